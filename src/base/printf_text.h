// printf into a std::string: the one way kvsnap formats a line of text whose
// length it does not bound (names, paths, tags).
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <string>

namespace kvsnap {

// As long as the text: a fixed buffer cut a line holding a long name or path, and its newline with it.
// `args` is left unread (the text is formatted from copies).
[[gnu::format(printf, 1, 0)]] inline std::string vprintf_text(const char* fmt, va_list args) {
  va_list count, again;
  va_copy(count, args);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, count);
  va_end(count);
  std::string s(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, again);
  va_end(again);
  return s;
}

[[gnu::format(printf, 1, 2)]] inline std::string printf_text(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = vprintf_text(fmt, args);
  va_end(args);
  return s;
}

}  // namespace kvsnap
