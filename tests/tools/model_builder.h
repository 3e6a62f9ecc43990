// Tiny random-weight GGUF models that real llama.cpp loads (v0.5.0, b8121,
// b5640; lfm2 is newer than b5640): the engine behind kvsnap-mkmodel,
// header-only so unit tests can build the same models in memory without
// linking the tool. docs/model-profile.md lists what was verified where.
//
// The tokenizer copies the shape of the shared tiny model: SentencePiece
// ("llama") with <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, a few
// "▁word" tokens, single letters and punctuation, so any prompt tokenizes.
// Weights come from one splitmix64 stream seeded by `seed`: the same spec gives
// the same bytes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "support/gguf_writer.h"

namespace kvsnap::testing {

struct ModelSpec {
  std::string arch = "llama";        // llama | deci | qwen2 | qwen3 | phi3 | command-r | olmo2 | qwen2vl | gemma2 | gemma3 | lfm2
  std::string name = "kvsnap-mkmodel";
  uint32_t n_layer = 4;
  uint32_t n_embd = 256;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  std::vector<uint32_t> n_head_kv_layers;  // non-empty: written as a per-layer array
                                           // (lfm2: 0 marks a short-conv layer; default: every 3rd is attention)
  uint32_t shortconv_l_cache = 3;          // lfm2
  bool lfm2_swa = false;                   // lfm2: write sliding_window = n_swa (attention layers windowed)
  uint32_t head_dim = 64;                  // key_length = value_length
  uint32_t n_rot = 0;                      // rope.dimension_count; 0: head_dim (partial rope below it)
  uint32_t n_ff = 512;
  uint32_t vocab_words = 14;                 // 14: the shared tiny model's 302-token vocabulary
  uint32_t n_ctx_train = 4096;
  uint64_t seed = 1;
  bool f16 = true;                         // 2-D weights f16 (norms and biases stay f32)
  uint32_t n_swa = 128;                    // gemma2/gemma3 sliding window
  float rope_base = 10000.0f;              // rope.freq_base (gemma3: of the global layers)
  float rope_base_swa = 0.0f;              // gemma3: rope.freq_base_swa of the SWA layers (0: not
                                           // written; llama.cpp then takes 10000)
  // gemma3/gemma2: also write attention.sliding_window_pattern (only v0.5.0
  // reads it; b8121 and b5640 hard-code 6 and 2).
  uint32_t swa_pattern = 0;                // 0: do not write
  std::vector<bool> swa_layers;            // non-empty: write the pattern as a bool array
  uint32_t alignment = 0;                  // 0: do not write general.alignment (32)
  bool metadata_only = false;              // no tensors (for metadata tests)
  // Trained-like K/V channel structure (0: off, and the model's bytes are those of a spec
  // without these fields). Per layer and KV head, `outlier_channels` output channels of
  // attn_k are scaled by outlier_scale and of attn_v by sqrt(outlier_scale); every K/V
  // output channel is also scaled by exp(channel_spread * u), u uniform in [-1, 1). Drawn
  // from a stream of its own (seed, layer), so the other weights stay the same.
  uint32_t outlier_channels = 0;
  float outlier_scale = 10.0f;
  float channel_spread = 0.5f;
};

inline const std::vector<std::string>& model_builder_archs() {
  static const std::vector<std::string> k = {"llama",   "deci",   "qwen2",  "qwen3", "phi3",     "command-r", "olmo2",
                                             "qwen2vl", "gemma2", "gemma3", "lfm2"};
  return k;
}

// The "▁word" tokens; --vocab-words takes the first N. The first 14 are the
// shared tiny model's.
inline const std::vector<std::string>& model_builder_words() {
  static const std::vector<std::string> k = {
      "the",     "a",       "of",     "and",    "to",     "in",     "is",      "cache",   "key",     "value",
      "token",   "model",   "session", "snapshot", "it",   "that",   "for",     "on",      "with",    "as",
      "was",     "be",      "by",     "this",   "are",    "or",     "from",    "at",      "an",      "not",
      "have",    "has",     "but",    "they",   "which",  "one",    "you",     "all",     "there",   "can",
      "state",   "file",    "layer",  "head",   "block",  "type",   "load",    "save",    "slot",    "server",
      "prompt",  "context", "memory", "batch",  "sequence", "position", "quant", "float",  "half",    "row",
      "column",  "table",   "store",  "chunk",  "index",  "hash",   "write",   "read",    "time",    "word"};
  return k;
}

namespace detail {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // uniform in [-1, 1)
  float uniform() { return float(double(next() >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0); }

 private:
  uint64_t s_;
};

inline uint32_t kv_heads(const ModelSpec& s, uint32_t il) {
  if (!s.n_head_kv_layers.empty()) return s.n_head_kv_layers[il];
  if (s.arch == "lfm2") return il % 3 == 2 ? s.n_head_kv : 0;
  return s.n_head_kv;
}

// Per output row of layer il's attn_k (is_v false) or attn_v: the trained-like scale
// (ModelSpec::outlier_channels); empty when the spec has none.
inline std::vector<float> kv_row_scale(const ModelSpec& s, uint32_t il, bool is_v) {
  std::vector<float> scale;
  const uint32_t heads = kv_heads(s, il);
  if (s.outlier_channels == 0 || heads == 0) return scale;
  Rng rng(s.seed * 1000003ull + il * 2ull + (is_v ? 1 : 0) + 0x6f75746cull);
  scale.resize(size_t(heads) * s.head_dim);
  for (auto& v : scale) v = std::exp(s.channel_spread * rng.uniform());
  const float big = is_v ? std::sqrt(s.outlier_scale) : s.outlier_scale;
  for (uint32_t h = 0; h < heads; ++h) {
    std::vector<bool> taken(s.head_dim, false);
    const uint32_t want = s.outlier_channels < s.head_dim ? s.outlier_channels : s.head_dim;
    for (uint32_t k = 0; k < want;) {
      const uint32_t ch = uint32_t(rng.next() % s.head_dim);
      if (taken[ch]) continue;
      taken[ch] = true;
      scale[size_t(h) * s.head_dim + ch] *= big;
      ++k;
    }
  }
  return scale;
}

}  // namespace detail

// Writes the spec's metadata and tensors into `w`.
inline Status build_model(const ModelSpec& s, GgufWriter& w) {
  const std::string& a = s.arch;
  bool known = false;
  for (const auto& x : model_builder_archs()) known = known || x == a;
  if (!known) return Status::InvalidArgument("mkmodel: unsupported arch '" + a + "'");
  if (s.n_layer == 0 || s.n_layer > 512) return Status::InvalidArgument("mkmodel: n_layer must be 1..512");
  if (s.n_head == 0 || s.head_dim == 0 || s.n_embd == 0 || s.n_ff == 0) {
    return Status::InvalidArgument("mkmodel: n_embd, n_head, head_dim and n_ff must be positive");
  }
  if (s.head_dim % 2 != 0) return Status::InvalidArgument("mkmodel: head_dim must be even (RoPE pairs)");
  if (s.n_rot % 2 != 0 || s.n_rot > s.head_dim) {
    return Status::InvalidArgument("mkmodel: n_rot must be even and at most head_dim");
  }
  if (!s.n_head_kv_layers.empty() && s.n_head_kv_layers.size() != s.n_layer) {
    return Status::InvalidArgument("mkmodel: per-layer n_head_kv needs exactly n_layer values");
  }
  const bool lfm2 = a == "lfm2";
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const uint32_t kv = detail::kv_heads(s, il);
    if (lfm2 && kv == 0) continue;  // a short-conv layer
    if (kv == 0 || s.n_head % kv != 0) {
      return Status::InvalidArgument("mkmodel: layer " + std::to_string(il) + ": n_head " + std::to_string(s.n_head) +
                                     " is not a multiple of n_head_kv " + std::to_string(kv));
    }
  }
  const bool command_r = a == "command-r", olmo2 = a == "olmo2";
  if ((a == "qwen2" || a == "qwen2vl" || a == "phi3" || lfm2 || command_r || olmo2) && s.n_head * s.head_dim != s.n_embd) {
    return Status::InvalidArgument("mkmodel: " + a + " needs n_embd == n_head * head_dim (" +
                                   std::to_string(s.n_head * s.head_dim) + ")");
  }
  if (s.vocab_words > model_builder_words().size()) {
    return Status::InvalidArgument("mkmodel: at most " + std::to_string(model_builder_words().size()) +
                                   " vocab words");
  }
  if (!s.swa_layers.empty() && s.swa_layers.size() != s.n_layer) {
    return Status::InvalidArgument("mkmodel: the SWA layer list needs exactly n_layer values");
  }

  // ---- tokenizer
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0.0f, 0.0f, 0.0f};
  std::vector<int32_t> types = {2, 3, 3};  // unknown, control, control
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    scores.push_back(0.0f);
    types.push_back(6);  // byte
  }
  const std::string space = "\xE2\x96\x81";  // U+2581
  for (uint32_t i = 0; i < s.vocab_words; ++i) {
    tokens.push_back(space + model_builder_words()[i]);
    scores.push_back(-float(i + 1));
    types.push_back(1);
  }
  for (char c = 'a'; c <= 'z'; ++c) {
    tokens.push_back(std::string(1, c));
    scores.push_back(-100.0f);
    types.push_back(1);
  }
  for (const char* t : {"\xE2\x96\x81", ".", ","}) {
    tokens.push_back(t);
    scores.push_back(-100.0f);
    types.push_back(1);
  }
  const uint32_t n_vocab = static_cast<uint32_t>(tokens.size());

  // ---- metadata
  const bool gemma = a == "gemma2" || a == "gemma3";
  if (s.alignment) w.set_u32("general.alignment", s.alignment);
  w.set_string("general.architecture", a);
  w.set_string("general.name", s.name);
  w.set_u32(a + ".context_length", s.n_ctx_train);
  w.set_u32(a + ".embedding_length", s.n_embd);
  w.set_u32(a + ".block_count", s.n_layer);
  w.set_u32(a + ".feed_forward_length", s.n_ff);
  w.set_u32(a + ".attention.head_count", s.n_head);
  if (s.n_head_kv_layers.empty() && !lfm2) {
    w.set_u32(a + ".attention.head_count_kv", s.n_head_kv);
  } else {
    std::vector<uint32_t> kv;
    for (uint32_t il = 0; il < s.n_layer; ++il) kv.push_back(detail::kv_heads(s, il));
    w.set_u32_array(a + ".attention.head_count_kv", kv);
  }
  w.set_u32(a + ".attention.key_length", s.head_dim);
  w.set_u32(a + ".attention.value_length", s.head_dim);
  w.set_u32(a + ".rope.dimension_count", s.n_rot ? s.n_rot : s.head_dim);
  if (command_r) {  // LayerNorm (LLM_NORM) and a scale on the logits (llama_model_command_r::load_arch_hparams)
    w.set_f32(a + ".attention.layer_norm_epsilon", 1e-5f);
    w.set_f32(a + ".logit_scale", 0.5f);
  } else {
    w.set_f32(a + ".attention.layer_norm_rms_epsilon", gemma ? 1e-6f : 1e-5f);
  }
  w.set_f32(a + ".rope.freq_base", s.rope_base);
  if (s.rope_base_swa > 0) w.set_f32(a + ".rope.freq_base_swa", s.rope_base_swa);
  if (a == "qwen2vl") {
    const int32_t half = int32_t(s.head_dim / 2);
    const int32_t s0 = half / 4, s1 = (half - s0) / 2, s2 = half - s0 - s1;
    w.set_i32_array(a + ".rope.dimension_sections", {s0, s1, s2, 0});
  }
  if (gemma) {
    w.set_u32(a + ".attention.sliding_window", s.n_swa);
    if (a == "gemma2") {
      w.set_f32(a + ".attn_logit_softcapping", 50.0f);
      w.set_f32(a + ".final_logit_softcapping", 30.0f);
    }
    if (!s.swa_layers.empty()) {
      w.set_bool_array(a + ".attention.sliding_window_pattern", s.swa_layers);
    } else if (s.swa_pattern) {
      w.set_u32(a + ".attention.sliding_window_pattern", s.swa_pattern);
    }
  }
  if (lfm2) {
    w.set_u32(a + ".shortconv.l_cache", s.shortconv_l_cache);
    if (s.lfm2_swa) w.set_u32(a + ".attention.sliding_window", s.n_swa);
    if (!s.swa_layers.empty() || s.swa_pattern) {
      return Status::InvalidArgument("mkmodel: lfm2 puts every attention layer in the window (--swa only)");
    }
  }
  w.set_u32(a + ".vocab_size", n_vocab);
  w.set_u32("general.file_type", s.f16 ? 1 : 0);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", std::move(tokens));
  w.set_f32_array("tokenizer.ggml.scores", scores);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  if (s.metadata_only) return Status::OK();

  // ---- tensors
  detail::Rng rng(s.seed);
  auto weight = [&](const std::string& name, int64_t in, int64_t out,
                    const std::vector<float>& row_scale = {}) -> Status {
    std::vector<float> v(static_cast<size_t>(in * out));
    const float scale = 1.0f / std::sqrt(float(in));
    for (auto& x : v) x = rng.uniform() * scale * 1.7f;
    if (!row_scale.empty()) {  // trained-like K/V channels: output row o times row_scale[o]
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) v[size_t(o * in + i)] *= row_scale[size_t(o)];
      }
    }
    if (s.f16) return w.add_tensor_f16(name, {in, out}, v);
    return w.add_tensor_f32(name, {in, out}, v);
  };
  auto embedding = [&](const std::string& name) -> Status {
    std::vector<float> v(static_cast<size_t>(s.n_embd) * n_vocab);
    for (auto& x : v) x = rng.uniform() * (gemma ? 0.1f : 0.5f);
    if (s.f16) return w.add_tensor_f16(name, {s.n_embd, n_vocab}, v);
    return w.add_tensor_f32(name, {s.n_embd, n_vocab}, v);
  };
  auto norm = [&](const std::string& name, int64_t n) -> Status {
    std::vector<float> v(size_t(n), 1.0f);
    if (command_r || olmo2) {  // weights that differ per channel, so a twin that skipped them computes another function
      for (auto& x : v) x = 1.0f + 0.5f * rng.uniform();
    }
    return w.add_tensor_f32(name, {n}, v);
  };
  // Per-head Q/K norms that differ per channel (qwen3), so a twin that swapped or skipped them
  // would compute another function.
  auto head_norm = [&](const std::string& name) -> Status {
    std::vector<float> v(s.head_dim);
    for (auto& x : v) x = 1.0f + 0.5f * rng.uniform();
    return w.add_tensor_f32(name, {int64_t(s.head_dim)}, v);
  };
  auto bias = [&](const std::string& name, int64_t n) -> Status {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = rng.uniform() * 0.02f;
    return w.add_tensor_f32(name, {n}, v);
  };

  const int64_t n_q = int64_t(s.n_head) * s.head_dim;
  KV_RETURN_IF_ERROR(embedding("token_embd.weight"));
  // lfm2 calls its output norm "token_embd_norm" (llama.cpp: "fix for wrong tensor name")
  KV_RETURN_IF_ERROR(norm(lfm2 ? "token_embd_norm.weight" : "output_norm.weight", s.n_embd));
  // gemma and command-r tie the output to token_embd
  if (!gemma && !command_r) KV_RETURN_IF_ERROR(weight("output.weight", s.n_embd, n_vocab));
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t n_kv = int64_t(detail::kv_heads(s, il)) * s.head_dim;
    if (lfm2) {
      // ffn first, then the operator: attention, or a gated short convolution
      KV_RETURN_IF_ERROR(norm(p + "ffn_norm.weight", s.n_embd));
      KV_RETURN_IF_ERROR(weight(p + "ffn_gate.weight", s.n_embd, s.n_ff));
      KV_RETURN_IF_ERROR(weight(p + "ffn_up.weight", s.n_embd, s.n_ff));
      KV_RETURN_IF_ERROR(weight(p + "ffn_down.weight", s.n_ff, s.n_embd));
      KV_RETURN_IF_ERROR(norm(p + "attn_norm.weight", s.n_embd));
      if (n_kv == 0) {
        {  // the convolution kernel stays f32 (ggml_ssm_conv), like converted LFM2 models
          std::vector<float> v(static_cast<size_t>(s.shortconv_l_cache) * s.n_embd);
          for (auto& x : v) x = rng.uniform() * 0.5f;
          KV_RETURN_IF_ERROR(w.add_tensor_f32(p + "shortconv.conv.weight", {s.shortconv_l_cache, s.n_embd}, v));
        }
        KV_RETURN_IF_ERROR(weight(p + "shortconv.in_proj.weight", s.n_embd, 3 * int64_t(s.n_embd)));
        KV_RETURN_IF_ERROR(weight(p + "shortconv.out_proj.weight", s.n_embd, s.n_embd));
      } else {
        KV_RETURN_IF_ERROR(norm(p + "attn_q_norm.weight", s.head_dim));
        KV_RETURN_IF_ERROR(norm(p + "attn_k_norm.weight", s.head_dim));
        KV_RETURN_IF_ERROR(weight(p + "attn_q.weight", s.n_embd, n_q));
        KV_RETURN_IF_ERROR(weight(p + "attn_k.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, false)));
        KV_RETURN_IF_ERROR(weight(p + "attn_v.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, true)));
        KV_RETURN_IF_ERROR(weight(p + "attn_output.weight", n_q, s.n_embd));
      }
      continue;
    }
    if (!olmo2) KV_RETURN_IF_ERROR(norm(p + "attn_norm.weight", s.n_embd));
    if (a == "phi3") {  // fused Q|K|V rows and gate|up rows, as llama.cpp's converter writes Phi-3
      std::vector<float> scale;
      const std::vector<float> ks = detail::kv_row_scale(s, il, false), vs = detail::kv_row_scale(s, il, true);
      if (!ks.empty()) {
        scale.assign(size_t(n_q), 1.0f);
        scale.insert(scale.end(), ks.begin(), ks.end());
        scale.insert(scale.end(), vs.begin(), vs.end());
      }
      KV_RETURN_IF_ERROR(weight(p + "attn_qkv.weight", s.n_embd, n_q + 2 * n_kv, scale));
      KV_RETURN_IF_ERROR(weight(p + "attn_output.weight", n_q, s.n_embd));
      KV_RETURN_IF_ERROR(norm(p + "ffn_norm.weight", s.n_embd));
      KV_RETURN_IF_ERROR(weight(p + "ffn_up.weight", s.n_embd, 2 * int64_t(s.n_ff)));
      KV_RETURN_IF_ERROR(weight(p + "ffn_down.weight", s.n_ff, s.n_embd));
      continue;
    }
    if (olmo2) {  // no pre-norms: RMS norms over the whole Q and K projections, after attention and after the FFN
      KV_RETURN_IF_ERROR(weight(p + "attn_q.weight", s.n_embd, n_q));
      KV_RETURN_IF_ERROR(weight(p + "attn_k.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, false)));
      KV_RETURN_IF_ERROR(weight(p + "attn_v.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, true)));
      KV_RETURN_IF_ERROR(weight(p + "attn_output.weight", n_q, s.n_embd));
      KV_RETURN_IF_ERROR(norm(p + "attn_q_norm.weight", n_q));
      KV_RETURN_IF_ERROR(norm(p + "attn_k_norm.weight", n_kv));
      KV_RETURN_IF_ERROR(norm(p + "post_attention_norm.weight", s.n_embd));
      KV_RETURN_IF_ERROR(weight(p + "ffn_gate.weight", s.n_embd, s.n_ff));
      KV_RETURN_IF_ERROR(weight(p + "ffn_up.weight", s.n_embd, s.n_ff));
      KV_RETURN_IF_ERROR(weight(p + "ffn_down.weight", s.n_ff, s.n_embd));
      KV_RETURN_IF_ERROR(norm(p + "post_ffw_norm.weight", s.n_embd));
      continue;
    }
    if (command_r) {  // one LayerNorm (weight, no bias) feeds attention and the gated FFN in parallel
      KV_RETURN_IF_ERROR(weight(p + "attn_q.weight", s.n_embd, n_q));
      KV_RETURN_IF_ERROR(weight(p + "attn_k.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, false)));
      KV_RETURN_IF_ERROR(weight(p + "attn_v.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, true)));
      KV_RETURN_IF_ERROR(weight(p + "attn_output.weight", n_q, s.n_embd));
      KV_RETURN_IF_ERROR(weight(p + "ffn_gate.weight", s.n_embd, s.n_ff));
      KV_RETURN_IF_ERROR(weight(p + "ffn_up.weight", s.n_embd, s.n_ff));
      KV_RETURN_IF_ERROR(weight(p + "ffn_down.weight", s.n_ff, s.n_embd));
      continue;
    }
    KV_RETURN_IF_ERROR(weight(p + "attn_q.weight", s.n_embd, n_q));
    KV_RETURN_IF_ERROR(weight(p + "attn_k.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, false)));
    KV_RETURN_IF_ERROR(weight(p + "attn_v.weight", s.n_embd, n_kv, detail::kv_row_scale(s, il, true)));
    if (a == "qwen2" || a == "qwen2vl") {
      KV_RETURN_IF_ERROR(bias(p + "attn_q.bias", n_q));
      KV_RETURN_IF_ERROR(bias(p + "attn_k.bias", n_kv));
      KV_RETURN_IF_ERROR(bias(p + "attn_v.bias", n_kv));
    }
    KV_RETURN_IF_ERROR(weight(p + "attn_output.weight", n_q, s.n_embd));
    if (a == "gemma3") {
      KV_RETURN_IF_ERROR(norm(p + "attn_q_norm.weight", s.head_dim));
      KV_RETURN_IF_ERROR(norm(p + "attn_k_norm.weight", s.head_dim));
    }
    if (a == "qwen3") {  // RMS norm per head on Q and K before the (NEOX) rope
      KV_RETURN_IF_ERROR(head_norm(p + "attn_q_norm.weight"));
      KV_RETURN_IF_ERROR(head_norm(p + "attn_k_norm.weight"));
    }
    if (gemma) KV_RETURN_IF_ERROR(norm(p + "post_attention_norm.weight", s.n_embd));
    KV_RETURN_IF_ERROR(norm(p + "ffn_norm.weight", s.n_embd));
    KV_RETURN_IF_ERROR(weight(p + "ffn_gate.weight", s.n_embd, s.n_ff));
    KV_RETURN_IF_ERROR(weight(p + "ffn_up.weight", s.n_embd, s.n_ff));
    KV_RETURN_IF_ERROR(weight(p + "ffn_down.weight", s.n_ff, s.n_embd));
    if (gemma) KV_RETURN_IF_ERROR(norm(p + "post_ffw_norm.weight", s.n_embd));
  }
  return Status::OK();
}

// A LoRA adapter for a ModelSpec's model, in the GGUF form llama.cpp's loader takes
// (llama_adapter_lora_init, --lora): general.type "adapter", adapter.type "lora",
// adapter.lora.alpha, the model's general.architecture, and per targeted weight W
// (ne {in, out}) a pair "W.lora_a" (ne {in, rank}) and "W.lora_b" (ne {rank, out}).
// llama.cpp adds scale * alpha / rank * B·A·x to W·x (scale: --lora-scaled, the
// server's per-request "lora" scale). Entries are drawn so that B·A has about the
// base weight's magnitude times `strength`: at scale 1 and alpha = rank the outputs
// change visibly, the KV cache too when k or v is targeted.
struct LoraSpec {
  uint32_t rank = 0;                                  // > 0
  float alpha = 0.0f;                                 // 0: rank (effective scale 1)
  std::vector<std::string> targets = {"k", "v"};      // q k v o gate up down
  float strength = 1.0f;
  uint64_t seed = 0;                                  // 0: the model's seed
};

inline const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> k = {"q", "k", "v", "o", "gate", "up", "down"};
  return k;
}

// Writes the adapter for `s` into `w` (`s` is validated as build_model would).
inline Status build_lora(const ModelSpec& s, const LoraSpec& l, GgufWriter& w) {
  {
    ModelSpec m = s;
    m.metadata_only = true;
    GgufWriter scratch;
    KV_RETURN_IF_ERROR(build_model(m, scratch));
  }
  if (l.rank == 0) return Status::InvalidArgument("mkmodel: LoRA rank must be positive");
  if (l.targets.empty()) return Status::InvalidArgument("mkmodel: LoRA needs at least one target");
  auto wants = [&](const char* t) {
    for (const auto& x : l.targets) {
      if (x == t) return true;
    }
    return false;
  };
  for (const auto& t : l.targets) {
    bool ok = false;
    for (const auto& x : lora_target_names()) ok = ok || x == t;
    if (!ok) return Status::InvalidArgument("mkmodel: unknown LoRA target '" + t + "' (q k v o gate up down)");
  }
  const std::string& a = s.arch;
  const bool phi3 = a == "phi3", lfm2 = a == "lfm2";
  if (wants("gate") && phi3) return Status::InvalidArgument("mkmodel: phi3 has no ffn_gate (gate|up is ffn_up)");

  if (s.alignment) w.set_u32("general.alignment", s.alignment);
  w.set_string("general.architecture", a);
  w.set_string("general.type", "adapter");
  w.set_string("general.name", s.name + "-lora");
  w.set_string("adapter.type", "lora");
  w.set_f32("adapter.lora.alpha", l.alpha > 0 ? l.alpha : float(l.rank));
  if (s.metadata_only) return Status::OK();

  detail::Rng rng((l.seed ? l.seed : s.seed) * 0xD1B54A32D192ED03ull + 0x6c6f7261ull);
  const int64_t r = l.rank;
  auto pair = [&](const std::string& name, int64_t in, int64_t out) -> Status {
    std::vector<float> va(static_cast<size_t>(in * r)), vb(static_cast<size_t>(r * out));
    // base entries: uniform * 1.7 / sqrt(in); (B·A)[o][i] sums r products: 1.7/sqrt(in) * 1.7/sqrt(r)
    const float sa = 1.7f / std::sqrt(float(in)), sb = 1.7f * l.strength / std::sqrt(float(r));
    for (auto& x : va) x = rng.uniform() * sa;
    for (auto& x : vb) x = rng.uniform() * sb;
    if (s.f16) {
      KV_RETURN_IF_ERROR(w.add_tensor_f16(name + ".lora_a", {in, r}, va));
      return w.add_tensor_f16(name + ".lora_b", {r, out}, vb);
    }
    KV_RETURN_IF_ERROR(w.add_tensor_f32(name + ".lora_a", {in, r}, va));
    return w.add_tensor_f32(name + ".lora_b", {r, out}, vb);
  };

  const int64_t n_q = int64_t(s.n_head) * s.head_dim;
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const int64_t n_kv = int64_t(detail::kv_heads(s, il)) * s.head_dim;
    if (!(lfm2 && n_kv == 0)) {  // lfm2's short-conv layers have no attention weights
      if (phi3) {
        if (wants("q") || wants("k") || wants("v")) {
          KV_RETURN_IF_ERROR(pair(p + "attn_qkv.weight", s.n_embd, n_q + 2 * n_kv));
        }
      } else {
        if (wants("q")) KV_RETURN_IF_ERROR(pair(p + "attn_q.weight", s.n_embd, n_q));
        if (wants("k")) KV_RETURN_IF_ERROR(pair(p + "attn_k.weight", s.n_embd, n_kv));
        if (wants("v")) KV_RETURN_IF_ERROR(pair(p + "attn_v.weight", s.n_embd, n_kv));
      }
      if (wants("o")) KV_RETURN_IF_ERROR(pair(p + "attn_output.weight", n_q, s.n_embd));
    }
    if (wants("gate")) KV_RETURN_IF_ERROR(pair(p + "ffn_gate.weight", s.n_embd, s.n_ff));
    if (wants("up")) KV_RETURN_IF_ERROR(pair(p + "ffn_up.weight", s.n_embd, (phi3 ? 2 : 1) * int64_t(s.n_ff)));
    if (wants("down")) KV_RETURN_IF_ERROR(pair(p + "ffn_down.weight", s.n_ff, s.n_embd));
  }
  return Status::OK();
}

}  // namespace kvsnap::testing
