// Quantized -> quantized conversion that is exact where exactness is possible.
//
// Requantizing dequantized values with ggml's reference quantizer adds a
// second rounding error on top of the source's. But many blocks can be stored
// in the target type exactly: a q4_0 block is a q8_0 block with the same scale
// and levels -8..7, a q4_1/q5_0/q5_1 block with a suitable offset, and the
// other way round when the levels happen to fit (so q4_0 -> q8_0 -> q4_0 gives
// back the original bytes); an iq4_nl block is a q8_0 block with its table
// values as levels. For each block, the requantizer builds the candidate with
// the source block's own scale (and offset), decodes it with the target's
// to_f32 and keeps it only when every value is bit-for-bit the source's;
// otherwise the block is requantized: ggml's reference quantizer, or a nearby
// scale when that lands the source's levels closer (see requantize_block).
//
// Only for quantized -> quantized with no rotation step (both ends in the
// same domain); float -> quantized always uses the reference quantizer, so
// those bytes stay ggml_quantize_chunk's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "migrate/type_traits.h"

namespace kvsnap {

class ExactRequantizer {
 public:
  // kInvalidArgument unless both types are quantized with 32-value blocks and
  // n_elems is whole blocks.
  // search: for blocks that cannot be exact, take the smaller squared error of
  // the reference quantizer's block and a small scale search (never worse);
  // false: exactly ggml's reference quantizer for those blocks.
  // direct: q4_0, q5_0 or iq4_nl -> q8_0, where every block with a finite nonzero scale embeds
  // (same scale; levels -8..7, -16..15 or the iq4_nl table fit int8, and q * d is the same
  // product either way), rewrite those blocks' bytes without decoding and checking them; false
  // (for tests) takes the general path for every block. The bytes are the same.
  static Result<ExactRequantizer> make(const TypeTraits& src, const TypeTraits& dst, uint64_t n_elems,
                                       bool search = true, bool direct = true);

  uint64_t src_row_bytes() const { return src_row_; }
  uint64_t dst_row_bytes() const { return dst_row_; }
  // k whole rows in, k rows out.
  Status convert(std::span<const std::byte> in, std::span<std::byte> out);

  uint64_t blocks_exact() const { return exact_; }
  uint64_t blocks_requantized() const { return requant_; }

 private:
  ExactRequantizer() = default;
  bool embed_block(const std::byte* src_block, const float* values, std::byte* dst_block);
  void requantize_block(const float* values, std::byte* dst_block);
  void convert_block(const std::byte* src_block, const float* values, std::byte* dst_block);
  void convert_row_direct(const std::byte* src_row, std::byte* dst_row);
  void convert_row_no_search(const std::byte* src_row, const float* values, std::byte* dst_row);
  bool may_embed(const std::byte* src_block) const;

  const TypeTraits* src_ = nullptr;
  const TypeTraits* dst_ = nullptr;
  uint64_t n_elems_ = 0, src_row_ = 0, dst_row_ = 0;
  std::vector<float> row_;
  uint64_t exact_ = 0, requant_ = 0;
  bool mode_search_ = true;
  bool direct_ = false;
  // may_embed's test for a q8_0 source: levels in [embed_lo_, embed_hi_], or (embed_span_, an
  // offset target) spanning at most embed_hi_
  bool q8_0_source_ = false, embed_span_ = false;
  int embed_lo_ = 0, embed_hi_ = 0;
};

// Whether ExactRequantizer applies to this pair.
bool exact_requant_applies(const TypeTraits& src, const TypeTraits& dst);

// Whether `--requant auto` (the default) runs the scale search for this pair. From q8_0, ggml's
// reference block lands within ~5% of the error of a cache made natively in the target type
// (kvsnap-requant-error: 1.003-1.05x), so the search (~30 MB/s a thread) buys little over native
// and auto skips it (GB/s). From a 4/5-bit type the reference block is 1.2-2.4x native (grids
// that do not nest; q5_0 -> q4_0 lands half the values on ties) and the search takes back much of
// that (q5_0 -> q4_0 1.69x -> 1.12x), so auto searches. Figures: docs/conversion.md.
bool search_by_default(const TypeTraits& src, const TypeTraits& dst);

}  // namespace kvsnap
