// The head dim read from RoPE (migrate/rope_head_dim.h) on files real llama.cpp wrote
// (fixtures/): every fixture with its own model is never contradicted, and is confirmed where
// llama.cpp's K rows carry enough same-token cells; a file read with the model of the other head
// dim but the same KV row width (tiny-hd64: 2 heads of 64, tiny-hd128: 1 of 128) is refused by
// parse_for_model, which convert, migrate, info and restore all read through.
#include "migrate/rope_head_dim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/json.h"
#include "format/state_builder.h"
#include "migrate/hadamard.h"
#include "migrate/model_info.h"
#include "migrate/source_rotation.h"
#include "migrate/type_traits.h"

namespace kvsnap {
namespace {

using V = HeadDimEvidence::Verdict;

std::string fixture(const std::string& name) { return std::string(KVSNAP_SOURCE_DIR) + "/fixtures/" + name; }

struct Checked {
  Status parsed;             // parse_for_model's status
  HeadDimEvidence evidence;  // check_head_dim with the model's claim
  bool claimed = false;      // the model has a claim (its layer 0 holds K with RoPE)
};

// `file` read with `model`: parse_for_model's verdict, and the evidence itself (the state parsed
// without the check, so a refused file still shows its numbers).
Checked check(const std::string& file, const std::string& model) {
  Checked out;
  auto m = load_model_info(posix_io(), fixture(model));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  auto f = posix_io().open_read(fixture(file));
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!m.ok() || !f.ok()) return out;
  out.parsed = parse_for_model(**f, {}, &*m).status();
  ParseOptions po;
  po.shape = &m->shape;
  auto st = parse_state(**f, po);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  auto claim = model_head_dim_claim(m->profile, m->path);
  out.claimed = claim.has_value();
  if (!st.ok() || !claim) return out;
  auto e = check_head_dim(**f, *st, *claim);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (e.ok()) out.evidence = *e;
  return out;
}

TEST(RopeHeadDim, VerdictNames) {
  EXPECT_STREQ(verdict_name(V::kConfirmed), "confirmed");
  EXPECT_STREQ(verdict_name(V::kContradicted), "contradicted");
  EXPECT_STREQ(verdict_name(V::kUnsure), "unsure");
}

// The case that converted silently wrong: the same KV width, the other head dim.
TEST(RopeHeadDim, TheOtherModelOfTheSameWidthIsRefused) {
  for (const std::string tag : {"b10361", "v0.5.0", "b8390"}) {
    for (const auto& [file, wrong, truth] :
         {std::tuple{"hd64-f16-f16-faon.slot", "tiny-hd128.gguf", 64u},
          std::tuple{"hd64-q8_0-q8_0-faon.slot", "tiny-hd128.gguf", 64u},
          std::tuple{"hd128-f16-f16-faon.slot", "tiny-hd64.gguf", 128u},
          std::tuple{"hd128-q8_0-q8_0-faon.slot", "tiny-hd64.gguf", 128u}}) {
      SCOPED_TRACE(tag + "/" + file + " with " + wrong);
      Checked c = check(tag + "/" + file, std::string("models/") + wrong);
      EXPECT_EQ(c.evidence.verdict, V::kContradicted) << c.evidence.summary;
      EXPECT_EQ(c.evidence.observed, truth) << c.evidence.summary;
      EXPECT_EQ(c.parsed.code(), Code::kMismatch) << c.parsed.ToString();
      EXPECT_NE(c.parsed.message().find("head dim " + std::to_string(truth)), std::string::npos) << c.parsed.ToString();
      EXPECT_NE(c.parsed.message().find("--model"), std::string::npos) << c.parsed.ToString();
    }
  }
}

TEST(RopeHeadDim, TheRightModelIsConfirmed) {
  for (const std::string tag : {"b10361", "v0.5.0", "b8390"}) {
    for (const auto& [file, model] : {std::pair{"hd64-f16-f16-faon.slot", "tiny-hd64.gguf"},
                                      std::pair{"hd64-q8_0-q8_0-faon.slot", "tiny-hd64.gguf"},
                                      std::pair{"hd128-f16-f16-faon.slot", "tiny-hd128.gguf"},
                                      std::pair{"hd128-q8_0-q8_0-faon.slot", "tiny-hd128.gguf"}}) {
      SCOPED_TRACE(tag + "/" + file);
      Checked c = check(tag + "/" + file, std::string("models/") + model);
      EXPECT_TRUE(c.parsed.ok()) << c.parsed.ToString();
      EXPECT_EQ(c.evidence.verdict, V::kConfirmed) << c.evidence.summary;
    }
  }
}

// What cannot be a witness says so and decides nothing.
TEST(RopeHeadDim, WithoutEvidenceNothingIsDecided) {
  auto m = load_model_info(posix_io(), fixture("models/tiny-hd128.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto f = posix_io().open_read(fixture("v0.5.0/hd64-f16-f16-faon.slot"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ParseOptions po;
  po.shape = &m->shape;
  auto parsed = parse_state(**f, po);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const HeadDimClaim claim = *model_head_dim_claim(m->profile, m->path);
  ASSERT_EQ(claim.head_dim, 128u);
  auto verdict_of = [&](const StateFile& st, const HeadDimClaim& c) {
    auto e = check_head_dim(**f, st, c);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? *e : HeadDimEvidence{};
  };
  ASSERT_EQ(verdict_of(*parsed, claim).verdict, V::kContradicted);  // the control: it is a witness as it is

  StateFile st = *parsed;
  st.tokens.media_positions = {3};  // media take positions without a token
  HeadDimEvidence e = verdict_of(st, claim);
  EXPECT_EQ(e.verdict, V::kUnsure);
  EXPECT_NE(e.summary.find("media"), std::string::npos) << e.summary;

  st = *parsed;
  st.tokens.tokens.resize(12);  // few tokens: few cells of one token
  e = verdict_of(st, claim);
  EXPECT_EQ(e.verdict, V::kUnsure);
  EXPECT_NE(e.summary.find("pairs of cells"), std::string::npos) << e.summary;

  st = *parsed;
  for (auto& cell : st.memory.kv[0].streams[0].cells) cell.pos = 0;  // one position for every cell
  EXPECT_EQ(verdict_of(st, claim).verdict, V::kUnsure);

  st = *parsed;
  st.memory.kv[0].streams.push_back(st.memory.kv[0].streams[0]);  // whose tokens?
  e = verdict_of(st, claim);
  EXPECT_EQ(e.verdict, V::kUnsure);
  EXPECT_NE(e.summary.find("streams"), std::string::npos) << e.summary;

  HeadDimClaim odd = claim;
  odd.head_dim = 48;  // 128 values are not heads of 48
  EXPECT_EQ(verdict_of(*parsed, odd).verdict, V::kUnsure);
  HeadDimClaim elsewhere = claim;
  elsewhere.section = 1;  // no such section
  e = verdict_of(*parsed, elsewhere);
  EXPECT_EQ(e.verdict, V::kUnsure);
  EXPECT_NE(e.summary.find("no KV section"), std::string::npos) << e.summary;
  elsewhere = claim;
  elsewhere.layer = 99;  // no such layer
  EXPECT_EQ(verdict_of(*parsed, elsewhere).verdict, V::kUnsure);

  st = *parsed;
  st.memory.kv[0].streams[0].layers[0].k.size -= 1;  // rows past the range: the file contradicts itself
  auto bad = check_head_dim(**f, st, claim);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption) << bad.status().ToString();
}

// The rotation of an old-format file (b10361's ggsq v2: eras D..G, the layout cannot tell) from the
// head dims alone, as `convert --head-dim-k` or a snapshot's geometry gives them: the right ones
// decide it (rotated by 64); wrong ones are refused, never taken for a rotation (a review's
// finding: a section's answer was taken whatever its verdict).
TEST(RopeHeadDim, TheRotationIsToldOnlyByAConfirmedHeadDim) {
  auto f = posix_io().open_read(fixture("b10361/hd64-q8_0-q8_0-faon.slot"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto st = parse_state(**f);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto right = decide_source_rotation(f->get(), *st, RotationGeometry{{64}, {64}}, std::nullopt, {});
  ASSERT_TRUE(right.ok()) << right.status().ToString();
  EXPECT_EQ(right->rotated, Tri::kYes);
  EXPECT_EQ(right->decided_by, "rope");
  auto wrong = decide_source_rotation(f->get(), *st, RotationGeometry{{128}, {128}}, std::nullopt, {});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Code::kMismatch) << wrong.status().ToString();
  EXPECT_NE(wrong.status().message().find("has head dim 64"), std::string::npos) << wrong.status().ToString();
}

// A model whose layer 0 has no K or no RoPE claims nothing: lfm2's first layer is a convolution.
TEST(RopeHeadDim, AModelWithoutAWitnessLayerClaimsNothing) {
  auto hybrid = load_model_info(posix_io(), fixture("models/tiny-hybrid.gguf"));
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().ToString();
  EXPECT_FALSE(model_head_dim_claim(hybrid->profile, hybrid->path).has_value());
  auto iswa = load_model_info(posix_io(), fixture("models/tiny-iswa.gguf"));
  ASSERT_TRUE(iswa.ok()) << iswa.status().ToString();
  auto claim = model_head_dim_claim(iswa->profile, iswa->path);
  ASSERT_TRUE(claim.has_value());
  EXPECT_EQ(claim->head_dim, 64u);
  ModelProfile no_rope = iswa->profile;
  no_rope.rope = RopeKind::kNone;
  EXPECT_FALSE(model_head_dim_claim(no_rope, "x").has_value());
}

// Partial rotary as Phi-4-mini has it (NEOX rope over the first 96 of each head's 128 values; phi2,
// stablelm, gpt-neox likewise): layer 0's K of a synthetic state, each cell's the NEOX RoPE at its
// position of its token's vector, 2 KV heads; the K type `k_type` (f32, or q8_0 stored rotated by
// llama.cpp's block or not). tests/oracle/partial_rotary_test.sh has the caches real llama.cpp writes.
struct PartialRopeState {
  std::vector<std::byte> bytes;
  StateFile state;
};
PartialRopeState partial_rope_state(GgmlType k_type, bool rotated) {
  constexpr uint32_t kHeadDim = 128, kRopeDims = 96, kHeads = 2, kCells = 96, kTokens = 9;
  constexpr uint32_t W = kHeadDim * kHeads;
  testing::SynthSpec spec;
  spec.cells = kCells;
  spec.layers = {testing::SynthLayer{int32_t(k_type), W, 1, W}};
  spec.token_words.clear();
  for (uint32_t c = 0; c < kCells; ++c) spec.token_words.push_back(int32_t(c % kTokens));
  PartialRopeState out{testing::build_state(spec), {}};
  auto parsed = parse_state(MemoryFile("partial.slot", out.bytes));
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  if (!parsed.ok()) return out;
  const KvLayer& layer = parsed->memory.kv[0].streams[0].layers[0];

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> token_k(size_t(kTokens) * W);  // layer 0's K before RoPE: the token's alone
  for (float& v : token_k) v = normal(rng);
  const TypeTraits& traits = *find_traits(k_type);
  for (uint32_t c = 0; c < kCells; ++c) {
    const float* x = token_k.data() + size_t(c % kTokens) * W;
    std::vector<float> row(x, x + W);
    for (uint32_t m = 0; m < kHeads; ++m) {
      for (uint32_t i = 0; i < kRopeDims / 2; ++i) {  // llama.cpp's NEOX: theta_i = pos * base^(-2i/n_rot)
        const double theta = c * std::pow(10000.0, -2.0 * i / kRopeDims);
        float& a = row[m * kHeadDim + i];
        float& b = row[m * kHeadDim + i + kRopeDims / 2];
        const double a0 = a, b0 = b;
        a = float(a0 * std::cos(theta) - b0 * std::sin(theta));
        b = float(a0 * std::sin(theta) + b0 * std::cos(theta));
      }
    }
    if (rotated) hadamard_rotate(row.data(), W, rotation_block_size(KvSide::kK, kHeadDim));
    traits.from_f32(row.data(), out.bytes.data() + layer.k.offset + uint64_t(c) * layer.k_row_bytes, W);
  }
  auto again = parse_state(MemoryFile("partial.slot", out.bytes));
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  if (again.ok()) out.state = *again;
  return out;
}

HeadDimEvidence partial_rope_verdict(const PartialRopeState& s, uint32_t head_dim, uint32_t rope_dims) {
  MemoryFile file("partial.slot", s.bytes);
  auto e = check_head_dim(file, s.state, HeadDimClaim{head_dim, 0, 0, "the test", rope_dims});
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? *e : HeadDimEvidence{};
}

TEST(RopeHeadDim, PartialRotaryIsReadWithTheModelsRopeDims) {
  for (const auto& [type, rotated] : {std::pair{GgmlType::kF32, false}, std::pair{GgmlType::kQ8_0, true},
                                      std::pair{GgmlType::kQ8_0, false}}) {
    SCOPED_TRACE(std::string(find_traits(type)->name()) + (rotated ? " rotated" : ""));
    const PartialRopeState s = partial_rope_state(type, rotated);
    HeadDimEvidence e = partial_rope_verdict(s, 128, 96);
    EXPECT_EQ(e.verdict, V::kConfirmed) << e.summary;
    EXPECT_NE(e.summary.find("halves of the first 96"), std::string::npos) << e.summary;
    if (type == GgmlType::kQ8_0) {
      EXPECT_EQ(e.stored_rotated, rotated ? Tri::kYes : Tri::kNo) << e.summary;
    }
    // The pairs of a whole-head rope are not these: without the rope dims nothing is decided.
    e = partial_rope_verdict(s, 128, 0);
    EXPECT_EQ(e.verdict, V::kUnsure) << e.summary;
    EXPECT_EQ(e.stored_rotated, Tri::kUnknown) << e.summary;
    // Twice the head dim with the same rope dims (one head of 256): refused, naming 128.
    e = partial_rope_verdict(s, 256, 96);
    EXPECT_EQ(e.verdict, V::kContradicted) << e.summary;
    EXPECT_EQ(e.observed, 128u) << e.summary;
    // Other rope dims (or a whole-head rope of 64): the file's pairs are the claim's at no head
    // dim, so nothing is decided (docs/rope-witness.md, Limits).
    EXPECT_EQ(partial_rope_verdict(s, 128, 64).verdict, V::kUnsure);
    EXPECT_EQ(partial_rope_verdict(s, 64, 0).verdict, V::kUnsure);
  }
}

// No fixture llama.cpp wrote is refused with its own model, whatever its era, type, model kind
// (iSWA, M-RoPE, hybrid) or file kind; the verdicts are printed for the record.
TEST(RopeHeadDim, NoFixtureIsContradictedByItsOwnModel) {
  int confirmed = 0, seen = 0, rotation_told = 0, rotation_checked = 0;
  for (const std::string tag : {"b3166", "b3543", "b5640", "b8121", "b8179", "b8390", "b9842", "b10361", "v0.4.0",
                                "v0.5.0"}) {
    std::ifstream in(fixture(tag + "/MANIFEST.json"));
    ASSERT_TRUE(in) << tag;
    const auto manifest = nlohmann::json::parse(in);
    for (const auto& entry : manifest.at("files")) {
      const std::string file = entry.at("file");
      const bool state = file.ends_with(".slot") || file.ends_with(".session");
      if (!state) continue;  // logits, raw buffers (no tokens), files kept as refused inputs
      const std::string model = entry.at("model");
      if (!std::ifstream(fixture(model))) continue;  // a large model regen.sh recreates
      SCOPED_TRACE(tag + "/" + file);
      Checked c = check(tag + "/" + file, model);
      EXPECT_TRUE(c.parsed.ok()) << c.parsed.ToString();
      // lfm2's layer 0 is a convolution: no witness, nothing claimed; every other model claims.
      EXPECT_EQ(c.claimed, model != "models/tiny-hybrid.gguf") << model;
      EXPECT_NE(c.evidence.verdict, V::kContradicted) << c.evidence.summary;
      ++seen;
      confirmed += c.evidence.verdict == V::kConfirmed;
      // How K was stored, where MANIFEST.json says (the zoo tags) and the RoPE says anything: the same.
      const Tri rotated = c.evidence.stored_rotated;
      if (rotated != Tri::kUnknown) {
        ++rotation_told;
        if (entry.contains("rotated_k")) {
          ++rotation_checked;
          EXPECT_EQ(rotated == Tri::kYes, entry.at("rotated_k").get<bool>()) << c.evidence.summary;
        }
      }
      std::printf("%-8s %-32s %-13s %-8s %s\n", tag.c_str(), file.c_str(), verdict_name(c.evidence.verdict),
                  rotated == Tri::kYes ? "rotated" : rotated == Tri::kNo ? "plain" : "-", c.evidence.summary.c_str());
    }
  }
  // The figures of docs/rope-witness.md ("Measured on the fixtures").
  EXPECT_EQ(seen, 139);
  EXPECT_EQ(confirmed, 116);
  EXPECT_EQ(rotation_told, 40);
  EXPECT_EQ(rotation_checked, 28);
  std::printf("%d files, %d confirmed, %d told how K is stored (%d against MANIFEST.json)\n", seen, confirmed,
              rotation_told, rotation_checked);
}

}  // namespace
}  // namespace kvsnap
