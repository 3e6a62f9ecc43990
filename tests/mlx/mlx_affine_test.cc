// migrate/mlx_affine.h on hand-worked groups: the expected numbers come from the arithmetic of MLX's
// kernels done by hand (comments), not from the codec. The byte contract with the real
// mx.quantize is tests/mlx/requant_test.py (oracle.mlx_requant).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "migrate/half.h"
#include "migrate/mlx_affine.h"

namespace kvsnap {
namespace {

struct Quantized {
  std::vector<std::byte> codes;
  std::vector<float> scales, biases;
};

Quantized quantize(const std::vector<float>& x, int bits, int group, MlxDevice d = MlxDevice::kCpu) {
  Quantized q;
  q.codes.resize(mlx_affine_row_bytes(int64_t(x.size()), bits));
  q.scales.resize(x.size() / size_t(group));
  q.biases.resize(x.size() / size_t(group));
  mlx_affine_quantize_row(x.data(), int64_t(x.size()), bits, group, d, q.codes.data(), q.scales.data(),
                          q.biases.data());
  return q;
}

TEST(MlxAffine, AscendingGroupHandWorked) {
  // 0..63, 4 bits: |min| > |max| is false, so the edge is max = 63 and the scale negative:
  // scale = -(63/15) = -4.2, q0 = rint(63 / -4.2) = -15, scale = 63 / -15, bias = 63.
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[size_t(i)] = float(i);
  const Quantized q = quantize(x, 4, 64);
  EXPECT_EQ(q.scales[0], 63.0f / -15.0f);
  EXPECT_EQ(q.biases[0], 63.0f);
  EXPECT_EQ(mlx_affine_code(q.codes.data(), 63, 4), 0u);   // the edge is code 0
  EXPECT_EQ(mlx_affine_code(q.codes.data(), 0, 4), 15u);   // (0 - 63) / -4.2 = 15
  EXPECT_EQ(mlx_affine_code(q.codes.data(), 10, 4), 13u);  // 53 / 4.2 = 12.62
  // 4 bits: code i in bits 4(i%8).. of little-endian word i/8: byte 0 holds codes 0 (low) and 1.
  EXPECT_EQ(uint8_t(q.codes[0]), uint8_t(15 | (15 << 4)));  // (63-0)/4.2 = 15, (63-1)/4.2 = 14.76
}

// A NaN in a file's cache (fuzz_mlx_prompt_cache found one) is no reason for undefined behaviour: the
// clamp keeps a NaN, and casting it is undefined in C++. It becomes code 0; min and max skip it
// (std::max/min keep their first argument against a NaN), so the other codes do not change.
TEST(MlxAffine, ANaNBecomesCodeZeroAndLeavesTheOtherCodesAlone) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[size_t(i)] = float(i);
  const Quantized plain = quantize(x, 4, 64);
  x[10] = std::numeric_limits<float>::quiet_NaN();
  const Quantized q = quantize(x, 4, 64);
  EXPECT_EQ(mlx_affine_code(q.codes.data(), 10, 4), 0u);
  for (int i = 0; i < 64; ++i) {
    if (i == 10) continue;
    EXPECT_EQ(mlx_affine_code(q.codes.data(), i, 4), mlx_affine_code(plain.codes.data(), i, 4)) << i;
  }
  EXPECT_EQ(q.scales[0], plain.scales[0]);
  EXPECT_EQ(q.biases[0], plain.biases[0]);
}

TEST(MlxAffine, ZeroGroupIsMinusEpsInEachType) {
  // All zeros: scale = -max(0, 1e-7), q0 = rint(-0) = -0 == 0, so bias 0 and the scale stays -1e-7;
  // stored as bf16 0xB3D7, f16 0x8002 (subnormal), f32 0xB3D6BF95.
  const Quantized q = quantize(std::vector<float>(32, 0.0f), 8, 32);
  EXPECT_EQ(q.biases[0], 0.0f);
  std::byte b[4];
  mlx_store_float(MlxFloat::kBF16, q.scales[0], b);
  EXPECT_EQ(half::load_u16(b), 0xB3D7);
  mlx_store_float(MlxFloat::kF16, q.scales[0], b);
  EXPECT_EQ(half::load_u16(b), 0x8002);
  mlx_store_float(MlxFloat::kF32, q.scales[0], b);
  EXPECT_EQ(half::f32_to_bits(mlx_load_float(MlxFloat::kF32, b)), 0xB3D6BF95u);
  for (auto c : q.codes) EXPECT_EQ(c, std::byte{0});
}

TEST(MlxAffine, ConstantGroupKeepsItsValueInTheBias) {
  // c = 0.75: range 0 -> scale -1e-7, edge c, q0 = rint(-7.5e6), bias = c exactly, codes 0.
  const Quantized q = quantize(std::vector<float>(64, 0.75f), 4, 64);
  EXPECT_EQ(q.biases[0], 0.75f);
  EXPECT_LT(q.scales[0], 0.0f);
  for (auto c : q.codes) EXPECT_EQ(c, std::byte{0});
}

TEST(MlxAffine, AllNegativeGroupDiffersBetweenCpuAndGpu) {
  // Values in [-10, -9], 2 bits (3 bins). CPU: scale 1/3, edge -10, q0 = rint(-30), scale -10/-30.
  // GPU: the running max starts at 0, so range 10: scale 10/3, q0 = round(-3), scale -10/-3.
  std::vector<float> x(32, -9.5f);
  x[0] = -10.0f;
  x[1] = -9.0f;
  const Quantized c = quantize(x, 2, 32, MlxDevice::kCpu);
  const Quantized g = quantize(x, 2, 32, MlxDevice::kGpu);
  EXPECT_EQ(c.scales[0], -10.0f / -30.0f);
  EXPECT_EQ(g.scales[0], -10.0f / -3.0f);
  EXPECT_EQ(c.biases[0], -10.0f);
  EXPECT_EQ(g.biases[0], -10.0f);
  EXPECT_EQ(mlx_affine_code(c.codes.data(), 1, 2), 3u);  // 1 / (1/3) = 3
  EXPECT_EQ(mlx_affine_code(g.codes.data(), 1, 2), 0u);  // 1 / (10/3) = 0.3
}

TEST(MlxAffine, TiesRoundToEvenOnCpuAndAwayOnGpu) {
  // min 0, max 3, 2 bits: scale -(3/3) = -1, edge 3, q0 = -3, scale 3/-3 = -1, bias 3.
  // 0.5 -> (0.5-3)/-1 = 2.5: CPU 2, GPU 3. 2.5 -> 0.5: CPU 0, GPU 1. 1.5 -> 1.5: both 2.
  std::vector<float> x(32, 1.0f);
  x[0] = 0.0f, x[1] = 3.0f, x[2] = 0.5f, x[3] = 2.5f, x[4] = 1.5f;
  const Quantized c = quantize(x, 2, 32, MlxDevice::kCpu);
  const Quantized g = quantize(x, 2, 32, MlxDevice::kGpu);
  EXPECT_EQ(c.scales[0], -1.0f);
  EXPECT_EQ(mlx_affine_code(c.codes.data(), 2, 2), 2u);
  EXPECT_EQ(mlx_affine_code(g.codes.data(), 2, 2), 3u);
  EXPECT_EQ(mlx_affine_code(c.codes.data(), 3, 2), 0u);
  EXPECT_EQ(mlx_affine_code(g.codes.data(), 3, 2), 1u);
  EXPECT_EQ(mlx_affine_code(c.codes.data(), 4, 2), 2u);
  EXPECT_EQ(mlx_affine_code(g.codes.data(), 4, 2), 2u);
}

TEST(MlxAffine, PackingIsAnLsbFirstBitStreamForEveryWidth) {
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    // 0, 1, ..., 2^bits-1 repeated: with min 0 and max n at codes n..0 (edge = max, code = n - value).
    const int n = (1 << bits) - 1;
    std::vector<float> x(128);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i) % (n + 1));
    x[0] = 0, x[1] = float(n);
    const Quantized q = quantize(x, bits, 128);
    ASSERT_EQ(q.codes.size(), size_t(128 * bits / 8)) << bits;
    for (size_t i = 0; i < x.size(); ++i) {
      // Independent of the codec's reader: stream bit k is bit k%8 of byte k/8.
      uint32_t code = 0;
      for (int b = 0; b < bits; ++b) {
        const size_t k = i * size_t(bits) + size_t(b);
        code |= ((uint32_t(q.codes[k / 8]) >> (k % 8)) & 1u) << b;
      }
      EXPECT_EQ(code, uint32_t(n - int(x[i]))) << "bits " << bits << " value " << i;
    }
  }
  // MLX's Metal dequantizer for 3 bits: out[2] = ((w[0] & 0xc0) >> 6) + ((w[1] & 0x1) << 2).
  std::vector<float> x(32, 0.0f);
  x[0] = 7, x[2] = 2;  // codes 7 - value (edge = max = 7): code 2 = 5
  const Quantized q = quantize(x, 3, 32);
  EXPECT_EQ(((uint32_t(q.codes[0]) & 0xc0) >> 6) + ((uint32_t(q.codes[1]) & 0x1) << 2), 5u);
}

TEST(MlxAffine, DequantizeRoundsProductThenSumToTheType) {
  // bf16: code 3 * scale 1.0078125 = 3.0234375 -> bf16 3.03125 (8 bits of mantissa), + bias 0.001953125
  // = 3.033203125 -> bf16 3.03125. Computed in float without the roundings it would be 3.0253906.
  std::byte codes[4] = {std::byte(3), std::byte(0), std::byte(0), std::byte(0)};  // 8 bits: codes 3,0,0,0
  std::vector<std::byte> row(32, std::byte{0});
  row[0] = codes[0];
  const float s = 1.0078125f, b = 0.001953125f;
  std::vector<float> out(32);
  mlx_affine_dequantize_row(row.data(), &s, &b, 32, 8, 32, MlxFloat::kBF16, out.data());
  EXPECT_EQ(out[0], 3.03125f);
  EXPECT_EQ(out[1], 0.001953125f);
  mlx_affine_dequantize_row(row.data(), &s, &b, 32, 8, 32, MlxFloat::kF32, out.data());
  EXPECT_EQ(out[0], 3.0234375f + 0.001953125f);
}

TEST(MlxAffine, SettingsMlxDoesNotHaveAreRefused) {
  EXPECT_TRUE(mlx_affine_check(4, 64).ok());
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int g : {32, 64, 128}) EXPECT_TRUE(mlx_affine_check(bits, g).ok());
  }
  const Status b7 = mlx_affine_check(7, 64);
  EXPECT_EQ(b7.code(), Code::kInvalidArgument);
  EXPECT_NE(b7.message().find("bits 7"), std::string::npos) << b7.ToString();
  EXPECT_NE(b7.message().find("2, 3, 4, 5, 6 or 8"), std::string::npos) << b7.ToString();
  const Status g48 = mlx_affine_check(4, 48);
  EXPECT_NE(g48.message().find("group size 48"), std::string::npos) << g48.ToString();
  EXPECT_FALSE(mlx_affine_check(1, 16).ok());
  EXPECT_TRUE(mlx_affine_check_dim(128, 64).ok());
  const Status d = mlx_affine_check_dim(80, 64);
  EXPECT_EQ(d.code(), Code::kInvalidArgument);
  EXPECT_NE(d.message().find("head dim 80"), std::string::npos) << d.ToString();
  EXPECT_FALSE(mlx_affine_check_dim(0, 32).ok());
  EXPECT_FALSE(mlx_device_of("metal").ok());
  EXPECT_EQ(*mlx_device_of("gpu"), MlxDevice::kGpu);
}

}  // namespace
}  // namespace kvsnap
