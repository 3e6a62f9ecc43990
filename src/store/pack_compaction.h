// gc's compaction of packs. A save writes its new blobs into one pack, so a pack goes dead piece
// by piece: a session saved again after more turns shares its prefix chunks with the earlier
// snapshot, and removing (or evicting) the earlier one leaves its pack partly live for as long as
// the later one stays. Deleting whole packs only would keep those dead bytes forever, and a store
// held to a cap (`gc --max-bytes`, docs/store.md) would fill its disk beyond it.
//
// compact_packs() takes, one at a time, each pack whose dead bytes are at least
// options.compact_dead_percent of it: copies its live blobs into a new pack, moves their catalog
// rows there in one transaction (Catalog::move_chunks), and deletes the old pack. It runs at the end
// of collect_garbage, after the deletions (so a full disk still gets its garbage deleted), under the
// exclusive gc lock: no save is between its blobs and its commit, and no reader between reading its
// rows and its last blob (blob_store.h), so nobody holds an old location.
//
// What it promises:
//   - Crash-safe at every step: until the move commits, the new pack is one no row names (the next
//     gc deletes it); after it, the old pack is. Interrupted (options.progress returning an error),
//     the packs done are done and the one in progress is as it was.
//   - Blobs are copied as storage holds them (BlobStore::read_stored_into, past a cache), sealed
//     ones included (no key needed): a chunk keeps its id and every check of its bytes.
//   - Never fails gc for a pack: one that is missing, shorter than its rows say, or unreadable (any
//     read error, EIO included) is left as it is and named in report.warnings (`kvsnap verify`
//     names the snapshots hurt), and the next one is tried, until three in a row fail (storage
//     rather than a pack); a storage error while writing (a full disk) stops compaction with a
//     warning. Only a stop (an error from options.progress, Ctrl-C) is returned.
//   - Space: at most one pack's live bytes beyond what the store holds (a new pack whose rows could
//     not move is deleted at once). Memory: one blob, and the rows of one pack.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "store/blob_store.h"
#include "store/catalog.h"

namespace kvsnap {

// Which of `packs` are dead enough at `percent` (0: none), with their sizes: what compact_packs
// takes, and what `gc --dry-run` shows. Reads only (no lock needed for a preview, which a save
// or removal beside it may change). A pack missing or shorter than its rows say is a warning, not
// a candidate; an error of the catalog or storage ends the plan there with a warning.
struct CompactionCandidate {
  std::string pack;
  uint64_t size = 0, live_bytes = 0;
};
struct CompactionPlan {
  std::vector<CompactionCandidate> packs;
  uint64_t live_bytes = 0, dead_bytes = 0;  // summed over `packs`
  std::vector<std::string> warnings;
};
CompactionPlan plan_compaction(Catalog& catalog, BlobStore& blobs, const std::vector<std::string>& packs, int percent);

// Compacts those of `packs` that are dead enough; counts into report (packs_compacted,
// compacted_bytes_moved, compacted_bytes_freed, warnings). OK with nothing done when
// options.compact_dead_percent is 0 or no pack qualifies; not OK only when options.progress stopped it.
Status compact_packs(Catalog& catalog, BlobStore& blobs, const GcLock& lock, const std::vector<std::string>& packs,
                     const GcOptions& options, GcReport& report);

}  // namespace kvsnap
