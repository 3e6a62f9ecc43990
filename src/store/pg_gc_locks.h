// The gc lock of a store whose catalog is in PostgreSQL: session-level
// advisory locks in the catalog's database instead of flock(2) on a local file,
// so that saves and gc on different hosts exclude each other (blob_store.h
// states why saves hold it shared and gc exclusive).
//
// Each hold is its own connection holding pg_advisory_lock_shared(key) or
// pg_advisory_lock(key); destroying the hold unlocks and closes it. A process
// that dies holds nothing once the server sees its connection close (a host
// that vanishes without closing it: after the server's tcp_keepalives_*).
// A hold lasts as long as its connection: if the server restarts or the
// connection drops, the hold is gone without its owner knowing (a save would
// then find out only if gc deleted a blob it had counted on; kvsnap verify
// --all finds such a snapshot). Keep the server up while saves run.
// The wait=false variants use pg_try_advisory_lock*: they answer at once. A
// waiting exclusive request queues new shared ones behind it (PostgreSQL's lock
// queue), so a waiting gc is not starved by a stream of saves.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "store/gc_lock.h"

namespace kvsnap {

class PgConn;

class PgGcHold : public GcLockHold {
 public:
  PgGcHold(std::unique_ptr<PgConn> conn, bool shared);
  ~PgGcHold() override;
  PgGcHold(const PgGcHold&) = delete;
  PgGcHold& operator=(const PgGcHold&) = delete;

 private:
  std::unique_ptr<PgConn> conn_;
  bool shared_;
};

class PgGcLocks : public GcLocks {
 public:
  // The advisory lock key ("kvsnapgc"); locks are per database.
  static constexpr int64_t kGcLockKey = 0x6b76736e61706763;

  // `url`: the catalog's libpq URL. Connects only when a lock is asked for.
  explicit PgGcLocks(std::string url) : url_(std::move(url)) {}

  // nullptr when wait=false and a gc holds (or waits for) the exclusive lock.
  Result<std::unique_ptr<GcLockHold>> lock_shared(bool wait) override;
  Result<std::unique_ptr<GcLockHold>> lock_exclusive(bool wait) override;

 private:
  Result<std::unique_ptr<GcLockHold>> lock(bool shared, bool wait);
  std::string url_;
};

}  // namespace kvsnap
