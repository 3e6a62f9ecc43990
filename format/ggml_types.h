// The ggml tensor types: ONE table, indexed by ggml type id, with each type's on-disk layout
// (values per block, bytes per block), kind, name and flags. Everything that sizes or names a
// ggml type reads it: the state-file reader (row sizes), the GGUF reader (tensor sizes of any
// type), the snapshot chunk filters, `kvsnap info` (pricing every ctk/ctv), and migrate/
// (migrate/quants.h takes its block constants from here; migrate/type_traits.h adds the codec
// pointers per SIMD level over the KV cache rows).
//
// A new ggml type: fill its row in kGgmlTypes (ggml.c type_traits: blck_size, type_size;
// ggml_types.cc checks ids, kinds, sizes and unique names at compile time). When llama.cpp
// accepts it for -ctk/-ctv, also give it kTypeKvCache, a GgmlType name below and its entry in
// ggml_types.cc's kLlamaKvCacheTypes (the hand-kept second opinion the flags are checked
// against), then its codecs (migrate/type_traits.h says where, and what fails if forgotten).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvsnap {

// enum ggml_type values (ggml/include/ggml.h) of the KV cache types. Numbers never change.
enum class GgmlType : int32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kIQ4_NL = 20,
  kBF16 = 30,
};

// GGML_TYPE_COUNT of llama.cpp v0.5.0: the ids 0 .. 42.
inline constexpr int32_t kGgmlTypeCount = 43;

enum class TypeKind : uint8_t {
  kNone,       // an id ggml removed (q4_2, q4_3, q4_0_4_4, ...): kept so that numbers never shift
  kFloat,      // one value per element: f32, f16, bf16, f64
  kInt,        // i8, i16, i32, i64
  kQuantized,  // blocks of values with their scales
};

// Bits of TypeLayout::flags.
enum TypeFlag : uint8_t {
  kTypeKvCache = 1u << 0,  // llama.cpp accepts it for -ctk/-ctv (common/arg.cpp: kv_cache_types)
};

struct TypeLayout {
  GgmlType id;
  // ggml_type_name(): "q8_0", "q4_K". llama.cpp's -ctk/-ctv parser compares its argument with
  // this same string, so it is also the CLI spelling (-ctk q8_0). Empty for removed ids.
  std::string_view name;
  uint32_t block_elems;  // values per block (ggml blck_size; 0 for removed ids)
  uint32_t block_bytes;  // bytes per block (ggml type_size)
  bool quantized;        // kind == kQuantized; quantized K/V are Hadamard-rotated by current llama.cpp
  TypeKind kind;
  uint8_t flags;  // TypeFlag bits

  constexpr bool kv_cache() const { return (flags & kTypeKvCache) != 0; }
};

namespace ggml_types_detail {

constexpr TypeLayout row(GgmlType id, std::string_view name, TypeKind kind, uint32_t block_elems, uint32_t block_bytes,
                         uint8_t flags = 0) {
  return {id, name, block_elems, block_bytes, kind == TypeKind::kQuantized, kind, flags};
}
constexpr TypeLayout removed(GgmlType id) { return {id, {}, 0, 0, false, TypeKind::kNone, 0}; }

}  // namespace ggml_types_detail

// Every ggml type id, at its own index (ggml.c type_traits, read off libggml-base of llama.cpp
// v0.5.0). format/ggml_types.cc checks the order and the sizes at compile time.
inline constexpr std::array<TypeLayout, kGgmlTypeCount> kGgmlTypes = [] {
  using ggml_types_detail::removed;
  using ggml_types_detail::row;
  constexpr auto F = TypeKind::kFloat, I = TypeKind::kInt, Q = TypeKind::kQuantized;
  constexpr uint8_t KV = kTypeKvCache;
  using T = GgmlType;
  return std::array<TypeLayout, kGgmlTypeCount>{{
      row(T::kF32, "f32", F, 1, 4, KV),                  // 0
      row(T::kF16, "f16", F, 1, 2, KV),                  // 1
      row(T::kQ4_0, "q4_0", Q, 32, 2 + 16, KV),          // 2  f16 d; 32 nibbles
      row(T::kQ4_1, "q4_1", Q, 32, 4 + 16, KV),          // 3  f16 d, m; 32 nibbles
      removed(T{4}),                                     // 4  q4_2
      removed(T{5}),                                     // 5  q4_3
      row(T::kQ5_0, "q5_0", Q, 32, 2 + 4 + 16, KV),      // 6  f16 d; 32 high bits; nibbles
      row(T::kQ5_1, "q5_1", Q, 32, 4 + 4 + 16, KV),      // 7  f16 d, m; 32 high bits; nibbles
      row(T::kQ8_0, "q8_0", Q, 32, 2 + 32, KV),          // 8  f16 d; 32 int8
      row(T{9}, "q8_1", Q, 32, 36),                      // 9
      row(T{10}, "q2_K", Q, 256, 84),                    // 10
      row(T{11}, "q3_K", Q, 256, 110),                   // 11
      row(T{12}, "q4_K", Q, 256, 144),                   // 12
      row(T{13}, "q5_K", Q, 256, 176),                   // 13
      row(T{14}, "q6_K", Q, 256, 210),                   // 14
      row(T{15}, "q8_K", Q, 256, 292),                   // 15
      row(T{16}, "iq2_xxs", Q, 256, 66),                 // 16
      row(T{17}, "iq2_xs", Q, 256, 74),                  // 17
      row(T{18}, "iq3_xxs", Q, 256, 98),                 // 18
      row(T{19}, "iq1_s", Q, 256, 50),                   // 19
      row(T::kIQ4_NL, "iq4_nl", Q, 32, 2 + 16, KV),      // 20 f16 d; 32 nibbles (kvalues_iq4nl)
      row(T{21}, "iq3_s", Q, 256, 110),                  // 21
      row(T{22}, "iq2_s", Q, 256, 82),                   // 22
      row(T{23}, "iq4_xs", Q, 256, 136),                 // 23
      row(T{24}, "i8", I, 1, 1),                         // 24
      row(T{25}, "i16", I, 1, 2),                        // 25
      row(T{26}, "i32", I, 1, 4),                        // 26
      row(T{27}, "i64", I, 1, 8),                        // 27
      row(T{28}, "f64", F, 1, 8),                        // 28
      row(T{29}, "iq1_m", Q, 256, 56),                   // 29
      row(T::kBF16, "bf16", F, 1, 2, KV),                // 30
      removed(T{31}),                                    // 31 q4_0_4_4
      removed(T{32}),                                    // 32 q4_0_4_8
      removed(T{33}),                                    // 33 q4_0_8_8
      row(T{34}, "tq1_0", Q, 256, 54),                   // 34
      row(T{35}, "tq2_0", Q, 256, 66),                   // 35
      removed(T{36}),                                    // 36 iq4_nl_4_4
      removed(T{37}),                                    // 37 iq4_nl_4_8
      removed(T{38}),                                    // 38 iq4_nl_8_8
      row(T{39}, "mxfp4", Q, 32, 17),                    // 39
      row(T{40}, "nvfp4", Q, 64, 36),                    // 40
      row(T{41}, "q1_0", Q, 128, 18),                    // 41
      row(T{42}, "q2_0", Q, 64, 18),                     // 42
  }};
}();

namespace ggml_types_detail {

constexpr size_t count_kv() {
  size_t n = 0;
  for (const TypeLayout& t : kGgmlTypes) n += t.kv_cache() ? 1 : 0;
  return n;
}

constexpr std::array<TypeLayout, count_kv()> kv_rows() {
  std::array<TypeLayout, count_kv()> out{};
  size_t k = 0;
  for (const TypeLayout& t : kGgmlTypes) {
    if (t.kv_cache()) out[k++] = t;
  }
  return out;
}

}  // namespace ggml_types_detail

// The rows of kGgmlTypes flagged kTypeKvCache, in ggml enum order: the types llama.cpp
// accepts for -ctk/-ctv (nine in v0.5.0). find_type() and migrate/type_traits.h point into this array.
inline constexpr auto kKvCacheTypes = ggml_types_detail::kv_rows();

constexpr std::span<const TypeLayout> kv_cache_types() { return kKvCacheTypes; }

// The row of a ggml type id (any type ggml has, KV cache type or not); nullptr for ids out of
// range or removed.
constexpr const TypeLayout* find_ggml_type(int32_t id) {
  if (id < 0 || id >= kGgmlTypeCount || kGgmlTypes[static_cast<size_t>(id)].kind == TypeKind::kNone) return nullptr;
  return &kGgmlTypes[static_cast<size_t>(id)];
}

// The layout of a KV cache type, by its enum (a constant expression).
constexpr const TypeLayout& ggml_layout(GgmlType id) { return kGgmlTypes[static_cast<size_t>(id)]; }

// nullptr when `id` is not one of the KV cache types (or not a type at all).
constexpr const TypeLayout* find_type(int32_t id) {
  for (const TypeLayout& t : kKvCacheTypes) {
    if (static_cast<int32_t>(t.id) == id) return &t;
  }
  return nullptr;
}
constexpr const TypeLayout* find_type(std::string_view name) {
  for (const TypeLayout& t : kKvCacheTypes) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// Bytes of a row of `n_elems` values; kMismatch unless whole blocks fit.
Result<uint64_t> row_bytes(const TypeLayout& t, uint64_t n_elems);

// The element count a row of `bytes` holds, if `bytes` is a whole number of blocks.
std::optional<uint64_t> row_elems(const TypeLayout& t, uint64_t bytes);

// The KV cache types' names in table order, for messages and --help: "f32 f16 q4_0 ... bf16".
std::string kv_cache_type_names();

// "q8_0" or "type 99" for ids that are not KV cache types, for messages.
std::string type_name(int32_t id);

// Size in bytes of n elements of ggml type `type` (any ggml type, not only the KV cache ones);
// nullopt for an unknown or removed type, a count that is not whole blocks, or an overflow.
std::optional<uint64_t> ggml_nbytes(int32_t type, uint64_t n_elements);
// ggml's type name ("f16", "q4_K") of any type, or "type N".
std::string ggml_type_name_any(int32_t type);

}  // namespace kvsnap
