// Token prefixes of real slot files: the cut keeps the first cells' bytes
// exactly, in both V layouts, and refuses what cannot be cut.
#include "format/state_prefix.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "test_files.h"

namespace kvsnap {
namespace {

using test::slurp;

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures" / name;
}

struct Parsed {
  std::vector<std::byte> bytes;
  std::unique_ptr<MemoryFile> file;
  StateFile state;
};

Parsed parse_file(std::vector<std::byte> b) {
  Parsed p;
  p.bytes = std::move(b);
  p.file = std::make_unique<MemoryFile>("t.slot", std::span<const std::byte>(p.bytes));
  auto st = parse_state(*p.file);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (st.ok()) p.state = std::move(st).value();
  return p;
}

std::vector<std::byte> cut(const Parsed& p, uint64_t n, Status* status = nullptr) {
  VectorSink out;
  Status s = write_prefix(p.state, *p.file, n, out);
  if (status) *status = s;
  else EXPECT_TRUE(s.ok()) << s.ToString();
  return out.bytes;
}

std::span<const std::byte> at(const std::vector<std::byte>& b, uint64_t off, uint64_t n) {
  return std::span<const std::byte>(b).subspan(off, n);
}

void expect_prefix_of(const Parsed& full, const Parsed& pre, uint64_t n) {
  ASSERT_EQ(pre.state.tokens.tokens.size(), n);
  EXPECT_TRUE(std::equal(pre.state.tokens.tokens.begin(), pre.state.tokens.tokens.end(),
                         full.state.tokens.tokens.begin()));
  const KvStream& a = full.state.memory.kv[0].streams[0];
  const KvStream& b = pre.state.memory.kv[0].streams[0];
  ASSERT_EQ(b.cell_count, n);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t il = 0; il < a.layers.size(); ++il) {
    const KvLayer &la = a.layers[il], &lb = pre.state.memory.kv[0].streams[0].layers[il];
    EXPECT_TRUE(std::ranges::equal(at(full.bytes, la.k.offset, n * la.k_row_bytes), at(pre.bytes, lb.k.offset, lb.k.size)));
    if (!a.v_trans) {
      EXPECT_TRUE(std::ranges::equal(at(full.bytes, la.v.offset, n * la.v_row_bytes), at(pre.bytes, lb.v.offset, lb.v.size)));
      continue;
    }
    for (uint64_t d = 0; d < la.n_embd_v_gqa; ++d) {
      auto src = at(full.bytes, la.v.offset + d * a.cell_count * la.v_elem_bytes, n * la.v_elem_bytes);
      auto dst = at(pre.bytes, lb.v.offset + d * n * lb.v_elem_bytes, n * lb.v_elem_bytes);
      EXPECT_TRUE(std::ranges::equal(src, dst)) << "layer " << il << " V row " << d;
    }
  }
}

class StatePrefixTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StatePrefixTest, KeepsTheFirstCellsExactly) {
  Parsed full = parse_file(slurp(fixture(GetParam())));
  const uint64_t n_tok = full.state.tokens.tokens.size();
  ASSERT_GT(n_tok, 10u);
  for (uint64_t n : {uint64_t(1), uint64_t(7), n_tok / 2, n_tok - 1}) {
    Parsed pre = parse_file(cut(full, n));
    expect_prefix_of(full, pre, n);
    // a prefix of a prefix is the prefix
    EXPECT_EQ(cut(pre, 1), cut(full, 1));
  }
  EXPECT_EQ(cut(full, n_tok), full.bytes) << "the whole state is the file itself";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StatePrefixTest,
                         ::testing::Values("v0.5.0/hd64-f16-f16-faon.slot", "v0.5.0/hd64-f16-f16-faoff.slot",
                                           "v0.5.0/hd128-q4_0-q8_0-faon.slot", "b8121/hd64-f16-f16-faoff.slot",
                                           "v0.5.0/mrope-f16-f16-faon.slot"));

TEST(StatePrefix, RefusesWhatCannotBeCut) {
  for (const char* name : {"v0.5.0/hd64-f16-f16-faon.session", "v0.5.0/iswa-f16-f16-faon.slot",
                           "v0.5.0/hybrid-f16-f16-faon.slot"}) {
    auto bytes = slurp(fixture(name));
    MemoryFile f(name, std::span<const std::byte>(bytes));
    ParseOptions o;
    auto st = parse_state(f, o);
    ASSERT_TRUE(st.ok()) << name << ": " << st.status().ToString();
    VectorSink out;
    Status s = write_prefix(*st, f, 5, out);
    EXPECT_EQ(s.code(), Code::kNotSupported) << name << ": " << s.ToString();
  }
  Parsed full = parse_file(slurp(fixture("v0.5.0/hd64-f16-f16-faon.slot")));
  Status s;
  cut(full, 0, &s);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  cut(full, full.state.tokens.tokens.size() + 1, &s);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace kvsnap
