#!/usr/bin/env python3
"""An independent reader of llama.cpp state files (written from docs/llama-formats.md and
llama.cpp's sources, sharing no code with format/), checked against `kvsnap info --json` on
every state file under the given directories: token count, cells, layers, per-layer types,
row bytes and V layout must agree.

usage: independent_info_check.py KVSNAP_BINARY DIR...   (exit 0 when every file agrees)
"""
import json, os, struct, subprocess, sys

TYPES = {0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22),
         7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 20: ("iq4_nl", 32, 18), 30: ("bf16", 1, 2)}


class R:
    def __init__(self, b, pos=0):
        self.b, self.p = b, pos
    def u32(self):
        v = struct.unpack_from("<I", self.b, self.p)[0]; self.p += 4; return v
    def i32(self):
        v = struct.unpack_from("<i", self.b, self.p)[0]; self.p += 4; return v
    def u64(self):
        v = struct.unpack_from("<Q", self.b, self.p)[0]; self.p += 8; return v
    def skip(self, n):
        if self.p + n > len(self.b): raise ValueError("truncated")
        self.p += n


def kv_section(r, prefix, ext):
    streams = []
    n_stream = r.u32() if prefix else 1
    for _ in range(n_stream):
        cc = r.u32()
        s = {"cell_count": cc}
        if cc:
            for _ in range(cc):
                r.i32(); n = r.u32(); r.skip(ext); r.skip(4 * n)
            s["v_trans"] = r.u32(); nl = r.u32(); s["n_layer"] = nl
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


def parse(path):
    b = open(path, "rb").read()
    r = R(b)
    magic, ver = r.u32(), r.u32()
    out = {}
    if magic == 0x67677371:
        n = r.u32(); words = struct.unpack_from("<%di" % n, b, r.p); r.p += 4 * n
        if n and words[0] == -1:
            out["tokens"] = words[2]  # -1, version, count, ...
        else:
            out["tokens"] = n
        prefixes = [True] if ver == 3 else [True, False]
    elif magic == 0x6767736e:
        n = r.u32(); r.skip(4 * n); out["tokens"] = n
        alen = r.u32(); r.skip(alen)
        if ver == 9:
            no = r.u32(); r.skip(4 * no); ls = r.u64(); r.skip(4 * ls); es = r.u64(); r.skip(4 * es)
        prefixes = [True] if ver == 10 else [True, False]
    elif magic == 0xaf143cd8:  # v0.5.0 raw sequence buffer: magic, i32 seq_id (already read as "version")
        prefixes = [True]
    else:
        raise ValueError("unknown magic")
    start = r.p
    exts = [0, 12] if (magic == 0x67677371 and ver == 3) or (magic == 0x6767736e and ver == 10) or magic == 0xaf143cd8 else [0]
    fits = []
    for prefix in prefixes:
        for ext in exts:
            for n_kv in (1, 2):
                for recurrent in (False, True):
                    try:
                        r.p = start
                        sections = [kv_section(r, prefix, ext) for _ in range(n_kv)]
                        if recurrent and (not prefix or not recurrent_tail(r)):  # b5640 had no hybrid memory
                            continue
                        if r.p == len(b):
                            fits.append(sections)
                    except Exception:
                        pass
    if len(fits) != 1:
        raise ValueError("%d layouts fit" % len(fits))
    out["sections"] = fits[0]
    return out


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


def main():
    exe, dirs = sys.argv[1], sys.argv[2:]
    files = []
    for d in dirs:
        for root, _, names in os.walk(d):
            files += [os.path.join(root, n) for n in names if n.endswith((".slot", ".session", ".bin", ".raw"))]
    bad = 0
    for f in sorted(files):
        mine = parse(f)
        args = [exe, "info", f, "--json"] + (["--input-format", "raw-seq"] if f.endswith(".raw") else [])
        j = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
        problems = []
        if j.get("tokens", {}).get("count", mine.get("tokens")) != mine.get("tokens"):
            problems.append("tokens %s != %s" % (j["tokens"]["count"], mine["tokens"]))
        if len(mine["sections"]) != len(j["kv_sections"]):
            problems.append("KV section count")
        for streams, sec in zip(mine["sections"], j["kv_sections"]):
            theirs_streams = sec["streams"]
            if len(streams) != len(theirs_streams):
                problems.append("stream count")
            for a, s in zip(streams, theirs_streams):
                if a["cell_count"] != s["cell_count"]:
                    problems.append("cells")
                if not a["cell_count"]:
                    continue
                if a["v_trans"] != s["v_trans"] or a["n_layer"] != s["n_layer"]:
                    problems.append("v_trans/n_layer")
                for la, ls in zip(a["layers"], s["layers"]):
                    for k, v in la.items():
                        if ls.get(k) != v:
                            problems.append("%s: %s != %s" % (k, ls.get(k), v))
        print("%-70s %s" % (f, "agrees" if not problems else "DIFFERS: " + "; ".join(problems[:5])))
        bad += bool(problems)
    print("%d passed, %d failed" % (len(files) - bad, bad))
    return 1 if bad or not files else 0


if __name__ == "__main__":
    sys.exit(main())
