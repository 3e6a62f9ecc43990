#include "migrate/fp_strict.h"  // first: no implicit FMA contraction in this file

// ExactRequantizer's quick search at AVX2 (simd_kernels.h, QuickSearchBlocks): 8 blocks at a
// time, block k in lane k. The 32 values of the 8 blocks are transposed once, so value i of every
// block is one vector; a candidate's error then needs no horizontal step: the scalar search's 8
// partial sums (lane l adding values l, l + 8, l + 16, l + 24) are 8 vectors, and its pairwise
// tree of them is 7 vector adds. Every choice is a per-lane blend, so each block gets what the
// scalar search gives it alone, bit for bit (tests/migrate/exact_requant_test.cc).

#include <limits>

#include "migrate/kernels/x86_avx2_iq4_nl.h"
#include "migrate/kernels/x86_common.h"
#include "migrate/simd_kernels.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {
namespace {

// The scalar search's tree over its 8 partial sums: (l, l + 4), (l, l + 2), (0, 1).
KV_AVX2_INLINE __m256 tree8(const __m256* a) {
  const __m256 t0 = _mm256_add_ps(a[0], a[4]), t1 = _mm256_add_ps(a[1], a[5]);
  const __m256 t2 = _mm256_add_ps(a[2], a[6]), t3 = _mm256_add_ps(a[3], a[7]);
  return _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
}

struct Grid {
  __m256 lo, hi;  // a linear grid's levels
  Search table;   // iq4_nl's
};

// The level of value x for scale d (id = 1 / d) and offset m. Without an offset, x * id is what
// (x - 0) * id gives, up to the sign of a zero, which the level does not keep (and
// best_index_int8 gives +0 and -0 one index).
template <RequantGrid G>
KV_AVX2_INLINE __m256 level(__m256 x, __m256 id, __m256 m, const Grid& g) {
  if (G == RequantGrid::kIq4nl) return value8(_mm256_mul_ps(x, id), g.table);
  const __m256 r = G == RequantGrid::kOffset ? _mm256_mul_ps(_mm256_sub_ps(x, m), id) : _mm256_mul_ps(x, id);
  const __m256 n = _mm256_round_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm256_min_ps(_mm256_max_ps(n, g.lo), g.hi);
}

// The sum of sq(i) over the 32 values i in every lane, in the scalar search's order: lane l
// (of the 8 partial sums) adds i = l, l + 8, l + 16, l + 24 in turn, then tree8.
template <class Sq>
KV_AVX2_INLINE __m256 sum32(Sq sq) {
  __m256 acc[8];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) acc[l] = sq(l);
#pragma GCC unroll 3
  for (int v = 1; v < 4; ++v) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) acc[l] = _mm256_add_ps(acc[l], sq(8 * v + l));
  }
  return tree8(acc);
}

// A candidate's error in every lane: xt[i] is value i of the 8 blocks.
template <RequantGrid G>
KV_AVX2_INLINE __m256 score(const __m256* xt, __m256 d, __m256 id, __m256 m, const Grid& g) {
  constexpr bool kOffset = G == RequantGrid::kOffset;
  auto sq = [&](int i) KV_AVX2_LAMBDA {
    const __m256 n = level<G>(xt[i], id, m, g);
    // Without an offset, x - n * d in one multiply-add, the scalar search's x - (n * d + 0) up to
    // the sign of a zero the square drops: n * d is exact (an integer level |n| <= 127 times an
    // f16's 11-bit significand, |n d| < 2^23 and, when not 0, >= 2^-24: a normal float), so the
    // one rounding is the subtraction's.
    const __m256 diff = kOffset ? _mm256_sub_ps(xt[i], _mm256_add_ps(_mm256_mul_ps(n, d), m))
                                : _mm256_fnmadd_ps(n, d, xt[i]);
    return _mm256_mul_ps(diff, diff);
  };
  return sum32(sq);
}

KV_AVX2_INLINE __m256 finite(__m256 v) {
  return _mm256_cmp_ps(abs8(v), _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ);
}

// The best candidate so far in every lane.
struct Best {
  __m256 err, d, id, m;
  __m256i d16, m16;   // f16 bits in the low half of each 32-bit lane
  __m256 improved;    // all ones where a candidate beat the reference block
};

// Scores the candidate (d16, m16) in the lanes of `valid` and keeps it where it does better.
template <RequantGrid G>
KV_AVX2_INLINE void consider(const __m256* xt, __m128i d16, __m128i m16, __m256 valid, const Grid& g, Best& b) {
  constexpr bool kOffset = G == RequantGrid::kOffset;
  const __m256 d = _mm256_cvtph_ps(d16);
  const __m256 m = kOffset ? _mm256_cvtph_ps(m16) : _mm256_setzero_ps();
  __m256 ok = _mm256_and_ps(valid, _mm256_cmp_ps(abs8(d), _mm256_setzero_ps(), _CMP_GT_OQ));
  ok = _mm256_and_ps(ok, finite(d));
  if (kOffset) ok = _mm256_and_ps(ok, finite(m));
  if (_mm256_movemask_ps(ok) == 0) return;
  const __m256 id = _mm256_div_ps(_mm256_set1_ps(1.0f), d);
  const __m256 e = score<G>(xt, d, id, m, g);
  const __m256 better = _mm256_and_ps(ok, _mm256_cmp_ps(e, b.err, _CMP_LT_OQ));
  const __m256i bi = _mm256_castps_si256(better);
  b.err = _mm256_blendv_ps(b.err, e, better);
  b.d = _mm256_blendv_ps(b.d, d, better);
  b.id = _mm256_blendv_ps(b.id, id, better);
  b.m = _mm256_blendv_ps(b.m, m, better);
  b.d16 = _mm256_blendv_epi8(b.d16, _mm256_cvtepu16_epi32(d16), bi);
  b.m16 = _mm256_blendv_epi8(b.m16, _mm256_cvtepu16_epi32(m16), bi);
  b.improved = _mm256_or_ps(b.improved, better);
}

// The least-squares candidate of 4 lanes, in double as the scalar search: il, ill the sums of
// the levels and their squares, sx, sxl of the values and values times levels.
template <RequantGrid G>
KV_AVX2_INLINE void fit4(__m128 il, __m128 ill, __m128 sx_f, __m128 sxl_f, __m128& d_out, __m128& m_out,
                         __m128& ok_out) {
  constexpr bool kOffset = G == RequantGrid::kOffset;
  const __m256d sl = _mm256_cvtps_pd(il), sll = _mm256_cvtps_pd(ill);
  const __m256d sx = _mm256_cvtps_pd(sx_f), sxl = _mm256_cvtps_pd(sxl_f);
  const __m256d n = _mm256_set1_pd(32.0), zero = _mm256_setzero_pd();
  __m256d d, m = zero, ok;
  if (kOffset) {
    const __m256d det = _mm256_sub_pd(_mm256_mul_pd(n, sll), _mm256_mul_pd(sl, sl));
    ok = _mm256_cmp_pd(det, zero, _CMP_NEQ_UQ);
    d = _mm256_div_pd(_mm256_sub_pd(_mm256_mul_pd(n, sxl), _mm256_mul_pd(sl, sx)), det);
    m = _mm256_div_pd(_mm256_sub_pd(sx, _mm256_mul_pd(d, sl)), n);
  } else {
    ok = _mm256_cmp_pd(sll, zero, _CMP_NEQ_UQ);
    d = _mm256_div_pd(sxl, sll);
  }
  d_out = _mm256_cvtpd_ps(d);
  m_out = _mm256_cvtpd_ps(m);
  // the 4 64-bit masks to 4 32-bit ones
  const __m256 okf = _mm256_castpd_ps(ok);
  ok_out = _mm_shuffle_ps(_mm256_castps256_ps128(okf), _mm256_extractf128_ps(okf, 1), 0x88);
}

// The reference blocks of a symmetric linear grid (levels lo..hi, lo = -2^(B-1)), as ggml's
// quantize_row_q4_0_ref / q5_0_ref make them, in every lane (simd_kernels.h, make_reference): max,
// the first value of largest |x| (index order: a later value of equal |x| does not replace it),
// d = max / lo, id = 1 / d, level = min(trunc(x * id - lo + 0.5), hi - lo) + lo, the scale stored
// as the f16 of d. `plain`: the lanes where that is what this code computes, bit for bit: every
// value finite (their sum finite; a large finite sum only sends a block back to the caller) and
// id finite (so max is not 0), so that x * id - lo + 0.5 is in [0, 2 hi + 2) (|x| <= |max|),
// where truncation is the reference's (int8_t) cast. `err`: each one's error as the quick search scores
// a candidate (score above: the levels times the f16 scale are exact products).
struct Reference {
  __m256 plain;
  __m256 err;
  __m128i d16;
};
KV_AVX2_INLINE Reference make_reference_lanes(const __m256* xt, float lo, float hi, float (*ref_q)[8]) {
  // amax as a tree of maxima (order-free where every value is finite, the only lanes kept), then
  // max, the value of the first i with |x[i]| = amax (the reference's amax < fabsf(v) keeps the
  // first), by blends from the last i down: no chain of dependent compares. The sum (only its
  // finiteness counts) as 8 partial sums, as the search adds.
  __m256 a[32];
#pragma GCC unroll 32
  for (int i = 0; i < 32; ++i) a[i] = abs8(xt[i]);
  __m256 t[8];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) t[l] = _mm256_max_ps(_mm256_max_ps(a[l], a[l + 8]), _mm256_max_ps(a[l + 16], a[l + 24]));
  const __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(t[0], t[4]), _mm256_max_ps(t[2], t[6])),
                                    _mm256_max_ps(_mm256_max_ps(t[1], t[5]), _mm256_max_ps(t[3], t[7])));
  __m256 max = _mm256_setzero_ps();
#pragma GCC unroll 32
  for (int i = 31; i >= 0; --i) max = _mm256_blendv_ps(max, xt[i], _mm256_cmp_ps(a[i], amax, _CMP_EQ_OQ));
  const __m256 sum = sum32([&](int i) KV_AVX2_LAMBDA { return xt[i]; });
  const __m256 d = _mm256_div_ps(max, _mm256_set1_ps(lo));
  const __m256 id = _mm256_div_ps(_mm256_set1_ps(1.0f), d);
  Reference r;
  r.plain = _mm256_and_ps(finite(sum), finite(id));  // all zero: d = -0, id = -inf
  r.d16 = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
  const __m256 d_f16 = _mm256_cvtph_ps(r.d16);
  const __m256 bias = _mm256_set1_ps(0.5f - lo), top = _mm256_set1_ps(hi - lo), vlo = _mm256_set1_ps(lo);
  auto sq = [&](int i) KV_AVX2_LAMBDA {
    const __m256 t = _mm256_round_ps(_mm256_add_ps(_mm256_mul_ps(xt[i], id), bias), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 n = _mm256_add_ps(_mm256_min_ps(t, top), vlo);
    _mm256_store_ps(ref_q[i], n);
    const __m256 diff = _mm256_fnmadd_ps(n, d_f16, xt[i]);
    return _mm256_mul_ps(diff, diff);
  };
  r.err = sum32(sq);
  return r;
}

template <RequantGrid G, bool kMakeRef>
KV_AVX2_INLINE void quick_search_lanes(QuickSearchBlocks& q) {
  static_assert(!kMakeRef || G == RequantGrid::kSymmetric, "reference blocks are made for symmetric linear grids");
  constexpr bool kOffset = G == RequantGrid::kOffset;
  const Grid g{_mm256_set1_ps(q.lo), _mm256_set1_ps(q.hi), search8()};
  // Lanes past q.n repeat block 0 and are never chosen.
  const float* xp[8];
  const float* yp[8];
  alignas(16) uint16_t d16[8], m16[8];
  for (int k = 0; k < 8; ++k) {
    const int s = k < q.n ? k : 0;
    xp[k] = q.x[s];
    yp[k] = kMakeRef ? nullptr : q.y[s];
    d16[k] = kMakeRef ? 0 : q.d16[s];
    m16[k] = kOffset ? q.m16[s] : 0;
  }
  // The values transposed: xt[i] holds value i of the 8 blocks.
  __m256 xt[32];
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(xp[k] + 8 * v);
    transpose8(r);
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) xt[8 * v + l] = r[l];
  }
  // The reference blocks' levels: kMakeRef, made here for every lane; otherwise read below for
  // the lanes no factor improves.
  alignas(32) float ref_q[32][8];
  __m128i d16_ref, m16_ref;
  __m256 ref_err, plain;
  if constexpr (kMakeRef) {
    const Reference r = make_reference_lanes(xt, q.lo, q.hi, ref_q);
    ref_err = r.err;
    plain = r.plain;
    d16_ref = r.d16;
    m16_ref = _mm_setzero_si128();
  } else {
    // The reference block's error, block by block (lane l: the partial sum of values l, l + 8,
    // l + 16, l + 24), then transposed so that the tree runs across the blocks.
    __m256 part[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      __m256 acc = _mm256_setzero_ps();
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m256 diff = _mm256_sub_ps(_mm256_loadu_ps(xp[k] + 8 * v), _mm256_loadu_ps(yp[k] + 8 * v));
        const __m256 sq = _mm256_mul_ps(diff, diff);
        acc = v == 0 ? sq : _mm256_add_ps(acc, sq);
      }
      part[k] = acc;
    }
    transpose8(part);
    ref_err = tree8(part);
    plain = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    d16_ref = _mm_load_si128(reinterpret_cast<const __m128i*>(d16));
    m16_ref = _mm_load_si128(reinterpret_cast<const __m128i*>(m16));
  }
  Best b;
  b.err = ref_err;
  b.d = _mm256_cvtph_ps(d16_ref);
  b.m = kOffset ? _mm256_cvtph_ps(m16_ref) : _mm256_setzero_ps();
  b.id = _mm256_div_ps(_mm256_set1_ps(1.0f), b.d);
  b.d16 = _mm256_cvtepu16_epi32(d16_ref);
  b.m16 = _mm256_cvtepu16_epi32(m16_ref);
  b.improved = _mm256_setzero_ps();
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(q.n), lane));
  const __m256 made = _mm256_and_ps(valid, plain);  // kMakeRef: the blocks whose reference is made here
  q.referenced = kMakeRef ? uint32_t(_mm256_movemask_ps(made)) : 0;
  valid = _mm256_and_ps(made, _mm256_cmp_ps(b.err, _mm256_setzero_ps(), _CMP_GT_OQ));
  valid = _mm256_and_ps(valid, finite(b.err));
  valid = _mm256_and_ps(valid, _mm256_cmp_ps(abs8(b.d), _mm256_setzero_ps(), _CMP_GT_OQ));
  valid = _mm256_and_ps(valid, finite(b.d));
  if (kOffset) valid = _mm256_and_ps(valid, finite(b.m));
  q.improved = 0;
  const int valid_mask = _mm256_movemask_ps(valid);
  if (valid_mask == 0 && q.referenced == 0) return;

  for (float f : kQuickFactors) {
    const __m128i cand = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_cvtph_ps(d16_ref), _mm256_set1_ps(f)),
                                         _MM_FROUND_TO_NEAREST_INT);
    consider<G>(xt, cand, m16_ref, valid, g, b);
  }

  // The least-squares fit of the best's levels: the reference block's where no factor did better.
  const int reference = valid_mask & ~_mm256_movemask_ps(b.improved);
  if (!kMakeRef && reference != 0) {
    for (int k = 0; k < 8; ++k) {
      int8_t lv[32] = {};
      if (reference >> k & 1) q.ref_levels(q.ctx, k, lv);
      for (int i = 0; i < 32; ++i) ref_q[i][k] = float(lv[i]);
    }
  }
  // il and ill are sums of integers below 2^24, exact in any order: 8 partial sums like the
  // others, so that no chain of 32 dependent additions holds the fit back.
  __m256 al[8], all[8], ax[8], axl[8];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    al[l] = all[l] = ax[l] = axl[l] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const int i = 8 * v + l;
      __m256 n = level<G>(xt[i], b.id, b.m, g);
      if (reference != 0) n = _mm256_blendv_ps(_mm256_load_ps(ref_q[i]), n, b.improved);
      al[l] = _mm256_add_ps(al[l], n);
      all[l] = _mm256_add_ps(all[l], _mm256_mul_ps(n, n));
      ax[l] = _mm256_add_ps(ax[l], xt[i]);
      axl[l] = _mm256_add_ps(axl[l], _mm256_mul_ps(xt[i], n));
    }
  }
  const __m256 il = tree8(al), ill = tree8(all);
  const __m256 sx = tree8(ax), sxl = tree8(axl);
  __m128 d_lo, d_hi, m_lo, m_hi, ok_lo, ok_hi;
  fit4<G>(_mm256_castps256_ps128(il), _mm256_castps256_ps128(ill), _mm256_castps256_ps128(sx),
                _mm256_castps256_ps128(sxl), d_lo, m_lo, ok_lo);
  fit4<G>(_mm256_extractf128_ps(il, 1), _mm256_extractf128_ps(ill, 1), _mm256_extractf128_ps(sx, 1),
                _mm256_extractf128_ps(sxl, 1), d_hi, m_hi, ok_hi);
  const __m128i fit_d16 = _mm256_cvtps_ph(_mm256_set_m128(d_hi, d_lo), _MM_FROUND_TO_NEAREST_INT);
  const __m128i fit_m16 = kOffset ? _mm256_cvtps_ph(_mm256_set_m128(m_hi, m_lo), _MM_FROUND_TO_NEAREST_INT)
                                  : _mm_setzero_si128();
  consider<G>(xt, fit_d16, fit_m16, _mm256_and_ps(valid, _mm256_set_m128(ok_hi, ok_lo)), g, b);

  const int improved = _mm256_movemask_ps(b.improved);
  q.improved = uint32_t(improved);
  // The blocks written out: the improved ones, and (kMakeRef) the reference blocks made here.
  const int written = kMakeRef ? int(q.referenced) : improved;
  if (written == 0) return;
  alignas(32) uint32_t out_d[8], out_m[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out_d), b.d16);  // the reference's where not improved
  _mm256_store_si256(reinterpret_cast<__m256i*>(out_m), b.m16);
  // The best's levels, transposed back to one block per row and packed to int8.
  __m256 n[32];
#pragma GCC unroll 32
  for (int i = 0; i < 32; ++i) {
    __m256 v = level<G>(xt[i], b.id, b.m, g);
    if (kMakeRef) v = _mm256_blendv_ps(_mm256_load_ps(ref_q[i]), v, b.improved);
    n[i] = _mm256_castsi256_ps(_mm256_cvttps_epi32(v));
  }
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) transpose8(n + 8 * v);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int k = 0; k < 8; ++k) {
    if (!(written >> k & 1)) continue;
    q.out_d16[k] = uint16_t(out_d[k]);
    q.out_m16[k] = uint16_t(out_m[k]);
    // int32 -> int8 in order: the packs interleave the 128-bit lanes, the permute undoes it
    const __m256i w01 = _mm256_packs_epi32(_mm256_castps_si256(n[k]), _mm256_castps_si256(n[8 + k]));
    const __m256i w23 = _mm256_packs_epi32(_mm256_castps_si256(n[16 + k]), _mm256_castps_si256(n[24 + k]));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q.levels[k]), bytes);
  }
}

// The grid's instance of the kernel, inlined into each entry point below (so each is compiled
// for its entry point's target).
KV_AVX2_INLINE void quick_search_grid(QuickSearchBlocks& q) {
  switch (q.grid) {
    case RequantGrid::kOffset: quick_search_lanes<RequantGrid::kOffset, false>(q); break;
    case RequantGrid::kSymmetric: quick_search_lanes<RequantGrid::kSymmetric, false>(q); break;
    case RequantGrid::kIq4nl: quick_search_lanes<RequantGrid::kIq4nl, false>(q); break;
  }
}

// The kernel that also makes the reference blocks (simd_kernels.h, QuickSearchBlocks::make_reference).
KV_AVX2_INLINE void quick_search_reference_grid(QuickSearchBlocks& q) {
  // make_reference_lanes is ggml's q4_0 and q5_0 reference (lo = -8 or -16, hi = -lo - 1), not
  // q8_0's (amax / 127, roundf), which is symmetric too: any other grid, every block back to the
  // caller.
  if (q.grid != RequantGrid::kSymmetric || !(q.lo == -8.0f || q.lo == -16.0f) || q.hi != -q.lo - 1.0f) {
    q.improved = q.referenced = 0;
    return;
  }
  quick_search_lanes<RequantGrid::kSymmetric, true>(q);
}

}  // namespace

KV_AVX2 void quick_search_avx2(QuickSearchBlocks& q) { quick_search_grid(q); }

// The same kernel compiled for the avx512 level: the same 256-bit operations in the same order
// (the same bytes), with AVX-512VL's 32 vector registers, so the 32 value vectors the candidates
// share need not be reloaded from the stack for each candidate.
KV_AVX512 void quick_search_avx2_vl(QuickSearchBlocks& q) { quick_search_grid(q); }

KV_AVX2 void quick_search_reference_avx2(QuickSearchBlocks& q) { quick_search_reference_grid(q); }
KV_AVX512 void quick_search_reference_avx2_vl(QuickSearchBlocks& q) { quick_search_reference_grid(q); }

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
