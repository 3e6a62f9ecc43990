#!/usr/bin/env python3
"""Converted slot files inside a real llama-server (the check of issue 3, the base of issue 5's).

  server_test.py KVSNAP LLAMA_SERVER FIXTURES WORKDIR [--models hd64,hd128]

For each model: a server with f16/f16 and flash attention on completes fixtures/prompt.txt and
saves slot 0. Then, for each target configuration (q8_0/q8_0, q4_0/q8_0, q4_0/q4_0 with flash
attention; f16/f16 without), a server started with those types:
  1. computes prompt + suffix natively (the "native" distributions, prompt_n = every token);
  2. refuses the unconverted f16 file (when the types differ: the reason kvsnap exists);
  3. restores the file `kvsnap convert` made, then completes prompt + suffix: prompt_n must be
     the few suffix tokens only (the cache was reused), and the next-token distributions (the
     whole vocabulary, n_probs = n_vocab) must be within the fidelity bound:
        KL(restored || f16 reference) <= 1.5 * max(KL(native target), KL(native source)) or <= 1e-6
     averaged over the generated positions where all runs agree on the tokens;
  4. the same file converted with --rotation off restores too, and its KL is reported (the
     negative control: garbage that restores without error).
Prints a table; exits non-zero on any failure. Needs only the Python standard library.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback import free_port  # noqa: E402  (tests/loopback.py)

SUFFIX = " And then the story went on, one more time."
N_PREDICT = 6


class Server:
    def __init__(self, binary, model, ctk, ctv, fa, slot_dir, log_path, extra=(), cwd=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [binary, "-m", model, "-c", "4096", "-np", "1", "-ctk", ctk, "-ctv", ctv,
                "-fa", "on" if fa else "off", "--slot-save-path", slot_dir + "/",
                "--host", "127.0.0.1", "--port", str(self.port), "-t", "2", "--no-warmup", *extra]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=cwd)
        self.desc = f"{os.path.basename(model)} ctk={ctk} ctv={ctv} fa={'on' if fa else 'off'}"
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.desc}); see {log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not become healthy ({self.desc}); see {log_path}")

    api_key = None

    def post(self, path, body):
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def completion(srv, prompt, n_vocab, cache_prompt=True):
    code, j = srv.post("/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0,
                                        "cache_prompt": cache_prompt, "id_slot": 0, "n_probs": n_vocab})
    if code != 200:
        raise RuntimeError(f"/completion failed on {srv.desc}: {code} {j}")
    steps = []
    for p in j.get("completion_probabilities", []):
        # v0.5.0 reports log-probabilities of the top n_probs tokens (pre-sampling, softmax of the logits)
        dist = {t["id"]: math.exp(t["logprob"]) for t in p["top_logprobs"]}
        steps.append((p["id"], dist))
    return j["timings"]["prompt_n"], steps


def kl(p, q):
    eps = 1e-10
    return sum(pv * math.log(pv / max(q.get(t, 0.0), eps)) for t, pv in p.items() if pv > 0)


def mean_kl(ref, other, agree):
    if agree == 0:
        return float("nan")
    return sum(kl(ref[i][1], other[i][1]) for i in range(agree)) / agree


def agreeing_prefix(*runs):
    n = min(len(r) for r in runs)
    for i in range(n):
        if len({r[i][0] for r in runs}) != 1:
            return i + 1  # the distribution at the first disagreement is still comparable
    return n


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


CONFIGS = {
    # name: (ctk, ctv, flash attention)
    "f16-f16-on": ("f16", "f16", True),
    "q8_0-q8_0-on": ("q8_0", "q8_0", True),
    "f16-f16-off": ("f16", "f16", False),
    "q4_0-q8_0-on": ("q4_0", "q8_0", True),
    "q4_0-q4_0-on": ("q4_0", "q4_0", True),
    "iq4_nl-iq4_nl-on": ("iq4_nl", "iq4_nl", True),
    "q5_1-q5_0-on": ("q5_1", "q5_0", True),
    "bf16-q8_0-on": ("bf16", "q8_0", True),
    "q8_0-f16-off": ("q8_0", "f16", False),
}
SOURCES = ["f16-f16-on", "q8_0-q8_0-on", "f16-f16-off"]
REFERENCE = "f16-f16-on"


class Case:
    """One model: every configuration's server, its native distributions, the saved slots."""

    def __init__(self, server_bin, model, work, prompt):
        self.model, self.work, self.prompt = model, work, prompt
        self.slot_dir = os.path.join(work, "slots")
        os.makedirs(self.slot_dir)
        self.servers, self.native, self.native_prompt_n = {}, {}, {}
        self.saved = {}
        for name, (ctk, ctv, fa) in CONFIGS.items():
            self.servers[name] = Server(server_bin, model, ctk, ctv, fa, self.slot_dir,
                                        os.path.join(work, f"{name}.log"))
        ref = self.servers[REFERENCE]
        self.n_total = len(ref.post("/tokenize", {"content": prompt + SUFFIX})[1]["tokens"]) + 1  # + BOS
        self.n_suffix = self.n_total - (len(ref.post("/tokenize", {"content": prompt})[1]["tokens"]) + 1)
        # n_probs above the vocabulary size: the server clamps it, so this is the whole distribution
        self.native_prompt_n[REFERENCE], self.native[REFERENCE] = completion(ref, prompt + SUFFIX, 100000, False)
        self.n_vocab = len(self.native[REFERENCE][0][1])
        for name, srv in self.servers.items():
            if name != REFERENCE:
                self.native_prompt_n[name], self.native[name] = completion(srv, prompt + SUFFIX, self.n_vocab, False)
            if name in SOURCES:
                srv.post("/slots/0?action=erase", {})
                completion(srv, prompt, 8)
                code, j = srv.post("/slots/0?action=save", {"filename": f"saved-{name}.bin"})
                if code != 200:
                    raise RuntimeError(f"slot save failed on {srv.desc}: {j}")
                self.saved[name] = j["n_saved"]

    def stop(self):
        for srv in self.servers.values():
            srv.stop()


def check_pair(case, kvsnap, src, dst, failures):
    ctk, ctv, fa = CONFIGS[dst]
    fa_word = "on" if fa else "off"
    srv = case.servers[dst]
    saved_path = os.path.join(case.slot_dir, f"saved-{src}.bin")
    srv.post("/slots/0?action=erase", {})
    label = f"{os.path.basename(case.model)} {src} -> {dst}"
    code, j = srv.post("/slots/0?action=restore", {"filename": f"saved-{src}.bin"})
    if code == 200:
        failures.append(f"{label}: the unconverted file restored ({j}); expected llama.cpp to refuse it")
    srv.post("/slots/0?action=erase", {})
    conv = f"conv-{src}-to-{dst}.bin"
    run([kvsnap, "convert", "--force", saved_path, os.path.join(case.slot_dir, conv), "--ctk", ctk, "--ctv", ctv,
         "--flash-attn", fa_word, "--model", case.model])
    code, j = srv.post("/slots/0?action=restore", {"filename": conv})
    if code != 200:
        failures.append(f"{label}: restore of the converted file failed: {j}")
        return None
    n_restored = j.get("n_restored")
    n_prompt, restored = completion(srv, case.prompt + SUFFIX, case.n_vocab)
    control = []
    if CONFIGS[src][0] in ("f16", "bf16", "f32") and ctk not in ("f16", "bf16", "f32"):
        # the negative control: the same conversion without the rotation restores just as well
        srv.post("/slots/0?action=erase", {})
        ctl = f"ctl-{src}-to-{dst}.bin"
        run([kvsnap, "convert", "--force", saved_path, os.path.join(case.slot_dir, ctl), "--ctk", ctk, "--ctv", ctv,
             "--flash-attn", fa_word, "--model", case.model, "--rotation", "off"])
        code, _ = srv.post("/slots/0?action=restore", {"filename": ctl})
        if code == 200:
            _, control = completion(srv, case.prompt + SUFFIX, case.n_vocab)
    ref = case.native[REFERENCE]
    agree = agreeing_prefix(ref, case.native[src], case.native[dst], restored)
    kl_src, kl_dst = mean_kl(ref, case.native[src], agree), mean_kl(ref, case.native[dst], agree)
    kl_restored = mean_kl(ref, restored, agree)
    kl_control = mean_kl(ref, control, min(agree, len(control))) if control else float("nan")
    bound = max(1.5 * max(kl_src, kl_dst), 1e-6)
    # the suffix, plus at most one token where the prompt's end and the suffix re-tokenize
    reused_ok = n_restored == case.saved[src] and n_prompt <= case.n_suffix + 1
    ok = reused_ok and kl_restored <= bound
    if not reused_ok:
        failures.append(f"{label}: restored {n_restored}/{case.saved[src]} tokens, then evaluated {n_prompt} of "
                        f"{case.n_total} prompt tokens (expected only the {case.n_suffix} of the suffix)")
    if kl_restored > bound:
        failures.append(f"{label}: KL {kl_restored:.3g} above the bound {bound:.3g}")
    return (label, n_restored, n_prompt, agree, kl_src, kl_dst, kl_restored, bound, kl_control, "ok" if ok else "FAIL")


def main():
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    kvsnap, server_bin, fixtures, work = sys.argv[1:5]
    models = ["hd64", "hd128"]
    if len(sys.argv) > 6 and sys.argv[5] == "--models":
        models = sys.argv[6].split(",")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prompt = open(os.path.join(fixtures, "prompt.txt")).read()
    failures, rows = [], []
    for m in models:
        case = Case(server_bin, os.path.join(fixtures, "models", f"tiny-{m}.gguf"), os.path.join(work, m), prompt)
        try:
            for src in SOURCES:
                for dst in CONFIGS:
                    if dst != src:
                        row = check_pair(case, kvsnap, src, dst, failures)
                        if row:
                            rows.append(row)
        finally:
            case.stop()
        print(f"{m}: prompt + suffix = {case.n_total} tokens, suffix {case.n_suffix}, vocabulary {case.n_vocab}")
    hdr = ("conversion", "restored", "prompt_n after restore", "positions", "KL native src", "KL native dst",
           "KL converted", "bound", "KL no rotation", "")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")
    for f in failures:
        print("FAIL: " + f)
    print(f"{len(rows)} conversions restored in llama-server, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
