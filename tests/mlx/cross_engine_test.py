"""ctest oracle.mlx_cross_engine: sessions moved between real llama.cpp and real mlx-lm by
`kvsnap convert --to mlx|llama`, proven by the next-token KL of the other engine continuing them.

  cross_engine_test.py KVSNAP MKMODEL DRIVER_V050 DRIVER_B8121|- PROMPT WORK [LLAMA_SERVER|-]

Models: kvsnap-mkmodel GGUFs with trained-like K/V outlier channels (so the rotation detector has
something to see), loaded in mlx-lm with the same weights (tests/mlx/gguf_twin.py): llama at head
dim 64 and 128 (K pairs permuted between the engines), qwen2, qwen3 and phi3 (NEOX rope: K in the
same order; qwen3 with per-head Q/K norms, head dim 128 wider than n_embd / n_head, GQA ratio 4;
phi3 with fused Q|K|V and gate|up projections and the rope over 96 of 128 dims, as Phi-4-mini), and
command-r (NORM rope in llama.cpp, traditional=True rope in mlx-lm, no converter permutation: K in
the same order; LayerNorm without bias, parallel attention and FFN, tied and scaled logits), and olmo2 (NEOX; RMS norms over the whole Q and K projections, after
attention and after the FFN, no pre-norms). qwen3, phi3, command-r and olmo2 run a shorter list of cases, marked * below, to keep the test's time down.
KVSNAP_MLX_CROSS_BEDS=hd64,command-r runs only the beds named.
Method (docs/fidelity.md): the state holds t[0..n-17]; the 16 tail tokens are decoded in one batch
and the mean KL over their 16 next-token distributions is taken, in float64.

1. The twin: llama.cpp (f16 cache) and mlx-lm (float32) on the same ids: KL < 1e-4; the twin without
   its Q/K un-permutation must be far off (the check can fail).
2. llama.cpp -> mlx-lm: slot files of llama.cpp v0.5.0 (rotating) at f16 (flash attention on and
   off), q8_0, q4_0, q8_0/q4_0, of v0.5.0 with LLAMA_ATTN_ROT_DISABLE=1 (refused without
   --src-rotation off, then moved), of b8121 (never rotates; --source-build b8121), moved, loaded by
   mlx-lm, the tail decoded from the loaded cache, KL against mlx-lm computing the whole prompt.
   Bound: KL <= 1.5 x the KL of llama.cpp's own cache of that type (against its f16 cache) + 1e-5.
   Also to mlx-lm's QuantizedKVCache (--kv-bits 8 / 4): bound 1.5 x mlx-lm's own quantized cache.
   The session file (llama_state_save_file) llama.cpp saved with each slot of equal K/V types and
   flash attention on moves too (f16 and q8_0 (*), q4_0; b8121's ggsn v9 q8_0).
3. mlx-lm -> llama.cpp: mlx-lm's cache (float32, and its q8g64 QuantizedKVCache) moved to slot files
   at f16 (fa on/off), q8_0, q4_0 (rotated), q8_0 for b8121 (--target-build b8121: not rotated),
   restored by the driver of that build, KL against llama.cpp computing the prompt (f16 cache).
   Bound as in 2, from llama.cpp's natively computed cache of the target types. Also to session
   files (--llama-file session) at f16 and q8_0 (*), q4_0, and b8121's ggsn v9 q8_0
   (--target-build b8121), loaded by llama_state_load_file.
4. Controls that must fail the bound: the K pair order wrong (llama: permutation skipped; qwen2: a
   permutation made), both ways; the rotation not undone (--src-rotation off on a rotated file).
5. mlx-lm --max-kv-size: a RotatingKVCache of 128 holding the 92 positions moves to llama.cpp f16
   (bound 1e-5); one of 64, whose ring has wrapped, is refused (exit 4) naming layer 0.
6. With llama-server v0.5.0 (when built): a slot it saved (packed token payload) moved to mlx-lm;
   mlx-lm's cache moved to f16 and q8_0 slots it restores (n_restored, only the 16 tail tokens
   computed) and continues: KL of the one distribution after the prompt (n_probs = vocabulary).
7. gemma3 (iSWA; gemma() and gemma_server()): 6 layers, every third global, window 16, so the
   92-token state wraps the SWA layers' rings. The twin (and a twin with window 17, which must fail);
   llama.cpp slot and session f16, q8_0, fa off, --swa-full -> mlx-lm (RotatingKVCache checked
   against mlx-lm's own: classes, offsets, the window's rows), also in the layouts of mlx-lm 0.31.3
   and 0.28.0 continued by them, and --kv-bits 8 (global layers quantized, rings float); mlx-lm's
   cache after one batch (rings of 92 rows) and after single steps (wrapped rings, _idx 5), and its
   q8g64 mixed cache -> llama.cpp slot/session; controls: the rings' rows one slot off, the SWA cells
   one position off. llama-server: its slot to mlx-lm; mlx-lm's caches restored (n_restored 92): the
   batch one continued from the restored cache (prompt_n 16: kvsnap writes the SWA cell T-17 the
   server's reuse rule wants), the wrapped ring treated as the server's own slot (re-processed).
   gemma2 (window 128, longer than the prompt: mlx-lm's gemma2 has no window, so the engines agree only within it) runs the shorter list (*) as
   a NEOX family, every layer a KVCache; a gemma2 session past a window of 32 is refused.
Prints a table of every KL and exits 1 on any failure.
"""
import json
import os
import resource
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as C

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_twin import load_twin, mean_kl  # noqa: E402

TAIL = 16
FLOOR = 1e-5  # "near 0": f16 caches, whose native KL is 0 or a few 1e-6
failures = []
rows = []


def cpu_seconds():
    """CPU time of this process and of the engines it ran (the wall time depends on the machine's load)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def fail(where, msg):
    failures.append("%s: %s" % (where, msg))
    print("FAIL %s: %s" % (where, msg), flush=True)


def run(cmd, env=None, expect_ok=True):
    e = dict(os.environ)
    e["KVSNAP_ORACLE_CPU"] = "x64"
    if env:
        e.update(env)
    r = subprocess.run(cmd, capture_output=True, text=True, env=e)
    if expect_ok and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, (r.stderr or r.stdout).strip()))
    return r


def logits(path):
    return np.fromfile(path, dtype="<f4").reshape(TAIL, -1)


def record(what, kl, native, bound, must_fail=False):
    ok = kl > bound if must_fail else kl <= bound
    rows.append((what, kl, native, bound, "must fail" if must_fail else "", "ok" if ok else "FAIL"))
    if not ok:
        fail(what, "KL %.3e %s bound %.3e (native %.3e)" % (kl, "within" if must_fail else "above", bound, native))


class Bed:
    def __init__(self, kvsnap, mkmodel, drivers, prompt, work, name, mk_args, quick=False):
        self.kvsnap, self.drivers, self.prompt, self.work = kvsnap, drivers, prompt, work
        self.name = name
        self.quick = quick  # the cases marked * in the docstring only
        self.gguf = os.path.join(work, name + ".gguf")
        run([mkmodel, "--out", self.gguf] + mk_args)
        self.model, self.info = load_twin(self.gguf)
        self.ref = {}  # driver -> its own f16 tail logits (llama.cpp computing the prompt)
        self.tokens = None

    def path(self, s):
        return os.path.join(self.work, self.name + "-" + s)

    def save(self, drv, ctk, ctv, fa, tag, env=None, args=()):
        """llama.cpp computing t[0..n-17]: its slot file, its session file (<slot>.session) and the tail's logits."""
        slot, lg = self.path(tag + ".slot"), self.path(tag + ".logits")
        cmd = [self.drivers[drv], "save", "--model", self.gguf, "--prompt-file", self.prompt, "--ctk", ctk, "--ctv", ctv,
               "--fa", fa, "--eval-tail", str(TAIL), "--slot", slot, "--session", slot + ".session", "--logits", lg]
        cmd += list(args)
        if self.tokens is None:
            cmd += ["--tokens-out", self.path("tokens.bin")]
        run(cmd, env)
        if self.tokens is None:
            self.tokens = np.fromfile(self.path("tokens.bin"), dtype="<i4").tolist()
        return slot, logits(lg)

    def llama_ref(self, drv):
        if drv not in self.ref:
            self.ref[drv] = self.save(drv, "f16", "f16", "on", drv + "-ref-f16")[1]
        return self.ref[drv]

    def restore(self, drv, slot, ctk, ctv, fa, kind="slot"):
        """The driver loads a slot (llama_state_seq_load_file) or session (llama_state_load_file) file."""
        lg = slot + ".logits"
        run([self.drivers[drv], "restore", "--model", self.gguf, "--prompt-file", self.prompt, "--ctk", ctk, "--ctv", ctv,
             "--fa", fa, "--eval-tail", str(TAIL), "--" + kind, slot, "--logits", lg])
        return logits(lg)

    def mlx_full(self):
        """mlx-lm computing the whole prompt: the tail's logits."""
        if not hasattr(self, "_mlx_full"):
            out = self.model(mx.array([self.tokens]))[0].astype(mx.float32)
            self._mlx_full = np.array(out[-TAIL:])
        return self._mlx_full

    def mlx_continue(self, cache_path=None, cache=None):
        if cache is None:
            cache = C.load_prompt_cache(cache_path)
        out = self.model(mx.array([self.tokens[-TAIL:]]), cache=cache)[0].astype(mx.float32)
        return np.array(out)

    def mlx_cache(self):
        """mlx-lm's own cache of t[0..n-17], float32."""
        cache = C.make_prompt_cache(self.model)
        self.model(mx.array([self.tokens[:-TAIL]]), cache=cache)
        mx.eval([c.state for c in cache])
        return cache

    def convert(self, src, dst, *args, expect_ok=True):
        r = run([self.kvsnap, "convert", "--force", src, dst, "--model", self.gguf] + list(args), expect_ok=False)
        if expect_ok and r.returncode != 0:
            raise RuntimeError("kvsnap convert %s: exit %d: %s" % (src, r.returncode, r.stderr.strip()))
        return r


def check_twin(bed):
    ref = bed.llama_ref("v0.5.0")
    kl = mean_kl(ref, bed.mlx_full())
    record("%s twin: llama.cpp f16 vs mlx-lm f32, same ids" % bed.name, kl, 0.0, 1e-4)
    wrong, _ = load_twin(bed.gguf, permute=bed.info["arch"] != "llama")
    out = np.array(wrong(mx.array([bed.tokens]))[0].astype(mx.float32)[-TAIL:])
    record("%s twin control: Q/K rows %s" % (bed.name, "not un-permuted" if bed.info["arch"] == "llama" else "un-permuted"),
           mean_kl(ref, out), 0.0, 1e-4, must_fail=True)


def k_to_llama_order(cache):
    """The control: a cache's K put in llama.cpp's pair order: for a llama the permutation skipped,
    for a NEOX model (qwen2) one made although its K is in the same order in both engines."""
    for c in cache:
        k = c.keys[..., : c.offset, :]
        d = k.shape[-1]
        c.keys = k.reshape(*k.shape[:-1], 2, d // 2).swapaxes(-1, -2).reshape(k.shape)
        c.values = c.values[..., : c.offset, :]
    return cache


def llama_to_mlx(bed):
    ref = bed.llama_ref("v0.5.0")
    full = bed.mlx_full()
    cases = [("v0.5.0", "f16", "f16", "on", None, []), ("v0.5.0", "q8_0", "q8_0", "on", None, [])]
    if not bed.quick:
        cases += [("v0.5.0", "f16", "f16", "off", None, []), ("v0.5.0", "q4_0", "q4_0", "on", None, []),
                  ("v0.5.0", "q8_0", "q4_0", "on", None, [])]
        if "b8121" in bed.drivers:
            cases.append(("b8121", "q8_0", "q8_0", "on", None, []))
        cases.append(("v0.5.0", "q8_0", "q8_0", "on", {"LLAMA_ATTN_ROT_DISABLE": "1"}, ["--src-rotation", "off"]))
    for drv, ctk, ctv, fa, env, claims in cases:
        tag = "%s-%s-%s-fa%s%s" % (drv, ctk, ctv, fa, "-norot" if env else "")
        slot, native_lg = bed.save(drv, ctk, ctv, fa, tag, env)
        native = mean_kl(bed.llama_ref(drv), native_lg)
        out = bed.path(tag + ".safetensors")
        if drv == "b8121":  # ggsq v2 is written by builds on both sides: the data decides, layer 0's
            # RoPE first (docs/rope-witness.md), and the outlier channels must agree
            r = bed.convert(slot, out + ".json", "--to", "mlx", "--json")
            d = json.loads(r.stdout)["source_rotation"]
            if d.get("decided_by") != "rope" or d.get("rotated") is not False or \
                    (d.get("data") or {}).get("verdict") != "not-rotated":
                fail(tag, "rotation decided %s" % json.dumps(d)[:300])
        if claims:  # without the claim the move must be refused (exit 6), never guessed
            r = bed.convert(slot, out + ".unclaimed", "--to", "mlx", expect_ok=False)
            if r.returncode != 6 or os.path.exists(out + ".unclaimed"):
                fail(tag, "moved without %s: exit %d (want 6, no output): %s" % (claims[0], r.returncode, r.stderr.strip()))
        bed.convert(slot, out, "--to", "mlx", *claims)
        kl = mean_kl(full, bed.mlx_continue(out))
        record("%s llama.cpp %s %s/%s fa %s -> mlx-lm" % (bed.name, drv + (" ROT_DISABLE" if env else ""), ctk, ctv, fa),
               kl, native, 1.5 * native + FLOOR)
        if fa == "on" and ctk == ctv and not env:  # the session saved with the slot (ggsn v10; b8121: v9)
            out = bed.path(tag + "-session.safetensors")
            bed.convert(slot + ".session", out, "--to", "mlx")
            record("%s llama.cpp %s %s/%s session -> mlx-lm" % (bed.name, drv, ctk, ctv),
                   mean_kl(full, bed.mlx_continue(out)), native, 1.5 * native + FLOOR)
        if ctk == "f16" and fa == "on":
            bad = k_to_llama_order(C.load_prompt_cache(out))
            record("%s control: f16 -> mlx-lm, K pair order wrong" % bed.name,
                   mean_kl(full, bed.mlx_continue(cache=bad)), native, 1.5 * native + FLOOR, must_fail=True)
        if ctk == "q8_0" and ctv == "q8_0" and drv == "v0.5.0" and not env:
            bad = bed.path(tag + "-unrotated.safetensors")
            bed.convert(slot, bad, "--to", "mlx", "--src-rotation", "off")
            record("%s control: q8_0 -> mlx-lm, rotation not undone" % bed.name,
                   mean_kl(full, bed.mlx_continue(bad)), native, 1.5 * native + FLOOR, must_fail=True)
    # llama.cpp f16 -> mlx-lm QuantizedKVCache: against mlx-lm's own quantized cache.
    slot = bed.path("v0.5.0-f16-f16-faon.slot")
    if bed.info["arch"] == "gemma2":  # mlx-lm's gemma2 attention takes no QuantizedKVCache: refused
        r = bed.convert(slot, bed.path("q8.safetensors"), "--to", "mlx", "--kv-bits", "8", expect_ok=False)
        if r.returncode != 4 or os.path.exists(bed.path("q8.safetensors")):
            fail("gemma2 --kv-bits", "exit %d: %s" % (r.returncode, r.stderr.strip()))
        return
    for bits in (8,) if bed.quick else (8, 4):
        native_cache = [c.to_quantized(group_size=64, bits=bits) for c in bed.mlx_cache()]
        native = mean_kl(full, bed.mlx_continue(cache=native_cache))
        out = bed.path("v0.5.0-f16-to-q%dg64.safetensors" % bits)
        bed.convert(slot, out, "--to", "mlx", "--kv-bits", str(bits), "--kv-group-size", "64")
        record("%s llama.cpp f16 -> mlx-lm q%dg64" % (bed.name, bits), mean_kl(full, bed.mlx_continue(out)), native,
               1.5 * native + FLOOR)
    # older mlx-lm releases (the bed's venv/old): their layout, continued by that release
    if bed.name != "hd64":
        return
    native_q8 = mean_kl(full, bed.mlx_continue(cache=[c.to_quantized(group_size=64, bits=8) for c in bed.mlx_cache()]))
    for version, layout in OLD_MLX_LM:
        for bits in (None, 8):
            out = bed.path("v0.5.0-f16-mlx-lm-%s%s.safetensors" % (version, "-q8" if bits else ""))
            bed.convert(slot, out, "--to", "mlx", "--mlx-lm", version, *(["--kv-bits", "8"] if bits else []))
            # a KVCache-only file is the same in both meta layouts (only QuantizedKVCache has `step`)
            got = continue_in_old(bed, out, version, layout if bits else "meta_state")
            if got is None:
                continue
            native = native_q8 if bits else 0.0
            record("%s llama.cpp f16 -> mlx-lm %s%s (its layout, continued by it)" % (bed.name, version,
                                                                                      " q8g64" if bits else ""),
                   mean_kl(full, got), native, 1.5 * native + FLOOR)


OLD_MLX_LM = (("0.31.3", "meta_state"), ("0.28.0", "meta_state-with-step"))


def continue_in_old(bed, out, version, layout):
    """The tail's logits from an older mlx-lm release (the bed's <venv>/old/mlx-lm-<v>) loading the
    prompt cache `out` (checked to be in `layout`), or None after recording why not."""
    old = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "old", "mlx-lm-" + version)
    if not os.path.isdir(old):
        fail(old, "mlx-lm %s is not in the bed (tests/mlx/make-bed.sh)" % version)
        return None
    info = json.loads(run([bed.kvsnap, "info", out, "--json"]).stdout)
    if info.get("layout") != layout:
        fail(out, "layout %s, want %s" % (info.get("layout"), layout))
    got = out + ".logits"
    env = dict(os.environ, PYTHONPATH=old)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--continue", bed.gguf, bed.path("tokens.bin"),
                        out, got], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        fail(out, "mlx-lm %s: %s" % (version, (r.stdout + r.stderr).strip()[-800:]))
        return None
    return logits(got)


def mlx_to_llama(bed):
    cache = bed.mlx_cache()
    src = bed.path("mlx-f32.safetensors")
    C.save_prompt_cache(src, cache, {"model": bed.name})
    toks = bed.path("prompt-tokens.json")
    with open(toks, "w") as f:
        json.dump(bed.tokens[:-TAIL], f)
    qsrc = bed.path("mlx-q8g64.safetensors")
    full = bed.mlx_full()
    if bed.info["arch"] != "gemma2":  # mlx-lm's gemma2 cannot run a QuantizedKVCache
        C.save_prompt_cache(qsrc, [c.to_quantized(group_size=64, bits=8) for c in bed.mlx_cache()], {"model": bed.name})
        mlx_q8_native = mean_kl(full, bed.mlx_continue(qsrc))

    # without --tokens the move is refused (mlx-lm stores none) and leaves nothing
    r = bed.convert(src, bed.path("no-tokens.slot"), "--to", "llama", expect_ok=False)
    if r.returncode == 0 or os.path.exists(bed.path("no-tokens.slot")):
        fail(src, "moved to llama.cpp without token ids: exit %d" % r.returncode)
    cases = [("v0.5.0", "f16", "f16", "on", []), ("v0.5.0", "q8_0", "q8_0", "on", [])]
    if not bed.quick:
        cases += [("v0.5.0", "f16", "f16", "off", []), ("v0.5.0", "q4_0", "q4_0", "on", []),
                  ("v0.5.0", "q8_0", "q4_0", "on", [])]
        if "b8121" in bed.drivers:
            cases.append(("b8121", "q8_0", "q8_0", "on", ["--target-build", "b8121"]))
    for drv, ctk, ctv, fa, extra in cases:
        tag = "mlx-to-%s-%s-%s-fa%s" % (drv, ctk, ctv, fa)
        _, native_lg = bed.save(drv, ctk, ctv, fa, drv + "-native-" + ctk + "-" + ctv + "-fa" + fa)
        ref = bed.llama_ref(drv)
        native = mean_kl(ref, native_lg)
        out = bed.path(tag + ".slot")
        bed.convert(src, out, "--to", "llama", "--tokens", toks, "--ctk", ctk, "--ctv", ctv, "--fa", fa, *extra)
        kl = mean_kl(ref, bed.restore(drv, out, ctk, ctv, fa))
        record("%s mlx-lm f32 -> llama.cpp %s %s/%s fa %s" % (bed.name, drv, ctk, ctv, fa), kl, native, 1.5 * native + FLOOR)
        if fa == "on" and ctk == ctv:  # a session file (b8121: ggsn v9), loaded by llama_state_load_file
            sess = bed.path(tag + ".session")
            bed.convert(src, sess, "--to", "llama", "--llama-file", "session", "--tokens", toks, "--ctk", ctk, "--ctv", ctv,
                        *extra)
            with open(sess, "rb") as f:
                if f.read(4) != b"nsgg":  # 'ggsn' as a little-endian u32
                    fail(sess, "not a ggsn session file")
            record("%s mlx-lm f32 -> llama.cpp %s %s/%s session" % (bed.name, drv, ctk, ctv),
                   mean_kl(ref, bed.restore(drv, sess, ctk, ctv, fa, kind="session")), native, 1.5 * native + FLOOR)
        if ctk == "f16" and fa == "on":
            bad_src = bed.path("mlx-f32-k-prepermuted.safetensors")
            # K put in mlx-lm order from llama.cpp order: for a llama, kvsnap's permutation then gives
            # back the mlx-lm order (the skipped move); for qwen2 it is a wrong permutation
            inv = bed.mlx_cache()
            for c in inv:
                k = c.keys[..., : c.offset, :]
                d = k.shape[-1]
                c.keys = k.reshape(*k.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(k.shape)
                c.values = c.values[..., : c.offset, :]
            C.save_prompt_cache(bad_src, inv, {"model": bed.name})
            bad = bed.path(tag + "-unpermuted.slot")
            bed.convert(bad_src, bad, "--to", "llama", "--tokens", toks, "--ctk", ctk, "--ctv", ctv, "--fa", fa)
            record("%s control: mlx-lm -> llama.cpp f16, K pair order wrong" % bed.name,
                   mean_kl(ref, bed.restore(drv, bad, ctk, ctv, fa)), native, 1.5 * native + FLOOR, must_fail=True)
    # mlx-lm's own q8g64 cache -> llama.cpp f16: the loss is mlx-lm's quantization
    ref = bed.llama_ref("v0.5.0")
    if not bed.quick:
        out = bed.path("mlx-q8g64-to-f16.slot")
        bed.convert(qsrc, out, "--to", "llama", "--tokens", toks)
        record("%s mlx-lm q8g64 -> llama.cpp f16" % bed.name, mean_kl(ref, bed.restore("v0.5.0", out, "f16", "f16", "on")),
               mlx_q8_native, 1.5 * mlx_q8_native + FLOOR)
    # round trip llama.cpp -> mlx-lm -> llama.cpp, tokens carried in the prompt cache's metadata
    there = bed.path("v0.5.0-q8_0-q8_0-faon.safetensors")
    back = bed.path("roundtrip-q8_0.slot")
    bed.convert(there, back, "--to", "llama", "--ctk", "q8_0", "--ctv", "q8_0")
    native = mean_kl(ref, logits(bed.path("v0.5.0-q8_0-q8_0-faon.logits")))
    record("%s llama.cpp q8_0 -> mlx-lm -> llama.cpp q8_0 (tokens from metadata)" % bed.name,
           mean_kl(ref, bed.restore("v0.5.0", back, "q8_0", "q8_0", "on")), native, 2.0 * 1.5 * native + FLOOR)


def rotating_to_llama(bed):
    """mlx-lm --max-kv-size: a RotatingKVCache whose ring has not wrapped (max_size 128 > 92 positions)
    moves to llama.cpp like a KVCache; one that has (max_size 64 < 92) is refused naming the layer."""
    toks = bed.path("prompt-tokens.json")
    ref = bed.llama_ref("v0.5.0")
    for max_size in (128, 64):
        cache = [C.RotatingKVCache(max_size=max_size, keep=4) for _ in bed.model.layers]
        bed.model(mx.array([bed.tokens[:-TAIL]]), cache=cache)
        mx.eval([c.state for c in cache])
        src = bed.path("mlx-rotating-%d.safetensors" % max_size)
        C.save_prompt_cache(src, cache, {"model": bed.name})
        out = bed.path("mlx-rotating-%d.slot" % max_size)
        if max_size == 128:
            bed.convert(src, out, "--to", "llama", "--tokens", toks)
            record("%s mlx-lm RotatingKVCache(128), 92 positions -> llama.cpp f16" % bed.name,
                   mean_kl(ref, bed.restore("v0.5.0", out, "f16", "f16", "on")), 0.0, FLOOR)
            continue
        r = bed.convert(src, out, "--to", "llama", "--tokens", toks, expect_ok=False)
        want = "layer 0 (RotatingKVCache): its ring of 64 positions has wrapped (offset 92, _idx 92)"
        if r.returncode != 4 or want not in r.stderr or os.path.exists(out):
            fail(src, "wrapped ring: exit %d (want 4, no output, '%s'): %s" % (r.returncode, want, r.stderr.strip()))
        else:
            print("ok %s: wrapped ring refused: %s" % (bed.name, r.stderr.strip()[:200]), flush=True)


def with_server(bed, server_bin):
    """llama-server v0.5.0 (when built): a slot it saved (packed token payload) moved to mlx-lm, and
    mlx-lm's cache moved to a slot it restores and continues. KL of the one next-token distribution
    after the whole prompt (n_probs = the vocabulary), bound from the driver's native cache there."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
    from server_test import Server  # noqa: E402

    n_vocab = bed.info["n_vocab"]
    full = bed.mlx_full()
    ref_row = bed.llama_ref("v0.5.0")[-1:]
    slot_dir = bed.path("server-slots")
    os.makedirs(slot_dir, exist_ok=True)
    for ctk in ("f16", "q8_0"):
        native_lg = logits(bed.path("v0.5.0-native-%s-%s-faon.logits" % (ctk, ctk)))
        native = mean_kl(ref_row, native_lg[-1:])  # the last position, for the server's one distribution
        native16 = mean_kl(bed.llama_ref("v0.5.0"), native_lg)
        srv = Server(bed.server, bed.gguf, ctk, ctk, True, slot_dir, bed.path("server-%s.log" % ctk))
        try:
            # the server computes t[0..91] and saves its slot (its packed token payload)
            code, j = srv.post("/completion", {"prompt": bed.tokens[:-TAIL], "n_predict": 0, "cache_prompt": True,
                                               "id_slot": 0})
            code, j = srv.post("/slots/0?action=save", {"filename": "saved-%s.slot" % ctk})
            if code != 200:
                raise RuntimeError("slot save: %d %s" % (code, j))
            saved = os.path.join(slot_dir, "saved-%s.slot" % ctk)
            out = bed.path("server-%s.safetensors" % ctk)
            bed.convert(saved, out, "--to", "mlx")
            record("%s llama-server %s/%s slot -> mlx-lm" % (bed.name, ctk, ctk), mean_kl(full, bed.mlx_continue(out)),
                   native16, 1.5 * native16 + FLOOR)
            # mlx-lm's cache -> a slot this server restores, then the prompt's last token after it
            name = "from-mlx-%s.slot" % ctk
            bed.convert(bed.path("mlx-f32.safetensors"), os.path.join(slot_dir, name), "--to", "llama", "--tokens",
                        bed.path("prompt-tokens.json"), "--ctk", ctk, "--ctv", ctk)
            code, j = srv.post("/slots/0?action=restore", {"filename": name})
            if code != 200 or j.get("n_restored") != len(bed.tokens) - TAIL:
                fail(name, "llama-server restore: %d %s" % (code, j))
                continue
            code, j = srv.post("/completion", {"prompt": bed.tokens, "n_predict": 1, "temperature": 0,
                                               "cache_prompt": True, "id_slot": 0, "n_probs": n_vocab})
            if code != 200 or j["timings"]["prompt_n"] != TAIL:
                fail(name, "llama-server did not continue the restored cache: %d %s" % (code, j.get("timings")))
                continue
            dist = np.full(n_vocab, -1e30)
            for t in j["completion_probabilities"][0]["top_logprobs"]:
                dist[t["id"]] = t["logprob"]
            record("%s mlx-lm f32 -> llama-server %s/%s (last position)" % (bed.name, ctk, ctk),
                   mean_kl(ref_row, dist[None, :]), native, 1.5 * native + FLOOR)
        finally:
            srv.stop()


def ring_rows(c):
    """A RotatingKVCache's K rows in temporal order (mlx-lm's own _temporal_order), as float32."""
    return np.array(c._temporal_order(c.keys).astype(mx.float32))


def gemma(bed):
    """gemma3 (iSWA, window W): both ways, the prompt long enough to wrap the SWA layers' ring."""
    W = bed.info["n_swa"]
    ref, full = bed.llama_ref("v0.5.0"), bed.mlx_full()
    record("%s twin: llama.cpp f16 vs mlx-lm f32, same ids (window %d)" % (bed.name, W), mean_kl(ref, full), 0.0, 1e-4)
    wrong, _ = load_twin(bed.gguf)
    wrong.model.window_size = W + 1  # the engines disagreeing on the window rule by one position
    out = np.array(wrong(mx.array([bed.tokens]))[0].astype(mx.float32)[-TAIL:])
    record("%s twin control: mlx-lm window %d" % (bed.name, W + 1), mean_kl(ref, out), 0.0, 1e-4, must_fail=True)

    # llama.cpp -> mlx-lm: the slot's SWA section (the last W cells; every cell in a session) -> rings
    own = bed.mlx_cache()
    for ctk, ctv, fa, args in (("f16", "f16", "on", []), ("q8_0", "q8_0", "on", []), ("f16", "f16", "off", []),
                               ("f16", "f16", "on", ["--swa-full", "on"])):
        tag = "v0.5.0-%s-%s-fa%s%s" % (ctk, ctv, fa, "-swafull" if args else "")
        slot, native_lg = bed.save("v0.5.0", ctk, ctv, fa, tag, args=args)
        native = mean_kl(ref, native_lg)
        what = "%s llama.cpp %s/%s fa %s%s" % (bed.name, ctk, ctv, fa, " --swa-full" if args else "")
        for kind, src in (("slot", slot), ("session", slot + ".session")):
            if kind == "session" and (fa == "off" or args):
                continue
            out = bed.path(tag + "-" + kind + ".safetensors")
            bed.convert(src, out, "--to", "mlx")
            moved = C.load_prompt_cache(out)
            for i, (a, b) in enumerate(zip(own, moved)):  # the same caches as mlx-lm's own, window rows alike
                if type(a) is not type(b) or a.offset != b.offset:
                    fail(out, "layer %d: %s offset %d, mlx-lm's own %s offset %d" % (i, type(b).__name__, b.offset,
                                                                                     type(a).__name__, a.offset))
                elif isinstance(a, C.RotatingKVCache):
                    mine, theirs = ring_rows(b), ring_rows(a)[..., -W:, :]
                    err = np.abs(mine - theirs).max() / np.abs(theirs).max()
                    if b.max_size != W or b.keep != 0 or mine.shape != theirs.shape or err > 0.02:
                        fail(out, "layer %d: ring max %d keep %d rows %s, off by %.3g from mlx-lm's own" %
                             (i, b.max_size, b.keep, mine.shape, err))
            record("%s %s -> mlx-lm" % (what, kind), mean_kl(full, bed.mlx_continue(out)), native, 1.5 * native + FLOOR)
        if ctk == "f16" and fa == "on" and not args:  # control: the rings' rows one slot off
            bad = C.load_prompt_cache(bed.path(tag + "-slot.safetensors"))
            for c in bad:
                if isinstance(c, C.RotatingKVCache):
                    c.keys, c.values = mx.roll(c.keys, 1, axis=2), mx.roll(c.values, 1, axis=2)
            record("%s control: f16 -> mlx-lm, ring rows one slot off" % bed.name,
                   mean_kl(full, bed.mlx_continue(cache=bad)), native, 1.5 * native + FLOOR, must_fail=True)
            for version, layout in OLD_MLX_LM:  # the rings' meta_state of older releases (0.28.0: with step)
                out = bed.path(tag + "-mlx-lm-%s.safetensors" % version)
                bed.convert(slot, out, "--to", "mlx", "--mlx-lm", version)
                got = continue_in_old(bed, out, version, layout)
                if got is not None:
                    record("%s llama.cpp f16 -> mlx-lm %s (its layout, continued by it)" % (bed.name, version),
                           mean_kl(full, got), native, 1.5 * native + FLOOR)

    # --kv-bits 8: the global layers' KVCache quantized, the rings kept float (mlx-lm cannot quantize
    # them); native: mlx-lm's own cache quantized the same way
    mixed = [c.to_quantized(group_size=64, bits=8) if isinstance(c, C.KVCache) else c for c in bed.mlx_cache()]
    C.save_prompt_cache(bed.path("mlx-q8g64.safetensors"), mixed, {"model": bed.name})
    native_q8 = mean_kl(full, bed.mlx_continue(cache=mixed))
    out = bed.path("v0.5.0-f16-to-q8g64.safetensors")
    bed.convert(bed.path("v0.5.0-f16-f16-faon.slot"), out, "--to", "mlx", "--kv-bits", "8")
    record("%s llama.cpp f16 -> mlx-lm q8g64 (global layers; rings float)" % bed.name,
           mean_kl(full, bed.mlx_continue(out)), native_q8, 1.5 * native_q8 + FLOOR)

    # mlx-lm -> llama.cpp: its cache after one batch (rings of all 92 rows, _idx 92) and after single
    # steps (rings of W rows, wrapped: _idx 5)
    toks = bed.path("prompt-tokens.json")
    with open(toks, "w") as f:
        json.dump(bed.tokens[:-TAIL], f)
    C.save_prompt_cache(bed.path("mlx-batch.safetensors"), own, {"model": bed.name})
    stepped = C.make_prompt_cache(bed.model)
    bed.model(mx.array([bed.tokens[:-TAIL - 5]]), cache=stepped)
    for t in bed.tokens[-TAIL - 5:-TAIL]:
        bed.model(mx.array([[t]]), cache=stepped)
    C.save_prompt_cache(bed.path("mlx-stepped.safetensors"), stepped, {"model": bed.name})
    if stepped[0]._idx != 5 or stepped[0].keys.shape[2] != W:
        fail("mlx-stepped", "ring _idx %d rows %d, want 5 and %d" % (stepped[0]._idx, stepped[0].keys.shape[2], W))
    for name in ("batch", "stepped", "q8g64"):
        src = bed.path("mlx-%s.safetensors" % name)
        for ctk, kind in (("f16", "slot"),) if name == "q8g64" else (("f16", "slot"), ("q8_0", "slot"), ("f16", "session")):
            native = mean_kl(ref, logits(bed.path("v0.5.0-%s-%s-faon.logits" % (ctk, ctk))))
            out = bed.path("mlx-%s-to-%s.%s" % (name, ctk, kind))
            bed.convert(src, out, "--to", "llama", "--tokens", toks, "--ctk", ctk, "--ctv", ctk, "--llama-file", kind)
            if name == "q8g64":  # the loss is mlx-lm's quantization
                native = native_q8
            record("%s mlx-lm %s -> llama.cpp %s/%s %s" % (bed.name, name, ctk, ctk, kind),
                   mean_kl(ref, bed.restore("v0.5.0", out, ctk, ctk, "on", kind=kind)), native, 1.5 * native + FLOOR)
    # control: the wrapped ring read one slot off (_idx + 1): every SWA cell one position off
    bad = C.load_prompt_cache(bed.path("mlx-stepped.safetensors"))
    for c in bad:
        if isinstance(c, C.RotatingKVCache):
            c._idx += 1
    C.save_prompt_cache(bed.path("mlx-stepped-off.safetensors"), bad, {"model": bed.name})
    out = bed.path("mlx-stepped-off.slot")
    bed.convert(bed.path("mlx-stepped-off.safetensors"), out, "--to", "llama", "--tokens", toks)
    record("%s control: mlx-lm -> llama.cpp f16, SWA cells one position off" % bed.name,
           mean_kl(ref, bed.restore("v0.5.0", out, "f16", "f16", "on")), 0.0, FLOOR, must_fail=True)


def gemma_server(bed, server_bin):
    """llama-server v0.5.0 and gemma3 (-np 1: an SWA cache of n_swa + ubatch cells): a slot it saved
    moved to mlx-lm; mlx-lm's caches moved to slots it restores and continues. The server reuses a
    restored iSWA slot only with SWA cells down to T-n_swa-1 (pos_min < pos_next - n_swa), one more
    than its own slot save keeps, so it re-processes the prompt after restoring its own slot; kvsnap
    writes that cell when mlx-lm's cache still holds it (after one batch: the server then computes
    the 16 tail tokens only), and a wrapped ring of n_swa rows is treated as the server's own slot.
    The distribution after the prompt is scored as in with_server."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
    from server_test import Server  # noqa: E402

    n_vocab, T = bed.info["n_vocab"], len(bed.tokens) - TAIL
    slot_dir = bed.path("server-slots")
    os.makedirs(slot_dir, exist_ok=True)
    for name in ("batch", "stepped"):
        bed.convert(bed.path("mlx-%s.safetensors" % name), os.path.join(slot_dir, "from-mlx-%s.slot" % name), "--to",
                    "llama", "--tokens", bed.path("prompt-tokens.json"))
    srv = Server(server_bin, bed.gguf, "f16", "f16", True, slot_dir, bed.path("server.log"))
    try:
        srv.post("/completion", {"prompt": bed.tokens[:-TAIL], "n_predict": 0, "cache_prompt": True, "id_slot": 0})
        code, j = srv.post("/slots/0?action=save", {"filename": "saved.slot"})
        if code != 200:
            raise RuntimeError("slot save: %d %s" % (code, j))
        out = bed.path("server-f16.safetensors")
        bed.convert(os.path.join(slot_dir, "saved.slot"), out, "--to", "mlx")
        record("%s llama-server f16/f16 slot -> mlx-lm" % bed.name, mean_kl(bed.mlx_full(), bed.mlx_continue(out)),
               0.0, FLOOR)
        timings = {}
        for name in ("saved.slot", "from-mlx-stepped.slot", "from-mlx-batch.slot"):
            code, j = srv.post("/slots/0?action=restore", {"filename": name})
            if code != 200 or j.get("n_restored") != T:
                fail(name, "llama-server restore: %d %s" % (code, j))
                return
            code, j = srv.post("/completion", {"prompt": bed.tokens, "n_predict": 1, "temperature": 0,
                                               "cache_prompt": True, "id_slot": 0, "n_probs": n_vocab})
            timings[name] = (j["timings"]["cache_n"], j["timings"]["prompt_n"])
            if name == "saved.slot":
                continue
            dist = np.full(n_vocab, -1e30)
            for t in j["completion_probabilities"][0]["top_logprobs"]:
                dist[t["id"]] = t["logprob"]
            record("%s mlx-lm %s -> llama-server f16/f16 (last position; cache_n %d, prompt_n %d)" %
                   ((bed.name, name[9:-5]) + timings[name]),
                   mean_kl(bed.llama_ref("v0.5.0")[-1:], dist[None, :]), 0.0, FLOOR)
        if timings["from-mlx-stepped.slot"] != timings["saved.slot"]:
            fail("from-mlx-stepped.slot", "llama-server's cache_n/prompt_n %s, with its own slot %s" %
                 (timings["from-mlx-stepped.slot"], timings["saved.slot"]))
        if timings["from-mlx-batch.slot"] != (T, TAIL):
            fail("from-mlx-batch.slot", "llama-server's cache_n/prompt_n %s: the restored cache not reused" %
                 (timings["from-mlx-batch.slot"],))
    finally:
        srv.stop()


def check_refusals(bed, kvsnap, mkmodel, work):
    # a cache that does not fit the model: another head count
    other = os.path.join(work, "other-hd128.gguf")
    run([mkmodel, "--out", other, "--n-layer", "4", "--n-head", "2", "--n-head-kv", "1", "--head-dim", "128"])
    src = bed.path("mlx-f32.safetensors")
    r = run([kvsnap, "convert", "--force", src, os.path.join(work, "wrong.slot"), "--to", "llama", "--model", other, "--tokens",
             bed.path("prompt-tokens.json")], expect_ok=False)
    if r.returncode == 0 or "heads" not in r.stderr:
        fail("mismatched model", "exit %d: %s" % (r.returncode, r.stderr.strip()))
    # gemma2 past its window (32 < 92 tokens): mlx-lm's gemma2 has none, the engines' caches differ
    iswa = os.path.join(work, "gemma2-swa32.gguf")
    run([mkmodel, "--out", iswa, "--arch", "gemma2", "--n-layer", "4", "--swa-pattern", "2", "--swa", "32"])
    r = run([kvsnap, "convert", "--force", src, os.path.join(work, "iswa.slot"), "--to", "llama", "--model", iswa, "--tokens",
             bed.path("prompt-tokens.json")], expect_ok=False)
    if r.returncode != 4 or "past the sliding window of 32" not in r.stderr or os.path.exists(os.path.join(work, "iswa.slot")):
        fail("gemma2 past its window", "exit %d: %s" % (r.returncode, r.stderr.strip()))


def continue_here(gguf, tokens_bin, cache_path, out):
    """--continue: run in another mlx-lm release (PYTHONPATH): its load_prompt_cache and models."""
    import mlx_lm
    model, _ = load_twin(gguf)
    toks = np.fromfile(tokens_bin, dtype="<i4").tolist()
    cache = C.load_prompt_cache(cache_path)
    logits_ = model(mx.array([toks[-TAIL:]]), cache=cache)[0].astype(mx.float32)
    np.array(logits_, dtype="<f4").tofile(out)
    print("mlx-lm", getattr(mlx_lm, "__version__", "?"), mlx_lm.__file__)


def main():
    if sys.argv[1] == "--continue":
        return continue_here(*sys.argv[2:6])
    kvsnap, mkmodel, d050, d8121, prompt, work = sys.argv[1:7]
    server = sys.argv[7] if len(sys.argv) > 7 and sys.argv[7] != "-" else None
    os.makedirs(work, exist_ok=True)
    drivers = {"v0.5.0": d050}
    if d8121 != "-":
        drivers["b8121"] = d8121
    trained = ["--outlier-channels", "4", "--outlier-scale", "10"]
    beds = [Bed(kvsnap, mkmodel, drivers, prompt, work, "hd64", ["--n-layer", "4", "--seed", "1"] + trained),
            Bed(kvsnap, mkmodel, drivers, prompt, work, "hd128",
                ["--n-layer", "4", "--n-head", "2", "--n-head-kv", "1", "--head-dim", "128", "--seed", "2"] + trained),
            Bed(kvsnap, mkmodel, drivers, prompt, work, "qwen2", ["--arch", "qwen2", "--n-layer", "4", "--seed", "5"] + trained),
            Bed(kvsnap, mkmodel, drivers, prompt, work, "qwen3",
                ["--arch", "qwen3", "--n-layer", "4", "--n-head", "8", "--n-head-kv", "2", "--head-dim", "128",
                 "--seed", "7"] + trained, quick=True),
            Bed(kvsnap, mkmodel, drivers, prompt, work, "phi3",
                ["--arch", "phi3", "--n-layer", "4", "--n-embd", "512", "--n-head", "4", "--n-head-kv", "2",
                 "--head-dim", "128", "--n-rot", "96", "--seed", "9"] + trained, quick=True),
            Bed(kvsnap, mkmodel, drivers, prompt, work, "command-r",
                ["--arch", "command-r", "--n-layer", "4", "--seed", "11"] + trained, quick=True),
            Bed(kvsnap, mkmodel, drivers, prompt, work, "olmo2",
                ["--arch", "olmo2", "--n-layer", "4", "--seed", "13"] + trained, quick=True),
            # gemma2, window 128 > 108 tokens: mlx-lm's gemma2 (no window) computes the same function
            Bed(kvsnap, mkmodel, drivers, prompt, work, "gemma2",
                ["--arch", "gemma2", "--n-layer", "4", "--swa-pattern", "2", "--swa", "128", "--seed", "13"] + trained,
                quick=True)]
    # A comma-separated subset of the beds ("gemma3,qwen2"), for a quicker local run.
    only = [b for b in os.environ.get("KVSNAP_MLX_CROSS_BEDS", "").split(",") if b]
    t0, c0 = time.time(), cpu_seconds()
    g = Bed(kvsnap, mkmodel, drivers, prompt, work, "gemma3",
            ["--arch", "gemma3", "--n-layer", "6", "--swa-pattern", "3", "--swa", "16", "--rope-base", "1000000",
             "--rope-base-swa", "10000", "--seed", "11"] + trained)
    if not only or "gemma3" in only:
        gemma(g)
        if server:
            gemma_server(g, server)
        print("gemma3: %.1f s (%.1f s of CPU)" % (time.time() - t0, cpu_seconds() - c0), flush=True)
    for bed in [b for b in beds if not only or b.name in only]:
        t0, c0 = time.time(), cpu_seconds()
        bed.server = server
        check_twin(bed)
        llama_to_mlx(bed)
        mlx_to_llama(bed)
        rotating_to_llama(bed)
        if server and not bed.quick:
            with_server(bed, server)
        print("%s: %.1f s (%.1f s of CPU)" % (bed.name, time.time() - t0, cpu_seconds() - c0), flush=True)
    if not only:
        check_refusals(beds[0], kvsnap, mkmodel, work)
    print("\n%-72s %11s %11s %11s" % ("move", "KL", "native", "bound"))
    for what, kl, native, bound, note, verdict in rows:
        print("%-72s %11.3e %11.3e %11.3e %s %s" % (what, kl, native, bound, verdict, note))
    print("\n%d checked, %d failed" % (len(rows), len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
