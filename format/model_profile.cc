#include "format/model_profile.h"

#include <algorithm>
#include <memory>
#include <string_view>

#include "format/model_arch_internal.h"

namespace kvsnap {

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
namespace {

using namespace model_detail;

constexpr uint32_t kCellExtBytesV050 = 12;  // sizeof(llama_kv_cell_ext) in v0.5.0: x, y, tok

// general.architecture (required) and general.name (optional).
Status read_names(const GgufHeader& h, ModelProfile& p) {
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
  return Status::OK();
}

// Layer counts and per-layer head counts (llama_model_base::load_hparams).
Status load_layer_counts(const GgufHeader& h, const Keys& k, ModelProfile& p, Hp& hp) {
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
  return Status::OK();
}

// Head sizes: key/value_length (else n_embd / n_head), their SWA and MLA
// variants, and the rotary dimension.
Status load_head_dims(const Keys& k, Hp& hp) {
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
  return Status::OK();
}

// load_arch, with its errors naming the file (once).
Status load_arch_keys(const GgufHeader& h, const Keys& k, ModelProfile& p, Hp& hp, bool* modelled) {
  Status s = load_arch(p.arch, k, hp, modelled, p.notes);
  if (!s.ok() && s.message().rfind(h.file, 0) != 0) return s.Prefixed(h.file);
  return s;
}

// For an arch kvsnap does not model: what its arch code would most likely
// have read, each guess written down in p.notes.
Status guess_unmodelled(const Keys& k, ModelProfile& p, Hp& hp) {
  p.inferred = true;
  p.notes.push_back("arch '" + p.arch + "' is not modelled by kvsnap: assumed the generic keys (block_count, " +
                    "attention.head_count[_kv], attention.key_length/value_length, else embedding_length / " +
                    "head_count), no SWA unless attention.sliding_window_pattern is present, no recurrent layers " +
                    "unless llama.cpp lists the arch as recurrent/hybrid (then head_count_kv == 0 marks them)");
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
  return k.opt_sections(hp.rope_sections).status();
}

// Which memory llama_model::create_memory builds (p.memory stays kNone for
// archs without memory).
Status decide_memory(const Keys& k, ModelProfile& p, const Hp& hp) {
  if (p.memory == MemoryKind::kNone) return Status::OK();
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
  return Status::OK();
}

// The attention-layer filter of create_memory: does layer il have KV rows?
bool attention_filter(const ModelProfile& p, const Hp& hp, uint32_t il) {
  const std::string& a = p.arch;
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
}

// The recurrent-layer filter of create_memory: does layer il have state rows?
bool recurrent_filter(const ModelProfile& p, const Hp& hp, uint32_t il) {
  const std::string& a = p.arch;
  if (il >= hp.n_layer()) return false;  // the recurrent cache spans hparams.n_layer()
  if (p.memory == MemoryKind::kRecurrent) return true;
  if (a == "falcon-h1") return true;
  if (in(a, {"nemotron_h", "nemotron_h_moe"})) return hp.is_recr[il] && hp.n_ff[il] == 0;
  return hp.is_recr[il] != 0;
}

// The model-wide fields of the profile: sizes, rope, cell ext, SWA, MLA and
// the recurrent state widths.
void fill_model_fields(ModelProfile& p, const Hp& hp) {
  p.is_mla = hp.mla_k != 0 && hp.mla_v != 0;
  if (p.is_mla && !in(p.arch, {"deepseek2", "mistral4", "deepseek2-ocr"})) {
    p.notes.push_back("MLA (key_length_mla/value_length_mla set): no V rows assumed");
  }
  p.n_layer = hp.n_layer_all;
  p.n_layer_nextn = hp.n_layer_nextn;
  p.n_embd = hp.n_embd;
  p.n_head = hp.n_head[0];
  p.n_head_kv = hp.n_head_kv[0];
  p.n_rot = hp.n_rot;
  p.rope_sections = hp.rope_sections;
  p.rope = rope_kind_for(p.arch, hp);
  p.has_cell_ext = p.rope == RopeKind::kMrope || p.rope == RopeKind::kImrope || hp.ple;
  p.cell_ext_bytes = p.has_cell_ext ? kCellExtBytesV050 : 0;
  p.swa = hp.swa;
  p.n_swa = hp.n_swa;
  if (p.memory == MemoryKind::kRecurrent || p.is_hybrid()) {
    p.n_embd_r = hp.n_embd_r();
    p.n_embd_s = hp.n_embd_s();
  }
}

// One LayerProfile per layer, then notes on layer maps worth knowing.
void fill_layers(ModelProfile& p, const Hp& hp) {
  const uint32_t L = hp.n_layer_all;
  const bool has_recurrent_section = p.memory == MemoryKind::kRecurrent || p.is_hybrid();
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
    l.has_kv = has_kv_section && attention_filter(p, hp, il);
    l.has_v = l.has_kv && !p.is_mla;
    l.in_recurrent = has_recurrent_section && recurrent_filter(p, hp, il);
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
}

// The vocabulary size: the token list's length, else <arch>.vocab_size.
Status read_vocab(const GgufHeader& h, const Keys& k, ModelProfile& p) {
  if (auto n = h.get_array_size("tokenizer.ggml.tokens"); n.ok()) {
    p.n_vocab = static_cast<uint32_t>(std::min<uint64_t>(*n, UINT32_MAX));
    return Status::OK();
  }
  return k.opt_u32("vocab_size", p.n_vocab).status();
}

}  // namespace

Result<ModelProfile> profile_from_gguf(const GgufHeader& h) {
  ModelProfile p;
  KV_RETURN_IF_ERROR(read_names(h, p));
  const Keys k(h, p.arch);
  Hp hp;
  if (arch_has_no_memory(p.arch)) {
    p.memory = MemoryKind::kNone;
    p.notes.push_back(p.arch + ": llama.cpp v0.5.0 keeps no KV memory for this arch (embedding/diffusion model)");
  }
  KV_RETURN_IF_ERROR(load_layer_counts(h, k, p, hp));
  KV_RETURN_IF_ERROR(load_head_dims(k, hp));
  bool modelled = false;
  KV_RETURN_IF_ERROR(load_arch_keys(h, k, p, hp, &modelled));
  if (!modelled) KV_RETURN_IF_ERROR(guess_unmodelled(k, p, hp));
  if (k.has("ple.layers")) {
    auto n = h.get_array_size(k.k("ple.layers"));
    hp.ple = n.ok() && *n > 0;
  }
  KV_RETURN_IF_ERROR(decide_memory(k, p, hp));
  fill_model_fields(p, hp);
  fill_layers(p, hp);
  KV_RETURN_IF_ERROR(read_vocab(h, k, p));
  for (const GgufTensorInfo& t : h.tensors) {
    if (t.name == "rope_factors_long.weight" || t.name == "rope_factors_short.weight") p.rope_long_short_factors = true;
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
namespace {

// A KV section: every KV layer, or (swa_part) only the SWA or only the
// non-SWA ones.
MemorySectionLayout kv_section(const ModelProfile& p, const char* name, bool swa_part, bool select_swa) {
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
}

// The recurrent section: its n_layer field counts every main layer, its rows
// only the recurrent ones.
MemorySectionLayout recurrent_section(const ModelProfile& p) {
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
}

// An iSWA cache: the base part (dropped from partial states), then the SWA part.
void push_iswa_sections(const ModelProfile& p, std::vector<MemorySectionLayout>& out) {
  out.push_back(kv_section(p, "kv_base", true, false));
  out.back().omitted_if_partial = true;
  out.push_back(kv_section(p, "kv_swa", true, true));
}

}  // namespace

Result<std::vector<MemorySectionLayout>> memory_sections(const ModelProfile& p) {
  std::vector<MemorySectionLayout> out;
  switch (p.memory) {
    case MemoryKind::kNone: break;
    case MemoryKind::kSpecial:
      return Status::NotSupported("arch '" + p.arch + "': llama.cpp v0.5.0 keeps a " +
                                  "dedicated cache for it whose state layout kvsnap does not model");
    case MemoryKind::kKv: out.push_back(kv_section(p, "kv", false, false)); break;
    case MemoryKind::kKvIswa: push_iswa_sections(p, out); break;
    case MemoryKind::kRecurrent: out.push_back(recurrent_section(p)); break;
    case MemoryKind::kHybrid:
      out.push_back(kv_section(p, "kv", false, false));
      out.back().omitted_if_partial = true;
      out.push_back(recurrent_section(p));
      break;
    case MemoryKind::kHybridIswa:
      // llama_memory_hybrid_iswa passes the flags to the iSWA cache (which drops
      // its base part for partial states) and always writes the attention part
      push_iswa_sections(p, out);
      out.push_back(recurrent_section(p));
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
