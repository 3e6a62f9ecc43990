#!/usr/bin/env python3
"""An independent reader of llama.cpp state files (written from docs/llama-formats.md, the
layout-era table of docs/oracle.md and llama.cpp's sources, sharing no code with format/),
checked against `kvsnap info --json` on every state file under the given directories.

For each file it tries every reading its (magic, version) allows -- n_stream prefix or not, cell
ext 0/8/12 bytes, v9 sessions with or without the output block (output ids, logits, embeddings;
dropped at b8179 without a version bump), one or two KV sections, a recurrent tail -- keeps the
readings that consume the file exactly (there must be exactly one) and says which llama.cpp layout
eras (A..H, docs/oracle.md) that reading fits. A fixture's MANIFEST.json (its llama.cpp tag) must
name one of those eras.

Then `kvsnap info --json` (and, when the manifest names the model, `kvsnap info --json --model M`)
must agree: token count, sections, streams, cells, per-layer types, row bytes, V layout, the cell
ext bytes, whether a v9 session carries outputs, and, with the model, the rotation words
(quantized K/V of era G/H builds are Hadamard-rotated when the head dim is a multiple of 64).

Files stored as NAME.pending (fixtures/regen.sh: ones kvsnap cannot read yet, kept out of kvsnap's
own fixture walkers) are checked like NAME.

Disagreements that kvsnap is known to have today are listed, per file, in KNOWN_KVSNAP_GAPS with the
kinds of problem allowed and a reason. A listed file must show only those kinds; a listed file that
now agrees fails too ("stale"), so the list is emptied as kvsnap is fixed. Any other disagreement
fails.

usage: independent_info_check.py KVSNAP_BINARY DIR...   (exit 0 when every file agrees)
       independent_info_check.py --reading FILE...      (one JSON line a file: the reading that fits,
                                                         used by tests/oracle/zoo_test.sh; no kvsnap)
"""
import json, os, struct, subprocess, sys

TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22),
         7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 20: ("iq4_nl", 32, 18), 30: ("bf16", 1, 2)}
FLOAT_TYPES = {"f32", "f16", "bf16"}
GGSQ, GGSN, RAW_TAG = 0x67677371, 0x6767736e, 0xaf143cd8

# llama.cpp tag -> layout era (docs/oracle.md, fixtures/README.md)
ERA_OF_TAG = {"b3166": "A", "b3543": "B", "b5640": "C", "b8121": "D", "b8179": "E", "b8390": "F", "b9842": "G", "b10361": "G",
              "v0.4.0": "H", "v0.5.0": "H"}
ROTATING_ERAS = {"G", "H"}

# Files (relative to the fixtures directory) on which kvsnap is known to be wrong today, with the
# problem kinds allowed and why. Kinds: info-fails (kvsnap info exits non-zero), structure (tokens,
# sections, cells, layers), cell-ext, outputs (v9 output block), rotation (k_rotation / v_rotation).
# Remove an entry when kvsnap gets the file right: a listed file that agrees fails as "stale".
KNOWN_KVSNAP_GAPS = {}


class R:
    def __init__(self, b, pos=0):
        self.b, self.p = b, pos
    def _take(self, fmt, n):
        if self.p + n > len(self.b): raise ValueError("truncated")
        v = struct.unpack_from(fmt, self.b, self.p)[0]; self.p += n; return v
    def u32(self): return self._take("<I", 4)
    def i32(self): return self._take("<i", 4)
    def u64(self): return self._take("<Q", 8)
    def skip(self, n):
        if n < 0 or self.p + n > len(self.b): raise ValueError("truncated")
        self.p += n


def kv_section(r, prefix, ext, ids=None):
    """ids: collects each cell's n_seq_id (ggsq cells hold none up to b4980, one from b5640)."""
    streams = []
    n_stream = r.u32() if prefix else 1
    if n_stream > 64: raise ValueError("implausible n_stream")
    for _ in range(n_stream):
        cc = r.u32()
        s = {"cell_count": cc}
        if cc:
            for _ in range(cc):
                r.i32(); n = r.u32(); r.skip(ext); r.skip(4 * n)
                if ids is not None: ids.add(n)
            s["v_trans"] = r.u32(); nl = r.u32(); s["n_layer"] = nl
            if s["v_trans"] > 1 or nl > 4096: raise ValueError("implausible")
            layers = [{} for _ in range(nl)]
            for L in layers:
                t = r.i32(); rb = r.u64(); L["k_type"] = TYPES[t][0]; L["k_row_bytes"] = rb; r.skip(rb * cc)
            for L in layers:
                t = r.i32(); L["v_type"] = TYPES[t][0]
                if s["v_trans"]:
                    el = r.u32(); ne = r.u32(); L["v_elem_bytes"] = el; L["n_embd_v_gqa"] = ne; r.skip(el * ne * cc)
                else:
                    rb = r.u64(); L["v_row_bytes"] = rb; r.skip(rb * cc)
            s["layers"] = layers
        streams.append(s)
    return streams


def recurrent_tail(r):
    """llama_memory_recurrent::state_write: cells, s_trans, n_layer, then {type, row, rows} entries."""
    cc = r.u32()
    for _ in range(cc):
        r.i32(); n = r.u32(); r.skip(4 * n)
    if r.u32() != 0:
        return False
    r.u32()
    entries = 0
    while r.p < len(r.b):
        t = r.i32(); row = r.u64()
        if t not in TYPES:
            return False
        r.skip(row * cc); entries += 1
    return entries > 0 and entries % 2 == 0


def seq_v1(r):
    """ggsq v1 (b3166): u32 sizeof(size_t), cell_count, n_layer, n_embd_v_gqa, cell_count i32 positions,
    per layer {i32 k_type, u64 k_row, rows}, then per layer V {i32 type, u64 row | element size, data}."""
    if r.u32() != 8: raise ValueError("size_t width")
    cc, nl, nv = r.u32(), r.u32(), r.u32()
    r.skip(4 * cc)
    s = {"cell_count": cc, "n_layer": nl}
    layers = [{} for _ in range(nl)]
    for L in layers:
        t = r.i32(); rb = r.u64(); L["k_type"] = TYPES[t][0]; L["k_row_bytes"] = rb; r.skip(rb * cc)
    for L in layers:
        t = r.i32(); x = r.u64(); L["v_type"] = TYPES[t][0]
        name, blk, bb = TYPES[t]
        if blk == 1 and x == bb and nv > 1:  # transposed: element size
            s["v_trans"] = 1; L["v_elem_bytes"] = x; L["n_embd_v_gqa"] = nv; r.skip(x * nv * cc)
        elif x == nv // blk * bb:
            s["v_trans"] = 0; L["v_row_bytes"] = x; r.skip(x * cc)
        else:
            raise ValueError("V size")
    s["layers"] = layers
    return [s]


def session_v6(b, r, out):
    """ggsn v6 (b3166): raw llama_hparams (152 bytes; n_head_kv at 20, n_layer at 24, n_embd_head_k/v at
    32/36), u32 n_token + tokens, u64 rng length + text, u64 n_outputs + i32s, u64 logits + f32s,
    u64 embeddings + f32s, u64 kv_buf_size, u32 kv_head, kv_size, kv_used, v_trans, per layer K then V
    of kv_head cells, kv_head cells {i32 pos, u64 n_seq, i32s}. The types: the only pair of b3166's
    cache types whose rows (widths from the file's own hparams) make kv_buf_size / kv_head."""
    hp = b[8:160]
    if len(hp) != 152: raise ValueError("truncated")
    n_head_kv, n_layer = struct.unpack_from("<II", hp, 20)
    hk, hv = struct.unpack_from("<II", hp, 32)
    r.p = 160
    n = r.u32(); r.skip(4 * n); out["tokens"] = n
    r.skip(r.u64())
    r.skip(4 * r.u64()); r.skip(4 * r.u64()); r.skip(4 * r.u64())
    buf, head, _size, _used, vt = r.u64(), r.u32(), r.u32(), r.u32(), r.u32()
    nk, nv = hk * n_head_kv, hv * n_head_kv
    row = lambda t, ne: ne // TYPES[t][1] * TYPES[t][2] if ne % TYPES[t][1] == 0 else None
    b3166 = [0, 1, 8, 2, 3, 20, 6, 7]
    pairs = [(k, v) for k in b3166 for v in b3166 if not (vt and TYPES[v][1] != 1)
             and row(k, nk) and row(v, nv) and head and n_layer * (row(k, nk) + row(v, nv)) * head == buf]
    s = {"cell_count": head}
    if head:
        if len(pairs) != 1: raise ValueError("%d K/V type pairs fit" % len(pairs))
        k, v = pairs[0]
        s["v_trans"] = vt; s["n_layer"] = n_layer
        layers = []
        for _ in range(n_layer):
            L = {"k_type": TYPES[k][0], "k_row_bytes": row(k, nk), "v_type": TYPES[v][0]}
            r.skip(row(k, nk) * head)
            if vt:
                L["v_elem_bytes"] = TYPES[v][2]; L["n_embd_v_gqa"] = nv
            else:
                L["v_row_bytes"] = row(v, nv)
            r.skip(row(v, nv) * head)
            layers.append(L)
        s["layers"] = layers
    for _ in range(head):
        r.i32(); r.skip(4 * r.u64())
    if r.p != len(b): raise ValueError("%d bytes after the cells" % (len(b) - r.p))
    out.update({"sections": [[s]], "prefix": False, "ext": 0, "outputs": True, "recurrent": False, "eras": {"A"}})
    return out


def eras_of(magic, ver, prefix, ext, outputs, ids=frozenset()):
    """The layout eras (docs/oracle.md) in which llama.cpp writes a file read this way."""
    if magic == GGSQ and ver == 1:
        return {"A"}
    if magic == GGSN and ver == 8:
        return {"B"}
    if magic == RAW_TAG:  # the io magic prefix appeared at b9842 (G), before the v3 bump (H)
        return {0: {"G", "H"}, 8: {"G"}, 12: {"H"}}[ext]
    if ver in (3, 10):
        return {"H"}
    if not prefix:
        if magic == GGSQ and ids == {0}:  # b3543..b4980 slots: cells without their seq id
            return {"B", "C"}
        return {"C"}
    if outputs:
        return {"D"}
    if ext == 8:
        return {"F", "G"}
    # ggsq v2 files never held outputs: D and E write the same slot files
    return {"D", "E", "F", "G"} if magic == GGSQ else {"E", "F", "G"}


def readings(magic, ver):
    """(prefix, ext, outputs) triples the (magic, version) allows."""
    if magic == RAW_TAG:
        return [(True, e, False) for e in (0, 8, 12)]
    if (magic == GGSQ and ver == 3) or (magic == GGSN and ver == 10):
        return [(True, e, False) for e in (0, 12)]
    if magic == GGSQ and ver == 2:
        return [(False, 0, False), (True, 0, False), (True, 8, False)]
    if magic == GGSN and ver == 9:
        return [(False, 0, True), (True, 0, True), (True, 0, False), (True, 8, False)]
    if magic == GGSN and ver == 8:  # b3543: RNG text, outputs, memory without n_stream
        return [(False, 0, True)]
    if magic == GGSQ and ver == 1:  # b3166: its own sequence layout (seq_v1)
        return [(False, 0, False)]
    raise ValueError("unknown version %d" % ver)


def parse(path):
    b = open(path, "rb").read()
    r = R(b)
    magic, ver = r.u32(), r.u32()
    out = {"magic": magic, "version": ver}
    if magic == GGSQ:
        n = r.u32(); words = struct.unpack_from("<%di" % n, b, r.p); r.p += 4 * n
        out["tokens"] = words[2] if n and words[0] == -1 else n  # packed: -1, version, count, ...
    elif magic == GGSN and ver == 6:
        return session_v6(b, r, out)
    elif magic == GGSN:
        n = r.u32(); r.skip(4 * n); out["tokens"] = n
        alen = r.u32(); r.skip(alen)
        if ver == 8:
            rlen = r.u32(); r.skip(rlen); out["rng_bytes"] = rlen
    elif magic == RAW_TAG:  # b9842+ raw sequence buffer: magic, i32 seq_id (already read as "version")
        pass
    else:
        raise ValueError("unknown magic")
    start = r.p
    fits = []
    for prefix, ext, outputs in readings(magic, ver):
        for n_kv in (1, 2):
            for recurrent in (False, True):
                try:
                    r.p = start
                    if outputs:
                        no = r.u32(); r.skip(4 * no); ls = r.u64(); r.skip(4 * ls); es = r.u64(); r.skip(4 * es)
                    ids = set()
                    if magic == GGSQ and ver == 1:
                        if n_kv == 2 or recurrent: continue
                        sections = [seq_v1(r)]
                    else:
                        sections = [kv_section(r, prefix, ext, ids) for _ in range(n_kv)]
                    if recurrent and (not prefix or not recurrent_tail(r)):  # b5640 had no hybrid memory
                        continue
                    if r.p == len(b):
                        fits.append({"sections": sections, "prefix": prefix, "ext": ext, "outputs": outputs,
                                     "recurrent": recurrent, "eras": eras_of(magic, ver, prefix, ext, outputs, ids)})
                except (ValueError, KeyError, struct.error):
                    pass
    if len(fits) != 1:
        raise ValueError("%d readings fit" % len(fits))
    out.update(fits[0])
    return out


PENDING = ".pending"


def real_name(path):
    """fixtures/regen.sh stores the files kvsnap cannot read yet as NAME.pending"""
    return path[:-len(PENDING)] if path.endswith(PENDING) else path


def manifest_entry(path):
    """(era, model path, head_dim) from the MANIFEST.json beside the file, or Nones."""
    path = real_name(path)
    d = os.path.dirname(path)
    mf = os.path.join(d, "MANIFEST.json")
    if not os.path.exists(mf):
        return None, None, None
    m = json.load(open(mf))
    era = m.get("era") or ERA_OF_TAG.get(m.get("llama_cpp_tag"))
    for e in m.get("files", []):
        if e.get("file") == os.path.basename(path):
            model = os.path.join(os.path.dirname(d), e["model"]) if e.get("model") else None
            return era, model, e.get("head_dim")
    return era, None, None


def expected_rotation(era, head_dim, type_name, side):
    """llama.cpp's rule in the words of `kvsnap info` (docs/info-json.md); a set of acceptable words."""
    if type_name in FLOAT_TYPES:
        return {"none"}
    if era not in ROTATING_ERAS:
        # Unrotated twice over when the head dim is one llama.cpp never rotates: either word is true
        # (kvsnap says none-head-dim when the model shows it and the file's era is not known).
        # Or the values show it (layer 0's RoPE: a format several eras write, no build named).
        return {"none-pre-rotation"} | ({"none-head-dim"} if head_dim % 64 else {"none-by-data"})
    if head_dim % 64:
        return {"none-head-dim"}
    n = 64
    while side == "k" and head_dim % (n * 2) == 0:
        n *= 2
    # Rotated; kvsnap may know it from the values alone (a format several eras write, no build named).
    return {"hadamard-%d" % n, "hadamard-%d-by-data" % n}


def run_info(exe, f, model=None, extra=()):
    args = [exe, "info", f, "--json"] + (["--input-format", "raw-seq"] if real_name(f).endswith(".raw") else [])
    if model:
        args += ["--model", model]
    args += list(extra)
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        return None, "exit %d: %s" % (p.returncode, (p.stderr.strip().splitlines() or [""])[-1][:200])
    return json.loads(p.stdout), None


def compare(mine, j, problems, era=None, head_dim=None, undecided_ok=False):
    """Appends (kind, text) for every disagreement between my reading and kvsnap's JSON."""
    def bad(kind, text):
        problems.append((kind, text))
    if j.get("tokens", {}).get("count", mine.get("tokens")) != mine.get("tokens"):
        bad("structure", "tokens %s != %s" % (j["tokens"]["count"], mine["tokens"]))
    lay = j.get("layout", {})
    if lay.get("cell_ext_bytes", mine["ext"]) != mine["ext"]:
        bad("cell-ext", "cell ext %s != %s" % (lay.get("cell_ext_bytes"), mine["ext"]))
    if mine["magic"] == GGSN and mine["version"] in (8, 9) and bool(j.get("outputs")) != mine["outputs"]:
        bad("outputs", "outputs %s, the file has %s" % ("present" if j.get("outputs") else "none",
                                                         "an output block" if mine["outputs"] else "none"))
    if len(mine["sections"]) != len(j.get("kv_sections", [])):
        bad("structure", "KV section count %d != %d" % (len(j.get("kv_sections", [])), len(mine["sections"])))
    for streams, sec in zip(mine["sections"], j.get("kv_sections", [])):
        theirs_streams = sec["streams"]
        if len(streams) != len(theirs_streams):
            bad("structure", "stream count")
        for a, s in zip(streams, theirs_streams):
            if a["cell_count"] != s["cell_count"]:
                bad("structure", "cells %s != %s" % (s["cell_count"], a["cell_count"]))
            if not a["cell_count"]:
                continue
            if a["v_trans"] != s.get("v_trans") or a["n_layer"] != s.get("n_layer"):
                bad("structure", "v_trans/n_layer")
            for la, ls in zip(a["layers"], s.get("layers", [])):
                for k, v in la.items():
                    if ls.get(k) != v:
                        bad("structure", "%s: %s != %s" % (k, ls.get(k), v))
                if era is None or head_dim is None:
                    continue
                for side in ("k", "v"):
                    t = la.get(side + "_type")
                    got = ls.get(side + "_rotation")
                    if t is None or got is None:
                        continue
                    want = expected_rotation(era, head_dim, t, side)
                    if undecided_ok and t not in FLOAT_TYPES:
                        want = want | {"unknown-era"}  # not knowing is right; a wrong answer never is
                    if got not in want:
                        bad("rotation", "layer %s %s_rotation %s, want %s (era %s, head dim %d, %s)"
                            % (ls.get("layer"), side, got, "/".join(sorted(want)), era, head_dim, t))


def print_readings(paths):
    rc = 0
    for f in paths:
        try:
            m = parse(f)
            print(json.dumps({"file": f, "magic": "%08x" % m["magic"], "version": m["version"],
                              "tokens": m.get("tokens"), "n_stream_prefix": m["prefix"], "cell_ext_bytes": m["ext"],
                              "outputs": m["outputs"], "kv_sections": len(m["sections"]),
                              "recurrent": m["recurrent"], "eras": "".join(sorted(m["eras"])),
                              "cells": [[s["cell_count"] for s in sec] for sec in m["sections"]]}))
        except (OSError, ValueError) as e:
            print(json.dumps({"file": f, "error": str(e)}))
            rc = 1
    return rc


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--reading":
        return print_readings(sys.argv[2:])
    exe, dirs = sys.argv[1], sys.argv[2:]
    files = []
    for d in dirs:
        for root, _, names in os.walk(d):
            files += [os.path.join(root, n) for n in names
                      if real_name(n).endswith((".slot", ".session", ".bin", ".raw"))]
    bad = known = 0
    seen_gaps = set()
    for f in sorted(files):
        rel = next((os.path.relpath(real_name(f), d) for d in dirs
                    if os.path.abspath(f).startswith(os.path.abspath(d) + os.sep)), real_name(f))
        problems = []
        try:
            mine = parse(f)
        except ValueError as e:
            print("%-60s DIFFERS: independent parser: %s" % (rel, e))
            bad += 1
            continue
        era, model, head_dim = manifest_entry(f)
        fits = "".join(sorted(mine["eras"]))
        if era is not None and era not in mine["eras"]:
            problems.append(("fixture", "the manifest's era %s is not among the eras this reading fits (%s)"
                             % (era, fits)))
        j, err = run_info(exe, f)
        if mine["magic"] == GGSN and mine["version"] == 6:
            # b3166 sessions record no types: kvsnap must ask for the model (exit 4 naming --model)
            if not err or not err.startswith("exit 4") or "--model" not in err:
                problems.append(("info-fails", "kvsnap info without --model: %s" % (err or "succeeded")))
        elif err:
            problems.append(("info-fails", "kvsnap info: " + err))
        else:
            compare(mine, j, problems)
        if model and os.path.exists(model):
            # Without the build, kvsnap may not know the rotation, but must never say a wrong one.
            j, err = run_info(exe, f, model)
            if err:
                problems.append(("info-fails", "kvsnap info --model: " + err))
            else:
                compare(mine, j, problems, era, head_dim, undecided_ok=True)
            # With the build that wrote it (the fixture's directory), the rotation is known exactly.
            tag = rel.split("/")[0]
            if tag in ERA_OF_TAG:
                j, err = run_info(exe, f, model, ["--source-build", tag])
                if err:
                    problems.append(("info-fails", "kvsnap info --model --source-build %s: %s" % (tag, err)))
                else:
                    compare(mine, j, problems, era, head_dim)
        reading = "eras %s (%s, ext %d%s)" % (fits, "n_stream" if mine["prefix"] else "no n_stream", mine["ext"],
                                             ", outputs" if mine["outputs"] else "")
        gap = KNOWN_KVSNAP_GAPS.get(rel)
        if gap:
            seen_gaps.add(rel)
        kinds = {k for k, _ in problems}
        texts = "; ".join(t for _, t in problems[:4])
        if not problems and not gap:
            print("%-60s agrees   %s" % (rel, reading))
        elif not problems:
            print("%-60s STALE GAP: kvsnap now agrees; remove it from KNOWN_KVSNAP_GAPS   %s" % (rel, reading))
            bad += 1
        elif gap and kinds <= set(gap[0].split(",")):
            print("%-60s known gap (%s)   %s: %s" % (rel, gap[0], reading, texts))
            known += 1
        else:
            print("%-60s DIFFERS  %s: %s" % (rel, reading, texts))
            bad += 1
    for g in sorted(set(KNOWN_KVSNAP_GAPS) - seen_gaps):
        # an entry for a fixture that is not there: the list must name real files
        if any(os.path.isdir(os.path.join(d, g.split("/")[0])) for d in dirs):
            print("%-60s STALE GAP: no such fixture" % g)
            bad += 1
    print("%d agree, %d known kvsnap gaps (KNOWN_KVSNAP_GAPS), %d failed" % (len(files) - bad - known, known, bad))
    return 1 if bad or not files else 0


if __name__ == "__main__":
    sys.exit(main())
