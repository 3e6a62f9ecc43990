// Cell restarts (format version 4, the GRID section): an extension saved on its parent's cell
// grid keeps every chunk of the parent's and stores only its new cells; the original reads back
// byte for byte through the restarted grid (rows and transposed V; bands by the mapping test); a chain of
// extensions keeps its restarts bounded; a damaged GRID is refused naming it; a manifest that
// needs no restart stays version 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "format/content_digest.h"
#include "format/cursor.h"
#include "format/manifest_surgery.h"
#include "format/snapshot.h"
#include "format/snapshot_internal.h"
#include "format/state_builder.h"
#include "format/state_prefix.h"
#include "test_files.h"

namespace kvsnap {
namespace {

using testing::build_state;
using testing::Surgery;
using testing::SynthSpec;

constexpr uint32_t kN = 4;  // cells per chunk

// A synthetic state of `cells` cells, and its first `prefix` cells as a state of their own (the
// session before its last turn).
struct Conversation {
  std::vector<std::byte> full;
  std::vector<std::vector<std::byte>> prefixes;
};

Conversation conversation(uint32_t v_trans, uint32_t cells, const std::vector<uint64_t>& prefix_cells) {
  SynthSpec spec;
  spec.v_trans = v_trans;
  spec.cells = cells;
  spec.token_words.clear();
  for (uint32_t i = 0; i < cells; ++i) spec.token_words.push_back(int32_t(100 + i));
  Conversation c;
  c.full = build_state(spec);
  MemoryFile f("full.slot", std::span<const std::byte>(c.full));
  auto st = parse_state(f);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (!st.ok()) return c;
  for (uint64_t n : prefix_cells) {
    VectorSink cut;
    Status s = write_prefix(*st, f, n, cut);
    EXPECT_TRUE(s.ok()) << s.ToString();
    c.prefixes.push_back(std::move(cut.bytes));
  }
  return c;
}

SnapshotOptions options() {
  SnapshotOptions o;
  o.cells_per_chunk = kN;
  o.created = "2025-01-01T00:00:00Z";
  o.source_name = "x.slot";
  return o;
}

// A save of `state` into `store`, continuing `parent`'s grid and taking its chunks when given.
Result<SnapshotManifest> save(const std::vector<std::byte>& state, MemoryChunkStore& store,
                              const SnapshotManifest* parent, bool continue_grid = true) {
  MemoryFile f("state.slot", std::span<const std::byte>(state));
  KV_ASSIGN_OR_RETURN(StateFile st, parse_state(f));
  SnapshotOptions o = options();
  std::map<Sha256Digest, ChunkRef> known;
  if (parent) {
    for (const ChunkRef& c : parent->chunks) known.emplace(c.sha256, c);
    o.known_chunks = &known;
    if (continue_grid) o.parent_grid = &parent->segments;
  }
  return build_snapshot(st, f, o, store);
}

uint64_t tensor_cells_bytes(const SnapshotManifest& m, uint64_t cells) {
  uint64_t n = 0;
  for (const Segment& s : m.segments.segments) {
    if (s.kind == SegmentKind::kRows) n += cells * s.row_bytes;
    if (s.kind == SegmentKind::kTransposed) n += cells * uint64_t(s.n_rows) * s.elem_bytes;
  }
  return n;
}

// Raw bytes of the tensor chunks of `m` that `parent` does not hold.
uint64_t new_tensor_bytes(const SnapshotManifest& m, const SnapshotManifest& parent) {
  std::set<Sha256Digest> had;
  for (const ChunkRef& c : parent.chunks) had.insert(c.sha256);
  uint64_t n = 0;
  for (uint64_t i = m.segments.n_frame_chunks; i < m.chunks.size(); ++i)
    if (!had.count(m.chunks[i].sha256)) n += m.chunks[i].raw_size;
  return n;
}

void expect_reads_back(const SnapshotManifest& m, MemoryChunkStore& store, const std::vector<std::byte>& want) {
  auto parsed = parse_manifest(m.bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  auto r = open_snapshot(m.bytes, store);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::byte> got(want.size());
  ASSERT_EQ((*r)->original().size(), want.size());
  ASSERT_TRUE((*r)->original().read_at(0, got).ok());
  EXPECT_TRUE(got == want);
  // Pieces of odd sizes (1, 14, 27, ... bytes) cross the restarts at many offsets.
  std::vector<std::byte> piecewise(want.size());
  for (uint64_t at = 0, piece = 1; at < want.size(); at += piece, piece = piece % 97 + 13) {
    const uint64_t n = std::min<uint64_t>(piece, want.size() - at);
    ASSERT_TRUE((*r)->original().read_at(at, std::span<std::byte>(piecewise.data() + at, n)).ok());
  }
  EXPECT_TRUE(piecewise == want);
  EXPECT_TRUE((*r)->verify_chunks().ok());
  Status v = (*r)->verify_original();
  EXPECT_TRUE(v.ok()) << v.ToString();
}

class SnapshotGrid : public ::testing::TestWithParam<uint32_t> {};  // v_trans

TEST_P(SnapshotGrid, AnExtensionOnItsParentsGridStoresOnlyItsNewCells) {
  // 14 cells, then 23: the parent's last chunk (cells 12..13) is partial.
  const Conversation c = conversation(GetParam(), 23, {14});
  MemoryChunkStore store;
  auto parent = save(c.prefixes[0], store, nullptr);
  ASSERT_TRUE(parent.ok()) << parent.status().ToString();
  EXPECT_EQ(parent->format_version, 3u) << "nothing to continue: version 3";

  auto ext = save(c.full, store, &*parent);
  ASSERT_TRUE(ext.ok()) << ext.status().ToString();
  EXPECT_EQ(ext->format_version, 4u);
  EXPECT_EQ(ext->min_reader_version, 4u);
  EXPECT_EQ(ext->info["format_version"], 4);
  size_t tensor_segments = 0;
  for (const Segment& s : ext->segments.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    ++tensor_segments;
    EXPECT_EQ(s.cell_restarts(), std::vector<uint32_t>{14}) << snapshot_detail::describe_segment(s);
    EXPECT_EQ(s.cell_chunks(), 4u + 3u) << "cells 0-3 4-7 8-11 12-13 | 14-17 18-21 22";
  }
  EXPECT_GT(tensor_segments, 0u);
  // Every tensor chunk of the parent's is one of the extension's, and the new ones hold exactly
  // the 9 new cells.
  std::set<Sha256Digest> ext_ids;
  for (const ChunkRef& ch : ext->chunks) ext_ids.insert(ch.sha256);
  for (uint64_t i = parent->segments.n_frame_chunks; i < parent->chunks.size(); ++i)
    EXPECT_TRUE(ext_ids.count(parent->chunks[i].sha256)) << "parent chunk " << i;
  EXPECT_EQ(new_tensor_bytes(*ext, *parent), tensor_cells_bytes(*ext, 23 - 14));
  expect_reads_back(*ext, store, c.full);

  // Without the parent's grid the partial chunk is stored again, with the cells after it.
  MemoryChunkStore other;
  auto uniform = save(c.full, other, &*parent, /*continue_grid=*/false);
  ASSERT_TRUE(uniform.ok());
  EXPECT_EQ(uniform->format_version, 3u);
  EXPECT_EQ(new_tensor_bytes(*uniform, *parent), tensor_cells_bytes(*uniform, 23 - 12));

  // The digest covers the grid: the same file on another grid has another digest, and the table
  // recomputes it.
  EXPECT_NE(ext->content_digest, uniform->content_digest);
  EXPECT_EQ(ext->content_digest, content_digest_of_table(ext->segments, c.full.size(), ext->chunks, false));

  // Names and prefixes follow the restarted grid.
  auto r = open_snapshot(ext->bytes, store);
  ASSERT_TRUE(r.ok());
  const Segment* first = nullptr;
  for (const Segment& s : ext->segments.segments)
    if (s.kind != SegmentKind::kFrame && !first) first = &s;
  ASSERT_NE(first, nullptr);
  EXPECT_NE((*r)->describe_chunk(first->first_chunk + 3).find("cells 12..13"), std::string::npos)
      << (*r)->describe_chunk(first->first_chunk + 3);
  EXPECT_NE((*r)->describe_chunk(first->first_chunk + 4).find("cells 14..17"), std::string::npos)
      << (*r)->describe_chunk(first->first_chunk + 4);
  const std::vector<uint64_t> prefix = (*r)->chunks_for_cell_prefix(15);
  EXPECT_TRUE(std::count(prefix.begin(), prefix.end(), first->first_chunk + 4)) << "cell 14 is in chunk 4";
  EXPECT_FALSE(std::count(prefix.begin(), prefix.end(), first->first_chunk + 5));
}

TEST_P(SnapshotGrid, AChainOfExtensionsKeepsItsRestartsBounded) {
  // 60 turns of 3 cells after a first save of 5: a restart per turn, and a turn stores its 3
  // cells, until the bound; then the last piece carries on as a uniform grid would, and a turn
  // stores at most the parent's partial last chunk again (N - 1 cells) with its own.
  std::vector<uint64_t> lengths;
  for (uint64_t n = 5; n <= 5 + 3 * 60; n += 3) lengths.push_back(n);
  const Conversation c = conversation(GetParam(), uint32_t(lengths.back()), lengths);
  MemoryChunkStore store;
  auto prev = save(c.prefixes[0], store, nullptr);
  ASSERT_TRUE(prev.ok());
  size_t most = 0;
  for (size_t i = 1; i < lengths.size(); ++i) {
    SCOPED_TRACE(lengths[i]);
    auto next = save(c.prefixes[i], store, &*prev);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    size_t had = 0;
    for (const Segment& s : prev->segments.segments) had = std::max(had, s.cell_restarts().size());
    for (const Segment& s : next->segments.segments) most = std::max(most, s.cell_restarts().size());
    if (had < 32) EXPECT_EQ(new_tensor_bytes(*next, *prev), tensor_cells_bytes(*next, 3));
    else EXPECT_LE(new_tensor_bytes(*next, *prev), tensor_cells_bytes(*next, 3 + kN - 1));
    if (i % 20 == 0 || i + 1 == lengths.size()) expect_reads_back(*next, store, c.prefixes[i]);
    prev = std::move(next);
  }
  EXPECT_EQ(most, 32u) << "the bound was reached and held";
}

// kvsnap digest --as takes a snapshot's whole grid: a manifest another writer made with more
// restarts than this one's 32 still gives the file it was saved from its recorded digest (a
// save's continuation keeps 32: the digest on that grid differs, a false "different content").
TEST_P(SnapshotGrid, DigestAsTakesEveryRestartOfTheSnapshot) {
  const Conversation c = conversation(GetParam(), 90, {});
  MemoryFile f("full.slot", std::span<const std::byte>(c.full));
  auto st = parse_state(f);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto snap = snapshot_detail::plan_state_segments(*st, f, kN);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  std::vector<uint32_t> restarts;
  for (uint32_t r = 2; r < 90 && restarts.size() < 40; r += 2) restarts.push_back(r);
  ASSERT_EQ(restarts.size(), 40u);
  for (Segment& seg : snap->segments)
    if (seg.kind != SegmentKind::kFrame) seg.set_cell_restarts(restarts);
  snapshot_detail::number_chunks(*snap);
  auto recorded = content_digest_of_original(*snap, f, nullptr);
  ASSERT_TRUE(recorded.ok()) << recorded.status().ToString();

  auto as = state_digests(*st, f, kN, &*snap);
  ASSERT_TRUE(as.ok()) << as.status().ToString();
  EXPECT_EQ(as->content_digest, *recorded) << "digest --as on the snapshot's 40 restarts";

  // A save continuing that grid keeps 32 of them: another grid, another digest.
  auto continued = snapshot_detail::plan_state_segments(*st, f, kN);
  ASSERT_TRUE(continued.ok());
  snapshot_detail::continue_cell_grids(*continued, *snap);
  for (const Segment& seg : continued->segments) {
    if (seg.kind == SegmentKind::kFrame) continue;
    EXPECT_EQ(seg.cell_restarts().size(), 32u);
  }
  auto cont_digest = content_digest_of_original(*continued, f, nullptr);
  ASSERT_TRUE(cont_digest.ok());
  EXPECT_NE(*cont_digest, *recorded);
}

// The reader's offset -> chunk mapping (locate) and the writer's gather (ChunkReader) agree on
// every byte of a restarted segment: rows, and transposed V cut into bands of 3 of its 7 rows
// (real slots need a 16 MiB segment for bands; the mapping does not).
TEST(SnapshotGridMapping, EveryByteIsWhereItsChunkHoldsIt) {
  using namespace snapshot_detail;
  for (const SegmentKind kind : {SegmentKind::kRows, SegmentKind::kTransposed}) {
    SCOPED_TRACE(segment_kind_name(kind));
    Segment s;
    s.kind = kind;
    s.cell_count = 37;
    s.cells_per_chunk = 5;
    if (kind == SegmentKind::kRows) {
      s.row_bytes = 6;
      s.size = 37 * 6;
    } else {
      s.elem_bytes = 2;
      s.n_rows = 7;
      s.rows_per_chunk = 3;
      s.size = 7 * 37 * 2;
    }
    s.set_cell_restarts({3, 11, 12, 30});
    // Pieces of 3, 8, 1, 18 and 7 cells: 1 + 2 + 1 + 4 + 2 cell chunks.
    ASSERT_EQ(s.cell_chunks(), 10u);
    EXPECT_EQ(s.cell_chunk(2).first, 8u);
    EXPECT_EQ(s.cell_chunk(2).count, 3u);
    EXPECT_EQ(s.cell_chunk(3).first, 11u);
    EXPECT_EQ(s.cell_chunk(3).count, 1u);
    EXPECT_EQ(s.cell_chunk(9).first, 35u);
    EXPECT_EQ(s.cell_chunk(9).count, 2u);
    SegmentTable t;
    t.segments = {s};
    number_chunks(t);
    const Segment& seg = t.segments[0];
    std::vector<std::byte> bytes(seg.size);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(uint8_t(i * 7 + 1));
    MemoryFile f("segment", std::span<const std::byte>(bytes));
    ChunkReader reader(t, f);
    ASSERT_EQ(reader.n_chunks(), seg.n_chunks());
    std::vector<std::vector<std::byte>> chunks(seg.n_chunks());
    uint64_t total = 0;
    for (uint64_t k = 0; k < chunks.size(); ++k) {
      ASSERT_TRUE(reader.read(seg.first_chunk + k, chunks[k]).ok());
      EXPECT_EQ(chunks[k].size(), seg.chunk_raw_size(k));
      total += chunks[k].size();
    }
    EXPECT_EQ(total, seg.size);
    for (uint64_t off = 0; off < seg.size; ++off) {
      const Location loc = locate(t, seg, off);
      ASSERT_LT(loc.chunk - seg.first_chunk, chunks.size()) << off;
      const std::vector<std::byte>& c = chunks[loc.chunk - seg.first_chunk];
      ASSERT_GT(loc.run, 0u) << off;
      ASSERT_LE(loc.offset_in_chunk + loc.run, c.size()) << off;
      ASSERT_LE(off + loc.run, seg.size) << off;
      for (uint64_t r = 0; r < loc.run; ++r) ASSERT_EQ(c[loc.offset_in_chunk + r], bytes[off + r]) << off << "+" << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, SnapshotGrid, ::testing::Values(0u, 1u),
                         [](const auto& info) { return info.param ? "TransposedV" : "RowV"; });

// 23 transposed-V cells saved after their first 14 (both into `store`): the extension's manifest.
Result<SnapshotManifest> synthetic_extension(MemoryChunkStore& store) {
  const Conversation c = conversation(1, 23, {14});
  KV_ASSIGN_OR_RETURN(SnapshotManifest parent, save(c.prefixes[0], store, nullptr));
  return save(c.full, store, &parent);
}

TEST(SnapshotGridHostile, ADamagedGridIsRefusedNamingIt) {
  MemoryChunkStore store;
  auto ext = synthetic_extension(store);
  ASSERT_TRUE(ext.ok()) << ext.status().ToString();
  ASSERT_TRUE(open_snapshot(ext->bytes, store).ok());
  ASSERT_EQ(ext->format_version, 4u) << "a GRID section to damage";
  const uint32_t first_tensor = [&] {
    for (size_t i = 0; i < ext->segments.segments.size(); ++i)
      if (ext->segments.segments[i].kind != SegmentKind::kFrame) return uint32_t(i);
    return 0u;
  }();
  const uint32_t frame = first_tensor == 0 ? 1u : 0u;
  ASSERT_EQ(ext->segments.segments[frame].kind, SegmentKind::kFrame);

  // One entry: segment `index`, the given restarts.
  auto grid = [](uint32_t index, std::vector<uint32_t> restarts, uint64_t entries = 1) {
    std::vector<std::byte> b;
    put_u64(b, entries);
    put_u32(b, index);
    put_u32(b, uint32_t(restarts.size()));
    for (uint32_t r : restarts) put_u32(b, r);
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  auto expect_refused = [&](Surgery x, const std::string& what) {
    auto r = open_snapshot(x.b, store);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
  };
  struct Case {
    std::string payload, what;
  };
  const std::vector<Case> cases = {
      {grid(first_tensor, {0}), "segment " + std::to_string(first_tensor) + ": restart at cell 0"},
      {grid(first_tensor, {23}), "restart at cell 23 is not after 0 and inside its 23 cells"},
      {grid(first_tensor, {9, 9}), "restart at cell 9 is not after 9"},
      {grid(first_tensor, {}), "an entry without restarts"},
      {grid(frame, {3}), "has no cell grid to restart"},
      {grid(9999, {3}), "past the"},
      {grid(first_tensor, {14}, 0), "no segment has cell restarts"},
      {grid(first_tensor, {14}) + "x", "bytes after the entries"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    Surgery x{ext->bytes};
    x.replace_payload(snapshot_detail::kTagGrid, k.payload);
    expect_refused(x, k.what);
  }
  {
    // The first segment's restart moved from 14 to 13: as many chunks, but not of the sizes CHNK has.
    Surgery x{ext->bytes};
    const size_t first_restart = x.payload_of(snapshot_detail::kTagGrid) + 8 + 4 + 4;
    uint32_t was = 0;
    std::memcpy(&was, x.b.data() + first_restart, 4);
    ASSERT_EQ(was, 14u);
    x.set_u32(first_restart, 13);
    x.reseal();
    expect_refused(x, "the segments say");
  }
  {
    // A GRID a reader without it may skip.
    Surgery x{ext->bytes};
    x.set_u32(x.payload_of(snapshot_detail::kTagGrid) - 12, 0);
    x.reseal();
    expect_refused(x, "a GRID section not flagged required");
  }
  {
    // Cell restarts in a manifest that says a reader of version 3 may read it.
    Surgery x{ext->bytes};
    x.set_u32(8, 3);
    x.reseal();
    expect_refused(x, "a GRID section in a manifest for readers of version 3");
  }
  {
    // A version-3 reader refuses a version-4 manifest by its version (simulated: version 5 here).
    Surgery x{ext->bytes};
    x.set_u32(4, 5);
    x.set_u32(8, 5);
    x.reseal();
    auto r = open_snapshot(x.b, store);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kNotSupported);
  }
}

TEST(SnapshotGridHostile, AStandaloneFileContinuesNoGrid) {
  const Conversation c = conversation(0, 23, {14});
  MemoryChunkStore store;
  auto parent = save(c.prefixes[0], store, nullptr);
  ASSERT_TRUE(parent.ok());
  MemoryFile f("full.slot", std::span<const std::byte>(c.full));
  auto st = parse_state(f);
  ASSERT_TRUE(st.ok());
  SnapshotOptions o = options();
  o.parent_grid = &parent->segments;
  VectorSink out;
  auto m = write_snapshot_file(*st, f, o, out);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_NE(m.status().message().find("full.slot: a standalone snapshot file does not continue"), std::string::npos)
      << m.status().ToString();
  EXPECT_TRUE(out.bytes.empty());
}

// Writes fixtures/kvsnap/v4/ (only with KVSNAP_WRITE_FIXTURES=1): real slots saved after their
// first 70 cells (16 cells per chunk), as an export of a store writes them (the file form of a
// version-4 manifest). SnapshotFixtures.EveryReleasedVersionStillOpens opens them.
TEST(SnapshotFixtures, RegenerateGrid) {
  if (!std::getenv("KVSNAP_WRITE_FIXTURES")) GTEST_SKIP() << "set KVSNAP_WRITE_FIXTURES=1 to write the fixtures";
  namespace fs = std::filesystem;
  const fs::path root = fs::path(KVSNAP_SOURCE_DIR);
  const fs::path out_dir = root / snapshot_fixture_dir(kSnapshotGridVersion);
  fs::create_directories(out_dir);
  for (const char* file : {"b5640/hd64-bf16-bf16-faoff.slot", "v0.5.0/hd64-f16-f16-faon.slot"}) {
    const fs::path p = root / "fixtures" / file;
    const std::vector<std::byte> bytes = test::slurp(p);
    MemoryFile f(p.filename().string(), std::span<const std::byte>(bytes));
    auto st = parse_state(f);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    VectorSink cut;
    ASSERT_TRUE(write_prefix(*st, f, 70, cut).ok());
    MemoryChunkStore store;
    SnapshotOptions o = options();
    o.cells_per_chunk = 16;
    o.source_name = p.string();
    MemoryFile cf("cut.slot", std::span<const std::byte>(cut.bytes));
    auto cst = parse_state(cf);
    ASSERT_TRUE(cst.ok());
    auto parent = build_snapshot(*cst, cf, o, store);
    ASSERT_TRUE(parent.ok()) << parent.status().ToString();
    o.parent_grid = &parent->segments;
    auto ext = build_snapshot(*st, f, o, store);
    ASSERT_TRUE(ext.ok()) << ext.status().ToString();
    ASSERT_EQ(ext->format_version, kSnapshotGridVersion);
    auto plan = SnapshotFileAssembler::plan(*ext, store);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const std::string f_name = std::string(file);
    const std::string stem = f_name.substr(0, f_name.find('/')) + "-" + p.stem().string() + "-after-70";
    const fs::path target = out_dir / (stem + ".kvsnap");
    auto w = AtomicFileWriter::create(posix_io(), target.string());
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(plan->write(store, **w).ok());
    ASSERT_TRUE((*w)->commit().ok());
    std::ofstream(target.string() + ".sha256") << to_hex(sha256_of(bytes)) << "\n";
    std::printf("wrote %s (%zu bytes from %zu)\n", target.c_str(), size_t(fs::file_size(target)), bytes.size());
  }
  // The fuzz target's seed (small, so the fuzzer's mutations reach GRID often): a synthetic
  // transposed-V extension, as a file and as a manifest.
  MemoryChunkStore store;
  auto ext = synthetic_extension(store);
  ASSERT_TRUE(ext.ok()) << ext.status().ToString();
  ASSERT_EQ(ext->format_version, kSnapshotGridVersion);
  auto plan = SnapshotFileAssembler::plan(*ext, store);
  ASSERT_TRUE(plan.ok());
  const fs::path seeds = root / "tests/fuzz/corpus/snapshot";
  VectorSink file;
  ASSERT_TRUE(plan->write(store, file).ok());
  std::ofstream(seeds / "grid-v4.kvsnap", std::ios::binary)
      .write(reinterpret_cast<const char*>(file.bytes.data()), std::streamsize(file.bytes.size()));
  std::ofstream(seeds / "grid-v4.manifest", std::ios::binary)
      .write(reinterpret_cast<const char*>(ext->bytes.data()), std::streamsize(ext->bytes.size()));
  std::printf("wrote %s/grid-v4.kvsnap (%zu bytes) and .manifest\n", seeds.c_str(), file.bytes.size());
}

}  // namespace
}  // namespace kvsnap
