// Content-addressed chunk blobs on disk.
//
//   <root>/chunks/ab/<64 hex>   one blob per chunk; the name is the SHA-256 of
//                               the chunk's raw bytes (ab = its first two hex
//                               digits), the content is whatever the container
//                               stores for it (opaque here)
//   <root>/tmp/                 temporaries of puts in progress
//   <root>/gc.lock              the gc lock (below)
//
// What the store promises:
//   - A blob under chunks/ is always complete: it is written to tmp/, fsynced
//     and renamed into place, so a crash or a failed write leaves at most a
//     temporary file in tmp/, never a partial blob.
//   - put() of a hash already present writes nothing (dedup).
//   - After BlobWriteBatch::sync_dirs() returns OK, every blob the batch put,
//     *including the ones it found already present*, survives a crash. (A blob
//     found present may have been renamed in a moment ago by another save that
//     has not synced its directory yet, so "present" is not "durable".)
//   - All file access goes through Io.
//
// The gc rule (why blobs are never deleted under a save's feet). A save writes
// its blobs first and commits the catalog row that references them last; between
// the two the blobs look like orphans, and a blob it found already present may
// be one that the catalog says nobody uses. So:
//   - every save holds the SHARED gc lock (a BlobWriteBatch) from before its
//     first put until after its catalog commit;
//   - everything that deletes blobs or temporaries (remove, clear_tmp) needs the
//     EXCLUSIVE gc lock (a GcLock), which the type system enforces here.
// While gc holds the lock, no save is between "blob written" and "catalog
// committed", so an orphan blob is truly garbage and a refcount-0 chunk cannot
// be revived. The lock is flock(2): a crashed process holds nothing. A gc that
// does not wait simply skips when a save is running.
//
// Thread safety: BlobStore and BlobWriteBatch may be shared between threads
// (a save may compress and put chunks in parallel) if the Io allows it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/io.h"
#include "base/status.h"

namespace kvsnap {

// A chunk's identity: the SHA-256 of its raw bytes.
struct ChunkHash {
  std::array<uint8_t, 32> bytes{};

  static ChunkHash of(std::span<const std::byte> raw);
  // 64 lowercase or uppercase hex digits; kInvalidArgument otherwise.
  static Result<ChunkHash> from_hex(std::string_view hex);
  std::string hex() const;  // lowercase
  auto operator<=>(const ChunkHash&) const = default;
};

enum class PutOutcome { kWritten, kExisted };

class BlobWriteBatch;

// Proof of holding the exclusive gc lock.
class GcLock {
 public:
  explicit GcLock(std::unique_ptr<FileLock> lock) : lock_(std::move(lock)) {}

 private:
  std::unique_ptr<FileLock> lock_;
};

class BlobStore {
 public:
  // Creates <root>/chunks and <root>/tmp when missing.
  static Result<std::unique_ptr<BlobStore>> open(Io& io, std::string root);

  const std::string& root() const { return root_; }
  std::string blob_path(const ChunkHash& h) const;
  std::string lock_path() const { return root_ + "/gc.lock"; }
  std::string tmp_dir() const { return root_ + "/tmp"; }

  // Starts a save: takes the shared gc lock. With wait=false returns nullptr
  // when a gc holds the lock.
  Result<std::unique_ptr<BlobWriteBatch>> begin_write(bool wait = true);
  // Takes the exclusive gc lock. With wait=false returns nullptr when a save
  // (or another gc) holds it.
  Result<std::unique_ptr<GcLock>> lock_for_gc(bool wait);

  Result<bool> contains(const ChunkHash& h);
  // The blob's bytes; kNotFound when absent, kInvalidArgument when larger
  // than `max_bytes`.
  Result<std::vector<std::byte>> get(const ChunkHash& h, uint64_t max_bytes);
  // Every blob on disk, sorted. Ignores names that are not 64 hex digits in
  // the right shard (foreign files are never deleted by gc).
  Result<std::vector<ChunkHash>> list();

  // Deletes a blob (absent is OK).
  Status remove(const GcLock&, const ChunkHash& h);
  // Deletes every file in tmp/: leftovers of saves that crashed. Returns how many.
  Result<size_t> clear_tmp(const GcLock&);

 private:
  BlobStore(Io& io, std::string root) : io_(io), root_(std::move(root)) {}
  friend class BlobWriteBatch;
  std::string shard_dir(const ChunkHash& h) const;

  Io& io_;
  std::string root_;
};

// A save's view of the store: holds the shared gc lock until destroyed.
// Destroy it only after the catalog commit that references its blobs.
class BlobWriteBatch {
 public:
  ~BlobWriteBatch();
  // Writes `stored` as the blob of `h` unless it is already there. Does not
  // fsync the directory: call sync_dirs() once after the last put.
  Result<PutOutcome> put(const ChunkHash& h, std::span<const std::byte> stored);
  // fsyncs every shard directory this batch touched (and chunks/ when a shard
  // was created). Call before committing the catalog.
  Status sync_dirs();
  uint64_t written() const;  // blobs written (not deduplicated) so far

 private:
  friend class BlobStore;
  BlobWriteBatch(BlobStore& store, std::unique_ptr<FileLock> lock) : store_(store), lock_(std::move(lock)) {}
  BlobStore& store_;
  std::unique_ptr<FileLock> lock_;
  mutable std::mutex mu_;
  std::set<std::string> dirty_dirs_;  // guarded by mu_
  uint64_t written_ = 0;              // guarded by mu_
};

}  // namespace kvsnap
