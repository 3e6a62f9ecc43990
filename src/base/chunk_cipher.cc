#include "base/chunk_cipher.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "base/byte_order.h"

namespace kvsnap {
namespace {

// Fetched once: an OpenSSL 3 fetch is a provider lookup under a lock (base/sha256.cc).
EVP_CIPHER* aes_gcm() {
  static EVP_CIPHER* c = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  if (!c) throw std::bad_alloc();
  return c;
}
EVP_MAC* hmac_mac() {
  static EVP_MAC* m = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (!m) throw std::bad_alloc();
  return m;
}
EVP_KDF* hkdf_kdf() {
  static EVP_KDF* k = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (!k) throw std::bad_alloc();
  return k;
}

void check(int openssl_ok) {
  if (openssl_ok != 1) throw std::bad_alloc();  // the header's failure policy
}

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;
CipherCtx new_cipher_ctx() {
  CipherCtx c(EVP_CIPHER_CTX_new());
  if (!c) throw std::bad_alloc();
  return c;
}

std::span<const uint8_t> as_u8(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }
std::span<const uint8_t> as_u8(std::span<const std::byte> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Sha256Digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> data) {
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_new(hmac_mac()), EVP_MAC_CTX_free);
  if (!ctx) throw std::bad_alloc();
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  check(EVP_MAC_init(ctx.get(), key.data(), key.size(), params));
  check(EVP_MAC_update(ctx.get(), data.data(), data.size()));
  Sha256Digest out{};
  size_t n = 0;
  check(EVP_MAC_final(ctx.get(), out.data(), &n, out.size()));
  return out;
}

KeyId first8(const Sha256Digest& d) {
  KeyId id{};
  std::memcpy(id.data(), d.data(), id.size());
  return id;
}

bool is_hex_digit(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

constexpr std::string_view kSalt = "kvsnap chunk cipher v1";

// info = label, a NUL (no label has one), the tenant: distinct labels never collide.
std::string label_for(std::string_view label, std::string_view tenant) {
  std::string info(label);
  info.push_back('\0');
  info.append(tenant);
  return info;
}

std::string default_what(const ChunkId& id, std::string_view what) {
  return what.empty() ? "chunk " + to_hex(id) : std::string(what);
}

void write_header(const ChunkCipher& c, const std::array<uint8_t, kSealedNonceBytes>& nonce, uint32_t payload,
                  std::byte* out) {
  std::memcpy(out, kSealedMagic.data(), 4);
  out[4] = std::byte{kSealedVersion};
  out[5] = std::byte{kSealedAesGcm};
  out[6] = out[7] = std::byte{0};
  std::memcpy(out + 8, c.master_key_id().data(), 8);
  std::memcpy(out + 16, c.tenant_key_id().data(), 8);
  std::memcpy(out + 24, nonce.data(), kSealedNonceBytes);
  store_le(out + 36, payload, 4);
}

}  // namespace

// --- Keys ----------------------------------------------------------------------------------

MasterKey::~MasterKey() { OPENSSL_cleanse(key_.data(), key_.size()); }

Result<MasterKey> MasterKey::from_bytes(std::span<const uint8_t> bytes) {
  if (bytes.size() != kMasterKeyBytes) {
    return Status::InvalidArgument("a master key is " + std::to_string(kMasterKeyBytes) + " bytes, not " +
                                   std::to_string(bytes.size()));
  }
  MasterKey k;
  std::memcpy(k.key_.data(), bytes.data(), kMasterKeyBytes);
  k.id_ = first8(hmac_sha256(k.key_, as_u8(std::string_view("kvsnap key id"))));
  return k;
}

Result<MasterKey> parse_master_key(std::span<const std::byte> material, const std::string& what) {
  const std::span<const uint8_t> m = as_u8(material);
  size_t n = m.size();
  const bool all_hex = [&] {
    for (size_t i = 0; i < n; ++i) {
      if (!is_hex_digit(m[i]) && !((m[i] == '\n' || m[i] == '\r') && i + 2 >= n)) return false;
    }
    return n > 0;
  }();
  // 32 raw random bytes are all hex digits with odds of (22/256)^32: such a file is a hex key
  // cut short, which taken as raw would open (or create) a store under a key nobody meant.
  if (n == kMasterKeyBytes && !all_hex) return MasterKey::from_bytes(m);
  if (n >= 1 && m[n - 1] == '\n') --n;
  if (n >= 1 && m[n - 1] == '\r' && n + 1 == m.size()) --n;
  const std::string shape = "a key is " + std::to_string(kMasterKeyBytes) + " raw bytes or " +
                            std::to_string(2 * kMasterKeyBytes) + " hex digits, with an optional newline";
  if (n != 2 * kMasterKeyBytes) {
    const bool digits_only = all_hex && std::all_of(m.begin(), m.begin() + n, is_hex_digit);
    if (digits_only) return Status::InvalidArgument(what + ": " + std::to_string(n) + " hex digits; " + shape);
    return Status::InvalidArgument(what + ": " + std::to_string(m.size()) + " bytes; " + shape);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!is_hex_digit(m[i])) {
      return Status::InvalidArgument(what + ": byte " + std::to_string(i) + " is not a hex digit; " + shape);
    }
  }
  std::array<uint8_t, kMasterKeyBytes> raw{};
  const bool ok = from_hex(std::string_view(reinterpret_cast<const char*>(m.data()), n), std::span<uint8_t>(raw));
  Result<MasterKey> key = ok ? MasterKey::from_bytes(raw) : Result<MasterKey>(Status::InvalidArgument(what + ": " + shape));
  OPENSSL_cleanse(raw.data(), raw.size());
  return key;
}

Status hkdf_sha256(std::span<const uint8_t> ikm, std::span<const uint8_t> salt, std::span<const uint8_t> info,
                   std::span<uint8_t> out) {
  if (out.empty() || out.size() > 255 * 32) {
    return Status::InvalidArgument("HKDF-SHA256 gives 1..8160 bytes, not " + std::to_string(out.size()));
  }
  std::unique_ptr<EVP_KDF_CTX, decltype(&EVP_KDF_CTX_free)> ctx(EVP_KDF_CTX_new(hkdf_kdf()), EVP_KDF_CTX_free);
  if (!ctx) throw std::bad_alloc();
  char digest[] = "SHA256";
  OSSL_PARAM params[5];
  OSSL_PARAM* p = params;
  *p++ = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
  *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(ikm.data()), ikm.size());
  // An absent salt is RFC 5869's HashLen zeros, which HMAC's zero padding of an empty key equals.
  if (!salt.empty()) {
    *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<uint8_t*>(salt.data()), salt.size());
  }
  if (!info.empty()) {
    *p++ = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<uint8_t*>(info.data()), info.size());
  }
  *p = OSSL_PARAM_construct_end();
  if (EVP_KDF_derive(ctx.get(), out.data(), out.size(), params) != 1) {
    return Status::InvalidArgument("HKDF-SHA256 refused its input (info over 1024 bytes?)");
  }
  return Status::OK();
}

Status check_tenant_name(std::string_view tenant) {
  if (tenant.empty() || tenant.size() > 128) {
    return Status::InvalidArgument("a tenant name is 1..128 bytes, not " + std::to_string(tenant.size()));
  }
  for (size_t i = 0; i < tenant.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(tenant[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return Status::InvalidArgument("tenant name: byte " + std::to_string(i) +
                                     " is not printable ASCII (no spaces or control characters)");
    }
  }
  return Status::OK();
}

std::string key_id_hex(const KeyId& id) { return to_hex(std::span<const uint8_t>(id)); }

// --- The sealed header ---------------------------------------------------------------------

bool looks_sealed(std::span<const std::byte> blob) {
  return blob.size() >= 4 && std::memcmp(blob.data(), kSealedMagic.data(), 4) == 0;
}

Result<SealedHeader> parse_sealed_header(std::span<const std::byte> blob, std::string_view what) {
  const std::string w(what);
  if (blob.size() < kSealedHeaderBytes + kSealedTagBytes) {
    return Status::Corruption(w + ": " + std::to_string(blob.size()) + " bytes, shorter than an encrypted blob's " +
                              std::to_string(kSealedHeaderBytes + kSealedTagBytes) + " bytes of header and tag");
  }
  if (!looks_sealed(blob)) return Status::Corruption(w + ": not an encrypted blob (bad magic)");
  SealedHeader h;
  const auto* b = reinterpret_cast<const uint8_t*>(blob.data());
  h.version = b[4];
  h.algorithm = b[5];
  if (h.version != kSealedVersion) {
    return Status::NotSupported(w + ": encrypted blob version " + std::to_string(h.version) +
                                " (this kvsnap reads version " + std::to_string(kSealedVersion) + ")");
  }
  if (h.algorithm != kSealedAesGcm) {
    return Status::NotSupported(w + ": unknown encryption algorithm " + std::to_string(h.algorithm) +
                                " (1: AES-256-GCM)");
  }
  if (b[6] != 0 || b[7] != 0) return Status::Corruption(w + ": reserved header bytes are not zero");
  std::memcpy(h.master_key_id.data(), b + 8, 8);
  std::memcpy(h.tenant_key_id.data(), b + 16, 8);
  std::memcpy(h.nonce.data(), b + 24, kSealedNonceBytes);
  h.payload_size = load_le<uint32_t>(b + 36);
  if (h.payload_size > kMaxSealedPayload) {
    return Status::Corruption(w + ": encrypted payload of " + std::to_string(h.payload_size) + " bytes, over the " +
                              std::to_string(kMaxSealedPayload) + " a chunk can have");
  }
  const uint64_t want = uint64_t(kSealedHeaderBytes) + h.payload_size + kSealedTagBytes;
  if (blob.size() != want) {
    return Status::Corruption(w + ": " + std::to_string(blob.size()) + " bytes, but its header says " +
                              std::to_string(want) + " (truncated or corrupt)");
  }
  return h;
}

Status check_sealed_key_ids(const SealedHeader& h, const KeyId& master, const KeyId& tenant, std::string_view what) {
  if (h.master_key_id != master) {
    return Status::Mismatch(std::string(what) + ": encrypted with key " + key_id_hex(h.master_key_id) +
                            ", but the key given is " + key_id_hex(master) +
                            " (wrong key: pass the store's {--key-file FILE} or {--key-command CMD})");
  }
  if (h.tenant_key_id != tenant) {
    return Status::Mismatch(std::string(what) + ": encrypted for another tenant (tenant key " +
                            key_id_hex(h.tenant_key_id) + ", expected " + key_id_hex(tenant) + ")");
  }
  return Status::OK();
}

// --- ChunkCipher ---------------------------------------------------------------------------

ChunkCipher::~ChunkCipher() {
  OPENSSL_cleanse(enc_key_.data(), enc_key_.size());
  OPENSSL_cleanse(id_key_.data(), id_key_.size());
}

Result<ChunkCipher> ChunkCipher::for_tenant(const MasterKey& master, std::string_view tenant) {
  KV_RETURN_IF_ERROR(check_tenant_name(tenant));
  ChunkCipher c;
  c.tenant_ = std::string(tenant);
  c.master_id_ = master.id();
  KV_RETURN_IF_ERROR(hkdf_sha256(master.bytes(), as_u8(kSalt), as_u8(label_for("kvsnap chunk enc v1", tenant)),
                                 c.enc_key_));
  KV_RETURN_IF_ERROR(hkdf_sha256(master.bytes(), as_u8(kSalt), as_u8(label_for("kvsnap chunk id v1", tenant)),
                                 c.id_key_));
  c.tenant_id_ = first8(hmac_sha256(c.id_key_, as_u8(std::string_view("kvsnap tenant key id"))));
  return c;
}

ChunkId ChunkCipher::chunk_id(std::span<const std::byte> raw) const { return hmac_sha256(id_key_, as_u8(raw)); }

Result<size_t> ChunkCipher::seal_into(const ChunkId& id, std::span<const std::byte> plain,
                                      std::vector<std::byte>& blob) const {
  if (plain.size() > kMaxSealedPayload) {
    return Status::InvalidArgument("chunk " + to_hex(id) + ": " + std::to_string(plain.size()) +
                                   " bytes to encrypt, over the " + std::to_string(kMaxSealedPayload) + " limit");
  }
  const size_t total = kSealedHeaderBytes + plain.size() + kSealedTagBytes;
  if (blob.size() < total) blob.resize(total);
  std::array<uint8_t, kSealedNonceBytes> nonce{};
  if (RAND_bytes(nonce.data(), int(nonce.size())) != 1) {
    return Status::IOError("no random bytes for an encryption nonce (OpenSSL's RAND_bytes failed)");
  }
  std::byte* out = blob.data();
  write_header(*this, nonce, uint32_t(plain.size()), out);
  CipherCtx ctx = new_cipher_ctx();
  int len = 0;
  check(EVP_EncryptInit_ex2(ctx.get(), aes_gcm(), enc_key_.data(), nonce.data(), nullptr));
  check(EVP_EncryptUpdate(ctx.get(), nullptr, &len, reinterpret_cast<const uint8_t*>(out), int(kSealedHeaderBytes)));
  check(EVP_EncryptUpdate(ctx.get(), nullptr, &len, id.data(), int(id.size())));
  auto* ct = reinterpret_cast<uint8_t*>(out + kSealedHeaderBytes);
  if (!plain.empty()) {
    check(EVP_EncryptUpdate(ctx.get(), ct, &len, reinterpret_cast<const uint8_t*>(plain.data()), int(plain.size())));
  }
  check(EVP_EncryptFinal_ex(ctx.get(), ct + plain.size(), &len));
  check(EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_GET_TAG, int(kSealedTagBytes), ct + plain.size()));
  return total;
}

Status ChunkCipher::check_without_decrypting(std::span<const std::byte> blob, std::string_view what) const {
  KV_ASSIGN_OR_RETURN(const SealedHeader h, parse_sealed_header(blob, what));
  return check_sealed_key_ids(h, master_id_, tenant_id_, what);
}

Status ChunkCipher::open_into(const ChunkId& id, std::span<const std::byte> blob, std::vector<std::byte>& plain,
                              std::string_view what) const {
  plain.clear();
  const std::string w = default_what(id, what);
  KV_ASSIGN_OR_RETURN(const SealedHeader h, parse_sealed_header(blob, w));
  KV_RETURN_IF_ERROR(check_sealed_key_ids(h, master_id_, tenant_id_, w));
  plain.resize(h.payload_size);
  const auto* b = reinterpret_cast<const uint8_t*>(blob.data());
  CipherCtx ctx = new_cipher_ctx();
  int len = 0;
  check(EVP_DecryptInit_ex2(ctx.get(), aes_gcm(), enc_key_.data(), h.nonce.data(), nullptr));
  check(EVP_DecryptUpdate(ctx.get(), nullptr, &len, b, int(kSealedHeaderBytes)));
  check(EVP_DecryptUpdate(ctx.get(), nullptr, &len, id.data(), int(id.size())));
  auto* pt = reinterpret_cast<uint8_t*>(plain.data());
  if (h.payload_size > 0) check(EVP_DecryptUpdate(ctx.get(), pt, &len, b + kSealedHeaderBytes, int(h.payload_size)));
  std::array<uint8_t, kSealedTagBytes> tag{};
  std::memcpy(tag.data(), b + kSealedHeaderBytes + h.payload_size, tag.size());
  check(EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_SET_TAG, int(tag.size()), tag.data()));
  if (EVP_DecryptFinal_ex(ctx.get(), pt + h.payload_size, &len) != 1) {
    // Unauthenticated plaintext never leaves: a caller that ignored the status finds nothing.
    OPENSSL_cleanse(plain.data(), plain.size());
    plain.clear();
    return Status::Corruption(w + ": tampered or corrupt (its AES-GCM tag does not match the key " +
                              key_id_hex(master_id_) + ", tenant '" + tenant_ + "' and chunk id)");
  }
  return Status::OK();
}

}  // namespace kvsnap
