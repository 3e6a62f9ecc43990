// PgCatalog's eviction marks and the eviction scope (catalog.h; the policy
// itself is shared by every backend, eviction.cc).
#include "store/catalog_rules.h"
#include "store/pg_catalog.h"
#include "store/pg_catalog_internal.h"
#include "store/pg_conn.h"

namespace kvsnap {

using namespace catalog_detail;
using Iso = PgConn::Isolation;


// One statement, so one implicit transaction; no row changed: no such snapshot.
static Status one_row_changed(Result<PgResult> r, int64_t id) {
  if (!r.ok()) return r.status();
  if (r.value().changed() != 1) return no_snapshot(id);
  return Status::OK();
}

Status PgCatalog::mark_restored(int64_t id, const std::string& when) {
  return one_row_changed(conn_->exec("UPDATE snapshots SET last_restored = $2 WHERE id = $1", PgParams().i64(id).text(when)),
                         id);
}

Status PgCatalog::set_pinned(int64_t id, bool pinned) {
  return one_row_changed(conn_->exec("UPDATE snapshots SET pinned = $2 <> 0 WHERE id = $1", PgParams().i64(id).i64(pinned)),
                         id);
}

Status PgCatalog::set_expiry(int64_t id, const std::optional<std::string>& expires_at) {
  return one_row_changed(
      conn_->exec("UPDATE snapshots SET expires_at = $2 WHERE id = $1", PgParams().i64(id).opt_text(expires_at)), id);
}

Result<EvictionScope> PgCatalog::eviction_scope(const std::optional<std::string>& tenant) {
  EvictionScope out;
  // One snapshot of the database: the snapshots, their chunk uses and the refcounts agree.
  Status s = conn_->transaction(Iso::kRepeatableReadOnly, [&]() -> Status {
    out = EvictionScope();
    PgParams p;
    p.opt_text(tenant).text(kTenantTag);
    KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT " KV_PG_INFO_COLS " FROM snapshots s WHERE ($1::text IS NULL OR "
                                                "s.id IN (SELECT t.snapshot_id FROM tags t WHERE t.key = $2 AND t.value = $1))",
                                                p));
    for (int r = 0; r < q.rows(); ++r) {
      out.snapshots.push_back(pg_info_from_row(q, r));
      out.snapshots.back().tags.clear();
    }
    KV_ASSIGN_OR_RETURN(PgResult u, conn_->exec("SELECT sc.snapshot_id, c.sha256, COUNT(*), c.stored_size, c.refcount "
                                                "FROM snapshot_chunks sc JOIN chunks c ON c.sha256 = sc.sha256 "
                                                "WHERE ($1::text IS NULL OR sc.snapshot_id IN (SELECT t.snapshot_id "
                                                "FROM tags t WHERE t.key = $2 AND t.value = $1)) "
                                                "GROUP BY sc.snapshot_id, c.sha256",
                                                p));
    for (int r = 0; r < u.rows(); ++r) {
      EvictionUse e;
      e.snapshot_id = u.i64(r, 0);
      if (!hash_from(u.bytes(r, 1), e.sha256)) {
        return Status::Corruption(where_ + ": snapshot " + std::to_string(e.snapshot_id) + " has a malformed chunk hash");
      }
      e.uses = u.i64(r, 2);
      e.stored_size = static_cast<uint64_t>(u.i64(r, 3));
      e.refcount = u.i64(r, 4);
      out.uses.push_back(e);
    }
    return Status::OK();
  });
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<int64_t>> PgCatalog::expired_snapshots(const std::string& now) {
  KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec(kExpiredSql, PgParams().text(now)));
  std::vector<int64_t> out;
  for (int r = 0; r < q.rows(); ++r) out.push_back(q.i64(r, 0));
  return out;
}

}  // namespace kvsnap
