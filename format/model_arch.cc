// llama.cpp v0.5.0's per-arch knowledge: see model_arch_internal.h.
#include "format/model_arch_internal.h"

namespace kvsnap::model_detail {

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

namespace {

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

}  // namespace

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

namespace {

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

// The plain archs read only the generic keys; the M-RoPE ones among them also
// their rope sections, which three of them require.
Status load_plain(const std::string& a, const Keys& k, Hp& hp) {
  if (in(a, {"glm4", "glm4moe", "hunyuan_vl"})) KV_RETURN_IF_ERROR(k.opt_sections(hp.rope_sections).status());
  if (in(a, {"qwen2vl", "qwen3vl", "qwen3vlmoe", "paddleocr", "qwen3tts"})) {
    KV_ASSIGN_OR_RETURN(bool found, k.opt_sections(hp.rope_sections));
    if (!found && in(a, {"qwen2vl", "qwen3vl", "qwen3vlmoe"})) {
      return Status::Corruption("key '" + k.k("rope.dimension_sections") + "' not found (llama.cpp requires it)");
    }
  }
  return Status::OK();
}

// Each loader below reads what load_arch_hparams reads for its family of
// archs and returns true, or returns false when `a` is not one of them.
using ArchLoader = Result<bool> (*)(const std::string& a, const Keys& k, Hp& hp, std::vector<std::string>& notes);

// phi3 and the gemma family: each reads its SWA in a way of its own.
Result<bool> load_phi_gemma(const std::string& a, const Keys& k, Hp& hp, std::vector<std::string>& notes) {
  if (a == "phi3") {
    // SWA is read but disabled in v0.5.0 ("Phi SWA is currently disabled")
    uint32_t n_swa = 0;
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", n_swa));
    if (found && n_swa > 0) notes.push_back("phi3: sliding_window is ignored by llama.cpp v0.5.0 (all layers dense)");
    return true;
  }
  if (a == "gemma2") {
    hp.swa = SwaKind::kStandard;
    hp.n_swa = 4096;
    KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 2, false));
    KV_RETURN_IF_ERROR(k.opt_u32("attention.sliding_window", hp.n_swa).status());
    return true;
  }
  if (a == "gemma3") {
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", hp.n_swa));
    if (found && hp.n_swa > 0) {
      hp.swa = SwaKind::kStandard;
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 6, false));
    }
    return true;
  }
  if (a == "gemma3n") {
    hp.swa = SwaKind::kStandard;
    KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 5, false));
    hp.n_layer_kv_from_start = 20;
    KV_RETURN_IF_ERROR(k.req_u32("attention.sliding_window", hp.n_swa));
    return true;
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
    return true;
  }
  return false;
}

// The archs whose load_arch_hparams is one call of load_swa_pattern with
// fixed arguments: a table, so that such an arch is one row.
Result<bool> load_swa_table(const std::string& a, const Keys& k, Hp& hp, std::vector<std::string>&) {
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
    return true;
  }
  return false;
}

// SWA archs with a twist the table cannot say (a window the file cannot
// override, a layer-count condition, chunked attention, a required array).
Result<bool> load_swa_other(const std::string& a, const Keys& k, Hp& hp, std::vector<std::string>&) {
  if (a == "smallthinker") {
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", hp.n_swa));
    if (found && hp.n_swa > 0) {
      hp.swa = SwaKind::kStandard;
      hp.n_swa = 4096;  // overrides the file, as llama.cpp does
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 4, true));
    }
    return true;
  }
  if (a == "exaone4") {
    if (hp.n_layer() == 64) {
      hp.swa = SwaKind::kStandard;
      hp.n_swa = 4096;
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 4, false));
    }
    KV_RETURN_IF_ERROR(k.opt_u32("attention.sliding_window", hp.n_swa).status());
    return true;
  }
  if (a == "llama4") {
    KV_ASSIGN_OR_RETURN(bool found, k.opt_u32("attention.sliding_window", hp.n_swa));
    if (!(found && hp.n_swa == 0)) {
      hp.swa = SwaKind::kChunked;
      hp.n_swa = 8192;
      KV_RETURN_IF_ERROR(load_swa_pattern(k, hp, 4, false));
    }
    return true;
  }
  if (in(a, {"granite_swa", "maple", "mimo2", "spark2_5", "step35"})) {
    hp.swa = SwaKind::kStandard;
    KV_RETURN_IF_ERROR(require_swa_array(k, hp));
    KV_RETURN_IF_ERROR(k.req_u32("attention.sliding_window", hp.n_swa));
    return true;
  }
  return false;
}

// Purely recurrent archs: the widths of their state.
Result<bool> load_recurrent(const std::string& a, const Keys& k, Hp& hp, std::vector<std::string>&) {
  if (in(a, {"mamba", "mamba2"})) {
    KV_RETURN_IF_ERROR(load_ssm(k, hp, a == "mamba2"));
    return true;
  }
  if (in(a, {"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})) {
    KV_RETURN_IF_ERROR(k.req_u32("wkv.head_size", hp.wkv_head_size));
    KV_RETURN_IF_ERROR(k.opt_u32("token_shift_count", hp.token_shift_count).status());
    return true;
  }
  return false;
}

// Hybrids: the state widths plus which layers are recurrent, each arch by its
// own rule.
Result<bool> load_hybrid(const std::string& a, const Keys& k, Hp& hp, std::vector<std::string>&) {
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
    return true;
  }
  if (a == "granitehybrid" || a == "jamba") {
    KV_RETURN_IF_ERROR(load_ssm(k, hp, a == "granitehybrid"));
    for (uint32_t il = 0; il < hp.n_layer(); ++il) hp.is_recr[il] = hp.n_head_kv[il] == 0;
    return true;
  }
  if (a == "falcon-h1") {
    KV_RETURN_IF_ERROR(load_ssm(k, hp, true));
    std::fill(hp.is_recr.begin(), hp.is_recr.end(), 1);
    return true;
  }
  if (in(a, {"nemotron_h", "nemotron_h_moe"})) {
    KV_RETURN_IF_ERROR(load_ssm(k, hp, true));
    for (uint32_t il = 0; il < hp.n_layer_all; ++il) {
      hp.is_recr[il] = il < hp.n_layer() && hp.n_head_kv[il] == 0 && hp.n_ff[il] == 0;
    }
    return true;
  }
  if (in(a, {"qwen3next", "qwen35", "qwen35moe"})) {
    if (a != "qwen3next") {
      KV_ASSIGN_OR_RETURN(bool found, k.opt_sections(hp.rope_sections));
      if (!found) return Status::Corruption("key '" + k.k("rope.dimension_sections") + "' not found (llama.cpp requires it)");
    }
    KV_RETURN_IF_ERROR(load_ssm(k, hp, true));
    KV_RETURN_IF_ERROR(load_recurrent_layers(k, hp));
    return true;
  }
  return false;
}

}  // namespace

Status load_arch(const std::string& a, const Keys& k, Hp& hp, bool* modelled, std::vector<std::string>& notes) {
  *modelled = true;
  if (arch_is_plain(a)) return load_plain(a, k, hp);
  // the families are disjoint: at most one loader knows `a`
  for (ArchLoader load : {load_phi_gemma, load_swa_table, load_swa_other, load_recurrent, load_hybrid}) {
    KV_ASSIGN_OR_RETURN(bool known, load(a, k, hp, notes));
    if (known) return Status::OK();
  }
  *modelled = false;
  if (in(a, {"deepseek2", "mistral4", "deepseek2-ocr"})) {
    // generic keys plus MLA (read in profile_from_gguf)
    notes.push_back(a + ": MLA layout taken from attention.key_length / key_length_mla; not verified against "
                        "llama.cpp");
  }
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

}  // namespace kvsnap::model_detail
