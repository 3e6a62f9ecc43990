// collect_garbage(): generic over the Catalog, BlobStore and GcLocks
// interfaces. Plans every deletion under the exclusive gc lock once the
// catalog has forgotten the rows, then deletes blobs, packs and temporaries,
// then compacts the packs left partly dead (pack_compaction.h).
#include <set>
#include <string>
#include <vector>

#include "store/catalog.h"
#include "store/pack_compaction.h"
#include "store/store_identity.h"

namespace kvsnap {

namespace {

// One file a gc deletes; the catalog rows naming it are gone already.
struct Deletion {
  enum Kind { kUnreferenced, kOrphan, kPack, kTemp } kind;
  ChunkHash hash;    // kUnreferenced, kOrphan
  std::string name;  // kPack, kTemp
};

// What deleting it frees (0 when it is gone already).
Result<uint64_t> size_of(BlobStore& blobs, const Deletion& d) {
  switch (d.kind) {
    case Deletion::kUnreferenced:
    case Deletion::kOrphan: return blobs.blob_size(d.hash);
    case Deletion::kPack: return blobs.pack_size(d.name);
    case Deletion::kTemp: break;
  }
  return blobs.tmp_size(d.name);
}

Status remove(BlobStore& blobs, const GcLock& lock, const Deletion& d) {
  switch (d.kind) {
    case Deletion::kUnreferenced:
    case Deletion::kOrphan: return blobs.remove(lock, d.hash);
    case Deletion::kPack: return blobs.remove_pack(lock, d.name);
    case Deletion::kTemp: break;
  }
  return blobs.remove_tmp(lock, d.name);
}

// Packs live rows name that storage does not list: not garbage, damage (a file deleted by hand, a
// bucket's lifecycle rule). gc cannot mend it; it says so rather than finish as if the store were whole.
Status report_missing_packs(Catalog& catalog, const std::vector<std::string>& listed, GcReport& report) {
  KV_ASSIGN_OR_RETURN(auto live, catalog.live_packs());
  const std::set<std::string> present(listed.begin(), listed.end());
  for (const auto& [pack, rows] : live)
    if (!present.count(pack))
      report.warnings.push_back("pack " + pack + " is missing from storage, and " + std::to_string(rows) +
                                " chunks of stored snapshots are in it: `kvsnap verify` names the snapshots hurt");
  return Status::OK();
}

}  // namespace

Result<GcReport> collect_garbage(Catalog& catalog, BlobStore& blobs, const GcOptions& options) {
  GcReport report;
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLock> lock, blobs.lock_for_gc(options.wait));
  if (!lock) {
    report.skipped_busy = true;
    return report;
  }
  // From here until `lock` goes, no save is between writing a blob and
  // committing the row that names it.
  // Every blob this catalog does not name is deleted below: they must be its blobs.
  KV_RETURN_IF_ERROR(bind_store_identity(catalog, blobs).Prefixed("gc: deleting nothing"));
  std::vector<ChunkHash> on_disk;
  if (options.scan_orphans) {
    KV_ASSIGN_OR_RETURN(on_disk, blobs.list());
  }
  KV_ASSIGN_OR_RETURN(GcCandidates cand, catalog.gc_candidates(on_disk));
  KV_ASSIGN_OR_RETURN(std::vector<ChunkHash> gone, catalog.forget_unreferenced(cand.unreferenced));
  // Packs after rows: a pack's last rows are gone now, and a crashed save's
  // pack (renamed in, never committed) was never named.
  KV_ASSIGN_OR_RETURN(std::vector<std::string> packs, blobs.list_packs());
  KV_ASSIGN_OR_RETURN(std::vector<std::string> unused, catalog.unused_packs(packs));
  if (options.scan_orphans) KV_RETURN_IF_ERROR(report_missing_packs(catalog, packs, report));
  std::vector<std::string> temps;
  if (options.scan_orphans) {
    KV_ASSIGN_OR_RETURN(temps, blobs.list_tmp());
  }
  // The plan is sound only if the lock stood while it was made: a database's
  // lock lost meanwhile (a restart) let saves in, whose new packs look unused.
  // (Nothing a save starts later can have a planned name: packs are new names,
  // and the rows planned for are gone.)
  KV_RETURN_IF_ERROR(lock->still_held().Prefixed("gc: deleting nothing"));
  // Every file to delete is garbage now: no row names it. Deleting them in any
  // order, or stopping at any point, leaves a whole store.
  // A packed chunk's blob goes with its pack: deleting a loose blob of its hash
  // would cost a request per chunk for nothing (an S3 DELETE each; 45 s for a
  // snapshot of 1,025 chunks). A stray loose copy, if any, is an orphan now:
  // the next gc that scans for orphans takes it.
  const std::set<ChunkHash> packed(cand.unreferenced_packed.begin(), cand.unreferenced_packed.end());
  std::vector<Deletion> plan;
  for (const ChunkHash& h : gone) {
    if (packed.count(h)) {
      ++report.unreferenced_deleted;
    } else {
      plan.push_back({Deletion::kUnreferenced, h, {}});
    }
  }
  for (const ChunkHash& h : cand.orphans) plan.push_back({Deletion::kOrphan, h, {}});
  for (const std::string& p : unused) plan.push_back({Deletion::kPack, {}, p});
  for (const std::string& t : temps) plan.push_back({Deletion::kTemp, {}, t});
  GcProgress progress;
  progress.files_total = plan.size();
  std::vector<uint64_t> sizes(plan.size(), 0);
  if (options.progress) {
    for (size_t i = 0; i < plan.size(); ++i) {
      KV_ASSIGN_OR_RETURN(sizes[i], size_of(blobs, plan[i]));
      progress.bytes_total += sizes[i];
    }
    KV_RETURN_IF_ERROR(options.progress(progress));
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    const Deletion& d = plan[i];
    KV_RETURN_IF_ERROR(remove(blobs, *lock, d));
    switch (d.kind) {
      case Deletion::kUnreferenced: ++report.unreferenced_deleted; break;
      case Deletion::kOrphan: ++report.orphans_deleted; break;
      case Deletion::kPack: ++report.packs_deleted; break;
      case Deletion::kTemp: ++report.temporaries_deleted; break;
    }
    if (options.progress) {
      ++progress.files_done;
      progress.bytes_done += sizes[i];
      KV_RETURN_IF_ERROR(options.progress(progress));
    }
  }
  if (options.scan_orphans) {
    KV_ASSIGN_OR_RETURN(report.uploads_aborted, blobs.abort_stale_uploads(*lock));
  }
  // Last, once the garbage is gone (a full disk gets that space first): the packs left partly
  // dead, each copied into a new pack and deleted. Never fails gc but for a stop (progress).
  KV_RETURN_IF_ERROR(compact_packs(catalog, blobs, *lock, options.scan_orphans ? packs : cand.packs_losing_chunks,
                                   options, report));
  return report;
}

}  // namespace kvsnap
