// The kvsnap snapshot format (v1): one saved llama.cpp KV state, versioned,
// self-describing, checksummed. Byte layouts: docs/format.md.
//
// What it promises:
//  - Lossless by construction. A snapshot holds the original llama.cpp file,
//    split into segments: the frame (everything that is not K/V tensor data:
//    headers, cell metadata, tokens, recurrent state, v9 outputs), stored as
//    one "frame stream" cut into chunks of at most 1 MiB, and one tensor
//    segment per KV section/stream/layer/side, cut by cells: chunk j holds
//    cells [j*N, (j+1)*N) (N = the segment's cells_per_chunk). Transposed V
//    (v_trans=1) is also cut into bands of rows_per_chunk rows, so a chunk is a
//    tile: for each row of its band, the elements of its cells. A token prefix
//    reads from the first chunks of each segment without the rest.
//  - SnapshotReader::original() is a ReadableFile whose bytes are exactly the
//    original file, computed on demand: offsets map to chunks arithmetically,
//    every chunk is checked against its SHA-256 after decoding, and a small
//    LRU of decoded chunks (SnapshotReadOptions::cache_bytes, 64 MiB by
//    default) bounds memory. parse_state / convert_state work on it unchanged.
//  - One encoding for two uses: the manifest (a byte string) plus
//    content-addressed chunk blobs (format/chunk_codec.h). A standalone file
//    is preamble + blobs + manifest + trailer; a store keeps the manifest bytes
//    in its catalog and the blobs by hash. The manifest is byte-identical in
//    both (blob offsets in a file are implied: blobs follow in chunk order).
//  - Hostile input is an error, never a crash: every length and count is
//    checked before it sizes anything; errors name the file, the section and
//    the problem. Unknown optional sections are skipped; unknown required
//    sections and too-new versions are refused naming the tag / version.
//  - Bounded memory when writing and reading, whatever the state size:
//    writing holds at most G x 2 x threads chunks (G = 2 or 4 with SHA-NI, 8 with
//    the AVX2 SHA-256 lanes: docs/format.md section 5); reading holds the cache.
//
// Thread safety: SnapshotReader and its original() may be read from several
// threads at once. ChunkSink::put is called from one thread, in chunk order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/chunk_cipher.h"
#include "base/io.h"
#include "base/json.h"
#include "base/status.h"
#include "format/chunk_codec.h"
#include "format/llama_state.h"
#include "format/model_profile.h"

namespace kvsnap {

// The format this code writes (format_version = min_reader_version = 3) for a snapshot whose
// cell grids are uniform; the store records it with every manifest. Version 3 changed what DIGS's
// content digest is (ContentDigestRule); 2 is not a manifest version: it is the file form of an
// encrypted snapshot (docs/format.md). A snapshot saved on its parent's grid (a segment with
// Segment::cell_restarts) is version 4 (kSnapshotGridVersion), so a kvsnap that reads 3 refuses
// it by its version instead of misplacing its chunks; the others stay readable by it.
inline constexpr uint32_t kSnapshotFormatVersion = 3;
inline constexpr uint32_t kSnapshotMinReaderVersion = 3;
inline constexpr uint32_t kSnapshotGridVersion = 4;
inline constexpr uint32_t kStoreFormatVersion = kSnapshotFormatVersion;
// A file or manifest whose min_reader_version exceeds this is refused.
inline constexpr uint32_t kSnapshotReaderVersion = 4;
// Written into INFO.kvsnap_version unless SnapshotOptions says otherwise;
// kept in step with project(VERSION) in CMakeLists.txt.
inline constexpr const char* kKvsnapLibraryVersion = "0.1.0";

// Compatibility fixtures: every released format version N keeps
// "fixtures/kvsnap/v<N>/" (relative to the source tree) with .kvsnap files and
// their originals' SHA-256; files there are never edited, and every one must
// keep opening (tests/format/snapshot_test.cc). New versions add a directory.
std::string snapshot_fixture_dir(uint32_t format_version);

inline constexpr uint32_t kDefaultCellsPerChunk = 256;
inline constexpr uint32_t kFrameChunkBytes = 1u << 20;

// --- The manifest model ---------------------------------------------------------

enum class SegmentKind : uint8_t {
  kFrame = 0,       // file bytes [file_offset, +size) = frame stream [frame_offset, +size)
  kRows = 1,        // cell_count rows of row_bytes (K, or V with v_trans = 0)
  kTransposed = 2,  // n_rows rows of cell_count elements of elem_bytes (V with v_trans = 1)
};
const char* segment_kind_name(SegmentKind k);

// How DIGS's content digest is computed from the original (docs/format.md, "The content digest").
enum class ContentDigestRule : uint8_t {
  kWholeSha256 = 1,  // format version 1: SHA-256 of the whole file
  kChunkTree = 3,    // format version 3: over the segment table and every chunk's id (content_digest.h)
};

struct Segment {
  SegmentKind kind = SegmentKind::kFrame;
  uint64_t file_offset = 0;
  uint64_t size = 0;
  uint64_t frame_offset = 0;   // kFrame
  // Tensor segments (kRows, kTransposed):
  uint32_t section = 0, stream = 0, layer = 0;
  bool is_v = false;
  int32_t ggml_type = 0;
  uint64_t row_bytes = 0;      // kRows
  uint32_t elem_bytes = 0;     // kTransposed
  uint32_t n_rows = 0;         // kTransposed (n_embd_v_gqa)
  uint32_t cell_count = 0;
  uint32_t cells_per_chunk = 0;  // N of this segment
  uint32_t rows_per_chunk = 0;   // kTransposed: R (a band); kRows: 0
  uint64_t first_chunk = 0;

  uint64_t cell_chunks() const;  // J: ceil(cell_count / N) without restarts
  uint64_t bands() const;        // B = ceil(n_rows / R) for kTransposed, else 1
  uint64_t n_chunks() const;     // J * B (band-major: chunk = first_chunk + b * J + j)
  // Raw bytes of the segment's chunk `k` (0-based within the segment).
  uint64_t chunk_raw_size(uint64_t k) const;

  // The cell grid. Without restarts cell chunk j holds cells [j*N, min((j+1)*N, cell_count)).
  // With restarts r_1 < ... < r_m (each in (0, cell_count); the GRID section, format version 4)
  // the cells are cut into pieces [0, r_1), [r_1, r_2), ..., [r_m, cell_count) and each piece every
  // N cells from its own start: an extension saved on its parent's grid restarts at the parent's
  // cell count, so every chunk of the parent's is one of its chunks (docs/format.md, "GRID").
  struct CellRun {
    uint64_t first = 0, count = 0;
  };
  CellRun cell_chunk(uint64_t j) const;          // the cells of cell chunk j < cell_chunks()
  uint64_t cell_chunk_of(uint64_t cell) const;   // the cell chunk that holds cell < cell_count
  const std::vector<uint32_t>& cell_restarts() const { return restarts_; }
  // Callers check the restarts first (strictly increasing, in (0, cell_count)) and set
  // cells_per_chunk (> 0) and cell_count before.
  void set_cell_restarts(std::vector<uint32_t> restarts);

 private:
  std::vector<uint32_t> restarts_;
  std::vector<uint64_t> restart_chunk_;  // the first cell chunk of the piece at restarts_[i]
};

struct SegmentTable {
  uint32_t frame_chunk_bytes = kFrameChunkBytes;
  uint64_t frame_bytes = 0;          // the frame stream's size; its chunks are 0..n_frame_chunks-1
  uint64_t n_frame_chunks = 0;
  std::vector<Segment> segments;     // sorted by file_offset, contiguous from 0 to the file size

  bool has_cell_restarts() const;    // any segment's (then the manifest is version 4, with GRID)
};

struct ChunkRef {
  Sha256Digest sha256{};                   // of the raw bytes: the chunk's identity
  uint64_t raw_size = 0;
  // Size of the blob this writer made. A store may hold another encoding of
  // the same raw bytes (another level or filter): readers accept any blob
  // whose decoded bytes hash to sha256.
  uint64_t stored_size = 0;
  ChunkCodec codec = ChunkCodec::kStored;
  ChunkFilter filter = ChunkFilter::kNone;
  uint16_t elem_size = 0;
  uint64_t index = 0;                // position in the chunk table (not part of the identity)
  // chunk_xxh of the raw bytes, when the manifest records it (its optional CHKX section:
  // snapshots saved before it, and encrypted ones, have none). Checked with the SHA-256
  // whenever the chunk is decoded.
  std::optional<ChunkXxh> xxh;
};

struct CellSection {
  uint32_t ext_bytes = 0;
  std::vector<std::vector<CellMeta>> streams;  // per stream, per cell
};

struct SnapshotTokens {
  std::vector<int32_t> tokens;       // the prompt's tokens (llama-server's packed payload unpacked)
  std::vector<int32_t> words;        // the token payload exactly as stored in the file
  bool packed = false;
};

// Which llama.cpp wrote the original, as far as the saver knew (the file
// does not say; format/llama_era.h). Recorded at save so that a restore
// decides the rotation of a ggsq v2 / ggsn v9 file as the saver could.
// Empty strings: not known.
struct SourceClaims {
  std::string llama_build;       // "b8121", "v0.5.0": declared, or reported by llama-server
  std::string llama_build_from;  // "declared" | "llama-server"
  std::string reported_build;    // llama-server's /props build_info as it said it ("b1-1a2b3c"), even when unusable
  std::string src_rotation;      // "on" | "off": declared at save
  bool empty() const { return llama_build.empty() && reported_build.empty() && src_rotation.empty(); }
};

// The store's name and tags of a snapshot, recorded in INFO.labels of an encrypted snapshot's
// manifest, which is sealed: the catalog's plain name and tags can then be checked against them
// (a catalog writer without the key cannot swap the names of two sealed snapshots unseen).
struct SnapshotLabels {
  std::optional<std::string> name;
  std::map<std::string, std::string> tags;
  bool operator==(const SnapshotLabels&) const = default;
};

struct SnapshotProvenance {
  std::string source;                // basename of the original file
  SourceClaims writer;               // who wrote it (optional keys of INFO)
  StateKind kind = StateKind::kSeqFile;
  uint32_t magic = 0;
  uint32_t version = 0;
  uint64_t file_size = 0;
  Sha256Digest content_digest{};     // INFO "sha256" (version 1) or "content_digest" (3): = DIGS
  // INFO kind "mlx-prompt-cache": the original is an mlx-lm prompt cache (a safetensors file), not
  // a llama.cpp state; `kind`, `magic` and `version` then mean nothing. Such a manifest has the
  // MLXC section (SnapshotMlx) and no CELL data (format/snapshot_mlx.h).
  bool mlx_prompt_cache = false;
};

// What the model's GGUF says, when one was given (all optional in INFO).
struct SnapshotModelInfo {
  std::string arch;
  std::string gguf_fingerprint;
  uint32_t n_layer = 0;
  uint32_t n_head_kv = 0;            // layer 0
  struct Layer {
    uint32_t head_dim_k = 0, head_dim_v = 0, n_head_kv = 0;
  };
  std::vector<Layer> layers;         // per model layer
  struct Section {                   // per KV section of the state, in file order
    std::vector<uint32_t> head_dim_k, head_dim_v;  // per layer of the section
    std::optional<uint32_t> k_rotation_block;      // llama.cpp's rule; nullopt: never rotated
    std::optional<uint32_t> v_rotation_block;
  };
  std::vector<Section> kv_sections;
  // The bytes after each cell's position in v0.5.0-format files (12 for an M-RoPE model, 0 for
  // most): what an old-format original needs to be upgraded. nullopt: not recorded (kvsnap
  // before it was; such a snapshot needs the model for that upgrade).
  std::optional<uint32_t> cell_ext_bytes;
};
// From a loaded profile (load_model_profile): dims and llama.cpp's rotation rule.
Result<SnapshotModelInfo> snapshot_model_info(const ModelProfile& p);

// A lossy conversion applied before the snapshot was taken (store at another type).
struct LossyConversion {
  std::string from_k, from_v;        // type names before
  std::string to_k, to_v;            // type names stored
  std::string note;
};

// An encrypted snapshot (base/chunk_cipher.h; docs/store.md, "Encryption at rest — design"):
// every chunk id is the tenant's keyed id (HMAC-SHA256) and every blob is sealed (AES-256-GCM)
// around the usual chunk blob. Recorded in the CRYP section, which is required: a kvsnap that
// does not know it refuses the manifest instead of misreading keyed ids as SHA-256.
struct SnapshotEncryption {
  std::string tenant;   // the name the tenant keys were derived for
  KeyId master_key_id{};
  KeyId tenant_key_id{};
};

// MLXC: the original is an mlx-lm prompt cache (format/snapshot_mlx.h). One entry per tensor
// segment, in segment order: the safetensors tensor it holds (a [B,H,S,D] tensor stored as a
// kTransposed segment of B*H rows (planes) of S cells (sequence positions) of D*itemsize bytes).
struct SnapshotMlxTensor {
  std::string name;   // "3.0", "0.1.2"
  std::string dtype;  // "BF16", "U32", ...
};
struct SnapshotMlx {
  uint32_t version = 1;
  std::vector<SnapshotMlxTensor> tensors;
};

struct SnapshotManifest {
  uint32_t format_version = kSnapshotFormatVersion;
  uint32_t min_reader_version = kSnapshotMinReaderVersion;
  nlohmann::ordered_json info;       // the INFO section (docs/format.md)
  SnapshotProvenance provenance;     // INFO.provenance, checked
  std::optional<std::string> arch;
  std::optional<SnapshotModelInfo> model;  // INFO.model (when a GGUF was given; layers/sections may be empty)
  uint32_t cells_per_chunk = kDefaultCellsPerChunk;
  bool lossy = false;
  std::vector<CellSection> cells;
  SnapshotTokens tokens;
  SegmentTable segments;
  std::vector<ChunkRef> chunks;
  // DIGS: the original's digest by rule() (format/content_digest.h): version 1 the SHA-256 of the
  // whole file, version 3 the digest of the chunk ids over the segment table.
  Sha256Digest content_digest{};
  Sha256Digest sections_sha256{};          // DIGS: SHA-256 of the manifest bytes before DIGS
  std::optional<SnapshotEncryption> encryption;  // CRYP: absent = plain chunks, SHA-256 ids
  std::optional<SnapshotMlx> mlx;                // MLXC: an mlx-lm prompt cache, not a llama.cpp state
  std::optional<SnapshotLabels> labels;          // INFO.labels (encrypted snapshots saved by a store)
  std::vector<uint32_t> skipped_sections;  // unknown optional tags a reader skipped
  std::vector<std::byte> bytes;      // the encoded manifest
  Sha256Digest manifest_sha256{};          // of `bytes` (a store may key the manifest by it)

  ContentDigestRule rule() const {
    return format_version >= 3 ? ContentDigestRule::kChunkTree : ContentDigestRule::kWholeSha256;
  }
  uint64_t raw_bytes() const;        // sum of chunk raw sizes
  uint64_t stored_bytes() const;     // sum of blob sizes
};

// Decodes and checks manifest bytes (structure, bounds, the DIGS digest, the
// segment and chunk tables against each other). `name` is for messages.
Result<SnapshotManifest> parse_manifest(std::span<const std::byte> bytes, const std::string& name = "manifest");

// --- Writing ---------------------------------------------------------------------

// Receives every chunk blob, in chunk order, from one thread. Content-addressed:
// a store may skip hashes it already has (the same raw bytes always have the
// same hash, whatever their encoding). The blob is empty for a chunk of
// SnapshotOptions::known_chunks.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  virtual Status put(const ChunkRef& ref, std::span<const std::byte> blob) = 0;
  // The same for a blob in the first `size` bytes of `buffer`, a buffer the caller reuses: a
  // sink that holds blobs may take it and leave another buffer of its own (of any size and
  // contents) in its place instead of copying the blob.
  virtual Status put_buffer(const ChunkRef& ref, std::vector<std::byte>& buffer, size_t size) {
    return put(ref, std::span<const std::byte>(buffer.data(), size));
  }
};

struct SnapshotOptions {
  uint32_t cells_per_chunk = kDefaultCellsPerChunk;
  int zstd_level = 3;
  bool compress = true;              // false: chunks stored raw (ChunkEncoder), zstd_level unused
  // With compress: a chunk is compressed only while the sink is behind the encoders (the disk,
  // not the CPU, is the limit: compressing costs no time), else stored raw. So a save runs at
  // the pace of the slower of raw encoding and the disk, and compresses what that pace leaves
  // time for (docs/store.md, "The adaptive level"). Which chunks are compressed depends on timing.
  bool adaptive = false;
  // How many times the calling thread has blocked (adaptive's signal; empty: base/os.h
  // thread_blocked_count). A seam for tests, which block a sink by counting, not by the scheduler.
  std::function<std::optional<uint64_t>()> blocked_count;
  // How many times the sink's storage has made its writes wait (a store's pack: the disk's paced
  // write-behind, BlobWriteBatch::storage_waits): where it says, the disk is the limit only when
  // it grew while the sink took a job. Empty, or nullopt: the calling thread's own blocks during
  // the job stand in, which also count page-cache reclaim and catalog round trips.
  std::function<std::optional<uint64_t>()> storage_waits;
  bool byte_shuffle = true;          // the per-type filter (false: benchmarks of the filter's gain)
  uint32_t threads = 1;
  std::optional<SnapshotModelInfo> model;
  std::string source_name;           // recorded as its basename
  SourceClaims writer;               // recorded in the provenance; also settles "unknown-era" rotation
  std::optional<LossyConversion> lossy;
  std::string created;               // ISO-8601 UTC; empty: now (set it for reproducible output)
  std::string kvsnap_version = kKvsnapLibraryVersion;
  std::optional<SnapshotLabels> labels;  // written as INFO.labels (SnapshotLabels)
  // Chunks the sink already holds (a store: the parent snapshot's, by hash,
  // with the encoding recorded for them). A chunk whose raw bytes hash to one
  // of these is not encoded: the sink gets the known ref (index and raw size
  // of this chunk) and an empty blob. Read-only while building.
  // Known chunks that carry an xxh are found by it first: a chunk of the same
  // size and chunk_xxh takes the known SHA-256 without hashing it (what makes
  // saving an extension cost in proportion to its new chunks).
  const std::map<Sha256Digest, ChunkRef>* known_chunks = nullptr;
  // The segment table of the snapshot this one extends (a store: the parent's). Each tensor
  // segment with the parent's place and geometry continues the parent's cell grid: its cells
  // restart where the parent's ended (Segment::cell_restarts), so every chunk of the parent's is
  // one of this snapshot's, and only the new cells make new chunks (an extension stores in
  // proportion to its new tokens, not to the partial last chunk of every layer). Such a manifest
  // is format version 4. Not for write_snapshot_file, which writes its version first.
  const SegmentTable* parent_grid = nullptr;
  // Encrypts: chunk ids are cipher->chunk_id (known_chunks must hold ids of the same tenant),
  // every blob is sealed after it is encoded, and the manifest records CRYP. Must outlive the build.
  const ChunkCipher* cipher = nullptr;
};

// Reads `original` (described by `parsed`, from parse_state on it) once for
// the chunks, hashes it whole from those bytes (re-reading only what lies
// between row-major chunks), hands every blob to `chunks`, and returns the
// manifest with its encoded bytes.
Result<SnapshotManifest> build_snapshot(const StateFile& parsed, const ReadableFile& original,
                                        const SnapshotOptions& opts, ChunkSink& chunks);

// The standalone .kvsnap file: preamble, blobs, manifest, trailer; streamed
// to `out` (use AtomicFileWriter for files). Returns the manifest. With opts.cipher the file
// form is version 2: the manifest is sealed too, so the file shows no tokens or metadata.
Result<SnapshotManifest> write_snapshot_file(const StateFile& parsed, const ReadableFile& original,
                                             const SnapshotOptions& opts, ByteSink& out);

// A standalone file assembled from a manifest and blobs fetched elsewhere (a
// store's export). A store may hold another encoding of some raw bytes than
// the manifest recorded (another zstd level from another save), so plan()
// fetches every blob once and rewrites the chunk table with the blobs' actual
// sizes and encodings: the file's manifest may differ from `m.bytes` but
// describes the same chunks and the same original. write() fetches the blobs
// again (bounded memory) and refuses a blob that changed in between.
class ChunkSource;
//
// An encrypted manifest (CRYP) needs its tenant's `cipher`: the blobs are copied sealed as they
// are, the rewritten manifest is sealed again (the file form of an encrypted snapshot).
class SnapshotFileAssembler {
 public:
  static Result<SnapshotFileAssembler> plan(const SnapshotManifest& m, ChunkSource& blobs,
                                            const ChunkCipher* cipher = nullptr);
  uint64_t file_size() const;
  Status write(ChunkSource& blobs, ByteSink& out) const;
  const SnapshotManifest& manifest() const { return m_; }

 private:
  SnapshotManifest m_;
  std::vector<std::byte> sealed_manifest_;  // encrypted: what the file holds instead of m_.bytes
  uint64_t blob_bytes_ = 0;
};

// --- Reading ---------------------------------------------------------------------

// Fetches a blob by its reference (a store: by ref.sha256; a file: by ref.index).
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  virtual Result<std::vector<std::byte>> get(const ChunkRef& ref) = 0;
  // The same into `out` (resized; a source may reuse its capacity and skip
  // the zero-fill of a fresh vector): the hot path of a restore.
  virtual Status get_into(const ChunkRef& ref, std::vector<std::byte>& out) {
    KV_ASSIGN_OR_RETURN(out, get(ref));
    return Status::OK();
  }
};

// Chunk blobs by id in memory, as a store keeps them (tests, benchmarks): the first blob put
// for an id is kept; the empty blob of a known chunk is not stored.
class MemoryChunkStore final : public ChunkSink, public ChunkSource {
 public:
  Status put(const ChunkRef& ref, std::span<const std::byte> blob) override {
    if (!blob.empty()) blobs.try_emplace(ref.sha256, blob.begin(), blob.end());
    return Status::OK();
  }
  Result<std::vector<std::byte>> get(const ChunkRef& ref) override {
    auto it = blobs.find(ref.sha256);
    if (it == blobs.end()) return Status::NotFound("no blob for chunk " + to_hex(ref.sha256));
    return it->second;
  }
  std::map<Sha256Digest, std::vector<std::byte>> blobs;
};

struct SnapshotReadOptions {
  uint64_t cache_bytes = uint64_t(64) << 20;  // decoded chunks kept (at least one chunk is)
  // The tenant's cipher for an encrypted snapshot (must outlive the reader). Opening checks its
  // key ids against CRYP (kMismatch naming both). Without it the snapshot opens, but every chunk
  // read fails naming the key it needs; verify_sealed_chunks() checks what it can. Not used for
  // a snapshot without CRYP.
  const ChunkCipher* cipher = nullptr;
};

class SnapshotReader {
 public:
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  const SnapshotManifest& manifest() const;
  const nlohmann::ordered_json& info() const { return manifest().info; }
  const SnapshotProvenance& provenance() const { return manifest().provenance; }
  const std::vector<CellSection>& cells() const { return manifest().cells; }
  const SnapshotTokens& tokens() const { return manifest().tokens; }
  const SegmentTable& segments() const { return manifest().segments; }
  const std::vector<ChunkRef>& chunks() const { return manifest().chunks; }

  // The original llama.cpp file, byte for byte (lives as long as the reader).
  const ReadableFile& original() const;
  // How to parse original() exactly as it was parsed when the snapshot was
  // built (raw buffer kind and era, and the memory layout as a MemoryShape),
  // without the model. The options point into this reader.
  ParseOptions parse_options() const;
  Result<StateFile> parse_original() const;

  // Fetches, decodes and hashes every chunk; the first bad one is reported by
  // index and what it covers.
  Status verify_chunks() const;
  // Recomputes the content digest of original() by the manifest's rule (version 1: its SHA-256;
  // version 3: every chunk's id read back from original() at the place the segment table gives
  // it, so bytes put in the wrong place fail even when every chunk decodes right) and compares
  // it with DIGS. An encrypted version-3 snapshot needs its cipher (keyed chunk ids).
  Status verify_original() const;
  // kCorruption unless the manifest's cell metadata and token list (CELL, TOKN: outside the content
  // digest) are those of `parsed`, this snapshot's parse_original(): what a catalog, a prefix
  // lookup or a reuse check reads must be what a restore writes.
  Status verify_metadata(const StateFile& parsed) const;
  // An encrypted snapshot without its key: fetches every blob and checks what needs no key (the
  // sealed header, that the recorded key ids sealed it, its size against the chunk table). Not
  // the contents: a flipped ciphertext byte passes here and fails verify_chunks() with the key.
  Status verify_sealed_chunks() const;
  bool encrypted() const { return manifest().encryption.has_value(); }

  // Chunk indices needed to read cells [0, n_cells) of every KV stream, and
  // every frame chunk (headers, cell metadata, tokens), ascending: what a store
  // prefetches for a token prefix.
  std::vector<uint64_t> chunks_for_cell_prefix(uint64_t n_cells) const;
  // File offsets that cut original() into blocks of about `target` bytes for
  // a parallel copy (ascending, from 0 to the file size): never inside a
  // row-major chunk nor inside a band of transposed tiles, so each chunk is
  // read by one copier, straight into its block (no shared cache, no chunk
  // decoded twice). A block exceeds `target` only to hold one chunk or band.
  std::vector<uint64_t> block_bounds(uint64_t target) const;
  // Cells of a tensor that original() reads best at once: as many of its chunks as a read decodes
  // and checks together (their SHA-256s in one kernel's lanes: 2 or 4 with SHA-NI, 8 with AVX2,
  // 1 for keyed ids) times their cells; 0 when its row tensors' chunks differ in cells or it has
  // none. A conversion's blocks take it (ConvertRequest::source_read_cells).
  uint64_t read_cells() const;
  // The cells of each of original()'s row tensors' chunks; 0 when they differ, when it has none, or
  // after an extension's cell restart (GRID), where chunks no longer start at multiples of it.
  uint64_t chunk_cells() const;
  // "chunk 12 (layer 3 V of KV section 0 stream 0, cells 256..511, rows 0..127)".
  std::string describe_chunk(uint64_t index) const;

  // Chunk `index`'s blob exactly as stored (not decoded; checked against the
  // chunk's hash only when decoded): what a store copies on import.
  Result<std::vector<std::byte>> blob(uint64_t index) const;

  // Decoded-chunk cache statistics (for tests and benchmarks).
  struct CacheStats {
    uint64_t hits = 0, misses = 0, bytes = 0, peak_bytes = 0;
  };
  CacheStats cache_stats() const;

  struct Impl;

 private:
  explicit SnapshotReader(std::unique_ptr<Impl> impl);
  friend Result<std::unique_ptr<SnapshotReader>> open_snapshot_file(const ReadableFile&, const SnapshotReadOptions&);
  friend Result<std::unique_ptr<SnapshotReader>> open_snapshot(std::span<const std::byte>, ChunkSource&,
                                                               const SnapshotReadOptions&);
  std::unique_ptr<Impl> impl_;
};

// Whether `head` (a file's first bytes, at least kSnapshotMagicBytes of them) starts as a
// standalone .kvsnap file does: its magic only, nothing else checked.
inline constexpr size_t kSnapshotMagicBytes = 8;
bool starts_like_snapshot_file(std::span<const std::byte> head);

// A standalone file; `file` must outlive the reader. Checks the preamble,
// trailer (truncation), the manifest's hash and the manifest itself. An encrypted file (version
// 2) needs opts.cipher to open its sealed manifest; without it, after the structure, digest and
// sealed header are checked, the error names the key it needs.
Result<std::unique_ptr<SnapshotReader>> open_snapshot_file(const ReadableFile& file,
                                                           const SnapshotReadOptions& opts = {});
// Manifest bytes from a store (copied) and its chunk source (must outlive the reader).
Result<std::unique_ptr<SnapshotReader>> open_snapshot(std::span<const std::byte> manifest_bytes, ChunkSource& chunks,
                                                      const SnapshotReadOptions& opts = {});

}  // namespace kvsnap
