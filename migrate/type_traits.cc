#include "migrate/type_traits.h"

#include <array>
#include <cassert>
#include <cstring>
#include <string>

#include "migrate/half.h"
#include "migrate/quants.h"

namespace kvsnap {
namespace {

// The codec half of each row; the layout half comes from format/ggml_types.h.
struct Codec {
  GgmlType id;
  ToF32Fn to_f32;
  FromF32Fn from_f32;
};

// Same order as kv_cache_types() (ggml enum order).
constexpr std::array<Codec, 9> kCodecs = {{
    {GgmlType::kF32, quants::f32_to_f32, quants::f32_from_f32},
    {GgmlType::kF16, quants::f16_to_f32, quants::f16_from_f32},
    {GgmlType::kQ4_0, quants::q4_0_to_f32, quants::q4_0_from_f32},
    {GgmlType::kQ4_1, quants::q4_1_to_f32, quants::q4_1_from_f32},
    {GgmlType::kQ5_0, quants::q5_0_to_f32, quants::q5_0_from_f32},
    {GgmlType::kQ5_1, quants::q5_1_to_f32, quants::q5_1_from_f32},
    {GgmlType::kQ8_0, quants::q8_0_to_f32, quants::q8_0_from_f32},
    {GgmlType::kIQ4_NL, quants::iq4_nl_to_f32, quants::iq4_nl_from_f32},
    {GgmlType::kBF16, quants::bf16_to_f32, quants::bf16_from_f32},
}};
static_assert(kCodecs.size() == 9, "one codec per KV cache type llama.cpp accepts");

std::array<TypeTraits, kCodecs.size()> build_table() {
  std::array<TypeTraits, kCodecs.size()> table{};
  const auto layouts = kv_cache_types();
  assert(layouts.size() == kCodecs.size());
  for (size_t i = 0; i < kCodecs.size(); i++) {
    const TypeLayout* layout = &layouts[i];
    assert(layout->id == kCodecs[i].id && "kCodecs must follow kv_cache_types() order");
    table[i] = TypeTraits{layout, kCodecs[i].to_f32, kCodecs[i].from_f32};
  }
  return table;
}

const std::array<TypeTraits, kCodecs.size()>& table() {
  static const auto t = build_table();
  return t;
}

}  // namespace

std::span<const TypeTraits> type_traits() { return table(); }

const TypeTraits* find_traits(int32_t ggml_id) {
  for (const TypeTraits& t : table()) {
    if (static_cast<int32_t>(t.id()) == ggml_id) return &t;
  }
  return nullptr;
}

const TypeTraits* find_traits(GgmlType id) { return find_traits(static_cast<int32_t>(id)); }

const TypeTraits* find_traits(std::string_view name) {
  for (const TypeTraits& t : table()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

const TypeTraits* find_traits(const TypeLayout& layout) { return find_traits(layout.id); }

Status validate_row(const TypeTraits& t, std::span<const std::byte> row) {
  if (row.size() % t.block_bytes() != 0) {
    return Status::Corruption(std::to_string(row.size()) + " bytes are not a whole number of " +
                              std::string(t.name()) + " blocks of " + std::to_string(t.block_bytes()));
  }
  const size_t nb = row.size() / t.block_bytes();
  auto bad = [&](size_t i, const char* what, bool nan) {
    return Status::Corruption(std::string(t.name()) + " " + what + " " + std::to_string(i) + " is " +
                              (nan ? "NaN" : "infinite"));
  };
  switch (t.id()) {
    case GgmlType::kF32:
      for (size_t i = 0; i < nb; i++) {
        uint32_t w;
        std::memcpy(&w, row.data() + 4 * i, 4);
        if ((w & 0x7f800000) == 0x7f800000) return bad(i, "value", (w & 0x007fffff) != 0);
      }
      return Status::OK();
    case GgmlType::kF16:
      for (size_t i = 0; i < nb; i++) {
        const uint16_t h = half::load_u16(row.data() + 2 * i);
        if ((h & 0x7c00) == 0x7c00) return bad(i, "value", (h & 0x03ff) != 0);
      }
      return Status::OK();
    case GgmlType::kBF16:
      for (size_t i = 0; i < nb; i++) {
        const uint16_t h = half::load_u16(row.data() + 2 * i);
        if ((h & 0x7f80) == 0x7f80) return bad(i, "value", (h & 0x007f) != 0);
      }
      return Status::OK();
    default: {
      // Every quantized KV type starts with an f16 scale; q4_1/q5_1 follow it with an f16 min.
      const bool has_min = t.id() == GgmlType::kQ4_1 || t.id() == GgmlType::kQ5_1;
      for (size_t i = 0; i < nb; i++) {
        const std::byte* blk = row.data() + i * t.block_bytes();
        for (int k = 0; k < (has_min ? 2 : 1); k++) {
          const uint16_t h = half::load_u16(blk + 2 * k);
          if ((h & 0x7c00) == 0x7c00) return bad(i, k == 0 ? "scale of block" : "min of block", (h & 0x03ff) != 0);
        }
      }
      return Status::OK();
    }
  }
}

}  // namespace kvsnap
