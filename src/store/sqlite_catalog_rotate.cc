// SqliteCatalog (sqlite_catalog.h): the chunk lists' refcount bookkeeping shared by add, remove
// and key rotation, and key rotation's settings and row swap (catalog.h, "Key rotation").
#include <cstring>

#include "store/sqlite_catalog_internal.h"

namespace kvsnap {

using namespace catalog_detail;

Status SqliteCatalog::add_chunk_uses(int64_t id, const std::vector<ChunkUse>& chunks) {
  for (size_t idx = 0; idx < chunks.size(); ++idx) {
    const ChunkUse& c = chunks[idx];
    {
      // The hash names the raw bytes, so one hash with two raw sizes means a bug upstream.
      KV_ASSIGN_OR_RETURN(Stmt up, stmt("INSERT INTO chunks(sha256, raw_size, stored_size, refcount, pack, pack_offset) "
                                        "VALUES(?1, ?2, ?3, 1, ?4, ?5) ON CONFLICT(sha256) DO UPDATE "
                                        "SET refcount = refcount + 1 WHERE raw_size = excluded.raw_size"));
      up.blob(1, c.sha256.bytes).i64(2, static_cast<int64_t>(c.raw_size)).i64(3, static_cast<int64_t>(c.stored_size));
      up.opt_text(4, c.pack.empty() ? std::nullopt : std::optional<std::string>(c.pack));
      up.i64(5, static_cast<int64_t>(c.pack_offset));
      KV_RETURN_IF_ERROR(up.run());
    }
    if (sqlite3_changes(db_) != 1) return chunk_size_mismatch(path_, c.sha256, c.raw_size);
    KV_ASSIGN_OR_RETURN(Stmt ins, stmt("INSERT INTO snapshot_chunks(snapshot_id, idx, sha256) VALUES(?1, ?2, ?3)"));
    ins.i64(1, id).i64(2, static_cast<int64_t>(idx)).blob(3, c.sha256.bytes);
    KV_RETURN_IF_ERROR(ins.run());
  }
  return Status::OK();
}

Status SqliteCatalog::drop_chunk_uses(int64_t id, std::vector<ChunkHash>& freed) {
  std::vector<std::pair<ChunkHash, int64_t>> uses;
  {
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT sha256, COUNT(*) FROM snapshot_chunks WHERE snapshot_id = ?1 GROUP BY sha256"));
    q.i64(1, id);
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      ChunkHash h;
      auto b = q.col_blob(0);
      if (b.size() != 32) return Status::Corruption(path_ + ": snapshot " + std::to_string(id) + " has a malformed chunk hash");
      std::memcpy(h.bytes.data(), b.data(), 32);
      uses.emplace_back(h, q.col_i64(1));
    }
  }
  for (const auto& [h, n] : uses) {
    KV_ASSIGN_OR_RETURN(Stmt up, stmt("UPDATE chunks SET refcount = refcount - ?2 WHERE sha256 = ?1 RETURNING refcount"));
    up.blob(1, h.bytes).i64(2, n);
    KV_ASSIGN_OR_RETURN(bool row, up.step());
    if (!row) return Status::Corruption(path_ + ": chunk " + h.hex() + " is used but has no chunk row");
    if (up.col_i64(0) == 0) freed.push_back(h);
    KV_RETURN_IF_ERROR(up.run());
  }
  KV_ASSIGN_OR_RETURN(Stmt del, stmt("DELETE FROM snapshot_chunks WHERE snapshot_id = ?1"));
  del.i64(1, id);
  return del.run();
}

Status SqliteCatalog::check_row_key(const SnapshotInfo& info) {
  KV_ASSIGN_OR_RETURN(std::optional<std::string> current, get_meta(kMetaEncryption));
  if (!info.tenant) return current ? plain_row_refused(path_, *current) : Status::OK();
  if (!current || *current == info.master_key_id) return Status::OK();
  KV_ASSIGN_OR_RETURN(std::optional<std::string> previous, get_meta(kMetaEncryptionPrevious));
  if (previous && *previous == info.master_key_id) return Status::OK();
  return Status::Mismatch(path_ + ": the store is encrypted with key " + *current + ", but the snapshot was sealed with " +
                          info.master_key_id + " (wrong key: pass the store's --key-file FILE or --key-command CMD)");
}

Status SqliteCatalog::begin_key_rotation(const std::string& from, const std::string& to) {
  return write_txn([&]() -> Status {
    KV_ASSIGN_OR_RETURN(std::optional<std::string> current, get_meta(kMetaEncryption));
    KV_ASSIGN_OR_RETURN(std::optional<std::string> previous, get_meta(kMetaEncryptionPrevious));
    if (current == to && previous == from) return Status::OK();  // resumed
    if (previous)
      return Status::Mismatch(path_ + ": a rotation from key " + *previous + " to " + current.value_or("?") +
                              " is unfinished: run kvsnap rekey with those keys first");
    if (current != from)
      return Status::Mismatch(path_ + ": the store is encrypted with key " + current.value_or("(none)") +
                              ", not " + from + ": nothing to rotate from that key");
    KV_ASSIGN_OR_RETURN(Stmt set, stmt("INSERT INTO store_meta(key, value) VALUES(?1, ?2) "
                                       "ON CONFLICT(key) DO UPDATE SET value = excluded.value"));
    set.text(1, kMetaEncryptionPrevious).text(2, from);
    KV_RETURN_IF_ERROR(set.run());
    set.reset();
    set.text(1, kMetaEncryption).text(2, to);
    return set.run();
  });
}

Result<int64_t> SqliteCatalog::finish_key_rotation(const std::string& from, const std::string& to) {
  int64_t left = 0;
  KV_RETURN_IF_ERROR(write_txn([&]() -> Status {
    KV_ASSIGN_OR_RETURN(std::optional<std::string> current, get_meta(kMetaEncryption));
    KV_ASSIGN_OR_RETURN(std::optional<std::string> previous, get_meta(kMetaEncryptionPrevious));
    if (current != to || (previous && previous != from))
      return Status::Mismatch(path_ + ": the store is not rotating from key " + from + " to " + to);
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT COUNT(*) FROM snapshots WHERE master_key_id = ?1"));
      q.text(1, from);
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      left = row ? q.col_i64(0) : 0;
    }
    if (left > 0) return Status::OK();
    KV_ASSIGN_OR_RETURN(Stmt del, stmt("DELETE FROM store_meta WHERE key = ?1"));
    del.text(1, kMetaEncryptionPrevious);
    return del.run();
  }));
  return left;
}

Status SqliteCatalog::replace_sealed(int64_t id, SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                                     const std::string& expect_key_id, const PrefixKeying& keying, GcLockHold& hold) {
  KV_RETURN_IF_ERROR(hold.still_held().Prefixed(describe() + ": not swapping the snapshot's keys"));
  KV_ASSIGN_OR_RETURN(PrefixKey key, prepare_snapshot(rec, chunks.size(), &keying));
  const SnapshotInfo& info = rec.info;
  return write_txn([&]() -> Status {
    KV_RETURN_IF_ERROR(check_row_key(info));
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT master_key_id FROM snapshots WHERE id = ?1"));
      q.i64(1, id);
      KV_ASSIGN_OR_RETURN(bool found, q.step());
      if (!found) return no_snapshot(id);
      if (q.col_text(0) != expect_key_id)
        return Status::Mismatch(path_ + ": snapshot " + std::to_string(id) + " is sealed with key " + q.col_text(0) +
                                " now, not " + expect_key_id + " (rotated meanwhile)");
    }
    {
      KV_ASSIGN_OR_RETURN(Stmt up, stmt("UPDATE snapshots SET content_sha256 = ?2, anchor_len = ?3, anchor_hash = ?4, "
                                        "full_hash = ?5, master_key_id = ?6, tenant_key_id = ?7, n_chunks = ?8 WHERE id = ?1"));
      up.i64(1, id).text(2, info.content_sha256).i64(3, key.anchor_len).blob(4, key.anchor_hash).blob(5, key.full_hash);
      up.text(6, info.master_key_id).text(7, info.tenant_key_id).i64(8, info.n_chunks);
      KV_RETURN_IF_ERROR(up.run());
    }
    {
      KV_ASSIGN_OR_RETURN(Stmt up, stmt("UPDATE snapshot_blobs SET manifest = ?2, tokens = ?3 WHERE snapshot_id = ?1"));
      up.i64(1, id).blob(2, rec.manifest).blob(3, key.tokens);
      KV_RETURN_IF_ERROR(up.run());
    }
    std::vector<ChunkHash> freed;  // refcount 0: gc's, like a removed snapshot's
    KV_RETURN_IF_ERROR(drop_chunk_uses(id, freed));
    return add_chunk_uses(id, chunks);
  });
}

}  // namespace kvsnap
