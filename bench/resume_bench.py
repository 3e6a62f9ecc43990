#!/usr/bin/env python3
"""End to end: resuming a session with `kvsnap restore --server` against reprocessing its prompt.

One run, one machine, one stock llama-server (issue 13 part 3, docs/performance.md "End to end"):

  1. llama-server at f16 with --slot-save-path evaluates the prompt on slot 0;
     `kvsnap save --server` puts the slot into a fresh store;
  2. the server is restarted at q8_0 (-ctk/-ctv q8_0, the same -fa);
  3. (a) resume: `kvsnap restore --server` (converts f16 -> q8_0 into the slot directory, the server
     loads it), then the same prompt as a completion: its prompt_n proves the reuse;
     (b) reprocess: the slot erased, the same prompt evaluated from scratch (prompt_ms, wall);
  4. the restore's phases, each measured on its own: reading the snapshot out of the store
     (`kvsnap restore --out`, stored types), reading + converting (`--out` at q8_0), converting a
     plain file (`kvsnap convert`), plain write(2)s into a new file and over an existing one,
     llama-server's own load of the converted file (POST /slots/0?action=restore of that file,
     no kvsnap in between).

The restore's CPU (user, sys) and minor page faults are reported beside its wall clock: where the
machine is loaded, or memory touched for the first time is slow, the wall clock alone misleads.
By default save/restore --server keep their scratch file in the slot dir (the restore writes over
the save's); --no-scratch measures restores that keep nothing.

--simd LEVEL runs kvsnap's restores and phases with KVSNAP_SIMD=LEVEL (llama-server unchanged);
--simd all runs the resume (3a) at every SIMD level this CPU has, the levels taking turns in each
round beside the same reprocess (3b), and prints each level's resume ratio (the phases run at the
best level). `kvsnap doctor` says which levels this CPU has and confirms each one is in use.

Prints a table and the ratio; --json FILE writes every figure. Nothing here asserts a time.

  bench/resume_bench.py KVSNAP LLAMA_SERVER MODEL PROMPT_FILE WORK_DIR [--repeat N] [--simd LEVEL|all]
      [--against OTHER_KVSNAP] [--json FILE]

--against OTHER_KVSNAP (a build of another commit) runs its restore --server beside KVSNAP's in every
round and level, and prints both: a change to the restore is measured so, not in two sittings.

With bench/make_real_slot.sh's model and prompt (~/.cache/kvsnap-bench/model.gguf and
real-f16.slot.prompt.txt, ~3,200 tokens). WORK_DIR is emptied of the bench's own files.
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from loopback import free_port  # noqa: E402  (tests/loopback.py)


def http(port, method, path, body=None, timeout=3600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = r.read()
    except urllib.error.HTTPError as e:
        raise SystemExit(f"resume_bench: {method} {path}: HTTP {e.code}: {e.read()[:300]!r}")
    return json.loads(out), (time.perf_counter() - t0) * 1000


class Server:
    """A stock llama-server on a free loopback port; its log goes to WORK/name.log."""

    def __init__(self, binary, model, slot_dir, work, name, ctk, ctv, fa, ctx, threads):
        self.port = free_port()
        self.log_path = os.path.join(work, name + ".log")
        self.log = open(self.log_path, "w")
        args = [binary, "-m", model, "-c", str(ctx), "-np", "1", "-ctk", ctk, "-ctv", ctv, "-fa", fa,
                "-t", str(threads), "--slot-save-path", slot_dir, "--cache-ram", "0",
                "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"resume_bench: llama-server exited ({self.proc.returncode}); see {self.log_path}")
            try:
                http(self.port, "GET", "/health", timeout=5)
                return
            except (OSError, SystemExit):
                time.sleep(0.2)
        raise SystemExit(f"resume_bench: llama-server did not become healthy; see {self.log_path}")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def wait_idle(pid, quiet_s=0.2, max_s=5.0):
    """Waits until process `pid` has used no CPU for `quiet_s` (at most `max_s`); returns the seconds
    waited. Each restore and reprocess starts so from an idle llama-server, as a restarted server's
    first restore does: right after a reprocess its threads kept a core busy for a few hundred ms,
    and a restore started then (every round's but the first) took 1.3x as long on 2 cores with the
    same CPU time. Without /proc (macOS): a fixed 1 s."""
    t0 = time.perf_counter()

    def cpu_ticks():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15)

    try:
        last = cpu_ticks()
    except OSError:
        time.sleep(1.0)
        return time.perf_counter() - t0
    quiet_since = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        time.sleep(0.05)
        now = cpu_ticks()
        if now != last:
            last, quiet_since = now, time.perf_counter()
        elif time.perf_counter() - quiet_since >= quiet_s:
            break
    return time.perf_counter() - t0


LAST_CPU = {}


def run(cmd, what, simd=None):
    """Runs a command (with KVSNAP_SIMD=simd when given): (its stdout, JSON when it is, wall ms). Its
    CPU (user, sys seconds) and minor page faults go to LAST_CPU: on a machine where fresh memory is
    slow, wall clock alone cannot tell waiting for a core from work."""
    env = dict(os.environ, KVSNAP_SIMD=simd) if simd else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    ms = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU.clear()
    LAST_CPU.update({"user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
                     "minflt": after.ru_minflt - before.ru_minflt})
    if p.returncode != 0:
        raise SystemExit(f"resume_bench: {what} failed ({p.returncode}):\n  {' '.join(cmd)}\n{p.stderr}{p.stdout}")
    try:
        out = json.loads(p.stdout) if p.stdout.strip().startswith("{") else p.stdout
    except json.JSONDecodeError:
        out = p.stdout
    return out, ms


def simd_levels(kvsnap, store, want):
    """The SIMD levels to run kvsnap at: [None] (its own choice) when want is None, [want], or every
    level this CPU runs for "all", lowest first; `kvsnap doctor` names them and shows each in use."""
    def doctor_simd(level):
        out, _ = run([kvsnap, "doctor", "--json", "--store", store], "kvsnap doctor", simd=level)
        return next(c for c in out["checks"] if c["check"] == "simd")
    if want is None:
        return [None]
    have = re.search(r"this CPU runs: ([a-z0-9 ]+)", doctor_simd(None)["detail"]).group(1).split()
    levels = have if want == "all" else [want]
    for level in levels:
        check = doctor_simd(level)
        if check["verdict"] != "ok" or not check["detail"].startswith(level + ","):
            raise SystemExit(f"resume_bench: kvsnap does not run at SIMD level {level} here: {check['detail']}")
    return levels


def complete(port, prompt):
    """The prompt on slot 0, one token predicted: (timings, wall ms)."""
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": True, "id_slot": 0}
    j, ms = http(port, "POST", "/completion", body)
    return j["timings"], ms


def ph_bytes_rate(p):
    return p["bytes"] / p["wall_ms"] / 1e6


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kvsnap")
    ap.add_argument("llama_server")
    ap.add_argument("model")
    ap.add_argument("prompt_file")
    ap.add_argument("work")
    ap.add_argument("--repeat", type=int, default=3, help="resume / reprocess rounds (medians reported)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--fa", default="on")
    ap.add_argument("--to", default="q8_0", help="the restarted server's -ctk/-ctv")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server -t")
    ap.add_argument("--no-scratch", action="store_true",
                    help="pass --no-scratch to save/restore --server (a new slot file each time, none kept)")
    ap.add_argument("--simd", help="KVSNAP_SIMD for kvsnap's restores: a level (scalar, avx2, avx512, neon), or all: "
                                   "the resume at every level this CPU has, in one run")
    ap.add_argument("--level", help="kvsnap save's --level: a zstd level, or none (chunks stored raw)")
    ap.add_argument("--against", metavar="KVSNAP",
                    help="another kvsnap binary (a build of another commit): its restore --server runs right after "
                         "KVSNAP's in every round, at every level, and both are reported side by side. A change is "
                         "measured so, in one run: this VM's speed drifts between sittings")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()

    prompt = open(a.prompt_file).read()
    work = os.path.abspath(a.work)
    slot_dir, store = os.path.join(work, "slots"), os.path.join(work, "store")
    for d in (slot_dir, store):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    kv = [a.kvsnap]
    st = ["--store", store]
    scratch = ["--no-scratch"] if a.no_scratch else []
    levels = simd_levels(a.kvsnap, store, a.simd)
    # The phases and the summary's own figures: the one level asked for, or the best (the last).
    main_level = levels[-1]
    res = {"model": a.model, "prompt_file": a.prompt_file, "to": a.to, "fa": a.fa, "ctx": a.ctx,
           "cores": os.cpu_count(), "simd": levels, "loadavg_before": os.getloadavg()}

    # 1. f16: evaluate, save.
    srv = Server(a.llama_server, a.model, slot_dir, work, "server-f16", "f16", "f16", a.fa, a.ctx, a.threads)
    try:
        t, ms = complete(srv.port, prompt)
        res["f16_prompt"] = {"prompt_n": t["prompt_n"], "prompt_ms": t["prompt_ms"], "wall_ms": ms}
        saved, ms = run(kv + ["save", "--server", srv.url, "--slot", "0", "--slot-dir", slot_dir, "--model", a.model,
                              "--name", "e2e", "--json"] + scratch + st + (["--level", a.level] if a.level else []),
                        "kvsnap save --server")
        res["save"] = {"wall_ms": ms, "result": saved}
        # The f16 file llama-server itself writes, for the phase runs below.
        j, ms = http(srv.port, "POST", "/slots/0?action=save", {"filename": "server-f16.bin"})
        res["server_save_f16"] = {"wall_ms": ms, "bytes": j.get("n_written"), "save_ms": j["timings"]["save_ms"]}
    finally:
        srv.stop()
    f16_file = os.path.join(slot_dir, "server-f16.bin")
    n_tokens = res["f16_prompt"]["prompt_n"]

    # 2. restart at the other types.
    srv = Server(a.llama_server, a.model, slot_dir, work, f"server-{a.to}", a.to, a.to, a.fa, a.ctx, a.threads)
    rounds, against, waited = [], [], []
    try:
        def restore_against(level):
            http(srv.port, "POST", "/slots/0?action=erase", {})
            wait_idle(srv.proc.pid)
            r, restore_ms = run([a.against, "restore", "e2e", "--server", srv.url, "--slot", "0", "--slot-dir",
                                 slot_dir, "--ctk", a.to, "--ctv", a.to, "--fa", a.fa, "--model", a.model,
                                 "--json"] + scratch + st, "--against's restore --server", simd=level)
            against.append({"simd": level, "restore_wall_ms": restore_ms, "restore": r, "restore_cpu": dict(LAST_CPU)})

        for i in range(a.repeat):
            this_round = []
            for level in levels:  # in turn, so that every level sees the same machine load
                # --against's restore goes first in even rounds, last in odd ones: a restore right after
                # the round's reprocess (both cores busy for seconds) ran up to 1.5x slower here, the
                # same binary.
                if a.against and i % 2 == 0:
                    restore_against(level)
                http(srv.port, "POST", "/slots/0?action=erase", {})
                waited.append(wait_idle(srv.proc.pid))
                r, restore_ms = run(kv + ["restore", "e2e", "--server", srv.url, "--slot", "0", "--slot-dir", slot_dir,
                                          "--ctk", a.to, "--ctv", a.to, "--fa", a.fa, "--model", a.model, "--json"]
                                    + scratch + st, "kvsnap restore --server", simd=level)
                restore_cpu = dict(LAST_CPU)
                t_after, first_ms = complete(srv.port, prompt)
                # Control: the same again, nothing restored: what one token costs on this server right now.
                t_again, again_ms = complete(srv.port, prompt)
                this_round.append({"simd": level, "restore_wall_ms": restore_ms, "restore": r,
                                   "restore_cpu": restore_cpu, "first_completion_ms": first_ms,
                                   "prompt_n_after_restore": t_after["prompt_n"],
                                   "prompt_ms_after_restore": t_after["prompt_ms"],
                                   "control_completion_ms": again_ms, "control_prompt_n": t_again["prompt_n"]})
                if a.against and i % 2 == 1:
                    restore_against(level)
            http(srv.port, "POST", "/slots/0?action=erase", {})
            wait_idle(srv.proc.pid)
            t_fresh, fresh_ms = complete(srv.port, prompt)
            for x in this_round:  # the round's one reprocess, beside each level's resume
                x.update({"reprocess_wall_ms": fresh_ms, "reprocess_prompt_ms": t_fresh["prompt_ms"],
                          "reprocess_prompt_n": t_fresh["prompt_n"]})
            rounds += this_round
        # 4. the phases, each on its own.
        conv = os.path.join(work, "converted.bin")
        phases = {}
        for name, extra in (("store_read", []), ("store_read_convert", ["--ctk", a.to, "--ctv", a.to, "--fa", a.fa])):
            out = os.path.join(work, name + ".bin")
            xs, cpu = [], []
            for _ in range(a.repeat):
                if os.path.exists(out):
                    os.remove(out)
                j, ms = run(kv + ["restore", "e2e", "--out", out, "--model", a.model, "--json"] + extra + st, name,
                            simd=main_level)
                xs.append(ms)
                cpu.append(LAST_CPU["user_s"] + LAST_CPU["sys_s"])
            phases[name] = {"wall_ms": median(xs), "cpu_s": median(cpu), "bytes": os.path.getsize(out)}
        os.replace(os.path.join(work, "store_read_convert.bin"), os.path.join(slot_dir, "converted.bin"))
        xs, cpu = [], []
        for _ in range(a.repeat):
            if os.path.exists(conv):
                os.remove(conv)
            _, ms = run(kv + ["convert", f16_file, conv, "--ctk", a.to, "--ctv", a.to, "--fa", a.fa, "--model", a.model],
                        "kvsnap convert", simd=main_level)
            xs.append(ms)
            cpu.append(LAST_CPU["user_s"] + LAST_CPU["sys_s"])
        phases["convert_plain_file"] = {"wall_ms": median(xs), "cpu_s": median(cpu), "bytes_in": os.path.getsize(f16_file),
                                        "bytes": os.path.getsize(conv)}
        xs, ys = [], []
        for _ in range(a.repeat):
            http(srv.port, "POST", "/slots/0?action=erase", {})
            j, ms = http(srv.port, "POST", "/slots/0?action=restore", {"filename": "converted.bin"})
            xs.append(ms)
            ys.append(j["timings"]["restore_ms"])
        phases["server_load"] = {"wall_ms": median(xs), "restore_ms": median(ys)}
        # The machine's ceilings: the same number of bytes written into the slot dir by plain write(2)s
        # of 4 MiB, no fsync: into a new file (new page-cache pages), and over an existing file of that
        # size in place (its pages reused, as restore --server does over the slot dir's scratch file).
        block = b"\x01" * (4 << 20)
        path = os.path.join(slot_dir, "plain-write.bin")

        def plain_write(flags):
            t0 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
            left = phases["store_read_convert"]["bytes"]
            while left > 0:
                left -= os.write(fd, block[:min(left, len(block))])
            os.close(fd)
            return (time.perf_counter() - t0) * 1000
        for name, flags in (("plain_write", os.O_TRUNC), ("plain_rewrite", 0)):
            xs = []
            for _ in range(a.repeat):
                if name == "plain_write" and os.path.exists(path):
                    os.remove(path)
                xs.append(plain_write(flags))
            phases[name] = {"wall_ms": median(xs), "bytes": phases["store_read_convert"]["bytes"]}
        os.remove(path)
        xs = []
        for _ in range(a.repeat):
            _, ms = run([a.kvsnap, "--version"], "kvsnap --version")
            xs.append(ms)
        phases["kvsnap_process_start"] = {"wall_ms": median(xs)}
        res["phases"] = phases
    finally:
        srv.stop()
    res["rounds"] = rounds
    res["against_rounds"] = against
    res["idle_waits_s"] = waited
    res["loadavg_after"] = os.getloadavg()

    at_level = {lv: [r for r in rounds if r["simd"] == lv] for lv in levels}
    res["levels"] = {str(lv): {"restore_wall_ms": median([r["restore_wall_ms"] for r in rs]),
                               "restore_cpu_s": median([r["restore_cpu"]["user_s"] + r["restore_cpu"]["sys_s"] for r in rs]),
                               "first_completion_ms": median([r["first_completion_ms"] for r in rs]),
                               "reprocess_wall_ms": median([r["reprocess_wall_ms"] for r in rs])}
                     for lv, rs in at_level.items()}
    for x in res["levels"].values():
        x["resume_ms"] = x["restore_wall_ms"] + x["first_completion_ms"]
        x["ratio_reprocess_over_resume"] = x["reprocess_wall_ms"] / x["resume_ms"]
    rounds = at_level[main_level]  # the summary below: the main level's rounds
    m = lambda k: median([r[k] for r in rounds])
    restore_ms, first_ms = m("restore_wall_ms"), m("first_completion_ms")
    reproc_ms, reproc_prompt_ms = m("reprocess_wall_ms"), m("reprocess_prompt_ms")
    out_bytes = rounds[-1]["restore"]["bytes"]
    inner = median([r["restore"].get("phases_ms", {}).get("write", float("nan")) +
                    r["restore"].get("phases_ms", {}).get("commit", 0) for r in rounds])
    summary = {
        "n_tokens": n_tokens,
        "restore_wall_ms": restore_ms,
        "first_completion_after_restore_ms": first_ms,
        "prompt_n_after_restore": [r["prompt_n_after_restore"] for r in rounds],
        "resume_ms": restore_ms + first_ms,
        "reprocess_wall_ms": reproc_ms,
        "reprocess_prompt_ms": reproc_prompt_ms,
        "ratio_reprocess_over_resume": reproc_ms / (restore_ms + first_ms),
        "ratio_reprocess_over_restore": reproc_ms / restore_ms,
        "slot_file_bytes": out_bytes,
        "write_phase_ms": inner,
        "restore_rate_gbps_whole": out_bytes / restore_ms / 1e6,
        "restore_rate_gbps_write_phase": out_bytes / inner / 1e6 if inner == inner else None,
        "plain_write_gbps": ph_bytes_rate(res["phases"]["plain_write"]),
        "plain_rewrite_gbps": ph_bytes_rate(res["phases"]["plain_rewrite"]),
        "restore_cpu_s": median([r["restore_cpu"]["user_s"] + r["restore_cpu"]["sys_s"] for r in rounds]),
        "restore_user_s": median([r["restore_cpu"]["user_s"] for r in rounds]),
        "restore_sys_s": median([r["restore_cpu"]["sys_s"] for r in rounds]),
        "restore_minflt": median([r["restore_cpu"]["minflt"] for r in rounds]),
        "idle_wait_ms": median(waited) * 1000,
    }
    res["summary"] = summary

    ph = res["phases"]
    print(f"end to end, {n_tokens} tokens, f16 saved -> server restarted at {a.to}/{a.to} fa {a.fa}, "
          f"{a.repeat} rounds (medians), {os.cpu_count()} cores, load {res['loadavg_before'][0]:.1f} -> "
          f"{res['loadavg_after'][0]:.1f}, kvsnap SIMD {main_level or 'its own choice'}")
    print(f"{'':44} {'ms':>9}")
    print(f"{'(a) kvsnap restore --server (wall)':44} {restore_ms:9.0f}   CPU {summary['restore_cpu_s'] * 1000:.0f} ms "
          f"(user {summary['restore_user_s'] * 1000:.0f}, sys {summary['restore_sys_s'] * 1000:.0f}), "
          f"{summary['restore_minflt']:.0f} minor faults")
    print(f"{'    first completion after it (wall)':44} {first_ms:9.0f}   prompt_n "
          f"{summary['prompt_n_after_restore']}")
    print(f"{'    control: the same completion again':44} {m('control_completion_ms'):9.0f}   "
          "(no restore in between: one token on this server now)")
    print(f"{'    resume = both':44} {restore_ms + first_ms:9.0f}   (each restore started with llama-server idle: "
          f"a median {summary['idle_wait_ms']:.0f} ms waited for its CPU time to stop)")
    print(f"{'(b) reprocess on an erased slot (wall)':44} {reproc_ms:9.0f}   prompt_ms {reproc_prompt_ms:.0f}")
    print(f"ratio reprocess / resume: {summary['ratio_reprocess_over_resume']:.1f}x "
          f"(reprocess / restore alone: {summary['ratio_reprocess_over_restore']:.1f}x)")
    print(f"restore --server: {out_bytes / 1e6:.1f} MB into the slot dir; "
          f"{summary['restore_rate_gbps_whole']:.2f} GB/s over the whole command"
          + (f", {summary['restore_rate_gbps_write_phase']:.2f} GB/s over its read+convert+write phase"
             if summary["restore_rate_gbps_write_phase"] else ""))
    if len(levels) > 1:
        print("resume at each SIMD level (KVSNAP_SIMD for kvsnap restore --server; the levels take turns in each "
              "round, beside the same reprocess):")
        print(f"  {'level':8} {'restore ms':>10} {'CPU ms':>8} {'first completion ms':>20} {'resume ms':>10} "
              f"{'reprocess/resume':>17}")
        for lv in levels:
            x = res["levels"][lv]
            print(f"  {lv:8} {x['restore_wall_ms']:10.0f} {x['restore_cpu_s'] * 1000:8.0f} {x['first_completion_ms']:20.0f} "
                  f"{x['resume_ms']:10.0f} {x['ratio_reprocess_over_resume']:16.1f}x")
    if a.against:
        def write_ms(r):
            p = r["restore"].get("phases_ms", {}) if isinstance(r["restore"], dict) else {}
            return p.get("write", float("nan")) + p.get("commit", 0)
        print(f"restore --server, KVSNAP against --against {a.against} (both in every round, the order "
              f"alternating; medians):")
        print(f"  {'level':8} {'wall ms':>8} {'against':>8} {'ratio':>6} {'CPU ms':>7} {'against':>8} "
              f"{'write phase ms':>15} {'against':>8}")
        res["against"] = {}
        for lv in levels:
            ours = [r for r in res["rounds"] if r["simd"] == lv]
            theirs = [r for r in against if r["simd"] == lv]
            cpu = lambda rs: median([r["restore_cpu"]["user_s"] + r["restore_cpu"]["sys_s"] for r in rs]) * 1000
            x = {"restore_wall_ms": median([r["restore_wall_ms"] for r in ours]),
                 "against_restore_wall_ms": median([r["restore_wall_ms"] for r in theirs]),
                 "restore_cpu_ms": cpu(ours), "against_restore_cpu_ms": cpu(theirs),
                 "write_phase_ms": median([write_ms(r) for r in ours]),
                 "against_write_phase_ms": median([write_ms(r) for r in theirs])}
            x["ratio_against_over_kvsnap"] = x["against_restore_wall_ms"] / x["restore_wall_ms"]
            res["against"][str(lv)] = x
            print(f"  {str(lv):8} {x['restore_wall_ms']:8.0f} {x['against_restore_wall_ms']:8.0f} "
                  f"{x['ratio_against_over_kvsnap']:5.2f}x {x['restore_cpu_ms']:7.0f} {x['against_restore_cpu_ms']:8.0f} "
                  f"{x['write_phase_ms']:15.0f} {x['against_write_phase_ms']:8.0f}")
    inner_phases = rounds[-1]["restore"].get("phases_ms")
    if inner_phases:
        print("  inside the restore (last round, ms): " + ", ".join(f"{k} {v:.0f}" for k, v in inner_phases.items()))
    print("phases, each on its own (ms):")
    print(f"  kvsnap process start (--version)            {ph['kvsnap_process_start']['wall_ms']:9.0f}")
    print(f"  store -> file, stored types (restore --out) {ph['store_read']['wall_ms']:9.0f}   "
          f"{ph['store_read']['bytes'] / 1e6:.1f} MB, CPU {ph['store_read']['cpu_s'] * 1000:.0f} ms")
    print(f"  store -> file at {a.to:5} (restore --out)      {ph['store_read_convert']['wall_ms']:9.0f}   "
          f"{ph['store_read_convert']['bytes'] / 1e6:.1f} MB, CPU {ph['store_read_convert']['cpu_s'] * 1000:.0f} ms")
    print(f"  plain f16 file -> {a.to} (kvsnap convert)     {ph['convert_plain_file']['wall_ms']:9.0f}   "
          f"CPU {ph['convert_plain_file']['cpu_s'] * 1000:.0f} ms")
    print(f"  plain write(2) into a new file              {ph['plain_write']['wall_ms']:9.0f}   "
          f"{ph['plain_write']['bytes'] / ph['plain_write']['wall_ms'] / 1e6:.2f} GB/s")
    print(f"  plain write(2) over an existing file        {ph['plain_rewrite']['wall_ms']:9.0f}   "
          f"{ph['plain_rewrite']['bytes'] / ph['plain_rewrite']['wall_ms'] / 1e6:.2f} GB/s")
    print(f"  llama-server loads the converted file       {ph['server_load']['wall_ms']:9.0f}   "
          f"(its restore_ms {ph['server_load']['restore_ms']:.0f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    bad = [r for r in res["rounds"] if r["prompt_n_after_restore"] > 8]  # at every level
    if bad:
        print(f"WARNING: the server did not reuse the restored cache (prompt_n {bad[0]['prompt_n_after_restore']})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
