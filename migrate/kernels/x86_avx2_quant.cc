#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + FMA + F16C quantizers (from_f32) of q8_0, q4_0, q4_1, q5_0, q5_1, simd::Level::kAvx2.
// See x86_common.h for the rules. Each block is the reference's per-value operations in 8
// lanes; its reductions (abs-max, min, max) are order-free on non-NaN values, so a block holding
// a NaN takes the scalar reference, and so does a q4_1/q5_1 block whose min or max is a zero
// (which zero the reference keeps, +0 or -0, depends on the order, and the sign reaches the bytes).

#include "migrate/kernels/x86_common.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

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
// id = 1/d, q = MIN(2^B - 1, (int8)(x * id + 2^(B-1) + 0.5f)).
// q4_1 / q5_1 (quantize_row_q{4,5}_1_ref): d = (max - min) / (2^B - 1), id = 1/d,
// q = (int8)((x - min) * id + 0.5f), MIN(15, q) for q4_1 (q5_1 keeps the (uint8) cast alone).
// Eight blocks at a time: their reductions in one register, their scales in one division each.
// =============================================================================================

namespace {

struct Scales8 {
  alignas(32) float id[8];
  alignas(32) float mn[8];
  alignas(16) uint16_t dh[8];
  alignas(16) uint16_t mh[8];
  uint32_t scalar;  // blocks for the scalar reference: a NaN, or (q4_1/q5_1) a zero min or max
};

KV_AVX2_INLINE __m256 neg8(__m256 v) { return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }

template <int B, bool kMin>
KV_AVX2_INLINE void scales8(const float* xs, int cnt, Scales8* s) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 pa[8], pb[8];
  uint32_t nan = 0;
  // The loops over the 8 blocks and their registers are unrolled so that pa, pb and the blocks'
  // values stay in registers (rolled, GCC keeps them on the stack: 30% of this row's time).
#pragma GCC unroll 8
  for (int b = 0; b < 8; b++) {
    if (__builtin_expect(b >= cnt, 0)) {
      pa[b] = pb[b] = zero;
      continue;
    }
    const Block32 v = load32(xs + b * kQK);
    nan |= static_cast<uint32_t>(any_nan32(v.v)) << b;
    if constexpr (kMin) {
      pa[b] = _mm256_max_ps(_mm256_max_ps(v.v[0], v.v[1]), _mm256_max_ps(v.v[2], v.v[3]));
      pb[b] = _mm256_max_ps(_mm256_max_ps(neg8(v.v[0]), neg8(v.v[1])), _mm256_max_ps(neg8(v.v[2]), neg8(v.v[3])));
    } else {
      pa[b] = _mm256_max_ps(_mm256_max_ps(abs8(v.v[0]), abs8(v.v[1])), _mm256_max_ps(abs8(v.v[2]), abs8(v.v[3])));
    }
  }
  __m256 d;
  if constexpr (kMin) {
    // the reference starts from min = FLT_MAX, max = -FLT_MAX: a block of +inf keeps min = FLT_MAX
    const __m256 mx = _mm256_max_ps(hmax8x8(pa), _mm256_set1_ps(-FLT_MAX));
    const __m256 mn = _mm256_min_ps(neg8(hmax8x8(pb)), _mm256_set1_ps(FLT_MAX));
    const __m256 zmask = _mm256_or_ps(_mm256_cmp_ps(mn, zero, _CMP_EQ_OQ), _mm256_cmp_ps(mx, zero, _CMP_EQ_OQ));
    nan |= static_cast<uint32_t>(_mm256_movemask_ps(zmask));
    d = _mm256_div_ps(_mm256_sub_ps(mx, mn), _mm256_set1_ps(static_cast<float>((1 << B) - 1)));
    _mm256_store_ps(s->mn, mn);
    _mm_store_si128(reinterpret_cast<__m128i*>(s->mh), _mm256_cvtps_ph(mn, _MM_FROUND_TO_NEAREST_INT));
  } else {
    // max, the first of largest |x| (the reference's), is amax with that value's sign: only the
    // signs are gathered, as bits (eight scalar stores read back as one vector would stall the
    // store forwarding). Lanes of NaN blocks are unused (the scalar reference writes those).
    const __m256 amax_v = hmax8x8(pa);
    alignas(32) float amax[8];
    _mm256_store_ps(amax, amax_v);
    uint32_t neg = 0;
#pragma GCC unroll 8
    for (int b = 0; b < 8; b++) {
      if (b >= cnt || ((nan >> b) & 1) || !(amax[b] > 0.0f)) continue;
      const Block32 v = load32(xs + b * kQK);
      const __m256 m = _mm256_set1_ps(amax[b]);
      uint32_t k = 0;
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) k |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(abs8(v.v[i]), m, _CMP_EQ_OQ))) << (8 * i);
      neg |= static_cast<uint32_t>(std::signbit(xs[b * kQK + __builtin_ctz(k)])) << b;
    }
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i neg_bits = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(neg)), bit);
    const __m256 neg_lanes = _mm256_castsi256_ps(_mm256_cmpeq_epi32(neg_bits, bit));
    const __m256 max = _mm256_xor_ps(amax_v, _mm256_and_ps(neg_lanes, _mm256_set1_ps(-0.0f)));
    d = _mm256_div_ps(max, _mm256_set1_ps(-static_cast<float>(1 << (B - 1))));
  }
  s->scalar = nan;
  _mm256_store_ps(s->id, _mm256_and_ps(_mm256_cmp_ps(d, zero, _CMP_NEQ_UQ), _mm256_div_ps(_mm256_set1_ps(1.0f), d)));
  _mm_store_si128(reinterpret_cast<__m128i*>(s->dh), _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));  // NaN lanes unused
}

template <int B, bool kMin>
KV_AVX2_INLINE void qx_block(const float* x, const Scales8& s, int b, std::byte* blk) {
  const Block32 v = load32(x);
  const __m256 vid = _mm256_broadcast_ss(s.id + b);
  store_u16(blk, s.dh[b]);
  __m256i q;
  if constexpr (kMin) {
    store_u16(blk + 2, s.mh[b]);
    const __m256 vmin = _mm256_broadcast_ss(s.mn + b), half = _mm256_set1_ps(0.5f);
    q = bytes32(v, [&](__m256 y) KV_AVX2_LAMBDA {
      return _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(y, vmin), vid), half));
    });
    if constexpr (B == 4) q = _mm256_min_epi8(q, _mm256_set1_epi8(15));
  } else {
    const __m256 bias = _mm256_set1_ps(static_cast<float>(1 << (B - 1)) + 0.5f);
    q = _mm256_min_epi8(bytes32(v, [&](__m256 y) KV_AVX2_LAMBDA { return _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(y, vid), bias)); }),
                        _mm256_set1_epi8((1 << B) - 1));
  }
  constexpr size_t kQs = (kMin ? 4 : 2) + (B == 5 ? 4 : 0);  // offset of qs: d (, m) (, qh)
  if constexpr (B == 5) {
    const uint32_t qh = bit4_mask(q);
    std::memcpy(blk + kQs - 4, &qh, sizeof(qh));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + kQs), nibbles16(q));
}

// A row of a 4/5-bit type, eight blocks at a time; blocks flagged by scales8 through the scalar
// reference `ref`.
template <int B, bool kMin, size_t kBytes>
KV_AVX2_INLINE void qx_row(const float* x, std::byte* out, size_t n, void (*ref)(const float*, std::byte*, size_t)) {
  assert(n % kQK == 0);
  const size_t nb = n / kQK;
  for (size_t b0 = 0; b0 < nb; b0 += 8) {
    const int cnt = nb - b0 < 8 ? static_cast<int>(nb - b0) : 8;
    const float* xs = x + b0 * kQK;
    Scales8 s;
    scales8<B, kMin>(xs, cnt, &s);
#pragma GCC unroll 8
    for (int b = 0; b < 8; b++) {
      if (__builtin_expect(b >= cnt, 0)) break;
      std::byte* blk = out + (b0 + b) * kBytes;
      if (__builtin_expect((s.scalar >> b) & 1, 0)) ref(xs + b * kQK, blk, kQK);
      else qx_block<B, kMin>(xs + b * kQK, s, b, blk);
    }
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
