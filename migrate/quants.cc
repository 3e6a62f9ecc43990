#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

#include "migrate/quants.h"

#include <bit>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "migrate/half.h"

// Transcriptions of ggml/src/ggml-quants.c (llama.cpp v0.5.0). Keep them literal: the
// order of every float operation is part of the contract (bytes equal to
// ggml_quantize_chunk, floats equal to ggml's to_float). Comments name the original.

static_assert(std::endian::native == std::endian::little, "ggml blocks are little-endian");

namespace kvsnap::quants {
namespace {

using half::f32_to_fp16;
using half::fp16_to_f32;
using half::load_u16;
using half::store_u16;

// C's float -> int conversion as libggml-base executes it on x86-64 (cvttss2si /
// cvttps2dq, 32-bit): truncation toward zero, and INT32_MIN ("integer indefinite") for
// NaN and out-of-range values, where C leaves the result undefined. ggml's
// `(int8_t)(x0 + 8.5f)` then keeps the low byte.
inline int32_t cvtt_i32(float f) {
  return (f >= -2147483648.0f && f < 2147483648.0f) ? static_cast<int32_t>(f) : INT32_MIN;
}
inline int8_t to_i8(float f) { return static_cast<int8_t>(static_cast<uint8_t>(cvtt_i32(f) & 0xff)); }
inline uint8_t to_u8(float f) { return static_cast<uint8_t>(cvtt_i32(f) & 0xff); }

inline uint8_t min_i8(int8_t bound, int8_t v) {  // ggml MIN(bound, v), stored as uint8_t
  return static_cast<uint8_t>(bound < v ? bound : v);
}

inline const uint8_t* u8(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }
inline uint8_t* u8(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }

// best_index_int8 (ggml-quants.c): index of the table value nearest to x.
inline int best_index_int8(int n, const int8_t* val, float x) {
  if (x <= val[0]) return 0;
  if (x >= val[n - 1]) return n - 1;
  int ml = 0, mu = n - 1;
  while (mu - ml > 1) {
    int mav = (ml + mu) / 2;
    if (x < val[mav]) mu = mav; else ml = mav;
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// ggml's abs-max search of q4_0/q5_0: the signed value of the first largest |v|.
inline float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (size_t j = 0; j < kQK; j++) {
    const float v = x[j];
    if (amax < std::fabs(v)) {
      amax = std::fabs(v);
      max = v;
    }
  }
  return max;
}

}  // namespace

// The scalar reference kernels (declared in quants.h). migrate/type_traits.cc picks these or a
// SIMD kernel that gives the same bytes.
namespace ref {

int iq4_nl_best_index(float x) { return best_index_int8(16, kIQ4NLValues, x); }

// ---- float types (ggml.c) ----------------------------------------------------------

void f32_to_f32(const std::byte* src, float* dst, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void f32_from_f32(const float* src, std::byte* dst, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }

// ggml_fp16_to_fp32_row
void f16_to_f32(const std::byte* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = fp16_to_f32(load_u16(src + 2 * i));
}
// ggml_fp32_to_fp16_row
void f16_from_f32(const float* src, std::byte* dst, size_t n) {
  for (size_t i = 0; i < n; i++) store_u16(dst + 2 * i, f32_to_fp16(src[i]));
}
// ggml_bf16_to_fp32_row
void bf16_to_f32(const std::byte* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = half::bf16_to_f32(load_u16(src + 2 * i));
}
// ggml_fp32_to_bf16_row_ref
void bf16_from_f32(const float* src, std::byte* dst, size_t n) {
  for (size_t i = 0; i < n; i++) store_u16(dst + 2 * i, half::f32_to_bf16(src[i]));
}

// ---- q4_0: {f16 d; u8 qs[16]} ---------------------------------------------------------

// quantize_row_q4_0_ref
void q4_0_from_f32(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    uint8_t* y = u8(out + ib * kQ4_0Bytes);
    const float max = signed_absmax(x);
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out + ib * kQ4_0Bytes, f32_to_fp16(d));
    for (size_t j = 0; j < kQK / 2; ++j) {
      const float x0 = x[0 + j] * id;
      const float x1 = x[kQK / 2 + j] * id;
      const uint8_t xi0 = min_i8(15, to_i8(x0 + 8.5f));
      const uint8_t xi1 = min_i8(15, to_i8(x1 + 8.5f));
      y[2 + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

// dequantize_row_q4_0
void q4_0_to_f32(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const uint8_t* b = u8(in + ib * kQ4_0Bytes);
    const float d = fp16_to_f32(load_u16(in + ib * kQ4_0Bytes));
    for (size_t j = 0; j < kQK / 2; ++j) {
      const int x0 = (b[2 + j] & 0x0F) - 8;
      const int x1 = (b[2 + j] >> 4) - 8;
      y[j + 0] = static_cast<float>(x0) * d;
      y[j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

// ---- q4_1: {f16 d; f16 m; u8 qs[16]} --------------------------------------------------

// quantize_row_q4_1_ref
void q4_1_from_f32(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ4_1Bytes;
    uint8_t* y = u8(blk);
    float min = FLT_MAX;
    float max = -FLT_MAX;
    for (size_t j = 0; j < kQK; j++) {
      const float v = x[j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(blk, f32_to_fp16(d));
    store_u16(blk + 2, f32_to_fp16(min));
    for (size_t j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[0 + j] - min) * id;
      const float x1 = (x[kQK / 2 + j] - min) * id;
      const uint8_t xi0 = min_i8(15, to_i8(x0 + 0.5f));
      const uint8_t xi1 = min_i8(15, to_i8(x1 + 0.5f));
      y[4 + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

// dequantize_row_q4_1
void q4_1_to_f32(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ4_1Bytes;
    const uint8_t* b = u8(blk);
    const float d = fp16_to_f32(load_u16(blk));
    const float m = fp16_to_f32(load_u16(blk + 2));
    for (size_t j = 0; j < kQK / 2; ++j) {
      const int x0 = (b[4 + j] & 0x0F);
      const int x1 = (b[4 + j] >> 4);
      y[j + 0] = static_cast<float>(x0) * d + m;
      y[j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

// ---- q5_0: {f16 d; u8 qh[4]; u8 qs[16]} -----------------------------------------------

// quantize_row_q5_0_ref
void q5_0_from_f32(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ5_0Bytes;
    uint8_t* y = u8(blk);
    const float max = signed_absmax(x);
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(blk, f32_to_fp16(d));
    uint32_t qh = 0;
    for (size_t j = 0; j < kQK / 2; ++j) {
      const float x0 = x[0 + j] * id;
      const float x1 = x[kQK / 2 + j] * id;
      const uint8_t xi0 = min_i8(31, to_i8(x0 + 16.5f));
      const uint8_t xi1 = min_i8(31, to_i8(x1 + 16.5f));
      y[6 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(blk + 2, &qh, sizeof(qh));
  }
}

// dequantize_row_q5_0
void q5_0_to_f32(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ5_0Bytes;
    const uint8_t* b = u8(blk);
    const float d = fp16_to_f32(load_u16(blk));
    uint32_t qh;
    std::memcpy(&qh, blk + 2, sizeof(qh));
    for (size_t j = 0; j < kQK / 2; ++j) {
      const uint8_t xh_0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh_1 = static_cast<uint8_t>(((qh >> (j + 12))) & 0x10);
      const int32_t x0 = ((b[6 + j] & 0x0F) | xh_0) - 16;
      const int32_t x1 = ((b[6 + j] >> 4) | xh_1) - 16;
      y[j + 0] = static_cast<float>(x0) * d;
      y[j + kQK / 2] = static_cast<float>(x1) * d;
    }
  }
}

// ---- q5_1: {f16 d; f16 m; u8 qh[4]; u8 qs[16]} ----------------------------------------

// quantize_row_q5_1_ref
void q5_1_from_f32(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ5_1Bytes;
    uint8_t* y = u8(blk);
    float min = FLT_MAX;
    float max = -FLT_MAX;
    for (size_t j = 0; j < kQK; j++) {
      const float v = x[j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / ((1 << 5) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(blk, f32_to_fp16(d));
    store_u16(blk + 2, f32_to_fp16(min));
    uint32_t qh = 0;
    for (size_t j = 0; j < kQK / 2; ++j) {
      const float x0 = (x[0 + j] - min) * id;
      const float x1 = (x[kQK / 2 + j] - min) * id;
      const uint8_t xi0 = to_u8(x0 + 0.5f);
      const uint8_t xi1 = to_u8(x1 + 0.5f);
      y[8 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
      qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
      qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
    }
    std::memcpy(blk + 4, &qh, sizeof(qh));
  }
}

// dequantize_row_q5_1
void q5_1_to_f32(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ5_1Bytes;
    const uint8_t* b = u8(blk);
    const float d = fp16_to_f32(load_u16(blk));
    const float m = fp16_to_f32(load_u16(blk + 2));
    uint32_t qh;
    std::memcpy(&qh, blk + 4, sizeof(qh));
    for (size_t j = 0; j < kQK / 2; ++j) {
      const uint8_t xh_0 = static_cast<uint8_t>(((qh >> (j + 0)) << 4) & 0x10);
      const uint8_t xh_1 = static_cast<uint8_t>(((qh >> (j + 12))) & 0x10);
      const int x0 = (b[8 + j] & 0x0F) | xh_0;
      const int x1 = (b[8 + j] >> 4) | xh_1;
      y[j + 0] = static_cast<float>(x0) * d + m;
      y[j + kQK / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

// ---- q8_0: {f16 d; i8 qs[32]} ---------------------------------------------------------

// quantize_row_q8_0_ref
void q8_0_from_f32(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, x += kQK) {
    std::byte* blk = out + ib * kQ8_0Bytes;
    uint8_t* y = u8(blk);
    float amax = 0.0f;
    for (size_t j = 0; j < kQK; j++) {
      const float a = std::fabs(x[j]);
      amax = amax > a ? amax : a;  // ggml MAX(amax, fabsf(v)): a NaN replaces amax
    }
    const float d = amax / ((1 << 7) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(blk, f32_to_fp16(d));
    for (size_t j = 0; j < kQK; ++j) {
      const float x0 = x[j] * id;
      y[2 + j] = static_cast<uint8_t>(to_i8(std::round(x0)));  // roundf: ties away from zero
    }
  }
}

// dequantize_row_q8_0
void q8_0_to_f32(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kQ8_0Bytes;
    const float d = fp16_to_f32(load_u16(blk));
    for (size_t j = 0; j < kQK; ++j) {
      const int8_t q = static_cast<int8_t>(u8(blk)[2 + j]);
      y[j] = static_cast<float>(q) * d;
    }
  }
}

// ---- iq4_nl: {f16 d; u8 qs[16]}, values from kvalues_iq4nl ----------------------------

// quantize_iq4_nl -> quantize_row_iq4_nl_impl(super_block_size = block_size = 32,
// quant_weights = NULL, ntry = 7), one call per block. The unused pieces (sigma2, the
// super-block scale path) are left out; nothing they compute reaches the output.
void iq4_nl_from_f32(const float* src, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  constexpr int ntry = 7;
  const int8_t* values = kIQ4NLValues;
  for (size_t ib = 0; ib < n / kQK; ib++) {
    const float* xb = src + ib * kQK;
    std::byte* blk = out + ib * kIQ4_NLBytes;
    float weight[kQK];
    uint8_t L[kQK];
    for (size_t j = 0; j < kQK; ++j) weight[j] = xb[j] * xb[j];
    float amax = 0, max = 0;
    for (size_t j = 0; j < kQK; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    float d = 0.0f;  // scales[0]
    if (!(amax < 1e-15f)) {  // GROUP_MAX_EPS
      d = ntry > 0 ? -max / values[0] : max / values[0];
      float id = 1 / d;
      float sumqx = 0, sumq2 = 0;
      for (size_t j = 0; j < kQK; ++j) {
        const float al = id * xb[j];
        const int l = best_index_int8(16, values, al);
        const float q = values[l];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
      float best = d * sumqx;
      for (int itry = -ntry; itry <= ntry; ++itry) {
        id = static_cast<float>(itry + values[0]) / max;
        sumqx = sumq2 = 0;
        for (size_t j = 0; j < kQK; ++j) {
          const float al = id * xb[j];
          const int l = best_index_int8(16, values, al);
          const float q = values[l];
          const float w = weight[j];
          sumqx += w * q * xb[j];
          sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
          d = sumqx / sumq2;
          best = d * sumqx;
        }
      }
    }
    store_u16(blk, f32_to_fp16(d));
    const float id = d != 0.0f ? 1 / d : 0;
    for (size_t j = 0; j < kQK; ++j) L[j] = static_cast<uint8_t>(best_index_int8(16, values, id * xb[j]));
    uint8_t* q4 = u8(blk) + 2;
    for (size_t j = 0; j < 16; ++j) q4[j] = static_cast<uint8_t>(L[j] | (L[16 + j] << 4));
  }
}

// dequantize_row_iq4_nl
void iq4_nl_to_f32(const std::byte* in, float* y, size_t n) {
  assert(n % kQK == 0);
  for (size_t ib = 0; ib < n / kQK; ib++, y += kQK) {
    const std::byte* blk = in + ib * kIQ4_NLBytes;
    const uint8_t* qs = u8(blk) + 2;
    const float d = fp16_to_f32(load_u16(blk));
    for (size_t j = 0; j < kQK / 2; ++j) {
      y[j + 0] = d * static_cast<float>(kIQ4NLValues[qs[j] & 0xf]);
      y[j + kQK / 2] = d * static_cast<float>(kIQ4NLValues[qs[j] >> 4]);
    }
  }
}

}  // namespace ref

}  // namespace kvsnap::quants
