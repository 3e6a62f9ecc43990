#include "store/gc_lock.h"

namespace kvsnap {

namespace {

class FileGcLockHold final : public GcLockHold {
 public:
  explicit FileGcLockHold(std::unique_ptr<FileLock> lock) : lock_(std::move(lock)) {}

 private:
  std::unique_ptr<FileLock> lock_;
};

class FileGcLocks final : public GcLocks {
 public:
  FileGcLocks(Io& io, std::string path) : io_(io), path_(std::move(path)) {}
  Result<std::unique_ptr<GcLockHold>> lock_shared(bool wait) override { return lock(LockMode::kShared, wait); }
  Result<std::unique_ptr<GcLockHold>> lock_exclusive(bool wait) override { return lock(LockMode::kExclusive, wait); }

 private:
  Result<std::unique_ptr<GcLockHold>> lock(LockMode mode, bool wait) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<FileLock> l, io_.lock_file(path_, mode, wait));
    if (!l) return std::unique_ptr<GcLockHold>();
    return std::unique_ptr<GcLockHold>(new FileGcLockHold(std::move(l)));
  }
  Io& io_;
  std::string path_;
};

class BorrowedGcLockHold final : public GcLockHold {
 public:
  explicit BorrowedGcLockHold(GcLockHold& owner) : owner_(owner) {}
  Status still_held() override { return owner_.still_held(); }
  std::optional<GcHoldSession> session() const override { return owner_.session(); }

 private:
  GcLockHold& owner_;
};

}  // namespace

std::unique_ptr<GcLockHold> borrowed_hold(GcLockHold& owner) { return std::make_unique<BorrowedGcLockHold>(owner); }

std::unique_ptr<GcLocks> file_gc_locks(Io& io, std::string lock_path) {
  return std::make_unique<FileGcLocks>(io, std::move(lock_path));
}

Result<std::unique_ptr<GcLock>> GcLock::take(GcLocks& locks, bool wait) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLockHold> hold, locks.lock_exclusive(wait));
  if (!hold) return std::unique_ptr<GcLock>();
  return std::unique_ptr<GcLock>(new GcLock(std::move(hold)));
}

}  // namespace kvsnap
