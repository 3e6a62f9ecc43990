// SHA-256, the one hash kvsnap uses (chunk identities, snapshot and original
// checksums, model fingerprints, the catalog's token-prefix index), over
// OpenSSL's EVP interface.
//
// Failure policy: OpenSSL fails these calls only when it cannot allocate, so
// they follow the rule for every allocation in kvsnap: std::bad_alloc, caught
// at the process and C API edges. There is no other error path.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvsnap {

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental. Copyable (a copy continues from the same state), movable.
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256& other);
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();

  void update(std::span<const std::byte> data);
  void update(const void* data, size_t n) { update({static_cast<const std::byte*>(data), n}); }
  // The digest of everything so far; the hash goes on.
  Sha256Digest peek() const;
  // The digest of everything so far; the hasher starts over.
  Sha256Digest finish();

 private:
  void* ctx_;      // EVP_MD_CTX
  void* scratch_;  // for peek()
};

Sha256Digest sha256_of(std::span<const std::byte> data);

// Lowercase hex of any bytes ("" for none).
std::string to_hex(std::span<const uint8_t> bytes);
inline std::string to_hex(const Sha256Digest& d) { return to_hex(std::span<const uint8_t>(d)); }
// Exactly 2 * out.size() hex digits (either case) into `out`; false otherwise
// (`out` then holds no promise).
bool from_hex(std::string_view hex, std::span<uint8_t> out);
inline bool from_hex(std::string_view hex, Sha256Digest& out) { return from_hex(hex, std::span<uint8_t>(out)); }

}  // namespace kvsnap
