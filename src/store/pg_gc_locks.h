// The gc lock of a store whose catalog is in PostgreSQL: session-level
// advisory locks in the catalog's database instead of flock(2) on a local file,
// so that saves and gc on different hosts exclude each other (blob_store.h
// states why saves hold it shared and gc exclusive).
//
// Each hold is its own connection holding pg_advisory_lock_shared(key) or
// pg_advisory_lock(key); destroying the hold unlocks and closes it. A process
// that dies holds nothing once the server sees its connection close (a host
// that vanishes without closing it: after the server's tcp_keepalives_*).
// The wait=false variants use pg_try_advisory_lock*: they answer at once. A
// waiting exclusive request queues new shared ones behind it (PostgreSQL's lock
// queue), so a waiting gc is not starved by a stream of saves.
//
// A hold lasts only as long as its connection: if the server restarts or the
// connection is killed (pg_terminate_backend), the hold is gone without its
// owner knowing, and a gc elsewhere may take the exclusive lock. A save
// therefore commits through PgCatalog::commit_save(), which checks inside its
// commit transaction that the hold's session (PgGcHold::session) still holds
// the lock, under a second, transaction-level lock (kCommitFenceKey) that an
// exclusive hold waits for once after it is granted (lock_exclusive). That
// handshake is what makes "check, then commit" race-free (pg_catalog.cc,
// commit_save, has the argument); a save whose hold was lost fails and
// commits nothing.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "store/gc_lock.h"

namespace kvsnap {

class PgConn;

class PgGcHold : public GcLockHold {
 public:
  PgGcHold(std::unique_ptr<PgConn> conn, bool shared, GcHoldSession session);
  ~PgGcHold() override;
  PgGcHold(const PgGcHold&) = delete;
  PgGcHold& operator=(const PgGcHold&) = delete;

  // Asks the server whether this connection still holds the lock.
  Status still_held() override;
  std::optional<GcHoldSession> session() const override { return session_; }

 private:
  std::unique_ptr<PgConn> conn_;
  bool shared_;
  GcHoldSession session_;
};

class PgGcLocks : public GcLocks {
 public:
  // The advisory lock key ("kvsnapgc"); locks are per database.
  static constexpr int64_t kGcLockKey = 0x6b76736e61706763;
  // The commit fence ("kvsnapcf"): a save's commit transaction holds it shared
  // (pg_advisory_xact_lock_shared) while it checks its hold and commits; a new
  // exclusive hold takes and drops it once, so it waits for the commits in
  // flight when it was granted.
  static constexpr int64_t kCommitFenceKey = 0x6b76736e61706366;

  // `url`: the catalog's libpq URL. Connects only when a lock is asked for.
  explicit PgGcLocks(std::string url) : url_(std::move(url)) {}

  // nullptr when wait=false and a gc holds (or waits for) the exclusive lock.
  Result<std::unique_ptr<GcLockHold>> lock_shared(bool wait) override;
  // Returns once the commits that were in flight when the lock was granted have ended.
  Result<std::unique_ptr<GcLockHold>> lock_exclusive(bool wait) override;

 private:
  Result<std::unique_ptr<GcLockHold>> lock(bool shared, bool wait);
  std::string url_;
};

// The condition "session `s` holds the gc lock (shared)" as SQL over pg_locks
// and pg_stat_activity, with the key in $1, the pid in $2 and the start time in
// $3 (what PgGcHold and PgCatalog::commit_save ask).
extern const char* const kPgHoldsGcLockSql;

}  // namespace kvsnap
