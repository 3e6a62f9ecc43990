#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + F16C: MLX's affine quantization (migrate/mlx_affine.h), the same bytes and floats as the
// scalar code there, 8 values per vector:
// - quantize: the group's minimum and maximum are lane-wise std::min/std::max (maxps(w, acc) is
//   `acc < w ? w : acc`, so a NaN is skipped as the scalar loop skips it) reduced across lanes;
//   with no NaN left they are order-free, and the sign of a zero extreme never reaches the output
//   (a zero edge gives q0 = 0 either way). Scale and bias come from the scalar
//   mlx_affine_scale_bias. Each value: (w - bias) / scale (a division, like the scalar one), rint
//   (vroundps, half to even) or, for the GPU rule, round half away from zero (trunc of
//   x + copysign(0.49999997, x), equal to roundf for every float: x86_common.h), then the clamp to
//   [0, 2^bits - 1] with maxps/minps, whose NaN operand order gives code 0 to a NaN (what the
//   scalar code writes), and vcvttps2dq on the integral result.
// - pack/unpack (the scalar bit stream, LSB first): 4 bits by nibble shifts, 8 bits a copy,
//   2/3/5/6 bits 32 codes a step with the tables of mlx_pack.h (pack: maddubs/madd/64-bit
//   shifts merge a run of 8 codes into a 64-bit lane, PSHUFB keeps its `bits` bytes; unpack:
//   PSHUFB spreads them to 16-bit lanes, a multiply and a shift isolate each code).
// - dequantize: T(T(code * scale) + bias) per value with the rounding to T by vcvtps2ph/vcvtph2ps
//   (f16, equal to ggml's rounding for non-NaN) or the integer round-to-nearest-even (bf16);
//   a group whose scale or bias is not finite (no NaN can appear otherwise: code * scale and the
//   sum are finite or inf of one sign) goes through the scalar code.

#include "migrate/kernels/x86_common.h"
#include "migrate/kernels/mlx_pack.h"

#include <algorithm>
#include <cfloat>

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {
namespace {

using mlx_pack::kStreamSlack;
using mlx_pack::kStreamTables;

// 2, 3, 5, 6 bits: codes c[0..n) (each < 2^bits, n a multiple of 32) as the bit stream, 32 codes
// (4 * bits bytes) a step: maddubs merges code pairs, madd pairs of pairs (4 codes in a 32-bit
// lane), a 64-bit shift the two halves of a run of 8, PSHUFB keeps each run's `bits` bytes.
// Writes up to kStreamSlack bytes past n * bits / 8.
KV_AVX2 void pack_stream(const uint8_t* c, int n, int bits, std::byte* out) {
  const __m256i pair = _mm256_set1_epi16(int16_t(1 | (1 << bits) << 8));  // bits <= 6: 2^bits fits an int8
  const __m256i quad = _mm256_set1_epi32(1 | (1 << 2 * bits) << 16);
  const __m256i low32 = _mm256_set1_epi64x(0xffffffff);
  const __m128i up = _mm_cvtsi32_si128(4 * bits);
  const __m256i gather = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kStreamTables[bits].gather)));
  for (int i = 0; i < n; i += 32, out += 4 * bits) {
    const __m256i q4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(c + i)), pair), quad);
    const __m256i q8 = _mm256_or_si256(_mm256_and_si256(q4, low32), _mm256_sll_epi64(_mm256_srli_epi64(q4, 32), up));
    const __m256i b = _mm256_shuffle_epi8(q8, gather);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(b));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * bits), _mm256_extracti128_si256(b, 1));
  }
}

// 16 codes from runs of 8 at `lo` and `hi`, one per 16-bit lane.
KV_AVX2_INLINE __m256i unpack16(const std::byte* lo, const std::byte* hi, __m256i spread, __m256i mul, __m128i down) {
  const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
  return _mm256_srl_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(b, spread), mul), down);
}

// The inverse of pack_stream, 32 codes a step; reads up to kStreamSlack bytes past n * bits / 8.
KV_AVX2 void unpack_stream(const std::byte* in, int n, int bits, uint8_t* c) {
  const mlx_pack::StreamTables& t = kStreamTables[bits];
  const __m256i spread = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.spread)));
  const __m256i mul = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.mul)));
  const __m128i down = _mm_cvtsi32_si128(16 - bits);
  for (int i = 0; i < n; i += 32, in += 4 * bits) {
    const __m256i a = unpack16(in, in + bits, spread, mul, down);
    const __m256i b = unpack16(in + 2 * bits, in + 3 * bits, spread, mul, down);
    // packus interleaves the 128-bit lanes: runs 0, 2, 1, 3
    _mm256_store_si256(reinterpret_cast<__m256i*>(c + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8));
  }
}

// Codes c[0..n) (each < 2^bits) as the bit stream of mlx_affine_quantize_group: code i at stream
// bits [i * bits, (i + 1) * bits); n * bits is a multiple of 8. `room`: the bytes from `out` to
// the end of the caller's buffer (pack_stream may write past the group when it has them).
KV_AVX2 void pack_codes(const uint8_t* c, int n, int bits, std::byte* out, size_t room) {
  const size_t bytes = size_t(n) * size_t(bits) / 8;
  if (bits == 8) {
    std::memcpy(out, c, size_t(n));
    return;
  }
  if (bits == 4) {  // byte k = c[2k] | c[2k + 1] << 4, 16 bytes at a time
    for (int i = 0; i < n; i += 32) {
      const __m128i a = _mm_load_si128(reinterpret_cast<const __m128i*>(c + i));
      const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(c + i + 16));
      const __m128i lo = _mm_set1_epi16(0x0F);
      // each 16-bit lane holds c[2k] (low byte) and c[2k + 1] (high byte), both < 16
      const __m128i pa = _mm_or_si128(_mm_and_si128(a, lo), _mm_srli_epi16(a, 4));
      const __m128i pb = _mm_or_si128(_mm_and_si128(b, lo), _mm_srli_epi16(b, 4));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 2),
                       _mm_packus_epi16(_mm_and_si128(pa, _mm_set1_epi16(0xFF)), _mm_and_si128(pb, _mm_set1_epi16(0xFF))));
    }
    return;
  }
  if (room >= bytes + kStreamSlack) {
    pack_stream(c, n, bits, out);
    return;
  }
  std::byte padded[128 * 6 / 8 + kStreamSlack];
  pack_stream(c, n, bits, padded);
  std::memcpy(out, padded, bytes);
}

// The inverse: codes of a group of n values from its stream bytes (`room` bytes readable at `in`).
KV_AVX2 void unpack_codes(const std::byte* in, int n, int bits, uint8_t* c, size_t room) {
  const size_t bytes = size_t(n) * size_t(bits) / 8;
  if (bits == 8) {
    std::memcpy(c, in, size_t(n));
    return;
  }
  if (bits == 4) {  // code 2k = byte k & 15, code 2k + 1 = byte k >> 4
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int i = 0; i < n; i += 32) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i / 2));
      const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
      _mm_store_si128(reinterpret_cast<__m128i*>(c + i), _mm_unpacklo_epi8(lo, hi));
      _mm_store_si128(reinterpret_cast<__m128i*>(c + i + 16), _mm_unpackhi_epi8(lo, hi));
    }
    return;
  }
  if (room >= bytes + kStreamSlack) {
    unpack_stream(in, n, bits, c);
    return;
  }
  std::byte padded[128 * 6 / 8 + kStreamSlack] = {};
  std::memcpy(padded, in, bytes);
  unpack_stream(padded, n, bits, c);
}

KV_AVX2_INLINE __m256 round_code8(__m256 v, MlxDevice d) {
  if (d == MlxDevice::kCpu) return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 h = _mm256_set1_ps(0x1.fffffep-2f);
  const __m256 half = _mm256_blendv_ps(h, _mm256_set1_ps(-0x1.fffffep-2f), v);
  return _mm256_round_ps(_mm256_add_ps(v, half), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
}

// `room`: the bytes from `codes` to the end of the row (pack_codes).
KV_AVX2 void quantize_group(const float* w, int bits, int group_size, MlxDevice device, std::byte* codes, size_t room,
                            float* scale, float* bias) {
  const bool cpu = device == MlxDevice::kCpu;
  __m256 mx = _mm256_set1_ps(cpu ? -INFINITY : 0.0f);
  __m256 mn = _mm256_set1_ps(cpu ? INFINITY : FLT_MAX);
  for (int j = 0; j < group_size; j += 8) {
    const __m256 v = _mm256_loadu_ps(w + j);
    mx = _mm256_max_ps(v, mx);
    mn = _mm256_min_ps(v, mn);
  }
  alignas(32) float lmx[8], lmn[8];
  _mm256_store_ps(lmx, mx);
  _mm256_store_ps(lmn, mn);
  float w_min = 0, w_max = 0;
  mlx_affine_min_max(lmn, lmx, 8, device, &w_min, &w_max);
  mlx_affine_scale_bias(w_min, w_max, bits, device, scale, bias);
  const __m256 vs = _mm256_set1_ps(*scale), vb = _mm256_set1_ps(*bias);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(float((1 << bits) - 1));
  alignas(32) uint8_t c[128];
  for (int j = 0; j < group_size; j += 32) {
    __m256i q[4];
    for (int i = 0; i < 4; i++) {
      const __m256 r = round_code8(_mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(w + j + 8 * i), vb), vs), device);
      q[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, zero), top));
    }
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]), _mm256_packus_epi32(q[2], q[3]));
    _mm256_store_si256(reinterpret_cast<__m256i*>(c + j),
                       _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  pack_codes(c, group_size, bits, codes, room);
}

// v rounded to T (mlx_round_to) for finite or infinite lanes.
KV_AVX2_INLINE __m256 round_to8(__m256 v, MlxFloat t) {
  if (t == MlxFloat::kF16) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  if (t == MlxFloat::kBF16) {
    const __m256i i = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(i, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
  return v;
}

}  // namespace

KV_AVX2 void mlx_affine_quantize_row_avx2(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                                          std::byte* codes, float* scales, float* biases) {
  const size_t group_bytes = size_t(group_size) * size_t(bits) / 8;
  for (int64_t g = 0; g < dim / group_size; ++g) {
    quantize_group(x + g * group_size, bits, group_size, device, codes + size_t(g) * group_bytes,
                   size_t(dim / group_size - g) * group_bytes, scales + g, biases + g);
  }
}

KV_AVX2 void mlx_affine_dequantize_row_avx2(const std::byte* codes, const float* scales, const float* biases,
                                            int64_t dim, int bits, int group_size, MlxFloat t, float* out) {
  const size_t group_bytes = size_t(group_size) * size_t(bits) / 8;
  alignas(32) uint8_t c[128];
  for (int64_t g = 0; g < dim / group_size; ++g) {
    const std::byte* in = codes + size_t(g) * group_bytes;
    float* o = out + g * group_size;
    if (!std::isfinite(scales[g]) || !std::isfinite(biases[g])) {
      mlx_affine_dequantize_row_ref(in, scales + g, biases + g, group_size, bits, group_size, t, o);
      continue;
    }
    unpack_codes(in, group_size, bits, c, size_t(dim / group_size - g) * group_bytes);
    const __m256 vs = _mm256_set1_ps(scales[g]), vb = _mm256_set1_ps(biases[g]);
    for (int j = 0; j < group_size; j += 8) {
      const __m256 code = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + j))));
      const __m256 prod = round_to8(_mm256_mul_ps(code, vs), t);
      _mm256_storeu_ps(o + j, round_to8(_mm256_add_ps(prod, vb), t));
    }
  }
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
