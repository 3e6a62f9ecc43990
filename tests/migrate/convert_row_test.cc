// Row conversion: identity paths, round trips, rotation steps, argument checks.
#include "migrate/convert_row.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "migrate/half.h"
#include "test_inputs.h"

namespace kvsnap {
namespace {

const TypeTraits& T(const char* name) { return *find_traits(name); }

std::vector<std::byte> encode(const TypeTraits& t, const std::vector<float>& x) {
  std::vector<std::byte> out(x.size() / t.block_elems() * t.block_bytes());
  t.from_f32(x.data(), out.data(), x.size());
  return out;
}

std::vector<std::byte> convert(const TypeTraits& s, const TypeTraits& d, const RotationPlan& plan,
                               const std::vector<std::byte>& in, size_t n) {
  auto c = RowConverter::make(s, d, n, plan);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  std::vector<std::byte> out(in.size() / c->src_row_bytes() * c->dst_row_bytes());
  EXPECT_TRUE(c->convert(in, out).ok());
  return out;
}

TEST(ConvertRow, SameTypeIsBytePassThrough) {
  testing::Rng rng(1);
  for (const TypeTraits& t : type_traits()) {
    // arbitrary bytes, NaN payloads and garbage scales included
    std::vector<std::byte> in(4 * 1024 / t.block_elems() * t.block_bytes());
    for (auto& b : in) b = static_cast<std::byte>(rng.u32());
    auto c = RowConverter::make(t, t, 1024, RotationPlan{});
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->is_copy());
    std::vector<std::byte> out(in.size());
    ASSERT_TRUE(c->convert(in, out).ok());
    EXPECT_EQ(in, out) << t.name();
    std::vector<std::byte> one(in.size() / 4);
    ASSERT_TRUE(convert_row(t, t, RotationPlan{}, std::span(in).first(one.size()), one, {}).ok());
    EXPECT_EQ(0, std::memcmp(one.data(), in.data(), one.size()));
  }
}

TEST(ConvertRow, F16ThroughF32RoundTripIsByteIdentical) {
  // every fp16 code that is not NaN, as rows of 1024
  std::vector<uint16_t> codes;
  for (uint32_t h = 0; h < 65536; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;
    codes.push_back(static_cast<uint16_t>(h));
  }
  ASSERT_EQ(codes.size(), 63490u);
  while (codes.size() % 1024) codes.push_back(0x3c00);
  std::vector<std::byte> f16(codes.size() * 2);
  std::memcpy(f16.data(), codes.data(), f16.size());
  const auto f32 = convert(T("f16"), T("f32"), {}, f16, 1024);
  const auto back = convert(T("f32"), T("f16"), {}, f32, 1024);
  EXPECT_EQ(back, f16);
  // NaNs come back as ggml makes them: 0x7E00 with the sign
  std::vector<std::byte> nan(64);
  for (int i = 0; i < 32; i++) half::store_u16(nan.data() + 2 * i, static_cast<uint16_t>(i % 2 ? 0xfc01 + i : 0x7e00 + i));
  const auto nan_back = convert(T("f32"), T("f16"), {}, convert(T("f16"), T("f32"), {}, nan, 32), 32);
  for (int i = 0; i < 32; i++) EXPECT_EQ(half::load_u16(nan_back.data() + 2 * i), i % 2 ? 0xfe00 : 0x7e00);
}

TEST(ConvertRow, Bf16ThroughF32RoundTripIsByteIdentical) {
  std::vector<std::byte> bf(65536 * 2);
  for (uint32_t h = 0; h < 65536; h++) half::store_u16(bf.data() + 2 * h, static_cast<uint16_t>(h));
  const auto back = convert(T("f32"), T("bf16"), {}, convert(T("bf16"), T("f32"), {}, bf, 1024), 1024);
  for (uint32_t h = 0; h < 65536; h++) {
    const bool snan = (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0 && (h & 0x40) == 0;
    ASSERT_EQ(half::load_u16(back.data() + 2 * h), snan ? (h | 0x40) : h) << std::hex << h;  // ggml quiets sNaN
  }
}

TEST(ConvertRow, F16ToBf16AndBackKeepsWhatBf16CanHold) {
  // f16 values with at most 8 significant bits and in bf16 range survive f16 -> bf16 -> f16.
  std::vector<float> x(256);
  for (int i = 0; i < 256; i++) x[i] = static_cast<float>(i - 128) * 0.125f;
  const auto f16 = encode(T("f16"), x);
  const auto back = convert(T("bf16"), T("f16"), {}, convert(T("f16"), T("bf16"), {}, f16, 256), 256);
  EXPECT_EQ(back, f16);
}

TEST(ConvertRow, GenericPathIsToF32RotateFromF32) {
  const size_t n = 1024;
  const auto x = testing::random_rows(testing::Dist::kKvLike, 3, 4, n);
  const auto src = encode(T("f16"), x);
  for (const TypeTraits& q : type_traits()) {
    if (!q.quantized()) continue;
    auto plan = plan_rotation(*T("f16").layout, *q.layout, 128, KvSide::kK);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->step, RotationStep::kRotate);
    const auto got = convert(T("f16"), q, *plan, src, n);
    // by hand
    std::vector<float> f(x.size());
    T("f16").to_f32(src.data(), f.data(), f.size());
    hadamard_rotate(f.data(), f.size(), 128);
    EXPECT_EQ(got, encode(q, f)) << q.name();
    // and back: unrotate after dequantizing
    auto back_plan = plan_rotation(*q.layout, *T("f16").layout, 128, KvSide::kK);
    ASSERT_TRUE(back_plan.ok());
    const auto back = convert(q, T("f16"), *back_plan, got, n);
    std::vector<float> g(x.size());
    q.to_f32(got.data(), g.data(), g.size());
    hadamard_unrotate(g.data(), g.size(), 128);
    EXPECT_EQ(back, encode(T("f16"), g)) << q.name();
  }
}

TEST(ConvertRow, RotationRestoresQualityAfterARoundTrip) {
  // f16 -> q8_0 (rotated) -> f16 (unrotated) lands close to the source; forgetting the
  // un-rotation does not.
  const size_t n = 1024;
  const auto x = testing::random_rows(testing::Dist::kKvLike, 9, 8, n);
  const auto src = encode(T("f16"), x);
  auto to_q = plan_rotation(*T("f16").layout, *T("q8_0").layout, 128, KvSide::kV);
  auto to_f = plan_rotation(*T("q8_0").layout, *T("f16").layout, 128, KvSide::kV);
  ASSERT_TRUE(to_q.ok() && to_f.ok());
  const auto q = convert(T("f16"), T("q8_0"), *to_q, src, n);
  auto err = [&](const std::vector<std::byte>& f16) {
    std::vector<float> y(x.size()), s(x.size());
    T("f16").to_f32(f16.data(), y.data(), y.size());
    T("f16").to_f32(src.data(), s.data(), s.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); i++) {
      num += (y[i] - s[i]) * static_cast<double>(y[i] - s[i]);
      den += s[i] * static_cast<double>(s[i]);
    }
    return std::sqrt(num / den);
  };
  EXPECT_LT(err(convert(T("q8_0"), T("f16"), *to_f, q, n)), 0.01);
  EXPECT_GT(err(convert(T("q8_0"), T("f16"), RotationPlan{}, q, n)), 0.5);
}

TEST(ConvertRow, QuantizedToQuantizedStaysRotated) {
  auto plan = plan_rotation(*T("q8_0").layout, *T("q4_0").layout, 128, KvSide::kK);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->step, RotationStep::kNone);
  const auto x = testing::random_rows(testing::Dist::kGauss, 2, 2, 256);
  const auto q8 = encode(T("q8_0"), x);
  std::vector<float> f(x.size());
  T("q8_0").to_f32(q8.data(), f.data(), f.size());
  EXPECT_EQ(convert(T("q8_0"), T("q4_0"), *plan, q8, 256), encode(T("q4_0"), f));
}

TEST(ConvertRow, ManyRowsEqualOneAtATime) {
  const size_t n = 256, rows = 5;
  const auto x = testing::random_rows(testing::Dist::kOutliers, 4, rows, n);
  const auto src = encode(T("bf16"), x);
  RotationPlan plan{RotationStep::kRotate, 64, false, true};
  const auto all = convert(T("bf16"), T("iq4_nl"), plan, src, n);
  std::vector<float> scratch(n);
  const size_t sb = n * 2, db = n / 32 * 18;
  for (size_t r = 0; r < rows; r++) {
    std::vector<std::byte> one(db);
    ASSERT_TRUE(convert_row(T("bf16"), T("iq4_nl"), plan, std::span(src).subspan(r * sb, sb), one, scratch).ok());
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * db, db)) << r;
  }
}

TEST(ConvertRow, RejectsBadShapes) {
  RotationPlan none;
  // not whole blocks of the destination
  EXPECT_EQ(RowConverter::make(T("f16"), T("q8_0"), 48, none).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RowConverter::make(T("f16"), T("f32"), 0, none).status().code(), Code::kInvalidArgument);
  // row not whole rotation blocks
  RotationPlan rot{RotationStep::kRotate, 128, false, true};
  EXPECT_EQ(RowConverter::make(T("f16"), T("q8_0"), 64 * 3, rot).status().code(), Code::kInvalidArgument);
  RotationPlan odd{RotationStep::kRotate, 96, false, true};
  EXPECT_EQ(RowConverter::make(T("f16"), T("q8_0"), 96 * 4, odd).status().code(), Code::kInvalidArgument);

  auto c = RowConverter::make(T("f16"), T("q8_0"), 64, none);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->src_row_bytes(), 128u);
  EXPECT_EQ(c->dst_row_bytes(), 68u);
  std::vector<std::byte> in(256), out(136);
  EXPECT_TRUE(c->convert(in, out).ok());
  EXPECT_EQ(c->convert(std::span(in).first(200), out).code(), Code::kInvalidArgument);        // partial row
  EXPECT_EQ(c->convert(in, std::span(out).first(100)).code(), Code::kInvalidArgument);        // short output

  std::vector<float> scratch(64);
  std::vector<std::byte> row_out(68);
  EXPECT_EQ(convert_row(T("f16"), T("q8_0"), none, std::span(in).first(127), row_out, scratch).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(convert_row(T("f16"), T("q8_0"), none, std::span(in).first(128), std::span(row_out).first(34), scratch)
                .code(),
            Code::kInvalidArgument);
  EXPECT_EQ(convert_row(T("f16"), T("q8_0"), none, std::span(in).first(128), row_out, std::span(scratch).first(10))
                .code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(convert_row(T("f16"), T("q8_0"), none, std::span(in).first(128), row_out, scratch).ok());
}

}  // namespace
}  // namespace kvsnap
