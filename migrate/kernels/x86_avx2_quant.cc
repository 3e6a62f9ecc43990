#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + FMA + F16C quantizers (from_f32) of q8_0, q4_0, q4_1, q5_0, q5_1, simd::Level::kAvx2.
// See x86_common.h for the rules. Each block is the reference's per-value operations in 8
// lanes; its reductions (abs-max, min, max) are order-free on non-NaN values, so a block holding
// a NaN takes the scalar reference, and so does a q4_1/q5_1 block whose min or max is a zero
// (which zero the reference keeps, +0 or -0, depends on the order, and the sign reaches the bytes).

#include "migrate/kernels/x86_common.h"

#include <algorithm>
#include <cfloat>

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {
namespace {

struct Block32 {
  __m256 v[4];
};

KV_AVX2_INLINE Block32 load32(const float* x) {
  return {{_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)}};
}

// The low byte of each lane of f(v[k]) (the reference's (int8_t) / (uint8_t) casts), in value order.
template <class F>
KV_AVX2_INLINE __m256i bytes32(const Block32& b, F f) {
  return low_bytes32(f(b.v[0]), f(b.v[1]), f(b.v[2]), f(b.v[3]));
}

// x[j] | x[16 + j] << 4 for the 32 bytes x (low nibbles of each kept), the qs of the 4/5-bit types.
KV_AVX2_INLINE __m128i nibbles16(__m256i b) {
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(_mm256_castsi256_si128(b), m);
  const __m128i hi = _mm_and_si128(_mm256_extracti128_si256(b, 1), m);
  return _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
}

// Bit j = bit 4 of byte j: the qh of q5_0/q5_1.
KV_AVX2_INLINE uint32_t bit4_mask(__m256i b) { return static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(b, 3))); }

// The signed value of the first element of largest |x| (q4_0, q5_0), for a block without NaN.
KV_AVX2_INLINE float first_of_amax8(const float* x, const Block32& b) {
  const __m256 a[4] = {abs8(b.v[0]), abs8(b.v[1]), abs8(b.v[2]), abs8(b.v[3])};
  const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
  if (!(amax > 0.0f)) return 0.0f;
  const __m256 m = _mm256_set1_ps(amax);
  uint32_t k = 0;
  for (int i = 0; i < 4; i++) k |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a[i], m, _CMP_EQ_OQ))) << (8 * i);
  return x[__builtin_ctz(k)];
}

// min and max of a block without NaN; false when either is a zero (see the top of the file).
KV_AVX2_INLINE bool min_max8(const Block32& b, float* mn, float* mx) {
  __m128 m = _mm_setzero_ps();
  const __m256 lo = _mm256_min_ps(_mm256_min_ps(b.v[0], b.v[1]), _mm256_min_ps(b.v[2], b.v[3]));
  m = _mm_min_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
  // the reference starts from min = FLT_MAX, max = -FLT_MAX: a block of +inf keeps min = FLT_MAX
  *mn = std::min(_mm_cvtss_f32(m), FLT_MAX);
  *mx = std::max(hmax8(_mm256_max_ps(_mm256_max_ps(b.v[0], b.v[1]), _mm256_max_ps(b.v[2], b.v[3]))), -FLT_MAX);
  return *mn != 0.0f && *mx != 0.0f;
}

}  // namespace

// =============================================================================================
// q8_0 (quantize_row_q8_0_ref): d = amax / 127, id = 1/d, q = (int8)roundf(x * id)
// =============================================================================================

// Eight blocks at a time: their abs-maxima reduced into one register and both divisions done
// once for the eight (8 lanes; an IEEE division rounds the same in every lane), so the blocks'
// division latencies overlap instead of forming a chain. A block holding a NaN takes the
// scalar reference.
KV_AVX2 void q8_0_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  const size_t nb = n / kQK;
  for (size_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = nb - b0 < 8 ? static_cast<int>(nb - b0) : 8;
    const float* xs = x + b0 * kQK;
    __m256 pm[8];
    uint32_t nan = 0;
    for (int b = 0; b < 8; b++) {
      if (b >= cnt) {
        pm[b] = _mm256_setzero_ps();
        continue;
      }
      const Block32 v = load32(xs + b * kQK);
      nan |= static_cast<uint32_t>(any_nan32(v.v)) << b;
      pm[b] = _mm256_max_ps(_mm256_max_ps(abs8(v.v[0]), abs8(v.v[1])), _mm256_max_ps(abs8(v.v[2]), abs8(v.v[3])));
    }
    const __m256 d = _mm256_div_ps(hmax8x8(pm), _mm256_set1_ps(static_cast<float>((1 << 7) - 1)));
    alignas(32) float id[8];
    _mm256_store_ps(id, _mm256_and_ps(_mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_UQ), _mm256_div_ps(_mm256_set1_ps(1.0f), d)));
    alignas(16) uint16_t dh[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(dh), _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));  // NaN lanes unused
    for (int b = 0; b < cnt; b++) {
      std::byte* blk = out + (b0 + b) * kQ8_0Bytes;
      if (__builtin_expect((nan >> b) & 1, 0)) {
        quants::ref::q8_0_from_f32(xs + b * kQK, blk, kQK);
        continue;
      }
      store_u16(blk, dh[b]);
      const __m256 vid = _mm256_broadcast_ss(id + b);
      const Block32 v = load32(xs + b * kQK);
      // the low byte of each int32 (the reference's (int8_t) cast, also for an infinite id)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + 2),
                          bytes32(v, [&](__m256 y) KV_AVX2_LAMBDA { return roundf_to_i32_8(_mm256_mul_ps(y, vid)); }));
    }
  }
}

// =============================================================================================
// q4_0 / q5_0 (quantize_row_q{4,5}_0_ref): max = first value of largest |x|, d = max / -2^(B-1),
// id = 1/d, q = MIN(2^B - 1, (int8)(x * id + 2^(B-1) + 0.5f))
// =============================================================================================

namespace {

template <int B>
KV_AVX2_INLINE void qx_0_block(const float* x, const Block32& b, std::byte* blk) {
  constexpr float kHalfRange = static_cast<float>(1 << (B - 1));
  const float max = first_of_amax8(x, b);
  const float d = max / -kHalfRange;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(blk, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));  // d is not NaN
  const __m256 vid = _mm256_set1_ps(id), bias = _mm256_set1_ps(kHalfRange + 0.5f);
  const __m256i q = _mm256_min_epi8(bytes32(b, [&](__m256 v) KV_AVX2_LAMBDA { return _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v, vid), bias)); }),
                                    _mm256_set1_epi8((1 << B) - 1));
  if constexpr (B == 4) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 2), nibbles16(q));
  } else {
    const uint32_t qh = bit4_mask(q);
    std::memcpy(blk + 2, &qh, sizeof(qh));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 6), nibbles16(q));
  }
}

// q4_1 / q5_1 (quantize_row_q{4,5}_1_ref): d = (max - min) / (2^B - 1), id = 1/d,
// q = (int8)((x - min) * id + 0.5f), MIN(15, q) for q4_1 (q5_1 keeps the (uint8) cast alone).
template <int B>
KV_AVX2_INLINE bool qx_1_block(const Block32& b, std::byte* blk) {
  float mn, mx;
  if (!min_max8(b, &mn, &mx)) return false;
  const float d = (mx - mn) / ((1 << B) - 1);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(blk, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));  // no NaN in the block: d, min are not NaN
  store_u16(blk + 2, _cvtss_sh(mn, _MM_FROUND_TO_NEAREST_INT));
  const __m256 vid = _mm256_set1_ps(id), vmin = _mm256_set1_ps(mn), half = _mm256_set1_ps(0.5f);
  __m256i q = bytes32(b, [&](__m256 v) KV_AVX2_LAMBDA { return _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, vmin), vid), half)); });
  if constexpr (B == 4) {
    q = _mm256_min_epi8(q, _mm256_set1_epi8(15));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 4), nibbles16(q));
  } else {
    const uint32_t qh = bit4_mask(q);
    std::memcpy(blk + 4, &qh, sizeof(qh));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 8), nibbles16(q));
  }
  return true;
}

}  // namespace

namespace {

// A row of the 4/5-bit types: block by block, a block holding a NaN (or, for q4_1/q5_1, a zero
// min or max) through the scalar reference `ref`.
template <int B, bool kMin, size_t kBytes>
KV_AVX2_INLINE void qx_row(const float* x, std::byte* out, size_t n, void (*ref)(const float*, std::byte*, size_t)) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kBytes;
    const Block32 b = load32(x);
    bool done = false;
    if (__builtin_expect(!any_nan32(b.v), 1)) {
      if constexpr (kMin) {
        done = qx_1_block<B>(b, blk);
      } else {
        qx_0_block<B>(x, b, blk);
        done = true;
      }
    }
    if (__builtin_expect(!done, 0)) ref(x, blk, kQK);
  }
}

}  // namespace

KV_AVX2 void q4_0_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  qx_row<4, false, kQ4_0Bytes>(x, out, n, quants::ref::q4_0_from_f32);
}
KV_AVX2 void q5_0_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  qx_row<5, false, kQ5_0Bytes>(x, out, n, quants::ref::q5_0_from_f32);
}
KV_AVX2 void q4_1_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  qx_row<4, true, kQ4_1Bytes>(x, out, n, quants::ref::q4_1_from_f32);
}
KV_AVX2 void q5_1_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  qx_row<5, true, kQ5_1Bytes>(x, out, n, quants::ref::q5_1_from_f32);
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
