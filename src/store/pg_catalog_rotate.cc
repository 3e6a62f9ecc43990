// PgCatalog (pg_catalog.h): key rotation's settings and row swap (catalog.h, "Key rotation").
// The settings' rows in kvsnap_meta are the lock that orders a rotation's finish against a
// commit of a row under the old key: under READ COMMITTED each statement sees what committed
// before it, so the finish takes them FOR UPDATE before counting the old key's rows, and a
// commit takes them FOR SHARE before its key check.
#include "store/catalog_rules.h"
#include "store/pg_catalog.h"
#include "store/pg_catalog_internal.h"
#include "store/pg_conn.h"

namespace kvsnap {

using namespace catalog_detail;
using Iso = PgConn::Isolation;

Result<std::pair<std::optional<std::string>, std::optional<std::string>>> PgCatalog::lock_key_settings(bool exclusive) {
  const char* sql = exclusive ? "SELECT key, value FROM kvsnap_meta WHERE key = $1 OR key = $2 FOR UPDATE"
                              : "SELECT key, value FROM kvsnap_meta WHERE key = $1 OR key = $2 FOR SHARE";
  KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec(sql, PgParams().text(kMetaEncryption).text(kMetaEncryptionPrevious)));
  std::pair<std::optional<std::string>, std::optional<std::string>> out;
  for (int r = 0; r < q.rows(); ++r) (q.text(r, 0) == kMetaEncryption ? out.first : out.second) = q.text(r, 1);
  return out;
}

Status PgCatalog::check_row_key(const SnapshotInfo& info) {
  KV_ASSIGN_OR_RETURN(auto settings, lock_key_settings(/*exclusive=*/false));
  const auto& [current, previous] = settings;
  if (!info.tenant) return current ? plain_row_refused(where_, *current) : Status::OK();
  if (!current || *current == info.master_key_id || previous == info.master_key_id) return Status::OK();
  return Status::Mismatch(where_ + ": the store is encrypted with key " + *current + ", but the snapshot was sealed with " +
                          info.master_key_id + " (wrong key: pass the store's --key-file FILE or --key-command CMD)");
}

Status PgCatalog::begin_key_rotation(const std::string& from, const std::string& to) {
  return conn_->transaction(Iso::kReadCommitted, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto settings, lock_key_settings(/*exclusive=*/true));
    const auto& [current, previous] = settings;
    if (current == to && previous == from) return Status::OK();  // resumed
    if (previous)
      return Status::Mismatch(where_ + ": a rotation from key " + *previous + " to " + current.value_or("?") +
                              " is unfinished: run kvsnap rekey with those keys first");
    if (current != from)
      return Status::Mismatch(where_ + ": the store is encrypted with key " + current.value_or("(none)") + ", not " +
                              from + ": nothing to rotate from that key");
    return conn_
        ->exec("INSERT INTO kvsnap_meta(key, value) VALUES($1, $2), ($3, $4) "
               "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
               PgParams().text(kMetaEncryptionPrevious).text(from).text(kMetaEncryption).text(to))
        .status();
  });
}

Result<int64_t> PgCatalog::finish_key_rotation(const std::string& from, const std::string& to) {
  int64_t left = 0;
  KV_RETURN_IF_ERROR(conn_->transaction(Iso::kReadCommitted, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto settings, lock_key_settings(/*exclusive=*/true));
    const auto& [current, previous] = settings;
    if (current != to || (previous && previous != from))
      return Status::Mismatch(where_ + ": the store is not rotating from key " + from + " to " + to);
    KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT COUNT(*) FROM snapshots WHERE master_key_id = $1",
                                                PgParams().text(from)));
    left = q.rows() == 1 ? q.i64(0, 0) : 0;
    if (left > 0) return Status::OK();
    return conn_->exec("DELETE FROM kvsnap_meta WHERE key = $1", PgParams().text(kMetaEncryptionPrevious)).status();
  }));
  return left;
}

Status PgCatalog::replace_sealed(int64_t id, SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                                 const std::string& expect_key_id, const PrefixKeying& keying, GcLockHold& hold) {
  std::optional<GcHoldSession> session = hold.session();
  if (!session) KV_RETURN_IF_ERROR(hold.still_held().Prefixed(describe() + ": not swapping the snapshot's keys"));
  KV_ASSIGN_OR_RETURN(PrefixKey key, prepare_snapshot(rec, chunks.size(), &keying));
  const SnapshotInfo& info = rec.info;
  return conn_->transaction(Iso::kReadCommitted, [&]() -> Status {
    if (session) KV_RETURN_IF_ERROR(check_hold(*session));  // first: see PgCatalog::check_hold
    KV_RETURN_IF_ERROR(check_row_key(info));
    {
      KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT master_key_id FROM snapshots WHERE id = $1 FOR UPDATE",
                                                  PgParams().i64(id)));
      if (q.rows() == 0) return no_snapshot(id);
      if (q.text(0, 0) != expect_key_id)
        return Status::Mismatch(where_ + ": snapshot " + std::to_string(id) + " is sealed with key " + q.text(0, 0) +
                                " now, not " + expect_key_id + " (rotated meanwhile)");
    }
    KV_RETURN_IF_ERROR(conn_
                           ->exec("UPDATE snapshots SET content_sha256 = $2, anchor_len = $3, anchor_hash = $4, "
                                  "full_hash = $5, master_key_id = $6, tenant_key_id = $7, n_chunks = $8 WHERE id = $1",
                                  PgParams()
                                      .i64(id)
                                      .text(info.content_sha256)
                                      .i64(key.anchor_len)
                                      .bytes(key.anchor_hash.data(), 16)
                                      .bytes(key.full_hash.data(), 16)
                                      .text(info.master_key_id)
                                      .text(info.tenant_key_id)
                                      .i64(info.n_chunks))
                           .status());
    KV_RETURN_IF_ERROR(conn_
                           ->exec("UPDATE snapshot_blobs SET manifest = $2, tokens = $3 WHERE snapshot_id = $1",
                                  PgParams().i64(id).bytes(rec.manifest).bytes(key.tokens))
                           .status());
    std::vector<ChunkHash> freed;  // refcount 0: gc's, like a removed snapshot's
    KV_RETURN_IF_ERROR(drop_chunk_uses(id, freed));
    return add_chunk_uses(id, chunks);
  });
}

}  // namespace kvsnap
