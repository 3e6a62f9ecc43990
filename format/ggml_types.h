// The layout of ggml tensor types as they appear on disk: the one table that
// says how many values a block holds and how many bytes it takes. Readers use
// it to validate row sizes, `kvsnap info` to price every ctk/ctv, and
// migrate/type_traits.h adds the conversion functions over the same rows.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "base/status.h"

namespace kvsnap {

// enum ggml_type values (ggml/include/ggml.h). Numbers never change.
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

struct TypeLayout {
  GgmlType id;
  std::string_view name;   // ggml's type name, also the CLI spelling (-ctk q8_0)
  uint32_t block_elems;    // values per block
  uint32_t block_bytes;    // bytes per block
  bool quantized;          // quantized K/V are Hadamard-rotated by current llama.cpp
};

// The nine types llama.cpp accepts for -ctk/-ctv, in ggml enum order.
std::span<const TypeLayout> kv_cache_types();

// nullptr when `id` is not one of the KV cache types (or not a type at all).
const TypeLayout* find_type(int32_t id);
const TypeLayout* find_type(std::string_view name);

// Bytes of a row of `n_elems` values; kMismatch unless whole blocks fit.
Result<uint64_t> row_bytes(const TypeLayout& t, uint64_t n_elems);

// The element count a row of `bytes` holds, if `bytes` is a whole number of blocks.
std::optional<uint64_t> row_elems(const TypeLayout& t, uint64_t bytes);

// "q8_0" or "type 99" for unknown ids, for messages.
std::string type_name(int32_t id);

}  // namespace kvsnap
