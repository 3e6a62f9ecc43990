// Encryption at rest for store chunks: AES-256-GCM per chunk (OpenSSL EVP), per-tenant keys
// derived from one master key with HKDF-SHA256, keyed chunk ids. Design and threat model:
// docs/store.md, "Encryption at rest".
//
// Why in base/: the chunk id is computed where a save cuts chunks (format/snapshot_write.cc,
// the pipeline of format/snapshot_pipeline.h), which is below the store; base is the one layer
// both format/ and store/ may include. Nothing here knows chunks beyond "bytes with a 32-byte id".
//
// What it promises:
//  - A sealed blob is: the 40-byte header below, the ciphertext, a 16-byte GCM tag. The header
//    and the chunk id are the GCM additional data, so a blob moved to another id, another
//    tenant or another key, or any flipped bit anywhere, fails open() before any plaintext is
//    handed out (the output is zeroed on failure).
//      0  magic "KVSE"             4  version (1)          5  algorithm (1: AES-256-GCM)
//      6  reserved (0, 2 bytes)    8  master key id (8)    16 tenant key id (8)
//      24 nonce (12, random)       36 payload size (u32 LE, = ciphertext size)
//      40 ciphertext               40+n tag (16)
//  - Errors tell the cases apart: a blob sealed under another master key or for another tenant
//    is kMismatch naming both key ids (the ids are fingerprints, never key bytes); a failed tag
//    is kCorruption "tampered or corrupt"; a malformed header is kCorruption naming the field.
//  - Keyed ids: ChunkCipher::chunk_id = HMAC-SHA256(tenant id key, raw bytes). The same raw
//    bytes get the same id within a tenant (dedup keeps working), different ids across tenants,
//    and without the key nobody can confirm a guessed plaintext from an id (which plain SHA-256
//    of the raw bytes would allow).
//  - Key bytes never appear in a message and are wiped (OPENSSL_cleanse) when dropped.
//
// Nonces are 96 random bits per seal: a tenant key should seal fewer than 2^32 blobs (NIST
// SP 800-38D's bound for random GCM nonces); at a few MiB a chunk that is petabytes per tenant.
//
// Thread safety: MasterKey and ChunkCipher are immutable after construction and may be used
// from any number of threads at once. Failure policy for OpenSSL: as base/sha256.h (a failing
// primitive means no memory: std::bad_alloc), except where input decides the outcome.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/sha256.h"
#include "base/status.h"

namespace kvsnap {

inline constexpr size_t kMasterKeyBytes = 32;
inline constexpr std::array<uint8_t, 4> kSealedMagic = {'K', 'V', 'S', 'E'};
inline constexpr uint8_t kSealedVersion = 1;
inline constexpr uint8_t kSealedAesGcm = 1;
inline constexpr size_t kSealedHeaderBytes = 40;
inline constexpr size_t kSealedTagBytes = 16;
inline constexpr size_t kSealedNonceBytes = 12;
// A sealed payload above this is refused before anything is allocated (chunks are at most
// 16 MiB raw, format/chunk_codec.h; the bound leaves room for a blob's own header).
inline constexpr uint32_t kMaxSealedPayload = 64u << 20;

using KeyId = std::array<uint8_t, 8>;
using ChunkId = Sha256Digest;  // keyed: HMAC-SHA256 of the raw bytes

// The store's master key: 32 bytes, wiped on destruction. Copyable (each copy wipes itself).
class MasterKey {
 public:
  static Result<MasterKey> from_bytes(std::span<const uint8_t> bytes);
  MasterKey(const MasterKey&) = default;
  MasterKey& operator=(const MasterKey&) = default;
  ~MasterKey();
  // First 8 bytes of HMAC-SHA256(master, "kvsnap key id"): names the key in blobs and messages.
  const KeyId& id() const { return id_; }
  std::span<const uint8_t> bytes() const { return key_; }

 private:
  MasterKey() = default;
  std::array<uint8_t, kMasterKeyBytes> key_{};
  KeyId id_{};
};

// Key material as a key file or key command gives it: exactly 32 raw bytes, or 64 hex digits
// (either case) with at most one trailing "\n" or "\r\n". `what` names the source in errors
// ("key file /etc/kvsnap.key"); the message never quotes the bytes.
Result<MasterKey> parse_master_key(std::span<const std::byte> material, const std::string& what);

// HKDF-SHA256 (RFC 5869, extract then expand) through OpenSSL 3's EVP_KDF "HKDF".
// out.size() must be 1..8160 (255 * 32); kInvalidArgument otherwise.
Status hkdf_sha256(std::span<const uint8_t> ikm, std::span<const uint8_t> salt, std::span<const uint8_t> info,
                   std::span<uint8_t> out);

// A tenant's name: 1..128 printable ASCII bytes (it goes into HKDF labels and messages).
Status check_tenant_name(std::string_view tenant);

// What a sealed blob's header says, read without any key.
struct SealedHeader {
  uint8_t version = 0;
  uint8_t algorithm = 0;
  KeyId master_key_id{};
  KeyId tenant_key_id{};
  std::array<uint8_t, kSealedNonceBytes> nonce{};
  uint32_t payload_size = 0;
};
// True when `blob` starts with the sealed magic (a plain chunk blob starts with "KVCB").
bool looks_sealed(std::span<const std::byte> blob);
// Checks magic, version, algorithm, reserved bytes, the payload bound and that the blob's size is
// exactly header + payload + tag: everything that can be checked without the key. `what` names
// the blob in errors ("chunk 3f2a...").
Result<SealedHeader> parse_sealed_header(std::span<const std::byte> blob, std::string_view what);

// One tenant's keys, derived from the master key:
//   enc key = HKDF(master, salt "kvsnap chunk cipher v1", info "kvsnap chunk enc v1\0" tenant)
//   id key  = HKDF(master, salt "kvsnap chunk cipher v1", info "kvsnap chunk id v1\0" tenant)
//   tenant key id = first 8 bytes of HMAC-SHA256(id key, "kvsnap tenant key id")
class ChunkCipher {
 public:
  static Result<ChunkCipher> for_tenant(const MasterKey& master, std::string_view tenant);
  ChunkCipher(const ChunkCipher&) = default;
  ChunkCipher& operator=(const ChunkCipher&) = default;
  ~ChunkCipher();

  const std::string& tenant() const { return tenant_; }
  const KeyId& master_key_id() const { return master_id_; }
  const KeyId& tenant_key_id() const { return tenant_id_; }

  // HMAC-SHA256(id key, raw): the chunk's identity in an encrypted store.
  ChunkId chunk_id(std::span<const std::byte> raw) const;

  // Seals `plain` (a chunk's encoded blob: encryption comes after compression) as the blob of
  // `id` into the first N bytes of `blob` (grown when too small, never shrunk: a reused buffer
  // costs no allocation); returns N = plain.size() + 56. kInvalidArgument over kMaxSealedPayload.
  Result<size_t> seal_into(const ChunkId& id, std::span<const std::byte> plain, std::vector<std::byte>& blob) const;
  // Checks and decrypts the blob of `id` into `plain` (resized to the payload). kCorruption for a
  // malformed header or a failed tag, kMismatch for another master key or tenant; `plain` is
  // empty after any failure. `what` names the blob in errors; empty: "chunk <id hex>".
  Status open_into(const ChunkId& id, std::span<const std::byte> blob, std::vector<std::byte>& plain,
                   std::string_view what = {}) const;
  // What `verify` checks of a blob without decrypting it: parse_sealed_header, and that this
  // cipher's keys sealed it (the key ids match). Needs the ids only, so a verify without the
  // key compares with the key ids the catalog recorded instead (check_sealed_key_ids).
  Status check_without_decrypting(std::span<const std::byte> blob, std::string_view what) const;

 private:
  ChunkCipher() = default;
  std::string tenant_;
  std::array<uint8_t, 32> enc_key_{};
  std::array<uint8_t, 32> id_key_{};
  KeyId master_id_{};
  KeyId tenant_id_{};
};

// The key-id half of check_without_decrypting, for a caller that holds only the recorded ids
// (a verify run without the key): kMismatch naming expected and found ids.
Status check_sealed_key_ids(const SealedHeader& h, const KeyId& master, const KeyId& tenant, std::string_view what);

// 16 lowercase hex digits.
std::string key_id_hex(const KeyId& id);

}  // namespace kvsnap
