// format/snapshot_mlx.h: mlx-lm prompt caches as snapshots. Every class (hand-made files and the
// real mlx-lm files of the fuzz corpus) comes back byte for byte from its chunks, two caches
// sharing a prefix share the chunks of the whole 256-position blocks, damaged manifests and
// chunks are refused naming what is wrong, and a kvsnap that does not know MLXC refuses it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "format/snapshot_internal.h"
#include "format/snapshot_mlx.h"
#include "migrate/mlx_requant.h"
#include "mlx/mlx_test_files.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;
using namespace test_mlx;

struct Built {
  SnapshotManifest m;
  MemoryChunkStore blobs;
};

Result<Built> build(const ReadableFile& f, const MlxSnapshotMeta& meta = {}, uint32_t threads = 2) {
  KV_ASSIGN_OR_RETURN(MlxPromptCache c, read_mlx_prompt_cache(f));
  Built b;
  SnapshotOptions o;
  o.threads = threads;
  o.created = "2026-01-01T00:00:00Z";
  KV_ASSIGN_OR_RETURN(b.m, build_mlx_snapshot(c, f, o, meta, b.blobs));
  return b;
}

// original() of the snapshot, read whole.
Result<std::vector<std::byte>> restored(Built& b) {
  KV_ASSIGN_OR_RETURN(auto r, open_snapshot(b.m.bytes, b.blobs));
  std::vector<std::byte> out(r->original().size());
  KV_RETURN_IF_ERROR(r->original().read_at(0, out));
  KV_RETURN_IF_ERROR(r->verify_chunks());
  KV_RETURN_IF_ERROR(r->verify_original());
  return out;
}

void expect_round_trip(const MemoryFile& f) {
  auto b = build(f);
  ASSERT_TRUE(b.ok()) << f.name() << ": " << b.status().ToString();
  ASSERT_TRUE(b->m.mlx.has_value());
  EXPECT_TRUE(b->m.provenance.mlx_prompt_cache);
  auto back = restored(*b);
  ASSERT_TRUE(back.ok()) << f.name() << ": " << back.status().ToString();
  ASSERT_EQ(back->size(), f.size()) << f.name();
  EXPECT_EQ(std::memcmp(back->data(), f.bytes().data(), f.size()), 0) << f.name();
  // The manifest reads back the same (its MLXC too).
  auto again = parse_manifest(b->m.bytes);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(again->mlx.has_value());
  ASSERT_EQ(again->mlx->tensors.size(), b->m.mlx->tensors.size());
  for (size_t i = 0; i < again->mlx->tensors.size(); ++i) {
    EXPECT_EQ(again->mlx->tensors[i].name, b->m.mlx->tensors[i].name);
    EXPECT_EQ(again->mlx->tensors[i].dtype, b->m.mlx->tensors[i].dtype);
  }
}

MemoryFile requantized(const MemoryFile& in, MlxKvSetting to) {
  auto c = read_mlx_prompt_cache(in);
  EXPECT_TRUE(c.ok());
  VectorSink sink;
  auto r = mlx_requantize(*c, in, MlxRequantSpec{to, to, MlxDevice::kCpu, MlxLayout::kMeta}, sink);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return MemoryFile("q.safetensors", std::move(sink.bytes));
}

TEST(SnapshotMlx, KvCacheRoundTripsAndIsCutIntoHeadPlanesByPosition) {
  MemoryFile f = kv_file(2, 4, 600, 64);
  expect_round_trip(f);
  auto b = build(f);
  ASSERT_TRUE(b.ok());
  // 4 tensor segments (2 layers x K, V), each 4 planes x 600 positions of 128 bytes, cut at 256
  // positions with every plane in the chunk (the band holds all planes): 3 chunks each.
  ASSERT_EQ(b->m.mlx->tensors.size(), 4u);
  size_t tensor_segments = 0;
  for (const Segment& s : b->m.segments.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    ++tensor_segments;
    EXPECT_EQ(s.kind, SegmentKind::kTransposed);
    EXPECT_EQ(s.n_rows, 4u);
    EXPECT_EQ(s.cell_count, 600u);
    EXPECT_EQ(s.elem_bytes, 128u);
    EXPECT_EQ(s.rows_per_chunk, 4u);
    EXPECT_EQ(s.n_chunks(), 3u);
    EXPECT_EQ(s.ggml_type, 30);  // bf16: byte planes
  }
  EXPECT_EQ(tensor_segments, 4u);
  EXPECT_TRUE(b->m.cells.empty());
  EXPECT_EQ(b->m.info["provenance"]["kind"], "mlx-prompt-cache");
  EXPECT_EQ(b->m.info["mlx"]["model"], "tiny");
  EXPECT_EQ(b->m.info["mlx"]["k_types"], "bf16");
  EXPECT_EQ(b->m.info["mlx"]["classes"], "KVCache x2");
  EXPECT_EQ(b->m.info["mlx"]["offset"], 600);
  auto r = open_snapshot(b->m.bytes, b->blobs);
  ASSERT_TRUE(r.ok());
  // A chunk's description names the tensor, positions and planes; a llama.cpp parse is refused.
  EXPECT_NE((*r)->describe_chunk(1).find("tensor "), std::string::npos) << (*r)->describe_chunk(1);
  EXPECT_NE((*r)->describe_chunk(1).find("positions 0..255, planes 0..3"), std::string::npos);
  auto parsed = (*r)->parse_original();
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kNotSupported);
  EXPECT_NE(parsed.status().message().find("mlx-lm prompt cache"), std::string::npos);
  auto sum = mlx_summary_of((*r)->manifest());
  ASSERT_TRUE(sum.has_value());
  EXPECT_EQ(sum->model, "tiny");
  EXPECT_EQ(sum->n_layers, 2);
  EXPECT_EQ(sum->offset, 600);
}

TEST(SnapshotMlx, QuantizedCachesRoundTripWithCodesUnfilteredAndScalesInPlanes) {
  MemoryFile f = kv_file(2, 2, 300, 128);
  for (MlxKvSetting q : {MlxKvSetting{4, 64}, MlxKvSetting{3, 128}, MlxKvSetting{8, 32}}) {
    MemoryFile qf = requantized(f, q);
    expect_round_trip(qf);
    auto b = build(qf);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->m.info["mlx"]["k_types"], q.name());
    for (size_t i = 0, t = 0; i < b->m.segments.segments.size(); ++i) {
      const Segment& s = b->m.segments.segments[i];
      if (s.kind == SegmentKind::kFrame) continue;
      const std::string& dtype = b->m.mlx->tensors[t++].dtype;
      EXPECT_EQ(s.ggml_type, dtype == "U32" ? -1 : 30) << dtype;
    }
  }
}

TEST(SnapshotMlx, RealMlxLmFilesOfEveryLayoutRoundTrip) {
  // The fuzz corpus holds files the real mlx-lm wrote (tests/fuzz/make_corpus.py): a ring, a
  // quantized file of the step layout, and ArraysCache + scalars of the 0.32 layout.
  const fs::path dir = fs::path(KVSNAP_SOURCE_DIR) / "tests/fuzz/corpus/mlx_prompt_cache";
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::vector<std::byte> bytes = test::slurp(e.path());
    MemoryFile f(e.path().filename().string(), std::move(bytes));
    expect_round_trip(f);
    ++n;
  }
  EXPECT_GE(n, 3u);
}

TEST(SnapshotMlx, ScalarsAndOddTensorsStayInTheFrame) {
  // mlx-lm 0.32's layout: 0-d I32 state, ArraysCache arrays (not [B,H,S,D]), F32[0] for None.
  const fs::path p = fs::path(KVSNAP_SOURCE_DIR) / "tests/fuzz/corpus/mlx_prompt_cache/scalars_arrays.safetensors";
  MemoryFile f(p.filename().string(), test::slurp(p));
  auto c = read_mlx_prompt_cache(f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto b = build(f);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  std::set<std::string> segmented;
  for (const SnapshotMlxTensor& t : b->m.mlx->tensors) segmented.insert(t.name);
  size_t framed = 0;
  for (const SafetensorsTensor& t : c->st.tensors) {
    const bool planes = t.shape.size() == 4 && t.bytes() > 0;
    EXPECT_EQ(segmented.count(t.name), planes ? 1u : 0u) << t.name;
    framed += !planes;
  }
  EXPECT_GT(framed, 0u);
  EXPECT_FALSE(segmented.empty());
}

TEST(SnapshotMlx, TwoCachesSharingAPrefixShareTheChunksOfItsWholeBlocks) {
  // 600 and 900 positions whose first 600 agree: blocks 0..255 and 256..511 of every tensor
  // are the same chunks; 512..599 vs 512..767 are not (the shorter block differs in length).
  MemoryFile a = kv_file(2, 4, 600, 64, "a.safetensors");
  MemoryFile b = kv_file(2, 4, 900, 64, "b.safetensors");
  auto sa = build(a), sb = build(b);
  ASSERT_TRUE(sa.ok() && sb.ok());
  std::set<Sha256Digest> ha, hb;
  for (const ChunkRef& c : sa->m.chunks) ha.insert(c.sha256);
  for (const ChunkRef& c : sb->m.chunks) hb.insert(c.sha256);
  size_t shared = 0;
  for (const auto& h : hb) shared += ha.count(h);
  EXPECT_EQ(shared, 4u * 2u);  // 4 tensors x 2 whole blocks
  // Quantized the same way, the same holds (quantization is per position).
  MemoryFile qa = requantized(a, {4, 64}), qb = requantized(b, {4, 64});
  auto qsa = build(qa), qsb = build(qb);
  ASSERT_TRUE(qsa.ok() && qsb.ok());
  ha.clear();
  shared = 0;
  for (const ChunkRef& c : qsa->m.chunks) ha.insert(c.sha256);
  for (const ChunkRef& c : qsb->m.chunks) shared += ha.count(c.sha256);
  EXPECT_EQ(shared, 12u * 2u);  // 4 sides x (codes, scales, biases) x 2 blocks
}

TEST(SnapshotMlx, StandaloneFileOpensAndThreadsDoNotChangeTheManifest) {
  MemoryFile f = kv_file(1, 2, 300, 64);
  auto one = build(f, {"m", {1, 2, 3}}, 1), two = build(f, {"m", {1, 2, 3}}, 2);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(one->m.bytes, two->m.bytes);
  EXPECT_EQ(one->m.tokens.tokens, (std::vector<int32_t>{1, 2, 3}));
  auto c = read_mlx_prompt_cache(f);
  ASSERT_TRUE(c.ok());
  VectorSink out;
  SnapshotOptions o;
  auto m = write_mlx_snapshot_file(*c, f, o, {}, out);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  MemoryFile file("x.kvsnap", std::move(out.bytes));
  auto r = open_snapshot_file(file);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE((*r)->manifest().mlx.has_value());
  EXPECT_TRUE((*r)->verify_original().ok());
}

// Re-encodes a changed manifest (the digests follow), as a buggy or hostile writer would.
std::vector<std::byte> reencoded(SnapshotManifest m) {
  EXPECT_TRUE(snapshot_detail::encode_manifest(m).ok());
  return m.bytes;
}

TEST(SnapshotMlx, DamagedManifestsAreRefusedNamingTheProblem) {
  MemoryFile f = kv_file(1, 2, 300, 64);
  auto b = build(f);
  ASSERT_TRUE(b.ok());
  auto expect = [](const std::vector<std::byte>& bytes, Code code, const std::string& words) {
    auto p = parse_manifest(bytes, "m");
    ASSERT_FALSE(p.ok()) << words;
    EXPECT_EQ(p.status().code(), code) << p.status().ToString();
    EXPECT_NE(p.status().message().find(words), std::string::npos) << p.status().ToString();
  };
  {  // INFO says mlx, no MLXC
    SnapshotManifest m = b->m;
    m.mlx.reset();
    expect(reencoded(m), Code::kCorruption, "there is no MLXC section");
  }
  {  // MLXC without INFO's kind
    SnapshotManifest m = b->m;
    m.info["provenance"]["kind"] = "seq";
    expect(reencoded(m), Code::kCorruption, "not an mlx-lm prompt cache");
  }
  {  // a tensor more than segments
    SnapshotManifest m = b->m;
    m.mlx->tensors.push_back({"9.9", "BF16"});
    expect(reencoded(m), Code::kCorruption, "MLXC names 3 tensors, the segment table has 2");
  }
  {  // a newer MLXC
    SnapshotManifest m = b->m;
    m.mlx->version = 2;
    expect(reencoded(m), Code::kNotSupported, "MLXC section version 2");
  }
  {  // a CELL table
    SnapshotManifest m = b->m;
    m.cells.push_back({});
    expect(reencoded(m), Code::kCorruption, "with a CELL table");
  }
  {  // truncated MLXC payload: cut the last byte of the first section and fix the length
    std::vector<std::byte> bytes = b->m.bytes;
    ASSERT_EQ(std::memcmp(bytes.data() + 16, "MLXC", 4), 0);  // written first
    uint64_t len = load_le<uint64_t>(reinterpret_cast<const uint8_t*>(bytes.data()) + 24);
    bytes.erase(bytes.begin() + 32 + std::ptrdiff_t(len) - 1);
    std::vector<std::byte> l;
    append_le<uint64_t>(l, len - 1);
    std::memcpy(bytes.data() + 24, l.data(), 8);
    // Reseal DIGS (the last 72 bytes' middle digest) so the MLXC decoder is what fails.
    const size_t digs = bytes.size() - 72 - 16;
    const Sha256Digest h = sha256_of(std::span<const std::byte>(bytes).first(digs));
    std::memcpy(bytes.data() + digs + 16 + 40, h.data(), 32);
    expect(bytes, Code::kCorruption, "MLXC section");
  }
  {  // what a kvsnap without MLXC sees: an unknown required section, before INFO
    std::vector<std::byte> bytes = b->m.bytes;
    bytes[16 + 3] = std::byte{'D'};  // "MLXD"
    const size_t digs = bytes.size() - 72 - 16;
    const Sha256Digest h = sha256_of(std::span<const std::byte>(bytes).first(digs));
    std::memcpy(bytes.data() + digs + 16 + 40, h.data(), 32);
    expect(bytes, Code::kNotSupported, "required section 'MLXD' is unknown to this kvsnap");
  }
}

TEST(SnapshotMlx, AFlippedChunkByteIsCaughtNamingTheTensor) {
  MemoryFile f = kv_file(1, 2, 300, 64);
  auto b = build(f);
  ASSERT_TRUE(b.ok());
  // Chunk 1 is the first tensor chunk (chunk 0 is the frame): store it uncompressed-damaged.
  const ChunkRef& ref = b->m.chunks[1];
  std::vector<std::byte>& blob = b->blobs.blobs.at(ref.sha256);
  blob.back() ^= std::byte{0x40};
  auto r = open_snapshot(b->m.bytes, b->blobs);
  ASSERT_TRUE(r.ok());
  Status s = (*r)->verify_chunks();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tensor 0.0 BF16, positions 0..255"), std::string::npos) << s.ToString();
}

TEST(SnapshotMlx, ATruncatedFileIsRefusedBeforeAnyChunk) {
  MemoryFile f = kv_file(1, 2, 300, 64);
  std::vector<std::byte> cut(f.bytes().begin(), f.bytes().end() - 100);
  MemoryFile t("cut.safetensors", std::move(cut));
  auto c = read_mlx_prompt_cache(t);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cut.safetensors"), std::string::npos);
  // A cache that does not describe the file given is refused by the builder.
  auto good = read_mlx_prompt_cache(f);
  ASSERT_TRUE(good.ok());
  MemoryChunkStore blobs;
  auto m = build_mlx_snapshot(*good, t, SnapshotOptions{}, {}, blobs);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(blobs.blobs.empty());
}

}  // namespace
}  // namespace kvsnap
