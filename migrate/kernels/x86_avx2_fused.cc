#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + FMA + F16C fused rows (simd::Level::kAvx2): to_f32, rotation, from_f32 per rotation
// block in one pass, the structure of x86_avx512.cc's with 8-wide vectors. Each step is the
// same operations as the separate AVX2 kernels (f16_to_f32_avx2, hadamard_avx2,
// q8_0_from_f32_avx2, f16_from_f32_avx2), so the bytes equal the three steps' (and the scalar
// reference's). See x86_common.h for the rules.
//
// A rotation block of R = 64, 128 or 256 values: each 64-value chunk is rotated in 8 registers
// (stages len 1..32); for R > 64 the chunks go to an L1 buffer where the middle stage (len 64,
// R = 256) runs, and the last stage (len R / 2) is done as the values are read back, two output
// quant blocks (8 registers) at a time: block j (u + w) and block j + R / 64 (u - w). The q8_0
// rows (f16 -> q8_0, q8_0 -> f16) and f16 -> q4_1 at R = 128, the K rotation of head_dim 128, go
// by 32-value quarters instead (rotate128_quarters): fewer live registers, more independent chains.
// The avx512 level runs f16 -> q8_0 (n_rot 64, 128, 256) and q8_0 -> f16 (n_rot 64) from here
// too (f16_rot_q8_0_vl, q8_0_rot_f16_vl: the same code compiled with AVX-512VL's 32 registers);
// at n_rot 128 f16 -> q8_0 then takes the paired layout (unit_rotate_paired: two rotation blocks
// per register, no lane-crossing stage), which needs more registers than AVX2's 16.
// Every rotation block whose input is not all finite is recomputed by the scalar reference (f16
// inputs: after the rotation, from its maxima; q8_0: before, from its scales), and finite f16 or
// q8_0 inputs never overflow in the rotation, so the subtractions run as fwht_sub8<true>
// (x86_common.h) on the multiply-add pipes.

#include "migrate/kernels/x86_common.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {
namespace {

struct Rot8 {
  __m256 scale;
  __m256 s[3];
};

KV_AVX2_INLINE Rot8 rot8(uint32_t r) {
  Rot8 k;
  k.scale = _mm256_set1_ps(fwht_scale(r));
  load_signs8(k.s);
  return k;
}

// Chunk c of a rotation block (load(c, v): NV registers of unscaled floats), scaled and rotated
// inside itself (stages len 1 .. 4 NV).
template <int NV, class Load>
KV_AVX2_INLINE void load_rotate8(const Rot8& k, Load load, int c, __m256* v) {
  load(c, v);
#pragma GCC unroll 8
  for (int i = 0; i < NV; i++) v[i] = _mm256_mul_ps(v[i], k.scale);
  fwht_regs8<NV, true>(v, k.s);
}

// The rotation block of R values whose 64-value chunk c (8 registers, f32, unscaled) load(c, v)
// gives, rotated; emit(v, a, b) receives the rotated values 8 registers at a time: values a..a+31
// in v[0..3], b..b+31 in v[4..7]. An inf or NaN input makes every rotated value of the block
// inf or NaN (each is a +- sum of all the inputs, and inf - inf is NaN): callers detect it on
// what they receive.
template <int R, class Load, class Emit>
KV_AVX2_INLINE void rotate_block(const Rot8& k, Load load, Emit emit) {
  static_assert(R == 64 || R == 128 || R == 256, "n_rot 64, 128, 256");
  if constexpr (R == 64) {
    __m256 v[8];
    load_rotate8<8>(k, load, 0, v);
    emit(v, 0, 32);
  } else if constexpr (R == 128) {
    // chunk 0 through L1, chunk 1 stays in registers for the last stage (len 64)
    alignas(32) float buf[64];
    __m256 v[8];
    load_rotate8<8>(k, load, 0, v);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) _mm256_store_ps(buf + 8 * i, v[i]);
    __m256 w[8];
    load_rotate8<8>(k, load, 1, w);
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) {
      __m256 o[8];
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) {
        const __m256 u = _mm256_load_ps(buf + 32 * j + 8 * i);
        o[i] = _mm256_add_ps(u, w[4 * j + i]);
        o[4 + i] = fwht_sub8<true>(u, w[4 * j + i]);
      }
      emit(o, 32 * j, 64 + 32 * j);
    }
  } else {
    alignas(32) float buf[R];
    for (int c = 0; c < R / 64; c++) {
      __m256 v[8];
      load_rotate8<8>(k, load, c, v);
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) _mm256_store_ps(buf + 64 * c + 8 * i, v[i]);
    }
    if constexpr (R == 256) {  // stage len 64
      for (int i = 0; i < R; i += 128) {
#pragma GCC unroll 8
        for (int j = 0; j < 64; j += 8) {
          const __m256 u = _mm256_load_ps(buf + i + j), w = _mm256_load_ps(buf + i + 64 + j);
          _mm256_store_ps(buf + i + j, _mm256_add_ps(u, w));
          _mm256_store_ps(buf + i + 64 + j, fwht_sub8<true>(u, w));
        }
      }
    }
    for (int j = 0; j < R / 2; j += 32) {  // the last stage, len R / 2
      __m256 v[8];
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) {
        const __m256 u = _mm256_load_ps(buf + j + 8 * i), w = _mm256_load_ps(buf + R / 2 + j + 8 * i);
        v[i] = _mm256_add_ps(u, w);
        v[4 + i] = fwht_sub8<true>(u, w);
      }
      emit(v, j, R / 2 + j);
    }
  }
}

// The last two stages of n_rot 128 on four registers x[g] = x + stride * g (g: the value index's
// bits 5 and 6): len 32 on (x0, x1), (x2, x3), then len 64 on the results (q0, q2), (q1, q3).
// emit(g, o) receives the results (o of register g). kAllFirst: all four results before the
// first emit, else each emitted as soon as computed: the schedules GCC makes of the two differ,
// f16 -> q8_0 is ~2% faster with the first, q8_0 -> f16 ~2% with the second (Zen 4, AVX2).
template <bool kAllFirst, class Emit>
KV_AVX2_INLINE void fwht_len32_64(const float* x, int stride, Emit emit) {
  const __m256 x0 = _mm256_load_ps(x), x1 = _mm256_load_ps(x + stride);
  const __m256 x2 = _mm256_load_ps(x + 2 * stride), x3 = _mm256_load_ps(x + 3 * stride);
  const __m256 q0 = _mm256_add_ps(x0, x1), q1 = fwht_sub8<true>(x0, x1);
  const __m256 q2 = _mm256_add_ps(x2, x3), q3 = fwht_sub8<true>(x2, x3);
  if constexpr (kAllFirst) {
    const __m256 o[4] = {_mm256_add_ps(q0, q2), _mm256_add_ps(q1, q3), fwht_sub8<true>(q0, q2), fwht_sub8<true>(q1, q3)};
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) emit(g, o[g]);
  } else {
    emit(0, _mm256_add_ps(q0, q2));
    emit(1, _mm256_add_ps(q1, q3));
    emit(2, fwht_sub8<true>(q0, q2));
    emit(3, fwht_sub8<true>(q1, q3));
  }
}

// n_rot 128 by quarters: each 32-value quarter q (load32(q, v): 4 registers, f32, unscaled) is
// scaled and rotated in registers (stages len 1..16) into an L1 buffer; then, per register
// position k, the four quarters' registers take stages len 32 and 64 and emit(b, k, x) receives
// values 32 b + 8 k .. + 7 (b = 0..3, the quant blocks of the rotation block). Fewer values are
// live at once than in rotate_block<128> (4 + 4 registers instead of 16), so nothing spills and the
// quarters' dependency chains overlap. The same operations on the same pairs as rotate_block.
template <bool kAllFirst, class Load32, class Emit>
KV_AVX2_INLINE void rotate128_quarters(const Rot8& k, Load32 load32, Emit emit) {
  alignas(32) float buf[128];
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++) {
    __m256 v[4];
    load_rotate8<4>(k, load32, q, v);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) _mm256_store_ps(buf + 32 * q + 8 * i, v[i]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; j++) {
    fwht_len32_64<kAllFirst>(buf + 8 * j, 32, [&](int b, __m256 x) KV_AVX2_LAMBDA { emit(b, j, x); });
  }
}

// 64 f16 values -> 8 registers of floats (f16_to_f32_avx2); load_f16x32: 32 values, 4 registers.
KV_AVX2_INLINE void load_f16x64(const std::byte* in, __m256* v) {
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) v[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16 * i)));
}
KV_AVX2_INLINE void load_f16x32(const std::byte* in, __m256* v) {
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) v[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16 * i)));
}

// f16 -> q8_0 / q4_1 with rotation works in units of 256 values (8 quant blocks): unit_rotate
// rotates a unit into an L1 buffer and reduces the blocks' abs-maxima (q4_1: maxima and minima)
// into registers of 8 lanes; unit_scales turns them into the scales (q8_0: d = amax / 127; q4_1:
// d = (max - min) / 15; id = 1 / d: the quantizers' divisions, 8 lanes at once) in the same
// stretch of code as the next unit's rotation (software pipelining over the reductions' and
// divisions' latency); the back quantizes the unit from the buffer.
constexpr int kUnit = 256;

enum class Kind { kQ8_0, kQ4_1 };

struct Unit {
  alignas(32) float buf[kUnit];
  alignas(32) float id[8];
  alignas(32) float mn[8];     // q4_1: the blocks' minima
  alignas(16) uint16_t dh[8];
  __m256 pa[8], pb[8];         // per block: the lane (abs-)maxima, the lane minima (q4_1)
  alignas(32) uint32_t dm[8];  // q4_1: d and the minimum as f16, the first 4 bytes of each block
  const std::byte* in;  // the unit's f16 input (for the scalar path of a rotation block with inf/NaN)
  std::byte* out;
  int nb;               // quant blocks in the unit (a multiple of R / 32)
  uint32_t nonfinite;   // blocks whose maxima are inf/NaN: their rotation block had an inf/NaN input
  uint32_t scalar;      // blocks for the scalar reference on the rotated values (see the backs)
  bool paired;          // buf is in the paired layout (unit_rotate_paired), not in value order
};

// f16 -> q8_0 at n_rot 128, a whole unit (rotation blocks A = values 0..127, B = 128..255) in
// the paired layout: register (g, p) (g 0..3, p 0..7, buf + 64 g + 8 p) holds values
// 32 g + 4 p .. + 3 of A in its low 128-bit half and the same values of B in its high half.
// Stages len 1 and 2 stay inside 128-bit lanes (vpermilps, as in fwht_in8), len 4, 8, 16 are
// across the 8 registers of a group (the bits of p), len 32 and 64 across the groups (the bits
// of g): no lane-crossing shuffle at all, where the value-order layout needs one per register
// (len 4), and the two halves of an input register come together by a blend of two loads. Quant
// block g of A is then the low halves of group g, block g of B its high halves: the abs-maxima
// reduce in two rounds (hmax_paired) and the packs put A's bytes in the low lane, B's in the
// high one (q8_0_pair). The same operations on the same pairs, in the same stage order, as
// rotate_block. side(g) as in unit_rotate.
template <class Side>
KV_AVX2_INLINE void unit_rotate_paired(const std::byte* in, const Rot8& k, Unit* u, Side side) {
  float* buf = u->buf;
#pragma GCC unroll 4
  for (int g = 0; g < 4; g++) {
    __m256 v[8];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
      if (p % 4 == 0) side(2 * g + p / 4);
      // values 32 g + 4 p .. + 3: A's 8 bytes in the low half, B's (256 bytes on) in the high half
      // (a 16-byte load ending at them, so the blend can take it from memory)
      const std::byte* a = in + 2 * (32 * g + 4 * p);
      const __m128i h = _mm_blend_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2 * 128 - 8)), 0xC);
      __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(h), k.scale);
      x = _mm256_fmadd_ps(x, k.s[0], _mm256_permute_ps(x, 0xB1));  // len 1
      v[p] = _mm256_fmadd_ps(x, k.s[1], _mm256_permute_ps(x, 0x4E));  // len 2
    }
    fwht_across8<8, 1, true>(v);  // len 4, 8, 16
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) _mm256_store_ps(buf + 64 * g + 8 * p, v[p]);
  }
  __m256 acc[4];
#pragma GCC unroll 8
  for (int p = 0; p < 8; p++) {
    fwht_len32_64<true>(buf + 8 * p, 64, [&](int g, __m256 o) KV_AVX2_LAMBDA {
      _mm256_store_ps(buf + 64 * g + 8 * p, o);
      // |x| as int32 orders like the floats (NaN above inf), see unit_rotate
      const __m256i a = _mm256_castps_si256(abs8(o));
      acc[g] = p == 0 ? _mm256_castsi256_ps(a) : _mm256_castsi256_ps(_mm256_max_epi32(_mm256_castps_si256(acc[g]), a));
    });
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; g++) u->pa[g] = acc[g];
}

// The paired layout's block maxima: lane b = the largest of block b's lanes (pa[g]: block g in
// the low half, block 4 + g in the high half), in two rounds (max is order-free on non-NaN
// values; a NaN or inf block has no finite lane and stays flagged).
KV_AVX2_INLINE void hmax_paired_round1(const __m256* pa, __m256* t) {
  t[0] = _mm256_max_ps(_mm256_unpacklo_ps(pa[0], pa[1]), _mm256_unpackhi_ps(pa[0], pa[1]));
  t[1] = _mm256_max_ps(_mm256_unpacklo_ps(pa[2], pa[3]), _mm256_unpackhi_ps(pa[2], pa[3]));
}
KV_AVX2_INLINE __m256 hmax_paired_round2(const __m256* t) {
  return _mm256_max_ps(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xEE));
}

// Values of block b of a paired unit, in order (for the scalar reference).
KV_AVX2_INLINE void paired_block(const Unit& u, int b, float* x) {
  for (int p = 0; p < 8; p++) std::memcpy(x + 4 * p, u.buf + 64 * (b % 4) + 8 * p + 4 * (b / 4), 4 * sizeof(float));
}

// q4_1's block maxima and minima are reduced on the floats' bits, in integer maxima that run on
// any vector pipe rather than on the FP pipes the rotation keeps busy: the largest bit pattern
// as a signed int32 (q4_1_max) is the largest float when the block has a value with its sign bit
// clear, the largest as an unsigned int32 (q4_1_min) the smallest float when it has one with the
// sign bit set. A block of one sign only (then its q4_1_max has the sign bit set or its q4_1_min
// has it clear) goes to the scalar reference, as does a zero maximum or minimum: the reference
// starts from min = FLT_MAX, max = -FLT_MAX and compares strictly, which on finite values is the
// plain minimum and maximum up to the sign of a zero (a rotated -0 can sit among nonzero values,
// from x - x cancellations; it matters only as a block's maximum or minimum, and such a block is
// flagged: a zero extreme, or one sign only). An inf or NaN is found whatever its sign: a NaN or
// +inf with the sign bit clear is the signed maximum (above every finite pattern), one with it
// set the unsigned one.
KV_AVX2_INLINE __m256 q4_1_max(__m256 a, __m256 b) { return hop8<HOp::kBitsMax>(a, b); }
KV_AVX2_INLINE __m256 q4_1_min(__m256 a, __m256 b) { return hop8<HOp::kBitsUmax>(a, b); }
KV_AVX2_INLINE __m256 q4_1_nonfinite(__m256 mx, __m256 mn) {
  return _mm256_or_ps(_mm256_cmp_ps(mx, _mm256_set1_ps(INFINITY), _CMP_NLT_UQ),
                      _mm256_cmp_ps(mn, _mm256_set1_ps(-INFINITY), _CMP_NGT_UQ));
}
KV_AVX2_INLINE uint32_t q4_1_scalar(__m256 mx, __m256 mn) {
  const __m256 zero = _mm256_setzero_ps();
  const uint32_t one_sign = static_cast<uint32_t>(_mm256_movemask_ps(mx) | (~_mm256_movemask_ps(mn) & 0xff));
  return one_sign | static_cast<uint32_t>(_mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(mn, zero, _CMP_EQ_OQ), _mm256_cmp_ps(mx, zero, _CMP_EQ_OQ))));
}
// The reference's d = (max - min) / 15, then (q4_1_set_scales) id = 1 / d, the blocks' first 4
// bytes (d and min as f16) and the flags: the steps of unit_scales and Q41Scales.
KV_AVX2_INLINE __m256 q4_1_d(__m256 mx, __m256 mn) {
  return _mm256_div_ps(_mm256_sub_ps(mx, mn), _mm256_set1_ps(static_cast<float>((1 << 4) - 1)));
}
KV_AVX2_INLINE void q4_1_set_scales(Unit* u, __m256 mx, __m256 mn, __m256 d) {
  const __m256 id = _mm256_and_ps(_mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_UQ), _mm256_div_ps(_mm256_set1_ps(1.0f), d));
  _mm256_store_ps(u->id, id);
  _mm256_store_ps(u->mn, mn);
  const __m128i dh = _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT), mh = _mm256_cvtps_ph(mn, _MM_FROUND_TO_NEAREST_INT);
  _mm_store_si128(reinterpret_cast<__m128i*>(u->dm), _mm_unpacklo_epi16(dh, mh));
  _mm_store_si128(reinterpret_cast<__m128i*>(u->dm + 4), _mm_unpackhi_epi16(dh, mh));
  u->nonfinite = static_cast<uint32_t>(_mm256_movemask_ps(q4_1_nonfinite(mx, mn)));
  // an infinite id (a d below ~2^-128, which rotated f16 values never give: q4_1_block) goes to
  // the scalar reference too
  u->scalar = q4_1_scalar(mx, mn) | static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(id, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ)));
}

// side(g) is called before the g-th 32-value load of a whole unit at n_rot 128 (g = 0..7: other
// work to interleave, see Q8Scales and Q41Scales), never on the others.
template <int R, Kind K, bool kPaired, class Side>
KV_AVX2_INLINE void unit_rotate(const std::byte* in, std::byte* out, size_t len, const Rot8& k, Unit* u, Side side) {
  constexpr bool kMin = K == Kind::kQ4_1;
  // pa[b]: block b's lane (abs-)maxima, pb[b] its lane minima (q4_1); the emits below set those of
  // the unit's blocks, so only the missing blocks of a short unit are zeroed (a zeroing of all
  // eight became a rep stos that cost ~5% of the row)
  __m256* pa = u->pa;
  __m256* pb = u->pb;
  u->in = in;
  u->out = out;
  u->nb = static_cast<int>(len / kQK);
  u->paired = false;
  if (__builtin_expect(u->nb < 8, 0)) {
    for (int b = u->nb; b < 8; b++) pa[b] = pb[b] = _mm256_setzero_ps();
  }
  const auto reduce = [&](const __m256* v, int b) KV_AVX2_LAMBDA {
    if constexpr (kMin) {
      pa[b] = q4_1_max(q4_1_max(v[0], v[1]), q4_1_max(v[2], v[3]));
      pb[b] = q4_1_min(q4_1_min(v[0], v[1]), q4_1_min(v[2], v[3]));
    } else {
      pa[b] = _mm256_max_ps(_mm256_max_ps(abs8(v[0]), abs8(v[1])), _mm256_max_ps(abs8(v[2]), abs8(v[3])));
    }
  };
  if constexpr (R == 128) {
    const auto rot = [&](size_t r, bool whole) KV_AVX2_LAMBDA {
      float* buf = u->buf + r;
      const int b0 = static_cast<int>(r / kQK);
      __m256 acc[4], accm[4];
      rotate128_quarters<true>(
          k,
          [&](int q, __m256* v) KV_AVX2_LAMBDA {
            if (whole) side(static_cast<int>(r / 32) + q);
            load_f16x32(in + 2 * (r + 32 * q), v);
          },
          [&](int b, int j, __m256 x) KV_AVX2_LAMBDA {
            _mm256_store_ps(buf + 32 * b + 8 * j, x);
            if constexpr (kMin) {
              acc[b] = j == 0 ? x : q4_1_max(acc[b], x);
              accm[b] = j == 0 ? x : q4_1_min(accm[b], x);
            } else {
              // |x| as int32 orders like the floats (NaN above inf), and the integer maximum runs on
              // any vector pipe, not on the adders the rotation keeps busy
              const __m256i a = _mm256_castps_si256(abs8(x));
              acc[b] = j == 0 ? _mm256_castsi256_ps(a) : _mm256_castsi256_ps(_mm256_max_epi32(_mm256_castps_si256(acc[b]), a));
            }
          });
#pragma GCC unroll 4
      for (int b = 0; b < 4; b++) {
        pa[b0 + b] = acc[b];
        if constexpr (kMin) pb[b0 + b] = accm[b];
      }
    };
    if (len == kUnit && kPaired) {
      u->paired = true;
      unit_rotate_paired(in, k, u, side);
    } else if (len == kUnit) {  // both rotation blocks in one straight stretch of code for the scheduler
      rot(0, true);
      rot(R, true);
    } else {
      for (size_t r = 0; r < len; r += R) rot(r, false);
    }
  } else {
  for (size_t r = 0; r < len; r += R) {
    float* buf = u->buf + r;
    const int b0 = static_cast<int>(r / kQK);
    // a rotation block with an inf/NaN input has inf/NaN maxima and minima (flagged below)
    rotate_block<R>(
        k, [&](int c, __m256* v) KV_AVX2_LAMBDA { load_f16x64(in + 2 * (r + 64 * c), v); },
        [&](const __m256* v, int a, int bb) KV_AVX2_LAMBDA {
#pragma GCC unroll 4
          for (int i = 0; i < 4; i++) {
            _mm256_store_ps(buf + a + 8 * i, v[i]);
            _mm256_store_ps(buf + bb + 8 * i, v[4 + i]);
          }
          reduce(v, b0 + a / kQK);
          reduce(v + 4, b0 + bb / kQK);
        });
  }
  }
}

// The unit's scales from its maxima (and minima); run in the same stretch of code as the next
// unit's rotation, so that the reductions' and divisions' latency overlaps with independent work.
template <Kind K>
KV_AVX2_INLINE void unit_scales(Unit* u) {
  const __m256* pa = u->pa;
  if constexpr (K == Kind::kQ4_1) {  // never paired
    const __m256 mx = hmax8x8<HOp::kBitsMax>(pa), mn = hmax8x8<HOp::kBitsUmax>(u->pb);
    q4_1_set_scales(u, mx, mn, q4_1_d(mx, mn));
    return;
  }
  const __m256 zero = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY);
  __m256 t[2];
  if (u->paired) hmax_paired_round1(pa, t);
  const __m256 mx = u->paired ? hmax_paired_round2(t) : hmax8x8(pa);
  const __m256 d = _mm256_div_ps(mx, _mm256_set1_ps(static_cast<float>((1 << 7) - 1)));
  const __m256 id = _mm256_and_ps(_mm256_cmp_ps(d, zero, _CMP_NEQ_UQ), _mm256_div_ps(_mm256_set1_ps(1.0f), d));
  _mm256_store_ps(u->id, id);
  _mm_store_si128(reinterpret_cast<__m128i*>(u->dh), _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
  u->nonfinite = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(mx, inf, _CMP_NLT_UQ)));
  // an infinite id (a d below ~2^-128, which rotated f16 values never give: they are multiples
  // of 2^-51, see q4_1_block) goes to the scalar reference
  u->scalar = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(id, inf, _CMP_EQ_OQ)));
}

// unit_scales for q8_0 in eight steps, step(g) before the g-th eighth of the
// next unit's rotation: the same operations, the reductions and the two divisions (~40 cycles of
// latency in a row) spread over independent work instead of holding the scheduler's entries
// while they wait.
template <bool kPaired>
struct Q8Scales {
  explicit Q8Scales(Unit* unit) : u(unit) {}
  Unit* u;
  __m256 t[4], v[2], d, bad;  // set by the steps, in order
  KV_AVX2_INLINE void step(int g) {
    const __m256 zero = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY);
    if constexpr (kPaired) {
      if (g == 0) hmax_paired_round1(u->pa, t);
    } else {
      if (g == 0) hmax8x8_round1(u->pa, t);
      if (g == 1) hmax8x8_round2(t, v);
    }
    if (g == 2) {
      const __m256 mx = kPaired ? hmax_paired_round2(t) : hmax8x8_round3(v);
      bad = _mm256_cmp_ps(mx, inf, _CMP_NLT_UQ);
      d = _mm256_div_ps(mx, _mm256_set1_ps(static_cast<float>((1 << 7) - 1)));
    }
    if (g == 5) {
      const __m256 id = _mm256_and_ps(_mm256_cmp_ps(d, zero, _CMP_NEQ_UQ), _mm256_div_ps(_mm256_set1_ps(1.0f), d));
      _mm256_store_ps(u->id, id);
      _mm_store_si128(reinterpret_cast<__m128i*>(u->dh), _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
      u->nonfinite = static_cast<uint32_t>(_mm256_movemask_ps(bad));
      u->scalar = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(id, inf, _CMP_EQ_OQ)));
    }
  }
};

// unit_scales for q4_1 in steps, as Q8Scales: the maxima's and minima's reductions, then
// d = (max - min) / 15 and id = 1 / d, the same operations as unit_scales<Kind::kQ4_1>.
struct Q41Scales {
  explicit Q41Scales(Unit* unit) : u(unit) {}
  Unit* u;
  __m256 t[4], v[2], mx, mn, d;  // set by the steps, in order
  KV_AVX2_INLINE void step(int g) {
    if (g == 0) hmax8x8_round1<HOp::kBitsMax>(u->pa, t);
    if (g == 1) hmax8x8_round2<HOp::kBitsMax>(t, v);
    if (g == 2) {
      mx = hmax8x8_round3<HOp::kBitsMax>(v);
      hmax8x8_round1<HOp::kBitsUmax>(u->pb, t);
    }
    if (g == 3) hmax8x8_round2<HOp::kBitsUmax>(t, v);
    if (g == 4) {
      mn = hmax8x8_round3<HOp::kBitsUmax>(v);
      d = q4_1_d(mx, mn);
    }
    if (g == 7) q4_1_set_scales(u, mx, mn, d);
  }
};

// q8_0_from_f32_avx2's operations on block b of the unit. q = roundf(x * id) lies in -127..127
// when id is finite, so saturating packs keep the reference's (int8_t) bytes.
KV_AVX2_INLINE void q8_0_block(const Unit& u, int b) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  std::byte* blk = u.out + b * kQ8_0Bytes;
  const float* x = u.buf + b * kQK;
  const __m256 vid = _mm256_broadcast_ss(u.id + b);
  const __m256i w01 = _mm256_packs_epi32(roundf_to_i32_8(_mm256_mul_ps(_mm256_load_ps(x), vid)),
                                         roundf_to_i32_8(_mm256_mul_ps(_mm256_load_ps(x + 8), vid)));
  const __m256i w23 = _mm256_packs_epi32(roundf_to_i32_8(_mm256_mul_ps(_mm256_load_ps(x + 16), vid)),
                                         roundf_to_i32_8(_mm256_mul_ps(_mm256_load_ps(x + 24), vid)));
  store_u16(blk, u.dh[b]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk + 2), _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order));
}

// q8_0_block on blocks g and 4 + g of a paired unit: the packs keep each 128-bit lane apart, so
// A's 32 bytes come out as the low lanes of two registers and B's as their high lanes.
KV_AVX2_INLINE void q8_0_pair(const Unit& u, int g) {
  const float* x = u.buf + 64 * g;
  const __m256 vid = _mm256_blend_ps(_mm256_broadcast_ss(u.id + g), _mm256_broadcast_ss(u.id + 4 + g), 0xF0);
  __m256i r[8];
#pragma GCC unroll 8
  for (int p = 0; p < 8; p++) r[p] = roundf_to_i32_8(_mm256_mul_ps(_mm256_load_ps(x + 8 * p), vid));
  // bytes of values 0..15 of A | 0..15 of B, then 16..31 of each
  const __m256i lo = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
  const __m256i hi = _mm256_packs_epi16(_mm256_packs_epi32(r[4], r[5]), _mm256_packs_epi32(r[6], r[7]));
  std::byte* a = u.out + g * kQ8_0Bytes;
  std::byte* b = u.out + (4 + g) * kQ8_0Bytes;
  store_u16(a, u.dh[g]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + 2), _mm256_permute2x128_si256(lo, hi, 0x20));
  store_u16(b, u.dh[4 + g]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + 2), _mm256_permute2x128_si256(lo, hi, 0x31));
}

// q4_1_from_f32_avx2's operations on block b of the unit: q = (int8)((x - min) * id + 0.5f),
// MIN(15, q), computed as 0.5f - (min - x) * id: rounding to nearest is symmetric, so
// fl(min - x) = -fl(x - min) and fl(fl(min - x) * id) = -fl(fl(x - min) * id), and the last
// subtraction is the reference's addition (a zero difference gives 0.5 either way); the x
// operand can then come straight from memory. With finite values, min <= x <= max and d =
// (max - min) / 15 a normal float, (x - min) * id lies in [0, 15 (1 + 2^-21)], so q is 0..15:
// saturating packs keep the reference's bytes and its MIN(15, q) never acts (the nibble shift
// below relies on it). d is normal on these rows: the rotation first multiplies each f16 (a
// multiple of 2^-24) by the scale (2^-3 .. 2^-4) into a multiple of 2^-51, every sum and
// difference after stays one, so a nonzero max - min is >= 2^-51 (a zero one is flagged). The
// packing pairs j with 16 + j without a byte shuffle: packs(q0, q2), packs(q1, q3), packus put
// values j..j+3 and 16+j..19+j in one 64-bit lane, so a 64-bit shift by 28 lays the second
// group on the first's high nibbles.
KV_AVX2_INLINE void q4_1_block(const Unit& u, int b) {
  std::byte* blk = u.out + b * kQ4_1Bytes;
  const float* x = u.buf + b * kQK;
  const __m256 vid = _mm256_broadcast_ss(u.id + b), vmn = _mm256_broadcast_ss(u.mn + b), half = _mm256_set1_ps(0.5f);
  __m256i q[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    q[i] = _mm256_cvttps_epi32(_mm256_sub_ps(half, _mm256_mul_ps(_mm256_sub_ps(vmn, _mm256_load_ps(x + 8 * i)), vid)));
  }
  // bytes: values 0-3 16-19 8-11 24-27 | 4-7 20-23 12-15 28-31
  __m256i r = _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[2]), _mm256_packs_epi32(q[1], q[3]));
  r = _mm256_or_si256(r, _mm256_srli_epi64(r, 28));
  const __m256i qs = _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 2, 6, 0, 4, 2, 6));
  std::memcpy(blk, &u.dm[b], sizeof(uint32_t));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 4), _mm256_castsi256_si128(qs));
}

// The unit's blocks: a rotation block with an inf/NaN input from its input through the scalar
// reference, a block flagged in u.scalar through the scalar quantizer on the same rotated values.
template <int R, Kind K>
KV_AVX2_INLINE void unit_back(const Unit& u) {
  constexpr size_t kBytes = K == Kind::kQ4_1 ? kQ4_1Bytes : kQ8_0Bytes;
  const auto block = [&](int b) KV_AVX2_LAMBDA {
    if constexpr (K == Kind::kQ4_1) q4_1_block(u, b);
    else q8_0_block(u, b);
  };
  const auto ref = K == Kind::kQ4_1 ? quants::ref::q4_1_from_f32 : quants::ref::q8_0_from_f32;
  if constexpr (K == Kind::kQ8_0) {
    if (__builtin_expect(u.paired && (u.nonfinite | u.scalar) == 0, 1)) {
#pragma GCC unroll 4
      for (int g = 0; g < 4; g++) q8_0_pair(u, g);
      return;
    }
  }
  if (__builtin_expect(u.nb == 8 && (u.nonfinite | u.scalar) == 0, 1)) {  // a whole unit, no flags
#pragma GCC unroll 8
    for (int b = 0; b < 8; b++) block(b);
    return;
  }
  for (int b = 0; b < u.nb; b++) {
    std::byte* blk = u.out + b * kBytes;
    if (__builtin_expect((u.nonfinite >> b) & 1, 0)) {
      if (b % (R / kQK) == 0) {  // the whole rotation block, once, from its input
        alignas(32) float tmp[R];
        quants::ref::f16_to_f32(u.in + 2 * b * kQK, tmp, R);
        hadamard_ref::rotate(tmp, R, R);
        ref(tmp, blk, R);
      }
    } else if (u.paired) {  // q8_0 only: the block's values in order, the scalar reference
      alignas(32) float x[kQK];
      paired_block(u, b, x);
      ref(x, blk, kQK);
    } else if (__builtin_expect((u.scalar >> b) & 1, 0)) {
      ref(u.buf + b * kQK, blk, kQK);
    } else {
      block(b);
    }
  }
}

// f16 rows -> floats, rotated in blocks of R, -> q8_0 / q4_1: front of unit i + 1, then back of unit i.
template <int R, Kind K, bool kPaired = false>
KV_AVX2_INLINE void f16_rot_unit(const std::byte* in, std::byte* out, size_t n) {
  assert(n % R == 0);
  constexpr size_t kBytes = K == Kind::kQ4_1 ? kQ4_1Bytes : kQ8_0Bytes;
  const Rot8 k = rot8(R);
  Unit units[2];
  const size_t nu = (n + kUnit - 1) / kUnit;
  // iteration i: the scales of unit i - 1 and the rotation of unit i (one straight stretch of
  // code), then the back of unit i - 1
  for (size_t i = 0; i <= nu; i++) {
    Unit* prev = i > 0 ? &units[(i - 1) & 1] : nullptr;
    const size_t v0 = i * kUnit, len = n - v0 < size_t{kUnit} ? n - v0 : size_t{kUnit};
    const auto none = [](int) {};
    if (__builtin_expect(prev != nullptr && i < nu && len == kUnit, 1)) {
      if constexpr (R == 128 && K == Kind::kQ4_1) {
        Q41Scales sc(prev);
        unit_rotate<R, K, kPaired>(in + 2 * v0, out + v0 / kQK * kBytes, len, k, &units[i & 1],
                          [&](int g) KV_AVX2_LAMBDA { sc.step(g); });
      } else if constexpr (R == 128 && K == Kind::kQ8_0) {
        Q8Scales<kPaired> sc(prev);
        unit_rotate<R, K, kPaired>(in + 2 * v0, out + v0 / kQK * kBytes, len, k, &units[i & 1],
                          [&](int g) KV_AVX2_LAMBDA { sc.step(g); });
      } else {
        unit_scales<K>(prev);
        unit_rotate<R, K, kPaired>(in + 2 * v0, out + v0 / kQK * kBytes, len, k, &units[i & 1], none);
      }
    } else {
      if (prev != nullptr) unit_scales<K>(prev);
      if (i < nu) unit_rotate<R, K, kPaired>(in + 2 * v0, out + v0 / kQK * kBytes, len, k, &units[i & 1], none);
    }
    if (prev != nullptr) unit_back<R, K>(*prev);
  }
}

template <int R>
KV_AVX2 void f16_rot_q8_0(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  f16_rot_unit<R, Kind::kQ8_0>(in, out, n);
}
template <int R>
KV_AVX2 void f16_rot_q4_1(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  f16_rot_unit<R, Kind::kQ4_1>(in, out, n);
}

// f16 rows -> floats, rotated in blocks of R, -> a 4/5-bit type through its AVX2 quantizer
// (quant, blocks of kBytes): each unit of 256 values is rotated into an L1 buffer in registers
// (rotate_block), then quantized from there. A rotation block with an inf/NaN input (then its
// first rotated value is inf/NaN too, see rotate_block) takes the scalar reference's three steps.
using QuantFn = void (*)(const float* src, std::byte* dst, size_t n);

template <int R, size_t kBytes>
KV_AVX2_INLINE void f16_rot_quant(const std::byte* in, std::byte* out, size_t n, QuantFn quant, QuantFn ref) {
  assert(n % R == 0);
  const Rot8 k = rot8(R);
  alignas(32) float buf[kUnit];
  for (size_t v0 = 0; v0 < n; v0 += kUnit) {
    const size_t len = n - v0 < size_t{kUnit} ? n - v0 : size_t{kUnit};
    bool bad = false;
    for (size_t r = 0; r < len; r += R) {
      float* b = buf + r;
      rotate_block<R>(
          k, [&](int c, __m256* v) KV_AVX2_LAMBDA { load_f16x64(in + 2 * (v0 + r + 64 * c), v); },
          [&](const __m256* v, int a, int bb) KV_AVX2_LAMBDA {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
              _mm256_store_ps(b + a + 8 * i, v[i]);
              _mm256_store_ps(b + bb + 8 * i, v[4 + i]);
            }
          });
      bad |= !std::isfinite(b[0]);
    }
    std::byte* dst = out + v0 / kQK * kBytes;
    if (__builtin_expect(!bad, 1)) {
      quant(buf, dst, len);
      continue;
    }
    for (size_t r = 0; r < len; r += R) {
      if (std::isfinite(buf[r])) {
        quant(buf + r, dst + r / kQK * kBytes, R);
      } else {
        alignas(32) float tmp[R];
        quants::ref::f16_to_f32(in + 2 * (v0 + r), tmp, R);
        hadamard_ref::rotate(tmp, R, R);
        ref(tmp, dst + r / kQK * kBytes, R);
      }
    }
  }
}

template <int R>
KV_AVX2 void f16_rot_q4_0(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  f16_rot_quant<R, kQ4_0Bytes>(in, out, n, q4_0_from_f32_avx2, quants::ref::q4_0_from_f32);
}
template <int R>
KV_AVX2 void f16_rot_q5_0(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  f16_rot_quant<R, kQ5_0Bytes>(in, out, n, q5_0_from_f32_avx2, quants::ref::q5_0_from_f32);
}
template <int R>
KV_AVX2 void f16_rot_q5_1(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  f16_rot_quant<R, kQ5_1Bytes>(in, out, n, q5_1_from_f32_avx2, quants::ref::q5_1_from_f32);
}

// One q8_0 block -> 4 registers of floats (q8_0_to_f32_avx2: float(q) * d); load_q8_0x64: two
// blocks, 8 registers.
KV_AVX2_INLINE void load_q8_0x32(const std::byte* blk, __m256* v) {
  // the scale broadcast as f16, then converted: one vpbroadcastw from memory and one vcvtph2ps
  const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(load_u16(blk))));
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * k));
    v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
  }
}
KV_AVX2_INLINE void load_q8_0x64(const std::byte* in, __m256* v) {
  load_q8_0x32(in, v);
  load_q8_0x32(in + kQ8_0Bytes, v + 4);
}

// q8_0 rows -> floats, rotated in blocks of R, -> f16. Finite scales give finite values, so no
// NaN reaches the f16 conversion (whose only difference from ggml's is NaN); a block with an
// inf/NaN scale takes the scalar reference.
template <int R>
KV_AVX2_INLINE void q8_0_rot_f16_rows(const std::byte* in, std::byte* out, size_t n) {
  assert(n % R == 0);
  const Rot8 k = rot8(R);
  for (size_t b = 0; b < n; b += R) {
    const std::byte* src = in + b / kQK * kQ8_0Bytes;
    std::byte* dst = out + 2 * b;
    bool bad = false;
    for (int q = 0; q < R / static_cast<int>(kQK); q++) bad |= (load_u16(src + q * kQ8_0Bytes) & 0x7c00u) == 0x7c00u;
    if (__builtin_expect(bad, 0)) {
      alignas(32) float tmp[R];
      quants::ref::q8_0_to_f32(src, tmp, R);
      hadamard_ref::rotate(tmp, R, R);
      quants::ref::f16_from_f32(tmp, dst, R);
      continue;
    }
    if constexpr (R == 128) {
      rotate128_quarters<false>(
          k, [&](int q, __m256* v) KV_AVX2_LAMBDA { load_q8_0x32(src + q * kQ8_0Bytes, v); },
          [&](int qb, int j, __m256 x) KV_AVX2_LAMBDA {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * (32 * qb + 8 * j)), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
          });
      continue;
    }
    rotate_block<R>(  // finite scales: finite values
        k, [&](int c, __m256* v) KV_AVX2_LAMBDA { load_q8_0x64(src + 2 * c * kQ8_0Bytes, v); },
        [&](const __m256* v, int a, int bb) KV_AVX2_LAMBDA {
#pragma GCC unroll 4
          for (int i = 0; i < 4; i++) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * (a + 8 * i)), _mm256_cvtps_ph(v[i], _MM_FROUND_TO_NEAREST_INT));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * (bb + 8 * i)),
                             _mm256_cvtps_ph(v[4 + i], _MM_FROUND_TO_NEAREST_INT));
          }
        });
  }
}

template <int R>
KV_AVX2 void q8_0_rot_f16(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  q8_0_rot_f16_rows<R>(in, out, n);
}

// The q8_0 rows compiled for the avx512 level: the same code with AVX-512VL's 32 vector registers
// and EVEX encodings available to the compiler (256-bit vectors: on Zen 4 a 512-bit operation
// takes the pipes twice, so the wider registers of x86_avx512.cc's kernels buy no throughput,
// while their lane-crossing stages cost more).
template <int R>
KV_AVX512 void f16_rot_q8_0_vl(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  f16_rot_unit<R, Kind::kQ8_0, R == 128>(in, out, n);
}
template <int R>
KV_AVX512 void q8_0_rot_f16_vl(const std::byte* in, std::byte* out, size_t n, uint32_t) {
  q8_0_rot_f16_rows<R>(in, out, n);
}

}  // namespace

// Measured on Zen 4 against x86_avx512.cc's kernels (kernel alone, alternating): f16 -> q8_0
// +7% at n_rot 64, +8% at 128 (paired), +23% at 256; q8_0 -> f16 +7% at n_rot 64, but 7% slower
// at 128 and 15% at 256, which stay x86_avx512.cc's.
FusedRowFn find_fused_avx2_vl(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot) {
  if (!rotate) return nullptr;
  if (src == GgmlType::kF16 && dst == GgmlType::kQ8_0) {
    return n_rot == 64 ? f16_rot_q8_0_vl<64> : n_rot == 128 ? f16_rot_q8_0_vl<128> : n_rot == 256 ? f16_rot_q8_0_vl<256> : nullptr;
  }
  if (src == GgmlType::kQ8_0 && dst == GgmlType::kF16 && n_rot == 64) return q8_0_rot_f16_vl<64>;
  return nullptr;
}

KV_AVX2 void roundf_i32_avx2(const float* x, int32_t* out, size_t n) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), roundf_to_i32_8(_mm256_loadu_ps(x + i)));
  }
}

FusedRowFn find_fused_avx2(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot) {
  if (!rotate || (n_rot != 64 && n_rot != 128 && n_rot != 256)) return nullptr;
  if (src == GgmlType::kF16 && dst == GgmlType::kQ8_0) {
    return n_rot == 64 ? f16_rot_q8_0<64> : n_rot == 128 ? f16_rot_q8_0<128> : f16_rot_q8_0<256>;
  }
  if (src == GgmlType::kQ8_0 && dst == GgmlType::kF16) {
    return n_rot == 64 ? q8_0_rot_f16<64> : n_rot == 128 ? q8_0_rot_f16<128> : q8_0_rot_f16<256>;
  }
  if (src != GgmlType::kF16) return nullptr;
  switch (dst) {
    case GgmlType::kQ4_0: return n_rot == 64 ? f16_rot_q4_0<64> : n_rot == 128 ? f16_rot_q4_0<128> : f16_rot_q4_0<256>;
    case GgmlType::kQ4_1: return n_rot == 64 ? f16_rot_q4_1<64> : n_rot == 128 ? f16_rot_q4_1<128> : f16_rot_q4_1<256>;
    case GgmlType::kQ5_0: return n_rot == 64 ? f16_rot_q5_0<64> : n_rot == 128 ? f16_rot_q5_0<128> : f16_rot_q5_0<256>;
    case GgmlType::kQ5_1: return n_rot == 64 ? f16_rot_q5_1<64> : n_rot == 128 ? f16_rot_q5_1<128> : f16_rot_q5_1<256>;
    default: return nullptr;
  }
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
