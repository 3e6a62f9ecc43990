"""kvsnap's snapshot store on real mlx-lm prompt caches (issue 15 part 3), against the real mlx-lm:

1. every bed file (every class, layout and bits) is saved (`kvsnap save FILE --model --tokens`),
   `show --json` agrees with what mlx-lm's loader said about it (class per layer, K/V setting), and
   `restore` gives the file byte for byte (cmp);
2. every bed file with a KVCache or QuantizedKVCache layer is restored at other bits/groups and to
   float: the bytes equal `kvsnap convert` of the restored file, and each such file loads in the
   mlx-lm release that made the original (load_prompt_cache); a file convert refuses, restore refuses;
3. dedup: two real save_prompt_cache files of one conversation (600 and 900 positions, the first
   600 equal; KVCache bf16 and QuantizedKVCache q4g64 via to_quantized) share the chunks of their
   whole 256-position blocks; the second save writes only the rest;
4. ls / find --tokens / verify / export / import / rm / gc on these snapshots.

    python3 store_test.py KVSNAP BED_DIR VENV_PYTHON WORK_DIR
Run by ctest (oracle.mlx_store) through store_test.sh, which makes the bed or exits 77 (SKIP).
"""
import filecmp
import json
import os
import subprocess
import sys

from bed_load import load_in_release

failures = []
stats = {"saved": 0, "restored_exact": 0, "requantized": 0, "equal_to_convert": 0, "loads": 0}
SETTINGS = [("4", "64"), ("8", "32"), ("3", "128"), ("none", None)]


def fail(where, msg):
    failures.append("%s: %s" % (where, msg))


def run(*args, ok=True):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if ok and r.returncode != 0:
        fail(" ".join(str(a) for a in args[:4]), "exit %d: %s" % (r.returncode, r.stderr.strip()[-800:]))
        return None
    return r


def classes_of(oracle):
    return [L["class"] for L in oracle["layers"]]


def setting_of(L):
    if "bits" in L:
        return "q%dg%d" % (L["bits"], L["group_size"])
    keys = L.get("keys")
    if isinstance(keys, dict):
        return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(keys["dtype"], keys["dtype"])
    return None


def check_bed(kvsnap, store, bed, python, work):
    for version in sorted(os.listdir(bed)):
        vdir = os.path.join(bed, version)
        if not os.path.isdir(vdir):
            continue
        loads = []
        for name in sorted(os.listdir(vdir)):
            if not name.endswith(".safetensors"):
                continue
            src = os.path.join(vdir, name)
            oracle = json.load(open(src[: -len(".safetensors")] + ".json"))
            snap = "%s-%s" % (version, name[: -len(".safetensors")])
            if run(kvsnap, "save", src, "--store", store, "--name", snap, "--model", "tiny-" + version,
                   "--tokens", "1,2,3", "--tag", "bed=" + version, "--json") is None:
                continue
            stats["saved"] += 1
            r = run(kvsnap, "show", snap, "--store", store, "--json")
            if r:
                show = json.loads(r.stdout)
                mlx = show["snapshot"]["mlx"]
                want = {}
                for c in classes_of(oracle):
                    want[c] = want.get(c, 0) + 1
                want_text = ", ".join("%s x%d" % (c, n) for c, n in sorted(want.items()))
                if mlx["classes"] != want_text or mlx["n_layers"] != len(oracle["layers"]):
                    fail(snap, "show says %s (%d layers), mlx-lm says %s" % (mlx["classes"], mlx["n_layers"], want_text))
                ks = sorted({s for s in (setting_of(L) for L in oracle["layers"]) if s})
                got = sorted(t for t in mlx["k_types"].split(",") if t != "-")
                if ks and got != ks:
                    fail(snap, "K types %s, mlx-lm's layers say %s" % (got, ks))
                if show["model_arch"] != "mlx-lm" or show["model_fingerprint"] != "mlx-lm:tiny-" + version:
                    fail(snap, "catalog model %s %s" % (show["model_arch"], show["model_fingerprint"]))
                if show["n_tokens"] != 3 or show["raw_bytes"] != oracle["file_bytes"]:
                    fail(snap, "catalog tokens %d, bytes %d" % (show["n_tokens"], show["raw_bytes"]))
            out = os.path.join(work, snap + ".safetensors")
            if run(kvsnap, "restore", snap, "--store", store, "-o", out, "--force") is None:
                continue
            if not filecmp.cmp(src, out, shallow=False):
                fail(snap, "restore is not the saved file byte for byte")
            else:
                stats["restored_exact"] += 1
            # Other bits: the bytes of `kvsnap convert` of the restored file, and mlx-lm loads them.
            for bits, gs in SETTINGS:
                args = ["--kv-bits", bits] + (["--kv-group-size", gs] if gs else [])
                if version < "0.32":
                    args += ["--mlx-lm", version]  # a float meta file does not say whether `step` is needed
                tag = "q%sg%s" % (bits, gs) if gs else "float"
                a = os.path.join(work, "%s-restore-%s.safetensors" % (snap, tag))
                b = os.path.join(work, "%s-convert-%s.safetensors" % (snap, tag))
                for f in (a, b):
                    if os.path.exists(f):
                        os.remove(f)
                ra = run(kvsnap, "restore", snap, "--store", store, "-o", a, *args, ok=False)
                rb = run(kvsnap, "convert", out, b, *args, ok=False)
                if (ra.returncode == 0) != (rb.returncode == 0):
                    fail(snap + " " + tag, "restore exit %d (%s), convert exit %d (%s)"
                         % (ra.returncode, ra.stderr.strip()[-300:], rb.returncode, rb.stderr.strip()[-300:]))
                    continue
                if ra.returncode != 0:
                    if os.path.exists(a):
                        fail(snap + " " + tag, "a refused restore left " + a)
                    continue
                stats["requantized"] += 1
                if not filecmp.cmp(a, b, shallow=False):
                    fail(snap + " " + tag, "restore --kv-bits differs from convert of the restored file")
                else:
                    stats["equal_to_convert"] += 1
                loads.append(a)
        ok, out = load_in_release(python, __file__, version, loads)
        if not ok:
            fail("mlx-lm " + version, "load_prompt_cache: " + out)
        else:
            stats["loads"] += len(loads)


def make_conversation(python, work):
    """Two real save_prompt_cache files of one conversation (run in the venv's mlx-lm)."""
    r = subprocess.run([python, __file__, "--make", work], capture_output=True, text=True)
    if r.returncode != 0:
        fail("make conversation", (r.stdout + r.stderr).strip()[-1500:])
        return False
    return True


def make_files(work):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, save_prompt_cache

    mx.random.seed(7)
    layers, heads, dim = 4, 2, 128
    ks = [mx.random.normal((1, heads, 900, dim)).astype(mx.bfloat16) for _ in range(layers)]
    vs = [mx.random.normal((1, heads, 900, dim)).astype(mx.bfloat16) for _ in range(layers)]
    for n in (600, 900):
        caches = []
        for L in range(layers):
            c = KVCache()
            c.update_and_fetch(ks[L][:, :, :n, :], vs[L][:, :, :n, :])
            caches.append(c)
        save_prompt_cache(os.path.join(work, "conv-%d-bf16.safetensors" % n), caches, {"model": "conv"})
        save_prompt_cache(os.path.join(work, "conv-%d-q4g64.safetensors" % n),
                          [c.to_quantized(group_size=64, bits=4) for c in caches], {"model": "conv"})


def check_dedup(kvsnap, work, python):
    if not make_conversation(python, work):
        return
    toks = os.path.join(work, "tokens-900.json")
    json.dump(list(range(100, 1000)), open(toks, "w"))
    toks600 = os.path.join(work, "tokens-600.json")
    json.dump(list(range(100, 700)), open(toks600, "w"))
    for kind in ("bf16", "q4g64"):
        store = os.path.join(work, "dedup-" + kind)  # one store each: a parent is of the same tokens and kind
        first = run(kvsnap, "save", os.path.join(work, "conv-600-%s.safetensors" % kind), "--store", store,
                    "--name", "c600-" + kind, "--tokens", toks600, "--json")
        second = run(kvsnap, "save", os.path.join(work, "conv-900-%s.safetensors" % kind), "--store", store,
                     "--name", "c900-" + kind, "--tokens", toks, "--json")
        if not first or not second:
            continue
        a, b = json.loads(first.stdout), json.loads(second.stdout)
        sa = run(kvsnap, "show", "c900-" + kind, "--store", store, "--json")
        n = json.loads(sa.stdout)["chunks"]["count"] if sa else 0
        reused = n - b["chunks_new"]
        # mlx-lm 0.32 saves whole 256-row buffers: 600 -> 768 rows (3 blocks), 900 -> 1024 rows;
        # blocks 0..255 and 256..511 are equal in both; the header differs.
        tensors = 4 * 2 * (3 if kind == "q4g64" else 1)
        print("dedup %s: first save %d chunks, %d bytes written; second %d chunks, %d new, %d bytes written; "
              "parent %s" % (kind, a["n_chunks"], a["bytes_new"], n, b["chunks_new"], b["bytes_new"], b.get("parent_id")))
        if reused < 2 * tensors:
            fail("dedup " + kind, "the second save reused %d chunks, expected at least %d" % (reused, 2 * tensors))
        if b.get("parent_id") != a["id"]:
            fail("dedup " + kind, "parent %s, expected %s" % (b.get("parent_id"), a["id"]))
        r = run(kvsnap, "find", "--tokens", toks, "--store", store, "--json")
        if r and [s["name"] for s in json.loads(r.stdout)] != ["c900-" + kind, "c600-" + kind]:
            fail("find " + kind, r.stdout[:300])
        r = run(kvsnap, "find", "--tokens", toks600, "--store", store, "--json")
        if r and [s["name"] for s in json.loads(r.stdout)] != ["c600-" + kind]:
            fail("find " + kind, r.stdout[:300])
        run(kvsnap, "verify", "--all", "--store", store)
    # export the q4g64 child, import it into a fresh store; rm of a parent, gc
    store = os.path.join(work, "dedup-bf16")
    ex = os.path.join(work, "conv.tar.zst")
    if os.path.exists(ex):
        os.remove(ex)
    run(kvsnap, "export", "c900-q4g64", "-o", ex, "--store", os.path.join(work, "dedup-q4g64"))
    other = os.path.join(work, "import-store")
    run(kvsnap, "import", ex, "--store", other)
    out = os.path.join(work, "imported.safetensors")
    if run(kvsnap, "restore", "c900-q4g64", "-o", out, "--force", "--store", other):
        if not filecmp.cmp(out, os.path.join(work, "conv-900-q4g64.safetensors"), shallow=False):
            fail("import", "restored file differs")
    run(kvsnap, "rm", "c600-bf16", "--store", store)
    run(kvsnap, "gc", "--store", store)
    if run(kvsnap, "restore", "c900-bf16", "-o", out, "--force", "--store", store):
        if not filecmp.cmp(out, os.path.join(work, "conv-900-bf16.safetensors"), shallow=False):
            fail("rm parent", "the child no longer restores byte for byte")
    run(kvsnap, "verify", "--all", "--store", store)


def main():
    if sys.argv[1] == "--load":
        from mlx_lm.models.cache import load_prompt_cache

        for p in sys.argv[2:]:
            load_prompt_cache(p)
        return
    if sys.argv[1] == "--make":
        make_files(sys.argv[2])
        return
    kvsnap, bed, python, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    store = os.path.join(work, "store")
    check_bed(kvsnap, store, bed, python, work)
    check_dedup(kvsnap, work, python)
    for f in failures[:50]:
        print("FAIL", f)
    print("%d bed files saved, %d restored byte for byte, %d restores at other bits (%d equal to convert), "
          "%d loads in mlx-lm, %d failures" % (stats["saved"], stats["restored_exact"], stats["requantized"],
                                               stats["equal_to_convert"], stats["loads"], len(failures)))
    if failures or stats["saved"] == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
