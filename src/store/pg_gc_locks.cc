#include "store/pg_gc_locks.h"

#include "store/pg_conn.h"

namespace kvsnap {

PgGcHold::PgGcHold(std::unique_ptr<PgConn> conn, bool shared) : conn_(std::move(conn)), shared_(shared) {}

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

Result<std::unique_ptr<GcLockHold>> PgGcLocks::lock_shared(bool wait) { return lock(true, wait); }
Result<std::unique_ptr<GcLockHold>> PgGcLocks::lock_exclusive(bool wait) { return lock(false, wait); }

Result<std::unique_ptr<GcLockHold>> PgGcLocks::lock(bool shared, bool wait) {
  PgConnOptions o;
  o.lock_timeout_ms = 0;  // like flock(LOCK_EX): wait as long as it takes
  KV_ASSIGN_OR_RETURN(std::unique_ptr<PgConn> conn, PgConn::connect(url_, o));
  const char* sql = shared ? (wait ? "SELECT pg_advisory_lock_shared($1), true" : "SELECT true, pg_try_advisory_lock_shared($1)")
                           : (wait ? "SELECT pg_advisory_lock($1), true" : "SELECT true, pg_try_advisory_lock($1)");
  KV_ASSIGN_OR_RETURN(PgResult r, conn->exec(sql, PgParams().i64(kGcLockKey)));
  if (r.rows() != 1) return Status::IOError(conn->where() + ": the gc lock query returned no row");
  if (!r.boolean(0, 1)) return std::unique_ptr<GcLockHold>();
  return std::unique_ptr<GcLockHold>(std::make_unique<PgGcHold>(std::move(conn), shared));
}

}  // namespace kvsnap
