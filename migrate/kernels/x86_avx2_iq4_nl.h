// Internal to migrate/kernels/: ggml's best_index_int8 over iq4_nl's table in 8 lanes, shared by
// the AVX2 iq4_nl quantizer (x86_avx2_iq4_nl.cc) and the requantizer's quick search
// (x86_avx2_requant.cc).
#pragma once

#include "migrate/kernels/x86_common.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {

// (kvalues_iq4nl[k] + kvalues_iq4nl[k + 1]) / 2: best_index_int8(x) = the number of these <= x
// (x - val[k] < val[k + 1] - x is false exactly from the midpoint on: near a midpoint both
// differences are exact; kvsnap-simd-check compares the two for every float with --exhaustive).
inline constexpr float kMid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                            7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};

// The count of midpoints <= x by a branchless binary search over the 15 sorted midpoints, four
// comparisons: bit 3 (x >= mid[7]), bit 2 (mid[3] or mid[11]), bit 1 (mid[1], [5], [9] or [13],
// by permute), bit 0 (mid[0], [2], ..., [14], by permute). NaN lanes give some index (the
// quantizer's blocks holding NaN take the scalar path; the quick search's NaN lanes are never
// valid).
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

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
