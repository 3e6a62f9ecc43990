// base/io.h's PosixIo writes: a file written in pieces past the write-behind step (8 MiB, when
// the kernel is asked to start writing) reads back byte for byte after commit.
#include "base/io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

TEST(PosixIo, AFileWrittenPastTheWriteBehindStepReadsBackExactly) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "out.bin").string();
  std::vector<std::byte> want(size_t(21) << 20);  // 2.6 write-behind steps
  std::mt19937 rng(7);
  for (auto& b : want) b = std::byte(rng() & 0xff);
  auto w = AtomicFileWriter::create(posix_io(), path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // Odd piece sizes, so a step boundary falls inside a piece.
  for (size_t at = 0, piece = 1; at < want.size(); at += piece, piece = piece * 7 % 3000011 + 1) {
    piece = std::min(piece, want.size() - at);
    ASSERT_TRUE((*w)->append(std::span<const std::byte>(want.data() + at, piece)).ok());
  }
  ASSERT_TRUE((*w)->commit().ok());
  auto got = read_all(posix_io(), path, want.size());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == want);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvsnap
