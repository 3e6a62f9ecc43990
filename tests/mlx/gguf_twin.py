"""The GGUF twin: an mlx-lm model with the very weights of a kvsnap-mkmodel GGUF, so llama.cpp and
mlx-lm compute the same function of the same token ids (issue 15 part 5).

mx.load reads the GGUF (f16/f32 tensors). llama.cpp's converter permuted the Q and K projection rows
of llama-family models so that its NORM RoPE (adjacent pairs 2j, 2j+1) equals HF's rotate-half RoPE
(pairs j, j + D/2) that mlx-lm runs (traditional=False); the twin undoes that permutation per head:
    gguf row h*D + 2j + t  ==  HF row h*D + t*D/2 + j.
NEOX-rope families (qwen2, qwen3) were not permuted by the converter and are loaded as they are.
qwen3 adds per-head RMS norms on Q and K (before the rope) and a head dim free of the width. phi3
has fused Q|K|V and gate|up projections (the GGUF's rows are mlx-lm's qkv_proj / gate_up_proj rows)
and may rope only the first rope.dimension_count dims of a head (partial_rotary_factor). command-r
(mlx-lm cohere.py) runs NORM rope in llama.cpp and traditional=True (adjacent pairs) in mlx-lm, and
its converter did not permute: loaded as it is; one LayerNorm without bias feeds attention and FFN in
parallel, the output is tied to the embeddings and scaled by logit_scale. olmo2 (NEOX, no
permutation) has no pre-norms: RMS norms over the whole Q and K projections (before the rope), after
attention and after the FFN.
gemma2: the same norms and scaled, tied embedding, attention and final logit soft-capping, and no
sliding window in mlx-lm (llama.cpp's SWA layers see the last sliding_window positions: the twin
agrees while the prompt fits in the window). gemma3 (mlx-lm's gemma3_text): NEOX rope (not permuted), Q/K RMS norms, norms stored by the
converter as 1 + w (mlx-lm's RMSNorm adds the 1 itself: the twin takes 1 from each), the embedding
scaled by sqrt(n_embd) and tied to the output, sliding-window layers (sliding_window,
sliding_window_pattern: every pattern-th layer global) with their own rope base (rope.freq_base_swa,
llama.cpp's default 10000), and 1/sqrt(head_dim) as attention scale (query_pre_attn_scalar).
Weights are kept in float32 (exact from f16), so mlx-lm computes in float32 like llama.cpp's CPU
backend does with f16 weights.
"""
import mlx.core as mx
import numpy as np


def _meta_int(md, key):
    return int(np.array(md[key]).item())


def _meta_float(md, key):
    return float(np.array(md[key]).item())


def unpermute_rows(w, n_head):
    """GGUF (interleaved-pair) rows of a Q/K projection -> HF (split-half) rows."""
    out_dim = w.shape[0]
    d = out_dim // n_head
    rest = w.shape[1:]
    return w.reshape(n_head, d // 2, 2, *rest).swapaxes(1, 2).reshape(out_dim, *rest)


def load_twin(gguf_path, permute=None):
    """Returns (model, info) for a llama, qwen2, qwen3, phi3, olmo2 or command-r GGUF made by kvsnap-mkmodel. `permute` overrides
    whether Q/K rows are un-permuted (the arch decides by default; the override is the control)."""
    w, md = mx.load(gguf_path, return_metadata=True)
    arch = str(md["general.architecture"])
    a = arch
    n_layer = _meta_int(md, a + ".block_count")
    n_embd = _meta_int(md, a + ".embedding_length")
    n_head = _meta_int(md, a + ".attention.head_count")
    n_head_kv = _meta_int(md, a + ".attention.head_count_kv")
    head_dim = _meta_int(md, a + ".attention.key_length")
    n_ff = _meta_int(md, a + ".feed_forward_length")
    eps_key = a + (".attention.layer_norm_epsilon" if arch == "command-r" else ".attention.layer_norm_rms_epsilon")
    eps = _meta_float(md, eps_key)
    theta = _meta_float(md, a + ".rope.freq_base")
    n_vocab = w["token_embd.weight"].shape[0]
    common = dict(hidden_size=n_embd, num_hidden_layers=n_layer, intermediate_size=n_ff,
                  num_attention_heads=n_head, num_key_value_heads=n_head_kv, rms_norm_eps=eps,
                  vocab_size=n_vocab, rope_theta=theta, tie_word_embeddings=False)
    if arch == "llama":
        from mlx_lm.models.llama import Model, ModelArgs
        model = Model(ModelArgs(model_type="llama", head_dim=head_dim, **common))
        permuted = True if permute is None else permute
    elif arch == "qwen2":
        from mlx_lm.models.qwen2 import Model, ModelArgs
        if n_head * head_dim != n_embd:
            raise ValueError("qwen2 twin needs n_embd == n_head * head_dim")
        model = Model(ModelArgs(model_type="qwen2", **common))
        permuted = False if permute is None else permute
    elif arch == "phi3":
        from mlx_lm.models.phi3 import Model, ModelArgs
        n_rot = _meta_int(md, a + ".rope.dimension_count")
        model = Model(ModelArgs(model_type="phi3", partial_rotary_factor=n_rot / head_dim, **common))
        permuted = False if permute is None else permute
    elif arch == "qwen3":
        from mlx_lm.models.qwen3 import Model, ModelArgs
        model = Model(ModelArgs(model_type="qwen3", head_dim=head_dim,
                                max_position_embeddings=_meta_int(md, a + ".context_length"), **common))
        permuted = False if permute is None else permute
    elif arch == "olmo2":
        from mlx_lm.models.olmo2 import Model, ModelArgs
        model = Model(ModelArgs(model_type="olmo2", head_dim=head_dim, **common))
        permuted = False if permute is None else permute
    elif arch == "command-r":
        from mlx_lm.models.cohere import Model, ModelArgs
        if n_head * head_dim != n_embd:
            raise ValueError("command-r twin needs n_embd == n_head * head_dim")
        common.pop("rms_norm_eps")
        common.pop("tie_word_embeddings")
        model = Model(ModelArgs(model_type="cohere", layer_norm_eps=eps,
                                logit_scale=_meta_float(md, a + ".logit_scale"), **common))
        permuted = False if permute is None else permute
    elif arch == "gemma3":
        from mlx_lm.models.gemma3_text import Model, ModelArgs
        pattern = _meta_int(md, a + ".attention.sliding_window_pattern")
        base_swa = _meta_float(md, a + ".rope.freq_base_swa") if a + ".rope.freq_base_swa" in md else 10000.0
        if n_embd ** 0.5 != mx.array(n_embd ** 0.5, mx.bfloat16).item():
            raise ValueError("gemma3 twin: mlx-lm rounds sqrt(n_embd) to bf16; pick n_embd with an exact root")
        common.pop("tie_word_embeddings")
        # from_dict drops what an older mlx-lm's ModelArgs lacks (0.28.0: max_position_embeddings)
        model = Model(ModelArgs.from_dict(dict(model_type="gemma3_text", head_dim=head_dim,
                                               query_pre_attn_scalar=head_dim, rope_local_base_freq=base_swa,
                                               sliding_window=_meta_int(md, a + ".attention.sliding_window"),
                                               sliding_window_pattern=pattern,
                                               max_position_embeddings=_meta_int(md, a + ".context_length"), **common)))
        permuted = False if permute is None else permute
    elif arch == "gemma2":  # mlx-lm's gemma2: no sliding window, every layer attends to every position
        from mlx_lm.models.gemma2 import Model, ModelArgs
        common.pop("tie_word_embeddings")
        model = Model(ModelArgs.from_dict(dict(
            model_type="gemma2", head_dim=head_dim, query_pre_attn_scalar=head_dim,
            attn_logit_softcapping=_meta_float(md, a + ".attn_logit_softcapping"),
            final_logit_softcapping=_meta_float(md, a + ".final_logit_softcapping"), **common)))
        permuted = False if permute is None else permute
    else:
        raise ValueError("no twin for arch %s" % arch)

    f32 = {k: v.astype(mx.float32) for k, v in w.items()}
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
                 "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
                 "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
                 "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
                 "attn_v.bias": "self_attn.v_proj.bias",
                 "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
                 "post_attention_norm.weight": "post_attention_layernorm.weight",
                 "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
                 "attn_qkv.weight": "self_attn.qkv_proj.weight",
                 "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
                 "ffn_down.weight": "mlp.down_proj.weight"}
    if arch in ("gemma2", "gemma3"):
        per_layer.update({"ffn_norm.weight": "pre_feedforward_layernorm.weight",
                          "post_attention_norm.weight": "post_attention_layernorm.weight",
                          "post_ffw_norm.weight": "post_feedforward_layernorm.weight"})
    weights = []
    for k, v in f32.items():
        if arch in ("gemma2", "gemma3") and k.endswith("norm.weight"):
            v = v - 1.0  # the converter stored 1 + w
        if k in names:
            weights.append((names[k], v))
            continue
        parts = k.split(".", 2)
        if parts[0] != "blk" or parts[2] not in per_layer:
            raise ValueError("%s: tensor %s has no place in the twin" % (gguf_path, k))
        if permuted and parts[2].startswith("attn_q."):
            v = unpermute_rows(v, n_head)
        if permuted and parts[2].startswith("attn_k."):
            v = unpermute_rows(v, n_head_kv)
        if permuted and parts[2] == "attn_qkv.weight":
            nq, nk = n_head * head_dim, n_head_kv * head_dim
            v = mx.concatenate([unpermute_rows(v[:nq], n_head), unpermute_rows(v[nq:nq + nk], n_head_kv), v[nq + nk:]])
        if arch == "phi3" and parts[2] == "ffn_up.weight":  # gate|up, fused
            weights.append(("model.layers.%s.mlp.gate_up_proj.weight" % parts[1], v))
            continue
        weights.append(("model.layers.%s.%s" % (parts[1], per_layer[parts[2]]), v))
    if arch == "gemma3" and "lm_head.weight" not in dict(weights):
        model.sanitize({})  # ties the output to the embedding, as for a checkpoint without lm_head
    model.load_weights(weights, strict=True)
    mx.eval(model.parameters())
    info = dict(arch=arch, n_layer=n_layer, n_head_kv=n_head_kv, head_dim=head_dim, n_vocab=n_vocab)
    if arch in ("gemma2", "gemma3"):
        info.update(n_swa=_meta_int(md, a + ".attention.sliding_window"))
    return model, info


def log_softmax64(x):
    x = np.array(x, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def mean_kl(ref, got):
    """Mean over rows of KL(softmax(ref) || softmax(got)), float64 (docs/fidelity.md)."""
    lr, lg = log_softmax64(ref), log_softmax64(got)
    return float(np.mean(np.sum(np.exp(lr) * (lr - lg), axis=-1)))
