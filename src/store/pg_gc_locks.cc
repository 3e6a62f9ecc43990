#include "store/pg_gc_locks.h"

#include "store/pg_conn.h"

namespace kvsnap {

// Takes the commit fence ($4) for the statement's transaction first (the
// MATERIALIZED CTE is read before the EXISTS in the select list runs), then
// reads the lock table as it is now. pg_stat_activity is read after the fence
// too: a backend's status is cached for the rest of a transaction once read.
const char* const kPgHoldsGcLockSql =
    "WITH fence AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared($4) AS v) "
    "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid::int8 = ($1 >> 32) AND l.objid::int8 = ($1 & 4294967295) "
    "AND l.pid = $2 AND (extract(epoch FROM a.backend_start) * 1000000)::int8 = $3) FROM fence";

PgGcHold::PgGcHold(std::unique_ptr<PgConn> conn, bool shared, GcHoldSession session)
    : conn_(std::move(conn)), shared_(shared), session_(session) {}

PgGcHold::~PgGcHold() {
  // Unlock before closing so the next locker need not wait for the server to
  // notice the closed connection. Failure is harmless: closing releases it too.
  // (A broken connection holds nothing any more: no reconnecting to unlock.)
  if (!conn_->connected()) return;
  Status s = conn_->exec(shared_ ? "SELECT pg_advisory_unlock_shared($1)" : "SELECT pg_advisory_unlock($1)",
                         PgParams().i64(PgGcLocks::kGcLockKey))
                 .status();
  (void)s;
}

Status PgGcHold::still_held() {
  auto lost = [&](const std::string& why) {
    return Status::IOError(conn_->where() + ": the gc lock held by backend " + std::to_string(session_.pid) +
                           " was lost (" + why + "); a gc elsewhere may have run since");
  };
  // On a dropped connection exec() fails, or reconnects and asks as a new backend: lost either way.
  auto r = conn_->exec(kPgHoldsGcLockSql, PgParams()
                                              .i64(PgGcLocks::kGcLockKey)
                                              .i64(session_.pid)
                                              .i64(session_.started_us)
                                              .i64(PgGcLocks::kCommitFenceKey));
  if (!r.ok()) return lost(r.status().message());
  if (r->rows() != 1 || !r->boolean(0, 0)) return lost("the server restarted or the connection was killed");
  return Status::OK();
}

Result<std::unique_ptr<GcLockHold>> PgGcLocks::lock_shared(bool wait) { return lock(true, wait); }
Result<std::unique_ptr<GcLockHold>> PgGcLocks::lock_exclusive(bool wait) { return lock(false, wait); }

Result<std::unique_ptr<GcLockHold>> PgGcLocks::lock(bool shared, bool wait) {
  PgConnOptions o;
  o.lock_timeout_ms = 0;  // like flock(LOCK_EX): wait as long as it takes
  KV_ASSIGN_OR_RETURN(std::unique_ptr<PgConn> conn, PgConn::connect(url_, o));
  // The lock, then who holds it: the session's pid and start time (GcHoldSession).
  const char* sql =
      shared ? (wait ? "SELECT pg_advisory_lock_shared($1), true, pid, (extract(epoch FROM backend_start) * 1000000)::int8 "
                       "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
                     : "SELECT true, pg_try_advisory_lock_shared($1), pid, (extract(epoch FROM backend_start) * 1000000)::int8 "
                       "FROM pg_stat_activity WHERE pid = pg_backend_pid()")
             : (wait ? "SELECT pg_advisory_lock($1), true, pid, (extract(epoch FROM backend_start) * 1000000)::int8 "
                       "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
                     : "SELECT true, pg_try_advisory_lock($1), pid, (extract(epoch FROM backend_start) * 1000000)::int8 "
                       "FROM pg_stat_activity WHERE pid = pg_backend_pid()");
  KV_ASSIGN_OR_RETURN(PgResult r, conn->exec(sql, PgParams().i64(kGcLockKey)));
  if (r.rows() != 1) return Status::IOError(conn->where() + ": the gc lock query returned no row");
  if (!r.boolean(0, 1)) return std::unique_ptr<GcLockHold>();
  if (!shared) {
    // The barrier: saves whose hold was lost may still be inside their commit
    // transaction (holding the fence shared); wait for them to end.
    KV_RETURN_IF_ERROR(conn->exec("SELECT pg_advisory_xact_lock($1)", PgParams().i64(kCommitFenceKey)).status());
  }
  return std::unique_ptr<GcLockHold>(
      std::make_unique<PgGcHold>(std::move(conn), shared, GcHoldSession{r.i64(0, 2), r.i64(0, 3)}));
}

}  // namespace kvsnap
