// What every blob store shares: chunk hashes, the gc locks a save and a gc
// take, and the calls built on the backend's own.
#include "store/blob_store.h"

#include <algorithm>
#include <random>

#include "base/sha256.h"

namespace kvsnap {

ChunkHash ChunkHash::of(std::span<const std::byte> raw) {
  ChunkHash h;
  h.bytes = sha256_of(raw);
  return h;
}

Result<ChunkHash> ChunkHash::from_hex(std::string_view hex) {
  ChunkHash h;
  if (!kvsnap::from_hex(hex, h.bytes)) {
    return Status::InvalidArgument("'" + std::string(hex) + "' is not a chunk hash (64 hex digits)");
  }
  return h;
}

std::string ChunkHash::hex() const { return to_hex(bytes); }

namespace {
bool lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
}  // namespace

bool is_blob_name(std::string_view name) { return name.size() == 64 && lower_hex(name); }

bool is_pack_name(std::string_view name) {
  constexpr size_t kHex = 16;
  return name.size() == kHex + 5 && name.substr(kHex) == ".pack" && lower_hex(name.substr(0, kHex));
}

std::optional<std::string_view> name_under(std::string_view name, std::string_view prefix) {
  if (name.size() < prefix.size() || name.substr(0, prefix.size()) != prefix) return std::nullopt;
  return name.substr(prefix.size());
}

std::string new_pack_name() {
  std::random_device rd;
  const uint64_t v = (uint64_t(rd()) << 32) ^ rd();
  static const char* kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 0; i < 16; ++i) s[i] = kDigits[(v >> (60 - 4 * i)) & 15];
  return s;
}

BlobWriteBatch::~BlobWriteBatch() = default;
BlobStore::~BlobStore() = default;

Result<std::unique_ptr<BlobWriteBatch>> BlobStore::begin_write(bool wait) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLockHold> hold, locks_->lock_shared(wait));
  if (!hold) return std::unique_ptr<BlobWriteBatch>();
  return new_batch(std::move(hold));
}

Result<std::unique_ptr<BlobWriteBatch>> BlobStore::begin_write_under(GcLockHold& hold) {
  return new_batch(borrowed_hold(hold));
}

Result<std::unique_ptr<GcLockHold>> BlobStore::hold_for_read() { return locks_->lock_shared(/*wait=*/true); }

Result<std::unique_ptr<GcLock>> BlobStore::lock_for_gc(bool wait) { return GcLock::take(*locks_, wait); }

Result<std::vector<std::byte>> BlobStore::get(const ChunkHash& h, const BlobLocation& where, uint64_t max_bytes) {
  std::vector<std::byte> out;
  KV_RETURN_IF_ERROR(get_into(h, where, max_bytes, out));
  return out;
}

Result<size_t> BlobStore::clear_tmp(const GcLock& lock) {
  KV_ASSIGN_OR_RETURN(std::vector<std::string> names, list_tmp());
  for (const std::string& n : names) KV_RETURN_IF_ERROR(remove_tmp(lock, n));
  return names.size();
}

}  // namespace kvsnap
