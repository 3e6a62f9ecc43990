// Shared by the libFuzzer targets: the input as kvsnap's own types.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/io.h"

namespace kvsnap::fuzz {

inline std::span<const std::byte> bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}
inline std::string_view text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Reads up to `limit` bytes of `f` front to back in pieces, as a consumer
// would; errors are fine (the input is hostile), crashes are not.
inline void read_some(const ReadableFile& f, uint64_t limit) {
  std::vector<std::byte> buf(64 << 10);
  for (uint64_t at = 0; at < f.size() && at < limit;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), f.size() - at);
    if (!f.read_at(at, std::span<std::byte>(buf.data(), n)).ok()) return;
    at += n;
  }
}

}  // namespace kvsnap::fuzz
