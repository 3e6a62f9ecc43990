// Internals shared by snapshot_manifest.cc, snapshot_write.cc and
// snapshot_read.cc. Not part of the API.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "base/byte_order.h"
#include "base/io.h"
#include "format/snapshot.h"

namespace kvsnap::snapshot_detail {

// "\x89KVSNAP\n": the high byte catches 7-bit transfers, the newline text-mode ones.
inline constexpr std::array<uint8_t, 8> kFileMagic = {0x89, 'K', 'V', 'S', 'N', 'A', 'P', '\n'};
inline constexpr std::array<uint8_t, 4> kManifestMagic = {'K', 'V', 'S', 'M'};
inline constexpr size_t kPreambleBytes = 16;   // magic, u32 version, u32 min_reader_version
inline constexpr size_t kTrailerBytes = 80;    // 4 x u64, sha256, 2 x u32, magic
inline constexpr size_t kManifestHeaderBytes = 16;
inline constexpr size_t kSectionHeaderBytes = 16;
inline constexpr size_t kSegmentRecordBytes = 64;
inline constexpr size_t kChunkRecordBytes = 56;
inline constexpr uint64_t kMaxManifestBytes = uint64_t(1) << 30;
// INFO is parsed into a tree of about 16 bytes per input byte; this bounds it
// (a real INFO is some hundred bytes per layer and stream: 10 MiB for 256
// streams of 128 layers). The writer refuses to write more than a reader reads.
inline constexpr uint64_t kMaxInfoBytes = uint64_t(32) << 20;
// A blob may exceed its raw size by at most this much (header + zstd framing);
// this writer never exceeds raw + 16 (it stores incompressible chunks).
inline constexpr uint64_t kMaxBlobOverhead = 64 << 10;
// The writer sizes a transposed-V band (rows_per_chunk rows of every cell) to
// fit this, so reading original() front to back reuses cached tiles.
inline constexpr uint64_t kBandBytes = uint64_t(16) << 20;

constexpr uint32_t fourcc(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}
inline constexpr uint32_t kTagInfo = fourcc("INFO");
inline constexpr uint32_t kTagCell = fourcc("CELL");
inline constexpr uint32_t kTagTokn = fourcc("TOKN");
inline constexpr uint32_t kTagSegs = fourcc("SEGS");
inline constexpr uint32_t kTagChnk = fourcc("CHNK");
inline constexpr uint32_t kTagDigs = fourcc("DIGS");
inline constexpr uint32_t kTagCryp = fourcc("CRYP");  // SnapshotEncryption
inline constexpr uint32_t kTagChkx = fourcc("CHKX");  // ChunkRef::xxh of every chunk (optional)
inline constexpr uint32_t kChkxXxh3_128 = 1;           // CHKX's algorithm: XXH3-128, canonical bytes
inline constexpr uint32_t kTagGrid = fourcc("GRID");  // Segment::cell_restarts (format version 4)
// SnapshotMlx. Written first, so a kvsnap that does not know it stops at it ("required section
// 'MLXC' is unknown") before it could take the mlx provenance in INFO for a damaged one.
inline constexpr uint32_t kTagMlxc = fourcc("MLXC");
// INFO.provenance's copy of DIGS's content digest, from format version 3 on ("sha256" before).
inline constexpr const char* kContentDigestKey = "content_digest";
// INFO.provenance.kind of an mlx-lm prompt cache.
inline constexpr const char* kMlxPromptCacheKind = "mlx-prompt-cache";
inline constexpr uint32_t kSectionRequired = 1;

// "INFO", or "0x12345678" when not printable.
std::string tag_name(uint32_t tag);

inline void put_bytes(std::vector<std::byte>& out, const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}

// Bounds-checked little-endian reads over bytes in memory. Every failure is a
// kCorruption naming `what` and the offset from the start of the span.
class SpanReader {
 public:
  SpanReader(std::span<const std::byte> data, std::string context) : d_(data), ctx_(std::move(context)) {}
  size_t offset() const { return pos_; }
  size_t remaining() const { return d_.size() - pos_; }
  bool at_end() const { return pos_ == d_.size(); }

  Status u8(uint8_t& v, const char* what) { return fixed(&v, 1, what); }
  Status u16(uint16_t& v, const char* what) { return little(v, what); }
  Status u32(uint32_t& v, const char* what) { return little(v, what); }
  Status i32(int32_t& v, const char* what) {
    uint32_t u = 0;
    KV_RETURN_IF_ERROR(little(u, what));
    v = int32_t(u);
    return Status::OK();
  }
  Status u64(uint64_t& v, const char* what) { return little(v, what); }
  Status bytes(void* dst, size_t n, const char* what) { return fixed(dst, n, what); }
  Result<std::span<const std::byte>> take(uint64_t n, const char* what) {
    if (n > remaining()) return truncated(n, what);
    auto s = d_.subspan(pos_, size_t(n));
    pos_ += size_t(n);
    return s;
  }
  // Refuses a count whose records could not fit in what remains.
  Status check_count(uint64_t count, uint64_t min_record_bytes, const char* what) const {
    if (min_record_bytes && count > remaining() / min_record_bytes) {
      return corrupt(std::string(what) + ": count " + std::to_string(count) + " needs at least " +
                     std::to_string(min_record_bytes) + " bytes each, " + std::to_string(remaining()) + " remain");
    }
    return Status::OK();
  }
  Status corrupt(const std::string& msg) const {
    return Status::Corruption(ctx_ + ": offset " + std::to_string(pos_) + ": " + msg);
  }

 private:
  Status truncated(uint64_t n, const char* what) const {
    return corrupt(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes, " +
                   std::to_string(remaining()) + " remain");
  }
  Status fixed(void* dst, size_t n, const char* what) {
    if (n > remaining()) return truncated(n, what);
    if (n) std::memcpy(dst, d_.data() + pos_, n);
    pos_ += n;
    return Status::OK();
  }
  template <class T>
  Status little(T& v, const char* what) {
    std::array<uint8_t, sizeof(T)> b{};
    KV_RETURN_IF_ERROR(fixed(b.data(), sizeof(T), what));
    v = load_le<T>(b.data());
    return Status::OK();
  }
  std::span<const std::byte> d_;
  std::string ctx_;
  size_t pos_ = 0;
};

// Encodes the sections of `m` (info, cells, tokens, segments, chunks, digests)
// into m.bytes and sets m.sections_sha256 and m.manifest_sha256.
Status encode_manifest(SnapshotManifest& m);

// A save's adaptive level (SnapshotOptions::adaptive): its chunks are compressed until the sink
// has taken kAdaptiveFirstBytes of encoded blobs, as the write-behind cannot make the sink wait
// before its pack holds more than kWriteBehindWindows windows (base/io.h).
inline constexpr uint64_t kAdaptiveFirstBytes = (kWriteBehindWindows + 1) * kWriteBehindBytes;

// Chunks the segments of m.segments (set by the caller) from `original`: every chunk encoded on
// opts.threads workers and handed to `chunks` in order, the original hashed on the side. Sets
// m.chunks and m.content_digest. Checks opts first.
Status encode_snapshot_chunks(const ReadableFile& original, const SnapshotOptions& opts, ChunkSink& chunks,
                              SnapshotManifest& m);

// Planning: a frame segment for file bytes [at, end) (nothing when end <= at; `at` moves to end),
// and, once every segment is in, the frame chunk count and each tensor segment's first chunk.
void add_frame_segment(SegmentTable& t, uint64_t& at, uint64_t end);
void number_chunks(SegmentTable& t);

// A kTransposed segment's band height (docs/format.md, "Writer's choices").
uint32_t rows_per_chunk(uint64_t n_rows, uint64_t cell_count, uint64_t elem_bytes, uint64_t cells_per_chunk);

// INFO's "chunking": the chunk size and how this save encoded its new chunks.
nlohmann::ordered_json chunking_json(const SnapshotOptions& opts);
// INFO.labels: {"name": string or null, "tags": {key: value}} (SnapshotLabels).
nlohmann::ordered_json labels_json(const SnapshotLabels& labels);

// The INFO document for a state (everything but the digests of the bytes).
nlohmann::ordered_json build_info(const StateFile& f, const SnapshotOptions& opts, const Sha256Digest& original_sha,
                                  const std::string& created);

// The file form of an encrypted snapshot: preamble and trailer say version 2 (min reader 2, so
// an older kvsnap refuses it: "upgrade kvsnap") and the manifest area holds the version-1
// manifest sealed by the tenant's cipher under sealed_manifest_id().
inline constexpr uint32_t kSealedFileVersion = 2;
inline ChunkId sealed_manifest_id(const ChunkCipher& c) {
  constexpr std::string_view kLabel = "kvsnap manifest v1";
  return c.chunk_id({reinterpret_cast<const std::byte*>(kLabel.data()), kLabel.size()});
}

// Where a file offset of the original lands: the chunk (global index), the
// offset inside the chunk's raw bytes, and how many bytes from there on are
// contiguous in both the file and the chunk.
struct Location {
  uint64_t chunk = 0;
  uint64_t offset_in_chunk = 0;
  uint64_t run = 0;
};
// `seg` contains `file_offset`. Frame chunk sizes come from `table`.
Location locate(const SegmentTable& table, const Segment& seg, uint64_t file_offset);

// The raw bytes of chunk `index`, read from the original file at the places the segment table
// gives them: the writer's input, and what verify reads back to recompute the content digest.
class ChunkReader {
 public:
  ChunkReader(const SegmentTable& t, const ReadableFile& file);
  uint64_t n_chunks() const;
  // The segment a tensor chunk belongs to (nullptr for frame chunks).
  const Segment* tensor_segment(uint64_t index) const;
  // `out` is resized to the chunk's raw size (its capacity reused).
  Status read(uint64_t index, std::vector<std::byte>& out) const;

 private:
  Status read_frame(uint64_t k, std::vector<std::byte>& out) const;

  const SegmentTable& t_;
  const ReadableFile& file_;
  std::vector<const Segment*> frames_;
  std::vector<const Segment*> tensors_;
};

// SnapshotOptions::parent_grid: each tensor segment of `t` continues the parent segment of the
// same place and geometry, if there is one (the parent's restarts, and its end where that is off
// its grid, while a segment has fewer than 32); then the chunks are numbered again.
void continue_cell_grids(SegmentTable& t, const SegmentTable& parent);
// kvsnap digest --as: each tensor segment of `t` (a file's table) takes the restarts of the
// `snapshot`'s segment of the same place and geometry that fall inside it, all of them (a
// manifest another writer made may hold more than 32), so a file the snapshot was saved from
// gets that snapshot's grid back.
void adopt_cell_grids(SegmentTable& t, const SegmentTable& snapshot);

// The segment table a save of `parsed` (read from `original`) makes: checks the sizes agree.
Result<SegmentTable> plan_state_segments(const StateFile& parsed, const ReadableFile& original,
                                         uint32_t cells_per_chunk);

// SEGS's payload (docs/format.md): what the content digest binds the chunks' places with.
std::vector<std::byte> encode_segments(const SegmentTable& t);
// GRID's payload: what the content digest also hashes when the table has cell restarts.
std::vector<std::byte> encode_grid(const SegmentTable& t);

// Text for messages: "layer 3 V of KV section 0 stream 0".
std::string describe_segment(const Segment& s);

}  // namespace kvsnap::snapshot_detail
