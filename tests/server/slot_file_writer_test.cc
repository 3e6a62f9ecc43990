// The slot file kvsnap hands to llama-server (src/server/slot_file_writer.h):
// the final name appears only complete, and a kept scratch file is written over
// in place (its inode reused) and cut to the new length.
#include "server/slot_file_writer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "temp_dir.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& p) { return test::slurp_text(p); }

ino_t inode(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? st.st_ino : 0;
}

Status write_all(SlotFileWriter& w, const std::string& s) {
  return w.append(std::as_bytes(std::span<const char>(s.data(), s.size())));
}

std::vector<std::string> names(const std::string& dir) {
  std::vector<std::string> n;
  for (const auto& e : fs::directory_iterator(dir)) n.push_back(e.path().filename().string());
  std::sort(n.begin(), n.end());
  return n;
}

TEST(SlotFileWriter, TheFinalNameAppearsOnlyAtCommit) {
  const test::TempDir d{"kvsnap-slotfile"};
  const std::string path = d.path() + "/slot.bin";
  auto w = SlotFileWriter::create(posix_io(), path, d.path() + "/.kvsnap-scratch.kvsnap-tmp-kept");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_FALSE((*w)->reused_scratch()) << "no scratch file yet";
  const std::string big(9u << 20, 'x');  // more than two of the writer's blocks
  ASSERT_TRUE(write_all(**w, big).ok());
  EXPECT_FALSE(fs::exists(path));
  ASSERT_TRUE((*w)->commit().ok());
  EXPECT_EQ(slurp(path), big);
  EXPECT_EQ(names(d.path()), std::vector<std::string>{"slot.bin"});
}

// Large appends are written by the caller, small ones go through the thread's blocks: the bytes
// still come out in the order they were appended, whatever mix of the two.
TEST(SlotFileWriter, SmallAndLargeAppendsComeOutInOrder) {
  const test::TempDir d{"kvsnap-slotfile"};
  const std::string path = d.path() + "/slot.bin";
  auto w = SlotFileWriter::create(posix_io(), path);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::string want;
  auto add = [&](size_t n, char c) {
    std::string s(n, c);
    for (size_t i = 0; i < n; i += 4093) s[i] = char('A' + (want.size() + i) % 26);  // not one repeated byte
    want += s;
    return write_all(**w, s);
  };
  // Header-sized pieces, blocks the size of a converted tensor block, pieces that fill the
  // thread's 1 MiB blocks past their end, and a large append right after one that filled a block.
  const std::pair<size_t, char> steps[] = {{12, 'h'},          {557056, 'a'},       {4, 't'},
                                           {300u << 10, 'b'},  {(1u << 20) - 4, 'c'}, {557056, 'd'},
                                           {3u << 20, 'e'},    {100, 'f'},          {(3u << 20) + 7, 'g'},
                                           {256u << 10, 'i'},  {(256u << 10) - 1, 'j'}};
  for (const auto& [n, c] : steps) ASSERT_TRUE(add(n, c).ok());
  ASSERT_TRUE((*w)->commit().ok());
  EXPECT_TRUE(slurp(path) == want) << "bytes out of order or lost";
}

TEST(SlotFileWriter, AKeptScratchFileIsWrittenOverInPlaceAndCutToTheNewLength) {
  const test::TempDir d{"kvsnap-slotfile"};
  const std::string scratch = d.path() + "/.kvsnap-scratch.kvsnap-tmp-kept", path = d.path() + "/slot.bin";
  { std::ofstream(scratch, std::ios::binary) << std::string(6u << 20, 'o'); }
  const ino_t before = inode(scratch);
  auto w = SlotFileWriter::create(posix_io(), path, scratch);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_TRUE((*w)->reused_scratch());
  EXPECT_FALSE(fs::exists(scratch)) << "claimed: no other writer can take it";
  const std::string shorter = std::string(1u << 20, 'a') + "tail";
  ASSERT_TRUE(write_all(**w, shorter).ok());
  EXPECT_FALSE(fs::exists(path));
  ASSERT_TRUE((*w)->commit().ok());
  EXPECT_EQ(slurp(path), shorter) << "no byte of the old contents after the new end";
  EXPECT_EQ(inode(path), before) << "the same file, its pages reused";
  EXPECT_EQ(names(d.path()), std::vector<std::string>{"slot.bin"});
}

TEST(SlotFileWriter, OfTwoWritersOneGetsTheScratchFile) {
  const test::TempDir d{"kvsnap-slotfile"};
  const std::string scratch = d.path() + "/.kvsnap-scratch.kvsnap-tmp-kept";
  { std::ofstream(scratch, std::ios::binary) << "old"; }
  auto a = SlotFileWriter::create(posix_io(), d.path() + "/a.bin", scratch);
  auto b = SlotFileWriter::create(posix_io(), d.path() + "/b.bin", scratch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE((*a)->reused_scratch());
  EXPECT_FALSE((*b)->reused_scratch());
  ASSERT_TRUE(write_all(**a, "A").ok() && write_all(**b, "B").ok());
  ASSERT_TRUE((*a)->commit().ok() && (*b)->commit().ok());
  EXPECT_EQ(slurp(d.path() + "/a.bin"), "A");
  EXPECT_EQ(slurp(d.path() + "/b.bin"), "B");
}

// A review's finding: the scratch file was opened through a symlink (or a second hard link) someone
// planted in the slot directory, and the slot's bytes overwrote the file it pointed at, outside the
// directory (with kvsnap as root: any file). One that is not a regular file of kvsnap's user with
// one name is removed, and a new file made.
TEST(SlotFileWriter, AScratchThatIsALinkIsNotWrittenThrough) {
  const test::TempDir d{"kvsnap-slotfile"}, outside{"kvsnap-slotfile-outside"};
  const std::string scratch = d.path() + "/.kvsnap-scratch.kvsnap-tmp-kept", victim = outside.path() + "/precious";
  for (const bool hard : {false, true}) {
    SCOPED_TRACE(hard ? "a hard link" : "a symlink");
    { std::ofstream(victim, std::ios::binary) << "precious data"; }
    if (hard) fs::create_hard_link(victim, scratch);
    else fs::create_symlink(victim, scratch);
    auto w = SlotFileWriter::create(posix_io(), d.path() + "/slot.bin", scratch);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_FALSE((*w)->reused_scratch());
    ASSERT_TRUE(write_all(**w, "slot bytes").ok());
    ASSERT_TRUE((*w)->commit().ok());
    EXPECT_EQ(slurp(victim), "precious data");
    EXPECT_EQ(slurp(d.path() + "/slot.bin"), "slot bytes");
    EXPECT_FALSE(fs::is_symlink(d.path() + "/slot.bin"));
    EXPECT_EQ(names(d.path()), std::vector<std::string>{"slot.bin"}) << "the link is gone";
    fs::remove(d.path() + "/slot.bin");
  }
}

TEST(SlotFileWriter, DroppedWithoutCommitLeavesNothing) {
  const test::TempDir d{"kvsnap-slotfile"};
  const std::string scratch = d.path() + "/.kvsnap-scratch.kvsnap-tmp-kept";
  { std::ofstream(scratch, std::ios::binary) << "old"; }
  {
    auto w = SlotFileWriter::create(posix_io(), d.path() + "/slot.bin", scratch);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(write_all(**w, "partial").ok());
  }
  EXPECT_TRUE(names(d.path()).empty()) << "the claimed scratch went with the unfinished file";
}

}  // namespace
}  // namespace kvsnap
