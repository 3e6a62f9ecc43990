#!/usr/bin/env python3
"""Fails when a picture of docs/pictures/ was drawn from other data than the docs hold now.

Each PNG records the SHA-256 of the text it was drawn from (make_pictures.py); this recomputes it
from the current sources (no matplotlib needed) and compares. Exit 1 names the stale pictures and
the command that redraws them."""
import os
import struct
import sys
import zlib  # noqa: F401  (tEXt chunks are uncompressed; kept for zTXt if matplotlib ever writes one)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_pictures as mp  # noqa: E402


def png_text(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG")
    out, i = {}, 8
    while i + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[i:i + 8])
        body = data[i + 8:i + 8 + n]
        if kind == b"tEXt" and b"\0" in body:
            k, v = body.split(b"\0", 1)
            out[k.decode("latin-1")] = v.decode("latin-1")
        i += 12 + n
    return out


def main():
    stale = []
    for name, text in mp.sources().items():
        path = os.path.join(mp.HERE, name)
        if not os.path.exists(path):
            stale.append(f"{name}: missing")
            continue
        got = png_text(path).get(mp.KEY)
        if got != mp.sha(text):
            stale.append(f"{name}: drawn from other data (recorded {got}, current {mp.sha(text)})")
        else:
            print(f"ok   {name} matches its source")
    for s in stale:
        print(f"FAIL {s}")
    if stale:
        print("redraw: python3 docs/pictures/make_pictures.py (needs matplotlib; see its header)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
