"""Compression of mlx-lm prompt-cache tensors by dtype: zstd -1 of the raw bytes, of their byte planes
each in its own frame (what kvsnap's shuffle filter does), and of the planes in one frame. What
format/snapshot_mlx.cc's filter choice rests on (docs/mlx.md, "The snapshot store").

    python3 tests/mlx/measure_codecs.py FILE.safetensors...   (needs numpy and the zstd command)
"""
import json, struct, subprocess, sys
import numpy as np
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b, 0)[0]
    h = json.loads(b[8:8+n])
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]
        yield k, v["dtype"], v["shape"], b[8+n+s:8+n+e]
def z(data):
    return len(subprocess.run(["zstd", "-1", "-c", "-q"], input=data, capture_output=True).stdout)
def planes(data, E):
    a = np.frombuffer(data[: len(data)//E*E], dtype=np.uint8).reshape(-1, E)
    return [a[:, i].tobytes() for i in range(E)]
tot = {}
for path in sys.argv[1:]:
    for k, dt, shape, d in tensors(path):
        if len(shape) != 4: continue
        kind = {"U32": "codes"}.get(dt, "float-" + dt)
        if len(k.split(".")) == 3 and k.endswith(".1"): kind = "scales-" + dt
        if len(k.split(".")) == 3 and k.endswith(".2"): kind = "biases-" + dt
        E = 4 if dt in ("U32", "F32") else 2
        r = tot.setdefault(kind, [0, 0, 0, 0])
        r[0] += len(d); r[1] += z(d); r[2] += sum(z(p) for p in planes(d, E)); r[3] += z(b"".join(planes(d, E)))
for kind, (raw, plain, sep, one) in sorted(tot.items()):
    print("%-14s raw %9d  zstd %5.3fx  planes-separate %5.3fx  planes-one-frame %5.3fx" % (kind, raw, raw/plain, raw/sep, raw/one))
