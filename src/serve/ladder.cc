#include "serve/ladder.h"

#include <charconv>

#include "format/ggml_types.h"

namespace kvsnap {

namespace {

constexpr uint64_t kCtxPad = 256;

Result<const TypeLayout*> rung_type(const std::string& name, const std::string& spec) {
  const TypeLayout* t = find_type(name);
  if (!t)
    return Status::InvalidArgument("--dynamic-cache '" + spec + "': '" + name + "' is not a cache type llama-server " +
                                   "takes (" + kv_cache_type_names() + ")");
  return t;
}

Result<uint64_t> bytes_per_token(const ModelInfo& m, const TypeLayout& kt, const TypeLayout& vt) {
  if (!m.shape.kv_sections_known || m.shape.kv_sections.empty())
    return Status::NotSupported("--dynamic-cache: the model " + m.path + " has no K/V cache kvsnap can size");
  uint64_t total = 0;
  for (const KvSectionShape& sec : m.shape.kv_sections) {
    for (size_t il = 0; il < sec.n_embd_k_gqa.size(); ++il) {
      KV_ASSIGN_OR_RETURN(uint64_t k, row_bytes(kt, sec.n_embd_k_gqa[il]));
      total += k;
      if (!sec.has_v.empty() && !sec.has_v[il]) continue;
      KV_ASSIGN_OR_RETURN(uint64_t v, row_bytes(vt, sec.n_embd_v_gqa[il]));
      total += v;
    }
  }
  return total;
}

}  // namespace

Result<uint64_t> parse_budget(const std::string& s) {
  uint64_t n = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  const std::string unit(end, s.data() + s.size());
  uint64_t mul = unit.empty() ? 1 : unit == "K" ? 1ull << 10 : unit == "M" ? 1ull << 20 : unit == "G" ? 1ull << 30 : 0;
  if (ec != std::errc() || mul == 0 || n == 0)
    return Status::InvalidArgument("--cache-budget '" + s + "' must be bytes: a number, optionally with K, M or G");
  return n * mul;
}

Result<Ladder> make_ladder(const std::string& spec, uint64_t budget, const ModelInfo& model,
                           const std::string& flash_attn) {
  Ladder l;
  l.budget = budget;
  size_t p = 0;
  while (p <= spec.size()) {
    size_t q = spec.find(',', p);
    if (q == std::string::npos) q = spec.size();
    const std::string item = spec.substr(p, q - p);
    const size_t slash = item.find('/');
    Rung r;
    r.ctk = item.substr(0, slash);
    r.ctv = slash == std::string::npos ? r.ctk : item.substr(slash + 1);
    KV_ASSIGN_OR_RETURN(const TypeLayout* kt, rung_type(r.ctk, spec));
    KV_ASSIGN_OR_RETURN(const TypeLayout* vt, rung_type(r.ctv, spec));
    if (vt->quantized && flash_attn == "off")
      return Status::InvalidArgument("--dynamic-cache rung " + item + ": llama-server takes a quantized V cache only with "
                                     "flash attention, and its ARGS say -fa off");
    auto bpt = bytes_per_token(model, *kt, *vt);
    if (!bpt.ok()) return bpt.status().Prefixed("--dynamic-cache rung " + item);
    r.bytes_per_token = *bpt;
    if (!l.rungs.empty() && r.bytes_per_token >= l.rungs.back().bytes_per_token)
      return Status::InvalidArgument("--dynamic-cache rung " + item + " holds " + std::to_string(r.bytes_per_token) +
                                     " bytes a token, the rung before it " +
                                     std::to_string(l.rungs.back().bytes_per_token) +
                                     ": each rung must be smaller than the one before (e.g. f16,q8_0,q4_0)");
    const uint64_t ctx = budget / r.bytes_per_token / kCtxPad * kCtxPad;
    if (ctx == 0 || ctx > (1u << 30))
      return Status::InvalidArgument("--cache-budget " + std::to_string(budget) + " bytes holds " +
                                     std::to_string(budget / r.bytes_per_token) + " tokens at " + item + " (" +
                                     std::to_string(r.bytes_per_token) + " bytes each): at least " +
                                     std::to_string(kCtxPad) + " are needed");
    r.ctx_size = int(ctx);
    l.rungs.push_back(std::move(r));
    p = q + 1;
  }
  if (l.rungs.size() < 2)
    return Status::InvalidArgument("--dynamic-cache '" + spec + "' needs two rungs or more (e.g. f16,q8_0,q4_0)");
  return l;
}

}  // namespace kvsnap
