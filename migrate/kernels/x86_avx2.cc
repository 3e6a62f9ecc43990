#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + FMA + F16C kernels (x86-64-v3), simd::Level::kAvx2. See x86_common.h for the rules.

#include "migrate/kernels/x86_common.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {

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
// Walsh-Hadamard rotation (see x86_common.h): 8 lanes
// =============================================================================================

namespace {

KV_AVX2_INLINE __m256 fwht_in8(__m256 a, const __m256* s) {
  a = _mm256_fmadd_ps(a, s[0], _mm256_permute_ps(a, 0xB1));            // len 1
  a = _mm256_fmadd_ps(a, s[1], _mm256_permute_ps(a, 0x4E));            // len 2
  return _mm256_fmadd_ps(a, s[2], _mm256_permute2f128_ps(a, a, 0x01));  // len 4
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

// One block of NV registers (n_rot = 8 NV values), already scaled.
template <int NV>
KV_AVX2_INLINE void fwht_regs8(__m256* v, const __m256* s) {
#pragma GCC unroll 32
  for (int i = 0; i < NV; i++) v[i] = fwht_in8(v[i], s);
  fwht_across8<NV, 1>(v);
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

KV_AVX2_INLINE void load_signs8(__m256* s) {
  for (int k = 0; k < 3; k++) s[k] = _mm256_load_ps(kSigns.s[k]);
}

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

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
