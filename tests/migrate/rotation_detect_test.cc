// Rotation detection (migrate/rotation_detect.h) on synthetic caches: K/V with outlier
// channels stored plain and stored rotated (hadamard.h + the reference quantizers),
// structureless data, too few cells, tensors that are never examined, broken input.
#include "migrate/rotation_detect.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "format/llama_state.h"
#include "synthetic_cache.h"

namespace kvsnap {
namespace {

using test::Data;
using test::Spec;
using test::build;

using Built = test::Parsed;

Built parse(const Spec& s) {
  auto p = test::parse_built(s);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : Built{};
}

RotationGeometry geometry(uint32_t hd) { return RotationGeometry{{hd}, {hd}}; }

using V = RotationEvidence::Verdict;

RotationEvidence detect(const Spec& s, std::optional<RotationGeometry> geo = std::nullopt, DetectOptions o = {}) {
  Built b = parse(s);
  auto r = detect_rotation(*b.file, b.state, geo ? *geo : geometry(s.head_dim), o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : RotationEvidence{};
}

TEST(RotationDetect, VerdictNames) {
  EXPECT_STREQ(verdict_name(V::kRotated), "rotated");
  EXPECT_STREQ(verdict_name(V::kNotRotated), "not-rotated");
  EXPECT_STREQ(verdict_name(V::kUnsure), "unsure");
}

TEST(RotationDetect, OutlierChannelsStoredPlain) {
  for (int32_t kt : {8, 2, 20}) {  // q8_0 q4_0 iq4_nl
    for (uint32_t hd : {64u, 128u}) {
      Spec s;
      s.k_type = s.v_type = kt;
      s.head_dim = hd;
      const RotationEvidence e = detect(s);
      EXPECT_EQ(e.verdict, V::kNotRotated) << kt << " " << hd << ": " << e.summary;
      EXPECT_EQ(e.tensors, 8u);
      EXPECT_EQ(e.for_rotated, 0u) << e.summary;
      EXPECT_GE(e.for_plain, 4u) << e.summary;
      EXPECT_LT(e.score, -kDetectMinLogRatio);
      EXPECT_GT(e.confidence, 0.0);
      EXPECT_LE(e.confidence, 1.0);
    }
  }
}

TEST(RotationDetect, OutlierChannelsStoredRotated) {
  for (int32_t kt : {8, 2, 3, 6, 7, 20}) {
    for (uint32_t hd : {64u, 128u, 256u}) {
      Spec s;
      s.k_type = s.v_type = kt;
      s.head_dim = hd;
      s.rotated = true;
      const RotationEvidence e = detect(s);
      EXPECT_EQ(e.verdict, V::kRotated) << kt << " " << hd << ": " << e.summary;
      EXPECT_EQ(e.for_plain, 0u) << e.summary;
      EXPECT_GE(e.for_rotated, 4u) << e.summary;
      EXPECT_GT(e.score, kDetectMinLogRatio);
      EXPECT_GT(e.confidence, 0.0);
      EXPECT_LE(e.confidence, 1.0);
      EXPECT_NE(e.summary.find("after un-rotating"), std::string::npos) << e.summary;
    }
  }
}

TEST(RotationDetect, MixedTypesAndHeadDim192) {
  Spec s;
  s.k_type = 2;  // q4_0 K, q8_0 V
  s.v_type = 8;
  s.head_dim = 192;  // K blocks of 64, V blocks of 64
  s.rotated = true;
  EXPECT_EQ(detect(s).verdict, V::kRotated);
  s.rotated = false;
  EXPECT_EQ(detect(s).verdict, V::kNotRotated);
}

TEST(RotationDetect, StructurelessDataIsUnsure) {
  for (Data d : {Data::kIid, Data::kLowRankRandom}) {
    for (bool rotated : {false, true}) {
      for (int32_t kt : {8, 2}) {
        Spec s;
        s.data = d;
        s.rotated = rotated;
        s.k_type = s.v_type = kt;
        const RotationEvidence e = detect(s);
        EXPECT_EQ(e.verdict, V::kUnsure) << int(d) << " " << rotated << " " << kt << ": " << e.summary;
        EXPECT_EQ(e.confidence, 0.0);
        EXPECT_EQ(e.tensors, 8u);
      }
    }
  }
}

TEST(RotationDetect, TooFewCellsIsUnsure) {
  Spec s;
  s.cells = kDetectMinCells - 1;
  const RotationEvidence e = detect(s);
  EXPECT_EQ(e.verdict, V::kUnsure);
  EXPECT_EQ(e.tensors, 0u);
  EXPECT_NE(e.summary.find("too few cells"), std::string::npos) << e.summary;
  // max_cells below the minimum: the same.
  Spec t;
  DetectOptions o;
  o.max_cells = 8;
  EXPECT_EQ(detect(t, std::nullopt, o).verdict, V::kUnsure);
}

TEST(RotationDetect, SamplingFewerCellsStillDecides) {
  Spec s;
  s.cells = 600;
  s.rotated = true;
  DetectOptions o;
  o.max_cells = 64;
  const RotationEvidence e = detect(s, std::nullopt, o);
  EXPECT_EQ(e.verdict, V::kRotated) << e.summary;
}

TEST(RotationDetect, SamplesAtMostMaxCells) {
  for (uint32_t cells : {40u, 100u, 1000u}) {
    for (uint32_t max_cells : {16u, 33u, 100u, 1024u}) {
      Spec s;
      s.cells = cells;
      s.n_layer = 2;
      Built b = parse(s);
      std::vector<TensorEvidence> per;
      DetectOptions o;
      o.max_cells = max_cells;
      auto r = detect_rotation_detailed(*b.file, b.state, geometry(s.head_dim), o, &per);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(per.size(), 4u);
      for (const auto& t : per) EXPECT_EQ(t.cells, std::min(cells, max_cells)) << cells << " " << max_cells;
    }
  }
}

TEST(RotationDetect, WideRowsAreExaminedInPart) {
  // 160 KV heads x 128 = 20,480 values a row: only the first 16,384 are examined.
  for (bool rotated : {false, true}) {
    Spec s;
    s.n_head_kv = 160;
    s.n_layer = 2;
    s.cells = 40;
    s.rotated = rotated;
    const RotationEvidence e = detect(s);
    EXPECT_EQ(e.tensors, 4u);
    EXPECT_EQ(e.verdict, rotated ? V::kRotated : V::kNotRotated) << e.summary;
  }
}

TEST(RotationDetect, NothingToExamine) {
  Spec f16;
  f16.k_type = f16.v_type = 1;
  RotationEvidence e = detect(f16);
  EXPECT_EQ(e.verdict, V::kUnsure);
  EXPECT_EQ(e.tensors, 0u);
  EXPECT_NE(e.summary.find("nothing to examine"), std::string::npos) << e.summary;

  Spec q;  // quantized, but the geometry never rotates (head dim 96 / unknown / 0)
  q.head_dim = 96;
  e = detect(q, geometry(96));
  EXPECT_EQ(e.verdict, V::kUnsure);
  EXPECT_EQ(e.tensors, 0u);
  e = detect(Spec{}, RotationGeometry{});
  EXPECT_EQ(e.tensors, 0u);
  e = detect(Spec{}, geometry(0));
  EXPECT_EQ(e.tensors, 0u);
}

TEST(RotationDetect, TransposedVIsSkipped) {
  Spec s;
  s.v_type = 1;  // f16, column-wise
  s.v_trans = 1;
  s.rotated = true;
  const RotationEvidence e = detect(s);
  EXPECT_EQ(e.tensors, 4u);  // K only
  EXPECT_EQ(e.verdict, V::kRotated) << e.summary;
  EXPECT_NE(e.summary.find("V: not examined"), std::string::npos) << e.summary;
}

TEST(RotationDetect, TruncatedFileIsAnError) {
  Spec s;
  Built b = parse(s);
  const auto bytes = b.file->bytes();
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t(200)}) {
    MemoryFile shorter("short.slot", std::vector<std::byte>(bytes.begin(), bytes.begin() + cut));
    auto r = detect_rotation(shorter, b.state, geometry(s.head_dim));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  }
}

TEST(RotationDetect, InconsistentStateIsAnError) {
  Spec s;
  Built b = parse(s);
  StateFile bad = b.state;
  bad.memory.kv[0].streams[0].layers[1].k_row_bytes = 33;  // not whole q8_0 blocks
  auto r = detect_rotation(*b.file, bad, geometry(s.head_dim));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption);

  bad = b.state;
  bad.memory.kv[0].streams[0].layers[0].k.offset = ~uint64_t(0) - 10;  // offset past the end
  r = detect_rotation(*b.file, bad, geometry(s.head_dim));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption);

  bad = b.state;
  bad.memory.kv[0].streams[0].cell_count = 1u << 30;  // more rows than the range holds
  r = detect_rotation(*b.file, bad, geometry(s.head_dim));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption);

  // A head dim that does not divide the row: the geometry is not this file's.
  r = detect_rotation(*b.file, b.state, geometry(192));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kMismatch);
}

TEST(RotationDetect, GarbageBytesDoNotCrash) {
  // Rows of random bytes (NaN/inf scales among them): an answer or an error, never a crash.
  Spec s;
  Built b = parse(s);
  std::vector<std::byte> bytes(b.file->bytes().begin(), b.file->bytes().end());
  std::mt19937 rng(3);
  const KvStream& st = b.state.memory.kv[0].streams[0];
  for (const KvLayer& L : st.layers) {
    for (uint64_t i = 0; i < L.k.size; ++i) bytes[L.k.offset + i] = std::byte(rng() & 0xff);
  }
  MemoryFile garbage("garbage.slot", std::move(bytes));
  auto r = detect_rotation(garbage, b.state, geometry(s.head_dim));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->verdict, V::kRotated);
}

}  // namespace
}  // namespace kvsnap
