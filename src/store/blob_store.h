// Content-addressed chunk blobs: the storage interface the snapshot store
// writes chunks to and reads them from. LocalBlobStore (local_blob_store.h)
// keeps them in a directory, the embedded default; other implementations keep
// them elsewhere (an object store) under the same promises.
//
// A blob is the stored form of one chunk, named by the SHA-256 of the chunk's
// raw bytes (ChunkHash); its content is whatever the container stores (opaque
// here). A save appends its new blobs to one pack (a blob of blobs, named by
// the store, one write and one sync per save); the catalog records where each
// blob is (BlobLocation). Loose blobs, one per chunk, are what stores made
// before packs hold: still read, and written by put().
//
// What every implementation promises:
//   - A blob or pack is visible (get, list, list_packs) only complete: a crash
//     or a failed write leaves at most a temporary (list_tmp), never a partial
//     blob or pack.
//   - put() of a hash already present writes nothing (dedup); append() of a
//     hash this batch already appended writes nothing (the caller dedups
//     against the catalog).
//   - After BlobWriteBatch::commit() returns OK, the batch's pack is complete
//     and every blob the batch put, *including the ones it found already
//     present*, survives a crash. (A blob found present may have been written a
//     moment ago by another save that has not committed yet, so "present" is
//     not "durable".)
//   - Reads of a missing blob or pack are kNotFound; a pack shorter than the
//     location says is kCorruption; nothing from storage (names, sizes) is
//     trusted further than it is checked.
//
// The gc rule (why blobs are never deleted under a save's feet). A save writes
// its blobs first and commits the catalog row that references them last; between
// the two the blobs look like orphans, and a blob it found already present may
// be one that the catalog says nobody uses. So:
//   - every save holds the SHARED gc lock (a BlobWriteBatch holds it) from
//     before its first put until after its catalog commit;
//   - everything that deletes blobs, packs or temporaries needs the EXCLUSIVE
//     gc lock (a GcLock, gc_lock.h), which the type system enforces here.
// While gc holds the lock, no save is between "blob written" and "catalog
// committed", so an orphan blob is truly garbage and a refcount-0 chunk cannot
// be revived.
//
// Readers hold it too. A restore (or export, verify) reads a snapshot's rows
// first and its blobs after; meanwhile the rows may change (rekey swaps them
// for chunks sealed under the new key, rm drops them) and leave the chunks it
// is about to read at refcount 0. So every reader holds the SHARED gc lock
// (hold_for_read) from before it reads the rows until its last blob read: a gc
// then either ran before the rows were read (and deleted nothing they name) or
// waits (a gc that does not wait skips) until the reader is done. Both locks come from the GcLocks the store was opened with
// (begin_write and lock_for_gc below take them, so no implementation can skip
// them); a crashed process holds nothing. A gc that does not wait simply skips
// when a save or a read is running.
//
// Thread safety: a BlobStore and a BlobWriteBatch may be shared between
// threads (a save appends from its encoder pipeline, a restore reads in
// parallel); implementations guard their own state.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "store/gc_lock.h"

namespace kvsnap {

// A chunk's identity: the SHA-256 of its raw bytes.
struct ChunkHash {
  std::array<uint8_t, 32> bytes{};

  static ChunkHash of(std::span<const std::byte> raw);
  // 64 lowercase or uppercase hex digits; kInvalidArgument otherwise.
  static Result<ChunkHash> from_hex(std::string_view hex);
  std::string hex() const;  // lowercase
  bool operator==(const ChunkHash&) const = default;
  // Byte order. Not `= default`: libc++ before 17 (Apple clang 15's too) has no operator<=> for
  // std::array, so the defaulted one would be deleted there.
  std::strong_ordering operator<=>(const ChunkHash& o) const {
    return std::memcmp(bytes.data(), o.bytes.data(), bytes.size()) <=> 0;
  }
};

// Where a blob is: `size` bytes at `offset` of pack `pack`, or, when `pack` is
// empty, the whole loose blob of its hash.
struct BlobLocation {
  std::string pack;
  uint64_t offset = 0;
  uint64_t size = 0;
};

enum class PutOutcome { kWritten, kExisted };

// The names every backend gives its blobs and packs (a directory's files, an
// object store's keys), so that a listing ignores foreign names the same way.
// A loose blob: its hash as 64 lowercase hex digits.
bool is_blob_name(std::string_view name);
// A pack: 16 lowercase hex digits + ".pack".
bool is_pack_name(std::string_view name);
// What follows `prefix` in a listed name, or nullopt for a name outside it: an object store (or a
// proxy) that ignores a listing's prefix= returns the whole bucket, whose other keys are not
// this store's to read, delete or abort.
std::optional<std::string_view> name_under(std::string_view name, std::string_view prefix);
// 64 random bits as 16 hex digits: concurrent saves never pick the same pack.
std::string new_pack_name();

// The name of the store id beside chunks/ and packs/ (BlobStore::read_store_id).
inline constexpr const char* kStoreIdName = "store-id";
// More than any store id: a larger one is refused as damaged.
inline constexpr uint64_t kMaxStoreIdBytes = 4096;

// A save's view of the store: holds the shared gc lock until destroyed.
// Destroy it only after the catalog commit that references its blobs.
class BlobWriteBatch {
 public:
  virtual ~BlobWriteBatch();
  // Writes `stored` as the loose blob of `h` unless it is already there. Not
  // durable until commit().
  virtual Result<PutOutcome> put(const ChunkHash& h, std::span<const std::byte> stored) = 0;
  // Appends `stored` as the blob of `h` to this batch's pack and says where it
  // will be; a hash appended before by this batch is not written again. Not
  // visible, not durable, until commit() returns OK. A failed append abandons
  // the pack (its locations will never exist).
  virtual Result<BlobLocation> append(const ChunkHash& h, std::span<const std::byte> stored) = 0;
  // Completes the pack and makes everything this batch put or appended
  // durable (LocalBlobStore: fsync, rename into packs/, fsync the directories).
  // Call before committing the catalog. A failed commit may be retried;
  // appends after it start a new pack.
  virtual Status commit() = 0;
  virtual uint64_t written() const = 0;  // blobs written (not deduplicated) so far
  // How many times this batch's writes have waited for the storage so far (a local pack: the
  // disk's paced write-behind, WritableFile::disk_waits); nullopt where the batch cannot tell (S3:
  // the caller's own count of blocks stands in). A save's adaptive level reads it
  // (format/snapshot.h SnapshotOptions::storage_waits).
  virtual std::optional<uint64_t> storage_waits() const = 0;
  // The shared gc lock this batch holds: what the catalog commit checks (Catalog::commit_save).
  GcLockHold& hold() const { return *hold_; }

 protected:
  explicit BlobWriteBatch(std::unique_ptr<GcLockHold> hold) : hold_(std::move(hold)) {}

 private:
  std::unique_ptr<GcLockHold> hold_;  // released after the derived batch's own clean-up
};

class BlobStore {
 public:
  virtual ~BlobStore();
  BlobStore(const BlobStore&) = delete;
  BlobStore& operator=(const BlobStore&) = delete;

  // Where the blobs are, for messages (a directory, a URL).
  virtual std::string describe() const = 0;

  // Starts a save: takes the shared gc lock. With wait=false returns nullptr
  // when a gc holds the lock.
  Result<std::unique_ptr<BlobWriteBatch>> begin_write(bool wait = true);
  // Starts a save under a hold this thread already has (an import keeps one from unpacking its
  // archive to its last entry): the batch borrows it, since a second hold of the thread could wait
  // for a gc that waits for the first (hold_for_read below).
  Result<std::unique_ptr<BlobWriteBatch>> begin_write_under(GcLockHold& hold);
  // A write batch of gc's own (compaction's new pack) under the exclusive lock it holds.
  Result<std::unique_ptr<BlobWriteBatch>> begin_write_for_gc(const GcLock& lock) { return begin_write_under(lock.hold()); }
  // A reader's hold on the blobs its rows name (the shared gc lock, "readers"
  // above); waits while a gc runs. A thread takes one hold at a time: on a
  // catalog server a gc waiting between two holds of one thread would wait for
  // the first while the second waits for it.
  Result<std::unique_ptr<GcLockHold>> hold_for_read();
  // Takes the exclusive gc lock. With wait=false returns nullptr when a save,
  // a reader (or another gc) holds it.
  Result<std::unique_ptr<GcLock>> lock_for_gc(bool wait);

  // Whether the loose blob of `h` is there.
  virtual Result<bool> contains(const ChunkHash& h) = 0;
  // The loose blob's bytes; kNotFound when absent, kInvalidArgument when
  // larger than `max_bytes`.
  virtual Result<std::vector<std::byte>> get(const ChunkHash& h, uint64_t max_bytes) = 0;
  // The blob at `where` (a loose one when where.pack is empty) into `out`
  // (resized; a reused buffer keeps its capacity). kNotFound when the pack is
  // missing, kCorruption when it is shorter than `where` says,
  // kInvalidArgument when where.size > max_bytes.
  virtual Status get_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes,
                          std::vector<std::byte>& out) = 0;
  // The same from storage itself, past any cache of blobs: what gc's compaction copies (the bytes
  // the pack holds, and a cache left to the readers). Default: get_into.
  virtual Status read_stored_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes,
                                  std::vector<std::byte>& out) {
    return get_into(h, where, max_bytes, out);
  }
  // The same, returned. (An implementation that overrides get() above says
  // `using BlobStore::get;` so that this one stays visible through it.)
  Result<std::vector<std::byte>> get(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes);
  // Every loose blob, sorted. Ignores names that are not blobs (foreign
  // objects are never deleted by gc).
  virtual Result<std::vector<ChunkHash>> list() = 0;
  // The packs (names as BlobLocation::pack has them), sorted; foreign names ignored.
  virtual Result<std::vector<std::string>> list_packs() = 0;

  // Deletes a loose blob (absent is OK).
  virtual Status remove(const GcLock&, const ChunkHash& h) = 0;
  // Deletes a pack (absent is OK).
  virtual Status remove_pack(const GcLock&, const std::string& pack) = 0;
  // The temporaries of writes in progress or crashed (names); none for a
  // backend without local temporaries. One of them deleted (absent is OK).
  virtual Result<std::vector<std::string>> list_tmp() = 0;
  virtual Status remove_tmp(const GcLock&, const std::string& name) = 0;
  // Aborts the incomplete uploads a killed save left in storage that are older
  // than the backend's bound (S3: multipart uploads; their parts take space
  // but no listing of objects shows them); how many. Default: none to abort.
  virtual Result<size_t> abort_stale_uploads(const GcLock&) { return size_t{0}; }
  // Deletes every temporary: leftovers of saves that crashed. Returns how many.
  Result<size_t> clear_tmp(const GcLock&);

  // The id of the store whose catalog these blobs belong to (store/store_identity.h), nullopt
  // when none was written yet: a file or object `store-id` beside chunks/ and packs/, which
  // list() and list_packs() never name. create_store_id writes it only if none is there (the
  // caller reads back which one is); kCorruption from read_store_id when it is not a store id.
  virtual Result<std::optional<std::string>> read_store_id() = 0;
  virtual Status create_store_id(const std::string& id) = 0;

  // Sizes in storage (what deleting frees; gc's progress); 0 when absent.
  virtual Result<uint64_t> blob_size(const ChunkHash& h) = 0;
  virtual Result<uint64_t> pack_size(const std::string& pack) = 0;
  virtual Result<uint64_t> tmp_size(const std::string& name) = 0;

 protected:
  // `locks`: the gc locks every process using these blobs shares.
  explicit BlobStore(std::unique_ptr<GcLocks> locks) : locks_(std::move(locks)) {}
  // A batch that holds `hold` (the shared gc lock) until destroyed.
  virtual Result<std::unique_ptr<BlobWriteBatch>> new_batch(std::unique_ptr<GcLockHold> hold) = 0;

 private:
  std::unique_ptr<GcLocks> locks_;
};

}  // namespace kvsnap
