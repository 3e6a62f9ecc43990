#!/usr/bin/env python3
# Writes a large ggsq v3 slot file for timing rotation detection (docs/rotation-detection.md):
#   python3 tests/tools/make_big_slot.py OUT CELLS     (32768 cells: 2.3 GB)
# and its model: kvsnap-mkmodel --out big.gguf --metadata-only --n-layer 32 --n-embd 4096 --n-head 32 --n-head-kv 8 --head-dim 128
# A ggsq v3 slot file shaped like an 8B model's q8_0 cache: 32 layers, 8 KV heads x 128,
# N cells; rows are valid q8_0 blocks (scale 1/64, random int8) drawn from a small pool.
import os, random, struct, sys
out, cells = sys.argv[1], int(sys.argv[2])
n_layer, n = 32, 1024
row_bytes = n // 32 * 34
r = random.Random(5)
pool = []
for _ in range(64):
    b = bytearray()
    for _ in range(n // 32):
        b += struct.pack('<H', 0x2400) + bytes(r.getrandbits(8) for _ in range(32))
    pool.append(bytes(b))
chunk = b''.join(pool[i % 64] for i in range(4096))
with open(out, 'wb') as f:
    f.write(struct.pack('<III', 0x67677371, 3, cells))
    f.write(struct.pack('<i', 1) * cells)
    f.write(struct.pack('<II', 1, cells))
    for c in range(cells):
        f.write(struct.pack('<iIi', c, 1, 0))
    f.write(struct.pack('<II', 0, n_layer))
    for side in range(2):
        for il in range(n_layer):
            f.write(struct.pack('<iQ', 8, row_bytes))
            left = cells
            while left:
                k = min(left, 4096)
                f.write(chunk[:k * row_bytes])
                left -= k
