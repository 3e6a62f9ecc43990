#include "migrate/cross_engine_archs.h"

namespace kvsnap {
namespace {

constexpr RopeKind N = RopeKind::kNorm, X = RopeKind::kNeox;
constexpr KMap P = KMap::kPermute, C = KMap::kCopy;

// Sources: llama.cpp 3.22.1 (src/llama-model.cpp llama_model_rope_type; conversion/<file>.py
// <Class>.modify_tensors) and mlx-lm 0.32.2 (mlx_lm/models/<module>.py Attention.__init__).
// "no permute": the converter class has no Q/K row permutation (TextModel.modify_tensors only
// renames). Keep a row only with both sources read; "proven" names the oracle test moving real
// sessions between the two engines.
constexpr CrossEngineArch kArchs[] = {
    // conversion/llama.py LlamaModel.modify_tensors: undo_permute = True -> LlamaModel.permute (HF
    // LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, InternLM3 (internlm.py), ...);
    // mistral.py MistralModel (native consolidated weights, already in interleaved order) also
    // writes arch llama. mlx-lm llama.py initialize_rope(head_dim, traditional=rope_traditional,
    // default False); mistral -> llama (utils.MODEL_REMAPPING), mixtral.py, internlm3.py likewise.
    {"llama", N, true, "llama", false, false, P, "oracle.mlx_cross_engine (head dim 64 and 128)"},
    // granite.py GraniteModel(LlamaModel) keeps undo_permute; mlx-lm granite.py initialize_rope(head_dim, .., False, ..).
    {"granite", N, true, "granite", false, false, P, ""},
    // granite.py GraniteMoeModel.modify_tensors -> super() (LlamaModel.permute); mlx-lm granitemoe.py traditional False.
    {"granitemoe", N, true, "granitemoe", false, false, P, ""},
    // llama.py SmolLM3Model(LlamaModel); mlx-lm smollm3.py wraps llama.LlamaModel (traditional False). Its NoPE
    // layers rope nothing, but their K rows are still in the converter's permuted order.
    {"smollm3", N, true, "smollm3", false, false, P, ""},
    // olmo.py OlmoModel.modify_tensors: LlamaModel.permute of q_proj/k_proj; mlx-lm olmo.py rope_traditional False.
    {"olmo", N, true, "olmo", false, false, P, ""},
    // minicpm.py MiniCPMModel.modify_tensors: LlamaModel.permute; mlx-lm minicpm.py rope_traditional False.
    {"minicpm", N, true, "minicpm", false, false, P, ""},
    // internlm.py InternLM2Model.modify_tensors: wqkv split, LlamaModel.permute(k, n_head, n_kv_head) (per KV
    // head); mlx-lm internlm2.py initialize_rope(head_dim, traditional=rope_traditional, default False).
    {"internlm2", N, true, "internlm2", false, false, P, ""},

    // command_r.py CommandR2Model: no permute; mlx-lm cohere.py nn.RoPE(head_dim, traditional=True).
    {"command-r", N, false, "cohere", true, false, C, "oracle.mlx_cross_engine"},
    // ernie.py Ernie4_5Model.modify_tensors: splits qkv_proj, no permute; mlx-lm ernie4_5.py
    // initialize_rope(head_dim, traditional=True).
    {"ernie4_5", N, false, "ernie4_5", true, false, C, ""},

    // qwen.py Qwen2Model: no permute; mlx-lm qwen2.py initialize_rope(head_dim, traditional=rope_traditional False).
    {"qwen2", X, false, "qwen2", false, false, C, "oracle.mlx_cross_engine"},
    // qwen.py Qwen2MoeModel: no Q/K permute (experts only); mlx-lm qwen2_moe.py nn.RoPE(head_dim, rope_traditional False).
    {"qwen2moe", X, false, "qwen2_moe", false, false, C, ""},
    // qwen.py Qwen3Model(Qwen2Model): no permute; mlx-lm qwen3.py initialize_rope(head_dim, traditional=False).
    {"qwen3", X, false, "qwen3", false, false, C, "oracle.mlx_cross_engine"},
    // qwen.py Qwen3MoeModel(Qwen2MoeModel): no permute; mlx-lm qwen3_moe.py nn.RoPE(head_dim, traditional=False).
    {"qwen3moe", X, false, "qwen3_moe", false, false, C, ""},
    // phi.py Phi2Model: no permute; mlx-lm phi.py nn.RoPE(partial_rotary_factor * head_dim, traditional=False).
    {"phi2", X, false, "phi", false, true, C, ""},
    // phi.py Phi3MiniModel: no permute (fused qkv kept); mlx-lm phi3.py nn.RoPE(rope_dim, rope_traditional False)
    // or SuScaledRoPE (rope_utils.py: traditional=False), rope_dim = partial_rotary_factor * head_dim.
    {"phi3", X, false, "phi3", false, true, C, "oracle.mlx_cross_engine (rope over 96 of 128 dims)"},
    // gemma.py GemmaModel: no permute (norm + 1 only); mlx-lm gemma.py nn.RoPE(head_dim, rope_traditional False).
    {"gemma", X, false, "gemma", false, false, C, ""},
    // gemma.py Gemma2Model / Gemma3Model.modify_tensors: norm shift (+1) and vocab cut only, no permute;
    // mlx-lm gemma2.py nn.RoPE(head_dim, rope_traditional False), gemma3_text.py initialize_rope(head_dim,
    // traditional=False). Both are iSWA models: cross_engine_k_order refuses them before asking the table
    // until the two KV sections move.
    {"gemma2", X, false, "gemma2", false, false, C, ""},
    {"gemma3", X, false, "gemma3_text", false, false, C, ""},
    // starcoder.py StarCoder2Model: no permute; mlx-lm starcoder2.py nn.RoPE(head_dim, traditional=False).
    {"starcoder2", X, false, "starcoder2", false, false, C, ""},
    // olmo.py Olmo2Model: no permute; mlx-lm olmo2.py initialize_rope(head_dim, rope_traditional False).
    {"olmo2", X, false, "olmo2", false, false, C, "oracle.mlx_cross_engine"},
    // stablelm.py StableLMModel: no permute; mlx-lm stablelm.py nn.RoPE(partial_rotary_factor * head_dim, False).
    {"stablelm", X, false, "stablelm", false, true, C, ""},
    // exaone.py ExaoneModel: no permute; mlx-lm exaone.py initialize_rope(head_dim, rope_traditional False).
    {"exaone", X, false, "exaone", false, false, C, ""},
};

}  // namespace

std::span<const CrossEngineArch> cross_engine_archs() { return kArchs; }

const CrossEngineArch* find_cross_engine_arch(const std::string& arch) {
  for (const CrossEngineArch& a : kArchs) {
    if (arch == a.arch) return &a;
  }
  return nullptr;
}

Result<const CrossEngineArch*> cross_engine_arch_for(const ModelProfile& p, const std::string& who) {
  const CrossEngineArch* a = find_cross_engine_arch(p.arch);
  if (!a) {
    return Status::NotSupported(who + ": arch '" + p.arch + "' (rope " + rope_kind_name(p.rope) +
                                ") is not in kvsnap's cross-engine table: how its HF -> GGUF converter and "
                                "mlx-lm lay out K was not audited, and a wrong guess moves a session silently "
                                "wrong (docs/mlx.md lists the archs that move)");
  }
  // The K a session holds was roped with llama.cpp's short factors when each sequence's context was
  // within the original one (llama_model::get_rope_factors), and mlx-lm's SuScaledRoPE always ropes
  // with the long ones: a moved cache would sit at other rotations than the new queries (a review's
  // finding; Phi-3.5-mini, Phi-3-mini-128k, Phi-4-mini).
  if (p.rope_long_short_factors) {
    return Status::NotSupported(who + ": the GGUF has long and short rope factors (LongRoPE): llama.cpp ropes K with "
                                "the short ones up to the original context and mlx-lm always with the long ones, "
                                "so a session's K means another thing in the other engine; not moved");
  }
  if (p.rope != a->rope) {
    return Status::NotSupported(who + ": the GGUF's rope is " + rope_kind_name(p.rope) + ", but arch '" + p.arch +
                                "' runs " + rope_kind_name(a->rope) + " rope in llama.cpp: not the model audited");
  }
  if (!a->partial_rotary) {
    for (const LayerProfile& l : p.layers) {
      if (l.has_kv && (l.head_dim_k % 2 != 0 || (p.n_rot && p.n_rot != l.head_dim_k))) {
        return Status::NotSupported(who + ": rope over " + std::to_string(p.n_rot) + " of " +
                                    std::to_string(l.head_dim_k) + " K dims, but mlx-lm's " + a->mlx_module +
                                    ".py ropes the whole head: the K layout is not known for it");
      }
    }
  }
  return a;
}

}  // namespace kvsnap
