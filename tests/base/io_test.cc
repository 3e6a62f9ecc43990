// base/io.h's PosixIo writes: a file written in pieces past the write-behind step (8 MiB, when
// the kernel is asked to start writing) reads back byte for byte after commit.
#include "base/io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/os.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

std::string test_read(const std::string& p) { return test::slurp_text(p); }

TEST(PosixIo, AFileWrittenPastTheWriteBehindStepReadsBackExactly) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "out.bin").string();
  // 5.6 write-behind steps: paced, the appends past kWriteBehindWindows wait for the oldest.
  std::vector<std::byte> want(size_t(45) << 20);
  std::mt19937 rng(7);
  for (auto& b : want) b = std::byte(rng() & 0xff);
  AtomicWriteOptions paced;
  paced.disk_pace = true;
  auto w = AtomicFileWriter::create(posix_io(), path, paced);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  {
    auto plain = posix_io().open_write((dir / "plain.bin").string(), true);
    ASSERT_TRUE(plain.ok());
    EXPECT_FALSE((*plain)->disk_waits()) << "not paced: it cannot tell";
    EXPECT_TRUE((*plain)->pace_to_disk()) << "a POSIX file has the write-behind that paces";
    auto scratch = posix_io().open_scratch((dir / "scratch.bin").string());
    ASSERT_TRUE(scratch.ok());
    EXPECT_FALSE((*scratch)->pace_to_disk()) << "a scratch file has no write-behind";
    EXPECT_FALSE((*scratch)->disk_waits());
  }
  // Odd piece sizes, so a step boundary falls inside a piece.
  for (size_t at = 0, piece = 1; at < want.size(); at += piece, piece = piece * 7 % 3000011 + 1) {
    piece = std::min(piece, want.size() - at);
    ASSERT_TRUE((*w)->append(std::span<const std::byte>(want.data() + at, piece)).ok());
  }
  // A block is counted only when a window is handed to the disk or an old one waited for: never
  // more than the windows. Linux can tell; elsewhere there is no wait to count.
  const std::optional<uint64_t> waits = (*w)->disk_waits();
  EXPECT_EQ(waits.has_value(), std::string(os_branch()) == "linux");
  if (waits) {
    EXPECT_LE(*waits, want.size() / kWriteBehindBytes);
  }
  ASSERT_TRUE((*w)->commit().ok());
  auto got = read_all(posix_io(), path, want.size());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == want);
  fs::remove_all(dir);
}

// A paced file whose system has no wait for its write-back (sync_file_range refuses a character
// device, as a file system without it does) cannot tell the disk's waits: nullopt, so a save's
// adaptive level falls back to its thread's own count instead of taking "never waited" for a fast
// disk.
TEST(PosixIo, AFileWhoseWaitIsNotThereCannotTellItsDiskWaits) {
  auto f = posix_io().open_write("/dev/null", /*exclusive=*/false);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE((*f)->pace_to_disk());
  const std::vector<std::byte> window(kWriteBehindBytes, std::byte{1});
  for (uint64_t k = 0; k <= kWriteBehindWindows + 1; ++k) ASSERT_TRUE((*f)->append(window).ok());
  EXPECT_FALSE((*f)->disk_waits()) << "a wait that is not there counted as none";
  EXPECT_TRUE((*f)->close().ok());
}

// exchange swaps two names in one step, or says kNotSupported where the system has no such call
// (the generic POSIX build); a missing name is an error that leaves the other file alone.
TEST(PosixIo, ExchangeSwapsTwoNamesOrSaysItCannot) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-exchange-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  std::ofstream(a) << "A";
  std::ofstream(b) << "B";
  const Status s = posix_io().exchange(a, b);
  if (std::string(os_branch()) == "posix") {
    EXPECT_EQ(s.code(), Code::kNotSupported) << s.ToString();
  } else if (s.code() == Code::kNotSupported) {
    fs::remove_all(dir);
    GTEST_SKIP() << "the file system of " << dir << " cannot exchange two names: " << s.ToString();
  } else {
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(test_read(a), "B");
    EXPECT_EQ(test_read(b), "A");
    const Status missing = posix_io().exchange((dir / "nothing").string(), a);
    EXPECT_EQ(missing.code(), Code::kNotFound) << missing.ToString();
    EXPECT_EQ(test_read(a), "B");
  }
  fs::remove_all(dir);
}

mode_t mode_of(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

Status write_atomically(const std::string& path, const std::string& text) {
  KV_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::create(posix_io(), path));
  KV_RETURN_IF_ERROR(w->append(std::as_bytes(std::span<const char>(text.data(), text.size()))));
  return w->commit();
}

// The one place paths are cut into directory and name (the catalog's room reserve, a store config's
// directory, a snapshot's recorded source name).
TEST(Paths, DirAndNameOfAPath) {
  struct Case {
    const char *path, *dir, *name;
  };
  for (const Case& c : {Case{"a/b/c", "a/b", "c"}, Case{"c", ".", "c"}, Case{"/c", "/", "c"},
                        Case{"/srv/store/catalog.sqlite", "/srv/store", "catalog.sqlite"}, Case{"a/", "a", ""}}) {
    EXPECT_EQ(dir_of(c.path), c.dir) << c.path;
    EXPECT_EQ(file_name_of(c.path), c.name) << c.path;
  }
}

// A file whose name is near NAME_MAX (255 bytes) is written: its temporary's name is cut to fit, at
// a character's start (a review's finding: past ~215 bytes the temporary's name was too long, and
// every writer failed with "File name too long").
TEST(PosixIo, AFileWithALongNameIsWrittenThroughAShorterTemporary) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-long-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // 254 bytes; 255 with two-byte characters at 214..221, where the cut falls (~217): not inside one
  const std::string accented = std::string(214, 'y') + "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9" + std::string(33, 'z');
  for (const std::string& n : {std::string(254, 'x'), accented}) {
    const std::string path = (dir / n).string();
    const std::string tmp = temp_path_beside(path);
    const std::string tmp_name = fs::path(tmp).filename().string();
    EXPECT_LE(tmp_name.size(), 255u);
    EXPECT_EQ(tmp.rfind((dir / "").string(), 0), 0u) << "beside the file";
    EXPECT_NE(tmp_name.find(std::string(kTempInfix)), std::string::npos);
    const size_t kept = tmp_name.find(std::string(kTempInfix));
    EXPECT_EQ(n.compare(0, kept, tmp_name, 0, kept), 0) << "the start of the name, kept";
    EXPECT_NE(static_cast<unsigned char>(n[kept]) & 0xC0, 0x80) << "cut at a character's start";
    Status s = write_atomically(path, "long");
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(test_read(path), "long");
  }
  const std::string short_tmp = fs::path(temp_path_beside("short.slot")).filename().string();
  EXPECT_EQ(short_tmp.rfind("short.slot" + std::string(kTempInfix), 0), 0u) << "a short name: whole";
  fs::remove_all(dir);
}

// A file replaced by rename keeps its mode: a 0600 slot file converted in place (migrate, convert
// over it) does not become readable by everyone. A new file is created as before.
TEST(PosixIo, AReplacedFileKeepsItsMode) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-mode-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "slot.bin").string();
  ASSERT_TRUE(write_atomically(path, "old").ok());
  const mode_t created = mode_of(path);
  EXPECT_EQ(created & 0600, 0600u);
  for (mode_t m : {mode_t(0600), mode_t(0640), mode_t(0444)}) {
    ASSERT_EQ(::chmod(path.c_str(), m), 0);
    Status s = write_atomically(path, "new");
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(mode_of(path), m) << std::oct << m;
    EXPECT_EQ(test_read(path), "new");
  }
  fs::remove_all(dir);
}

// owner_only (a plaintext copy of what an encrypted store seals): group and others lose every
// permission, whether the file is new or replaces a more open one, from the temporary's first byte.
TEST(PosixIo, AnOwnerOnlyFileIsReadableByItsOwnerOnly) {
  const mode_t umask_before = ::umask(022);  // a umask of 077 would pass this without the feature
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-owner-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "plain.slot").string();
  AtomicWriteOptions private_file;
  private_file.owner_only = true;
  for (mode_t before : {mode_t(0), mode_t(0644), mode_t(0660)}) {  // 0: no file there yet
    fs::remove(path);
    if (before != 0) {
      ASSERT_TRUE(write_atomically(path, "old").ok());
      ASSERT_EQ(::chmod(path.c_str(), before), 0);
    }
    auto w = AtomicFileWriter::create(posix_io(), path, private_file);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(mode_of((*w)->temp_path()) & 077, 0u) << "the temporary, replacing " << std::oct << before;
    ASSERT_TRUE((*w)->append(std::as_bytes(std::span<const char>("new", 3))).ok());
    ASSERT_TRUE((*w)->commit().ok());
    EXPECT_EQ(mode_of(path) & 077, 0u) << "replacing " << std::oct << before;
    EXPECT_EQ(mode_of(path) & 0600, 0600u);
  }
  fs::remove_all(dir);
  ::umask(umask_before);
}

// create_owner_only: the file is 0600 from its create, under a umask that would give others
// read access (no chmod follows the create that this could be passing by), and it never replaces
// or opens a file that is already there.
TEST(PosixIo, AnOwnerOnlyFileIsCreatedSo) {
  const mode_t umask_before = ::umask(022);
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-create-private-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "plain.tmp").string();
  {
    auto f = posix_io().create_owner_only(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(mode_of(path), 0600u) << std::oct << mode_of(path);
    ASSERT_TRUE((*f)->append(std::as_bytes(std::span<const char>("new", 3))).ok());
    ASSERT_TRUE((*f)->close().ok());
  }
  auto again = posix_io().create_owner_only(path);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().ToString().find(path), std::string::npos) << again.status().ToString();
  EXPECT_EQ(test_read(path), "new");
  fs::remove_all(dir);
  ::umask(umask_before);
}

// The temporary has the original's mode before its first byte (a 0600 conversation is never
// readable by others while it is written, nor in what a killed kvsnap leaves); a symlink at the
// target is replaced, not followed (whatever it points to keeps its mode and bytes); setuid and
// setgid bits are not copied.
TEST(PosixIo, TheTemporaryIsAsPrivateAsTheFileItReplacesAndLinksAreNotFollowed) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-tmpmode-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "slot.bin").string();
  ASSERT_TRUE(write_atomically(path, "old").ok());
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  {
    auto w = AtomicFileWriter::create(posix_io(), path);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    size_t temps = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().string().find(kTempInfix) == std::string::npos) continue;
      ++temps;
      EXPECT_EQ(mode_of(e.path().string()), 0600u) << "the temporary is readable by others";
    }
    EXPECT_EQ(temps, 1u);
  }  // dropped without commit: the temporary goes

  const std::string victim = (dir / "victim").string(), link = (dir / "link.bin").string();
  ASSERT_TRUE(write_atomically(victim, "secret").ok());
  ASSERT_EQ(::chmod(victim.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  ASSERT_TRUE(write_atomically(link, "new").ok());
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(link))) << "the link was written through";
  EXPECT_EQ(mode_of(victim), 0600u);
  EXPECT_EQ(test_read(victim), "secret");

  ASSERT_EQ(::chmod(path.c_str(), 06755), 0);
  ASSERT_TRUE(write_atomically(path, "newer").ok());
  EXPECT_EQ(mode_of(path), 0755u) << "setuid/setgid copied";
  fs::remove_all(dir);
}

// open_regular opens a regular file and stamps it as stat does; a symlink (even to a regular file)
// and a FIFO are reported, not followed or waited on. lock_dir locks a directory without a file in
// it: a second holder is told so (nullptr), and the lock is free once dropped.
TEST(PosixIo, OpenRegularNeitherFollowsLinksNorWaitsOnFifosAndLockDirCreatesNothing) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-regular-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "a").string(), link = (dir / "link").string(), fifo = (dir / "fifo").string();
  ASSERT_TRUE(write_atomically(file, "bytes").ok());
  ASSERT_EQ(::symlink(file.c_str(), link.c_str()), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto a = posix_io().open_regular(file);
  ASSERT_TRUE(a.ok() && a->file) << a.status().ToString();
  EXPECT_EQ(a->file->size(), 5u);
  auto st = posix_io().stamp(file);
  ASSERT_TRUE(st.ok() && a->stamp);
  EXPECT_TRUE(*st == *a->stamp);
  auto l = posix_io().open_regular(link);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_FALSE(l->file);
  EXPECT_TRUE(l->symlink);
  auto f = posix_io().open_regular(fifo);  // would block for a writer without O_NONBLOCK
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE(f->file);
  EXPECT_FALSE(f->symlink);
  EXPECT_EQ(f->not_regular, "a FIFO, socket or device");
  // open_read too: refused at once (a review's finding: `kvsnap info FIFO` waited for a writer).
  auto r = posix_io().open_read(fifo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), fifo + ": not a regular file");
  auto plain = posix_io().open_read(file);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  std::string got(5, '\0');
  ASSERT_TRUE((*plain)->read_at(0, std::as_writable_bytes(std::span(got))).ok());
  EXPECT_EQ(got, "bytes");

  {
    auto first = posix_io().lock_dir(dir.string());
    ASSERT_TRUE(first.ok() && *first) << first.status().ToString();
    auto second = posix_io().lock_dir(dir.string());
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_FALSE(*second) << "a held directory lock was given twice";
  }
  auto again = posix_io().lock_dir(dir.string());
  ASSERT_TRUE(again.ok() && *again);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 3) << "a lock file was created";
  fs::remove_all(dir);
}

// Run as root (as `sudo kvsnap migrate`), a replaced file keeps its owner and group: llama-server,
// running as that owner, opens it for writing again when it saves the slot.
TEST(PosixIo, AReplacedFileKeepsItsOwnerWhenRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "only root can give a file to another owner";
  const fs::path dir = fs::temp_directory_path() / ("kvsnap-io-owner-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "slot.bin").string();
  ASSERT_TRUE(write_atomically(path, "old").ok());
  ASSERT_EQ(::chown(path.c_str(), 12345, 23456), 0);
  ASSERT_TRUE(write_atomically(path, "new").ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 12345u);
  EXPECT_EQ(st.st_gid, 23456u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvsnap
