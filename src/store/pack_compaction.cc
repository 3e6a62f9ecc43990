// compact_packs(): which packs are dead enough, and for each the copy of its live blobs into a new
// pack, the move of its rows, the deletion of the old pack. Generic over the Catalog and BlobStore
// interfaces, like collect_garbage.
#include "store/pack_compaction.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "store/store_internal.h"

namespace kvsnap {

namespace {

// How one pack's compaction ended when it did not: the pack itself could not be read or moved (the
// next one may do), storage failing while writing (a full disk: the next would fail the same way),
// or options.progress saying stop (returned as it is).
enum class Failure { kNone, kThisPack, kStorage, kStopped };

struct Attempt {
  Status status;
  Failure failure = Failure::kNone;
};

Attempt this_pack(Status s) { return {std::move(s), Failure::kThisPack}; }
Attempt storage(Status s) { return {std::move(s), Failure::kStorage}; }

// After the new pack is durable, a move refused by its guard (kMismatch: checked inside the
// transaction, nothing moved) leaves it unused: deleted at once (no row names it, gc holds the
// lock), so a gc that goes on keeps no more than one pack's copy beyond what the store holds. (If
// that fails too, the next gc deletes it.) Any other failure may be a commit whose outcome is
// unknown (SQLite's WAL fsync failing after its commit frame was written: recovery after a crash
// finds the move committed), so the new pack stays; compaction stops, and the next gc deletes
// whichever pack no row names.
Attempt drop_new_pack(BlobStore& blobs, const GcLock& lock, const std::string& new_pack, Attempt why) {
  if (!new_pack.empty()) (void)blobs.remove_pack(lock, new_pack);
  return why;
}

// The pack's live blobs into a new pack, then the rows, then the old pack deleted.
Attempt compact_one(Catalog& catalog, BlobStore& blobs, const GcLock& lock, const std::string& pack,
                    const GcOptions& options) {
  auto rows = catalog.chunks_in_pack(pack);
  if (!rows.ok()) return storage(rows.status());
  auto batch = blobs.begin_write_for_gc(lock);
  if (!batch.ok()) return storage(batch.status());
  std::vector<ChunkMove> moves;
  std::vector<std::byte> blob;  // one at a time
  GcProgress progress;
  progress.compacting = true;
  for (const ChunkUse& u : *rows) {
    if (options.progress) {
      Status go_on = options.progress(progress);
      if (!go_on.ok()) return {go_on, Failure::kStopped};
    }
    // Any failed read is this pack's (gone, short, a bad sector: EIO); compact_packs stops when
    // several packs in a row cannot be read, which is storage rather than one pack.
    Status read = blobs.read_stored_into(u.sha256, u.location(), store_detail::kMaxBlobBytes, blob);
    if (!read.ok()) return this_pack(read);
    auto to = (*batch)->append(u.sha256, blob);
    if (!to.ok()) return storage(to.status());
    moves.push_back({u.sha256, u.location(), *to});
  }
  if (Status s = (*batch)->commit(); !s.ok()) return storage(s);
  // From here the new pack is durable; until the move commits, no row names it.
  const std::string new_pack = moves.empty() ? std::string() : moves.front().to.pack;
  if (Status s = catalog.move_chunks(moves, lock.hold()); !s.ok())
    return s.code() == Code::kMismatch ? drop_new_pack(blobs, lock, new_pack, this_pack(s)) : storage(s);
  // Every row that named the old pack names the new one now (a refcount-0 row of an `rm` beside
  // this gc moved too); asked again rather than assumed.
  auto unused = catalog.unused_packs({pack});
  if (!unused.ok()) return storage(unused.status());
  if (unused->empty())
    return this_pack(Status::Mismatch("its rows moved, but a row still names it; it stays (the next gc looks again)"));
  if (Status s = blobs.remove_pack(lock, pack); !s.ok()) return storage(s);
  return {};
}

// Whether `pack` is dead enough to compact; a warning when its rows name more than it holds.
bool dead_enough(const std::string& pack, const PackUsage& use, uint64_t size, int percent,
                 std::vector<std::string>& warnings) {
  if (use.rows == 0) return false;  // unused: collect_garbage's to delete
  if (size == 0) {
    warnings.push_back("pack " + pack + " is missing, and " + std::to_string(use.rows) +
                       " chunks name it (kvsnap verify names the snapshots that need it)");
    return false;
  }
  if (use.end > size) {
    warnings.push_back("pack " + pack + " holds " + std::to_string(size) + " bytes, its chunks end at " +
                       std::to_string(use.end) + ": not compacted (kvsnap verify names the snapshots hurt)");
    return false;
  }
  if (use.live_bytes >= size) return false;
  // dead / size >= percent / 100, in 128-bit integers: a size is what storage lists, which an
  // object store could give as anything up to 2^64 - 1.
  using Wide = unsigned __int128;
  return Wide(size - use.live_bytes) * 100 >= Wide(size) * static_cast<uint64_t>(percent);
}

// Packs in a row whose own compaction failed before compaction takes it for storage trouble.
constexpr int kFailedPacksInARow = 3;

}  // namespace

CompactionPlan plan_compaction(Catalog& catalog, BlobStore& blobs, const std::vector<std::string>& packs, int percent) {
  CompactionPlan plan;
  if (percent <= 0 || packs.empty()) return plan;
  auto uses = catalog.pack_usage(packs);
  if (!uses.ok()) {
    plan.warnings.push_back("compaction skipped: " + uses.status().message());
    return plan;
  }
  for (size_t i = 0; i < packs.size(); ++i) {
    const PackUsage& use = (*uses)[i];
    if (use.rows == 0) continue;
    auto size = blobs.pack_size(packs[i]);
    if (!size.ok()) {
      plan.warnings.push_back("the sizes of pack " + packs[i] + " and those after it could not be read (" +
                              size.status().message() + "): they are not compacted");
      return plan;
    }
    if (!dead_enough(packs[i], use, *size, percent, plan.warnings)) continue;
    plan.packs.push_back({packs[i], *size, use.live_bytes});
    plan.live_bytes += use.live_bytes;
    plan.dead_bytes += *size - use.live_bytes;
  }
  return plan;
}

Status compact_packs(Catalog& catalog, BlobStore& blobs, const GcLock& lock, const std::vector<std::string>& packs,
                     const GcOptions& options, GcReport& report) {
  CompactionPlan plan = plan_compaction(catalog, blobs, packs, options.compact_dead_percent);
  report.warnings.insert(report.warnings.end(), plan.warnings.begin(), plan.warnings.end());
  int failed_in_a_row = 0;
  for (const CompactionCandidate& c : plan.packs) {
    Attempt a = compact_one(catalog, blobs, lock, c.pack, options);
    if (a.failure == Failure::kStopped) return a.status;
    if (a.failure == Failure::kThisPack) {
      report.warnings.push_back("pack " + c.pack + " not compacted: " + a.status.message() +
                                " (kvsnap verify names the snapshots that need it)");
      if (++failed_in_a_row < kFailedPacksInARow) continue;
      report.warnings.push_back("compaction stopped: " + std::to_string(failed_in_a_row) +
                                " packs in a row could not be compacted");
      return Status::OK();
    }
    if (!a.status.ok()) {
      report.warnings.push_back("compaction stopped at pack " + c.pack + ": " + a.status.message());
      return Status::OK();
    }
    failed_in_a_row = 0;
    ++report.packs_compacted;
    report.compacted_bytes_moved += c.live_bytes;
    report.compacted_bytes_freed += c.size - c.live_bytes;
  }
  return Status::OK();
}

}  // namespace kvsnap
