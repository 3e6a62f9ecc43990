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
// scale when that lands the source's levels closer (Search: the quick search,
// simd::QuickSearchFn 8 blocks at a time through QuickBatch, or the full one,
// requantize_block).
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
  // What a block that cannot be exact gets. A search keeps a candidate only when its squared error
  // against the source values is below the best so far, starting from ggml's reference block, so
  // it is never worse than that block by its own score (kFull sums in double; kQuick in float,
  // where a near tie could go either way by a few ulp in double, or exactly from integer sums):
  enum class Search {
    kNone,   // ggml's reference block
    kQuick,  // the smaller error of the reference block, 4 nearby scales and one least-squares
             // refinement (kQuickFactors; levels by a multiply with the scale's reciprocal, the
             // nearest of a linear grid or ggml's best_index_int8 into iq4_nl's table, errors in
             // float; from q8_0, q4_0, q5_0, iq4_nl, q4_1 or q5_1 into q4_0 or q5_0 the same
             // candidate scales in integers, levels by a 15-bit fixed-point ratio (within ~0.002
             // of the nearest; with the offset in 10 or 11 fraction bits), errors exact (from an
             // offset source: of n ds + ms, in double, exact unless |ms / ds| is huge):
             // simd::LevelSearchBlocks)
    kFull,   // the smaller error of the reference block, 16 nearby scales and up to 3
             // least-squares refinements (levels by division, errors in double)
  };
  // kInvalidArgument unless both types are quantized with 32-value blocks and
  // n_elems is whole blocks.
  // direct: q4_0, q5_0 or iq4_nl -> q8_0, where every block with a finite nonzero scale embeds
  // (same scale; levels -8..7, -16..15 or the iq4_nl table fit int8, and q * d is the same
  // product either way), rewrite those blocks' bytes without decoding and checking them; false
  // (for tests) takes the general path for every block. The bytes are the same.
  // search: what `kvsnap convert` runs by default is search_by_default(src, dst) (below).
  static Result<ExactRequantizer> make(const TypeTraits& src, const TypeTraits& dst, uint64_t n_elems,
                                       Search search, bool direct = true);

  uint64_t src_row_bytes() const { return src_row_; }
  uint64_t dst_row_bytes() const { return dst_row_; }
  // k whole rows in, k rows out.
  Status convert(std::span<const std::byte> in, std::span<std::byte> out);

  Search search() const { return search_; }
  uint64_t blocks_exact() const { return exact_; }
  uint64_t blocks_requantized() const { return requant_; }

 private:
  ExactRequantizer() = default;
  bool embed_block(const std::byte* src_block, const float* values, std::byte* dst_block);
  void requantize_block(const float* values, std::byte* dst_block);
  void convert_block(const std::byte* src_block, const float* values, std::byte* dst_block);
  void convert_row_direct(const std::byte* src_row, std::byte* dst_row);
  void convert_row_from_reference(const std::byte* src_row, const float* values, std::byte* dst_row);
  void convert_row_by_levels(const std::byte* src_row, std::byte* dst_row);
  bool may_embed(const std::byte* src_block) const;
  bool offset_source_may_embed(const std::byte* src_block) const;

  const TypeTraits* src_ = nullptr;
  const TypeTraits* dst_ = nullptr;
  uint64_t n_elems_ = 0, src_row_ = 0, dst_row_ = 0;
  std::vector<float> row_;
  std::vector<float> ref_row_;  // kQuick: the row's reference blocks, decoded
  uint64_t exact_ = 0, requant_ = 0;
  Search search_ = Search::kFull;
  bool direct_ = false;
  // may_embed's test for a symmetric source: levels in [embed_lo_, embed_hi_], or (embed_span_, an
  // offset target) spanning at most embed_hi_
  bool symmetric_source_ = false, embed_span_ = false;
  int embed_lo_ = 0, embed_hi_ = 0;
  // may_embed's test for an offset source: levels spanning more than the target's levels do
  int target_span_ = 0;
  // may_embed's test into iq4_nl: every level one of its table's
  bool table_target_ = false;
  // kQuick from a source of integer levels (q8_0, q4_0, q5_0, iq4_nl, q4_1, q5_1) into q4_0 or
  // q5_0, and into q4_1 / q5_1 from the sources whose levels can span more than the target's: the
  // search in integers (simd_kernels.h, LevelSearchBlocks) instead of QuickSearchBlocks's floats
  bool level_search_ = false;
  // may_embed's test for a q4_0 or q5_0 source into a linear symmetric target, from the stored
  // levels the target holds: all of them (kAll: nothing to test), q5_0's 8..23 into q4_0
  // (kQ5_0InQ4_0: on the stored bits), else (kGeneral) the test on the levels below.
  enum class StoredFit : uint8_t { kGeneral, kAll, kQ5_0InQ4_0 };
  StoredFit stored_fit_ = StoredFit::kGeneral;
};

// Whether ExactRequantizer applies to this pair.
bool exact_requant_applies(const TypeTraits& src, const TypeTraits& dst);

// "exact" (kNone), "quick", "search" (kFull): the --requant word that runs each.
const char* search_name(ExactRequantizer::Search s);

// What `--requant auto` (the default) runs for this pair. Into iq4_nl, kQuick, from any type:
// within 1% of kFull's error (kvsnap-requant-error) and end to end the same KL (75 pairs of
// oracle.fidelity: geometric mean 1.004x kFull's), at ~20x its speed. Not kNone, even from q8_0:
// that reference block, although its squared error is 1.004x native, flipped the continuation of
// tests/oracle/server_test.py's hd128 case at a generated position where that model is
// hypersensitive (KL 0.197 against the bound 0.0077), where a search and llama.cpp's own iq4_nl
// cache did not: one case of a random model, but no evidence the other way. From q8_0 into a
// linear grid, kNone:
// ggml's reference block lands within ~2% of the error of a cache made natively in the target
// type (kvsnap-requant-error: 1.003-1.02x; 1.05x unrotated), so a search buys little over native.
// From a 4/5-bit type into a linear grid, where the grids do not nest (q5_0 -> q4_0 lands half the
// values on ties) and the reference block is 1.2-2.4x native: kQuick, which takes back nearly all
// that kFull does (q5_0 -> q4_0 1.69x -> 1.13x; kFull 1.12x) at a fraction of its cost. Figures:
// docs/conversion.md.
ExactRequantizer::Search search_by_default(const TypeTraits& src, const TypeTraits& dst);

}  // namespace kvsnap
