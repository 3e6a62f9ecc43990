#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX-512 F/BW/DQ/VL (+ AVX2, FMA, F16C) kernels (x86-64-v4), simd::Level::kAvx512, except the
// iq4_nl quantizer (x86_avx512_iq4_nl*.cc). See x86_common.h for the rules.

#include "migrate/kernels/x86_avx512_iq4_nl.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {

// =============================================================================================
// f16
// =============================================================================================

KV_AVX512 void f16_to_f32_avx512(const std::byte* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  if (i < n) f16_to_f32_avx2(src + 2 * i, dst + i, n - i);
}

KV_AVX512 void f16_from_f32_avx512(const float* src, std::byte* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), f16x16_from_f32(_mm512_loadu_ps(src + i)));
  }
  if (i < n) f16_from_f32_avx2(src + i, dst + 2 * i, n - i);
}

// =============================================================================================
// Walsh-Hadamard rotation (see x86_common.h): 16 lanes
// =============================================================================================

namespace {

// A block holding a NaN is left to the scalar loop (false), as in hadamard_avx2.
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

// Any n_rot >= 16: the in-register stages per vector, then the wider stages through memory.
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

}  // namespace

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

namespace {

// The fused (src -> dst) row kernels of this level: one row per pair, one
// column per rotation block (the unrotated kernel, then n_rot 64, 128, 256;
// nullptr where this level has none and the caller falls back).
struct FusedEntry {
  GgmlType src, dst;
  FusedRowFn plain, rot64, rot128, rot256;
};
constexpr FusedEntry kFused[] = {
    {GgmlType::kQ4_0, GgmlType::kQ8_0, q4_0_to_q8_0_fn, nullptr, nullptr, nullptr},
    {GgmlType::kF16, GgmlType::kIQ4_NL, f16_iq4_nl_fn, f16_rot_iq4_nl, f16_rot_iq4_nl, f16_rot_iq4_nl},
    {GgmlType::kF16, GgmlType::kQ8_0, nullptr, f16_rot_q8_0<4>, f16_rot_q8_0<8>, f16_rot_q8_0<16>},
    {GgmlType::kF16, GgmlType::kQ4_0, nullptr, f16_rot_q4_0<4>, f16_rot_q4_0<8>, f16_rot_q4_0<16>},
    {GgmlType::kQ8_0, GgmlType::kF16, nullptr, q8_0_rot_f16_fn<4>, q8_0_rot_f16_fn<8>, q8_0_rot_f16_fn<16>},
};

}  // namespace

FusedRowFn find_fused_avx512(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot) {
  // Where a 512-bit operation is split in two (Zen 4), the AVX2 kernels with AVX-512VL's
  // registers beat this file's on the q8_0 rows; at full width this file's won on Zen 5 (Intel
  // takes them too, unmeasured: docs/performance.md, "How the kernels are built").
  if (avx512_in_halves()) {
    if (FusedRowFn f = find_fused_avx2_vl(src, dst, rotate, n_rot)) return f;
  }
  for (const FusedEntry& e : kFused) {
    if (e.src != src || e.dst != dst) continue;
    if (!rotate) return e.plain;
    return n_rot == 64 ? e.rot64 : n_rot == 128 ? e.rot128 : n_rot == 256 ? e.rot256 : nullptr;
  }
  return nullptr;
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
