// Reading snapshots: open a file or a store manifest, and serve the original
// llama.cpp file from chunks through a bounded LRU of decoded chunks.
#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "base/byte_order.h"
#include "base/json_access.h"
#include "base/sha256_lanes.h"
#include "base/text.h"
#include "format/ggml_types.h"
#include "format/snapshot.h"
#include "format/content_digest.h"
#include "format/snapshot_internal.h"

namespace kvsnap {

using namespace snapshot_detail;

namespace {

// A standalone file's blobs: chunk i sits at the chunk area's start plus the
// stored sizes of chunks 0..i-1.
class FileChunkSource final : public ChunkSource {
 public:
  FileChunkSource(const ReadableFile& file, std::vector<uint64_t> offsets) : file_(file), offsets_(std::move(offsets)) {}
  Result<std::vector<std::byte>> get(const ChunkRef& ref) override {
    if (ref.index >= offsets_.size()) {
      return Status::InvalidArgument(file_.name() + ": no chunk " + std::to_string(ref.index));
    }
    std::vector<std::byte> blob;
    KV_RETURN_IF_ERROR(get_into(ref, blob));
    return blob;
  }
  Status get_into(const ChunkRef& ref, std::vector<std::byte>& out) override {
    if (ref.index >= offsets_.size()) {
      return Status::InvalidArgument(file_.name() + ": no chunk " + std::to_string(ref.index));
    }
    out.resize(ref.stored_size);
    return file_.read_at(offsets_[ref.index], out);
  }

 private:
  const ReadableFile& file_;
  std::vector<uint64_t> offsets_;
};

class OriginalFile;
struct DecodeScratch;

// INFO.memory.recurrent is present (not null): the state carries recurrent memory.
bool info_has_recurrent(const nlohmann::ordered_json& info) {
  auto mem = OrderedJsonRef(info, "INFO").find("memory");
  if (!mem.ok() || !*mem) return false;
  auto rec = (*mem)->find("recurrent");
  return rec.ok() && rec->has_value();
}

}  // namespace

struct SnapshotReader::Impl {
  SnapshotManifest m;
  std::string name;
  ChunkSource* source = nullptr;
  std::unique_ptr<ChunkSource> owned_source;
  const ChunkCipher* cipher = nullptr;  // set only for an encrypted snapshot, checked against CRYP
  uint64_t cache_cap = 0;
  MemoryShape shape;
  std::unique_ptr<OriginalFile> original;

  using Chunk = std::shared_ptr<const std::vector<std::byte>>;
  struct Entry {
    Chunk data;
    std::list<uint64_t>::iterator pos;
  };
  mutable std::mutex mu;
  mutable std::list<uint64_t> lru;  // most recent first
  mutable std::unordered_map<uint64_t, Entry> cache;
  mutable CacheStats stats;

  // Fetches, decodes and checks chunk `i` (no caching).
  Result<std::vector<std::byte>> load(uint64_t i) const;
  // The same into `out` (exactly the chunk's raw size): no cache, no copy.
  // On error `out` holds garbage.
  Status load_into(uint64_t i, std::span<std::byte> out) const;
  // load_into for consecutive whole chunks `ids` into `outs` (one each, at most
  // Sha256Lanes::kMaxLanes), their SHA-256s computed together (base/sha256_lanes.h).
  Status load_group_into(std::span<const uint64_t> ids, std::span<const std::span<std::byte>> outs) const;
  // How many whole chunks read_at hands load_group_into at once: the SHA-256 kernel's lanes (2
  // or 4 with SHA-NI, 8 with AVX2); 1 with OpenSSL's one stream or for keyed ids.
  size_t group_size() const {
    return cipher || m.encryption ? 1 : sha256_kernel_width(sha256_kernel());
  }
  // load_into's work with the scratch it took; errors without the chunk's name.
  Status decode_checked(const ChunkRef& ref, DecodeScratch& sc, std::span<std::byte> out) const;
  // load_group_into's; `failed` says which chunk an error is about.
  Status decode_group_checked(std::span<const uint64_t> ids, std::span<const std::span<std::byte>> outs,
                              DecodeScratch* const* sc, size_t& failed) const;
  // The blob of `ref` fetched into sc.blob, opened where encrypted: what its decoder reads.
  Result<std::span<const std::byte>> fetch_blob(const ChunkRef& ref, DecodeScratch& sc) const;
  // A decoded chunk's digests against the manifest's.
  Status check_digests(const ChunkRef& ref, const Sha256Digest& sha, const ChunkXxh& xxh,
                       std::span<const std::byte> out) const;
  // Through the cache.
  Result<Chunk> chunk(uint64_t i) const;
  // True (and counted as a miss) when chunk i is not in the cache.
  bool miss(uint64_t i) const {
    std::lock_guard<std::mutex> lock(mu);
    if (cache.count(i)) return false;
    ++stats.misses;
    return true;
  }
  std::string describe(uint64_t i) const;
  void build_shape();
  // An encrypted snapshot read without its key.
  Status missing_key() const {
    return Status::InvalidArgument("encrypted with key " + key_id_hex(m.encryption->master_key_id) + " for tenant " +
                                   quote_text(m.encryption->tenant) +
                                   ", and no key was given: pass {--key-file FILE} or {--key-command CMD}");
  }
};

namespace {

class OriginalFile final : public ReadableFile {
 public:
  explicit OriginalFile(const SnapshotReader::Impl& impl)
      : impl_(impl), name_(impl.name + " (original " + impl.m.provenance.source + ")") {}
  uint64_t size() const override { return impl_.m.provenance.file_size; }
  const std::string& name() const override { return name_; }

  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > size() || dst.size() > size() - offset) {
      return Status::Corruption(name_ + ": read of " + std::to_string(dst.size()) + " bytes at offset " +
                                std::to_string(offset) + " runs past the end (" + std::to_string(size()) + " bytes)");
    }
    size_t done = 0;
    while (done < dst.size()) {
      const uint64_t at = offset + done;
      const Location loc = locate_at(at);
      const uint64_t n = std::min<uint64_t>(loc.run, dst.size() - done);
      if (whole_chunk(loc, n) && impl_.miss(loc.chunk)) {
        // A whole chunk whose bytes are contiguous here (a run of cells of a
        // row-major tensor, a piece of the frame): decoded and checked straight
        // into the reader's buffer. Sequential readers (restore) read each
        // chunk once, so caching it would only cost a copy. The whole chunks that
        // follow are decoded with it, as many as the SHA-256 kernel has lanes: their
        // SHA-256s run together, faster than one after the other.
        std::array<uint64_t, Sha256Lanes::kMaxLanes> ids{loc.chunk};
        std::array<std::span<std::byte>, Sha256Lanes::kMaxLanes> outs{dst.subspan(done, n)};
        size_t k = 1;
        uint64_t end = done + n;
        for (const size_t group = impl_.group_size(); k < group && end < dst.size(); ++k) {
          const Location next = locate_at(offset + end);
          const uint64_t n2 = std::min<uint64_t>(next.run, dst.size() - end);
          if (!whole_chunk(next, n2) || !impl_.miss(next.chunk)) break;
          ids[k] = next.chunk;
          outs[k] = dst.subspan(end, n2);
          end += n2;
        }
        KV_RETURN_IF_ERROR(impl_.load_group_into(std::span(ids).first(k), std::span(outs).first(k)));
        done = end;
        continue;
      }
      KV_ASSIGN_OR_RETURN(auto chunk, impl_.chunk(loc.chunk));
      std::memcpy(dst.data() + done, chunk->data() + loc.offset_in_chunk, n);
      done += n;
    }
    return Status::OK();
  }

 private:
  Location locate_at(uint64_t at) const {
    const auto& segs = impl_.m.segments.segments;
    auto it = std::upper_bound(segs.begin(), segs.end(), at, [](uint64_t o, const Segment& s) { return o < s.file_offset; });
    return locate(impl_.m.segments, *std::prev(it), at);
  }
  // `n` bytes at `loc` are the whole of its chunk.
  bool whole_chunk(const Location& loc, uint64_t n) const {
    return loc.offset_in_chunk == 0 && n == impl_.m.chunks[loc.chunk].raw_size;
  }

  const SnapshotReader::Impl& impl_;
  std::string name_;
};

}  // namespace

Result<std::vector<std::byte>> SnapshotReader::Impl::load(uint64_t i) const {
  std::vector<std::byte> raw(m.chunks[i].raw_size);
  KV_RETURN_IF_ERROR(load_into(i, raw));
  return raw;
}

namespace {

// What one chunk's decode needs besides its output: the blob, the zstd context and scratch,
// the hashers. Taken from a process-wide pool and given back, so neither a chunk nor (after
// the first) a restore allocates: the restore's decode threads are new each time, and fresh
// pages are slow to first touch.
struct DecodeScratch {
  std::vector<std::byte> blob, opened;
  ChunkDecoder decoder;
  Sha256 sha;
  // chunks decoded together, lane j the j-th; made for the kernel in use when taken (ScratchPool::
  // take), which a level set within the process may change (avx512-x8 at avx512, avx2-x8 at avx2)
  std::optional<Sha256Lanes> lanes;
  ChunkXxhHasher xxh;
};

class ScratchPool {
 public:
  std::unique_ptr<DecodeScratch> take() {
    std::unique_ptr<DecodeScratch> s;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!free_.empty()) {
        s = std::move(free_.back());
        free_.pop_back();
      }
    }
    // A scratch kept from another level hashes as that level (a review's finding: kvsnap-store-bench
    // --simd all hashed about half of an avx2 restore's chunks with libxxhash): made again.
    if (!s || !s->xxh.follows_level()) s = std::make_unique<DecodeScratch>();
    if (!s->lanes || s->lanes->kernel() != sha256_kernel()) s->lanes.emplace(sha256_kernel());
    return s;
  }
  void give(std::unique_ptr<DecodeScratch> s) {
    std::lock_guard<std::mutex> g(mu_);
    if (free_.size() < kKeep) free_.push_back(std::move(s));
  }

 private:
  // About a chunk and a half each. Two decode threads of eight AVX2 lanes hold 16 at once (of
  // SHA-NI pairs, 4): only as many as were in use are ever made and kept.
  static constexpr size_t kKeep = 2 * Sha256Lanes::kMaxLanes;
  std::mutex mu_;
  std::vector<std::unique_ptr<DecodeScratch>> free_;
};

ScratchPool& scratch_pool() {
  static ScratchPool* pool = new ScratchPool;  // never destroyed: decodes may run during exit
  return *pool;
}

}  // namespace

Status SnapshotReader::Impl::load_into(uint64_t i, std::span<std::byte> out) const {
  const ChunkRef& ref = m.chunks[i];
  auto fail = [&](const Status& s) { return s.Prefixed(name + ": " + describe(i)); };
  if (out.size() != ref.raw_size) return fail(Status::InvalidArgument("decode buffer of the wrong size"));
  std::unique_ptr<DecodeScratch> sc = scratch_pool().take();
  Status s = decode_checked(ref, *sc, out);
  scratch_pool().give(std::move(sc));
  return s.ok() ? s : fail(s);
}

Status SnapshotReader::Impl::load_group_into(std::span<const uint64_t> ids,
                                            std::span<const std::span<std::byte>> outs) const {
  if (ids.size() == 1) return load_into(ids[0], outs[0]);
  for (size_t j = 0; j < ids.size(); ++j)
    if (outs[j].size() != m.chunks[ids[j]].raw_size)
      return Status::InvalidArgument("decode buffer of the wrong size").Prefixed(name + ": " + describe(ids[j]));
  std::array<std::unique_ptr<DecodeScratch>, Sha256Lanes::kMaxLanes> taken;
  std::array<DecodeScratch*, Sha256Lanes::kMaxLanes> sc{};
  for (size_t j = 0; j < ids.size(); ++j) taken[j] = scratch_pool().take(), sc[j] = taken[j].get();
  size_t failed = 0;
  Status s = decode_group_checked(ids, outs, sc.data(), failed);
  for (size_t j = 0; j < ids.size(); ++j) scratch_pool().give(std::move(taken[j]));
  return s.ok() ? s : s.Prefixed(name + ": " + describe(ids[failed]));
}

Result<std::span<const std::byte>> SnapshotReader::Impl::fetch_blob(const ChunkRef& ref, DecodeScratch& sc) const {
  KV_RETURN_IF_ERROR(source->get_into(ref, sc.blob));
  if (sc.blob.size() > ref.raw_size + kMaxBlobOverhead) {
    return Status::Corruption("blob of " + std::to_string(sc.blob.size()) + " bytes for " +
                              std::to_string(ref.raw_size) + " raw bytes");
  }
  if (m.encryption) {
    if (!cipher) return missing_key();
    KV_RETURN_IF_ERROR(cipher->open_into(ref.sha256, sc.blob, sc.opened, "its blob"));
    return std::span<const std::byte>(sc.opened);
  }
  if (looks_sealed(sc.blob)) {
    // A plain snapshot's id is the SHA-256 anyone can compute: an encrypted blob under it is
    // not the store's doing.
    return Status::Corruption("an encrypted blob in a snapshot whose manifest records no encryption");
  }
  return std::span<const std::byte>(sc.blob);
}

Status SnapshotReader::Impl::check_digests(const ChunkRef& ref, const Sha256Digest& sha, const ChunkXxh& xxh,
                                           std::span<const std::byte> out) const {
  if (cipher ? cipher->chunk_id(out) != ref.sha256 : sha != ref.sha256) {
    return Status::Corruption(std::string("damaged: its decoded bytes do not match their ") +
                              (cipher ? "keyed id " : "SHA-256 ") + to_hex(ref.sha256));
  }
  // The manifest's equality digest must hold too (a forged one, from an imported manifest,
  // would otherwise let a later extension's save take this chunk for other bytes).
  if (ref.xxh && xxh != *ref.xxh) {
    return Status::Corruption("damaged: its decoded bytes match their SHA-256 but not the manifest's "
                              "XXH3-128 " + to_hex(*ref.xxh));
  }
  return Status::OK();
}

Status SnapshotReader::Impl::decode_checked(const ChunkRef& ref, DecodeScratch& sc, std::span<std::byte> out) const {
  KV_ASSIGN_OR_RETURN(const std::span<const std::byte> inner, fetch_blob(ref, sc));
  // Both digests are fed each piece as it is decoded, while it is in cache (the keyed id of an
  // encrypted snapshot, an HMAC, is taken over the whole chunk after).
  const Status s = sc.decoder.decode_into(inner, out, [&sc, keyed = cipher != nullptr](std::span<const std::byte> p) {
    if (!keyed) sc.sha.update(p);
    sc.xxh.update(p);
  });
  const Sha256Digest sha = sc.sha.finish();  // both start over, whatever happened
  const ChunkXxh xxh = sc.xxh.finish();
  KV_RETURN_IF_ERROR(s);
  return check_digests(ref, sha, xxh, out);
}

// All chunks but the last are decoded whole first (their XXH3-128s fed as they go); then the
// last, and each of its pieces goes into its lane of one Sha256Lanes while in cache, beside as
// many bytes of every other chunk (just written: in L2 or L3), so the SHA-256s run together;
// what the others have left goes in together after. Errors come in the order one chunk after
// the other would give them.
Status SnapshotReader::Impl::decode_group_checked(std::span<const uint64_t> ids,
                                                  std::span<const std::span<std::byte>> outs,
                                                  DecodeScratch* const* sc, size_t& failed) const {
  const size_t k = ids.size(), last = k - 1;
  Status err;
  size_t err_at = k;  // the first chunk whose fetch or decode failed
  for (size_t j = 0; j < last && err_at == k; ++j) {
    auto inner = fetch_blob(m.chunks[ids[j]], *sc[j]);
    DecodeScratch& x = *sc[j];
    err = inner.ok() ? x.decoder.decode_into(*inner, outs[j], [&x](std::span<const std::byte> p) { x.xxh.update(p); })
                     : inner.status();
    if (!err.ok()) err_at = j;
  }
  Sha256Lanes& lanes = *sc[0]->lanes;
  std::array<size_t, Sha256Lanes::kMaxLanes> fed{};
  // Feeds up to `n` more bytes of each of the first `upto` chunks.
  auto feed_others = [&](size_t upto, size_t n, Sha256Lanes::Pieces& p) {
    for (size_t j = 0; j < upto; ++j) {
      const size_t take = std::min(n, outs[j].size() - fed[j]);
      p[j] = std::span<const std::byte>(outs[j]).subspan(fed[j], take);
      fed[j] += take;
    }
  };
  if (err_at == k) {
    DecodeScratch& x = *sc[last];
    auto inner = fetch_blob(m.chunks[ids[last]], x);
    err = inner.ok() ? x.decoder.decode_into(*inner, outs[last],
                                             [&](std::span<const std::byte> p) {
                                               x.xxh.update(p);
                                               Sha256Lanes::Pieces pieces{};
                                               feed_others(last, p.size(), pieces);
                                               pieces[last] = p;
                                               lanes.update(pieces);
                                             })
                     : inner.status();
    if (!err.ok()) err_at = last;
  }
  const size_t whole = std::min(err_at, last);  // chunks decoded whole before any error
  for (bool more = true; more;) {
    Sha256Lanes::Pieces pieces{};
    feed_others(whole, kDecodePieceBytes, pieces);
    more = false;
    for (size_t j = 0; j < whole; ++j) more = more || !pieces[j].empty();
    if (more) lanes.update(pieces);
  }
  std::array<Sha256Digest, Sha256Lanes::kMaxLanes> sha{};
  std::array<ChunkXxh, Sha256Lanes::kMaxLanes> xxh{};
  for (size_t j = 0; j < k; ++j) sha[j] = lanes.finish(j), xxh[j] = sc[j]->xxh.finish();  // all start over
  for (size_t j = 0; j < whole; ++j) {
    failed = j;
    KV_RETURN_IF_ERROR(check_digests(m.chunks[ids[j]], sha[j], xxh[j], outs[j]));
  }
  failed = err_at == k ? last : err_at;
  KV_RETURN_IF_ERROR(err);
  return check_digests(m.chunks[ids[last]], sha[last], xxh[last], outs[last]);
}

Result<SnapshotReader::Impl::Chunk> SnapshotReader::Impl::chunk(uint64_t i) const {
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(i);
    if (it != cache.end()) {
      lru.splice(lru.begin(), lru, it->second.pos);
      ++stats.hits;
      return it->second.data;
    }
    ++stats.misses;
  }
  // Decoded outside the lock: readers of other chunks do not wait.
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> raw, load(i));
  auto data = std::make_shared<const std::vector<std::byte>>(std::move(raw));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(i);
  if (it != cache.end()) return it->second.data;  // another thread got there first
  lru.push_front(i);
  cache.emplace(i, Entry{data, lru.begin()});
  stats.bytes += data->size();
  // Evict least recent chunks; the one just loaded always stays.
  while (stats.bytes > cache_cap && lru.size() > 1) {
    auto victim = cache.find(lru.back());
    stats.bytes -= victim->second.data->size();
    cache.erase(victim);
    lru.pop_back();
  }
  stats.peak_bytes = std::max(stats.peak_bytes, stats.bytes);
  return data;
}

std::string SnapshotReader::Impl::describe(uint64_t i) const {
  std::string s = "chunk " + std::to_string(i);
  const SegmentTable& t = m.segments;
  if (i < t.n_frame_chunks) {
    const uint64_t b = i * t.frame_chunk_bytes;
    return s + " (frame stream bytes " + std::to_string(b) + ".." +
           std::to_string(std::min<uint64_t>(b + t.frame_chunk_bytes, t.frame_bytes) - 1) +
           (m.mlx ? ": the safetensors header and the small tensors)" : ": headers, cell metadata, tokens, opaque state)");
  }
  for (const Segment& seg : t.segments) {
    if (seg.kind == SegmentKind::kFrame || i < seg.first_chunk || i >= seg.first_chunk + seg.n_chunks()) continue;
    const uint64_t k = i - seg.first_chunk, J = seg.cell_chunks(), j = k % J, b = k / J;
    const Segment::CellRun cells = seg.cell_chunk(j);
    const uint64_t c0 = cells.first, c1 = cells.first + cells.count;
    if (m.mlx && seg.layer < m.mlx->tensors.size()) {  // an mlx-lm tensor: head planes x positions
      const SnapshotMlxTensor& x = m.mlx->tensors[seg.layer];
      const uint64_t r0 = b * seg.rows_per_chunk, r1 = std::min<uint64_t>(r0 + seg.rows_per_chunk, seg.n_rows);
      return s + " (tensor " + x.name + " " + x.dtype + ", positions " + std::to_string(c0) + ".." +
             std::to_string(c1 - 1) + ", planes " + std::to_string(r0) + ".." + std::to_string(r1 - 1) + ")";
    }
    s += " (" + describe_segment(seg) + ", cells " + std::to_string(c0) + ".." + std::to_string(c1 - 1);
    if (seg.kind == SegmentKind::kTransposed) {
      const uint64_t r0 = b * seg.rows_per_chunk, r1 = std::min<uint64_t>(r0 + seg.rows_per_chunk, seg.n_rows);
      s += ", rows " + std::to_string(r0) + ".." + std::to_string(r1 - 1);
    }
    return s + ")";
  }
  return s;
}

// The layout parse_state needs to read original() as it was read when the
// snapshot was made, without the model: per KV section the layer widths
// (from the tensor segments) and which layers have V, the cell ext, and
// whether recurrent state follows (carried opaque).
void SnapshotReader::Impl::build_shape() {
  shape = MemoryShape{};
  shape.kv_sections_known = true;
  shape.recurrent_known = true;
  shape.recurrent_opaque_ok = true;
  shape.source = "snapshot manifest";
  shape.has_recurrent = info_has_recurrent(m.info);
  if (!m.cells.empty()) shape.ext_bytes = m.cells[0].ext_bytes;
  shape.kv_sections.resize(m.cells.size());
  // One stream with cells per section tells the layer widths (every stream
  // of a section has the same layers).
  std::vector<int64_t> stream_of(m.cells.size(), -1);
  for (const Segment& s : m.segments.segments) {
    if (s.kind == SegmentKind::kFrame || s.section >= shape.kv_sections.size()) continue;
    if (stream_of[s.section] < 0) stream_of[s.section] = s.stream;
    if (int64_t(s.stream) != stream_of[s.section]) continue;
    KvSectionShape& ks = shape.kv_sections[s.section];
    // parse_manifest bounded s.layer by the segment count; size_t keeps 0xFFFFFFFF + 1 from wrapping.
    const size_t n_layers = size_t(s.layer) + 1;
    if (ks.n_embd_k_gqa.size() < n_layers) {
      ks.n_embd_k_gqa.resize(n_layers, 0);
      ks.n_embd_v_gqa.resize(n_layers, 0);
      ks.has_v.resize(n_layers, false);
    }
    uint64_t n = 0;
    if (s.kind == SegmentKind::kTransposed) {
      n = s.n_rows;
    } else if (const TypeLayout* t = find_type(s.ggml_type)) {
      n = row_elems(*t, s.row_bytes).value_or(0);
    }
    if (s.is_v) {
      ks.n_embd_v_gqa[s.layer] = uint32_t(n);
      ks.has_v[s.layer] = true;
    } else {
      ks.n_embd_k_gqa[s.layer] = uint32_t(n);
    }
  }
}

SnapshotReader::SnapshotReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SnapshotReader::~SnapshotReader() = default;

const SnapshotManifest& SnapshotReader::manifest() const { return impl_->m; }
const ReadableFile& SnapshotReader::original() const { return *impl_->original; }

Result<std::vector<std::byte>> SnapshotReader::blob(uint64_t index) const {
  if (index >= impl_->m.chunks.size())
    return Status::InvalidArgument(impl_->name + ": no chunk " + std::to_string(index));
  return impl_->source->get(impl_->m.chunks[index]);
}

ParseOptions SnapshotReader::parse_options() const {
  ParseOptions o;
  o.shape = &impl_->shape;
  const SnapshotProvenance& p = impl_->m.provenance;
  if (p.kind == StateKind::kRawSeq || p.kind == StateKind::kRawContext) {
    o.kind = p.kind;
    o.raw_version = p.version;
  }
  // A ggsn v6 session does not record its K/V types; its segments do.
  std::optional<int32_t> k, v;
  for (const Segment& s : impl_->m.segments.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    (s.is_v ? v : k) = (s.is_v ? v : k).value_or(s.ggml_type);
  }
  if (p.kind == StateKind::kSessionFile && p.version == 6 && k && v) o.legacy_kv_types = std::make_pair(*k, *v);
  // How the save read a version-9 body that fits both readings (a build named at save decided):
  // INFO's layout.outputs, null when it had none. Consulted only when both readings fit.
  const auto& info = impl_->m.info;
  if (auto layout = info.find("layout"); layout != info.end() && layout->is_object()) {
    if (auto outputs = layout->find("outputs"); outputs != layout->end()) o.v9_outputs = !outputs->is_null();
  }
  return o;
}

Result<StateFile> SnapshotReader::parse_original() const {
  if (impl_->m.mlx) {
    return Status::NotSupported(impl_->name + ": an mlx-lm prompt cache (" + impl_->m.provenance.source +
                                "), not a llama.cpp state");
  }
  KV_ASSIGN_OR_RETURN(StateFile f, parse_state(original(), parse_options()));
  // A ggsn v6 session does not name its arch; the model recorded at save time does.
  if (f.legacy && f.arch.empty() && impl_->m.model) f.arch = impl_->m.model->arch;
  return f;
}

Status SnapshotReader::verify_chunks() const {
  // As many chunks at a time as the SHA-256 kernel hashes together, into buffers kept across groups.
  const uint64_t n = impl_->m.chunks.size();
  const size_t group = impl_->group_size();
  std::array<std::vector<std::byte>, Sha256Lanes::kMaxLanes> bufs;
  std::array<uint64_t, Sha256Lanes::kMaxLanes> ids{};
  std::array<std::span<std::byte>, Sha256Lanes::kMaxLanes> outs{};
  for (uint64_t i = 0; i < n; i += group) {
    const size_t k = size_t(std::min<uint64_t>(group, n - i));
    for (size_t j = 0; j < k; ++j) {
      ids[j] = i + j;
      bufs[j].resize(impl_->m.chunks[i + j].raw_size);
      outs[j] = bufs[j];
    }
    KV_RETURN_IF_ERROR(impl_->load_group_into(std::span(ids).first(k), std::span(outs).first(k)));
  }
  return Status::OK();
}

Status SnapshotReader::verify_sealed_chunks() const {
  const SnapshotManifest& m = impl_->m;
  if (!m.encryption) return Status::InvalidArgument(impl_->name + ": not encrypted (verify_chunks checks it)");
  std::vector<std::byte> blob;
  for (const ChunkRef& ref : m.chunks) {
    const std::string what = impl_->name + ": " + impl_->describe(ref.index);
    KV_RETURN_IF_ERROR(impl_->source->get_into(ref, blob).Prefixed(what));
    KV_ASSIGN_OR_RETURN(const SealedHeader h, parse_sealed_header(blob, what));
    KV_RETURN_IF_ERROR(check_sealed_key_ids(h, m.encryption->master_key_id, m.encryption->tenant_key_id, what));
    if (h.payload_size < kBlobHeaderBytes || h.payload_size > ref.raw_size + kMaxBlobOverhead) {
      return Status::Corruption(what + ": an encrypted blob of " + std::to_string(h.payload_size) +
                                " bytes cannot hold " + std::to_string(ref.raw_size) + " raw bytes");
    }
  }
  return Status::OK();
}

Status SnapshotReader::verify_original() const {
  const ReadableFile& f = original();
  const SnapshotManifest& m = impl_->m;
  Sha256Digest got{};
  if (m.rule() == ContentDigestRule::kChunkTree) {
    if (m.encryption && !impl_->cipher) {
      return Status::InvalidArgument(impl_->name + ": the content digest of an encrypted snapshot needs its key");
    }
    KV_ASSIGN_OR_RETURN(got, content_digest_of_original(m.segments, f, impl_->cipher));
  } else {
    KV_ASSIGN_OR_RETURN(got, whole_file_sha256(f));
  }
  if (got != m.content_digest) {
    return Status::Corruption(impl_->name + ": the original rebuilt from the chunks has the content digest " +
                              to_hex(got) + " (" + content_digest_rule_name(m.rule(), m.encryption && m.rule() == ContentDigestRule::kChunkTree) +
                              "), the manifest records " + to_hex(m.content_digest));
  }
  return Status::OK();
}

Status SnapshotReader::verify_metadata(const StateFile& parsed) const {
  const SnapshotManifest& m = impl_->m;
  const std::string what = impl_->name + ": the manifest's ";
  const SnapshotTokens& t = m.tokens;
  if (t.tokens != parsed.tokens.tokens || t.words != parsed.tokens.words || t.packed != parsed.tokens.packed)
    return Status::Corruption(what + "token list (TOKN) is not the original's");
  bool same = m.cells.size() == parsed.memory.kv.size();
  for (size_t i = 0; same && i < m.cells.size(); ++i) {
    const KvSection& sec = parsed.memory.kv[i];
    const CellSection& cs = m.cells[i];
    same = cs.ext_bytes == sec.ext_bytes && cs.streams.size() == sec.streams.size();
    for (size_t s = 0; same && s < cs.streams.size(); ++s) {
      const std::vector<CellMeta>& a = cs.streams[s];
      const std::vector<CellMeta>& b = sec.streams[s].cells;
      same = a.size() == b.size();
      const size_t n_ext = std::min<size_t>(sec.ext_bytes / 4, 3);
      for (size_t c = 0; same && c < a.size(); ++c)
        same = a[c].pos == b[c].pos && a[c].seq_ids == b[c].seq_ids &&
               std::equal(a[c].ext.begin(), a[c].ext.begin() + n_ext, b[c].ext.begin());
    }
  }
  if (!same) return Status::Corruption(what + "cell metadata (CELL) is not the original's");
  return Status::OK();
}

std::vector<uint64_t> SnapshotReader::chunks_for_cell_prefix(uint64_t n_cells) const {
  const SegmentTable& t = impl_->m.segments;
  std::vector<uint64_t> out;
  for (uint64_t k = 0; k < t.n_frame_chunks; ++k) out.push_back(k);
  for (const Segment& s : t.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    const uint64_t cells = std::min<uint64_t>(n_cells, s.cell_count);
    const uint64_t jn = cells == 0 ? 0 : s.cell_chunk_of(cells - 1) + 1, J = s.cell_chunks();
    for (uint64_t b = 0; b < s.bands(); ++b) {
      for (uint64_t j = 0; j < jn; ++j) out.push_back(s.first_chunk + b * J + j);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {
// The row segments' one cells_per_chunk, 0 when they differ or there are none.
uint32_t uniform_cells_per_chunk(const SegmentTable& t) {
  uint32_t n = 0;
  for (const Segment& s : t.segments) {
    if (s.kind != SegmentKind::kRows) continue;
    if (n != 0 && s.cells_per_chunk != n) return 0;
    n = s.cells_per_chunk;
  }
  return n;
}
}  // namespace

uint64_t SnapshotReader::chunk_cells() const {
  // After an extension's cell restart chunks no longer start at multiples of it.
  if (impl_->m.segments.has_cell_restarts()) return 0;
  return uniform_cells_per_chunk(impl_->m.segments);
}

uint64_t SnapshotReader::read_cells() const {
  return uint64_t(uniform_cells_per_chunk(impl_->m.segments)) * impl_->group_size();
}

std::vector<uint64_t> SnapshotReader::block_bounds(uint64_t target) const {
  target = std::max<uint64_t>(target, 1);
  std::vector<uint64_t> cuts{0};
  uint64_t start = 0;  // of the block being filled
  // The next piece [at, at + n) joins the block, or starts a new one when the block would outgrow `target`.
  auto add = [&](uint64_t at, uint64_t n) {
    if (at > start && at + n - start > target) {
      cuts.push_back(at);
      start = at;
    }
  };
  for (const Segment& s : impl_->m.segments.segments) {
    // A piece that may not be cut: a row-major chunk, a band of tiles; frame bytes cut anywhere.
    if (s.kind == SegmentKind::kRows) {
      for (uint64_t j = 0; j < s.cell_chunks(); ++j) {
        const Segment::CellRun cells = s.cell_chunk(j);
        add(s.file_offset + cells.first * s.row_bytes, cells.count * s.row_bytes);
      }
      continue;
    }
    uint64_t piece = target;
    if (s.kind == SegmentKind::kTransposed) piece = uint64_t(s.rows_per_chunk) * s.cell_count * s.elem_bytes;
    for (uint64_t at = 0; at < s.size; at += piece) add(s.file_offset + at, std::min(piece, s.size - at));
  }
  const uint64_t end = impl_->m.provenance.file_size;
  if (cuts.back() != end) cuts.push_back(end);
  return cuts;
}

std::string SnapshotReader::describe_chunk(uint64_t index) const { return impl_->describe(index); }

bool starts_like_snapshot_file(std::span<const std::byte> head) {
  static_assert(kFileMagic.size() == kSnapshotMagicBytes);
  return head.size() >= kFileMagic.size() && std::memcmp(head.data(), kFileMagic.data(), kFileMagic.size()) == 0;
}

SnapshotReader::CacheStats SnapshotReader::cache_stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

namespace {

bool has_magic(const std::byte* p) { return std::memcmp(p, kFileMagic.data(), kFileMagic.size()) == 0; }

Status check_versions(const std::string& name, uint32_t version, uint32_t min_reader, const char* where) {
  if (version == 0 || min_reader == 0 || min_reader > version) {
    return Status::Corruption(name + ": " + where + ": format version " + std::to_string(version) +
                              " with minimum reader version " + std::to_string(min_reader) + " is invalid");
  }
  if (min_reader > kSnapshotReaderVersion) {
    return Status::NotSupported(name + ": written in kvsnap snapshot format version " + std::to_string(version) +
                                ", which needs a reader of version " + std::to_string(min_reader) +
                                " or later; this kvsnap reads version " + std::to_string(kSnapshotReaderVersion) +
                                ": upgrade kvsnap");
  }
  return Status::OK();
}

// The manifest area of an encrypted file, replaced by the manifest it seals. Without a cipher
// the header is still checked, so the error can name the key the file needs.
Status open_sealed_manifest(const std::string& name, const ChunkCipher* cipher, std::vector<std::byte>& bytes) {
  const std::string what = name + ": manifest";
  KV_ASSIGN_OR_RETURN(const SealedHeader h, parse_sealed_header(bytes, what));
  if (!cipher) {
    return Status::InvalidArgument(name + ": an encrypted snapshot file (key " + key_id_hex(h.master_key_id) +
                                   ", tenant key " + key_id_hex(h.tenant_key_id) +
                                   "), and no key was given: pass {--key-file FILE} or {--key-command CMD}");
  }
  std::vector<std::byte> plain;
  KV_RETURN_IF_ERROR(cipher->open_into(sealed_manifest_id(*cipher), bytes, plain, what));
  bytes.swap(plain);
  return Status::OK();
}

Result<std::unique_ptr<SnapshotReader::Impl>> make_impl(SnapshotManifest m, std::string name,
                                                         const SnapshotReadOptions& opts) {
  auto impl = std::make_unique<SnapshotReader::Impl>();
  impl->m = std::move(m);
  impl->name = std::move(name);
  impl->cache_cap = opts.cache_bytes;
  if (impl->m.encryption && opts.cipher) {
    // The wrong key or tenant is told here, once, before any chunk is fetched.
    const SnapshotEncryption& e = *impl->m.encryption;
    SealedHeader recorded;
    recorded.master_key_id = e.master_key_id;
    recorded.tenant_key_id = e.tenant_key_id;
    KV_RETURN_IF_ERROR(check_sealed_key_ids(recorded, opts.cipher->master_key_id(), opts.cipher->tenant_key_id(),
                                            impl->name + " (tenant " + quote_text(e.tenant) + ")"));
    impl->cipher = opts.cipher;
  }
  impl->build_shape();
  impl->original = std::make_unique<OriginalFile>(*impl);
  return impl;
}

}  // namespace

Result<std::unique_ptr<SnapshotReader>> open_snapshot_file(const ReadableFile& file, const SnapshotReadOptions& opts) {
  const std::string& name = file.name();
  const uint64_t size = file.size();
  if (size < kPreambleBytes + kTrailerBytes) {
    return Status::Corruption(name + ": " + std::to_string(size) + " bytes is too short for a kvsnap snapshot file (" +
                              std::to_string(kPreambleBytes + kTrailerBytes) + " at least)");
  }
  std::array<std::byte, kPreambleBytes> pre{};
  KV_RETURN_IF_ERROR(file.read_at(0, pre));
  if (!has_magic(pre.data())) return Status::Corruption(name + ": not a kvsnap snapshot file (bad magic)");
  // Version 2 (min reader 2) is the file form of an encrypted snapshot: a sealed version-1 manifest.
  const bool sealed = load_le<uint32_t>(pre.data() + 8) == kSealedFileVersion &&
                      load_le<uint32_t>(pre.data() + 12) == kSealedFileVersion;
  if (!sealed) {
    KV_RETURN_IF_ERROR(
        check_versions(name, load_le<uint32_t>(pre.data() + 8), load_le<uint32_t>(pre.data() + 12), "preamble"));
  }
  std::array<std::byte, kTrailerBytes> tr{};
  KV_RETURN_IF_ERROR(file.read_at(size - kTrailerBytes, tr));
  if (!has_magic(tr.data() + 72)) {
    return Status::Corruption(name +
                              ": no kvsnap trailer at the end: the file is truncated, was not completely written, "
                              "or has bytes appended");
  }
  const uint64_t area_off = load_le<uint64_t>(tr.data()), area_len = load_le<uint64_t>(tr.data() + 8);
  const uint64_t man_off = load_le<uint64_t>(tr.data() + 16), man_len = load_le<uint64_t>(tr.data() + 24);
  const uint32_t version = load_le<uint32_t>(tr.data() + 64), min_reader = load_le<uint32_t>(tr.data() + 68);
  if (!sealed) KV_RETURN_IF_ERROR(check_versions(name, version, min_reader, "trailer"));
  if (version != load_le<uint32_t>(pre.data() + 8) || min_reader != load_le<uint32_t>(pre.data() + 12)) {
    return Status::Corruption(name + ": preamble and trailer disagree on the format version");
  }
  const uint64_t body = size - kPreambleBytes - kTrailerBytes;
  if (area_off != kPreambleBytes || area_len > body || man_off != area_off + area_len || man_len != body - area_len) {
    return Status::Corruption(name + ": the trailer's layout (chunks at " + std::to_string(area_off) + " +" +
                              std::to_string(area_len) + ", manifest at " + std::to_string(man_off) + " +" +
                              std::to_string(man_len) + ") does not fit the file's " + std::to_string(size) +
                              " bytes: truncated or damaged");
  }
  if (man_len > kMaxManifestBytes) {
    return Status::NotSupported(name + ": manifest of " + std::to_string(man_len) + " bytes exceeds the " +
                                std::to_string(kMaxManifestBytes) + "-byte limit");
  }
  std::vector<std::byte> bytes(man_len);
  KV_RETURN_IF_ERROR(file.read_at(man_off, bytes));
  Sha256Digest want{};
  std::memcpy(want.data(), tr.data() + 32, 32);
  if (sha256_of(bytes) != want) {
    return Status::Corruption(name + ": the manifest does not match the SHA-256 in the trailer: the file is damaged");
  }
  if (sealed) KV_RETURN_IF_ERROR(open_sealed_manifest(name, opts.cipher, bytes));
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, parse_manifest(bytes, name + ": manifest"));
  if (sealed != m.encryption.has_value()) {
    return Status::Corruption(name + (sealed ? ": a sealed manifest that records no encryption"
                                             : ": an encrypted snapshot whose manifest is not sealed"));
  }
  if (!sealed && (m.format_version != version || m.min_reader_version != min_reader)) {
    return Status::Corruption(name + ": the manifest and the trailer disagree on the format version");
  }
  std::vector<uint64_t> offsets;
  offsets.reserve(m.chunks.size());
  uint64_t at = area_off;
  for (const ChunkRef& c : m.chunks) {
    offsets.push_back(at);
    at += c.stored_size;
  }
  if (at != man_off) {
    return Status::Corruption(name + ": the chunk table's blobs take " + std::to_string(at - area_off) +
                              " bytes, the chunk area has " + std::to_string(area_len));
  }
  KV_ASSIGN_OR_RETURN(auto impl, make_impl(std::move(m), name, opts));
  impl->owned_source = std::make_unique<FileChunkSource>(file, std::move(offsets));
  impl->source = impl->owned_source.get();
  return std::unique_ptr<SnapshotReader>(new SnapshotReader(std::move(impl)));
}

Result<std::unique_ptr<SnapshotReader>> open_snapshot(std::span<const std::byte> manifest_bytes, ChunkSource& chunks,
                                                      const SnapshotReadOptions& opts) {
  if (manifest_bytes.size() > kMaxManifestBytes) {
    return Status::NotSupported("manifest of " + std::to_string(manifest_bytes.size()) + " bytes exceeds the " +
                                std::to_string(kMaxManifestBytes) + "-byte limit");
  }
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, parse_manifest(manifest_bytes, "snapshot manifest"));
  const std::string name = "snapshot " + to_hex(m.manifest_sha256).substr(0, 12);
  KV_ASSIGN_OR_RETURN(auto impl, make_impl(std::move(m), name, opts));
  impl->source = &chunks;
  return std::unique_ptr<SnapshotReader>(new SnapshotReader(std::move(impl)));
}

}  // namespace kvsnap
