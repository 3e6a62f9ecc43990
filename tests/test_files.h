// Reading a whole file in a test: the fixture loader every test directory uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace kvsnap::test {

// The file as a string (for comparing outputs byte for byte with ==); empty when it cannot be read
// (the test's checks then fail by name). One read of the file's size, not a character at a time
// through istreambuf_iterator: that loop was a fifth of a truncation sweep's time under the
// sanitizers. What a file holds past its size (one that grew, /proc's) is read after.
inline std::string slurp_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string s;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(p, ec);
  if (in && !ec && size > 0) {
    s.resize(size_t(size));
    in.read(s.data(), std::streamsize(s.size()));
    s.resize(size_t(in.gcount()));
  }
  if (in) s.append(std::istreambuf_iterator<char>(in), {});
  return s;
}

// The file's bytes; empty when it cannot be read.
inline std::vector<std::byte> slurp(const std::filesystem::path& p) {
  const std::string c = slurp_text(p);
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

// The first n bytes of `all` (n <= its size) in a heap block of exactly n bytes, so that
// AddressSanitizer reports any read past the cut. Copied by memcpy and freed by delete[]: in an -O0
// build a std::vector<std::byte>'s range constructor and its destructor make a call per byte, which
// made a sweep over every prefix quadratic in calls (15 s of CI's sanitized stage for a 30 KB file).
class ExactPrefix {
 public:
  ExactPrefix(std::span<const std::byte> all, size_t n) : size_(n) {
    if (n > all.size()) throw std::out_of_range("ExactPrefix: " + std::to_string(n) + " bytes of " + std::to_string(all.size()));
    bytes_.reset(new std::byte[n]);
    if (n > 0) std::memcpy(bytes_.get(), all.data(), n);
  }
  std::span<const std::byte> span() const { return {bytes_.get(), size_}; }

 private:
  std::unique_ptr<std::byte[]> bytes_;
  size_t size_;
};

// The llama.cpp sequence or session file `b` with a token list that holds no token twice (ids 0,
// 1, 2, ...; the fixtures' models have more than their prompts' length): the same cells and rows,
// but no two cells of one token, so layer 0's RoPE witnesses nothing (migrate/rope_head_dim.h)
// and the rotation of an old-format quantized file stays unknown. Plain and packed (-1, version,
// n, tokens...) token lists; false (and `b` unchanged) when it is neither.
template <typename Bytes>
bool drop_repeated_tokens(Bytes& b) {
  auto word = [&](size_t i) {
    int32_t w = 0;
    std::memcpy(&w, b.data() + 12 + 4 * i, 4);
    return w;
  };
  if (b.size() < 16) return false;
  uint32_t n_words = 0;
  std::memcpy(&n_words, b.data() + 8, 4);
  if (b.size() < 12 + 4 * uint64_t(n_words)) return false;
  size_t first = 0, n = n_words;
  if (n_words >= 3 && word(0) == -1) {  // packed: -1, version, n, n tokens, ...
    first = 3;
    n = size_t(uint32_t(word(2)));
    if (first + n > n_words) return false;
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(i);
    std::memcpy(b.data() + 12 + 4 * (first + i), &id, 4);
  }
  return true;
}

// drop_repeated_tokens of the file `from`, written to `to`.
inline bool copy_without_repeated_tokens(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::string b = slurp_text(from);
  if (!drop_repeated_tokens(b)) return false;
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out.write(b.data(), std::streamsize(b.size()));
  return bool(out);
}

}  // namespace kvsnap::test
