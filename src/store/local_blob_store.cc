#include "store/local_blob_store.h"

#include <algorithm>

#include "store/pack_tally.h"

namespace kvsnap {


// A save's batch: loose blobs renamed into chunks/, new blobs appended to one
// pack written in tmp/ and renamed into packs/ by commit().
class LocalBlobWriteBatch final : public BlobWriteBatch {
 public:
  LocalBlobWriteBatch(LocalBlobStore& store, std::unique_ptr<GcLockHold> hold)
      : BlobWriteBatch(std::move(hold)), store_(store) {}
  Result<PutOutcome> put(const ChunkHash& h, std::span<const std::byte> stored) override;
  Result<BlobLocation> append(const ChunkHash& h, std::span<const std::byte> stored) override;
  // Completes the pack (fsync, rename into packs/), then fsyncs packs/ and
  // every shard directory this batch touched (and chunks/ when a shard was
  // created).
  Status commit() override;
  uint64_t written() const override;
  // nullopt once a pack's file could not tell (WritableFile::disk_waits).
  std::optional<uint64_t> storage_waits() const override {
    std::lock_guard<std::mutex> g(mu_);
    if (!done_packs_waits_ || !pack_file_) return done_packs_waits_;
    const std::optional<uint64_t> now = pack_file_->disk_waits();
    if (!now) return std::nullopt;
    return *done_packs_waits_ + *now;
  }

 private:
  LocalBlobStore& store_;
  mutable std::mutex mu_;
  std::set<std::string> dirty_dirs_;  // guarded by mu_
  uint64_t written_ = 0;              // guarded by mu_
  // The pack being written (guarded by mu_): its file, and its name, size so far and blobs.
  std::unique_ptr<AtomicFileWriter> pack_file_;
  PackTally pack_;
  // The disk waits of this batch's packs before pack_file_ (nullopt: one could not tell).
  std::optional<uint64_t> done_packs_waits_ = 0;
  void add_waits_of_pack() {  // mu_ held, pack_file_ set
    const std::optional<uint64_t> w = pack_file_->disk_waits();
    done_packs_waits_ = done_packs_waits_ && w ? std::optional<uint64_t>(*done_packs_waits_ + *w) : std::nullopt;
  }
};

Result<std::unique_ptr<LocalBlobStore>> LocalBlobStore::open(Io& io, std::string root, std::unique_ptr<GcLocks> locks) {
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  KV_RETURN_IF_ERROR(io.create_dirs(root + "/chunks"));
  KV_RETURN_IF_ERROR(io.create_dirs(root + "/tmp"));
  KV_RETURN_IF_ERROR(io.create_dirs(root + "/packs"));
  if (!locks) locks = file_gc_locks(io, root + "/gc.lock");
  return std::unique_ptr<LocalBlobStore>(new LocalBlobStore(io, std::move(root), std::move(locks)));
}

std::string LocalBlobStore::shard_dir(const ChunkHash& h) const { return root_ + "/chunks/" + h.hex().substr(0, 2); }

std::string LocalBlobStore::blob_path(const ChunkHash& h) const {
  std::string hex = h.hex();
  return root_ + "/chunks/" + hex.substr(0, 2) + "/" + hex;
}

Result<std::unique_ptr<BlobWriteBatch>> LocalBlobStore::new_batch(std::unique_ptr<GcLockHold> hold) {
  return std::unique_ptr<BlobWriteBatch>(new LocalBlobWriteBatch(*this, std::move(hold)));
}

Result<bool> LocalBlobStore::contains(const ChunkHash& h) { return io_.exists(blob_path(h)); }

Result<std::vector<std::byte>> LocalBlobStore::get(const ChunkHash& h, uint64_t max_bytes) {
  std::string path = blob_path(h);
  KV_ASSIGN_OR_RETURN(bool present, io_.exists(path));
  if (!present) return Status::NotFound("chunk " + h.hex() + " is missing from the store (" + path + ")");
  return read_all(io_, path, max_bytes);
}

Result<std::shared_ptr<const ReadableFile>> LocalBlobStore::open_pack(const std::string& pack) {
  // A name from the catalog is never a path (S3BlobStore checks the same): "../x" would open a file
  // outside packs/.
  if (!is_pack_name(pack + ".pack")) return Status::Corruption("'" + pack + "' is not a pack name");
  std::lock_guard<std::mutex> g(packs_mu_);
  auto it = open_packs_.find(pack);
  if (it != open_packs_.end()) {
    it->second.last_use = ++pack_uses_;
    return it->second.file;
  }
  const std::string path = pack_path(pack);
  KV_ASSIGN_OR_RETURN(bool present, io_.exists(path));
  if (!present) return Status::NotFound("pack " + pack + " is missing from the store (" + path + ")");
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> opened, io_.open_read(path));
  // Packs another process's gc deleted (compacted, or all dead) since they were opened here: an
  // open descriptor keeps a deleted file's space until closed, and a long-lived store (kvsnap
  // serve) would hold up to kMaxOpenPacks of them. Checked at each miss: one stat per open pack.
  for (auto e = open_packs_.begin(); e != open_packs_.end();) {
    auto still = io_.exists(pack_path(e->first));
    e = still.ok() && !*still ? open_packs_.erase(e) : std::next(e);
  }
  if (open_packs_.size() >= kMaxOpenPacks) {
    auto oldest = std::min_element(open_packs_.begin(), open_packs_.end(), [](const auto& a, const auto& b) {
      return a.second.last_use < b.second.last_use;
    });
    open_packs_.erase(oldest);  // closed once its last reader is done
  }
  std::shared_ptr<const ReadableFile> file(std::move(opened));
  open_packs_[pack] = OpenPack{file, ++pack_uses_};
  return file;
}

Status LocalBlobStore::get_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes, std::vector<std::byte>& out) {
  if (where.pack.empty()) {
    KV_ASSIGN_OR_RETURN(out, get(h, max_bytes));
    return Status::OK();
  }
  if (where.size > max_bytes)
    return Status::InvalidArgument("chunk " + h.hex() + " in pack " + where.pack + " claims " +
                                   std::to_string(where.size) + " bytes, more than " + std::to_string(max_bytes));
  KV_ASSIGN_OR_RETURN(const std::shared_ptr<const ReadableFile> f, open_pack(where.pack));
  if (where.offset > f->size() || where.size > f->size() - where.offset)
    return Status::Corruption("chunk " + h.hex() + ": pack " + pack_path(where.pack) + " has " +
                              std::to_string(f->size()) + " bytes, the blob is said to end at " +
                              std::to_string(where.offset + where.size));
  out.resize(where.size);
  return f->read_at(where.offset, out);
}

Result<std::vector<std::string>> LocalBlobStore::list_packs() {
  std::vector<std::string> out;
  KV_ASSIGN_OR_RETURN(auto files, io_.list_dir(pack_dir()));
  for (const DirEntry& f : files)
    if (f.is_regular && is_pack_name(f.name)) out.push_back(f.name.substr(0, f.name.size() - 5));
  std::sort(out.begin(), out.end());
  return out;
}

Status LocalBlobStore::remove_pack(const GcLock&, const std::string& pack) {
  {
    std::lock_guard<std::mutex> g(packs_mu_);
    open_packs_.erase(pack);
  }
  return io_.remove(pack_path(pack));
}

Result<std::vector<ChunkHash>> LocalBlobStore::list() {
  std::vector<ChunkHash> out;
  KV_ASSIGN_OR_RETURN(auto shards, io_.list_dir(root_ + "/chunks"));
  for (const DirEntry& shard : shards) {
    if (!shard.is_dir || shard.name.size() != 2) continue;
    KV_ASSIGN_OR_RETURN(auto files, io_.list_dir(root_ + "/chunks/" + shard.name));
    for (const DirEntry& f : files) {
      if (!f.is_regular || !is_blob_name(f.name) || f.name.compare(0, 2, shard.name) != 0) continue;
      KV_ASSIGN_OR_RETURN(ChunkHash h, ChunkHash::from_hex(f.name));  // is_blob_name checked the digits
      out.push_back(h);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status LocalBlobStore::remove(const GcLock&, const ChunkHash& h) { return io_.remove(blob_path(h)); }

Result<std::vector<std::string>> LocalBlobStore::list_tmp() {
  KV_ASSIGN_OR_RETURN(auto files, io_.list_dir(tmp_dir()));
  std::vector<std::string> out;
  for (const DirEntry& f : files)
    if (f.is_regular) out.push_back(f.name);
  return out;
}

Result<std::optional<std::string>> LocalBlobStore::read_store_id() {
  const std::string path = root_ + "/" + kStoreIdName;
  auto bytes = read_all(io_, path, kMaxStoreIdBytes);
  if (!bytes.ok() && bytes.status().code() == Code::kNotFound) return std::optional<std::string>();
  if (!bytes.ok() && bytes.status().code() == Code::kInvalidArgument)
    return Status::Corruption(path + " is not a store id (" + bytes.status().message() + ")");
  KV_RETURN_IF_ERROR(bytes.status());
  if (bytes->empty()) return std::optional<std::string>();  // a crash between its create and its write
  return std::optional<std::string>(std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
}

Status LocalBlobStore::create_store_id(const std::string& id) {
  const std::string path = root_ + "/" + kStoreIdName;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto file = io_.open_write(path, /*exclusive=*/true);
    if (file.ok()) {
      KV_RETURN_IF_ERROR((*file)->append(std::as_bytes(std::span(id))));
      KV_RETURN_IF_ERROR((*file)->sync());
      KV_RETURN_IF_ERROR((*file)->close());
      return io_.sync_dir(root_);
    }
    KV_ASSIGN_OR_RETURN(bool there, io_.exists(path));
    if (!there) return file.status();
    KV_ASSIGN_OR_RETURN(std::optional<std::string> now, read_store_id());
    if (now) return Status::OK();  // another process's: the caller compares
    KV_RETURN_IF_ERROR(io_.remove(path));  // empty: a crash's leftover
  }
  return Status::IOError("cannot create " + path + ": it keeps appearing empty");
}

Status LocalBlobStore::remove_tmp(const GcLock&, const std::string& name) { return io_.remove(tmp_dir() + "/" + name); }

Result<uint64_t> LocalBlobStore::file_size(const std::string& path) {
  auto f = io_.open_read(path);
  if (!f.ok()) return f.status().code() == Code::kNotFound ? Result<uint64_t>(uint64_t(0)) : Result<uint64_t>(f.status());
  return (*f)->size();
}

Result<PutOutcome> LocalBlobWriteBatch::put(const ChunkHash& h, std::span<const std::byte> stored) {
  Io& io = store_.io_;
  std::string dir = store_.shard_dir(h);
  std::string path = store_.blob_path(h);
  KV_ASSIGN_OR_RETURN(bool present, io.exists(path));
  if (present) {
    // Present is not durable: another save may have renamed it in without
    // syncing the directory yet. commit() covers it.
    std::lock_guard<std::mutex> g(mu_);
    dirty_dirs_.insert(dir);
    return PutOutcome::kExisted;
  }
  KV_RETURN_IF_ERROR(io.create_dirs(dir));
  AtomicWriteOptions opt;
  opt.temp_dir = store_.tmp_dir();
  opt.sync_dir = false;
  KV_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::create(io, path, opt));
  KV_RETURN_IF_ERROR(w->append(stored));
  KV_RETURN_IF_ERROR(w->commit());  // on failure the writer's destructor removes the temporary
  std::lock_guard<std::mutex> g(mu_);
  dirty_dirs_.insert(dir);
  dirty_dirs_.insert(store_.root_ + "/chunks");  // the shard may be new
  ++written_;
  return PutOutcome::kWritten;
}

Result<BlobLocation> LocalBlobWriteBatch::append(const ChunkHash& h, std::span<const std::byte> stored) {
  std::lock_guard<std::mutex> g(mu_);
  if (const BlobLocation* at = pack_.find(h)) return *at;
  if (!pack_file_) {
    pack_.start();
    AtomicWriteOptions opt;
    opt.temp_dir = store_.tmp_dir();
    opt.sync_dir = false;  // commit() does packs/
    opt.disk_pace = true;  // a save's adaptive level watches whether the pack's writes block
    KV_ASSIGN_OR_RETURN(pack_file_, AtomicFileWriter::create(store_.io_, store_.pack_path(pack_.name()), opt));
  }
  Status s = pack_file_->append(stored);
  if (!s.ok()) {
    add_waits_of_pack();
    pack_file_.reset();  // removes the temporary: a pack is never left half-written
    pack_.clear();       // those locations will never exist
    return s;
  }
  ++written_;
  return pack_.add(h, stored.size());
}

Status LocalBlobWriteBatch::commit() {
  std::set<std::string> dirs;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (pack_file_) {
      Status s = pack_file_->commit();  // fsync, rename into packs/
      add_waits_of_pack();
      if (!s.ok()) {
        pack_file_.reset();
        pack_.clear();  // those locations will never exist
        return s;
      }
      pack_file_.reset();
      dirty_dirs_.insert(store_.pack_dir());
    }
    dirs.swap(dirty_dirs_);
  }
  // Order does not matter: all of them complete before the catalog commit.
  for (auto it = dirs.begin(); it != dirs.end(); ++it) {
    Status s = store_.io_.sync_dir(*it);
    if (!s.ok()) {
      // Keep the rest dirty so that a retry covers them.
      std::lock_guard<std::mutex> g(mu_);
      dirty_dirs_.insert(it, dirs.end());
      return s;
    }
  }
  return Status::OK();
}

uint64_t LocalBlobWriteBatch::written() const {
  std::lock_guard<std::mutex> g(mu_);
  return written_;
}

}  // namespace kvsnap
