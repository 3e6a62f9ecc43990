// MLX's affine quantization (mx.quantize / mx.dequantize, mode "affine"), the codec of mlx-lm's
// QuantizedKVCache: rows of D values in groups of 32, 64 or 128 consecutive values, 2,3,4,5,6 or 8
// bits per code, one scale and one bias per group in the cache's float type T (f32, f16, bf16).
//
// Promises (pure functions, no state, no allocation):
// - mlx_affine_quantize_row with MlxDevice::kCpu gives the codes mx.quantize gives on MLX's CPU
//   backend (mlx/backend/cpu/quantized.cpp `quantize`, mlx 0.23.2 .. 0.32.4): min/max in float32,
//   scale = max((max-min)/(2^bits-1), 1e-7), the larger-magnitude end is the "edge", scale snapped
//   to edge/rint(edge/scale), codes rint((x-bias)/scale) clamped to [0, 2^bits-1], every step a
//   separate float32 operation, rint half to even. The scales/biases it returns are the float32
//   values before MLX rounds them to T; mlx_round_to(T, .) is that rounding (nearest even).
//   Byte-exactness is tested against the real mx.quantize (tests/mlx/requant_test.py).
// - MlxDevice::kGpu follows the Metal/CUDA kernel (mlx/backend/metal/kernels/quantized.h
//   `affine_quantize`): the running max starts at 0, not at -inf (an all-negative group is
//   quantized over [min, 0]), and both roundings are half away from zero. Written from the kernel
//   source; not checked against a real Apple GPU (none here).
// - Packing: each row is a little-endian LSB-first bit stream, code i at stream bits
//   [i*bits, (i+1)*bits); the row takes D*bits/8 bytes = D*bits/32 uint32 words.
// - mlx_affine_dequantize_row is mx.dequantize on the CPU (the ops fallback in mlx/ops.cpp):
//   T(T(code*scale) + bias), each product and sum in float32 then rounded to T.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace kvsnap {

enum class MlxFloat { kF32, kF16, kBF16 };
enum class MlxDevice { kCpu, kGpu };

// "F32", "F16", "BF16" (safetensors dtype names).
Result<MlxFloat> mlx_float_of(const std::string& dtype);
const char* mlx_float_name(MlxFloat t);  // "F32", ...
size_t mlx_float_size(MlxFloat t);
Result<MlxDevice> mlx_device_of(const std::string& name);  // "cpu", "gpu"
const char* mlx_device_name(MlxDevice d);

// bits in {2,3,4,5,6,8} and group_size in {32,64,128}, as mx.quantize accepts; the message says so.
Status mlx_affine_check(int bits, int group_size);
// The row length must be whole groups (mx.quantize: "the last dimension ... must be divisible by
// group_size"). Names nothing: callers add the file and layer.
Status mlx_affine_check_dim(int64_t dim, int group_size);

inline size_t mlx_affine_row_bytes(int64_t dim, int bits) { return size_t(dim) * size_t(bits) / 8; }

// The float value of T's encoding in `p` (little-endian), and the encoding of float v rounded to T.
float mlx_load_float(MlxFloat t, const std::byte* p);
void mlx_store_float(MlxFloat t, float v, std::byte* p);
// n of them at once (the codec table's f16/bf16 row kernels, SIMD where the CPU has them: the
// same bits as the one-value functions).
void mlx_load_floats(MlxFloat t, const std::byte* p, size_t n, float* out);
void mlx_store_floats(MlxFloat t, const float* v, size_t n, std::byte* p);
// v rounded to T (round to nearest even; f32: v itself).
float mlx_round_to(MlxFloat t, float v);

// Quantizes x[0..dim) (values of T, given as float) into `codes` (mlx_affine_row_bytes bytes) and
// the float32 scale and bias of each of dim/group_size groups. Preconditions: mlx_affine_check and
// mlx_affine_check_dim pass.
void mlx_affine_quantize_row(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                             std::byte* codes, float* scales, float* biases);

// Its scalar code, which the SIMD kernels (the level table in migrate/simd_kernels.cc) must equal
// byte for byte and kvsnap-simd-check compares them with.
void mlx_affine_quantize_row_ref(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                                 std::byte* codes, float* scales, float* biases);

// The pieces mlx_affine_quantize_row is made of, shared with its SIMD kernels
// (migrate/kernels/x86_avx2_mlx.cc, arm_neon_mlx.cc), which must give the same bytes:
// - the group's minimum over lo[0..n) and maximum over hi[0..n) as MLX's loop takes them (a NaN
//   is skipped; the GPU's running maximum starts at 0): the scalar quantizer passes the group
//   twice, the kernels their lanes' minima and maxima (the same extremes in another order);
// - the group's scale and bias from its minimum and maximum (MLX's float32 steps, in order);
// - the scalar quantizer of one group of group_size values, whose codes (group_size * bits / 8
//   bytes, always whole bytes) go to `codes`.
void mlx_affine_min_max(const float* lo, const float* hi, int n, MlxDevice device, float* w_min, float* w_max);
void mlx_affine_scale_bias(float w_min, float w_max, int bits, MlxDevice device, float* scale, float* bias);
void mlx_affine_quantize_group(const float* w, int bits, int group_size, MlxDevice device, std::byte* codes,
                               float* scale, float* bias);

// Code i of a packed row.
uint32_t mlx_affine_code(const std::byte* codes, int64_t i, int bits);

// Dequantizes a packed row with its groups' scales and biases (T values, as float) the way
// mx.dequantize does on the CPU for T; the results are T values, as float.
void mlx_affine_dequantize_row(const std::byte* codes, const float* scales, const float* biases, int64_t dim, int bits,
                               int group_size, MlxFloat t, float* out);
// Its scalar code, which the SIMD kernels fall back to (and kvsnap-simd-check compares them with).
void mlx_affine_dequantize_row_ref(const std::byte* codes, const float* scales, const float* biases, int64_t dim,
                                   int bits, int group_size, MlxFloat t, float* out);

}  // namespace kvsnap
