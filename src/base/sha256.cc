#include "base/sha256.h"

#include <openssl/evp.h>

#include <new>

namespace kvsnap {
namespace {

// Fetched once: in OpenSSL 3 an EVP_sha256() init does a provider lookup per
// call, which costs as much as hashing a small chunk.
const EVP_MD* sha256_md() {
  static const EVP_MD* md = [] {
    const EVP_MD* m = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return m ? m : EVP_sha256();
  }();
  return md;
}

EVP_MD_CTX* ctx_of(void* p) { return static_cast<EVP_MD_CTX*>(p); }

void check(int openssl_ok) {
  if (openssl_ok != 1) throw std::bad_alloc();  // see the failure policy in the header
}

EVP_MD_CTX* new_ctx() {
  EVP_MD_CTX* c = EVP_MD_CTX_new();
  if (!c) throw std::bad_alloc();
  return c;
}

}  // namespace

Sha256::Sha256() : ctx_(new_ctx()), scratch_(new_ctx()) {
  check(EVP_DigestInit_ex(ctx_of(ctx_), sha256_md(), nullptr));
}

Sha256::Sha256(const Sha256& other) : ctx_(new_ctx()), scratch_(new_ctx()) {
  check(EVP_MD_CTX_copy_ex(ctx_of(ctx_), ctx_of(other.ctx_)));
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_of(ctx_));
  EVP_MD_CTX_free(ctx_of(scratch_));
}

void Sha256::update(std::span<const std::byte> data) {
  if (!data.empty()) check(EVP_DigestUpdate(ctx_of(ctx_), data.data(), data.size()));
}

Sha256Digest Sha256::peek() const {
  Sha256Digest d{};
  unsigned int n = 0;
  check(EVP_MD_CTX_copy_ex(ctx_of(scratch_), ctx_of(ctx_)));
  check(EVP_DigestFinal_ex(ctx_of(scratch_), d.data(), &n));
  return d;
}

Sha256Digest Sha256::finish() {
  Sha256Digest d{};
  unsigned int n = 0;
  check(EVP_DigestFinal_ex(ctx_of(ctx_), d.data(), &n));
  check(EVP_DigestInit_ex(ctx_of(ctx_), sha256_md(), nullptr));
  return d;
}

Sha256Digest sha256_of(std::span<const std::byte> data) {
  static thread_local Sha256 h;
  h.update(data);
  return h.finish();
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * bytes.size(), '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

bool from_hex(std::string_view hex, std::span<uint8_t> out) {
  if (hex.size() != 2 * out.size()) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = uint8_t(hi << 4 | lo);
  }
  return true;
}

}  // namespace kvsnap
