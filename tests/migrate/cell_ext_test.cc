// The M-RoPE cell extra across eras (migrate/convert_state.cc, recode_cell_ext): {x, y} in the v2/v9
// files of b8352..b10375, {x, y, token} in v0.5.0's, the token taken from the file's token list by
// position, which is one sequence's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/io.h"
#include "migrate/convert_state.h"
#include "migrate/model_info.h"

namespace kvsnap {
namespace {

std::string fixture(const std::string& name) { return std::string(KVSNAP_SOURCE_DIR) + "/fixtures/" + name; }

// A review's finding: cells of a second sequence got tokens of the first (the token list's, by
// position) when b10361's M-RoPE session was upgraded to ggsn v10, exit 0.
TEST(CellExt, AnUpgradeTakesTokensOfOneSequenceOnly) {
  auto model = load_model_info(posix_io(), fixture("models/tiny-mrope.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto file = posix_io().open_read(fixture("b10361/mrope-f16-f16-faon.session"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto st = parse_for_model(**file, {}, &*model);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->memory.kv.at(0).ext_bytes, 8u);
  ConvertRequest req;
  req.format = TargetFormat::kSameKindCurrent;
  VectorSink one;
  auto r = convert_state(*st, **file, req, one);
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // one sequence: its tokens
  auto& cells = st->memory.kv[0].streams.at(0).cells;
  ASSERT_GT(cells.size(), 60u);
  for (size_t i = 50; i < cells.size(); ++i) cells[i].seq_ids = {1};
  VectorSink two;
  r = convert_state(*st, **file, req, two);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find("sequences 0 and 1"), std::string::npos) << r.status().ToString();
}

// A tagged raw sequence buffer of b9842..b10375 reads as v3 (its tag) yet holds v2-era cells with
// 8-byte extras: `--format current` kept them, which v0.5.0 reads as 12-byte ones (a review's finding,
// exit 0). Its own layout (the default for a raw buffer) still keeps them, byte for byte; the current
// one needs each cell's token, which a raw buffer has no list of: refused.
TEST(CellExt, ATaggedRawBufferOfV2EraCellsIsNotWrittenAsV3WithTheirExtras) {
  auto model = load_model_info(posix_io(), fixture("models/tiny-mrope.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto file = posix_io().open_read(fixture("b10361/mrope-f16-f16-faon.raw"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ParseOptions po;
  po.kind = StateKind::kRawSeq;
  auto st = parse_for_model(**file, po, &*model);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE(st->raw_seq_tagged);
  ASSERT_EQ(st->memory.kv.at(0).ext_bytes, 8u);
  ConvertRequest keep;
  keep.keep_raw_layout = true;
  VectorSink same;
  ASSERT_TRUE(convert_state(*st, **file, keep, same).ok());
  std::vector<std::byte> in((*file)->size());
  ASSERT_TRUE((*file)->read_at(0, in).ok());
  EXPECT_TRUE(same.bytes == in) << "its own layout: byte for byte";
  ConvertRequest current;
  current.format = TargetFormat::kSameKindCurrent;
  VectorSink out;
  auto r = convert_state(*st, **file, current, out);
  ASSERT_FALSE(r.ok()) << "written as v3 with 8-byte extras";
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find("has none (a raw buffer)"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace kvsnap
