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
4. ls / find --tokens / verify / export / import / rm / gc on these snapshots;
5. restore --tokens 3 of every bed file (and of a RotatingKVCache whose ring has not wrapped): the
   cut loads in the mlx-lm release that made the original with offset 3 in every layer (and _idx 3
   for a ring) and the first 3 positions of every K/V tensor equal to the original's; refused
   (non-zero exit, no output) exactly where a layer cannot be cut (recurrent state, a wrapped ring,
   a ChunkedKVCache past its first chunk, the 0.18.x '<i>_keys' layout); restore --tokens 600 of the
   900-position KVCache equals mlx-lm 0.32's own save of those 600 positions byte for byte (the
   bed's cuts are loaded in one mlx-lm process per release, check_prefixes_in_release);
6. an encrypted store (--key-file, --tenant) on a few bed files: restore byte for byte, --tokens and
   --kv-bits equal to the plain store's, show, find, verify with and without the key (exit 0,
   sealed_only), no key exit 2, another key exit 5, a flipped pack byte exit 3, export (sealed and
   --decrypt) and import, rm and gc; no tensor bytes or metadata strings in the store's files.

    python3 store_test.py KVSNAP BED_DIR VENV_PYTHON WORK_DIR
Run by ctest (oracle.mlx_store) through store_test.sh, which makes the bed or exits 77 (SKIP).
"""
import filecmp
import json
import os
import struct
import subprocess
import sys

from bed_load import load_in_release, run_in_release

failures = []
stats = {"saved": 0, "restored_exact": 0, "requantized": 0, "equal_to_convert": 0, "loads": 0, "prefixes": 0,
         "prefixes_refused": 0, "encrypted": 0}
PREFIX = 3  # positions kept by restore --tokens: the 3 tokens the bed files are saved with; every one holds more
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
        prefixes = []  # (snapshot, original, cut): checked in one mlx-lm process per release, below
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
            # digest reads llama.cpp files: an mlx-lm cache is told for one (it said "unknown magic")
            d = run(kvsnap, "digest", src, ok=False)
            if d.returncode != 2 or "is an mlx-lm prompt cache" not in d.stderr:
                fail("digest " + snap, "exit %d: %s" % (d.returncode, d.stderr.strip()[-300:]))
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
            check_prefix(kvsnap, store, snap, oracle, src, work, prefixes)
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
                rb = run(kvsnap, "convert", "--force", out, b, *args, ok=False)
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
        check_prefixes_in_release(python, version, prefixes, work)


def cuttable(layer):
    """Whether restore --tokens can cut this layer (as mlx-lm's loader reported it): format/mlx_layout.h."""
    c = layer["class"]
    if c == "CacheList":
        return all(cuttable(x) for x in layer["caches"])
    if c in ("KVCache", "QuantizedKVCache"):
        return True
    if c == "ChunkedKVCache":
        return layer.get("start_position", 0) == 0
    if c == "RotatingKVCache":
        return layer["offset"] <= layer["max_size"] and layer["_idx"] == layer["offset"]
    return False


def check_prefix(kvsnap, store, snap, oracle, src, work, prefixes):
    """restore --tokens PREFIX: a cut (appended to `prefixes`, for check_prefixes_in_release to load in
    mlx-lm as the first PREFIX positions), or refused."""
    want = "reference" not in oracle and all(cuttable(L) for L in oracle["layers"])
    out = os.path.join(work, snap + "-prefix.safetensors")
    if os.path.exists(out):
        os.remove(out)
    r = run(kvsnap, "restore", snap, "--store", store, "-o", out, "--tokens", str(PREFIX), ok=False)
    if (r.returncode == 0) != want:
        fail(snap + " --tokens", "exit %d, expected %s: %s" % (r.returncode, "a cut" if want else "a refusal",
                                                              r.stderr.strip()[-400:]))
        return
    if not want:
        if os.path.exists(out):
            fail(snap + " --tokens", "a refused restore left " + out)
        elif "restore the whole snapshot" not in r.stderr:
            fail(snap + " --tokens", "the refusal does not say the way out: " + r.stderr.strip()[-300:])
        else:
            stats["prefixes_refused"] += 1
        return
    prefixes.append((snap, src, out))


def check_prefixes_in_release(python, version, prefixes, work):
    """Every (snapshot, original, cut) of `prefixes` in one process of mlx-lm `version` (its start and
    imports cost ~1 s, the checks a few ms each): one answer line per cut; a cut without one (the
    process died while loading it: it names each cut on stderr first) fails with the output."""
    if not prefixes:
        return
    plan = os.path.join(work, "prefixes-%s.json" % version)
    answers = plan + ".out"
    with open(plan, "w") as f:
        json.dump([[snap, src, out] for snap, src, out in prefixes], f)
    if os.path.exists(answers):
        os.remove(answers)
    ok, said = run_in_release(python, __file__, version, ["--prefix-checks", str(PREFIX), plan, answers])
    got = {}
    if os.path.exists(answers):
        for line in open(answers):
            snap, _, problems = line.rstrip("\n").partition("\t")
            got[snap] = problems
    for snap, _, _ in prefixes:
        if snap not in got:
            fail(snap + " --tokens", "mlx-lm %s gave no answer (exit ok: %s): %s" % (version, ok, said))
        elif got[snap]:
            fail(snap + " --tokens", "mlx-lm %s: %s" % (version, got[snap]))
        else:
            stats["prefixes"] += 1


def prefix_checks(n, plan, answers):
    """In the venv: prefix_problems for every [snapshot, original, cut] of the JSON file `plan`, one
    line per cut to `answers` ("SNAPSHOT<TAB>PROBLEMS", empty when none), flushed as it goes."""
    with open(answers, "w") as out:
        for snap, original, cut in json.load(open(plan)):
            print("checking", snap, file=sys.stderr, flush=True)
            out.write("%s\t%s\n" % (snap, "; ".join(prefix_problems(n, original, cut))))
            out.flush()


def prefix_check(n, original, cut):
    """In the venv: exit 1, printing the problems, unless `cut` loads as the first n positions of `original`."""
    problems = prefix_problems(n, original, cut)
    if problems:
        print("\n".join(problems))
        sys.exit(1)


def prefix_problems(n, original, cut):
    """In the venv (the release on PYTHONPATH): why `cut` does not load as the first n positions of
    `original` (empty: it does)."""
    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache

    problems = []

    def first(c, name):
        k, v = c.keys, c.values
        parts = list(k) + list(v) if name == "QuantizedKVCache" else [k, v]
        return [t[..., :n, :] for t in parts]

    def compare(a, b, where):
        name = type(a).__name__
        if type(b).__name__ != name:
            problems.append("%s: class %s, cut %s" % (where, name, type(b).__name__))
            return
        if name == "CacheList":
            for i, (x, y) in enumerate(zip(a.caches, b.caches)):
                compare(x, y, "%s.%d" % (where, i))
            return
        if b.offset != n:
            problems.append("%s (%s): offset %d, expected %d" % (where, name, b.offset, n))
        if name == "RotatingKVCache" and b._idx != n:
            problems.append("%s (%s): _idx %d, expected %d" % (where, name, b._idx, n))
        for i, (x, y) in enumerate(zip(first(a, name), first(b, name))):
            if x.shape != y.shape or not mx.array_equal(x, y).item():
                problems.append("%s (%s): tensor %d's first %d positions differ" % (where, name, i, n))

    a, b = load_prompt_cache(original), load_prompt_cache(cut)
    if len(a) != len(b):
        problems.append("%d layers, cut %d" % (len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        compare(x, y, "layer %d" % i)
    return problems


def make_conversation(python, work):
    """Two real save_prompt_cache files of one conversation (run in the venv's mlx-lm)."""
    r = subprocess.run([python, __file__, "--make", work], capture_output=True, text=True)
    if r.returncode != 0:
        fail("make conversation", (r.stdout + r.stderr).strip()[-1500:])
        return False
    return True


def make_files(work):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, RotatingKVCache, save_prompt_cache

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
    # A ring that has not wrapped: 40 positions in a window of 64 (the bed's rings have wrapped).
    rings = []
    for L in range(2):
        c = RotatingKVCache(max_size=64, keep=4)
        c.update_and_fetch(ks[L][:, :, :40, :], vs[L][:, :, :40, :])
        rings.append(c)
    save_prompt_cache(os.path.join(work, "ring-40.safetensors"), rings, {"model": "conv"})


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
        # restore --tokens 600 of the 900-position KVCache gives what mlx-lm 0.32 itself saved for
        # those 600 positions (conv-600), byte for byte: its 256-row buffer (768 rows), zero past 600
        if kind == "bf16":
            cut = os.path.join(work, "c900-to-600.safetensors")
            if run(kvsnap, "restore", "c900-bf16", "-o", cut, "--force", "--store", store, "--tokens", "600"):
                if not filecmp.cmp(cut, os.path.join(work, "conv-600-bf16.safetensors"), shallow=False):
                    fail("restore --tokens 600", "the cut differs from mlx-lm's own save of the 600 positions")
                else:
                    print("ok restore c900-bf16 --tokens 600 == mlx-lm's conv-600-bf16 byte for byte", flush=True)
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


def check_ring(kvsnap, work, python):
    """restore --tokens of a RotatingKVCache whose ring has not wrapped, in the venv's mlx-lm."""
    src = os.path.join(work, "ring-40.safetensors")
    if not os.path.exists(src):
        return  # make_conversation failed: already a failure
    store = os.path.join(work, "ring-store")
    if run(kvsnap, "save", src, "--store", store, "--name", "ring") is None:
        return
    for n in (PREFIX, 40):
        out = os.path.join(work, "ring-%d.safetensors" % n)
        if run(kvsnap, "restore", "ring", "--store", store, "-o", out, "--tokens", str(n), "--force") is None:
            continue
        ok, said = run_in_release(python, __file__, "0.32.2", ["--prefix-check", str(n), src, out])
        if not ok:
            fail("ring --tokens %d" % n, said)
        else:
            stats["prefixes"] += 1
    r = run(kvsnap, "restore", "ring", "--store", store, "-o", os.path.join(work, "ring-41.safetensors"),
            "--tokens", "41", ok=False)
    if r.returncode != 2:
        fail("ring --tokens 41", "exit %d (expected 2: past the offset): %s" % (r.returncode, r.stderr.strip()[-300:]))


ENCRYPTED_FILES = ["0.32.2/kv_bf16", "0.32.2/q4g64_bf16", "0.31.3/cachelist_mixed", "0.28.0/rotating_bf16",
                   "0.31.3/hybrid_bf16"]


def store_holds(root, needle):
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                if needle in fh.read():
                    return True
    return False


def check_encrypted(kvsnap, plain_store, bed, work):
    """The same bed files in an encrypted store: everything the plain store does, sealed."""
    keys = os.path.join(work, "keys")
    os.makedirs(keys, exist_ok=True)
    key, other = os.path.join(keys, "k.key"), os.path.join(keys, "other.key")
    for path, digit in ((key, "e"), (other, "f")):
        with open(path, "w") as f:
            f.write(digit * 64 + "\n")
        os.chmod(path, 0o600)
    store = os.path.join(work, "enc-store")
    k = ["--store", store, "--key-file", key, "--tenant", "ana"]
    saved = []
    for rel in ENCRYPTED_FILES:
        src = os.path.join(bed, rel + ".safetensors")
        if not os.path.exists(src):
            fail("encrypted " + rel, "no bed file")
            continue
        plain_snap = rel.replace("/", "-")
        snap = "enc-" + plain_snap
        if run(kvsnap, "save", src, *k, "--name", snap, "--model", "tiny-enc", "--tokens", "1,2,3,4,5,6,7") is None:
            continue
        saved.append((snap, src))
        out = os.path.join(work, snap + ".safetensors")
        if run(kvsnap, "restore", snap, *k, "-o", out, "--force") and not filecmp.cmp(src, out, shallow=False):
            fail(snap, "restore is not the saved file byte for byte")
        # --tokens and --kv-bits: the plain store's bytes (or both refused)
        version = rel.split("/")[0]
        for args in (["--tokens", str(PREFIX)], ["--kv-bits", "4"] + (["--mlx-lm", version] if version < "0.32" else [])):
            a, b = os.path.join(work, snap + "-a.safetensors"), os.path.join(work, snap + "-b.safetensors")
            ra = run(kvsnap, "restore", snap, *k, "-o", a, "--force", *args, ok=False)
            rb = run(kvsnap, "restore", plain_snap, "--store", plain_store, "-o", b, "--force", *args, ok=False)
            if ra.returncode != rb.returncode:
                fail(snap + " " + args[0], "exit %d encrypted, %d plain: %s" % (ra.returncode, rb.returncode,
                                                                              ra.stderr.strip()[-300:]))
            elif ra.returncode == 0 and not filecmp.cmp(a, b, shallow=False):
                fail(snap + " " + args[0], "differs from the plain store's restore")
        r = run(kvsnap, "show", snap, *k, "--json")
        if r and (json.loads(r.stdout).get("encryption") or {}).get("tenant") != "ana":
            fail(snap, "show: " + r.stdout[:300])
        stats["encrypted"] += 1
    if not saved:
        return
    snap, src = saved[0]
    out = os.path.join(work, "enc-x.safetensors")
    for args, code in ((["--store", store], 2), (["--store", store, "--key-file", other, "--tenant", "ana"], 5)):
        r = run(kvsnap, "restore", snap, *args, "-o", out, "--force", ok=False)
        if r.returncode != code or os.path.exists(out):
            fail("encrypted " + snap, "restore %s: exit %d, expected %d" % (args[1:], r.returncode, code))
    prompt = os.path.join(work, "enc-prompt.json")
    json.dump(list(range(1, 11)), open(prompt, "w"))
    r = run(kvsnap, "find", "--tokens", prompt, *k, "--json")
    if r and sorted(x["name"] for x in json.loads(r.stdout)) != sorted(s_ for s_, _ in saved):
        fail("encrypted find", r.stdout[:400])
    run(kvsnap, "verify", "--all", *k)
    r = run(kvsnap, "verify", "--all", "--store", store, "--json")
    if r and json.loads(r.stdout).get("sealed_only") != len(saved):
        fail("keyless verify", r.stdout[:400])
    # no tensor bytes (the first 64 of each file's data: 0.32 buffers end in zero rows) or metadata
    # strings at rest
    for snap_, src_ in saved:
        data = open(src_, "rb").read()
        start = 8 + struct.unpack("<Q", data[:8])[0]
        needle = data[start:start + 64]
        if len(set(needle)) > 8 and store_holds(store, needle):
            fail("at rest", "tensor bytes of %s in the encrypted store" % src_)
    for needle in (b"tiny-random-llama", b"trust_remote_code"):
        if store_holds(store, needle):
            fail("at rest", "%r in the encrypted store" % needle)
    # export sealed -> the same key elsewhere; export --decrypt -> a plain store
    sealed, plain = os.path.join(work, "enc.tar.zst"), os.path.join(work, "enc-plain.tar.zst")
    for f in (sealed, plain):
        if os.path.exists(f):
            os.remove(f)
    run(kvsnap, "export", snap, "-o", sealed, *k)
    run(kvsnap, "export", snap, "--decrypt", "-o", plain, *k)
    for at, args in ((os.path.join(work, "enc-import"), ["--key-file", key, "--tenant", "ana"]),
                     (os.path.join(work, "enc-import-plain"), [])):
        archive = sealed if args else plain
        if run(kvsnap, "import", archive, "--store", at, *args) is None:
            continue
        r = run(kvsnap, "ls", "--store", at, "--json", *args)
        ref = json.loads(r.stdout)[0]["uuid"] if r else snap
        if run(kvsnap, "restore", ref, "--store", at, *args, "-o", out, "--force"):
            if not filecmp.cmp(src, out, shallow=False):
                fail("import " + archive, "restored file differs")
        run(kvsnap, "verify", "--all", "--store", at, *args)
    # a flipped pack byte: exit 3; rm and gc
    packs = os.path.join(store, "packs")
    pack = os.path.join(packs, sorted(os.listdir(packs))[0])
    blob = bytearray(open(pack, "rb").read())
    blob[-1] ^= 0x20  # the GCM tag of the pack's last blob
    open(pack, "wb").write(bytes(blob))
    bad = [run(kvsnap, "restore", s_, *k, "-o", out, "--force", ok=False).returncode for s_, _ in saved]
    if 3 not in bad or any(c not in (0, 3) for c in bad):
        fail("encrypted tamper", "restore exits %s, expected 3 for the damaged one" % bad)
    blob[-1] ^= 0x20
    open(pack, "wb").write(bytes(blob))
    for s_, _ in saved:
        run(kvsnap, "rm", s_, *k)
    run(kvsnap, "gc", "--store", store, "--key-file", key)  # gc's --tenant is its eviction scope
    run(kvsnap, "verify", "--all", *k)


def main():
    if sys.argv[1] == "--load":
        from mlx_lm.models.cache import load_prompt_cache

        for p in sys.argv[2:]:
            load_prompt_cache(p)
        return
    if sys.argv[1] == "--prefix-check":
        prefix_check(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    if sys.argv[1] == "--prefix-checks":
        prefix_checks(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    if sys.argv[1] == "--make":
        make_files(sys.argv[2])
        return
    kvsnap, bed, python, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    store = os.path.join(work, "store")
    check_bed(kvsnap, store, bed, python, work)
    check_dedup(kvsnap, work, python)
    check_ring(kvsnap, work, python)
    check_encrypted(kvsnap, store, bed, work)
    for f in failures[:100]:
        print("FAIL", f)
    print("%d bed files saved, %d restored byte for byte, %d restores at other bits (%d equal to convert), "
          "%d loads in mlx-lm, %d prefixes cut and checked in mlx-lm, %d refused, %d files in an encrypted store, "
          "%d failures" % (stats["saved"], stats["restored_exact"], stats["requantized"], stats["equal_to_convert"],
                           stats["loads"], stats["prefixes"], stats["prefixes_refused"], stats["encrypted"],
                           len(failures)))
    if failures or stats["saved"] == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
