#!/usr/bin/env python3
"""kvsnap serve in front of the bed's real llama-server (issue 14, parts 1 to 6).

  serve_test.py KVSNAP LLAMA_SERVER FIXTURES WORKDIR [OPENAI_PYTHON]

A direct llama-server and `kvsnap serve -- llama-server` with the same arguments get the same
requests in the same order; then:
  1. /health, /props, /tokenize, /completion, /v1/chat/completions answers are identical (status
     and JSON, timing fields and the random chat id aside);
  2. a streamed /completion and /v1/chat/completions are byte-identical to direct access (the values
     of timings, ids and times masked, the SSE framing not) and arrive chunked; a 64-token stream
     comes in several HTTP chunks (not held back whole); one connection carries 4 requests
     (keep-alive), a stream among them; a request body sent chunked gets the direct answer;
  3. malformed JSON, a missing prompt and an unknown route: the child's status and body, untouched;
  4. 8 concurrent clients through the proxy all get complete answers;
  5. persistence: `kvsnap ls --tag serve.ns=...` shows the slots saved after completions, the
     X-Kvsnap-Session namespace kept apart; a conversation's next turn writes at most half of its
     chunks (the ones of its first 512 tokens are shared with the turn before);
  6. the child SIGKILLed is restarted and serving resumes;
  7. SIGTERM to kvsnap serve saves the slot last used and leaves no llama-server process;
  8. prefix restore: a conversation saved at f16 continues after restarts at q8_0/q8_0 and
     q4_0/q8_0 evaluating only its suffix (timings.prompt_n <= 8); another namespace gets nothing
     restored; a chat's next turn evaluates only its new tokens; 3 conversations through -np 1;
     6 sessions back to back through -np 1 are each saved before the next takes the slot;
  9. part 4 and 5, with API keys from --api-key-file and LLAMA_API_KEY: GET /kvsnap/usage matches
     `kvsnap ls` and `kvsnap info`'s size table of the slot file; a requantize dry run changes
     nothing; a bad type is a 400 and serving continues; POST /kvsnap/requantize to q4_0 answers
     200 with the dry run's bytes and the next turn evaluates <= 8 tokens (counted as reused); a
     completion in flight finishes first; a restart the child refuses rolls back; two API keys are
     isolated; the same as an operator would run it (-fa auto, -np 2, a streamed chat); with
     --admin-key-file and KVSNAP_ADMIN_KEY kvsnap's routes take those keys only, not the child's;
 10. --dynamic-cache f16,q8_0,q4_0 --cache-budget: a slot filled to 90% of its context steps the cache
     down once, to q8_0 with the context the budget holds there, and the conversation goes on;
 11. SWA and hybrid models: what llama-server evaluates after a restore is what the log and
     /kvsnap/usage say (not_reused for iSWA without --swa-full);
 12. disk full (root only: two tmpfs): the store's own disk, then the slot directory's; completions
     answer, the failed saves are logged and counted, saving works again with room;
 13. SIGINT during a streamed completion: the stream completes, the slot is saved, no child left;
     kvsnap serve SIGKILLed: its llama-server and lifeline watchdog exit too, with the parent-death
     signal and without it (the lifeline alone, as on macOS), and a llama-server deaf to SIGTERM is
     SIGKILLed;
 14. llama-server's config.ini: every case of tests/serve/llama_config_cases.json (the grammar
     table kvsnap's unit tests read) run through this llama-server, which must do what the table
     says (refuse the file, or apply which flash-attn value); then a conversation saved at f16
     continues through `kvsnap serve` whose child gets q8_0 caches from a config.ini only
     ($XDG_CONFIG_HOME), evaluating only its suffix (the restore converted for the config's types);
 15. a client that hangs up on a stream sent with an X-Conversation-Id (llama-server generates on
     for a resume): the whole exchange is saved once the child ends it, and GET /v1/stream?conv_id=
     through kvsnap answers with what llama-server kept of the stream, its last event included;
 16. two clients that pin their completions to the same slot (id_slot 0, -np 2): the second waits in
     kvsnap until the first has ended and is saved, so both conversations are in the store;
 17. two stored conversations continued at once after a restart (-np 2): each is restored into a
     slot of its own, each evaluates only its suffix, and both continuations are saved;
 18. a client that hangs up on a completion not streamed: llama-server's task is cancelled (as
     with direct access, where llama-server sees its own connection close), the slot stops well
     short of n_predict, and the next completion is answered.
 19. cache settings: a conversation saved at the model's RoPE base is not restored into a child with
     --rope-freq-base 5000, one saved under it is, nor into a child restarted after its config.ini
     gained a rope-freq-base; POST /lora-adapters is refused (403); with a LoRA adapter loaded, a plain
     request after one with its own "lora" scales is evaluated anew, a conversation of its own scales
     is not kept, an Anthropic-route request finds no slot of other scales, and own scales are
     refused (400) while the child keeps its RAM prompt cache; with
     LLAMA_ATTN_ROT_DISABLE=1 a session saved at f16 continues at q8_0 (and one saved at q8_0 at f16)
     with the answer of a full evaluation in the same child.
With OPENAI_PYTHON (a Python with the `openai` package), one chat goes through the openai client.
Needs only the Python standard library otherwise.
"""
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from default_signals import restore_default_signals  # noqa: E402
from test_outcome import exit_status  # noqa: E402
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback import free_port  # noqa: E402  (tests/loopback.py)

FAILS = []
SKIPPED = []  # checks this machine could not run (test_outcome.py; an audit's finding: they passed)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS.append(what)


def request(port, method, path, body=None, headers=None, timeout=120):
    """(status, headers dict (lower-case names), raw body bytes)"""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"} if data is not None else {}
    h.update(headers or {})
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    raw = r.read()
    hd = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hd, raw


def wait_health(port, proc, what, deadline_s=120):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        try:
            if request(port, "GET", "/health", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not become healthy")


# Fields that differ between any two runs of llama-server: timings, the chat id, and /props'
# media_marker (a random string each server process draws at start).
TIMING = {"timings", "created", "id", "prompt_ms", "predicted_ms", "t_load", "t_start", "media_marker"}


def strip(j):
    if isinstance(j, dict):
        return {k: strip(v) for k, v in j.items() if k not in TIMING}
    if isinstance(j, list):
        return [strip(v) for v in j]
    return j


def events(raw):
    out = []
    for line in raw.decode().split("\n"):
        if line.startswith("data: "):
            d = line[6:]
            out.append(d if d == "[DONE]" else strip(json.loads(d)))
    return out


def children_of(pid):
    """Children of every thread of pid (a restarted child is the monitor thread's)."""
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def llama_children(pid):
    """kvsnap serve's llama-server (its other child is the lifeline watchdog, named kvsnap-lifeline)."""
    return [k for k in children_of(pid) if comm(k) != "kvsnap-lifeline"]


def watchdogs(pid):
    return [k for k in children_of(pid) if comm(k) == "kvsnap-lifeline"]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def ls(kvsnap, store, *extra):
    p = subprocess.run([kvsnap, "ls", "--store", store, "--json", *extra], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"kvsnap ls failed: {p.stderr}")
    return json.loads(p.stdout)


def wait_for(pred, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    return pred()


def settled_reuse(port, headers=None):
    """/kvsnap/usage's reuse counters once the last answer is counted: kvsnap counts a reuse after the
    answer has gone to the client, so a client that asks at once may be ahead of the count."""
    def get():
        s, _, raw = request(port, "GET", "/kvsnap/usage", headers=headers or {})
        return json.loads(raw)["counters"]["reuse"] if s == 200 else {}
    return wait_for(lambda: (lambda r: r if r.get("reused", 0) + r.get("not_reused", 0) >= 1 else None)(get()), 10) \
        or get()


def main():
    restore_default_signals()
    kvsnap, llama, fixtures, work = sys.argv[1:5]
    openai_python = sys.argv[5] if len(sys.argv) > 5 else ""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    store = os.path.join(work, "store")
    model = os.path.join(fixtures, "models", "tiny-hd64.gguf")
    args = ["-m", model, "-c", "4096", "-np", "2", "-t", "1", "--no-warmup", "--seed", "42", "--metrics"]

    dport = free_port()
    direct_log = open(os.path.join(work, "direct.log"), "w")
    direct = subprocess.Popen([llama, *args, "--host", "127.0.0.1", "--port", str(dport)], stdout=direct_log,
                              stderr=subprocess.STDOUT)
    pport = free_port()
    serve_log = open(os.path.join(work, "serve.log"), "w")
    serve = subprocess.Popen([kvsnap, "serve", "--listen", f"127.0.0.1:{pport}", "--store", store, "--log",
                              os.path.join(work, "child.log"), "--", llama, *args], stdout=serve_log,
                             stderr=subprocess.STDOUT)
    SERVES.append(serve)
    try:
        wait_health(dport, direct, "direct llama-server")
        wait_health(pport, serve, "kvsnap serve")
        run_checks(kvsnap, store, dport, pport, serve, openai_python, os.path.join(work, "serve.log"))
        serve_log.close()
        print(open(os.path.join(work, "serve.log")).read())
        run_prefix_restore(kvsnap, llama, model, work)
        run_config_ini(kvsnap, llama, model, work)
        run_cache_settings(kvsnap, llama, model, work)
        run_lora_scales(kvsnap, llama, model, work)
        run_config_edited(kvsnap, llama, model, work)
        run_rotation_disabled(kvsnap, llama, model, work)
        run_conversation_id_hangup(kvsnap, llama, model, work)
        run_non_stream_hangup(kvsnap, llama, model, work)
        run_same_slot_pins(kvsnap, llama, model, work)
        run_concurrent_restores(kvsnap, llama, model, work)
        run_tenant_per_namespace(kvsnap, llama, model, work)
        run_back_to_back(kvsnap, llama, model, work)
        run_many_clients(kvsnap, llama, model, work)
        run_many_clients(kvsnap, llama, model, work, np=None)
        run_tied_chats(kvsnap, llama, model, work)
        run_requantize(kvsnap, llama, model, work)
        run_requantize_chat(kvsnap, llama, model, work)
        run_admin_key(kvsnap, llama, model, work)
        run_caps_logged(kvsnap, llama, model, work)
        run_ladder(kvsnap, llama, model, work)
        run_swa_hybrid(kvsnap, llama, model, work)
        run_disk_full(kvsnap, llama, model, work)
        run_sigint_in_flight(kvsnap, llama, model, work)
        run_serve_sigkilled(kvsnap, llama, model, work)
    finally:
        if direct.poll() is None:
            direct.kill()
            direct.wait()
        for p in SERVES:
            stop_quietly(p)
    return exit_status(FAILS, SKIPPED)


def run_swa_hybrid(kvsnap, llama, model, work):
    """Part 5 for SWA and hybrid models: a conversation saved at f16, the child restarted at q8_0, the same
    prompt plus a few words. Whatever llama-server evaluates (timings.prompt_n), /kvsnap/usage and the log
    must say it as it is. Measured with 3.22.1: the iSWA fixture (window 32) evaluates the whole prompt
    (no context checkpoint in a slot file), with --swa-full only the new words, and the same answer as a
    full evaluation; the hybrid fixture (attention + recurrent) only the new words."""
    models = os.path.dirname(model)
    more = PROMPT + SUFFIX + " the"
    for name, extra in (("tiny-iswa", []), ("tiny-iswa", ["--swa-full"]), ("tiny-hybrid", [])):
        tag = f"swa-{name}{extra and '-full' or ''}"
        store = os.path.join(work, tag + "-store")
        base = ["-m", os.path.join(models, name + ".gguf"), "-c", "4096", "-np", "1", "-t", "1", "--no-warmup",
                "-fa", "on", *extra]
        proc, port, log = start_serve(kvsnap, llama, store, work, tag + "-a", base)
        request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0})
        stop_serve(proc, log, tag + "-a", work)
        proc, port, log = start_serve(kvsnap, llama, store, work, tag, [*base, "-ctk", "q8_0", "-ctv", "q8_0"])
        n_total = len(json.loads(request(port, "POST", "/tokenize", {"content": more, "add_special": True})[2])["tokens"])
        ask = {"prompt": more, "n_predict": 1, "temperature": 0, "n_probs": 3}
        s, _, raw = request(port, "POST", "/completion", ask)
        j = json.loads(raw)
        n = j["timings"]["prompt_n"]
        reuse = settled_reuse(port)
        anew = json.loads(request(port, "POST", "/completion", {**ask, "cache_prompt": False})[2])
        text = stop_serve(proc, log, tag, work)
        line = next((l for l in text.splitlines() if "prefix: reuse" in l), "")
        restored = int(re.search(r"\((\d+) restored\)", line).group(1)) if line else 0
        reused = n <= n_total - restored + 1
        kind = "hybrid model" if "hybrid" in name else "SWA model (sliding window 32)"
        check(s == 200 and restored > 0 and reuse["reused"] == int(reused) and reuse["not_reused"] == int(not reused)
              and reuse["last_prompt_n"] == n and f"evaluated {n} of {n_total}" in line and kind in line and
              ("NOT reused" in line) != reused,
              f"{tag}: after a restart at q8_0 the child evaluates {n} of {n_total} tokens ({restored} restored), "
              f"usage counts {reuse}, the log says: {line.split('prefix: ')[-1]}")
        top = lambda a: [(p["id"], round(p["logprob"], 3)) for p in a["completion_probabilities"][0]["top_logprobs"]]
        same = [x[0] for x in top(j)] == [x[0] for x in top(anew)] and \
            all(abs(x[1] - y[1]) < 0.01 for x, y in zip(top(j), top(anew)))
        check(reused == (name == "tiny-hybrid" or extra == ["--swa-full"]) and same,
              f"{tag}: {'reused' if reused else 'evaluated anew'} as measured with 3.22.1; the answer's top tokens "
              f"{top(j)} are a full evaluation's ({top(anew)})")


def run_disk_full(kvsnap, llama, model, work):
    """The store's disk full while serving: the store on a 4 MiB tmpfs, kvsnap's slot directory (STORE/serve) on
    a second one. First the store's own disk fills (the slot file is written, the store's write of it fails),
    then the slot directory's (llama-server cannot write the slot file): each time completions answer 200 and
    the failed save is logged and counted; with room again saving works. Needs to mount (root); else skipped."""
    mnt = os.path.join(work, "small-disk")
    store = os.path.join(mnt, "store")
    serve_dir = os.path.join(store, "serve")
    os.makedirs(mnt, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], capture_output=True).returncode != 0:
        print("SKIP the store's disk full: cannot mount a tmpfs here (not root)")
        SKIPPED.append("the store's and the slot directory's disk full (no tmpfs mount)")
        return
    mounted = [mnt]
    try:
        os.makedirs(serve_dir)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", serve_dir], check=True)
        mounted.append(serve_dir)
        args = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
        proc, port, log = start_serve(kvsnap, llama, store, work, "disk-full", args)
        log_path = os.path.join(work, "disk-full.log")

        def fill(where):
            path = os.path.join(where, "filler")
            with open(path, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            return path

        def outcomes():  # each save's outcome, in order
            with open(log_path) as f:
                return [l for l in f.read().splitlines()
                        if "failed (serving continues)" in l or ") saved as snapshot" in l]

        for n, (where, what) in enumerate(((mnt, "the store's disk"), (serve_dir, "the slot directory's disk"))):
            filler = fill(where)
            s, _, _ = request(port, "POST", "/completion", {"prompt": f"{n}: " + PROMPT, "n_predict": 2,
                                                            "temperature": 0})
            wait_for(lambda: len(outcomes()) >= 2 * n + 1, 30)
            s2, _, _ = request(port, "POST", "/completion", {"prompt": f"{n}: still serving?", "n_predict": 2})
            done = wait_for(lambda: outcomes()[2 * n:] if len(outcomes()) >= 2 * n + 2 else None, 30) or []
            failed = [l for l in done if "failed (serving continues)" in l]
            line = failed[0].split("(serving continues): ")[-1] if failed else "no failure logged"
            # first the store's own write fails (llama-server wrote the slot file), then llama-server's;
            # the store's first write may be its catalog's (SQLite's words) or a blob's (the kernel's)
            from_store = not line.startswith("llama-server ") and ("No space left" in line or "disk is full" in line)
            check(s == 200 and s2 == 200 and bool(failed) and (from_store if n == 0 else not from_store),
                  f"disk full ({what}): the completion answers {s}, serving continues, the failed save is logged: "
                  f"{line[:300]}")
            check(len(failed) == 2 and not [f for f in os.listdir(os.path.join(serve_dir, "slots"))
                                             if f.startswith("kvsnap-")],
                  f"disk full ({what}): both saves failed ({len(failed)}), no slot file left behind")
            os.remove(filler)
        s, _, _ = request(port, "POST", "/completion", {"prompt": "Room again: " + PROMPT, "n_predict": 2,
                                                        "temperature": 0})
        saved = wait_for(lambda: len(ls(kvsnap, store)) >= 1, 30)
        text = stop_serve(proc, log, "disk-full", work)
        counted = re.search(r"stopped: (\d+) slot saves, (\d+) failed", text)
        check(s == 200 and bool(saved) and counted is not None and int(counted.group(2)) == 4,
              f"disk full: saving works again with room ({len(ls(kvsnap, store))} snapshots); the failures counted: "
              + next((l for l in text.splitlines() if "stopped:" in l), "?"))
    finally:
        for m in reversed(mounted):
            subprocess.run(["umount", m])


def run_sigint_in_flight(kvsnap, llama, model, work):
    """SIGINT while a streamed completion is generating: the client gets the whole stream, its slot is saved into
    the store before the child stops, kvsnap exits 0 and leaves no llama-server."""
    store = os.path.join(work, "sigint-store")
    args = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "sigint", args)
    kids = children_of(proc.pid)
    got = {}

    n_predict = 3700  # ~3 s here: long enough that the waiters below are still waiting when SIGINT comes

    def stream():
        got["answer"] = request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": n_predict,
                                                              "ignore_eos": True, "temperature": 0, "stream": True})
        got["ended"] = time.monotonic()
    th = threading.Thread(target=stream)
    th.start()
    busy = wait_for(lambda: any(x.get("is_processing") for x in json.loads(request(port, "GET", "/slots")[2])), 10)
    # two more completions wait at the slot gate (-np 1): the SIGINT refuses them (503), it does not
    # forward each in turn while the shutdown waits
    waiting, answered = [], []

    def waiter(i):
        waiting.append(request(port, "POST", "/completion", {"prompt": f"{i} {PROMPT}", "n_predict": 8,
                                                             "temperature": 0})[0])
        answered.append(time.monotonic())
    waiters = [threading.Thread(target=waiter, args=(i,)) for i in range(2)]
    for w in waiters:
        w.start()
    time.sleep(0.5)
    still = any(x.get("is_processing") for x in json.loads(request(port, "GET", "/slots")[2]))
    proc.send_signal(signal.SIGINT)
    th.join()
    for w in waiters:
        w.join()
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    log.close()
    text = open(os.path.join(work, "sigint.log")).read()
    s, _, raw = got.get("answer", (None, {}, b""))
    last = [json.loads(l[6:]) for l in raw.decode().split("\n") if l.startswith("data: {")][-1:] or [{}]
    snaps = ls(kvsnap, store)
    check(busy and s == 200 and last[0].get("stop") is True and last[0].get("tokens_predicted") == n_predict,
          f"SIGINT during a streamed completion: the client gets the whole stream ({s}, "
          f"{last[0].get('tokens_predicted')} tokens)")
    check(rc == 0 and "got SIGINT" in text and len(snaps) == 1 and snaps[0]["n_tokens"] >= n_predict and
          kids and not any(alive(k) for k in kids),
          f"SIGINT: kvsnap serve exits {rc}, the slot is in the store "
          f"({[x['n_tokens'] for x in snaps]} tokens), no llama-server left ({kids})")
    check(still and sorted(waiting) == [503, 503] and all(t < got.get("ended", 0) for t in answered),
          f"SIGINT: the completions waiting for the slot are refused at once, before the stream in flight ends, "
          f"not run in turn ({waiting}; the stream still generating at the signal: {still})")


def run_serve_sigkilled(kvsnap, llama, model, work):
    """kvsnap serve killed with SIGKILL (it cannot stop anything then): its llama-server goes too, and so
    does the lifeline watchdog. Twice: with both guards (Linux's parent-death signal and the lifeline), and
    with the lifeline alone (KVSNAP_SERVE_NO_PDEATHSIG=1: the macOS path). Then a llama-server that does not
    act on SIGTERM (stopped with SIGSTOP, as one that lost the signal) is SIGKILLed after the lifeline's
    grace (5 s), with both guards again."""
    args = ["-m", model, "-c", "1024", "-np", "1", "-t", "1", "--no-warmup"]
    for tag, name, env, stopped in (
            ("sigkill", "both guards", None, False),
            ("sigkill-lifeline", "the lifeline alone", {**os.environ, "KVSNAP_SERVE_NO_PDEATHSIG": "1"}, False),
            ("sigkill-deaf", "a llama-server deaf to SIGTERM", None, True)):
        proc, port, log = start_serve(kvsnap, llama, os.path.join(work, tag + "-store"), work, tag, args, env=env)
        kids, dogs = llama_children(proc.pid), watchdogs(proc.pid)
        check(len(kids) == 1 and len(dogs) == 1 and os.getpgid(dogs[0]) == kids[0],
              f"{name}: kvsnap serve runs llama-server {kids} and a lifeline watchdog {dogs} in its group")
        if stopped:
            for k in kids:
                os.kill(k, signal.SIGSTOP)
        proc.kill()
        proc.wait()
        log.close()
        every = kids + dogs
        gone = wait_for(lambda: kids and not any(alive(k) for k in every), 30)
        for k in every:
            if alive(k):
                os.kill(k, signal.SIGKILL)
        check(bool(gone), f"kvsnap serve SIGKILLed, {name}: its llama-server and watchdog {every} exit")


SERVES = []  # every kvsnap serve started: stopped at the end whatever happens


def stop_quietly(proc):
    """SIGTERM (kvsnap serve then stops its llama-server); SIGKILL to both after 30 s."""
    if proc.poll() is not None:
        return
    kids = children_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for k in kids:
        if alive(k):
            os.kill(k, signal.SIGKILL)


def start_serve(kvsnap, llama, store, work, name, args, env=None, serve_args=()):
    port = free_port()
    log = open(os.path.join(work, name + ".log"), "w")
    proc = subprocess.Popen([kvsnap, "serve", "--listen", f"127.0.0.1:{port}", "--store", store, "--log",
                             os.path.join(work, name + "-child.log"), *serve_args, "--", llama, *args], stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    SERVES.append(proc)
    wait_health(port, proc, name)
    return proc, port, log


def stop_serve(proc, log, name, work):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    log.close()
    return open(os.path.join(work, name + ".log")).read()


PROMPT = ("The old lighthouse keeper climbed the spiral stairs every evening, counting the steps and "
          "listening to the sea below, until one night the light would not turn on.")
SUFFIX = " Then"


def run_prefix_restore(kvsnap, llama, model, work):
    """Part 3: a conversation saved at f16 continues after a restart at q8_0/q8_0 (and at q4_0/q8_0)
    evaluating only its new tokens; another namespace gets nothing restored."""
    store = os.path.join(work, "prefix-store")
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "prefix-f16", base)
    n_prompt = len(json.loads(request(port, "POST", "/tokenize", {"content": PROMPT, "add_special": True})[2])["tokens"])
    n_full = len(json.loads(request(port, "POST", "/tokenize",
                                    {"content": PROMPT + SUFFIX, "add_special": True})[2])["tokens"])
    s, _, raw = request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0})
    first = json.loads(raw)["timings"]["prompt_n"]
    check(s == 200 and first >= n_prompt - 1, f"prefix: the first turn at f16 evaluates its prompt ({first} tokens)")
    text = stop_serve(proc, log, "prefix-f16", work)
    check("saved as snapshot" in text, "prefix: the conversation is in the store after SIGTERM")
    for ctk, ctv in (("q8_0", "q8_0"), ("q4_0", "q8_0")):
        name = f"prefix-{ctk}-{ctv}"
        proc, port, log = start_serve(kvsnap, llama, store, work, name, [*base, "-ctk", ctk, "-ctv", ctv])
        # another namespace first: nothing of 'default' may be restored for it
        s, _, raw = request(port, "POST", "/completion", {"prompt": PROMPT + SUFFIX, "n_predict": 1, "temperature": 0},
                            headers={"X-Kvsnap-Session": f"someone-else-{ctk}"})  # new each round
        other = json.loads(raw)["timings"]["prompt_n"]
        check(s == 200 and other >= n_prompt, f"prefix ({ctk}/{ctv}): another namespace gets no restore "
                                              f"(evaluates {other} of {n_full} tokens)")
        # the slot now holds the other tenant's tokens: llama-server's own cache, not kvsnap's restore, would
        # reuse them; restart so the returning conversation starts from an empty slot
        text = stop_serve(proc, log, name, work)
        check("prefix: restored" not in text, f"prefix ({ctk}/{ctv}): no restore logged for the other namespace")
        proc, port, log = start_serve(kvsnap, llama, store, work, name + "-2", [*base, "-ctk", ctk, "-ctv", ctv])
        t0 = time.time()
        s, _, raw = request(port, "POST", "/completion", {"prompt": PROMPT + SUFFIX, "n_predict": 1, "temperature": 0})
        ms = (time.time() - t0) * 1000
        j = json.loads(raw)
        n = j["timings"]["prompt_n"]
        check(s == 200 and n <= 8 and n <= n_full - n_prompt + 1,
              f"prefix ({ctk}/{ctv}): after the restart the same prompt + suffix evaluates {n} of {n_full} tokens "
              f"(suffix {n_full - n_prompt}; the request took {ms:.0f} ms with the restore)")
        text = stop_serve(proc, log, name + "-2", work)
        check(f"-> {ctk}/{ctv}" in text and "prefix: reuse" in text,
              f"prefix ({ctk}/{ctv}): the log names the conversion and the reuse")
        print("\n".join(l for l in text.splitlines() if "prefix:" in l))

    # three conversations through one slot (-np 1): the first, when it returns, comes back from the store
    proc, port, log = start_serve(kvsnap, llama, os.path.join(work, "three-store"), work, "three", base)
    convs = [PROMPT, "A second conversation, about the price of apples at the market in the autumn of that year.",
             "A third one, which asks the way to the station and is told to follow the river north."]
    for c in convs:
        request(port, "POST", "/completion", {"prompt": c, "n_predict": 1, "temperature": 0})
    wait_for(lambda: len(ls(kvsnap, os.path.join(work, "three-store"))) >= 3, 30)
    s, _, raw = request(port, "POST", "/completion", {"prompt": PROMPT + SUFFIX, "n_predict": 1, "temperature": 0})
    n = json.loads(raw)["timings"]["prompt_n"]
    text = stop_serve(proc, log, "three", work)
    check(s == 200 and n <= n_full - n_prompt + 1,
          f"prefix: 3 conversations through -np 1, the first returns evaluating {n} of {n_full} tokens")

    # a chat: the first turn at f16, the next (the first plus an answer and a question) after a restart at
    # q8_0; without -fa (llama-server's auto, which kvsnap detects from a slot file)
    chat_store = os.path.join(work, "chat-store")
    first = [{"role": "user", "content": PROMPT}]
    base = base[:-2]
    proc, port, log = start_serve(kvsnap, llama, chat_store, work, "chat-f16", base)
    s, _, raw = request(port, "POST", "/v1/chat/completions", {"messages": first, "max_tokens": 1, "temperature": 0})
    n1 = json.loads(raw)["timings"]["prompt_n"]
    stop_serve(proc, log, "chat-f16", work)
    proc, port, log = start_serve(kvsnap, llama, chat_store, work, "chat-q8", [*base, "-ctk", "q8_0", "-ctv", "q8_0"])
    second = first + [{"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Why?"}]
    s, _, raw = request(port, "POST", "/v1/chat/completions", {"messages": second, "max_tokens": 1, "temperature": 0})
    j = json.loads(raw)
    n2, total = j["timings"]["prompt_n"], j["usage"]["prompt_tokens"]
    text = stop_serve(proc, log, "chat-q8", work)
    check(s == 200 and "prefix: restored" in text and n2 <= total - n1 + 1,
          f"prefix (chat, /apply-template, -fa auto): after a restart at q8_0 the next turn evaluates {n2} of {total} tokens "
          f"(the first turn was {n1})")
    print("\n".join(l for l in text.splitlines() if "prefix:" in l))


def run_cache_settings(kvsnap, llama, model, work):
    """A review's finding: the child's cache-changing flags were no part of a snapshot's identity, and a
    conversation saved at the model's RoPE base was restored into a child started with --rope-freq-base
    5000 (other K for the same tokens). Now it is not; the same settings restore; POST /lora-adapters
    is refused."""
    store = os.path.join(work, "cache-settings-store")
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    rope = [*base, "--rope-freq-base", "5000"]
    ask = {"prompt": PROMPT + SUFFIX, "n_predict": 1, "temperature": 0}
    proc, port, log = start_serve(kvsnap, llama, store, work, "cache-plain", base)
    n_prompt = len(json.loads(request(port, "POST", "/tokenize", {"content": PROMPT, "add_special": True})[2])["tokens"])
    request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0})
    stop_serve(proc, log, "cache-plain", work)
    # a review's finding: slot files a SIGKILLed kvsnap left in serve's slot directory were never removed
    slots = os.path.join(store, "serve", "slots")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = os.path.join(slots, f"kvsnap-save.kvsnap-tmp-{gone.pid}-77.bin")
    live = os.path.join(slots, f"kvsnap-save.kvsnap-tmp-{os.getpid()}-78.bin")
    for f in (dead, live):
        open(f, "wb").write(b"x" * 64)
    proc, port, log = start_serve(kvsnap, llama, store, work, "cache-rope", rope)
    check(not os.path.exists(dead) and os.path.exists(live),
          "serve removes the slot files of a kvsnap that is gone at start, and keeps a running process's")
    os.remove(live)
    s, _, raw = request(port, "POST", "/completion", ask)
    n = json.loads(raw)["timings"]["prompt_n"]
    s2, _, raw2 = request(port, "POST", "/lora-adapters", [{"id": 0, "scale": 0.5}])
    text = stop_serve(proc, log, "cache-rope", work)
    kept = len(ls(kvsnap, store))
    check(kept == 2, f"cache settings: the store holds the two plain turns only ({kept} snapshots)")
    check(s == 200 and n >= n_prompt and "prefix: restored" not in text and "serve.cache=" in text,
          f"cache settings: a conversation saved at the model's RoPE base is not restored into a child with "
          f"--rope-freq-base 5000 (it evaluates {n} tokens, its prompt {n_prompt})")
    check(s2 == 403 and b"lora-scaled" in raw2, f"cache settings: POST /lora-adapters is answered 403 ({s2})")
    # the turn above was saved at shutdown under the child's tag: a child with the same base restores it
    proc, port, log = start_serve(kvsnap, llama, store, work, "cache-rope-2", rope)
    s, _, raw = request(port, "POST", "/completion", {**ask, "prompt": PROMPT + SUFFIX + " the"})
    n = json.loads(raw)["timings"]["prompt_n"]
    text = stop_serve(proc, log, "cache-rope-2", work)
    check(s == 200 and n <= 8 and "prefix: restored" in text,
          f"cache settings: a child with the same --rope-freq-base restores its own conversation (evaluates {n})")


def run_lora_scales(kvsnap, llama, model, work):
    """A review's findings: a request's own LoRA scales ("lora") made a cache that llama-server 3.22.1
    continues for a later request without them (measured: the top token changes), and serve's erase of
    it after the exchange raced other requests and saves. Now, before a request with the loaded scales
    runs in a slot whose last task ran under others (read from the child's /slots), serve erases that
    slot; a conversation of other scales is not kept, and nothing is restored for such a request;
    own scales are refused while the child keeps its RAM prompt cache. With the adapter fixture
    (fixtures/models/tiny-hd64-lora.gguf: kvsnap-mkmodel --lora-rank)."""
    adapter = os.path.join(os.path.dirname(model), "tiny-hd64-lora.gguf")
    store = os.path.join(work, "lora-store")
    base = ["-m", model, "--lora", adapter, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    own = [{"id": 0, "scale": 0.0}]
    top = lambda a: [(p["id"], round(p["logprob"], 3)) for p in a["completion_probabilities"][0]["top_logprobs"]]
    erase_said = "whose cache was made under other LoRA scales than the next request's"

    def ask(port, prompt, lora=None, fresh=False):
        body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "n_probs": 5}
        if lora is not None:
            body["lora"] = lora
        if fresh:
            body["cache_prompt"] = False
        s, _, raw = request(port, "POST", "/completion", body)
        return s, (json.loads(raw) if s == 200 else {"error": raw[:200], "timings": {"prompt_n": -1}})

    def same(a, b):
        return "error" not in a and [x[0] for x in top(a)] == [x[0] for x in top(b)] and \
            max(abs(x[1] - y[1]) for x, y in zip(top(a), top(b))) < 0.02

    shown = lambda a: a.get("error") or top(a)
    proc, port, log = start_serve(kvsnap, llama, store, work, "lora-1", [*base, "--cache-ram", "0"])
    n_prompt = len(json.loads(request(port, "POST", "/tokenize", {"content": PROMPT, "add_special": True})[2])["tokens"])
    sa, _ = ask(port, PROMPT, own)
    sb, b = ask(port, PROMPT + SUFFIX)  # with the loaded scales, in the one slot, after one of its own
    _, b_full = ask(port, PROMPT + SUFFIX, fresh=True)
    _, b_own = ask(port, PROMPT + SUFFIX, own, fresh=True)
    text = stop_serve(proc, log, "lora-1", work)
    check("loaded 1 LoRA adapter" in text and "own scales are served" in text,
          "lora scales: serve reads the child's adapters and says a request's own scales are served")
    check(sa == 200 and sb == 200 and erase_said in text and b["timings"]["prompt_n"] >= n_prompt and
          same(b, b_full) and not same(b, b_own),
          f"lora scales: a request with the loaded scales after one of its own in the same slot finds it erased, is "
          f"evaluated anew ({b['timings']['prompt_n']} of its tokens, the prompt {n_prompt}) and answers as a full "
          f"evaluation ({shown(b)} vs {top(b_full)}; under the other scales {top(b_own)})")
    snaps = ls(kvsnap, store)
    tags = {json.dumps(t.get("tags", {}).get("serve.cache")) for t in snaps}
    check(len(snaps) >= 1 and len(tags) == 1 and "LoRA scales of its own: not kept" in text,
          f"lora scales: only conversations of the loaded scales are kept ({len(snaps)} snapshots, tags {tags})")

    proc, port, log = start_serve(kvsnap, llama, store, work, "lora-2", [*base, "--cache-ram", "0"])
    more = PROMPT + SUFFIX + " the"
    s2, a2 = ask(port, more, own)
    _, a2_full = ask(port, more, own, fresh=True)
    s3, b2 = ask(port, more)
    _, b2_full = ask(port, more, fresh=True)
    s4, _ = ask(port, PROMPT, own)
    s5, _, _ = request(port, "POST", "/v1/messages", {"model": "m", "max_tokens": 1,
                                                      "messages": [{"role": "user", "content": "Hi"}]})
    # a review's finding: serve restored a conversation of the loaded scales for a request the child then
    # refused (a "lora" that is no array), and the slot kept the scales of its last task (its own): a
    # request of those scales went on from what was restored. Now that slot is erased first.
    said = (lambda t: t.count(erase_said))(open(os.path.join(work, "lora-2.log")).read())
    ask(port, more, own)
    s9, _, _ = request(port, "POST", "/completion", {"prompt": more + " again", "n_predict": 1, "lora": "x"})
    s10, a10 = ask(port, more + " again", own)
    _, a10_full = ask(port, more + " again", own, fresh=True)
    text = stop_serve(proc, log, "lora-2", work)
    check(s9 == 400 and s10 == 200 and a10["timings"]["prompt_n"] > 8 and same(a10, a10_full) and
          text.count(erase_said) == said + 2,
          f"lora scales: a request of its own scales in a slot serve restored into for a request the child refused is "
          f"evaluated anew ({s9}; {a10['timings']['prompt_n']} tokens) and answers as a full evaluation under them "
          f"({shown(a10)} vs {top(a10_full)})")
    check(s2 == 200 and "nothing is restored for it" in text and same(a2, a2_full),
          f"lora scales: after a restart a request of its own scales is restored nothing and answers as a full "
          f"evaluation under them ({shown(a2)} vs {top(a2_full)})")
    check(s3 == 200 and "prefix: restored" in text and b2["timings"]["prompt_n"] <= 8 and same(b2, b2_full),
          f"lora scales: then a request with the loaded scales in that slot continues its own restored conversation "
          f"(evaluates {b2['timings']['prompt_n']}) and answers as a full evaluation ({shown(b2)} vs {top(b2_full)})")
    check(s4 == 200 and s5 == 200 and said == 2,
          f"lora scales: an Anthropic-route request (which drops \"lora\"; it runs alone) after one of its own scales "
          f"finds that slot erased ({s4}, {s5}; {said} erases said)")

    proc, port, log = start_serve(kvsnap, llama, os.path.join(work, "lora-store-ram"), work, "lora-ram", base)
    s6, _, raw6 = request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "lora": own})
    s7, _, _ = request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1})
    stop_serve(proc, log, "lora-ram", work)
    check(s6 == 400 and b"--cache-ram 0" in raw6 and s7 == 200,
          f"lora scales: with llama-server's RAM prompt cache on, a request's own scales are refused ({s6}: "
          f"{raw6[:160]!r}) and a plain request is served ({s7})")


def run_config_edited(kvsnap, llama, model, work):
    """A review's finding: the child reads its config.ini again at each restart, and serve kept the cache
    tag of its own start: a rope-freq-base added meanwhile reached the restarted child while serve went on
    restoring the snapshots of the model's base. After the restart serve reads the files again."""
    home = os.path.join(work, "cfg-edit-home")
    env = config_env(home)
    cfg = os.path.join(home, "llama.cpp", "config.ini")
    open(cfg, "w").write("")
    store = os.path.join(work, "cfg-edit-store")
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "cfg-edit", base, env=env)
    n_prompt = len(json.loads(request(port, "POST", "/tokenize", {"content": PROMPT, "add_special": True})[2])["tokens"])
    request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0})
    saved = wait_for(lambda: len(ls(kvsnap, store)) >= 1, 30)
    open(cfg, "w").write("rope-freq-base = 5000\n")
    for k in llama_children(proc.pid):
        os.kill(k, signal.SIGKILL)
    path = os.path.join(work, "cfg-edit.log")
    told = wait_for(lambda: "differ from its last start" in open(path).read(), 120)
    wait_health(port, proc, "cfg-edit")
    s, _, raw = request(port, "POST", "/completion", {"prompt": PROMPT + SUFFIX, "n_predict": 1, "temperature": 0})
    n = json.loads(raw)["timings"]["prompt_n"] if s == 200 else -1
    text = stop_serve(proc, log, "cfg-edit", work)
    check(saved and told and n >= n_prompt and "prefix: restored" not in text,
          f"config edited: after the child's restart with rope-freq-base from its config.ini, the conversation "
          f"saved before is not restored (evaluates {n} tokens, its prompt {n_prompt})")


def run_rotation_disabled(kvsnap, llama, model, work):
    """A review's finding: with LLAMA_ATTN_ROT_DISABLE=1 in serve's environment (the child's too), a
    session saved at f16 was restored at q8_0 rotated, for a child that reads it plain. Now the answer
    after the restore is a full evaluation's, in the same child."""
    env = {**os.environ, "LLAMA_ATTN_ROT_DISABLE": "1"}
    store = os.path.join(work, "rot-off-store")
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "rot-off-f16", base, env=env)
    request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0})
    text = stop_serve(proc, log, "rot-off-f16", work)
    check("unrotated" in text, "unrotated child: serve logs that the child stores quantized caches unrotated")
    for ctk, ctv in (("q8_0", "q8_0"), ("f16", "f16")):
        name = f"rot-off-{ctk}"
        proc, port, log = start_serve(kvsnap, llama, store, work, name, [*base, "-ctk", ctk, "-ctv", ctv], env=env)
        more = PROMPT + SUFFIX + (" the" if ctk == "f16" else "")
        ask = {"prompt": more, "n_predict": 1, "temperature": 0, "n_probs": 5}
        s, _, raw = request(port, "POST", "/completion", ask)
        j = json.loads(raw)
        anew = json.loads(request(port, "POST", "/completion", {**ask, "cache_prompt": False})[2])
        text = stop_serve(proc, log, name, work)
        top = lambda a: [(p["id"], round(p["logprob"], 3)) for p in a["completion_probabilities"][0]["top_logprobs"]]
        gap = max(abs(x[1] - y[1]) for x, y in zip(top(j), top(anew)))
        check(s == 200 and "prefix: restored" in text and j["timings"]["prompt_n"] <= 8 and
              [x[0] for x in top(j)] == [x[0] for x in top(anew)] and gap < 0.02,
              f"unrotated child ({ctk}/{ctv}): after the restore (evaluating {j['timings']['prompt_n']}) the top tokens "
              f"{top(j)} are a full evaluation's ({top(anew)}; largest logprob gap {gap:.4f})")


def config_env(home):
    """An environment whose llama-server reads HOME/llama.cpp/config.ini as its user's config file."""
    os.makedirs(os.path.join(home, "llama.cpp"), exist_ok=True)
    return dict(os.environ, XDG_CONFIG_HOME=home, HOME=home)


def run_config_ini(kvsnap, llama, model, work):
    """Part 14: llama-server's config.ini, read as llama-server reads it."""
    check(not os.path.exists("/etc/llama.cpp/config.ini"),
          "config.ini: this machine has no /etc/llama.cpp/config.ini (it would be read beside the test's)")
    # The grammar table: what this llama-server does with each file.
    table = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve", "llama_config_cases.json")
    cases = json.load(open(table))["cases"]
    home = os.path.join(work, "config-grammar")
    env = config_env(home)
    wrong = []
    for c in cases:
        with open(os.path.join(home, "llama.cpp", "config.ini"), "wb") as f:
            f.write(c["text"].encode("latin-1"))
        p = subprocess.run([llama, "-m", os.path.join(home, "absent.gguf"), "--port", "1"], env=env,
                           capture_output=True, timeout=120)
        out = (p.stdout + p.stderr).decode("latin-1")
        m = re.search(r"unknown value for --flash-attn: '(.*)'", out)
        if "failed to parse server config file" in out:
            got = "refused"
        elif m:
            got = "fa=" + m.group(1)
        elif "failed to open GGUF file" in out or "failed to load model" in out:
            got = "none"
        else:
            got = "unexpected: " + out[-400:]
        if got != c["expect"] or p.returncode == 0:
            wrong.append(f"{c['text']!r}: the table says {c['expect']!r}, llama-server {got!r} (exit {p.returncode})")
    check(not wrong and len(cases) >= 50,
          f"config.ini: llama-server does what the grammar table says for all {len(cases)} files" +
          "".join("\n    " + w for w in wrong))

    # A config.ini llama-server would not start with: kvsnap serve refuses it, naming the file and line.
    home = os.path.join(work, "config-bad")
    env = config_env(home)
    bad = os.path.join(home, "llama.cpp", "config.ini")
    with open(bad, "w") as f:
        f.write("[*]\n  cache-type-k = q8_0\n")
    p = subprocess.run([kvsnap, "serve", "--store", os.path.join(work, "config-bad-store"), "--listen",
                        f"127.0.0.1:{free_port()}", "--", llama, "-m", model], env=env, capture_output=True,
                       text=True, timeout=120)
    check(p.returncode != 0 and bad in p.stderr and "line 2" in p.stderr,
          f"config.ini: kvsnap serve refuses a file llama-server would not start with (exit {p.returncode}: "
          f"{p.stderr.strip()[-200:]})")

    # A conversation saved at f16, then served by a child whose q8_0 caches come from config.ini alone.
    store = os.path.join(work, "config-store")
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    clean = config_env(os.path.join(work, "config-none"))
    proc, port, log = start_serve(kvsnap, llama, store, work, "config-f16", base, env=clean)
    s, _, raw = request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0})
    n_full = len(json.loads(request(port, "POST", "/tokenize",
                                    {"content": PROMPT + SUFFIX, "add_special": True})[2])["tokens"])
    text = stop_serve(proc, log, "config-f16", work)
    check(s == 200 and "saved as snapshot" in text, "config.ini: the conversation is saved at f16")
    home = os.path.join(work, "config-q8")
    env = config_env(home)
    with open(os.path.join(home, "llama.cpp", "config.ini"), "w") as f:
        f.write("; the cache types come from here only\n[*]\ncache-type-k = q8_0\nLLAMA_ARG_CACHE_TYPE_V = q8_0\n")
    proc, port, log = start_serve(kvsnap, llama, store, work, "config-q8", base, env=env)
    s, _, raw = request(port, "POST", "/completion", {"prompt": PROMPT + SUFFIX, "n_predict": 1, "temperature": 0})
    n = json.loads(raw)["timings"]["prompt_n"] if s == 200 else -1
    text = stop_serve(proc, log, "config-q8", work)
    child = open(os.path.join(work, "config-q8-child.log"), errors="replace").read()
    check("using config file: " + os.path.join(home, "llama.cpp", "config.ini") in child,
          "config.ini: the child llama-server read the file")
    check("read llama-server's config file" in text and "cache-type-k = q8_0" in text,
          "config.ini: kvsnap serve logs the file and the settings it took from it")
    check(s == 200 and "-> q8_0/q8_0" in text and 0 <= n <= 8,
          f"config.ini: the f16 conversation restored into the config's q8_0/q8_0 child evaluates {n} of {n_full} "
          f"tokens")
    print("\n".join(l for l in text.splitlines() if "config" in l or "prefix:" in l))


def run_conversation_id_hangup(kvsnap, llama, model, work):
    """Part 15: a hang-up on a resumable stream (X-Conversation-Id) is saved whole."""
    store = os.path.join(work, "conv-store")
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "conv-hangup", base)
    n_prompt = len(json.loads(request(port, "POST", "/tokenize", {"content": PROMPT, "add_special": True})[2])["tokens"])
    # Long enough to be still generating when kvsnap sees the hang-up; the grammar makes every token
    # text, so that the stream has an event per token (the tiny model's own tokens make none).
    n_predict = 1500
    data = json.dumps({"prompt": PROMPT, "n_predict": n_predict, "temperature": 0, "stream": True,
                       "ignore_eos": True, "grammar": "root ::= [a-z ]+"}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"X-Conversation-Id: conv-hangup-1\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        raw = b""
        while b"data: " not in raw:
            b = s.recv(4096)
            if not b:
                break
            raw += b
    # hung up after the first event; llama-server generates the rest into the slot
    snaps = wait_for(lambda: ls(kvsnap, store), 60)
    n = max((x.get("n_tokens", 0) for x in snaps), default=0)
    check(len(snaps) == 1 and n >= n_prompt + n_predict - 1,
          f"X-Conversation-Id hang-up: the exchange is saved whole once the child ends it "
          f"({len(snaps)} snapshot(s), {n} tokens; the prompt is {n_prompt}, {n_predict} generated)")
    st, _, body = request(port, "GET", "/v1/stream?conv_id=conv-hangup-1")
    events = body.decode(errors="replace").count("data: ")
    check(st == 200 and b'"stop":true' in body,
          f"X-Conversation-Id hang-up: GET /v1/stream?conv_id= through kvsnap answers with what llama-server kept "
          f"of the stream, its last event included ({st}, {events} events)")
    text = stop_serve(proc, log, "conv-hangup", work)
    print("\n".join(l for l in text.splitlines() if "persist" in l or "saved" in l)[-2000:])


def run_non_stream_hangup(kvsnap, llama, model, work):
    """Part 18: a hang-up on a completion not streamed cancels llama-server's task."""
    store = os.path.join(work, "nostream-store")
    # --context-shift: generation goes on past the slot's context (4096, the model's), so that uncut
    # it runs for several seconds (~2,000 tokens/s here); the grammar makes every token text, so
    # that the tiny model does not stop early.
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "--context-shift"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "nostream-hangup", base)
    n_predict = 15000
    data = json.dumps({"prompt": PROMPT, "n_predict": n_predict, "temperature": 0, "ignore_eos": True,
                       "grammar": "root ::= [a-z ]+"}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        busy = wait_for(lambda: any(x.get("is_processing") for x in json.loads(request(port, "GET", "/slots")[2])), 10)
        check(busy, "non-streamed hang-up: the completion is running before the client hangs up")
    # Hung up: kvsnap cuts its connection to the child within 0.25 s. llama-server looks at that
    # connection only when a second passes without any task's result (server_response::
    # recv_with_timeout restarts its wait at each one), so /slots is asked every 2 s, not more often.
    idle = False
    for _ in range(30):
        time.sleep(2)
        if not any(x.get("is_processing") for x in json.loads(request(port, "GET", "/slots")[2])):
            idle = True
            break
    check(idle, "non-streamed hang-up: the slot is idle again")
    child_log = open(os.path.join(work, "nostream-hangup-child.log"), errors="replace").read()
    ends = [l.strip() for l in child_log.splitlines() if "cancel task" in l or "stop processing" in l]
    check(any("cancel task" in l for l in ends),
          f"non-streamed hang-up: llama-server cancelled the task, as when its own client hangs up {ends}")
    st, _, body = request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 4, "temperature": 0})
    check(st == 200 and json.loads(body).get("tokens_predicted") == 4,
          f"non-streamed hang-up: the next completion is answered ({st})")
    text = stop_serve(proc, log, "nostream-hangup", work)
    print("\n".join(l for l in text.splitlines() if "persist" in l or "saved" in l)[-1000:])


def run_same_slot_pins(kvsnap, llama, model, work):
    """Part 16: two completions pinned to one slot: both conversations saved."""
    store = os.path.join(work, "pin-store")
    base = ["-m", model, "-c", "4096", "-np", "2", "-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "same-slot", base)
    other = "A second conversation, about the price of apples at the market in the autumn of that year."
    n_a = len(json.loads(request(port, "POST", "/tokenize", {"content": PROMPT, "add_special": True})[2])["tokens"])
    n_b = len(json.loads(request(port, "POST", "/tokenize", {"content": other, "add_special": True})[2])["tokens"])
    n_predict = 1500  # long enough that the second client arrives while the first is generating
    first_event = threading.Event()
    result = {}

    def long_one():
        result["a"] = raw_chunked(port, "/completion", {"prompt": PROMPT, "n_predict": n_predict, "temperature": 0,
                                                        "stream": True, "ignore_eos": True,
                                                        "grammar": "root ::= [a-z ]+", "id_slot": 0},
                                  first_event)[2]
        first_event.set()

    t = threading.Thread(target=long_one)
    t.start()
    first_event.wait(60)
    s_b, _, raw_b = request(port, "POST", "/completion", {"prompt": other, "n_predict": 1, "temperature": 0,
                                                          "id_slot": 0})
    t.join(120)
    snaps = wait_for(lambda: (lambda v: v if len(v) >= 2 else None)(ls(kvsnap, store)), 30) or ls(kvsnap, store)
    sizes = sorted(x.get("n_tokens", 0) for x in snaps)
    text = stop_serve(proc, log, "same-slot", work)
    check(s_b == 200 and b'"stop":true' in result.get("a", b""), "same slot: both completions answered")
    check(any(n >= n_a + n_predict - 1 for n in sizes) and any(n_b <= n <= n_b + 1 for n in sizes),
          f"same slot: both conversations pinned to slot 0 are saved (snapshots of {sizes} tokens; the first "
          f"is {n_a} + {n_predict} generated, the second {n_b} + 1)")


def run_concurrent_restores(kvsnap, llama, model, work):
    """Part 17: two prefix restores at once choose two slots."""
    store = os.path.join(work, "two-restores-store")
    base = ["-m", model, "-c", "4096", "-np", "2", "-t", "1", "--no-warmup", "-fa", "on"]
    convs = [PROMPT, "A second conversation, about the price of apples at the market in the autumn of that year."]
    proc, port, log = start_serve(kvsnap, llama, store, work, "two-restores-1", base)
    for c in convs:
        request(port, "POST", "/completion", {"prompt": c, "n_predict": 1, "temperature": 0})
    wait_for(lambda: len(ls(kvsnap, store)) >= 2, 30)
    stop_serve(proc, log, "two-restores-1", work)
    proc, port, log = start_serve(kvsnap, llama, store, work, "two-restores-2", base)
    # both slots hold something first (one unrelated completion each, one at a time), so that the
    # second restore has no empty slot to prefer
    for c in ("A third, unrelated, about the weather at sea.", "A fourth, about a train that was late again."):
        request(port, "POST", "/completion", {"prompt": c, "n_predict": 1, "temperature": 0})
    wait_for(lambda: len(ls(kvsnap, store)) >= 4, 30)
    # the first a 1,500-token stream, the second sent on its first event: the two exchanges overlap
    first_event = threading.Event()
    results = {}

    def long_one():
        results[0] = raw_chunked(port, "/completion", {"prompt": convs[0] + SUFFIX, "n_predict": 1500, "stream": True,
                                                       "temperature": 0, "ignore_eos": True,
                                                       "grammar": "root ::= [a-z ]+"}, first_event)
        first_event.set()
    t = threading.Thread(target=long_one)
    t.start()
    first_event.wait(60)
    s_b, _, raw_b = request(port, "POST", "/completion", {"prompt": convs[1] + SUFFIX, "n_predict": 8,
                                                           "temperature": 0})
    t.join(120)
    events = [json.loads(l[6:]) for l in results.get(0, (0, {}, b""))[2].decode().split("\n")
              if l.startswith("data: {")]
    timings = [e["timings"] for e in events if "timings" in e][-1:] or [{}]
    evaluated = [timings[0].get("prompt_n", -1), json.loads(raw_b)["timings"]["prompt_n"] if s_b == 200 else -1]
    snaps = wait_for(lambda: (lambda v: v if len(v) >= 6 else None)(ls(kvsnap, store)), 30) or ls(kvsnap, store)
    text = stop_serve(proc, log, "two-restores-2", work)
    restored = re.findall(r"prefix: restored snapshot \d+ .* into slot (\d+)", text)
    check(sorted(restored) == ["0", "1"] and all(0 <= n <= 8 for n in evaluated) and len(snaps) >= 6,
          f"two restores at once: each into its own slot (slots {restored}), each evaluates only its suffix "
          f"({evaluated} tokens), both continuations saved ({len(snaps)} snapshots)")


def run_tenant_per_namespace(kvsnap, llama, model, work):
    """--tenant-per-namespace: two namespaces' conversations sealed under their own tenants; after a
    restart each is restored only for its own namespace."""
    store = os.path.join(work, "tenant-store")
    key = os.path.join(work, "tenant.key")
    with open(key, "w") as f:
        f.write("7" * 64 + "\n")
    os.chmod(key, 0o600)
    # two slots: each conversation keeps its own until shutdown saves both
    base = ["-m", model, "-c", "4096", "-np", "2", "-t", "1", "--no-warmup", "-fa", "on"]
    tpn = ["--key-file", key, "--tenant-per-namespace"]
    other = "A second conversation, about the price of apples at the market in the autumn of that year."
    ana, bob = {"X-Kvsnap-Session": "ana"}, {"X-Kvsnap-Session": "bob"}

    def ask(port, prompt, who):
        s, _, raw = request(port, "POST", "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0},
                            headers=who)
        return s, (json.loads(raw)["timings"]["prompt_n"] if s == 200 else raw)

    def n_tokens(port, prompt):
        return len(json.loads(request(port, "POST", "/tokenize", {"content": prompt, "add_special": True})[2])["tokens"])

    proc, port, log = start_serve(kvsnap, llama, store, work, "tenants-1", base, serve_args=tpn)
    n_prompt, n_full = n_tokens(port, PROMPT), n_tokens(port, PROMPT + SUFFIX)
    # a session name that is no tenant name (a space): answered, not kept, and no failed save (a
    # failed save stops every requantize)
    s, _ = ask(port, "A conversation nobody may keep. " + other, {"X-Kvsnap-Session": "no tenant"})
    check(s == 200, "tenants: a session that is no tenant name is answered")
    for prompt, who in ((PROMPT, ana), (other, bob)):
        s, _ = ask(port, prompt, who)
        check(s == 200, f"tenants: {who['X-Kvsnap-Session']}'s first turn")
    wait_for(lambda: "cannot be a tenant" in open(os.path.join(work, "tenants-1.log")).read(), 30)
    s, _, raw = request(port, "GET", "/kvsnap/usage")
    failed = json.loads(raw)["counters"]["saves"]["failed"] if s == 200 else raw
    check(failed == 0, f"tenants: the session that is no tenant name counts no failed save ({failed})")
    text = stop_serve(proc, log, "tenants-1", work)
    check("cannot be a tenant" in text, "tenants: the session that is no tenant name is logged")
    for tenant in ("session-ana", "session-bob"):
        rows = ls(kvsnap, store, "--key-file", key, "--tenant", tenant)
        mine = [r for r in rows if (r.get("encryption") or {}).get("tenant") == tenant]
        check(len(mine) >= 1 and len(mine) == len(rows),
              f"tenants: {tenant} sees only its own snapshots, sealed for it ({len(mine)} of {len(rows)})")
    ana_rows = ls(kvsnap, store, "--key-file", key, "--tenant", "session-ana")
    if ana_rows:
        p = subprocess.run([kvsnap, "restore", str(ana_rows[0]["id"]), "-o", os.path.join(work, "tenant-x.slot"),
                            "--store", store, "--key-file", key, "--tenant", "session-bob"], capture_output=True, text=True)
        check(p.returncode != 0, f"tenants: bob's tenant cannot restore ana's snapshot (exit {p.returncode})")

    # bob asks ana's prompt: nothing of ana's may be restored for him
    proc, port, log = start_serve(kvsnap, llama, store, work, "tenants-2", base, serve_args=tpn)
    s, n = ask(port, PROMPT + SUFFIX, bob)
    text = stop_serve(proc, log, "tenants-2", work)
    check(s == 200 and n >= n_prompt and "prefix: restored" not in text,
          f"tenants: bob asking ana's prompt gets no restore (evaluates {n} of {n_full} tokens)")

    # each asks its own again: each restored from its own tenant's snapshot
    proc, port, log = start_serve(kvsnap, llama, store, work, "tenants-3", base, serve_args=tpn)
    s_bob, n_bob = ask(port, other + SUFFIX, bob)
    s_ana, n_ana = ask(port, PROMPT + SUFFIX, ana)
    text = stop_serve(proc, log, "tenants-3", work)
    check(s_bob == 200 and n_bob <= 8, f"tenants: bob's own conversation is restored (evaluates {n_bob} tokens)")
    check(s_ana == 200 and n_ana <= n_full - n_prompt + 1,
          f"tenants: ana's own conversation is restored after bob's (evaluates {n_ana} of {n_full} tokens)")
    print("\n".join(l for l in text.splitlines() if "prefix:" in l))


def run_back_to_back(kvsnap, llama, model, work):
    """One slot (-np 1), six sessions, each request sent the moment the answer before it ends (streamed
    and not, in turn): each conversation is saved, under its own namespace, before the next request
    takes the slot, while serve runs (not left for shutdown)."""
    store = os.path.join(work, "b2b-store")
    base = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "b2b", base)
    sessions = ["s%d" % i for i in range(6)]
    for i, who in enumerate(sessions):
        s, _, _ = request(port, "POST", "/completion",
                          {"prompt": f"Conversation number {i}: " + PROMPT, "n_predict": 2, "temperature": 0,
                           "stream": i % 2 == 0}, headers={"X-Kvsnap-Session": who})
        check(s == 200, f"back to back (-np 1): {who}'s turn answers")
    # the last conversation is still in the slot; each other one was taken from it by the next request
    def saved():
        return [w for w in sessions if ls(kvsnap, store, "--tag", f"serve.ns=session-{w}")]
    got = wait_for(lambda: len(saved()) == len(sessions), 30)
    check(got, f"back to back (-np 1): all {len(sessions)} conversations are saved while serve runs "
               f"(saved: {', '.join(saved())})")
    # Six clients at once on the one slot: llama-server would queue five and start each in the slot
    # the moment the one before ends, before its save; serve holds them to one per slot (SlotGate).
    together = ["c%d" % i for i in range(6)]
    answers = {}

    def one(i, who):
        s, _, _ = request(port, "POST", "/completion",
                          {"prompt": f"Client {i} at once: " + PROMPT, "n_predict": 2, "temperature": 0,
                           "stream": i % 2 == 1}, headers={"X-Kvsnap-Session": who})
        answers[who] = s

    threads = [threading.Thread(target=one, args=(i, w)) for i, w in enumerate(together)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(answers.get(w) == 200 for w in together), f"at once (-np 1): every client answered ({answers})")

    def saved_together():
        return [w for w in together if ls(kvsnap, store, "--tag", f"serve.ns=session-{w}")]
    got = wait_for(lambda: len(saved_together()) == len(together), 30)
    text = stop_serve(proc, log, "b2b", work)
    check(got, f"at once (-np 1): all {len(together)} conversations are saved while serve runs "
               f"(saved: {', '.join(saved_together())})")
    check("no recent request's prompt" not in text, "back to back (-np 1): no slot was left unsaved")


def run_many_clients(kvsnap, llama, model, work, np="2"):
    """Twenty clients at once on two slots (-np 2), each its own session, the same prompt, answers of
    different lengths, streamed and not, two through the Anthropic route (llama-server drops its
    id_slot): every conversation is saved while serve runs. llama-server frees a slot when its
    generation ends, before kvsnap reads the answer's end and queues the save; a request let in
    meanwhile was given that slot by llama-server (the one holding its prompt) and took it over
    unsaved (5 and 9 of 20 lost in two runs, every answer 200). serve names the slot. Two ask for
    "n": 2 (one streamed): llama-server runs the copy in the other slot when it frees, one the gate
    gave another client; serve runs them alone and saves every slot they used.
    np=None: llama-server's default slots (4, one unified KV cache), whose idle slots it cleared
    when a task started (--cache-idle-slots) before kvsnap saved them (7 and 9 of 20 lost in two
    runs): serve turns that off."""
    name = "many" if np else "many-default"
    store = os.path.join(work, name + "-store")
    base = ["-m", model, "-c", "4096"] + (["-np", np] if np else []) + ["-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, name, base)
    np_says = "-np " + np if np else "default slots"
    who = ["m%d" % i for i in range(20)]
    answers = {}

    def one(i, w):
        h = {"X-Kvsnap-Session": w}
        if i in (7, 13):
            s, _, _ = request(port, "POST", "/v1/messages",
                              {"model": "tiny", "max_tokens": 1 + i % 3, "temperature": 0,
                               "messages": [{"role": "user", "content": PROMPT}]}, headers=h)
        else:
            body = {"prompt": PROMPT, "n_predict": 1 + (i * 7) % 12, "temperature": 0, "stream": i % 2 == 0}
            if i in (4, 11):
                body["n"] = 2
            s, _, _ = request(port, "POST", "/completion", body, headers=h)
        answers[w] = s

    threads = [threading.Thread(target=one, args=(i, w)) for i, w in enumerate(who)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(answers.get(w) == 200 for w in who), f"many clients ({np_says}): every client answered ({answers})")

    # kvsnap does not tokenize an Anthropic request, nor pins it (llama-server drops its id_slot): it runs
    # alone, and the slot whose task is newer than its admission is its conversation, saved under its
    # session (before: "unattributed", no tenant's)
    def saved():
        return [x.get("tags", {}).get("serve.ns") for x in ls(kvsnap, store)]
    got = wait_for(lambda: all("session-" + w in saved() for w in who), 60)
    lost = [w for w in who if "session-" + w not in saved()]
    text = stop_serve(proc, log, name, work)
    check(got, f"many clients ({np_says}): all {len(who)} conversations are saved under their sessions while serve "
               f"runs, the 2 Anthropic ones too (lost: {lost}; {saved().count('unattributed')} unattributed)")
    check("may be lost" not in text, f"many clients ({np_says}): serve never let a completion go on unguarded")


def run_tied_chats(kvsnap, llama, model, work):
    """Two sessions send the same chat (an OpenAI-style answer names no slot): each conversation is
    saved under its own session while serve runs. kvsnap saved every changed slot by the recent
    prompts, and two namespaces' equal prompts tie: the second was left unsaved (to a later guess).
    The slot the gate gave each is its save's. Then a third session asks for "n": 2 beside them."""
    store = os.path.join(work, "tied-store")
    base = ["-m", model, "-c", "4096", "-np", "3", "-t", "1", "--no-warmup", "-fa", "on"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "tied", base)
    chat = {"model": "tiny", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": PROMPT}]}

    def kept(ns):
        return [x for x in ls(kvsnap, store) if x.get("tags", {}).get("serve.ns") == ns]
    for who in ("ta", "tb"):
        s, _, _ = request(port, "POST", "/v1/chat/completions", chat, headers={"X-Kvsnap-Session": who})
        check(s == 200, f"tied chats: {who} answered")
        check(wait_for(lambda: len(kept("session-" + who)) == 1, 30),
              f"tied chats: {who}'s conversation is saved under its session while serve runs "
              f"({[x.get('tags', {}).get('serve.ns') for x in ls(kvsnap, store)]})")
    s, _, _ = request(port, "POST", "/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 0, "n": 2},
                      headers={"X-Kvsnap-Session": "tc"})
    check(s == 200, "tied chats: the \"n\": 2 completion answered")
    check(wait_for(lambda: len(kept("session-tc")) >= 1, 30), "tied chats: the \"n\": 2 conversation is saved")
    stop_serve(proc, log, "tied", work)
    check(len(kept("session-ta")) == 1 and len(kept("session-tb")) == 1,
          "tied chats: neither earlier session got a snapshot of another's slot "
          f"({[x.get('tags', {}).get('serve.ns') for x in ls(kvsnap, store)]})")


def post_json(port, path, body, key, extra=None):
    h = {"Authorization": "Bearer " + key} if key else {}
    h.update(extra or {})
    s, _, raw = request(port, "POST", path, body, headers=h, timeout=300)
    try:
        return s, json.loads(raw)
    except ValueError:
        return s, raw


def run_admin_key(kvsnap, llama, model, work):
    """--admin-key-file and KVSNAP_ADMIN_KEY: kvsnap's routes take those keys only, the child's API key
    no longer; the child takes its own key and not the admin's (kvsnap does not forward it as one)."""
    keyfile, admin = os.path.join(work, "child-keys.txt"), os.path.join(work, "admin-keys.txt")
    with open(keyfile, "w") as f:
        f.write("key-tenant\n")
    with open(admin, "w") as f:
        f.write("# operators\nkey-admin\n")
    args = ["-m", model, "-c", "2048", "-np", "1", "-t", "1", "--no-warmup", "--api-key-file", keyfile]
    env = dict(os.environ, KVSNAP_ADMIN_KEY="key-admin-env")
    proc, port, log = start_serve(kvsnap, llama, os.path.join(work, "admin-store"), work, "admin", args, env=env,
                                  serve_args=["--admin-key-file", admin])
    usage = {who: request(port, "GET", "/kvsnap/usage", headers=h)[0] for who, h in (
        ("none", {}), ("tenant", {"Authorization": "Bearer key-tenant"}),
        ("admin", {"Authorization": "Bearer key-admin"}), ("admin-env", {"X-Api-Key": "key-admin-env"}))}
    dry = {who: post_json(port, "/kvsnap/requantize", {"ctk": "q8_0", "ctv": "q8_0", "dry_run": True}, k)[0]
           for who, k in (("tenant", "key-tenant"), ("admin", "key-admin"))}
    said = request(port, "GET", "/kvsnap/usage", headers={"Authorization": "Bearer key-tenant"})[2]
    pid = json.loads(request(port, "GET", "/kvsnap/usage", headers={"X-Api-Key": "key-admin"})[2])["child"]["pid"]
    with open(f"/proc/{pid}/environ", "rb") as f:
        child_env = f.read()
    done = {who: post_json(port, "/completion", {"prompt": "Hello", "n_predict": 1}, k)[0]
            for who, k in (("tenant", "key-tenant"), ("admin", "key-admin"))}
    text = stop_serve(proc, log, "admin", work)
    check(usage == {"none": 401, "tenant": 401, "admin": 200, "admin-env": 200} and
          dry == {"tenant": 401, "admin": 200} and b"admin key" in said and b"KVSNAP_ADMIN_KEY" not in child_env,
          f"admin key: /kvsnap/usage {usage}, requantize dry run {dry} (the file's key and KVSNAP_ADMIN_KEY's "
          f"only; the tenant's 401 says: {said[:70]!r}); llama-server's environment has no KVSNAP_ADMIN_KEY "
          f"({b'KVSNAP_ADMIN_KEY' not in child_env})")
    check(done == {"tenant": 200, "admin": 401} and "take the 2 admin key(s) only" in text,
          f"admin key: a completion with the child's key {done['tenant']}, with the admin key {done['admin']} "
          f"(the child's answer); the log names the admin keys")


def run_caps_logged(kvsnap, llama, model, work):
    """A store config's cap under kvsnap serve: each save evicts the conversation saved before it, and
    the log says so (how many evicted, and that the cap is not met at most every 10 minutes, not at
    every save)."""
    store = os.path.join(work, "caps-store")
    os.makedirs(store, exist_ok=True)
    with open(os.path.join(store, "store.json"), "w") as f:
        f.write('{"max_bytes": 1, "compact_dead_percent": 0}\n')
    args = ["-m", model, "-c", "2048", "-np", "1", "-t", "1", "--no-warmup"]
    proc, port, log = start_serve(kvsnap, llama, store, work, "caps", args)
    for i, who in enumerate(("first", "second")):
        s, _, _ = request(port, "POST", "/completion", {"prompt": f"Conversation {i}: " + PROMPT, "n_predict": 1},
                          headers={"X-Kvsnap-Session": who})
        check(s == 200, f"caps: the {who} conversation answers")
        wait_for(lambda: len(ls(kvsnap, store, "--tag", f"serve.ns=session-{who}")) == 1, 30)
    text = stop_serve(proc, log, "caps", work)
    left = [r["tags"].get("serve.ns") for r in ls(kvsnap, store)]
    check("1 evicted for the caps" in text and text.count("persist: cap not met: the store holds") == 1 and
          "session-first" not in left,
          f"caps: a save evicts the conversation before it and the log says so ({text.count('evicted for the caps')} "
          f"such lines, {text.count('cap not met')} 'cap not met', said once for two saves over it within 10 "
          f"minutes); left in the store: {left}")


def get_usage(port, key):
    s, _, raw = request(port, "GET", "/kvsnap/usage", headers={"Authorization": "Bearer " + key})
    return json.loads(raw) if s == 200 else {"status": s, "body": raw}


def run_requantize(kvsnap, llama, model, work):
    """Part 4 (requantize, usage) and 5 (reuse counted), with the keys of --api-key-file and LLAMA_API_KEY;
    two keys isolated."""
    store = os.path.join(work, "requant-store")
    keyfile = os.path.join(work, "keys.txt")
    with open(keyfile, "w") as f:
        f.write("# tenants\nkey-alice\n\nkey-bob\n")
    # --cache-ram 0: llama-server's own RAM prompt cache would hand A's state to B (it knows no tenants)
    args = ["-m", model, "-c", "4096", "-np", "1", "-t", "1", "--no-warmup", "-fa", "on", "--cache-ram", "0",
            "--api-key-file", keyfile]
    os.environ["LLAMA_API_KEY"] = "key-ops"  # llama-server reads it before --api-key-file: kvsnap's own calls use it
    try:
        proc, port, log = start_serve(kvsnap, llama, store, work, "requant", args)
    finally:
        del os.environ["LLAMA_API_KEY"]
    A, B = "key-alice", "key-bob"
    s, _ = post_json(port, "/completion", {"prompt": "no key", "n_predict": 1}, None)
    u = request(port, "GET", "/kvsnap/usage")[0]
    u_env = request(port, "GET", "/kvsnap/usage", headers={"Authorization": "Bearer key-ops"})[0]
    u_file = request(port, "GET", "/kvsnap/usage", headers={"X-Api-Key": "key-bob"})[0]
    check(s == 401 and u == 401 and u_env == 200 and u_file == 200,
          f"API keys: without a key the child refuses ({s}) and so does /kvsnap/usage ({u}); it takes LLAMA_API_KEY's "
          f"({u_env}) and --api-key-file's ({u_file}, as X-Api-Key)")
    n_prompt = len(post_json(port, "/tokenize", {"content": PROMPT, "add_special": True}, A)[1]["tokens"])
    n_full = len(post_json(port, "/tokenize", {"content": PROMPT + SUFFIX, "add_special": True}, A)[1]["tokens"])
    s, j = post_json(port, "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0}, A)
    check(s == 200, f"key A's first turn through kvsnap serve ({s})")
    usage = wait_for(lambda: (lambda u: u if u.get("counters", {}).get("saves", {}).get("ok", 0) >= 1 else None)(
        get_usage(port, A)), 30) or {}
    snaps = ls(kvsnap, store)
    slot = (usage.get("slots") or [{}])[0]
    snap = next((x for x in snaps if x["id"] == slot.get("snapshot")), {})
    check(snap and slot.get("n_tokens") == snap["n_tokens"] and slot.get("bytes") == snap["raw_bytes"] and
          slot.get("ctk") == "f16" and slot.get("namespace") == snap["tags"].get("serve.ns"),
          f"/kvsnap/usage: slot 0 holds snapshot {slot.get('snapshot')}, {slot.get('n_tokens')} tokens, "
          f"{slot.get('bytes')} bytes, as kvsnap ls says ({snap.get('n_tokens')}, {snap.get('raw_bytes')})")
    # the size table against kvsnap info's (other code: the CLI's dry-run table) on the slot file itself
    slot_file = os.path.join(work, "requant-slot.bin")
    subprocess.run([kvsnap, "restore", "--store", store, str(slot.get("snapshot")), "-o", slot_file], check=True,
                   capture_output=True)
    info = json.loads(subprocess.run([kvsnap, "info", slot_file, "--json", "-m", model], capture_output=True,
                                     text=True, check=True).stdout)
    theirs = {(d["ctk"], d["ctv"]): d.get("file_bytes") for d in info["dry_run"]}
    mine = {(d["ctk"], d["ctv"]): d["bytes"] for d in slot.get("sizes", [])}
    check(len(mine) == 81 and os.path.getsize(slot_file) == slot.get("bytes") and
          all(mine[k] == theirs.get(k) for k in mine),
          f"/kvsnap/usage: the size at all {len(mine)} ctk/ctv pairs equals kvsnap info's table of the slot file "
          f"(q4_0/q4_0: {mine.get(('q4_0', 'q4_0'))} bytes)")

    # a dry run: the estimate, nothing restarted
    pid = usage["child"]["pid"]
    s, dry = post_json(port, "/kvsnap/requantize", {"ctk": "q4_0", "ctv": "q4_0", "dry_run": True}, A)
    after = get_usage(port, A)
    check(s == 200 and dry.get("bytes_after_estimate") == mine.get(("q4_0", "q4_0")) and
          after["child"]["pid"] == pid and after["child"]["ctk"] == "f16",
          f"requantize dry run: 200, estimate {dry.get('bytes_after_estimate') if s == 200 else dry}, the child "
          f"untouched (pid {after['child']['pid']}, {after['child']['ctk']})")
    # bad requests: 400, nothing restarted, serving continues
    bad = [post_json(port, "/kvsnap/requantize", b, A) for b in
           ({"ctk": "q3_K", "ctv": "q4_0"}, {"ctk": "q4_0", "ctx": 5}, b"{not json")]
    s2, _ = post_json(port, "/completion", {"prompt": "Still here?", "n_predict": 1}, B)
    check(all(b[0] == 400 for b in bad) and "q3_K" in bad[0][1]["error"]["message"] and s2 == 200 and
          get_usage(port, A)["child"]["pid"] == pid,
          f"requantize with a bad type / unknown key / bad JSON: {[b[0] for b in bad]} "
          f"({bad[0][1]['error']['message'][:90]}...); serving continues ({s2})")

    # the real thing: A's conversation is in the slot? (B's request above took it) -- A comes back first
    s, j = post_json(port, "/completion", {"prompt": PROMPT + SUFFIX, "n_predict": 1, "temperature": 0}, A)
    wait_for(lambda: get_usage(port, A)["counters"]["saves"]["ok"] >= 3, 30)
    s, dry = post_json(port, "/kvsnap/requantize", {"ctk": "q4_0", "ctv": "q4_0", "dry_run": True}, A)
    t0 = time.time()
    s, rq = post_json(port, "/kvsnap/requantize", {"ctk": "q4_0", "ctv": "q4_0"}, A)
    ms = (time.time() - t0) * 1000
    after = get_usage(port, A)
    check(s == 200 and rq.get("slots_restored") == 1 and rq.get("bytes_after") == dry.get("bytes_after_estimate")
          and after["child"]["ctk"] == "q4_0" and after["child"]["pid"] != pid and after["slots"][0]["ctk"] == "q4_0",
          f"requantize to q4_0/q4_0: {s}, {rq.get('slots_restored')} slot restored, {rq.get('bytes_before')} -> "
          f"{rq.get('bytes_after')} bytes (dry run said {dry.get('bytes_after_estimate')}), phases {rq.get('ms')} "
          f"({ms:.0f} ms seen by the client)")
    more = PROMPT + SUFFIX + " the"
    n_more = len(post_json(port, "/tokenize", {"content": more, "add_special": True}, A)[1]["tokens"])
    s, j = post_json(port, "/completion", {"prompt": more, "n_predict": 1, "temperature": 0}, A)
    n = j["timings"]["prompt_n"] if s == 200 else None
    reuse = settled_reuse(port, {"Authorization": "Bearer " + A})
    check(s == 200 and n is not None and n <= 8 and n <= n_more - n_full + 1 and reuse["reused"] >= 1 and
          reuse["not_reused"] == 0,
          f"after the requantize the next turn evaluates {n} of {n_more} tokens; usage counts it: {reuse}")

    # drain: a long completion in flight when a requantize comes finishes first, whole; a request sent while
    # the child restarts waits at the gate and is answered by the new child
    results = {}
    # 1500 tokens: seconds on the 2-core CI, long enough to be seen busy (/slots) and still running at the requantize
    long_body = {"prompt": "Count with me:", "n_predict": 1500, "ignore_eos": True, "temperature": 0}
    th_long = threading.Thread(target=lambda: results.update(long=post_json(port, "/completion", long_body, B)))
    th_long.start()
    busy = wait_for(lambda: any(x.get("is_processing") for x in
                                json.loads(request(port, "GET", "/slots", headers={"X-Api-Key": B})[2])), 10)
    log_path = os.path.join(work, "requant.log")

    def during():
        wait_for(lambda: "requantize to f16/f16 fa on -c 4096: draining" in open(log_path).read(), 30)
        results["progress"] = get_usage(port, A).get("requantize")  # where the running requantize stands
        results["during"] = post_json(port, "/completion", {"prompt": "During the restart", "n_predict": 1}, B)
    th_during = threading.Thread(target=during)
    th_during.start()
    s, rq2 = post_json(port, "/kvsnap/requantize", {"ctk": "f16", "ctv": "f16"}, A)
    th_long.join()
    th_during.join()
    text = open(log_path).read()
    ls_, lj = results.get("long", (None, {}))
    ds, _ = results.get("during", (None, {}))
    check(busy and s == 200 and ls_ == 200 and lj.get("tokens_predicted") == 1500 and ds == 200 and
          "drained (1 in flight waited for)" in text,
          f"requantize while a completion is in flight: it finishes first ({ls_}, {lj.get('tokens_predicted')} "
          f"tokens), the requantize answers {s} after it, a request sent meanwhile waits and gets {ds}")
    # back to q4_0, for what follows, with another context size
    s, _ = post_json(port, "/kvsnap/requantize", {"ctk": "q4_0", "ctv": "q4_0", "ctx_size": 2048}, A)
    after = get_usage(port, A)
    check(s == 200 and after["child"]["ctx_size"] == 2048 and after["slots"][0].get("n_ctx") == 2048,
          f"requantize with ctx_size 2048: {s}, the child runs with -c {after['child']['ctx_size']} "
          f"(its slot's n_ctx {after['slots'][0].get('n_ctx')})")

    # a restart the child refuses (quantized V without flash attention): rolled back, serving continues
    s, rb = post_json(port, "/kvsnap/requantize", {"ctk": "q8_0", "ctv": "q8_0", "flash_attn": "off"}, A)
    after = get_usage(port, A)
    more2 = more + " end"
    s2, j2 = post_json(port, "/completion", {"prompt": more2, "n_predict": 1, "temperature": 0}, A)
    n2 = j2["timings"]["prompt_n"] if s2 == 200 else None
    check(s == 500 and "previous arguments" in json.dumps(rb) and after["child"]["ctk"] == "q4_0" and
          after["counters"]["requantizes"] == {"ok": 3, "failed": 1} and s2 == 200 and n2 is not None and n2 <= 8,
          f"requantize refused by the child (-fa off, q8_0 V): {s}, back at {after['child']['ctk']}, "
          f"serving continues, the conversation restored again (the next turn evaluates {n2} tokens)")

    # two keys isolated: B asks for A's conversation; the slot holds B's own prompt first, so only a restore
    # of A's snapshot could make B's evaluation short
    saves = lambda: (lambda c: c["ok"] + c["failed"])(get_usage(port, A)["counters"]["saves"])
    n_saves = saves()
    post_json(port, "/completion", {"prompt": "Bob talks about something else entirely.", "n_predict": 1}, B)
    wait_for(lambda: saves() > n_saves, 30)
    # whichever completion's queued save stored it (B's may run after A used the slot), every snapshot
    # holding A's conversation is in A's namespace
    toks = os.path.join(work, "a-tokens.json")
    with open(toks, "w") as f:
        json.dump(post_json(port, "/tokenize", {"content": more2, "add_special": True}, A)[1]["tokens"], f)
    found = json.loads(subprocess.run([kvsnap, "find", "--store", store, "--tokens", toks, "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    ns_a = "key-" + hashlib.sha256(A.encode()).hexdigest()[:16]
    check(found and all(x["tags"].get("serve.ns") == ns_a for x in found),
          f"every stored snapshot of A's conversation is in A's namespace: "
          f"{[(x['id'], x['n_tokens'], x['tags'].get('serve.ns')) for x in found]} ({ns_a})")
    s, j = post_json(port, "/completion", {"prompt": more2, "n_predict": 1, "temperature": 0}, B)
    nb = j["timings"]["prompt_n"] if s == 200 else None
    s, j = post_json(port, "/completion", {"prompt": more2 + " again", "n_predict": 1, "temperature": 0}, A)
    na = j["timings"]["prompt_n"] if s == 200 else None
    check(nb is not None and nb >= n_prompt and na is not None and na <= 8,
          f"two API keys isolated: B's request for A's prompt evaluates {nb} tokens (nothing of A's restored), "
          f"A's next turn evaluates {na}")

    # two keys, one session name: X-Kvsnap-Session is a session of the key that sends it, so B naming A's
    # session gets nothing of A's restored, and A's own next turn in it is restored. Between turns B asks
    # something else, so that the slot never holds the asked prompt itself (llama-server would reuse it).
    shared = {"X-Kvsnap-Session": "shared"}
    secret = "A secret kept in a named session. " + PROMPT

    def ask(key, prompt, extra=None):
        n0 = saves()
        s, j = post_json(port, "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0}, key, extra)
        wait_for(lambda: saves() > n0, 30)
        return j["timings"]["prompt_n"] if s == 200 else None
    n_secret = len(post_json(port, "/tokenize", {"content": secret, "add_special": True}, A)[1]["tokens"])
    ask(A, secret, shared)
    ask(B, "Bob talks about the weather instead.")
    nb_shared = ask(B, secret, shared)
    ask(B, "Bob talks about the sea instead.")
    na_shared = ask(A, secret + " again", shared)
    ns_a_shared = ls(kvsnap, store, "--tag", f"serve.ns={ns_a}-session-shared")
    ns_b_shared = ls(kvsnap, store, "--tag",
                     "serve.ns=key-" + hashlib.sha256(B.encode()).hexdigest()[:16] + "-session-shared")
    text = stop_serve(proc, log, "requant", work)
    check(nb_shared is not None and nb_shared >= n_secret // 2 and na_shared is not None and na_shared <= 8 and
          ns_a_shared and ns_b_shared and not ls(kvsnap, store, "--tag", "serve.ns=session-shared"),
          f"one X-Kvsnap-Session name under two keys: B's request for A's session prompt evaluates {nb_shared} of "
          f"{n_secret} tokens, A's next turn in it {na_shared}; each key's session saved in its own namespace "
          f"({len(ns_a_shared)} and {len(ns_b_shared)} snapshots, none as plain session-shared)")
    check("requantize: drained" in text and "requantize: done" in text and "with the previous arguments" in text,
          "requantize: progress lines and the rollback in the log")
    prog = results.get("progress") or {}
    check(prog.get("phase") == "draining" and prog.get("to", "").startswith("f16/f16") and
          prog.get("slots_total") == 0 and after.get("requantize", "absent") is None and
          re.search(r"restored \(.*\); \d+ of \d+ slots, [\d.]+ of [\d.]+ MiB \(\d+%\), [\d.]+ MiB/s", text),
          f"requantize progress: /kvsnap/usage during the drain says {prog}, null after; the log's restore lines "
          f"end with slots and MiB done of the total and the rate")
    print("\n".join(l for l in text.splitlines() if "requantize" in l or "reuse" in l))


def run_requantize_chat(kvsnap, llama, model, work):
    """As an operator would: stock ARGS (-fa auto, -np 2) at q8_0, set as a container image sets it (the
    LLAMA_ARG_CACHE_TYPE_K/V environment variables), a chat, a requantize to q4_0, the next turn streamed: it
    goes to the restored slot and evaluates only its new tokens, counted as reused."""
    env = dict(os.environ, LLAMA_ARG_CACHE_TYPE_K="q8_0", LLAMA_ARG_CACHE_TYPE_V="q8_0")
    proc, port, log = start_serve(kvsnap, llama, os.path.join(work, "rq-chat-store"), work, "rq-chat",
                                  ["-m", model, "-np", "2", "-t", "1", "--no-warmup"], env=env)
    msgs = [{"role": "user", "content": PROMPT}]
    s, _, raw = request(port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0})
    answer = json.loads(raw)["choices"][0]["message"]["content"]
    wait_for(lambda: json.loads(request(port, "GET", "/kvsnap/usage")[2])["counters"]["saves"]["ok"] >= 1, 30)
    before = json.loads(request(port, "GET", "/kvsnap/usage")[2])
    child, slot = before["child"], next((x for x in before["slots"] if x.get("snapshot")), {})
    check(child["ctk"] == "q8_0" and child["ctv"] == "q8_0" and slot.get("ctk") == "q8_0",
          f"LLAMA_ARG_CACHE_TYPE_K/V=q8_0 in the environment: kvsnap knows the child's cache as "
          f"{child['ctk']}/{child['ctv']}, and the saved slot is {slot.get('ctk')}")
    s, _, raw = request(port, "POST", "/kvsnap/requantize", {"ctk": "q4_0", "ctv": "q4_0"})
    rq = json.loads(raw)
    msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
    s2, _, raw = request(port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                                                "stream": True})
    timed = [json.loads(l[6:]) for l in raw.decode().split("\n") if l.startswith("data: {") and '"timings"' in l]
    tm = timed[-1]["timings"] if timed else {}
    reuse = settled_reuse(port)
    stop_serve(proc, log, "rq-chat", work)
    check(s == 200 and rq.get("slots_restored") == 1 and s2 == 200 and tm.get("cache_n", 0) >= 200 and
          reuse["reused"] == 1 and reuse["not_reused"] == 0,
          f"requantize q8_0 -> q4_0 (-fa auto, -np 2, chat): the next turn, streamed, evaluates {tm.get('prompt_n')} "
          f"new tokens and takes {tm.get('cache_n')} from the restored slot; usage counts it: {reuse}")


def run_ladder(kvsnap, llama, model, work):
    """Part 4's ladder: the child starts at f16 with the context 1 MiB holds; a conversation at 90% of it steps
    the cache down to q8_0 (a larger context in the same budget); the next turn evaluates only its new tokens."""
    store = os.path.join(work, "ladder-store")
    args = ["-m", model, "-np", "1", "-t", "1", "--no-warmup", "-fa", "on", "--cache-ram", "0"]
    port = free_port()
    log = open(os.path.join(work, "ladder.log"), "w")
    proc = subprocess.Popen([kvsnap, "serve", "--listen", f"127.0.0.1:{port}", "--store", store, "--log",
                             os.path.join(work, "ladder-child.log"), "--dynamic-cache", "f16,q8_0,q4_0",
                             "--cache-budget", "1M", "--", llama, *args], stdout=log, stderr=subprocess.STDOUT)
    SERVES.append(proc)
    wait_health(port, proc, "ladder")
    u = json.loads(request(port, "GET", "/kvsnap/usage")[2])
    rungs = u["dynamic_cache"]["rungs"]
    ctx0 = rungs[0]["ctx_size"]
    check(u["child"]["ctk"] == "f16" and u["child"]["ctx_size"] == ctx0 and
          all(r["ctx_size"] * r["bytes_per_token"] <= 1 << 20 for r in rungs),
          f"ladder: the child starts at f16 with -c {ctx0}; rungs {[(r['ctk'], r['ctx_size']) for r in rungs]} "
          f"all within 1 MiB")
    # a prompt of 92% of the context
    text = PROMPT
    while len(json.loads(request(port, "POST", "/tokenize", {"content": text + " " + PROMPT})[2])["tokens"]) < 0.92 * ctx0:
        text += " " + PROMPT
    while len(json.loads(request(port, "POST", "/tokenize", {"content": text})[2])["tokens"]) < 0.92 * ctx0:
        text += " and the sea"
    n0 = len(json.loads(request(port, "POST", "/tokenize", {"content": text, "add_special": True})[2])["tokens"])
    s, _, raw = request(port, "POST", "/completion", {"prompt": text, "n_predict": 1, "temperature": 0})
    before = wait_for(lambda: (lambda u: u if u["slots"] and u["slots"][0].get("n_tokens") else None)(
        json.loads(request(port, "GET", "/kvsnap/usage")[2])), 30) or {"slots": [{}]}
    stepped = wait_for(lambda: (lambda u: u if u["child"]["ctk"] == "q8_0" and u["slots"] and
                                u["slots"][0].get("ctk") == "q8_0" else None)(
        json.loads(request(port, "GET", "/kvsnap/usage")[2])), 60) or {"child": {}, "slots": [{}],
                                                                       "dynamic_cache": {}}
    sb, sa = before["slots"][0], stepped["slots"][0]
    # the rungs' bytes per token against the slot files: the f16 and the q8_0 state differ by exactly that
    diff_ok = (sb.get("n_tokens") == sa.get("n_tokens") and sa.get("bytes") is not None and sb.get("bytes") is not None
               and sb["bytes"] - sa["bytes"] == sb["n_tokens"] * (rungs[0]["bytes_per_token"] - rungs[1]["bytes_per_token"]))
    check(s == 200 and stepped["child"].get("ctx_size") == rungs[1]["ctx_size"] and
          stepped["dynamic_cache"].get("rung") == 1 and diff_ok,
          f"ladder: {n0} of {ctx0} tokens: stepped down to {stepped['child'].get('ctk')} with -c "
          f"{stepped['child'].get('ctx_size')}, the slot restored ({sb.get('bytes')} -> {sa.get('bytes')} bytes, "
          f"{sa.get('n_tokens')} tokens)")
    s, _, raw = request(port, "POST", "/completion", {"prompt": text + SUFFIX, "n_predict": 1, "temperature": 0})
    n = json.loads(raw)["timings"]["prompt_n"] if s == 200 else None
    time.sleep(1)  # the save after it, and the ladder's look (no second step: far from the new context)
    u = json.loads(request(port, "GET", "/kvsnap/usage")[2])
    log.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    text = open(os.path.join(work, "ladder.log")).read()
    check(n is not None and n <= 8 and u["dynamic_cache"]["rung"] == 1 and text.count("stepping down") == 1,
          f"ladder: the next turn at q8_0 evaluates {n} tokens; one step only (rung {u['dynamic_cache']['rung']})")
    print("\n".join(l for l in text.splitlines() if "dynamic cache" in l or "requantize: done" in l))


def same_on_both(dport, pport, method, path, body=None, what=None, as_json=True, headers=None):
    d = request(dport, method, path, body, headers)
    p = request(pport, method, path, body, headers)
    what = what or f"{method} {path}"
    if as_json:
        dj, pj = strip(json.loads(d[2])), strip(json.loads(p[2]))
        diff = sorted(k for k in set(dj) | set(pj) if dj.get(k) != pj.get(k)) if isinstance(dj, dict) else []
        check(d[0] == p[0] and dj == pj, f"{what}: status {p[0]} and JSON identical to direct access"
              + (f" (differ: {diff}: {[(dj.get(k), pj.get(k)) for k in diff]})" if diff else ""))
    else:
        check(d[0] == p[0] and d[2] == p[2], f"{what}: status {p[0]} and body byte-identical to direct access")
    check(d[1].get("content-type") == p[1].get("content-type"), f"{what}: same Content-Type")
    return d, p


MASK = re.compile(rb'"(timings|created|id|prompt_ms|predicted_ms|t_load|t_start|media_marker)":'
                  rb'(\{[^{}]*\}|"[^"]*"|-?[0-9][0-9.eE+-]*)')


def masked(raw):
    """The raw bytes with the values of the fields that differ between two llama-server processes replaced."""
    return MASK.sub(rb'"\1":_', raw)


def raw_chunked(port, path, body, first_event=None):
    """POST body on a raw socket: (status, headers, the de-chunked body, how many HTTP chunks carried it).
    `first_event` (a threading.Event) is set when the first SSE event arrives."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        raw = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            raw += b
            if first_event is not None and b"data: " in raw:
                first_event.set()
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hd = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    if hd.get("transfer-encoding") != "chunked":
        return int(lines[0].split()[1]), hd, rest, 1
    out, n = b"", 0
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2:]
        n += 1
    return int(lines[0].split()[1]), hd, out, n


def keep_alive(port, reqs):
    """Several requests on one HTTPConnection: [(status, the local address of the socket after it)]; a server
    that closes the connection leaves None (http.client would reconnect for the next one)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    out = []
    for method, path, body in reqs:
        data = None if body is None else json.dumps(body).encode()
        try:
            c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            r = c.getresponse()
            r.read()
            out.append((r.status, c.sock.getsockname() if c.sock else None))
        except OSError as e:  # closed without saying so
            out.append((str(e), None))
            c.close()
    c.close()
    return out


def chunked_request(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = json.dumps(body).encode()
    c.request("POST", path, body=iter([data[:10], data[10:]]), encode_chunked=True,
              headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, raw


def first_event_ms(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    c.request("POST", "/completion", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    r.read(1)  # the first byte of the first event
    ms = (time.perf_counter() - t0) * 1000
    r.read()
    c.close()
    return ms


def measure_overhead(dport, pport):
    """Figures, not checks (bench/serve_bench.py measures more): latency of a small request on a new
    connection and time to the first streamed event, direct and through kvsnap serve."""
    def pct(v, q):
        v = sorted(v)
        return v[min(len(v) - 1, int(q * len(v)))]
    for name, port in (("direct", dport), ("kvsnap serve", pport)):
        lat = []
        for _ in range(200):
            t0 = time.perf_counter()
            request(port, "POST", "/tokenize", {"content": "Once upon a time"})
            lat.append((time.perf_counter() - t0) * 1000)
        ttft = [first_event_ms(port, {"prompt": "Once upon a time", "n_predict": 4, "stream": True}) for _ in range(30)]
        print(f"measure {name}: /tokenize p50 {pct(lat, 0.5):.2f} ms p99 {pct(lat, 0.99):.2f} ms; "
              f"first streamed event p50 {pct(ttft, 0.5):.2f} ms p99 {pct(ttft, 0.99):.2f} ms", flush=True)


def run_checks(kvsnap, store, dport, pport, serve, openai_python, log_path):
    # 1. identical answers
    same_on_both(dport, pport, "GET", "/health", as_json=False)
    # a client that accepts gzip/br: the child sends plain JSON, and so must kvsnap (cpp-httplib would compress)
    props_d, props_p = same_on_both(dport, pport, "GET", "/props", headers={"Accept-Encoding": "gzip, br"})
    check("content-encoding" not in props_p[1] and "content-encoding" not in props_d[1],
          "Accept-Encoding: gzip, br: the answer is not re-encoded")
    # /metrics is text/plain, which cpp-httplib compresses for a client that accepts gzip: the child does not,
    # so neither may kvsnap (the counters themselves differ between the two servers: only the encoding is compared)
    m_d = request(dport, "GET", "/metrics", headers={"Accept-Encoding": "gzip, br"})
    m_p = request(pport, "GET", "/metrics", headers={"Accept-Encoding": "gzip, br"})
    check(m_d[0] == m_p[0] == 200 and m_p[1].get("content-encoding") == m_d[1].get("content-encoding") and
          m_p[2].startswith(b"# HELP"), f"GET /metrics with Accept-Encoding: gzip, br: not re-encoded "
                                         f"({m_p[1].get('content-type')}, {m_p[1].get('content-encoding')})")
    same_on_both(dport, pport, "POST", "/tokenize", {"content": "Once upon a time"}, as_json=False)
    same_on_both(dport, pport, "GET", "/v1/models")
    comp = {"prompt": "Once upon a time, in a quiet village", "n_predict": 8, "temperature": 0, "seed": 7}
    _, p = same_on_both(dport, pport, "POST", "/completion?x=1", comp, "POST /completion")
    check(json.loads(p[2]).get("id_slot") is not None, "the completion names its slot (id_slot)")
    chat = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 6, "temperature": 0,
            "seed": 7}
    same_on_both(dport, pport, "POST", "/v1/chat/completions", chat)

    # 2. streaming: the same bytes as direct access (the values of the fields that differ between any two
    # llama-server processes masked, the framing not), forwarded chunk by chunk as the child writes them
    for path, body in (("/completion", dict(comp, stream=True, prompt="A dragon flew over the hills")),
                       ("/v1/chat/completions", dict(chat, stream=True))):
        (ds, dh, draw, dchunks), (ps, ph, praw, pchunks) = raw_chunked(dport, path, body), raw_chunked(pport, path, body)
        de, pe = events(draw), events(praw)
        check(ps == ds == 200 and len(pe) > 2 and masked(draw) == masked(praw),
              f"streamed {path}: {len(pe)} events, byte-identical to direct access ({len(praw)} bytes; timings, ids "
              f"and times masked)" + ("" if masked(draw) == masked(praw) else f": {masked(draw)[:300]!r} vs "
                                                                                 f"{masked(praw)[:300]!r}"))
        check(ph.get("transfer-encoding") == "chunked" and "content-length" not in ph and
              ph.get("content-type") == dh.get("content-type"),
              f"streamed {path}: forwarded chunked ({ph.get('content-type')}; {pchunks} HTTP chunks, direct {dchunks})")
    # chunk by chunk as the child writes: a 64-token stream is not gathered into one chunk (several events may
    # share one: the proxy forwards what it has read from the child each time)
    long_stream = {"prompt": "The river", "n_predict": 64, "ignore_eos": True, "stream": True}
    ps, _, praw, pchunks = raw_chunked(pport, "/completion", long_stream)
    dchunks = raw_chunked(dport, "/completion", long_stream)[3]
    check(ps == 200 and pchunks >= 2 and b'"tokens_predicted":64' in praw,
          f"a 64-token stream comes through in {pchunks} HTTP chunks ({len(events(praw))} events; direct: {dchunks} "
          f"chunks), not held back whole")

    # keep-alive: one connection carries several requests through kvsnap, a stream among them. (llama-server
    # itself closes the connection after a stream: direct, the request after it needs a new one.)
    ka = keep_alive(pport, [("GET", "/health", None), ("POST", "/completion", comp),
                            ("POST", "/completion", dict(comp, stream=True)), ("GET", "/props", None)])
    check(all(st == 200 for st, _ in ka) and len({sn for _, sn in ka}) == 1 and ka[0][1] is not None,
          f"keep-alive: 4 requests through kvsnap, a stream among them, on one connection: {ka}")
    # a request body sent chunked (Transfer-Encoding: chunked) reaches the child whole
    dc, pc = chunked_request(dport, "/completion", comp), chunked_request(pport, "/completion", comp)
    check(dc[0] == pc[0] == 200 and strip(json.loads(dc[1])) == strip(json.loads(pc[1])),
          f"a chunked request body: {pc[0]}, the same completion as direct access")

    # 3. bad requests, untouched
    same_on_both(dport, pport, "POST", "/completion", b"{not json", "malformed JSON", as_json=False)
    same_on_both(dport, pport, "GET", "/no/such/route", None, "unknown route", as_json=False)
    same_on_both(dport, pport, "POST", "/completion", {"n_predict": 1}, "a completion without a prompt",
                 as_json=False)

    # 4. 8 concurrent clients
    results = [None] * 8
    prompts = [f"Client {i} asks about the weather in town number {i}." for i in range(8)]

    def client(i):
        try:
            s, _, raw = request(pport, "POST", "/completion", {"prompt": prompts[i], "n_predict": 12, "temperature": 0})
            j = json.loads(raw)
            # each client gets the answer to its own prompt, complete
            results[i] = (s, j.get("prompt", "").endswith(prompts[i]) and j.get("stop") is True and
                          j.get("tokens_predicted", 0) >= 1)
        except Exception as e:  # noqa: BLE001 - reported as a failure below
            results[i] = (str(e), None)

    t0 = time.time()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(r == (200, True) for r in results), f"8 concurrent clients: {results} in {time.time() - t0:.2f} s")

    measure_overhead(dport, pport)

    # openai client, if given
    if openai_python:
        code = ("import openai,sys; c=openai.OpenAI(base_url=sys.argv[1], api_key='none');"
                "r=c.chat.completions.create(model='x', messages=[{'role':'user','content':'Tell me a story.'}],"
                "max_tokens=6, temperature=0, seed=7); print(r.choices[0].message.content)")
        o = subprocess.run([openai_python, "-c", code, f"http://127.0.0.1:{pport}/v1"], capture_output=True, text=True)
        direct = json.loads(request(dport, "POST", "/v1/chat/completions", chat)[2])
        check(o.returncode == 0 and o.stdout[:-1] == direct["choices"][0]["message"]["content"],
              f"openai client through kvsnap serve: the direct answer ({o.stderr.strip()[-200:]})")

    else:
        print("SKIP openai client check: no Python with the openai package given (tests/run-all.sh makes one)")
        SKIPPED.append("the openai client (no Python with the openai package)")

    # 5. persistence
    snaps = wait_for(lambda: ls(kvsnap, store, "--tag", "serve.ns=default"), 30)
    check(len(snaps) >= 1, f"kvsnap ls shows {len(snaps)} slot snapshots saved after completions")
    check(all(s["tags"].get("serve.slot") in ("0", "1") for s in snaps), "each is tagged with its slot")
    s, _, _ = request(pport, "POST", "/completion", {"prompt": "A private conversation", "n_predict": 4},
                      headers={"X-Kvsnap-Session": "tenant-a"})
    mine = wait_for(lambda: ls(kvsnap, store, "--tag", "serve.ns=session-tenant-a"), 30)
    check(s == 200 and len(mine) == 1, f"an X-Kvsnap-Session request is saved in its own namespace ({len(mine)})")
    # incremental: a conversation's next turn writes only its new chunks. A chunk holds 256 cells of one K or
    # V tensor: a first turn of over 512 tokens leaves two whole chunks of each that the next turn shares.
    long_prompt = " ".join([PROMPT] * 4)
    ns = {"X-Kvsnap-Session": "incremental"}
    saved_re = re.compile(r"\(session-incremental\) saved as snapshot \d+: (\d+) tokens, (\d+)/(\d+) chunks new")

    def turns():
        with open(log_path) as f:
            return [tuple(map(int, m.groups())) for m in saved_re.finditer(f.read())]
    s1, _, _ = request(pport, "POST", "/completion", {"prompt": long_prompt, "n_predict": 1, "temperature": 0},
                       headers=ns)
    wait_for(lambda: len(turns()) >= 1, 30)
    s2, _, _ = request(pport, "POST", "/completion", {"prompt": long_prompt + SUFFIX, "n_predict": 1,
                                                      "temperature": 0}, headers=ns)
    t = wait_for(lambda: turns() if len(turns()) >= 2 else None, 30) or turns()
    check(s1 == s2 == 200 and len(t) == 2 and t[0][0] > 512 and t[1][0] > t[0][0] and t[1][1] * 2 <= t[1][2],
          f"incremental: the next turn writes only its new chunks (turns saved: (tokens, new chunks, chunks) {t})")

    # 6. SIGKILL the child
    kids = llama_children(serve.pid)
    check(len(kids) == 1, f"kvsnap serve has one llama-server ({kids})")
    os.kill(kids[0], signal.SIGKILL)
    t0 = time.time()
    s = wait_for(lambda: (request(pport, "GET", "/health", timeout=5)[0] == 200 and
                          llama_children(serve.pid) not in ([], kids)), 120)
    check(bool(s), f"the SIGKILLed child was restarted, serving resumed after {time.time() - t0:.1f} s")
    kids, dogs = llama_children(serve.pid), watchdogs(serve.pid)
    check(len(kids) == 1 and len(dogs) == 1 and os.getpgid(dogs[0]) == kids[0],
          f"the lifeline watchdog {dogs} guards the restarted llama-server {kids} (is in its group)")
    before = len(ls(kvsnap, store))
    s, _, raw = request(pport, "POST", "/completion", {"prompt": "After the restart, the story", "n_predict": 4})
    check(s == 200, "a completion after the restart")

    # 7. SIGTERM at once: the slot just used is saved (by the background save or the shutdown's), no child left
    kids = children_of(serve.pid)
    serve.send_signal(signal.SIGTERM)
    try:
        rc = serve.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, f"SIGTERM: kvsnap serve exited with {rc}")
    check(len(kids) == 2 and not any(alive(k) for k in kids), f"SIGTERM: no llama-server or watchdog left ({kids})")
    after = ls(kvsnap, store)
    check(len(after) == before + 1, f"SIGTERM: the slot used last is in the store ({before} -> {len(after)} snapshots)")


if __name__ == "__main__":
    sys.exit(main())
