// Writing snapshots: plan the segments of a parsed state, cut them into
// chunks, encode the chunks on `threads` workers (2, 4 or 8 a job, at most 2 x threads jobs in
// flight: 4 x threads chunks, 8 x with shani-x4, 16 x with AVX2 lanes), and emit blobs in chunk order; then
// the content digest from the chunk ids, the manifest (and, for a file, the trailer).
#include <zstd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <ctime>
#include <map>
#include <tuple>

#include "base/os.h"
#include "base/sha256_lanes.h"
#include "base/text.h"
#include "format/content_digest.h"
#include "format/cursor.h"
#include "format/snapshot.h"
#include "format/snapshot_internal.h"
#include "format/snapshot_pipeline.h"

namespace kvsnap {

using namespace snapshot_detail;

namespace snapshot_detail {

// Transposed V: a band of R rows of every cell should fit kBandBytes (so a
// front-to-back read of original() decodes each tile once), and a tile
// (R rows x N cells) the chunk limit. R is a power of two unless it is all
// rows, so it changes only when the context doubles (dedup across snapshots of
// a growing conversation keeps working in between).
uint32_t rows_per_chunk(uint64_t n_rows, uint64_t cell_count, uint64_t elem_bytes, uint64_t cells_per_chunk) {
  const uint64_t row_len = cell_count * elem_bytes;
  uint64_t R = n_rows;
  if (n_rows * row_len > kBandBytes) {
    R = 1;
    while (R * 2 * row_len <= kBandBytes) R *= 2;
  }
  const uint64_t tile_row = std::min(cells_per_chunk, cell_count) * elem_bytes;
  R = std::min(R, std::max<uint64_t>(1, kMaxChunkRawBytes / tile_row));
  return uint32_t(std::min(R, n_rows));
}

void add_frame_segment(SegmentTable& t, uint64_t& at, uint64_t end) {
  if (end <= at) return;
  Segment fr;
  fr.kind = SegmentKind::kFrame;
  fr.file_offset = at;
  fr.size = end - at;
  fr.frame_offset = t.frame_bytes;
  t.frame_bytes += fr.size;
  t.segments.push_back(fr);
  at = end;
}

void number_chunks(SegmentTable& t) {
  t.n_frame_chunks = (t.frame_bytes + t.frame_chunk_bytes - 1) / t.frame_chunk_bytes;
  uint64_t next = t.n_frame_chunks;
  for (Segment& s : t.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    s.first_chunk = next;
    next += s.n_chunks();
  }
}

// --- ChunkReader (snapshot_internal.h) ---

ChunkReader::ChunkReader(const SegmentTable& t, const ReadableFile& file) : t_(t), file_(file) {
  for (const Segment& s : t.segments) (s.kind == SegmentKind::kFrame ? frames_ : tensors_).push_back(&s);
}

uint64_t ChunkReader::n_chunks() const {
  return tensors_.empty() ? t_.n_frame_chunks : tensors_.back()->first_chunk + tensors_.back()->n_chunks();
}

const Segment* ChunkReader::tensor_segment(uint64_t index) const {
  if (index < t_.n_frame_chunks) return nullptr;
  auto it = std::upper_bound(tensors_.begin(), tensors_.end(), index,
                             [](uint64_t i, const Segment* s) { return i < s->first_chunk; });
  return *std::prev(it);
}

Status ChunkReader::read(uint64_t index, std::vector<std::byte>& out) const {
  if (index < t_.n_frame_chunks) return read_frame(index, out);
  const Segment& s = *tensor_segment(index);
  const uint64_t k = index - s.first_chunk;
  out.resize(s.chunk_raw_size(k));
  const uint64_t J = s.cell_chunks(), j = k % J, b = k / J;
  const Segment::CellRun cells = s.cell_chunk(j);
  if (s.kind == SegmentKind::kRows) return file_.read_at(s.file_offset + cells.first * s.row_bytes, out);
  // A tile: for each row of band b, the elements of cells [c0, c0 + n_j).
  const uint64_t eb = s.elem_bytes, row_len = uint64_t(s.cell_count) * eb;
  const uint64_t n_j = cells.count;
  const uint64_t r0 = b * s.rows_per_chunk, rows = out.size() / (n_j * eb);
  for (uint64_t r = 0; r < rows; ++r) {
    std::span<std::byte> dst(out.data() + r * n_j * eb, n_j * eb);
    KV_RETURN_IF_ERROR(file_.read_at(s.file_offset + (r0 + r) * row_len + cells.first * eb, dst));
  }
  return Status::OK();
}

Status ChunkReader::read_frame(uint64_t k, std::vector<std::byte>& out) const {
  const uint64_t begin = k * t_.frame_chunk_bytes;
  const uint64_t end = std::min<uint64_t>(begin + t_.frame_chunk_bytes, t_.frame_bytes);
  out.resize(end - begin);
  auto it = std::upper_bound(frames_.begin(), frames_.end(), begin,
                             [](uint64_t o, const Segment* s) { return o < s->frame_offset; });
  for (--it; it != frames_.end(); ++it) {
    const Segment& s = **it;
    const uint64_t lo = std::max(begin, s.frame_offset), hi = std::min(end, s.frame_offset + s.size);
    if (lo >= hi) break;
    std::span<std::byte> dst(out.data() + (lo - begin), hi - lo);
    KV_RETURN_IF_ERROR(file_.read_at(s.file_offset + (lo - s.frame_offset), dst));
  }
  return Status::OK();
}

// At most this many restarts in a segment's cell grid: each piece ends in a partial chunk (more
// chunks, smaller ones). Past it a save adds no restart: its last piece carries on from the
// parent's last restart, as a uniform grid would, re-storing at most the cells of the parent's
// partial last chunk. (Merging older pieces instead re-stores whole pieces, ~1/32 of the context
// per turn once they have grown: more than the uniform grid.)
constexpr size_t kMaxCellRestarts = 32;

static bool same_grid_place(const Segment& a, const Segment& b) {
  return a.kind == b.kind && a.section == b.section && a.stream == b.stream && a.layer == b.layer &&
         a.is_v == b.is_v && a.ggml_type == b.ggml_type && a.row_bytes == b.row_bytes &&
         a.elem_bytes == b.elem_bytes && a.n_rows == b.n_rows && a.cells_per_chunk == b.cells_per_chunk &&
         a.rows_per_chunk == b.rows_per_chunk;
}

// The restarts that keep `parent`'s chunks among `s`'s: the parent's own below s's cell count,
// and the parent's end when it falls inside s off the grid of the parent's last piece, while
// the segment has fewer than kMaxCellRestarts (a parent with more, which this writer never
// makes, keeps its first ones: the pieces after them are stored again).
static std::vector<uint32_t> continued_restarts(const Segment& s, const Segment& parent) {
  std::vector<uint32_t> out;
  for (uint32_t r : parent.cell_restarts()) {
    if (r >= s.cell_count || out.size() == kMaxCellRestarts) break;
    out.push_back(r);
  }
  const uint32_t end = parent.cell_count, last = out.empty() ? 0 : out.back();
  if (out.size() < kMaxCellRestarts && end > last && end < s.cell_count && (end - last) % s.cells_per_chunk != 0)
    out.push_back(end);
  return out;
}

// Gives each tensor segment of `t` the restarts `restarts_of(s, p)` computes from the segment `p`
// of `from` with the same place and geometry, then numbers the chunks again.
template <class RestartsOf>
static void take_cell_grids(SegmentTable& t, const SegmentTable& from, RestartsOf restarts_of) {
  // `from`'s tensor segments by place (a session file may have thousands: streams x layers x 2).
  std::map<std::tuple<uint32_t, uint32_t, uint32_t, bool>, const Segment*> by_place;
  for (const Segment& p : from.segments)
    if (p.kind != SegmentKind::kFrame) by_place.emplace(std::make_tuple(p.section, p.stream, p.layer, p.is_v), &p);
  bool changed = false;
  for (Segment& s : t.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    auto it = by_place.find(std::make_tuple(s.section, s.stream, s.layer, s.is_v));
    if (it == by_place.end() || !same_grid_place(s, *it->second)) continue;
    std::vector<uint32_t> restarts = restarts_of(s, *it->second);
    if (restarts.empty()) continue;
    s.set_cell_restarts(std::move(restarts));
    changed = true;
  }
  if (changed) number_chunks(t);
}

void continue_cell_grids(SegmentTable& t, const SegmentTable& parent) {
  take_cell_grids(t, parent, continued_restarts);
}

void adopt_cell_grids(SegmentTable& t, const SegmentTable& snapshot) {
  // All of the snapshot's restarts inside the segment, however many another writer made: where
  // the file is the snapshot's content its segments have the snapshot's cell counts, so this is
  // the snapshot's grid; where it is not, the digests differ anyway.
  take_cell_grids(t, snapshot, [](const Segment& s, const Segment& snap) {
    std::vector<uint32_t> out;
    for (uint32_t r : snap.cell_restarts())
      if (r < s.cell_count) out.push_back(r);
    return out;
  });
}

}  // namespace snapshot_detail

namespace {

struct TensorPiece {
  ByteRange range;
  Segment seg;
};

Result<SegmentTable> plan_segments(const StateFile& f, uint32_t cells_per_chunk, const std::string& name) {
  std::vector<TensorPiece> tensors;
  for (size_t si = 0; si < f.memory.kv.size(); ++si) {
    const KvSection& sec = f.memory.kv[si];
    for (size_t s = 0; s < sec.streams.size(); ++s) {
      const KvStream& st = sec.streams[s];
      if (st.cell_count == 0) continue;
      for (size_t il = 0; il < st.layers.size(); ++il) {
        const KvLayer& L = st.layers[il];
        Segment k;
        k.kind = SegmentKind::kRows;
        k.section = uint32_t(si), k.stream = uint32_t(s), k.layer = uint32_t(il);
        k.ggml_type = L.k_type;
        k.row_bytes = L.k_row_bytes;
        k.cell_count = st.cell_count;
        tensors.push_back({L.k, k});
        if (!L.has_v) continue;
        Segment v = k;
        v.is_v = true;
        v.ggml_type = L.v_type;
        if (st.v_trans) {
          v.kind = SegmentKind::kTransposed;
          v.row_bytes = 0;
          v.elem_bytes = L.v_elem_bytes;
          v.n_rows = L.n_embd_v_gqa;
        } else {
          v.row_bytes = L.v_row_bytes;
        }
        tensors.push_back({L.v, v});
      }
    }
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorPiece& a, const TensorPiece& b) { return a.range.offset < b.range.offset; });
  SegmentTable t;
  t.frame_chunk_bytes = kFrameChunkBytes;
  uint64_t at = 0;
  auto add_frame = [&](uint64_t end) { add_frame_segment(t, at, end); };
  for (TensorPiece& p : tensors) {
    if (p.range.offset < at || p.range.size > f.file_size - p.range.offset || p.range.offset > f.file_size) {
      return Status::InvalidArgument(name + ": the parsed state's tensor ranges overlap or run past the file");
    }
    if (p.range.size == 0) continue;
    add_frame(p.range.offset);
    Segment s = p.seg;
    s.file_offset = p.range.offset;
    s.size = p.range.size;
    if (s.kind == SegmentKind::kRows) {
      if (s.row_bytes > kMaxChunkRawBytes) {
        return Status::NotSupported(name + ": " + describe_segment(s) + ": a row of " + std::to_string(s.row_bytes) +
                                    " bytes exceeds the " + std::to_string(kMaxChunkRawBytes) + "-byte chunk limit");
      }
      s.cells_per_chunk = uint32_t(std::min<uint64_t>(cells_per_chunk, kMaxChunkRawBytes / s.row_bytes));
    } else {
      s.cells_per_chunk = uint32_t(std::min<uint64_t>(cells_per_chunk, kMaxChunkRawBytes / std::max(1u, s.elem_bytes)));
      s.rows_per_chunk = rows_per_chunk(s.n_rows, s.cell_count, s.elem_bytes, s.cells_per_chunk);
    }
    t.segments.push_back(s);
    at = p.range.offset + p.range.size;
  }
  add_frame(f.file_size);
  number_chunks(t);
  return t;
}

Status check_options(const SnapshotOptions& o) {
  if (o.cells_per_chunk == 0 || o.cells_per_chunk > (1u << 24)) {
    return Status::InvalidArgument("{--cells-per-chunk} " + std::to_string(o.cells_per_chunk) + " is out of range (1..16777216)");
  }
  if (o.zstd_level < ZSTD_minCLevel() || o.zstd_level > ZSTD_maxCLevel()) {
    return Status::InvalidArgument("zstd level ({--level}) " + std::to_string(o.zstd_level) + " is out of range (" +
                                   std::to_string(ZSTD_minCLevel()) + ".." + std::to_string(ZSTD_maxCLevel()) + ")");
  }
  if (o.threads == 0 || o.threads > 256) {
    return Status::InvalidArgument("{--threads} " + std::to_string(o.threads) + " is out of range (0 = every core, 1..256)");
  }
  return Status::OK();
}

struct Slot {
  std::vector<std::byte> raw;
  std::vector<std::byte> blob;  // its first blob_size bytes (ChunkEncoder::encode_into)
  size_t blob_size = 0;
  std::vector<std::byte> spare;  // encrypting: the other buffer, swapped with blob (no allocation)
  ChunkRef ref;
};

// The known chunks that carry an xxh, by it (SnapshotOptions::known_chunks).
using KnownByXxh = std::map<ChunkXxh, const ChunkRef*>;
KnownByXxh known_by_xxh(const SnapshotOptions& o) {
  KnownByXxh out;
  if (o.known_chunks && !o.cipher)
    for (const auto& [sha, ref] : *o.known_chunks)
      if (ref.xxh) out.emplace(*ref.xxh, &ref);
  return out;
}

// A known chunk stands for this one: the sink gets its ref (stored already, not encoded again).
void take_known(const ChunkRef& known, uint64_t index, const std::optional<ChunkXxh>& xxh, Slot& slot) {
  slot.ref = known;
  slot.ref.index = index;
  slot.ref.xxh = xxh;
  slot.blob_size = 0;
}

// Reads chunk `index` into the slot and takes a known chunk for it where its equality digest
// finds one; false when it still needs its id (then slot.ref.xxh is set).
Result<bool> read_one(const ChunkReader& reader, uint64_t index, const SnapshotOptions& o, const KnownByXxh& known_xxh,
                      Slot& slot) {
  KV_RETURN_IF_ERROR(reader.read(index, slot.raw));
  // The equality digest first (memory speed): a parent's chunk found by it needs no SHA-256.
  // Encrypted snapshots record none (a plain digest of the plaintext; their ids are keyed).
  std::optional<ChunkXxh> xxh;
  if (!o.cipher) xxh = chunk_xxh(slot.raw);
  if (xxh) {
    auto it = known_xxh.find(*xxh);
    if (it != known_xxh.end() && it->second->raw_size == slot.raw.size()) {
      take_known(*it->second, index, xxh, slot);
      return true;
    }
  }
  slot.ref.xxh = xxh;
  return false;
}

// The rest of a chunk read by read_one, given its id: a known chunk by id, else encoded (and sealed).
Status encode_one(const ChunkReader& reader, uint64_t index, const Sha256Digest& sha, ChunkEncoder& enc,
                  const SnapshotOptions& o, Slot& slot) {
  const std::optional<ChunkXxh> xxh = slot.ref.xxh;
  if (o.known_chunks) {
    auto it = o.known_chunks->find(sha);
    if (it != o.known_chunks->end() && it->second.raw_size == slot.raw.size()) {
      take_known(it->second, index, xxh, slot);
      return Status::OK();
    }
  }
  const Segment* seg = reader.tensor_segment(index);
  const FilterChoice filter = seg && o.byte_shuffle ? filter_for_type(seg->ggml_type) : FilterChoice{};
  slot.ref.sha256 = sha;
  slot.ref.raw_size = slot.raw.size();
  slot.ref.index = index;
  KV_ASSIGN_OR_RETURN(slot.blob_size, enc.encode_into(slot.raw, filter, slot.blob));
  KV_ASSIGN_OR_RETURN(BlobHeader h, read_blob_header(std::span<const std::byte>(slot.blob.data(), slot.blob_size)));
  if (o.cipher) {
    // Encrypt after compression (ciphertext does not compress); the codec fields below stay
    // those of the blob inside, which a reader with the key decodes.
    KV_ASSIGN_OR_RETURN(const size_t n,
                        o.cipher->seal_into(sha, std::span<const std::byte>(slot.blob.data(), slot.blob_size), slot.spare));
    slot.blob.swap(slot.spare);
    slot.blob_size = n;
  }
  slot.ref.stored_size = slot.blob_size;
  slot.ref.codec = h.codec;
  slot.ref.filter = h.filter;
  slot.ref.elem_size = h.elem_size;
  return Status::OK();
}

// Chunks first..first+count-1 (count <= Sha256Lanes::kMaxLanes) into slots[0..count-1]: the ids
// of those that need one are computed together (base/sha256_lanes.h: two or four SHA-256s interleaved, or
// eight in AVX2 lanes, run faster than one after the other), keyed ids one by one.
Status encode_group(const ChunkReader& reader, uint64_t first, size_t count, ChunkEncoder& enc, const SnapshotOptions& o,
                    const KnownByXxh& known_xxh, Slot* slots) {
  std::array<std::span<const std::byte>, Sha256Lanes::kMaxLanes> need{};
  std::array<size_t, Sha256Lanes::kMaxLanes> which{};
  size_t n_need = 0;
  for (size_t k = 0; k < count; ++k) {
    KV_ASSIGN_OR_RETURN(const bool known, read_one(reader, first + k, o, known_xxh, slots[k]));
    if (!known) which[n_need] = k, need[n_need++] = slots[k].raw;
  }
  std::array<Sha256Digest, Sha256Lanes::kMaxLanes> ids{};
  if (o.cipher) {
    for (size_t j = 0; j < n_need; ++j) ids[j] = o.cipher->chunk_id(need[j]);
  } else {
    sha256_many(std::span(need).first(n_need), ids);
  }
  for (size_t j = 0; j < n_need; ++j) KV_RETURN_IF_ERROR(encode_one(reader, first + which[j], ids[j], enc, o, slots[which[j]]));
  return Status::OK();
}

// SnapshotOptions::adaptive. The sink (the calling thread) appends to a pack whose write-behind
// makes it wait while the disk is behind (base/io.h pace_to_disk), or to a network store, and
// between two jobs waits for the encoders when they are behind. A thread that blocks makes a
// voluntary context switch; one that only lost time slices to the encoders does not. So the sink
// tells which side is the limit:
//  - its storage made it wait while it appended a job (SnapshotOptions::storage_waits; where the
//    storage cannot say, the thread blocked during the job): the disk (or the network) is, and
//    the CPU has time: compress the jobs begun from now on. (The thread's own count alone also
//    counts blocks that are not the disk's: page-cache reclaim, a catalog's round trips. On a VM
//    whose disk never held a save back, they turned compression on for a third of the chunks.)
//  - it blocked between two jobs (waiting for the next) and has not blocked in its appends for a
//    write-behind window and a ring of jobs: the CPU is, and raw chunks cost the least: store
//    them raw. (The pack blocks at most once a window; in between, the sink waits for the
//    encoders, so that wait alone says nothing. The ring's worth is slack for a window that ends
//    without a block.)
//  - otherwise: as before (a save that compresses at the disk's pace stays compressed, one that
//    stores raw at the CPU's stays raw).
// Until the sink has taken kAdaptiveFirstBytes of encoded blobs every chunk is compressed (the
// disk's pace shows only once the write-behind can wait; a parent's chunk, found by its digest,
// brings no blob). Where the count is not known (not Linux) every chunk is compressed. A worker
// decides as it begins a job, so a change reaches the jobs begun after it.
class AdaptiveLevel {
 public:
  using BlockedCount = std::function<std::optional<uint64_t>()>;
  // Both counts before the sink takes a job (before_sink), for after_sink.
  struct Before {
    std::optional<uint64_t> thread, storage;
  };
  // ring_jobs: how many jobs the pipeline holds (the sink takes that many at once after a block).
  // storage: SnapshotOptions::storage_waits (empty: not known).
  AdaptiveLevel(bool on, BlockedCount count, BlockedCount storage, size_t ring_jobs)
      : on_(on), count_(count ? std::move(count) : BlockedCount(thread_blocked_count)),
        storage_(storage ? std::move(storage) : BlockedCount([] { return std::optional<uint64_t>(); })),
        ring_jobs_(ring_jobs) {}
  bool on() const { return on_; }
  // For a worker about to encode a job.
  bool compress() const {
    return !known_.load(std::memory_order_relaxed) ||
           encoded_.load(std::memory_order_relaxed) < snapshot_detail::kAdaptiveFirstBytes ||
           compressing_.load(std::memory_order_relaxed);
  }
  // The sink, before it takes a job.
  Before before_sink() {
    if (!on_) return {};
    const std::optional<uint64_t> now = count_();
    const uint64_t hold = kWriteBehindBytes + ring_jobs_ * (blob_bytes_ / std::max<uint64_t>(1, jobs_));
    if (now && after_last_ && *now != *after_last_ && blob_bytes_ - blocked_at_ > hold)
      compressing_.store(false, std::memory_order_relaxed);
    return {now, storage_()};
  }
  // The sink, after it took a job with `blob_bytes` of encoded blobs.
  void after_sink(uint64_t blob_bytes, const Before& before) {
    if (!on_) return;
    ++jobs_;
    blob_bytes_ += blob_bytes;
    encoded_.store(blob_bytes_, std::memory_order_relaxed);
    after_last_ = count_();
    const std::optional<uint64_t> storage = storage_();
    if (!before.thread || !after_last_) {
      known_.store(false, std::memory_order_relaxed);
    } else if (before.storage && storage ? *storage != *before.storage : *after_last_ != *before.thread) {
      compressing_.store(true, std::memory_order_relaxed);
      blocked_at_ = blob_bytes_;
    }
  }

 private:
  const bool on_;
  const BlockedCount count_, storage_;
  const uint64_t ring_jobs_;
  // The sink's own: the count when it took its last job, jobs and blob bytes taken, where it last
  // blocked in its appends.
  std::optional<uint64_t> after_last_;
  uint64_t jobs_ = 0, blob_bytes_ = 0, blocked_at_ = 0;
  // Written by the sink, read by the workers (a stale value decides one job).
  std::atomic<bool> known_{true};
  std::atomic<uint64_t> encoded_{0};      // blob_bytes_, for the workers
  std::atomic<bool> compressing_{true};   // the last side seen to be the limit was the disk's
};

// Encodes every chunk on `o.threads` persistent workers, as many chunks a job as the SHA-256
// kernel hashes at once (at least two: 2 or 4 with SHA-NI, 8 with AVX2 lanes), and hands the blobs to
// `sink` in order on this thread while the workers go on (format/snapshot_pipeline.h):
// 2 x threads jobs in flight at most (one being encoded, one waiting for the sink, per worker).
Status encode_all(const ChunkReader& reader, const SnapshotOptions& o, ChunkSink& sink, std::vector<ChunkRef>& refs) {
  const size_t group = std::max<size_t>(2, sha256_kernel_width(sha256_kernel()));
  const uint64_t n = reader.n_chunks();
  const uint64_t jobs = (n + group - 1) / group;
  auto group_size = [&](uint64_t job) { return size_t(std::min<uint64_t>(group, n - job * group)); };
  std::vector<std::unique_ptr<ChunkEncoder>> encoders;
  for (uint32_t t = 0; t < o.threads; ++t) encoders.push_back(std::make_unique<ChunkEncoder>(o.zstd_level, o.compress));
  std::vector<Slot> slots(group * 2 * o.threads);
  const KnownByXxh known_xxh = known_by_xxh(o);
  AdaptiveLevel adaptive(o.adaptive && o.compress, o.blocked_count, o.storage_waits, slots.size() / group);
  refs.reserve(n);
  return ordered_pipeline(
      jobs, o.threads, slots.size() / group,
      [&](uint64_t job, size_t slot, uint32_t worker) {
        if (adaptive.on()) encoders[worker]->set_compress(adaptive.compress());
        return encode_group(reader, job * group, group_size(job), *encoders[worker], o, known_xxh, &slots[group * slot]);
      },
      [&](uint64_t job, size_t slot) {
        const AdaptiveLevel::Before blocked = adaptive.before_sink();
        uint64_t blobs = 0;
        for (size_t k = 0; k < group_size(job); ++k) {
          Slot& s = slots[group * slot + k];
          blobs += s.blob_size;  // 0 for a parent's chunk
          KV_RETURN_IF_ERROR(sink.put_buffer(s.ref, s.blob, s.blob_size));  // may swap s.blob
          refs.push_back(s.ref);
        }
        adaptive.after_sink(blobs, blocked);
        return Status::OK();
      });
}

}  // namespace

Status snapshot_detail::encode_snapshot_chunks(const ReadableFile& original, const SnapshotOptions& opts,
                                               ChunkSink& chunks, SnapshotManifest& m) {
  KV_RETURN_IF_ERROR(check_options(opts));
  ChunkReader reader(m.segments, original);
  KV_RETURN_IF_ERROR(encode_all(reader, opts, chunks, m.chunks).Prefixed(original.name()));
  // The content digest needs no pass over the file: every chunk's id is known by now (a parent's
  // chunk found by its equality digest brings its id along), so an extension costs its new chunks.
  const bool grid = m.segments.has_cell_restarts();
  m.format_version = grid ? kSnapshotGridVersion : kSnapshotFormatVersion;
  m.min_reader_version = grid ? kSnapshotGridVersion : kSnapshotMinReaderVersion;
  m.content_digest = content_digest_of_table(m.segments, original.size(), m.chunks, opts.cipher != nullptr);
  return Status::OK();
}

Result<SegmentTable> snapshot_detail::plan_state_segments(const StateFile& parsed, const ReadableFile& original,
                                                         uint32_t cells_per_chunk) {
  if (parsed.file_size != original.size()) {
    return Status::InvalidArgument(original.name() + ": the parsed state describes " +
                                   std::to_string(parsed.file_size) + " bytes, the file has " +
                                   std::to_string(original.size()));
  }
  SnapshotOptions o;
  o.cells_per_chunk = cells_per_chunk;
  KV_RETURN_IF_ERROR(check_options(o));
  return plan_segments(parsed, cells_per_chunk, original.name());
}

Result<SnapshotManifest> build_snapshot(const StateFile& parsed, const ReadableFile& original,
                                        const SnapshotOptions& opts, ChunkSink& chunks) {
  KV_RETURN_IF_ERROR(check_options(opts));
  const std::string& name = original.name();
  if (parsed.file_size != original.size()) {
    return Status::InvalidArgument(name + ": the parsed state describes " + std::to_string(parsed.file_size) +
                                   " bytes, the file has " + std::to_string(original.size()));
  }
  SnapshotManifest m;
  KV_ASSIGN_OR_RETURN(m.segments, plan_segments(parsed, opts.cells_per_chunk, name));
  if (opts.parent_grid) continue_cell_grids(m.segments, *opts.parent_grid);
  KV_RETURN_IF_ERROR(encode_snapshot_chunks(original, opts, chunks, m));
  m.provenance = {std::string(), opts.writer, parsed.kind, parsed.magic, parsed.version, parsed.file_size,
                  m.content_digest};
  if (m.provenance.writer.src_rotation == "auto") m.provenance.writer.src_rotation.clear();
  m.info = build_info(parsed, opts, m.content_digest, opts.created.empty() ? utc_now("%Y-%m-%dT%H:%M:%SZ") : opts.created);
  m.provenance.source = m.info["provenance"]["source"].get<std::string>();
  if (!parsed.arch.empty()) m.arch = parsed.arch;
  else if (opts.model && !opts.model->arch.empty()) m.arch = opts.model->arch;
  m.model = opts.model;
  m.cells_per_chunk = opts.cells_per_chunk;
  m.lossy = opts.lossy.has_value();
  for (const KvSection& sec : parsed.memory.kv) {
    CellSection cs;
    cs.ext_bytes = sec.ext_bytes;
    for (const KvStream& st : sec.streams) cs.streams.push_back(st.cells);
    m.cells.push_back(std::move(cs));
  }
  m.tokens = {parsed.tokens.tokens, parsed.tokens.words, parsed.tokens.packed};
  if (opts.cipher) {
    m.encryption = SnapshotEncryption{opts.cipher->tenant(), opts.cipher->master_key_id(), opts.cipher->tenant_key_id()};
  }
  KV_RETURN_IF_ERROR(encode_manifest(m));
  return m;
}

namespace {

// Blobs go straight into the file, in chunk order: their offsets are implied.
class FileChunkSink final : public ChunkSink {
 public:
  explicit FileChunkSink(ByteSink& out) : out_(out) {}
  Status put(const ChunkRef&, std::span<const std::byte> blob) override {
    bytes += blob.size();
    return out_.append(blob);
  }
  uint64_t bytes = 0;

 private:
  ByteSink& out_;
};

}  // namespace

namespace {

std::vector<std::byte> preamble_bytes(uint32_t version, uint32_t min_reader) {
  std::vector<std::byte> pre;
  put_bytes(pre, kFileMagic.data(), kFileMagic.size());
  put_u32(pre, version);
  put_u32(pre, min_reader);
  return pre;
}

// `manifest_area`: the manifest bytes as the file holds them (sealed when encrypted).
std::vector<std::byte> trailer_bytes(std::span<const std::byte> manifest_area, uint64_t blob_bytes, uint32_t version,
                                     uint32_t min_reader) {
  std::vector<std::byte> tr;
  put_u64(tr, kPreambleBytes);
  put_u64(tr, blob_bytes);
  put_u64(tr, kPreambleBytes + blob_bytes);
  put_u64(tr, manifest_area.size());
  const Sha256Digest sha = sha256_of(manifest_area);
  put_bytes(tr, sha.data(), 32);
  put_u32(tr, version);
  put_u32(tr, min_reader);
  put_bytes(tr, kFileMagic.data(), kFileMagic.size());
  return tr;
}

// The file form's versions: a plain snapshot's own, or 2 for a sealed manifest.
std::pair<uint32_t, uint32_t> file_versions(bool sealed, const SnapshotManifest* m) {
  if (sealed) return {kSealedFileVersion, kSealedFileVersion};
  return m ? std::make_pair(m->format_version, m->min_reader_version) : std::make_pair(kSnapshotFormatVersion, kSnapshotMinReaderVersion);
}

}  // namespace

Result<SnapshotManifest> write_snapshot_file(const StateFile& parsed, const ReadableFile& original,
                                             const SnapshotOptions& opts, ByteSink& sink) {
  if (opts.parent_grid) {
    return Status::InvalidArgument(original.name() + ": a standalone snapshot file does not continue a parent's "
                                   "cell grid (its preamble's version is written before the grid is planned)");
  }
  BufferedSink out(sink);
  const auto [version, min_reader] = file_versions(opts.cipher != nullptr, nullptr);
  KV_RETURN_IF_ERROR(out.append(preamble_bytes(version, min_reader)));
  FileChunkSink chunks(out);
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, build_snapshot(parsed, original, opts, chunks));
  std::vector<std::byte> sealed;
  if (opts.cipher) {
    KV_ASSIGN_OR_RETURN(const size_t n, opts.cipher->seal_into(sealed_manifest_id(*opts.cipher), m.bytes, sealed));
    sealed.resize(n);
  }
  const std::span<const std::byte> area = opts.cipher ? std::span<const std::byte>(sealed) : m.bytes;
  KV_RETURN_IF_ERROR(out.append(area));
  const auto [tv, tm] = file_versions(opts.cipher != nullptr, &m);
  KV_RETURN_IF_ERROR(out.append(trailer_bytes(area, chunks.bytes, tv, tm)));
  KV_RETURN_IF_ERROR(out.flush());
  return m;
}

Result<SnapshotFileAssembler> SnapshotFileAssembler::plan(const SnapshotManifest& m, ChunkSource& blobs,
                                                          const ChunkCipher* cipher) {
  if (m.encryption) {
    if (!cipher) {
      return Status::InvalidArgument("the snapshot is encrypted with key " + key_id_hex(m.encryption->master_key_id) +
                                     " for tenant '" + m.encryption->tenant +
                                     "', and no key was given to seal its manifest: pass {--key-file FILE} or "
                                     "{--key-command CMD}");
    }
    SealedHeader recorded;
    recorded.master_key_id = m.encryption->master_key_id;
    recorded.tenant_key_id = m.encryption->tenant_key_id;
    KV_RETURN_IF_ERROR(check_sealed_key_ids(recorded, cipher->master_key_id(), cipher->tenant_key_id(), "snapshot"));
  }
  SnapshotFileAssembler a;
  a.m_ = m;
  for (ChunkRef& ref : a.m_.chunks) {
    KV_ASSIGN_OR_RETURN(std::vector<std::byte> blob, blobs.get(ref));
    if (m.encryption) {
      // Exported as stored, and without the key: what is inside cannot be read, so the codec
      // fields stay as recorded (a reader decodes the inner blob by its own header anyway).
      const std::string what = "chunk " + std::to_string(ref.index);
      KV_ASSIGN_OR_RETURN(const SealedHeader h, parse_sealed_header(blob, what));
      KV_RETURN_IF_ERROR(check_sealed_key_ids(h, m.encryption->master_key_id, m.encryption->tenant_key_id, what));
      ref.stored_size = blob.size();
      a.blob_bytes_ += blob.size();
      continue;
    }
    KV_ASSIGN_OR_RETURN(BlobHeader h, read_blob_header(blob));
    if (h.raw_size != ref.raw_size)
      return Status::Corruption("chunk " + std::to_string(ref.index) + ": the blob holds " +
                                std::to_string(h.raw_size) + " raw bytes, the manifest says " +
                                std::to_string(ref.raw_size));
    ref.stored_size = blob.size();
    ref.codec = h.codec;
    ref.filter = h.filter;
    ref.elem_size = h.elem_size;
    a.blob_bytes_ += blob.size();
  }
  KV_RETURN_IF_ERROR(encode_manifest(a.m_));
  if (m.encryption) {
    KV_ASSIGN_OR_RETURN(const size_t n, cipher->seal_into(sealed_manifest_id(*cipher), a.m_.bytes, a.sealed_manifest_));
    a.sealed_manifest_.resize(n);
  }
  return a;
}

uint64_t SnapshotFileAssembler::file_size() const {
  return kPreambleBytes + blob_bytes_ + (m_.encryption ? sealed_manifest_.size() : m_.bytes.size()) + kTrailerBytes;
}

Status SnapshotFileAssembler::write(ChunkSource& blobs, ByteSink& out) const {
  const bool sealed = m_.encryption.has_value();
  const auto [version, min_reader] = file_versions(sealed, &m_);
  KV_RETURN_IF_ERROR(out.append(preamble_bytes(version, min_reader)));
  for (const ChunkRef& ref : m_.chunks) {
    KV_ASSIGN_OR_RETURN(std::vector<std::byte> blob, blobs.get(ref));
    if (blob.size() != ref.stored_size)
      return Status::Corruption("chunk " + std::to_string(ref.index) + " changed size while being exported");
    KV_RETURN_IF_ERROR(out.append(blob));
  }
  const std::span<const std::byte> area = sealed ? std::span<const std::byte>(sealed_manifest_) : m_.bytes;
  KV_RETURN_IF_ERROR(out.append(area));
  return out.append(trailer_bytes(area, blob_bytes_, version, min_reader));
}

}  // namespace kvsnap
