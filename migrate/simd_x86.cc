#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

#include "migrate/simd_kernels.h"

// x86-64 SIMD kernels for the row codecs (see simd_kernels.h for the rules they follow).
// Each function carries its own target attribute; nothing here is executed unless
// simd::level() found the instructions (migrate/simd_level.cc). The file is compiled with
// the project's normal flags (no -march), and -ffp-contract=off plus fp_strict.h keep GCC from
// fusing the vector multiplies and adds into FMAs (its intrinsics are plain vector operators).
//
// Why each kernel gives the reference's bytes:
//   f16 <-> f32   vcvtph2ps is exact and quiets a NaN keeping its payload, like ggml's
//                 fp16_to_fp32; vcvtps2ph with round-to-nearest-even equals ggml's
//                 fp32_to_fp16 bit trick for every non-NaN input (checked over all 2^32
//                 patterns by kvsnap-simd-check --exhaustive), and NaN lanes are patched to
//                 0x7E00|sign.
//   rotation      the same u+v / u-v on the same pairs, stage by stage (len = 1, 2, 4, ...),
//                 after the same scaling multiply; inside a register u-v is one exact FMA.
//                 Blocks holding a NaN take the scalar loop (which NaN survives when two meet
//                 depends on operand order).
//   q8_0/q4_0     the abs-max of a block is a max over non-NaN values (order-free; VRANGEPS
//                 returns one of its operands), the scale and its inverse are IEEE divisions
//                 (a vector lane rounds like the scalar division), every value goes through the
//                 same multiply/add; roundf is round-half-away done exactly (roundf_to_i32_16);
//                 float->int is cvttps2dq, as in the reference on x86-64. Blocks holding a NaN
//                 take the scalar path (the reference's NaN handling depends on the order).
//   iq4_nl        lane = one block (16 blocks per vector; the 16 passes of a block in the
//                 lanes for runs of fewer than 8 blocks); each lane runs the reference's sums
//                 over j = 0..31 in order, so every sum is bit-identical; best_index is an exact
//                 equivalent (see "iq4_nl" below; verified for every float); the decision
//                 between the trials is the reference's sequence of comparisons, lane = block.
//                 Blocks with NaN/inf: scalar.
// Each of these is compared with the scalar reference byte for byte by kvsnap-simd-check
// (bench/simd_check.cc) and, through the public codecs, by tests/migrate at every level
// (KVSNAP_SIMD=avx2|avx512).

#ifdef KVSNAP_SIMD_X86

// GCC 12's avx512fintrin.h reads _mm512_undefined_*() values on purpose (-Wuninitialized noise).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cassert>
#include <cmath>
#include <cstring>

#include "migrate/half.h"
#include "migrate/quants.h"

#define KV_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KV_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define KV_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define KV_AVX512_INLINE                                                                                    \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"), always_inline)) \
  inline

namespace kvsnap::simd::x86 {
namespace {

using half::load_u16;
using half::store_u16;
using quants::kIQ4_NLBytes;
using quants::kIQ4NLValues;
using quants::kQ4_0Bytes;
using quants::kQ8_0Bytes;
using quants::kQK;

inline uint8_t* u8(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }

// ---- AVX2 helpers ---------------------------------------------------------------------------

KV_AVX2 inline __m256 abs8(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

// Largest lane; exact for non-NaN lanes (max is order-free there).
KV_AVX2 inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// True when any of the 32 values of a block is NaN.
KV_AVX2 inline bool any_nan32(const __m256 v[4]) {
  __m256 m = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v[0], v[0], _CMP_UNORD_Q), _mm256_cmp_ps(v[1], v[1], _CMP_UNORD_Q)),
                          _mm256_or_ps(_mm256_cmp_ps(v[2], v[2], _CMP_UNORD_Q), _mm256_cmp_ps(v[3], v[3], _CMP_UNORD_Q)));
  return _mm256_movemask_ps(m) != 0;
}

// The low byte of each of 4 x 8 int32 lanes, in order: 32 bytes.
KV_AVX2 inline __m256i low_bytes32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ff = _mm256_set1_epi32(0xff);
  const __m256i ab = _mm256_packus_epi32(_mm256_and_si256(a, ff), _mm256_and_si256(b, ff));
  const __m256i cd = _mm256_packus_epi32(_mm256_and_si256(c, ff), _mm256_and_si256(d, ff));
  const __m256i abcd = _mm256_packus_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// roundf(x) for 8 lanes: round half away from zero. trunc(x) and x - trunc(x) are exact, so
// |x - trunc(x)| >= 0.5 decides exactly; t +- 1 is exact for |t| < 2^24 and never taken
// above (the fraction is 0 there). inf -> inf (the fraction is NaN), NaN -> NaN.
KV_AVX2 inline __m256 roundf8(__m256 x) {
  const __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 f = abs8(_mm256_sub_ps(x, t));
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 ge = _mm256_cmp_ps(f, half, _CMP_GE_OQ);
  const __m256 one = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))),
                                  _mm256_set1_ps(1.0f));
  return _mm256_add_ps(t, _mm256_and_ps(ge, one));
}

// ---- AVX-512 helpers ------------------------------------------------------------------------

KV_AVX512 inline __m512 abs16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

KV_AVX512 inline float hmax16(__m512 v) {
  const __m256 m = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  return hmax8(m);
}

// The signed value of the first element whose |x| equals amax (> 0): what the reference's
// `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` (strict: the first one wins) keeps.
KV_AVX512 inline float first_of_amax(const float* x, __m512 a0, __m512 a1, float amax) {
  const __m512 m = _mm512_set1_ps(amax);
  const uint32_t k = static_cast<uint32_t>(_mm512_cmp_ps_mask(a0, m, _CMP_EQ_OQ)) |
                     (static_cast<uint32_t>(_mm512_cmp_ps_mask(a1, m, _CMP_EQ_OQ)) << 16);
  return x[__builtin_ctz(k)];
}

}  // namespace

// =============================================================================================
// f16 / bf16
// =============================================================================================

KV_AVX2 void f16_to_f32_avx2(const std::byte* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  if (i < n) quants::ref::f16_to_f32(src + 2 * i, dst + i, n - i);
}

KV_AVX2 void f16_from_f32_avx2(const float* src, std::byte* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
      // ggml: every NaN becomes 0x7E00 with the input's sign
      const __m256i bits = _mm256_castps_si256(x);
      const __m256i fix = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x8000)),
                                          _mm256_set1_epi32(0x7E00));
      const __m128i fix16 = _mm_packus_epi32(_mm256_castsi256_si128(fix), _mm256_extracti128_si256(fix, 1));
      const __m256i nm = _mm256_castps_si256(nan);
      const __m128i m16 = _mm_packs_epi32(_mm256_castsi256_si128(nm), _mm256_extracti128_si256(nm, 1));
      h = _mm_blendv_epi8(h, fix16, m16);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  if (i < n) quants::ref::f16_from_f32(src + i, dst + 2 * i, n - i);
}

KV_AVX512 void f16_to_f32_avx512(const std::byte* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  if (i < n) f16_to_f32_avx2(src + 2 * i, dst + i, n - i);
}

namespace {

// 16 floats -> f16, rounding to nearest, a NaN as the scalar path stores it (quiet NaN 0x7E00
// with its sign), which vcvtps2ph alone would not give.
KV_AVX512_INLINE __m256i f16x16_from_f32(__m512 x) {
  __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  if (__builtin_expect(nan != 0, 0)) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i fix = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x8000)),
                                        _mm512_set1_epi32(0x7E00));
    h = _mm256_mask_mov_epi16(h, nan, _mm512_cvtepi32_epi16(fix));
  }
  return h;
}

}  // namespace

KV_AVX512 void f16_from_f32_avx512(const float* src, std::byte* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), f16x16_from_f32(_mm512_loadu_ps(src + i)));
  }
  if (i < n) f16_from_f32_avx2(src + i, dst + 2 * i, n - i);
}

KV_AVX2 void bf16_to_f32_avx2(const std::byte* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  if (i < n) quants::ref::bf16_to_f32(src + 2 * i, dst + i, n - i);
}

// ggml_compute_fp32_to_bf16: NaN -> (i >> 16) | 64, else (i + 0x7fff + ((i >> 16) & 1)) >> 16.
KV_AVX2 void bf16_from_f32_avx2(const float* src, std::byte* dst, size_t n) {
  size_t i = 0;
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, absmask), inf);
    const __m256i hi = _mm256_srli_epi32(w, 16);
    const __m256i r_nan = _mm256_or_si256(hi, _mm256_set1_epi32(64));
    const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(w, bias), 16);
    const __m256i v = _mm256_blendv_epi8(r, r_nan, nan);
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  if (i < n) quants::ref::bf16_from_f32(src + i, dst + 2 * i, n - i);
}

// =============================================================================================
// dequantization (to_f32): float(q) * d, exactly the reference's one multiply per value
// =============================================================================================

KV_AVX2 void q8_0_to_f32_avx2(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ8_0Bytes;
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
    for (int k = 0; k < 4; k++) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * k));
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
      _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(f, d));
    }
  }
}

KV_AVX2 void q4_0_to_f32_avx2(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  const __m128i m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ4_0Bytes;
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(qs, m4), eight);                     // x[0..15]
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), eight);  // x[16..31]
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
      _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(f, d));
    }
  }
}

// y = d * kvalues_iq4nl[nibble]
KV_AVX2 void iq4_nl_to_f32_avx2(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kIQ4_NLBytes;
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, m4));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), m4));
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
      const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k]));
      _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(d, f));
    }
  }
}

// =============================================================================================
// q8_0 (quantize_row_q8_0_ref): d = amax / 127, id = 1/d, q = (int8)roundf(x * id)
// =============================================================================================

KV_AVX2 void q8_0_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ8_0Bytes;
    const __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
    if (__builtin_expect(any_nan32(v), 0)) {
      quants::ref::q8_0_from_f32(x, blk, kQK);
      continue;
    }
    const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(abs8(v[0]), abs8(v[1])), _mm256_max_ps(abs8(v[2]), abs8(v[3]))));
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(blk, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));  // d is not NaN: F16C == ggml
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvttps_epi32(roundf8(_mm256_mul_ps(v[k], vid)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + 2), low_bytes32(q[0], q[1], q[2], q[3]));
  }
}

// roundf with AVX-512's embedded rounding: x + copysign(0.5, x) rounded toward zero, then
// truncated, is exactly roundf(x): for x >= 0 the exact sum s = x + 0.5 satisfies
// k <= RZ(s) < k + 1 whenever k <= s < k + 1 (k an integer, exact in float), so
// trunc(RZ(s)) = floor(x + 0.5) = roundf(x); negative x mirror it. cvttps2dq truncates, so the
// add feeds it directly; NaN and |x| >= 2^31 give INT32_MIN either way, as in the reference.
KV_AVX512 inline __m512i roundf_to_i32_16(__m512 x) {
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512 half = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(0.5f))));
  return _mm512_cvttps_epi32(_mm512_add_round_ps(x, half, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
}


// =============================================================================================
// q4_0 (quantize_row_q4_0_ref): max = first value of largest |x|, d = max / -8, id = 1/d,
// q = MIN(15, (int8)(x * id + 8.5f)), two values per byte
// =============================================================================================

KV_AVX2 void q4_0_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ4_0Bytes;
    const __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)};
    if (__builtin_expect(any_nan32(v), 0)) {
      quants::ref::q4_0_from_f32(x, blk, kQK);
      continue;
    }
    const __m256 a[4] = {abs8(v[0]), abs8(v[1]), abs8(v[2]), abs8(v[3])};
    const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
    float max = 0.0f;
    if (amax > 0.0f) {
      const __m256 m = _mm256_set1_ps(amax);
      uint32_t k = 0;
      for (int i = 0; i < 4; i++) {
        k |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a[i], m, _CMP_EQ_OQ))) << (8 * i);
      }
      max = x[__builtin_ctz(k)];
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(blk, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));  // d is not NaN
    const __m256 vid = _mm256_set1_ps(id), bias = _mm256_set1_ps(8.5f);
    __m256i c[4];
    for (int i = 0; i < 4; i++) c[i] = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(v[i], vid), bias));
    // (int8) of each, then MIN(15, .) as int8
    const __m256i b = _mm256_min_epi8(low_bytes32(c[0], c[1], c[2], c[3]), _mm256_set1_epi8(15));
    const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    const __m128i q = _mm_or_si128(lo, _mm_and_si128(_mm_slli_epi16(hi, 4), _mm_set1_epi8(static_cast<char>(0xf0))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 2), q);
  }
}


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

namespace {

struct Iq4nlTables {
  alignas(64) float thr[32];     // slot k & 31: the midpoint in bucket [9k, 9k + 9), or +inf
  alignas(64) int32_t base[32];  // slot k & 31: the number of midpoints < 9k
  alignas(64) float vals[16];     // kvalues_iq4nl as floats
  alignas(64) float vals_hi[16];  // kvalues_iq4nl[min(k + 1, 15)]
  alignas(64) float mid[32];      // the fifteen midpoints, then +inf
  alignas(64) float thr8[32];     // slot k & 31: the midpoint in bucket [8k, 8k + 8), or +inf
  alignas(64) int32_t base8[32];  // slot k & 31: the number of midpoints < 8k
};

// Buckets [width k, width (k + 1)), k = -16..15 at slot k & 31: the midpoint inside (or +inf),
// and the number of midpoints below.
void fill_iq4nl_buckets(const float* mid, float width, float* thr, int32_t* base) {
  for (int key = -16; key < 16; key++) {
    const int slot = key & 31;
    const float lo = width * static_cast<float>(key), hi = lo + width;
    base[slot] = 0;
    thr[slot] = INFINITY;
    for (int i = 0; i < 15; i++) {
      if (mid[i] < lo) base[slot]++;
      else if (mid[i] < hi) thr[slot] = mid[i];
    }
  }
}

Iq4nlTables make_iq4nl_tables() {
  Iq4nlTables t{};
  float mid[15];
  for (int i = 0; i < 15; i++) mid[i] = static_cast<float>(kIQ4NLValues[i] + kIQ4NLValues[i + 1]) / 2;
  for (int i = 0; i < 16; i++) t.vals[i] = static_cast<float>(kIQ4NLValues[i]);
  for (int i = 0; i < 16; i++) t.vals_hi[i] = static_cast<float>(kIQ4NLValues[i < 15 ? i + 1 : 15]);
  for (int i = 0; i < 32; i++) t.mid[i] = i < 15 ? mid[i] : INFINITY;
  fill_iq4nl_buckets(mid, 9.0f, t.thr, t.base);
  fill_iq4nl_buckets(mid, 8.0f, t.thr8, t.base8);  // over [-128, 128): at most one midpoint each
  return t;
}

const Iq4nlTables& iq4nl_tables() {
  static const Iq4nlTables t = make_iq4nl_tables();
  return t;
}

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

}  // namespace

KV_AVX512 void iq4_nl_index_within128_avx512(const float* x, uint8_t* idx, size_t n) {
  const Iq4nlTables& t = iq4nl_tables();
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + i),
                     _mm512_cvtepi32_epi8(iq4nl_index16_within128(_mm512_loadu_ps(x + i), t)));
  }
}

KV_AVX512 void iq4_nl_index_avx512(const float* x, uint8_t* idx, size_t n) {
  const Iq4nlTables& t = iq4nl_tables();
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + i), _mm512_cvtepi32_epi8(iq4nl_index16(_mm512_loadu_ps(x + i), t)));
  }
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

struct Iq4nlChunk {
  alignas(64) float id[kIq4Chunk][16];    // per block: lane 0 = 1/d, lane 8 + itry = (itry - 127)/max
  alignas(64) float thr[kIq4Chunk][kQK];  // m[k0] per value (+inf past the last midpoint)
  alignas(64) float plo[kIq4Chunk][kQK], phi[kIq4Chunk][kQK], rlo[kIq4Chunk][kQK], rhi[kIq4Chunk][kQK];
  alignas(64) float p0[kIq4Chunk][kQK], r0[kIq4Chunk][kQK];  // lane 0's (w*q)*x and (w*q)*q
  alignas(64) float sx[kIq4Chunk][16], s2[kIq4Chunk][16];
  alignas(64) float sx0[kIq4Chunk], s20[kIq4Chunk];
  alignas(64) float d[kIq4Chunk];
  uint8_t kind[kIq4Chunk];  // 0: search, 1: amax < GROUP_MAX_EPS (d = 0), 2: inf/NaN (scalar reference)
};

// Candidate tables of one block.
KV_AVX512_INLINE void iq4_nl_tables_for(const float* xb, const float* idv, const Iq4nlTables& t, Iq4nlChunk& c,
                                        size_t b) {
  const __m512 id0 = _mm512_set1_ps(idv[0]), id1 = _mm512_set1_ps(idv[1]), id15 = _mm512_set1_ps(idv[15]);
  const __m512 vals = _mm512_load_ps(t.vals);
  const __m512 mid_a = _mm512_load_ps(t.mid), mid_b = _mm512_load_ps(t.mid + 16);
  const __m512i fifteen = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
  for (int h = 0; h < 2; h++) {
    const __m512 x = _mm512_loadu_ps(xb + 16 * h);
    const __m512 w = _mm512_mul_ps(x, x);  // weight[j] = xb[j]*xb[j]
    // |id * x| <= 134.02 for every lane (|id| <= 134/|max| to within rounding, |x| <= |max|)
    const __m512i k0 = iq4nl_index16_bounded(_mm512_min_ps(_mm512_mul_ps(id1, x), _mm512_mul_ps(id15, x)), t);
    _mm512_store_ps(c.thr[b] + 16 * h, _mm512_permutex2var_ps(mid_a, k0, mid_b));
    const __m512 qlo = _mm512_permutexvar_ps(k0, vals);
    const __m512 qhi = _mm512_permutexvar_ps(_mm512_min_epi32(_mm512_add_epi32(k0, one), fifteen), vals);
    const __m512 wlo = _mm512_mul_ps(w, qlo), whi = _mm512_mul_ps(w, qhi);
    _mm512_store_ps(c.plo[b] + 16 * h, _mm512_mul_ps(wlo, x));
    _mm512_store_ps(c.rlo[b] + 16 * h, _mm512_mul_ps(wlo, qlo));
    _mm512_store_ps(c.phi[b] + 16 * h, _mm512_mul_ps(whi, x));
    _mm512_store_ps(c.rhi[b] + 16 * h, _mm512_mul_ps(whi, qhi));
    const __m512 q0 = _mm512_permutexvar_ps(iq4nl_index16_bounded(_mm512_mul_ps(id0, x), t), vals);
    const __m512 w0 = _mm512_mul_ps(w, q0);
    _mm512_store_ps(c.p0[b] + 16 * h, _mm512_mul_ps(w0, x));
    _mm512_store_ps(c.r0[b] + 16 * h, _mm512_mul_ps(w0, q0));
  }
}

// kLaneJ[j] = j in every lane: the permute index of value j's lower candidate (+16: upper).
struct LaneJ {
  alignas(64) int32_t v[16][16];
};
constexpr LaneJ make_lane_j() {
  LaneJ t{};
  for (int j = 0; j < 16; j++) {
    for (int l = 0; l < 16; l++) t.v[j][l] = j;
  }
  return t;
}
constexpr LaneJ kLaneJ = make_lane_j();

// The 16 lanes' sums of one block, j = 0..31 in order.
KV_AVX512_INLINE void iq4_nl_sums_for(const float* xb, Iq4nlChunk& c, size_t b) {
  const __m512 id = _mm512_load_ps(c.id[b]);
  __m512 sumqx = _mm512_setzero_ps(), sumq2 = _mm512_setzero_ps();
  float sumqx0 = 0, sumq20 = 0;
#pragma GCC unroll 2
  for (int h = 0; h < 2; h++) {
    const __m512 plo = _mm512_load_ps(c.plo[b] + 16 * h), phi = _mm512_load_ps(c.phi[b] + 16 * h);
    const __m512 rlo = _mm512_load_ps(c.rlo[b] + 16 * h), rhi = _mm512_load_ps(c.rhi[b] + 16 * h);
    const __m512i sixteen = _mm512_set1_epi32(16);
#pragma GCC unroll 4
    for (int jj = 0; jj < 16; ++jj) {
      const int j = 16 * h + jj;
      const __m512 al = _mm512_mul_ps(id, _mm512_set1_ps(xb[j]));
      __mmask16 ge;
#if defined(__GNUC__) && !defined(__clang__)
      // al >= thr[j] with the threshold as an embedded broadcast (GCC would broadcast it into a
      // register first, one more instruction per value)
      __asm__("vcmpps $0x1d, %[t]%{1to16%}, %[al], %[k]" : [k] "=k"(ge) : [al] "v"(al), [t] "m"(c.thr[b][j]));
#else
      ge = _mm512_cmp_ps_mask(al, _mm512_set1_ps(c.thr[b][j]), _CMP_GE_OQ);
#endif
      const __m512i lj = _mm512_load_si512(kLaneJ.v[jj]);
      const __m512i idx = _mm512_mask_add_epi32(lj, ge, lj, sixteen);
      sumqx = _mm512_add_ps(sumqx, _mm512_permutex2var_ps(plo, idx, phi));  // sumqx += w*q*xb[j]
      sumq2 = _mm512_add_ps(sumq2, _mm512_permutex2var_ps(rlo, idx, rhi));  // sumq2 += w*q*q
      sumqx0 += c.p0[b][j];
      sumq20 += c.r0[b][j];
    }
  }
  _mm512_store_ps(c.sx[b], sumqx);
  _mm512_store_ps(c.s2[b], sumq2);
  c.sx0[b] = sumqx0;
  c.s20[b] = sumq20;
}

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

// 16 x 16 transpose: out[i] lane b = in[b] lane i.
KV_AVX512_INLINE void transpose16(const float (*in)[16], __m512* out) {
  const float* rows[16];
  for (int b = 0; b < 16; ++b) rows[b] = in[b];
  transpose16_rows(rows, out);
}

// The 16 block scales as f16 (f16x16_from_f32: the scalar path's NaN).
KV_AVX512_INLINE void store_scales_f16(__m512 d, uint16_t* dh) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(dh), f16x16_from_f32(d));
}

// The reference's choice of scale for the 16 blocks of a chunk at once (lane b = block b):
// lane 0's pass, then itry = -7..7 in order, on the same floats (IEEE division and
// multiplication round the same in a vector lane as in a scalar).
KV_AVX512 void iq4_nl_decide16(Iq4nlChunk& c) {
  __m512 sx[16], s2[16];
  transpose16(c.sx, sx);
  transpose16(c.s2, s2);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 sx0 = _mm512_load_ps(c.sx0), s20 = _mm512_load_ps(c.s20);
  // d = sumq2 > 0 ? sumqx/sumq2 : 0.f; best = d*sumqx;
  __m512 d = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(s20, zero, _CMP_GT_OQ), sx0, s20);
  __m512 best = _mm512_mul_ps(d, sx0);
#pragma GCC unroll 15
  for (int lane = 1; lane < 16; ++lane) {  // itry = lane - 8
    const __m512 qx = sx[lane], q2 = s2[lane];
    const __mmask16 take = _mm512_cmp_ps_mask(q2, zero, _CMP_GT_OQ) &
                           _mm512_cmp_ps_mask(_mm512_mul_ps(qx, qx), _mm512_mul_ps(best, q2), _CMP_GT_OQ);
    const __m512 dt = _mm512_div_ps(qx, q2);
    d = _mm512_mask_mov_ps(d, take, dt);
    best = _mm512_mask_mov_ps(best, take, _mm512_mul_ps(dt, qx));
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, d);
  for (size_t b = 0; b < kIq4Chunk; b++) {
    if (c.kind[b] == 0) c.d[b] = out[b];
  }
}

namespace {

// ---- the steps every chunk of up to 16 blocks shares -------------------------------------------

// kind[b]: 0 search, 1 amax < GROUP_MAX_EPS (d = 0), 2 inf/NaN (the scalar reference);
// maxv[b]: the reference's `max` (the signed first value of largest magnitude) of a searching
// block, 1.0 for the others and for the missing blocks b >= cnt.
KV_AVX512_INLINE void iq4_nl_classify(const float* xc, size_t cnt, uint8_t* kind, float* maxv) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  for (size_t b = 0; b < kIq4Chunk; b++) {
    kind[b] = 1;
    maxv[b] = 1.0f;
  }
  for (size_t b = 0; b < cnt; b++) {
    const float* xb = xc + b * kQK;
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    const __mmask16 bad0 = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v0), exp_mask), exp_mask);
    const __mmask16 bad1 = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v1), exp_mask), exp_mask);
    if (__builtin_expect((bad0 | bad1) != 0, 0)) {  // NaN or inf: the scalar reference
      kind[b] = 2;
      continue;
    }
    const __m512 a0 = abs16(v0), a1 = abs16(v1);
    const float amax = hmax16(_mm512_max_ps(a0, a1));
    if (amax < 1e-15f) continue;  // GROUP_MAX_EPS: d = 0
    kind[b] = 0;
    maxv[b] = first_of_amax(xb, a0, a1, amax);
  }
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

// ---- lanes = trial passes (one block at a time): chunks of fewer than kIq4AcrossMin blocks ------

// Up to 16 blocks: the 16 passes of each block in the lanes of one vector.
KV_AVX512 void iq4_nl_chunk_by_block(const float* xc, std::byte* outc, size_t cnt, const Iq4nlTables& t) {
  constexpr int ntry = 7;
  const int8_t* values = kIQ4NLValues;
  // lane 0: the first pass (its id is set per block); lane 8 + itry: itry + values[0]
  alignas(64) float numer[16];
  numer[0] = 1.0f;
  for (int itry = -ntry; itry <= ntry; ++itry) numer[8 + itry] = static_cast<float>(itry + values[0]);
  const __m512 vnumer = _mm512_load_ps(numer);
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  Iq4nlChunk c;
  alignas(64) float maxv[kIq4Chunk], id0v[kIq4Chunk];
  // the sums of blocks that do not search (and of the chunk's missing blocks) are zeroed for the
  // vectorized decision
  for (size_t b = 0; b < kIq4Chunk; b++) {
    _mm512_store_ps(c.sx[b], zero);
    _mm512_store_ps(c.s2[b], zero);
    c.d[b] = 0.0f;
  }
  _mm512_store_ps(c.sx0, zero);
  _mm512_store_ps(c.s20, zero);
  iq4_nl_classify(xc, cnt, c.kind, maxv);
  // the first pass's scale of all blocks: d = -max/values[0], id = 1/d (two vector divisions)
  {
    const __m512 max = _mm512_load_ps(maxv);
    const __m512 d = ntry > 0 ? _mm512_div_ps(_mm512_sub_ps(zero, max), _mm512_set1_ps(static_cast<float>(values[0])))
                              : _mm512_div_ps(max, _mm512_set1_ps(static_cast<float>(values[0])));
    _mm512_store_ps(id0v, _mm512_div_ps(one, d));
  }
  for (size_t b = 0; b < cnt; b++) {
    if (c.kind[b] != 0) continue;
    _mm512_store_ps(c.id[b], _mm512_mask_mov_ps(_mm512_div_ps(vnumer, _mm512_set1_ps(maxv[b])), 1, _mm512_set1_ps(id0v[b])));
  }
  // candidate tables; sums; decisions
  for (size_t b = 0; b < cnt; b++) {
    if (c.kind[b] == 0) iq4_nl_tables_for(xc + b * kQK, c.id[b], t, c, b);
  }
  for (size_t b = 0; b < cnt; b++) {
    if (c.kind[b] == 0) iq4_nl_sums_for(xc + b * kQK, c, b);
  }
  iq4_nl_decide16(c);
  iq4_nl_finish(xc, outc, cnt, c.kind, c.d, t);
}

// ---- lanes = blocks: chunks of kIq4AcrossMin..16 blocks -----------------------------------------
//
// Lane b of every vector belongs to block b of the chunk and walks the reference's loops for that
// block: the first pass over j = 0..31, then itry = -7..7, each over j = 0..31, every sum adding
// one value's (w*q)*x or (w*q)*q per step, in that order. The candidates are the same as above
// (a trial pass gives value j index k0 or k0 + 1, k0 + 1 iff al = id*x[j] >= m[k0], al computed
// with the reference's multiply); only the vector direction differs: a step of the sums is now
// 16 blocks' value j in one trial pass (a multiply, a compare, two blends, two additions), and
// the decision needs no transpose. The values are transposed once (x[j] lane b), blocks that do
// not search get zeros (their lanes compute harmless sums that are not used).

// The trial passes' id = (itry + values[0])/max, itry = -7..7, into id[0..14] (lane = block),
// each the correctly rounded quotient. A vector division takes ~10 cycles on the divider, and the
// tables wait for these; so one division gives y = RN(1/max), and each quotient is
// q = RN(a*y), r = a - q*max (exact, one FMA), q' = RN(q + r*y): Markstein's correction, which
// yields RN(a/max) when y is the rounded reciprocal and q is within an ulp of a/max. That holds
// for these numerators (-134..-120) and every divisor in [1, 2), checked exhaustively by
// kvsnap-simd-check; scaling the divisor by 2^k scales y, q and q' by 2^-k and leaves r as it
// is, so it holds for every |max| in [2^-100, 2^100] (all values stay normal). Other lanes take
// the divisions.
// With ends_only, only trials 1 and 15 (id[0..15], id[16 * 14..]) when the ids are exact (the
// trial schedule computes the others it runs, iq4_nl_compact_trials); all of them otherwise.
KV_AVX512_INLINE bool iq4_nl_trial_ids(__m512 max, float* id, __m512* y_out = nullptr, bool ends_only = false) {
  constexpr int ntry = 7;
  const float v0 = static_cast<float>(kIQ4NLValues[0]);
  const __m512 amax = abs16(max);
  const bool in_range = (_mm512_cmp_ps_mask(amax, _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(amax, _mm512_set1_ps(0x1p100f), _CMP_LE_OQ)) == 0xffff;
  if (__builtin_expect(!in_range, 0)) {
    for (int itry = -ntry; itry <= ntry; ++itry) {
      _mm512_storeu_ps(id + 16 * (itry + ntry), _mm512_div_ps(_mm512_set1_ps(static_cast<float>(itry) + v0), max));
    }
    return false;
  }
  const __m512 y = _mm512_div_ps(_mm512_set1_ps(1.0f), max);
  if (y_out) *y_out = y;
#pragma GCC unroll 15
  for (int itry = -ntry; itry <= ntry; ++itry) {
    if (ends_only && itry != -ntry && itry != ntry) continue;
    const __m512 a = _mm512_set1_ps(static_cast<float>(itry) + v0);
    const __m512 q = _mm512_mul_ps(a, y);
    const __m512 r = _mm512_fnmadd_ps(q, max, a);
    _mm512_storeu_ps(id + 16 * (itry + ntry), _mm512_fmadd_ps(r, y, q));
  }
  return true;
}

constexpr size_t kIq4AcrossMin = 8;  // fewer blocks: lanes = passes (iq4_nl_chunk_by_block)

// How far from the estimated flip of a value (in trials) iq4_nl_mark_flips also marks: more than
// the estimate's error (< 0.009) plus the rounding of the trial scales and products (< 3e-5).
constexpr float kIq4StepSlack = 0.02f;

// The per-value candidate tables of a chunk: written by its tables step, read only by its sums,
// so consecutive chunks share one (the next chunk's tables start after this chunk's sums), which
// keeps the chunks in flight within L1.
struct Iq4nlCand {
  alignas(64) float thr[kQK][16];  // m[k0] of value j of block b (+inf past the last midpoint)
  alignas(64) float plo[kQK][16], phi[kQK][16], rlo[kQK][16], rhi[kQK][16];  // (w*q)*x, (w*q)*q for q[k0], q[k0+1]
};

struct Iq4nlAcross {
  alignas(64) float x[kQK][16];    // x[j] lane b: value j of block b (0 for the missing blocks b >= cnt)
  Iq4nlCand* cand;  // the candidate tables, shared by the chunks in flight (see Iq4nlCand)
  // id[p] lane b: step p's id: p = 0: 1/d (the first pass); p >= 1: the lane's p-th trial
  // (iq4_nl_compact_trials), or trial p (itry = p - 8) for all 15 when the ids are divisions
  alignas(64) float id[16][16];
  alignas(64) float sx[16][16], s2[16][16];  // step p's sumqx, sumq2, lane b
  alignas(64) float d[16];
  uint8_t kind[kIq4Chunk];
  __mmask16 search;  // kind == 0
  int steps;         // the trial passes that run: id[1..steps] (see iq4_nl_compact_trials)
  int steps_half[2];  // those of lanes 0..7 and 8..15 (the larger is steps)
  alignas(64) float max[16];  // max lane b: the block's first value of largest magnitude (1: no search)
};


// Step p of the reference's choice of scale, lane = block, on the sums of pass p: p = 0 is the
// first pass (d = sumq2 > 0 ? sumqx/sumq2 : 0.f; best = d*sumqx), p = 1..steps are the lane's
// trials in order (iq4_nl_compact_trials) (if (sumq2 > 0 && sumqx*sumqx > best*sumq2) { d =
// sumqx/sumq2; best = d*sumqx; }), on the same floats (a vector lane rounds a division or product
// like the scalar instruction).
KV_AVX512_INLINE void iq4_nl_decide_step(const Iq4nlAcross& a, int p, __m512& d, __m512& best) {
  // the lanes whose half ran pass p (the sums of the others are not there)
  const __mmask16 ran = static_cast<__mmask16>((p <= a.steps_half[0] ? 0x00ff : 0) | (p <= a.steps_half[1] ? 0xff00 : 0));
  const __m512 zero = _mm512_setzero_ps();
  const __m512 qx = _mm512_load_ps(a.sx[p]), q2 = _mm512_load_ps(a.s2[p]);
  if (p == 0) {
    d = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(q2, zero, _CMP_GT_OQ), qx, q2);
    best = _mm512_mul_ps(d, qx);
    return;
  }
  const __mmask16 take = ran & _mm512_cmp_ps_mask(q2, zero, _CMP_GT_OQ) &
                         _mm512_cmp_ps_mask(_mm512_mul_ps(qx, qx), _mm512_mul_ps(best, q2), _CMP_GT_OQ);
  const __m512 dt = _mm512_div_ps(qx, q2);
  d = _mm512_mask_mov_ps(d, take, dt);
  best = _mm512_mask_mov_ps(best, take, _mm512_mul_ps(dt, qx));
}

// Trials that repeat the one before are skipped. Trial p (1..15) gives value j the index
// k0 + (al >= m[k0]), al = id_p * x[j], and that comparison flips at most once along p (al is
// monotone in p), near the real p* where (p* - 135) x / max = m[k0]: the rounding of id_p and
// of the product moves the flip by < 3e-5 (|p* - 135| <= 134 for a flip inside 1..15). When no
// value of a block flips between p - 1 and p, the two trials have the same indices, hence the
// same sums (the same additions in the same order), and the reference's loop does not change
// its choice on the second one: if it took the first, the second gives the same d and best;
// if not, the same comparison fails again. So each lane runs only its trials that follow a
// flip, in order, and repeats its last one to fill the vector.
//
// chg lane b has bit p (2..15) set when a value of block b may flip between p - 1 and p:
// iq4_nl_mark_flips marks floor(p* + 1 -+ slack) with p* estimated from rcp14 (relative error
// < 2^-14, so < 0.009 in p* for the values that can flip: |x| >= 0.03 |max| there, as |al| >=
// 4.5 at a midpoint and |al| <= 134 |x / max|); marking more is safe, marking less is not
// (kvsnap-simd-check compares the schedules with the reference's indices).
// The trial ids are recomputed with iq4_nl_trial_ids's operations, so equal to the table's.
KV_AVX512_INLINE void iq4_nl_compact_trials(Iq4nlAcross& a, __m512 max, __m512 y, __m512i chg) {
  // (blocks that do not search need no trials: zeros, padding, inf/NaN)
  __m512i m = _mm512_maskz_and_epi32(a.search, chg, _mm512_set1_epi32(0xFFFC));
  __m512 id = _mm512_load_ps(a.id[1]);  // every lane runs trial 1 first
  int steps = 1;
  a.steps_half[0] = a.steps_half[1] = 1;
  for (__mmask16 live = _mm512_test_epi32_mask(m, m); live; live = _mm512_test_epi32_mask(m, m)) {
    const __m512i low = _mm512_and_si512(m, _mm512_sub_epi32(_mm512_setzero_si512(), m));
    m = _mm512_xor_si512(m, low);
    // p = log2(low), from the exponent of the (exact) float; numerator p - 135 = itry - 127
    const __m512i p = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(low)), 23),
                                       _mm512_set1_epi32(127));
    const __m512 num = _mm512_cvtepi32_ps(_mm512_sub_epi32(p, _mm512_set1_epi32(135)));
    const __m512 q = _mm512_mul_ps(num, y);
    const __m512 r = _mm512_fnmadd_ps(q, max, num);
    id = _mm512_mask_mov_ps(id, live, _mm512_fmadd_ps(r, y, q));
    _mm512_store_ps(a.id[++steps], id);
    if (live & 0x00ff) a.steps_half[0] = steps;
    if (live & 0xff00) a.steps_half[1] = steps;
  }
  a.steps = steps;
}

// The candidate tables of every value, and the first pass's sums (p = 0), all in order of j.
// With `prev`, the steps of prev's decision (0..prev->steps) are interleaved with the 16 iterations (their
// chain of dependent compares and divisions then hides behind this chunk's arithmetic), and
// prev->d is set.
template <bool kDecide>
KV_AVX512_INLINE void iq4_nl_across_tables(Iq4nlAcross& a, const Iq4nlTables& t, Iq4nlAcross* prev) {
  __m512 dd = _mm512_setzero_ps(), best = _mm512_setzero_ps();
  const __m512 id0 = _mm512_load_ps(a.id[0]), id1 = _mm512_load_ps(a.id[1]), id15 = _mm512_load_ps(a.id[15]);
  const __m512 vals = _mm512_load_ps(t.vals), vals_hi = _mm512_load_ps(t.vals_hi), mid = _mm512_load_ps(t.mid);
  __m512 sx0 = _mm512_setzero_ps(), s20 = _mm512_setzero_ps();
  // two values per step (independent work for the out-of-order core); the sums stay in j order
  for (size_t j = 0; j < kQK; j += 2) {
    if constexpr (kDecide) {
      if (static_cast<int>(j / 2) <= prev->steps) iq4_nl_decide_step(*prev, static_cast<int>(j / 2), dd, best);
    }
    __m512 p0[2], r0[2];
#pragma GCC unroll 2
    for (size_t u = 0; u < 2; u++) {
      const __m512 x = _mm512_load_ps(a.x[j + u]);
      const __m512 w = _mm512_mul_ps(x, x);  // weight[j] = xb[j]*xb[j]
      // |id * x| <= 134.02 for every lane (|id| <= 134/|max| to within rounding, |x| <= |max|)
      // (k0: the index is 0 below -128 and 15 above 127.99, so the clamp keeps it)
      const __m512i k0 = iq4nl_index16_within128(
          _mm512_range_ps(_mm512_min_ps(_mm512_mul_ps(id1, x), _mm512_mul_ps(id15, x)), _mm512_set1_ps(127.99f), 0x02), t);
      _mm512_store_ps(a.cand->thr[j + u], _mm512_permutexvar_ps(k0, mid));
      const __m512 qlo = _mm512_permutexvar_ps(k0, vals), qhi = _mm512_permutexvar_ps(k0, vals_hi);
      const __m512 wlo = _mm512_mul_ps(w, qlo), whi = _mm512_mul_ps(w, qhi);
      _mm512_store_ps(a.cand->plo[j + u], _mm512_mul_ps(wlo, x));
      _mm512_store_ps(a.cand->rlo[j + u], _mm512_mul_ps(wlo, qlo));
      _mm512_store_ps(a.cand->phi[j + u], _mm512_mul_ps(whi, x));
      _mm512_store_ps(a.cand->rhi[j + u], _mm512_mul_ps(whi, qhi));
      // |id0 * x| <= 127 (1 + 2^-22): id0 = 1/d, d = max/127 (two roundings), |x| <= |max|
      const __m512 q0 = _mm512_permutexvar_ps(iq4nl_index16_within128(_mm512_mul_ps(id0, x), t), vals);
      const __m512 w0 = _mm512_mul_ps(w, q0);
      p0[u] = _mm512_mul_ps(w0, x);
      r0[u] = _mm512_mul_ps(w0, q0);
    }
    sx0 = _mm512_add_ps(_mm512_add_ps(sx0, p0[0]), p0[1]);  // sumqx += w*q*xb[j], j then j + 1
    s20 = _mm512_add_ps(_mm512_add_ps(s20, r0[0]), r0[1]);  // sumq2 += w*q*q
  }
  _mm512_store_ps(a.sx[0], sx0);
  _mm512_store_ps(a.s2[0], s20);
  if constexpr (kDecide) _mm512_store_ps(prev->d, _mm512_maskz_mov_ps(prev->search, dd));  // d = 0: no search
}

// The trials where a value of a block may change index (iq4_nl_compact_trials): lane b, bit p
// (2..15) for floor(p* + 1 -+ slack), where p* + 1 = 136 + m[k0] * max / x.
KV_AVX512_INLINE __m512i iq4_nl_mark_flips(const Iq4nlAcross& a, __m512 max) {
  const __m512 p_lo = _mm512_set1_ps(136.0f - kIq4StepSlack), p_hi = _mm512_set1_ps(136.0f + kIq4StepSlack);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i chg = _mm512_setzero_si512();
  for (size_t j = 0; j < kQK; j++) {
    const __m512 x = _mm512_load_ps(a.x[j]), thr = _mm512_load_ps(a.cand->thr[j]);
    const __m512 mr = _mm512_mul_ps(max, _mm512_rcp14_ps(x));
    const __m512i s_lo = _mm512_cvt_roundps_epi32(_mm512_fmadd_ps(thr, mr, p_lo), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512i s_hi = _mm512_cvt_roundps_epi32(_mm512_fmadd_ps(thr, mr, p_hi), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    chg = _mm512_or_si512(chg, _mm512_or_si512(_mm512_sllv_epi32(one, s_lo), _mm512_sllv_epi32(one, s_hi)));
  }
  return chg;
}

// The sums of the trial passes P0 .. P0 + G - 1 of blocks 8h..8h + 7 (half h of the lanes),
// j = 0..31 in order. In 256-bit vectors: as fast per block as 512-bit ones on CPUs that split
// those in two (Zen 4), and each half runs only its own passes (Iq4nlAcross::steps_half).
template <int G>
KV_AVX512_INLINE void iq4_nl_across_sums_half(Iq4nlAcross& a, int P0, int h) {
  __m256 id[G], sx[G], s2[G];
  const size_t o = 8 * static_cast<size_t>(h);
#pragma GCC unroll 16
  for (int k = 0; k < G; k++) {
    id[k] = _mm256_load_ps(a.id[P0 + k] + o);
    sx[k] = _mm256_setzero_ps();
    s2[k] = _mm256_setzero_ps();
  }
#pragma GCC unroll 1
  for (size_t j = 0; j < kQK; j++) {
    const __m256 x = _mm256_load_ps(a.x[j] + o), thr = _mm256_load_ps(a.cand->thr[j] + o);
    const __m256 plo = _mm256_load_ps(a.cand->plo[j] + o), phi = _mm256_load_ps(a.cand->phi[j] + o);
    const __m256 rlo = _mm256_load_ps(a.cand->rlo[j] + o), rhi = _mm256_load_ps(a.cand->rhi[j] + o);
#pragma GCC unroll 16
    for (int k = 0; k < G; k++) {
      const __mmask8 ge = _mm256_cmp_ps_mask(_mm256_mul_ps(id[k], x), thr, _CMP_GE_OQ);  // al >= m[k0]
      sx[k] = _mm256_add_ps(sx[k], _mm256_mask_blend_ps(ge, plo, phi));  // sumqx += w*q*xb[j]
      s2[k] = _mm256_add_ps(s2[k], _mm256_mask_blend_ps(ge, rlo, rhi));  // sumq2 += w*q*q
    }
  }
#pragma GCC unroll 16
  for (int k = 0; k < G; k++) {
    _mm256_store_ps(a.sx[P0 + k] + o, sx[k]);
    _mm256_store_ps(a.s2[P0 + k] + o, s2[k]);
  }
}

// The nibbles of blocks 4L..4L + 3 (r[i], 128-bit lane L: the 16 bytes of block 4L + i).
template <int L>
KV_AVX512_INLINE void iq4_nl_store_nibbles(const __m512i* r, std::byte* outc) {
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(outc + (4 * L + i) * kIQ4_NLBytes + 2), _mm512_extracti32x4_epi32(r[i], L));
  }
}

// The blocks' bytes, lane = block: the scale as fp16 and the indices with id = 1/d, the same
// operations as iq4_nl_finish; the 16 bytes of nibbles of each block are gathered with shifts and
// a 4 x 4 transpose of dwords per 128-bit lane. Blocks whose id is inf/NaN (al may be NaN, which
// best_index sends to 15) go through iq4_nl_finish, those of kind 2 through the scalar reference.
KV_AVX512_INLINE void iq4_nl_finish_across(const Iq4nlAcross& a, const float* xc, std::byte* outc, size_t cnt,
                                           const Iq4nlTables& t) {
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  const __m512 d = _mm512_load_ps(a.d);
  alignas(32) uint16_t dh[kIq4Chunk];
  store_scales_f16(d, dh);
  // id = d != 0.0f ? 1/d : 0 (a NaN d is != 0)
  const __m512 idf = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ), one, d);
  const __mmask16 special = _mm512_fpclass_ps_mask(idf, 0x99);
  __m512i v[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; j++) {
    const __m512i lo = iq4nl_index16(_mm512_mul_ps(idf, _mm512_load_ps(a.x[j])), t);
    const __m512i hi = iq4nl_index16(_mm512_mul_ps(idf, _mm512_load_ps(a.x[j + 16])), t);
    v[j] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));  // q4[j] = L[j] | L[16 + j] << 4
  }
  __m512i w[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++) {  // bytes 4k..4k+3 of every block
    w[k] = _mm512_or_si512(_mm512_or_si512(v[4 * k], _mm512_slli_epi32(v[4 * k + 1], 8)),
                           _mm512_or_si512(_mm512_slli_epi32(v[4 * k + 2], 16), _mm512_slli_epi32(v[4 * k + 3], 24)));
  }
  const __m512i t0 = _mm512_unpacklo_epi32(w[0], w[1]), t1 = _mm512_unpackhi_epi32(w[0], w[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(w[2], w[3]), t3 = _mm512_unpackhi_epi32(w[2], w[3]);
  // r[i], 128-bit lane l: the 16 bytes of block 4l + i
  const __m512i r[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                        _mm512_unpackhi_epi64(t1, t3)};
  for (size_t b = 0; b < cnt; b++) store_u16(outc + b * kIQ4_NLBytes, dh[b]);
  if (cnt == kIq4Chunk) {
    iq4_nl_store_nibbles<0>(r, outc);
    iq4_nl_store_nibbles<1>(r, outc);
    iq4_nl_store_nibbles<2>(r, outc);
    iq4_nl_store_nibbles<3>(r, outc);
  } else {
    alignas(64) uint8_t q[4][64];
    for (int i = 0; i < 4; i++) _mm512_store_si512(q[i], r[i]);
    for (size_t b = 0; b < cnt; b++) std::memcpy(outc + b * kIQ4_NLBytes + 2, q[b % 4] + 16 * (b / 4), 16);
  }
  for (size_t b = 0; b < cnt; b++) {
    if (a.kind[b] == 2) {
      quants::ref::iq4_nl_from_f32(xc + b * kQK, outc + b * kIQ4_NLBytes, kQK);
    } else if ((special >> b) & 1) {
      alignas(64) float d1[kIq4Chunk] = {a.d[b]};
      iq4_nl_finish(xc + b * kQK, outc + b * kIQ4_NLBytes, 1, &a.kind[b], d1, t);
    }
  }
}

// A chunk of 16 blocks (cnt >= kIq4AcrossMin; the missing ones are padded with zeros) in three
// steps: prepare (transpose, classify, scales, tables), sums, decide and write. The row loop runs
// the decision of one chunk inside the next chunk's tables (iq4_nl_across_tables<true>), so that
// its chain of dependent compares and divisions overlaps with that arithmetic; only the last
// chunk of a run decides on its own (iq4_nl_across_decide).
KV_AVX512 void iq4_nl_across_prepare(const float* xc, size_t cnt, Iq4nlAcross& a, const Iq4nlTables& t,
                                     Iq4nlAcross* prev) {
  constexpr int ntry = 7;
  const int8_t* values = kIQ4NLValues;
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  // x[j] lane b (zeros for the missing blocks b >= cnt)
  {
    alignas(64) static const float zeros[kQK] = {};
    for (size_t h = 0; h < 2; h++) {
      const float* hr[kIq4Chunk];
      for (size_t b = 0; b < kIq4Chunk; b++) hr[b] = (b < cnt ? xc + b * kQK : zeros) + 16 * h;
      __m512 xt[16];
      transpose16_rows(hr, xt);
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) _mm512_store_ps(a.x[16 * h + i], xt[i]);
    }
  }
  // classify, lane = block: the reference's `if (ax > amax) { amax = ax; max = xb[j]; }` over
  // j = 0..31 (the first value of largest magnitude wins); blocks with an inf/NaN value take the
  // scalar reference (their lanes compute garbage that is not used: lanes never mix), blocks
  // with amax < GROUP_MAX_EPS get d = 0; those and the missing blocks search with max = 1.
  __m512 max;
  __mmask16 search;
  {
    // amax, and `max` = x[j] at the smallest j with |x[j]| == amax (what the strict > keeps).
    // Over non-NaN values max and min are order-free: the largest value hi and the smallest lo;
    // max is hi when hi > -lo and lo when -lo > hi, whichever j holds it first (the same value).
    // Only when hi == -lo (both signs reach amax) does the order matter: then the lanes that
    // search take the reference's loop. NaN lanes are `bad` and take the scalar reference.
    __m512 hi4[4], lo4[4];
    __mmask16 badk[4] = {0, 0, 0, 0};
#pragma GCC unroll 32
    for (size_t j = 0; j < kQK; j++) {
      const __m512 x = _mm512_load_ps(a.x[j]);
      badk[j % 4] |= _mm512_fpclass_ps_mask(x, 0x99);  // QNaN | +inf | -inf | SNaN
      hi4[j % 4] = j < 4 ? x : _mm512_max_ps(hi4[j % 4], x);
      lo4[j % 4] = j < 4 ? x : _mm512_min_ps(lo4[j % 4], x);
    }
    const __m512 hi = _mm512_max_ps(_mm512_max_ps(hi4[0], hi4[1]), _mm512_max_ps(hi4[2], hi4[3]));
    const __m512 neg_lo = _mm512_sub_ps(_mm512_setzero_ps(),
                                        _mm512_min_ps(_mm512_min_ps(lo4[0], lo4[1]), _mm512_min_ps(lo4[2], lo4[3])));
    __mmask16 bad = static_cast<__mmask16>((badk[0] | badk[1]) | (badk[2] | badk[3]));
    const __m512 amax = _mm512_max_ps(hi, neg_lo);
    __m512 mx = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(neg_lo, hi, _CMP_GT_OQ), hi, _mm512_sub_ps(_mm512_setzero_ps(), neg_lo));
    if (__builtin_expect(_mm512_cmp_ps_mask(hi, neg_lo, _CMP_EQ_OQ) != 0, 0)) {
      __m512 first = _mm512_setzero_ps();
      for (size_t j = kQK; j-- > 0;) {
        const __m512 x = _mm512_load_ps(a.x[j]);
        first = _mm512_mask_mov_ps(first, _mm512_cmp_ps_mask(abs16(x), amax, _CMP_EQ_OQ), x);
      }
      mx = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(hi, neg_lo, _CMP_EQ_OQ), first);
    }
    const __mmask16 valid = static_cast<__mmask16>(cnt >= 16 ? 0xffff : (1u << cnt) - 1);
    bad &= valid;
    search = static_cast<__mmask16>(valid & ~bad & _mm512_cmp_ps_mask(amax, _mm512_set1_ps(1e-15f), _CMP_NLT_UQ));
    a.search = search;
    max = _mm512_mask_mov_ps(one, search, mx);
    _mm512_store_ps(a.max, max);
    for (size_t b = 0; b < kIq4Chunk; b++) a.kind[b] = (bad >> b) & 1 ? 2 : (search >> b) & 1 ? 0 : 1;
  }
  // the scales: d = -max/values[0], id = 1/d for the first pass; id = (itry + values[0])/max
  {
    const __m512 d = ntry > 0 ? _mm512_div_ps(_mm512_sub_ps(zero, max), _mm512_set1_ps(static_cast<float>(values[0])))
                              : _mm512_div_ps(max, _mm512_set1_ps(static_cast<float>(values[0])));
    _mm512_store_ps(a.id[0], _mm512_div_ps(one, d));
  }
  __m512 y = one;
  const bool exact_ids = iq4_nl_trial_ids(max, &a.id[1][0], &y, true);
  if (prev) iq4_nl_across_tables<true>(a, t, prev);
  else iq4_nl_across_tables<false>(a, t, nullptr);
  if (exact_ids) {
    iq4_nl_compact_trials(a, max, y, iq4_nl_mark_flips(a, max));
  } else {
    a.steps = a.steps_half[0] = a.steps_half[1] = 15;
  }
}

template <int G>
KV_AVX512_INLINE void iq4_nl_sums_n(Iq4nlAcross& a, int p0, int g, int h) {
  if constexpr (G > 1) {
    if (g < G) return iq4_nl_sums_n<G - 1>(a, p0, g, h);
  }
  iq4_nl_across_sums_half<G>(a, p0, h);
}

// The sums of passes 1..steps_half[h] of each half h of the lanes, at most 8 at a time (16 sums
// and 8 ids in registers), in two parts of similar size when there are more.
KV_AVX512_INLINE void iq4_nl_across_search(Iq4nlAcross& a) {
  for (int h = 0; h < 2; h++) {
    const int k = a.steps_half[h];
    if (k <= 8) {
      iq4_nl_sums_n<8>(a, 1, k, h);
    } else {
      const int g1 = (k + 1) / 2;
      iq4_nl_sums_n<8>(a, 1, g1, h);
      iq4_nl_sums_n<8>(a, 1 + g1, k - g1, h);
    }
  }
}

KV_AVX512 void iq4_nl_across_decide(Iq4nlAcross& a, const float* xc, std::byte* outc, size_t cnt, const Iq4nlTables& t) {
  __m512 d = _mm512_setzero_ps(), best = _mm512_setzero_ps();
  for (int p = 0; p <= a.steps; ++p) iq4_nl_decide_step(a, p, d, best);
  _mm512_store_ps(a.d, _mm512_maskz_mov_ps(a.search, d));  // d = 0 for the blocks that do not search
  iq4_nl_finish_across(a, xc, outc, cnt, t);
}

}  // namespace

namespace {

// The row loop over chunks of 16 blocks. load(b0, cnt) returns the cnt * 32 values of blocks
// b0.. as floats; they must stay valid until the chunk after next is loaded (the decision of a
// chunk runs after the next chunk's preparation and may read them again).
template <class Load>
KV_AVX512_INLINE void iq4_nl_rows(size_t nb, std::byte* out, const Iq4nlTables& t, Load load) {
  Iq4nlAcross a[2];
  Iq4nlCand cand;
  a[0].cand = a[1].cand = &cand;
  // the decision reads every step's sums and masks the lanes whose half did not run the step;
  // zeros keep that read defined in the first chunks
  for (Iq4nlAcross& c : a) {
    std::memset(c.sx, 0, sizeof c.sx);
    std::memset(c.s2, 0, sizeof c.s2);
  }
  const float* xs[2] = {nullptr, nullptr};
  size_t pending = SIZE_MAX;  // the chunk (first block) whose sums are done, decision not yet
  for (size_t b0 = 0, k = 0; b0 < nb; b0 += kIq4Chunk, k ^= 1) {
    const size_t cnt = nb - b0 < kIq4Chunk ? nb - b0 : kIq4Chunk;
    xs[k] = load(b0, cnt);
    if (cnt < kIq4AcrossMin) {  // the last chunk
      iq4_nl_chunk_by_block(xs[k], out + b0 * kIQ4_NLBytes, cnt, t);
      continue;
    }
    if (pending != SIZE_MAX) {  // prev's decision inside this chunk's tables, then prev's bytes
      iq4_nl_across_prepare(xs[k], cnt, a[k], t, &a[k ^ 1]);
      iq4_nl_finish_across(a[k ^ 1], xs[k ^ 1], out + pending * kIQ4_NLBytes, kIq4Chunk, t);
    } else {
      iq4_nl_across_prepare(xs[k], cnt, a[k], t, nullptr);
    }
    iq4_nl_across_search(a[k]);
    pending = b0;
    if (cnt < kIq4Chunk) {  // the last chunk
      iq4_nl_across_decide(a[k], xs[k], out + b0 * kIQ4_NLBytes, cnt, t);
      pending = SIZE_MAX;
    }
  }
  if (pending != SIZE_MAX) {
    const size_t k = (pending / kIq4Chunk) & 1;
    iq4_nl_across_decide(a[k], xs[k], out + pending * kIQ4_NLBytes, kIq4Chunk, t);
  }
}

}  // namespace

KV_AVX512 int iq4_nl_trial_schedule_avx512(const float* x, size_t cnt, uint8_t* trials) {
  Iq4nlAcross a;
  Iq4nlCand cand;
  a.cand = &cand;
  iq4_nl_across_prepare(x, cnt, a, iq4nl_tables(), nullptr);
  // the trial of each step: the one whose id it carries (a block's trial ids are distinct)
  alignas(64) float ids[15][16];
  iq4_nl_trial_ids(_mm512_load_ps(a.max), &ids[0][0]);
  for (int k = 0; k < a.steps; k++) {
    for (size_t b = 0; b < 16; b++) {
      const bool ran = k < a.steps_half[b / 8] && (a.search >> b & 1);  // 0: the lane's half stopped
      trials[16 * k + b] = ran ? 0xFF : 0;  // 0xFF: an id that is no trial's
      for (int p = 1; p <= 15 && ran; p++) {
        if (a.id[k + 1][b] == ids[p - 1][b]) trials[16 * k + b] = static_cast<uint8_t>(p);
      }
    }
  }
  return a.steps;
}

KV_AVX512 void iq4_nl_trial_ids_avx512(const float* max, float* id, size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) iq4_nl_trial_ids(_mm512_loadu_ps(max + i), id + 15 * i);
}

KV_AVX512 void iq4_nl_from_f32_avx512(const float* src, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  iq4_nl_rows(n / kQK, out, iq4nl_tables(), [src](size_t b0, size_t) { return src + b0 * kQK; });
}


// =============================================================================================
// Walsh-Hadamard rotation (ggml_compute_forward_fwht): x * (1/sqrt(n)), then for len = 1, 2, 4,
// ...: (u, v) -> (u + v, u - v) on the pairs (i + j, i + len + j).
//
// Stages inside a register (partner lane l ^ len) are one FMA each:
//   r[l] = a[l] * s[l] + a[l ^ len],  s[l] = +1 on the lower lane of a pair, -1 on the upper one.
// a[l] * (+-1) is exact, so the single rounding gives exactly fl(u + v) on the lower lane
// (u = a[l], v = a[l + len]) and fl(u - v) on the upper one (v = a[l], u = a[l - len]); signed
// zeros agree as well (+0 * -1 + +0 = +0 = +0 - +0, -0 * -1 + -0 = +0 = -0 - -0, ...). Stages
// across registers are u + v and u - v. Same pairs, same stage order, same roundings as the
// scalar loop, so the same bits.
// =============================================================================================


namespace {

// kSigns[k][l] = -1 when bit k of l is set (the upper lane of a pair at distance 2^k), else +1.
struct SignTable {
  alignas(64) float s[4][16];
};
constexpr SignTable make_signs() {
  SignTable t{};
  for (int k = 0; k < 4; k++) {
    for (int l = 0; l < 16; l++) t.s[k][l] = ((l >> k) & 1) ? -1.0f : 1.0f;
  }
  return t;
}
constexpr SignTable kSigns = make_signs();

KV_AVX2_INLINE __m256 fwht_in8(__m256 a, const __m256* s) {
  a = _mm256_fmadd_ps(a, s[0], _mm256_permute_ps(a, 0xB1));            // len 1
  a = _mm256_fmadd_ps(a, s[1], _mm256_permute_ps(a, 0x4E));            // len 2
  return _mm256_fmadd_ps(a, s[2], _mm256_permute2f128_ps(a, a, 0x01));  // len 4
}

KV_AVX512_INLINE __m512 fwht_in16(__m512 a, const __m512* s) {
  a = _mm512_fmadd_ps(a, s[0], _mm512_permute_ps(a, 0xB1));          // len 1
  a = _mm512_fmadd_ps(a, s[1], _mm512_permute_ps(a, 0x4E));          // len 2
  a = _mm512_fmadd_ps(a, s[2], _mm512_shuffle_f32x4(a, a, 0xB1));    // len 4
  return _mm512_fmadd_ps(a, s[3], _mm512_shuffle_f32x4(a, a, 0x4E));  // len 8
}

// The stages across registers: register distance LEN, 2 LEN, ... < NV.
template <int NV, int LEN>
KV_AVX2_INLINE void fwht_across8(__m256* v) {
  if constexpr (LEN < NV) {
#pragma GCC unroll 32
    for (int i = 0; i < NV; i++) {
      if ((i & LEN) == 0) {
        const __m256 u = v[i], w = v[i + LEN];
        v[i] = _mm256_add_ps(u, w);
        v[i + LEN] = _mm256_sub_ps(u, w);
      }
    }
    fwht_across8<NV, 2 * LEN>(v);
  }
}

template <int NV, int LEN>
KV_AVX512_INLINE void fwht_across16(__m512* v) {
  if constexpr (LEN < NV) {
    const __m512 one = _mm512_set1_ps(1.0f);
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) {
      if ((i & LEN) == 0) {
        const __m512 u = v[i], w = v[i + LEN];
        v[i] = _mm512_add_ps(u, w);
        // u - w as -(w * 1) + u: the product is exact, so the one rounding is that of u - w. On
        // the multiply-add pipes, beside the additions on the add pipes.
        v[i + LEN] = _mm512_fnmadd_ps(w, one, u);
      }
    }
    fwht_across16<NV, 2 * LEN>(v);
  }
}

// One block of NV registers (n_rot = 8 NV / 16 NV values), already scaled.
template <int NV>
KV_AVX2_INLINE void fwht_regs8(__m256* v, const __m256* s) {
#pragma GCC unroll 32
  for (int i = 0; i < NV; i++) v[i] = fwht_in8(v[i], s);
  fwht_across8<NV, 1>(v);
}

template <int NV>
KV_AVX512_INLINE void fwht_regs16(__m512* v, const __m512* s) {
#pragma GCC unroll 16
  for (int i = 0; i < NV; i++) v[i] = fwht_in16(v[i], s);
  fwht_across16<NV, 1>(v);
}

// A block holding a NaN is left to the scalar loop (false): when two NaNs meet, which one
// survives depends on the operand order of the instruction the compiler picked, so only the
// same code gives the same NaN. Without NaN inputs every NaN made on the way (inf - inf) is the
// default NaN, whatever the order.
template <int NV>
KV_AVX2_INLINE bool fwht_block_avx2(float* r, __m256 scale, const __m256* s) {
  __m256 v[NV];
  __m256 nan = _mm256_setzero_ps();
#pragma GCC unroll 32
  for (int i = 0; i < NV; i++) {
    const __m256 x = _mm256_loadu_ps(r + 8 * i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    v[i] = _mm256_mul_ps(x, scale);
  }
  if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) return false;
  fwht_regs8<NV>(v, s);
#pragma GCC unroll 32
  for (int i = 0; i < NV; i++) _mm256_storeu_ps(r + 8 * i, v[i]);
  return true;
}

template <int NV>
KV_AVX512_INLINE bool fwht_block_avx512(float* r, __m512 scale, const __m512* s) {
  __m512 v[NV];
  __mmask16 nan = 0;
#pragma GCC unroll 16
  for (int i = 0; i < NV; i++) {
    const __m512 x = _mm512_loadu_ps(r + 16 * i);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    v[i] = _mm512_mul_ps(x, scale);
  }
  if (__builtin_expect(nan != 0, 0)) return false;
  fwht_regs16<NV>(v, s);
#pragma GCC unroll 16
  for (int i = 0; i < NV; i++) _mm512_storeu_ps(r + 16 * i, v[i]);
  return true;
}

// Any n_rot >= 8 / 16: the in-register stages per vector, then the wider stages through memory.
KV_AVX2 bool fwht_generic_avx2(float* r, uint32_t n_rot, __m256 scale, const __m256* s) {
  __m256 nan = _mm256_setzero_ps();
  for (uint32_t i = 0; i < n_rot; i += 8) {
    const __m256 x = _mm256_loadu_ps(r + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(nan) != 0) return false;
  for (uint32_t i = 0; i < n_rot; i += 8) {
    _mm256_storeu_ps(r + i, fwht_in8(_mm256_mul_ps(_mm256_loadu_ps(r + i), scale), s));
  }
  for (uint32_t len = 8; len < n_rot; len <<= 1) {
    for (uint32_t i = 0; i < n_rot; i += 2 * len) {
      for (uint32_t j = 0; j < len; j += 8) {
        const __m256 u = _mm256_loadu_ps(r + i + j), w = _mm256_loadu_ps(r + i + len + j);
        _mm256_storeu_ps(r + i + j, _mm256_add_ps(u, w));
        _mm256_storeu_ps(r + i + len + j, _mm256_sub_ps(u, w));
      }
    }
  }
  return true;
}

KV_AVX512 bool fwht_generic_avx512(float* r, uint32_t n_rot, __m512 scale, const __m512* s) {
  __mmask16 nan = 0;
  for (uint32_t i = 0; i < n_rot; i += 16) {
    const __m512 x = _mm512_loadu_ps(r + i);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  }
  if (nan != 0) return false;
  for (uint32_t i = 0; i < n_rot; i += 16) {
    _mm512_storeu_ps(r + i, fwht_in16(_mm512_mul_ps(_mm512_loadu_ps(r + i), scale), s));
  }
  for (uint32_t len = 16; len < n_rot; len <<= 1) {
    for (uint32_t i = 0; i < n_rot; i += 2 * len) {
      for (uint32_t j = 0; j < len; j += 16) {
        const __m512 u = _mm512_loadu_ps(r + i + j), w = _mm512_loadu_ps(r + i + len + j);
        _mm512_storeu_ps(r + i + j, _mm512_add_ps(u, w));
        _mm512_storeu_ps(r + i + len + j, _mm512_sub_ps(u, w));
      }
    }
  }
  return true;
}

KV_AVX2_INLINE void load_signs8(__m256* s) {
  for (int k = 0; k < 3; k++) s[k] = _mm256_load_ps(kSigns.s[k]);
}
KV_AVX512_INLINE void load_signs16(__m512* s) {
  for (int k = 0; k < 4; k++) s[k] = _mm512_load_ps(kSigns.s[k]);
}

// 1.0f / sqrtf(n_rot), as the scalar code computes it
inline float fwht_scale(uint32_t n_rot) { return 1.0f / std::sqrt(static_cast<float>(n_rot)); }

}  // namespace

KV_AVX2 void hadamard_avx2(float* x, size_t n, uint32_t n_rot) {
  assert(n_rot >= 8 && (n_rot & (n_rot - 1)) == 0 && n % n_rot == 0);
  const __m256 scale = _mm256_set1_ps(fwht_scale(n_rot));
  __m256 s[3];
  load_signs8(s);
  for (size_t b = 0; b < n; b += n_rot) {
    float* r = x + b;
    bool done;
    switch (n_rot) {
      case 8: done = fwht_block_avx2<1>(r, scale, s); break;
      case 16: done = fwht_block_avx2<2>(r, scale, s); break;
      case 32: done = fwht_block_avx2<4>(r, scale, s); break;
      case 64: done = fwht_block_avx2<8>(r, scale, s); break;
      case 128: done = fwht_block_avx2<16>(r, scale, s); break;
      default: done = fwht_generic_avx2(r, n_rot, scale, s); break;
    }
    if (!done) hadamard_ref::rotate(r, n_rot, n_rot);
  }
}

KV_AVX512 void hadamard_avx512(float* x, size_t n, uint32_t n_rot) {
  assert(n_rot >= 16 && (n_rot & (n_rot - 1)) == 0 && n % n_rot == 0);
  const __m512 scale = _mm512_set1_ps(fwht_scale(n_rot));
  __m512 s[4];
  load_signs16(s);
  for (size_t b = 0; b < n; b += n_rot) {
    float* r = x + b;
    bool done;
    switch (n_rot) {
      case 16: done = fwht_block_avx512<1>(r, scale, s); break;
      case 32: done = fwht_block_avx512<2>(r, scale, s); break;
      case 64: done = fwht_block_avx512<4>(r, scale, s); break;
      case 128: done = fwht_block_avx512<8>(r, scale, s); break;
      case 256: done = fwht_block_avx512<16>(r, scale, s); break;
      default: done = fwht_generic_avx512(r, n_rot, scale, s); break;
    }
    if (!done) hadamard_ref::rotate(r, n_rot, n_rot);
  }
}

// =============================================================================================
// Fused rows: to_f32, rotation, from_f32 per rotation block, in registers. Each step is the
// kernel above (same operations), so the bytes equal the three separate steps'. Quantization
// works on four 32-value blocks at once: their abs-max reductions share shuffles, and the
// scale divisions are one vector division (IEEE division is correctly rounded in every lane,
// like the scalar one). Rotation blocks holding inf/NaN take the scalar reference path.
// =============================================================================================

namespace {

// The abs-max (IMM 0x0B: max |a|, |b|, sign cleared) or signed abs-max (IMM 0x07: the operand of
// larger magnitude, its sign kept) of four 32-value blocks given as m0..m3 (each already the
// lane-wise combination of a block's two registers); block k's result fills 128-bit lane k.
// VRANGEPS returns one of its operands, so with IMM 0x07 the result is a value of the block.
template <int IMM>
KV_AVX512_INLINE __m512 reduce4(__m512 m0, __m512 m1, __m512 m2, __m512 m3) {
  const __m512 t01 = _mm512_range_ps(_mm512_shuffle_f32x4(m0, m1, 0x44), _mm512_shuffle_f32x4(m0, m1, 0xEE), IMM);
  const __m512 t23 = _mm512_range_ps(_mm512_shuffle_f32x4(m2, m3, 0x44), _mm512_shuffle_f32x4(m2, m3, 0xEE), IMM);
  __m512 u = _mm512_range_ps(_mm512_shuffle_f32x4(t01, t23, 0x88), _mm512_shuffle_f32x4(t01, t23, 0xDD), IMM);
  u = _mm512_range_ps(u, _mm512_permute_ps(u, 0x4E), IMM);
  return _mm512_range_ps(u, _mm512_permute_ps(u, 0xB1), IMM);
}


// NV registers of f16 values -> floats, scaled, rotated. The caller detects non-finite inputs
// afterwards: a single inf or NaN input makes every output of the rotation block inf or NaN
// (each output is a +- sum of all inputs), so the block's maxima are not finite.
template <int NV>
KV_AVX512_INLINE void load_rotate_f16(const std::byte* in, __m512* v, __m512 scale, const __m512* s) {
#pragma GCC unroll 16
  for (int i = 0; i < NV; i++) {
    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32 * i)));
    v[i] = _mm512_mul_ps(x, scale);
  }
  fwht_regs16<NV>(v, s);
}

// f16 -> floats rotated in blocks of n_rot (0: not rotated) into dst. For n_rot 64 and 128 each
// rotation block goes from the f16 loads through the rotation in registers (load_rotate_f16,
// the same operations as f16_to_f32_avx512 then hadamard_avx512); a block holding a NaN takes
// those two steps as they are (the NaN that survives depends on the operand order).
template <int NV>
KV_AVX512_INLINE void f16_rotate_blocks(const std::byte* src, float* dst, size_t n) {
  const __m512 scale = _mm512_set1_ps(fwht_scale(16 * NV));
  __m512 s[4];
  load_signs16(s);
  for (size_t b = 0; b < n; b += 16 * NV) {
    __mmask16 nan = 0;
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++) {
      const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * (b + 16 * i))));
      nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
    if (__builtin_expect(nan != 0, 0)) {
      f16_to_f32_avx512(src + 2 * b, dst + b, 16 * NV);
      hadamard_avx512(dst + b, 16 * NV, 16 * NV);
      continue;
    }
    __m512 v[NV];
    load_rotate_f16<NV>(src + 2 * b, v, scale, s);
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++) _mm512_store_ps(dst + b + 16 * i, v[i]);
  }
}

KV_AVX512 void f16_rotate_to_f32(const std::byte* src, float* dst, size_t n, uint32_t n_rot) {
  if (n_rot == 128) {
    f16_rotate_blocks<8>(src, dst, n);
  } else if (n_rot == 64) {
    f16_rotate_blocks<4>(src, dst, n);
  } else {
    f16_to_f32_avx512(src, dst, n);
    if (n_rot) hadamard_avx512(dst, n, n_rot);
  }
}

// f16 -> (rotation) -> iq4_nl in one pass: each chunk of 16 blocks is converted and rotated into
// an L1 buffer by the same kernels as the three-step path (f16_to_f32_avx512, hadamard_avx512;
// n_rot 0 = no rotation), then quantized; the next chunk's f16 input is prefetched meanwhile.
// n is a multiple of 32 and of n_rot, so every chunk is whole rotation blocks (n_rot <= 512).
KV_AVX512 void f16_rot_iq4_nl(const std::byte* in, std::byte* out, size_t n, uint32_t n_rot) {
  assert(n % kQK == 0 && (n_rot == 0 || (n % n_rot == 0 && (kIq4Chunk * kQK) % n_rot == 0)));
  alignas(64) float buf[2][kIq4Chunk * kQK];
  iq4_nl_rows(n / kQK, out, iq4nl_tables(), [&](size_t b0, size_t cnt) {
    float* x = buf[(b0 / kIq4Chunk) & 1];
    const std::byte* src = in + b0 * kQK * 2;
    const size_t next = (b0 + kIq4Chunk) * kQK * 2, end = n * 2;
    for (size_t off = 0; off < kIq4Chunk * kQK * 2 && next + off < end; off += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(in + next + off), _MM_HINT_T0);
    }
    f16_rotate_to_f32(src, x, cnt * kQK, n_rot);
    return static_cast<const float*>(x);
  });
}

void f16_iq4_nl_fn(const std::byte* in, std::byte* out, size_t n, uint32_t) { f16_rot_iq4_nl(in, out, n, 0); }

enum class Quant { kQ8_0, kQ4_0 };

// The per-block reduction of up to four blocks given as eight registers (block k = v[2k],
// v[2k + 1]), stored as red[0..3] (IMM as in reduce4; blocks past nb repeat the last one).
// Returns whether any of the reductions is inf or NaN.
template <int IMM>
KV_AVX512_INLINE bool reduce_store4(const __m512* v, int nb, float* red) {
  __m512 m[4];
  for (int k = 0; k < 4; k++) {
    const int b = k < nb ? k : nb - 1;
    m[k] = _mm512_range_ps(v[2 * b], v[2 * b + 1], IMM);
  }
  const __m512 u = reduce4<IMM>(m[0], m[1], m[2], m[3]);
  _mm_storeu_ps(red, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                                      0, 0, 0, 0),
                                                                     u)));
  return _mm512_fpclass_ps_mask(u, 0x99) != 0;
}

// Quantizes nb <= 16 blocks of 32 finite floats in buf into out, given each block's reduction
// red[b] (q8_0: amax; q4_0: a value of largest |x|, with its sign). Blocks whose bit is set in
// `skip` were written already. The scales of all blocks come from two vector divisions.
template <Quant Q>
KV_AVX512_INLINE void quant_chunk(const float* buf, const float* red, int nb, uint32_t skip, std::byte* out) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512 r = _mm512_loadu_ps(red);
  __m512 d, max;
  if constexpr (Q == Quant::kQ8_0) {
    d = _mm512_div_ps(r, _mm512_set1_ps(static_cast<float>((1 << 7) - 1)));  // amax / ((1 << 7) - 1)
  } else {
    max = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, zero, _CMP_NEQ_UQ), r);  // an all-zero block keeps +0.0f
    d = _mm512_div_ps(max, _mm512_set1_ps(-8.0f));                            // max / -8
  }
  alignas(64) float id[16];
  _mm512_store_ps(id, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), d));
  alignas(32) uint16_t dh[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(dh), _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
  alignas(64) float neg[16];
  if constexpr (Q == Quant::kQ4_0) _mm512_store_ps(neg, _mm512_sub_ps(zero, max));  // exact
  for (int b = 0; b < nb; b++) {
    if ((skip >> b) & 1) continue;
    const float* x = buf + b * kQK;
    const __m512 a = _mm512_loadu_ps(x), c = _mm512_loadu_ps(x + 16);
    const __m512 idb = _mm512_set1_ps(id[b]);
    if constexpr (Q == Quant::kQ8_0) {
      std::byte* blk = out + b * kQ8_0Bytes;
      store_u16(blk, dh[b]);
      const __m128i q0 = _mm512_cvtepi32_epi8(roundf_to_i32_16(_mm512_mul_ps(a, idb)));
      const __m128i q1 = _mm512_cvtepi32_epi8(roundf_to_i32_16(_mm512_mul_ps(c, idb)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + 2), _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1));
    } else {
      std::byte* blk = out + b * kQ4_0Bytes;
      if (neg[b] != 0.0f) {
        // The reference keeps the FIRST value of largest |x|. VRANGEPS picked one of them; only
        // when the opposite value occurs too can the choice differ: then do what it does.
        const __m512 nb_ = _mm512_set1_ps(neg[b]);
        if (__builtin_expect((_mm512_cmp_ps_mask(a, nb_, _CMP_EQ_OQ) | _mm512_cmp_ps_mask(c, nb_, _CMP_EQ_OQ)) != 0, 0)) {
          quants::ref::q4_0_from_f32(x, blk, kQK);
          continue;
        }
      }
      store_u16(blk, dh[b]);
      const __m512 bias = _mm512_set1_ps(8.5f);
      const __m128i c0 = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(a, idb), bias)));
      const __m128i c1 = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(c, idb), bias)));
      const __m128i fifteen = _mm_set1_epi8(15);
      const __m128i lo = _mm_min_epi8(c0, fifteen), hi = _mm_min_epi8(c1, fifteen);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 2),
                       _mm_or_si128(lo, _mm_and_si128(_mm_slli_epi16(hi, 4), _mm_set1_epi8(static_cast<char>(0xf0)))));
    }
  }
}

constexpr size_t kQuantChunk = 16 * kQK;  // values per pass: 16 blocks

// f16 rows -> floats, rotated in blocks of R = 16 NV, -> q8_0 / q4_0. Per pass of 16 quant
// blocks: convert, rotate and reduce each rotation block into an L1 buffer, then quantize the 16
// blocks (their scale divisions are two vector divisions instead of 32 dependent scalar ones).
template <int NV, Quant Q>
KV_AVX512 void f16_rot_quant(const std::byte* in, std::byte* out, size_t n) {
  constexpr size_t R = 16 * NV;
  static_assert(kQuantChunk % R == 0 || R % kQuantChunk == 0, "rotation blocks tile the passes");
  constexpr size_t BB = Q == Quant::kQ8_0 ? kQ8_0Bytes : kQ4_0Bytes;
  constexpr int IMM = Q == Quant::kQ8_0 ? 0x0B : 0x07;
  assert(n % R == 0);
  const __m512 scale = _mm512_set1_ps(fwht_scale(R));
  __m512 s[4];
  load_signs16(s);
  alignas(64) float buf[kQuantChunk > R ? kQuantChunk : R];
  alignas(64) float red[16 + 4] = {};
  const size_t step = kQuantChunk > R ? kQuantChunk : R;
  for (size_t c0 = 0; c0 < n; c0 += step) {
    const size_t cnt = n - c0 < step ? n - c0 : step;
    uint32_t skip = 0;
    for (size_t r = 0; r < cnt; r += R) {
      __m512 v[NV];
      load_rotate_f16<NV>(in + 2 * (c0 + r), v, scale, s);
      bool bad = false;
#pragma GCC unroll 4
      for (int g = 0; g < NV; g += 8) {
        bad |= reduce_store4<IMM>(v + g, NV - g >= 8 ? 4 : (NV - g) / 2, red + (r + 16 * g) / kQK);
      }
      // The maxima are finite unless an input was inf/NaN (then every rotated value is): the
      // whole rotation block goes the scalar reference's way.
      if (__builtin_expect(bad, 0)) {
        alignas(64) float tmp[R];
        quants::ref::f16_to_f32(in + 2 * (c0 + r), tmp, R);
        hadamard_ref::rotate(tmp, R, R);
        if constexpr (Q == Quant::kQ8_0) quants::ref::q8_0_from_f32(tmp, out + (c0 + r) / kQK * BB, R);
        else quants::ref::q4_0_from_f32(tmp, out + (c0 + r) / kQK * BB, R);
        for (size_t b = r / kQK; b < (r + R) / kQK; b++) {
          skip |= 1u << (b % 16);
          red[b % 16] = 1.0f;
        }
        continue;
      }
#pragma GCC unroll 16
      for (int i = 0; i < NV; i++) _mm512_store_ps(buf + r + 16 * i, v[i]);
    }
    quant_chunk<Q>(buf, red, static_cast<int>(cnt / kQK), skip, out + c0 / kQK * BB);
  }
}

// roundf(x) -> int32 as roundf_to_i32_16, with copysign(0.5, x) in one ternary-logic op:
// (x & sign) | 0.5f (imm 0xEA = (A & B) | C).
KV_AVX512_INLINE __m512i roundf_to_i32_16t(__m512 x) {
  const __m512i half = _mm512_ternarylogic_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN),
                                                 _mm512_set1_epi32(0x3f000000), 0xEA);
  return _mm512_cvttps_epi32(_mm512_add_round_ps(x, _mm512_castsi512_ps(half), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
}

// The scales of 4 q8_0 blocks from their abs-maxima (reduce4's result: block k in 128-bit lane
// k): d = amax / 127 and id = d != 0 ? 1 / d : 0 in one 4-lane division each, as the reference.
struct Q8Scales {
  __m128 d, id;
};
KV_AVX512_INLINE Q8Scales q8_0_scales4(__m512 amax) {
  const __m128 a = _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), amax));
  const __m128 d = _mm_div_ps(a, _mm_set1_ps(static_cast<float>((1 << 7) - 1)));
  return {d, _mm_maskz_div_ps(_mm_cmp_ps_mask(d, _mm_setzero_ps(), _CMP_NEQ_UQ), _mm_set1_ps(1.0f), d)};
}

// q8_0 of NQ = 2 or 4 blocks of 32 finite floats held in registers (block k = v[2k], v[2k + 1]),
// every id finite. Then |x * id| <= amax * id < 127.5, so roundf gives -127..127 and the
// saturating packs keep the same bytes as the reference's (int8_t) cast: two blocks' 64 bytes
// come from 2 dword->word packs, 1 word->byte pack and 1 dword permute. (An infinite id, from
// an amax below ~3.7e-37, would make the cast's 0x00 a saturated 0x80: such units go to the
// scalar reference, see f16_rot_q8_0_front.)
KV_AVX512_INLINE __m512i q8_0_round(__m512 x, float id) { return roundf_to_i32_16t(_mm512_mul_ps(x, _mm512_set1_ps(id))); }

template <int NQ>
KV_AVX512_INLINE void q8_0_regs4(const __m512* v, Q8Scales sc, std::byte* out) {
  static_assert(NQ == 2 || NQ == 4, "blocks are packed in pairs");
  alignas(16) float id[4];
  _mm_store_ps(id, sc.id);
  alignas(16) uint16_t dh[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(dh), _mm_cvtps_ph(sc.d, _MM_FROUND_TO_NEAREST_INT));
  // Read back through memory: a broadcast from memory and a 16-bit scalar move are load-store
  // work, where extracting lanes of a register (what the compiler would do) takes the shuffle
  // units this kernel is bound by.
  __asm__("" : "+m"(id), "+m"(dh));
  // After the packs, 128-bit lane j holds dwords [r0_j, r1_j, r2_j, r3_j] (r_j: the bytes of
  // values 4j..4j+3 of register r); this puts them back in value order.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
#pragma GCC unroll 2
  for (int k = 0; k < NQ; k += 2) {
    std::byte* blk = out + k * kQ8_0Bytes;
    const __m512i w0 = _mm512_packs_epi32(q8_0_round(v[2 * k], id[k]), q8_0_round(v[2 * k + 1], id[k]));
    const __m512i w1 = _mm512_packs_epi32(q8_0_round(v[2 * k + 2], id[k + 1]), q8_0_round(v[2 * k + 3], id[k + 1]));
    const __m512i b = _mm512_permutexvar_epi32(order, _mm512_packs_epi16(w0, w1));
    store_u16(blk, dh[k]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + 2), _mm512_castsi512_si256(b));
    store_u16(blk + kQ8_0Bytes, dh[k + 1]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + kQ8_0Bytes + 2), _mm512_extracti64x4_epi64(b, 1));
  }
}

// The first half of a unit of NR <= 8 registers (whole rotation blocks of NV registers, NR / 2
// quant blocks): load, rotate, abs-maxima, scales. `bad`: a maximum is inf/NaN, i.e. an input
// was (every rotated value of its block then is): the unit goes to the scalar reference.
template <int NV, int NR>
KV_AVX512_INLINE void f16_rot_q8_0_load(const std::byte* in, __m512* v, __m512 scale, const __m512* s) {
#pragma GCC unroll 4
  for (int r = 0; r < NR; r += NV) load_rotate_f16<NV>(in + 32 * r, v + r, scale, s);
}

template <int NR>
KV_AVX512_INLINE Q8Scales f16_rot_q8_0_scales(const __m512* v, bool* bad) {
  __m512 m[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++) {
    const int b = k < NR / 2 ? k : NR / 2 - 1;  // past the end: repeat the last block
    m[k] = _mm512_range_ps(v[2 * b], v[2 * b + 1], 0x0B);
  }
  const __m512 amax = reduce4<0x0B>(m[0], m[1], m[2], m[3]);
  const Q8Scales sc = q8_0_scales4(amax);
  // 0x99: a NaN or infinite maximum; 0x18: an infinite id (see q8_0_regs4).
  *bad = (_mm512_fpclass_ps_mask(amax, 0x99) | _mm_fpclass_ps_mask(sc.id, 0x18)) != 0;
  return sc;
}

template <int NV, int NR>
KV_AVX512_INLINE Q8Scales f16_rot_q8_0_front(const std::byte* in, __m512* v, __m512 scale, const __m512* s, bool* bad) {
  f16_rot_q8_0_load<NV, NR>(in, v, scale, s);
  return f16_rot_q8_0_scales<NR>(v, bad);
}

template <int NV, int NR>
KV_AVX512_INLINE void f16_rot_q8_0_back(const std::byte* in, const __m512* v, Q8Scales sc, bool bad, std::byte* out) {
  if (__builtin_expect(bad, 0)) {
    alignas(64) float tmp[16 * NR];
    quants::ref::f16_to_f32(in, tmp, 16 * NR);
    hadamard_ref::rotate(tmp, 16 * NR, 16 * NV);
    quants::ref::q8_0_from_f32(tmp, out, 16 * NR);
    return;
  }
  q8_0_regs4<NR / 2>(v, sc, out);
}

// f16 rows -> floats, rotated in blocks of 16 NV values (NV 4 or 8), -> q8_0, every value
// staying in registers: units of 8 registers (4 quant blocks), software-pipelined so that the
// scale divisions of unit u (two dependent divisions after a 7-level reduction) complete while
// unit u + 1 is loaded and rotated, before unit u is quantized.
template <int NV>
KV_AVX512 void f16_rot_q8_0_regs(const std::byte* in, std::byte* out, size_t n) {
  static_assert(NV == 4 || NV == 8, "units of 8 registers");
  assert(n % (16 * NV) == 0);
  constexpr size_t U = 128;  // values per unit
  constexpr size_t UB = U / kQK * kQ8_0Bytes;
  const __m512 scale = _mm512_set1_ps(fwht_scale(16 * NV));
  __m512 s[4];
  load_signs16(s);
  const size_t nu = n / U;
  if (nu == 1) {
    __m512 a[8];
    bool bad_a;
    const Q8Scales sc_a = f16_rot_q8_0_front<NV, 8>(in, a, scale, s, &bad_a);
    f16_rot_q8_0_back<NV, 8>(in, a, sc_a, bad_a, out);
  } else if (nu >= 2) {
    // a: unit u, scales known; b: unit u + 1, rotated; c: unit u + 2.
    __m512 a[8], b[8];
    bool bad_a, bad_b;
    Q8Scales sc_a = f16_rot_q8_0_front<NV, 8>(in, a, scale, s, &bad_a);
    f16_rot_q8_0_load<NV, 8>(in + 2 * U, b, scale, s);
    for (size_t u = 0; u + 2 < nu; u++) {
      __m512 c[8];
      f16_rot_q8_0_load<NV, 8>(in + 2 * U * (u + 2), c, scale, s);
      const Q8Scales sc_b = f16_rot_q8_0_scales<8>(b, &bad_b);
      f16_rot_q8_0_back<NV, 8>(in + 2 * U * u, a, sc_a, bad_a, out + UB * u);
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {  // register renames
        a[r] = b[r];
        b[r] = c[r];
      }
      sc_a = sc_b;
      bad_a = bad_b;
    }
    const Q8Scales sc_b = f16_rot_q8_0_scales<8>(b, &bad_b);
    f16_rot_q8_0_back<NV, 8>(in + 2 * U * (nu - 2), a, sc_a, bad_a, out + UB * (nu - 2));
    f16_rot_q8_0_back<NV, 8>(in + 2 * U * (nu - 1), b, sc_b, bad_b, out + UB * (nu - 1));
  }
  if constexpr (NV == 4) {
    if (n % U != 0) {  // one 64-value rotation block left
      __m512 v[4];
      bool bad;
      const Q8Scales sc = f16_rot_q8_0_front<4, 4>(in + 2 * U * nu, v, scale, s, &bad);
      f16_rot_q8_0_back<4, 4>(in + 2 * U * nu, v, sc, bad, out + UB * nu);
    }
  }
}

// q8_0 rows -> floats, rotated, -> f16. Finite scales give finite values, so no NaN reaches
// the f16 conversion (whose only difference from ggml's is NaN).
template <int NV>
KV_AVX512 void q8_0_rot_f16(const std::byte* in, std::byte* out, size_t n) {
  constexpr size_t R = 16 * NV;
  assert(n % R == 0);
  const __m512 scale = _mm512_set1_ps(fwht_scale(R));
  __m512 s[4];
  load_signs16(s);
  for (size_t b = 0; b < n; b += R) {
    const std::byte* blk0 = in + b / kQK * kQ8_0Bytes;
    __m512 v[NV];
    uint32_t bad = 0;
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) {
      const std::byte* blk = blk0 + (i / 2) * kQ8_0Bytes;
      const uint16_t h = load_u16(blk);
      bad |= (h & 0x7c00u) == 0x7c00u;
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 16 * (i & 1)));
      v[i] = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d), scale);
    }
    if (__builtin_expect(bad != 0, 0)) {
      alignas(64) float tmp[R];
      quants::ref::q8_0_to_f32(blk0, tmp, R);
      hadamard_ref::rotate(tmp, R, R);
      quants::ref::f16_from_f32(tmp, out + 2 * b, R);
      continue;
    }
    fwht_regs16<NV>(v, s);
#pragma GCC unroll 16
    for (int i = 0; i < NV; i++) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * (b + 16 * i)), _mm512_cvtps_ph(v[i], _MM_FROUND_TO_NEAREST_INT));
    }
  }
}

// q4_0 -> q8_0, no rotation: dequantize 16 blocks into an L1 buffer (finite scales give finite
// values), reduce, quantize.
KV_AVX512 void q4_0_to_q8_0(const std::byte* in, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  const size_t nb = n / kQK;
  const __m128i m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  alignas(64) float buf[kQuantChunk];
  alignas(64) float red[16 + 4] = {};
  for (size_t b0 = 0; b0 < nb; b0 += 16) {
    const int cnt = nb - b0 >= 16 ? 16 : static_cast<int>(nb - b0);
    uint32_t skip = 0;
    for (int g = 0; g < cnt; g += 4) {
      const int ng = cnt - g >= 4 ? 4 : cnt - g;
      __m512 v[8];
      for (int k = 0; k < ng; k++) {
        const std::byte* blk = in + (b0 + g + k) * kQ4_0Bytes;
        const uint16_t h = load_u16(blk);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
        const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(qs, m4), eight);
        const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), m4), eight);
        v[2 * k] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d);
        v[2 * k + 1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d);
        if (__builtin_expect((h & 0x7c00u) == 0x7c00u, 0)) {  // inf/NaN scale: the scalar reference
          alignas(64) float tmp[kQK];
          quants::ref::q4_0_to_f32(blk, tmp, kQK);
          quants::ref::q8_0_from_f32(tmp, out + (b0 + g + k) * kQ8_0Bytes, kQK);
          skip |= 1u << (g + k);
          v[2 * k] = v[2 * k + 1] = _mm512_setzero_ps();
        }
        _mm512_store_ps(buf + (g + k) * kQK, v[2 * k]);
        _mm512_store_ps(buf + (g + k) * kQK + 16, v[2 * k + 1]);
      }
      reduce_store4<0x0B>(v, ng, red + g);
    }
    quant_chunk<Quant::kQ8_0>(buf, red, cnt, skip, out + b0 * kQ8_0Bytes);
  }
}

// f32 rows -> q8_0 / q4_0 (quantize_row_q8_0_ref / _q4_0_ref), 16 blocks per pass. A block
// holding a NaN takes the scalar reference (its abs-max keeps or drops NaNs by position).
template <Quant Q>
KV_AVX512 void quant_from_f32(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  constexpr size_t BB = Q == Quant::kQ8_0 ? kQ8_0Bytes : kQ4_0Bytes;
  constexpr int IMM = Q == Quant::kQ8_0 ? 0x0B : 0x07;
  const size_t nb = n / kQK;
  alignas(64) float red[16 + 4] = {};
  for (size_t b0 = 0; b0 < nb; b0 += 16) {
    const int cnt = nb - b0 >= 16 ? 16 : static_cast<int>(nb - b0);
    const float* xc = x + b0 * kQK;
    uint32_t skip = 0;
    for (int g = 0; g < cnt; g += 4) {
      const int ng = cnt - g >= 4 ? 4 : cnt - g;
      __m512 v[8];
      for (int k = 0; k < ng; k++) {
        const float* xb = xc + (g + k) * kQK;
        v[2 * k] = _mm512_loadu_ps(xb);
        v[2 * k + 1] = _mm512_loadu_ps(xb + 16);
        if (__builtin_expect((_mm512_cmp_ps_mask(v[2 * k], v[2 * k], _CMP_UNORD_Q) |
                              _mm512_cmp_ps_mask(v[2 * k + 1], v[2 * k + 1], _CMP_UNORD_Q)) != 0,
                             0)) {
          if constexpr (Q == Quant::kQ8_0) quants::ref::q8_0_from_f32(xb, out + (b0 + g + k) * BB, kQK);
          else quants::ref::q4_0_from_f32(xb, out + (b0 + g + k) * BB, kQK);
          skip |= 1u << (g + k);
          v[2 * k] = v[2 * k + 1] = _mm512_setzero_ps();
        }
      }
      reduce_store4<IMM>(v, ng, red + g);
    }
    quant_chunk<Q>(xc, red, cnt, skip, out + b0 * BB);
  }
}

template <int NV>
void f16_rot_q8_0(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  if constexpr (NV <= 8) f16_rot_q8_0_regs<NV>(in, out, n);
  else f16_rot_quant<NV, Quant::kQ8_0>(in, out, n);
}
template <int NV>
void f16_rot_q4_0(const std::byte* in, std::byte* out, size_t n, uint32_t) { f16_rot_quant<NV, Quant::kQ4_0>(in, out, n); }
template <int NV>
void q8_0_rot_f16_fn(const std::byte* in, std::byte* out, size_t n, uint32_t) { q8_0_rot_f16<NV>(in, out, n); }
void q4_0_to_q8_0_fn(const std::byte* in, std::byte* out, size_t n, uint32_t) { q4_0_to_q8_0(in, out, n); }

}  // namespace

KV_AVX512 void q8_0_from_f32_avx512(const float* x, std::byte* out, size_t n) { quant_from_f32<Quant::kQ8_0>(x, out, n); }
KV_AVX512 void q4_0_from_f32_avx512(const float* x, std::byte* out, size_t n) { quant_from_f32<Quant::kQ4_0>(x, out, n); }

FusedRowFn find_fused_avx512(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot) {
  if (!rotate) {
    if (src == GgmlType::kQ4_0 && dst == GgmlType::kQ8_0) return q4_0_to_q8_0_fn;
    if (src == GgmlType::kF16 && dst == GgmlType::kIQ4_NL) return f16_iq4_nl_fn;
    return nullptr;
  }
  const int nv = n_rot == 64 ? 4 : n_rot == 128 ? 8 : n_rot == 256 ? 16 : 0;
  if (nv == 0) return nullptr;
  if (src == GgmlType::kF16 && dst == GgmlType::kQ8_0) {
    return nv == 4 ? f16_rot_q8_0<4> : nv == 8 ? f16_rot_q8_0<8> : f16_rot_q8_0<16>;
  }
  if (src == GgmlType::kF16 && dst == GgmlType::kQ4_0) {
    return nv == 4 ? f16_rot_q4_0<4> : nv == 8 ? f16_rot_q4_0<8> : f16_rot_q4_0<16>;
  }
  if (src == GgmlType::kQ8_0 && dst == GgmlType::kF16) {
    return nv == 4 ? q8_0_rot_f16_fn<4> : nv == 8 ? q8_0_rot_f16_fn<8> : q8_0_rot_f16_fn<16>;
  }
  if (src == GgmlType::kF16 && dst == GgmlType::kIQ4_NL) return f16_rot_iq4_nl;  // n_rot 64, 128, 256
  return nullptr;
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
