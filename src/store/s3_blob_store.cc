#include "store/s3_blob_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>

#include "base/sha256.h"
#include "store/eviction.h"
#include "store/pack_tally.h"

namespace kvsnap {

// ---- BlobCache ----------------------------------------------------------------
// A cached blob is the file <dir>/<64 hex>: the blob's bytes, then the SHA-256
// of those bytes (32 bytes). Written to a temporary and renamed, never fsynced.

namespace {
constexpr size_t kDigest = 32;
}

BlobCache::BlobCache(Io& io, std::string dir, uint64_t max_bytes) : io_(io), dir_(std::move(dir)), max_(max_bytes) {}

Status BlobCache::open() {
  KV_RETURN_IF_ERROR(io_.create_dirs(dir_));
  KV_ASSIGN_OR_RETURN(std::vector<DirEntry> files, io_.list_dir(dir_));
  std::lock_guard lock(mu_);
  for (const DirEntry& f : files) {
    if (!f.is_regular) continue;
    if (!is_blob_name(f.name)) {
      (void)io_.remove(path(f.name));  // a temporary of a crashed put
      continue;
    }
    auto r = io_.open_read(path(f.name));
    if (!r.ok()) continue;
    lru_.push_back(f.name);
    index_[f.name] = {(*r)->size(), std::prev(lru_.end())};
    bytes_ += (*r)->size();
  }
  return Status::OK();
}

void BlobCache::touch(const std::string& hex) {
  auto it = index_.find(hex);
  if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.second);
}

void BlobCache::drop(std::string hex) {  // a copy: `hex` may be the LRU entry erased here
  auto it = index_.find(hex);
  if (it == index_.end()) return;
  bytes_ -= it->second.first;
  lru_.erase(it->second.second);
  index_.erase(it);
  (void)io_.remove(path(hex));
}

bool BlobCache::get(const ChunkHash& h, std::vector<std::byte>& out) {
  const std::string hex = h.hex();
  {
    std::lock_guard lock(mu_);
    if (!index_.count(hex)) return false;
    touch(hex);
  }
  auto f = io_.open_read(path(hex));
  bool ok = f.ok() && (*f)->size() >= kDigest;
  if (ok) {
    const uint64_t n = (*f)->size() - kDigest;
    Sha256Digest want{};
    out.resize(n);
    ok = (*f)->read_at(0, out).ok() &&
         (*f)->read_at(n, std::as_writable_bytes(std::span<uint8_t>(want))).ok() && sha256_of(out) == want;
  }
  if (!ok) {
    std::lock_guard lock(mu_);
    drop(hex);  // torn or damaged: fetched again by the caller
  }
  return ok;
}

void BlobCache::put(const ChunkHash& h, std::span<const std::byte> bytes) {
  const uint64_t size = bytes.size() + kDigest;
  if (size > max_ / 4) return;  // one blob never pushes out most of the cache
  const std::string hex = h.hex();
  {
    std::lock_guard lock(mu_);
    if (index_.count(hex)) return;
  }
  const std::string tmp = path(hex) + std::string(kTempInfix) + unique_suffix();
  auto w = io_.open_write(tmp, /*exclusive=*/true);
  const Sha256Digest digest = sha256_of(bytes);
  if (!w.ok() || !(*w)->append(bytes).ok() || !(*w)->append(digest.data(), digest.size()).ok() || !(*w)->close().ok() ||
      !io_.rename(tmp, path(hex)).ok()) {
    (void)io_.remove(tmp);
    return;
  }
  std::lock_guard lock(mu_);
  if (index_.count(hex)) return;  // another thread cached it meanwhile (same bytes)
  lru_.push_front(hex);
  index_[hex] = {size, lru_.begin()};
  bytes_ += size;
  while (bytes_ > max_ && !lru_.empty()) drop(lru_.back());
}

void BlobCache::erase(const ChunkHash& h) {
  std::lock_guard lock(mu_);
  drop(h.hex());
}

uint64_t BlobCache::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

size_t BlobCache::entries() const {
  std::lock_guard lock(mu_);
  return index_.size();
}

// ---- the write batch ----------------------------------------------------------

// Loose blobs are PUT at once. Packed blobs stream to the bucket: appends fill
// a part in memory, and a full part goes up as a part of a multipart upload of
// the pack's own key, outside the mutex (several appending threads may each
// have a part in flight). commit() sends the last part and completes the
// upload; a pack smaller than one part is one PUT at commit(). Until then the
// pack is an incomplete upload, which no listing shows: nothing of a killed
// save stays on this host, and any host's gc aborts its upload
// (abort_stale_uploads).
class S3BlobWriteBatch final : public BlobWriteBatch {
 public:
  S3BlobWriteBatch(S3BlobStore& store, std::unique_ptr<GcLockHold> hold)
      : BlobWriteBatch(std::move(hold)), store_(store),
        part_bytes_(std::max<uint64_t>(store.s3_.config().part_size, 5ull << 20)) {}
  ~S3BlobWriteBatch() override;
  Result<PutOutcome> put(const ChunkHash& h, std::span<const std::byte> stored) override;
  Result<BlobLocation> append(const ChunkHash& h, std::span<const std::byte> stored) override;
  Status commit() override;
  uint64_t written() const override {
    std::lock_guard g(mu_);
    return written_;
  }
  // Parts go out from the caller's thread: its own count of blocks tells (SnapshotOptions).
  std::optional<uint64_t> storage_waits() const override { return std::nullopt; }

 private:
  // Sends part_ as the next part (starting the upload first); `g` is released meanwhile.
  Status send_part(std::unique_lock<std::mutex>& g);
  Status finish_pack();  // mu_ held, no part in flight
  void forget_pack();    // mu_ held: the next append starts a new pack

  S3BlobStore& store_;
  const uint64_t part_bytes_;
  mutable std::mutex mu_;
  std::condition_variable parts_done_;
  uint64_t written_ = 0;  // guarded by mu_
  // The pack being written, all guarded by mu_: its name, size and blobs; the
  // bytes not sent yet; the upload (empty id: no part sent) and its parts'
  // ETags by number - 1; parts on their way; the first part that failed.
  PackTally pack_;
  std::vector<std::byte> part_;
  std::string upload_id_;
  std::vector<std::string> etags_;
  int in_flight_ = 0;
  Status failed_;
  bool committing_ = false;
};

S3BlobWriteBatch::~S3BlobWriteBatch() {
  std::unique_lock g(mu_);
  parts_done_.wait(g, [&] { return in_flight_ == 0; });
  // A pack never completed: its parts go now (best effort; else any host's gc aborts the upload).
  if (!upload_id_.empty()) (void)store_.s3_.abort_upload(store_.pack_key(pack_.name()), upload_id_);
}

void S3BlobWriteBatch::forget_pack() {
  pack_.clear();  // appends after a commit start a new pack
  part_.clear();
  part_.shrink_to_fit();
  upload_id_.clear();
  etags_.clear();
  failed_ = Status::OK();
  committing_ = false;
}

Result<PutOutcome> S3BlobWriteBatch::put(const ChunkHash& h, std::span<const std::byte> stored) {
  KV_ASSIGN_OR_RETURN(const bool present, store_.contains(h));
  if (present) return PutOutcome::kExisted;
  // Another writer may PUT the same key now: same bytes, and either PUT leaves a whole object.
  KV_RETURN_IF_ERROR(store_.s3_.put(store_.blob_key(h), stored));
  std::lock_guard g(mu_);
  ++written_;
  return PutOutcome::kWritten;
}

Result<BlobLocation> S3BlobWriteBatch::append(const ChunkHash& h, std::span<const std::byte> stored) {
  std::unique_lock g(mu_);
  if (const BlobLocation* at = pack_.find(h)) return *at;
  if (committing_) return Status::InvalidArgument("pack " + pack_.name() + " is being committed");
  KV_RETURN_IF_ERROR(failed_);
  if (pack_.name().empty()) pack_.start();
  part_.insert(part_.end(), stored.begin(), stored.end());
  ++written_;
  const BlobLocation at = pack_.add(h, stored.size());
  if (part_.size() >= part_bytes_) KV_RETURN_IF_ERROR(send_part(g));
  return at;
}

Status S3BlobWriteBatch::send_part(std::unique_lock<std::mutex>& g) {
  const std::string key = store_.pack_key(pack_.name());
  if (upload_id_.empty()) {
    Result<std::string> id = store_.s3_.start_upload(key);
    if (!id.ok()) return failed_ = id.status();
    upload_id_ = *id;
  }
  const std::string id = upload_id_;
  etags_.emplace_back();
  const int number = int(etags_.size());
  std::vector<std::byte> bytes;
  bytes.swap(part_);
  ++in_flight_;
  g.unlock();
  Result<std::string> etag = store_.s3_.upload_part(key, id, number, bytes);
  g.lock();
  --in_flight_;
  parts_done_.notify_all();
  if (!etag.ok()) {
    if (failed_.ok()) failed_ = etag.status();
    return etag.status();
  }
  etags_[number - 1] = *etag;
  return Status::OK();
}

Status S3BlobWriteBatch::commit() {
  std::unique_lock g(mu_);
  if (pack_.name().empty()) return Status::OK();  // loose PUTs are durable once answered
  committing_ = true;
  parts_done_.wait(g, [&] { return in_flight_ == 0; });
  KV_RETURN_IF_ERROR(failed_);
  return finish_pack();
}

// What stays after a failure (the upload, its ETags, the last part's bytes)
// lets a retried commit() finish the same pack.
Status S3BlobWriteBatch::finish_pack() {
  const std::string key = store_.pack_key(pack_.name());
  if (upload_id_.empty()) {
    KV_RETURN_IF_ERROR(store_.s3_.put(key, part_));
  } else {
    if (!part_.empty()) {  // the last part may be short
      KV_ASSIGN_OR_RETURN(std::string etag, store_.s3_.upload_part(key, upload_id_, int(etags_.size()) + 1, part_));
      etags_.push_back(std::move(etag));
      part_.clear();
    }
    KV_RETURN_IF_ERROR(store_.s3_.complete_upload(key, upload_id_, etags_));
  }
  forget_pack();
  return Status::OK();
}

// ---- the store ----------------------------------------------------------------

S3BlobStore::S3BlobStore(Io& io, S3Location where, S3BlobStoreOptions opt, std::unique_ptr<GcLocks> locks)
    : BlobStore(std::move(locks)), io_(io), where_(std::move(where)), opt_(std::move(opt)), s3_(where_.config) {}

Result<std::unique_ptr<S3BlobStore>> S3BlobStore::open(Io& io, S3Location where, S3BlobStoreOptions opt,
                                                       std::unique_ptr<GcLocks> locks) {
  if (opt.staging_dir.empty()) return Status::InvalidArgument("S3 blob store " + where.redacted + ": no staging directory");
  KV_RETURN_IF_ERROR(io.create_dirs(opt.staging_dir));
  if (!locks) locks = file_gc_locks(io, opt.staging_dir + "/gc.lock");
  std::unique_ptr<S3BlobStore> store(new S3BlobStore(io, std::move(where), std::move(opt), std::move(locks)));
  if (!store->opt_.cache_dir.empty()) {
    store->cache_ = std::make_unique<BlobCache>(io, store->opt_.cache_dir, store->opt_.cache_bytes);
    KV_RETURN_IF_ERROR(store->cache_->open());
  }
  // Fail here, with the server's words, rather than in the middle of a save.
  KV_RETURN_IF_ERROR(store->s3_.list_page(store->key(""), "", 1).status());
  return store;
}

std::string S3BlobStore::key(const std::string& rest) const {
  return where_.prefix.empty() ? rest : where_.prefix + "/" + rest;
}

std::string S3BlobStore::blob_key(const ChunkHash& h) const {
  const std::string hex = h.hex();
  return key("chunks/" + hex.substr(0, 2) + "/" + hex);
}

std::string S3BlobStore::pack_key(const std::string& pack) const { return key("packs/" + pack + ".pack"); }

Result<uint64_t> S3BlobStore::object_size(const std::string& k) {
  KV_ASSIGN_OR_RETURN(const std::optional<uint64_t> size, s3_.head(k));
  return size.value_or(0);
}

Result<bool> S3BlobStore::contains(const ChunkHash& h) {
  KV_ASSIGN_OR_RETURN(const std::optional<uint64_t> size, s3_.head(blob_key(h)));
  return size.has_value();
}

Result<std::vector<std::byte>> S3BlobStore::get(const ChunkHash& h, uint64_t max_bytes) {
  std::vector<std::byte> out;
  KV_RETURN_IF_ERROR(get_into(h, BlobLocation{}, max_bytes, out));
  return out;
}

Status S3BlobStore::get_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes,
                             std::vector<std::byte>& out) {
  const bool packed = !where.pack.empty();
  // A cached blob of the wrong size or over max_bytes is a miss; read_stored_into checks the claim.
  if (cache_ && cache_->get(h, out) && out.size() <= max_bytes && (!packed || out.size() == where.size))
    return Status::OK();
  KV_RETURN_IF_ERROR(read_stored_into(h, where, max_bytes, out));
  if (cache_) cache_->put(h, out);
  return Status::OK();
}

Status S3BlobStore::read_stored_into(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes,
                                     std::vector<std::byte>& out) {
  const bool packed = !where.pack.empty();
  if (packed && where.size > max_bytes)
    return Status::InvalidArgument("chunk " + h.hex() + " in pack " + where.pack + " claims " +
                                   std::to_string(where.size) + " bytes, more than the " + std::to_string(max_bytes) +
                                   " allowed");
  if (packed) {
    if (!is_pack_name(where.pack + ".pack"))
      return Status::Corruption("chunk " + h.hex() + ": '" + where.pack + "' is not a pack name");
    out.resize(where.size);
    KV_RETURN_IF_ERROR(s3_.get_range(pack_key(where.pack), where.offset, out));
  } else {
    KV_RETURN_IF_ERROR(s3_.get_into(blob_key(h), max_bytes, out));
  }
  return Status::OK();
}

Result<std::vector<ChunkHash>> S3BlobStore::list() {
  const std::string base = key("chunks/");
  KV_ASSIGN_OR_RETURN(const std::vector<S3Object> objects, s3_.list(base));
  std::vector<ChunkHash> out;
  for (const S3Object& o : objects) {
    const std::optional<std::string_view> under = name_under(o.key, base);  // "ab/<64 hex>"
    if (!under) continue;  // outside the store: never its blob
    const std::string_view rest = *under;
    if (rest.size() != 67 || rest[2] != '/' || !is_blob_name(rest.substr(3)) || rest.substr(0, 2) != rest.substr(3, 2))
      continue;  // a foreign object: never deleted by gc
    KV_ASSIGN_OR_RETURN(ChunkHash h, ChunkHash::from_hex(rest.substr(3)));
    out.push_back(h);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::vector<std::string>> S3BlobStore::list_packs() {
  const std::string base = key("packs/");
  KV_ASSIGN_OR_RETURN(const std::vector<S3Object> objects, s3_.list(base));
  std::vector<std::string> out;
  std::lock_guard<std::mutex> g(listed_mu_);
  listed_pack_sizes_.clear();  // this listing's, not those of packs another host deleted since
  for (const S3Object& o : objects) {
    const std::optional<std::string_view> under = name_under(o.key, base);
    if (!under || !is_pack_name(*under)) continue;
    const std::string_view name = *under;
    out.emplace_back(name.substr(0, name.size() - 5));
    listed_pack_sizes_[out.back()] = o.size;
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<uint64_t> S3BlobStore::pack_size(const std::string& pack) {
  {
    std::lock_guard<std::mutex> g(listed_mu_);
    auto it = listed_pack_sizes_.find(pack);
    if (it != listed_pack_sizes_.end()) return it->second;
  }
  return object_size(pack_key(pack));
}

Status S3BlobStore::remove(const GcLock&, const ChunkHash& h) {
  if (cache_) cache_->erase(h);
  return s3_.remove(blob_key(h));
}

Status S3BlobStore::remove_pack(const GcLock&, const std::string& pack) {
  // Cached blobs of the pack stay: content addressed, they are still the right bytes if read again.
  {
    std::lock_guard<std::mutex> g(listed_mu_);
    listed_pack_sizes_.erase(pack);
  }
  return s3_.remove(pack_key(pack));
}

Result<std::optional<std::string>> S3BlobStore::read_store_id() {
  auto bytes = s3_.get(key(kStoreIdName), kMaxStoreIdBytes);
  if (!bytes.ok() && bytes.status().code() == Code::kNotFound) return std::optional<std::string>();
  if (!bytes.ok() && bytes.status().code() == Code::kInvalidArgument)
    return Status::Corruption(s3_.url(key(kStoreIdName)) + " is not a store id (" + bytes.status().message() + ")");
  KV_RETURN_IF_ERROR(bytes.status());
  return std::optional<std::string>(std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
}

Status S3BlobStore::create_store_id(const std::string& id) {
  return s3_.put_if_absent(key(kStoreIdName), std::as_bytes(std::span(id)));
}

Result<std::vector<std::string>> S3BlobStore::list_tmp() {
  KV_ASSIGN_OR_RETURN(const std::vector<DirEntry> files, io_.list_dir(opt_.staging_dir));
  std::vector<std::string> out;
  for (const DirEntry& f : files)
    if (f.is_regular && f.name.find(kTempInfix) != std::string::npos) out.push_back(f.name);
  std::sort(out.begin(), out.end());
  return out;
}

Status S3BlobStore::remove_tmp(const GcLock&, const std::string& name) {
  if (name.find('/') != std::string::npos) return Status::InvalidArgument("'" + name + "' is not a temporary's name");
  const std::string path = opt_.staging_dir + "/" + name;
  KV_ASSIGN_OR_RETURN(const bool there, io_.exists(path));
  return there ? io_.remove(path) : Status::OK();
}

Result<uint64_t> S3BlobStore::tmp_size(const std::string& name) {
  const std::string path = opt_.staging_dir + "/" + name;
  KV_ASSIGN_OR_RETURN(const bool there, io_.exists(path));
  if (!there) return uint64_t(0);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, io_.open_read(path));
  return f->size();
}

// An upload is stale when it started before now - upload_max_age_s. Times are
// compared to the second as ISO 8601 text; one the server wrote otherwise is left alone.
Result<size_t> S3BlobStore::abort_stale_uploads(const GcLock&) {
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string cutoff = utc_iso8601(now_ms - opt_.upload_max_age_s * 1000).substr(0, 19);
  const std::string base = key("packs/");
  KV_ASSIGN_OR_RETURN(const std::vector<S3Upload> uploads, s3_.list_uploads(base));
  size_t aborted = 0;
  for (const S3Upload& u : uploads) {
    const std::optional<std::string_view> under = name_under(u.key, base);
    if (!under || !is_pack_name(*under)) continue;  // another prefix's (a shared bucket), or not a pack
    const bool dated = u.initiated.size() >= 19 && u.initiated[4] == '-' && u.initiated[10] == 'T';
    if (!dated || u.initiated.substr(0, 19) >= cutoff) continue;
    KV_RETURN_IF_ERROR(s3_.abort_upload(u.key, u.upload_id));
    ++aborted;
  }
  return aborted;
}

Result<std::unique_ptr<BlobWriteBatch>> S3BlobStore::new_batch(std::unique_ptr<GcLockHold> hold) {
  return std::unique_ptr<BlobWriteBatch>(new S3BlobWriteBatch(*this, std::move(hold)));
}

}  // namespace kvsnap
