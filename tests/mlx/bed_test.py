"""kvsnap against the real mlx-lm, on every file of the bed (tests/mlx/make-bed.sh):

1. `kvsnap info --json FILE` agrees with what mlx-lm said when it loaded the file (the <name>.json
   next to it): class, offset, bits/group, ring fields and every K/V array's dtype and shape of
   each layer, CacheList members, ArraysCache arrays, the user metadata and the file size;
2. read + write (tests/mlx/mlx_roundtrip) gives the same bytes (cmp);
3. the written file loads in the mlx-lm that made the original (load_prompt_cache) with identical
   arrays and scalars;
4. `kvsnap convert FILE OUT --mlx-lm V` for every bed release V: the moved file loads in V with the
   original's classes, offsets, fields and arrays, or is refused when V cannot hold a layer; with
   --kv-bits 4 --kv-group-size 64 as well, kv_bf16 of one release loads in another as that one's
   own q4g64_bf16 file.

    python3 bed_test.py KVSNAP ROUNDTRIP BED_DIR VENV_PYTHON WORK_DIR
Run by ctest (oracle.mlx_bed) through bed_test.sh, which makes the bed or exits 77 (SKIP).
"""
import filecmp
import json
import os
import subprocess
import sys

from bed_load import run_in_release

DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "uint32": "U32", "int32": "I32"}
failures = []


def fail(where, msg):
    failures.append("%s: %s" % (where, msg))


def same_array(where, oracle, ours):
    want = (DTYPES.get(oracle["dtype"], oracle["dtype"]), oracle["shape"])
    got = (ours["dtype"], ours["shape"])
    if want != got:
        fail(where, "array %s %s, mlx-lm says %s %s" % (ours.get("name"), got, want[0], want[1]))


def same_side(where, oracle, ours):
    if isinstance(oracle, list):
        if not isinstance(ours, list) or len(ours) != len(oracle):
            return fail(where, "quantized triple expected, kvsnap gives %r" % (ours,))
        for o, g in zip(oracle, ours):
            same_array(where, o, g)
    else:
        same_array(where, oracle, ours)


def same_layer(where, oracle, ours):
    if oracle["class"] != ours["class"]:
        return fail(where, "class %s, mlx-lm says %s" % (ours["class"], oracle["class"]))
    for key in ("offset", "bits", "group_size", "keep", "max_size", "_idx", "chunk_size", "start_position"):
        if key in oracle and oracle[key] != ours.get(key):
            fail(where, "%s %r, mlx-lm says %r" % (key, ours.get(key), oracle[key]))
    for side in ("keys", "values"):
        if side in oracle:
            if side not in ours:
                fail(where, "no %s" % side)
            else:
                same_side(where + " " + side, oracle[side], ours[side])
    if "caches" in oracle:
        got = ours.get("caches", [])
        if len(got) != len(oracle["caches"]):
            return fail(where, "%d CacheList members, mlx-lm says %d" % (len(got), len(oracle["caches"])))
        for i, (o, g) in enumerate(zip(oracle["caches"], got)):
            same_layer("%s.%d" % (where, i), o, g)
    if "arrays" in oracle:
        # The scalars layout keeps cache[i] under "<state>.0.<i>", next to left_padding "<state>.1" and
        # lengths "<state>.2" (kvsnap lists all four); the older ones only cache[i], "<state>.<i>".
        got = ours.get("arrays", [])
        if got and len(got) != len(oracle["arrays"]):
            depth = max(a["name"].count(".") for a in got)
            got = [a for a in got if a["name"].count(".") == depth]
        if len(got) != len(oracle["arrays"]):
            return fail(where, "%d arrays, mlx-lm says %d" % (len(got), len(oracle["arrays"])))
        for o, g in zip(oracle["arrays"], got):
            same_array(where, o, g)


def check_info(kvsnap, path, oracle):
    out = subprocess.run([kvsnap, "info", "--json", path], capture_output=True, text=True)
    if out.returncode != 0:
        return fail(path, "kvsnap info failed: " + out.stderr.strip())
    info = json.loads(out.stdout)
    if info["engine"] != "mlx-lm" or info["file_bytes"] != oracle["file_bytes"]:
        fail(path, "engine %s, %d bytes" % (info["engine"], info["file_bytes"]))
    if info["user_metadata"] != oracle["user_metadata"]:
        fail(path, "user metadata %r, mlx-lm says %r" % (info["user_metadata"], oracle["user_metadata"]))
    if len(info["layers"]) != len(oracle["layers"]):
        return fail(path, "%d layers, mlx-lm says %d" % (len(info["layers"]), len(oracle["layers"])))
    for i, (o, g) in enumerate(zip(oracle["layers"], info["layers"])):
        same_layer("%s layer %d" % (os.path.basename(path), i), o, g)
    if not info["byte_exact_rewrite"]:
        fail(path, "kvsnap does not recognise MLX's own serialization")
    return info


def check_sizes(version, infos):
    """kvsnap's size table of kv_<dtype> at q<b>g<g> is what mlx-lm's own quantized file of the same
    cache (q<b>g<g>_<dtype>, made with to_quantized) holds."""
    for name, info in infos.items():
        if not name.startswith("q"):
            continue
        kind, dtype = name.split("_", 1)
        base = infos.get("kv_" + dtype)
        if base is None:
            continue
        table = {a["kind"]: a for a in base["size_at"]}
        if table[kind].get("kv_bytes") != info["sizes"]["kv_bytes"]:
            fail("%s/%s" % (version, name), "kvsnap predicted %r K+V bytes at %s, mlx-lm wrote %d"
                 % (table[kind].get("kv_bytes"), kind, info["sizes"]["kv_bytes"]))
        global sizes_checked
        sizes_checked += 1


sizes_checked = 0
refusals = 0


def check_roundtrip(roundtrip, path, out_path):
    """True when the rewrite has the original's bytes (then it is loaded and compared: load_compare_in)."""
    r = subprocess.run([roundtrip, path, out_path], capture_output=True, text=True)
    if r.returncode != 0:
        fail(path, "mlx_roundtrip failed: " + r.stderr.strip())
        return False
    if not filecmp.cmp(path, out_path, shallow=False):
        fail(path, "rewrite differs from the original")
        return False
    return True


def load_compare_in(python, version, pairs, out):
    """One process of mlx-lm `version` loads and compares every (original, rewrite) pair (an mlx
    import per file was most of this test's time)."""
    if not pairs:
        return
    args = [x for pair in pairs for x in pair]
    if os.path.exists(out):  # a run that writes nothing must not be read as the last run's answer
        os.remove(out)
    ok, said = run_in_release(python, __file__, version, ["--load-compare", out] + args)
    if not ok:
        return fail("mlx-lm " + version, "load_compare failed: " + said)
    with open(out) as f:
        errors = json.load(f)
    if sorted(errors) != sorted(a for a, _ in pairs):
        return fail("mlx-lm " + version, "load_compare answered for %d of %d files" % (len(errors), len(pairs)))
    for path, error in sorted(errors.items()):
        if error is not None:
            fail(path, "mlx-lm %s on the rewrite: %s" % (version, error[-800:]))


def describe(paths, out):
    """In the bed's venv (with one mlx-lm first on the path): what load_prompt_cache gives for each
    file, normalized so releases compare: class (MambaCache is ArraysCache), offset, ring, chunk and
    quantization fields, the SHA-256 of every K/V array cut to its valid rows (KVCache and
    QuantizedKVCache buffers of mlx-lm 0.32 run past offset; a ChunkedKVCache holds offset -
    start_position), of every ArraysCache array, left_padding and lengths, and CacheList members."""
    import hashlib

    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import load_prompt_cache

    def digest(x, rows=None):
        if x is None:
            return None
        x = x[..., :rows, :] if rows is not None else x
        if x.dtype == mx.bfloat16:
            x = x.view(mx.uint16)
        return "%s%s:%s" % (x.dtype, list(x.shape), hashlib.sha256(np.ascontiguousarray(np.array(x)).tobytes()).hexdigest()[:16])

    def layer(c):
        d = {"class": type(c).__name__.replace("MambaCache", "ArraysCache")}
        if hasattr(c, "caches"):
            d["caches"] = [layer(s) for s in c.caches]
            return d
        if hasattr(c, "cache"):
            d["arrays"] = [digest(a) for a in c.cache]
            for a in ("left_padding", "lengths"):
                d[a] = digest(getattr(c, a, None))
            return d
        for a in ("offset", "keep", "max_size", "_idx", "bits", "group_size", "chunk_size", "start_position"):
            if isinstance(getattr(c, a, None), int):
                d[a] = getattr(c, a)
        rows = {"RotatingKVCache": None, "ChunkedKVCache": d.get("offset", 0) - d.get("start_position", 0)}
        rows = rows.get(d["class"], d.get("offset"))
        for side in ("keys", "values"):
            v = getattr(c, side)
            d[side] = [digest(e, rows) for e in v] if isinstance(v, (list, tuple)) else digest(v, rows)
        return d

    result = {}
    for p in paths:
        cache, meta = load_prompt_cache(p, return_metadata=True)
        result[p] = {"layers": [layer(c) for c in cache], "metadata": meta}
    with open(out, "w") as f:
        json.dump(result, f)


def describe_in(python, version, paths, out):
    ok, said = run_in_release(python, __file__, version, ["--describe", out] + paths)
    if not ok:
        fail("mlx-lm " + version, "load_prompt_cache failed: " + said)
        return {}
    with open(out) as f:
        return json.load(f)


def version_tuple(v):
    return tuple(int(x) for x in v.split("."))


def refusal_expected(layers, target):
    """Why kvsnap must refuse to move these layers (the bed oracle's) to mlx-lm `target`'s layout,
    or None: the classes and state that release cannot load (format/mlx_layout.h)."""
    t = version_tuple(target)
    for L in layers:
        if L["class"] == "CacheList":
            if t < (0, 31, 0):
                return "CacheList before 0.31.0"
            why = refusal_expected(L["caches"], target)
            if why:
                return why
        if L["class"] in ("ArraysCache", "MambaCache"):
            if t < (0, 28, 1) and len(L["arrays"]) != 2:
                return "ArraysCache of %d arrays before 0.28.1" % len(L["arrays"])
            if t < (0, 32, 0) and ("left_padding" in L or "lengths" in L):
                return "ArraysCache left_padding/lengths before 0.32"
    return None


def check_layouts(kvsnap, bed, versions, python, work):
    """Every bed file, moved to the layout of every bed release, loads in that release with the same
    classes, offsets, fields and arrays as the original in its own; what that release cannot load is
    refused (`kvsnap convert --mlx-lm`: exit 4, naming the layer), not written wrong."""
    originals, converted = {v: [] for v in versions}, {v: [] for v in versions}
    pairs = []
    global refusals
    for v in versions:
        for name in sorted(os.listdir(os.path.join(bed, v))):
            if not name.endswith(".safetensors"):
                continue
            path = os.path.join(bed, v, name)
            with open(path[: -len(".safetensors")] + ".json") as f:
                oracle = json.load(f)
            layers = oracle["layers"]
            # A file no load_prompt_cache reads (mlx-lm 0.18's "<i>_keys") is compared with the same
            # cache saved by save_prompt_cache.
            ref = os.path.join(bed, v, oracle["reference"]) if "reference" in oracle else path
            for w in versions:
                out = os.path.join(work, "to-" + w, v + "-" + name)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                if os.path.exists(out):
                    os.remove(out)
                r = subprocess.run([kvsnap, "convert", "--force", path, out, "--mlx-lm", w], capture_output=True, text=True)
                why = refusal_expected(layers, w)
                if why:
                    if r.returncode != 4 or os.path.exists(out) or "layer" not in r.stderr:
                        fail(path, "to %s: expected a refusal naming the layer (%s; exit 4, no file), got %d: %s"
                             % (w, why, r.returncode, r.stderr.strip()))
                    refusals += 1
                    continue
                if r.returncode != 0:
                    fail(path, "to %s: %s" % (w, r.stderr.strip()))
                    continue
                originals[v].append(ref)
                converted[w].append(out)
                pairs.append((ref, v, out, w, ref != path))
    # Moved and requantized by one convert: kv_bf16 (every release made the same cache: the same seed)
    # and the 0.18 keys_values_bf16 file, for every other release at q4g64, load there as that
    # release's own q4g64_bf16 file of the cache does.
    for v in versions:
        for src_name in ("kv_bf16", "keys_values_bf16"):
            src = os.path.join(bed, v, src_name + ".safetensors")
            for w in versions:
                ref = os.path.join(bed, w, "q4g64_bf16.safetensors")
                if w == v or not os.path.exists(src) or not os.path.exists(ref):
                    continue
                out = os.path.join(work, "to-" + w, "q4g64-%s-%s.safetensors" % (v, src_name))
                r = subprocess.run([kvsnap, "convert", "--force", src, out, "--mlx-lm", w, "--kv-bits", "4", "--kv-group-size", "64"],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    fail(src, "to %s at q4g64: %s" % (w, r.stderr.strip()))
                    continue
                originals[w].append(ref)
                converted[w].append(out)
                pairs.append((ref, w, out, w, True))
    want, got = {}, {}
    for v in versions:
        want.update(describe_in(python, v, sorted(set(originals[v])), os.path.join(work, "orig-%s.json" % v)))
        got.update(describe_in(python, v, converted[v], os.path.join(work, "conv-%s.json" % v)))
    for path, v, out, w, by_ref in pairs:
        if path not in want or out not in got:
            continue
        a, b = want[path], got[out]
        if by_ref:  # mlx-lm 0.18's metadata (chat_template, max_kv_size) is carried as it was
            a, b = a["layers"], b["layers"]
        if a != b:
            fail(path, "moved to mlx-lm %s's layout, loads differently:\n  %s\n  %s" % (w, a, b))
    return len(pairs)


def load_compare_all(out, args):
    """In the bed's venv: load_compare of each pair (args: a1 b1 a2 b2 ...); {a: None or the error} to out."""
    import traceback
    errors = {}
    for a, b in zip(args[0::2], args[1::2]):
        print("load_compare", a, file=sys.stderr, flush=True)  # names the file if mlx itself crashes
        try:
            load_compare(a, b)
            errors[a] = None
        except Exception:
            errors[a] = traceback.format_exc()
    with open(out, "w") as f:
        json.dump(errors, f)


def load_compare(a, b):
    """In the bed's venv: both files load in mlx-lm with identical arrays and scalars."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.cache import load_prompt_cache

    ca, ma = load_prompt_cache(a, return_metadata=True)
    cb, mb = load_prompt_cache(b, return_metadata=True)
    assert ma == mb, (ma, mb)
    assert [type(c).__name__ for c in ca] == [type(c).__name__ for c in cb]
    fa = tree_flatten([c.state for c in ca])
    fb = tree_flatten([c.state for c in cb])
    assert [k for k, _ in fa] == [k for k, _ in fb]
    for (k, x), (_, y) in zip(fa, fb):
        if isinstance(x, mx.array):
            assert x.dtype == y.dtype and x.shape == y.shape and mx.array_equal(x, y, equal_nan=True).item(), k
        else:
            assert x == y, (k, x, y)
    for c, d in zip(ca, cb):
        assert getattr(c, "offset", None) == getattr(d, "offset", None)
        if hasattr(c, "meta_state"):
            assert c.meta_state == d.meta_state


def main():
    if sys.argv[1] == "--describe":
        describe(sys.argv[3:], sys.argv[2])
        return
    if sys.argv[1] == "--load-compare":
        load_compare_all(sys.argv[2], sys.argv[3:])
        return
    kvsnap, roundtrip, bed, python, work = sys.argv[1:6]
    os.makedirs(work, exist_ok=True)
    n = 0
    for version in sorted(os.listdir(bed)):
        vdir = os.path.join(bed, version)
        if not os.path.isdir(vdir):
            continue
        infos, rewrites = {}, []
        for name in sorted(os.listdir(vdir)):
            if not name.endswith(".safetensors"):
                continue
            path = os.path.join(vdir, name)
            with open(path[: -len(".safetensors")] + ".json") as f:
                oracle = json.load(f)
            info = check_info(kvsnap, path, oracle)
            if info:
                infos[name[: -len(".safetensors")]] = info
            out = os.path.join(work, version + "-" + name)
            if check_roundtrip(roundtrip, path, out) and "reference" not in oracle:
                rewrites.append((path, out))
            n += 1
        load_compare_in(python, version, rewrites, os.path.join(work, version + "-load-compare.json"))
        check_sizes(version, infos)
    versions = sorted(v for v in os.listdir(bed) if os.path.isdir(os.path.join(bed, v)))
    moved = check_layouts(kvsnap, bed, versions, python, os.path.join(work, "layouts"))
    for f in failures:
        print("FAIL", f)
    print("%d bed files (mlx-lm %s), %d size predictions checked, %d layout moves loaded, %d refused as expected, "
          "%d failures" % (n, ", ".join(versions), sizes_checked, moved, refusals, len(failures)))
    if n == 0 or failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
