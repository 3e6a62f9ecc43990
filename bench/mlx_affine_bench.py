#!/usr/bin/env python3
"""The baseline of kvsnap-bench's MLX rows: mx.quantize / mx.dequantize on MLX's CPU backend.

Run by kvsnap-bench (--mlx-python) with the interpreter of an MLX install (mlx[cpu] on Linux, e.g.
~/.cache/kvsnap-mlx-venv). Prints one line per cell: "<op> <bits> <group> <GB/s>", GB/s of input
bytes (1e9 B) per second of this process's CPU time (all of MLX's threads), the best of the
rounds, where the input is what kvsnap's row of the same name reads: the float rows (quantize),
the packed codes with their scales and biases (dequantize, requantize).
"""
import argparse
import time

import mlx.core as mx


def best_rate(fn, nbytes, seconds, rounds):
    mx.eval(fn())  # warm up
    best = 0.0
    for _ in range(rounds):
        done, t0, c0 = 0, time.monotonic(), time.process_time()
        while True:
            mx.eval(fn())
            done += nbytes
            if time.monotonic() - t0 >= seconds / rounds:
                break
        best = max(best, done / max(1e-9, time.process_time() - c0) / 1e9)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--bits", default="4,8")
    ap.add_argument("--from-bits", type=int, default=8, help="requantize: the source bits")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    mx.set_default_device(mx.cpu)
    x = (mx.random.normal((a.rows, a.dim)) * 2.0).astype(getattr(mx, a.dtype))
    mx.eval(x)

    def nbytes(*arrs):
        return sum(t.nbytes for t in arrs)

    for bits in [int(b) for b in a.bits.split(",")]:
        q = mx.quantize(x, group_size=a.group, bits=bits)
        mx.eval(q)
        r = best_rate(lambda: mx.quantize(x, group_size=a.group, bits=bits), x.nbytes, a.seconds, a.rounds)
        print(f"quantize {bits} {a.group} {r:.4f}", flush=True)
        r = best_rate(lambda: mx.dequantize(*q, group_size=a.group, bits=bits), nbytes(*q), a.seconds, a.rounds)
        print(f"dequantize {bits} {a.group} {r:.4f}", flush=True)
        if bits != a.from_bits:
            src = mx.quantize(x, group_size=a.group, bits=a.from_bits)
            mx.eval(src)
            r = best_rate(
                lambda: mx.quantize(mx.dequantize(*src, group_size=a.group, bits=a.from_bits), group_size=a.group,
                                    bits=bits), nbytes(*src), a.seconds, a.rounds)
            print(f"requantize {bits} {a.group} {r:.4f}", flush=True)


if __name__ == "__main__":
    main()
