// Chunk blobs in an S3-compatible bucket (blob_store.h says what every blob
// store promises; s3_client.h how the bucket is reached).
//
//   <prefix>/chunks/ab/<64 hex>   one loose blob (put())
//   <prefix>/packs/<16 hex>.pack  one save's pack (append() + commit())
//
// the same names as a directory store's files, so `aws s3 sync DIR s3://...`
// of a directory store's chunks/ and packs/ gives a valid bucket store.
//
// How it keeps the promises:
//   - An object appears whole or not at all (S3 PUT and CompleteMultipartUpload
//     are atomic), so nothing partial is ever listed. A pack is staged in the
//     bucket, not on this host: append() sends each full part (S3Config::
//     part_size) of a multipart upload of the pack's key, and commit() sends
//     the last part and completes it (one PUT when the pack is under a part).
//     A failed commit keeps the upload for a retry.
//   - Keys are content addressed, so many writers may PUT the same blob at
//     once: the bytes are the same; put() HEADs first to write nothing when the
//     blob is there. A PUT acknowledged by the server is durable: commit() only
//     has the pack left to do.
//   - Reads of blobs inside packs are range GETs. Blobs read are kept in a
//     local read-through cache (<cache_dir>, at most `cache_bytes`, the least
//     recently used dropped first); a cached file carries the SHA-256 of its
//     bytes and is fetched again when it does not match (a torn write after a
//     crash, a disk error), so it needs no fsync.
//   - The gc locks are the ones the store was opened with (gc_lock.h): a file
//     lock on this host by default, so gc is only safe while every writer of
//     the bucket prefix runs on this host (a shared catalog's locks lift that).
//   - A batch destroyed before its commit aborts its upload. A save killed
//     mid-pack leaves an incomplete upload, on the server where every host's
//     gc sees it: gc aborts those under packs/ older than `upload_max_age_s`
//     (abort_stale_uploads). Under the exclusive gc lock no save of this store
//     is live (each holds the shared lock from its first blob to its commit;
//     with a PostgreSQL catalog the lock spans hosts), so the age is only a
//     margin for writers that do not share the lock.
//   - <staging_dir> holds temporaries (list_tmp) of kvsnap versions that
//     staged packs there, which gc removes, and the default file gc lock.
#pragma once

#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/io.h"
#include "store/blob_store.h"
#include "store/s3_client.h"

namespace kvsnap {

struct S3BlobStoreOptions {
  std::string staging_dir;                // this host's gc.lock and old temporaries (required; created)
  std::string cache_dir;                  // read-through cache; empty: no cache
  uint64_t cache_bytes = 1ull << 30;      // the cache's size bound
  // gc aborts incomplete multipart uploads under packs/ started longer ago than this.
  int64_t upload_max_age_s = 24 * 3600;
};

// The read-through cache of blobs by hash (content addressed, so an entry
// never goes stale). Thread-safe. Every failure is a miss: the cache is never
// the reason a read fails.
class BlobCache {
 public:
  BlobCache(Io& io, std::string dir, uint64_t max_bytes);
  // Creates the directory and counts what an earlier run left.
  Status open();
  // True and the blob's bytes in `out` when cached and intact.
  bool get(const ChunkHash& h, std::vector<std::byte>& out);
  void put(const ChunkHash& h, std::span<const std::byte> bytes);
  void erase(const ChunkHash& h);
  uint64_t bytes() const;
  size_t entries() const;

 private:
  std::string path(const std::string& hex) const { return dir_ + "/" + hex; }
  void touch(const std::string& hex);          // mu_ held
  void drop(std::string hex);                  // mu_ held
  Io& io_;
  std::string dir_;
  uint64_t max_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recent first, guarded by mu_
  std::unordered_map<std::string, std::pair<uint64_t, std::list<std::string>::iterator>> index_;  // guarded by mu_
  uint64_t bytes_ = 0;  // guarded by mu_
};

class S3BlobStore final : public BlobStore {
 public:
  // Checks that the bucket answers (one list request). `locks`: null means
  // file_gc_locks(io, <staging_dir>/gc.lock).
  static Result<std::unique_ptr<S3BlobStore>> open(Io& io, S3Location where, S3BlobStoreOptions opt,
                                                   std::unique_ptr<GcLocks> locks = nullptr);

  std::string blob_key(const ChunkHash& h) const;
  std::string pack_key(const std::string& pack) const;
  S3Client& client() { return s3_; }
  BlobCache* cache() { return cache_.get(); }

  std::string describe() const override { return where_.redacted; }
  Result<bool> contains(const ChunkHash& h) override;
  Result<std::vector<std::byte>> get(const ChunkHash& h, uint64_t max_bytes) override;
  using BlobStore::get;
  Status get_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes,
                  std::vector<std::byte>& out) override;
  Status read_stored_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes,
                          std::vector<std::byte>& out) override;
  Result<std::vector<ChunkHash>> list() override;
  Result<std::vector<std::string>> list_packs() override;
  Status remove(const GcLock&, const ChunkHash& h) override;
  Status remove_pack(const GcLock&, const std::string& pack) override;
  Result<std::optional<std::string>> read_store_id() override;
  Status create_store_id(const std::string& id) override;
  Result<std::vector<std::string>> list_tmp() override;
  Status remove_tmp(const GcLock&, const std::string& name) override;
  Result<size_t> abort_stale_uploads(const GcLock&) override;
  Result<uint64_t> blob_size(const ChunkHash& h) override { return object_size(blob_key(h)); }
  // The size list_packs() saw, else a HEAD: a gc that looks at every pack for compaction asks
  // once per pack, and a listing's sizes save a request each (packs never change once written).
  Result<uint64_t> pack_size(const std::string& pack) override;
  Result<uint64_t> tmp_size(const std::string& name) override;

 protected:
  Result<std::unique_ptr<BlobWriteBatch>> new_batch(std::unique_ptr<GcLockHold> hold) override;

 private:
  friend class S3BlobWriteBatch;
  S3BlobStore(Io& io, S3Location where, S3BlobStoreOptions opt, std::unique_ptr<GcLocks> locks);
  std::string key(const std::string& rest) const;  // <prefix>/<rest>
  Result<uint64_t> object_size(const std::string& key);

  Io& io_;
  S3Location where_;
  S3BlobStoreOptions opt_;
  S3Client s3_;
  std::unique_ptr<BlobCache> cache_;
  std::mutex listed_mu_;
  std::map<std::string, uint64_t> listed_pack_sizes_;  // list_packs()'s, minus removed packs
};

}  // namespace kvsnap
