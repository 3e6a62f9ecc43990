// The content digest, versions 3 and 4 (format/content_digest.h); byte layout: docs/format.md.
#include "format/content_digest.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>

#include "base/byte_order.h"
#include "format/cursor.h"
#include "format/snapshot_internal.h"

namespace kvsnap {

using namespace snapshot_detail;

namespace {

constexpr std::string_view kDomain{"kvsnap content digest v3\0", 25};
// A table with cell restarts (format version 4): GRID's payload follows SEGS's.
constexpr std::string_view kGridDomain{"kvsnap content digest v4\0", 25};

void add_u64(Sha256& sha, uint64_t v) {
  std::vector<std::byte> b;
  put_u64(b, v);
  sha.update(b);
}

}  // namespace

const char* content_digest_rule_name(ContentDigestRule rule, bool keyed) {
  if (rule == ContentDigestRule::kWholeSha256) return keyed ? "hmac-sha256" : "sha256";
  return keyed ? "keyed-chunk-tree" : "chunk-tree";
}

ContentDigester::ContentDigester(const SegmentTable& t, uint64_t file_size, uint64_t n_chunks, bool keyed) {
  const bool grid = t.has_cell_restarts();
  const std::string_view domain = grid ? kGridDomain : kDomain;
  sha_.update(std::as_bytes(std::span<const char>(domain.data(), domain.size())));
  const std::byte scheme{uint8_t(keyed ? 1 : 0)};
  sha_.update(std::span<const std::byte>(&scheme, 1));
  add_u64(sha_, file_size);
  const std::vector<std::byte> segs = encode_segments(t);
  add_u64(sha_, segs.size());
  sha_.update(segs);
  if (grid) {
    const std::vector<std::byte> restarts = encode_grid(t);
    add_u64(sha_, restarts.size());
    sha_.update(restarts);
  }
  add_u64(sha_, n_chunks);
}

void ContentDigester::add(uint64_t raw_size, const Sha256Digest& id) {
  std::array<std::byte, 40> rec{};
  store_le(rec.data(), raw_size, 8);
  std::memcpy(rec.data() + 8, id.data(), 32);
  sha_.update(rec);
}

Sha256Digest ContentDigester::finish() { return sha_.finish(); }

Sha256Digest content_digest_of_table(const SegmentTable& t, uint64_t file_size, const std::vector<ChunkRef>& chunks,
                                     bool keyed) {
  ContentDigester d(t, file_size, chunks.size(), keyed);
  for (const ChunkRef& c : chunks) d.add(c.raw_size, c.sha256);
  return d.finish();
}

Result<Sha256Digest> content_digest_of_original(const SegmentTable& t, const ReadableFile& original,
                                                const ChunkCipher* cipher, Sha256Kernel kernel) {
  ChunkReader reader(t, original);
  const uint64_t n = reader.n_chunks();
  ContentDigester d(t, original.size(), n, cipher != nullptr);
  // As many chunks at a time as the kernel hashes together (as a save computes their ids), each
  // read in chunk order (the first that fails is the one named), into buffers kept across groups:
  // fresh pages are slow to touch. Keyed ids are HMACs, one by one.
  const size_t group = std::max<size_t>(2, sha256_kernel_width(kernel));
  std::array<std::vector<std::byte>, Sha256Lanes::kMaxLanes> raw;
  std::array<std::span<const std::byte>, Sha256Lanes::kMaxLanes> msgs{};
  std::array<Sha256Digest, Sha256Lanes::kMaxLanes> ids{};
  for (uint64_t i = 0; i < n; i += group) {
    const size_t k = size_t(std::min<uint64_t>(group, n - i));
    for (size_t j = 0; j < k; ++j) {
      KV_RETURN_IF_ERROR(reader.read(i + j, raw[j]));
      msgs[j] = raw[j];
    }
    if (cipher) {
      for (size_t j = 0; j < k; ++j) ids[j] = cipher->chunk_id(msgs[j]);
    } else {
      sha256_many(std::span(msgs).first(k), ids, kernel);
    }
    for (size_t j = 0; j < k; ++j) d.add(msgs[j].size(), ids[j]);
  }
  return d.finish();
}

Result<Sha256Digest> whole_file_sha256(const ReadableFile& f) {
  Sha256 h;
  std::vector<std::byte> buf(std::min<uint64_t>(f.size(), 1 << 20));
  for (uint64_t at = 0; at < f.size();) {
    std::span<std::byte> piece(buf.data(), std::min<uint64_t>(buf.size(), f.size() - at));
    KV_RETURN_IF_ERROR(f.read_at(at, piece));
    h.update(piece);
    at += piece.size();
  }
  return h.finish();
}

Result<StateDigests> state_digests(const StateFile& parsed, const ReadableFile& original, uint32_t cells_per_chunk,
                                   const SegmentTable* grid_of, const ChunkCipher* cipher) {
  KV_ASSIGN_OR_RETURN(SegmentTable t, plan_state_segments(parsed, original, cells_per_chunk));
  if (grid_of) adopt_cell_grids(t, *grid_of);
  StateDigests d;
  KV_ASSIGN_OR_RETURN(d.content_digest, content_digest_of_original(t, original, cipher));
  KV_ASSIGN_OR_RETURN(d.sha256, whole_file_sha256(original));
  return d;
}

}  // namespace kvsnap
