#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + FMA + F16C kernels (x86-64-v3), simd::Level::kAvx2. See x86_common.h for the rules.

#include <limits>

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

namespace {

// The 32 4-bit values of a block's qs[16]: x[j] = low nibble of qs[j], x[16 + j] = high nibble.
KV_AVX2_INLINE __m256i nibbles32(const std::byte* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
}

// 0x10 in byte j where bit j of qh is set (the fifth bit of q5_0/q5_1).
KV_AVX2_INLINE __m256i high_bits32(const std::byte* qhp) {
  uint32_t qh;
  std::memcpy(&qh, qhp, sizeof(qh));
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                                              2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

// y = float(q) * d (+ m): 32 int8 values q of a block, the reference's one multiply (and add).
template <bool kMin>
KV_AVX2_INLINE void scale_store32(__m256i q, __m256 d, __m256 m, float* y) {
  const __m128i parts[4] = {_mm256_castsi256_si128(q), _mm_srli_si128(_mm256_castsi256_si128(q), 8),
                            _mm256_extracti128_si256(q, 1), _mm_srli_si128(_mm256_extracti128_si256(q, 1), 8)};
  for (int k = 0; k < 4; k++) {
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), d);
    if constexpr (kMin) f = _mm256_add_ps(f, m);
    _mm256_storeu_ps(y + 8 * k, f);
  }
}

KV_AVX2_INLINE __m256 half8(const std::byte* p) { return _mm256_set1_ps(_cvtsh_ss(load_u16(p))); }

}  // namespace

KV_AVX2 void q4_1_to_f32_avx2(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ4_1Bytes;
    scale_store32<true>(nibbles32(blk + 4), half8(blk), half8(blk + 2), y);
  }
}

KV_AVX2 void q5_0_to_f32_avx2(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ5_0Bytes;
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(blk + 6), high_bits32(blk + 2)), _mm256_set1_epi8(16));
    scale_store32<false>(q, half8(blk), _mm256_setzero_ps(), y);
  }
}

KV_AVX2 void q5_1_to_f32_avx2(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ5_1Bytes;
    scale_store32<true>(_mm256_or_si256(nibbles32(blk + 8), high_bits32(blk + 4)), half8(blk), half8(blk + 2), y);
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
// ExactRequantizer's direct path: q4_0 / q5_0 / iq4_nl blocks -> q8_0 blocks, the same scale and
// the source's levels as int8 (exact_requant.cc's block_levels, byte for byte)
// =============================================================================================

namespace {

// The 34-byte q8_0 block: the source's 2-byte scale, then the 32 levels.
KV_AVX2_INLINE void put_q8_0(const std::byte* scale, __m256i levels, std::byte* out) {
  std::memcpy(out, scale, 2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2), levels);
}

KV_AVX2 void q4_0_embed_q8_0(const std::byte* in, std::byte* out, size_t nb) {
  for (size_t b = 0; b < nb; b++, in += kQ4_0Bytes, out += kQ8_0Bytes)
    put_q8_0(in, _mm256_sub_epi8(nibbles32(in + 2), _mm256_set1_epi8(8)), out);
}

KV_AVX2 void q5_0_embed_q8_0(const std::byte* in, std::byte* out, size_t nb) {
  for (size_t b = 0; b < nb; b++, in += kQ5_0Bytes, out += kQ8_0Bytes)
    put_q8_0(in, _mm256_sub_epi8(_mm256_or_si256(nibbles32(in + 6), high_bits32(in + 2)), _mm256_set1_epi8(16)), out);
}

KV_AVX2 void iq4_nl_embed_q8_0(const std::byte* in, std::byte* out, size_t nb) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
  for (size_t b = 0; b < nb; b++, in += kIQ4_NLBytes, out += kQ8_0Bytes)
    put_q8_0(in, _mm256_shuffle_epi8(table, nibbles32(in + 2)), out);
}

}  // namespace

EmbedQ8_0Fn find_embed_q8_0_avx2(GgmlType src) {
  switch (src) {
    case GgmlType::kQ4_0: return q4_0_embed_q8_0;
    case GgmlType::kQ5_0: return q5_0_embed_q8_0;
    case GgmlType::kIQ4_NL: return iq4_nl_embed_q8_0;
    default: return nullptr;
  }
}

// ExactRequantizer's scale search: 8 candidate scales in the lanes, each lane the scalar
// search's arithmetic in its order (simd_kernels.h, RequantScore8Fn)
KV_AVX2 bool requant_score8_avx2(const float* x, float m, const float* d, int lo, int hi, RequantGrid grid,
                                 double best_err, double* e, int32_t* levels, bool* ok) {
  const __m256 vd = _mm256_loadu_ps(d), vm = _mm256_set1_ps(m);
  const __m256 vlo = _mm256_set1_ps(float(lo)), vhi = _mm256_set1_ps(float(hi));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256d best = _mm256_set1_pd(best_err);
  __m256d e_lo = _mm256_setzero_pd(), e_hi = _mm256_setzero_pd();
  __m256 unusable = _mm256_setzero_ps();  // kIq4nl: lanes that met a non-finite quotient
  for (int i = 0; i < 32; ++i) {
    const __m256 r = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(x[i]), vm), vd);
    __m256 level;
    if (grid == RequantGrid::kIq4nl) {
      const __m256 finite = _mm256_cmp_ps(_mm256_and_ps(r, abs_mask), inf, _CMP_LT_OQ);
      unusable = _mm256_or_ps(unusable, _mm256_cmp_ps(finite, _mm256_setzero_ps(), _CMP_EQ_OQ));
      // nearest_iq4nl: the first of the 16 levels with the smallest |r - level|
      __m256 nearest = _mm256_set1_ps(float(kIQ4NLValues[0]));
      __m256 best_dist = _mm256_and_ps(_mm256_sub_ps(r, nearest), abs_mask);
      for (int k = 1; k < 16; ++k) {
        const __m256 lk = _mm256_set1_ps(float(kIQ4NLValues[k]));
        const __m256 dist = _mm256_and_ps(_mm256_sub_ps(r, lk), abs_mask);
        const __m256 closer = _mm256_cmp_ps(dist, best_dist, _CMP_LT_OQ);
        best_dist = _mm256_blendv_ps(best_dist, dist, closer);
        nearest = _mm256_blendv_ps(nearest, lk, closer);
      }
      level = _mm256_and_ps(nearest, finite);
    } else {
      // nearbyint (round half to even), clamped; 0 where not finite
      const __m256 n = _mm256_round_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m256 finite = _mm256_cmp_ps(_mm256_and_ps(n, abs_mask), inf, _CMP_LT_OQ);
      level = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(n, vlo), vhi), finite);
    }
    const __m256i li = _mm256_cvttps_epi32(level);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels + 8 * i), li);
    __m256 decoded = _mm256_mul_ps(_mm256_cvtepi32_ps(li), vd);
    if (grid == RequantGrid::kOffset) decoded = _mm256_add_ps(decoded, vm);
    const __m256d xd = _mm256_set1_pd(double(x[i]));
    const __m256d d0 = _mm256_sub_pd(xd, _mm256_cvtps_pd(_mm256_castps256_ps128(decoded)));
    const __m256d d1 = _mm256_sub_pd(xd, _mm256_cvtps_pd(_mm256_extractf128_ps(decoded, 1)));
    e_lo = _mm256_add_pd(e_lo, _mm256_mul_pd(d0, d0));
    e_hi = _mm256_add_pd(e_hi, _mm256_mul_pd(d1, d1));
    if ((i & 7) == 7 && _mm256_movemask_pd(_mm256_cmp_pd(e_lo, best, _CMP_LT_OQ)) == 0 &&
        _mm256_movemask_pd(_mm256_cmp_pd(e_hi, best, _CMP_LT_OQ)) == 0) {
      return false;  // no lane can get below best_err: the terms are >= 0
    }
  }
  _mm256_storeu_pd(e, e_lo);
  _mm256_storeu_pd(e + 4, e_hi);
  const int bad = _mm256_movemask_ps(unusable);
  for (int k = 0; k < 8; ++k)
    if (bad & (1 << k)) ok[k] = false;
  return true;
}

// =============================================================================================
// Walsh-Hadamard rotation (see x86_common.h): 8 lanes
// =============================================================================================

namespace {

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
