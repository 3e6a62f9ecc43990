// Internal to migrate/kernels/: what the aarch64 NEON kernel files share. Advanced SIMD is part of
// every aarch64 CPU, so these files need no target attributes or -m flags; they compile to nothing
// on other architectures (KVSNAP_SIMD_NEON, migrate/simd_kernels.h). -ffp-contract=off
// (CMakeLists.txt) plus migrate/fp_strict.h keep GCC from fusing the vector multiplies and adds
// into FMLA: arm_neon.h defines vmulq_f32/vaddq_f32 as plain vector operators, and aarch64 GCC
// contracts by default.
//
// The files (declarations in migrate/simd_kernels.h, simd::Level::kNeon):
//   arm_neon.cc        f16/bf16, the dequantizers, the Hadamard rotation
//   arm_neon_quant.cc  the quantizers q8_0, q4_0, q4_1, q5_0, q5_1
//   arm_neon_iq4_nl.cc the iq4_nl quantizer (lane = block; see its header)
//   arm_neon_mlx.cc    MLX's affine quantize / dequantize rows (see its header)
//   arm_neon_requant.cc ExactRequantizer's quick search (lane = block; see its header)
//
// Why each kernel gives the reference's bytes (it does the reference's float operations, lane by
// lane, in its order; nothing is fused or reassociated):
//   f16 <-> f32   FCVT f16->f32 is exact and quiets a NaN keeping its payload, like ggml's
//                 fp16_to_fp32; FCVT f32->f16 rounds to nearest even (FPCR's default mode;
//                 subnormals are kept, FZ being off on Linux) and so equals ggml's bit trick for
//                 every non-NaN input; NaN lanes are patched to 0x7E00 | sign.
//   bf16          integer operations only, the reference's formulas.
//   rotation      the same u+v / u-v on the same pairs, stage by stage (len = 1, 2 within a
//                 register, by reversing / rotating lanes; wider stages across registers), after
//                 the same scaling multiply. Blocks holding a NaN take the scalar loop (which NaN
//                 survives when two meet depends on operand order).
//   quantizers    the abs-max / min / max of a block are order-free without NaN (blocks holding a
//                 NaN take the scalar path), the scale and its inverse are the same scalar IEEE
//                 divisions, every value goes through the same multiply / add; roundf is FRINTA
//                 (round half away from zero, exactly roundf); float -> int is cvtt_i32x4 below:
//                 the x86-64 truncation the reference transcribes (INT32_MIN for NaN and
//                 |x| >= 2^31, where FCVTZS would saturate or give 0), then the low byte.
//   dequantizers  float(q) * d (+ m), the reference's one multiply (and add) per value.
// Each is compared with the scalar reference byte for byte by kvsnap-simd-check under
// qemu-aarch64 (tests/cross/run.sh), and through the public codecs by tests/migrate.
#pragma once

#include "migrate/simd_kernels.h"

#ifdef KVSNAP_SIMD_NEON

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "migrate/half.h"
#include "migrate/quants.h"

namespace kvsnap::simd::arm {

using half::load_u16;
using half::store_u16;
using quants::kQK;

inline uint8_t* u8(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }
inline const uint8_t* u8(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }

// The 32 values of a block in 8 registers.
struct Block32 {
  float32x4_t v[8];
};
inline Block32 load_block32(const float* x) {
  Block32 b;
  for (int k = 0; k < 8; k++) b.v[k] = vld1q_f32(x + 4 * k);
  return b;
}

// True when any of the 32 values is NaN.
inline bool any_nan32(const Block32& b) {
  uint32x4_t ok = vceqq_f32(b.v[0], b.v[0]);
  for (int k = 1; k < 8; k++) ok = vandq_u32(ok, vceqq_f32(b.v[k], b.v[k]));
  return vminvq_u32(ok) == 0;
}

// The largest |x| of a block (no NaN: max is order-free).
inline float absmax32(const Block32& b) {
  float32x4_t m = vabsq_f32(b.v[0]);
  for (int k = 1; k < 8; k++) m = vmaxq_f32(m, vabsq_f32(b.v[k]));
  return vmaxvq_f32(m);
}

// (int32_t)x as the reference executes it on x86-64 (quants.cc cvtt_i32): truncation toward
// zero, INT32_MIN for NaN and out-of-range values. FCVTZS alone saturates and maps NaN to 0.
inline int32x4_t cvtt_i32x4(float32x4_t x) {
  const uint32x4_t in_range = vcaltq_f32(x, vdupq_n_f32(2147483648.0f));  // |x| < 2^31, false for NaN
  return vbslq_s32(in_range, vcvtq_s32_f32(x), vdupq_n_s32(INT32_MIN));
}

// The low byte of each of 4 x 4 int32 lanes, in order: the reference's (int8_t) casts.
inline int8x16_t low_bytes16(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d) {
  const int16x8_t ab = vcombine_s16(vmovn_s32(a), vmovn_s32(b));
  const int16x8_t cd = vcombine_s16(vmovn_s32(c), vmovn_s32(d));
  return vcombine_s8(vmovn_s16(ab), vmovn_s16(cd));
}

// Bit j (j < 16) set when bit 4 of byte j of b is: the q5 "high bit" field of 16 values.
inline uint32_t bit4_mask16(uint8x16_t b) {
  static const uint8_t kWeights[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t set = vandq_u8(vtstq_u8(b, vdupq_n_u8(0x10)), vld1q_u8(kWeights));
  return static_cast<uint32_t>(vaddv_u8(vget_low_u8(set))) | (static_cast<uint32_t>(vaddv_u8(vget_high_u8(set))) << 8);
}

// 16 bytes, byte j = 0x10 when bit j of bits (16 bits) is set, else 0: q5's high bits as a value.
inline uint8x16_t bits_to_0x10(uint32_t bits) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t bytes = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)), vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  return vandq_u8(vtstq_u8(bytes, vld1q_u8(kBit)), vdupq_n_u8(0x10));
}

// 16 int8 values -> 4 x 4 floats, each times d: the reference's float(q) * d.
inline void store_scaled16(int8x16_t q, float32x4_t d, float* y) {
  const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
  vst1q_f32(y + 0, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
  vst1q_f32(y + 4, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d));
  vst1q_f32(y + 8, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
  vst1q_f32(y + 12, vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d));
}

// The same, then + m: the reference's float(q) * d + m (two roundings: no FMLA here).
inline void store_scaled_offset16(int8x16_t q, float32x4_t d, float32x4_t m, float* y) {
  const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
  vst1q_f32(y + 0, vaddq_f32(vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d), m));
  vst1q_f32(y + 4, vaddq_f32(vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), d), m));
  vst1q_f32(y + 8, vaddq_f32(vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d), m));
  vst1q_f32(y + 12, vaddq_f32(vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), d), m));
}

// best_index_int8(16, kvalues_iq4nl, x) per lane, and kvalues_iq4nl[index] as a float (the iq4_nl
// quantizer, arm_neon_iq4_nl.cc, and the requantizer's quick search, arm_neon_requant.cc).
inline void iq4_index4(float32x4_t x, uint32x4_t* idx, float32x4_t* q) {
  float32x4_t lo = vdupq_n_f32(quants::kIQ4NLValues[0]), hi = vdupq_n_f32(quants::kIQ4NLValues[15]);
  uint32x4_t below = vdupq_n_u32(0);  // mu - 1: how many of val[1..14] are <= x
  for (int k = 1; k < 15; k++) {
    const float32x4_t vk = vdupq_n_f32(quants::kIQ4NLValues[k]);
    const uint32x4_t ge = vcgeq_f32(x, vk);
    lo = vbslq_f32(ge, vk, lo);
    below = vsubq_u32(below, ge);  // ge is all ones (-1) or 0
  }
  for (int k = 14; k >= 1; k--) {
    const float32x4_t vk = vdupq_n_f32(quants::kIQ4NLValues[k]);
    hi = vbslq_f32(vcltq_f32(x, vk), vk, hi);  // the smallest val[k] above x
  }
  const uint32x4_t take_lo = vcltq_f32(vsubq_f32(x, lo), vsubq_f32(hi, x));
  // NaN: the binary search ends at mu = 15 and the comparison is false: index 15
  const uint32x4_t nan = vmvnq_u32(vceqq_f32(x, x));
  *idx = vbslq_u32(nan, vdupq_n_u32(15), vaddq_u32(below, vandq_u32(vmvnq_u32(take_lo), vdupq_n_u32(1))));
  *q = vbslq_f32(nan, vdupq_n_f32(quants::kIQ4NLValues[15]), vbslq_f32(take_lo, lo, hi));
}

}  // namespace kvsnap::simd::arm

#endif  // KVSNAP_SIMD_NEON
