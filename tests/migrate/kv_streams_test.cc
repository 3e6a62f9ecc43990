// The KV stream count of a sequence state (ConvertRequest::kv_streams, migrate/convert_state.cc
// restreamed): llama.cpp keeps one stream per slot with -np N and no -kvu, one with -kvu, and
// restores a slot file only into a cache with as many. The sequence's stream keeps its bytes; the
// others are written empty. A session (every sequence) is not restreamed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/io.h"
#include "migrate/conversion_spec.h"
#include "migrate/convert_state.h"
#include "migrate/model_info.h"

namespace kvsnap {
namespace {

std::string fixture(const std::string& name) { return std::string(KVSNAP_SOURCE_DIR) + "/fixtures/" + name; }

std::vector<std::byte> bytes_of(const ReadableFile& f) {
  std::vector<std::byte> b(f.size());
  EXPECT_TRUE(f.read_at(0, b).ok());
  return b;
}

// `st` (read from `in`) converted by `req`, and the output parsed again.
struct Converted {
  std::vector<std::byte> bytes;
  StateFile state;
};
Result<Converted> convert(const StateFile& st, const ReadableFile& in, const ConvertRequest& req,
                          const ModelInfo* model) {
  VectorSink out;
  KV_RETURN_IF_ERROR(convert_state(st, in, req, out).status());
  MemoryFile back("out", out.bytes);
  KV_ASSIGN_OR_RETURN(StateFile parsed, parse_for_model(back, {}, model));
  return Converted{out.bytes, std::move(parsed)};
}

std::vector<uint32_t> cell_counts(const KvSection& sec) {
  std::vector<uint32_t> n;
  for (const KvStream& s : sec.streams) n.push_back(s.cell_count);
  return n;
}

class KvStreams : public ::testing::TestWithParam<const char*> {};

// 1 -> 3 -> 1 is the file again, byte for byte, for plain, iSWA and hybrid models alike; a stream
// past the new count moves to stream 0, one within it keeps its index.
TEST_P(KvStreams, RestreamedAndBackIsTheFileAgain) {
  const std::string kind = GetParam();
  auto model = load_model_info(posix_io(), fixture("models/tiny-" + kind + ".gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto file = posix_io().open_read(fixture("v0.5.0/" + kind + "-f16-f16-faon.slot"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto st = parse_for_model(**file, {}, &*model);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ConvertRequest three;
  three.kv_streams = 3;
  auto wide = convert(*st, **file, three, &*model);
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  const uint32_t cells = st->memory.kv[0].streams[0].cell_count;
  ASSERT_GT(cells, 0u);
  for (const KvSection& sec : wide->state.memory.kv) {
    ASSERT_EQ(sec.streams.size(), 3u);
    EXPECT_EQ(cell_counts(sec)[1] + cell_counts(sec)[2], 0u);
  }
  EXPECT_EQ(wide->state.memory.kv[0].streams[0].cell_count, cells);
  EXPECT_EQ(wide->bytes.size(), (*file)->size() + 2 * 4 * st->memory.kv.size()) << "two empty streams a section";
  MemoryFile wide_file("wide", wide->bytes);
  ConvertRequest one;
  one.kv_streams = 1;
  auto back = convert(wide->state, wide_file, one, &*model);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->bytes == bytes_of(**file)) << kind;

  // The sequence in stream 2 of 3 (slot 2 of -np 3): kept there for 3 or more, moved to 0 below.
  StateFile at2 = wide->state;
  for (KvSection& sec : at2.memory.kv) std::swap(sec.streams[0], sec.streams[2]);
  ConvertRequest four;
  four.kv_streams = 4;
  auto kept = convert(at2, wide_file, four, &*model);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(cell_counts(kept->state.memory.kv[0]), (std::vector<uint32_t>{0, 0, cells, 0}));
  ConvertRequest two;
  two.kv_streams = 2;
  auto moved = convert(at2, wide_file, two, &*model);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(cell_counts(moved->state.memory.kv[0]), (std::vector<uint32_t>{cells, 0}));
  auto again = convert(moved->state, MemoryFile("moved", moved->bytes), one, &*model);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->bytes == bytes_of(**file)) << "the moved stream's bytes are the sequence's";
}

INSTANTIATE_TEST_SUITE_P(Models, KvStreams, ::testing::Values("hd64", "iswa", "hybrid"));

// Restreaming and a type change in one conversion are the type change, restreamed.
TEST(KvStreamsWith, ATypeChangeIsTheSameBytesRestreamed) {
  auto model = load_model_info(posix_io(), fixture("models/tiny-hd64.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto file = posix_io().open_read(fixture("v0.5.0/hd64-f16-f16-faon.slot"));
  ASSERT_TRUE(file.ok());
  auto st = parse_for_model(**file, {}, &*model);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ConversionSpec spec;
  spec.ctk = spec.ctv = "q8_0";
  auto q8 = make_request(spec, *st, &*model, "f");
  ASSERT_TRUE(q8.ok()) << q8.status().ToString();
  spec.kv_streams = 2;
  auto q8_two = make_request(spec, *st, &*model, "f");
  ASSERT_TRUE(q8_two.ok()) << q8_two.status().ToString();
  ASSERT_EQ(q8_two->kv_streams, 2u);
  auto a = convert(*st, **file, *q8, &*model);
  auto b = convert(*st, **file, *q8_two, &*model);
  ASSERT_TRUE(a.ok() && b.ok());
  ConvertRequest two;
  two.kv_streams = 2;
  auto a2 = convert(a->state, MemoryFile("a", a->bytes), two, &*model);
  ASSERT_TRUE(a2.ok()) << a2.status().ToString();
  EXPECT_TRUE(a2->bytes == b->bytes);
  spec.kv_streams = 257;
  EXPECT_EQ(make_request(spec, *st, &*model, "f").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(check_spec_words(spec).code(), Code::kInvalidArgument);
}

// What cannot be restreamed is refused before anything is written: a session of another stream
// count (it holds every sequence), cells in two streams (no sequence's state has them).
TEST(KvStreamsWith, SessionsAndTwoFilledStreamsAreRefused) {
  auto model = load_model_info(posix_io(), fixture("models/tiny-hd64.gguf"));
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto session = posix_io().open_read(fixture("v0.5.0/hd64-f16-f16-faon.session"));
  ASSERT_TRUE(session.ok());
  auto ss = parse_for_model(**session, {}, &*model);
  ASSERT_TRUE(ss.ok()) << ss.status().ToString();
  ConvertRequest two;
  two.kv_streams = 2;
  VectorSink none;
  auto r = convert_state(*ss, **session, two, none);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find("holds every sequence"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(none.bytes.empty());
  ConvertRequest same;
  same.kv_streams = uint32_t(ss->memory.kv[0].streams.size());
  EXPECT_TRUE(convert(*ss, **session, same, &*model).ok()) << "its own count: nothing to move";

  auto file = posix_io().open_read(fixture("v0.5.0/hd64-f16-f16-faon.slot"));
  ASSERT_TRUE(file.ok());
  auto st = parse_for_model(**file, {}, &*model);
  ASSERT_TRUE(st.ok());
  StateFile doubled = *st;
  doubled.memory.kv[0].streams.push_back(doubled.memory.kv[0].streams[0]);
  ConvertRequest one;
  one.kv_streams = 1;
  r = convert_state(doubled, **file, one, none);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find("streams 0 and 1"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(none.bytes.empty());
  // A raw buffer tagged with sequence -1 is the whole cache, read back at the file's own streams.
  auto raw = posix_io().open_read(fixture("v0.5.0/hd64-f16-f16-faon.raw"));
  ASSERT_TRUE(raw.ok());
  ParseOptions po;
  po.kind = StateKind::kRawSeq;
  auto rs = parse_for_model(**raw, po, &*model);
  ASSERT_TRUE(rs.ok()) << rs.status().ToString();
  ASSERT_TRUE(rs->raw_seq_tagged);
  EXPECT_TRUE(convert(*rs, **raw, two, &*model).ok()) << "sequence " << rs->raw_seq_id;
  rs->raw_seq_id = -1;
  r = convert_state(*rs, **raw, two, none);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  EXPECT_TRUE(none.bytes.empty());
  ConvertRequest zero;
  zero.kv_streams = 0;
  EXPECT_EQ(convert_state(*st, **file, zero, none).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kvsnap
