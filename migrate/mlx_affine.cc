#include "migrate/fp_strict.h"  // first: no fused multiply-add anywhere below

#include "migrate/mlx_affine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/byte_order.h"
#include "migrate/half.h"
#include "migrate/simd_kernels.h"
#include "migrate/type_traits.h"

namespace kvsnap {
namespace {

// Round half to even (std::rint in the default rounding mode, as MLX's CPU kernel) or half away
// from zero (Metal's and CUDA's round()).
float round_code(float v, MlxDevice d) { return d == MlxDevice::kCpu ? std::nearbyint(v) : std::round(v); }

}  // namespace

Result<MlxFloat> mlx_float_of(const std::string& dtype) {
  if (dtype == "F32") return MlxFloat::kF32;
  if (dtype == "F16") return MlxFloat::kF16;
  if (dtype == "BF16") return MlxFloat::kBF16;
  return Status::NotSupported("dtype " + dtype + " is not a float type MLX quantizes (F32, F16, BF16)");
}

const char* mlx_float_name(MlxFloat t) {
  switch (t) {
    case MlxFloat::kF32: return "F32";
    case MlxFloat::kF16: return "F16";
    case MlxFloat::kBF16: return "BF16";
  }
  return "?";
}

size_t mlx_float_size(MlxFloat t) { return t == MlxFloat::kF32 ? 4 : 2; }

Result<MlxDevice> mlx_device_of(const std::string& name) {
  if (name == "cpu") return MlxDevice::kCpu;
  if (name == "gpu") return MlxDevice::kGpu;
  return Status::InvalidArgument("MLX device '" + name + "': give cpu (mx.quantize on MLX's CPU backend, e.g. "
                                 "mlx[cpu] on Linux) or gpu (the Metal/CUDA kernel, what a Mac's GPU writes)");
}

const char* mlx_device_name(MlxDevice d) { return d == MlxDevice::kCpu ? "cpu" : "gpu"; }

Status mlx_affine_check(int bits, int group_size) {
  const bool bits_ok = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  const bool group_ok = group_size == 32 || group_size == 64 || group_size == 128;
  if (bits_ok && group_ok) return Status::OK();
  std::string what;
  if (!bits_ok) what = "bits " + std::to_string(bits);
  if (!group_ok) what += (what.empty() ? "" : " and ") + std::string("group size ") + std::to_string(group_size);
  return Status::InvalidArgument(what + ": kvsnap writes MLX's affine quantization (mx.quantize) at bits 2, 3, 4, "
                                        "5, 6 or 8 (not mlx 0.32's 1-bit form) and group size 32, 64 or 128");
}

Status mlx_affine_check_dim(int64_t dim, int group_size) {
  if (dim > 0 && group_size > 0 && dim % group_size == 0) return Status::OK();
  return Status::InvalidArgument("head dim " + std::to_string(dim) + " is not a whole number of groups of " +
                                 std::to_string(group_size) + " (mx.quantize needs the last dimension divisible by "
                                 "the group size; pick a group size that divides it)");
}

float mlx_load_float(MlxFloat t, const std::byte* p) {
  switch (t) {
    case MlxFloat::kF32: return half::f32_from_bits(load_le<uint32_t>(p));
    case MlxFloat::kF16: return half::fp16_to_f32(half::load_u16(p));
    case MlxFloat::kBF16: return half::bf16_to_f32(half::load_u16(p));
  }
  return 0;
}

void mlx_store_float(MlxFloat t, float v, std::byte* p) {
  switch (t) {
    case MlxFloat::kF32: store_le(p, half::f32_to_bits(v), 4); return;
    case MlxFloat::kF16: half::store_u16(p, half::f32_to_fp16(v)); return;
    case MlxFloat::kBF16: half::store_u16(p, half::f32_to_bf16(v)); return;
  }
}

namespace {
// mlx_load_float / mlx_store_float are ggml's f16 and bf16 conversions (migrate/half.h), which
// the codec table's f16 and bf16 rows compute at every SIMD level.
const TypeTraits* row_codec(MlxFloat t) {
  return t == MlxFloat::kF16 ? find_traits(GgmlType::kF16) : t == MlxFloat::kBF16 ? find_traits(GgmlType::kBF16) : nullptr;
}
}  // namespace

void mlx_load_floats(MlxFloat t, const std::byte* p, size_t n, float* out) {
  if (const TypeTraits* c = row_codec(t)) {
    c->to_f32(p, out, n);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = mlx_load_float(t, p + 4 * i);
  }
}

void mlx_store_floats(MlxFloat t, const float* v, size_t n, std::byte* p) {
  if (const TypeTraits* c = row_codec(t)) {
    c->from_f32(v, p, n);
  } else {
    for (size_t i = 0; i < n; ++i) mlx_store_float(t, v[i], p + 4 * i);
  }
}

float mlx_round_to(MlxFloat t, float v) {
  switch (t) {
    case MlxFloat::kF32: return v;
    case MlxFloat::kF16: return half::fp16_to_f32(half::f32_to_fp16(v));
    case MlxFloat::kBF16: return half::bf16_to_f32(half::f32_to_bf16(v));
  }
  return v;
}

void mlx_affine_scale_bias(float w_min, float w_max, int bits, MlxDevice device, float* scale_out, float* bias_out) {
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  const bool mask = std::fabs(w_min) > std::fabs(w_max);
  float scale = std::max((w_max - w_min) / n_bins, eps);
  scale = mask ? scale : -scale;
  const float edge = mask ? w_min : w_max;
  const float q0 = round_code(edge / scale, device);
  float bias = 0;
  if (q0 != 0) {
    scale = edge / q0;
    bias = edge;
  }
  *scale_out = scale;
  *bias_out = bias;
}

void mlx_affine_min_max(const float* lo, const float* hi, int n, MlxDevice device, float* w_min_out,
                        float* w_max_out) {
  // The GPU kernel's running max starts at 0 (and its min at T's largest finite value, which no
  // value of T is above: the same as starting at float's).
  float w_min = device == MlxDevice::kCpu ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::max();
  float w_max = device == MlxDevice::kCpu ? -std::numeric_limits<float>::infinity() : 0.0f;
  for (int j = 0; j < n; ++j) {
    w_max = std::max(w_max, hi[j]);
    w_min = std::min(w_min, lo[j]);
  }
  *w_min_out = w_min;
  *w_max_out = w_max;
}

void mlx_affine_quantize_group(const float* w, int bits, int group_size, MlxDevice device, std::byte* codes,
                               float* scale_out, float* bias_out) {
  const float n_bins = float((1 << bits) - 1);
  float w_min = 0, w_max = 0;
  mlx_affine_min_max(w, w, group_size, device, &w_min, &w_max);
  float scale = 0, bias = 0;
  mlx_affine_scale_bias(w_min, w_max, bits, device, &scale, &bias);
  *scale_out = scale;
  *bias_out = bias;
  uint64_t acc = 0;  // bit stream, flushed a byte at a time; a group is whole bytes
  int acc_bits = 0;
  size_t out = 0;
  for (int j = 0; j < group_size; ++j) {
    float q = round_code((w[j] - bias) / scale, device);
    q = std::min(std::max(q, 0.0f), n_bins);
    // A NaN here (a NaN in the group, inf - inf) survives the clamp, and its cast is undefined in
    // C++: code 0, the low bits of what x86's cvttss2si and ARM's fcvtzu give for it.
    acc |= (std::isnan(q) ? uint64_t{0} : uint64_t(q)) << acc_bits;
    acc_bits += bits;
    while (acc_bits >= 8) {
      codes[out++] = std::byte(acc & 0xff);
      acc >>= 8;
      acc_bits -= 8;
    }
  }
}

void mlx_affine_quantize_row(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                             std::byte* codes, float* scales, float* biases) {
  simd::find_mlx_quantize()(x, dim, bits, group_size, device, codes, scales, biases);
}

void mlx_affine_quantize_row_ref(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                                 std::byte* codes, float* scales, float* biases) {
  const size_t group_bytes = size_t(group_size) * size_t(bits) / 8;
  for (int64_t g = 0; g < dim / group_size; ++g) {
    mlx_affine_quantize_group(x + g * group_size, bits, group_size, device, codes + size_t(g) * group_bytes,
                              scales + g, biases + g);
  }
}

uint32_t mlx_affine_code(const std::byte* codes, int64_t i, int bits) {
  const uint64_t bit = uint64_t(i) * uint64_t(bits);
  const size_t byte = size_t(bit / 8);
  uint32_t two = uint32_t(codes[byte]);
  if ((bit % 8) + unsigned(bits) > 8) two |= uint32_t(codes[byte + 1]) << 8;
  return (two >> (bit % 8)) & ((1u << bits) - 1);
}

void mlx_affine_dequantize_row(const std::byte* codes, const float* scales, const float* biases, int64_t dim, int bits,
                               int group_size, MlxFloat t, float* out) {
  simd::find_mlx_dequantize()(codes, scales, biases, dim, bits, group_size, t, out);
}

void mlx_affine_dequantize_row_ref(const std::byte* codes, const float* scales, const float* biases, int64_t dim,
                                   int bits, int group_size, MlxFloat t, float* out) {
  for (int64_t i = 0; i < dim; ++i) {
    const int64_t g = i / group_size;
    const float prod = mlx_round_to(t, float(mlx_affine_code(codes, i, bits)) * scales[g]);
    out[i] = mlx_round_to(t, prod + biases[g]);
  }
}

}  // namespace kvsnap
