// Internal to format/model_*.cc: llama.cpp v0.5.0's per-arch knowledge (which
// archs are recurrent, hybrid, plain; their rope type; the keys each arch's
// load_arch_hparams reads) for profile_from_gguf (model_profile.cc). Kept apart
// so that a new arch goes in model_arch.cc, and model_profile.cc only turns the
// hparams mirror into a ModelProfile.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "format/gguf.h"
#include "format/model_profile.h"

namespace kvsnap::model_detail {

constexpr uint32_t kMaxLayers = 512;  // LLAMA_MAX_LAYERS

inline bool in(std::string_view arch, std::initializer_list<std::string_view> list) {
  return std::find(list.begin(), list.end(), arch) != list.end();
}

// llama_model_rope_type() of v0.5.0; kUnknown for archs it does not list and
// for those that decide from their rope sections (see rope_kind_for).
RopeKind table_rope(std::string_view a);
// llm_arch_is_recurrent / llm_arch_is_hybrid of v0.5.0.
bool arch_is_recurrent(std::string_view a);
bool arch_is_hybrid(std::string_view a);
// create_memory() returns no memory for these.
bool arch_has_no_memory(std::string_view a);
// create_memory() builds a cache kvsnap does not model for these.
bool arch_has_special_memory(std::string_view a);

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
Status load_swa_pattern(const Keys& k, Hp& hp, uint32_t n_pattern, bool dense_first);

// Per-arch part of load_hparams (src/models/<arch>.cpp, load_arch_hparams).
// Sets *modelled to false for archs it only approximates.
Status load_arch(const std::string& a, const Keys& k, Hp& hp, bool* modelled, std::vector<std::string>& notes);

// The rope type, including the archs that decide it from their rope sections.
RopeKind rope_kind_for(const std::string& a, const Hp& hp);

}  // namespace kvsnap::model_detail
