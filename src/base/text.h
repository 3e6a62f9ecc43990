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

inline std::string shown_text(std::string_view s, bool keep_lines = false);

// `s` between single quotes, safe to print whatever a file holds: shown_text's escapes, at most
// `max_bytes` bytes of `s` shown (cut at a character's start), "..." when cut.
inline std::string quote_text(std::string_view s, size_t max_bytes = 80) {
  size_t cut = s.size() > max_bytes ? max_bytes : s.size();
  for (int k = 0; k < 3 && cut > 0 && cut < s.size() && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80; ++k) --cut;
  return "'" + shown_text(s.substr(0, cut)) + (cut < s.size() ? "..." : "") + "'";
}

// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing past
// U+10FFFF), as JSON text and PostgreSQL require of what kvsnap writes there.
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xc2 && c <= 0xdf) n = 1;
    else if (c == 0xe0) { n = 2; lo = 0xa0; }
    else if (c == 0xed) { n = 2; hi = 0x9f; }
    else if (c >= 0xe1 && c <= 0xef) n = 2;
    else if (c == 0xf0) { n = 3; lo = 0x90; }
    else if (c >= 0xf1 && c <= 0xf3) n = 3;
    else if (c == 0xf4) { n = 3; hi = 0x8f; }
    else return false;
    if (i + n >= s.size()) return false;  // cut short
    const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
    if (c1 < lo || c1 > hi) return false;
    for (size_t k = 2; k <= n; ++k) {
      const unsigned char ck = static_cast<unsigned char>(s[i + k]);
      if (ck < 0x80 || ck > 0xbf) return false;
    }
    i += n + 1;
  }
  return true;
}

// Whether UTF-8 text `s` holds a character that moves a terminal's cursor, starts an escape
// sequence or reorders what is shown after it: a C0 control but tab, DEL, a C1 control (U+0080..
// U+009F, CSI among them) or a bidirectional embedding, override or isolate (U+202A..U+202E,
// U+2066..U+2069). The marks (U+200E, U+200F, U+061C) are ordinary in right-to-left text and
// reorder nothing after them: not counted. Text from outside (an archive's index) kvsnap prints.
inline bool has_terminal_controls(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const unsigned char c1 = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
    const unsigned char c2 = i + 2 < s.size() ? static_cast<unsigned char>(s[i + 2]) : 0;
    if ((c < 0x20 && c != '\t') || c == 0x7f) return true;
    if (c == 0xc2 && c1 >= 0x80 && c1 <= 0x9f) return true;  // C1
    if (c == 0xe2 && c1 == 0x80 && c2 >= 0xaa && c2 <= 0xae) return true;
    if (c == 0xe2 && c1 == 0x81 && c2 >= 0xa6 && c2 <= 0xa9) return true;
  }
  return false;
}

// `s` with every byte that is not part of a well-formed UTF-8 sequence written as \xNN (a file
// path of another encoding, made fit for a tag: the same path gives the same text).
inline std::string utf8_escaped(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if (i + len <= s.size() && is_valid_utf8(s.substr(i, len))) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
      ++i;
    }
  }
  return out;
}

// `s` as a listing or a message shows text kvsnap did not write (a snapshot's name and tags, a
// model's architecture, a file name, a server's build string): every C0 control (tab and newline
// too, which would break a listing's rows) and DEL as \xNN, a C1 control or a bidirectional
// embedding, override or isolate (has_terminal_controls) as \uXXXX, a byte that is not part of
// well-formed UTF-8 as \xNN; all else as it is. Nothing shown can move the cursor, start an
// escape sequence or reorder what follows. The text itself is kept as it was (--json prints it).
// keep_lines: newline and tab pass (a whole message of several lines, as the CLI prints errors).
inline std::string shown_text(std::string_view s, bool keep_lines) {
  std::string out;
  out.reserve(s.size());
  char b[16];
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && !(keep_lines && (c == '\n' || c == '\t'))) || c == 0x7f) {
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
      ++i;
      continue;
    }
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    const std::string_view ch = s.substr(i, len);
    if (ch.size() < len || len == 1 || !is_valid_utf8(ch)) {
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
      ++i;
      continue;
    }
    if (has_terminal_controls(ch)) {
      const unsigned cp = len == 2 ? ((c & 0x1fu) << 6) | (static_cast<unsigned char>(ch[1]) & 0x3fu)
                                   : ((c & 0x0fu) << 12) | ((static_cast<unsigned char>(ch[1]) & 0x3fu) << 6) |
                                         (static_cast<unsigned char>(ch[2]) & 0x3fu);
      std::snprintf(b, sizeof b, "\\u%04x", cp);
      out += b;
    } else {
      out.append(ch);
    }
    i += len;
  }
  return out;
}

}  // namespace kvsnap
