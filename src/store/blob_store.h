// Content-addressed chunk blobs on disk.
//
//   <root>/packs/<16 hex>.pack  the blobs one save wrote, back to back (what a
//                               save writes): one file and one fsync per save
//                               instead of one per chunk. The catalog knows
//                               where each blob is (BlobLocation).
//   <root>/chunks/ab/<64 hex>   one blob per chunk (put(): what stores made
//                               before packs hold, still read): the name is the
//                               SHA-256 of the chunk's raw bytes (ab = its
//                               first two hex digits), the content is whatever
//                               the container stores for it (opaque here)
//   <root>/tmp/                 temporaries of writes in progress
//   <root>/gc.lock              the gc lock (below)
//
// What the store promises:
//   - A blob under chunks/ and a pack under packs/ is always complete: it is
//     written to tmp/, fsynced and renamed into place, so a crash or a failed
//     write leaves at most a temporary file in tmp/, never a partial blob.
//   - put() of a hash already present writes nothing (dedup); append() of a
//     hash this batch already appended writes nothing (the caller dedups
//     against the catalog).
//   - After BlobWriteBatch::sync_dirs() returns OK, the batch's pack is
//     complete under packs/, and every blob the batch put, *including the ones
//     it found already present*, survives a crash. (A blob found present may
//     have been renamed in a moment ago by another save that has not synced its
//     directory yet, so "present" is not "durable".)
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
#include <map>
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

// Where a blob is: `size` bytes at `offset` of packs/<pack>.pack, or, when
// `pack` is empty, the whole loose file chunks/ab/<sha>.
struct BlobLocation {
  std::string pack;
  uint64_t offset = 0;
  uint64_t size = 0;
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
  std::string pack_dir() const { return root_ + "/packs"; }
  std::string pack_path(const std::string& pack) const { return pack_dir() + "/" + pack + ".pack"; }

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
  // The blob at `where` (a loose one when where.pack is empty). kNotFound
  // when the pack is missing, kCorruption when it is shorter than `where`
  // says. Packs stay open for later reads (thread-safe).
  Result<std::vector<std::byte>> get(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes);
  // The same into `out` (resized; a reused buffer keeps its capacity).
  Status get_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes, std::vector<std::byte>& out);
  // Every blob on disk, sorted. Ignores names that are not 64 hex digits in
  // the right shard (foreign files are never deleted by gc).
  Result<std::vector<ChunkHash>> list();

  // The packs on disk (names without ".pack"), sorted; foreign names ignored.
  Result<std::vector<std::string>> list_packs();

  // Deletes a blob (absent is OK).
  Status remove(const GcLock&, const ChunkHash& h);
  // Deletes a pack (absent is OK).
  Status remove_pack(const GcLock&, const std::string& pack);
  // Deletes every file in tmp/: leftovers of saves that crashed. Returns how many.
  Result<size_t> clear_tmp(const GcLock&);
  // The files in tmp/ (names), and one of them deleted (absent is OK).
  Result<std::vector<std::string>> list_tmp();
  Status remove_tmp(const GcLock&, const std::string& name);
  // The size of a file of the store (a blob, pack or temporary path); 0 when it is absent.
  Result<uint64_t> size_on_disk(const std::string& path);

 private:
  BlobStore(Io& io, std::string root) : io_(io), root_(std::move(root)) {}
  friend class BlobWriteBatch;
  std::string shard_dir(const ChunkHash& h) const;

  Result<const ReadableFile*> open_pack(const std::string& pack);

  Io& io_;
  std::string root_;
  std::mutex packs_mu_;
  std::map<std::string, std::unique_ptr<ReadableFile>> open_packs_;  // guarded by packs_mu_
};

// A save's view of the store: holds the shared gc lock until destroyed.
// Destroy it only after the catalog commit that references its blobs.
class BlobWriteBatch {
 public:
  ~BlobWriteBatch();
  // Writes `stored` as the blob of `h` unless it is already there. Does not
  // fsync the directory: call sync_dirs() once after the last put.
  Result<PutOutcome> put(const ChunkHash& h, std::span<const std::byte> stored);
  // Appends `stored` as the blob of `h` to this batch's pack (a temporary in
  // tmp/ until sync_dirs()) and says where it will be; a hash appended before
  // by this batch is not written again. Not durable, not even under packs/,
  // until sync_dirs() returns OK.
  Result<BlobLocation> append(const ChunkHash& h, std::span<const std::byte> stored);
  // Completes the pack (fsync, rename into packs/), then fsyncs packs/ and
  // every shard directory this batch touched (and chunks/ when a shard was
  // created). Call before committing the catalog. Appends after it start a
  // new pack.
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
  // The pack being written (guarded by mu_): its name, file, size so far and blobs.
  std::string pack_;
  std::unique_ptr<AtomicFileWriter> pack_file_;
  uint64_t pack_size_ = 0;
  std::map<ChunkHash, BlobLocation> packed_;
};

}  // namespace kvsnap
