#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// aarch64 NEON: MLX's affine quantization (migrate/mlx_affine.h), the same bytes and floats as
// the scalar code there (and as x86_avx2_mlx.cc), 4 values per vector:
// - quantize: the group's minimum and maximum are lane-wise `acc < v ? v : acc` / `v < acc ? v :
//   acc` (compare + select: std::max/std::min's expressions, so a NaN is skipped as the scalar
//   loop skips it; FMAX/FMIN would return it), reduced across lanes by mlx_affine_min_max; with
//   no NaN left they are order-free, and the sign of a zero extreme never reaches the output (a
//   zero edge gives q0 = 0 either way). Scale and bias come from the scalar mlx_affine_scale_bias.
//   Each value: (w - bias) / scale (FSUB, FDIV: IEEE, as the scalar ones), rint (FRINTN, half
//   to even) or, for the GPU rule, roundf (FRINTA, half away from zero), the clamp to [0, 2^bits
//   - 1] by FMAX/FMIN, which keep a NaN, and FCVTZU, which gives it code 0 (what the scalar code
//   writes); the other lanes are integral and in range there, so the conversion is exact.
// - pack/unpack: 4 bits by VLD2/VST2 and shift-insert, 8 bits a copy, 2/3/5/6 bits 16 codes a
//   step with the tables of mlx_pack.h (shifts merge a run of 8 codes into a 64-bit lane, TBL
//   keeps its `bits` bytes; TBL spreads them back to 16-bit lanes, USHL by -shift[j]).
// - dequantize: T(T(code * scale) + bias) per value, the rounding to T by FCVT to f16 and back
//   (round to nearest even, equal to ggml's rounding for non-NaN: arm_common.h) or the
//   integer round-to-nearest-even (bf16); a group whose scale or bias is not finite goes through
//   the scalar code (otherwise no NaN can appear: code * scale and the sum are finite or an
//   infinity of one sign).
// kvsnap-simd-check compares all of it with the scalar code under qemu-aarch64 (tests/cross/run.sh).

#include "migrate/kernels/arm_common.h"
#include "migrate/kernels/mlx_pack.h"

#ifdef KVSNAP_SIMD_NEON

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace kvsnap::simd::arm {
namespace {

using mlx_pack::kStreamSlack;
using mlx_pack::kStreamTables;

// 2, 3, 5, 6 bits: codes c[0..n) (n a multiple of 16) as the bit stream, 16 codes (2 * bits
// bytes) a step; writes up to kStreamSlack bytes past n * bits / 8.
void pack_stream(const uint8_t* c, int n, int bits, uint8_t* out) {
  const uint8x16_t gather = vld1q_u8(kStreamTables[bits].gather);
  const int16x8_t up1 = vdupq_n_s16(int16_t(bits));
  const int32x4_t up2 = vdupq_n_s32(2 * bits);
  const int64x2_t up4 = vdupq_n_s64(4 * bits);
  for (int i = 0; i < n; i += 16, out += 2 * bits) {
    // code pairs, then pairs of pairs, then runs of 8, each at bit (index * bits) of its lane
    const uint16x8_t h = vreinterpretq_u16_u8(vld1q_u8(c + i));
    const uint32x4_t w = vreinterpretq_u32_u16(vorrq_u16(vandq_u16(h, vdupq_n_u16(0xFF)), vshlq_u16(vshrq_n_u16(h, 8), up1)));
    const uint64x2_t d = vreinterpretq_u64_u32(vorrq_u32(vandq_u32(w, vdupq_n_u32(0xFFFF)), vshlq_u32(vshrq_n_u32(w, 16), up2)));
    const uint64x2_t r = vorrq_u64(vandq_u64(d, vdupq_n_u64(0xFFFFFFFF)), vshlq_u64(vshrq_n_u64(d, 32), up4));
    vst1q_u8(out, vqtbl1q_u8(vreinterpretq_u8_u64(r), gather));
  }
}

// The inverse, 16 codes a step; reads up to kStreamSlack bytes past n * bits / 8.
void unpack_stream(const uint8_t* in, int n, int bits, uint8_t* c) {
  const mlx_pack::StreamTables& t = kStreamTables[bits];
  const uint8x16_t spread = vld1q_u8(t.spread);
  const int16x8_t down = vnegq_s16(vld1q_s16(t.shift));
  const uint16x8_t mask = vdupq_n_u16(uint16_t((1 << bits) - 1));
  auto eight = [&](const uint8_t* run) {  // the 8 codes of the run at `run`
    const uint16x8_t w = vreinterpretq_u16_u8(vqtbl1q_u8(vld1q_u8(run), spread));
    return vmovn_u16(vandq_u16(vshlq_u16(w, down), mask));
  };
  for (int i = 0; i < n; i += 16, in += 2 * bits) vst1q_u8(c + i, vcombine_u8(eight(in), eight(in + bits)));
}

// Codes c[0..n) (each < 2^bits) as the bit stream of mlx_affine_quantize_group (n * bits / 8
// bytes). `room`: the bytes from `out` to the end of the caller's buffer (pack_stream may write
// past the group when it has them).
void pack_codes(const uint8_t* c, int n, int bits, std::byte* out, size_t room) {
  const size_t bytes = size_t(n) * size_t(bits) / 8;
  if (bits == 8) {
    std::memcpy(out, c, size_t(n));
    return;
  }
  if (bits == 4) {  // byte k = c[2k] | c[2k + 1] << 4
    for (int i = 0; i < n; i += 32) {
      const uint8x16x2_t v = vld2q_u8(c + i);  // even codes, odd codes
      vst1q_u8(u8(out) + i / 2, vsliq_n_u8(v.val[0], v.val[1], 4));
    }
    return;
  }
  if (room >= bytes + kStreamSlack) {
    pack_stream(c, n, bits, u8(out));
    return;
  }
  uint8_t padded[128 * 6 / 8 + kStreamSlack];
  pack_stream(c, n, bits, padded);
  std::memcpy(out, padded, bytes);
}

// The inverse: codes of a group of n values from its stream bytes (`room` bytes readable at `in`).
void unpack_codes(const std::byte* in, int n, int bits, uint8_t* c, size_t room) {
  const size_t bytes = size_t(n) * size_t(bits) / 8;
  if (bits == 8) {
    std::memcpy(c, in, size_t(n));
    return;
  }
  if (bits == 4) {  // code 2k = byte k & 15, code 2k + 1 = byte k >> 4
    for (int i = 0; i < n; i += 32) {
      const uint8x16_t b = vld1q_u8(u8(in) + i / 2);
      uint8x16x2_t v;
      v.val[0] = vandq_u8(b, vdupq_n_u8(0x0F));
      v.val[1] = vshrq_n_u8(b, 4);
      vst2q_u8(c + i, v);
    }
    return;
  }
  if (room >= bytes + kStreamSlack) {
    unpack_stream(u8(in), n, bits, c);
    return;
  }
  uint8_t padded[128 * 6 / 8 + kStreamSlack] = {};
  std::memcpy(padded, in, bytes);
  unpack_stream(padded, n, bits, c);
}

// `acc < v ? v : acc` and `v < acc ? v : acc` lane by lane: std::max / std::min as the scalar
// loop calls them (a NaN v leaves acc).
inline float32x4_t max_skip_nan(float32x4_t acc, float32x4_t v) { return vbslq_f32(vcltq_f32(acc, v), v, acc); }
inline float32x4_t min_skip_nan(float32x4_t acc, float32x4_t v) { return vbslq_f32(vcltq_f32(v, acc), v, acc); }

// One group's codes (as bytes) and its scale and bias.
void quantize_group(const float* w, int bits, int group_size, MlxDevice device, uint8_t* c, float* scale, float* bias) {
  const bool cpu = device == MlxDevice::kCpu;
  float32x4_t mx[2], mn[2];
  mx[0] = mx[1] = vdupq_n_f32(cpu ? -INFINITY : 0.0f);
  mn[0] = mn[1] = vdupq_n_f32(cpu ? INFINITY : FLT_MAX);
  for (int j = 0; j < group_size; j += 8) {
    for (int k = 0; k < 2; k++) {
      const float32x4_t v = vld1q_f32(w + j + 4 * k);
      mx[k] = max_skip_nan(mx[k], v);
      mn[k] = min_skip_nan(mn[k], v);
    }
  }
  float lmx[8], lmn[8];
  vst1q_f32(lmx, mx[0]), vst1q_f32(lmx + 4, mx[1]);
  vst1q_f32(lmn, mn[0]), vst1q_f32(lmn + 4, mn[1]);
  float w_min = 0, w_max = 0;
  mlx_affine_min_max(lmn, lmx, 8, device, &w_min, &w_max);
  mlx_affine_scale_bias(w_min, w_max, bits, device, scale, bias);
  const float32x4_t vs = vdupq_n_f32(*scale), vb = vdupq_n_f32(*bias);
  const float32x4_t zero = vdupq_n_f32(0.0f), top = vdupq_n_f32(float((1 << bits) - 1));
  for (int j = 0; j < group_size; j += 16) {
    uint32x4_t q[4];
    for (int k = 0; k < 4; k++) {
      const float32x4_t v = vdivq_f32(vsubq_f32(vld1q_f32(w + j + 4 * k), vb), vs);
      const float32x4_t r = cpu ? vrndnq_f32(v) : vrndaq_f32(v);
      q[k] = vcvtq_u32_f32(vminq_f32(vmaxq_f32(r, zero), top));
    }
    const uint16x8_t lo = vcombine_u16(vmovn_u32(q[0]), vmovn_u32(q[1]));
    const uint16x8_t hi = vcombine_u16(vmovn_u32(q[2]), vmovn_u32(q[3]));
    vst1q_u8(c + j, vcombine_u8(vmovn_u16(lo), vmovn_u16(hi)));
  }
}

// v rounded to T (mlx_round_to) for finite or infinite lanes.
inline float32x4_t round_to4(float32x4_t v, MlxFloat t) {
  if (t == MlxFloat::kF16) return vcvt_f32_f16(vcvt_f16_f32(v));
  if (t == MlxFloat::kBF16) {
    const uint32x4_t i = vreinterpretq_u32_f32(v);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(i, 16), vdupq_n_u32(1));
    const uint32x4_t r = vaddq_u32(i, vaddq_u32(lsb, vdupq_n_u32(0x7FFF)));
    return vreinterpretq_f32_u32(vandq_u32(r, vdupq_n_u32(0xFFFF0000u)));
  }
  return v;
}

}  // namespace

void mlx_affine_quantize_row_neon(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                                  std::byte* codes, float* scales, float* biases) {
  const size_t group_bytes = size_t(group_size) * size_t(bits) / 8;
  const int64_t groups = dim / group_size;
  uint8_t c[128];
  for (int64_t g = 0; g < groups; ++g) {
    quantize_group(x + g * group_size, bits, group_size, device, c, scales + g, biases + g);
    pack_codes(c, group_size, bits, codes + size_t(g) * group_bytes, size_t(groups - g) * group_bytes);
  }
}

void mlx_affine_dequantize_row_neon(const std::byte* codes, const float* scales, const float* biases, int64_t dim,
                                    int bits, int group_size, MlxFloat t, float* out) {
  const size_t group_bytes = size_t(group_size) * size_t(bits) / 8;
  const int64_t groups = dim / group_size;
  uint8_t c[128];
  for (int64_t g = 0; g < groups; ++g) {
    const std::byte* in = codes + size_t(g) * group_bytes;
    float* o = out + g * group_size;
    if (!std::isfinite(scales[g]) || !std::isfinite(biases[g])) {
      mlx_affine_dequantize_row_ref(in, scales + g, biases + g, group_size, bits, group_size, t, o);
      continue;
    }
    unpack_codes(in, group_size, bits, c, size_t(groups - g) * group_bytes);
    const float32x4_t vs = vdupq_n_f32(scales[g]), vb = vdupq_n_f32(biases[g]);
    for (int j = 0; j < group_size; j += 8) {
      const uint16x8_t h = vmovl_u8(vld1_u8(c + j));
      const float32x4_t code[2] = {vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(h)))};
      for (int k = 0; k < 2; k++) {
        const float32x4_t prod = round_to4(vmulq_f32(code[k], vs), t);
        vst1q_f32(o + j + 4 * k, round_to4(vaddq_f32(prod, vb), t));
      }
    }
  }
}

}  // namespace kvsnap::simd::arm

#endif  // KVSNAP_SIMD_NEON
