// Converting ggsn v6 sessions (llama.cpp b3166's legacy dump): the dump lists kv_head cells, empty
// ones (holes of a removed sequence) with their rows; later formats list live cells only and the
// converter keeps rows and cells 1:1, so a session with holes converts only to ggsn v6 itself.
// Real v6 files (no holes) are converted in tests/cli/cli_test.cc and tests/oracle/zoo_test.sh.
#include <gtest/gtest.h>

#include <cstring>

#include <optional>
#include <utility>

#include "format/cursor.h"
#include "format/llama_state.h"
#include "migrate/convert_state.h"

namespace kvsnap {
namespace {

// A v6 session of a 2-layer model with n_embd_k_gqa = n_embd_v_gqa = 64, f16 rows, and these cells.
std::vector<std::byte> v6_session(const std::vector<std::pair<int32_t, bool>>& cells) {
  std::vector<std::byte> b;
  put_u32(b, kMagicGgsn);
  put_u32(b, 6);
  // llama_hparams: n_head_kv 1 (offset 20), n_embd_head_k/v 64 (32, 36), the rest 0
  const size_t hp = b.size();
  b.resize(hp + kB3166HparamsBytes);
  for (size_t off : {size_t(20), size_t(32), size_t(36)}) {
    const uint32_t v = off == 20 ? 1 : 64;
    std::memcpy(b.data() + hp + off, &v, 4);
  }
  put_u32(b, 1);
  put_i32(b, 7);
  const std::string rng = "5489 1 2";
  put_u64(b, rng.size());
  for (char c : rng) b.push_back(std::byte(c));
  put_u64(b, 0);
  put_u64(b, 0);
  put_u64(b, 0);
  const uint64_t n = cells.size();
  put_u64(b, n * 2 * (128 + 128));
  put_u32(b, uint32_t(n));
  put_u32(b, 256);
  put_u32(b, uint32_t(n));
  put_u32(b, 0);
  for (uint64_t i = 0; i < n * 2 * 256; ++i) b.push_back(std::byte(i % 7 == 0 ? 0x3c : 0));  // f16 values
  for (auto [pos, live] : cells) {
    put_i32(b, pos);
    put_u64(b, live ? 1 : 0);
    if (live) put_i32(b, 0);
  }
  return b;
}

MemoryShape two_layers() {
  MemoryShape s;
  s.kv_sections_known = s.recurrent_known = true;
  s.kv_sections.push_back(KvSectionShape{{64, 64}, {64, 64}, {true, true}});
  s.source = "test model";
  s.hparams = MemoryShape::Hparams{};  // the header above
  s.hparams->n_head_kv = 1;
  s.hparams->n_embd_head_k = s.hparams->n_embd_head_v = 64;
  s.hparams->arch = "llama";
  return s;
}

Result<std::vector<std::byte>> convert(const std::vector<std::byte>& b, TargetFormat fmt,
                                       std::optional<std::pair<int32_t, int32_t>> types = std::nullopt) {
  MemoryFile f("holes.session", std::span<const std::byte>(b));
  const MemoryShape shape = two_layers();
  ParseOptions o;
  o.shape = &shape;
  KV_ASSIGN_OR_RETURN(StateFile st, parse_state(f, o));
  ConvertRequest req;
  req.format = fmt;
  if (types) req.k_type = types->first, req.v_type = types->second;
  VectorSink out;
  KV_RETURN_IF_ERROR(convert_state(st, f, req, out).status());
  return out.bytes;
}

// A v6 dump records no K/V types (b3166 reads it with its context's; kvsnap by size, or as declared
// where sizes fit several pairs): a review's finding wrote bf16, which b3166 lacks, and it read back
// as f16 with exit 0. Only a pair b3166 has is written; bf16 is refused before anything is.
TEST(LegacySession, V6IsWrittenOnlyWithTypesB3166Has) {
  const auto live = v6_session({{0, true}, {1, true}});
  for (const auto& [k, v] : std::vector<std::pair<int32_t, int32_t>>{{30, 30}, {30, 1}, {1, 30}}) {  // bf16
    auto r = convert(live, TargetFormat::kGgsnV6, std::make_pair(k, v));
    ASSERT_FALSE(r.ok()) << k << "/" << v;
    EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  }
  auto q8 = convert(live, TargetFormat::kGgsnV6, std::make_pair(8, 8));
  ASSERT_TRUE(q8.ok()) << q8.status().ToString();
  MemoryFile f("q8.session", std::span<const std::byte>(*q8));
  const MemoryShape shape = two_layers();
  ParseOptions o;
  o.shape = &shape;
  auto back = parse_state(f, o);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->memory.kv[0].streams[0].layers[0].k_type, 8);
  EXPECT_EQ(back->memory.kv[0].streams[0].layers[0].v_type, 8);
}

TEST(LegacySession, HolesConvertOnlyToV6) {
  const auto holes = v6_session({{0, true}, {-1, false}, {2, true}});
  auto up = convert(holes, TargetFormat::kSameKindCurrent);
  ASSERT_FALSE(up.ok());
  EXPECT_EQ(up.status().code(), Code::kNotSupported);
  EXPECT_NE(up.status().message().find("empty"), std::string::npos) << up.status().ToString();
  EXPECT_NE(up.status().message().find("holes.session"), std::string::npos) << up.status().ToString();
  auto same = convert(holes, TargetFormat::kGgsnV6);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(*same, holes);
}

TEST(LegacySession, WithoutHolesItGoesUpToV10AndV6NeedsAV6Input) {
  const auto live = v6_session({{0, true}, {1, true}});
  auto up = convert(live, TargetFormat::kSameKindCurrent);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  MemoryFile f("up.session", std::span<const std::byte>(*up));
  auto st = parse_state(f);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->version, 10u);
  EXPECT_EQ(st->arch, "llama");  // from the model: v6 does not name it
  EXPECT_FALSE(st->legacy);
  ASSERT_EQ(st->memory.kv.at(0).streams.at(0).cell_count, 2u);
  EXPECT_EQ(st->memory.kv[0].streams[0].cells[1].pos, 1);
  ConvertRequest req;
  req.format = TargetFormat::kGgsnV6;
  VectorSink out;
  auto down = convert_state(*st, f, req, out);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), Code::kNotSupported) << down.status().ToString();
  EXPECT_NE(down.status().message().find("llama_hparams"), std::string::npos) << down.status().ToString();
}

}  // namespace
}  // namespace kvsnap
