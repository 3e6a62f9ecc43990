// SqliteCatalog's eviction marks and the eviction scope (catalog.h; the
// policy itself is shared by every backend, eviction.cc).
#include <cstring>

#include "store/sqlite_catalog_internal.h"

namespace kvsnap {

using namespace catalog_detail;

Status SqliteCatalog::update_snapshot(int64_t id, Stmt& st) {
  return write_txn([&]() -> Status {
    st.i64(1, id);
    KV_RETURN_IF_ERROR(st.run());
    if (sqlite3_changes(db_) != 1) return no_snapshot(id);
    return Status::OK();
  });
}

Status SqliteCatalog::mark_restored(int64_t id, const std::string& when) {
  KV_ASSIGN_OR_RETURN(Stmt st, stmt("UPDATE snapshots SET last_restored = ?2 WHERE id = ?1"));
  st.text(2, when);
  return update_snapshot(id, st);
}

Status SqliteCatalog::set_pinned(int64_t id, bool pinned) {
  KV_ASSIGN_OR_RETURN(Stmt st, stmt("UPDATE snapshots SET pinned = ?2 WHERE id = ?1"));
  st.i64(2, pinned ? 1 : 0);
  return update_snapshot(id, st);
}

Status SqliteCatalog::set_expiry(int64_t id, const std::optional<std::string>& expires_at) {
  KV_ASSIGN_OR_RETURN(Stmt st, stmt("UPDATE snapshots SET expires_at = ?2 WHERE id = ?1"));
  st.opt_text(2, expires_at);
  return update_snapshot(id, st);
}

Result<EvictionScope> SqliteCatalog::eviction_scope(const std::optional<std::string>& tenant) {
  EvictionScope out;
  // One read transaction: the snapshots, their chunk uses and the refcounts agree.
  KV_RETURN_IF_ERROR(exec("BEGIN"));
  Status s = [&]() -> Status {
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT " KV_INFO_COLS " FROM snapshots s WHERE ?1 IS NULL OR s.id IN "
                                       "(SELECT t.snapshot_id FROM tags t WHERE t.key = ?2 AND t.value = ?1)"));
      q.opt_text(1, tenant).text(2, kTenantTag);
      for (;;) {
        KV_ASSIGN_OR_RETURN(bool row, q.step());
        if (!row) break;
        out.snapshots.push_back(info_from_row(q));
      }
    }
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT sc.snapshot_id, c.sha256, COUNT(*), c.stored_size, c.refcount "
                                     "FROM snapshot_chunks sc JOIN chunks c ON c.sha256 = sc.sha256 "
                                     "WHERE ?1 IS NULL OR sc.snapshot_id IN "
                                     "(SELECT t.snapshot_id FROM tags t WHERE t.key = ?2 AND t.value = ?1) "
                                     "GROUP BY sc.snapshot_id, c.sha256"));
    q.opt_text(1, tenant).text(2, kTenantTag);
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      EvictionUse u;
      u.snapshot_id = q.col_i64(0);
      auto b = q.col_blob(1);
      if (b.size() != 32) return Status::Corruption(path_ + ": snapshot " + std::to_string(u.snapshot_id) + " has a malformed chunk hash");
      std::memcpy(u.sha256.bytes.data(), b.data(), 32);
      u.uses = q.col_i64(2);
      u.stored_size = static_cast<uint64_t>(q.col_i64(3));
      u.refcount = q.col_i64(4);
      out.uses.push_back(u);
    }
    return Status::OK();
  }();
  rollback();
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<int64_t>> SqliteCatalog::expired_snapshots(const std::string& now) {
  KV_ASSIGN_OR_RETURN(Stmt q, stmt(kExpiredSql));
  q.text(1, now);
  std::vector<int64_t> out;
  for (;;) {
    KV_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) return out;
    out.push_back(q.col_i64(0));
  }
}

}  // namespace kvsnap
