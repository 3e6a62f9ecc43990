// Which llama.cpp builds write a file's layout (format/llama_era.h), and the
// bodies that share a version number: v9 sessions with and without outputs,
// v2 files with the 8-byte M-RoPE cell extra.
#include "format/llama_era.h"

#include <gtest/gtest.h>

#include <cstring>

#include "format/rewrite.h"
#include "format/state_builder.h"
#include "test_files.h"

namespace kvsnap {
namespace {

using testing::build_state;
using testing::SynthSpec;

Result<StateFile> parse_bytes(const std::vector<std::byte>& b, const ParseOptions& o = {}) {
  MemoryFile f("test.bin", std::span<const std::byte>(b));
  return parse_state(f, o);
}

using test::rewrite;

SynthSpec session_v9(bool outputs) {
  SynthSpec s;
  s.kind = SynthSpec::kSession;
  s.version = 9;
  s.v9_outputs = outputs;
  return s;
}

TEST(LlamaBuild, ParsesBuildNumbersAndTags) {
  auto a = parse_llama_build("b8121");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->number, 8121u);
  EXPECT_FALSE(a->is_tag());
  EXPECT_EQ(parse_llama_build("10361")->number, 10361u);
  EXPECT_EQ(parse_llama_build("b8643-f49e91787")->number, 8643u);  // llama-server's build_info
  auto t = parse_llama_build("v0.5.0");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->is_tag());
  EXPECT_EQ(t->minor, 5);
  for (const char* bad : {"", "b", "bx12", "v", "v1", "latest", "b-1", "b0"}) {
    auto r = parse_llama_build(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(LlamaBuild, LayoutsOfTheEras) {
  auto at = [](const char* b) { return *layout_of_build(*parse_llama_build(b)); };
  EXPECT_EQ(at("b5640").era, "C");
  EXPECT_EQ(at("b5640").stream_prefix, Tri::kNo);
  EXPECT_EQ(at("b8121").era, "D");
  EXPECT_EQ(at("b8121").session_outputs, Tri::kYes);
  EXPECT_EQ(at("b8121").rotates, Tri::kNo);
  EXPECT_EQ(at("b8179").session_outputs, Tri::kNo);
  EXPECT_EQ(*at("b8179").mrope_ext_bytes, 0u);
  EXPECT_EQ(*at("b8390").mrope_ext_bytes, 8u);
  EXPECT_EQ(at("b8390").rotates, Tri::kNo);
  EXPECT_EQ(at("b8500").era, "F|G");
  EXPECT_EQ(at("b8500").rotates, Tri::kUnknown);  // between the last build seen without and the first seen with
  EXPECT_EQ(at("b10361").era, "G");
  EXPECT_EQ(at("b10361").rotates, Tri::kYes);
  EXPECT_EQ(*at("b10361").ggsq_version, 2u);
  EXPECT_FALSE(at("b10500").ggsq_version.has_value());
  EXPECT_EQ(*at("b10645").ggsq_version, 3u);
  EXPECT_EQ(*at("v0.4.0").ggsn_version, 10u);
  EXPECT_EQ(at("v0.2.0").rotates, Tri::kYes);
  EXPECT_FALSE(at("v0.2.0").ggsq_version.has_value());
  // eras A and B, and the slot cells' seq id (b4980|b5640)
  EXPECT_EQ(at("b3166").era, "A");
  EXPECT_EQ(*at("b3166").ggsq_version, 1u);
  EXPECT_EQ(*at("b3166").ggsn_version, 6u);
  EXPECT_EQ(layout_of_build(*parse_llama_build("b3000")).status().code(), Code::kNotSupported);
  EXPECT_EQ(layout_of_build(*parse_llama_build("b3300")).status().code(), Code::kNotSupported);
  EXPECT_EQ(at("b3543").era, "B");
  EXPECT_EQ(*at("b3543").ggsn_version, 8u);
  EXPECT_EQ(*at("b3543").ggsq_version, 2u);
  EXPECT_EQ(at("b3543").stream_prefix, Tri::kNo);
  EXPECT_EQ(at("b3543").seq_cell_ids, Tri::kNo);
  EXPECT_EQ(at("b3700").era, "B|C");
  EXPECT_FALSE(at("b3700").ggsn_version.has_value());
  EXPECT_EQ(*at("b3889").ggsn_version, 9u);
  EXPECT_EQ(at("b3889").seq_cell_ids, Tri::kNo);
  EXPECT_EQ(at("b5000").seq_cell_ids, Tri::kUnknown);
  EXPECT_EQ(at("b5640").seq_cell_ids, Tri::kYes);
  EXPECT_EQ(at("v0.5.0").seq_cell_ids, Tri::kYes);
}

TEST(LlamaEra, CurrentFilesRotateAndOldLayoutsProveTheyDoNot) {
  SynthSpec v3;
  auto f3 = parse_bytes(build_state(v3));
  ASSERT_TRUE(f3.ok());
  EXPECT_EQ(era_of_file(*f3, std::nullopt).rotates, Tri::kYes);

  SynthSpec b5640;
  b5640.version = 2;
  b5640.stream_prefix = false;
  auto fc = parse_bytes(build_state(b5640));
  ASSERT_TRUE(fc.ok());
  EXPECT_EQ(era_of_file(*fc, std::nullopt).eras, "C");
  EXPECT_EQ(era_of_file(*fc, std::nullopt).rotates, Tri::kNo);

  auto fd = parse_bytes(build_state(session_v9(true)));
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(era_of_file(*fd, std::nullopt).eras, "D");
  EXPECT_EQ(era_of_file(*fd, std::nullopt).rotates, Tri::kNo);
}

TEST(LlamaEra, PlainV2FilesDoNotTellTheirRotation) {
  SynthSpec v2;
  v2.version = 2;
  auto f = parse_bytes(build_state(v2));
  ASSERT_TRUE(f.ok());
  const FileEra e = era_of_file(*f, std::nullopt);
  EXPECT_EQ(e.rotates, Tri::kUnknown);
  EXPECT_EQ(e.eras, "D..G");
  EXPECT_NE(e.why.find("b8643"), std::string::npos) << e.why;
  // An M-RoPE model's cells without the extra: before b8352, so before rotation.
  EXPECT_EQ(era_of_file(*f, true).rotates, Tri::kNo);
  EXPECT_EQ(era_of_file(*f, false).rotates, Tri::kUnknown);
}

// A tagged raw sequence buffer is taken as rotated from its tag alone: the tag came after the
// rotation (b8740, llama.rn 0.12.0-rc.7, rotates and writes no tag; b9842 writes it).
TEST(LlamaEra, TaggedRawSequenceBuffersComeFromRotatingBuilds) {
  SynthSpec tagged;
  tagged.kind = SynthSpec::kRawSeqTagged;
  auto f = parse_bytes(build_state(tagged));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(f->raw_seq_tagged);
  EXPECT_EQ(era_of_file(*f, std::nullopt).rotates, Tri::kYes);
  const Status b8740 = check_build_wrote(*f, *parse_llama_build("b8740"), std::nullopt);
  EXPECT_EQ(b8740.code(), Code::kMismatch) << b8740.ToString();
  EXPECT_NE(b8740.message().find("not tagged"), std::string::npos) << b8740.ToString();
  EXPECT_EQ(check_build_wrote(*f, *parse_llama_build("b8390"), std::nullopt).code(), Code::kMismatch);
  EXPECT_TRUE(check_build_wrote(*f, *parse_llama_build("b9000"), std::nullopt).ok());  // between: unknown
  EXPECT_TRUE(check_build_wrote(*f, *parse_llama_build("b9842"), std::nullopt).ok());
}

// A raw context buffer (llama_state_get_data) carries no version or tag: the one in b8390's session
// (unrotated q8_0) parses with v0.5.0's layout, as does one v0.5.0 writes (a review's finding: it
// was taken as era H, rotated, and un-rotated on conversion with exit 0).
TEST(LlamaEra, RawContextBuffersDoNotTellTheirRotation) {
  const auto session = kvsnap::test::slurp(std::string(KVSNAP_SOURCE_DIR) + "/fixtures/b8390/hd64-q8_0-q8_0-faon.session");
  ASSERT_GT(session.size(), 12u);
  uint32_t n_tokens = 0;
  std::memcpy(&n_tokens, session.data() + 8, 4);
  const std::vector<std::byte> raw(session.begin() + 12 + 4 * n_tokens, session.end());
  ParseOptions o;
  o.kind = StateKind::kRawContext;
  auto f = parse_bytes(raw, o);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const FileEra e = era_of_file(*f, std::nullopt);
  EXPECT_EQ(e.rotates, Tri::kUnknown) << e.why;
  EXPECT_EQ(e.eras, "E..H");
  EXPECT_TRUE(check_build_wrote(*f, *parse_llama_build("b8390"), std::nullopt).ok());
  EXPECT_TRUE(check_build_wrote(*f, *parse_llama_build("v0.5.0"), std::nullopt).ok());
  EXPECT_EQ(era_of_file(*f, false).rotates, Tri::kUnknown);
}

// llama-server's packed token payload came after rotation (b10361 has none) and ggsq v2 ended before
// b10645 (the first v3 build): the builds named end there, not at b10375, the last v2 build seen.
TEST(LlamaEra, V2SeqFilesWithThePackedPayloadRotateAndEndBeforeV3) {
  SynthSpec v2;
  v2.version = 2;
  v2.token_words = pack_server_tokens({1, 2, 3, 4}, {}, {});
  auto f = parse_bytes(build_state(v2));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE(f->tokens.packed);
  const FileEra e = era_of_file(*f, std::nullopt);
  EXPECT_EQ(e.eras, "G");
  EXPECT_EQ(e.rotates, Tri::kYes);
  EXPECT_EQ(e.builds, "about b10400..b10644");
}

TEST(LlamaEra, V9SessionsWithoutOutputsAreReadAndWrittenByteExact) {
  const auto bytes = build_state(session_v9(false));
  auto f = parse_bytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE(f->outputs.has_value());
  EXPECT_NE(f->reading.find("b8179"), std::string::npos) << f->reading;
  EXPECT_EQ(era_of_file(*f, std::nullopt).eras, "E..G");
  EXPECT_EQ(era_of_file(*f, std::nullopt).rotates, Tri::kUnknown);
  EXPECT_EQ(rewrite(bytes), bytes);

  const auto with = build_state(session_v9(true));
  auto g = parse_bytes(with);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(g->outputs.has_value());
  EXPECT_EQ(g->outputs->logits_size, 11u);
  EXPECT_EQ(rewrite(with), with);
}

TEST(LlamaEra, V9SessionsThatFitNeitherBodySayBoth) {
  auto bytes = build_state(session_v9(false));
  bytes.resize(bytes.size() - 3);
  auto f = parse_bytes(bytes);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kCorruption);
  EXPECT_NE(f.status().message().find("b8179"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("b8121"), std::string::npos) << f.status().message();
}

TEST(LlamaEra, V2FilesWithTheEightByteCellExtra) {
  SynthSpec s;
  s.version = 2;
  s.ext_bytes = 8;
  const auto bytes = build_state(s);
  auto f = parse_bytes(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->memory.kv[0].ext_bytes, 8u);
  EXPECT_EQ(f->memory.kv[0].streams[0].cells[3].ext[1], 31);
  EXPECT_EQ(era_of_file(*f, std::nullopt).eras, "F|G");
  EXPECT_EQ(era_of_file(*f, std::nullopt).rotates, Tri::kUnknown);
  EXPECT_EQ(rewrite(bytes), bytes);
  // A model without the extra never has one.
  MemoryShape no_ext;
  no_ext.ext_bytes = 0;
  ParseOptions o;
  o.shape = &no_ext;
  EXPECT_FALSE(parse_bytes(bytes, o).ok());
}

TEST(LlamaEra, ADeclaredBuildMustBeAbleToHaveWrittenTheFile) {
  SynthSpec v3;
  auto f3 = parse_bytes(build_state(v3));
  ASSERT_TRUE(f3.ok());
  Status s = check_build_wrote(*f3, *parse_llama_build("b10361"), std::nullopt);
  EXPECT_EQ(s.code(), Code::kMismatch);
  EXPECT_NE(s.message().find("ggsq v2"), std::string::npos) << s.message();
  EXPECT_TRUE(check_build_wrote(*f3, *parse_llama_build("v0.5.0"), std::nullopt).ok());

  auto fe = parse_bytes(build_state(session_v9(false)));
  ASSERT_TRUE(fe.ok());
  EXPECT_EQ(check_build_wrote(*fe, *parse_llama_build("b8121"), std::nullopt).code(), Code::kMismatch);
  EXPECT_TRUE(check_build_wrote(*fe, *parse_llama_build("b10257"), std::nullopt).ok());

  SynthSpec b5640;
  b5640.version = 2;
  b5640.stream_prefix = false;
  auto fc = parse_bytes(build_state(b5640));
  ASSERT_TRUE(fc.ok());
  EXPECT_EQ(check_build_wrote(*fc, *parse_llama_build("b8121"), std::nullopt).code(), Code::kMismatch);
  // A build inside a gap contradicts nothing it might have written.
  EXPECT_TRUE(check_build_wrote(*fc, *parse_llama_build("b6000"), std::nullopt).ok());

  // Facts the file proves without the model (a review's finding: both were checked only with it,
  // or not at all): 8-byte cell extras are an M-RoPE model's from b8352 on, and llama-server's
  // packed tokens come after b10361.
  SynthSpec ext8;
  ext8.version = 2;
  ext8.ext_bytes = 8;
  auto f8 = parse_bytes(build_state(ext8));
  ASSERT_TRUE(f8.ok());
  s = check_build_wrote(*f8, *parse_llama_build("b8121"), std::nullopt);
  EXPECT_EQ(s.code(), Code::kMismatch) << s.message();
  EXPECT_NE(s.message().find("cell extras"), std::string::npos) << s.message();
  EXPECT_TRUE(check_build_wrote(*f8, *parse_llama_build("b10361"), std::nullopt).ok());
  EXPECT_TRUE(check_build_wrote(*fe, *parse_llama_build("b10257"), false).ok()) << "no extras, no M-RoPE: any size";

  SynthSpec packed;
  packed.version = 2;
  packed.token_words = pack_server_tokens({1, 2, 3, 4}, {}, {});
  auto fp = parse_bytes(build_state(packed));
  ASSERT_TRUE(fp.ok());
  ASSERT_TRUE(fp->tokens.packed);
  s = check_build_wrote(*fp, *parse_llama_build("b8121"), std::nullopt);
  EXPECT_EQ(s.code(), Code::kMismatch) << s.message();
  EXPECT_NE(s.message().find("packed"), std::string::npos) << s.message();
  EXPECT_EQ(check_build_wrote(*fp, *parse_llama_build("b10361"), std::nullopt).code(), Code::kMismatch);
  EXPECT_TRUE(check_build_wrote(*fp, *parse_llama_build("b10375"), std::nullopt).ok()) << "inside the gap";
}

}  // namespace
}  // namespace kvsnap
