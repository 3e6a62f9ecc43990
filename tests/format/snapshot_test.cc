// The kvsnap snapshot format: every fixture round-trips through both forms
// (standalone file, manifest + chunk store) byte for byte, at several chunk
// sizes; hostile files are clean errors; memory stays bounded on a large
// state; and every released format version's fixtures keep opening.
//
// Regenerate the compatibility fixtures of the current format version (never
// those of a released one):
//   KVSNAP_WRITE_FIXTURES=1 build-fmt/tests/format_tests --gtest_filter=SnapshotFixtures.Regenerate
#include "format/content_digest.h"
#include "format/snapshot.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "base/json_access.h"
#include "base/os.h"
#include "base/sha256_lanes.h"
#include "format/cursor.h"
#include "format/memory_shape.h"
#include "format/model_profile.h"
#include "format/snapshot_internal.h"
#include "format/state_builder.h"
#include "format/state_prefix.h"
#include "format/manifest_surgery.h"
#include "under_asan.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;
using testing::build_state;
using testing::SynthSpec;
using testing::Surgery;

const fs::path kRoot = fs::path(KVSNAP_SOURCE_DIR);
const std::string kCreated = "2025-01-01T00:00:00Z";

using test::slurp;

std::vector<fs::path> state_files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const auto ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".slot" || ext == ".session" || ext == ".bin" || ext == ".raw")) {
      out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<fs::path> llama_fixtures() {
  std::vector<fs::path> all;
  for (const char* tag : {"v0.5.0", "b8121", "b5640"}) {
    auto v = state_files_under(kRoot / "fixtures" / tag);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

ParseOptions options_for(const fs::path& p) {
  ParseOptions o;
  if (p.extension() == ".raw") o.kind = StateKind::kRawSeq;
  return o;
}

// A content-addressed store in memory.
class MapStore final : public ChunkSink, public ChunkSource {
 public:
  Status put(const ChunkRef& ref, std::span<const std::byte> blob) override {
    ++puts;
    blobs.try_emplace(to_hex(ref.sha256), blob.begin(), blob.end());
    return Status::OK();
  }
  Result<std::vector<std::byte>> get(const ChunkRef& ref) override {
    fetched.insert(ref.index);
    auto it = blobs.find(to_hex(ref.sha256));
    if (it == blobs.end()) return Status::NotFound("no blob " + to_hex(ref.sha256));
    return it->second;
  }
  std::map<std::string, std::vector<std::byte>> blobs;
  std::set<uint64_t> fetched;
  size_t puts = 0;
};

SnapshotOptions opts_with(uint32_t cells_per_chunk, const std::string& source = "x.slot") {
  SnapshotOptions o;
  o.cells_per_chunk = cells_per_chunk;
  o.created = kCreated;
  o.source_name = source;
  return o;
}

std::vector<std::byte> make_file(const std::vector<std::byte>& state, const ParseOptions& po, const SnapshotOptions& o,
                                 SnapshotManifest* out_manifest = nullptr) {
  MemoryFile f("state", std::span<const std::byte>(state));
  auto st = parse_state(f, po);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (!st.ok()) return {};
  VectorSink sink;
  auto m = write_snapshot_file(*st, f, o, sink);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (out_manifest && m.ok()) *out_manifest = *m;
  return sink.bytes;
}

std::vector<std::byte> read_all_of(const ReadableFile& f) {
  std::vector<std::byte> b(f.size());
  Status s = f.read_at(0, b);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return b;
}

// original() read front to back in odd pieces, then at odd offsets.
void expect_same_bytes(const ReadableFile& orig, const std::vector<std::byte>& want) {
  ASSERT_EQ(orig.size(), want.size());
  EXPECT_TRUE(read_all_of(orig) == want);
  std::vector<std::byte> got(want.size());
  for (uint64_t at = 0, piece = 1; at < want.size(); at += piece, piece = piece * 3 % 4099 + 1) {
    const uint64_t n = std::min<uint64_t>(piece, want.size() - at);
    ASSERT_TRUE(orig.read_at(at, std::span<std::byte>(got.data() + at, n)).ok());
  }
  EXPECT_TRUE(got == want);
  std::mt19937 rng(uint32_t(want.size()));
  for (int i = 0; i < 200; ++i) {
    const uint64_t at = rng() % want.size();
    const uint64_t n = std::min<uint64_t>(1 + rng() % 3001, want.size() - at);
    std::vector<std::byte> b(n);
    ASSERT_TRUE(orig.read_at(at, b).ok());
    ASSERT_TRUE(std::equal(b.begin(), b.end(), want.begin() + at)) << "at " << at << " +" << n;
  }
  std::byte one{};
  EXPECT_FALSE(orig.read_at(want.size(), std::span<std::byte>(&one, 1)).ok());
}

// --- Every fixture, both forms -------------------------------------------------------

TEST(Snapshot, EveryFixtureRoundTripsInBothForms) {
  size_t n = 0;
  for (const auto& p : llama_fixtures()) {
    SCOPED_TRACE(p.string());
    const auto bytes = slurp(p);
    MemoryFile f(p.filename().string(), std::span<const std::byte>(bytes));
    auto st = parse_state(f, options_for(p));
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    const SnapshotOptions o = opts_with(kDefaultCellsPerChunk, p.string());

    // File form.
    VectorSink file;
    auto fm = write_snapshot_file(*st, f, o, file);
    ASSERT_TRUE(fm.ok()) << fm.status().ToString();
    MemoryFile snap("snap.kvsnap", std::span<const std::byte>(file.bytes));
    auto r = open_snapshot_file(snap);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    expect_same_bytes((*r)->original(), bytes);
    EXPECT_TRUE((*r)->verify_chunks().ok());
    EXPECT_TRUE((*r)->verify_original().ok());
    const StateDigests digests = state_digests(*st, f, kDefaultCellsPerChunk).value();
    EXPECT_EQ(to_hex((*r)->provenance().content_digest), to_hex(digests.content_digest));
    EXPECT_EQ(to_hex(digests.sha256), to_hex(sha256_of(bytes)));
    EXPECT_EQ((*r)->provenance().source, p.filename().string());
    auto again = parse_state((*r)->original(), options_for(p));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->reading, st->reading);
    auto exact = (*r)->parse_original();
    ASSERT_TRUE(exact.ok()) << exact.status().ToString();
    EXPECT_EQ(exact->memory.kv.size(), st->memory.kv.size());
    EXPECT_EQ(exact->memory.recurrent.has_value(), st->memory.recurrent.has_value());
    // Cells and tokens in the manifest are the file's.
    ASSERT_EQ((*r)->cells().size(), st->memory.kv.size());
    for (size_t si = 0; si < st->memory.kv.size(); ++si) {
      for (size_t s = 0; s < st->memory.kv[si].streams.size(); ++s) {
        const auto& a = st->memory.kv[si].streams[s].cells;
        const auto& b = (*r)->cells()[si].streams[s];
        ASSERT_EQ(a.size(), b.size());
        for (size_t c = 0; c < a.size(); ++c) {
          EXPECT_EQ(a[c].pos, b[c].pos);
          EXPECT_EQ(a[c].seq_ids, b[c].seq_ids);
          EXPECT_EQ(a[c].ext, b[c].ext);
        }
      }
    }
    EXPECT_EQ((*r)->tokens().words, st->tokens.words);
    EXPECT_EQ((*r)->tokens().tokens, st->tokens.tokens);

    // Store form: the same manifest bytes, chunks by hash.
    MapStore store;
    auto sm = build_snapshot(*st, f, o, store);
    ASSERT_TRUE(sm.ok()) << sm.status().ToString();
    EXPECT_EQ(sm->bytes, fm->bytes) << "the manifest is the same in both forms";
    auto rs = open_snapshot(sm->bytes, store);
    ASSERT_TRUE(rs.ok()) << rs.status().ToString();
    expect_same_bytes((*rs)->original(), bytes);
    EXPECT_TRUE((*rs)->verify_chunks().ok());
    ++n;
  }
  EXPECT_EQ(n, 47u);
}

// The standalone files at the defaults stay small: none grows by more than its
// manifest and a few percent (tiny or already-quantized fixtures barely
// compress: the worst, a 40 KB iSWA q8_0 slot, was 1.07x its size), and all
// fixtures together shrink (1.21x measured when this was written; zstd level 3
// with the byte-shuffle filter). Speed and the filter's gain: bench/store_bench.cc.
// A review's finding: the manifest's token list and cell metadata lie outside the content digest, and
// an archive whose TOKN was edited was imported (the store's verify then flagged it; show --tokens and
// a server restore's reuse check read it). verify_metadata holds them to the original's.
TEST(Snapshot, ManifestTokensAndCellsAreHeldToTheOriginal) {
  const fs::path p = llama_fixtures().front();
  const auto bytes = slurp(p);
  MemoryFile f(p.filename().string(), std::span<const std::byte>(bytes));
  auto st = parse_state(f, options_for(p));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_FALSE(st->tokens.tokens.empty());
  ASSERT_FALSE(st->memory.kv.empty());
  const SnapshotOptions o = opts_with(kDefaultCellsPerChunk, p.string());
  auto check = [&](const StateFile& written) {
    VectorSink file;
    EXPECT_TRUE(write_snapshot_file(written, f, o, file).ok());
    MemoryFile snap("snap.kvsnap", std::span<const std::byte>(file.bytes));
    auto r = open_snapshot_file(snap);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return Status::Corruption("unreadable");
    EXPECT_TRUE((*r)->verify_original().ok()) << "the digest does not cover TOKN and CELL";
    auto parsed = (*r)->parse_original();
    EXPECT_TRUE(parsed.ok());
    return parsed.ok() ? (*r)->verify_metadata(*parsed) : parsed.status();
  };
  EXPECT_TRUE(check(*st).ok());
  StateFile tokens = *st;
  tokens.tokens.tokens[0] ^= 1;
  EXPECT_EQ(check(tokens).code(), Code::kCorruption);
  StateFile cells = *st;
  for (KvStream& s : cells.memory.kv[0].streams)
    if (!s.cells.empty()) s.cells[0].pos += 7;
  EXPECT_EQ(check(cells).code(), Code::kCorruption);
}

TEST(Snapshot, FixtureSizesStayBounded) {
  uint64_t total_in = 0, total_out = 0;
  for (const auto& p : llama_fixtures()) {
    const auto bytes = slurp(p);
    SnapshotManifest m;
    const auto file = make_file(bytes, options_for(p), opts_with(kDefaultCellsPerChunk), &m);
    total_in += bytes.size();
    total_out += file.size();
    EXPECT_LE(file.size(), bytes.size() + bytes.size() / 20 + m.bytes.size() + 1024) << p;
  }
  EXPECT_GE(double(total_in) / double(total_out), 1.15) << total_in << " -> " << total_out;
}

TEST(Snapshot, SmallChunksCrossTransposedGathers) {
  for (const auto& p : llama_fixtures()) {
    SCOPED_TRACE(p.string());
    const auto bytes = slurp(p);
    for (uint32_t cpc : {1u, 3u, 7u}) {
      SCOPED_TRACE(cpc);
      SnapshotManifest m;
      const auto file = make_file(bytes, options_for(p), opts_with(cpc), &m);
      MemoryFile snap("snap", std::span<const std::byte>(file));
      auto r = open_snapshot_file(snap);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(read_all_of((*r)->original()) == bytes);
      if (cpc == 7) expect_same_bytes((*r)->original(), bytes);
      for (const Segment& s : m.segments.segments) {
        if (s.kind != SegmentKind::kFrame) {
          EXPECT_EQ(s.cells_per_chunk, cpc);
        }
      }
    }
  }
}

TEST(Snapshot, ThreadsAndLevelsGiveTheSameOriginal) {
  const auto p = kRoot / "fixtures/v0.5.0/hd64-f16-f16-faoff.slot";
  const auto bytes = slurp(p);
  SnapshotManifest one;
  const auto a = make_file(bytes, {}, opts_with(5), &one);
  SnapshotOptions o = opts_with(5);
  o.threads = 3;
  SnapshotManifest three;
  const auto b = make_file(bytes, {}, o, &three);
  EXPECT_EQ(a, b) << "threads do not change the output";
  o.zstd_level = 19;
  SnapshotManifest high;
  const auto c = make_file(bytes, {}, o, &high);
  ASSERT_EQ(high.chunks.size(), one.chunks.size());
  for (size_t i = 0; i < one.chunks.size(); ++i) EXPECT_EQ(high.chunks[i].sha256, one.chunks[i].sha256);
  MemoryFile snap("snap", std::span<const std::byte>(c));
  auto r = open_snapshot_file(snap);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(read_all_of((*r)->original()) == bytes);
}

// The adaptive level (SnapshotOptions::adaptive): a save compresses its first kAdaptiveFirstBytes;
// then a sink that blocks in its appends (a disk behind: base/io.h pace_to_disk) makes the chunks
// begun after it compressed, and a sink that blocks between jobs (waiting for the encoders: the
// CPU is the limit) makes them raw; every mix gives the original back. The sink "blocks" by
// counting (SnapshotOptions::blocked_count, read before and after each job), so what is tested is
// the rule, not the scheduler; a sink whose storage says when it waited (a store's pack,
// SnapshotOptions::storage_waits) counts those waits too.
class PhasedSink final : public ByteSink {
 public:
  // Where the sink's output stands in [disk_from, disk_to), its appends block (the disk is the
  // limit); elsewhere it blocks between jobs (the encoders are). As a real pack, `per_window`:
  // only the append that crosses a write-behind window blocks, and the sink waits for the
  // encoders before every job, the disk-bound ones too (the ring it was blocked on is soon taken).
  PhasedSink(uint64_t disk_from, uint64_t disk_to, bool per_window = false)
      : from_(disk_from), to_(disk_to), per_window_(per_window) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    const bool crosses = (bytes + data.size()) / kWriteBehindBytes != bytes / kWriteBehindBytes;
    if (disk_limited() && (!per_window_ || crosses)) {
      ++blocked;
      ++storage;
    } else if (blocks_for_others) {
      ++blocked;
    }
    bytes += data.size();
    if (keep) kept.insert(kept.end(), data.begin(), data.end());
    return Status::OK();
  }
  // The count, read before and after each job (in turn, from the before): a wait between jobs is
  // counted at the before.
  std::optional<uint64_t> count() {
    if (calls++ % 2 == 0 && (per_window_ || !disk_limited())) ++blocked;
    return blocked;
  }
  bool disk_limited() const { return bytes >= from_ && bytes < to_; }
  uint64_t bytes = 0, blocked = 0, calls = 0;
  uint64_t storage = 0;  // the appends the disk made wait
  uint64_t storage_unknown_from = UINT64_MAX;  // from this output on the storage cannot tell
  // reports_storage: the save is told `storage` (SnapshotOptions::storage_waits). blocks_for_others:
  // the thread also blocks in every other append, not for the disk (page-cache reclaim, a
  // catalog's round trip).
  bool reports_storage = false, blocks_for_others = false;
  bool keep = false;
  std::vector<std::byte> kept;

 private:
  uint64_t from_, to_;
  bool per_window_;
};

constexpr uint64_t kMiB = uint64_t(1) << 20;

std::vector<std::byte> big_f16_state() {
  SynthSpec s;
  s.cells = 4800;  // 2 layers of K and V, 4096 f16 values a cell each: 150 MiB
  s.layers = {{1, 4096, 1, 4096}, {1, 4096, 1, 4096}};
  s.f16_like = true;
  return build_state(s);
}

// Each f16 chunk (the frame's few small ones left out): its offset in the file, its blob's in the
// snapshot file, compressed?
struct SavedChunk {
  uint64_t raw_at, stored_at;
  bool zstd;
};

std::vector<SavedChunk> adaptive_save(const std::vector<std::byte>& state, bool adaptive, PhasedSink& sink,
                                      bool counted = true) {
  MemoryFile f("big.slot", std::span<const std::byte>(state));
  auto st = parse_state(f, {});
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  SnapshotOptions o = opts_with(32);  // 256 KiB chunks
  o.threads = 2;
  o.zstd_level = -10;
  o.adaptive = adaptive;
  if (counted) o.blocked_count = [&sink] { return sink.count(); };
  else o.blocked_count = [] { return std::optional<uint64_t>(); };  // a system that does not say
  if (sink.reports_storage)
    o.storage_waits = [&sink] {
      return sink.bytes >= sink.storage_unknown_from ? std::nullopt : std::optional<uint64_t>(sink.storage);
    };
  std::vector<SavedChunk> out;
  if (!st.ok()) return out;
  auto m = write_snapshot_file(*st, f, o, sink);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return out;
  EXPECT_EQ(m->info["chunking"].value("compression", ""), adaptive ? "adaptive" : "");
  uint64_t at = 0, stored_at = snapshot_detail::kPreambleBytes;
  for (const ChunkRef& ref : m->chunks) {
    if (ref.raw_size >= (64 << 10)) out.push_back({at, stored_at, ref.codec == ChunkCodec::kZstd});
    at += ref.raw_size;
    stored_at += ref.stored_size;
  }
  return out;
}

// How far ahead of the sink the workers decide: 2 jobs a worker, a job as many chunks as the
// SHA-256 kernel hashes at once (format/snapshot_write.cc encode_all); in stored bytes at most so.
constexpr uint64_t kChunkBytes = 256 << 10;
uint64_t workers_lead() { return 2 * 2 * std::max<uint64_t>(2, sha256_kernel_width(sha256_kernel())) * kChunkBytes; }

TEST(SnapshotAdaptive, ACpuBoundSaveStoresRawAfterTheFirstBytes) {
  const auto state = big_f16_state();
  PhasedSink cpu_bound(0, 0);  // waits for the encoders before every job
  const auto chunks = adaptive_save(state, true, cpu_bound);
  const uint64_t raw_from = snapshot_detail::kAdaptiveFirstBytes + workers_lead() + kMiB;
  ASSERT_LT(raw_from + 8 * kMiB, state.size());
  size_t raw = 0;
  for (const SavedChunk& c : chunks) {
    if (c.stored_at + kChunkBytes <= snapshot_detail::kAdaptiveFirstBytes) {
      EXPECT_TRUE(c.zstd) << "the first bytes are compressed: " << c.raw_at;
    }
    if (c.stored_at >= raw_from) {
      EXPECT_FALSE(c.zstd) << "the sink waited for the encoders: the CPU is the limit: " << c.raw_at;
    }
    raw += !c.zstd;
  }
  EXPECT_GT(raw, 10u);
  PhasedSink fixed_sink(0, 0);
  for (const SavedChunk& c : adaptive_save(state, false, fixed_sink))
    EXPECT_TRUE(c.zstd) << "a fixed level compresses every f16 chunk: " << c.raw_at;
}

TEST(SnapshotAdaptive, ADiskBoundSaveStaysCompressed) {
  const auto state = big_f16_state();
  for (const bool told : {false, true}) {
    PhasedSink disk_bound(0, UINT64_MAX);  // blocks in every append, never waits for the encoders
    disk_bound.reports_storage = told;
    for (const SavedChunk& c : adaptive_save(state, true, disk_bound))
      EXPECT_TRUE(c.zstd) << "the disk is the limit: the CPU has time to compress: " << c.raw_at << (told ? " (told)" : "");
  }
}

// A CPU-bound save whose thread also blocks in its appends for other reasons than the disk
// (page-cache reclaim, a catalog's round trips: a VM whose disk never held a save back saw a few
// such blocks per save): where the storage says it never waited, the chunks after the first bytes
// are raw. The thread's count alone takes those blocks for the disk's and compresses them.
TEST(SnapshotAdaptive, BlocksThatAreNotTheDisksLeaveACpuBoundSaveRaw) {
  const auto state = big_f16_state();
  const uint64_t raw_from = snapshot_detail::kAdaptiveFirstBytes + workers_lead() + kMiB;
  PhasedSink told(0, 0);  // waits for the encoders before every job; the disk never waits
  told.reports_storage = told.blocks_for_others = true;
  size_t raw = 0;
  for (const SavedChunk& c : adaptive_save(state, true, told)) {
    if (c.stored_at < raw_from) continue;
    EXPECT_FALSE(c.zstd) << "the storage never waited: the CPU is the limit: " << c.raw_at;
    ++raw;
  }
  EXPECT_GT(raw, 10u);
  PhasedSink untold(0, 0);
  untold.blocks_for_others = true;
  size_t zstd = 0;
  for (const SavedChunk& c : adaptive_save(state, true, untold)) zstd += c.stored_at >= raw_from && c.zstd;
  EXPECT_GT(zstd, 10u) << "without the storage's word the thread's blocks look like the disk's";
}

// CPU-bound after the first bytes, then disk-bound for 16 MiB of output, then CPU-bound again:
// raw, compressed, raw, each from the workers' next jobs on.
// How the storage's count is told: not at all (the thread's count alone), all along, or until the
// disk-bound phase begins (then it cannot tell, and the thread's count stands in).
enum class Told { kNot, kAlways, kUntilTheDisk };
void the_level_follows_the_side_that_is_the_limit(Told told);

TEST(SnapshotAdaptive, TheLevelFollowsTheSideThatIsTheLimit) {
  for (const Told told : {Told::kNot, Told::kAlways, Told::kUntilTheDisk}) {
    SCOPED_TRACE(told == Told::kNot ? "the thread's count alone"
                 : told == Told::kAlways ? "the storage says when it waited"
                                         : "the storage cannot tell from the disk-bound phase on");
    the_level_follows_the_side_that_is_the_limit(told);
  }
}

void the_level_follows_the_side_that_is_the_limit(Told told) {
  const auto state = big_f16_state();
  const uint64_t lead = workers_lead();
  const uint64_t disk_from = snapshot_detail::kAdaptiveFirstBytes + lead + 8 * kMiB, disk_to = disk_from + 16 * kMiB;
  PhasedSink sink(disk_from, disk_to);
  sink.reports_storage = told != Told::kNot;
  if (told == Told::kUntilTheDisk) sink.storage_unknown_from = disk_from;
  const auto chunks = adaptive_save(state, true, sink);
  ASSERT_GT(sink.bytes, disk_to + kWriteBehindBytes + 2 * lead + 8 * kMiB) << "too small a state for the three phases";
  size_t raw_before = 0, zstd_during = 0, raw_after = 0;
  for (const SavedChunk& c : chunks) {
    if (c.stored_at >= snapshot_detail::kAdaptiveFirstBytes + lead + kMiB && c.stored_at + kChunkBytes < disk_from) {
      EXPECT_FALSE(c.zstd) << "CPU-bound: raw " << c.raw_at;
      ++raw_before;
    }
    if (c.stored_at >= disk_from + lead + kMiB && c.stored_at + kChunkBytes < disk_to) {
      EXPECT_TRUE(c.zstd) << "disk-bound: compressed " << c.raw_at;
      ++zstd_during;
    }
    // The hold after the last block: a write-behind window and a ring of jobs (and two jobs: the
    // block's own and the check's, which runs between jobs).
    if (c.stored_at >= disk_to + kWriteBehindBytes + 2 * lead + lead / 2 + kMiB) {
      EXPECT_FALSE(c.zstd) << "CPU-bound again: raw " << c.raw_at;
      ++raw_after;
    }
  }
  EXPECT_GT(raw_before, 0u);
  EXPECT_GT(zstd_during, 0u);
  EXPECT_GT(raw_after, 0u);
}

// The same with a sink that blocks as a real pack does: once a write-behind window while the disk
// is the limit, and between every two jobs. The disk-bound phase stays compressed (a rule without
// memory, or one that took every wait between jobs for the CPU's, stored most of it raw).
void a_pack_that_blocks_once_a_window_stays_compressed(bool told);

TEST(SnapshotAdaptive, APackThatBlocksOnceAWindowStaysCompressed) {
  for (const bool told : {false, true}) {
    SCOPED_TRACE(told ? "the storage says when it waited" : "the thread's count alone");
    a_pack_that_blocks_once_a_window_stays_compressed(told);
  }
}

void a_pack_that_blocks_once_a_window_stays_compressed(bool told) {
  const auto state = big_f16_state();
  const uint64_t lead = workers_lead();
  const uint64_t disk_from = snapshot_detail::kAdaptiveFirstBytes + lead + 8 * kMiB, disk_to = disk_from + 24 * kMiB;
  PhasedSink sink(disk_from, disk_to, /*per_window=*/true);
  sink.reports_storage = told;
  const auto chunks = adaptive_save(state, true, sink);
  ASSERT_GT(sink.bytes, disk_to + 2 * lead + kWriteBehindBytes + 8 * kMiB) << "too small a state for the phases";
  size_t zstd_during = 0, raw_after = 0;
  for (const SavedChunk& c : chunks) {
    // From the first block (the first window boundary in the phase) to the phase's end.
    if (c.stored_at >= disk_from + kWriteBehindBytes + lead + kMiB && c.stored_at + kChunkBytes < disk_to) {
      EXPECT_TRUE(c.zstd) << "disk-bound, blocked once a window: compressed " << c.raw_at;
      ++zstd_during;
    }
    // A window and a ring after the last block, the waits between jobs say the CPU.
    if (c.stored_at >= disk_to + kWriteBehindBytes + 2 * lead + kMiB) raw_after += !c.zstd;
  }
  EXPECT_GT(zstd_during, 20u);
  EXPECT_GT(raw_after, 0u);
}

TEST(SnapshotAdaptive, WithoutACountEveryChunkIsCompressed) {
  const auto state = big_f16_state();
  PhasedSink sink(0, 0);
  for (const SavedChunk& c : adaptive_save(state, true, sink, /*counted=*/false))
    EXPECT_TRUE(c.zstd) << "a system that does not say: every chunk compressed: " << c.raw_at;
}

TEST(SnapshotAdaptive, MixedChunksGiveTheOriginalBack) {
  const auto state = big_f16_state();
  const uint64_t disk_from = snapshot_detail::kAdaptiveFirstBytes + workers_lead() + 8 * kMiB;
  PhasedSink sink(disk_from, disk_from + 16 * kMiB);
  sink.keep = true;
  const auto chunks = adaptive_save(state, true, sink);
  size_t zstd = 0, raw = 0;
  for (const SavedChunk& c : chunks) ++(c.zstd ? zstd : raw);
  EXPECT_GT(zstd, 10u);
  EXPECT_GT(raw, 10u);
  MemoryFile snap("big.kvsnap", std::span<const std::byte>(sink.kept));
  auto r = open_snapshot_file(snap);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->verify_chunks().ok());
  EXPECT_TRUE(read_all_of((*r)->original()) == state);
}

// A sink that takes the encoders' buffers (ChunkSink::put_buffer) and leaves buffers of its own
// in their place, small, large or empty and full of other bytes: every blob it holds is the one
// a copying sink gets, and the encoders write the next blobs into what it left them.
class TakingSink final : public ChunkSink {
 public:
  Status put(const ChunkRef& ref, std::span<const std::byte> blob) override {
    blobs[ref.index].assign(blob.begin(), blob.end());
    return Status::OK();
  }
  Status put_buffer(const ChunkRef& ref, std::vector<std::byte>& buffer, size_t size) override {
    ++taken;
    std::vector<std::byte> mine(size_t(rng() % 3) * 200000, std::byte{0xA5});
    mine.swap(buffer);
    mine.resize(size);
    blobs[ref.index] = std::move(mine);
    return Status::OK();
  }
  std::map<uint64_t, std::vector<std::byte>> blobs;
  size_t taken = 0;
  std::mt19937 rng{5};
};

TEST(Snapshot, ASinkThatTakesTheBuffersGetsTheSameBlobs) {
  const auto bytes = slurp(kRoot / "fixtures/v0.5.0/hd64-f16-f16-faoff.slot");
  MemoryFile f("state", std::span<const std::byte>(bytes));
  auto st = parse_state(f);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  for (uint32_t threads : {1u, 3u}) {
    SCOPED_TRACE(threads);
    SnapshotOptions o = opts_with(5);
    o.threads = threads;
    class Copying final : public ChunkSink {
     public:
      Status put(const ChunkRef& ref, std::span<const std::byte> blob) override {
        blobs[ref.index].assign(blob.begin(), blob.end());
        return Status::OK();
      }
      std::map<uint64_t, std::vector<std::byte>> blobs;
    } copying;
    TakingSink taking;
    auto a = build_snapshot(*st, f, o, copying);
    auto b = build_snapshot(*st, f, o, taking);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->bytes, b->bytes);
    EXPECT_GT(taking.taken, 10u);
    ASSERT_EQ(copying.blobs.size(), a->chunks.size());
    EXPECT_TRUE(copying.blobs == taking.blobs);
  }
}

TEST(Snapshot, InfoDescribesTheStateAndTheModel) {
  const auto p = kRoot / "fixtures/v0.5.0/hd64-q4_0-q8_0-faon.slot";
  const auto bytes = slurp(p);
  auto prof = load_model_profile(posix_io(), (kRoot / "fixtures/models/tiny-hd64.gguf").string());
  ASSERT_TRUE(prof.ok()) << prof.status().ToString();
  auto mi = snapshot_model_info(*prof);
  ASSERT_TRUE(mi.ok()) << mi.status().ToString();
  SnapshotOptions o = opts_with(32, "/some/dir/" + p.filename().string());
  o.model = *mi;
  o.lossy = LossyConversion{"f16", "f16", "q4_0", "q8_0", "stored smaller"};
  const auto file = make_file(bytes, {}, o);
  MemoryFile snap("snap", std::span<const std::byte>(file));
  auto r = open_snapshot_file(snap);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& info = (*r)->info();
  EXPECT_EQ(info["created"], kCreated);
  EXPECT_EQ(info["provenance"]["source"], p.filename().string());
  EXPECT_EQ(info["provenance"]["kind"], "seq");
  EXPECT_EQ(info["provenance"]["magic"], "67677371");
  EXPECT_EQ(info["provenance"]["version"], 3);
  EXPECT_EQ(info["model"]["gguf_fingerprint"], prof->fingerprint);
  EXPECT_EQ(info["model"]["n_layer"], prof->n_layer);
  const auto& layer0 = info["memory"]["kv_sections"][0]["streams"][0]["layers"][0];
  EXPECT_EQ(layer0["k_type"], "q4_0");
  EXPECT_EQ(layer0["v_type"], "q8_0");
  EXPECT_EQ(layer0["head_dim_k"], 64);
  EXPECT_EQ(layer0["k_rotation"]["rotated"], "yes");
  EXPECT_EQ(layer0["k_rotation"]["block"], 64);
  EXPECT_EQ(info["memory"]["kv_sections"][0]["streams"][0]["v_layout"], "rows");
  EXPECT_EQ(info["lossy"]["to_k"], "q4_0");
  EXPECT_EQ(info["chunking"]["cells_per_chunk"], 32);
  EXPECT_TRUE((*r)->manifest().lossy);
  ASSERT_TRUE((*r)->manifest().model.has_value());
  EXPECT_EQ((*r)->manifest().model->gguf_fingerprint, prof->fingerprint);
  EXPECT_EQ((*r)->manifest().model->kv_sections.at(0).k_rotation_block, std::optional<uint32_t>(64));

  // Without a model: rotation unknown for a v0.5.0 quantized cache, no model.
  const auto plain = make_file(bytes, {}, opts_with(32));
  MemoryFile snap2("snap2", std::span<const std::byte>(plain));
  auto r2 = open_snapshot_file(snap2);
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE((*r2)->info()["model"].is_null());
  EXPECT_EQ((*r2)->info()["memory"]["kv_sections"][0]["streams"][0]["layers"][0]["k_rotation"]["rotated"], "unknown");
  EXPECT_TRUE((*r2)->info()["lossy"].is_null());
}

TEST(Snapshot, PrefixChunksAreAllAPrefixReadNeeds) {
  const auto p = kRoot / "fixtures/v0.5.0/hd64-f16-f16-faoff.slot";  // transposed V
  const auto bytes = slurp(p);
  MemoryFile f("in", std::span<const std::byte>(bytes));
  auto st = parse_state(f);
  ASSERT_TRUE(st.ok());
  MapStore store;
  auto m = build_snapshot(*st, f, opts_with(7), store);
  ASSERT_TRUE(m.ok());
  auto r = open_snapshot(m->bytes, store);
  ASSERT_TRUE(r.ok());
  const uint64_t n = 10;  // cells 0..9: chunks j = 0, 1 of every segment
  const auto want = (*r)->chunks_for_cell_prefix(n);
  std::set<uint64_t> allowed(want.begin(), want.end());
  store.fetched.clear();
  // Read the first n cells of every tensor through original().
  const auto& stream = st->memory.kv[0].streams[0];
  for (const auto& L : stream.layers) {
    std::vector<std::byte> b(n * L.k_row_bytes);
    ASSERT_TRUE((*r)->original().read_at(L.k.offset, b).ok());
    EXPECT_TRUE(std::equal(b.begin(), b.end(), bytes.begin() + L.k.offset));
    for (uint32_t row = 0; row < L.n_embd_v_gqa; ++row) {
      std::vector<std::byte> v(n * L.v_elem_bytes);
      const uint64_t at = L.v.offset + uint64_t(row) * stream.cell_count * L.v_elem_bytes;
      ASSERT_TRUE((*r)->original().read_at(at, v).ok());
      EXPECT_TRUE(std::equal(v.begin(), v.end(), bytes.begin() + at));
    }
  }
  for (uint64_t i : store.fetched) EXPECT_TRUE(allowed.count(i)) << (*r)->describe_chunk(i) << " was not in the prefix list";
  // Frame chunks, and two cell chunks of each of the 8 tensor segments.
  EXPECT_EQ(want.size(), m->segments.n_frame_chunks + 8 * 2);
  EXPECT_LT(want.size(), m->chunks.size());
  EXPECT_EQ((*r)->chunks_for_cell_prefix(1u << 30).size(), m->chunks.size());
}

// Parsing a snapshot's original reads its headers, not its tensors: a layer header is read alone
// (Cursor::header_before_bulk), not with a window reaching into the tensor's first chunk, which a
// restore would decode on one thread before its conversion starts. Only the first tensor's chunks
// may be read: the window over the last cells reaches past the stream's header into it.
TEST(Snapshot, ParsingTheOriginalDecodesNoTensorChunk) {
  for (const char* name : {"hd64-f16-f16-faoff.slot", "hd64-f16-f16-faon.slot"}) {
    const auto bytes = slurp(kRoot / "fixtures/v0.5.0" / name);
    MemoryFile f("in", std::span<const std::byte>(bytes));
    auto st = parse_state(f);
    ASSERT_TRUE(st.ok()) << name;
    MapStore store;
    auto m = build_snapshot(*st, f, opts_with(7), store);
    ASSERT_TRUE(m.ok()) << name;
    auto r = open_snapshot(m->bytes, store);
    ASSERT_TRUE(r.ok()) << name;
    std::vector<const Segment*> tensors;
    for (const Segment& s : m->segments.segments)
      if (s.kind != SegmentKind::kFrame) tensors.push_back(&s);
    std::sort(tensors.begin(), tensors.end(), [](auto* a, auto* b) { return a->file_offset < b->file_offset; });
    ASSERT_GE(tensors.size(), 2u) << name;
    store.fetched.clear();
    auto parsed = (*r)->parse_original();
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().ToString();
    EXPECT_EQ(parsed->memory.kv[0].streams[0].layers.size(), st->memory.kv[0].streams[0].layers.size());
    for (uint64_t i : store.fetched) {
      const bool in_first_tensor = i < m->segments.n_frame_chunks || i < tensors[1]->first_chunk;
      EXPECT_TRUE(in_first_tensor) << name << ": the parse read " << (*r)->describe_chunk(i);
    }
  }
}

// --- Hostile input --------------------------------------------------------------------

// A small snapshot with several chunks per segment and transposed V.
std::vector<std::byte> small_snapshot(SnapshotManifest* m = nullptr) {
  SynthSpec s;
  s.v_trans = 1;
  s.layers = {{1, 64, 1, 64}, {8, 64, 1, 32}};
  return make_file(build_state(s), {}, opts_with(3), m);
}

TEST(SnapshotHostile, EveryTruncationIsAnError) {
  const auto file = small_snapshot();
  ASSERT_FALSE(file.empty());
  for (size_t n = 0; n < file.size(); ++n) {
    MemoryFile f("cut.kvsnap", std::span<const std::byte>(file.data(), n));
    auto r = open_snapshot_file(f);
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes opened";
    ASSERT_NE(r.status().message().find("cut.kvsnap"), std::string::npos) << r.status().ToString();
  }
}

// A chunk whose low-byte plane is stored as a raw zstd frame (unshuffled straight from the
// blob, not through zstd): a byte flipped there fails the read of that chunk, in both the
// whole-chunk path (verify, restore) and through the cache, never giving other bytes.
TEST(SnapshotHostile, AFlipInARawPlaneFailsTheRead) {
  SynthSpec s;
  s.cells = 64;
  s.layers = {{1, 4096, 1, 4096}};
  s.f16_like = true;
  const auto state = build_state(s);
  SnapshotManifest m;
  auto file = make_file(state, {}, opts_with(64), &m);
  ASSERT_FALSE(file.empty());
  const std::array<std::byte, 5> raw_frame = {std::byte{0x28}, std::byte{0xB5}, std::byte{0x2F}, std::byte{0xFD},
                                              std::byte{0xA0}};  // put_raw_frame's magic and descriptor
  uint64_t at = snapshot_detail::kPreambleBytes, flipped = 0;
  for (const ChunkRef& c : m.chunks) {
    const std::byte* p = file.data() + at + kBlobHeaderBytes;
    if (c.stored_size > kBlobHeaderBytes + 2000 && file[at + 5] == std::byte{1} &&
        std::memcmp(p, raw_frame.data(), raw_frame.size()) == 0) {
      file[at + kBlobHeaderBytes + 9 + 3 + 1000] ^= std::byte{0x10};  // in the first raw block
      ++flipped;
      break;
    }
    at += c.stored_size;
  }
  ASSERT_EQ(flipped, 1u) << "no chunk with a raw plane";
  MemoryFile f("raw.kvsnap", std::span<const std::byte>(file));
  auto r = open_snapshot_file(f);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Status v = (*r)->verify_chunks();
  EXPECT_EQ(v.code(), Code::kCorruption);
  EXPECT_NE(v.message().find("SHA-256"), std::string::npos) << v.ToString();
  std::vector<std::byte> b(state.size());
  EXPECT_FALSE((*r)->original().read_at(0, b).ok());
  std::vector<std::byte> small(100);  // through the cache: part of every chunk
  bool failed = false;
  for (uint64_t o = 0; o + small.size() <= state.size(); o += 4096) failed |= !(*r)->original().read_at(o, small).ok();
  EXPECT_TRUE(failed);
}

// Whole chunks that follow each other in a read are decoded a group at a time (two with
// shani-x2), their SHA-256s computed together (base/sha256_lanes.h): a damaged blob fails the
// read wherever it sits, first or later in a group or alone at the end, and the error names that chunk; the same for
// verify_chunks, which checks chunks in the same groups. Run by ctest
// under every SHA-256 kernel too (format.sha256_kernel.*).
TEST(SnapshotHostile, ADamagedChunkFailsTheReadFirstOrSecondOfAPair) {
  SynthSpec s;
  s.cells = 64;
  s.layers = {{1, 4096, 1, 4096}, {1, 4096, 1, 4096}};
  s.f16_like = true;
  const auto state = build_state(s);
  SnapshotManifest m;
  const auto file = make_file(state, {}, opts_with(16), &m);
  ASSERT_FALSE(file.empty());
  {
    MemoryFile f("pairs.kvsnap", std::span<const std::byte>(file));
    auto r = open_snapshot_file(f);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::byte> b(state.size());
    ASSERT_TRUE((*r)->original().read_at(0, b).ok());
    ASSERT_TRUE(b == state);
  }
  const std::array<std::byte, 5> raw_frame = {std::byte{0x28}, std::byte{0xB5}, std::byte{0x2F}, std::byte{0xFD},
                                              std::byte{0xA0}};  // put_raw_frame's magic and descriptor
  uint64_t at = snapshot_detail::kPreambleBytes;
  size_t damaged = 0;
  for (size_t k = 0; k < m.chunks.size(); at += m.chunks[k].stored_size, ++k) {
    const ChunkRef& c = m.chunks[k];
    if (!(c.stored_size > kBlobHeaderBytes + 2000 && file[at + 5] == std::byte{1} &&
          std::memcmp(file.data() + at + kBlobHeaderBytes, raw_frame.data(), raw_frame.size()) == 0)) {
      continue;
    }
    auto x = file;
    x[at + kBlobHeaderBytes + 9 + 3 + 1000] ^= std::byte{0x10};  // in the first raw block: zstd cannot tell
    MemoryFile f("pairs.kvsnap", std::span<const std::byte>(x));
    auto r = open_snapshot_file(f);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<std::byte> b(state.size());
    const Status rd = (*r)->original().read_at(0, b);
    EXPECT_EQ(rd.code(), Code::kCorruption) << "chunk " << k;
    EXPECT_NE(rd.message().find("chunk " + std::to_string(k) + " "), std::string::npos) << rd.ToString();
    EXPECT_NE(rd.message().find("SHA-256"), std::string::npos) << rd.ToString();
    const Status v = (*r)->verify_chunks();  // the same groups, from chunk 0
    EXPECT_EQ(v.code(), Code::kCorruption) << "chunk " << k;
    EXPECT_NE(v.message().find("chunk " + std::to_string(k) + " "), std::string::npos) << v.ToString();
    ++damaged;
  }
  EXPECT_GE(damaged, 4u) << "too few chunks with a raw plane to damage both places of a pair";
}

TEST(SnapshotHostile, EveryByteFlipIsCaughtOrHarmless) {
  SynthSpec s;
  s.v_trans = 1;
  s.layers = {{1, 64, 1, 64}, {8, 64, 1, 32}};
  const auto state = build_state(s);
  const auto file = make_file(state, {}, opts_with(3));
  size_t refused = 0, caught_on_read = 0, harmless = 0;
  // One copy, each flip undone when its iteration ends (after the reader over it is gone): a copy
  // of the file per byte was quadratic, most of this test's time in the sanitized -O0 build.
  auto x = file;
  struct FlipFor {  // x[i] flipped while this lives
    std::vector<std::byte>& b;
    size_t i;
    FlipFor(std::vector<std::byte>& b, size_t i) : b(b), i(i) { b[i] ^= std::byte{0x21}; }
    ~FlipFor() { b[i] ^= std::byte{0x21}; }
  };
  for (size_t i = 0; i < file.size(); ++i) {
    const FlipFor flip(x, i);
    MemoryFile f("flip.kvsnap", std::span<const std::byte>(x));
    auto r = open_snapshot_file(f);
    if (!r.ok()) {
      ++refused;
      EXPECT_FALSE(r.status().message().empty());
      continue;
    }
    // Opened: the flip is inside a chunk blob. Reading gives the exact
    // original or an error naming the chunk, never other bytes.
    Status v = (*r)->verify_chunks();
    std::vector<std::byte> b(state.size());
    Status rd = (*r)->original().read_at(0, b);
    if (v.ok()) {
      ASSERT_TRUE(rd.ok()) << rd.ToString();
      ASSERT_TRUE(b == state) << "flip at " << i << " gave other bytes";
      ++harmless;
    } else {
      EXPECT_NE(v.message().find("chunk "), std::string::npos) << v.ToString();
      EXPECT_FALSE(rd.ok()) << "flip at " << i;
      ++caught_on_read;
    }
  }
  std::printf("%zu flips: %zu refused at open, %zu caught by chunk hashes, %zu harmless (zstd header bits)\n",
              file.size(), refused, caught_on_read, harmless);
  EXPECT_GT(caught_on_read, 0u);
  EXPECT_LT(harmless, file.size() / 50);
  EXPECT_TRUE(x == file) << "a flip was not undone";
}

struct StoreSnapshot {
  std::vector<std::byte> state;
  MapStore store;
  SnapshotManifest m;
};

std::unique_ptr<StoreSnapshot> store_snapshot() {
  auto s = std::make_unique<StoreSnapshot>();
  SynthSpec spec;
  spec.v_trans = 1;
  s->state = build_state(spec);
  MemoryFile f("state", std::span<const std::byte>(s->state));
  auto st = parse_state(f);
  EXPECT_TRUE(st.ok());
  auto m = build_snapshot(*st, f, opts_with(3), s->store);
  EXPECT_TRUE(m.ok());
  s->m = *m;
  return s;
}

// INFO.labels (a store's name and tags, sealed with an encrypted snapshot's manifest) read back as
// written; absent when not given; of another shape, corrupt.
TEST(Snapshot, LabelsAreReadBackAndAMalformedOneIsRefused) {
  const auto bytes = slurp(kRoot / "fixtures/v0.5.0/hd64-q4_0-q8_0-faon.slot");
  SnapshotOptions o = opts_with(32);
  o.labels = SnapshotLabels{std::string("chat"), {{"user", "ana"}, {"k", ""}}};
  const auto file = make_file(bytes, {}, o);
  MemoryFile snap("snap", std::span<const std::byte>(file));
  auto r = open_snapshot_file(snap);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE((*r)->manifest().labels.has_value());
  EXPECT_EQ(*(*r)->manifest().labels, *o.labels);
  EXPECT_EQ((*r)->info()["labels"]["name"], "chat");
  o.labels = SnapshotLabels{std::nullopt, {}};
  const auto unnamed = make_file(bytes, {}, o);
  MemoryFile snap2("snap2", std::span<const std::byte>(unnamed));
  auto r2 = open_snapshot_file(snap2);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(*(*r2)->manifest().labels, SnapshotLabels{});
  auto s = store_snapshot();
  EXPECT_FALSE(s->m.labels.has_value());
  for (const char* bad : {R"({"name": 5, "tags": {}})", R"({"name": "x"})", R"({"name": "x", "tags": {"k": 1}})",
                          R"({"name": "x", "tags": []})", R"("chat")"}) {
    SnapshotManifest m = s->m;
    m.info["labels"] = nlohmann::ordered_json::parse(bad);
    ASSERT_TRUE(snapshot_detail::encode_manifest(m).ok());
    auto refused = open_snapshot(m.bytes, s->store);
    EXPECT_EQ(refused.status().code(), Code::kCorruption) << bad << ": " << refused.status().ToString();
  }
}

// INFO is parsed into a tree many times its size (a hostile 1 GiB manifest cost some 17 GiB): the
// writer writes and the reader parses at most kMaxInfoBytes of it, the limit itself included.
TEST(SnapshotHostile, InfoBeyondItsLimitIsRefusedByTheWriterAndTheReader) {
  using snapshot_detail::kMaxInfoBytes;
  auto s = store_snapshot();
  SnapshotManifest at_limit = s->m;
  at_limit.info["padding"] = "";
  at_limit.info["padding"] = std::string(kMaxInfoBytes - json_text(at_limit.info).size(), 'x');
  ASSERT_EQ(json_text(at_limit.info).size(), kMaxInfoBytes);
  ASSERT_TRUE(snapshot_detail::encode_manifest(at_limit).ok());
  auto r = open_snapshot(at_limit.bytes, s->store);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->manifest().info.at("padding").get_ref<const std::string&>().size(),
            at_limit.info["padding"].get_ref<const std::string&>().size());

  SnapshotManifest over = at_limit;
  over.info["padding"] = at_limit.info["padding"].get<std::string>() + "x";
  const Status w = snapshot_detail::encode_manifest(over);
  EXPECT_EQ(w.code(), Code::kNotSupported) << w.ToString();
  EXPECT_NE(w.message().find("INFO would be " + std::to_string(kMaxInfoBytes + 1) + " bytes"), std::string::npos)
      << w.ToString();

  Surgery x{s->m.bytes};  // a writer without the check
  x.replace_payload(snapshot_detail::kTagInfo, json_text(over.info));
  auto refused = open_snapshot(x.b, s->store);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kCorruption);
  EXPECT_NE(refused.status().message().find("the INFO section is " + std::to_string(kMaxInfoBytes + 1) + " bytes"),
            std::string::npos)
      << refused.status().ToString();
}

// INFO's chunking.cells_per_chunk is what a re-save of the original takes (an import under other
// keys, export --decrypt): out of a save's range it is refused when read, not halfway through an
// import (a review's finding: exit 2 naming --cells-per-chunk, the snapshots before it stored).
TEST(SnapshotHostile, CellsPerChunkOutOfASavesRangeIsRefused) {
  auto s = store_snapshot();
  for (const uint64_t bad : {uint64_t{0}, uint64_t{1} << 24 | 1}) {
    SnapshotManifest m = s->m;
    m.info["chunking"]["cells_per_chunk"] = bad;
    Surgery x{s->m.bytes};
    x.replace_payload(snapshot_detail::kTagInfo, json_text(m.info));
    auto refused = open_snapshot(x.b, s->store);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), Code::kCorruption) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("cells_per_chunk " + std::to_string(bad) + " is out of range"),
              std::string::npos) << refused.status().ToString();
  }
}

// A CELL table is held to llama.cpp's bound of a stream's cells (2^24) and twice that in all,
// before anything is sized by it (a review's finding: a 1 GiB table of zeros held 9 GB).
TEST(SnapshotHostile, CellCountsPastTheLimitAreRefusedBeforeAnythingIsSized) {
  auto s = store_snapshot();
  // One stream of 2^24 + 1 cells (8 zero bytes each: 128 MiB), whose bytes are all there. (The
  // table's total is held the same way; a test of it would need 256 MiB.)
  {
    const uint32_t n = (1u << 24) + 1;
    std::string table;
    auto u32 = [&table](uint32_t v) { table.append(reinterpret_cast<const char*>(&v), 4); };
    u32(1);  // one section
    u32(0);  // no cell ext
    u32(1);  // one stream
    u32(n);
    table.resize(table.size() + size_t(n) * 8);
    Surgery x{s->m.bytes};
    x.replace_payload(snapshot_detail::kTagCell, table);
    auto refused = open_snapshot(x.b, s->store);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), Code::kNotSupported) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("over kvsnap's limit of 16777216 a stream and 33554432 a snapshot"),
              std::string::npos) << refused.status().ToString();
  }
}

TEST(SnapshotHostile, UnknownOptionalSectionIsSkipped) {
  auto s = store_snapshot();
  Surgery x{s->m.bytes};
  x.insert_section(snapshot_detail::fourcc("XTRA"), 0, "future data");
  auto r = open_snapshot(x.b, s->store);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->manifest().skipped_sections.size(), 1u);
  EXPECT_TRUE(read_all_of((*r)->original()) == s->state);
}

// --- Speed paths: block bounds, the equality digest ------------------------------------

// Restore copies original() in blocks on several threads: no cut inside a row-major chunk or a
// transposed band (each chunk decoded once, by one thread), and the blocks add up to the file.
TEST(Snapshot, BlockBoundsCutBetweenChunksAndBands) {
  for (uint32_t v_trans : {0u, 1u}) {
    SynthSpec spec;
    spec.v_trans = v_trans;
    spec.cells = 40;
    spec.layers = {{1, 64, 1, 64}, {8, 64, 1, 32}, {0, 32, 0, 32}};
    const auto state = build_state(spec);
    MemoryFile f("state", std::span<const std::byte>(state));
    auto st = parse_state(f);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    MapStore store;
    auto m = build_snapshot(*st, f, opts_with(3), store);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    for (uint64_t target : {uint64_t(1), uint64_t(100), uint64_t(4096), uint64_t(1) << 20}) {
      auto r = open_snapshot(m->bytes, store);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      const std::vector<uint64_t> cuts = (*r)->block_bounds(target);
      ASSERT_GE(cuts.size(), 2u);
      // What a conversion's blocks take (read_cells): the chunks' 3 cells times the chunks one
      // read checks together, the SHA-256 kernel's lanes (ctest runs this under each kernel).
      EXPECT_EQ((*r)->read_cells(), 3 * sha256_kernel_width(sha256_kernel())) << sha256_kernel_name(sha256_kernel());
      EXPECT_EQ(cuts.front(), 0u);
      EXPECT_EQ(cuts.back(), state.size());
      std::vector<std::byte> got;
      for (size_t i = 0; i + 1 < cuts.size(); ++i) {
        ASSERT_LT(cuts[i], cuts[i + 1]);
        std::vector<std::byte> b(cuts[i + 1] - cuts[i]);
        ASSERT_TRUE((*r)->original().read_at(cuts[i], b).ok());
        got.insert(got.end(), b.begin(), b.end());
      }
      EXPECT_TRUE(got == state) << "v_trans " << v_trans << ", target " << target;
      for (const Segment& seg : m->segments.segments) {
        uint64_t piece = 0;
        if (seg.kind == SegmentKind::kRows) piece = uint64_t(seg.cells_per_chunk) * seg.row_bytes;
        if (seg.kind == SegmentKind::kTransposed) piece = uint64_t(seg.rows_per_chunk) * seg.cell_count * seg.elem_bytes;
        if (!piece) continue;
        for (uint64_t c : cuts) {
          if (c > seg.file_offset && c < seg.file_offset + seg.size) {
            EXPECT_EQ((c - seg.file_offset) % piece, 0u) << snapshot_detail::describe_segment(seg) << ": cut at " << c;
          }
        }
      }
      if (target == 1) {
        EXPECT_GT(cuts.size(), m->chunks.size() / 2) << "a small target cuts at every chunk";
      }
    }
  }
}

// Every plain chunk records its XXH3-128 (CHKX) beside its SHA-256, and the manifest keeps it.
TEST(Snapshot, ChunksRecordTheirXxhInTheManifest) {
  auto s = store_snapshot();
  ASSERT_FALSE(s->m.chunks.empty());
  for (const ChunkRef& c : s->m.chunks) ASSERT_TRUE(c.xxh.has_value()) << "chunk " << c.index;
  auto pm = parse_manifest(s->m.bytes);
  ASSERT_TRUE(pm.ok()) << pm.status().ToString();
  for (size_t i = 0; i < pm->chunks.size(); ++i) EXPECT_EQ(pm->chunks[i].xxh, s->m.chunks[i].xxh);
  EXPECT_TRUE(pm->skipped_sections.empty());
}

// A saved session extended: its parent's chunks are found by XXH3-128 (no SHA-256 over them) and
// the extension reads back byte for byte. A known ref is trusted by its digest: one with the same
// digest and another SHA-256 is taken as it is (which is why every decode checks both).
TEST(Snapshot, AnExtensionFindsItsParentsChunksByXxh) {
  const auto full = slurp(kRoot / "fixtures/v0.5.0/hd64-f16-f16-faoff.slot");
  MemoryFile ff("full.slot", std::span<const std::byte>(full));
  auto fst = parse_state(ff);
  ASSERT_TRUE(fst.ok()) << fst.status().ToString();
  VectorSink cut;
  ASSERT_TRUE(write_prefix(*fst, ff, 64, cut).ok());
  MemoryFile cf("cut.slot", std::span<const std::byte>(cut.bytes));
  auto cst = parse_state(cf);
  ASSERT_TRUE(cst.ok()) << cst.status().ToString();
  MapStore store;
  auto parent = build_snapshot(*cst, cf, opts_with(16), store);
  ASSERT_TRUE(parent.ok()) << parent.status().ToString();
  auto pm = parse_manifest(parent->bytes);
  ASSERT_TRUE(pm.ok());
  std::map<Sha256Digest, ChunkRef> known;
  for (const ChunkRef& c : pm->chunks) known.emplace(c.sha256, c);

  SnapshotOptions o = opts_with(16);
  o.known_chunks = &known;
  auto ext = build_snapshot(*fst, ff, o, store);
  ASSERT_TRUE(ext.ok()) << ext.status().ToString();
  size_t reused = 0;
  for (const ChunkRef& c : ext->chunks) {
    ASSERT_TRUE(c.xxh.has_value());
    reused += known.count(c.sha256);
  }
  EXPECT_GT(reused, ext->chunks.size() / 4) << "the parent's K/V chunks of the first 64 cells";
  EXPECT_LT(reused, ext->chunks.size());
  auto r = open_snapshot(ext->bytes, store);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(read_all_of((*r)->original()) == full);
  EXPECT_TRUE((*r)->verify_chunks().ok());
  EXPECT_TRUE((*r)->verify_original().ok());

  // The digest decides: a known ref whose SHA-256 differs (but not its digest) is taken.
  std::map<Sha256Digest, ChunkRef> forged;
  Sha256Digest bent{};
  for (const auto& [sha, ref] : known) {
    ChunkRef c = ref;
    if (bent == Sha256Digest{} && ref.raw_size > 0 && ref.index >= pm->segments.n_frame_chunks) {
      c.sha256[0] ^= 1;
      bent = c.sha256;
    }
    forged.emplace(c.sha256, c);
  }
  o.known_chunks = &forged;
  auto taken = build_snapshot(*fst, ff, o, store);
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  EXPECT_TRUE(std::any_of(taken->chunks.begin(), taken->chunks.end(),
                          [&](const ChunkRef& c) { return c.sha256 == bent; }));
}

// A damaged CHKX digest fails the read of its chunk (as a damaged blob does), naming the digest.
TEST(SnapshotHostile, AWrongXxhFailsTheChunksRead) {
  auto s = store_snapshot();
  Surgery x{s->m.bytes};
  const size_t at = x.payload_of(snapshot_detail::kTagChkx);
  ASSERT_NE(at, 0u);
  x.b[at + 4 + 16 * (s->m.chunks.size() - 1)] ^= std::byte{1};  // the last chunk's digest
  x.reseal();
  auto r = open_snapshot(x.b, s->store);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::byte> b(s->state.size());
  Status rd = (*r)->original().read_at(0, b);
  ASSERT_FALSE(rd.ok());
  EXPECT_EQ(rd.code(), Code::kCorruption);
  EXPECT_NE(rd.message().find("XXH3-128"), std::string::npos) << rd.ToString();
  EXPECT_FALSE((*r)->verify_chunks().ok());
}

// A CHNK record is canonical (as encode_chunks writes it from the blob header): a reserved field,
// codec or filter no writer makes, or an element size that does not go with its filter, is damage
// (a review's finding: they were accepted, so one original had several manifests).
TEST(SnapshotHostile, ChunkRecordsNoWriterMakesAreRefused) {
  auto s = store_snapshot();
  ASSERT_EQ(s->m.chunks[0].filter, ChunkFilter::kNone);
  const struct {
    size_t offset;  // in the 56-byte record
    int width;
    uint32_t value;
    const char* what;
  } cases[] = {{52, 4, 1, "reserved 1"},     {48, 1, 2, "codec 2"},          {49, 1, 2, "filter 2"},
               {50, 2, 2, "element size 2"}, {49, 1, 1, "element size 0"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Surgery x{s->m.bytes};
    const size_t at = x.payload_of(snapshot_detail::kTagChnk);
    ASSERT_NE(at, 0u);
    std::memcpy(x.b.data() + at + 8 + c.offset, &c.value, size_t(c.width));
    x.reseal();
    auto refused = open_snapshot(x.b, s->store);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), Code::kCorruption) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find(c.what), std::string::npos) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("is not a record a writer makes"), std::string::npos);
  }
}

// CHKX of an algorithm this kvsnap does not know is skipped (the chunks have no digest); one of
// the wrong length is refused.
TEST(SnapshotHostile, ChkxOfAnotherAlgorithmIsSkippedAndOfAWrongLengthRefused) {
  auto s = store_snapshot();
  Surgery x{s->m.bytes};
  const size_t at = x.payload_of(snapshot_detail::kTagChkx);
  ASSERT_NE(at, 0u);
  x.set_u32(at, 99);
  x.reseal();
  auto r = open_snapshot(x.b, s->store);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->manifest().skipped_sections, std::vector<uint32_t>{snapshot_detail::kTagChkx});
  for (const ChunkRef& c : (*r)->chunks()) EXPECT_FALSE(c.xxh.has_value());
  EXPECT_TRUE(read_all_of((*r)->original()) == s->state);

  Surgery y{s->m.bytes};
  y.set_u64(y.payload_of(snapshot_detail::kTagChkx) - 8, 4 + 16 * (s->m.chunks.size() - 1));  // claims one less
  // the section now ends 16 bytes early: move DIGS back by cutting the last digest out
  const size_t cut_at = y.payload_of(snapshot_detail::kTagChkx) + 4 + 16 * (s->m.chunks.size() - 1);
  y.b.erase(y.b.begin() + std::ptrdiff_t(cut_at), y.b.begin() + std::ptrdiff_t(cut_at + 16));
  y.reseal();
  auto bad = open_snapshot(y.b, s->store);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption);
  EXPECT_NE(bad.status().message().find("CHKX"), std::string::npos) << bad.status().ToString();
}

TEST(SnapshotHostile, UnknownRequiredSectionIsRefusedByName) {
  auto s = store_snapshot();
  Surgery x{s->m.bytes};
  x.insert_section(snapshot_detail::fourcc("XTRA"), 1, "future data");
  auto r = open_snapshot(x.b, s->store);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported);
  EXPECT_NE(r.status().message().find("required section 'XTRA'"), std::string::npos) << r.status().ToString();
}

TEST(SnapshotHostile, TooNewVersionIsRefusedClearly) {
  auto s = store_snapshot();
  Surgery x{s->m.bytes};
  x.set_u32(4, 7);  // format version 7
  x.set_u32(8, 5);  // needs reader 5
  x.reseal();
  auto r = open_snapshot(x.b, s->store);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported);
  EXPECT_NE(r.status().message().find("format version 7"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("upgrade kvsnap"), std::string::npos);
  // A newer format this reader may read (min_reader_version 3) opens.
  Surgery y{s->m.bytes};
  y.set_u32(4, 4);
  y.reseal();
  {
    auto ry = open_snapshot(y.b, s->store);
    EXPECT_TRUE(ry.ok()) << ry.status().ToString();
  }
  // The file form says so from its preamble.
  auto file = small_snapshot();
  Surgery f{file};
  f.set_u32(8, 9);
  f.set_u32(12, 9);
  MemoryFile mf("new.kvsnap", std::span<const std::byte>(f.b));
  auto rf = open_snapshot_file(mf);
  ASSERT_FALSE(rf.ok());
  EXPECT_EQ(rf.status().code(), Code::kNotSupported);
  EXPECT_NE(rf.status().message().find("new.kvsnap: written in kvsnap snapshot format version 9"), std::string::npos)
      << rf.status().ToString();
}

TEST(SnapshotHostile, HugeDeclaredLengthsAreRefusedWithoutAllocating) {
  auto s = store_snapshot();
  using namespace snapshot_detail;
  auto expect_refused = [&](Surgery x, const char* what) {
    SCOPED_TRACE(what);
    auto r = open_snapshot(x.b, s->store);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  };
  {
    Surgery x{s->m.bytes};
    x.set_u64(kManifestHeaderBytes + 8, uint64_t(1) << 60);  // INFO length
    expect_refused(x, "section length");
  }
  {
    Surgery x{s->m.bytes};
    x.set_u32(12, 0x7fffffff);  // section count
    expect_refused(x, "section count");
  }
  {
    Surgery x{s->m.bytes};
    x.set_u32(x.payload_of(kTagCell), 0xffffffff);  // KV section count
    x.reseal();
    expect_refused(x, "cell sections");
  }
  {
    Surgery x{s->m.bytes};
    x.set_u32(x.payload_of(kTagCell) + 12, 0xfffffff0);  // cells of stream 0
    x.reseal();
    expect_refused(x, "cell count");
  }
  {
    Surgery x{s->m.bytes};
    x.set_u32(x.payload_of(kTagTokn) + 4, 0xffffffff);
    x.reseal();
    expect_refused(x, "token count");
  }
  {
    Surgery x{s->m.bytes};
    x.set_u64(x.payload_of(kTagChnk), uint64_t(1) << 58);
    x.reseal();
    expect_refused(x, "chunk count");
  }
  {
    Surgery x{s->m.bytes};
    x.set_u64(x.payload_of(kTagSegs) + 24, uint64_t(1) << 58);
    x.reseal();
    expect_refused(x, "segment count");
  }
  // A review's finding: the reserved fields of SEGS were never read, so manifests differing there
  // shared one content digest (the digest hashes the table as written, not as given).
  for (const size_t at : {size_t(4), size_t(32 + 2)}) {
    SCOPED_TRACE(at);
    Surgery x{s->m.bytes};
    x.set_u16(x.payload_of(kTagSegs) + at, 7);
    x.reseal();
    expect_refused(x, "reserved or unused field");
  }
  {
    // A chunk claiming a huge raw size contradicts the segment geometry.
    Surgery x{s->m.bytes};
    x.set_u64(x.payload_of(kTagChnk) + 8 + 32, uint64_t(1) << 40);
    x.reseal();
    expect_refused(x, "chunk raw size");
  }
  {
    Surgery x{s->m.bytes};
    x.b[x.b.size() / 2] ^= std::byte{1};  // not resealed
    auto r = open_snapshot(x.b, s->store);
    ASSERT_FALSE(r.ok());
  }
}

// Offset of the first tensor segment's record in the SEGS section.
size_t first_tensor_record(const Surgery& x) {
  using namespace snapshot_detail;
  const size_t recs = x.payload_of(kTagSegs) + 32;
  for (size_t at = recs;; at += kSegmentRecordBytes) {
    if (x.b[at] != std::byte{uint8_t(SegmentKind::kFrame)}) return at;
  }
}

// Fuzz finding: the reader sized per-layer tables by a segment's layer field
// (4-17 GB allocations; at 0xFFFFFFFF, layer + 1 wrapped to 0 and it wrote
// out of bounds).
TEST(SnapshotHostile, LayerIndexIsBoundedByTheSegmentTable) {
  auto s = store_snapshot();
  for (uint32_t layer : {1000u, 0x40000000u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(layer);
    Surgery x{s->m.bytes};
    x.set_u32(first_tensor_record(x) + 12, layer);
    x.reseal();
    auto r = open_snapshot(x.b, s->store);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find("layer " + std::to_string(layer) + " is out of range"), std::string::npos)
        << r.status().ToString();
  }
}

// A manifest whose whole original is frame bytes: one frame segment of
// `frame_bytes` in `n_frame_chunks` chunks, and no chunk table.
SnapshotManifest frame_only_manifest(uint64_t frame_bytes, uint64_t n_frame_chunks) {
  SnapshotManifest m;
  m.content_digest.fill(0x11);
  m.provenance.file_size = frame_bytes;
  m.info = {{"provenance",
             {{"source", "x.slot"}, {"kind", "seq"}, {"magic", "67677371"}, {"version", 3},
              {"file_size", frame_bytes}, {"content_digest", to_hex(m.content_digest)}}}};
  m.segments.frame_bytes = frame_bytes;
  m.segments.n_frame_chunks = n_frame_chunks;
  Segment fr;
  fr.size = frame_bytes;
  m.segments.segments.push_back(fr);
  EXPECT_TRUE(snapshot_detail::encode_manifest(m).ok());
  return m;
}

// Fuzz finding: (frame_bytes + chunk - 1) / chunk wrapped for frame_bytes near
// 2^64, so a manifest with no chunks passed and reading the original indexed
// past the chunk list.
TEST(SnapshotHostile, FrameChunkCountCannotWrap) {
  const uint64_t huge = ~uint64_t(0);
  for (uint64_t n_chunks : {uint64_t(0), huge / kFrameChunkBytes + 1}) {
    SCOPED_TRACE(n_chunks);
    SnapshotManifest m = frame_only_manifest(huge, n_chunks);
    auto r = parse_manifest(m.bytes, "wrap.manifest");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find("wrap.manifest: "), std::string::npos) << r.status().ToString();
  }
  // The same shape at a sane size is accepted until the (missing) chunks are counted.
  auto ok = parse_manifest(frame_only_manifest(100, 0).bytes);
  ASSERT_FALSE(ok.ok());
  EXPECT_NE(ok.status().message().find("frame chunk count 0 does not fit 100"), std::string::npos)
      << ok.status().ToString();
}

TEST(SnapshotHostile, DamagedChunkIsNamedByIndexAndCoverage) {
  auto s = store_snapshot();
  auto r = open_snapshot(s->m.bytes, s->store);
  ASSERT_TRUE(r.ok());
  // Swap the blob of a V chunk for another chunk's blob of the same size.
  const auto& chunks = s->m.chunks;
  const uint64_t victim = chunks.size() - 1;
  auto& blob = s->store.blobs[to_hex(chunks[victim].sha256)];
  blob.back() ^= std::byte{0x40};
  Status v = (*r)->verify_chunks();
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("chunk " + std::to_string(victim) + " (layer 1 V"), std::string::npos) << v.ToString();
  std::vector<std::byte> b(s->state.size());
  Status rd = (*r)->original().read_at(0, b);
  EXPECT_FALSE(rd.ok());
  EXPECT_FALSE((*r)->verify_original().ok());
  // A missing blob is the store's NotFound, named the same way.
  s->store.blobs.erase(to_hex(chunks[0].sha256));
  auto r2 = open_snapshot(s->m.bytes, s->store);
  ASSERT_TRUE(r2.ok());
  Status v2 = (*r2)->verify_chunks();
  EXPECT_EQ(v2.code(), Code::kNotFound);
  EXPECT_NE(v2.message().find("chunk 0 (frame"), std::string::npos) << v2.ToString();
}

TEST(SnapshotHostile, NotASnapshot) {
  const auto state = build_state(SynthSpec{});
  MemoryFile f("state.slot", std::span<const std::byte>(state));
  auto r = open_snapshot_file(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not a kvsnap snapshot file"), std::string::npos) << r.status().ToString();
  auto m = parse_manifest(state);
  EXPECT_FALSE(m.ok());
}

// --- Bounded memory -----------------------------------------------------------------

long vm_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key) + 1));
  }
  return -1;
}

// Resets the peak RSS counter (VmHWM) to the current RSS (Linux >= 4.0).
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return bool(out.flush());
}

TEST(SnapshotMemory, LargeStateBuildsAndReadsInBoundedMemory) {
#if defined(KVSNAP_UNDER_ASAN)
  const bool measure = false;  // peak RSS means nothing under AddressSanitizer
  const uint32_t cells = 4096;
#else
  const bool measure = true;
  const uint32_t cells = 16384;  // 4 layers x (K 32 MiB + transposed V 32 MiB) = 256 MiB
#endif
  const uint32_t n_layer = 4, n_embd = 1024;
  const fs::path dir = fs::temp_directory_path() / ("kvsnap_snapshot_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path big = dir / "big.slot", snap_path = dir / "big.kvsnap";
  {
    std::ofstream f(big, std::ios::binary);
    auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
    auto u64 = [&](uint64_t v) { f.write(reinterpret_cast<const char*>(&v), 8); };
    u32(0x67677371); u32(3); u32(3); u32(1); u32(2); u32(3);  // ggsq v3, 3 tokens
    u32(1); u32(cells);
    for (uint32_t c = 0; c < cells; ++c) { u32(c); u32(1); u32(0); }
    u32(1); u32(n_layer);                                      // transposed V
    std::vector<uint16_t> block(size_t(n_embd) * 64);
    std::mt19937 rng(7);
    for (auto& h : block) h = uint16_t(0x3000 + (rng() % 0x1000)) | uint16_t((rng() & 1) << 15);
    for (uint32_t l = 0; l < n_layer; ++l) {
      u32(1); u64(uint64_t(n_embd) * 2);
      for (uint32_t c = 0; c < cells; c += 64) f.write(reinterpret_cast<const char*>(block.data()), std::streamsize(block.size() * 2));
    }
    for (uint32_t l = 0; l < n_layer; ++l) {
      u32(1); u32(2); u32(n_embd);
      for (uint32_t c = 0; c < cells; c += 64) f.write(reinterpret_cast<const char*>(block.data()), std::streamsize(block.size() * 2));
    }
  }
  auto in = posix_io().open_read(big.string());
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  auto st = parse_state(**in);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const long rss0 = vm_kib("VmRSS:");
  const bool can_measure = measure && reset_peak_rss();
  Sha256Digest want{};
  {
    auto out = AtomicFileWriter::create(posix_io(), snap_path.string());
    ASSERT_TRUE(out.ok());
    SnapshotOptions o = opts_with(kDefaultCellsPerChunk, big.string());
    o.threads = 2;
    const auto t0 = std::chrono::steady_clock::now();
    auto m = write_snapshot_file(*st, **in, o, **out);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    std::printf("write: %.2f s (2 threads)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_TRUE((*out)->commit().ok());
    want = m->content_digest;
    const Segment& v0 = *std::find_if(m->segments.segments.begin(), m->segments.segments.end(),
                                      [](const Segment& s) { return s.kind == SegmentKind::kTransposed; });
    if (measure) {
      EXPECT_LT(v0.rows_per_chunk, v0.n_rows) << "a 32 MiB transposed V is cut into bands";
    }
    std::printf("%.0f MiB state -> %.1f MiB snapshot (%zu chunks)\n", double(st->file_size) / (1 << 20),
                double(fs::file_size(snap_path)) / (1 << 20), m->chunks.size());
  }
  const long write_peak = vm_kib("VmHWM:");
  auto sf = posix_io().open_read(snap_path.string());
  ASSERT_TRUE(sf.ok());
  auto r = open_snapshot_file(**sf);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto t1 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*r)->verify_original().ok());
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("read original() front to back and hash it: %.2f s, %.2f GB/s\n", read_s, double(st->file_size) / read_s / 1e9);
  EXPECT_EQ((*r)->manifest().content_digest, want);
  // Front to back, every chunk is decoded exactly once: the transposed bands fit the cache.
  const auto stats = (*r)->cache_stats();
  EXPECT_EQ(stats.misses, (*r)->chunks().size());
  EXPECT_LE(stats.peak_bytes, SnapshotReadOptions{}.cache_bytes);
  const long read_peak = vm_kib("VmHWM:");
  std::printf("RSS before %ld KiB; peak while writing %ld KiB, after reading %ld KiB; cache peak %.1f MiB\n", rss0,
              write_peak, read_peak, double(stats.peak_bytes) / (1 << 20));
  if (can_measure) {
    EXPECT_LT(write_peak - rss0, 96 * 1024) << "writing grew RSS by " << (write_peak - rss0) << " KiB";
    EXPECT_LT(read_peak - rss0, 128 * 1024) << "reading grew RSS by " << (read_peak - rss0) << " KiB";
  }
  r->reset();
  fs::remove_all(dir);
}

// --- Compatibility fixtures ---------------------------------------------------------

TEST(SnapshotFixtures, EveryReleasedVersionStillOpens) {
  size_t n = 0;
  const fs::path base = kRoot / "fixtures" / "kvsnap";
  ASSERT_TRUE(fs::exists(kRoot / snapshot_fixture_dir(kSnapshotFormatVersion)))
      << "the current format version has no compatibility fixtures: run SnapshotFixtures.Regenerate";
  ASSERT_TRUE(fs::exists(kRoot / snapshot_fixture_dir(kSnapshotGridVersion)))
      << "format version 4 (cell restarts) has no compatibility fixtures: run SnapshotFixtures.RegenerateGrid";
  for (const auto& e : fs::recursive_directory_iterator(base)) {
    if (!e.is_regular_file() || e.path().extension() != ".kvsnap") continue;
    SCOPED_TRACE(e.path().string());
    auto f = posix_io().open_read(e.path().string());
    ASSERT_TRUE(f.ok());
    auto r = open_snapshot_file(**f);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE((*r)->verify_chunks().ok());
    std::ifstream sha_in(e.path().string() + ".sha256");
    std::string recorded;
    sha_in >> recorded;
    ASSERT_EQ(recorded.size(), 64u) << "missing " << e.path().string() << ".sha256";
    EXPECT_EQ(to_hex(sha256_of(read_all_of((*r)->original()))), recorded);
    EXPECT_TRUE((*r)->verify_original().ok());
    // Version 1 recorded the whole file's SHA-256; versions 3 and 4 the digest over its chunk ids.
    if ((*r)->manifest().format_version == 1) EXPECT_EQ(to_hex((*r)->provenance().content_digest), recorded);
    else EXPECT_EQ((*r)->manifest().rule(), ContentDigestRule::kChunkTree);
    EXPECT_EQ("v" + std::to_string((*r)->manifest().format_version), e.path().parent_path().filename().string())
        << "a fixture of version N lies in vN/";
    EXPECT_EQ((*r)->segments().has_cell_restarts(), (*r)->manifest().format_version == kSnapshotGridVersion);
    auto st = (*r)->parse_original();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    ++n;
  }
  EXPECT_GE(n, 3u);
}

// The fuzz target's snapshot seeds open (a seed refused at the first check would leave the parsers
// behind it unfuzzed); the labels seed carries INFO.labels as an encrypted save writes them.
TEST(SnapshotFixtures, EveryFuzzSeedOpens) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(kRoot / "tests/fuzz/corpus/snapshot")) {
    if (e.path().extension() != ".kvsnap") continue;
    SCOPED_TRACE(e.path().string());
    auto f = posix_io().open_read(e.path().string());
    ASSERT_TRUE(f.ok());
    auto r = open_snapshot_file(**f);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE((*r)->verify_chunks().ok());
    if (e.path().filename() == "labels.kvsnap") {
      const std::optional<SnapshotLabels>& labels = (*r)->manifest().labels;
      ASSERT_TRUE(labels.has_value());
      EXPECT_EQ(labels->name, std::optional<std::string>("caf\xc3\xa9-42"));
      EXPECT_EQ(labels->tags.at("serve.ns"), "t1");
    }
    ++n;
  }
  EXPECT_GE(n, 10u);
}

// Writes fixtures/kvsnap/v<current>/ (only with KVSNAP_WRITE_FIXTURES=1).
TEST(SnapshotFixtures, Regenerate) {
  if (!std::getenv("KVSNAP_WRITE_FIXTURES")) GTEST_SKIP() << "set KVSNAP_WRITE_FIXTURES=1 to write the fixtures";
  struct Src {
    const char* file;
    const char* model;  // nullptr: none
  };
  const Src srcs[] = {
      {"v0.5.0/hd64-q4_0-q8_0-faon.slot", "tiny-hd64.gguf"},  // quantized, rotated, with model info
      {"v0.5.0/iswa-q8_0-q8_0-faon.slot", nullptr},           // two KV sections
      {"b8121/hybrid-f16-f16-faon.slot", "tiny-hybrid.gguf"}, // KV + recurrent state
      {"b5640/hd64-bf16-bf16-faoff.slot", nullptr},           // transposed V, no n_stream prefix
  };
  const fs::path out_dir = kRoot / snapshot_fixture_dir(kSnapshotFormatVersion);
  fs::create_directories(out_dir);
  for (const Src& s : srcs) {
    const fs::path p = kRoot / "fixtures" / s.file;
    const auto bytes = slurp(p);
    MemoryFile f(p.filename().string(), std::span<const std::byte>(bytes));
    SnapshotOptions o = opts_with(32, p.string());
    MemoryShape shape;
    ParseOptions po;
    if (s.model) {
      auto prof = load_model_profile(posix_io(), (kRoot / "fixtures/models" / s.model).string());
      ASSERT_TRUE(prof.ok()) << prof.status().ToString();
      auto mi = snapshot_model_info(*prof);
      ASSERT_TRUE(mi.ok()) << mi.status().ToString();
      o.model = *mi;
      auto sh = memory_shape(*prof, s.model);
      ASSERT_TRUE(sh.ok());
      shape = *sh;
      if (std::string(s.file).rfind("v0.5.0", 0) != 0) shape.ext_bytes.reset();
      po.shape = &shape;
    }
    auto st = parse_state(f, po);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    const std::string stem = std::string(s.file).substr(0, std::string(s.file).find('/')) + "-" + p.stem().string();
    const fs::path target = out_dir / (stem + ".kvsnap");
    auto w = AtomicFileWriter::create(posix_io(), target.string());
    ASSERT_TRUE(w.ok());
    auto m = write_snapshot_file(*st, f, o, **w);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_TRUE((*w)->commit().ok());
    std::ofstream(target.string() + ".sha256") << to_hex(sha256_of(bytes)) << "\n";
    std::printf("wrote %s (%zu bytes from %zu)\n", target.c_str(), size_t(fs::file_size(target)), bytes.size());
  }
}

}  // namespace
}  // namespace kvsnap
