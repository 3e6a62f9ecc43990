// The defaults of Catalog's calls that a backend may do better.
#include "store/catalog.h"

namespace kvsnap {

Result<SnapshotInfo> Catalog::commit_save(SnapshotRecord rec, const std::vector<ChunkUse>& chunks, GcLockHold& hold) {
  KV_RETURN_IF_ERROR(hold.still_held().Prefixed(describe() + ": not committing the save"));
  return add_snapshot(std::move(rec), chunks);
}

static Status rotation_not_supported(const Catalog& c) {
  return Status::NotSupported(c.describe() + ": key rotation is not supported by this catalog yet (the SQLite catalog has it)");
}
Status Catalog::begin_key_rotation(const std::string&, const std::string&) { return rotation_not_supported(*this); }
Result<int64_t> Catalog::finish_key_rotation(const std::string&, const std::string&) {
  return rotation_not_supported(*this);
}
Status Catalog::replace_sealed(int64_t, SnapshotRecord, const std::vector<ChunkUse>&, const std::string&,
                               const PrefixKeying&, GcLockHold&) {
  return rotation_not_supported(*this);
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
