// THE codec table: per KV cache type, per SIMD level, the two row functions (ggml's
// type_traits, kvsnap style). The layouts are format/ggml_types.h's (sizes live there only);
// this adds, for each of its KV cache rows (nine in v0.5.0), with ggml reference semantics:
//   to_f32    == ggml_get_type_traits(type)->to_float   (dequantize_row_*, fp16/bf16 rows)
//   from_f32  == ggml_quantize_chunk(type, ...)          (the *_ref quantizers; iq4_nl with
//                its scale search, quantize_iq4_nl(ntry 7); f16 ggml_fp32_to_fp16_row;
//                bf16 ggml_fp32_to_bf16_row_ref; f32 memcpy)
// Output is bit-identical to libggml-base of llama.cpp v0.5.0 on x86-64, including
// NaN/inf/denormal inputs (tests/migrate/oracle_test.cc checks it against the library), at
// every SIMD level: a level's kernels only change speed.
//
// Both functions take whole rows: `n` values, a multiple of the layout's block_elems;
// src and dst must not overlap.
//
// A new KV type: its row in format/ggml_types.h (flag kTypeKvCache; see there), its scalar
// pair in migrate/quants (quants::ref::<type>_to_f32 / _from_f32) and one row of kCodecRows in
// type_traits.cc. What fails when something else is forgotten:
//   - compile time: a KV row without its kCodecRows row, rows out of table order, a missing
//     scalar pair (type_traits.cc); a KV type exact_requant.cc has not decided (its kGrids);
//     ggml_types.cc's second opinion (llama.cpp's own -ctk/-ctv list).
//   - tests: its golden file (Golden.OneFilePerKvType; kvsnap_make_golden writes one per KV
//     type of the table), the codec properties of type_traits_test.cc.
// Not checked: validate_row's quantized case and the SIMD/fused kernels assume an f16 scale
// first (q4_1/q5_1: then an f16 min), as every KV type so far has.
// A new SIMD level: its column in kCodecRows; an empty entry (nullptr or {}) means "no kernel
// of its own" and is filled at compile time from simd::fallback(level).
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "base/simd_level.h"
#include "base/status.h"
#include "format/ggml_types.h"

namespace kvsnap {

using ToF32Fn = void (*)(const std::byte* src, float* dst, size_t n);
using FromF32Fn = void (*)(const float* src, std::byte* dst, size_t n);

// The row functions of one type at one SIMD level.
struct RowCodec {
  ToF32Fn to_f32 = nullptr;
  FromF32Fn from_f32 = nullptr;
};

struct TypeTraits {
  const TypeLayout* layout = nullptr;  // the row of kv_cache_types() this codec is for
  ToF32Fn to_f32 = nullptr;            // n values of `layout` -> n floats, at simd::level()
  FromF32Fn from_f32 = nullptr;        // n floats -> n values of `layout`, at simd::level()
  // The functions of each level (every entry set: a level without a kernel of its own for this
  // type has the one of the level below). to_f32/from_f32 call codec(simd::level()).
  std::array<RowCodec, simd::kLevelCount> codecs{};

  const RowCodec& codec(simd::Level l) const { return codecs[static_cast<size_t>(l)]; }

  GgmlType id() const { return layout->id; }
  std::string_view name() const { return layout->name; }
  bool quantized() const { return layout->quantized; }
  uint32_t block_elems() const { return layout->block_elems; }
  uint32_t block_bytes() const { return layout->block_bytes; }
};

// The nine codecs, in the order of kv_cache_types() (same index, same layout pointer).
std::span<const TypeTraits> type_traits();

// nullptr when the type is not one of the nine.
const TypeTraits* find_traits(int32_t ggml_id);
const TypeTraits* find_traits(GgmlType id);
const TypeTraits* find_traits(std::string_view name);
const TypeTraits* find_traits(const TypeLayout& layout);

// ggml_validate_row_data for the nine types: Corruption naming the first value (float
// types) or block scale (quantized types) that is NaN or infinite, or a size that is not
// whole blocks. Conversion does not require it; a NaN scale dequantizes to NaNs.
Status validate_row(const TypeTraits& t, std::span<const std::byte> row);

}  // namespace kvsnap
