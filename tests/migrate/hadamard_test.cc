// The Hadamard rotation and the rule deciding when a conversion rotates.
#include "migrate/hadamard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_inputs.h"

namespace kvsnap {
namespace {

const TypeLayout& L(const char* name) { return *find_type(name); }

TEST(Hadamard, MatrixIsOrthonormalAndSymmetric) {
  for (uint32_t n : {2u, 4u, 64u, 128u, 256u}) {
    const auto h = hadamard_matrix(n);
    for (uint32_t i = 0; i < n; i++) {
      for (uint32_t j = 0; j < n; j++) {
        ASSERT_EQ(h[i * n + j], h[j * n + i]);
        ASSERT_EQ(std::fabs(h[i * n + j]), h[0]);
        double dot = 0;  // (H.H)[i][j]
        for (uint32_t k = 0; k < n; k++) dot += static_cast<double>(h[i * n + k]) * h[k * n + j];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << n << " " << i << " " << j;
      }
    }
  }
}

TEST(Hadamard, TransformEqualsMatrixProduct) {
  for (uint32_t n : {64u, 128u, 256u}) {
    const auto h = hadamard_matrix(n);
    const auto x = testing::random_rows(testing::Dist::kGauss, n, 4, n);
    auto y = x;
    hadamard_rotate(y.data(), y.size(), n);
    for (size_t r = 0; r < 4; r++) {
      for (uint32_t i = 0; i < n; i++) {
        double want = 0;
        for (uint32_t k = 0; k < n; k++) want += static_cast<double>(h[i * n + k]) * x[r * n + k];
        ASSERT_NEAR(y[r * n + i], want, 1e-5) << n;
      }
    }
  }
}

TEST(Hadamard, UnitVectorsAreExact) {
  // n = 64: scale 1/8 and sums of one nonzero value are exact.
  std::vector<float> e(128, 0.0f);
  e[3] = 1.0f;
  e[64 + 0] = -2.0f;
  hadamard_rotate(e.data(), e.size(), 64);
  const auto h = hadamard_matrix(64);
  for (uint32_t i = 0; i < 64; i++) {
    EXPECT_EQ(e[i], h[i * 64 + 3]);  // column 3
    EXPECT_EQ(e[64 + i], -0.25f);    // -2 * 1/8 everywhere
  }
}

TEST(Hadamard, SelfInverseWithinRounding) {
  for (uint32_t n : {64u, 128u, 256u}) {
    for (auto dist : {testing::Dist::kGauss, testing::Dist::kKvLike, testing::Dist::kF16Exact}) {
      const auto x = testing::random_rows(dist, 3, 8, 1024);
      auto y = x;
      hadamard_rotate(y.data(), y.size(), n);
      hadamard_unrotate(y.data(), y.size(), n);
      for (size_t b = 0; b < x.size(); b += n) {
        float amax = 0;
        for (uint32_t j = 0; j < n; j++) amax = std::max(amax, std::fabs(x[b + j]));
        for (uint32_t j = 0; j < n; j++) {
          // a few ulp of the block's largest value: log2(n) roundings in each direction
          ASSERT_NEAR(y[b + j], x[b + j], amax * 1e-6f) << n << " " << testing::dist_name(dist);
        }
      }
    }
  }
  // powers of two that stay exact: the round trip is the identity
  std::vector<float> p(64);
  for (int j = 0; j < 64; j++) p[j] = static_cast<float>(j % 2 ? -1 : 1) * 8.0f;
  auto q = p;
  hadamard_rotate(q.data(), 64, 64);
  hadamard_rotate(q.data(), 64, 64);
  EXPECT_EQ(q, p);
}

TEST(Hadamard, BlocksAreIndependent) {
  const auto x = testing::random_rows(testing::Dist::kUniform, 5, 1, 512);
  auto whole = x;
  hadamard_rotate(whole.data(), 512, 128);
  for (size_t b = 0; b < 512; b += 128) {
    std::vector<float> part(x.begin() + b, x.begin() + b + 128);
    hadamard_rotate(part.data(), 128, 128);
    for (size_t j = 0; j < 128; j++) ASSERT_EQ(part[j], whole[b + j]);
  }
}

TEST(RotationRule, BlockSizes) {
  // K: largest power of two >= 64 dividing head_dim; V: 64; none unless head_dim % 64 == 0
  EXPECT_EQ(rotation_block_size(KvSide::kK, 64), 64u);
  EXPECT_EQ(rotation_block_size(KvSide::kK, 128), 128u);
  EXPECT_EQ(rotation_block_size(KvSide::kK, 192), 64u);
  EXPECT_EQ(rotation_block_size(KvSide::kK, 256), 256u);
  EXPECT_EQ(rotation_block_size(KvSide::kK, 320), 64u);
  EXPECT_EQ(rotation_block_size(KvSide::kK, 384), 128u);
  EXPECT_EQ(rotation_block_size(KvSide::kK, 512), 512u);
  EXPECT_EQ(rotation_block_size(KvSide::kK, 576), 64u);
  EXPECT_EQ(rotation_block_size(KvSide::kV, 64), 64u);
  EXPECT_EQ(rotation_block_size(KvSide::kV, 128), 64u);
  EXPECT_EQ(rotation_block_size(KvSide::kV, 512), 64u);
  for (uint32_t hd : {0u, 32u, 80u, 96u, 100u, 112u, 160u}) {
    EXPECT_EQ(rotation_block_size(KvSide::kK, hd), 0u) << hd;
    EXPECT_EQ(rotation_block_size(KvSide::kV, hd), 0u) << hd;
  }
}

TEST(RotationRule, TableOverAllTypePairs) {
  for (const TypeLayout& s : kv_cache_types()) {
    for (const TypeLayout& d : kv_cache_types()) {
      for (KvSide side : {KvSide::kK, KvSide::kV}) {
        auto p = plan_rotation(s, d, 128, side);
        ASSERT_TRUE(p.ok());
        RotationStep want = RotationStep::kNone;
        if (!s.quantized && d.quantized) want = RotationStep::kRotate;
        if (s.quantized && !d.quantized) want = RotationStep::kUnrotate;
        EXPECT_EQ(p->step, want) << s.name << " -> " << d.name;
        EXPECT_EQ(p->src_rotated, s.quantized);
        EXPECT_EQ(p->dst_rotated, d.quantized);
        EXPECT_EQ(p->n_rot, want == RotationStep::kNone ? 0u : side == KvSide::kK ? 128u : 64u);
        // head_dim llama.cpp does not rotate, or layers with different head dims (0): nothing
        for (uint32_t hd : {0u, 80u, 96u}) {
          auto q = plan_rotation(s, d, hd, side);
          ASSERT_TRUE(q.ok());
          EXPECT_EQ(q->step, RotationStep::kNone);
          EXPECT_FALSE(q->src_rotated || q->dst_rotated);
        }
        // off: nothing, ever
        auto o = plan_rotation(s, d, 128, side, RotationMode::kOff);
        ASSERT_TRUE(o.ok());
        EXPECT_EQ(o->step, RotationStep::kNone);
      }
    }
  }
}

TEST(RotationRule, PerEndOverrides) {
  // An unrotated q8_0 (old llama.cpp, or LLAMA_ATTN_ROT_DISABLE=1) to a rotated q4_0.
  auto p = plan_rotation(L("q8_0"), L("q4_0"), 128, KvSide::kK, RotationOverride{RotationMode::kOff, RotationMode::kAuto});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->step, RotationStep::kRotate);
  EXPECT_EQ(p->n_rot, 128u);
  // rotated q8_0 to a server running with rotation disabled
  p = plan_rotation(L("q8_0"), L("q4_0"), 128, KvSide::kV, RotationOverride{RotationMode::kAuto, RotationMode::kOff});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->step, RotationStep::kUnrotate);
  EXPECT_EQ(p->n_rot, 64u);
  // f16 to a q8_0 server with rotation disabled: plain quantization
  p = plan_rotation(L("f16"), L("q8_0"), 64, KvSide::kK, RotationOverride{RotationMode::kAuto, RotationMode::kOff});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->step, RotationStep::kNone);
  // forced on where llama.cpp cannot rotate: refused
  auto bad = plan_rotation(L("f16"), L("q8_0"), 80, KvSide::kK, RotationMode::kOn);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("80"), std::string::npos);
  // forced on for both ends: same domain, nothing to do
  p = plan_rotation(L("f16"), L("q8_0"), 64, KvSide::kK, RotationMode::kOn);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->step, RotationStep::kNone);
}

TEST(RotationRule, LlamaRotates) {
  EXPECT_TRUE(llama_rotates(L("q4_0"), 64, KvSide::kK));
  EXPECT_TRUE(llama_rotates(L("iq4_nl"), 128, KvSide::kV));
  EXPECT_FALSE(llama_rotates(L("f16"), 128, KvSide::kK));
  EXPECT_FALSE(llama_rotates(L("bf16"), 128, KvSide::kV));
  EXPECT_FALSE(llama_rotates(L("q8_0"), 96, KvSide::kK));
  EXPECT_EQ(to_string(RotationStep::kUnrotate), "unrotate");
}

}  // namespace
}  // namespace kvsnap
