// Manifest surgery for the format's tests: insert a section before DIGS, change header fields or
// a section's payload, and reseal the DIGS digest, so that a change reaches the section logic
// itself instead of failing the digest check.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "base/byte_order.h"
#include "base/sha256.h"
#include "format/cursor.h"
#include "format/snapshot_internal.h"

namespace kvsnap::testing {

struct Surgery {
  std::vector<std::byte> b;
  size_t digs_at() const {
    size_t at = snapshot_detail::kManifestHeaderBytes, last = 0;
    while (at < b.size()) {
      last = at;
      uint64_t len = 0;
      std::memcpy(&len, b.data() + at + 8, 8);
      at += snapshot_detail::kSectionHeaderBytes + len;
    }
    return last;
  }
  void reseal() {
    const size_t d = digs_at();
    const Sha256Digest h = sha256_of(std::span<const std::byte>(b.data(), d));
    std::memcpy(b.data() + d + snapshot_detail::kSectionHeaderBytes + 40, h.data(), 32);
  }
  void insert_section(uint32_t tag, uint32_t flags, const std::string& payload) {
    std::vector<std::byte> s;
    put_u32(s, tag);
    put_u32(s, flags);
    put_u64(s, payload.size());
    for (char c : payload) s.push_back(std::byte(c));
    b.insert(b.begin() + std::ptrdiff_t(digs_at()), s.begin(), s.end());
    uint32_t n = 0;
    std::memcpy(&n, b.data() + 12, 4);
    ++n;
    std::memcpy(b.data() + 12, &n, 4);
    reseal();
  }
  // Replaces the payload of the section with `tag` (its length follows; the digest is resealed).
  void replace_payload(uint32_t tag, const std::string& payload) {
    const size_t at = payload_of(tag);
    uint64_t len = 0;
    std::memcpy(&len, b.data() + at - 8, 8);
    b.erase(b.begin() + std::ptrdiff_t(at), b.begin() + std::ptrdiff_t(at + len));
    b.insert(b.begin() + std::ptrdiff_t(at), reinterpret_cast<const std::byte*>(payload.data()),
             reinterpret_cast<const std::byte*>(payload.data()) + payload.size());
    set_u64(at - 8, payload.size());
    reseal();
  }
  void set_u32(size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
  void set_u16(size_t at, uint16_t v) { std::memcpy(b.data() + at, &v, 2); }
  void set_u64(size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }
  // Offset of the payload of the section with `tag`.
  size_t payload_of(uint32_t tag) const {
    size_t at = snapshot_detail::kManifestHeaderBytes;
    while (at < b.size()) {
      uint32_t t = 0;
      uint64_t len = 0;
      std::memcpy(&t, b.data() + at, 4);
      std::memcpy(&len, b.data() + at + 8, 8);
      if (t == tag) return at + snapshot_detail::kSectionHeaderBytes;
      at += snapshot_detail::kSectionHeaderBytes + len;
    }
    return 0;
  }
};

}  // namespace kvsnap::testing
