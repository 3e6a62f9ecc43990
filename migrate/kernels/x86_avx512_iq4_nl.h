// Internal to migrate/kernels/: what the two files of the AVX-512 iq4_nl quantizer share.
//   x86_avx512_iq4_nl.cc         the row loop, lanes = blocks (chunks of 8..16 blocks), the
//                                f16 -> iq4_nl fused row, the exported entry points
//   x86_avx512_iq4_nl_passes.cc  lanes = the 16 passes of one block (chunks of < 8 blocks),
//                                the index tables
#pragma once

#include "migrate/kernels/x86_common.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {

// =============================================================================================
// iq4_nl (quantize_iq4_nl: quantize_row_iq4_nl_impl, ntry = 7, no weights)
// =============================================================================================
//
// best_index_int8(16, values, x) == number of midpoints m_i = (values[i] + values[i+1]) / 2
// with m_i <= x, for every non-NaN float x. The reference picks the interval
// values[k] <= x < values[k+1] by binary search, then k when fl(x - values[k]) <
// fl(values[k+1] - x), else k + 1. Exactly, x - a < b - x <=> x < m. Rounding cannot flip it:
// both sides round monotonically around h = (b - a) / 2, which is representable, so they can
// only compare equal at h itself, i.e. within half an ulp(h) of m; there |x| is in the binade of
// |m| and ulp(x) >= ulp(h) for all fifteen midpoints, so both differences are exact.
// (kvsnap-simd-check verifies the equivalence for every float in [-140, 140].)
//
// The count is computed with buckets of width 9: key = floor(x / 9) in [-15, 14] for
// |x| <= 135 (its low five bits index two-register permutes), each bucket holds at most one
// midpoint (they are >= 11.5 apart), and no midpoint lies within 0.5 of a multiple of 9, so
// the rounding of x * (1/9) cannot pick a wrong bucket. Trial scales keep |id * x| <= 134.02.
// Values known to lie in [-128, 128) take buckets of width 8 instead, key = floor(x) >> 3 with
// no rounding at all (iq4nl_index16_within128): the candidate and first-pass indices of the
// search, which thereby need no multiplication (the loop that computes them is short of
// multiply pipes, not of add pipes).

struct Iq4nlTables {
  alignas(64) float thr[32];     // slot k & 31: the midpoint in bucket [9k, 9k + 9), or +inf
  alignas(64) int32_t base[32];  // slot k & 31: the number of midpoints < 9k
  alignas(64) float vals[16];     // kvalues_iq4nl as floats
  alignas(64) float vals_hi[16];  // kvalues_iq4nl[min(k + 1, 15)]
  alignas(64) float mid[32];      // the fifteen midpoints, then +inf
  alignas(64) float thr8[32];     // slot k & 31: the midpoint in bucket [8k, 8k + 8), or +inf
  alignas(64) int32_t base8[32];  // slot k & 31: the number of midpoints < 8k
};

const Iq4nlTables& iq4nl_tables();  // built once


// best_index for 16 lanes of x in [-135, 134] (no NaN).
KV_AVX512 inline __m512i iq4nl_index16_bounded(__m512 x, const Iq4nlTables& t) {
  const __m512i key = _mm512_cvt_roundps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(1.0f / 9.0f)),
                                               _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 thr = _mm512_permutex2var_ps(_mm512_load_ps(t.thr), key, _mm512_load_ps(t.thr + 16));
  const __m512i base = _mm512_permutex2var_epi32(_mm512_load_si512(t.base), key, _mm512_load_si512(t.base + 16));
  const __mmask16 ge = _mm512_cmp_ps_mask(x, thr, _CMP_GE_OQ);
  return _mm512_mask_add_epi32(base, ge, base, _mm512_set1_epi32(1));
}

// best_index for 16 lanes of x in [-128, 128) (no NaN): buckets of width 8, floor(x) >> 3, taken
// exactly (no rounding: unlike iq4nl_index16_bounded's, this key needs no margin), each holding
// at most one midpoint (they are >= 11.5 apart); no multiplication, so the add pipes do the work.
KV_AVX512 inline __m512i iq4nl_index16_within128(__m512 x, const Iq4nlTables& t) {
  const __m512i key = _mm512_srai_epi32(_mm512_cvt_roundps_epi32(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC), 3);
  const __m512 thr = _mm512_permutex2var_ps(_mm512_load_ps(t.thr8), key, _mm512_load_ps(t.thr8 + 16));
  const __m512i base = _mm512_permutex2var_epi32(_mm512_load_si512(t.base8), key, _mm512_load_si512(t.base8 + 16));
  const __mmask16 ge = _mm512_cmp_ps_mask(x, thr, _CMP_GE_OQ);
  return _mm512_mask_add_epi32(base, ge, base, _mm512_set1_epi32(1));
}

// best_index for 16 lanes of non-NaN x (any magnitude): clamped to [-134, 134] (the index is 0
// below and 15 above anyway) by one VRANGEPS (imm 0x02: the operand of smaller magnitude, with
// the sign of x), then bucketed.
KV_AVX512 inline __m512i iq4nl_index16(__m512 x, const Iq4nlTables& t) {
  return iq4nl_index16_bounded(_mm512_range_ps(x, _mm512_set1_ps(134.0f), 0x02), t);
}

// The reference's 16 passes over one block (32 finite values, amax >= GROUP_MAX_EPS).
//
// Lane 0 is the first pass (id = 1/d), lanes 1..15 the trials itry = -7..7 (id = (itry - 127)/max).
// Each lane's sums run over j = 0..31 in order with the reference's products (w*q)*x and
// (w*q)*q, so they are bit-identical. What is cheap here is finding q:
//   - for the trial lanes, al = id*x[j] = r * (itry - 127) with r = x[j]/max in [-1, 1] (to within
//     rounding), an interval of length 14|r| around -127 r. No such interval holds two midpoints
//     (for any r, the second one is >= 0.075 |r|-units away; rounding moves al by < 2e-5), so
//     value j takes index k0 or k0 + 1 in every trial lane, k0 = the index of the smaller of al
//     at lanes 1 and 15 (al and the index are monotone in the lane), and a lane's index is
//     k0 + (al >= m[k0]);
//   - the two candidate products of each value are computed once, vectorized over j, and the loop
//     picks them with one compare and a two-register permute;
//   - lane 0 (its al has the other sign) is a scalar sum over products computed the same way.
// The decision between the trials is the reference's loop, on the same floats.
//
// The work is done in passes over up to 16 blocks (setup with the divisions, tables, sums,
// decisions, output), so that the long dependency chains of one block (divisions, the serial
// decision) overlap with the other blocks' work instead of stalling.
//
// Two vector directions use these facts. Chunks of 8..16 blocks put one BLOCK in each lane
// ("lanes = blocks" below, iq4_nl_across_*): a step of a sum is value j of 16 blocks in one trial
// pass, so the lane-0 pass and the decision need no scalar or transposed work, and each step is a
// multiply, a compare, two blends and two additions; each lane skips the trials that would repeat
// the one before (iq4_nl_compact_trials: ~11 of the 15 run on K-like data). This is the path of
// whole rows (32 blocks per 1024 values). A chunk of fewer than 8 blocks (the end of a run) puts
// the 16 PASSES of one block in the lanes (iq4_nl_chunk_by_block), as before. Both give the
// reference's bytes.

constexpr size_t kIq4Chunk = 16;  // blocks per pass

// 16 x 16 transpose of rows[b][0..15]: out[i] lane b = rows[b][i].
KV_AVX512_INLINE void transpose16_rows(const float* const* rows, __m512* out) {
  __m512 t[16], u[16], v[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; k++) {
    const __m512 a = _mm512_loadu_ps(rows[2 * k]), b = _mm512_loadu_ps(rows[2 * k + 1]);
    t[2 * k] = _mm512_unpacklo_ps(a, b);
    t[2 * k + 1] = _mm512_unpackhi_ps(a, b);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++) {
    u[4 * k + 0] = _mm512_shuffle_ps(t[4 * k + 0], t[4 * k + 2], 0x44);
    u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k + 0], t[4 * k + 2], 0xEE);
    u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int m = 0; m < 4; m++) {
    v[m] = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x88);
    v[4 + m] = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xDD);
    v[8 + m] = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x88);
    v[12 + m] = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xDD);
  }
#pragma GCC unroll 4
  for (int m = 0; m < 4; m++) {
    out[m] = _mm512_shuffle_f32x4(v[m], v[8 + m], 0x88);
    out[8 + m] = _mm512_shuffle_f32x4(v[m], v[8 + m], 0xDD);
    out[4 + m] = _mm512_shuffle_f32x4(v[4 + m], v[12 + m], 0x88);
    out[12 + m] = _mm512_shuffle_f32x4(v[4 + m], v[12 + m], 0xDD);
  }
}

// The 16 block scales as f16 (f16x16_from_f32: the scalar path's NaN).
KV_AVX512_INLINE void store_scales_f16(__m512 d, uint16_t* dh) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(dh), f16x16_from_f32(d));
}

// The blocks' bytes from their scales dv[b]: d as fp16 (ggml's rounding; NaN -> 0x7E00 | sign),
// the indices with id = d != 0 ? 1/d : 0. Blocks of kind 2 are the scalar reference's.
KV_AVX512_INLINE void iq4_nl_finish(const float* xc, std::byte* outc, size_t cnt, const uint8_t* kind,
                                    const float* dv, const Iq4nlTables& t) {
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  alignas(64) float idfv[kIq4Chunk];
  alignas(32) uint16_t dh[kIq4Chunk];
  {
    const __m512 d = _mm512_load_ps(dv);
    store_scales_f16(d, dh);
    // id = d != 0.0f ? 1/d : 0 (a NaN d is != 0)
    _mm512_store_ps(idfv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ), one, d));
  }
  for (size_t b = 0; b < cnt; b++) {
    const float* xb = xc + b * kQK;
    std::byte* blk = outc + b * kIQ4_NLBytes;
    if (kind[b] == 2) {
      quants::ref::iq4_nl_from_f32(xb, blk, kQK);
      continue;
    }
    store_u16(blk, dh[b]);
    const float idf = idfv[b];
    const __m512 vid = _mm512_set1_ps(idf);
    const __m512 al0 = _mm512_mul_ps(vid, _mm512_loadu_ps(xb)), al1 = _mm512_mul_ps(vid, _mm512_loadu_ps(xb + 16));
    if (__builtin_expect((_mm512_cmp_ps_mask(al0, al0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(al1, al1, _CMP_UNORD_Q)) != 0,
                         0)) {
      // id = inf (a subnormal d) times 0: NaN, which best_index sends to 15
      uint8_t L[kQK];
      for (size_t j = 0; j < kQK; ++j) L[j] = static_cast<uint8_t>(quants::ref::iq4_nl_best_index(idf * xb[j]));
      uint8_t* q4 = u8(blk) + 2;
      for (size_t j = 0; j < 16; ++j) q4[j] = static_cast<uint8_t>(L[j] | (L[16 + j] << 4));
      continue;
    }
    const __m128i l0 = _mm512_cvtepi32_epi8(iq4nl_index16(al0, t));
    const __m128i l1 = _mm512_cvtepi32_epi8(iq4nl_index16(al1, t));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 2), _mm_or_si128(l0, _mm_slli_epi16(l1, 4)));
  }
}

// Up to 16 blocks: the 16 passes of each block in the lanes of one vector (the passes file).
KV_AVX512 void iq4_nl_chunk_by_block(const float* xc, std::byte* outc, size_t cnt, const Iq4nlTables& t);

// f16 -> (rotation by n_rot, 0: none) -> iq4_nl in one pass: simd::FusedRowFn (find_fused_avx512).
KV_AVX512 void f16_rot_iq4_nl(const std::byte* in, std::byte* out, size_t n, uint32_t n_rot);
void f16_iq4_nl_fn(const std::byte* in, std::byte* out, size_t n, uint32_t n_rot);

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
