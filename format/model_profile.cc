#include "format/model_profile.h"

#include <algorithm>
#include <memory>
#include <string_view>

namespace kvsnap {
namespace {

constexpr uint32_t kMaxLayers = 512;        // LLAMA_MAX_LAYERS
constexpr uint32_t kCellExtBytesV050 = 12;  // sizeof(llama_kv_cell_ext) in v0.5.0: x, y, tok

bool in(std::string_view arch, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), arch) != list.end();
}

// ------------------------------------------------------------------ arch tables
// llama_model_rope_type() of v0.5.0. glm4, glm4moe, hunyuan_vl and dflash
// decide from their rope sections (handled in rope_kind_for).
RopeKind table_rope(std::string_view a) {
  if (in(a, {"gpt2", "gptj", "mpt", "refact", "bloom", "mamba", "mamba2", "jamba", "jina-bert-v2", "t5",
             "t5encoder", "jais", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "wavtokenizer-dec", "nemotron_h",
             "nemotron_h_moe", "kimi-linear", "kimi-k3"})) {
    return RopeKind::kNone;
  }
  if (in(a, {"llama", "llada", "llama4", "deci", "baichuan", "starcoder", "internlm2", "minicpm", "xverse",
             "command-r", "cohere2", "cohere2moe", "olmo", "arctic", "deepseek", "deepseek2", "deepseek2-ocr",
             "deepseek32", "deepseek4", "muse-glimmer", "plm", "chatglm", "granite", "granitemoe", "granitehybrid",
             "graniteswitch", "granite_swa", "chameleon", "bailingmoe", "bailingmoe3", "neo-bert", "smollm3", "arcee",
             "ernie4_5", "ernie4_5-moe", "mistral3", "eagle3", "mistral4", "llama-embed", "maincoder", "glm-dsa",
             "dots3note", "nanbeige", "pockettts", "hy_v4"})) {
    return RopeKind::kNorm;
  }
  if (in(a, {"falcon", "falcon-h1", "grok", "dbrx", "bert", "jina-bert-v3", "modern-bert", "nomic-bert",
             "nomic-bert-moe", "eurobert", "stablelm", "bitnet", "qwen", "qwen2", "dream", "qwen2moe", "qwen3",
             "qwen3moe", "llada-moe", "rnd1", "olmo2", "olmoe", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3",
             "gemma", "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-assistant", "gemma-embedding", "starcoder2",
             "openelm", "gptneox", "codeshell", "orion", "nemotron", "exaone", "exaone4", "exaone-moe", "minicpm3",
             "bailingmoe2", "dots1", "hunyuan-moe", "jais2", "gpt-oss", "hunyuan-dense", "hy_v3", "lfm2", "lfm2moe",
             "smallthinker", "seed_oss", "grovemoe", "apertus", "minimax-01", "minimax-m2", "minimax-m3", "cogvlm",
             "pangu-embedded", "afmoe", "laguna", "qwen3next", "mimo2", "step35", "spark2_5", "talkie", "mellum",
             "maple", "hrm_text"})) {
    return RopeKind::kNeox;
  }
  if (in(a, {"qwen2vl", "paddleocr"})) return RopeKind::kMrope;
  if (in(a, {"qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "qwen3tts"})) return RopeKind::kImrope;
  return RopeKind::kUnknown;
}

// llm_arch_is_recurrent / llm_arch_is_hybrid of v0.5.0.
bool arch_is_recurrent(std::string_view a) {
  return in(a, {"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"});
}
bool arch_is_hybrid(std::string_view a) {
  return in(a, {"jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
                "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4",
                "minimax-01"});
}
// create_memory() returns no memory for these.
bool arch_has_no_memory(std::string_view a) {
  return in(a, {"bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
                "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1"});
}
// create_memory() builds a cache kvsnap does not model for these.
bool arch_has_special_memory(std::string_view a) {
  return in(a, {"minimax-m3", "glm-dsa", "deepseek32", "dots3note", "deepseek4", "qwen4exp", "gemma4-assistant",
                "dflash"});
}

// Archs whose load_arch_hparams (v0.5.0) touches nothing that shapes the memory
// (SWA, recurrent layers, head sizes, KV layer ranges): the generic keys are
// exactly what llama.cpp uses.
bool arch_is_plain(std::string_view a) {
  return in(a, {"llama", "llama-embed", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
                "starcoder", "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen3", "qwen3moe",
                "qwen2vl", "qwen3vl", "qwen3vlmoe", "paddleocr", "qwen3tts", "phi2", "phimoe", "plamo", "codeshell",
                "orion", "internlm2", "minicpm", "minicpm3", "gemma", "starcoder2", "xverse", "command-r", "dbrx",
                "olmo", "olmoe", "openelm", "arctic", "deepseek", "chatglm", "glm4", "glm4moe", "bitnet", "jais",
                "jais2", "nemotron", "exaone", "granite", "granitemoe", "chameleon", "plm", "bailingmoe",
                "bailingmoe2", "dots1", "arcee", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense",
                "hunyuan_vl", "hy_v3", "smollm3", "seed_oss", "grovemoe", "apertus", "minimax-m2", "cogvlm",
                "pangu-embedded", "mistral3", "talkie", "maincoder", "pockettts"});
}

// ------------------------------------------------------------------ hparams mirror
struct Hp {
  uint32_t n_layer_all = 0;
  uint32_t n_layer_nextn = 0;
  uint32_t n_embd = 0;
  std::vector<uint32_t> n_head, n_head_kv, n_ff;
  uint32_t head_k_full = 0, head_v_full = 0, head_k_swa = 0, head_v_swa = 0;
  uint32_t n_rot = 0;
  std::vector<uint8_t> is_swa, is_recr;
  SwaKind swa = SwaKind::kNone;
  uint32_t n_swa = 0;
  int32_t n_layer_kv_from_start = -1;
  uint32_t ssm_d_conv = 0, ssm_d_inner = 0, ssm_d_state = 0, ssm_n_group = 0;
  uint32_t wkv_head_size = 0, token_shift_count = 2, shortconv_l_cache = 0;
  uint32_t mla_k = 0, mla_v = 0;
  std::array<int32_t, 4> rope_sections{};
  bool ple = false;

  uint32_t n_layer() const { return n_layer_all - n_layer_nextn; }
  void set_swa_pattern(uint32_t n_pattern, bool dense_first) {
    for (uint32_t il = 0; il < n_layer(); ++il) {
      if (dense_first) {
        is_swa[il] = n_pattern == 0 || (il % n_pattern != 0);
      } else {
        is_swa[il] = n_pattern == 0 || (il % n_pattern < (n_pattern - 1));
      }
    }
    for (uint32_t il = n_layer(); il < n_layer_all; ++il) is_swa[il] = 0;
  }
  bool has_kv(uint32_t il) const { return n_layer_kv_from_start < 0 || il < uint32_t(n_layer_kv_from_start); }
  uint32_t head_k(uint32_t il) const { return is_swa[il] ? head_k_swa : head_k_full; }
  uint32_t head_v(uint32_t il) const { return is_swa[il] ? head_v_swa : head_v_full; }
  uint32_t n_embd_r() const {
    if (wkv_head_size != 0) return token_shift_count * n_embd;
    if (shortconv_l_cache != 0) return n_embd * (shortconv_l_cache - 1);
    return (ssm_d_conv > 0 ? ssm_d_conv - 1 : 0) * (ssm_d_inner + 2 * ssm_n_group * ssm_d_state);
  }
  uint32_t n_embd_s() const {
    if (wkv_head_size != 0) return n_embd * wkv_head_size;
    return ssm_d_state * ssm_d_inner;
  }
};

// Reads keys of one arch the way llama_model_loader does; errors name the file.
class Keys {
 public:
  Keys(const GgufHeader& h, std::string arch) : h_(h), arch_(std::move(arch)) {}
  std::string k(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }
  bool has(std::string_view suffix) const { return h_.has(k(suffix)); }

  Status req_u32(std::string_view suffix, uint32_t& out) const {
    auto r = h_.get_u32(k(suffix));
    if (!r.ok()) return required_error(r.status(), suffix);
    out = *r;
    return Status::OK();
  }
  // Leaves `out` alone when the key is absent; true when found.
  Result<bool> opt_u32(std::string_view suffix, uint32_t& out) const {
    if (!has(suffix)) return false;
    auto r = h_.get_u32(k(suffix));
    if (!r.ok()) return wrap(r.status());
    out = *r;
    return true;
  }
  Result<bool> opt_bool(std::string_view suffix, bool& out) const {
    if (!has(suffix)) return false;
    auto r = h_.get_bool(k(suffix));
    if (!r.ok()) return wrap(r.status());
    out = *r;
    return true;
  }
  // get_key_or_arr over n values; leaves `out` alone when absent.
  Result<bool> opt_u32_or_arr(std::string_view suffix, std::vector<uint32_t>& out, uint32_t n) const {
    if (!has(suffix)) return false;
    auto r = h_.get_u32_or_array(k(suffix), n);
    if (!r.ok()) return wrap(r.status());
    out = std::move(*r);
    return true;
  }
  Result<bool> opt_flags_or_arr(std::string_view suffix, std::vector<uint8_t>& out, uint32_t n) const {
    std::vector<uint32_t> v;
    KV_ASSIGN_OR_RETURN(bool found, opt_u32_or_arr(suffix, v, n));
    if (found) {
      for (uint32_t i = 0; i < n; ++i) out[i] = v[i] != 0;
    }
    return found;
  }
  // ml.get_arr into a std::array<uint32_t, 512>: the first min(len, n) entries.
  Result<bool> opt_flags_arr(std::string_view suffix, std::vector<uint8_t>& out) const {
    const GgufKv* kv = h_.find(k(suffix));
    if (!kv || kv->value.type != GgufType::kArray) return false;
    const auto& a = std::get<GgufArray>(kv->value.v);
    if (a.count > kMaxLayers) {
      return Status::Corruption(h_.file + ": array length " + std::to_string(a.count) + " for key '" + k(suffix) +
                                "' exceeds max " + std::to_string(kMaxLayers));
    }
    for (uint64_t i = 0; i < a.count && i < out.size(); ++i) {
      auto v = a.int_at(i);
      if (!v.ok()) return wrap(Status::Mismatch(h_.file + ": key '" + k(suffix) + "': " + v.status().message()));
      out[i] = *v != 0;
    }
    return true;
  }
  Result<bool> opt_sections(std::array<int32_t, 4>& out) const {
    std::vector<uint32_t> v;
    KV_ASSIGN_OR_RETURN(bool found, opt_u32_or_arr("rope.dimension_sections", v, 4));
    if (found) {
      for (int i = 0; i < 4; ++i) out[i] = int32_t(v[i]);
    }
    return found;
  }

  Status wrap(const Status& s) const {
    if (s.code() == Code::kMismatch) return Status::Corruption(s.message());
    return s;
  }
  Status required_error(const Status& s, std::string_view suffix) const {
    if (s.code() == Code::kNotFound) {
      return Status::Corruption(h_.file + ": key '" + k(suffix) + "' not found (llama.cpp requires it for arch '" +
                                arch_ + "')");
    }
    return wrap(s);
  }

 private:
  const GgufHeader& h_;
  std::string arch_;
};

// load_swa_pattern(ml, n_pattern, dense_first): an explicit per-layer array
// wins, else a u32 period (default n_pattern).
Status load_swa_pattern(const Keys& k, Hp& hp, uint32_t n_pattern, bool dense_first) {
  KV_ASSIGN_OR_RETURN(bool arr, k.opt_flags_arr("attention.sliding_window_pattern", hp.is_swa));
  if (arr) return Status::OK();
  KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window_pattern", n_pattern));
  (void)found;
  hp.set_swa_pattern(n_pattern, dense_first);
  return Status::OK();
}

Status require_swa_array(const Keys& k, Hp& hp) {
  KV_ASSIGN_OR_RETURN(bool arr, k.opt_flags_arr("attention.sliding_window_pattern", hp.is_swa));
  if (!arr) {
    return Status::Corruption("array key '" + k.k("attention.sliding_window_pattern") + "' not found in model");
  }
  return Status::OK();
}

// The SSM keys of Mamba-style layers (required by the archs that have them).
Status load_ssm(const Keys& k, Hp& hp, bool with_groups) {
  KV_RETURN_IF_ERROR(k.req_u32("ssm.conv_kernel", hp.ssm_d_conv));
  KV_RETURN_IF_ERROR(k.req_u32("ssm.inner_size", hp.ssm_d_inner));
  KV_RETURN_IF_ERROR(k.req_u32("ssm.state_size", hp.ssm_d_state));
  uint32_t dt_rank = 0;
  KV_RETURN_IF_ERROR(k.req_u32("ssm.time_step_rank", dt_rank));
  if (with_groups) KV_RETURN_IF_ERROR(k.req_u32("ssm.group_count", hp.ssm_n_group));
  return Status::OK();
}

// The recurrent-layer map of qwen3next / qwen35: an explicit per-layer list,
// else every full_attention_interval-th layer (default 4) is attention.
Status load_recurrent_layers(const Keys& k, Hp& hp) {
  KV_ASSIGN_OR_RETURN(bool found, k.opt_flags_or_arr("attention.recurrent_layers", hp.is_recr, hp.n_layer_all));
  if (found) return Status::OK();
  uint32_t interval = 4;
  KV_ASSIGN_OR_RETURN(bool f2, k.opt_u32("full_attention_interval", interval));
  (void)f2;
  if (interval == 0) return Status::Corruption("key '" + k.k("full_attention_interval") + "' is 0");
  for (uint32_t i = 0; i < hp.n_layer_all; ++i) hp.is_recr[i] = (i < hp.n_layer()) && ((i + 1) % interval != 0);
  return Status::OK();
}

// Per-arch part of load_hparams (src/models/<arch>.cpp, load_arch_hparams).
// Sets *modelled to false for archs it only approximates.
Status load_arch(const std::string& a, const Keys& k, Hp& hp, bool* modelled, std::vector<std::string>& notes) {
  *modelled = true;
  if (arch_is_plain(a)) {
    if (in(a, {"glm4", "glm4moe", "hunyuan_vl"})) KV_RETURN_IF_ERROR(k.opt_sections(hp.rope_sections).status());
    if (in(a, {"qwen2vl", "qwen3vl", "qwen3vlmoe", "paddleocr", "qwen3tts"})) {
      KV_ASSIGN_OR_RETURN(bool found, k.opt_sections(hp.rope_sections));
      if (!found && in(a, {"qwen2vl", "qwen3vl", "qwen3vlmoe"})) {
        return Status::Corruption("key '" + k.k("rope.dimension_sections") + "' not found (llama.cpp requires it)");
      }
    }
    return Status::OK();
  }
  if (a == "phi3") {
    // SWA is read but disabled in v0.5.0 ("Phi SWA is currently disabled")
    uint32_t n_swa = 0;
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", n_swa));
    if (found && n_swa > 0) notes.push_back("phi3: sliding_window is ignored by llama.cpp v0.5.0 (all layers dense)");
    return Status::OK();
  }
  if (a == "gemma2") {
    hp.swa = SwaKind::kStandard;
    hp.n_swa = 4096;
    KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 2, false));
    KV_RETURN_IF_ERROR(k.opt_u32("attention.sliding_window", hp.n_swa).status());
    return Status::OK();
  }
  if (a == "gemma3") {
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", hp.n_swa));
    if (found && hp.n_swa > 0) {
      hp.swa = SwaKind::kStandard;
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 6, false));
    }
    return Status::OK();
  }
  if (a == "gemma3n") {
    hp.swa = SwaKind::kStandard;
    KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 5, false));
    hp.n_layer_kv_from_start = 20;
    KV_RETURN_IF_ERROR(k.req_u32("attention.sliding_window", hp.n_swa));
    return Status::OK();
  }
  if (a == "gemma4") {
    hp.swa = SwaKind::kStandard;
    KV_RETURN_IF_ERROR(require_swa_array(k, hp));
    uint32_t shared = 0;
    KV_RETURN_IF_ERROR(k.opt_u32("attention.shared_kv_layers", shared).status());
    hp.n_layer_kv_from_start = int32_t(hp.n_layer_all) - int32_t(shared);
    KV_RETURN_IF_ERROR(k.req_u32("attention.sliding_window", hp.n_swa));
    KV_RETURN_IF_ERROR(k.req_u32("attention.key_length_swa", hp.head_k_swa));
    KV_RETURN_IF_ERROR(k.req_u32("attention.value_length_swa", hp.head_v_swa));
    return Status::OK();
  }
  // load_swa_pattern families
  struct SwaRow {
    const char* arch;
    int when;  // 0: always, 1: if sliding_window > 0, 2: always with n_swa required
    uint32_t default_n_swa;
    uint32_t pattern;
    bool dense_first;
  };
  static constexpr SwaRow kSwaRows[] = {
      {"cohere2", 2, 0, 4, false},    {"cohere2moe", 2, 0, 4, true},  {"afmoe", 1, 0, 4, false},
      {"exaone-moe", 2, 128, 4, false}, {"mellum", 1, 0, 4, false},   {"muse-glimmer", 2, 0, 4, false},
      {"olmo2", 1, 0, 4, false},      {"gpt-oss", 2, 0, 2, false},    {"plamo3", 1, 0, 8, false},
      {"laguna", 1, 0, 4, true},
  };
  for (const auto& row : kSwaRows) {
    if (a != row.arch) continue;
    hp.n_swa = row.default_n_swa;
    if (row.when == 2) {
      KV_RETURN_IF_ERROR(k.req_u32("attention.sliding_window", hp.n_swa));
    } else {
      KV_RETURN_IF_ERROR(k.opt_u32("attention.sliding_window", hp.n_swa).status());
    }
    if (row.when != 1 || hp.n_swa > 0) {
      hp.swa = SwaKind::kStandard;
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, row.pattern, row.dense_first));
    }
    return Status::OK();
  }
  if (a == "smallthinker") {
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", hp.n_swa));
    if (found && hp.n_swa > 0) {
      hp.swa = SwaKind::kStandard;
      hp.n_swa = 4096;  // overrides the file, as llama.cpp does
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 4, true));
    }
    return Status::OK();
  }
  if (a == "exaone4") {
    if (hp.n_layer() == 64) {
      hp.swa = SwaKind::kStandard;
      hp.n_swa = 4096;
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 4, false));
    }
    KV_RETURN_IF_ERROR(k.opt_u32("attention.sliding_window", hp.n_swa).status());
    return Status::OK();
  }
  if (a == "llama4") {
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", hp.n_swa));
    if (!(found && hp.n_swa == 0)) {
      hp.swa = SwaKind::kChunked;
      hp.n_swa = 8192;
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 4, false));
    }
    return Status::OK();
  }
  if (in(a, {"granite_swa", "maple", "mimo2", "spark2_5", "step35"})) {
    hp.swa = SwaKind::kStandard;
    KV_RETURN_IF_ERROR(require_swa_array(k, hp));
    KV_RETURN_IF_ERROR(k.req_u32("attention.sliding_window", hp.n_swa));
    return Status::OK();
  }
  // recurrent
  if (in(a, {"mamba", "mamba2"})) return load_ssm(k, hp, a == "mamba2");
  if (in(a, {"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})) {
    KV_RETURN_IF_ERROR(k.req_u32("wkv.head_size", hp.wkv_head_size));
    KV_RETURN_IF_ERROR(k.opt_u32("token_shift_count", hp.token_shift_count).status());
    return Status::OK();
  }
  // hybrids
  if (in(a, {"lfm2", "lfm2moe"})) {
    KV_RETURN_IF_ERROR(k.req_u32("shortconv.l_cache", hp.shortconv_l_cache));
    for (uint32_t il = 0; il < hp.n_layer(); ++il) hp.is_recr[il] = hp.n_head_kv[il] == 0;
    if (a == "lfm2") {
      KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", hp.n_swa));
      if (found && hp.n_swa > 0) {
        hp.swa = SwaKind::kStandard;
        for (uint32_t il = 0; il < hp.n_layer(); ++il) hp.is_swa[il] = !hp.is_recr[il];
      }
    }
    return Status::OK();
  }
  if (a == "granitehybrid" || a == "jamba") {
    KV_RETURN_IF_ERROR(load_ssm(k, hp, a == "granitehybrid"));
    for (uint32_t il = 0; il < hp.n_layer(); ++il) hp.is_recr[il] = hp.n_head_kv[il] == 0;
    return Status::OK();
  }
  if (a == "falcon-h1") {
    KV_RETURN_IF_ERROR(load_ssm(k, hp, true));
    std::fill(hp.is_recr.begin(), hp.is_recr.end(), 1);
    return Status::OK();
  }
  if (in(a, {"nemotron_h", "nemotron_h_moe"})) {
    KV_RETURN_IF_ERROR(load_ssm(k, hp, true));
    for (uint32_t il = 0; il < hp.n_layer_all; ++il) {
      hp.is_recr[il] = il < hp.n_layer() && hp.n_head_kv[il] == 0 && hp.n_ff[il] == 0;
    }
    return Status::OK();
  }
  if (in(a, {"qwen3next", "qwen35", "qwen35moe"})) {
    if (a != "qwen3next") {
      KV_ASSIGN_OR_RETURN(bool found, k.opt_sections(hp.rope_sections));
      if (!found) return Status::Corruption("key '" + k.k("rope.dimension_sections") + "' not found (llama.cpp requires it)");
    }
    KV_RETURN_IF_ERROR(load_ssm(k, hp, true));
    return load_recurrent_layers(k, hp);
  }
  if (in(a, {"deepseek2", "mistral4", "deepseek2-ocr"})) {
    // generic keys plus MLA (read in profile_from_gguf)
    *modelled = false;
    notes.push_back(a + ": MLA layout taken from attention.key_length / key_length_mla; not verified against "
                        "llama.cpp");
    return Status::OK();
  }
  *modelled = false;
  return Status::OK();
}

RopeKind rope_kind_for(const std::string& a, const Hp& hp) {
  if (in(a, {"glm4", "glm4moe", "hunyuan_vl"})) {
    const bool mrope = hp.rope_sections[0] > 0 && hp.rope_sections[1] > 0;
    if (mrope) return RopeKind::kMrope;
    return a == "glm4" ? RopeKind::kNorm : RopeKind::kNeox;
  }
  if (a == "dflash") {
    const auto& s = hp.rope_sections;
    if (s[0] || s[1] || s[2] || s[3]) return RopeKind::kMrope;
    return RopeKind::kNeox;
  }
  return table_rope(a);
}

}  // namespace

// ------------------------------------------------------------------ names
const char* rope_kind_name(RopeKind k) {
  switch (k) {
    case RopeKind::kUnknown: return "unknown";
    case RopeKind::kNone: return "none";
    case RopeKind::kNorm: return "norm";
    case RopeKind::kNeox: return "neox";
    case RopeKind::kMrope: return "mrope";
    case RopeKind::kImrope: return "imrope";
  }
  return "unknown";
}

const char* swa_kind_name(SwaKind k) {
  switch (k) {
    case SwaKind::kNone: return "none";
    case SwaKind::kStandard: return "standard";
    case SwaKind::kChunked: return "chunked";
    case SwaKind::kSymmetric: return "symmetric";
  }
  return "unknown";
}

const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::kNone: return "none";
    case MemoryKind::kKv: return "kv";
    case MemoryKind::kKvIswa: return "kv-iswa";
    case MemoryKind::kRecurrent: return "recurrent";
    case MemoryKind::kHybrid: return "hybrid";
    case MemoryKind::kHybridIswa: return "hybrid-iswa";
    case MemoryKind::kSpecial: return "special";
  }
  return "unknown";
}

std::optional<uint32_t> ModelProfile::uniform_head_dim_k() const {
  std::optional<uint32_t> d;
  for (const auto& l : layers) {
    if (!l.has_kv) continue;
    if (d && *d != l.head_dim_k) return std::nullopt;
    d = l.head_dim_k;
  }
  return d;
}

std::optional<uint32_t> ModelProfile::uniform_head_dim_v() const {
  std::optional<uint32_t> d;
  for (const auto& l : layers) {
    if (!l.has_kv || !l.has_v) continue;
    if (d && *d != l.head_dim_v) return std::nullopt;
    d = l.head_dim_v;
  }
  return d;
}

// ------------------------------------------------------------------ profile
Result<ModelProfile> profile_from_gguf(const GgufHeader& h) {
  ModelProfile p;
  auto arch = h.get_string("general.architecture");
  if (!arch.ok()) {
    if (arch.status().code() == Code::kNotFound) {
      return Status::Corruption(h.file + ": not a llama.cpp model: key 'general.architecture' not found");
    }
    return Status::Corruption(arch.status().message());
  }
  p.arch = *arch;
  if (p.arch.empty()) return Status::Corruption(h.file + ": key 'general.architecture' is empty");
  if (auto name = h.get_string("general.name"); name.ok()) p.name = std::move(*name);
  const Keys k(h, p.arch);
  Hp hp;

  if (arch_has_no_memory(p.arch)) {
    p.memory = MemoryKind::kNone;
    p.notes.push_back(p.arch + ": llama.cpp v0.5.0 keeps no KV memory for this arch (embedding/diffusion model)");
  }

  // general (llama_model_base::load_hparams)
  KV_RETURN_IF_ERROR(k.opt_u32("context_length", p.n_ctx_train).status());
  KV_RETURN_IF_ERROR(k.req_u32("embedding_length", hp.n_embd));
  KV_RETURN_IF_ERROR(k.req_u32("block_count", hp.n_layer_all));
  if (hp.n_layer_all == 0 || hp.n_layer_all > kMaxLayers) {
    return Status::Corruption(h.file + ": key '" + k.k("block_count") + "' is " + std::to_string(hp.n_layer_all) +
                              ", must be 1.." + std::to_string(kMaxLayers));
  }
  KV_RETURN_IF_ERROR(k.opt_u32("nextn_predict_layers", hp.n_layer_nextn).status());
  if (hp.n_layer_nextn > hp.n_layer_all) {
    return Status::Corruption(h.file + ": key '" + k.k("nextn_predict_layers") + "' " +
                              std::to_string(hp.n_layer_nextn) + " exceeds block_count " +
                              std::to_string(hp.n_layer_all));
  }
  const uint32_t L = hp.n_layer_all;
  hp.n_head.assign(L, 0);
  hp.n_ff.assign(L, 0);
  hp.is_swa.assign(L, 0);
  hp.is_recr.assign(L, arch_is_recurrent(p.arch) ? 1 : 0);
  KV_RETURN_IF_ERROR(k.opt_u32_or_arr("feed_forward_length", hp.n_ff, L).status());
  KV_RETURN_IF_ERROR(k.opt_u32_or_arr("attention.head_count", hp.n_head, L).status());
  hp.n_head_kv = hp.n_head;
  KV_RETURN_IF_ERROR(k.opt_u32_or_arr("attention.head_count_kv", hp.n_head_kv, L).status());

  if (hp.n_head[0] > 0) {
    hp.head_k_full = hp.n_embd / hp.n_head[0];
    KV_RETURN_IF_ERROR(k.opt_u32("attention.key_length", hp.head_k_full).status());
    hp.head_v_full = hp.n_embd / hp.n_head[0];
    KV_RETURN_IF_ERROR(k.opt_u32("attention.value_length", hp.head_v_full).status());
    hp.n_rot = hp.head_k_full;
    KV_RETURN_IF_ERROR(k.opt_u32("rope.dimension_count", hp.n_rot).status());
  }
  hp.head_k_swa = hp.head_k_full;
  hp.head_v_swa = hp.head_v_full;
  KV_RETURN_IF_ERROR(k.opt_u32("attention.key_length_swa", hp.head_k_swa).status());
  KV_RETURN_IF_ERROR(k.opt_u32("attention.value_length_swa", hp.head_v_swa).status());
  KV_RETURN_IF_ERROR(k.opt_u32("attention.key_length_mla", hp.mla_k).status());
  KV_RETURN_IF_ERROR(k.opt_u32("attention.value_length_mla", hp.mla_v).status());

  bool modelled = false;
  {
    Status s = load_arch(p.arch, k, hp, &modelled, p.notes);
    if (!s.ok()) {
      if (s.message().rfind(h.file, 0) != 0) return s.Prefixed(h.file);
      return s;
    }
  }
  if (!modelled) {
    p.inferred = true;
    p.notes.push_back("arch '" + p.arch + "' is not modelled by kvsnap: assumed the generic keys (block_count, " +
                      "attention.head_count[_kv], attention.key_length/value_length, else embedding_length / " +
                      "head_count), no SWA unless attention.sliding_window_pattern is present, no recurrent layers " +
                      "unless llama.cpp lists the arch as recurrent/hybrid (then head_count_kv == 0 marks them)");
    // generic guesses for what the arch code would have read
    if (hp.swa == SwaKind::kNone && k.has("attention.sliding_window") && k.has("attention.sliding_window_pattern")) {
      KV_RETURN_IF_ERROR(k.opt_u32("attention.sliding_window", hp.n_swa).status());
      if (hp.n_swa > 0) {
        hp.swa = SwaKind::kStandard;
        KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 1, false));
        p.notes.push_back("assumed standard SWA from attention.sliding_window(_pattern)");
      }
    }
    if (arch_is_hybrid(p.arch)) {
      for (uint32_t il = 0; il < hp.n_layer(); ++il) hp.is_recr[il] = hp.n_head_kv[il] == 0;
    }
    if (arch_is_hybrid(p.arch) || arch_is_recurrent(p.arch)) {
      KV_RETURN_IF_ERROR(k.opt_u32("ssm.conv_kernel", hp.ssm_d_conv).status());
      KV_RETURN_IF_ERROR(k.opt_u32("ssm.inner_size", hp.ssm_d_inner).status());
      KV_RETURN_IF_ERROR(k.opt_u32("ssm.state_size", hp.ssm_d_state).status());
      KV_RETURN_IF_ERROR(k.opt_u32("ssm.group_count", hp.ssm_n_group).status());
      KV_RETURN_IF_ERROR(k.opt_u32("wkv.head_size", hp.wkv_head_size).status());
      KV_RETURN_IF_ERROR(k.opt_u32("shortconv.l_cache", hp.shortconv_l_cache).status());
      p.notes.push_back("recurrent state widths (n_embd_r/n_embd_s) from the generic ssm/wkv/shortconv formula");
    }
    if (table_rope(p.arch) == RopeKind::kUnknown && !in(p.arch, {"glm4", "glm4moe", "hunyuan_vl", "dflash"})) {
      p.notes.push_back("rope type unknown for arch '" + p.arch + "': assumed no M-RoPE (no cell ext)");
    }
    KV_RETURN_IF_ERROR(k.opt_sections(hp.rope_sections).status());
  }
  if (k.has("ple.layers")) {
    auto n = h.get_array_size(k.k("ple.layers"));
    hp.ple = n.ok() && *n > 0;
  }

  // memory kind (llama_model::create_memory)
  if (p.memory != MemoryKind::kNone) {
    const bool any_swa = hp.swa != SwaKind::kNone;
    if (arch_has_special_memory(p.arch)) {
      p.memory = MemoryKind::kSpecial;
      p.notes.push_back(p.arch + ": llama.cpp v0.5.0 uses a dedicated cache (indexer / compressed / shared KV) " +
                        "whose state layout kvsnap does not model");
    } else if (p.arch == "hy_v4") {
      uint32_t top_k = 0;
      KV_RETURN_IF_ERROR(k.opt_u32("attention.indexer.top_k", top_k).status());
      p.memory = top_k == 0 ? MemoryKind::kKv : MemoryKind::kSpecial;
    } else if (arch_is_recurrent(p.arch)) {
      p.memory = MemoryKind::kRecurrent;
    } else if (arch_is_hybrid(p.arch)) {
      p.memory = any_swa ? MemoryKind::kHybridIswa : MemoryKind::kHybrid;
    } else {
      p.memory = any_swa ? MemoryKind::kKvIswa : MemoryKind::kKv;
    }
  }

  // attention / recurrent layer filters of create_memory
  const std::string& a = p.arch;
  auto attn_filter = [&](uint32_t il) -> bool {
    if (!hp.has_kv(il)) return false;  // llama_kv_cache skips these always
    if (p.memory == MemoryKind::kHybrid || p.memory == MemoryKind::kHybridIswa) {
      if (a == "falcon-h1") return true;
      if (in(a, {"nemotron_h", "nemotron_h_moe"})) return !hp.is_recr[il] && hp.n_ff[il] == 0;
      if (in(a, {"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})) {
        return il < hp.n_layer() && !hp.is_recr[il];
      }
      return !hp.is_recr[il];
    }
    if (hp.n_layer_nextn > 0 && hp.n_layer() > 0 && a != "graniteswitch") return il < hp.n_layer();
    return true;
  };
  auto recr_filter = [&](uint32_t il) -> bool {
    if (il >= hp.n_layer()) return false;  // the recurrent cache spans hparams.n_layer()
    if (p.memory == MemoryKind::kRecurrent) return true;
    if (a == "falcon-h1") return true;
    if (in(a, {"nemotron_h", "nemotron_h_moe"})) return hp.is_recr[il] && hp.n_ff[il] == 0;
    return hp.is_recr[il] != 0;
  };

  p.is_mla = hp.mla_k != 0 && hp.mla_v != 0;
  if (p.is_mla && !in(a, {"deepseek2", "mistral4", "deepseek2-ocr"})) {
    p.notes.push_back("MLA (key_length_mla/value_length_mla set): no V rows assumed");
  }
  p.n_layer = L;
  p.n_layer_nextn = hp.n_layer_nextn;
  p.n_embd = hp.n_embd;
  p.n_head = hp.n_head[0];
  p.n_head_kv = hp.n_head_kv[0];
  p.n_rot = hp.n_rot;
  p.rope_sections = hp.rope_sections;
  p.rope = rope_kind_for(a, hp);
  p.has_cell_ext = p.rope == RopeKind::kMrope || p.rope == RopeKind::kImrope || hp.ple;
  p.cell_ext_bytes = p.has_cell_ext ? kCellExtBytesV050 : 0;
  p.swa = hp.swa;
  p.n_swa = hp.n_swa;
  const bool has_recurrent_section = p.memory == MemoryKind::kRecurrent || p.is_hybrid();
  if (has_recurrent_section) {
    p.n_embd_r = hp.n_embd_r();
    p.n_embd_s = hp.n_embd_s();
  }
  const bool has_kv_section = p.memory == MemoryKind::kKv || p.memory == MemoryKind::kKvIswa || p.is_hybrid();
  p.layers.resize(L);
  for (uint32_t il = 0; il < L; ++il) {
    LayerProfile& l = p.layers[il];
    l.n_head = hp.n_head[il];
    l.n_head_kv = hp.n_head_kv[il];
    l.head_dim_k = hp.head_k(il);
    l.head_dim_v = hp.head_v(il);
    l.n_embd_k_gqa = l.head_dim_k * l.n_head_kv;
    l.n_embd_v_gqa = l.head_dim_v * l.n_head_kv;
    l.is_swa = hp.is_swa[il] != 0;
    l.is_recurrent = hp.is_recr[il] != 0;
    l.has_kv = has_kv_section && attn_filter(il);
    l.has_v = l.has_kv && !p.is_mla;
    l.in_recurrent = has_recurrent_section && recr_filter(il);
  }
  if (p.memory == MemoryKind::kKvIswa || p.memory == MemoryKind::kHybridIswa) {
    bool any = false;
    for (const auto& l : p.layers) any = any || (l.is_swa && l.has_kv);
    if (!any) p.notes.push_back("SWA is on but no KV layer is SWA: the SWA section has no layers");
  }
  if (hp.n_layer_kv_from_start >= 0 && uint32_t(hp.n_layer_kv_from_start) < L) {
    p.notes.push_back("layers >= " + std::to_string(hp.n_layer_kv_from_start) +
                      " reuse the KV cache of earlier layers (no rows of their own)");
  }

  // vocabulary
  if (auto n = h.get_array_size("tokenizer.ggml.tokens"); n.ok()) {
    p.n_vocab = static_cast<uint32_t>(std::min<uint64_t>(*n, UINT32_MAX));
  } else {
    KV_RETURN_IF_ERROR(k.opt_u32("vocab_size", p.n_vocab).status());
  }
  return p;
}

Result<ModelProfile> load_model_profile(Io& io, const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, io.open_read(path));
  KV_ASSIGN_OR_RETURN(GgufHeader h, read_gguf(*f));
  KV_ASSIGN_OR_RETURN(ModelProfile p, profile_from_gguf(h));
  KV_ASSIGN_OR_RETURN(p.fingerprint, gguf_fingerprint(*f, h));
  return p;
}

// ------------------------------------------------------------------ sections
Result<std::vector<MemorySectionLayout>> memory_sections(const ModelProfile& p) {
  std::vector<MemorySectionLayout> out;
  if (p.memory == MemoryKind::kSpecial) {
    return Status::NotSupported("arch '" + p.arch + "': llama.cpp v0.5.0 keeps a " +
                                "dedicated cache for it whose state layout kvsnap does not model");
  }
  auto kv_section = [&](const char* name, bool swa_part, bool select_swa) {
    MemorySectionLayout s;
    s.kind = SectionKind::kKv;
    s.name = name;
    s.swa = swa_part && select_swa;
    s.cell_ext_bytes = p.cell_ext_bytes;
    for (uint32_t il = 0; il < p.layers.size(); ++il) {
      const LayerProfile& l = p.layers[il];
      if (!l.has_kv) continue;
      if (swa_part && l.is_swa != select_swa) continue;
      SectionLayer sl;
      sl.il = il;
      sl.n_embd_k_gqa = l.n_embd_k_gqa;
      sl.n_embd_v_gqa = l.has_v ? l.n_embd_v_gqa : 0;
      sl.head_dim_k = l.head_dim_k;
      sl.head_dim_v = l.head_dim_v;
      sl.has_v = l.has_v;
      s.layers.push_back(sl);
    }
    s.n_layer_field = static_cast<uint32_t>(s.layers.size());
    return s;
  };
  auto recurrent_section = [&]() {
    MemorySectionLayout s;
    s.kind = SectionKind::kRecurrent;
    s.name = "recurrent";
    s.n_layer_field = p.n_layer - p.n_layer_nextn;
    for (uint32_t il = 0; il < p.layers.size(); ++il) {
      if (!p.layers[il].in_recurrent) continue;
      SectionLayer sl;
      sl.il = il;
      sl.has_v = false;
      sl.n_embd_r = p.n_embd_r;
      sl.n_embd_s = p.n_embd_s;
      s.layers.push_back(sl);
    }
    return s;
  };
  switch (p.memory) {
    case MemoryKind::kNone: break;
    case MemoryKind::kSpecial: break;
    case MemoryKind::kKv: out.push_back(kv_section("kv", false, false)); break;
    case MemoryKind::kKvIswa:
      out.push_back(kv_section("kv_base", true, false));
      out.back().omitted_if_partial = true;
      out.push_back(kv_section("kv_swa", true, true));
      break;
    case MemoryKind::kRecurrent: out.push_back(recurrent_section()); break;
    case MemoryKind::kHybrid:
      out.push_back(kv_section("kv", false, false));
      out.back().omitted_if_partial = true;
      out.push_back(recurrent_section());
      break;
    case MemoryKind::kHybridIswa:
      // llama_memory_hybrid_iswa passes the flags to the iSWA cache (which drops
      // its base part for partial states) and always writes the attention part
      out.push_back(kv_section("kv_base", true, false));
      out.back().omitted_if_partial = true;
      out.push_back(kv_section("kv_swa", true, true));
      out.push_back(recurrent_section());
      break;
  }
  return out;
}

// ------------------------------------------------------------------ describe
std::string describe(const ModelProfile& p) {
  std::string s;
  s += "arch " + p.arch + (p.name.empty() ? "" : " (" + p.name + ")") + (p.inferred ? " [inferred]" : "") + "\n";
  s += "n_layer " + std::to_string(p.n_layer);
  if (p.n_layer_nextn) s += " (+" + std::to_string(p.n_layer_nextn) + " MTP)";
  s += ", n_embd " + std::to_string(p.n_embd) + ", n_head " + std::to_string(p.n_head) + ", n_head_kv " +
       std::to_string(p.n_head_kv) + ", n_vocab " + std::to_string(p.n_vocab) + "\n";
  s += std::string("rope ") + rope_kind_name(p.rope) + ", n_rot " + std::to_string(p.n_rot) +
       (p.has_cell_ext ? ", cell ext " + std::to_string(p.cell_ext_bytes) + " bytes" : "") + "\n";
  s += std::string("memory ") + memory_kind_name(p.memory);
  if (p.swa != SwaKind::kNone) s += std::string(", swa ") + swa_kind_name(p.swa) + " n_swa " + std::to_string(p.n_swa);
  if (p.is_mla) s += ", MLA (no V)";
  if (p.n_embd_r || p.n_embd_s) s += ", n_embd_r " + std::to_string(p.n_embd_r) + " n_embd_s " + std::to_string(p.n_embd_s);
  s += "\n";
  auto secs = memory_sections(p);
  if (secs.ok()) {
    for (const auto& sec : *secs) {
      s += "  section " + sec.name + ": n_layer " + std::to_string(sec.n_layer_field);
      if (sec.kind == SectionKind::kKv) {
        s += ", layers [";
        for (size_t i = 0; i < sec.layers.size(); ++i) {
          const auto& l = sec.layers[i];
          if (i) s += ", ";
          s += std::to_string(l.il) + ":" + std::to_string(l.n_embd_k_gqa) + "/" +
               (l.has_v ? std::to_string(l.n_embd_v_gqa) : std::string("-"));
        }
        s += "] (layer:k/v width)";
      } else {
        s += ", state layers [";
        for (size_t i = 0; i < sec.layers.size(); ++i) s += (i ? "," : "") + std::to_string(sec.layers[i].il);
        s += "]";
      }
      s += "\n";
    }
  }
  for (const auto& n : p.notes) s += "note: " + n + "\n";
  if (!p.fingerprint.empty()) s += "fingerprint " + p.fingerprint + "\n";
  return s;
}

}  // namespace kvsnap
