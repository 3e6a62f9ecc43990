// Chunk blobs of the kvsnap snapshot format: how one chunk of raw bytes is
// filtered, compressed, and made self-describing (docs/format.md, "Chunk blobs").
//
// A chunk's identity is the SHA-256 of its RAW bytes, so the same content
// dedups whatever the level or filter that encoded it. The stored blob is a
// 16-byte header (magic, codec, filter, element size, raw size) followed by the
// payload, so a blob decodes with nothing but itself; the caller then checks
// the decoded bytes against the hash it asked for.
//
// Encoding: raw -> filter -> zstd. The byte-shuffle filter of element size E
// regroups byte k of every element into plane k; the encoder then compresses
// each plane as its own zstd frame, so each plane gets its own entropy tables
// (the f16 high byte of sign+exponent compresses, the low mantissa byte does
// not). The payload is any sequence of zstd frames whose concatenated output
// is the filtered bytes: a decoder need not know how the encoder split them.
// When compression does not pay, the raw bytes are stored as they are.
//
// Memory: an encoder or decoder holds one zstd context and scratch buffers of
// about one chunk; make one per thread and reuse it (contexts are costly to
// create). Nothing is sized by a blob before its header passed the bounds
// below.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "base/status.h"
#include "format/byte_shuffle.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace kvsnap {

// --- Blob header ----------------------------------------------------------------
enum class ChunkCodec : uint8_t {
  kStored = 0,  // payload = the filtered bytes
  kZstd = 1,    // payload = zstd frames; their concatenated output = the filtered bytes
};
enum class ChunkFilter : uint8_t {
  kNone = 0,
  kShuffle = 1,  // byte planes of elements of elem_size bytes, then the tail unchanged
};
const char* codec_name(ChunkCodec c);
const char* filter_name(ChunkFilter f);

inline constexpr std::array<uint8_t, 4> kBlobMagic = {'K', 'V', 'C', 'B'};
inline constexpr size_t kBlobHeaderBytes = 16;
// No chunk's raw bytes exceed this (the writer sizes chunks under it; a reader
// refuses larger claims before allocating).
inline constexpr uint64_t kMaxChunkRawBytes = uint64_t(16) << 20;
inline constexpr uint16_t kMaxShuffleElem = 1024;

struct BlobHeader {
  ChunkCodec codec = ChunkCodec::kStored;
  ChunkFilter filter = ChunkFilter::kNone;
  uint16_t elem_size = 0;
  uint64_t raw_size = 0;
};
// Checks magic, known codec and filter, element size and raw size bounds.
Result<BlobHeader> read_blob_header(std::span<const std::byte> blob);

// The filter for a tensor of this ggml type: shuffle with E = 2 for f16/bf16
// and 4 for f32; none for quantized types (measured: shuffling q8_0 blocks by
// their 34 bytes compresses worse than leaving them, docs/format.md).
struct FilterChoice {
  ChunkFilter filter = ChunkFilter::kNone;
  uint16_t elem_size = 0;
};
FilterChoice filter_for_type(int32_t ggml_type);

// The filter itself: shuffle_bytes, unshuffle_bytes, unshuffle_planes (format/byte_shuffle.h).

// --- Equality digest ----------------------------------------------------------------
// XXH3-128 of a chunk's raw bytes: not a chunk's identity (that is its SHA-256)
// but a cheap check that two chunks hold the same bytes, at memory speed
// (docs/store.md, "Speed and space": an extension's save finds the parent's
// chunks by it without SHA-256 over them). Not collision-resistant against
// someone crafting bytes: a manifest records it beside the SHA-256, every
// decode checks both, and it never decides which blob a new chunk is stored as.
using ChunkXxh = std::array<uint8_t, 16>;
ChunkXxh chunk_xxh(std::span<const std::byte> raw);
// The same digest over bytes given piece by piece (finish() starts over). Both hash with
// xxhash's AVX2 loop at the avx2 and avx512 levels (chunk_xxh_avx2.h), else with libxxhash;
// a hasher keeps the one of the level at its construction.
struct Xxh3Impl;  // chunk_codec.cc
class ChunkXxhHasher {
 public:
  ChunkXxhHasher();
  ~ChunkXxhHasher();
  ChunkXxhHasher(const ChunkXxhHasher&) = delete;
  ChunkXxhHasher& operator=(const ChunkXxhHasher&) = delete;
  void update(std::span<const std::byte> bytes);
  ChunkXxh finish();
  // Whether it hashes with the implementation the SIMD level picks now (the level can change
  // within a process: a bench's --simd all; a hasher kept from before hashes as its level did).
  bool follows_level() const;

 private:
  const Xxh3Impl* impl_;  // libxxhash's XXH3 or chunk_xxh_avx2's
  void* state_;           // its XXH3_state_t
};

// --- Encoder / decoder (one per thread) -------------------------------------------
class ChunkEncoder {
 public:
  // compress false: every chunk is stored as it is (no filter, no zstd), a save's cheapest
  // encoding (docs/store.md, "Speed and space": when the save's CPU, not the disk, is the limit).
  explicit ChunkEncoder(int zstd_level = 3, bool compress = true);
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // Encodes `raw` (at most kMaxChunkRawBytes) into a blob. The span points into
  // this encoder's buffer and stays valid until the next call.
  Result<std::span<const std::byte>> encode(std::span<const std::byte> raw, FilterChoice filter);
  // The same, written into the first N bytes of `blob` (grown when too small,
  // never shrunk, so a reused buffer costs no allocation or zero-fill); returns
  // N. For a blob kept a while: no copy out of this encoder's buffer.
  Result<size_t> encode_into(std::span<const std::byte> raw, FilterChoice filter, std::vector<std::byte>& blob);
  // Whether the next chunks are compressed (a save's adaptive level switches it per job).
  void set_compress(bool compress) { compress_ = compress; }

 private:
  ZSTD_CCtx_s* cctx_;
  int level_;
  bool compress_;
  std::vector<std::byte> filtered_;
  std::vector<std::byte> out_;
};

class ChunkDecoder {
 public:
  ChunkDecoder();
  ~ChunkDecoder();
  ChunkDecoder(const ChunkDecoder&) = delete;
  ChunkDecoder& operator=(const ChunkDecoder&) = delete;

  // Decodes `blob` into `out` (resized to the raw size). kCorruption when the
  // header is bad, the raw size is not `expect_raw_size`, or the payload does
  // not decode to exactly that many bytes. The caller checks the hash.
  Status decode(std::span<const std::byte> blob, uint64_t expect_raw_size, std::vector<std::byte>& out);
  // The same into `out`, whose size is the expected raw size (no allocation
  // when the blob needs no filter: a restore decodes straight into its output).
  Status decode_into(std::span<const std::byte> blob, std::span<std::byte> out);
  // The same, handing `on_piece` the pieces of `out` in order (together all of it) as they
  // are written, each of at most kDecodePieceBytes when the blob is shuffled: the caller
  // hashes a piece while it is still in cache instead of reading the whole chunk back from
  // memory. The raw (stored) frames of a shuffled payload are unshuffled straight from the
  // blob, not copied out first. On error `out` holds garbage and the pieces seen were too.
  using PieceFn = std::function<void(std::span<const std::byte>)>;
  Status decode_into(std::span<const std::byte> blob, std::span<std::byte> out, const PieceFn& on_piece);

 private:
  // A run of the filtered bytes: in the blob (a raw zstd frame's block) or decoded.
  struct Run {
    uint64_t at;  // offset in the filtered bytes
    const std::byte* data;
    size_t size;
  };
  Status collect_runs(std::span<const std::byte> payload, const BlobHeader& h, std::span<std::byte> decoded);
  // The filtered bytes at `at`: a pointer and how many follow contiguously.
  std::pair<const std::byte*, size_t> filtered_at(uint64_t at) const;

  ZSTD_DCtx_s* dctx_;
  std::vector<std::byte> filtered_;
  std::vector<Run> runs_;
  std::vector<const std::byte*> planes_;
};

// Output pieces of a shuffled chunk's decode (ChunkDecoder::decode_into): small enough to be
// in L1/L2 cache when the caller hashes them.
inline constexpr size_t kDecodePieceBytes = 64 << 10;

}  // namespace kvsnap
