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
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SUFFIX = " And then the story went on, one more time."
N_PREDICT = 6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, model, ctk, ctv, fa, slot_dir, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [binary, "-m", model, "-c", "4096", "-np", "1", "-ctk", ctk, "-ctv", ctv,
                "-fa", "on" if fa else "off", "--slot-save-path", slot_dir + "/",
                "--host", "127.0.0.1", "--port", str(self.port), "-t", "2", "--no-warmup"]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
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

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
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
        dist = {t["id"]: t["prob"] for t in p["top_probs"]} if "top_probs" in p else \
               {t["id"]: t["prob"] for t in p["probs"]}
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
    targets = [("q8_0", "q8_0", True), ("q4_0", "q8_0", True), ("q4_0", "q4_0", True), ("f16", "f16", False)]
    failures = []
    rows = []
    for m in models:
        model = os.path.join(fixtures, "models", f"tiny-{m}.gguf")
        slot_dir = os.path.join(work, m)
        os.makedirs(slot_dir)
        src = Server(server_bin, model, "f16", "f16", True, slot_dir, os.path.join(work, f"{m}-src.log"))
        try:
            code, props = src.post("/tokenize", {"content": prompt + SUFFIX})
            n_total = len(props["tokens"]) + 1  # + BOS
            completion(src, prompt, 8)
            code, saved = src.post("/slots/0?action=save", {"filename": "saved-f16.bin"})
            if code != 200:
                raise RuntimeError(f"slot save failed: {saved}")
            n_saved = saved["n_saved"]
            # n_probs above the vocabulary size: the server clamps it, so this is the whole distribution
            _, ref = completion(src, prompt + SUFFIX, 100000)
            n_vocab = len(ref[0][1])
        finally:
            src.stop()
        saved_path = os.path.join(slot_dir, "saved-f16.bin")
        for ctk, ctv, fa in targets:
            fa_word = "on" if fa else "off"
            name = f"{m} {ctk}/{ctv} fa={fa_word}"
            srv = Server(server_bin, model, ctk, ctv, fa, slot_dir, os.path.join(work, f"{m}-{ctk}-{ctv}-{fa_word}.log"))
            try:
                n_native, native = completion(srv, prompt + SUFFIX, n_vocab, cache_prompt=False)
                srv.post("/slots/0?action=erase", {})
                same = (ctk, ctv, fa) == ("f16", "f16", True)
                if not same:
                    code, j = srv.post("/slots/0?action=restore", {"filename": "saved-f16.bin"})
                    if code == 200:
                        failures.append(f"{name}: the unconverted f16 file restored ({j}), expected a refusal")
                    srv.post("/slots/0?action=erase", {})
                conv = f"conv-{ctk}-{ctv}-{fa_word}.bin"
                run([kvsnap, "convert", saved_path, os.path.join(slot_dir, conv), "--ctk", ctk, "--ctv", ctv,
                     "--flash-attn", fa_word, "--model", model])
                code, j = srv.post("/slots/0?action=restore", {"filename": conv})
                if code != 200:
                    failures.append(f"{name}: restore of the converted file failed: {j}")
                    continue
                n_restored = j.get("n_restored")
                n_prompt, restored = completion(srv, prompt + SUFFIX, n_vocab)
                # the negative control: no rotation
                srv.post("/slots/0?action=erase", {})
                ctl = f"ctl-{ctk}-{ctv}-{fa_word}.bin"
                run([kvsnap, "convert", saved_path, os.path.join(slot_dir, ctl), "--ctk", ctk, "--ctv", ctv,
                     "--flash-attn", fa_word, "--model", model, "--rotation", "off"])
                code, _ = srv.post("/slots/0?action=restore", {"filename": ctl})
                _, control = completion(srv, prompt + SUFFIX, n_vocab) if code == 200 else (0, [])
            finally:
                srv.stop()
            agree = agreeing_prefix(ref, native, restored)
            kl_native = mean_kl(ref, native, agree)
            kl_restored = mean_kl(ref, restored, agree)
            kl_control = mean_kl(ref, control, min(agree, len(control))) if control else float("nan")
            bound = max(1.5 * kl_native, 1e-6)
            reused_ok = n_restored == n_saved and n_prompt < n_total - n_saved + 4
            ok = reused_ok and kl_restored <= bound
            rows.append((name, n_saved, n_restored, n_native, n_prompt, agree, kl_native, kl_restored, bound,
                         kl_control, "ok" if ok else "FAIL"))
            if not reused_ok:
                failures.append(f"{name}: restored {n_restored}/{n_saved} tokens, then evaluated {n_prompt} "
                                f"of {n_total} prompt tokens (expected only the suffix)")
            if kl_restored > bound:
                failures.append(f"{name}: KL {kl_restored:.3g} above the bound {bound:.3g}")
    hdr = ("target", "saved", "restored", "native prompt_n", "prompt_n after restore", "positions",
           "KL native", "KL converted", "bound", "KL no-rotation", "")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in r]
        print("| " + " | ".join(cells) + " |")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
