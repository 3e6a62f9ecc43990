// The defaults of Catalog's calls that a backend may do better.
#include "store/catalog.h"

namespace kvsnap {

Result<SnapshotInfo> Catalog::commit_save(SnapshotRecord rec, const std::vector<ChunkUse>& chunks, GcLockHold& hold) {
  KV_RETURN_IF_ERROR(hold.still_held().Prefixed(describe() + ": not committing the save"));
  return add_snapshot(std::move(rec), chunks);
}

Result<std::vector<std::optional<ChunkUse>>> Catalog::find_chunks(std::span<const ChunkHash> hashes) {
  std::vector<std::optional<ChunkUse>> out;
  out.reserve(hashes.size());
  for (const ChunkHash& h : hashes) {
    KV_ASSIGN_OR_RETURN(std::optional<ChunkUse> u, find_chunk(h));
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace kvsnap
