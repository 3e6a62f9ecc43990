// Scalar fp16 and bf16 conversions with ggml's exact semantics
// (ggml/src/ggml-impl.h, llama.cpp v0.5.0):
//   fp16 -> f32  ggml_compute_fp16_to_fp32: exact; a NaN comes back quiet with its payload.
//   f32 -> fp16  ggml_compute_fp32_to_fp16: round to nearest even, subnormals kept, overflow to
//                inf, every NaN becomes 0x7E00 with the input's sign.
//   bf16 -> f32  shift left 16 (exact, signalling NaNs stay signalling).
//   f32 -> bf16  ggml_compute_fp32_to_bf16: round to nearest even, NaN truncated and made quiet.
// These are what ggml_quantize_chunk and the dequantizers of libggml-base do; the
// CPU backend's own fp32->fp16/bf16 (F16C, AVX512-BF16) differ only on NaN payloads
// and (bf16) subnormals.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/byte_order.h"

namespace kvsnap::half {

inline float f32_from_bits(uint32_t w) { return std::bit_cast<float>(w); }
inline uint32_t f32_to_bits(float f) { return std::bit_cast<uint32_t>(f); }

inline float fp16_to_f32(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & UINT32_C(0x80000000);
  const uint32_t two_w = w + w;

  const uint32_t exp_offset = UINT32_C(0xE0) << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized_value = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;

  const uint32_t magic_mask = UINT32_C(126) << 23;
  const float magic_bias = 0.5f;
  const float denormalized_value = f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;

  const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? f32_to_bits(denormalized_value) : f32_to_bits(normalized_value));
  return f32_from_bits(result);
}

inline uint16_t f32_to_fp16(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;

  const uint32_t w = f32_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & UINT32_C(0x80000000);
  uint32_t bias = shl1_w & UINT32_C(0xFF000000);
  if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);

  base = f32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
  const uint32_t bits = f32_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
  const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT32_C(0x7E00) : nonsign));
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float s) {
  const uint32_t i = f32_to_bits(s);
  if ((i & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((i >> 16) | 64);  // NaN: force quiet
  return static_cast<uint16_t>((i + (0x7fff + ((i >> 16) & 1))) >> 16);
}

// Little-endian loads/stores of the 16-bit scale fields inside quant blocks.
inline uint16_t load_u16(const std::byte* p) { return load_le<uint16_t>(p); }
inline void store_u16(std::byte* p, uint16_t v) { store_le(p, v, 2); }

}  // namespace kvsnap::half
