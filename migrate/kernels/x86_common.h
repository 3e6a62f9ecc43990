// Internal to migrate/kernels/: what the x86-64 kernel files share. Each kernel function carries
// its own target attribute (KV_AVX2 / KV_AVX512 below): the files are compiled with the
// project's normal flags (no -march), so nothing here runs unless simd::level() found the
// instructions (base/simd_level.h), and no helper compiled for a wider ISA can leak into
// code that runs on any CPU. -ffp-contract=off (CMakeLists.txt) plus migrate/fp_strict.h keep
// GCC from fusing the vector multiplies and adds into FMAs (its intrinsics are plain vector
// operators).
//
// The files, one per ISA and seam (declarations in migrate/simd_kernels.h):
//   x86_avx2.cc               AVX2 + FMA + F16C: f16/bf16, dequantization, Hadamard
//   x86_avx2_quant.cc         AVX2: the quantizers q8_0, q4_0, q4_1, q5_0, q5_1
//   x86_avx2_fused.cc         AVX2: the fused rows (f16 -> q8_0/q4_0/q4_1/q5_0/q5_1, q8_0 -> f16, rotated)
//                             (the q8_0 rows also compiled for the avx512 level, find_fused_avx2_vl)
//   x86_avx2_iq4_nl.cc        AVX2: the iq4_nl quantizer
//   x86_avx2_mlx.cc           AVX2: MLX's affine quantize / dequantize rows (mlx_pack.h: the packers' tables)
//   x86_avx2_requant.cc       AVX2: ExactRequantizer's searches (8 blocks in the lanes; the quick
//                             search also compiled for the avx512 level, quick_search_avx2_vl)
//   x86_avx512.cc             AVX-512: f16, Hadamard, q8_0/q4_0, the fused rows
//   x86_avx512_iq4_nl*.cc     AVX-512: the iq4_nl quantizer (x86_avx512_iq4_nl.h)
// Another x86 level gets a file x86_<level>.cc of its own (and a KV_<LEVEL> macro here);
// another architecture a <arch>_common.h and <arch>_*.cc beside these (e.g. NEON: arm_neon.cc).
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
//   (q4_1, q5_0,  returns one of its operands), the scale and its inverse are IEEE divisions
//    q5_1)        (a vector lane rounds like the scalar division), every value goes through the
//                 same multiply/add; roundf is round-half-away done exactly (roundf_to_i32_16,
//                 roundf_to_i32_8); float->int is cvttps2dq, as in the reference on x86-64.
//                 Blocks holding a NaN take the scalar path (the reference's NaN handling
//                 depends on the order), and so do q4_1/q5_1 blocks whose min or max is a zero
//                 (the sign the reference keeps depends on the order). The AVX2 f16 -> q4_1 row
//                 takes a block's max and min as integer maxima of the bit patterns (signed and
//                 unsigned), which are the float ones when the block has both signs; blocks of
//                 one sign take the scalar path too (x86_avx2_fused.cc, q4_1_max).
//   iq4_nl        lane = one block (16 blocks per vector; the 16 passes of a block in the
//                 lanes for runs of fewer than 8 blocks); each lane runs the reference's sums
//                 over j = 0..31 in order, so every sum is bit-identical; best_index is an exact
//                 equivalent (see x86_avx512_iq4_nl.h; verified for every float); the decision
//                 between the trials is the reference's sequence of comparisons, lane = block.
//                 Blocks with NaN/inf: scalar. AVX2: 8 blocks per vector, best_index as a
//                 four-comparison search of the midpoints, the same trial skipping
//                 (x86_avx2_iq4_nl.cc).
//   searches      lane = one block; each candidate's levels and error are the scalar search's
//                 operations on the same values, its 8 partial sums and their tree in the same
//                 order, every choice a per-lane blend; x - n d is one FMA only where n d is
//                 exact (no offset: see x86_avx2_requant.cc).
// Each of these is compared with the scalar reference byte for byte by kvsnap-simd-check
// (bench/simd_check.cc) and, through the public codecs, by tests/migrate at every level
// (KVSNAP_SIMD=avx2|avx512).
#pragma once

#include "migrate/simd_kernels.h"

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
// After a lambda's parameter list: lambdas do not inherit the enclosing function's target.
#define KV_AVX2_LAMBDA __attribute__((target("avx2,fma,f16c"), always_inline))
#define KV_AVX512_INLINE                                                                                    \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"), always_inline)) \
  inline

namespace kvsnap::simd::x86 {

using half::load_u16;
using half::store_u16;
using quants::kIQ4_NLBytes;
using quants::kIQ4NLValues;
using quants::kQ4_0Bytes;
using quants::kQ4_1Bytes;
using quants::kQ5_0Bytes;
using quants::kQ5_1Bytes;
using quants::kQ8_0Bytes;
using quants::kQK;

inline uint8_t* u8(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }

// ---- AVX2 helpers ---------------------------------------------------------------------------

KV_AVX2 inline __m256 abs8(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

// 8 x 8 transpose: r[i] lane k <- r[k] lane i.
KV_AVX2_INLINE void transpose8(__m256* r) {
  __m256 t[8], u[8];
  // unrolled, so t and u stay in registers (rolled, GCC keeps them on the stack)
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
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

// Lane b = the largest (or, by kOp, another order's largest) of the 8 lanes of p[b] (the
// abs-maxima of 8 blocks at once): three rounds of shuffles and maxima (order-free on non-NaN
// values, up to the sign of a zero; NaN blocks are flagged, not used, and callers that store a
// zero's sign flag zeros too). kOp: kMax the floats' maximum; kBitsMax / kBitsUmax the largest
// float bit pattern read as a signed / unsigned int32, the orders q4_1's rows reduce in
// (x86_avx2_fused.cc: with both signs in a block, the float maximum and minimum).
enum class HOp { kMax, kBitsMax, kBitsUmax };
template <HOp kOp>
KV_AVX2_INLINE __m256 hop8(__m256 a, __m256 b) {
  if constexpr (kOp == HOp::kBitsMax) {
    return _mm256_castsi256_ps(_mm256_max_epi32(_mm256_castps_si256(a), _mm256_castps_si256(b)));
  } else if constexpr (kOp == HOp::kBitsUmax) {
    return _mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(a), _mm256_castps_si256(b)));
  } else {
    return _mm256_max_ps(a, b);
  }
}

// Its three rounds one by one, for callers that spread them over other work (the latency):
// p[8] -> t[4] -> u[2] -> the result.
template <HOp kOp = HOp::kMax>
KV_AVX2_INLINE void hmax8x8_round1(const __m256* p, __m256* t) {
  constexpr auto op = hop8<kOp>;
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) t[i] = op(_mm256_unpacklo_ps(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_ps(p[2 * i], p[2 * i + 1]));
}
template <HOp kOp = HOp::kMax>
KV_AVX2_INLINE void hmax8x8_round2(const __m256* t, __m256* u) {
  constexpr auto op = hop8<kOp>;
  u[0] = op(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xEE));
  u[1] = op(_mm256_shuffle_ps(t[2], t[3], 0x44), _mm256_shuffle_ps(t[2], t[3], 0xEE));
}
template <HOp kOp = HOp::kMax>
KV_AVX2_INLINE __m256 hmax8x8_round3(const __m256* u) {
  constexpr auto op = hop8<kOp>;
  return op(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

template <HOp kOp = HOp::kMax>
KV_AVX2_INLINE __m256 hmax8x8(const __m256* p) {
  __m256 t[4], u[2];
  hmax8x8_round1<kOp>(p, t);
  hmax8x8_round2<kOp>(t, u);
  return hmax8x8_round3<kOp>(u);
}

// roundf(x) -> int32 for 8 lanes (cvttps2dq of the rounded value, as the reference does):
// trunc(x + copysign(0.49999997f, x)). With the largest float below 0.5, the one rounding of the
// addition can no longer carry a fraction just below .5 up to the next integer (what breaks
// x + 0.5), and a tie still reaches it; equal to roundf for every non-NaN float (all 2^32
// patterns: kvsnap-simd-check --exhaustive). NaN and |x| >= 2^31 give INT32_MIN either way.
// copysign is one blend on x's sign bit (-0.0 and negative NaNs take -h, as and/or would give).
KV_AVX2_INLINE __m256i roundf_to_i32_8(__m256 x) {
  const __m256 h = _mm256_set1_ps(0x1.fffffep-2f);
  const __m256 half = _mm256_blendv_ps(h, _mm256_set1_ps(-0x1.fffffep-2f), x);
  return _mm256_cvttps_epi32(_mm256_add_ps(x, half));
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

// ---- Walsh-Hadamard rotation ----------------------------------------------------------------
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
inline constexpr SignTable kSigns = make_signs();

KV_AVX512_INLINE __m512 fwht_in16(__m512 a, const __m512* s) {
  a = _mm512_fmadd_ps(a, s[0], _mm512_permute_ps(a, 0xB1));          // len 1
  a = _mm512_fmadd_ps(a, s[1], _mm512_permute_ps(a, 0x4E));          // len 2
  a = _mm512_fmadd_ps(a, s[2], _mm512_shuffle_f32x4(a, a, 0xB1));    // len 4
  return _mm512_fmadd_ps(a, s[3], _mm512_shuffle_f32x4(a, a, 0x4E));  // len 8
}

// The stages across registers: register distance LEN, 2 LEN, ... < NV.
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

// 8 lanes (AVX2): the same, stages len 1, 2, 4 inside a register.
KV_AVX2_INLINE __m256 fwht_in8(__m256 a, const __m256* s) {
  a = _mm256_fmadd_ps(a, s[0], _mm256_permute_ps(a, 0xB1));            // len 1
  a = _mm256_fmadd_ps(a, s[1], _mm256_permute_ps(a, 0x4E));            // len 2
  return _mm256_fmadd_ps(a, s[2], _mm256_permute2f128_ps(a, a, 0x01));  // len 4
}

// kFinite: the caller recomputes in scalar code every block whose values are not all finite (or
// has none), so u - w may run as -(w * 1) + u on the multiply-add pipes, beside the additions on
// the add pipes: on finite values the product is exact and the one rounding is that of u - w,
// signed zeros included (-(+0) + -0 = -0 - +0 ... each case agrees). Only a NaN's sign differs: the
// hardware keeps w's, while clang at -O0 negates w with a sign flip first (0x7FC00000 where the
// reference gives 0xFFC00000: kvsnap-simd-check, clang build), so hadamard_avx2, whose inf inputs
// make NaNs it returns, keeps the plain subtraction.
template <bool kFinite>
KV_AVX2_INLINE __m256 fwht_sub8(__m256 u, __m256 w) {
  if constexpr (kFinite) return _mm256_fnmadd_ps(w, _mm256_set1_ps(1.0f), u);
  return _mm256_sub_ps(u, w);
}

template <int NV, int LEN, bool kFinite>
KV_AVX2_INLINE void fwht_across8(__m256* v) {
  if constexpr (LEN < NV) {
#pragma GCC unroll 32
    for (int i = 0; i < NV; i++) {
      if ((i & LEN) == 0) {
        const __m256 u = v[i], w = v[i + LEN];
        v[i] = _mm256_add_ps(u, w);
        v[i + LEN] = fwht_sub8<kFinite>(u, w);
      }
    }
    fwht_across8<NV, 2 * LEN, kFinite>(v);
  }
}

// One block of NV registers (n_rot = 8 NV values), already scaled.
template <int NV, bool kFinite = false>
KV_AVX2_INLINE void fwht_regs8(__m256* v, const __m256* s) {
#pragma GCC unroll 32
  for (int i = 0; i < NV; i++) v[i] = fwht_in8(v[i], s);
  fwht_across8<NV, 1, kFinite>(v);
}

KV_AVX2_INLINE void load_signs8(__m256* s) {
  for (int k = 0; k < 3; k++) s[k] = _mm256_load_ps(kSigns.s[k]);
}

// One block of NV registers (n_rot = 16 NV values), already scaled.
template <int NV>
KV_AVX512_INLINE void fwht_regs16(__m512* v, const __m512* s) {
#pragma GCC unroll 16
  for (int i = 0; i < NV; i++) v[i] = fwht_in16(v[i], s);
  fwht_across16<NV, 1>(v);
}

KV_AVX512_INLINE void load_signs16(__m512* s) {
  for (int k = 0; k < 4; k++) s[k] = _mm512_load_ps(kSigns.s[k]);
}

// 1.0f / sqrtf(n_rot), as the scalar code computes it
inline float fwht_scale(uint32_t n_rot) { return 1.0f / std::sqrt(static_cast<float>(n_rot)); }

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

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
