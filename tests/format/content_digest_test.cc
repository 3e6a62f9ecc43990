// The version-3 content digest (format/content_digest.h): recorded by a save from the chunk ids,
// recomputed by verify from the rebuilt original, so a reassembly bug (a piece swapped or shifted
// while every chunk decodes right) fails; keyed for an encrypted snapshot; `kvsnap digest`'s
// state_digests gives what a save records.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "base/sha256_lanes.h"
#include "format/content_digest.h"
#include "format/snapshot.h"
#include "format/snapshot_internal.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;
// Transposed V (tiles), K rows and frame pieces: every kind of piece.
const fs::path kSlot = fs::path(KVSNAP_SOURCE_DIR) / "fixtures/b5640/hd64-bf16-bf16-faoff.slot";

MasterKey key_of(uint8_t fill) {
  std::vector<uint8_t> k(32, fill);
  return MasterKey::from_bytes(k).value();
}

struct Saved {
  std::vector<std::byte> original;
  StateFile parsed;
  SnapshotManifest m;
  MemoryChunkStore blobs;
};

constexpr uint32_t kCells = 8;

void save(Saved& s, const ChunkCipher* cipher = nullptr, const std::map<Sha256Digest, ChunkRef>* known = nullptr) {
  s.original = test::slurp(kSlot);
  MemoryFile f(kSlot.string(), std::span<const std::byte>(s.original));
  s.parsed = parse_state(f).value();
  SnapshotOptions o;
  o.cipher = cipher;
  o.cells_per_chunk = kCells;
  o.known_chunks = known;
  o.created = "2026-01-01T00:00:00Z";
  Result<SnapshotManifest> m = build_snapshot(s.parsed, f, o, s.blobs);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  s.m = std::move(m).value();
}

// The first kRows segment with at least two full chunks, and its first two chunk indices.
std::pair<uint64_t, uint64_t> two_full_row_chunks(const SnapshotManifest& m) {
  for (const Segment& seg : m.segments.segments) {
    if (seg.kind == SegmentKind::kRows && seg.cell_count >= 2 * seg.cells_per_chunk) {
      return {seg.first_chunk, seg.first_chunk + 1};
    }
  }
  ADD_FAILURE() << "the fixture has no row segment of two full chunks";
  return {0, 0};
}

Sha256Digest recomputed(const SnapshotManifest& m, const std::vector<std::byte>& bytes) {
  MemoryFile f("x", std::span<const std::byte>(bytes));
  return content_digest_of_original(m.segments, f, nullptr).value();
}

TEST(ContentDigest, ASaveRecordsItAndVerifyRecomputesIt) {
  Saved s;
  save(s);
  EXPECT_EQ(s.m.format_version, 3u);
  EXPECT_EQ(s.m.min_reader_version, 3u);
  EXPECT_EQ(s.m.rule(), ContentDigestRule::kChunkTree);
  EXPECT_EQ(s.m.content_digest, content_digest_of_table(s.m.segments, s.original.size(), s.m.chunks, false));
  EXPECT_EQ(s.m.content_digest, recomputed(s.m, s.original));
  EXPECT_NE(s.m.content_digest, sha256_of(s.original)) << "not the whole-file SHA-256";
  // What `kvsnap digest FILE` prints.
  MemoryFile f("x", std::span<const std::byte>(s.original));
  auto d = state_digests(s.parsed, f, kCells);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->content_digest, s.m.content_digest);
  EXPECT_EQ(d->sha256, sha256_of(s.original));
  auto r = open_snapshot(s.m.bytes, s.blobs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->verify_chunks().ok());
  EXPECT_TRUE((*r)->verify_original().ok());
  EXPECT_EQ((*r)->provenance().content_digest, s.m.content_digest);
}

// An extension that takes its parent's chunks by their equality digest records the digest a full
// hash of its own file gives: the parent's ids stand for the same bytes.
TEST(ContentDigest, TakingAParentsChunksGivesTheSameDigest) {
  Saved parent;
  save(parent);
  std::map<Sha256Digest, ChunkRef> known;
  for (const ChunkRef& c : parent.m.chunks) known.emplace(c.sha256, c);
  Saved again;
  save(again, nullptr, &known);
  EXPECT_EQ(again.m.content_digest, parent.m.content_digest);
}

// The reader reassembles the original from a chunk table whose two entries were swapped (each
// chunk still decodes and matches its own id): only the end-to-end digest can see it.
TEST(ContentDigest, ASwappedPieceFailsVerifyThoughEveryChunkDecodes) {
  Saved s;
  save(s);
  const auto [a, b] = two_full_row_chunks(s.m);
  ASSERT_NE(s.m.chunks[a].sha256, s.m.chunks[b].sha256);
  SnapshotManifest swapped = s.m;
  std::swap(swapped.chunks[a], swapped.chunks[b]);
  std::swap(swapped.chunks[a].index, swapped.chunks[b].index);
  ASSERT_TRUE(snapshot_detail::encode_manifest(swapped).ok());  // DIGS keeps the digest recorded at save
  auto r = open_snapshot(swapped.bytes, s.blobs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->verify_chunks().ok());
  const Status v = (*r)->verify_original();
  EXPECT_EQ(v.code(), Code::kCorruption) << v.ToString();
  EXPECT_NE(v.message().find("content digest"), std::string::npos) << v.ToString();
}

// Bytes put in the wrong place: two row chunks swapped, a run shifted by one byte, two rows of a
// transposed tile swapped, a frame byte changed. Each changes the digest recomputed from the file.
TEST(ContentDigest, ASwappedOrShiftedPieceOfTheFileChangesIt) {
  Saved s;
  save(s);
  const auto [a, b] = two_full_row_chunks(s.m);
  const Segment* rows = nullptr;
  const Segment* tiles = nullptr;
  const Segment* frame = nullptr;
  for (const Segment& seg : s.m.segments.segments) {
    if (seg.kind == SegmentKind::kRows && seg.first_chunk == a) rows = &seg;
    if (seg.kind == SegmentKind::kTransposed && !tiles) tiles = &seg;
    if (seg.kind == SegmentKind::kFrame && !frame) frame = &seg;
  }
  ASSERT_TRUE(rows && tiles && frame);
  const uint64_t chunk = uint64_t(rows->cells_per_chunk) * rows->row_bytes;
  (void)b;

  std::vector<std::byte> swapped = s.original;
  std::swap_ranges(swapped.begin() + rows->file_offset, swapped.begin() + rows->file_offset + chunk,
                   swapped.begin() + rows->file_offset + chunk);
  ASSERT_NE(swapped, s.original);
  EXPECT_NE(recomputed(s.m, swapped), s.m.content_digest);

  std::vector<std::byte> shifted = s.original;
  auto at = shifted.begin() + rows->file_offset;
  std::rotate(at, at + 1, at + 2 * chunk);
  ASSERT_NE(shifted, s.original);
  EXPECT_NE(recomputed(s.m, shifted), s.m.content_digest);

  std::vector<std::byte> rows_swapped = s.original;
  const uint64_t row_len = uint64_t(tiles->cell_count) * tiles->elem_bytes;
  std::swap_ranges(rows_swapped.begin() + tiles->file_offset, rows_swapped.begin() + tiles->file_offset + row_len,
                   rows_swapped.begin() + tiles->file_offset + row_len);
  ASSERT_NE(rows_swapped, s.original);
  EXPECT_NE(recomputed(s.m, rows_swapped), s.m.content_digest);

  std::vector<std::byte> frame_changed = s.original;
  frame_changed[frame->file_offset] ^= std::byte{1};
  EXPECT_NE(recomputed(s.m, frame_changed), s.m.content_digest);

  EXPECT_EQ(recomputed(s.m, s.original), s.m.content_digest);
}

// The recomputation hashes a group of chunks at a time (as many as the kernel has lanes): every
// kernel this CPU runs gives the digest the save recorded, whole groups and the last, shorter one
// alike, plain and keyed.
TEST(ContentDigest, EveryKernelRecomputesTheRecordedDigest) {
  Saved s;
  save(s);
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  Saved sealed;
  save(sealed, &c);
  ASSERT_NE(s.m.chunks.size() % 8, 0u) << "the fixture should end in a part group of 8";
  MemoryFile f("x", std::span<const std::byte>(s.original));
  int kernels = 0;
  for (Sha256Kernel k : kSha256Kernels) {
    if (!sha256_kernel_supported(k)) continue;
    ++kernels;
    auto plain = content_digest_of_original(s.m.segments, f, nullptr, k);
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    EXPECT_EQ(*plain, s.m.content_digest) << sha256_kernel_name(k);
    auto keyed = content_digest_of_original(sealed.m.segments, f, &c, k);
    ASSERT_TRUE(keyed.ok()) << keyed.status().ToString();
    EXPECT_EQ(*keyed, sealed.m.content_digest) << sha256_kernel_name(k);
    // A chunk's bytes changed inside a group (not its first) changes the digest.
    std::vector<std::byte> changed = s.original;
    const auto [a, b] = two_full_row_chunks(s.m);
    (void)a;
    const Segment* seg = nullptr;
    for (const Segment& x : s.m.segments.segments)
      if (x.kind == SegmentKind::kRows && x.first_chunk + 1 == b) seg = &x;
    ASSERT_NE(seg, nullptr);
    changed[seg->file_offset + uint64_t(seg->cells_per_chunk) * seg->row_bytes] ^= std::byte{1};
    MemoryFile g("y", std::span<const std::byte>(changed));
    auto other = content_digest_of_original(s.m.segments, g, nullptr, k);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(*other, s.m.content_digest) << sha256_kernel_name(k);
  }
  EXPECT_GE(kernels, 1);
}

// A chunk that cannot be read while the digest is recomputed is named (its index and what it
// holds), whichever place in its group it has: verify_original reads the rebuilt original a group
// of chunks at a time.
TEST(ContentDigest, VerifyOriginalNamesADamagedChunkInItsGroup) {
  Saved s;
  save(s);
  ASSERT_GT(s.m.chunks.size(), 8u);
  for (const uint64_t victim : {uint64_t(1), uint64_t(5), uint64_t(s.m.chunks.size() - 1)}) {
    MemoryChunkStore damaged = s.blobs;
    auto it = damaged.blobs.find(s.m.chunks[victim].sha256);
    ASSERT_NE(it, damaged.blobs.end());
    it->second.back() ^= std::byte{0x40};
    auto r = open_snapshot(s.m.bytes, damaged);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // The first chunk with those bytes (equal chunks share a blob) is the one found damaged.
    uint64_t first = 0;
    while (s.m.chunks[first].sha256 != s.m.chunks[victim].sha256) ++first;
    const Status v = (*r)->verify_original();
    ASSERT_FALSE(v.ok()) << "chunk " << victim;
    EXPECT_NE(v.message().find("chunk " + std::to_string(first) + " ("), std::string::npos) << v.ToString();
  }
}

// An encrypted snapshot's digest is over its keyed ids: not the plain one, recomputed only with the
// key, and a verify without the key says so instead of passing.
TEST(ContentDigest, KeyedForAnEncryptedSnapshot) {
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  const ChunkCipher other = ChunkCipher::for_tenant(key_of(1), "bob").value();
  Saved plain, sealed;
  save(plain);
  save(sealed, &c);
  EXPECT_NE(sealed.m.content_digest, plain.m.content_digest);
  MemoryFile f("x", std::span<const std::byte>(sealed.original));
  EXPECT_EQ(content_digest_of_original(sealed.m.segments, f, &c).value(), sealed.m.content_digest);
  EXPECT_NE(content_digest_of_original(sealed.m.segments, f, &other).value(), sealed.m.content_digest);
  SnapshotReadOptions ro;
  ro.cipher = &c;
  auto r = open_snapshot(sealed.m.bytes, sealed.blobs, ro);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->verify_original().ok());
  auto keyless = open_snapshot(sealed.m.bytes, sealed.blobs);
  ASSERT_TRUE(keyless.ok());
  EXPECT_FALSE((*keyless)->verify_original().ok());
}

// A manifest of version 3 is refused by a reader of version 1 by its versions (what main's kvsnap
// says: "needs a reader of version 3 or later; this kvsnap reads version 1: upgrade kvsnap").
TEST(ContentDigest, TheManifestNeedsAReaderOfVersion3) {
  Saved s;
  save(s);
  ASSERT_GE(s.m.bytes.size(), 12u);
  EXPECT_EQ(load_le<uint32_t>(s.m.bytes.data() + 4), 3u);
  EXPECT_EQ(load_le<uint32_t>(s.m.bytes.data() + 8), 3u);
}

}  // namespace
}  // namespace kvsnap
