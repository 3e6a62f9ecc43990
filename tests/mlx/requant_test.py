"""kvsnap convert --kv-bits/--kv-group-size on mlx-lm prompt caches against the REAL mlx (CPU):

1. random K/V (bf16, f16, f32; rows with special groups: all negative, zeros, a constant, ties,
   near f16's largest, f16 subnormals, magnitudes from 1e-3 to 1e2) saved by mlx-lm's save_prompt_cache, converted by kvsnap to every
   bits x group (2,3,4,5,6,8 x 32,64,128): the codes, scales and biases mlx-lm loads from kvsnap's
   file are bit for bit mx.quantize's of the float buffer (what KVCache.to_quantized does), and the
   whole file equals mlx-lm's own to_quantized + save_prompt_cache file (every tensor, dtype, shape
   and byte, and the metadata; only the data order, MLX's hash-map order, may differ);
2. quantized -> quantized (every source and target of a grid): bit for bit
   mx.quantize(mx.dequantize(source)); the same setting gives the same bytes; quantized -> float
   is bit for bit mx.dequantize;
3. real caches: the bed's KVCache files of a tiny llama (mlx-lm 0.32.2, 0.31.3, 0.28.0: three file
   layouts) converted to each setting mlx-lm itself quantized them to in the bed: equal to mlx-lm's
   file; the bed's q4g64 files to q8g32, q3g128 and float: mx.quantize(mx.dequantize(x)) and
   mx.dequantize bit for bit; each converted file loads in the mlx-lm release that made the original;
4. a hybrid file (KVCache + RotatingKVCache layers): the ring is carried, the file loads; a file of
   rings only is refused with mlx-lm's reason;
5. next-token logits of a tiny random llama continuing from the converted cache against the float
   cache (mean KL over a 16-token tail, as docs/fidelity.md): within 1.5x the KL of mlx-lm's natively
   quantized cache, for float -> q and q -> q; a negative control (the K rows of a converted file
   shuffled) must fail the bound.

    python3 requant_test.py KVSNAP BED_DIR VENV_PYTHON WORK_DIR
Run by ctest (oracle.mlx_requant) through requant_test.sh, which makes the bed or exits 77 (SKIP).
"""
import json
import os
import subprocess
import sys

from bed_load import load_in_release

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as C

BITS = (2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)
DTYPES = {"bf16": mx.bfloat16, "f16": mx.float16, "f32": mx.float32}
failures = []
stats = {"values": 0, "mismatches": 0, "files_equal": 0, "conversions": 0, "loads": 0}


def fail(where, msg):
    failures.append("%s: %s" % (where, msg))


def bits_of(x):
    """A view of an array's bits (bf16/f16 as uint16, f32 as uint32) as numpy."""
    if x.dtype in (mx.bfloat16, mx.float16):
        x = x.view(mx.uint16)
    elif x.dtype == mx.float32:
        x = x.view(mx.uint32)
    return np.array(x)


def same_bits(where, want, got):
    """Bitwise equality of two arrays; counts values and mismatches."""
    if want.dtype != got.dtype or want.shape != got.shape:
        fail(where, "dtype/shape %s %s, expected %s %s" % (got.dtype, got.shape, want.dtype, want.shape))
        return False
    a, b = bits_of(want), bits_of(got)
    bad = int(np.count_nonzero(a != b))
    stats["values"] += a.size
    stats["mismatches"] += bad
    if bad:
        i = np.argwhere(a != b)[0]
        fail(where, "%d of %d values differ; first at %s: expected %s, got %s"
             % (bad, a.size, tuple(i), a[tuple(i)], b[tuple(i)]))
        return False
    return True


def convert(kvsnap, src, dst, *args, expect_ok=True):
    r = subprocess.run([kvsnap, "convert", "--force", src, dst, "--json"] + [str(a) for a in args],
                       capture_output=True, text=True)
    stats["conversions"] += 1
    if expect_ok and r.returncode != 0:
        fail(src, "kvsnap convert %s failed: %s" % (" ".join(map(str, args)), r.stderr.strip()))
        return None
    if not expect_ok:
        return r
    return json.loads(r.stdout)


def same_file(where, want_path, got_path):
    """Two safetensors files hold the same tensors (names, dtypes, shapes, bits) and metadata."""
    wa, wm = mx.load(want_path, return_metadata=True)
    ga, gm = mx.load(got_path, return_metadata=True)
    if wm != gm:
        fail(where, "metadata %r, mlx-lm wrote %r" % (gm, wm))
    if sorted(wa) != sorted(ga):
        return fail(where, "tensors %s, mlx-lm wrote %s" % (sorted(ga), sorted(wa)))
    ok = all([same_bits("%s tensor %s" % (where, k), wa[k], ga[k]) for k in sorted(wa)])
    if ok and wm == gm:
        stats["files_equal"] += 1


def random_cache(dtype, seed, layers=2, rows=37, dim=128):
    """KVCache layers of random K/V with special rows; returns the caches (filled like a prefill)."""
    rng = np.random.default_rng(seed)
    caches = []
    for _ in range(layers):
        kv = []
        for _ in range(2):
            x = rng.standard_normal((1, 2, rows, dim)).astype(np.float32)
            x *= 10.0 ** rng.uniform(-3, 2, size=(1, 2, rows, 1))
            x[0, 0, 0] = -np.abs(x[0, 0, 0]) - 1.0                       # all negative
            x[0, 0, 1] = 0.0                                              # zeros
            x[0, 0, 2] = 0.75                                             # constant
            x[0, 0, 3] = np.tile(np.array([0.0, 3.0, 0.5, 2.5, 1.5, 1.0, 2.0, 0.25]), dim // 8)  # ties
            x[0, 1, 0] = np.abs(x[0, 1, 0]) + 2.0                          # all positive
            x[0, 1, 1] = rng.integers(-8, 8, size=dim)                     # small integers
            x[0, 1, 2] = rng.uniform(-6e4, 6e4, size=dim)                  # near f16's largest
            x[0, 1, 3] = rng.uniform(-3e-6, 3e-6, size=dim)                # f16 subnormals
            kv.append(mx.array(x).astype(dtype))
        c = C.KVCache()
        c.update_and_fetch(kv[0], kv[1])
        caches.append(c)
    mx.eval([c.keys for c in caches] + [c.values for c in caches])
    return caches


def check_random(kvsnap, work):
    """1 and 2: float -> every setting, quantized -> quantized, quantized -> float."""
    for dname, dtype in DTYPES.items():
        caches = random_cache(dtype, seed=len(dname))
        src = os.path.join(work, "rand_%s.safetensors" % dname)
        C.save_prompt_cache(src, caches, {"model": "random"})
        loaded = C.load_prompt_cache(src)
        for bits in BITS:
            for gs in GROUPS:
                tag = "rand_%s q%dg%d" % (dname, bits, gs)
                out = os.path.join(work, "rand_%s_q%dg%d.safetensors" % (dname, bits, gs))
                if convert(kvsnap, src, out, "--kv-bits", bits, "--kv-group-size", gs) is None:
                    continue
                got = C.load_prompt_cache(out)
                stats["loads"] += 1
                for i, (c, g) in enumerate(zip(loaded, got)):
                    if not isinstance(g, C.QuantizedKVCache) or (g.bits, g.group_size, g.offset) != (bits, gs, c.offset):
                        fail(tag, "layer %d loads as %s" % (i, type(g).__name__))
                        continue
                    for side in ("keys", "values"):
                        want = mx.quantize(getattr(c, side), group_size=gs, bits=bits)
                        for part, w, x in zip(("codes", "scales", "biases"), want, getattr(g, side)):
                            same_bits("%s layer %d %s %s" % (tag, i, side, part), w, x)
                native = os.path.join(work, "native_rand_%s_q%dg%d.safetensors" % (dname, bits, gs))
                C.save_prompt_cache(native, [c.to_quantized(group_size=gs, bits=bits) for c in loaded],
                                    {"model": "random"})
                same_file(tag + " vs mlx-lm's to_quantized file", native, out)
        # 2: quantized -> quantized and -> float, from three sources to the whole grid (bf16 only:
        # the arithmetic is the same code for the three types, which 1 covers).
        if dname != "bf16":
            continue
        for sb, sg in ((4, 64), (8, 32), (3, 128)):
            qsrc = os.path.join(work, "rand_%s_q%dg%d.safetensors" % (dname, sb, sg))
            qc = C.load_prompt_cache(qsrc)
            for bits in BITS:
                for gs in GROUPS:
                    tag = "rand_%s q%dg%d -> q%dg%d" % (dname, sb, sg, bits, gs)
                    out = os.path.join(work, "rq_%d_%d_to_%d_%d.safetensors" % (sb, sg, bits, gs))
                    if convert(kvsnap, qsrc, out, "--kv-bits", bits, "--kv-group-size", gs) is None:
                        continue
                    got = C.load_prompt_cache(out)
                    for i, (c, g) in enumerate(zip(qc, got)):
                        for side in ("keys", "values"):
                            deq = mx.dequantize(*getattr(c, side), group_size=sg, bits=sb)
                            want = mx.quantize(deq, group_size=gs, bits=bits)
                            if (bits, gs) == (sb, sg):
                                want = getattr(c, side)  # copied
                            for part, w, x in zip(("codes", "scales", "biases"), want, getattr(g, side)):
                                same_bits("%s layer %d %s %s" % (tag, i, side, part), w, x)
            out = os.path.join(work, "rq_%d_%d_to_float.safetensors" % (sb, sg))
            if convert(kvsnap, qsrc, out, "--kv-bits", "none") is None:
                continue
            got = C.load_prompt_cache(out)
            for i, (c, g) in enumerate(zip(qc, got)):
                if not isinstance(g, C.KVCache) or g.offset != c.offset:
                    fail(out, "layer %d loads as %s" % (i, type(g).__name__))
                    continue
                for side in ("keys", "values"):
                    want = mx.dequantize(*getattr(c, side), group_size=sg, bits=sb)
                    same_bits("q%dg%d -> float layer %d %s" % (sb, sg, i, side), want, getattr(g, side))


def check_bed(kvsnap, bed, python, work):
    """3: the bed's real KVCache files against mlx-lm's own quantized files of the same caches."""
    for version in sorted(os.listdir(bed)):
        vdir = os.path.join(bed, version)
        if not os.path.isdir(vdir):
            continue
        made = []
        for name in sorted(os.listdir(vdir)):
            if not (name.startswith("q") and name.endswith(".safetensors")):
                continue
            kind, dtype = name[: -len(".safetensors")].split("_", 1)
            src = os.path.join(vdir, "kv_%s.safetensors" % dtype)
            if not os.path.exists(src):
                continue
            bits, gs = kind[1:].split("g")
            out = os.path.join(work, "bed-%s-%s" % (version, name))
            if os.path.exists(out):
                os.remove(out)
            if version < "0.32":
                # A float file of mlx-lm 0.19 .. 0.31 does not say whether its reader wants `step` in
                # QuantizedKVCache's meta_state (up to 0.28.0): refused (exit 6) until --mlx-lm says.
                r = convert(kvsnap, src, out, "--kv-bits", bits, "--kv-group-size", gs, expect_ok=False)
                if r.returncode != 6 or "give --mlx-lm VERSION" not in r.stderr or os.path.exists(out):
                    fail(src, "without --mlx-lm: exit %d %s" % (r.returncode, r.stderr.strip()))
            if convert(kvsnap, src, out, "--kv-bits", bits, "--kv-group-size", gs, "--mlx-lm", version) is None:
                continue
            same_file("bed %s %s" % (version, name), os.path.join(vdir, name), out)
            made.append(out)
        # Quantized -> quantized and -> float in this release's layout (mlx-lm's own q4g64 file),
        # compared as raw tensors (0.32's loader cannot read the older layouts).
        src = os.path.join(vdir, "q4g64_bf16.safetensors")
        if os.path.exists(src):
            a = mx.load(src)
            layers = sorted({k.split(".")[0] for k in a})
            for to in ((8, 32), (3, 128), None):
                tag = "q8g32" if to == (8, 32) else "q3g128" if to else "float"
                out = os.path.join(work, "bed-%s-q4g64-to-%s.safetensors" % (version, tag))
                args = ["--kv-bits", to[0], "--kv-group-size", to[1]] if to else ["--kv-bits", "none"]
                if convert(kvsnap, src, out, *args) is None:
                    continue
                b = mx.load(out)
                for L in layers:
                    for side in ("0", "1"):
                        q = [a["%s.%s.%d" % (L, side, i)] for i in range(3)]
                        deq = mx.dequantize(*q, group_size=64, bits=4)
                        where = "bed %s q4g64 -> %s layer %s side %s" % (version, tag, L, side)
                        if to is None:
                            same_bits(where, deq, b.get("%s.%s" % (L, side), mx.array([])))
                            continue
                        want = mx.quantize(deq, group_size=to[1], bits=to[0])
                        for i, w in enumerate(want):
                            same_bits(where, w, b.get("%s.%s.%d" % (L, side, i), mx.array([])))
                made.append(out)
        # Each converted file loads in the mlx-lm release that made the original.
        ok, out = load_in_release(python, __file__, version, made)
        if not ok:
            fail("mlx-lm " + version, "load_prompt_cache: " + out)
        else:
            stats["loads"] += len(made)


def check_classes(kvsnap, bed, work):
    """4: carried and refused classes."""
    mx.random.seed(3)
    k = lambda: mx.random.normal((1, 2, 9, 64)).astype(mx.bfloat16)
    kv, rot = C.KVCache(), C.RotatingKVCache(max_size=8, keep=2)
    kv.update_and_fetch(k(), k())
    rot.update_and_fetch(k(), k())
    src = os.path.join(work, "hybrid.safetensors")
    C.save_prompt_cache(src, [kv, rot], {"model": "hybrid"})
    out = os.path.join(work, "hybrid_q4.safetensors")
    j = convert(kvsnap, src, out, "--kv-bits", 4, "--kv-group-size", 32)
    if j is not None:
        got = C.load_prompt_cache(out)
        stats["loads"] += 1
        if [type(c).__name__ for c in got] != ["QuantizedKVCache", "RotatingKVCache"]:
            fail(out, "loads as %s" % [type(c).__name__ for c in got])
        else:
            same_bits("hybrid ring keys carried", rot.keys, got[1].keys)
            for part, w, x in zip(("codes", "scales", "biases"), mx.quantize(kv.keys, group_size=32, bits=4),
                                  got[0].keys):
                same_bits("hybrid layer 0 keys " + part, w, x)
        if not any("RotatingKVCache Quantization NYI" in n for n in j["notes"]):
            fail(out, "no note on the ring: %r" % j["notes"])
    for name in ("rotating_bf16", "arrays_mixed", "cachelist_bf16"):
        path = os.path.join(bed, "0.32.2", name + ".safetensors")
        if not os.path.exists(path):
            continue
        r = convert(kvsnap, path, os.path.join(work, "refused.safetensors"), "--kv-bits", 4, expect_ok=False)
        if r.returncode == 0 or "nothing mlx-lm can (de)quantize" not in r.stderr:
            fail(path, "expected a refusal, got exit %d: %s" % (r.returncode, r.stderr.strip()))
        if os.path.exists(os.path.join(work, "refused.safetensors")):
            fail(path, "a refused conversion left an output file")
    # Head dim 64 in groups of 128: refused, naming the layer and the group sizes that fit.
    r = convert(kvsnap, src, os.path.join(work, "refused.safetensors"), "--kv-bits", 4, "--kv-group-size", 128,
                expect_ok=False)
    if r.returncode == 0 or "layer 0 (KVCache): K head dim 64" not in r.stderr or "32, 64" not in r.stderr:
        fail(src, "head dim 64 at group 128: %d %s" % (r.returncode, r.stderr.strip()))


def tiny_model(seed):
    """A tiny llama with sharpened attention and logits, so KV errors show in the next-token KL."""
    from mlx_lm.models.llama import Model, ModelArgs

    mx.random.seed(seed)
    args = ModelArgs(model_type="llama", hidden_size=256, num_hidden_layers=2, intermediate_size=256,
                     num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=128)  # D=64
    model = Model(args)
    for layer in model.layers:  # sharper attention (x4 in the logits of q.k); the output stays soft
        layer.self_attn.q_proj.weight = layer.self_attn.q_proj.weight * 2
        layer.self_attn.k_proj.weight = layer.self_attn.k_proj.weight * 2
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model


def tail_logits(model, path, tail):
    cache = C.load_prompt_cache(path)
    return model(mx.array([tail]), cache=cache)[0].astype(mx.float32)


def log_softmax64(x):
    x = np.array(x, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def mean_kl(ref, got):
    """Mean over the tail positions of KL(softmax(ref) || softmax(got)), in float64."""
    lr, lg = log_softmax64(ref), log_softmax64(got)
    return float(np.mean(np.sum(np.exp(lr) * (lr - lg), axis=-1)))


def check_kl(kvsnap, work):
    """5: next-token KL of the converted cache within 1.5x that of mlx-lm's natively quantized one."""
    model = tiny_model(1)
    rng = np.random.default_rng(7)
    tokens = [int(t) for t in rng.integers(0, 128, size=108)]
    prompt, tail = tokens[:92], tokens[92:]
    cache = C.make_prompt_cache(model)
    model(mx.array([prompt]), cache=cache)
    mx.eval([c.keys for c in cache])
    ref_path = os.path.join(work, "kl_float.safetensors")
    C.save_prompt_cache(ref_path, cache, {"model": "tiny"})
    ref = tail_logits(model, ref_path, tail)
    native_kl, rows = {}, []

    def native(bits, gs, src=ref_path):
        path = os.path.join(work, "kl_native_q%dg%d.safetensors" % (bits, gs))
        C.save_prompt_cache(path, [c.to_quantized(group_size=gs, bits=bits) for c in C.load_prompt_cache(src)],
                            {"model": "tiny"})
        native_kl[(bits, gs)] = mean_kl(ref, tail_logits(model, path, tail))
        return path

    for bits in BITS:
        for gs in (32, 64):
            native(bits, gs)
    for (bits, gs), nkl in sorted(native_kl.items()):
        out = os.path.join(work, "kl_conv_q%dg%d.safetensors" % (bits, gs))
        if convert(kvsnap, ref_path, out, "--kv-bits", bits, "--kv-group-size", gs) is None:
            continue
        kl = mean_kl(ref, tail_logits(model, out, tail))
        rows.append(("float -> q%dg%d" % (bits, gs), kl, nkl))
        if not (kl <= 1.5 * nkl or kl <= 1e-6):
            fail(out, "KL %.3e above 1.5 x native %.3e" % (kl, nkl))
    for (sb, sg), (bits, gs) in (((8, 64), (4, 64)), ((8, 32), (2, 32)), ((4, 32), (3, 64)), ((6, 64), (5, 32)),
                                 ((2, 32), (8, 64)), ((4, 64), (8, 32))):
        src = os.path.join(work, "kl_native_q%dg%d.safetensors" % (sb, sg))
        out = os.path.join(work, "kl_q%dg%d_to_q%dg%d.safetensors" % (sb, sg, bits, gs))
        if convert(kvsnap, src, out, "--kv-bits", bits, "--kv-group-size", gs) is None:
            continue
        kl = mean_kl(ref, tail_logits(model, out, tail))
        bound = max(native_kl[(sb, sg)], native_kl[(bits, gs)])
        rows.append(("q%dg%d -> q%dg%d" % (sb, sg, bits, gs), kl, bound))
        if not (kl <= 1.5 * bound or kl <= 1e-6):
            fail(out, "KL %.3e above 1.5 x max native %.3e" % (kl, bound))
    # Negative control: the K rows of a converted q8 cache in reverse order must fail the bound.
    conv = C.load_prompt_cache(os.path.join(work, "kl_conv_q8g64.safetensors"))
    for c in conv:
        order = mx.concatenate([mx.arange(c.offset - 1, -1, -1), mx.arange(c.offset, c.keys[0].shape[2])])
        c.keys = tuple(mx.take(x, order, axis=2) for x in c.keys)
    bad = os.path.join(work, "kl_control.safetensors")
    C.save_prompt_cache(bad, conv, {"model": "tiny"})
    kl = mean_kl(ref, tail_logits(model, bad, tail))
    rows.append(("control: q8g64, K rows reversed", kl, native_kl[(8, 64)]))
    if kl <= 1.5 * native_kl[(8, 64)] or kl <= 1e-6:
        fail(bad, "the negative control passes the bound (KL %.3e): the check cannot fail" % kl)
    print("next-token KL over a 16-token tail (tiny random llama, bf16, D=64, 92-token cache):")
    for name, kl, bound in rows:
        print("  %-34s KL %.3e   native %.3e   ratio %.3f" % (name, kl, bound, kl / bound if bound else float("nan")))


def main():
    if sys.argv[1] == "--load":
        for p in sys.argv[2:]:
            from mlx_lm.models.cache import load_prompt_cache

            load_prompt_cache(p)
        return
    kvsnap, bed, python, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    mx.set_default_device(mx.cpu)
    check_random(kvsnap, work)
    check_bed(kvsnap, bed, python, work)
    check_classes(kvsnap, bed, work)
    check_kl(kvsnap, work)
    for f in failures[:50]:
        print("FAIL", f)
    print("%d conversions, %d loads in mlx-lm, %d values compared bit for bit with mx.quantize/dequantize "
          "(%d differ), %d files equal to mlx-lm's own, %d failures"
          % (stats["conversions"], stats["loads"], stats["values"], stats["mismatches"], stats["files_equal"],
             len(failures)))
    if failures or stats["values"] == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
