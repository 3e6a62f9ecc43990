#include "format/ggml_types.h"

#include <iterator>
#include <limits>
#include <string>

namespace kvsnap {
namespace {

// ---- compile-time checks of the table (a wrong row does not build) ----------------------------

constexpr bool ids_are_indices() {
  for (size_t i = 0; i < kGgmlTypes.size(); i++) {
    if (static_cast<size_t>(kGgmlTypes[i].id) != i) return false;
  }
  return true;
}
static_assert(ids_are_indices(), "kGgmlTypes: row i must be ggml type id i (removed ids keep their row)");

constexpr bool rows_are_consistent() {
  for (const TypeLayout& t : kGgmlTypes) {
    const bool none = t.kind == TypeKind::kNone;
    if (none != (t.block_elems == 0) || none != (t.block_bytes == 0) || none != t.name.empty()) return false;
    if (t.quantized != (t.kind == TypeKind::kQuantized)) return false;
    if ((t.kind == TypeKind::kFloat || t.kind == TypeKind::kInt) && t.block_elems != 1) return false;
    if (t.kind == TypeKind::kQuantized && t.block_elems < 32) return false;
    if (t.kv_cache() && t.kind != TypeKind::kFloat && t.kind != TypeKind::kQuantized) return false;
  }
  for (size_t i = 0; i < kGgmlTypes.size(); i++) {
    for (size_t j = i + 1; j < kGgmlTypes.size(); j++) {
      if (!kGgmlTypes[i].name.empty() && kGgmlTypes[i].name == kGgmlTypes[j].name) return false;
    }
  }
  return true;
}
static_assert(rows_are_consistent(), "kGgmlTypes: kind, sizes and name must agree; names must be unique");

constexpr bool layout_is(GgmlType id, std::string_view name, uint32_t elems, uint32_t bytes) {
  const TypeLayout& t = ggml_layout(id);
  return t.id == id && t.name == name && t.block_elems == elems && t.block_bytes == bytes && t.kv_cache();
}
// ggml-common.h block structs of the nine KV cache types.
static_assert(layout_is(GgmlType::kF32, "f32", 1, 4), "f32: 4 bytes");
static_assert(layout_is(GgmlType::kF16, "f16", 1, 2), "f16: 2 bytes");
static_assert(layout_is(GgmlType::kBF16, "bf16", 1, 2), "bf16: 2 bytes");
static_assert(layout_is(GgmlType::kQ8_0, "q8_0", 32, 34), "q8_0: f16 scale + 32 int8");
static_assert(layout_is(GgmlType::kQ4_0, "q4_0", 32, 18), "q4_0: f16 scale + 32 nibbles");
static_assert(layout_is(GgmlType::kQ4_1, "q4_1", 32, 20), "q4_1: f16 scale, f16 min + 32 nibbles");
static_assert(layout_is(GgmlType::kIQ4_NL, "iq4_nl", 32, 18), "iq4_nl: f16 scale + 32 nibbles");
static_assert(layout_is(GgmlType::kQ5_0, "q5_0", 32, 22), "q5_0: f16 scale, 32 high bits + nibbles");
static_assert(layout_is(GgmlType::kQ5_1, "q5_1", 32, 24), "q5_1: scale, min, high bits + nibbles");
// A few of the others the GGUF reader sizes model tensors with.
static_assert(kGgmlTypes[12].name == "q4_K" && kGgmlTypes[12].block_elems == 256 && kGgmlTypes[12].block_bytes == 144);
static_assert(kGgmlTypes[14].name == "q6_K" && kGgmlTypes[14].block_bytes == 210);
static_assert(kGgmlTypes[28].name == "f64" && kGgmlTypes[28].block_bytes == 8);
static_assert(find_ggml_type(4) == nullptr && find_ggml_type(kGgmlTypeCount) == nullptr, "removed / unknown ids");

// A second opinion on the kTypeKvCache flags, kept by hand on purpose: llama.cpp's own list
// (common/arg.cpp kv_cache_types, v0.5.0), in ggml enum order, with the GgmlType enumerators
// that name them. A row flagged (or unflagged) by mistake fails here; a new KV cache type is
// added here too, after checking llama.cpp accepts it for -ctk/-ctv. The count follows from it.
constexpr GgmlType kLlamaKvCacheTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kQ4_0,
                                           GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                                           GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kBF16};
static_assert(kKvCacheTypes.size() == std::size(kLlamaKvCacheTypes), "kTypeKvCache rows vs llama.cpp's list");
constexpr bool kv_types_in_enum_order() {
  for (size_t i = 0; i < kKvCacheTypes.size(); i++) {
    if (kKvCacheTypes[i].id != kLlamaKvCacheTypes[i]) return false;
  }
  return true;
}
static_assert(kv_types_in_enum_order(), "kKvCacheTypes: the GgmlType enumerators, in enum order");
constexpr bool find_type_finds_every_row() {
  for (const TypeLayout& t : kKvCacheTypes) {
    if (find_type(static_cast<int32_t>(t.id)) != &t || find_type(t.name) != &t) return false;
  }
  return true;
}
static_assert(find_type_finds_every_row() && !find_type(12) && !find_type("q4_K"));

}  // namespace

Result<uint64_t> row_bytes(const TypeLayout& t, uint64_t n_elems) {
  if (n_elems % t.block_elems != 0) {
    return Status::Mismatch(std::to_string(n_elems) + " values are not a whole number of " + std::string(t.name) +
                            " blocks of " + std::to_string(t.block_elems));
  }
  return n_elems / t.block_elems * t.block_bytes;
}

std::optional<uint64_t> row_elems(const TypeLayout& t, uint64_t bytes) {
  if (bytes % t.block_bytes != 0) return std::nullopt;
  return bytes / t.block_bytes * t.block_elems;
}

std::string kv_cache_type_names() {
  std::string names;
  for (const TypeLayout& t : kKvCacheTypes) names += (names.empty() ? "" : " ") + std::string(t.name);
  return names;
}

std::string type_name(int32_t id) {
  if (const TypeLayout* t = find_type(id)) return std::string(t->name);
  return "type " + std::to_string(id);
}

std::optional<uint64_t> ggml_nbytes(int32_t type, uint64_t n) {
  const TypeLayout* r = find_ggml_type(type);
  if (!r || n % r->block_elems != 0) return std::nullopt;
  const uint64_t blocks = n / r->block_elems;
  if (blocks > std::numeric_limits<uint64_t>::max() / r->block_bytes) return std::nullopt;
  return blocks * r->block_bytes;
}

std::string ggml_type_name_any(int32_t type) {
  const TypeLayout* r = find_ggml_type(type);
  return r ? std::string(r->name) : "type " + std::to_string(type);
}

}  // namespace kvsnap
