"""kvsnap against the real mlx-lm, on every file of the bed (tests/mlx/make-bed.sh):

1. `kvsnap info --json FILE` agrees with what mlx-lm said when it loaded the file (the <name>.json
   next to it): class, offset, bits/group, ring fields and every K/V array's dtype and shape of
   each layer, CacheList members, ArraysCache arrays, the user metadata and the file size;
2. read + write (tests/mlx/mlx_roundtrip) gives the same bytes (cmp);
3. the written file loads in the mlx-lm that made the original (load_prompt_cache) with identical
   arrays and scalars.

    python3 bed_test.py KVSNAP ROUNDTRIP BED_DIR VENV_PYTHON WORK_DIR
Run by ctest (oracle.mlx_bed) through bed_test.sh, which makes the bed or exits 77 (SKIP).
"""
import filecmp
import json
import os
import subprocess
import sys

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
        # The scalars layout keeps cache[i] under "<L>.0.<i>"; the older ones under "<L>.<i>".
        prefix = where.split()[-1] + ".0."
        got = [a for a in ours.get("arrays", []) if a["name"].startswith(prefix)] or ours.get("arrays", [])
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


def check_roundtrip(roundtrip, path, out_path, python, version):
    r = subprocess.run([roundtrip, path, out_path], capture_output=True, text=True)
    if r.returncode != 0:
        return fail(path, "mlx_roundtrip failed: " + r.stderr.strip())
    if not filecmp.cmp(path, out_path, shallow=False):
        return fail(path, "rewrite differs from the original")
    r = subprocess.run([python, __file__, "--load-compare", path, out_path], capture_output=True, text=True,
                       env=python_env(python, version))
    if r.returncode != 0:
        fail(path, "mlx-lm %s on the rewrite: %s" % (version, (r.stdout + r.stderr).strip()[-800:]))


def describe(paths, out):
    """In the bed's venv (with one mlx-lm first on the path): what load_prompt_cache gives for each
    file, normalized so releases compare: class, offset, ring/quantization fields and the SHA-256
    of every K/V array cut to its valid rows (KVCache and QuantizedKVCache buffers of mlx-lm 0.32
    run past offset)."""
    import hashlib

    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import load_prompt_cache

    def digest(x, rows):
        x = x[..., :rows, :] if rows is not None else x
        if x.dtype == mx.bfloat16:
            x = x.view(mx.uint16)
        return hashlib.sha256(np.ascontiguousarray(np.array(x)).tobytes()).hexdigest()[:16]

    result = {}
    for p in paths:
        cache, meta = load_prompt_cache(p, return_metadata=True)
        layers = []
        for c in cache:
            d = {"class": type(c).__name__}
            for a in ("offset", "keep", "max_size", "_idx", "bits", "group_size"):
                if isinstance(getattr(c, a, None), int):
                    d[a] = getattr(c, a)
            rows = None if d["class"] == "RotatingKVCache" else d["offset"]
            for side in ("keys", "values"):
                v = getattr(c, side)
                d[side] = [digest(e, rows) for e in v] if isinstance(v, (list, tuple)) else digest(v, rows)
            layers.append(d)
        result[p] = {"layers": layers, "metadata": meta}
    with open(out, "w") as f:
        json.dump(result, f)


def python_env(python, version):
    env = dict(os.environ)
    old = os.path.join(os.path.dirname(os.path.dirname(python)), "old", "mlx-lm-" + version)
    if os.path.isdir(old):
        env["PYTHONPATH"] = old
    return env


def describe_in(python, version, paths, out):
    r = subprocess.run([python, __file__, "--describe", out] + paths, capture_output=True, text=True,
                       env=python_env(python, version))
    if r.returncode != 0:
        fail("mlx-lm " + version, "load_prompt_cache failed: " + (r.stdout + r.stderr).strip()[-1500:])
        return {}
    with open(out) as f:
        return json.load(f)


CONVERTIBLE = {"KVCache", "QuantizedKVCache", "RotatingKVCache"}


def check_layouts(roundtrip, bed, versions, python, work):
    """Every bed file of convertible classes, moved to the layout of every bed release, loads in that
    release with the same classes, offsets, fields and arrays as the original in its own; the other
    classes are refused (exit 3), not written wrong."""
    originals, converted = {v: [] for v in versions}, {v: [] for v in versions}
    pairs = []
    for v in versions:
        for name in sorted(os.listdir(os.path.join(bed, v))):
            if not name.endswith(".safetensors"):
                continue
            path = os.path.join(bed, v, name)
            with open(path[: -len(".safetensors")] + ".json") as f:
                classes = {l["class"] for l in json.load(f)["layers"]}
            for w in versions:
                out = os.path.join(work, "to-" + w, v + "-" + name)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                r = subprocess.run([roundtrip, path, out, w], capture_output=True, text=True)
                if not classes <= CONVERTIBLE:
                    if r.returncode != 3:
                        fail(path, "to %s: expected a refusal (exit 3), got %d" % (w, r.returncode))
                    continue
                if r.returncode != 0:
                    fail(path, "to %s: %s" % (w, r.stderr.strip()))
                    continue
                originals[v].append(path)
                converted[w].append(out)
                pairs.append((path, v, out, w))
    want, got = {}, {}
    for v in versions:
        want.update(describe_in(python, v, sorted(set(originals[v])), os.path.join(work, "orig-%s.json" % v)))
        got.update(describe_in(python, v, converted[v], os.path.join(work, "conv-%s.json" % v)))
    for path, v, out, w in pairs:
        if path in want and out in got and want[path] != got[out]:
            fail(path, "moved to mlx-lm %s's layout, loads differently:\n  %s\n  %s" % (w, want[path], got[out]))
    return len(pairs)


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
        load_compare(sys.argv[2], sys.argv[3])
        return
    kvsnap, roundtrip, bed, python, work = sys.argv[1:6]
    os.makedirs(work, exist_ok=True)
    n = 0
    for version in sorted(os.listdir(bed)):
        vdir = os.path.join(bed, version)
        if not os.path.isdir(vdir):
            continue
        infos = {}
        for name in sorted(os.listdir(vdir)):
            if not name.endswith(".safetensors"):
                continue
            path = os.path.join(vdir, name)
            with open(path[: -len(".safetensors")] + ".json") as f:
                oracle = json.load(f)
            info = check_info(kvsnap, path, oracle)
            if info:
                infos[name[: -len(".safetensors")]] = info
            check_roundtrip(roundtrip, path, os.path.join(work, version + "-" + name), python, version)
            n += 1
        check_sizes(version, infos)
    versions = sorted(v for v in os.listdir(bed) if os.path.isdir(os.path.join(bed, v)))
    moved = check_layouts(roundtrip, bed, versions, python, os.path.join(work, "layouts"))
    for f in failures:
        print("FAIL", f)
    print("%d bed files (mlx-lm %s), %d size predictions checked, %d layout moves loaded, %d failures"
          % (n, ", ".join(versions), sizes_checked, moved, len(failures)))
    if n == 0 or failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
