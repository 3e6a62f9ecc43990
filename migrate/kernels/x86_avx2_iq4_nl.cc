#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + FMA + F16C iq4_nl quantizer (quantize_iq4_nl, ntry 7), simd::Level::kAvx2. See
// x86_common.h for the rules.
//
// Lane = block: 8 blocks at a time, their values transposed so that register j holds value j of
// each block. Every lane then runs the reference's loops in the reference's order: the abs-max
// scan (first largest |x|), the 16 trial scales (the first from -max / values[0], then
// (itry + values[0]) / max), each trial's sums over j = 0..31 (sumqx += w * q * x,
// sumq2 += w * q * q, w = x * x) and the reference's comparison to keep it, so every float
// is bit-identical. best_index_int8 searches the midpoints instead of the values: its result is
// the number of midpoints (val[k] + val[k + 1]) / 2 at or below x, found with four vector
// comparisons (find8), which iq4_nl_index_avx2 exposes and kvsnap-simd-check compares with the
// reference's binary search. Blocks holding inf/NaN, blocks whose
// abs-max is above 1e18 (x * x could overflow) and blocks whose scale comes out non-finite take
// the scalar reference.

#include "migrate/kernels/x86_common.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {
namespace {

// (kvalues_iq4nl[k] + kvalues_iq4nl[k + 1]) / 2: best_index_int8(x) = the number of these <= x
// (x - val[k] < val[k + 1] - x is false exactly from the midpoint on: near a midpoint both
// differences are exact; kvsnap-simd-check compares the two for every float with --exhaustive).
constexpr float kMid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                            7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};

// The count of midpoints <= x by a branchless binary search over the 15 sorted midpoints, four
// comparisons: bit 3 (x >= mid[7]), bit 2 (mid[3] or mid[11]), bit 1 (mid[1], [5], [9] or [13],
// by permute), bit 0 (mid[0], [2], ..., [14], by permute). NaN lanes give some index (their
// blocks take the scalar path).
struct Search {
  __m256 m7, m3, m11, t1, t0;  // mid[7], mid[3], mid[11], {mid[1], [5], [9], [13]}, {mid[0], [2], ..., [14]}
  __m256 veven, vodd;          // kvalues_iq4nl[2k], [2k + 1] as floats
};

KV_AVX2_INLINE Search search8() {
  alignas(32) float t1[8] = {kMid[1], kMid[5], kMid[9], kMid[13], 0, 0, 0, 0}, t0[8], ve[8], vo[8];
  for (int k = 0; k < 8; k++) {
    t0[k] = kMid[2 * k];
    ve[k] = static_cast<float>(kIQ4NLValues[2 * k]);
    vo[k] = static_cast<float>(kIQ4NLValues[2 * k + 1]);
  }
  return {_mm256_set1_ps(kMid[7]), _mm256_set1_ps(kMid[3]), _mm256_set1_ps(kMid[11]), _mm256_load_ps(t1),
          _mm256_load_ps(t0),      _mm256_load_ps(ve),      _mm256_load_ps(vo)};
}

// index = 2 * half + bit0 (half: the top three bits), c0: bit 0 as a lane mask
struct Found {
  __m256i half;
  __m256 c0;
};

KV_AVX2_INLINE Found find8(__m256 x, const Search& s) {
  const __m256 c3 = _mm256_cmp_ps(x, s.m7, _CMP_GE_OQ);
  const __m256 c2 = _mm256_cmp_ps(x, _mm256_blendv_ps(s.m3, s.m11, c3), _CMP_GE_OQ);
  const __m256i i2 = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(c3), _mm256_set1_epi32(2)), _mm256_castps_si256(c2));
  const __m256 c1 = _mm256_cmp_ps(x, _mm256_permutevar8x32_ps(s.t1, i2), _CMP_GE_OQ);
  const __m256i i1 = _mm256_sub_epi32(_mm256_add_epi32(i2, i2), _mm256_castps_si256(c1));
  return {i1, _mm256_cmp_ps(x, _mm256_permutevar8x32_ps(s.t0, i1), _CMP_GE_OQ)};
}

// best_index_int8(16, kvalues_iq4nl, x) as int32 lanes
KV_AVX2_INLINE __m256i index8(__m256 x, const Search& s) {
  const Found f = find8(x, s);
  return _mm256_sub_epi32(_mm256_add_epi32(f.half, f.half), _mm256_castps_si256(f.c0));
}

// (float)kvalues_iq4nl[best_index_int8(16, kvalues_iq4nl, x)]
KV_AVX2_INLINE __m256 value8(__m256 x, const Search& s) {
  const Found f = find8(x, s);
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(s.veven, f.half), _mm256_permutevar8x32_ps(s.vodd, f.half), f.c0);
}

// 8 x 8 transpose: r[i] lane k <- r[k] lane i.
KV_AVX2_INLINE void transpose8(__m256* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

struct Sums {
  __m256 qx, q2;
};

// One trial's sums, lane = block, over j = 0..31 in order.
KV_AVX2_INLINE Sums trial(const __m256* x, const __m256* w, __m256 id, const Search& t) {
  __m256 sqx = _mm256_setzero_ps(), sq2 = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int j = 0; j < 32; j++) {
    const __m256 q = value8(_mm256_mul_ps(id, x[j]), t);
    const __m256 wq = _mm256_mul_ps(w[j], q);
    sqx = _mm256_add_ps(sqx, _mm256_mul_ps(wq, x[j]));
    sq2 = _mm256_add_ps(sq2, _mm256_mul_ps(wq, q));
  }
  return {sqx, sq2};
}

// The scales d of 8 blocks (x: 8 consecutive blocks of 32 values), lane = block; `scalar`
// gets the blocks that must take the scalar reference.
KV_AVX2_INLINE __m256 scales8(const float* src, const Search& t, uint32_t* scalar) {
  __m256 x[32], w[32];
  for (int g = 0; g < 4; g++) {
    for (int b = 0; b < 8; b++) x[8 * g + b] = _mm256_loadu_ps(src + 32 * b + 8 * g);
    transpose8(x + 8 * g);
  }
  const __m256 zero = _mm256_setzero_ps();
  __m256 amax = zero, max = zero, nan = zero;
  for (int j = 0; j < 32; j++) {
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x[j], x[j], _CMP_UNORD_Q));
    w[j] = _mm256_mul_ps(x[j], x[j]);
    const __m256 ax = abs8(x[j]);
    const __m256 gt = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);  // if (ax > amax): the first largest
    amax = _mm256_blendv_ps(amax, ax, gt);
    max = _mm256_blendv_ps(max, x[j], gt);
  }
  const __m256 search = _mm256_cmp_ps(amax, _mm256_set1_ps(1e-15f), _CMP_NLT_UQ);  // !(amax < GROUP_MAX_EPS)
  // -max / values[0]
  const __m256 d0 = _mm256_div_ps(_mm256_sub_ps(zero, max), _mm256_set1_ps(static_cast<float>(kIQ4NLValues[0])));
  Sums s = trial(x, w, _mm256_div_ps(_mm256_set1_ps(1.0f), d0), t);
  __m256 d = _mm256_and_ps(_mm256_cmp_ps(s.q2, zero, _CMP_GT_OQ), _mm256_div_ps(s.qx, s.q2));
  __m256 best = _mm256_mul_ps(d, s.qx);
  for (int itry = -7; itry <= 7; itry++) {
    const __m256 id = _mm256_div_ps(_mm256_set1_ps(static_cast<float>(itry + kIQ4NLValues[0])), max);
    s = trial(x, w, id, t);
    const __m256 take = _mm256_and_ps(_mm256_cmp_ps(s.q2, zero, _CMP_GT_OQ),
                                      _mm256_cmp_ps(_mm256_mul_ps(s.qx, s.qx), _mm256_mul_ps(best, s.q2), _CMP_GT_OQ));
    const __m256 dn = _mm256_div_ps(s.qx, s.q2);
    d = _mm256_blendv_ps(d, dn, take);
    best = _mm256_blendv_ps(best, _mm256_mul_ps(dn, s.qx), take);
  }
  d = _mm256_and_ps(search, d);
  // inf/NaN inputs (amax not finite), amax > 1e18, or a non-finite scale: the scalar reference
  const __m256 big = _mm256_cmp_ps(amax, _mm256_set1_ps(1e18f), _CMP_NLE_UQ);
  const __m256 bad_d = _mm256_cmp_ps(abs8(d), _mm256_set1_ps(INFINITY), _CMP_NLT_UQ);
  *scalar = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(big, bad_d), nan)));
  return d;
}

// The block's bytes from its scale: L[j] = best_index(id * x[j]), id = d != 0 ? 1 / d : 0.
KV_AVX2_INLINE void block_out(const float* x, float d, const Search& s, std::byte* blk) {
  store_u16(blk, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));  // d is finite: F16C == ggml
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1 / d : 0.0f);
  __m256i l[4];
  for (int k = 0; k < 4; k++) l[k] = index8(_mm256_mul_ps(id, _mm256_loadu_ps(x + 8 * k)), s);
  const __m256i b = low_bytes32(l[0], l[1], l[2], l[3]);
  const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 2), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
}

}  // namespace

KV_AVX2 void iq4_nl_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  const size_t nb = n / kQK;
  const Search t = search8();
  for (size_t b0 = 0; b0 < nb; b0 += 8) {
    const size_t cnt = nb - b0 < 8 ? nb - b0 : 8;
    const float* src = x + b0 * kQK;
    alignas(32) float pad[8 * kQK];
    if (cnt < 8) {  // zero blocks in the missing lanes (their scales are not used)
      std::memset(pad, 0, sizeof pad);
      std::memcpy(pad, src, cnt * kQK * sizeof(float));
      src = pad;
    }
    uint32_t scalar;
    alignas(32) float d[8];
    _mm256_store_ps(d, scales8(src, t, &scalar));
    for (size_t b = 0; b < cnt; b++) {
      std::byte* blk = out + (b0 + b) * kIQ4_NLBytes;
      if (__builtin_expect((scalar >> b) & 1, 0)) quants::ref::iq4_nl_from_f32(src + b * kQK, blk, kQK);
      else block_out(src + b * kQK, d[b], t, blk);
    }
  }
}

KV_AVX2 void iq4_nl_index_avx2(const float* x, uint8_t* idx, size_t n) {
  const Search s = search8();
  for (size_t i = 0; i + 8 <= n; i += 8) {
    alignas(32) int32_t l[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l), index8(_mm256_loadu_ps(x + i), s));
    for (int k = 0; k < 8; k++) idx[i + k] = static_cast<uint8_t>(l[k]);
  }
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
