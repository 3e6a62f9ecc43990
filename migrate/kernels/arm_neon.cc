#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// aarch64 NEON kernels, simd::Level::kNeon: f16/bf16, the dequantizers, the Hadamard rotation.
// See arm_common.h for why each gives the reference's bytes.

#include "migrate/kernels/arm_common.h"

#ifdef KVSNAP_SIMD_NEON

#include <cassert>
#include <cmath>

namespace kvsnap::simd::arm {

using quants::kIQ4_NLBytes;
using quants::kIQ4NLValues;
using quants::kQ4_0Bytes;
using quants::kQ4_1Bytes;
using quants::kQ5_0Bytes;
using quants::kQ5_1Bytes;
using quants::kQ8_0Bytes;

// =============================================================================================
// f16 / bf16
// =============================================================================================

void f16_to_f32_neon(const std::byte* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint16_t h[4];
    std::memcpy(h, src + 2 * i, 8);
    vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h))));
  }
  if (i < n) quants::ref::f16_to_f32(src + 2 * i, dst + i, n - i);
}

void f16_from_f32_neon(const float* src, std::byte* dst, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t x = vld1q_f32(src + i);
    uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(x));
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(x, x));
    if (__builtin_expect(vmaxvq_u32(nan) != 0, 0)) {
      // ggml: every NaN becomes 0x7E00 with the input's sign
      const uint32x4_t bits = vreinterpretq_u32_f32(x);
      const uint32x4_t fix = vorrq_u32(vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(0x8000)), vdupq_n_u32(0x7E00));
      h = vbsl_u16(vmovn_u32(nan), vmovn_u32(fix), h);
    }
    uint16_t out[4];
    vst1_u16(out, h);
    std::memcpy(dst + 2 * i, out, 8);
  }
  if (i < n) quants::ref::f16_from_f32(src + i, dst + 2 * i, n - i);
}

void bf16_to_f32_neon(const std::byte* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint16x8_t h = vld1q_u16(reinterpret_cast<const uint16_t*>(src + 2 * i));
    vst1q_u32(reinterpret_cast<uint32_t*>(dst + i), vshll_n_u16(vget_low_u16(h), 16));
    vst1q_u32(reinterpret_cast<uint32_t*>(dst + i + 4), vshll_n_u16(vget_high_u16(h), 16));
  }
  if (i < n) quants::ref::bf16_to_f32(src + 2 * i, dst + i, n - i);
}

// ggml_compute_fp32_to_bf16: NaN -> (i >> 16) | 64, else (i + 0x7fff + ((i >> 16) & 1)) >> 16.
void bf16_from_f32_neon(const float* src, std::byte* dst, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint32x4_t w = vld1q_u32(reinterpret_cast<const uint32_t*>(src + i));
    const uint32x4_t nan = vcgtq_u32(vandq_u32(w, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    const uint32x4_t hi = vshrq_n_u32(w, 16);
    const uint32x4_t r_nan = vorrq_u32(hi, vdupq_n_u32(64));
    const uint32x4_t bias = vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(hi, vdupq_n_u32(1)));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(w, bias), 16);
    const uint16x4_t h = vmovn_u32(vbslq_u32(nan, r_nan, r));
    uint16_t out[4];
    vst1_u16(out, h);
    std::memcpy(dst + 2 * i, out, 8);
  }
  if (i < n) quants::ref::bf16_from_f32(src + i, dst + 2 * i, n - i);
}

// =============================================================================================
// dequantization (to_f32): float(q) * d (+ m), the reference's operations per value
// =============================================================================================

void q8_0_to_f32_neon(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ8_0Bytes;
    const float32x4_t d = vdupq_n_f32(half::fp16_to_f32(load_u16(blk)));
    store_scaled16(vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2)), d, y);
    store_scaled16(vld1q_s8(reinterpret_cast<const int8_t*>(blk + 18)), d, y + 16);
  }
}

void q4_0_to_f32_neon(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  const uint8x16_t m4 = vdupq_n_u8(0x0f);
  const int8x16_t eight = vdupq_n_s8(8);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ4_0Bytes;
    const float32x4_t d = vdupq_n_f32(half::fp16_to_f32(load_u16(blk)));
    const uint8x16_t qs = vld1q_u8(u8(blk) + 2);
    store_scaled16(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(qs, m4)), eight), d, y);        // x[0..15]
    store_scaled16(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(qs, 4)), eight), d, y + 16);  // x[16..31]
  }
}

void q4_1_to_f32_neon(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  const uint8x16_t m4 = vdupq_n_u8(0x0f);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ4_1Bytes;
    const float32x4_t d = vdupq_n_f32(half::fp16_to_f32(load_u16(blk)));
    const float32x4_t m = vdupq_n_f32(half::fp16_to_f32(load_u16(blk + 2)));
    const uint8x16_t qs = vld1q_u8(u8(blk) + 4);
    store_scaled_offset16(vreinterpretq_s8_u8(vandq_u8(qs, m4)), d, m, y);
    store_scaled_offset16(vreinterpretq_s8_u8(vshrq_n_u8(qs, 4)), d, m, y + 16);
  }
}

// q5: value j = (nibble | bit j of qh << 4), bits 16..31 of qh for the high nibbles; lo holds
// values 0..15, hi 16..31 (each 0..31).
inline void q5_values(const std::byte* qh_at, const uint8_t* qs_at, uint8x16_t* lo, uint8x16_t* hi) {
  uint32_t qh;
  std::memcpy(&qh, qh_at, 4);
  const uint8x16_t qs = vld1q_u8(qs_at);
  *lo = vorrq_u8(vandq_u8(qs, vdupq_n_u8(0x0f)), bits_to_0x10(qh & 0xffff));
  *hi = vorrq_u8(vshrq_n_u8(qs, 4), bits_to_0x10(qh >> 16));
}

void q5_0_to_f32_neon(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  const int8x16_t sixteen = vdupq_n_s8(16);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ5_0Bytes;
    const float32x4_t d = vdupq_n_f32(half::fp16_to_f32(load_u16(blk)));
    uint8x16_t lo, hi;
    q5_values(blk + 2, u8(blk) + 6, &lo, &hi);
    store_scaled16(vsubq_s8(vreinterpretq_s8_u8(lo), sixteen), d, y);
    store_scaled16(vsubq_s8(vreinterpretq_s8_u8(hi), sixteen), d, y + 16);
  }
}

void q5_1_to_f32_neon(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ5_1Bytes;
    const float32x4_t d = vdupq_n_f32(half::fp16_to_f32(load_u16(blk)));
    const float32x4_t m = vdupq_n_f32(half::fp16_to_f32(load_u16(blk + 2)));
    uint8x16_t lo, hi;
    q5_values(blk + 4, u8(blk) + 8, &lo, &hi);
    store_scaled_offset16(vreinterpretq_s8_u8(lo), d, m, y);  // 0..31: fits int8
    store_scaled_offset16(vreinterpretq_s8_u8(hi), d, m, y + 16);
  }
}

// y = d * kvalues_iq4nl[nibble]
void iq4_nl_to_f32_neon(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  const int8x16_t table = vld1q_s8(kIQ4NLValues);
  const uint8x16_t m4 = vdupq_n_u8(0x0f);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kIQ4_NLBytes;
    const float32x4_t d = vdupq_n_f32(half::fp16_to_f32(load_u16(blk)));
    const uint8x16_t qs = vld1q_u8(u8(blk) + 2);
    store_scaled16(vqtbl1q_s8(table, vandq_u8(qs, m4)), d, y);
    store_scaled16(vqtbl1q_s8(table, vshrq_n_u8(qs, 4)), d, y + 16);
  }
}

// =============================================================================================
// Walsh-Hadamard rotation (ggml_compute_forward_fwht): x * (1/sqrt(n)), then for len = 1, 2, 4,
// ...: (u, v) -> (u + v, u - v) on the pairs (i + j, i + len + j). Same pairs, same stage order,
// same roundings as hadamard_ref::rotate (u + v == v + u bit for bit without NaN inputs).
// =============================================================================================

namespace {

// The stages len = 1 and 2 inside one register of lanes a0..a3.
inline float32x4_t fwht_in4(float32x4_t a) {
  static const uint32_t kLow1[4] = {~0u, 0, ~0u, 0}, kLow2[4] = {~0u, ~0u, 0, 0};
  // len 1: partner [a1 a0 a3 a2]; lane 0: a0 + a1, lane 1: a0 - a1 (partner - a)
  float32x4_t p = vrev64q_f32(a);
  a = vbslq_f32(vld1q_u32(kLow1), vaddq_f32(a, p), vsubq_f32(p, a));
  // len 2: partner [a2 a3 a0 a1]; lanes 0, 1: a + partner, lanes 2, 3: partner - a
  p = vextq_f32(a, a, 2);
  return vbslq_f32(vld1q_u32(kLow2), vaddq_f32(a, p), vsubq_f32(p, a));
}

// The stages across registers: register distance LEN, 2 LEN, ... < NV.
template <int NV, int LEN>
inline void fwht_across4(float32x4_t* v) {
  if constexpr (LEN < NV) {
    for (int i = 0; i < NV; i++) {
      if ((i & LEN) == 0) {
        const float32x4_t u = v[i], w = v[i + LEN];
        v[i] = vaddq_f32(u, w);
        v[i + LEN] = vsubq_f32(u, w);
      }
    }
    fwht_across4<NV, 2 * LEN>(v);
  }
}

bool has_nan(const float* r, uint32_t n) {
  uint32x4_t ok = vdupq_n_u32(~0u);
  for (uint32_t i = 0; i < n; i += 4) {
    const float32x4_t x = vld1q_f32(r + i);
    ok = vandq_u32(ok, vceqq_f32(x, x));
  }
  return vminvq_u32(ok) == 0;
}

// One block of NV registers (n_rot = 4 NV values) in registers. A block holding a NaN is left to
// the scalar loop (false): which of two NaNs survives depends on the operand order.
template <int NV>
bool fwht_block_neon(float* r, float32x4_t scale) {
  if (has_nan(r, 4 * NV)) return false;
  float32x4_t v[NV];
  for (int i = 0; i < NV; i++) v[i] = fwht_in4(vmulq_f32(vld1q_f32(r + 4 * i), scale));
  fwht_across4<NV, 1>(v);
  for (int i = 0; i < NV; i++) vst1q_f32(r + 4 * i, v[i]);
  return true;
}

// Any n_rot >= 4: the in-register stages per vector, then the wider stages through memory.
bool fwht_generic_neon(float* r, uint32_t n_rot, float32x4_t scale) {
  if (has_nan(r, n_rot)) return false;
  for (uint32_t i = 0; i < n_rot; i += 4) vst1q_f32(r + i, fwht_in4(vmulq_f32(vld1q_f32(r + i), scale)));
  for (uint32_t len = 4; len < n_rot; len <<= 1) {
    for (uint32_t i = 0; i < n_rot; i += 2 * len) {
      for (uint32_t j = 0; j < len; j += 4) {
        const float32x4_t u = vld1q_f32(r + i + j), w = vld1q_f32(r + i + len + j);
        vst1q_f32(r + i + j, vaddq_f32(u, w));
        vst1q_f32(r + i + len + j, vsubq_f32(u, w));
      }
    }
  }
  return true;
}

}  // namespace

void hadamard_neon(float* x, size_t n, uint32_t n_rot) {
  assert(n_rot >= 4 && (n_rot & (n_rot - 1)) == 0 && n % n_rot == 0);
  const float32x4_t scale = vdupq_n_f32(1.0f / std::sqrt(static_cast<float>(n_rot)));  // as the scalar code
  for (size_t b = 0; b < n; b += n_rot) {
    float* r = x + b;
    bool done;
    switch (n_rot) {
      case 4: done = fwht_block_neon<1>(r, scale); break;
      case 8: done = fwht_block_neon<2>(r, scale); break;
      case 16: done = fwht_block_neon<4>(r, scale); break;
      case 32: done = fwht_block_neon<8>(r, scale); break;
      case 64: done = fwht_block_neon<16>(r, scale); break;
      default: done = fwht_generic_neon(r, n_rot, scale); break;
    }
    if (!done) hadamard_ref::rotate(r, n_rot, n_rot);
  }
}

}  // namespace kvsnap::simd::arm

#endif  // KVSNAP_SIMD_NEON
