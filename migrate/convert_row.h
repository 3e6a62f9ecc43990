// Row conversion between KV cache types: to_f32 -> rotation step (per plan) -> from_f32,
// through the TypeTraits table, with byte-exact identity paths.
//
// A row is one cell of one layer: n_embd_k_gqa (or n_embd_v_gqa) values. Memory is one
// row of floats per RowConverter, whatever the number of cells.
//
// Exactness:
//   - same type, no rotation step: memcpy (bytes unchanged, NaN payloads included).
//   - f16/bf16 -> f32 is exact, and f32 -> f16/bf16 gives the original bytes back for
//     every value that is not NaN (f16: all 63,490 non-NaN codes; bf16: all but the
//     signalling NaNs). NaNs come back as ggml makes them: f16 0x7E00|sign, bf16 quieted.
//   - everything else equals ggml: ggml's to_float, then the CPU backend's fwht, then
//     ggml_quantize_chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "migrate/hadamard.h"
#include "migrate/type_traits.h"

namespace kvsnap {

// One row, caller-owned scratch (scratch.size() >= number of values in the row; unused on
// the memcpy path). `in` and `out` must be exactly one row each of the same value count.
Status convert_row(const TypeTraits& src, const TypeTraits& dst, const RotationPlan& rot,
                   std::span<const std::byte> in, std::span<std::byte> out, std::span<float> scratch);

// Converts many rows of a fixed length; checks everything once at make().
class RowConverter {
 public:
  // InvalidArgument unless n_elems is whole blocks of both types and whole n_rot blocks.
  static Result<RowConverter> make(const TypeTraits& src, const TypeTraits& dst, uint64_t n_elems,
                                   const RotationPlan& rot);

  const TypeTraits& src() const { return *src_; }
  const TypeTraits& dst() const { return *dst_; }
  const RotationPlan& rotation() const { return rot_; }
  uint64_t n_elems() const { return n_elems_; }
  uint64_t src_row_bytes() const { return src_row_bytes_; }
  uint64_t dst_row_bytes() const { return dst_row_bytes_; }
  bool is_copy() const { return copy_; }  // bytes pass through unchanged

  // Converts k whole rows: in.size() == k * src_row_bytes(), out.size() == k * dst_row_bytes().
  // Not thread-safe (uses the converter's scratch row); use one converter per thread.
  Status convert(std::span<const std::byte> in, std::span<std::byte> out);

 private:
  RowConverter() = default;
  const TypeTraits* src_ = nullptr;
  const TypeTraits* dst_ = nullptr;
  RotationPlan rot_;
  uint64_t n_elems_ = 0;
  uint64_t src_row_bytes_ = 0;
  uint64_t dst_row_bytes_ = 0;
  bool copy_ = false;
  std::vector<float> scratch_;
};

}  // namespace kvsnap
