#!/usr/bin/env python3
"""The proxy's overhead: `kvsnap serve` beside direct access to the same llama-server (issue 14 part 1).

One llama-server started directly and one `kvsnap serve -- llama-server` with the same arguments;
N rounds, each sending every kind of request to both, alternating which goes first:
  GET /health                                   (the proxy's own floor)
  POST /completion, n_predict 1                 (kvsnap also looks up a stored prefix first)
  POST /completion, n_predict 8, stream: true   (time to the first streamed byte, and to the end)
  POST /completion of another prompt            (through kvsnap: a prefix restore each time)
Each request on a new connection, as a simple client makes it. Reports p50/p99 per route, direct and
through the proxy, the added latency (proxy - direct) and the ratio, all from the same run.
Nothing here asserts a time. Python 3 standard library only.

  bench/serve_bench.py KVSNAP LLAMA_SERVER MODEL WORK_DIR [-n 200] [--json FILE]

MODEL: fixtures/models/tiny-hd64.gguf is enough (the figures are the proxy's, not the model's).
"""
import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from loopback import free_port  # noqa: E402  (tests/loopback.py)


def wait_health(port, proc, what, log):
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"serve_bench: {what} exited ({proc.returncode}); see {log}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"serve_bench: {what} did not become healthy; see {log}")


def timed(port, method, path, body=None):
    """(ms to the first byte of the body, ms to the end); fails loudly on a non-200."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = None if body is None else json.dumps(body).encode()
    t0 = time.perf_counter()
    c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    r = c.getresponse()
    r.read(1)
    first = (time.perf_counter() - t0) * 1000
    rest = r.read()
    end = (time.perf_counter() - t0) * 1000
    c.close()
    if r.status != 200:
        raise SystemExit(f"serve_bench: {method} {path} on port {port}: HTTP {r.status}: {rest[:200]!r}")
    return first, end


def saves_logged(log):
    """How many background saves serve's log reports as done (saved or failed)."""
    with open(log, errors="replace") as f:
        return sum(1 for line in f if "saved as snapshot" in line or "persist: saving slot" in line)


class Settled:
    """timed(), with a direct request held until the proxy's background saves queued before it are done
    (at most 10 s): a bench review's finding, direct requests ran beside them on the 2 cores and read
    slower. A proxy request is not held: its own wait for a queued save (serve's wait_saved) is part of
    what a client of the proxy sees."""

    def __init__(self, plog):
        self.plog, self.expected = plog, 0

    def __call__(self, who, port, method, path, body=None):
        if who == "direct":
            deadline = time.time() + 10
            while saves_logged(self.plog) < self.expected and time.time() < deadline:
                time.sleep(0.01)
        elif method == "POST":
            self.expected = max(self.expected, saves_logged(self.plog)) + 1
        return timed(port, method, path, body)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


# The completions share one prompt, so the slot always holds it and kvsnap restores nothing: the rows
# are the proxy's cost (forwarding, its prefix lookup, the background save). The last row is a second
# prompt in the same slot: kvsnap finds the first one stored and restores it before forwarding (what
# a returning conversation gets), shown for what it costs on a tiny model, where reprocessing the few
# tokens would be cheaper.
PROMPT = "Once upon a time"
ROUTES = [
    ("GET /health", "GET", "/health", None),
    ("POST /completion n_predict 1", "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0}),
    ("streamed /completion: first token", "POST", "/completion",
     {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stream": True}),
    ("/completion, another prompt (restore)", "POST", "/completion",
     {"prompt": "The quick brown fox", "n_predict": 1, "temperature": 0}),
]
WHOLE_STREAM = "streamed /completion: whole stream"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kvsnap")
    ap.add_argument("llama_server")
    ap.add_argument("model")
    ap.add_argument("work")
    ap.add_argument("-n", type=int, default=200, help="rounds (each sends every route to both)")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    args = ["-m", a.model, "-c", "2048", "-np", "1", "-t", "1", "--seed", "42"]
    procs = []
    try:
        dport, pport = free_port(), free_port()
        dlog, plog = os.path.join(work, "direct.log"), os.path.join(work, "serve.log")
        procs.append(subprocess.Popen([a.llama_server, *args, "--host", "127.0.0.1", "--port", str(dport)],
                                      stdout=open(dlog, "w"), stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen([a.kvsnap, "serve", "--listen", f"127.0.0.1:{pport}", "--store",
                                       os.path.join(work, "store"), "--log", os.path.join(work, "child.log"), "--",
                                       a.llama_server, *args], stdout=open(plog, "w"), stderr=subprocess.STDOUT))
        wait_health(dport, procs[0], "llama-server", dlog)
        wait_health(pport, procs[1], "kvsnap serve", plog)
        for port in (dport, pport):  # warm both (first completions load pages, the proxy's store)
            for _, m, path, body in ROUTES:
                for _ in range(3):
                    timed(port, m, path, body)
        settled = Settled(plog)
        load0 = os.getloadavg()
        samples = {name: {"direct": [], "proxy": []} for name, *_ in ROUTES}
        samples[WHOLE_STREAM] = {"direct": [], "proxy": []}
        for i in range(a.n):
            order = [("direct", dport), ("proxy", pport)] if i % 2 == 0 else [("proxy", pport), ("direct", dport)]
            for name, m, path, body in ROUTES[:3]:
                for who, port in order:
                    first, end = settled(who, port, m, path, body)
                    if body and body.get("stream"):
                        samples[name][who].append(first)
                        samples[WHOLE_STREAM][who].append(end)
                    else:
                        samples[name][who].append(end)
        # Then the restore row: PROMPT (not timed) then the other prompt, so the slot holds the wrong one.
        name, m, path, body = ROUTES[3]
        for i in range(a.n):
            order = [("direct", dport), ("proxy", pport)] if i % 2 == 0 else [("proxy", pport), ("direct", dport)]
            for who, port in order:
                settled(who, port, *ROUTES[1][1:])
                samples[name][who].append(settled(who, port, m, path, body)[1])
        load1 = os.getloadavg()
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    res = {"rounds": a.n, "model": a.model, "cores": os.cpu_count(), "loadavg": [load0, load1], "routes": {}}
    print(f"kvsnap serve vs direct llama-server, {a.n} rounds, {os.path.basename(a.model)}, "
          f"{os.cpu_count()} cores, load {load0[0]:.1f} -> {load1[0]:.1f}; ms")
    print(f"{'':38} {'direct p50':>10} {'p99':>7} {'proxy p50':>10} {'p99':>7} "
          f"{'added p50':>10} {'p99':>7} {'ratio p50':>10}")
    for name in samples:
        d, p = samples[name]["direct"], samples[name]["proxy"]
        r = {"direct_p50": pct(d, 50), "direct_p99": pct(d, 99), "proxy_p50": pct(p, 50), "proxy_p99": pct(p, 99)}
        r["added_p50"] = r["proxy_p50"] - r["direct_p50"]
        r["added_p99"] = r["proxy_p99"] - r["direct_p99"]
        r["ratio_p50"] = r["proxy_p50"] / r["direct_p50"]
        res["routes"][name] = r
        print(f"{name:38} {r['direct_p50']:10.2f} {r['direct_p99']:7.2f} {r['proxy_p50']:10.2f} {r['proxy_p99']:7.2f} "
              f"{r['added_p50']:10.2f} {r['added_p99']:7.2f} {r['ratio_p50']:9.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
