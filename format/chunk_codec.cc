#include "format/chunk_codec.h"

// For ZSTD_c_literalCompressionMode (zstd >= 1.4.5; a parameter, no static-only symbol).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVSNAP_UNSHUFFLE_AVX2 1
#endif

#include "base/byte_order.h"
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

ChunkXxh chunk_xxh(std::span<const std::byte> raw) { return canonical(XXH3_128bits(raw.data(), raw.size())); }

ChunkXxhHasher::ChunkXxhHasher() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}
ChunkXxhHasher::~ChunkXxhHasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ChunkXxhHasher::update(std::span<const std::byte> bytes) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), bytes.data(), bytes.size());
}

ChunkXxh ChunkXxhHasher::finish() {
  auto* st = static_cast<XXH3_state_t*>(state_);
  const ChunkXxh d = canonical(XXH3_128bits_digest(st));
  XXH3_128bits_reset(st);
  return d;
}

// --- Shuffle ------------------------------------------------------------------------
// Elements are whole `elem`-byte groups; the tail (size % elem bytes) is copied
// as is after the planes.

void shuffle_bytes(std::span<const std::byte> in, size_t elem, std::span<std::byte> out) {
  const size_t n = in.size() / elem;
  const std::byte* src = in.data();
  std::byte* dst = out.data();
  size_t i = 0;
  if (elem == 2) {
#if defined(__SSE2__)
    // The hot path of encoding f16/bf16 chunks: split 16 elements into their
    // low and high bytes (measured: the scalar loop was ~15% of an encode).
    const __m128i low = _mm_set1_epi16(0x00FF);
    for (; i + 16 <= n; i += 16) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i + 16));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_packus_epi16(_mm_and_si128(a, low), _mm_and_si128(b, low)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + n + i),
                       _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
    }
#endif
    for (; i < n; ++i) {
      dst[i] = src[2 * i];
      dst[n + i] = src[2 * i + 1];
    }
  } else {
    for (size_t b = 0; b < elem; ++b) {
      std::byte* plane = dst + b * n;
      for (size_t i = 0; i < n; ++i) plane[i] = src[i * elem + b];
    }
  }
  if (in.size() > n * elem) std::memcpy(dst + n * elem, src + n * elem, in.size() - n * elem);
}

void unshuffle_bytes(std::span<const std::byte> in, size_t elem, std::span<std::byte> out) {
  const size_t n = in.size() / elem;
  std::vector<const std::byte*> planes(elem);
  for (size_t b = 0; b < elem; ++b) planes[b] = in.data() + b * n;
  unshuffle_planes(planes.data(), elem, n, out.data());
  if (in.size() > n * elem) std::memcpy(out.data() + n * elem, in.data() + n * elem, in.size() - n * elem);
}

namespace {

#if defined(KVSNAP_UNSHUFFLE_AVX2)
// Two planes interleaved 32 elements at a time; returns how many elements it did. Measured
// 1.7-2x the SSE2 loop on pieces in cache (the unshuffle was ~6% of a decode's CPU). format/
// sits below migrate/'s SIMD level table, so it asks the CPU itself.
__attribute__((target("avx2"))) size_t unshuffle2_avx2(const std::byte* p0, const std::byte* p1, size_t m,
                                                        std::byte* dst) {
  size_t i = 0;
  for (; i + 32 <= m; i += 32) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + i));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1 + i));
    // unpack works within 128-bit lanes: a = elements 0-7 | 16-23, b = 8-15 | 24-31.
    const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i + 32), _mm256_permute2x128_si256(a, b, 0x31));
  }
  return i;
}

bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

}  // namespace

void unshuffle_planes(const std::byte* const* planes, size_t elem, size_t m, std::byte* dst) {
  size_t i = 0;
  if (elem == 2) {
    const std::byte *p0 = planes[0], *p1 = planes[1];
#if defined(KVSNAP_UNSHUFFLE_AVX2)
    if (cpu_has_avx2()) i = unshuffle2_avx2(p0, p1, m, dst);
#endif
#if defined(__SSE2__)
    // The hot path of decoding f16/bf16 chunks: interleave two planes.
    for (; i + 16 <= m; i += 16) {
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), _mm_unpacklo_epi8(lo, hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
    }
#endif
    for (; i < m; ++i) {
      dst[2 * i] = p0[i];
      dst[2 * i + 1] = p1[i];
    }
  } else if (elem == 4) {
    const std::byte *q0 = planes[0], *q1 = planes[1], *q2 = planes[2], *q3 = planes[3];
#if defined(__SSE2__)
    for (; i + 16 <= m; i += 16) {
      const __m128i p0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q0 + i));
      const __m128i p1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q1 + i));
      const __m128i p2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q2 + i));
      const __m128i p3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q3 + i));
      const __m128i a = _mm_unpacklo_epi8(p0, p1), b = _mm_unpackhi_epi8(p0, p1);
      const __m128i c = _mm_unpacklo_epi8(p2, p3), d = _mm_unpackhi_epi8(p2, p3);
      __m128i* o = reinterpret_cast<__m128i*>(dst + 4 * i);
      _mm_storeu_si128(o + 0, _mm_unpacklo_epi16(a, c));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(a, c));
      _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(b, d));
      _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(b, d));
    }
#endif
    for (; i < m; ++i) {
      dst[4 * i] = q0[i];
      dst[4 * i + 1] = q1[i];
      dst[4 * i + 2] = q2[i];
      dst[4 * i + 3] = q3[i];
    }
  } else {
    for (size_t b = 0; b < elem; ++b) {
      const std::byte* plane = planes[b];
      for (size_t k = 0; k < m; ++k) dst[k * elem + b] = plane[k];
    }
  }
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

// `src` as one zstd frame of raw blocks (RFC 8878: single segment, 4-byte
// content size, no checksum): any zstd decoder reads it, at memcpy speed.
size_t put_raw_frame(std::span<const std::byte> src, std::byte* dst) {
  constexpr size_t kMaxBlock = 128 << 10;
  size_t pos = 0;
  store_le(dst, 0xFD2FB528u, 4);
  dst[4] = std::byte{0xA0};  // Single_Segment_flag, Frame_Content_Size_flag 2 (4 bytes)
  store_le(dst + 5, src.size(), 4);
  pos = 9;
  size_t at = 0;
  do {
    const size_t n = std::min(kMaxBlock, src.size() - at);
    const bool last = at + n == src.size();
    store_le(dst + pos, uint64_t(last) | (uint64_t(n) << 3), 3);  // Block_Type 0: raw
    if (n) std::memcpy(dst + pos + 3, src.data() + at, n);
    pos += 3 + n;
    at += n;
  } while (at < src.size());
  return pos;
}

size_t raw_frame_bound(size_t n) { return 9 + 3 * (n / (128 << 10) + 1) + n; }

}  // namespace

ChunkEncoder::ChunkEncoder(int zstd_level) : cctx_(ZSTD_createCCtx()), level_(zstd_level) {
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
  if (filter.filter == ChunkFilter::kNone) filter.elem_size = 0;
  // The planes compressed separately (one zstd frame each), then the tail.
  std::vector<std::span<const std::byte>> parts;
  std::span<const std::byte> filtered = raw;
  if (filter.filter == ChunkFilter::kShuffle && raw.size() >= filter.elem_size) {
    filtered_.resize(raw.size());
    shuffle_bytes(raw, filter.elem_size, filtered_);
    filtered = filtered_;
    const size_t n = raw.size() / filter.elem_size;
    for (size_t b = 0; b < filter.elem_size; ++b) parts.push_back(filtered.subspan(b * n, n));
    if (raw.size() % filter.elem_size) parts.push_back(filtered.subspan(n * filter.elem_size));
  } else {
    filter = {ChunkFilter::kNone, 0};
    parts.push_back(raw);
  }
  size_t bound = kBlobHeaderBytes;
  for (const auto& p : parts) bound += std::max(ZSTD_compressBound(p.size()), raw_frame_bound(p.size()));
  // Grown only, never shrunk: a reused buffer is not zero-filled again.
  out.resize(std::max({out.size(), bound, kBlobHeaderBytes + raw.size()}));

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
  size_t pos = kBlobHeaderBytes;
  for (const auto& p : parts) {
    if (p.size() > 2 * kProbeBytes && entropy_bits(p.first(kProbeBytes)) > 8 * kWorthCompressing) {
      // Probe a sample first (into the space the plane's frame will take).
      ret = ZSTD_compress2(cctx_, out.data() + pos, out.size() - pos, p.data(), kProbeBytes);
      if (ZSTD_isError(ret)) return Status::InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(ret));
      if (double(ret) > kWorthCompressing * kProbeBytes) {
        pos += put_raw_frame(p, out.data() + pos);
        continue;
      }
    }
    ret = ZSTD_compress2(cctx_, out.data() + pos, out.size() - pos, p.data(), p.size());
    if (ZSTD_isError(ret)) return Status::InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(ret));
    pos += ret;
  }
  BlobHeader h{ChunkCodec::kZstd, filter.filter, filter.elem_size, raw.size()};
  if (pos - kBlobHeaderBytes >= raw.size()) {
    // Incompressible: store the raw bytes, which also decode at memcpy speed.
    h = BlobHeader{ChunkCodec::kStored, ChunkFilter::kNone, 0, raw.size()};
    if (!raw.empty()) std::memcpy(out.data() + kBlobHeaderBytes, raw.data(), raw.size());
    pos = kBlobHeaderBytes + raw.size();
  }
  store_header(out.data(), h);
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
