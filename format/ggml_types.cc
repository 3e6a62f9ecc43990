#include "format/ggml_types.h"

#include <array>
#include <string>

namespace kvsnap {
namespace {

constexpr std::array<TypeLayout, 9> kTypes = {{
    {GgmlType::kF32, "f32", 1, 4, false},
    {GgmlType::kF16, "f16", 1, 2, false},
    {GgmlType::kQ4_0, "q4_0", 32, 18, true},
    {GgmlType::kQ4_1, "q4_1", 32, 20, true},
    {GgmlType::kQ5_0, "q5_0", 32, 22, true},
    {GgmlType::kQ5_1, "q5_1", 32, 24, true},
    {GgmlType::kQ8_0, "q8_0", 32, 34, true},
    {GgmlType::kIQ4_NL, "iq4_nl", 32, 18, true},
    {GgmlType::kBF16, "bf16", 1, 2, false},
}};

static_assert(kTypes.size() == 9, "llama.cpp accepts nine KV cache types");
static_assert(kTypes[6].block_bytes == 2 + 32, "q8_0: f16 scale + 32 int8");
static_assert(kTypes[2].block_bytes == 2 + 16, "q4_0: f16 scale + 32 nibbles");
static_assert(kTypes[3].block_bytes == 4 + 16, "q4_1: f16 scale, f16 min + 32 nibbles");
static_assert(kTypes[4].block_bytes == 2 + 4 + 16, "q5_0: f16 scale, 32 high bits + nibbles");
static_assert(kTypes[5].block_bytes == 4 + 4 + 16, "q5_1: scale, min, high bits + nibbles");
static_assert(kTypes[7].block_bytes == 2 + 16, "iq4_nl: f16 scale + 32 nibbles");

}  // namespace

std::span<const TypeLayout> kv_cache_types() { return kTypes; }

const TypeLayout* find_type(int32_t id) {
  for (const auto& t : kTypes) {
    if (static_cast<int32_t>(t.id) == id) return &t;
  }
  return nullptr;
}

const TypeLayout* find_type(std::string_view name) {
  for (const auto& t : kTypes) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

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

std::string type_name(int32_t id) {
  if (const TypeLayout* t = find_type(id)) return std::string(t->name);
  return "type " + std::to_string(id);
}

}  // namespace kvsnap
