// The M-RoPE cell extra across eras (migrate/convert_state.cc, recode_cell_ext): {x, y} in the v2/v9
// files of b8352..b10375, {x, y, token} in v0.5.0's, the token taken from the file's token list by
// position, which is one sequence's.
#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace kvsnap
