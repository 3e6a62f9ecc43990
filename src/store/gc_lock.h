// The gc lock: the seam that keeps gc from deleting a blob a save is about to
// reference (the rule is in blob_store.h). Saves take it shared, gc takes it
// exclusive; a hold is released when destroyed, and by the lock's owner (the
// kernel, a database server) when its process dies, so a crash never leaves a
// stale lock.
//
// Implementations: file_gc_locks() below (the embedded default, one host) and
// a catalog server's advisory locks (gc safe across hosts). Every process that
// saves into or collects garbage from one store must use the same locks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/io.h"
#include "base/status.h"

namespace kvsnap {

// The database session that keeps a hold (PgGcHold): a catalog in the same
// database checks, inside a save's commit, that this session still holds it
// (Catalog::commit_save). The start time tells a session from a later one that
// got the same pid.
struct GcHoldSession {
  int64_t pid = 0;
  int64_t started_us = 0;  // backend_start, microseconds since the epoch
};

// Held until destroyed.
class GcLockHold {
 public:
  virtual ~GcLockHold() = default;
  // OK while the hold still excludes gc; kIOError naming the lock once it was
  // lost behind its owner's back (a database restart or a killed connection;
  // a flock cannot be lost while its process lives, so the default is OK).
  // Only a snapshot of the moment: Catalog::commit_save() is what makes it safe.
  virtual Status still_held() { return Status::OK(); }
  // The session keeping the hold, for a lock a database server keeps; empty otherwise.
  virtual std::optional<GcHoldSession> session() const { return std::nullopt; }
};

class GcLocks {
 public:
  virtual ~GcLocks() = default;
  // A save's shared hold; nullptr when wait=false and a gc holds the exclusive one.
  virtual Result<std::unique_ptr<GcLockHold>> lock_shared(bool wait) = 0;
  // gc's exclusive hold; nullptr when wait=false and a save or another gc holds it.
  virtual Result<std::unique_ptr<GcLockHold>> lock_exclusive(bool wait) = 0;
};

// The embedded default: flock(2) on `lock_path` (<blob root>/gc.lock) through Io.
std::unique_ptr<GcLocks> file_gc_locks(Io& io, std::string lock_path);

// A hold that is `owner` for as long as `owner` lives: what it says (still_held, session) is the
// owner's, and destroying it releases nothing. For a write batch started under a hold its thread
// already has (BlobStore::begin_write_under).
std::unique_ptr<GcLockHold> borrowed_hold(GcLockHold& owner);

// Proof of holding the exclusive gc lock: what every deletion of blobs, packs
// or temporaries takes (BlobStore::remove*), so the type system enforces the
// rule. The only way to get one is take().
class GcLock {
 public:
  // The exclusive hold of `locks`; nullptr when wait=false and it is taken.
  static Result<std::unique_ptr<GcLock>> take(GcLocks& locks, bool wait);
  // GcLockHold::still_held(): gc asks once its plan is made, before deleting.
  Status still_held() const { return hold_->still_held(); }
  // The hold itself: what a catalog checks inside a transaction that gc commits (compaction's
  // Catalog::move_chunks), and what a write batch under this lock borrows.
  GcLockHold& hold() const { return *hold_; }

 private:
  explicit GcLock(std::unique_ptr<GcLockHold> hold) : hold_(std::move(hold)) {}
  std::unique_ptr<GcLockHold> hold_;
};

}  // namespace kvsnap
