// Little-endian byte coding: the one home for turning integers into file bytes and back.
// Every format kvsnap reads or writes (llama.cpp state files, GGUF, snapshots, chunk
// headers) stores integers little-endian, whatever the host's own order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace kvsnap {

// The n (at most 8) bytes at p as an unsigned little-endian integer.
inline uint64_t load_le(const std::byte* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

// The sizeof(T) bytes at p as a T (signed types by two's complement).
template <class T>
T load_le(const std::byte* p) {
  static_assert(std::is_integral_v<T>);
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(load_le(p, sizeof(T))));
}
template <class T>
T load_le(const uint8_t* p) {
  return load_le<T>(reinterpret_cast<const std::byte*>(p));
}

// Writes the low n bytes of v at p, least significant first.
inline void store_le(std::byte* p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = std::byte((v >> (8 * i)) & 0xff);
}

// Appends sizeof(T) bytes of v.
template <class T>
void append_le(std::vector<std::byte>& out, T v) {
  static_assert(std::is_integral_v<T>);
  const auto u = static_cast<std::make_unsigned_t<T>>(v);
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(std::byte((uint64_t(u) >> (8 * i)) & 0xff));
}

// Big-endian, for the one protocol that wants it: PostgreSQL's binary wire format (src/store/pg_conn.*).
inline uint64_t load_be(const std::byte* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | uint64_t(std::to_integer<uint8_t>(p[i]));
  return v;
}

// Appends the low n bytes of v, most significant first.
inline void append_be(std::string& out, uint64_t v, size_t n) {
  for (size_t i = n; i-- > 0;) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace kvsnap
