"""Real mlx-lm prompt-cache files for kvsnap's tests, from tiny random models (no download).

    python3 make_caches.py OUT_DIR            (run by tests/mlx/make-bed.sh with the bed's venv)

Writes OUT_DIR/<version>/<name>.safetensors with mlx-lm's own save_prompt_cache, and next to each
<name>.json: what that same mlx-lm says when it loads the file back (load_prompt_cache): the class,
offset and state arrays (dtype, shape) of every layer, plus the tensors mx.load lists. That JSON is
the oracle `kvsnap info --json` is compared with (tests/mlx/bed_test.py).

The installed mlx-lm makes the newest files. Older mlx-lm releases (pure Python, installed by
make-bed.sh with --no-deps --target into <venv>/old/mlx-lm-<version>) are run in a child process on
the same mlx, for the older file formats: 0.31.3 (meta_state strings) and 0.28.0 (meta_state with
`step`).
"""
import json
import os
import subprocess
import sys

OLD_VERSIONS = ["0.31.3", "0.28.0"]


def describe(x):
    """The oracle's view of one state value: arrays as dtype/shape, scalars as themselves."""
    import mlx.core as mx

    if isinstance(x, mx.array):
        return {"dtype": str(x.dtype).replace("mlx.core.", ""), "shape": list(x.shape)}
    if isinstance(x, (list, tuple)):
        return [describe(e) for e in x]
    return x


def layer_oracle(c):
    """What mlx-lm's loaded object says about one layer."""
    from mlx_lm.models import cache as C

    out = {"class": type(c).__name__}
    for attr in ("offset", "keep", "max_size", "_idx", "group_size", "bits", "chunk_size", "start_position"):
        if hasattr(c, attr) and isinstance(getattr(c, attr), int):
            out[attr] = getattr(c, attr)
    if isinstance(c, C.CacheList):
        out["caches"] = [layer_oracle(s) for s in c.caches]
    elif isinstance(c, C.ArraysCache):
        out["arrays"] = describe(list(c.cache))
    else:
        keys, values = getattr(c, "keys", None), getattr(c, "values", None)
        if keys is not None:
            out["keys"] = describe(keys)
            out["values"] = describe(values)
    return out


def write_oracle(path):
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.models.cache import load_prompt_cache

    cache, meta = load_prompt_cache(path, return_metadata=True)
    arrays, raw_meta = mx.load(path, return_metadata=True)
    oracle = {
        "mlx_lm_version": mlx_lm.__version__,
        "mlx_version": mx.__version__,
        "layers": [layer_oracle(c) for c in cache],
        "user_metadata": meta,
        "raw_metadata": raw_meta,
        "tensors": {k: describe(v) for k, v in arrays.items()},
        "file_bytes": os.path.getsize(path),
    }
    with open(path[: -len(".safetensors")] + ".json", "w") as f:
        json.dump(oracle, f, indent=1, sort_keys=True)


def tiny_llama(dtype, head_dim=128, layers=2):
    import mlx.core as mx
    from mlx_lm.models.llama import Model, ModelArgs

    args = ModelArgs(model_type="llama", hidden_size=2 * head_dim, num_hidden_layers=layers, intermediate_size=128,
                     num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=64)
    model = Model(args)
    model.set_dtype(dtype)
    return model


def prefill(model, cache, n, start=1):
    import mlx.core as mx

    model(mx.array([[(start + i) % 64 for i in range(n)]]), cache=cache)
    mx.eval([getattr(c, "keys", None) for c in cache if getattr(c, "keys", None) is not None])


def save(out, name, cache, meta=None):
    from mlx_lm.models.cache import save_prompt_cache

    path = os.path.join(out, name + ".safetensors")
    save_prompt_cache(path, cache, meta if meta is not None else {"model": "tiny-random-llama",
                                                                  "tokenizer_config": '{"trust_remote_code": false}'})
    write_oracle(path)


def make_all(out, full):
    """Every file this mlx-lm can make; `full` adds the whole bits x group grid and the extra classes."""
    import mlx.core as mx
    from mlx_lm.models import cache as C

    mx.random.seed(0)
    for dname, dtype in (("bf16", mx.bfloat16), ("f16", mx.float16), ("f32", mx.float32)):
        model = tiny_llama(dtype)
        cache = C.make_prompt_cache(model)
        prefill(model, cache, 37)
        save(out, "kv_" + dname, cache)
        if dname != "bf16":
            save(out, "q4g64_" + dname, [c.to_quantized(group_size=64, bits=4) for c in cache])
            continue
        grid = [(b, g) for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)] if full else [(4, 64), (8, 32), (3, 128)]
        for bits, gs in grid:
            save(out, "q%dg%d_bf16" % (bits, gs), [c.to_quantized(group_size=gs, bits=bits) for c in cache])
        # A ring that has wrapped: 30 tokens of prompt into a 16-slot ring, then 5 decode steps.
        rot = [C.RotatingKVCache(max_size=16, keep=4) for _ in model.layers]
        prefill(model, rot, 30)
        for i in range(5):
            prefill(model, rot, 1, start=40 + i)
        save(out, "rotating_bf16", rot)
        # Empty user metadata.
        save(out, "kv_bf16_nometa", cache, {})
    if not full:
        return
    k = lambda n, d=64: mx.random.normal((1, 2, n, d)).astype(mx.bfloat16)
    # ChunkedKVCache (llama4's), CacheList of two KV caches, ArraysCache (SSM state), fed directly.
    ch = C.ChunkedKVCache(chunk_size=16)
    ch.update_and_fetch(k(12), k(12))
    save(out, "chunked_bf16", [ch, ch])
    kv1, kv2 = C.KVCache(), C.KVCache()
    kv1.update_and_fetch(k(9), k(9))
    kv2.update_and_fetch(k(9, 32), k(9, 32))
    save(out, "cachelist_bf16", [C.CacheList(kv1, kv2)])
    ac = C.ArraysCache(2)
    ac[0] = mx.random.normal((1, 3, 48)).astype(mx.bfloat16)
    ac[1] = mx.random.normal((1, 4, 16, 8)).astype(mx.float32)
    save(out, "arrays_mixed", [ac])


def main():
    out = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "--old":
        # Child process: the old mlx-lm is first on sys.path.
        os.makedirs(out, exist_ok=True)
        make_all(out, full=False)
        return
    import mlx_lm

    newest = os.path.join(out, mlx_lm.__version__)
    os.makedirs(newest, exist_ok=True)
    make_all(newest, full=True)
    old_root = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "old")
    for v in OLD_VERSIONS:
        site = os.path.join(old_root, "mlx-lm-" + v)
        if not os.path.isdir(site):
            print("make_caches: no mlx-lm %s at %s: its files are not made" % (v, site), file=sys.stderr)
            continue
        env = dict(os.environ, PYTHONPATH=site)
        subprocess.run([sys.executable, __file__, os.path.join(out, v), "--old"], env=env, check=True)


if __name__ == "__main__":
    main()
