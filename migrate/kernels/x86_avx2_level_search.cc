#include "migrate/fp_strict.h"  // first: no implicit FMA contraction in this file

// The integer quick search at AVX2 (simd_kernels.h, LevelSearchBlocks): 8 blocks at a time. The
// source levels are int16 pairs: vector j holds, in 32-bit lane k, values 2j and 2j + 1 of block
// k, so a candidate's levels are 16 lanes of pmulhrsw, max and min, and pmaddwd adds each pair's
// products into block k's 32-bit lane: the sums need no horizontal step, and each block's scale,
// multiplier and error are lanes of 8-lane float and 4-lane double vectors. Integer sums are
// exact in any order and every float or double operation is the scalar search's, lane by lane,
// so each block gets what level_search_ref gives it (tests/migrate/exact_requant_test.cc).

#include <cstring>
#include <limits>

#include "migrate/kernels/x86_common.h"
#include "migrate/simd_kernels.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {
namespace {

constexpr int kPairs = 16;

// The levels of multiplier b (in both 16-bit halves of every lane) for the pair vector v.
KV_AVX2_INLINE __m256i levels_of(__m256i v, __m256i b, __m256i lo, __m256i hi) {
  return _mm256_min_epi16(_mm256_max_epi16(_mm256_mulhrs_epi16(v, b), lo), hi);
}

struct Sums {
  __m256i snm, smm;
};

// sum n m and sum m m per block for multiplier b; two partial sums each, so that the adds are
// two chains of 8 instead of one of 16 (integers: any order).
KV_AVX2_INLINE Sums sums_of(const __m256i* v, __m256i b, __m256i lo, __m256i hi) {
  __m256i nm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i mm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    const __m256i m = levels_of(v[j], b, lo, hi);
    nm[j & 1] = _mm256_add_epi32(nm[j & 1], _mm256_madd_epi16(v[j], m));
    mm[j & 1] = _mm256_add_epi32(mm[j & 1], _mm256_madd_epi16(m, m));
  }
  return {_mm256_add_epi32(nm[0], nm[1]), _mm256_add_epi32(mm[0], mm[1])};
}

// What the errors of a batch share: ds in double, t1 = (ds ds) Snn.
struct Shared {
  __m256d a_lo, a_hi, t1_lo, t1_hi;
};

KV_AVX2_INLINE Shared shared_of(__m256 ds, __m256i snn) {
  Shared s;
  s.a_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(ds));
  s.a_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(ds, 1));
  s.t1_lo = _mm256_mul_pd(_mm256_mul_pd(s.a_lo, s.a_lo), _mm256_cvtepi32_pd(_mm256_castsi256_si128(snn)));
  s.t1_hi = _mm256_mul_pd(_mm256_mul_pd(s.a_hi, s.a_hi), _mm256_cvtepi32_pd(_mm256_extracti128_si256(snn, 1)));
  return s;
}

// The error of 4 blocks (level_search.cc, level_error): t2 = (a D) Snm, t3 = (D D) Smm, (t1 -
// (t2 + t2)) + t3.
KV_AVX2_INLINE __m256d error4(__m256d a, __m256d t1, __m128 d, __m128i snm, __m128i smm) {
  const __m256d dd = _mm256_cvtps_pd(d);
  const __m256d t2 = _mm256_mul_pd(_mm256_mul_pd(a, dd), _mm256_cvtepi32_pd(snm));
  const __m256d t3 = _mm256_mul_pd(_mm256_mul_pd(dd, dd), _mm256_cvtepi32_pd(smm));
  return _mm256_add_pd(_mm256_sub_pd(t1, _mm256_add_pd(t2, t2)), t3);
}

struct Error8 {
  __m256d lo, hi;  // blocks 0..3, 4..7
};

KV_AVX2_INLINE Error8 error8(const Shared& sh, __m256 d, const Sums& s) {
  return {error4(sh.a_lo, sh.t1_lo, _mm256_castps256_ps128(d), _mm256_castsi256_si128(s.snm), _mm256_castsi256_si128(s.smm)),
          error4(sh.a_hi, sh.t1_hi, _mm256_extractf128_ps(d, 1), _mm256_extracti128_si256(s.snm, 1),
                 _mm256_extracti128_si256(s.smm, 1))};
}

// Two 4-lane 64-bit masks as one 8-lane 32-bit mask.
KV_AVX2_INLINE __m256 mask8(__m256d lo, __m256d hi) {
  const __m256 s = _mm256_shuffle_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi), 0x88);  // lo0 lo1 hi0 hi1 | lo2 lo3 hi2 hi3
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), 0xd8));
}

KV_AVX2_INLINE __m256 finite_nonzero(__m256 v) {
  const __m256 a = abs8(v);
  return _mm256_and_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ),
                       _mm256_cmp_ps(a, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ));
}

// Both 16-bit halves of each 32-bit lane set to its low 16 bits.
KV_AVX2_INLINE __m256i both_halves(__m256i v) {
  const __m256i low_twice = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8,
                                             9, 8, 9, 12, 13, 12, 13);
  return _mm256_shuffle_epi8(v, low_twice);
}

// Both 16-bit halves of each 32-bit lane set to the lane's value saturated to int16.
KV_AVX2_INLINE __m256i both_halves_saturated(__m256i v) {
  const __m256i p = _mm256_packs_epi32(v, v);  // per 128-bit half: s(v0..v3), s(v0..v3)
  return _mm256_unpacklo_epi16(p, p);          // s(v0), s(v0), s(v1), s(v1), ...
}

// Where e is below the best error, takes it (err) and returns those lanes as an 8-lane mask.
KV_AVX2_INLINE __m256i keep_below(Error8& err, const Error8& e) {
  const __m256d below_lo = _mm256_cmp_pd(e.lo, err.lo, _CMP_LT_OQ), below_hi = _mm256_cmp_pd(e.hi, err.hi, _CMP_LT_OQ);
  err.lo = _mm256_blendv_pd(err.lo, e.lo, below_lo);
  err.hi = _mm256_blendv_pd(err.hi, e.hi, below_hi);
  return _mm256_castps_si256(mask8(below_lo, below_hi));
}

struct Best {
  Error8 err;
  __m256i d16;       // f16 bits in the low half of each lane
  __m256i b;         // the multiplier in both halves; 0 where the reference block is best
  __m256i snm, smm;
  __m256 reference;  // all ones where the reference block is best
};

struct Block8 {
  const __m256i* v;
  __m256 ds;
  Shared shared;
  __m256i lo, hi;
  __m256 invalid;  // the blocks the search does not run for
};

// Scores the scale d16 (f16 bits, 8 lanes) except where `skip` and keeps it where it does
// better. A lane whose scale the search skips (simd_kernels.h: not finite and nonzero, |q| >= 1
// or |B| > 32767) gets the scale NaN, so its error is NaN and never below the best: q = ds / D
// is NaN or infinite for a D that is 0 or NaN, so B = nearbyint(q 2^15) is out of range (x86
// gives INT32_MIN) as it is for |q| >= 1; an infinite D gives B = 0, levels 0 and the error
// (a inf) 0 = NaN.
KV_AVX2_INLINE void consider(const Block8& k, __m128i d16, __m256 skip, Best& best) {
  const __m256 q = _mm256_div_ps(k.ds, _mm256_cvtph_ps(d16));
  const __m256i bq = _mm256_cvtps_epi32(_mm256_mul_ps(q, _mm256_set1_ps(32768.0f)));  // round to nearest even
  const __m256i in_range = _mm256_cmpeq_epi32(
      bq, _mm256_min_epi32(_mm256_max_epi32(bq, _mm256_set1_epi32(-32767)), _mm256_set1_epi32(32767)));
  const __m256 off = _mm256_or_ps(_mm256_or_ps(skip, k.invalid), _mm256_castsi256_ps(_mm256_xor_si256(in_range, _mm256_set1_epi32(-1))));
  if (_mm256_movemask_ps(off) == 0xff) return;
  const __m256 d = _mm256_or_ps(_mm256_cvtph_ps(d16), off);  // NaN where off
  const __m256i b = _mm256_andnot_si256(_mm256_castps_si256(off), both_halves(bq));
  const Sums s = sums_of(k.v, b, k.lo, k.hi);
  const __m256i bi = keep_below(best.err, error8(k.shared, d, s));
  best.d16 = _mm256_blendv_epi8(best.d16, _mm256_cvtepu16_epi32(d16), bi);
  best.b = _mm256_blendv_epi8(best.b, b, bi);
  best.snm = _mm256_blendv_epi8(best.snm, s.snm, bi);
  best.smm = _mm256_blendv_epi8(best.smm, s.smm, bi);
  best.reference = _mm256_andnot_ps(_mm256_castsi256_ps(bi), best.reference);
}

// The f16 of float(double(ds) * Snm / Smm) in 4 lanes, and where Smm != 0.
KV_AVX2_INLINE __m128 fit4(__m128 ds, __m128i snm, __m128i smm, __m128& ok) {
  const __m256d den = _mm256_cvtepi32_pd(smm);
  const __m256d d = _mm256_div_pd(_mm256_mul_pd(_mm256_cvtps_pd(ds), _mm256_cvtepi32_pd(snm)), den);
  ok = _mm_castsi128_ps(_mm_xor_si128(_mm_cmpeq_epi32(smm, _mm_setzero_si128()), _mm_set1_epi32(-1)));
  return _mm256_cvtpd_ps(d);
}

// A source block's 32 levels as int8 in order (source_levels: ggml's dequantize_row_* reading).
template <GgmlType T>
KV_AVX2_INLINE __m256i levels32(const std::byte* block) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(block);
  if constexpr (T == GgmlType::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
  } else {
    // q4_1 and q5_1 (an f16 offset after the scale) give their levels centred: n - 8, n - 16
    constexpr bool kFive = T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1;
    constexpr int kHead = T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1 ? 4 : 2;
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kHead + (kFive ? 4 : 0)));
    const __m128i low4 = _mm_set1_epi8(0x0f);
    // values 0..15: the low nibbles of qs; 16..31: the high ones
    const __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low4), _mm_and_si128(qs, low4));
    if constexpr (T == GgmlType::kIQ4_NL) {
      const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants::kIQ4NLValues));
      return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), u);
    } else if constexpr (kFive) {
      // bit i of qh is bit 4 of level i: byte i takes qh's byte i / 8 and tests bit i % 8
      uint32_t qh;
      std::memcpy(&qh, p + kHead, 4);
      const __m256i spread = _mm256_shuffle_epi8(
          _mm256_set1_epi32(int32_t(qh)), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                           2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
      const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
      const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
      return _mm256_sub_epi8(_mm256_or_si256(u, high), _mm256_set1_epi8(16));
    } else {
      return _mm256_sub_epi8(u, _mm256_set1_epi8(8));
    }
  }
}

// Writes a q4_0 (lo = -8) or q5_0 (lo = -16) block of scale d16 and levels lo16 (values 0..15 as
// int16) and hi16 (16..31), as pack_levels does.
KV_AVX2_INLINE void pack_block(__m256i lo16, __m256i hi16, int lo, uint16_t d16, std::byte* out) {
  const __m256i bias = _mm256_set1_epi16(int16_t(-lo));
  const __m256i ul = _mm256_add_epi16(lo16, bias), uh = _mm256_add_epi16(hi16, bias);  // as stored
  std::memcpy(out, &d16, 2);
  const __m256i low4 = _mm256_set1_epi16(0x0f);
  // qs[j]: level j's low nibble, level j + 16's high nibble
  const __m256i both = _mm256_or_si256(_mm256_and_si256(ul, low4), _mm256_slli_epi16(_mm256_and_si256(uh, low4), 4));
  const __m128i qs = _mm_packus_epi16(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
  if (lo == -8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2), qs);
    return;
  }
  // qh: bit i is bit 4 of level i (the bytes in order, bit 4 shifted to the sign bit)
  const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(ul, uh), 0xd8);
  const uint32_t qh = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(bytes, 3)));
  std::memcpy(out + 2, &qh, 4);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 6), qs);
}

// The levels of the (up to) 8 source blocks as int16 pairs: v[j], lane k = values 2j, 2j + 1 of
// block k (lanes past q.n repeat block 0 and are never written).
template <GgmlType T>
KV_AVX2_INLINE void load_pairs(const LevelSearchBlocks& q, __m256i* v) {
  __m256i bytes[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) bytes[k] = levels32<T>(q.src[k < q.n ? k : 0]);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m128i half = h == 0 ? _mm256_castsi256_si128(bytes[k]) : _mm256_extracti128_si256(bytes[k], 1);
      r[k] = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(half));
    }
    transpose8(r);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) v[8 * h + j] = _mm256_castps_si256(r[j]);
  }
}

// The smallest and largest level of each block, per 16-bit half of its lane.
KV_AVX2_INLINE void level_range(const __m256i* v, __m256i& vmin, __m256i& vmax) {
  vmin = v[0];
  vmax = v[0];
#pragma GCC unroll 15
  for (int j = 1; j < kPairs; ++j) {
    vmin = _mm256_min_epi16(vmin, v[j]);
    vmax = _mm256_max_epi16(vmax, v[j]);
  }
}

// The larger (smaller) of a lane's two 16-bit halves, as an int32.
KV_AVX2_INLINE __m256i halves_max(__m256i v) {
  return _mm256_max_epi32(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16), _mm256_srai_epi32(v, 16));
}
KV_AVX2_INLINE __m256i halves_min(__m256i v) {
  return _mm256_min_epi32(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16), _mm256_srai_epi32(v, 16));
}

template <GgmlType T>
KV_AVX2_INLINE void level_search_lanes(LevelSearchBlocks& q) {
  const int lo_level = q.dst_type == GgmlType::kQ5_0 ? -16 : -8, hi_level = -lo_level - 1;
  __m256i v[kPairs];
  load_pairs<T>(q, v);
  alignas(16) uint16_t ds16[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&ds16[k], q.src[k < q.n ? k : 0], 2);
  Block8 blk;
  blk.v = v;
  blk.ds = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(ds16)));
  blk.lo = _mm256_set1_epi16(int16_t(lo_level));
  blk.hi = _mm256_set1_epi16(int16_t(hi_level));

  // The blocks the target holds exactly: every level in [lo, hi].
  __m256i vmin, vmax;
  level_range(v, vmin, vmax);
  const __m256i outside = _mm256_or_si256(_mm256_cmpgt_epi16(blk.lo, vmin), _mm256_cmpgt_epi16(vmax, blk.hi));
  // a lane is exact when neither of its two halves has a level outside
  const __m256i exact = _mm256_cmpeq_epi32(outside, _mm256_setzero_si256());

  // ggml's reference block. max: the value of the first largest |n|. From the level range where
  // only one of the largest and minus the smallest is the largest |n| (a block ggml made has
  // its largest |level| once or with one sign: -16 in q5_0, -8 in q4_0, -127 in iq4_nl); where
  // both are (a tie, or all zero), by the first index: the largest key |n| << 8 | (31 - i) << 1
  // | sign (|n| <= 128: 16 unsigned bits), for the lanes that search.
  const __m256i low16 = _mm256_set1_epi32(0xffff);
  const __m256i top_n = halves_max(vmax);
  const __m256i bottom_n = halves_min(vmin);
  const __m256i minus_bottom = _mm256_sub_epi32(_mm256_setzero_si256(), bottom_n);
  __m256i max_n = _mm256_blendv_epi8(top_n, bottom_n, _mm256_cmpgt_epi32(minus_bottom, top_n));
  const __m256i tie = _mm256_andnot_si256(exact, _mm256_cmpeq_epi32(minus_bottom, top_n));
  if (!_mm256_testz_si256(tie, tie)) {
    __m256i key = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int j = 0; j < kPairs; ++j) {
      const __m256i index = _mm256_set1_epi32(int((31 - 2 * j - 1) << 1) << 16 | ((31 - 2 * j) << 1));
      const __m256i k = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi16(_mm256_abs_epi16(v[j]), 8), index),
                                        _mm256_srli_epi16(v[j], 15));
      key = _mm256_max_epu16(key, k);
    }
    key = _mm256_and_si256(_mm256_max_epu16(key, _mm256_srli_epi32(key, 16)), low16);
    const __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(key, _mm256_set1_epi32(1)));
    max_n = _mm256_blendv_epi8(max_n, _mm256_sub_epi32(_mm256_xor_si256(_mm256_srli_epi32(key, 8), neg), neg), tie);
  }
  const __m256 max = _mm256_mul_ps(_mm256_cvtepi32_ps(max_n), blk.ds);
  const __m256 d = _mm256_div_ps(max, _mm256_set1_ps(float(lo_level)));
  const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d),
                                  _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256 bias = _mm256_set1_ps(0.5f - float(lo_level));
  const __m256i top = _mm256_set1_epi16(int16_t(hi_level - lo_level));
  __m256i ref[kPairs];
  __m256i snn[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i rnm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i rmm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    const __m256 xe = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v[j], 16), 16)), blk.ds);
    const __m256 xo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(v[j], 16)), blk.ds);
    const __m256i le = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(xe, id), bias));
    const __m256i lodd = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(xo, id), bias));
    const __m256i l = _mm256_add_epi16(_mm256_min_epi16(_mm256_blend_epi16(le, _mm256_slli_epi32(lodd, 16), 0xaa), top), blk.lo);
    ref[j] = l;
    snn[j & 1] = _mm256_add_epi32(snn[j & 1], _mm256_madd_epi16(v[j], v[j]));
    rnm[j & 1] = _mm256_add_epi32(rnm[j & 1], _mm256_madd_epi16(v[j], l));
    rmm[j & 1] = _mm256_add_epi32(rmm[j & 1], _mm256_madd_epi16(l, l));
  }
  blk.shared = shared_of(blk.ds, _mm256_add_epi32(snn[0], snn[1]));
  const __m128i d16_ref = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
  const __m256 d_ref = _mm256_cvtph_ps(d16_ref);
  Best best;
  best.d16 = _mm256_cvtepu16_epi32(d16_ref);
  best.b = _mm256_setzero_si256();
  best.snm = _mm256_add_epi32(rnm[0], rnm[1]);
  best.smm = _mm256_add_epi32(rmm[0], rmm[1]);
  best.reference = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  best.err = error8(blk.shared, d_ref, Sums{best.snm, best.smm});
  const __m256d inf = _mm256_set1_pd(std::numeric_limits<double>::infinity()), zero = _mm256_setzero_pd();
  const __m256 err_ok = mask8(_mm256_and_pd(_mm256_cmp_pd(best.err.lo, zero, _CMP_GT_OQ), _mm256_cmp_pd(best.err.lo, inf, _CMP_LT_OQ)),
                              _mm256_and_pd(_mm256_cmp_pd(best.err.hi, zero, _CMP_GT_OQ), _mm256_cmp_pd(best.err.hi, inf, _CMP_LT_OQ)));
  const __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  blk.invalid = _mm256_or_ps(_mm256_xor_ps(_mm256_and_ps(err_ok, finite_nonzero(d_ref)), ones), _mm256_castsi256_ps(exact));

  if (_mm256_movemask_ps(blk.invalid) != 0xff) {
    for (float f : kQuickFactors) {
      consider(blk, _mm256_cvtps_ph(_mm256_mul_ps(d_ref, _mm256_set1_ps(f)), _MM_FROUND_TO_NEAREST_INT),
               _mm256_setzero_ps(), best);
    }
    __m128 ok_lo, ok_hi;
    const __m128 fit_lo = fit4(_mm256_castps256_ps128(blk.ds), _mm256_castsi256_si128(best.snm),
                               _mm256_castsi256_si128(best.smm), ok_lo);
    const __m128 fit_hi = fit4(_mm256_extractf128_ps(blk.ds, 1), _mm256_extracti128_si256(best.snm, 1),
                               _mm256_extracti128_si256(best.smm, 1), ok_hi);
    consider(blk, _mm256_cvtps_ph(_mm256_set_m128(fit_hi, fit_lo), _MM_FROUND_TO_NEAREST_INT),
             _mm256_xor_ps(_mm256_set_m128(ok_hi, ok_lo), ones), best);
  }

  // The best's levels (the reference block's where it stands; the source's where exact),
  // transposed back to a block per row and packed.
  const __m256i is_ref = _mm256_castps_si256(best.reference);
  __m256 out[kPairs];
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    const __m256i m = _mm256_blendv_epi8(levels_of(v[j], best.b, blk.lo, blk.hi), ref[j], is_ref);
    out[j] = _mm256_castsi256_ps(_mm256_blendv_epi8(m, v[j], exact));
  }
  transpose8(out);
  transpose8(out + 8);
  alignas(32) uint32_t d16_out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(d16_out),
                     _mm256_blendv_epi8(best.d16, _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(ds16))), exact));
  for (int k = 0; k < q.n; ++k) {
    pack_block(_mm256_castps_si256(out[k]), _mm256_castps_si256(out[8 + k]), lo_level, uint16_t(d16_out[k]), q.dst[k]);
  }
  q.embedded = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(exact))) & ((1u << q.n) - 1);
  q.declined = 0;
}

// floor(t / 2^kShift) clamped to [kLo, -kLo - 1] (kLo = -8 or -16), for t a saturated int16. Where
// the clamp is int16's own range shifted (2^kShift (-kLo) = 2^15) it is the shift alone; one bit
// short of it, a saturating doubling first (2t saturates exactly where t / 2^kShift leaves the
// range, and below that floor(2t / 2^(kShift + 1)) = floor(t / 2^kShift)): one operation fewer
// than a max and a min. Otherwise the max and the min.
template <int kShift, int kLo>
KV_AVX2_INLINE __m256i shift_and_clamp(__m256i t) {
  static_assert(kLo == -8 || kLo == -16);
  constexpr int kExact = kLo == -8 ? 12 : 11;  // the shift whose saturated range is [kLo, -kLo - 1]
  if constexpr (kShift == kExact) {
    return _mm256_srai_epi16(t, kShift);
  } else if constexpr (kShift + 1 == kExact) {
    return _mm256_srai_epi16(_mm256_adds_epi16(t, t), kExact);
  } else {
    return _mm256_min_epi16(_mm256_max_epi16(_mm256_srai_epi16(t, kShift), _mm256_set1_epi16(kLo)), _mm256_set1_epi16(-kLo - 1));
  }
}

// A source's centred levels c (int16 pairs) plus h as two float vectors, the even values and the
// odd ones: c + h is 0..31, so the halves need no sign extension.
KV_AVX2_INLINE void pair_floats(__m256i v, __m256i h16, __m256& even, __m256& odd) {
  const __m256i n = _mm256_add_epi16(v, h16);
  even = _mm256_cvtepi32_ps(_mm256_and_si256(n, _mm256_set1_epi32(0xffff)));
  odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(n, 16));
}

// An offset source (q4_1, q5_1; simd_kernels.h): the centred levels c = n - h as int16 pairs in
// the lanes, as above. A candidate's levels are pmulhrsw of a = c << (F + 1) by B, a saturating
// add of its offset C and a shift by F; sum c m and sum m come from one pmaddwd of the weights w
// = 1024 c + 1 (sum m is the low 10 bits, in [-512, 480]). Each block's constants, its error and
// the fit are lanes of float and double vectors whose operations are level_search.cc's
// (search_offset_block), lane by lane.
template <int kShift, int kLo>
KV_AVX2_INLINE __m256i offset_levels_of(__m256i a, __m256i b, __m256i c) {
  return shift_and_clamp<kShift, kLo>(_mm256_adds_epi16(_mm256_mulhrs_epi16(a, b), c));
}

// LevelSums (offset_levels.h) in 8 lanes: sum c l, sum l, sum l^2 of a candidate's levels l.
struct LevelSums8 {
  __m256i cross, sum, squares;
};

// unpack_sums in 8 lanes: from sum w l with w = 1024 c + 1, sum l is its low 10 bits
// sign-extended, sum c l the rest.
KV_AVX2_INLINE LevelSums8 unpack_sums8(__m256i weighted, __m256i squares) {
  const __m256i sum = _mm256_srai_epi32(_mm256_slli_epi32(weighted, 22), 22);
  return {_mm256_srai_epi32(_mm256_sub_epi32(weighted, sum), 10), sum, squares};
}

// One block's best candidate so far in each lane (CandidateBest, offset_levels.h): the reference
// block's where `reference` is set.
struct CandidateBest8 {
  Error8 err;
  __m256i d16, m16, b, c;  // f16 bits in the low half of d16, m16 (m16: offset targets only); b, c in both halves
  LevelSums8 sums;
  __m256 reference;
};

// A candidate scale dc against the source's scale ds, per lane: B, the ratio ds / dc in 14
// fraction bits (pmulhrsw's multiplier, rounded to nearest even), and the lanes the candidate is
// not scored in: those asked (skip), blocks without a search (invalid), a ratio past int16, and a
// candidate that is not `usable`.
struct CandidateLanes8 {
  __m256i bq;
  __m256 off;
};

KV_AVX2_INLINE CandidateLanes8 candidate_lanes(__m256 ds, __m256 dc, __m256 skip, __m256 invalid, __m256 usable) {
  const __m256i bq = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_div_ps(ds, dc), _mm256_set1_ps(16384.0f)));
  const __m256i in_range = _mm256_cmpeq_epi32(
      bq, _mm256_min_epi32(_mm256_max_epi32(bq, _mm256_set1_epi32(-32767)), _mm256_set1_epi32(32767)));
  const __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m256 off = _mm256_or_ps(_mm256_or_ps(skip, invalid),
                                  _mm256_or_ps(_mm256_xor_ps(_mm256_castsi256_ps(in_range), ones), _mm256_xor_ps(usable, ones)));
  return {bq, off};
}

// A candidate as the level kernels take it: d its scale, NaN in the lanes it is not scored in (its
// error is NaN there, never below the best), and B and C (both halves), zero there. v: its offset
// term in levels times 2^kShift, made C by rounding, adding half a level for the shift and
// clamping to int16.
struct Candidate8 {
  __m256 d;
  __m256i b, c;
};

template <int kShift>
KV_AVX2_INLINE Candidate8 candidate8(__m256 dc, const CandidateLanes8& lanes, __m256 v) {
  const __m256 vc = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-65536.0f)), _mm256_set1_ps(65536.0f));
  const __m256i c32 = _mm256_add_epi32(_mm256_cvtps_epi32(vc), _mm256_set1_epi32(1 << (kShift - 1)));
  const __m256i off = _mm256_castps_si256(lanes.off);
  return {_mm256_or_ps(dc, lanes.off), _mm256_andnot_si256(off, both_halves(lanes.bq)),
          _mm256_andnot_si256(off, both_halves_saturated(c32))};
}

// Takes the candidate (its f16 scale and, into an offset target, offset widened; its sums) in the
// lanes `better`.
template <bool kTargetOffset>
KV_AVX2_INLINE void keep_where(CandidateBest8& best, __m256i better, __m256i d16, __m256i m16, const Candidate8& k,
                               const LevelSums8& s) {
  best.d16 = _mm256_blendv_epi8(best.d16, d16, better);
  if constexpr (kTargetOffset) best.m16 = _mm256_blendv_epi8(best.m16, m16, better);
  best.b = _mm256_blendv_epi8(best.b, k.b, better);
  best.c = _mm256_blendv_epi8(best.c, k.c, better);
  best.sums.cross = _mm256_blendv_epi8(best.sums.cross, s.cross, better);
  best.sums.sum = _mm256_blendv_epi8(best.sums.sum, s.sum, better);
  best.sums.squares = _mm256_blendv_epi8(best.sums.squares, s.squares, better);
  best.reference = _mm256_andnot_ps(_mm256_castsi256_ps(better), best.reference);
}

template <int kShift, int kLo>
KV_AVX2_INLINE LevelSums8 offset_sums_of(const __m256i* a, const __m256i* w, __m256i b, __m256i c) {
  __m256i wm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i mm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    const __m256i m = offset_levels_of<kShift, kLo>(a[j], b, c);
    wm[j & 1] = _mm256_add_epi32(wm[j & 1], _mm256_madd_epi16(w[j], m));
    mm[j & 1] = _mm256_add_epi32(mm[j & 1], _mm256_madd_epi16(m, m));
  }
  return unpack_sums8(_mm256_add_epi32(wm[0], wm[1]), _mm256_add_epi32(mm[0], mm[1]));
}

// What a block's errors share (double, 4 lanes a half): ds, mc = ms + h ds, A.
struct OffsetShared {
  __m256d ds[2], mc[2], a[2];
};

// s = (ds D) Scm + (mc D) Sm, E = (A - (s + s)) + (D D) Smm, for 4 lanes.
KV_AVX2_INLINE __m256d offset_error4(__m256d ds, __m256d mc, __m256d a, __m128 d, __m128i scm, __m128i sm,
                                     __m128i smm) {
  const __m256d dd = _mm256_cvtps_pd(d);
  const __m256d s = _mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(ds, dd), _mm256_cvtepi32_pd(scm)),
                                  _mm256_mul_pd(_mm256_mul_pd(mc, dd), _mm256_cvtepi32_pd(sm)));
  return _mm256_add_pd(_mm256_sub_pd(a, _mm256_add_pd(s, s)), _mm256_mul_pd(_mm256_mul_pd(dd, dd), _mm256_cvtepi32_pd(smm)));
}

KV_AVX2_INLINE __m128i half_i(__m256i v, int h) { return h == 0 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1); }
KV_AVX2_INLINE __m128 half_f(__m256 v, int h) { return h == 0 ? _mm256_castps256_ps128(v) : _mm256_extractf128_ps(v, 1); }

KV_AVX2_INLINE Error8 offset_error8(const OffsetShared& sh, __m256 d, const LevelSums8& s) {
  Error8 e;
  e.lo = offset_error4(sh.ds[0], sh.mc[0], sh.a[0], half_f(d, 0), half_i(s.cross, 0), half_i(s.sum, 0), half_i(s.squares, 0));
  e.hi = offset_error4(sh.ds[1], sh.mc[1], sh.a[1], half_f(d, 1), half_i(s.cross, 1), half_i(s.sum, 1), half_i(s.squares, 1));
  return e;
}

struct OffsetBlock8 {
  const __m256i* a;
  const __m256i* w;
  __m256 ds, centre;  // centre = ms + float(h) ds
  OffsetShared shared;
  __m256 invalid;
};

template <int kShift, int kLo>
KV_AVX2_INLINE void consider_offset(const OffsetBlock8& k, __m128i d16, __m256 skip, CandidateBest8& best) {
  const __m256 dc = _mm256_cvtph_ps(d16);
  const CandidateLanes8 lanes = candidate_lanes(k.ds, dc, skip, k.invalid, finite_nonzero(dc));
  if (_mm256_movemask_ps(lanes.off) == 0xff) return;
  const Candidate8 cand =
      candidate8<kShift>(dc, lanes, _mm256_mul_ps(_mm256_div_ps(k.centre, dc), _mm256_set1_ps(float(1 << kShift))));
  const LevelSums8 s = offset_sums_of<kShift, kLo>(k.a, k.w, cand.b, cand.c);
  keep_where<false>(best, keep_below(best.err, offset_error8(k.shared, cand.d, s)), _mm256_cvtepu16_epi32(d16),
                    _mm256_setzero_si256(), cand, s);
}

// kLo: the target's lowest level, -8 (q4_0) or -16 (q5_0).
template <GgmlType T, int kLo>
KV_AVX2_INLINE void level_search_offset_lanes(LevelSearchBlocks& q) {
  constexpr bool kFive = T == GgmlType::kQ5_1;
  constexpr int kH = kFive ? 16 : 8, kShift = kFive ? 10 : 11;
  constexpr int lo_level = kLo, hi_level = -kLo - 1;
  __m256i v[kPairs];  // the centred levels c
  load_pairs<T>(q, v);
  alignas(16) uint16_t ds16[8], ms16[8];
  for (int k = 0; k < 8; ++k) {
    std::memcpy(&ds16[k], q.src[k < q.n ? k : 0], 2);
    std::memcpy(&ms16[k], q.src[k < q.n ? k : 0] + 2, 2);
  }
  const __m256 ds = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(ds16)));
  const __m256 ms = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(ms16)));
  const __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  OffsetBlock8 blk;
  blk.ds = ds;
  blk.centre = _mm256_add_ps(ms, _mm256_mul_ps(_mm256_set1_ps(float(kH)), ds));

  // The smallest and largest levels (as n = c + h) of each block.
  __m256i vmin, vmax;
  level_range(v, vmin, vmax);
  const __m256i h32 = _mm256_set1_epi32(kH);
  const __m256i nmax = _mm256_add_epi32(halves_max(vmax), h32);
  const __m256i nmin = _mm256_add_epi32(halves_min(vmin), h32);

  // The exact-multiple test: r = ms / ds in double, k = nearbyint(r).
  __m256d isint_d[2], near_d[2];
  __m128i k_i[2];
  for (int h = 0; h < 2; ++h) {
    const __m256d r = _mm256_div_pd(_mm256_cvtps_pd(half_f(ms, h)), _mm256_cvtps_pd(half_f(ds, h)));
    const __m256d k = _mm256_round_pd(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256d sign = _mm256_set1_pd(-0.0);
    isint_d[h] = _mm256_cmp_pd(r, k, _CMP_EQ_OQ);
    near_d[h] = _mm256_andnot_pd(isint_d[h], _mm256_and_pd(_mm256_cmp_pd(_mm256_andnot_pd(sign, r), _mm256_set1_pd(1048576.0), _CMP_LE_OQ),
                                                          _mm256_cmp_pd(_mm256_andnot_pd(sign, _mm256_sub_pd(r, k)), _mm256_set1_pd(1.0 / 32768.0), _CMP_LE_OQ)));
    k_i[h] = _mm256_cvtpd_epi32(_mm256_min_pd(_mm256_max_pd(k, _mm256_set1_pd(-4096.0)), _mm256_set1_pd(4096.0)));
  }
  const __m256i k32 = _mm256_set_m128i(k_i[1], k_i[0]);
  const __m256 isint = mask8(isint_d[0], isint_d[1]);
  const __m256 near = mask8(near_d[0], near_d[1]);
  const __m256i in_lo = _mm256_cmpgt_epi32(_mm256_add_epi32(nmin, k32), _mm256_set1_epi32(lo_level - 1));
  const __m256i in_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi_level + 1), _mm256_add_epi32(nmax, k32));
  const __m256i exact = _mm256_and_si256(_mm256_castps_si256(isint), _mm256_and_si256(in_lo, in_hi));

  // ggml's reference block: max from the smallest and largest levels' values.
  const __m256 x_lo = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(nmin), ds), ms);
  const __m256 x_hi = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(nmax), ds), ms);
  const __m256 a_lo = abs8(x_lo), a_hi = abs8(x_hi);
  const __m256 max = _mm256_blendv_ps(x_lo, x_hi, _mm256_cmp_ps(a_hi, a_lo, _CMP_GT_OQ));
  const __m256 tie = _mm256_and_ps(_mm256_cmp_ps(a_lo, a_hi, _CMP_EQ_OQ), _mm256_cmp_ps(x_lo, x_hi, _CMP_NEQ_UQ));
  const __m256 zero = _mm256_xor_ps(_mm256_cmp_ps(_mm256_max_ps(a_lo, a_hi), _mm256_setzero_ps(), _CMP_GT_OQ), ones);
  const __m256 declined =
      _mm256_or_ps(near, _mm256_andnot_ps(_mm256_castsi256_ps(exact), _mm256_or_ps(tie, zero)));
  const __m256 d = _mm256_div_ps(max, _mm256_set1_ps(float(lo_level)));
  const __m256 id = _mm256_div_ps(_mm256_set1_ps(1.0f), d);
  const __m256 bias = _mm256_set1_ps(0.5f - float(lo_level));
  const __m256i top = _mm256_set1_epi16(int16_t(hi_level - lo_level));
  const __m256i h16 = _mm256_set1_epi16(kH);
  const __m256i one16 = _mm256_set1_epi16(1);
  __m256i ref[kPairs], a[kPairs], w[kPairs];
  __m256i wc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  // sum w c = 1024 Scc + Sc
  __m256i rwm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i rmm[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    __m256 ne, no;
    pair_floats(v[j], h16, ne, no);
    const __m256 xe = _mm256_add_ps(_mm256_mul_ps(ne, ds), ms), xo = _mm256_add_ps(_mm256_mul_ps(no, ds), ms);
    const __m256i le = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(xe, id), bias));
    const __m256i lodd = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(xo, id), bias));
    const __m256i l = _mm256_add_epi16(_mm256_min_epi16(_mm256_blend_epi16(le, _mm256_slli_epi32(lodd, 16), 0xaa), top),
                                       _mm256_set1_epi16(kLo));
    ref[j] = l;
    a[j] = _mm256_slli_epi16(v[j], kShift + 1);
    w[j] = _mm256_add_epi16(_mm256_slli_epi16(v[j], 10), one16);
    wc[j & 1] = _mm256_add_epi32(wc[j & 1], _mm256_madd_epi16(w[j], v[j]));
    rwm[j & 1] = _mm256_add_epi32(rwm[j & 1], _mm256_madd_epi16(w[j], l));
    rmm[j & 1] = _mm256_add_epi32(rmm[j & 1], _mm256_madd_epi16(l, l));
  }
  blk.a = a;
  blk.w = w;
  const LevelSums8 cc = unpack_sums8(_mm256_add_epi32(wc[0], wc[1]), _mm256_setzero_si256());
  const __m256i scc8 = cc.cross, sc8 = cc.sum;
  for (int h = 0; h < 2; ++h) {
    const __m256d dsd = _mm256_cvtps_pd(half_f(ds, h));
    const __m256d mc = _mm256_add_pd(_mm256_cvtps_pd(half_f(ms, h)), _mm256_mul_pd(_mm256_set1_pd(double(kH)), dsd));
    const __m256d t = _mm256_mul_pd(_mm256_mul_pd(dsd, mc), _mm256_cvtepi32_pd(half_i(sc8, h)));
    blk.shared.ds[h] = dsd;
    blk.shared.mc[h] = mc;
    blk.shared.a[h] = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(dsd, dsd), _mm256_cvtepi32_pd(half_i(scc8, h))), _mm256_add_pd(t, t)),
                                    _mm256_mul_pd(_mm256_mul_pd(mc, mc), _mm256_set1_pd(32.0)));
  }
  const __m128i d16_ref = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
  const __m256 d_ref = _mm256_cvtph_ps(d16_ref);
  CandidateBest8 best;
  best.d16 = _mm256_cvtepu16_epi32(d16_ref);
  best.m16 = _mm256_setzero_si256();
  best.b = _mm256_setzero_si256();
  best.c = _mm256_setzero_si256();
  best.sums = unpack_sums8(_mm256_add_epi32(rwm[0], rwm[1]), _mm256_add_epi32(rmm[0], rmm[1]));
  best.reference = ones;
  best.err = offset_error8(blk.shared, d_ref, best.sums);
  const __m256d inf = _mm256_set1_pd(std::numeric_limits<double>::infinity()), zero_d = _mm256_setzero_pd();
  const __m256 err_ok = mask8(_mm256_and_pd(_mm256_cmp_pd(best.err.lo, zero_d, _CMP_GT_OQ), _mm256_cmp_pd(best.err.lo, inf, _CMP_LT_OQ)),
                              _mm256_and_pd(_mm256_cmp_pd(best.err.hi, zero_d, _CMP_GT_OQ), _mm256_cmp_pd(best.err.hi, inf, _CMP_LT_OQ)));
  blk.invalid = _mm256_or_ps(_mm256_or_ps(_mm256_xor_ps(_mm256_and_ps(err_ok, finite_nonzero(d_ref)), ones), _mm256_castsi256_ps(exact)), declined);

  if (_mm256_movemask_ps(blk.invalid) != 0xff) {
    for (float f : kQuickFactors) {
      consider_offset<kShift, kLo>(blk, _mm256_cvtps_ph(_mm256_mul_ps(d_ref, _mm256_set1_ps(f)), _MM_FROUND_TO_NEAREST_INT),
                              _mm256_setzero_ps(), best);
    }
    __m128 fit[2];
    __m128i ok[2];
    for (int h = 0; h < 2; ++h) {
      const __m256d num = _mm256_add_pd(_mm256_mul_pd(blk.shared.ds[h], _mm256_cvtepi32_pd(half_i(best.sums.cross, h))),
                                        _mm256_mul_pd(blk.shared.mc[h], _mm256_cvtepi32_pd(half_i(best.sums.sum, h))));
      fit[h] = _mm256_cvtpd_ps(_mm256_div_pd(num, _mm256_cvtepi32_pd(half_i(best.sums.squares, h))));
      ok[h] = _mm_cmpeq_epi32(half_i(best.sums.squares, h), _mm_setzero_si128());  // Smm == 0: skipped
    }
    consider_offset<kShift, kLo>(blk, _mm256_cvtps_ph(_mm256_set_m128(fit[1], fit[0]), _MM_FROUND_TO_NEAREST_INT),
                            _mm256_castsi256_ps(_mm256_set_m128i(ok[1], ok[0])), best);
  }

  // The best's levels (the reference block's where it stands; n + k where exact), transposed back
  // and packed; the declined blocks are not written.
  const __m256i is_ref = _mm256_castps_si256(best.reference);
  const __m256i kk = both_halves(_mm256_add_epi32(k32, h32));
  __m256 out[kPairs];
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    const __m256i m = _mm256_blendv_epi8(offset_levels_of<kShift, kLo>(a[j], best.b, best.c), ref[j], is_ref);
    out[j] = _mm256_castsi256_ps(_mm256_blendv_epi8(m, _mm256_add_epi16(v[j], kk), exact));
  }
  transpose8(out);
  transpose8(out + 8);
  alignas(32) uint32_t d16_out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(d16_out),
                     _mm256_blendv_epi8(best.d16, _mm256_cvtepu16_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(ds16))), exact));
  const uint32_t all = (1u << q.n) - 1;
  q.declined = uint32_t(_mm256_movemask_ps(declined)) & all;
  q.embedded = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(exact))) & all;
  for (int k = 0; k < q.n; ++k) {
    if (q.declined >> k & 1) continue;
    pack_block(_mm256_castps_si256(out[k]), _mm256_castps_si256(out[8 + k]), lo_level, uint16_t(d16_out[k]), q.dst[k]);
  }
}

// An offset target (q4_1, q5_1; simd_kernels.h, "An offset target"): the centred source levels c
// as int16 pairs in the lanes, as above; a candidate (D, M)'s centred target levels t' = t - H are
// pmulhrsw of a = c << (F + 1) by B, a saturating add of C, a shift by F and the clamps to [-H, T
// - H]. Its sums: Sct and St from one pmaddwd of w = 1024 c + 1 where |c| <= 16, from two
// (c t', 1 t') for 8-bit sources (q8_0, iq4_nl); Stt from t' t'. Each block's constants, errors
// and fit are lanes of float and double vectors whose operations are level_search.cc's
// (offset_target_block), lane by lane.
template <int kShift, int kHt, int kTop>
KV_AVX2_INLINE __m256i target_levels_of(__m256i a, __m256i b, __m256i c) {
  const __m256i t = _mm256_srai_epi16(_mm256_adds_epi16(_mm256_mulhrs_epi16(a, b), c), kShift);
  return _mm256_min_epi16(_mm256_max_epi16(t, _mm256_set1_epi16(-kHt)), _mm256_set1_epi16(kTop - kHt));
}

template <int kShift, int kHt, int kTop, bool kWide>
KV_AVX2_INLINE LevelSums8 target_sums_of(const __m256i* v, const __m256i* a, const __m256i* w, __m256i b, __m256i c) {
  const __m256i one16 = _mm256_set1_epi16(1);
  __m256i ct[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i st[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i tt[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    const __m256i t = target_levels_of<kShift, kHt, kTop>(a[j], b, c);
    if constexpr (kWide) {
      ct[j & 1] = _mm256_add_epi32(ct[j & 1], _mm256_madd_epi16(v[j], t));
      st[j & 1] = _mm256_add_epi32(st[j & 1], _mm256_madd_epi16(one16, t));
    } else {
      ct[j & 1] = _mm256_add_epi32(ct[j & 1], _mm256_madd_epi16(w[j], t));
    }
    tt[j & 1] = _mm256_add_epi32(tt[j & 1], _mm256_madd_epi16(t, t));
  }
  const __m256i stt = _mm256_add_epi32(tt[0], tt[1]);
  if constexpr (kWide) return {_mm256_add_epi32(ct[0], ct[1]), _mm256_add_epi32(st[0], st[1]), stt};
  return unpack_sums8(_mm256_add_epi32(ct[0], ct[1]), stt);
}

// What a block's errors share (double, 4 lanes a half): ds, mc = ms + hs ds, Scc, Sc.
struct TargetShared {
  __m256d ds[2], mc[2], scc[2], sc[2];
};

// E = (A - (s + s)) + (D D) Stt, u = (mc - M) - H D, w = (ds u) Sc, A = ((ds ds) Scc + (w + w)) +
// (u u) 32, s = (ds D) Sct + (u D) St, for 4 lanes (level_search.cc, target_error).
KV_AVX2_INLINE __m256d target_error4(const TargetShared& sh, int h, double ht, __m128 d, __m128 m, const LevelSums8& t) {
  const __m256d dd = _mm256_cvtps_pd(d);
  const __m256d u = _mm256_sub_pd(_mm256_sub_pd(sh.mc[h], _mm256_cvtps_pd(m)), _mm256_mul_pd(_mm256_set1_pd(ht), dd));
  const __m256d w = _mm256_mul_pd(_mm256_mul_pd(sh.ds[h], u), sh.sc[h]);
  const __m256d a = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(sh.ds[h], sh.ds[h]), sh.scc[h]), _mm256_add_pd(w, w)),
                                  _mm256_mul_pd(_mm256_mul_pd(u, u), _mm256_set1_pd(32.0)));
  const __m256d sum = _mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(sh.ds[h], dd), _mm256_cvtepi32_pd(half_i(t.cross, h))),
                                    _mm256_mul_pd(_mm256_mul_pd(u, dd), _mm256_cvtepi32_pd(half_i(t.sum, h))));
  return _mm256_add_pd(_mm256_sub_pd(a, _mm256_add_pd(sum, sum)),
                       _mm256_mul_pd(_mm256_mul_pd(dd, dd), _mm256_cvtepi32_pd(half_i(t.squares, h))));
}

KV_AVX2_INLINE Error8 target_error8(const TargetShared& sh, double ht, __m256 d, __m256 m, const LevelSums8& t) {
  return {target_error4(sh, 0, ht, half_f(d, 0), half_f(m, 0), t), target_error4(sh, 1, ht, half_f(d, 1), half_f(m, 1), t)};
}

struct TargetBlock8 {
  const __m256i* v;
  const __m256i* a;
  const __m256i* w;
  __m256 ds, centre;  // centre = ms + float(hs) ds
  TargetShared shared;
  __m256 invalid;
};

template <int kShift, int kHt, int kTop, bool kWide>
KV_AVX2_INLINE void consider_target(const TargetBlock8& k, __m128i d16, __m128i m16, __m256 skip, CandidateBest8& best) {
  const __m256 dc = _mm256_cvtph_ps(d16), mc = _mm256_cvtph_ps(m16);
  const __m256 m_finite = _mm256_cmp_ps(abs8(mc), _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ);
  const CandidateLanes8 lanes = candidate_lanes(k.ds, dc, skip, k.invalid, _mm256_and_ps(finite_nonzero(dc), m_finite));
  if (_mm256_movemask_ps(lanes.off) == 0xff) return;
  const __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_div_ps(_mm256_sub_ps(k.centre, mc), dc), _mm256_set1_ps(float(kHt))),
                                 _mm256_set1_ps(float(1 << kShift)));
  const Candidate8 cand = candidate8<kShift>(dc, lanes, v);
  const LevelSums8 s = target_sums_of<kShift, kHt, kTop, kWide>(k.v, k.a, k.w, cand.b, cand.c);
  keep_where<true>(best, keep_below(best.err, target_error8(k.shared, double(kHt), cand.d, mc, s)), _mm256_cvtepu16_epi32(d16),
                   _mm256_cvtepu16_epi32(m16), cand, s);
}

// Writes a q4_1 (kTop 15) or q5_1 block of scale d16, offset m16 and levels lo16 (values 0..15 as
// int16, 0..T) and hi16 (16..31), as pack_levels does.
template <int kTop>
KV_AVX2_INLINE void pack_offset_block(__m256i lo16, __m256i hi16, uint16_t d16, uint16_t m16, std::byte* out) {
  std::memcpy(out, &d16, 2);
  std::memcpy(out + 2, &m16, 2);
  const __m256i low4 = _mm256_set1_epi16(0x0f);
  const __m256i both = _mm256_or_si256(_mm256_and_si256(lo16, low4), _mm256_slli_epi16(_mm256_and_si256(hi16, low4), 4));
  const __m128i qs = _mm_packus_epi16(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
  if constexpr (kTop == 15) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4), qs);
  } else {
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(lo16, hi16), 0xd8);
    const uint32_t qh = uint32_t(_mm256_movemask_epi8(_mm256_slli_epi16(bytes, 3)));
    std::memcpy(out + 4, &qh, 4);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8), qs);
  }
}

// A source value as to_f32 gives it: float(n) ds (+ ms for an offset source).
template <bool kOffsetSrc>
KV_AVX2_INLINE __m256 source_value(__m256 n, __m256 ds, __m256 ms) {
  const __m256 x = _mm256_mul_ps(n, ds);
  if constexpr (kOffsetSrc) return _mm256_add_ps(x, ms);
  return x;
}

template <GgmlType T, int kTop>
KV_AVX2_INLINE void level_search_offset_target_lanes(LevelSearchBlocks& q) {
  constexpr bool kOffsetSrc = T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1;
  constexpr int kHs = T == GgmlType::kQ4_1 ? 8 : T == GgmlType::kQ5_1 ? 16 : 0;
  constexpr int kFsrc = T == GgmlType::kQ4_0 || T == GgmlType::kQ4_1 ? 11 : T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1 ? 10 : 7;
  constexpr int kShift = kFsrc < (kTop == 15 ? 11 : 10) ? kFsrc : (kTop == 15 ? 11 : 10);
  constexpr int kHt = (kTop + 1) / 2;
  constexpr bool kWide = kFsrc == 7;  // 8-bit levels: w = 1024 c + 1 would not fit int16
  __m256i v[kPairs];  // the centred levels c
  load_pairs<T>(q, v);
  alignas(16) uint16_t ds16[8], ms16[8] = {};
  for (int k = 0; k < 8; ++k) {
    std::memcpy(&ds16[k], q.src[k < q.n ? k : 0], 2);
    if (kOffsetSrc) std::memcpy(&ms16[k], q.src[k < q.n ? k : 0] + 2, 2);
  }
  const __m256 ds = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(ds16)));
  const __m256 ms = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(ms16)));
  const __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  TargetBlock8 blk;
  blk.ds = ds;
  blk.centre = _mm256_add_ps(ms, _mm256_mul_ps(_mm256_set1_ps(float(kHs)), ds));

  // Declined: levels at most T apart, or (an offset source) an offset beyond 2^19 scales.
  __m256i vmin, vmax;
  level_range(v, vmin, vmax);
  const __m256i hs32 = _mm256_set1_epi32(kHs);
  const __m256i nmax = _mm256_add_epi32(halves_max(vmax), hs32);
  const __m256i nmin = _mm256_add_epi32(halves_min(vmin), hs32);
  __m256 declined = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(kTop + 1), _mm256_sub_epi32(nmax, nmin)));
  if constexpr (kOffsetSrc) {
    const __m256 within = _mm256_cmp_ps(abs8(ms), _mm256_mul_ps(_mm256_set1_ps(524288.0f), abs8(ds)), _CMP_LE_OQ);
    declined = _mm256_or_ps(declined, _mm256_xor_ps(within, ones));
  }

  // ggml's reference block: min and max are the values of nmin and nmax.
  const __m256 x_lo = source_value<kOffsetSrc>(_mm256_cvtepi32_ps(nmin), ds, ms);
  const __m256 x_hi = source_value<kOffsetSrc>(_mm256_cvtepi32_ps(nmax), ds, ms);
  const __m256 lo_first = _mm256_cmp_ps(x_lo, x_hi, _CMP_LT_OQ);
  const __m256 min = _mm256_blendv_ps(x_hi, x_lo, lo_first), max = _mm256_blendv_ps(x_lo, x_hi, lo_first);
  const __m256 d = _mm256_div_ps(_mm256_sub_ps(max, min), _mm256_set1_ps(float(kTop)));
  const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256i one16 = _mm256_set1_epi16(1);
  const __m256i ht16 = _mm256_set1_epi16(kHt);
  __m256i ref[kPairs], a[kPairs], w[kPairs];
  // sum c c and sum c: from one sum w c = 1024 Scc + Sc where w is there (|c| <= 16), else two
  __m256i scc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i sc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i rct[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i rst[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  __m256i rtt[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    __m256 ne, no;
    if constexpr (kOffsetSrc) {
      pair_floats(v[j], _mm256_set1_epi16(kHs), ne, no);
    } else {
      ne = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v[j], 16), 16));
      no = _mm256_cvtepi32_ps(_mm256_srai_epi32(v[j], 16));
    }
    const __m256i le = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(source_value<kOffsetSrc>(ne, ds, ms), min), id), half));
    const __m256i lodd = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(source_value<kOffsetSrc>(no, ds, ms), min), id), half));
    __m256i l = _mm256_blend_epi16(le, _mm256_slli_epi32(lodd, 16), 0xaa);
    if constexpr (kTop == 15) {
      l = _mm256_min_epi16(l, _mm256_set1_epi16(15));
    } else {
      l = _mm256_and_si256(l, _mm256_set1_epi16(31));  // q5_1_ref keeps the low 5 bits
    }
    const __m256i t = _mm256_sub_epi16(l, ht16);
    ref[j] = t;
    a[j] = _mm256_slli_epi16(v[j], kShift + 1);
    if constexpr (!kWide) {
      w[j] = _mm256_add_epi16(_mm256_slli_epi16(v[j], 10), one16);
      scc[j & 1] = _mm256_add_epi32(scc[j & 1], _mm256_madd_epi16(w[j], v[j]));
    } else {
      scc[j & 1] = _mm256_add_epi32(scc[j & 1], _mm256_madd_epi16(v[j], v[j]));
      sc[j & 1] = _mm256_add_epi32(sc[j & 1], _mm256_madd_epi16(v[j], one16));
    }
    rct[j & 1] = _mm256_add_epi32(rct[j & 1], _mm256_madd_epi16(v[j], t));
    rst[j & 1] = _mm256_add_epi32(rst[j & 1], _mm256_madd_epi16(one16, t));
    rtt[j & 1] = _mm256_add_epi32(rtt[j & 1], _mm256_madd_epi16(t, t));
  }
  blk.v = v;
  blk.a = a;
  blk.w = w;
  __m256i scc8 = _mm256_add_epi32(scc[0], scc[1]), sc8 = _mm256_add_epi32(sc[0], sc[1]);
  if constexpr (!kWide) {
    const LevelSums8 cc = unpack_sums8(scc8, _mm256_setzero_si256());
    scc8 = cc.cross;
    sc8 = cc.sum;
  }
  for (int h = 0; h < 2; ++h) {
    const __m256d dsd = _mm256_cvtps_pd(half_f(ds, h));
    blk.shared.ds[h] = dsd;
    blk.shared.mc[h] = _mm256_add_pd(_mm256_cvtps_pd(half_f(ms, h)), _mm256_mul_pd(_mm256_set1_pd(double(kHs)), dsd));
    blk.shared.scc[h] = _mm256_cvtepi32_pd(half_i(scc8, h));
    blk.shared.sc[h] = _mm256_cvtepi32_pd(half_i(sc8, h));
  }
  const __m128i d16_ref = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
  const __m128i m16_ref = _mm256_cvtps_ph(min, _MM_FROUND_TO_NEAREST_INT);
  const __m256 d_ref = _mm256_cvtph_ps(d16_ref), m_ref = _mm256_cvtph_ps(m16_ref);
  CandidateBest8 best;
  best.d16 = _mm256_cvtepu16_epi32(d16_ref);
  best.m16 = _mm256_cvtepu16_epi32(m16_ref);
  best.b = _mm256_setzero_si256();
  best.c = _mm256_setzero_si256();
  best.sums = {_mm256_add_epi32(rct[0], rct[1]), _mm256_add_epi32(rst[0], rst[1]), _mm256_add_epi32(rtt[0], rtt[1])};
  best.reference = ones;
  best.err = target_error8(blk.shared, double(kHt), d_ref, m_ref, best.sums);
  const __m256d inf = _mm256_set1_pd(std::numeric_limits<double>::infinity()), zero_d = _mm256_setzero_pd();
  const __m256 err_ok = mask8(_mm256_and_pd(_mm256_cmp_pd(best.err.lo, zero_d, _CMP_GT_OQ), _mm256_cmp_pd(best.err.lo, inf, _CMP_LT_OQ)),
                              _mm256_and_pd(_mm256_cmp_pd(best.err.hi, zero_d, _CMP_GT_OQ), _mm256_cmp_pd(best.err.hi, inf, _CMP_LT_OQ)));
  const __m256 m_ok = _mm256_cmp_ps(abs8(m_ref), _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_LT_OQ);
  blk.invalid = _mm256_or_ps(_mm256_xor_ps(_mm256_and_ps(_mm256_and_ps(err_ok, finite_nonzero(d_ref)), m_ok), ones), declined);

  if (_mm256_movemask_ps(blk.invalid) != 0xff) {
    for (float f : kQuickFactors) {
      consider_target<kShift, kHt, kTop, kWide>(
          blk, _mm256_cvtps_ph(_mm256_mul_ps(d_ref, _mm256_set1_ps(f)), _MM_FROUND_TO_NEAREST_INT), m16_ref, _mm256_setzero_ps(), best);
    }
    // The least-squares line through the best's levels (level_search.cc, offset_target_block).
    __m128 dfit[2], mfit[2];
    __m128i skip[2];
    for (int h = 0; h < 2; ++h) {
      const __m256d st = _mm256_cvtepi32_pd(half_i(best.sums.sum, h));
      const __m256d det = _mm256_sub_pd(_mm256_mul_pd(_mm256_set1_pd(32.0), _mm256_cvtepi32_pd(half_i(best.sums.squares, h))),
                                        _mm256_mul_pd(st, st));
      const __m256d sx = _mm256_add_pd(_mm256_mul_pd(blk.shared.ds[h], blk.shared.sc[h]), _mm256_mul_pd(_mm256_set1_pd(32.0), blk.shared.mc[h]));
      const __m256d sxt = _mm256_add_pd(_mm256_mul_pd(blk.shared.ds[h], _mm256_cvtepi32_pd(half_i(best.sums.cross, h))),
                                        _mm256_mul_pd(blk.shared.mc[h], st));
      const __m256d df = _mm256_div_pd(_mm256_sub_pd(_mm256_mul_pd(_mm256_set1_pd(32.0), sxt), _mm256_mul_pd(st, sx)), det);
      const __m256d mf = _mm256_sub_pd(_mm256_div_pd(_mm256_sub_pd(sx, _mm256_mul_pd(df, st)), _mm256_set1_pd(32.0)),
                                       _mm256_mul_pd(_mm256_set1_pd(double(kHt)), df));
      dfit[h] = _mm256_cvtpd_ps(df);
      mfit[h] = _mm256_cvtpd_ps(mf);
      skip[h] = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
          _mm256_castpd_si256(_mm256_cmp_pd(det, zero_d, _CMP_EQ_OQ)), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)));
    }
    consider_target<kShift, kHt, kTop, kWide>(
        blk, _mm256_cvtps_ph(_mm256_set_m128(dfit[1], dfit[0]), _MM_FROUND_TO_NEAREST_INT),
        _mm256_cvtps_ph(_mm256_set_m128(mfit[1], mfit[0]), _MM_FROUND_TO_NEAREST_INT),
        _mm256_castsi256_ps(_mm256_set_m128i(skip[1], skip[0])), best);
  }

  // The best's levels (the reference block's where it stands), back to 0..T, transposed back and
  // packed; the declined blocks are not written.
  const __m256i is_ref = _mm256_castps_si256(best.reference);
  __m256 out[kPairs];
#pragma GCC unroll 16
  for (int j = 0; j < kPairs; ++j) {
    const __m256i t = _mm256_blendv_epi8(target_levels_of<kShift, kHt, kTop>(a[j], best.b, best.c), ref[j], is_ref);
    out[j] = _mm256_castsi256_ps(_mm256_add_epi16(t, ht16));
  }
  transpose8(out);
  transpose8(out + 8);
  alignas(32) uint32_t d16_out[8], m16_out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(d16_out), best.d16);
  _mm256_store_si256(reinterpret_cast<__m256i*>(m16_out), best.m16);
  const uint32_t all = (1u << q.n) - 1;
  q.declined = uint32_t(_mm256_movemask_ps(declined)) & all;
  q.embedded = 0;
  for (int k = 0; k < q.n; ++k) {
    if (q.declined >> k & 1) continue;
    pack_offset_block<kTop>(_mm256_castps_si256(out[k]), _mm256_castps_si256(out[8 + k]), uint16_t(d16_out[k]),
                            uint16_t(m16_out[k]), q.dst[k]);
  }
}

template <int kTop>
KV_AVX2_INLINE void level_search_offset_target(LevelSearchBlocks& q) {
  switch (q.src_type) {
    case GgmlType::kQ4_0: level_search_offset_target_lanes<GgmlType::kQ4_0, kTop>(q); break;
    case GgmlType::kQ5_0: level_search_offset_target_lanes<GgmlType::kQ5_0, kTop>(q); break;
    case GgmlType::kIQ4_NL: level_search_offset_target_lanes<GgmlType::kIQ4_NL, kTop>(q); break;
    case GgmlType::kQ4_1: level_search_offset_target_lanes<GgmlType::kQ4_1, kTop>(q); break;
    case GgmlType::kQ5_1: level_search_offset_target_lanes<GgmlType::kQ5_1, kTop>(q); break;
    default: level_search_offset_target_lanes<GgmlType::kQ8_0, kTop>(q); break;
  }
}

KV_AVX2_INLINE void level_search_type(LevelSearchBlocks& q) {
  if (q.dst_type == GgmlType::kQ4_1) return level_search_offset_target<15>(q);
  if (q.dst_type == GgmlType::kQ5_1) return level_search_offset_target<31>(q);
  const bool five = q.dst_type == GgmlType::kQ5_0;
  switch (q.src_type) {
    case GgmlType::kQ4_0: level_search_lanes<GgmlType::kQ4_0>(q); break;
    case GgmlType::kQ5_0: level_search_lanes<GgmlType::kQ5_0>(q); break;
    case GgmlType::kIQ4_NL: level_search_lanes<GgmlType::kIQ4_NL>(q); break;
    case GgmlType::kQ4_1: five ? level_search_offset_lanes<GgmlType::kQ4_1, -16>(q) : level_search_offset_lanes<GgmlType::kQ4_1, -8>(q); break;
    case GgmlType::kQ5_1: five ? level_search_offset_lanes<GgmlType::kQ5_1, -16>(q) : level_search_offset_lanes<GgmlType::kQ5_1, -8>(q); break;
    default: level_search_lanes<GgmlType::kQ8_0>(q); break;
  }
}

}  // namespace

KV_AVX2 void level_search_avx2(LevelSearchBlocks& q) { level_search_type(q); }

// The same kernel compiled for the avx512 level: the same 256-bit operations (the same bytes),
// with AVX-512VL's 32 vector registers.
KV_AVX512 void level_search_avx2_vl(LevelSearchBlocks& q) { level_search_type(q); }

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
