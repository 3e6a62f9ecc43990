// An offset source's block (q4_1, q5_1) as the integer quick search sees it (simd_kernels.h,
// LevelSearchBlocks): the steps level_search_ref (level_search.cc) and the NEON kernel
// (kernels/arm_neon_level_search.cc) share, so that their bytes are the same by construction;
// the AVX2 kernel computes the same lane by lane.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"

namespace kvsnap::simd {

// A candidate's levels l against the source's centred levels c, summed over a block: the three
// integer sums its exact error and the least-squares fit are made of (an offset source: l = m,
// the candidate's level; an offset target: l = t', its centred level).
struct LevelSums {
  int32_t cross = 0;    // sum c l
  int32_t sum = 0;      // sum l
  int32_t squares = 0;  // sum l^2
  void add(int32_t c, int32_t l) {
    cross += c * l;
    sum += l;
    squares += l * l;
  }
};

// The sums from sum w l with weights w = 1024 c + 1 (one multiply-add gives two sums): sum l is
// its low 10 bits, sign-extended, sum c l the rest (32 levels in -16..15 sum to -512..480).
inline LevelSums unpack_sums(int32_t weighted, int32_t squares) {
  const int32_t sum = int32_t(uint32_t(weighted) << 22) >> 22;
  return {(weighted - sum) >> 10, sum, squares};
}

// One block's best candidate so far (the scalar search and each NEON lane): the reference block's
// until a candidate scores lower.
struct CandidateBest {
  bool reference = true;
  uint16_t d16 = 0, m16 = 0;  // the candidate's scale and (an offset target's) offset, f16
  int32_t b = 0, c = 0;       // its multiplier B and offset C (offset_terms, target_terms)
  LevelSums sums;
  double err = 0;
};

struct OffsetBlock {
  enum class Kind {
    kDeclined,   // the caller's (an offset near a multiple of the scale, or ggml's max by index)
    kEmbedded,   // the target holds it exactly: d16 and levels are the result
    kReference,  // ggml's reference block stands (its error is 0 or not finite): d16, levels
    kSearch,     // the candidates are scored against the reference block (d16, levels, ref_*)
  };
  Kind kind = Kind::kDeclined;
  uint16_t d16 = 0;
  int8_t levels[32] = {};
  int8_t c[32] = {};  // the centred levels n - h
  int h = 8, shift = 11;  // half the source's levels; F, the levels' fraction bits
  float ds = 0, centre = 0;  // centre = ms + float(h) ds (float)
  double mc = 0, a = 0;      // ms + h ds (exact); A, the error's constant
  float d_ref = 0;           // the reference block's scale
  LevelSums ref_sums;  // the reference block's
  double ref_err = 0;
};

// Block `block` of type src (q4_1 or q5_1, its scale finite and nonzero, its offset finite) into a
// target of levels lo..hi.
OffsetBlock offset_block(GgmlType src, const std::byte* block, int lo, int hi);
// A candidate scale's multiplier B and offset C; false where the search skips it.
bool offset_terms(const OffsetBlock& o, float dc, int32_t& b, int32_t& c);
// The level of centred level c for terms b, cc.
int32_t offset_level(const OffsetBlock& o, int32_t c, int32_t b, int32_t cc, int lo, int hi);
// A candidate's error from its sums.
double offset_error(const OffsetBlock& o, float d, const LevelSums& s);
// The least-squares scale of the best's levels (the f16 to try), given s.squares != 0.
uint16_t offset_fit(const OffsetBlock& o, const LevelSums& s);

// A block into an offset target (q4_1, q5_1: value t d + m, t in 0..T) from a source of integer
// levels, as the integer quick search sees it (simd_kernels.h, LevelSearchBlocks, "An offset
// target"): the steps level_search_ref and the NEON kernel share. Candidates' levels are centred,
// t' = t - H; sums are over c and t'.
struct TargetBlock {
  enum class Kind {
    kDeclined,   // the target may hold it at the source's scale: the caller's (embed_block)
    kReference,  // ggml's reference block stands (its error is 0 or not finite): d16, m16, levels
    kSearch,     // the candidates are scored against the reference block
  };
  Kind kind = Kind::kDeclined;
  uint16_t d16 = 0, m16 = 0;  // the reference block
  int8_t levels[32] = {};     // its levels, 0..T
  int8_t c[32] = {};          // the centred source levels n - hs
  int top = 15, ht = 8;       // the target's T and H = (T + 1) / 2
  int shift = 11;             // F
  float ds = 0, centre = 0;   // centre = ms + float(hs) ds (float)
  double dsd = 0, mc = 0;     // ds and ms + hs ds, exact
  int32_t scc = 0, sc = 0;
  LevelSums ref_sums;  // the reference block's
  double ref_err = 0;
};
TargetBlock target_block_steps(GgmlType src, GgmlType dst, const std::byte* block);
// A candidate (D, M)'s multiplier B and offset C; false where the search skips it.
bool target_terms(const TargetBlock& o, float d, float m, int32_t& b, int32_t& c);
// The centred target level of centred source level c for terms b, cc.
int32_t target_level(const TargetBlock& o, int32_t c, int32_t b, int32_t cc);
// A candidate's error from its sums.
double target_error(const TargetBlock& o, float d, float m, const LevelSums& s);
// The least-squares scale and offset of the best's levels (the f16s to try); false where the
// levels leave them undetermined (32 Stt = St^2).
bool target_fit(const TargetBlock& o, const LevelSums& s, uint16_t& d16, uint16_t& m16);

// The whole search of one block, scalar.
struct OffsetTargetResult {
  bool declined = true;  // the block may embed: the caller's (the float path's embed_block)
  uint16_t d16 = 0, m16 = 0;
  int8_t levels[32] = {};  // 0..T
};
OffsetTargetResult offset_target_block(GgmlType src, GgmlType dst, const std::byte* block);

}  // namespace kvsnap::simd
