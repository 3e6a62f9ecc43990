// Reading and writing llama.cpp state files: round trips on every fixture and
// every synthetic layout, then one test per way a file can be wrong.
#include "format/llama_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "format/llama_era.h"
#include "format/memory_shape.h"
#include "format/model_profile.h"
#include "format/rewrite.h"
#include "format/state_builder.h"
#include "test_files.h"

namespace kvsnap {
namespace {

using testing::build_state;
using testing::SynthLayer;
using testing::SynthSpec;

Result<StateFile> parse_bytes(std::span<const std::byte> b, const ParseOptions& o = {}) {
  MemoryFile f("test.bin", b);
  return parse_state(f, o);
}

using test::rewrite;

using test::slurp;

// Every llama.cpp state file under `dir` (by extension).
std::vector<std::filesystem::path> state_files_under(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const auto ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".slot" || ext == ".session" || ext == ".bin" || ext == ".raw")) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The model a fixture was written with: fixtures/models/tiny-<first word of its name>.gguf.
std::filesystem::path fixture_model(const std::filesystem::path& p) {
  const std::string model_name = p.filename().string().substr(0, p.filename().string().find('-'));
  return std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures" / "models" / ("tiny-" + model_name + ".gguf");
}
std::optional<ModelProfile> fixture_model_profile(const std::filesystem::path& p) {
  const auto model = fixture_model(p);
  if (!std::filesystem::exists(model)) return std::nullopt;
  auto prof = load_model_profile(posix_io(), model.string());
  if (!prof.ok()) return std::nullopt;
  return *prof;
}

std::optional<MemoryShape> fixture_model_shape(const std::filesystem::path& p) {
  const auto prof = fixture_model_profile(p);
  if (!prof) return std::nullopt;
  auto sh = memory_shape(*prof, fixture_model(p).string());
  if (!sh.ok()) return std::nullopt;
  return *sh;
}

// ggsn v6 sessions (b3166) are read only with their model.
ParseOptions options_for(const std::filesystem::path& p) {
  static std::map<std::string, std::optional<MemoryShape>> shapes;
  ParseOptions o;
  if (p.extension() == ".raw") o.kind = StateKind::kRawSeq;
  if (p.extension() == ".session" && p.parent_path().filename() == "b3166") {
    auto it = shapes.emplace(p.string(), fixture_model_shape(p)).first;
    if (it->second) o.shape = &*it->second;
  }
  return o;
}

// --- Synthetic layouts: every kind the reader knows -------------------------

struct Layout {
  const char* name;
  SynthSpec spec;
};

std::vector<Layout> layouts() {
  std::vector<Layout> v;
  SynthSpec s;
  v.push_back({"ggsq3_rows", s});
  s = {}; s.v_trans = 1; v.push_back({"ggsq3_vtrans", s});
  s = {}; s.layers = {{8, 128, 2, 128}, {8, 128, 2, 128}}; v.push_back({"ggsq3_q8_q4", s});
  s = {}; s.layers = {{20, 64, 3, 64}, {6, 64, 7, 64}, {30, 64, 0, 64}}; v.push_back({"ggsq3_mixed", s});
  s = {}; s.ext_bytes = 12; v.push_back({"ggsq3_mrope_ext", s});
  s = {}; s.kv_sections = 2; v.push_back({"ggsq3_iswa", s});
  s = {}; s.recurrent = true; v.push_back({"ggsq3_hybrid", s});
  s = {}; s.token_words = {-1, 1, 3, 10, 11, 12, 0}; v.push_back({"ggsq3_server_packed", s});
  s = {}; s.cells = 0; v.push_back({"ggsq3_empty", s});
  s = {}; s.version = 2; v.push_back({"ggsq2_b8121", s});
  s = {}; s.version = 2; s.stream_prefix = false; v.push_back({"ggsq2_b5640", s});
  s = {}; s.version = 2; s.stream_prefix = false; s.v_trans = 1; v.push_back({"ggsq2_b5640_vtrans", s});
  // Empty, as b5640 writes it: the layers' headers after no cells (a review's finding: refused).
  s = {}; s.version = 2; s.stream_prefix = false; s.cells = 0; v.push_back({"ggsq2_b5640_empty", s});
  s = {}; s.kind = SynthSpec::kSession; s.version = 8; s.stream_prefix = false; s.cells = 0; s.v_trans = 1;
  v.push_back({"ggsn8_b3543_empty", s});
  s = {}; s.kind = SynthSpec::kSession; s.version = 10; s.n_streams = 3; s.n_seq_per_cell = 2;
  v.push_back({"ggsn10_streams", s});
  s = {}; s.kind = SynthSpec::kSession; s.version = 9; v.push_back({"ggsn9_b8121", s});
  s = {}; s.kind = SynthSpec::kSession; s.version = 9; s.stream_prefix = false; s.embd = 5;
  v.push_back({"ggsn9_b5640", s});
  s = {}; s.kind = SynthSpec::kRawSeqTagged; v.push_back({"raw_seq_tagged", s});
  // b3543 (era B): slots store cells without their seq id; sessions hold an RNG string
  s = {}; s.version = 2; s.stream_prefix = false; s.n_seq_per_cell = 0; v.push_back({"ggsq2_b3543", s});
  s = {}; s.kind = SynthSpec::kSession; s.version = 8; s.stream_prefix = false; v.push_back({"ggsn8_b3543", s});
  s = {}; s.kind = SynthSpec::kSession; s.version = 8; s.stream_prefix = false; s.v_trans = 1; s.n_outputs = 0;
  s.logits = 0; v.push_back({"ggsn8_b3543_vtrans_no_outputs", s});
  return v;
}

class SynthLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(SynthLayoutTest, ParsesAndRoundTripsByteExact) {
  const auto bytes = build_state(GetParam().spec);
  auto st = parse_bytes(bytes);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(rewrite(bytes), bytes);
  const SynthSpec& s = GetParam().spec;
  EXPECT_EQ(st->memory.kv.size(), size_t(s.kv_sections));
  EXPECT_EQ(st->memory.recurrent.has_value(), s.recurrent);
  if (s.cells > 0) {
    const KvStream& stream = st->memory.kv[0].streams[0];
    EXPECT_EQ(stream.cell_count, s.cells);
    EXPECT_EQ(stream.v_trans, s.v_trans);
    ASSERT_EQ(stream.layers.size(), s.layers.size());
    for (size_t i = 0; i < s.layers.size(); ++i) {
      EXPECT_EQ(stream.layers[i].k_type, s.layers[i].k_type);
      EXPECT_EQ(layer_n_embd_k(stream.layers[i]), s.layers[i].n_embd_k);
      EXPECT_EQ(layer_n_embd_v(stream.layers[i], stream.v_trans), s.layers[i].n_embd_v);
    }
    EXPECT_EQ(st->memory.kv[0].ext_bytes, s.ext_bytes);
    EXPECT_EQ(st->memory.kv[0].stream_prefix, s.stream_prefix);
  }
}

// Every strict prefix of every layout is an error, never a crash or a
// successful parse (this runs under ASan/UBSan in CI).
// The shape a model would give for a synthetic layout.
MemoryShape shape_of(const SynthSpec& s) {
  MemoryShape m;
  m.ext_bytes = s.ext_bytes;
  m.kv_sections_known = m.recurrent_known = true;
  m.has_recurrent = s.recurrent;
  for (int i = 0; i < s.kv_sections; ++i) {
    KvSectionShape ks;
    for (const auto& L : s.layers) {
      ks.n_embd_k_gqa.push_back(L.n_embd_k);
      ks.n_embd_v_gqa.push_back(L.n_embd_v);
    }
    m.kv_sections.push_back(ks);
  }
  m.source = "synthetic model";
  return m;
}

TEST_P(SynthLayoutTest, ParsesWithTheModelShapeToo) {
  const auto bytes = build_state(GetParam().spec);
  const MemoryShape shape = shape_of(GetParam().spec);
  ParseOptions o;
  o.shape = &shape;
  auto st = parse_bytes(bytes, o);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(rewrite(bytes, o), bytes);
}

// Without a model, a file cut exactly after its first KV section is a valid
// one-section file; with the model's shape, it is not. So the sweep uses the
// shape for iSWA and hybrid layouts.
TEST_P(SynthLayoutTest, EveryTruncationIsAnError) {
  const auto bytes = build_state(GetParam().spec);
  const MemoryShape shape = shape_of(GetParam().spec);
  ParseOptions o;
  if (GetParam().spec.kv_sections > 1 || GetParam().spec.recurrent) o.shape = &shape;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const test::ExactPrefix cut(bytes, n);
    auto st = parse_bytes(cut.span(), o);
    ASSERT_FALSE(st.ok()) << GetParam().name << ": prefix of " << n << " bytes parsed";
    ASSERT_FALSE(st.status().message().empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, SynthLayoutTest, ::testing::ValuesIn(layouts()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(TokenPayload, ServerPackedParsesAndRepacks) {
  std::vector<int32_t> toks = {5, 6, 7};
  std::vector<std::vector<std::byte>> media = {{std::byte{1}, std::byte{2}, std::byte{3}}};
  auto words = pack_server_tokens(toks, {1}, media);
  auto tp = parse_token_payload(words);
  ASSERT_TRUE(tp.ok()) << tp.status().ToString();
  EXPECT_TRUE(tp->packed);
  EXPECT_EQ(tp->tokens, toks);
  EXPECT_EQ(tp->media_positions, std::vector<uint32_t>{1});
  ASSERT_EQ(tp->media_chunks.size(), 1u);
  EXPECT_EQ(pack_server_tokens(tp->tokens, tp->media_positions, tp->media_chunks), words);
}

TEST(TokenPayload, PlainListStaysPlain) {
  auto tp = parse_token_payload({1, 2, 3});
  ASSERT_TRUE(tp.ok());
  EXPECT_FALSE(tp->packed);
  EXPECT_EQ(tp->tokens, (std::vector<int32_t>{1, 2, 3}));
}

TEST(TokenPayload, BrokenPackedPayloadIsCorrupt) {
  EXPECT_EQ(parse_token_payload({-1, 1, 99}).status().code(), Code::kCorruption);   // count past end
  EXPECT_EQ(parse_token_payload({-1, 2, 0, 0}).status().code(), Code::kNotSupported);  // version 2
  EXPECT_EQ(parse_token_payload({-1, 1, 0, 0, 7}).status().code(), Code::kCorruption);  // trailing word
}

// --- Hostile and wrong input: one test per error the reader returns ---------

void set_u32(std::vector<std::byte>& b, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[off + i] = std::byte((v >> (8 * i)) & 0xff);
}
void set_u64(std::vector<std::byte>& b, size_t off, uint64_t v) {
  set_u32(b, off, uint32_t(v));
  set_u32(b, off + 4, uint32_t(v >> 32));
}

// Offsets in the default SynthSpec (ggsq v3, 5 tokens, 1 stream, 7 cells of 12 bytes).
constexpr size_t kTokCount = 8;
constexpr size_t kNStream = 12 + 5 * 4;
constexpr size_t kCellCount = kNStream + 4;
constexpr size_t kFirstCell = kCellCount + 4;
constexpr size_t kVTrans = kFirstCell + 7 * 12;
constexpr size_t kNLayer = kVTrans + 4;
constexpr size_t kKType0 = kNLayer + 4;
constexpr size_t kKRow0 = kKType0 + 4;

void expect_error(const std::vector<std::byte>& b, Code code, const std::string& needle) {
  auto st = parse_bytes(b);
  ASSERT_FALSE(st.ok()) << "expected: " << needle;
  EXPECT_EQ(st.status().code(), code) << st.status().ToString();
  EXPECT_NE(st.status().message().find(needle), std::string::npos) << st.status().ToString();
  EXPECT_NE(st.status().message().find("test.bin"), std::string::npos) << "names the file: " << st.status().ToString();
}

TEST(HostileInput, WrongMagic) {
  auto b = build_state({});
  set_u32(b, 0, 0x12345678);
  expect_error(b, Code::kNotSupported, "unknown magic 12345678");
}

TEST(HostileInput, WrongVersion) {
  auto b = build_state({});
  set_u32(b, 4, 4);
  expect_error(b, Code::kNotSupported, "unknown (magic, version) for sequence state file: 67677371, 00000004");
}

// ggsn v6 (b3166) is read with the model (llama_state_v6_test.cc); v7 is not known.
TEST(HostileInput, EraASessionsNeedTheModelAndV7IsRefusedByName) {
  SynthSpec s;
  s.kind = SynthSpec::kSession;
  s.version = 9;
  auto sn = build_state(s);
  set_u32(sn, 4, 6);  // ggsn v6 (b3166): the legacy KV dump
  expect_error(sn, Code::kNotSupported, "pass its model with {--model GGUF}");
  set_u32(sn, 4, 7);
  expect_error(sn, Code::kNotSupported, "ggsn v7 session files");
}

// ggsq v1 (b3166) is read (real files: fixtures/b3166); a v3 body under a v1 header is not one.
TEST(HostileInput, AV1HeaderOnAnotherBody) {
  auto b = build_state({});
  set_u32(b, 4, 1);
  expect_error(b, Code::kCorruption, "size_t width");
}

// What b3166's ggsq v1 layout cannot hold is refused before the writer emits a byte: an iSWA model's
// two caches, a hybrid's recurrent tail, V widths that differ by layer. The plain state writes.
TEST(WriterRefusals, GgsqV1RefusesBeforeAnyByte) {
  struct Case {
    const char* name;
    SynthSpec spec;
    const char* says;  // nullptr: writable
  };
  SynthSpec iswa, hybrid, widths, layerless_v;
  iswa.kv_sections = 2;
  hybrid.recurrent = true;
  widths.layers = {{1, 128, 1, 128}, {1, 128, 1, 64}};
  std::vector<Case> cases = {{"plain", SynthSpec{}, nullptr},
                             {"iswa", iswa, "2 KV caches (an iSWA model's"},
                             {"hybrid", hybrid, "recurrent state"},
                             {"widths", widths, "layer 1's V is 64 wide and layer 0's 128"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto bytes = build_state(c.spec);
    MemoryFile in("in.bin", std::span<const std::byte>(bytes));
    auto st = parse_state(in, {});
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    st->version = 1;
    for (auto& sec : st->memory.kv) {
      sec.stream_prefix = false;
      for (auto& stream : sec.streams)
        for (auto& cell : stream.cells) cell.seq_ids.clear();
    }
    CopyTensorSource tensors(in);
    VectorSink out;
    const Status w = write_state(*st, tensors, in, out);
    EXPECT_EQ(check_writable(*st).code(), w.code());
    if (!c.says) {
      EXPECT_TRUE(w.ok()) << w.ToString();
      EXPECT_FALSE(out.bytes.empty());
      continue;
    }
    EXPECT_EQ(w.code(), Code::kNotSupported) << w.ToString();
    EXPECT_NE(w.message().find(c.says), std::string::npos) << w.message();
    EXPECT_NE(w.message().find("{--format current}"), std::string::npos) << w.message();
    EXPECT_TRUE(out.bytes.empty()) << out.bytes.size() << " bytes written before the refusal";
  }
}

// llama.cpp refuses a sequence file whose cells do not each hold the sequence's one id (none before
// b5640): one that mixes them, or holds a cell of two ids, is refused by name, never converted.
TEST(HostileInput, ASequenceFileWhoseCellsDoNotAllHoldOneIdIsRefused) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    SynthSpec spec;
    if (variant == 2) spec.n_seq_per_cell = 0, spec.version = 2, spec.stream_prefix = false;
    const auto bytes = build_state(spec);
    MemoryFile in("in.bin", std::span<const std::byte>(bytes));
    auto st = parse_state(in, {});
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    auto& cells = st->memory.kv[0].streams[0].cells;
    ASSERT_GT(cells.size(), 3u);
    if (variant == 0) cells[3].seq_ids.clear();
    if (variant == 1) cells[3].seq_ids = {0, 1};
    if (variant == 2) cells[3].seq_ids = {0};
    CopyTensorSource tensors(in);
    VectorSink out;
    ASSERT_TRUE(write_state(*st, tensors, in, out).ok());
    MemoryFile bad("bad.slot", std::span<const std::byte>(out.bytes));
    auto r = parse_state(bad, {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find("bad.slot: KV section 0, stream 0, cell 3 holds"), std::string::npos)
        << r.status().message();
  }
}

TEST(HostileInput, V8RngThatIsNotDecimalWords) {
  SynthSpec s;
  s.kind = SynthSpec::kSession;
  s.version = 8;
  s.stream_prefix = false;
  s.rng = "12 x4";
  expect_error(build_state(s), Code::kCorruption, "RNG state is not decimal words");
  s.rng = "";
  expect_error(build_state(s), Code::kCorruption, "RNG state length 0 is out of range");
}

TEST(HostileInput, TokenCountPastTheEnd) {
  auto b = build_state({});
  set_u32(b, kTokCount, 0xfffffff0u);
  expect_error(b, Code::kCorruption, "token count 4294967280");
}

// Counts the bytes hold, above any context llama.cpp runs: refused before kvsnap holds them (a review
// measured 2.1 GB for `kvsnap info` and 11.6 GB for `migrate --dry-run` of such a file).
TEST(HostileInput, TokenAndCellCountsAboveAnyContext) {
  auto b = build_state({});
  set_u32(b, kTokCount, (1u << 24) + 1);
  b.resize(b.size() + (size_t(1) << 26) + 64);
  expect_error(b, Code::kCorruption, "token count 16777217 is above any llama.cpp context");
  b = build_state({});
  set_u32(b, kCellCount, (1u << 24) + 1);
  b.resize(b.size() + (size_t(1) << 27) + 64);
  expect_error(b, Code::kCorruption, "16777217 cells in a stream is above any llama.cpp context");
}

TEST(HostileInput, ZeroStreams) {
  auto b = build_state({});
  set_u32(b, kNStream, 0);
  expect_error(b, Code::kCorruption, "stream count 0");
}

TEST(HostileInput, CellCountPastTheEnd) {
  auto b = build_state({});
  set_u32(b, kCellCount, 0x7fffffff);
  expect_error(b, Code::kCorruption, "cells need at least");
}

TEST(HostileInput, ZeroLayers) {
  auto b = build_state({});
  set_u32(b, kNLayer, 0);
  expect_error(b, Code::kCorruption, "layer count 0");
}

TEST(HostileInput, AbsurdLayerCount) {
  auto b = build_state({});
  set_u32(b, kNLayer, 1000000);
  expect_error(b, Code::kCorruption, "layer count 1000000");
}

TEST(HostileInput, BadVTrans) {
  auto b = build_state({});
  set_u32(b, kVTrans, 2);
  expect_error(b, Code::kCorruption, "v_trans is 2");
}

TEST(HostileInput, UnknownTypeId) {
  auto b = build_state({});
  set_u32(b, kKType0, 99);
  expect_error(b, Code::kCorruption, "unknown key type id 99");
}

TEST(HostileInput, RowSizeDisagreesWithType) {
  auto b = build_state({});
  set_u32(b, kKType0, 8);  // q8_0 rows are multiples of 34; this row is 256 bytes
  expect_error(b, Code::kCorruption, "is not a multiple of 34 (q8_0 block)");
}

TEST(HostileInput, HugeRowSize) {
  auto b = build_state({});
  set_u64(b, kKRow0, uint64_t(1) << 62);
  expect_error(b, Code::kCorruption, "out of range");
}

TEST(HostileInput, FileCutAfterTheFirstOfTwoSectionsNeedsTheModelToTell) {
  SynthSpec s;
  s.kv_sections = 2;
  auto b = build_state(s);
  auto whole = parse_bytes(b);
  ASSERT_TRUE(whole.ok());
  b.resize(whole->memory.kv[1].range.offset);
  EXPECT_TRUE(parse_bytes(b).ok()) << "a valid one-section file as far as the bytes go";
  const MemoryShape shape = shape_of(s);
  ParseOptions o;
  o.shape = &shape;
  EXPECT_FALSE(parse_bytes(b, o).ok());
}

TEST(HostileInput, TrailingBytes) {
  auto b = build_state({});
  b.resize(b.size() + 3);
  expect_error(b, Code::kCorruption, "");
}

// A review's finding: without a model, four zero bytes after a plain state were read as an empty
// recurrent state cut after its count (exit 0; llama.cpp writes an empty one whole). They are
// trailing bytes (no layout reads them), and the message says the model would tell.
TEST(HostileInput, FourZeroBytesAfterAPlainStateAreNotARecurrentState) {
  auto b = build_state({});
  b.resize(b.size() + 4);
  expect_error(b, Code::kCorruption, "cannot read the memory section");
}

// A review's finding: a ggsq v3 file of 8-byte cell extras (which no build writes or loads: v3
// carries 12 or none) was read as era H, exit 0. Only a tagged raw buffer may have them.
TEST(HostileInput, AV3StateWithEightByteCellExtrasIsRefused) {
  SynthSpec s;
  s.ext_bytes = 8;
  expect_error(build_state(s), Code::kCorruption, "");
  s.ext_bytes = 12;
  EXPECT_TRUE(parse_bytes(build_state(s)).ok());
}

// A review's finding: a session read without its arch (a v6 session's shape from a snapshot) was
// written with an arch of length 0, which llama.cpp and kvsnap's reader refuse.
TEST(Writer, ASessionWithoutItsArchIsNotWritten) {
  SynthSpec spec;
  spec.kind = SynthSpec::kSession;
  spec.version = 10;
  const auto bytes = build_state(spec);
  MemoryFile in("in.bin", std::span<const std::byte>(bytes));
  auto st = parse_state(in, {});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  st->arch.clear();
  CopyTensorSource tensors(in);
  VectorSink out;
  const Status w = write_state(*st, tensors, in, out);
  EXPECT_EQ(w.code(), Code::kInvalidArgument) << w.ToString();
  EXPECT_NE(w.message().find("the input names none"), std::string::npos) << w.ToString();
}

TEST(HostileInput, TooShortForAHeader) {
  std::vector<std::byte> b(5);
  expect_error(b, Code::kCorruption, "too short");
}

TEST(HostileInput, QuantizedTransposedV) {
  SynthSpec s;
  s.v_trans = 1;
  auto b = build_state(s);
  // First V header after both K layers: type then element size.
  const size_t v0 = kKRow0 + 8 + 256 * 7 + 4 + 8 + 256 * 7;
  set_u32(b, v0, 8);
  expect_error(b, Code::kCorruption, "requires flash attention");
}

// An empty hybrid slot, as llama-server 3.22.1 saves it (POST /slots/0?action=save on a fresh
// lfm2 server; the 120 bytes copied here, and oracle.server_flows re-proves it on the real one):
// llama_memory_recurrent::state_write writes s_trans, the layer count and every tensor's type and
// row size after an empty cell list, with no rows. It was refused as "bytes after an empty cell
// list", which failed `restore --server` into an empty hybrid slot (its type probe saves one).
TEST(RecurrentState, AnEmptyOneIsWrittenWholeAndReads) {
  const std::vector<uint32_t> words = {0x67677371, 3, 4, 0xffffffff, 1, 0, 0,  // ggsq v3, packed: no tokens
                                       1, 0,                                    // 1 stream, no cells
                                       0, 0, 4,                                 // recurrent: no cells, s_trans 0, 4 layers
                                       0, 1024, 0, 0, 1024, 0, 0, 1024, 0,      // r: f32, rows of 1024 bytes
                                       0, 0, 0, 0, 0, 0, 0, 0, 0};              // s: f32, rows of 0 bytes (lfm2)
  std::vector<std::byte> b(words.size() * 4);
  std::memcpy(b.data(), words.data(), b.size());
  auto st = parse_bytes(b);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE(st->memory.recurrent.has_value());
  EXPECT_TRUE(st->memory.recurrent->understood);
  EXPECT_EQ(st->memory.recurrent->cell_count, 0u);
  EXPECT_EQ(st->memory.recurrent->n_entries, 6u);
  EXPECT_EQ(st->memory.kv.at(0).streams.at(0).cell_count, 0u);
  std::vector<std::byte> cut(b.begin(), b.end() - 4);
  EXPECT_FALSE(parse_bytes(cut).ok()) << "a tensor entry cut short";
}

// --- With a model shape: mismatches are named as llama.cpp names them -------

TEST(ModelShape, MatchingShapeParses) {
  auto b = build_state({});
  MemoryShape shape;
  shape.kv_sections_known = shape.recurrent_known = true;
  shape.ext_bytes = 0;
  shape.kv_sections = {{{128, 128}, {128, 128}, {}}};
  shape.source = "model.gguf";
  ParseOptions o;
  o.shape = &shape;
  auto st = parse_bytes(b, o);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_NE(st->reading.find("from model.gguf"), std::string::npos);
}

TEST(ModelShape, WrongHeadDimIsAMismatch) {
  auto b = build_state({});
  MemoryShape shape;
  shape.kv_sections_known = shape.recurrent_known = true;
  shape.ext_bytes = 0;
  shape.kv_sections = {{{256, 256}, {256, 256}, {}}};
  ParseOptions o;
  o.shape = &shape;
  auto st = parse_bytes(b, o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Code::kMismatch);
  EXPECT_NE(st.status().message().find("mismatched key row size (256 != 512"), std::string::npos)
      << st.status().ToString();
}

TEST(ModelShape, WrongLayerCountIsAMismatch) {
  auto b = build_state({});
  MemoryShape shape;
  shape.kv_sections_known = shape.recurrent_known = true;
  shape.ext_bytes = 0;
  shape.kv_sections = {{{128, 128, 128}, {128, 128, 128}, {}}};
  ParseOptions o;
  o.shape = &shape;
  auto st = parse_bytes(b, o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("mismatched layer count (2 in the file, 3 in the model)"), std::string::npos)
      << st.status().ToString();
}

TEST(ModelShape, ModelDecidesTheCellExt) {
  SynthSpec s;
  s.ext_bytes = 12;
  auto b = build_state(s);
  MemoryShape shape;
  shape.ext_bytes = 0;  // the model says: no M-RoPE
  ParseOptions o;
  o.shape = &shape;
  EXPECT_FALSE(parse_bytes(b, o).ok());
  shape.ext_bytes = 12;
  EXPECT_TRUE(parse_bytes(b, o).ok());
}

// --- Real files: everything in fixtures/ (and the shared reference files
// when this checkout sits beside them) round-trips byte for byte. ---------

void round_trip_dir(const std::filesystem::path& dir, size_t& count) {
  for (const auto& p : state_files_under(dir)) {
    SCOPED_TRACE(p.string());
    const auto bytes = slurp(p);
    EXPECT_EQ(rewrite(bytes, options_for(p)), bytes);
    ++count;
  }
}

TEST(Fixtures, ProjectFixturesRoundTripByteExact) {
  size_t n = 0;
  round_trip_dir(std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures", n);
  if (n == 0) GTEST_SKIP() << "no state files under fixtures/ yet";
  std::printf("round-tripped %zu fixture files\n", n);
}

TEST(Fixtures, SharedReferenceFilesRoundTripByteExact) {
  const auto dir = std::filesystem::path(KVSNAP_SOURCE_DIR) / ".." / "shared" / "fixtures";
  size_t n = 0;
  round_trip_dir(dir, n);
  if (n == 0) GTEST_SKIP() << "../shared/fixtures is not beside this checkout";
  std::printf("round-tripped %zu shared reference files\n", n);
}

// Every fixtures/<build>/ directory proves its era: llama.cpp's layout of the build it is named
// after is known (layout_of_build), and that build can have written each of its files
// (check_build_wrote: version, n_stream prefix, v9 outputs, seq ids, raw tag, M-RoPE cell extra
// with the fixture's model). A new fixture directory is checked without touching this test.
TEST(Fixtures, EachBuildDirectoryHoldsFilesOfItsBuildsEra) {
  size_t dirs = 0;
  for (const auto& d : std::filesystem::directory_iterator(std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures")) {
    const std::string name = d.path().filename().string();
    const auto build = parse_llama_build(name);
    if (!d.is_directory() || !build.ok()) continue;  // models/, kvsnap/ (snapshots), scripts
    SCOPED_TRACE(name);
    ++dirs;
    const auto layout = layout_of_build(*build);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    size_t files = 0;
    for (const auto& p : state_files_under(d.path())) {
      SCOPED_TRACE(p.filename().string());
      const auto st = parse_bytes(slurp(p), options_for(p));
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      const auto prof = fixture_model_profile(p);
      const std::optional<bool> cell_ext = prof ? std::optional<bool>(prof->has_cell_ext) : std::nullopt;
      const Status wrote = check_build_wrote(*st, *build, cell_ext);
      EXPECT_TRUE(wrote.ok()) << "era " << layout->era << ": " << wrote.ToString();
      ++files;
    }
    EXPECT_GT(files, 0u) << "a fixture directory without state files";
  }
  if (dirs == 0) GTEST_SKIP() << "no fixtures/<build>/ directories";
  std::printf("checked the files of %zu fixture build directories against their builds\n", dirs);
}

// One real file per format: every strict prefix is a clean error.
TEST(Fixtures, TruncationSweepOnRealFiles) {
  std::map<std::string, std::filesystem::path> one_per_format;
  for (const auto& p : state_files_under(std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures")) {
    const auto bytes = slurp(p);
    auto st = parse_bytes(bytes, options_for(p));
    if (!st.ok()) continue;
    // One file per format (kind, version, n_stream era): the smallest. The
    // synthetic sweeps above cover every memory layout at every offset too.
    const std::string key = std::string(kind_name(st->kind)) + std::to_string(st->version) +
                            (st->memory.kv.empty() || st->memory.kv[0].stream_prefix ? "p" : "n");
    auto it = one_per_format.find(key);
    if (it == one_per_format.end() || std::filesystem::file_size(p) < std::filesystem::file_size(it->second)) {
      one_per_format[key] = p;
    }
  }
  if (one_per_format.empty()) GTEST_SKIP() << "no state files under fixtures/ yet";
  for (const auto& [key, p] : one_per_format) {
    SCOPED_TRACE(p.string());
    const auto bytes = slurp(p);
    // iSWA and hybrid files cut at a section boundary are valid shorter files
    // unless the model says how many sections there are: sweep with the model.
    ParseOptions o = options_for(p);
    std::optional<MemoryShape> shape = fixture_model_shape(p);
    if (shape) {
      if (p.parent_path().filename() != "v0.5.0") shape->ext_bytes.reset();  // older files have no ext
      o.shape = &*shape;
    }
    // Every cut in the headers and cell metadata (the first 8 KiB) and the
    // last 4 KiB, and every 61st byte between: inside tensor rows one cut is
    // like its neighbours, and the synthetic sweeps above cut everywhere.
    size_t tried = 0;
    for (size_t n = 0; n < bytes.size(); n += (n < 8192 || n + 4096 >= bytes.size()) ? 1 : 61) {
      MemoryFile f("cut", std::span<const std::byte>(bytes.data(), n));
      auto st = parse_state(f, o);
      ASSERT_FALSE(st.ok()) << "prefix of " << n << " bytes parsed";
      ++tried;
    }
    std::printf("truncation sweep: %s (%zu of %zu prefixes)\n", p.filename().c_str(), tried, bytes.size());
  }
}

}  // namespace
}  // namespace kvsnap
