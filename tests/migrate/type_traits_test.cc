// The codec table: one row per KV type, consistent with format/ggml_types.h; properties of
// the codecs that need no reference library (the golden test pins the exact bytes).
#include "migrate/type_traits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "migrate/half.h"
#include "test_inputs.h"

namespace kvsnap {
namespace {

TEST(TypeTraits, OneRowPerKvTypeSharingTheLayoutTable) {
  const auto traits = type_traits();
  const auto layouts = kv_cache_types();
  // The rows of the one table flagged for -ctk/-ctv, counted here rather than through kv_cache_types().
  const size_t kv_rows = size_t(std::count_if(kGgmlTypes.begin(), kGgmlTypes.end(),
                                              [](const TypeLayout& t) { return t.kv_cache(); }));
  ASSERT_GT(kv_rows, 0u);
  ASSERT_EQ(traits.size(), kv_rows);
  ASSERT_EQ(traits.size(), layouts.size());
  std::set<int32_t> ids;
  for (size_t i = 0; i < traits.size(); i++) {
    EXPECT_EQ(traits[i].layout, &layouts[i]) << "row " << i << " must point into kv_cache_types()";
    EXPECT_NE(traits[i].to_f32, nullptr);
    EXPECT_NE(traits[i].from_f32, nullptr);
    ids.insert(static_cast<int32_t>(traits[i].id()));
  }
  EXPECT_EQ(ids.size(), kv_rows);
}

TEST(TypeTraits, FindByIdNameAndLayout) {
  for (const TypeTraits& t : type_traits()) {
    EXPECT_EQ(find_traits(static_cast<int32_t>(t.id())), &t);
    EXPECT_EQ(find_traits(t.id()), &t);
    EXPECT_EQ(find_traits(t.name()), &t);
    EXPECT_EQ(find_traits(*t.layout), &t);
  }
  EXPECT_EQ(find_traits(4), nullptr);   // removed q4_2
  EXPECT_EQ(find_traits(12), nullptr);  // q4_K: not a KV cache type
  EXPECT_EQ(find_traits(-1), nullptr);
  EXPECT_EQ(find_traits("q8_K"), nullptr);
  EXPECT_EQ(find_traits("Q8_0"), nullptr);  // ggml names are lower case
  EXPECT_EQ(find_traits("iq4_nl")->block_bytes(), 18u);
  EXPECT_TRUE(find_traits("q5_1")->quantized());
  EXPECT_FALSE(find_traits("bf16")->quantized());
}

// The scalar fp16 conversion against an independent definition (exact value arithmetic).
TEST(Half, Fp16ToF32EveryCode) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float got = half::fp16_to_f32(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (nan) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      // quiet, payload kept, sign kept
      EXPECT_EQ(testing::f32_bits(got), ((h & 0x8000u) << 16) | 0x7f800000u | 0x00400000u | ((h & 0x3ffu) << 13))
          << std::hex << h;
    } else {
      ASSERT_EQ(testing::f32_bits(got), testing::f32_bits(testing::f16_code_value(static_cast<uint16_t>(h))))
          << std::hex << h;
    }
  }
}

TEST(Half, F32ToFp16RoundsToNearestEven) {
  // Every non-NaN code maps back to itself.
  for (uint32_t h = 0; h < 65536; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;
    ASSERT_EQ(half::f32_to_fp16(testing::f16_code_value(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
  EXPECT_EQ(half::f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);         // tie -> even (down)
  EXPECT_EQ(half::f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);     // tie -> even (up)
  EXPECT_EQ(half::f32_to_fp16(1.0f + 0x1p-11f + 0x1p-23f), 0x3c01);
  EXPECT_EQ(half::f32_to_fp16(65519.996f), 0x7bff);              // below the overflow tie
  EXPECT_EQ(half::f32_to_fp16(65520.0f), 0x7c00);                // overflow tie -> inf
  EXPECT_EQ(half::f32_to_fp16(0x1p-25f), 0x0000);                // subnormal tie -> 0 (even)
  EXPECT_EQ(half::f32_to_fp16(3 * 0x1p-25f), 0x0002);            // tie -> even
  EXPECT_EQ(half::f32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(half::f32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(half::f32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(half::f32_to_fp16(testing::bits_f32(0x7f800001)), 0x7e00);  // every NaN -> 0x7E00
  EXPECT_EQ(half::f32_to_fp16(testing::bits_f32(0xffc12345)), 0xfe00);
}

TEST(Half, Bf16) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float f = half::bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(testing::f32_bits(f), h << 16);
    const bool snan = (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0 && (h & 0x40) == 0;
    ASSERT_EQ(half::f32_to_bf16(f), snan ? (h | 0x40) : h) << std::hex << h;
  }
  EXPECT_EQ(half::f32_to_bf16(testing::bits_f32(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(half::f32_to_bf16(testing::bits_f32(0x3f818000)), 0x3f82);
  EXPECT_EQ(half::f32_to_bf16(testing::bits_f32(0x3f808001)), 0x3f81);
  EXPECT_EQ(half::f32_to_bf16(testing::bits_f32(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(half::f32_to_bf16(testing::bits_f32(0x00008000)), 0x0000);  // subnormals kept, tie -> even
  EXPECT_EQ(half::f32_to_bf16(testing::bits_f32(0x00018000)), 0x0002);
  EXPECT_EQ(half::f32_to_bf16(testing::bits_f32(0x7f800001)), 0x7fc0);  // NaN made quiet
}

// Shapes and invariants every quantizer must keep, whatever the input.
TEST(TypeTraits, QuantizersAreDeterministicAndBlockLocal) {
  const auto x = testing::random_rows(testing::Dist::kGauss, 7, 1, 256);
  for (const TypeTraits& t : type_traits()) {
    const size_t bytes = 256 / t.block_elems() * t.block_bytes();
    std::vector<std::byte> a(bytes), b(bytes), part(bytes);
    t.from_f32(x.data(), a.data(), 256);
    t.from_f32(x.data(), b.data(), 256);
    EXPECT_EQ(a, b) << t.name();
    // converting the second half alone gives the second half of the bytes
    t.from_f32(x.data() + 128, part.data(), 128);
    EXPECT_EQ(0, std::memcmp(part.data(), a.data() + bytes / 2, bytes / 2)) << t.name();
  }
}

TEST(TypeTraits, ZerosStayZeroAndScalesFinite) {
  for (const TypeTraits& t : type_traits()) {
    std::vector<float> zeros(64, 0.0f), back(64, 1.0f);
    std::vector<std::byte> q(64 / t.block_elems() * t.block_bytes(), std::byte{0x55});
    t.from_f32(zeros.data(), q.data(), 64);
    t.to_f32(q.data(), back.data(), 64);
    for (float v : back) EXPECT_EQ(v, 0.0f) << t.name();
    EXPECT_TRUE(validate_row(t, q).ok()) << t.name();
  }
}

TEST(TypeTraits, QuantizationErrorIsBounded) {
  // Relative RMS error of a round trip on gaussian rows: a sanity net under the golden test.
  const std::pair<const char*, double> bounds[] = {{"f32", 0},     {"f16", 1e-3},  {"bf16", 5e-3},
                                                    {"q8_0", 0.01}, {"q5_0", 0.05}, {"q5_1", 0.05},
                                                    {"q4_0", 0.1},  {"q4_1", 0.1},  {"iq4_nl", 0.1}};
  const auto x = testing::random_rows(testing::Dist::kGauss, 11, 64, 128);
  for (auto [name, bound] : bounds) {
    const TypeTraits& t = *find_traits(name);
    std::vector<std::byte> q(x.size() / t.block_elems() * t.block_bytes());
    std::vector<float> y(x.size());
    t.from_f32(x.data(), q.data(), x.size());
    t.to_f32(q.data(), y.data(), y.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); i++) {
      num += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
      den += x[i] * static_cast<double>(x[i]);
    }
    EXPECT_LE(std::sqrt(num / den), bound) << name;
  }
}

TEST(ValidateRow, FindsNonFiniteValuesAndScales) {
  const TypeTraits& q8 = *find_traits("q8_0");
  std::vector<float> x(64, 1.0f);
  std::vector<std::byte> q(68);
  q8.from_f32(x.data(), q.data(), 64);
  EXPECT_TRUE(validate_row(q8, q).ok());
  half::store_u16(q.data() + 34, 0x7c00);  // block 1 scale = inf
  const Status s = validate_row(q8, q);
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_NE(s.message().find("block 1"), std::string::npos) << s.message();
  EXPECT_EQ(validate_row(q8, std::span(q).first(35)).code(), Code::kCorruption);  // not whole blocks

  const TypeTraits& q41 = *find_traits("q4_1");
  std::vector<std::byte> b(20, std::byte{0});
  half::store_u16(b.data() + 2, 0x7e00);  // min = NaN
  EXPECT_NE(validate_row(q41, b).message().find("NaN"), std::string::npos);

  const TypeTraits& f16 = *find_traits("f16");
  std::vector<std::byte> h(8, std::byte{0});
  EXPECT_TRUE(validate_row(f16, h).ok());
  half::store_u16(h.data() + 6, 0xfc00);
  EXPECT_NE(validate_row(f16, h).message().find("value 3"), std::string::npos);
  const TypeTraits& bf = *find_traits("bf16");
  half::store_u16(h.data() + 6, 0x7fc0);
  EXPECT_NE(validate_row(bf, h).message().find("NaN"), std::string::npos);
  const TypeTraits& f32 = *find_traits("f32");
  std::vector<float> fv = {1.0f, std::numeric_limits<float>::infinity()};
  EXPECT_EQ(validate_row(f32, std::as_bytes(std::span(fv))).code(), Code::kCorruption);
}

}  // namespace
}  // namespace kvsnap
