// The embedded blob store: blobs in a directory (blob_store.h says what every
// blob store promises).
//
//   <root>/packs/<16 hex>.pack  the blobs one save wrote, back to back (what a
//                               save writes): one file and one fsync per save
//                               instead of one per chunk. The catalog knows
//                               where each blob is (BlobLocation).
//   <root>/chunks/ab/<64 hex>   one blob per chunk (put(): what stores made
//                               before packs hold, still read): the name is the
//                               SHA-256 of the chunk's raw bytes (ab = its
//                               first two hex digits)
//   <root>/tmp/                 temporaries of writes in progress
//   <root>/gc.lock              the gc lock of file_gc_locks() (the default)
//
// How it keeps the promises: a blob under chunks/ and a pack under packs/ is
// written to tmp/, fsynced and renamed into place, so a crash or a failed write
// leaves at most a temporary file in tmp/; commit() fsyncs packs/ and every
// shard directory the batch touched (a blob found present may have been
// renamed in by another save that has not synced its directory yet). All file
// access goes through Io.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "base/io.h"
#include "store/blob_store.h"

namespace kvsnap {

class LocalBlobStore final : public BlobStore {
 public:
  // Packs kept open for reading at most: kvsnap serve's one store read more packs than a process may
  // hold descriptors, and a pack another process deleted stayed allocated on disk while open.
  static constexpr size_t kMaxOpenPacks = 64;

  // Creates <root>/chunks, <root>/tmp and <root>/packs when missing. `locks`:
  // null means file_gc_locks(io, <root>/gc.lock).
  static Result<std::unique_ptr<LocalBlobStore>> open(Io& io, std::string root,
                                                      std::unique_ptr<GcLocks> locks = nullptr);

  const std::string& root() const { return root_; }
  std::string blob_path(const ChunkHash& h) const;
  std::string lock_path() const { return root_ + "/gc.lock"; }
  std::string tmp_dir() const { return root_ + "/tmp"; }
  std::string pack_dir() const { return root_ + "/packs"; }
  std::string pack_path(const std::string& pack) const { return pack_dir() + "/" + pack + ".pack"; }

  std::string describe() const override { return root_; }
  Result<bool> contains(const ChunkHash& h) override;
  Result<std::vector<std::byte>> get(const ChunkHash& h, uint64_t max_bytes) override;
  using BlobStore::get;
  // Packs stay open for later reads (thread-safe).
  Status get_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes,
                  std::vector<std::byte>& out) override;
  Result<std::vector<ChunkHash>> list() override;
  Result<std::vector<std::string>> list_packs() override;
  Status remove(const GcLock&, const ChunkHash& h) override;
  Status remove_pack(const GcLock&, const std::string& pack) override;
  Result<std::optional<std::string>> read_store_id() override;
  Status create_store_id(const std::string& id) override;
  Result<std::vector<std::string>> list_tmp() override;
  Status remove_tmp(const GcLock&, const std::string& name) override;
  Result<uint64_t> blob_size(const ChunkHash& h) override { return file_size(blob_path(h)); }
  Result<uint64_t> pack_size(const std::string& pack) override { return file_size(pack_path(pack)); }
  Result<uint64_t> tmp_size(const std::string& name) override { return file_size(tmp_dir() + "/" + name); }

 protected:
  Result<std::unique_ptr<BlobWriteBatch>> new_batch(std::unique_ptr<GcLockHold> hold) override;

 private:
  friend class LocalBlobWriteBatch;
  LocalBlobStore(Io& io, std::string root, std::unique_ptr<GcLocks> locks)
      : BlobStore(std::move(locks)), io_(io), root_(std::move(root)) {}
  std::string shard_dir(const ChunkHash& h) const;
  // The pack's file, open (kCorruption for a name that is not a pack's: the catalog names it).
  Result<std::shared_ptr<const ReadableFile>> open_pack(const std::string& pack);
  // 0 when the file is absent.
  Result<uint64_t> file_size(const std::string& path);

  Io& io_;
  std::string root_;
  // At most kMaxOpenPacks packs stay open (above), the least recently read closed first. A reader
  // holds its pack's file (shared) until it is done.
  struct OpenPack {
    std::shared_ptr<const ReadableFile> file;
    uint64_t last_use = 0;
  };
  std::mutex packs_mu_;
  std::map<std::string, OpenPack> open_packs_;  // guarded by packs_mu_
  uint64_t pack_uses_ = 0;                      // guarded by packs_mu_
};

}  // namespace kvsnap
