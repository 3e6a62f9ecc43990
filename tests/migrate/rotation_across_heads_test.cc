// A KV cache whose layers share a head dim that is not a multiple of 64 while layer 0's is (an
// SWA cache of 96 beside a base cache of 128): llama.cpp rotates it in blocks of 64 that straddle
// heads (format/rotation_rule.h rotates_across_heads). A conversion that would read or write such a
// cache rotated is refused, naming both head dims; one that never meets the rotation goes on.
#include <gtest/gtest.h>

#include "format/llama_state.h"
#include "format/rotation_rule.h"
#include "migrate/conversion_spec.h"
#include "synthetic_cache.h"

namespace kvsnap {
namespace {

TEST(RotationRule, AcrossHeadsOnlyWhereLayerZerosHeadDimRotatesAndTheSectionsDoesNotDivide) {
  EXPECT_TRUE(rotates_across_heads(96, 128));
  EXPECT_TRUE(rotates_across_heads(160, 64));
  EXPECT_FALSE(rotates_across_heads(96, 96));    // layer 0's is not a multiple of 64: no rotation
  EXPECT_FALSE(rotates_across_heads(128, 96));
  EXPECT_FALSE(rotates_across_heads(192, 128));  // blocks of 64 inside each head
  EXPECT_FALSE(rotates_across_heads(0, 128));    // the section's layers differ: no rotation
  EXPECT_FALSE(rotates_across_heads(96, 0));     // layer 0 unknown
  // llama.cpp's own K block for such a section is 64 (build_input_k_rot).
  EXPECT_EQ(k_rotation_block(96, 128), std::optional<uint32_t>(64));
}

TEST(RotationRule, TheModelsGeometryKnowsLayerZero) {
  ModelInfo m;
  m.head_dim_k = m.head_dim_v = {{128, 128}, {96, 96}};  // base cache, SWA cache
  m.layer0_head_dim_k = m.layer0_head_dim_v = 128;
  const RotationGeometry g = model_rotation_geometry(m);
  EXPECT_FALSE(g.across_heads(false, 0));
  EXPECT_TRUE(g.across_heads(false, 1));
  EXPECT_TRUE(g.across_heads(true, 1));
  EXPECT_FALSE(g.across_heads(true, 2));  // no such section
}

using test::Parsed;

// A v0.5.0 (rotating) slot of 2 layers, 2 heads of 96.
Parsed slot(int32_t type) {
  test::Spec s;
  s.k_type = s.v_type = type;
  s.head_dim = 96;
  s.n_layer = 2;
  s.cells = 64;
  s.data = test::Data::kIid;
  auto p = test::parse_built(s, "swa96.slot");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : Parsed{};
}

Status convert(const Parsed& p, ConversionSpec spec, uint32_t layer0) {
  RotationGeometry g{{96}, {96}};
  g.layer0_k = g.layer0_v = layer0;
  spec.geometry = g;
  return test::converted(p.state, *p.file, spec).status();
}

TEST(RotationAcrossHeads, AQuantizedEndIsRefusedNamingBothHeadDims) {
  const Parsed q8 = slot(8);
  ConversionSpec to_f16;
  to_f16.ctk = to_f16.ctv = "f16";
  const Status st = convert(q8, to_f16, 128);
  ASSERT_EQ(st.code(), Code::kNotSupported) << st.ToString();
  EXPECT_NE(st.message().find("straddle heads"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("head dim 96"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("layer 0's is 128"), std::string::npos) << st.ToString();

  const Parsed f16 = slot(1);
  ConversionSpec to_q4;
  to_q4.ctk = to_q4.ctv = "q4_0";
  EXPECT_EQ(convert(f16, to_q4, 128).code(), Code::kNotSupported);
  ConversionSpec requant;  // both ends rotated alike: still refused, the blocks are not llama.cpp's to trust
  requant.ctk = requant.ctv = "q4_0";
  EXPECT_EQ(convert(q8, requant, 128).code(), Code::kNotSupported);
}

TEST(RotationAcrossHeads, NoRotatedEndGoesOn) {
  const Parsed f16 = slot(1);
  ConversionSpec to_f32;
  to_f32.ctk = to_f32.ctv = "f32";
  EXPECT_TRUE(convert(f16, to_f32, 128).ok());
  const Parsed q8 = slot(8);
  ConversionSpec unrotated;  // written with LLAMA_ATTN_ROT_DISABLE=1, read by such a server
  unrotated.ctk = unrotated.ctv = "f16";
  unrotated.rotation = "off";
  const Status st = convert(q8, unrotated, 128);
  EXPECT_TRUE(st.ok()) << st.ToString();
  // Layer 0 unknown (head dims from --head-dim-k/v, one for every layer): llama.cpp does not rotate 96.
  ConversionSpec to_f16;
  to_f16.ctk = to_f16.ctv = "f16";
  const Status plain = convert(q8, to_f16, 0);
  EXPECT_TRUE(plain.ok()) << plain.ToString();
}

}  // namespace
}  // namespace kvsnap
