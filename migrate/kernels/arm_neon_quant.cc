#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// aarch64 NEON quantizers, simd::Level::kNeon: q8_0, q4_0, q4_1, q5_0, q5_1 from f32 (the
// quantize_row_*_ref of ggml-quants.c). See arm_common.h for why each gives the reference's bytes.
// Per block: the statistic (abs-max, min/max) across the 32 lanes, the scalar scale arithmetic
// of the reference, then the per-value multiply / add / truncation in vectors.

#include "migrate/kernels/arm_common.h"

#ifdef KVSNAP_SIMD_NEON

#include <cassert>
#include <cfloat>
#include <cmath>

namespace kvsnap::simd::arm {

using half::f32_to_fp16;
using quants::kQ4_0Bytes;
using quants::kQ4_1Bytes;
using quants::kQ5_0Bytes;
using quants::kQ5_1Bytes;
using quants::kQ8_0Bytes;

namespace {

// The reference's (int8_t)(v * id + bias) for 32 values, (v - min) * id + bias when `sub`.
template <bool kSub>
void truncate32(const Block32& b, float32x4_t min, float32x4_t id, float32x4_t bias, int8x16_t out[2]) {
  int32x4_t c[8];
  for (int k = 0; k < 8; k++) {
    const float32x4_t v = kSub ? vsubq_f32(b.v[k], min) : b.v[k];
    c[k] = cvtt_i32x4(vaddq_f32(vmulq_f32(v, id), bias));
  }
  out[0] = low_bytes16(c[0], c[1], c[2], c[3]);
  out[1] = low_bytes16(c[4], c[5], c[6], c[7]);
}

// q4_0 / q5_0's max: the signed value of the first element whose |x| equals amax (> 0), what
// `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` (strict: the first one wins) keeps.
float first_of_amax(const float* x, const Block32& b, float amax) {
  const float32x4_t m = vdupq_n_f32(amax);
  uint16x8_t eq[4];
  for (int k = 0; k < 4; k++) {
    eq[k] = vcombine_u16(vmovn_u32(vceqq_f32(vabsq_f32(b.v[2 * k]), m)), vmovn_u32(vceqq_f32(vabsq_f32(b.v[2 * k + 1]), m)));
  }
  for (int k = 0; k < 4; k++) {
    // 8 lanes of 0xffff / 0 -> 8 bytes of a 64-bit word: the first set byte is the first match
    const uint64_t bits = vget_lane_u64(vreinterpret_u64_u8(vshrn_n_u16(eq[k], 4)), 0);
    if (bits != 0) return x[8 * k + __builtin_ctzll(bits) / 8];
  }
  return 0.0f;  // not reached: amax is one of the |x|
}

// The block's min and max as the reference's `if (v < min) min = v; if (v > max) max = v;`
// from FLT_MAX / -FLT_MAX keeps them; false when the vector min/max could differ from that (a
// zero of either sign, where the first one seen wins, or an infinite extreme, where the
// reference may keep FLT_MAX): then the block goes to the scalar path.
bool min_max32(const Block32& b, float* min, float* max) {
  float32x4_t lo = b.v[0], hi = b.v[0];
  for (int k = 1; k < 8; k++) {
    lo = vminq_f32(lo, b.v[k]);
    hi = vmaxq_f32(hi, b.v[k]);
  }
  *min = vminvq_f32(lo);
  *max = vmaxvq_f32(hi);
  return *min != 0.0f && *max != 0.0f && std::isfinite(*min) && std::isfinite(*max);
}

// The scale step of q4_0 / q5_0: max = the first value of largest |x|, d = max / div stored as
// f16; returns id = 1/d (0 for d = 0).
float signed_max_scale(const float* x, const Block32& b, float div, std::byte* blk) {
  const float amax = absmax32(b);
  const float max = amax > 0.0f ? first_of_amax(x, b, amax) : 0.0f;
  const float d = max / div;
  store_u16(blk, f32_to_fp16(d));
  return d != 0.0f ? 1.0f / d : 0.0f;
}

// The scale step of q4_1 / q5_1: d = (max - min) / div, d and min stored as f16; returns 1/d.
float min_max_scale(float min, float max, float div, std::byte* blk) {
  const float d = (max - min) / div;
  store_u16(blk, f32_to_fp16(d));
  store_u16(blk + 2, f32_to_fp16(min));
  return d != 0.0f ? 1.0f / d : 0.0f;
}

}  // namespace

// ---- q8_0: d = amax / 127, id = 1/d, q = (int8)roundf(x * id) -------------------------------

void q8_0_from_f32_neon(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ8_0Bytes;
    const Block32 b = load_block32(x);
    if (__builtin_expect(any_nan32(b), 0)) {
      quants::ref::q8_0_from_f32(x, blk, kQK);
      continue;
    }
    const float amax = absmax32(b);
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(blk, f32_to_fp16(d));
    const float32x4_t vid = vdupq_n_f32(id);
    int32x4_t q[8];
    for (int k = 0; k < 8; k++) q[k] = cvtt_i32x4(vrndaq_f32(vmulq_f32(b.v[k], vid)));  // FRINTA == roundf
    vst1q_s8(reinterpret_cast<int8_t*>(blk + 2), low_bytes16(q[0], q[1], q[2], q[3]));
    vst1q_s8(reinterpret_cast<int8_t*>(blk + 18), low_bytes16(q[4], q[5], q[6], q[7]));
  }
}

// ---- q4_0: d = max / -8, q = MIN(15, (int8)(x * id + 8.5f)), two values per byte -------------

void q4_0_from_f32_neon(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ4_0Bytes;
    const Block32 b = load_block32(x);
    if (__builtin_expect(any_nan32(b), 0)) {
      quants::ref::q4_0_from_f32(x, blk, kQK);
      continue;
    }
    const float id = signed_max_scale(x, b, -8, blk);
    int8x16_t c[2];
    truncate32<false>(b, vdupq_n_f32(0.0f), vdupq_n_f32(id), vdupq_n_f32(8.5f), c);
    const uint8x16_t lo = vreinterpretq_u8_s8(vminq_s8(c[0], vdupq_n_s8(15)));  // x[0..15]
    const uint8x16_t hi = vreinterpretq_u8_s8(vminq_s8(c[1], vdupq_n_s8(15)));  // x[16..31]
    vst1q_u8(u8(blk) + 2, vorrq_u8(lo, vshlq_n_u8(hi, 4)));                        // xi0 | (xi1 << 4)
  }
}

// ---- q4_1: d = (max - min) / 15, q = MIN(15, (int8)((x - min) * id + 0.5f)) -------------------

void q4_1_from_f32_neon(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ4_1Bytes;
    const Block32 b = load_block32(x);
    float min, max;
    if (__builtin_expect(any_nan32(b) || !min_max32(b, &min, &max), 0)) {
      quants::ref::q4_1_from_f32(x, blk, kQK);
      continue;
    }
    const float id = min_max_scale(min, max, (1 << 4) - 1, blk);
    int8x16_t c[2];
    truncate32<true>(b, vdupq_n_f32(min), vdupq_n_f32(id), vdupq_n_f32(0.5f), c);
    const uint8x16_t lo = vreinterpretq_u8_s8(vminq_s8(c[0], vdupq_n_s8(15)));
    const uint8x16_t hi = vreinterpretq_u8_s8(vminq_s8(c[1], vdupq_n_s8(15)));
    vst1q_u8(u8(blk) + 4, vorrq_u8(lo, vshlq_n_u8(hi, 4)));
  }
}

// ---- q5_0: d = max / -16, q = MIN(31, (int8)(x * id + 16.5f)), bit 4 in qh ------------------

namespace {
// The q5 layout: low nibbles two per byte at qs, bit 4 of value j at bit j of qh.
void store_q5(uint8x16_t lo, uint8x16_t hi, std::byte* qh_at, uint8_t* qs) {
  const uint8x16_t m4 = vdupq_n_u8(0x0f);
  vst1q_u8(qs, vorrq_u8(vandq_u8(lo, m4), vshlq_n_u8(hi, 4)));  // (xi0 & 0x0F) | ((xi1 & 0x0F) << 4)
  const uint32_t qh = bit4_mask16(lo) | (bit4_mask16(hi) << 16);
  std::memcpy(qh_at, &qh, sizeof(qh));
}
}  // namespace

void q5_0_from_f32_neon(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ5_0Bytes;
    const Block32 b = load_block32(x);
    if (__builtin_expect(any_nan32(b), 0)) {
      quants::ref::q5_0_from_f32(x, blk, kQK);
      continue;
    }
    const float id = signed_max_scale(x, b, -16, blk);
    int8x16_t c[2];
    truncate32<false>(b, vdupq_n_f32(0.0f), vdupq_n_f32(id), vdupq_n_f32(16.5f), c);
    store_q5(vreinterpretq_u8_s8(vminq_s8(c[0], vdupq_n_s8(31))), vreinterpretq_u8_s8(vminq_s8(c[1], vdupq_n_s8(31))),
             blk + 2, u8(blk) + 6);
  }
}

// ---- q5_1: d = (max - min) / 31, q = (uint8)((x - min) * id + 0.5f), bit 4 in qh -------------

void q5_1_from_f32_neon(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ5_1Bytes;
    const Block32 b = load_block32(x);
    float min, max;
    if (__builtin_expect(any_nan32(b) || !min_max32(b, &min, &max), 0)) {
      quants::ref::q5_1_from_f32(x, blk, kQK);
      continue;
    }
    const float id = min_max_scale(min, max, (1 << 5) - 1, blk);
    int8x16_t c[2];
    truncate32<true>(b, vdupq_n_f32(min), vdupq_n_f32(id), vdupq_n_f32(0.5f), c);
    store_q5(vreinterpretq_u8_s8(c[0]), vreinterpretq_u8_s8(c[1]), blk + 4, u8(blk) + 8);
  }
}

}  // namespace kvsnap::simd::arm

#endif  // KVSNAP_SIMD_NEON
