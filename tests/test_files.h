// Reading a whole file in a test: the fixture loader every test directory uses.
#pragma once

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kvsnap::test {

// The file's bytes; empty when it cannot be read (the test's checks then fail by name).
inline std::vector<std::byte> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

// The same as a string (for comparing outputs byte for byte with ==).
inline std::string slurp_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace kvsnap::test
