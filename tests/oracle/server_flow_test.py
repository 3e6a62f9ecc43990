#!/usr/bin/env python3
"""kvsnap save --server / restore --server against a real llama-server (issue 5's flows).

  server_flow_test.py KVSNAP LLAMA_SERVER FIXTURES WORKDIR

1. a server with f16/f16 (flash attention on) completes fixtures/prompt.txt; `kvsnap save --server`
   stores slot 0 (nothing is left in the slot directory);
2. the server is restarted with q8_0/q8_0, then q4_0/q8_0, then f16/f16 without flash attention;
   each time `kvsnap restore --server --check` converts and restores the snapshot (types from flags, from a
   profile, or detected; the f16 one gets only --ctk/--ctv, into the restarted server's empty slot: the V
   layout (flash attention off, unlike the stored file) is detected, not demanded), the check proves the
   cache is reused, and a completion of prompt + suffix evaluates only the suffix and predicts like a
   server that computed the prompt natively in those types (KL within 1.5x of the native one, over the
   whole vocabulary);
3. failure paths: server down, unknown slot, slot busy, --slot-dir not the server's, --slot-dir not
   writable, a snapshot of another model: each a clear error, a non-zero exit, nothing left behind.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_test import Server, completion, mean_kl, agreeing_prefix, SUFFIX  # noqa: E402
from default_signals import restore_default_signals  # noqa: E402
from test_outcome import exit_status  # noqa: E402


def kvsnap(args, env, expect=0):
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    if expect is not None and p.returncode != expect:
        raise AssertionError(f"{' '.join(args)}: exit {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}")
    return p


SCRATCH = ".kvsnap-scratch.kvsnap-tmp-kept"  # the one file save/restore --server keep (server_flows.h)


def leftovers(slot_dir):
    return [f for f in os.listdir(slot_dir) if f != SCRATCH and (f.startswith("kvsnap-") or ".kvsnap-tmp-" in f)]


def main():
    restore_default_signals()
    k, server_bin, fixtures, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    slots = os.path.join(work, "slots")
    os.makedirs(slots)
    env = dict(os.environ, KVSNAP_HOME=os.path.join(work, "store"))
    model = os.path.join(fixtures, "models", "tiny-hd64.gguf")
    prompt = open(os.path.join(fixtures, "prompt.txt")).read()
    failures, rows = [], []
    skipped = []  # checks this machine could not run (test_outcome.py)

    def check(cond, msg):
        if not cond:
            failures.append(msg)
        print(("ok   " if cond else "FAIL ") + msg)

    # 1. save from an f16 server
    src = Server(server_bin, model, "f16", "f16", True, slots, os.path.join(work, "src.log"))
    try:
        n_suffix = len(src.post("/tokenize", {"content": prompt + SUFFIX})[1]["tokens"]) - \
            len(src.post("/tokenize", {"content": prompt})[1]["tokens"])
        completion(src, prompt, 8)
        p = kvsnap([k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots, "--name", "chat", "--json"], env)
        saved = json.loads(p.stdout)
        check(saved["n_tokens"] > 100, f"save --server stored {saved['n_tokens']} tokens")
        check(saved["server"] == src.url and saved["slot"] == 0 and saved["n_saved"] > 100
              and saved["server_ms"] >= 0, f"save --server --json names the server, slot and tokens saved: {saved}")
        check(not leftovers(slots) and os.path.exists(os.path.join(slots, SCRATCH)),
              "save --server leaves only its file, as the scratch file, in the slot directory")
        os.remove(os.path.join(slots, SCRATCH))
        kvsnap([k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots, "--name", "chat-again",
                "--no-scratch"], env)
        check(os.listdir(slots) == [], f"save --server --no-scratch leaves nothing: {os.listdir(slots)}")
        # /props build_info is recorded. This bed's server is built from node-llama-cpp's squashed
        # source bundle, so it says b1-<commit>: kept as reported, never used as evidence.
        build = saved["server_build"]
        check(bool(build["reported"]) and build["reported"].startswith("b1-") and build["usable"] is None
              and "git history" in (build["why_not"] or ""), f"/props build_info read: {build}")
        prov = json.loads(kvsnap([k, "show", "chat", "--json"], env).stdout)["snapshot"]["provenance"]
        check(prov.get("reported_build") == build["reported"] and "llama_build" not in prov,
              f"the snapshot records the reported build only: {prov}")
        p = kvsnap([k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots, "--name", "declared",
                    "--source-build", "v0.5.0", "--json"], env)
        prov = json.loads(kvsnap([k, "show", "declared", "--json"], env).stdout)["snapshot"]["provenance"]
        check(prov.get("llama_build") == "v0.5.0" and prov.get("llama_build_from") == "declared"
              and prov.get("reported_build") == build["reported"], f"--source-build wins and is recorded: {prov}")
        # migrate --server: the target build comes from /props (here unusable, so the current format)
        mig = os.path.join(work, "migrate")
        os.makedirs(mig, exist_ok=True)
        shutil.copy(os.path.join(fixtures, "b8121", "hd64-f16-f16-faon.slot"), mig)
        # (an upgrade in place needs the model: an M-RoPE model's files would lack their cell extra)
        p = kvsnap([k, "migrate", mig, "--server", src.url, "--model", model, "--dry-run", "--json"], env)
        m = json.loads(p.stdout)
        check(m["server"]["target_build"] is None and build["reported"] in m["server"]["note"]
              and m["converted"] == 1, f"migrate --server: {m['server']}, {m['converted']} to convert")
        p = kvsnap([k, "migrate", mig, "--server", src.url, "--target-build", "b8121", "--model", model, "--dry-run",
                    "--json"], env)
        m = json.loads(p.stdout)
        check(m["server"]["target_build"] == "b8121" and m["at_target"] == 1,
              f"migrate --server --target-build b8121 leaves a b8121 file alone: {m['server']}")
        p = kvsnap([k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots, "--name", "wrong",
                    "--source-build", "b10361"], env, expect=None)
        check(p.returncode == 5 and "b10361" in p.stderr and not leftovers(slots),
              f"a build that cannot have written the server's ggsq v3 file is refused: {p.stderr.strip()}")
        # Ctrl-C: save --server and restore --server stopped midway by a real SIGINT through kvsnap's handler
        # (raised after 100,000 bytes went through its file layer: the slot file is about 350,000) end by
        # that SIGINT (returncode -2) once they have said so, store nothing new and leave nothing in the
        # slot directory
        # progress of save --server: the total is the file the server wrote, known once it did
        p = kvsnap([k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots, "--name", "progress",
                    "--json"], dict(env, KVSNAP_PROGRESS_DELAY_MS="0"))
        ev = [json.loads(l)["progress"] for l in p.stderr.splitlines() if l.startswith('{"progress"')]
        size = json.loads(kvsnap([k, "show", "progress", "--json"], env).stdout)["snapshot"]["provenance"]["file_size"]
        check(ev and ev[-1]["finished"] and ev[-1].get("total_bytes") == size and ev[-1]["done_bytes"] == size,
              f"save --server --json: progress events with the slot file's size as the total ({size}): "
              f"{ev[-1] if ev else p.stderr.strip()[:200]}")
        kvsnap([k, "rm", "progress"], env)
        # An mlx-lm snapshot is refused before the server is asked anything, naming what it is (not
        # the --ctk/--ctv the flow fills in, which the user never gave).
        mlx_file = os.path.join(work, "tiny.safetensors")
        header = json.dumps({"0.0": {"dtype": "BF16", "shape": [1, 1, 2, 4], "data_offsets": [0, 16]},
                             "0.1": {"dtype": "BF16", "shape": [1, 1, 2, 4], "data_offsets": [16, 32]},
                             "__metadata__": {"0.0": "", "2.0": "KVCache"}}).encode()
        with open(mlx_file, "wb") as f:
            f.write(len(header).to_bytes(8, "little") + header + bytes(32))
        kvsnap([k, "save", mlx_file, "--name", "mlx"], env)
        p = kvsnap([k, "restore", "mlx", "--server", src.url, "--slot-dir", slots], env, expect=None)
        check(p.returncode == 2 and "is an mlx-lm prompt cache: llama-server cannot load it" in p.stderr
              and "--ctk" not in p.stderr and not leftovers(slots),
              f"restore --server of an mlx-lm snapshot is refused by what it is: {p.stderr.strip()[:200]}")
        kvsnap([k, "rm", "mlx"], env)
        stop_env = dict(env, KVSNAP_TEST_INTERRUPT_AFTER_BYTES="100000")
        listed = lambda: len(json.loads(kvsnap([k, "ls", "--json"], env).stdout))
        n_listed = listed()
        p = kvsnap([k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots, "--name", "stopped"], stop_env,
                   expect=None)
        check(p.returncode == -signal.SIGINT and "interrupted" in p.stderr and not leftovers(slots) and listed() == n_listed,
              f"save --server stopped by Ctrl-C: exit {p.returncode}, nothing stored, nothing left in the slot "
              f"directory: {p.stderr.strip()[:160]}")
        p = kvsnap([k, "restore", "chat", "--server", src.url, "--slot-dir", slots, "--ctk", "f16", "--ctv", "f16",
                    "--fa", "on"], stop_env, expect=None)
        check(p.returncode == -signal.SIGINT and "interrupted" in p.stderr and not leftovers(slots),
              f"restore --server stopped by Ctrl-C: exit {p.returncode}, nothing left in the slot directory: "
              f"{p.stderr.strip()[:160]}")
        _, ref = completion(src, prompt + SUFFIX, 100000)
        n_vocab = len(ref[0][1])
        # failure: a slot that does not exist
        p = kvsnap([k, "save", "--server", src.url, "--slot", "7", "--slot-dir", slots], env, expect=None)
        check(p.returncode != 0 and "slot 7" in p.stderr, f"unknown slot refused: {p.stderr.strip()}")
        # failure: a snapshot name the store does not hold (exit 8, not an internal error)
        p = kvsnap([k, "restore", "no-such-snapshot", "--server", src.url, "--slot-dir", slots], env, expect=None)
        check(p.returncode == 8 and "no-such-snapshot" in p.stderr and not leftovers(slots),
              f"unknown snapshot refused with exit 8: {p.returncode} {p.stderr.strip()}")
        # failure: slot busy (a long generation is running). kvsnap starts once llama-server reports
        # the slot processing; a save that succeeded after the generation had ended proves nothing
        # (a fast CPU generates the tiny model's 3,000 tokens in under a second), so that try is
        # made again
        def slot_processing():
            req = urllib.request.Request(src.url + "/slots", headers=(
                {"Authorization": "Bearer " + src.api_key} if src.api_key else {}))
            with urllib.request.urlopen(req, timeout=30) as r:
                return any(x.get("is_processing") for x in json.loads(r.read()))
        for tries in range(1, 6):
            busy = threading.Thread(target=lambda: src.post("/completion", {"prompt": prompt, "n_predict": 3000,
                                                                             "id_slot": 0, "ignore_eos": True}))
            busy.start()
            deadline = time.monotonic() + 30
            while not slot_processing() and time.monotonic() < deadline:
                time.sleep(0.005)
            p = kvsnap([k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots], env, expect=None)
            generation_ended_first = not busy.is_alive()
            busy.join()
            if p.returncode != 0 or not generation_ended_first:
                break
        check(p.returncode != 0 and "busy" in p.stderr, f"busy slot refused (try {tries}): {p.stderr.strip()}")
        check(not leftovers(slots), "nothing left after the refusals")
        # failure: a kvsnap that may not write in the slot directory (llama-server may) would leave the
        # server's file there, one per save, exit 0 (a review's finding): refused before the server saves
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        # nobody must reach kvsnap and the slot directory (a checkout under /root would not be)
        if os.geteuid() == 0 and shutil.which("setpriv") and subprocess.run(
                as_nobody + ["sh", "-c", 'test -x "$0" && test -x "$1"', k, slots]).returncode == 0:
            home = os.path.join(work, "nobody-store")
            os.makedirs(home)
            os.chmod(home, 0o777)
            before = sorted(os.listdir(slots))
            p = kvsnap(as_nobody + [k, "save", "--server", src.url, "--slot", "0", "--slot-dir", slots, "--name",
                                    "nobody"], dict(env, KVSNAP_HOME=home), expect=None)
            check(p.returncode == 7 and "cannot create files in --slot-dir" in p.stderr and
                  sorted(os.listdir(slots)) == before,
                  f"save --server by a user who may not write in the slot directory: exit {p.returncode}, the "
                  f"server's file not left there ({sorted(os.listdir(slots))}): {p.stderr.strip()[:200]}")
        else:
            print("SKIP save --server by a user who may not write in the slot directory (needs root, setpriv and "
                  "kvsnap and the slot directory reachable by nobody)")
            skipped.append("save --server by a user who may not write in the slot directory")
    finally:
        src.stop()

    # 2. restore into servers with other types (the first into a slot dir without a scratch file)
    if os.path.exists(os.path.join(slots, SCRATCH)):
        os.remove(os.path.join(slots, SCRATCH))
    kvsnap([k, "server", "add", "q8", "http://127.0.0.1:1", "--slot-dir", slots, "--ctk", "q8_0", "--ctv", "q8_0",
            "--fa", "on", "--model", model], env)
    targets = [("q8_0", "q8_0", True, "flags"), ("q4_0", "q8_0", True, "detected"),
               ("f16", "f16", False, "types only")]
    for ctk, ctv, fa, how in targets:
        fa_word = "on" if fa else "off"
        srv = Server(server_bin, model, ctk, ctv, fa, slots, os.path.join(work, f"{ctk}-{ctv}-{fa_word}.log"))
        try:
            _, native = completion(srv, prompt + SUFFIX, n_vocab, cache_prompt=False)
            srv.post("/slots/0?action=erase", {})
            if how == "detected":
                completion(srv, "warm up the slot so it has something to save", 2)  # detection saves the slot
            args = [k, "restore", "chat", "--server", srv.url, "--slot-dir", slots, "--check", "--json"]
            if how == "flags":
                args += ["--ctk", ctk, "--ctv", ctv, "--fa", fa_word]
            if how == "types only":  # no --fa, the slot empty: the stored file's fa (on) would be refused here
                args += ["--ctk", ctk, "--ctv", ctv]
            p = kvsnap(args, env, expect=None)
            if p.returncode != 0:
                check(False, f"restore --server into {ctk}/{ctv} fa {fa_word}: {p.stderr.strip()}")
                continue
            r = json.loads(p.stdout)
            if how == "types only":
                check(r["flash_attn"] == "off" and "empty slot" in r["types_from"],
                      f"{ctk}/{ctv} without --fa, empty slot: fa {r['flash_attn']} ({r['types_from']})")
            check(r["target_build"] is None and r["server_build"]["reported"] == build["reported"],
                  f"{ctk}/{ctv}: the unusable build_info picks no target build: {r['server_build']}")
            check(r["n_restored"] == saved["n_tokens"] and r["check"]["reused"],
                  f"{ctk}/{ctv} fa {fa_word} ({r['types_from']}): restored {r['n_restored']} tokens, "
                  f"--check evaluated {r['check']['prompt_n']}")
            n_prompt, restored = completion(srv, prompt + SUFFIX, n_vocab)
            agree = agreeing_prefix(ref, native, restored)
            kl_n, kl_r = mean_kl(ref, native, agree), mean_kl(ref, restored, agree)
            bound = max(1.5 * kl_n, 1e-6)
            rows.append((ctk, ctv, fa_word, r["n_restored"], n_prompt, kl_n, kl_r, bound))
            check(n_prompt <= n_suffix + 2, f"{ctk}/{ctv} fa {fa_word}: the next completion evaluated {n_prompt} "
                                            f"tokens (suffix {n_suffix})")
            check(kl_r <= bound, f"{ctk}/{ctv} fa {fa_word}: KL {kl_r:.3g} <= {bound:.3g} (native {kl_n:.3g})")
            check(not leftovers(slots), f"{ctk}/{ctv}: nothing left in the slot directory but the scratch file")
            if how == "flags":  # the first restore: a new file, kept; the next one writes over it
                check(r["slot_file"] == "new, kept as scratch", f"{ctk}/{ctv}: slot file {r['slot_file']}")
                p = kvsnap(args, env)
                check(json.loads(p.stdout)["slot_file"] == "written over the kept scratch",
                      f"{ctk}/{ctv}: the second restore wrote over the scratch file")
                p = kvsnap(args + ["--no-scratch"], env)
                check(json.loads(p.stdout)["check"]["reused"] and os.listdir(slots) == [SCRATCH],
                      f"{ctk}/{ctv}: restore --no-scratch leaves the slot dir as it was: {os.listdir(slots)}")
            if ctk == "q8_0":
                # the profile knows the types; the URL comes from the flag
                kvsnap([k, "server", "add", "q8", srv.url, "--slot-dir", slots, "--ctk", "q8_0", "--ctv", "q8_0",
                        "--fa", "on", "--model", model], env)
                p = kvsnap([k, "restore", "chat", "--server", "q8", "--check"], env, expect=None)
                check(p.returncode == 0, f"restore --server PROFILE: {p.stdout.strip()} {p.stderr.strip()}")
                # doctor against the live server: reachable, its build unknown (b1), slot dir and types known
                p = kvsnap([k, "doctor", "--server", "q8", "--json"], env, expect=None)
                d = {c["check"]: c for c in json.loads(p.stdout)["checks"]}
                check(p.returncode == 0 and d["server q8"]["verdict"] == "warn"
                      and build["reported"] in d["server q8"]["detail"]
                      and d["server q8 slot dir"]["verdict"] == "ok" and d["catalog"]["verdict"] == "ok",
                      f"doctor --server q8: {p.stdout.strip()} {p.stderr.strip()}")
                # failure: --slot-dir that is not the server's
                other = os.path.join(work, "other")
                os.makedirs(other, exist_ok=True)
                p = kvsnap([k, "restore", "chat", "--server", srv.url, "--slot-dir", other, "--ctk", ctk, "--ctv", ctv,
                            "--fa", fa_word], env, expect=None)
                check(p.returncode != 0 and "restoring slot" in p.stderr and not leftovers(other),
                      f"wrong --slot-dir: {p.stderr.strip()}")
                # failure: --slot-dir not writable (a file, so that root cannot write either)
                notdir = os.path.join(work, "not-a-dir")
                open(notdir, "w").close()
                p = kvsnap([k, "restore", "chat", "--server", srv.url, "--slot-dir", notdir, "--ctk", ctk, "--ctv", ctv,
                            "--fa", fa_word], env, expect=None)
                check(p.returncode != 0 and p.stderr.strip() != "", f"unwritable --slot-dir: {p.stderr.strip()}")
        finally:
            srv.stop()

    # 3. more failure paths: the server is down; a snapshot of another model
    p = kvsnap([k, "restore", "chat", "--server", "http://127.0.0.1:9", "--slot-dir", slots, "--ctk", "q8_0",
                "--ctv", "q8_0"], env, expect=None)
    check(p.returncode == 7 and "running" in p.stderr, f"server down: {p.stderr.strip()}")
    other_model = os.path.join(fixtures, "models", "tiny-hd128.gguf")
    srv = Server(server_bin, other_model, "f16", "f16", True, slots, os.path.join(work, "other-model.log"))
    try:
        p = kvsnap([k, "restore", "chat", "--server", srv.url, "--slot-dir", slots, "--ctk", "f16", "--ctv", "f16",
                    "--fa", "on"], env, expect=None)
        check(p.returncode == 5 and "another model" in p.stderr, f"wrong model: {p.stderr.strip()}")
        check(not leftovers(slots), "nothing left after the wrong-model refusal")
    finally:
        srv.stop()
    # KV streams: llama.cpp keeps one per slot with -np N and no -kvu, one with -kvu or -np 1, and restores
    # a slot file only into a cache with as many ("n_stream mismatch" in its log, a generic "invalid slot
    # save file" in its answer). The server tells only its slot count; when it refuses the file, kvsnap
    # rewrites the streams to each count it may have (its slot count, then 1) and tries again: a session
    # moves between -np settings and -kvu. Each restore is checked by the continuation it gives (the
    # saving server's, top tokens and KL), not only by the server taking the file.
    def streams_restore(srv, ref, want_streams, what, extra=()):
        p = kvsnap([k, "restore", ref, "--server", srv.url, "--slot-dir", slots, "--ctk", "f16", "--ctv", "f16",
                    "--fa", "on", "--json", *extra], env, expect=None)
        ok = p.returncode == 0
        j = json.loads(p.stdout) if ok else {}
        check(ok and j.get("kv_streams") == want_streams, f"{what}: restored with {want_streams} KV streams "
              f"({j.get('kv_streams_from') if ok else p.stderr.strip()})")
        if ok:
            prompt_n, steps = completion(srv, prompt, 2)
            agree = agreeing_prefix(ref_steps, steps)
            kl_r = mean_kl(ref_steps, steps, agree)
            check(prompt_n <= 1 and [s[0] for s in steps] == [s[0] for s in ref_steps] and kl_r < 1e-3,
                  f"{what}: the continuation is the saving server's (prompt_n {prompt_n}, agree {agree}/"
                  f"{len(ref_steps)}, KL {kl_r:.2e})")

    srv = Server(server_bin, model, "f16", "f16", True, slots, os.path.join(work, "np2.log"), extra=("-np", "2"))
    try:
        _, ref_steps = completion(srv, prompt, 2)
        kvsnap([k, "save", "--server", srv.url, "--slot", "0", "--slot-dir", slots, "--name", "np2"], env)
        srv.post("/slots/0?action=erase", {})
        streams_restore(srv, "chat", 2, "-np 1 into -np 2")
        # A count given by hand is taken as given: a wrong one is the server's refusal, explained.
        p = kvsnap([k, "restore", "np2", "--server", srv.url, "--slot-dir", slots, "--ctk", "f16", "--ctv", "f16",
                    "--fa", "on", "--kv-streams", "3"], env, expect=None)
        check(p.returncode == 5 and "the file holds 3 KV streams and this server, with 2 slots, has 1 or 2" in p.stderr,
              f"--kv-streams 3 into -np 2: {p.stderr.strip()}")
    finally:
        srv.stop()
    # A file the server refuses whatever its stream count (here for its types: the server runs q8_0,
    # f16 is given): rewritten once for each count the server may have, then refused with what else
    # may not fit named; nothing is left in the slot directory.
    srv = Server(server_bin, model, "q8_0", "q8_0", True, slots, os.path.join(work, "np2-q8.log"), extra=("-np", "2"))
    try:
        p = kvsnap([k, "restore", "chat", "--server", srv.url, "--slot-dir", slots, "--ctk", "f16", "--ctv", "f16",
                    "--fa", "on"], env, expect=None)
        check(p.returncode == 5 and "rewritten to 2 KV streams (the counts the server may have, for 2 slots) it was "
              "refused too: something else does not fit" in p.stderr and "the types" in p.stderr,
              f"refused with every stream count: {p.stderr.strip()}")
        check(not leftovers(slots), "nothing left after a refusal with every stream count")
    finally:
        srv.stop()
    for name, extra, want in (("np1", (), 1), ("np3", ("-np", "3"), 3), ("np2-kvu", ("-np", "2", "-kvu"), 1)):
        srv = Server(server_bin, model, "f16", "f16", True, slots, os.path.join(work, name + ".log"), extra=extra)
        try:
            streams_restore(srv, "np2", want, f"-np 2 into {' '.join(extra) or '-np 1'}")
        finally:
            srv.stop()
    # iSWA (two caches, each with its streams) and hybrid (a recurrent state beside the cache) models too.
    # Neither lets llama-server re-evaluate a restored slot's last token (SWA cells outside the window
    # are not saved, a recurrent state does not roll back: it reprocesses the prompt), so the proof is
    # the server's own save of the restored slot: the same bytes as the snapshot rewritten to 1 stream.
    def restored_file(name, *extra):
        path = os.path.join(work, name + ".slot")
        kvsnap([k, "restore", name, "-o", path, "--force", *extra], env)
        with open(path, "rb") as f:
            return f.read()

    for kind in ("iswa", "hybrid"):
        other = os.path.join(fixtures, "models", f"tiny-{kind}.gguf")
        srv = Server(server_bin, other, "f16", "f16", True, slots, os.path.join(work, f"np2-{kind}.log"),
                     extra=("-np", "2"))
        try:
            completion(srv, prompt, 2)
            kvsnap([k, "save", "--server", srv.url, "--slot", "0", "--slot-dir", slots, "--name", f"np2-{kind}"], env)
        finally:
            srv.stop()
        srv = Server(server_bin, other, "f16", "f16", True, slots, os.path.join(work, f"np1-{kind}.log"))
        try:
            # no --ctk/--ctv/--fa: the types are detected from the server's save of its empty slot
            p = kvsnap([k, "restore", f"np2-{kind}", "--server", srv.url, "--slot-dir", slots, "--model", other,
                        "--json"], env, expect=None)
            j = json.loads(p.stdout) if p.returncode == 0 else {}
            check(j.get("kv_streams") == 1, f"{kind}: -np 2 into -np 1: restored with 1 KV stream "
                  f"({j.get('kv_streams_from') if j else p.stderr.strip()})")
            kvsnap([k, "save", "--server", srv.url, "--slot", "0", "--slot-dir", slots, "--name", f"back-{kind}"], env)
            back, want = restored_file(f"back-{kind}"), restored_file(f"np2-{kind}", "--kv-streams", "1")
            check(back == want, f"{kind}: the server holds the snapshot's cells: its save of the restored slot is the "
                                f"snapshot rewritten to 1 stream, byte for byte ({len(back)} / {len(want)} bytes)")
        finally:
            srv.stop()
    check(not leftovers(slots), "nothing left after the stream-count rewrites")
    old_fmt = os.path.join(work, "np2-b3166.bin")
    p = kvsnap([k, "restore", "np2", "-o", old_fmt, "--format", "ggsq-v1-b3166"], env, expect=None)
    check(p.returncode == 4 and "holds one KV stream; this state has 2 (a llama-server with -np 2" in p.stderr
          and "--kv-streams 1" in p.stderr and not os.path.exists(old_fmt),
          f"2 streams into a format without the n_stream prefix: {p.stderr.strip()}")
    p = kvsnap([k, "restore", "np2", "-o", old_fmt, "--format", "ggsq-v1-b3166", "--kv-streams", "1"], env, expect=None)
    check(p.returncode == 0 and os.path.exists(old_fmt), f"... with --kv-streams 1: {p.stderr.strip()}")
    # A server started with a relative -m: its /props model_path is relative to the server's
    # directory, not kvsnap's. A file of that name beside kvsnap (here the snapshot's own model,
    # while the server runs the other) was taken for the server's model: the check passed and the
    # other model's cache loaded. Now the model is not checked, and the restore says so.
    srv_dir, kv_dir = os.path.join(work, "srv-rel"), os.path.join(work, "kv-rel")
    os.makedirs(srv_dir)
    os.makedirs(kv_dir)
    shutil.copy(other_model, os.path.join(srv_dir, "model.gguf"))
    shutil.copy(model, os.path.join(kv_dir, "model.gguf"))
    srv = Server(server_bin, "model.gguf", "f16", "f16", True, slots, os.path.join(work, "relative.log"), cwd=srv_dir)
    try:
        p = subprocess.run([k, "restore", "chat", "--server", srv.url, "--slot-dir", slots, "--ctk", "f16", "--ctv",
                            "f16", "--fa", "on", "--json"], env=env, cwd=kv_dir, capture_output=True, text=True,
                           timeout=600)
        r = json.loads(p.stdout) if p.returncode == 0 else {}
        check(p.returncode == 0 and r.get("model_from") != "the server's model_path"
              and "relative" in (r.get("model_unchecked") or ""),
              f"a relative model_path is not read beside kvsnap, and the restore says the model went unchecked: "
              f"{p.returncode} {r.get('model_from')} {r.get('model_unchecked')} {p.stderr.strip()[:200]}")
        p = subprocess.run([k, "restore", "chat", "--server", srv.url, "--slot-dir", slots, "--ctk", "f16", "--ctv",
                            "f16", "--fa", "on"], env=env, cwd=kv_dir, capture_output=True, text=True, timeout=600)
        check(p.returncode == 0 and "model not checked" in p.stdout, f"the text says so too: {p.stdout.strip()}")
        check(not leftovers(slots), "nothing left after the unchecked restores")
    finally:
        srv.stop()

    # 4. an API key, sent the way llama-server expects (Authorization: Bearer)
    srv = Server(server_bin, model, "f16", "f16", True, slots, os.path.join(work, "apikey.log"),
                 extra=("--api-key", "s3cret"))
    srv.api_key = "s3cret"
    try:
        completion(srv, prompt, 2)
        p = kvsnap([k, "save", "--server", srv.url, "--slot-dir", slots, "--name", "keyed"], env, expect=None)
        check(p.returncode == 2 and "api key" in p.stderr.lower(), f"no API key: {p.stderr.strip()}")
        keyfile = os.path.join(work, "key")
        with open(keyfile, "w") as f:
            f.write("s3cret\n")
        os.chmod(keyfile, 0o600)
        p = kvsnap([k, "save", "--server", srv.url, "--slot-dir", slots, "--name", "keyed", "--api-key-file", keyfile],
                   env, expect=None)
        check(p.returncode == 0, f"--api-key-file: {p.stdout.strip()} {p.stderr.strip()}")
        p = kvsnap([k, "restore", "keyed", "--server", srv.url, "--slot-dir", slots, "--api-key", "s3cret",
                    "--ctk", "f16", "--ctv", "f16", "--fa", "on", "--check"], env, expect=None)
        check(p.returncode == 0, f"--api-key: {p.stdout.strip()} {p.stderr.strip()}")
        check(not leftovers(slots), "nothing left with the API key flows")
    finally:
        srv.stop()

    print("| ctk | ctv | fa | restored | prompt_n after | KL native | KL restored | bound |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return exit_status(failures, skipped)


if __name__ == "__main__":
    sys.exit(main())
