// Small text helpers for messages: the one home for how kvsnap prints a raw
// 32-bit field and an untrusted name read from a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <string_view>

namespace kvsnap {

// Eight lower-case hex digits: "67677371" for ggsq's magic.
inline std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// The current time in UTC as strftime(`format`) writes it ("%Y-%m-%dT%H:%M:%SZ").
inline std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char b[64];
  return std::string(b, std::strftime(b, sizeof b, format, &tm));
}

// `s` between single quotes, safe to print whatever a file holds: control bytes
// (and DEL) as \xNN, at most `max_bytes` bytes shown, "..." when cut.
inline std::string quote_text(std::string_view s, size_t max_bytes = 80) {
  std::string out = "'";
  for (char ch : s.substr(0, max_bytes)) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  if (s.size() > max_bytes) out += "...";
  return out + "'";
}

}  // namespace kvsnap
