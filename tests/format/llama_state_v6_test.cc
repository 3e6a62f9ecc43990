// ggsn v6 sessions of llama.cpp b3166 (era A): the real fixtures written by b3166
// (fixtures/b3166, tests/oracle/driver.cc) read with the model, byte for byte back,
// and every way such a file can be wrong: no model, the wrong model, a size that fits
// several type pairs, truncations and mutations.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "format/cursor.h"
#include "format/ggml_types.h"
#include "format/llama_state.h"
#include "format/memory_shape.h"
#include "format/model_profile.h"
#include "format/rewrite.h"
#include "test_files.h"

namespace kvsnap {
namespace {

const std::filesystem::path kDir = std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures";

MemoryShape shape_of(const std::string& model) {
  const auto path = (kDir / "models" / ("tiny-" + model + ".gguf")).string();
  auto prof = load_model_profile(posix_io(), path);
  EXPECT_TRUE(prof.ok()) << prof.status().ToString();
  auto sh = memory_shape(*prof, path);
  EXPECT_TRUE(sh.ok()) << sh.status().ToString();
  return *sh;
}

Result<StateFile> parse(std::span<const std::byte> b, const MemoryShape* shape,
                        std::optional<std::pair<int32_t, int32_t>> types = std::nullopt) {
  MemoryFile f("test.session", b);
  ParseOptions o;
  o.shape = shape;
  o.legacy_kv_types = types;
  return parse_state(f, o);
}

std::vector<std::byte> rewrite(const std::vector<std::byte>& b, const MemoryShape* shape) {
  ParseOptions o;
  o.shape = shape;
  return test::rewrite(b, o, "test.session");
}

std::vector<std::byte> fixture(const std::string& name) { return test::slurp(kDir / "b3166" / name); }

uint64_t u64_at(const std::vector<std::byte>& b, size_t off) {
  uint64_t v;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}

// The offset of the dump header (kv_buf_size) of a real file, walked independently.
size_t dump_offset(const std::vector<std::byte>& b) {
  size_t o = 8 + kB3166HparamsBytes;
  uint32_t n;
  std::memcpy(&n, b.data() + o, 4);
  o += 4 + 4 * size_t(n);
  o += 8 + u64_at(b, o);         // rng
  o += 8 + 4 * u64_at(b, o);     // output ids
  o += 8 + 4 * u64_at(b, o);     // logits
  o += 8 + 4 * u64_at(b, o);     // embeddings
  return o;
}

// A v6 session built byte by byte on the real file's header (hparams of the
// hd64n model: 4 layers, n_embd_k_gqa = n_embd_v_gqa = 64), with rows of
// `k_row` and `v_row` bytes and the given cells.
std::vector<std::byte> synth(uint64_t k_row, uint64_t v_row, const std::vector<std::pair<int32_t, bool>>& cells) {
  const auto real = fixture("hd64n-f16-f16-faon.session");
  std::vector<std::byte> b(real.begin(), real.begin() + 8 + kB3166HparamsBytes);
  put_u32(b, 2);  // tokens
  put_i32(b, 1);
  put_i32(b, 2);
  const std::string rng = "5489 1 2 3";
  put_u64(b, rng.size());
  for (char c : rng) b.push_back(std::byte(c));
  put_u64(b, 0);  // outputs
  put_u64(b, 0);  // logits
  put_u64(b, 0);  // embeddings
  const uint64_t n = cells.size();
  put_u64(b, n * 4 * (k_row + v_row));
  put_u32(b, uint32_t(n));
  put_u32(b, 4096);
  put_u32(b, uint32_t(n));
  put_u32(b, 0);  // v_trans
  std::mt19937 rng_bytes(7);
  for (int il = 0; il < 4; ++il) {
    for (uint64_t i = 0; i < n * (k_row + v_row); ++i) b.push_back(std::byte(rng_bytes() & 0xff));
  }
  for (auto [pos, live] : cells) {
    put_i32(b, pos);
    put_u64(b, live ? 1 : 0);
    if (live) put_i32(b, 0);
  }
  return b;
}

TEST(EraASession, RealFilesReadWithTheModelAndRoundTripByteExact) {
  const MemoryShape shape = shape_of("hd64n");
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kDir / "b3166")) {
    if (e.path().extension() != ".session") continue;
    SCOPED_TRACE(e.path().string());
    const auto bytes = test::slurp(e.path());
    auto st = parse(bytes, &shape);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->kind, StateKind::kSessionFile);
    EXPECT_EQ(st->version, 6u);
    ASSERT_TRUE(st->legacy);
    EXPECT_EQ(st->legacy->hparams.size(), kB3166HparamsBytes);
    EXPECT_EQ(st->legacy->kv_size, 4096u);
    EXPECT_EQ(st->arch, "llama");  // from the model: later session formats need it, v6 does not say
    EXPECT_EQ(st->legacy->empty_cells, 0u);
    ASSERT_EQ(st->memory.kv.size(), 1u);
    const KvStream& s = st->memory.kv[0].streams.at(0);
    EXPECT_EQ(s.cell_count, st->tokens.tokens.size());  // one cell per prompt token
    for (uint32_t i = 0; i < s.cell_count; ++i) {
      EXPECT_EQ(s.cells[i].pos, int32_t(i));
      EXPECT_EQ(std::vector<int32_t>(s.cells[i].seq_ids.begin(), s.cells[i].seq_ids.end()), std::vector<int32_t>{0});
    }
    // What the file name says the driver asked b3166 for.
    const std::string name = e.path().filename().string();
    const std::string ctk = name.substr(6, name.find('-', 6) - 6);
    ASSERT_EQ(s.layers.size(), 4u);
    EXPECT_EQ(type_name(s.layers[0].k_type), ctk);
    EXPECT_EQ(s.v_trans, name.find("faoff") != std::string::npos ? 1u : 0u);
    EXPECT_NE(st->reading.find("inferred from kv_buf_size"), std::string::npos) << st->reading;
    EXPECT_GT(st->rng.size(), 1000u);
    ASSERT_TRUE(st->outputs);
    EXPECT_EQ(st->outputs->logits_size, st->outputs->n_outputs * 302u);  // n_vocab of the model
    EXPECT_EQ(rewrite(bytes, &shape), bytes);
    ++n;
  }
  EXPECT_GE(n, 1u);
}

TEST(EraASession, WithoutTheModelItNamesModel) {
  auto st = parse(fixture("hd64n-f16-f16-faon.session"), nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Code::kNotSupported);
  EXPECT_NE(st.status().message().find("{--model GGUF}"), std::string::npos) << st.status().ToString();
  EXPECT_NE(st.status().message().find("test.session"), std::string::npos) << st.status().ToString();
}

TEST(EraASession, TheWrongModelIsAMismatchNamingTheFields) {
  const MemoryShape other = shape_of("hd64");
  auto st = parse(fixture("hd64n-f16-f16-faon.session"), &other);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Code::kMismatch);
  EXPECT_NE(st.status().message().find("wrong model"), std::string::npos) << st.status().ToString();
  EXPECT_NE(st.status().message().find("n_head 2 in the file, 4 in the model"), std::string::npos)
      << st.status().ToString();
}

// b3166 gave every layer n_embd_head x n_head_kv; a model that says otherwise for a layer (or has
// another memory layout today) is refused by name rather than read with the wrong widths.
TEST(EraASession, ModelsWhoseLayersDifferFromB3166sAreRefused) {
  MemoryShape shape = shape_of("hd64n");
  shape.kv_sections[0].n_embd_k_gqa[2] = 128;
  auto st = parse(fixture("hd64n-f16-f16-faon.session"), &shape);
  EXPECT_EQ(st.status().code(), Code::kNotSupported) << st.status().ToString();
  EXPECT_NE(st.status().message().find("layer 2 128/64"), std::string::npos) << st.status().ToString();
  shape = shape_of("hd64n");
  shape.kv_sections.push_back(shape.kv_sections[0]);  // iSWA today
  st = parse(fixture("hd64n-f16-f16-faon.session"), &shape);
  EXPECT_EQ(st.status().code(), Code::kNotSupported) << st.status().ToString();
  EXPECT_NE(st.status().message().find("another memory layout"), std::string::npos) << st.status().ToString();
}

// q4_0 and iq4_nl blocks have the same size: a q4_0/q8_0 dump is also an iq4_nl/q8_0 one.
TEST(EraASession, SizesThatFitSeveralTypePairsAreRefusedNamingThem) {
  const MemoryShape shape = shape_of("hd64n");
  const auto b = synth(36, 68, {{0, true}, {1, true}, {2, true}});
  auto st = parse(b, &shape);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Code::kAmbiguous) << st.status().ToString();
  for (const char* p : {"q4_0/q8_0", "iq4_nl/q8_0", "test.session"}) {
    EXPECT_NE(st.status().message().find(p), std::string::npos) << p << ": " << st.status().ToString();
  }
  // Declared, the pair settles it; a declared pair that does not fit is a mismatch.
  auto ok = parse(b, &shape, std::make_pair(int32_t(GgmlType::kQ4_0), int32_t(GgmlType::kQ8_0)));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->memory.kv[0].streams[0].layers[3].k_type, int32_t(GgmlType::kQ4_0));
  auto bad = parse(b, &shape, std::make_pair(int32_t(GgmlType::kF16), int32_t(GgmlType::kF16)));
  EXPECT_EQ(bad.status().code(), Code::kMismatch) << bad.status().ToString();
  // q8_0/q8_0 (68 + 68 bytes per layer) fits one pair only.
  auto q8 = parse(synth(68, 68, {{0, true}, {1, true}}), &shape);
  ASSERT_TRUE(q8.ok()) << q8.status().ToString();
  EXPECT_EQ(q8->memory.kv[0].streams[0].layers[0].v_type, int32_t(GgmlType::kQ8_0));
  // A size no pair fits.
  auto none = parse(synth(10, 10, {{0, true}}), &shape);
  EXPECT_EQ(none.status().code(), Code::kMismatch) << none.status().ToString();
}

// The real q4_0/q8_0 session of b3166: 104 bytes per cell and layer fit q4_0/q8_0, iq4_nl/q8_0 and
// the two swapped pairs; declared, it reads and round-trips.
TEST(EraASession, RealAmbiguousFileIsRefusedUnlessDeclared) {
  const MemoryShape shape = shape_of("hd64n");
  const auto b = fixture("hd64n-q4_0-q8_0-faon.session.ambiguous");
  auto st = parse(b, &shape);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Code::kAmbiguous) << st.status().ToString();
  for (const char* p : {"fit 4 pairs", "q4_0/q8_0", "iq4_nl/q8_0", "q8_0/q4_0", "q8_0/iq4_nl"}) {
    EXPECT_NE(st.status().message().find(p), std::string::npos) << p << ": " << st.status().ToString();
  }
  MemoryFile f("test.session", std::span<const std::byte>(b));
  ParseOptions o;
  o.shape = &shape;
  o.legacy_kv_types = std::make_pair(int32_t(GgmlType::kQ4_0), int32_t(GgmlType::kQ8_0));
  auto ok = parse_state(f, o);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_NE(ok->reading.find("as declared"), std::string::npos) << ok->reading;
  VectorSink out;
  CopyTensorSource src(f);
  ASSERT_TRUE(write_state(*ok, src, f, out).ok());
  EXPECT_EQ(out.bytes, b);
}

// A hole left by a removed sequence inside kv_head: kept, counted, written back.
TEST(EraASession, EmptyCellsAreKeptAndCounted) {
  const MemoryShape shape = shape_of("hd64n");
  const auto b = synth(128, 128, {{0, true}, {-1, false}, {2, true}});
  auto st = parse(b, &shape);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->legacy->empty_cells, 1u);
  EXPECT_NE(st->reading.find("1 empty"), std::string::npos) << st->reading;
  EXPECT_EQ(rewrite(b, &shape), b);
}

// An empty context (kv_head 0): no rows, no cells, no types to infer.
TEST(EraASession, AnEmptyCacheReadsAndRoundTrips) {
  const MemoryShape shape = shape_of("hd64n");
  const auto b = synth(128, 128, {});
  auto st = parse(b, &shape);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->memory.kv.at(0).streams.at(0).cell_count, 0u);
  EXPECT_EQ(rewrite(b, &shape), b);
}

TEST(EraASession, EveryTruncationIsACleanError) {
  const MemoryShape shape = shape_of("hd64n");
  const auto b = fixture("hd64n-f16-f16-faon.session");
  for (size_t n = 0; n < b.size(); ++n) {
    const test::ExactPrefix cut(b, n);
    auto st = parse(cut.span(), &shape);
    ASSERT_FALSE(st.ok()) << "a prefix of " << n << " bytes parsed";
    ASSERT_NE(st.status().message().find("test.session"), std::string::npos) << st.status().ToString();
  }
}

TEST(EraASession, MutatedDumpHeadersAreCleanErrors) {
  const MemoryShape shape = shape_of("hd64n");
  const auto b = fixture("hd64n-f16-f16-faon.session");
  const size_t d = dump_offset(b);
  struct Case {
    size_t off;
    uint32_t value;
    Code code;
    const char* needle;
  };
  const Case cases[] = {
      {d, 11264 + 1, Code::kCorruption, "not a positive multiple of kv_head"},
      {d, 11 * 100, Code::kMismatch, "fit no pair"},
      {d + 8, 5000, Code::kCorruption, "exceeds kv_size"},
      {d + 20, 2, Code::kCorruption, "v_trans is 2"},
      {d + 8, 12, Code::kCorruption, ""},        // kv_head 12: kv_buf_size no longer a multiple
      {8 + 4, 303, Code::kMismatch, "n_vocab"},  // hparams n_vocab
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.off) + " := " + std::to_string(c.value));
    auto m = b;
    std::memcpy(m.data() + c.off, &c.value, 4);
    auto st = parse(m, &shape);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), c.code) << st.status().ToString();
    EXPECT_NE(st.status().message().find(c.needle), std::string::npos) << st.status().ToString();
  }
  // Random bytes anywhere in the headers and the cell list: an error or a reading, never a crash.
  std::mt19937 rng(3);
  for (int i = 0; i < 3000; ++i) {
    auto m = b;
    const size_t off = (i % 2) ? rng() % d + 0 : d + rng() % (m.size() - d);
    m[off] = std::byte(rng() & 0xff);
    (void)parse(m, &shape);
  }
}

}  // namespace
}  // namespace kvsnap
