"""Real mlx-lm prompt-cache files for kvsnap's tests, from tiny random models (no download).

    python3 make_caches.py OUT_DIR            (run by tests/mlx/make-bed.sh with the bed's venv)

Writes OUT_DIR/<version>/<name>.safetensors with mlx-lm's own save_prompt_cache, and next to each
<name>.json: what that same mlx-lm says when it loads the file back (load_prompt_cache): the class,
offset and state arrays (dtype, shape) of every layer, plus the tensors mx.load lists. That JSON is
the oracle `kvsnap info --json` is compared with (tests/mlx/bed_test.py).

The installed mlx-lm makes the newest files. Older mlx-lm releases (pure Python, installed by
make-bed.sh with --no-deps --target into <venv>/old/mlx-lm-<version>) are run in a child process on
the same mlx, for the older file formats: 0.31.3 (meta_state strings), 0.30.5 (the same, the last
release with MambaCache and without CacheList loading) and 0.28.0 (meta_state with `step`).
"""
import json
import os
import subprocess
import sys

OLD_VERSIONS = ["0.31.3", "0.30.5", "0.28.0"]


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
        for attr in ("left_padding", "lengths"):
            if getattr(c, attr, None) is not None:
                out[attr] = describe(getattr(c, attr))
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


def save_keys_values(out, name, cache):
    """The same cache as mlx-lm 0.18.2 .. 0.19.0's cache_prompt saved it (mlx-examples #979: plain
    mx.save_safetensors of "<i>_keys"/"<i>_values" cut to offset, no class list), which no
    load_prompt_cache reads: the oracle JSON is written from the cache objects, and bed_test.py
    compares moves of it with kv_bf16 (the same cache saved by save_prompt_cache)."""
    import mlx.core as mx

    path = os.path.join(out, name + ".safetensors")
    arrays = {}
    for i, c in enumerate(cache):
        arrays["%d_keys" % i] = c.state[0][..., : c.offset, :]
        arrays["%d_values" % i] = c.state[1][..., : c.offset, :]
    meta = {"model": "tiny-random-llama", "chat_template": "{{ messages }}", "tokenizer_config": '{"trust_remote_code": null}',
            "max_kv_size": "None"}
    mx.save_safetensors(path, arrays, meta)
    oracle = {
        "layers": [{"class": "KVCache", "offset": c.offset, "keys": describe(arrays["%d_keys" % i]),
                    "values": describe(arrays["%d_values" % i])} for i, c in enumerate(cache)],
        "user_metadata": meta,
        "raw_metadata": meta,
        "tensors": {k: describe(v) for k, v in arrays.items()},
        "file_bytes": os.path.getsize(path),
        "reference": "kv_bf16.safetensors",
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
        if full and dname == "bf16":
            save_keys_values(out, "keys_values_bf16", cache)
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
    k = lambda n, d=64: mx.random.normal((1, 2, n, d)).astype(mx.bfloat16)
    # ChunkedKVCache (llama4's), fed directly: 12 rows of a 16-token chunk.
    ch = C.ChunkedKVCache(chunk_size=16)
    ch.update_and_fetch(k(12), k(12))
    save(out, "chunked_bf16", [ch, ch])
    # A tiny random Mamba: MambaCache up to mlx-lm 0.30.5, ArraysCache(2) after (conv and SSM state).
    save(out, "mamba_bf16", tiny_mamba(mx.bfloat16))
    import mlx_lm

    if tuple(int(x) for x in mlx_lm.__version__.split(".")[:2]) >= (0, 31):
        # CacheList loads from mlx-lm 0.31.0 on: two KV caches with different head dims, and a
        # quantized cache next to a wrapped ring.
        kv1, kv2 = C.KVCache(), C.KVCache()
        kv1.update_and_fetch(k(9), k(9))
        kv2.update_and_fetch(k(9, 32), k(9, 32))
        save(out, "cachelist_bf16", [C.CacheList(kv1, kv2)])
        kv3, rot = C.KVCache(), C.RotatingKVCache(max_size=8, keep=2)
        kv3.update_and_fetch(k(11), k(11))
        for i in range(11):
            rot.update_and_fetch(k(1, 32), k(1, 32))
        save(out, "cachelist_mixed", [C.CacheList(kv3.to_quantized(group_size=32, bits=4), rot)])
        # SSM state and attention in one layer, as falcon_h1 makes: CacheList(ArraysCache(2), KVCache).
        ssm, kv5 = C.ArraysCache(2), C.KVCache()
        ssm[0] = mx.random.normal((1, 3, 40)).astype(mx.bfloat16)
        ssm[1] = mx.random.normal((1, 2, 8, 4)).astype(mx.float32)
        kv5.update_and_fetch(k(6), k(6))
        save(out, "cachelist_hybrid", [C.CacheList(ssm, kv5), C.CacheList(ssm, kv5)])
        # A hybrid (as lfm2 makes): attention layers next to a one-array conv state.
        kv4 = C.KVCache()
        kv4.update_and_fetch(k(7), k(7))
        conv = C.ArraysCache(1)
        conv[0] = mx.random.normal((1, 3, 96)).astype(mx.bfloat16)
        save(out, "hybrid_bf16", [kv4, conv, kv4])
    if not full:
        return
    # ChunkedKVCache past its chunk: 20 tokens, the first 4 trimmed (start_position 4).
    ch = C.ChunkedKVCache(chunk_size=16)
    ch.update_and_fetch(k(20), k(20))
    ch.maybe_trim_front()
    save(out, "chunked_trimmed_bf16", [ch])
    ac = C.ArraysCache(2)
    ac[0] = mx.random.normal((1, 3, 48)).astype(mx.bfloat16)
    ac[1] = mx.random.normal((1, 4, 16, 8)).astype(mx.float32)
    save(out, "arrays_mixed", [ac])
    # Batch state older layouts cannot hold: left_padding.
    ap = C.ArraysCache(2, left_padding=[1])
    ap[0] = mx.random.normal((1, 3, 48)).astype(mx.bfloat16)
    ap[1] = mx.random.normal((1, 4, 16, 8)).astype(mx.bfloat16)
    save(out, "arrays_padded", [ap])


def tiny_mamba(dtype):
    import mlx.core as mx
    from mlx_lm.models.mamba import Model, ModelArgs

    args = ModelArgs(model_type="mamba", vocab_size=64, hidden_size=32, intermediate_size=64, state_size=8,
                     num_hidden_layers=2, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4)
    model = Model(args)
    model.set_dtype(dtype)
    cache = model.make_cache()
    model(mx.array([[(1 + i) % 64 for i in range(13)]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


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
