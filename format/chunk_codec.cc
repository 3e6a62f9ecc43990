#include "format/chunk_codec.h"

// For ZSTD_c_literalCompressionMode (zstd >= 1.4.5; a parameter, no static-only symbol).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "base/byte_order.h"
#include "base/simd_level.h"
#include "format/byte_shuffle.h"
#include "format/chunk_xxh_avx2.h"
#include "format/ggml_types.h"

namespace kvsnap {


// --- Header -------------------------------------------------------------------------

const char* codec_name(ChunkCodec c) {
  switch (c) {
    case ChunkCodec::kStored: return "stored";
    case ChunkCodec::kZstd: return "zstd";
  }
  return "?";
}

const char* filter_name(ChunkFilter f) {
  switch (f) {
    case ChunkFilter::kNone: return "none";
    case ChunkFilter::kShuffle: return "shuffle";
  }
  return "?";
}

namespace {

void store_header(std::byte* p, const BlobHeader& h) {
  for (size_t i = 0; i < 4; ++i) p[i] = std::byte(kBlobMagic[i]);
  p[4] = std::byte(uint8_t(h.codec));
  p[5] = std::byte(uint8_t(h.filter));
  store_le(p + 6, h.elem_size, 2);
  store_le(p + 8, h.raw_size, 8);
}

}  // namespace

Result<BlobHeader> read_blob_header(std::span<const std::byte> blob) {
  if (blob.size() < kBlobHeaderBytes) {
    return Status::Corruption("chunk blob: " + std::to_string(blob.size()) + " bytes is shorter than its " +
                              std::to_string(kBlobHeaderBytes) + "-byte header");
  }
  for (size_t i = 0; i < 4; ++i) {
    if (blob[i] != std::byte(kBlobMagic[i])) return Status::Corruption("chunk blob: bad magic (not a kvsnap chunk)");
  }
  BlobHeader h;
  const uint8_t codec = uint8_t(blob[4]), filter = uint8_t(blob[5]);
  if (codec > uint8_t(ChunkCodec::kZstd)) {
    return Status::NotSupported("chunk blob: unknown codec " + std::to_string(codec) + " (this kvsnap knows 0 stored, 1 zstd)");
  }
  if (filter > uint8_t(ChunkFilter::kShuffle)) {
    return Status::NotSupported("chunk blob: unknown filter " + std::to_string(filter) +
                                " (this kvsnap knows 0 none, 1 shuffle)");
  }
  h.codec = ChunkCodec(codec);
  h.filter = ChunkFilter(filter);
  h.elem_size = load_le<uint16_t>(blob.data() + 6);
  h.raw_size = load_le<uint64_t>(blob.data() + 8);
  if (h.filter == ChunkFilter::kShuffle && (h.elem_size < 2 || h.elem_size > kMaxShuffleElem)) {
    return Status::Corruption("chunk blob: shuffle element size " + std::to_string(h.elem_size) + " is out of range (2.." +
                              std::to_string(kMaxShuffleElem) + ")");
  }
  if (h.filter == ChunkFilter::kNone && h.elem_size != 0) {
    return Status::Corruption("chunk blob: element size " + std::to_string(h.elem_size) + " without a filter");
  }
  if (h.raw_size > kMaxChunkRawBytes) {
    return Status::Corruption("chunk blob: raw size " + std::to_string(h.raw_size) + " exceeds the " +
                              std::to_string(kMaxChunkRawBytes) + "-byte chunk limit");
  }
  return h;
}

FilterChoice filter_for_type(int32_t ggml_type) {
  // The float KV cache types (f32, f16, bf16): byte planes of their element size.
  const TypeLayout* t = find_type(ggml_type);
  if (t && t->kind == TypeKind::kFloat) return {ChunkFilter::kShuffle, static_cast<uint16_t>(t->block_bytes)};
  return {ChunkFilter::kNone, 0};
}

namespace {

ChunkXxh canonical(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  ChunkXxh d{};
  std::memcpy(d.data(), c.digest, d.size());
  return d;
}

}  // namespace

struct Xxh3Impl {
  XXH128_hash_t (*hash)(const void* data, size_t n);
  void* (*new_state)();
  void (*free_state)(void* state);
  void (*reset)(void* state);
  void (*update)(void* state, const void* data, size_t n);
  XXH128_hash_t (*digest)(const void* state);
};

namespace {

// libxxhash's XXH3-128 and, in x86-64 builds, xxhash's AVX2 loop (chunk_xxh_avx2.h).
const Xxh3Impl kLibXxh3 = {
    [](const void* p, size_t n) { return XXH3_128bits(p, n); },
    [] { return static_cast<void*>(XXH3_createState()); },
    [](void* st) { XXH3_freeState(static_cast<XXH3_state_t*>(st)); },
    [](void* st) { XXH3_128bits_reset(static_cast<XXH3_state_t*>(st)); },
    [](void* st, const void* p, size_t n) { XXH3_128bits_update(static_cast<XXH3_state_t*>(st), p, n); },
    [](const void* st) { return XXH3_128bits_digest(static_cast<const XXH3_state_t*>(st)); },
};
#ifdef KVSNAP_SIMD_X86
XXH128_hash_t from_avx2(xxh3_avx2::Digest128 d) { return {d.low64, d.high64}; }
const Xxh3Impl kAvx2Xxh3 = {
    [](const void* p, size_t n) { return from_avx2(xxh3_avx2::hash128(p, n)); },
    xxh3_avx2::new_state,
    xxh3_avx2::free_state,
    xxh3_avx2::reset,
    xxh3_avx2::update,
    [](const void* st) { return from_avx2(xxh3_avx2::digest(st)); },
};
#endif

// AVX2's at the avx2 and avx512 levels, else the library's.
const Xxh3Impl& xxh3() {
#ifdef KVSNAP_SIMD_X86
  if (simd::level() != simd::Level::kScalar) return kAvx2Xxh3;
#endif
  return kLibXxh3;
}

}  // namespace

ChunkXxh chunk_xxh(std::span<const std::byte> raw) { return canonical(xxh3().hash(raw.data(), raw.size())); }

ChunkXxhHasher::ChunkXxhHasher() : impl_(&xxh3()), state_(impl_->new_state()) {
  if (!state_) throw std::bad_alloc();
  impl_->reset(state_);
}
ChunkXxhHasher::~ChunkXxhHasher() { impl_->free_state(state_); }
bool ChunkXxhHasher::follows_level() const { return impl_ == &xxh3(); }

void ChunkXxhHasher::update(std::span<const std::byte> bytes) { impl_->update(state_, bytes.data(), bytes.size()); }

ChunkXxh ChunkXxhHasher::finish() {
  const ChunkXxh d = canonical(impl_->digest(state_));
  impl_->reset(state_);
  return d;
}

// --- Encoder ----------------------------------------------------------------------

namespace {

// A plane is compressed only when it saves at least 10% (measured on the real slots of
// docs/store.md "Speed and space": the f16 exponent plane saves ~33%, the low-mantissa plane
// ~3%, a q8_0 chunk ~6% at ~1 s/GB of encode and a decode at ~1.5 GB/s instead of memcpy's
// speed: not worth a save's time). A sample's order-0 entropy decides a plane that clearly
// compresses (no zstd probe, whose output would be thrown away); any other plane is probed
// with zstd on the sample, which also sees repeats the entropy misses.
constexpr size_t kProbeBytes = 16 << 10;
constexpr double kWorthCompressing = 0.90;

// Order-0 entropy of `p` in bits per byte: what a Huffman coder of its bytes can reach.
double entropy_bits(std::span<const std::byte> p) {
  uint32_t h[4][256] = {};  // four tables: no store-to-load stall on runs of one byte
  size_t i = 0;
  for (; i + 4 <= p.size(); i += 4) {
    ++h[0][uint8_t(p[i])];
    ++h[1][uint8_t(p[i + 1])];
    ++h[2][uint8_t(p[i + 2])];
    ++h[3][uint8_t(p[i + 3])];
  }
  for (; i < p.size(); ++i) ++h[0][uint8_t(p[i])];
  double bits = 0;
  for (int c = 0; c < 256; ++c) {
    const double n = double(h[0][c] + h[1][c] + h[2][c] + h[3][c]);
    if (n > 0) bits -= n * std::log2(n / double(p.size()));
  }
  return bits / double(p.size());
}

// A zstd frame of raw blocks (RFC 8878: single segment, 4-byte content size, no checksum)
// holding n bytes: any zstd decoder reads it, at memcpy speed. Its blocks hold kRawBlockBytes
// each (the last one the rest; one empty block for n = 0), each after a 3-byte block header.
constexpr size_t kRawBlockBytes = 128 << 10;
constexpr size_t kRawFrameHeaderBytes = 9;

// Where the bytes from `at` (a multiple of kRawBlockBytes) go, from the frame's start.
size_t raw_block_offset(size_t at) { return kRawFrameHeaderBytes + (at / kRawBlockBytes) * (kRawBlockBytes + 3) + 3; }

// Writes the frame's header and every block header for n bytes at dst; returns the frame's
// size (the blocks' bytes are the caller's to write, at raw_block_offset).
size_t put_raw_frame_header(size_t n, std::byte* dst) {
  store_le(dst, 0xFD2FB528u, 4);
  dst[4] = std::byte{0xA0};  // Single_Segment_flag, Frame_Content_Size_flag 2 (4 bytes)
  store_le(dst + 5, n, 4);
  size_t at = 0;
  do {
    const size_t m = std::min(kRawBlockBytes, n - at);
    const bool last = at + m == n;
    store_le(dst + raw_block_offset(at) - 3, uint64_t(last) | (uint64_t(m) << 3), 3);  // Block_Type 0: raw
    at += m;
  } while (at < n);
  const size_t blocks = std::max<size_t>(1, (n + kRawBlockBytes - 1) / kRawBlockBytes);
  return kRawFrameHeaderBytes + 3 * blocks + n;
}

// `src` as one such frame at dst; returns its size.
size_t put_raw_frame(std::span<const std::byte> src, std::byte* dst) {
  const size_t size = put_raw_frame_header(src.size(), dst);
  for (size_t at = 0; at < src.size(); at += kRawBlockBytes)
    std::memcpy(dst + raw_block_offset(at), src.data() + at, std::min(kRawBlockBytes, src.size() - at));
  return size;
}

// `raw` as a stored blob into `out` (of kBlobHeaderBytes + raw.size() bytes at least).
size_t put_stored(std::span<const std::byte> raw, std::vector<std::byte>& out) {
  store_header(out.data(), BlobHeader{ChunkCodec::kStored, ChunkFilter::kNone, 0, raw.size()});
  if (!raw.empty()) std::memcpy(out.data() + kBlobHeaderBytes, raw.data(), raw.size());
  return kBlobHeaderBytes + raw.size();
}

size_t raw_frame_bound(size_t n) { return kRawFrameHeaderBytes + 3 * (n / kRawBlockBytes + 1) + n; }

}  // namespace

ChunkEncoder::ChunkEncoder(int zstd_level, bool compress)
    : cctx_(ZSTD_createCCtx()), level_(zstd_level), compress_(compress) {
  if (!cctx_) throw std::bad_alloc();
}
ChunkEncoder::~ChunkEncoder() { ZSTD_freeCCtx(cctx_); }

Result<std::span<const std::byte>> ChunkEncoder::encode(std::span<const std::byte> raw, FilterChoice filter) {
  KV_ASSIGN_OR_RETURN(size_t n, encode_into(raw, filter, out_));
  return std::span<const std::byte>(out_.data(), n);
}

Result<size_t> ChunkEncoder::encode_into(std::span<const std::byte> raw, FilterChoice filter, std::vector<std::byte>& out) {
  if (raw.size() > kMaxChunkRawBytes) {
    return Status::InvalidArgument("chunk of " + std::to_string(raw.size()) + " bytes exceeds the " +
                                   std::to_string(kMaxChunkRawBytes) + "-byte chunk limit");
  }
  if (filter.filter == ChunkFilter::kShuffle && (filter.elem_size < 2 || filter.elem_size > kMaxShuffleElem)) {
    return Status::InvalidArgument("shuffle element size " + std::to_string(filter.elem_size) + " is out of range");
  }
  if (!compress_) {
    out.resize(std::max(out.size(), kBlobHeaderBytes + raw.size()));
    return put_stored(raw, out);
  }
  if (filter.filter == ChunkFilter::kNone) filter.elem_size = 0;
  if (filter.filter == ChunkFilter::kShuffle && raw.size() < filter.elem_size) filter = {ChunkFilter::kNone, 0};
  const size_t elem = filter.filter == ChunkFilter::kShuffle ? filter.elem_size : 1;
  const size_t n = raw.size() / elem;  // each plane's bytes (all of them: one plane, unfiltered)
  const size_t tail = raw.size() - n * elem;
  size_t bound = kBlobHeaderBytes + ZSTD_compressBound(tail);
  for (size_t b = 0; b < elem; ++b) bound += std::max(ZSTD_compressBound(n), raw_frame_bound(n));
  // Grown only, never shrunk: a reused buffer is not zero-filled again.
  out.resize(std::max({out.size(), bound, kBlobHeaderBytes + raw.size()}));
  // filtered_: the planes (where they are not written straight into `out`), then each plane's
  // sample and the probe's output.
  const size_t sample_n = std::min(n, kProbeBytes);
  const size_t scratch = raw.size() + elem * sample_n, probe_cap = ZSTD_compressBound(kProbeBytes);
  if (filtered_.size() < scratch + probe_cap) filtered_.resize(scratch + probe_cap);

  size_t ret = ZSTD_CCtx_reset(cctx_, ZSTD_reset_session_and_parameters);
  if (!ZSTD_isError(ret)) ret = ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level_);
  if (!ZSTD_isError(ret) && level_ < 0) {
    // zstd's negative (fast) levels also store literals raw, which loses most of what the
    // f16 exponent plane gains (1.57x -> 1.04x on the bench slot's at -10); keep Huffman
    // literals: they are the gain, the match finder is the time. Matches of 7 bytes at
    // least: this data has few repeats, and shorter ones cost more time than they save
    // (measured, kvsnap-codec-bench --slot: docs/store.md "Speed and space").
    ret = ZSTD_CCtx_setParameter(cctx_, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
    if (!ZSTD_isError(ret)) ret = ZSTD_CCtx_setParameter(cctx_, ZSTD_c_minMatch, 7);
  }
  if (ZSTD_isError(ret)) return Status::InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(ret));

  // Which planes are stored raw, decided on a sample of each (its first kProbeBytes).
  std::array<bool, kMaxShuffleElem> stored_raw{};
  if (n > 2 * kProbeBytes) {
    std::array<std::byte*, kMaxShuffleElem> samples{};
    for (size_t b = 0; b < elem; ++b) samples[b] = filtered_.data() + raw.size() + b * sample_n;
    shuffle_planes(raw.data(), elem, sample_n, samples.data());
    for (size_t b = 0; b < elem; ++b) {
      const std::span<const std::byte> sample(samples[b], sample_n);
      if (entropy_bits(sample) <= 8 * kWorthCompressing) continue;
      ret = ZSTD_compress2(cctx_, filtered_.data() + scratch, probe_cap, sample.data(), sample.size());
      if (ZSTD_isError(ret)) return Status::InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(ret));
      stored_raw[b] = double(ret) > kWorthCompressing * double(sample.size());
    }
  }
  // The planes before the first compressed one are written straight into their raw frames in
  // `out` (no copy of them afterwards); the others into filtered_. Piece by piece, a raw
  // block's bytes at a time.
  size_t lead = 0;
  while (lead < elem && stored_raw[lead]) ++lead;
  if (lead == elem && tail == 0) return put_stored(raw, out);  // raw frames would only add their headers
  size_t pos = kBlobHeaderBytes;
  std::array<size_t, kMaxShuffleElem> frame_at{};
  for (size_t b = 0; b < lead; ++b) {
    frame_at[b] = pos;
    pos += put_raw_frame_header(n, out.data() + pos);
  }
  if (elem > 1 || lead > 0) {
    std::array<std::byte*, kMaxShuffleElem> dst{};
    for (size_t at = 0; at < n || at == 0; at += kRawBlockBytes) {
      const size_t m = std::min(kRawBlockBytes, n - at);
      for (size_t b = 0; b < elem; ++b)
        dst[b] = b < lead ? out.data() + frame_at[b] + raw_block_offset(at) : filtered_.data() + b * n + at;
      shuffle_planes(raw.data() + at * elem, elem, m, dst.data());
      if (m == 0) break;
    }
    if (tail) std::memcpy(filtered_.data() + n * elem, raw.data() + n * elem, tail);
  }
  const std::byte* planes = elem > 1 || lead > 0 ? filtered_.data() : raw.data();
  for (size_t b = lead; b < elem || (b == elem && tail); ++b) {
    const std::span<const std::byte> p(planes + b * n, b < elem ? n : tail);
    if (b < elem && stored_raw[b]) {
      pos += put_raw_frame(p, out.data() + pos);
      continue;
    }
    ret = ZSTD_compress2(cctx_, out.data() + pos, out.size() - pos, p.data(), p.size());
    if (ZSTD_isError(ret)) return Status::InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(ret));
    pos += ret;
  }
  // Incompressible: store the raw bytes, which also decode at memcpy speed.
  if (pos - kBlobHeaderBytes >= raw.size()) return put_stored(raw, out);
  store_header(out.data(), BlobHeader{ChunkCodec::kZstd, filter.filter, filter.elem_size, raw.size()});
  return pos;
}

// --- Decoder ----------------------------------------------------------------------

ChunkDecoder::ChunkDecoder() : dctx_(ZSTD_createDCtx()) {
  if (!dctx_) throw std::bad_alloc();
}
ChunkDecoder::~ChunkDecoder() { ZSTD_freeDCtx(dctx_); }

Status ChunkDecoder::decode(std::span<const std::byte> blob, uint64_t expect_raw_size, std::vector<std::byte>& out) {
  KV_ASSIGN_OR_RETURN(BlobHeader h, read_blob_header(blob));
  if (h.raw_size != expect_raw_size) {
    return Status::Corruption("chunk blob: raw size " + std::to_string(h.raw_size) + ", expected " +
                              std::to_string(expect_raw_size));
  }
  out.resize(h.raw_size);
  return decode_into(blob, out);
}

Status ChunkDecoder::decode_into(std::span<const std::byte> blob, std::span<std::byte> out) {
  return decode_into(blob, out, [](std::span<const std::byte>) {});
}

namespace {

constexpr uint32_t kZstdMagic = 0xFD2FB528u;
constexpr size_t kZstdMaxBlock = 128 << 10;

// The blocks of `frame` (one whole zstd frame) when it holds only raw blocks in a single
// segment, with its content size, no dictionary and no checksum: what put_raw_frame writes
// for a plane that does not compress. `add(bytes)` gets each block's bytes, and only once
// all of them passed. False for any other frame (zstd decodes it, or says what is wrong).
template <class Add>
bool raw_frame_blocks(std::span<const std::byte> f, Add&& add) {
  if (f.size() < 6 || load_le(f.data(), 4) != kZstdMagic) return false;
  const uint8_t fhd = uint8_t(f[4]);
  const bool single = fhd & 0x20, reserved = fhd & 0x08, checksum = fhd & 0x04;
  if (!single || reserved || checksum || (fhd & 0x03)) return false;
  const size_t fcs_bytes = std::array<size_t, 4>{1, 2, 4, 8}[fhd >> 6];
  if (5 + fcs_bytes > f.size()) return false;
  const uint64_t content = load_le(f.data() + 5, fcs_bytes) + (fcs_bytes == 2 ? 256 : 0);
  const size_t first = 5 + fcs_bytes;
  for (int pass = 0; pass < 2; ++pass) {  // check every block, then hand them over
    size_t pos = first;
    uint64_t total = 0;
    for (bool last = false; !last;) {
      if (f.size() - pos < 3) return false;
      const uint32_t bh = uint32_t(load_le(f.data() + pos, 3));
      const size_t n = bh >> 3;
      last = bh & 1;
      pos += 3;
      if (((bh >> 1) & 3) != 0 || n > kZstdMaxBlock || n > f.size() - pos) return false;
      if (pass == 1 && n) add(f.subspan(pos, n));
      pos += n;
      total += n;
    }
    if (pos != f.size() || total != content) return false;
  }
  return true;
}

}  // namespace

Status ChunkDecoder::collect_runs(std::span<const std::byte> payload, const BlobHeader& h, std::span<std::byte> decoded) {
  runs_.clear();
  uint64_t at = 0;
  auto too_long = [&] {
    return Status::Corruption("chunk blob: payload decodes to more than the " + std::to_string(h.raw_size) +
                              " bytes expected");
  };
  if (h.codec == ChunkCodec::kStored) {
    if (payload.size() != h.raw_size) {
      return Status::Corruption("chunk blob: stored payload of " + std::to_string(payload.size()) + " bytes, expected " +
                                std::to_string(h.raw_size));
    }
    if (!payload.empty()) runs_.push_back({0, payload.data(), payload.size()});
    return Status::OK();
  }
  while (!payload.empty()) {
    // A skippable frame decodes to nothing and would carry up to 64 KiB of bytes no check sees
    // (stored_size's slack); no writer makes one.
    if (payload.size() >= 4 && (load_le<uint32_t>(payload.data()) & 0xFFFFFFF0u) == 0x184D2A50u)
      return Status::Corruption("chunk blob: a skippable zstd frame (kvsnap writes none)");
    const size_t fsize = ZSTD_findFrameCompressedSize(payload.data(), payload.size());
    if (ZSTD_isError(fsize)) return Status::Corruption(std::string("chunk blob: zstd: ") + ZSTD_getErrorName(fsize));
    const std::span<const std::byte> frame = payload.first(fsize);
    payload = payload.subspan(fsize);
    bool fits = true;
    const bool raw = raw_frame_blocks(frame, [&](std::span<const std::byte> b) {
      fits = fits && b.size() <= h.raw_size - at;
      if (!fits) return;
      runs_.push_back({at, b.data(), b.size()});
      at += b.size();
    });
    if (!fits) return too_long();
    if (raw) continue;
    // Decoded where its bytes go: straight into the output when nothing is to be unshuffled.
    const size_t n = ZSTD_decompressDCtx(dctx_, decoded.data() + at, h.raw_size - at, frame.data(), frame.size());
    if (ZSTD_isError(n)) {
      if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall) return too_long();
      return Status::Corruption(std::string("chunk blob: zstd: ") + ZSTD_getErrorName(n));
    }
    if (n) runs_.push_back({at, decoded.data() + at, n});
    at += n;
  }
  if (at != h.raw_size) {
    return Status::Corruption("chunk blob: payload decodes to " + std::to_string(at) + " bytes, expected " +
                              std::to_string(h.raw_size));
  }
  return Status::OK();
}

std::pair<const std::byte*, size_t> ChunkDecoder::filtered_at(uint64_t at) const {
  // The last run starting at or before `at` (runs are in order and cover every byte).
  auto it = std::upper_bound(runs_.begin(), runs_.end(), at, [](uint64_t a, const Run& r) { return a < r.at; });
  const Run& r = *std::prev(it);
  return {r.data + (at - r.at), r.size - size_t(at - r.at)};
}

Status ChunkDecoder::decode_into(std::span<const std::byte> blob, std::span<std::byte> out, const PieceFn& on_piece) {
  KV_ASSIGN_OR_RETURN(BlobHeader h, read_blob_header(blob));
  if (h.raw_size != out.size()) {
    return Status::Corruption("chunk blob: raw size " + std::to_string(h.raw_size) + ", expected " +
                              std::to_string(out.size()));
  }
  const bool shuffled = h.filter == ChunkFilter::kShuffle;
  std::span<std::byte> decoded(out);
  if (shuffled) {
    if (filtered_.size() < h.raw_size) filtered_.resize(h.raw_size);  // grown only: reused without a zero-fill
    decoded = std::span<std::byte>(filtered_.data(), h.raw_size);
  }
  KV_RETURN_IF_ERROR(collect_runs(blob.subspan(kBlobHeaderBytes), h, decoded));
  std::byte* dst = out.data();
  uint64_t done = 0;  // bytes of `out` written and handed over
  if (shuffled) {
    // Piece by piece: each plane's next bytes, interleaved into the next piece of `out`.
    const size_t elem = h.elem_size, n = h.raw_size / elem;
    planes_.resize(elem);
    for (size_t k = 0; k < n;) {
      size_t m = std::min(n - k, std::max<size_t>(1, kDecodePieceBytes / elem));
      for (size_t b = 0; b < elem; ++b) {
        const auto [p, avail] = filtered_at(b * n + k);
        planes_[b] = p;
        m = std::min(m, avail);
      }
      unshuffle_planes(planes_.data(), elem, m, dst + k * elem);
      on_piece(std::span<const std::byte>(dst + k * elem, m * elem));
      k += m;
    }
    done = n * elem;
  }
  // The rest as it is (all of an unfiltered chunk, the tail of a shuffled one), in pieces.
  while (done < h.raw_size) {
    const auto [p, avail] = filtered_at(done);
    const size_t m = std::min<uint64_t>({avail, h.raw_size - done, kDecodePieceBytes});
    if (p != dst + done) std::memcpy(dst + done, p, m);
    on_piece(std::span<const std::byte>(dst + done, m));
    done += m;
  }
  return Status::OK();
}

}  // namespace kvsnap
