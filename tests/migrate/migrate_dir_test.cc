// migrate_dir (migrate/migrate_dir.h) against a slot directory that a server writes to meanwhile:
// a file saved again while it was converted keeps the server's new bytes.
#include "migrate/migrate_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "base/os.h"
#include "temp_dir.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) { return test::slurp_text(p); }

// The real file system, every call forwarded: the base of the Ios below, which each hook one step.
class ForwardingIo : public Io {
 public:
  Result<std::unique_ptr<ReadableFile>> open_read(const std::string& path) override { return base().open_read(path); }
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool exclusive) override {
    return base().open_write(path, exclusive);
  }
  Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& path) override {
    return base().create_owner_only(path);
  }
  Status rename(const std::string& from, const std::string& to) override { return base().rename(from, to); }
  Status exchange(const std::string& a, const std::string& b) override { return base().exchange(a, b); }
  Status remove(const std::string& path) override { return base().remove(path); }
  Status sync_dir(const std::string& dir) override { return base().sync_dir(dir); }
  Result<bool> exists(const std::string& path) override { return base().exists(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& dir) override { return base().list_dir(dir); }
  Status create_dirs(const std::string& dir) override { return base().create_dirs(dir); }
  Result<FileStamp> stamp(const std::string& path) override { return base().stamp(path); }
  Result<std::unique_ptr<FileLock>> lock_dir(const std::string& dir) override { return base().lock_dir(dir); }
  Result<OpenedRegular> open_regular(const std::string& path) override { return base().open_regular(path); }

 protected:
  static Io& base() { return posix_io(); }
};

// What a llama-server's save does: a new file renamed over `path`.
void save_over(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".server-save";
  std::ofstream(tmp, std::ios::binary) << bytes;
  fs::rename(tmp, path);
}

// What llama-server's save does (llama_file's fopen "wb"): `path` truncated and written in place.
void save_in_place(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A "server" saves `victim` with `save` just before migrate's conversion takes its name: in the
// first rename or exchange that names it (a swap back is the second).
class SavedAtPublicationIo final : public ForwardingIo {
 public:
  SavedAtPublicationIo(std::string victim, std::function<void()> save)
      : victim_(std::move(victim)), save_(std::move(save)) {}
  Status rename(const std::string& from, const std::string& to) override {
    if (to == victim_ && save_) std::exchange(save_, nullptr)();
    if (exchanges_ > 0 && fail_renames_) return Status::IOError(from + ": rename: EIO (injected)");
    return base().rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    if (b == victim_ && save_) std::exchange(save_, nullptr)();
    if (b == victim_) ++exchanges_;
    if (b == victim_ && exchanges_ == 2 && second_save_) second_save_();
    if (exchanges_ > exchanges_allowed_) return Status::IOError(a + ": exchange: EIO (injected)");
    return base().exchange(a, b);
  }
  int exchanges_allowed_ = 1 << 30;
  int exchanges_ = 0;
  std::function<void()> second_save_;  // before the second exchange (the swap back)
  bool fail_renames_ = false;  // every rename after the first exchange

 private:
  std::string victim_;
  std::function<void()> save_;
};

// A "server" that truncates `victim` (opens it for writing) just before migrate's exchange and
// writes its save after migrate is done (write()).
class OpenedBeforeTheExchangeIo final : public ForwardingIo {
 public:
  explicit OpenedBeforeTheExchangeIo(std::string victim) : victim_(std::move(victim)) {}
  Status exchange(const std::string& a, const std::string& b) override {
    if (b == victim_ && !out_) out_ = std::make_unique<std::ofstream>(victim_, std::ios::binary | std::ios::trunc);
    return base().exchange(a, b);
  }
  void write(const std::string& bytes) {
    *out_ << bytes;
    out_->close();
  }

 private:
  std::string victim_;
  std::unique_ptr<std::ofstream> out_;
};

// An Io that cannot exchange two names (NFS, a system without the call).
class NoExchangeIo final : public ForwardingIo {
 public:
  Status exchange(const std::string& a, const std::string&) override {
    return Status::NotSupported(a + ": no exchange (injected)");
  }
};

// Whether the file system of the test directories can swap two names (not the generic POSIX
// build, nor NFS or an old overlayfs): a real swap of two files there.
bool system_exchanges_names() {
  static const bool answer = [] {
    test::TempDir t("kvsnap-exchange-probe");
    const fs::path dir = t.path();
    std::ofstream(dir / "a") << "a";
    std::ofstream(dir / "b") << "b";
    return posix_io().exchange((dir / "a").string(), (dir / "b").string()).ok();
  }();
  return answer;
}

// A "server" replaces `victim` right after migrate has opened it to convert it (its second open:
// the first reads the headers of every file before any conversion).
class SavedMeanwhileIo final : public ForwardingIo {
 public:
  SavedMeanwhileIo(std::string victim, std::string newer) : victim_(std::move(victim)), newer_(std::move(newer)) {}
  Result<OpenedRegular> open_regular(const std::string& path) override {
    auto f = base().open_regular(path);
    if (f.ok() && path == victim_ && ++opens_ == 2) save_over(path, newer_);
    return f;
  }

 private:
  std::string victim_, newer_;
  int opens_ = 0;
};

// A written file whose sync() runs `on_sync` first.
class HookedFile final : public WritableFile {
 public:
  HookedFile(std::unique_ptr<WritableFile> f, std::function<void()> on_sync)
      : f_(std::move(f)), on_sync_(std::move(on_sync)) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> d) override { return f_->append(d); }
  Status sync() override {
    if (on_sync_) on_sync_();
    return f_->sync();
  }
  Status close() override { return f_->close(); }
  bool pace_to_disk() override { return f_->pace_to_disk(); }
  std::optional<uint64_t> disk_waits() const override { return f_->disk_waits(); }

 private:
  std::unique_ptr<WritableFile> f_;
  std::function<void()> on_sync_;
};

// A "server" replaces `victim` while the fdatasync of its converted temporary runs.
class SavedDuringSyncIo final : public ForwardingIo {
 public:
  SavedDuringSyncIo(std::string victim, std::string newer) : victim_(std::move(victim)), newer_(std::move(newer)) {}
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool exclusive) override {
    KV_ASSIGN_OR_RETURN(auto f, base().open_write(path, exclusive));
    if (path.rfind(victim_ + std::string(kTempInfix), 0) != 0) return f;
    return std::unique_ptr<WritableFile>(new HookedFile(std::move(f), [this] { save_over(victim_, newer_); }));
  }

 private:
  std::string victim_, newer_;
};

// Stops in its first list_dir (a migration under way) until release().
class StopsInListDirIo final : public ForwardingIo {
 public:
  Result<std::vector<DirEntry>> list_dir(const std::string& dir) override {
    entered_.set_value();
    release_.get_future().wait();
    return base().list_dir(dir);
  }
  void wait_entered() { entered_future_.wait(); }
  void release() { release_.set_value(); }

 private:
  std::promise<void> entered_, release_;
  std::future<void> entered_future_ = entered_.get_future();
};

// Runs `swap` right after the directory is listed: a file replaced by something else after the scan.
class SwappedAfterListingIo final : public ForwardingIo {
 public:
  explicit SwappedAfterListingIo(std::function<void()> swap) : swap_(std::move(swap)) {}
  Result<std::vector<DirEntry>> list_dir(const std::string& dir) override {
    auto listed = base().list_dir(dir);
    if (swap_) std::exchange(swap_, nullptr)();
    return listed;
  }

 private:
  std::function<void()> swap_;
};

// Every fsync of a directory fails (EIO), after the rename it follows.
class FailingDirSyncIo final : public ForwardingIo {
 public:
  Status sync_dir(const std::string& dir) override { return Status::IOError(dir + ": fsync: EIO (injected)"); }
};

size_t temps_in(const fs::path& dir) {
  size_t temps = 0;
  for (const auto& e : fs::directory_iterator(dir)) temps += e.path().string().find(kTempInfix) != std::string::npos;
  return temps;
}

const fs::path kFixtures = fs::path(KVSNAP_SOURCE_DIR) / "fixtures";

// migrate_dir of `dir` to f32 K and V through `io`.
Result<MigrateSummary> migrate_to_f32(Io& io, const fs::path& dir) {
  MigrateOptions o;
  o.dir = dir.string();
  o.spec.ctk = "f32";
  o.spec.ctv = "f32";
  return migrate_dir(io, o);
}

// `a` a copy of the f16 fixture, `ref`/a.slot the same converted to f32 by a plain migrate.
void put_a_slot_and_its_conversion(const fs::path& a, const fs::path& ref) {
  fs::create_directories(ref);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", ref / "a.slot");
  ForwardingIo plain;
  ASSERT_TRUE(migrate_to_f32(plain, ref).ok());
}

// `f` failed as a file the server saved again meanwhile, and holds that save.
void expect_kept_the_new_save(const FileOutcome& f, const fs::path& path, const std::string& newer) {
  EXPECT_EQ(f.action, FileAction::kFailed) << f.detail;
  EXPECT_NE(f.detail.find("changed while kvsnap converted it"), std::string::npos) << f.detail;
  EXPECT_TRUE(slurp(path) == newer) << "the conversion of the older file replaced the server's save";
}

TEST(MigrateDir, AFileSavedAgainWhileConvertedKeepsTheNewSave) {
  test::TempDir t("kvsnap-migrate-race");
  const fs::path dir = t.path(), a = dir / "a.slot", b = dir / "b.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", b);
  const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");  // the server's later save
  SavedMeanwhileIo io(a.string(), newer);
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 2u);
  expect_kept_the_new_save(sum->files[0], a, newer);
  EXPECT_EQ(sum->files[1].action, FileAction::kConverted) << sum->files[1].detail;
  EXPECT_EQ(temps_in(dir), 0u);
}

// A "server" starts saving `victim` in place (truncated, half written) as migrate opens it.
class WrittenWhileReadIo final : public ForwardingIo {
 public:
  WrittenWhileReadIo(std::string victim, std::string half) : victim_(std::move(victim)), half_(std::move(half)) {}
  Result<OpenedRegular> open_regular(const std::string& path) override {
    auto f = base().open_regular(path);
    if (f.ok() && path == victim_) save_in_place(path, half_);
    return f;
  }

 private:
  std::string victim_, half_;
};

// A review's finding: a slot file a server was writing while migrate read it was reported damaged
// (exit 3), which tells the user the file is lost; it is only not whole yet, and left as it is.
TEST(MigrateDir, AFileWrittenWhileReadIsNotCalledDamaged) {
  test::TempDir t("kvsnap-migrate-half");
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  const std::string whole = slurp(a), half = whole.substr(0, whole.size() / 2);
  WrittenWhileReadIo io(a.string(), half);
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 1u);
  EXPECT_EQ(sum->files[0].action, FileAction::kFailed) << sum->files[0].detail;
  EXPECT_NE(sum->files[0].detail.find("changed while kvsnap read it"), std::string::npos) << sum->files[0].detail;
  EXPECT_EQ(sum->files[0].error.code(), Code::kIOError) << "reported as damaged: " << sum->files[0].error.ToString();
  EXPECT_TRUE(slurp(a) == half) << "the file being written was touched";
  EXPECT_EQ(temps_in(dir), 0u);
}

// A directory kvsnap cannot write into: every new file refused.
class ReadOnlyDirIo final : public ForwardingIo {
 public:
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool) override {
    return Status::IOError(path + ": Permission denied");
  }
};

// A review's finding: in a directory kvsnap cannot write into, each file's original was backed up,
// its conversion failed, and the backup was dropped again, file after file. The directory is
// probed once: nothing is backed up and the run fails naming it.
TEST(MigrateDir, ADirectoryKvsnapCannotWriteIntoIsRefusedBeforeAnyBackup) {
  test::TempDir t("kvsnap-migrate-ro");
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  const std::string before = slurp(a);
  ReadOnlyDirIo io;
  MigrateOptions o;
  o.dir = dir.string();
  o.spec.ctk = "f32";
  o.spec.ctv = "f32";
  int backups = 0;
  o.backup = [&](const std::string&, const ReadableFile&, const StateFile&) -> Status {
    ++backups;
    return Status::OK();
  };
  auto sum = migrate_dir(io, o);
  ASSERT_FALSE(sum.ok());
  EXPECT_EQ(sum.status().code(), Code::kIOError) << sum.status().ToString();
  EXPECT_NE(sum.status().message().find("cannot create files there"), std::string::npos) << sum.status().ToString();
  EXPECT_EQ(backups, 0);
  EXPECT_TRUE(slurp(a) == before);
  o.dry_run = true;  // a dry run writes nothing: it still reports
  EXPECT_TRUE(migrate_dir(io, o).ok());
}

// Another name of `victim`'s file is made and removed at each stamp migrate takes of it: what a
// sibling name's conversion does to a shared inode (its ctime moves, its bytes do not).
class LinkedAndUnlinkedIo final : public ForwardingIo {
 public:
  explicit LinkedAndUnlinkedIo(std::string victim) : victim_(std::move(victim)) {}
  Result<FileStamp> stamp(const std::string& path) override {
    if (path == victim_) {
      const std::string extra = victim_ + ".extra-link";
      fs::create_hard_link(victim_, extra);
      fs::remove(extra);
    }
    return base().stamp(path);
  }

 private:
  std::string victim_;
};

// A review's finding: no test reached check_unchanged's clause for a file with several names, whose
// other names' renames and removals move its ctime (and link count) while its bytes stay. Such a
// file is judged by its size, mtime and inode: converted, not "changed while kvsnap converted it".
TEST(MigrateDir, AFileWithAnotherNameIsJudgedByItsBytesNotItsCtime) {
  test::TempDir t("kvsnap-migrate-links");
  const fs::path dir = fs::path(t.path()) / "slots", outside = fs::path(t.path()) / "kept.slot", a = dir / "a.slot";
  fs::create_directories(dir);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  fs::create_hard_link(a, outside);  // a second name, outside the directory migrated
  const std::string before = slurp(a);
  LinkedAndUnlinkedIo io(a.string());
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 1u);
  EXPECT_EQ(sum->files[0].action, FileAction::kConverted) << sum->files[0].detail;
  EXPECT_TRUE(slurp(outside) == before) << "the other name still holds the original";
  EXPECT_FALSE(slurp(a) == before);
}

// A review's finding: --backup-store's backup reads the file; a save in place during that read gave
// a backup of no save's bytes (the first part of one, the rest of the other), and the conversion,
// refused as "changed", left it in the store as the original's backup. The outcome says so, for the
// command to drop it; a file that failed unchanged keeps its backup.
TEST(MigrateDir, ASaveDuringTheBackupMarksTheBackupAsMixed) {
  test::TempDir t("kvsnap-migrate-backup-race");
  const fs::path dir = t.path(), a = dir / "a.slot", b = dir / "b.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", b);
  const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
  ForwardingIo io;
  MigrateOptions o;
  o.dir = dir.string();
  o.spec.ctk = "f32";
  o.spec.ctv = "f32";
  o.backup = [&](const std::string& path, const ReadableFile&, const StateFile&) -> Status {
    if (path == a.string()) save_in_place(path, newer);  // the server saves while the backup reads
    if (path == b.string()) return Status::IOError("the backup store is full");
    return Status::OK();
  };
  auto sum = migrate_dir(io, o);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 2u);
  expect_kept_the_new_save(sum->files[0], a, newer);
  EXPECT_TRUE(sum->files[0].backup_may_mix) << "a backup read during a save is not marked";
  EXPECT_EQ(sum->files[1].action, FileAction::kFailed) << sum->files[1].detail;
  EXPECT_FALSE(sum->files[1].backup_may_mix) << "an unchanged file's failure marks its backup";
  EXPECT_EQ(temps_in(dir), 0u);
}

// The stamp is compared after the temporary's fdatasync (which can take seconds), not before it:
// a save during that sync was replaced by the conversion of the older bytes, reported converted.
TEST(MigrateDir, AFileSavedAgainDuringTheSyncOfItsConversionKeepsTheNewSave) {
  test::TempDir t("kvsnap-migrate-sync-race");
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
  SavedDuringSyncIo io(a.string(), newer);
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 1u);
  expect_kept_the_new_save(sum->files[0], a, newer);
  EXPECT_EQ(temps_in(dir), 0u);
}

// A slot of `dir_tag` saved by `save(path, bytes)` just before migrate's conversion takes its name
// keeps that save, reported FAILED, after the exchange, its check and the swap back.
void expect_a_save_at_publication_kept(const char* dir_tag, void (*save)(const std::string&, const std::string&)) {
  test::TempDir t(dir_tag);
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
  SavedAtPublicationIo io(a.string(), [&] { save(a.string(), newer); });
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 1u);
  expect_kept_the_new_save(sum->files[0], a, newer);
  EXPECT_EQ(io.exchanges_, 2) << "not the exchange, the check and the swap back";
  EXPECT_EQ(temps_in(dir), 0u);
}

// The last check and the rename were two steps: a save that began between them (llama-server
// truncates the slot and writes it in place) went into the original just before the rename
// unlinked it, so the conversion of the older bytes replaced the newer save, reported converted.
// Now the original is checked after the new bytes took its name, and put back.
TEST(MigrateDir, ASaveInPlaceJustBeforeTheRenameKeepsTheNewSave) {
  if (!system_exchanges_names()) GTEST_SKIP() << "no exchange of two names on this system: the check before the rename is the guard";
  expect_a_save_at_publication_kept("kvsnap-migrate-publish-race", save_in_place);
}

// As above with a save that renames a new file over the slot (another writer's way).
TEST(MigrateDir, ASaveByRenameJustBeforeTheRenameKeepsTheNewSave) {
  if (!system_exchanges_names()) GTEST_SKIP() << "no exchange of two names on this system: the check before the rename is the guard";
  expect_a_save_at_publication_kept("kvsnap-migrate-publish-race-rename", save_over);
}

// A save that opened (truncated) the slot before the exchange and writes after migrate finished
// writes into the original, which is back at its name.
TEST(MigrateDir, ASaveOpenedBeforeTheExchangeAndWrittenAfterItKeepsItsBytes) {
  if (!system_exchanges_names()) GTEST_SKIP() << "no exchange of two names on this system: the check before the rename is the guard";
  test::TempDir t("kvsnap-migrate-open-before");
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
  OpenedBeforeTheExchangeIo io(a.string());
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  io.write(newer);
  expect_kept_the_new_save(sum->files.at(0), a, newer);
  EXPECT_EQ(temps_in(dir), 0u);
}

// A second save between the check of the swapped-out original and the swap back reached the
// converted file at the slot's name: the swap back took it to the temporary's name, which was
// removed as the conversion. It is the newest save and takes the name.
TEST(MigrateDir, ASecondSaveBeforeTheSwapBackTakesTheName) {
  if (!system_exchanges_names()) GTEST_SKIP() << "no exchange of two names on this system: the check before the rename is the guard";
  for (auto second : {save_in_place, save_over}) {
    test::TempDir t("kvsnap-migrate-two-saves");
    const fs::path dir = t.path(), a = dir / "a.slot";
    fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
    const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
    const std::string newest = newer + "the second save";
    SavedAtPublicationIo io(a.string(), [&] { save_in_place(a.string(), newer); });
    io.second_save_ = [&] { second(a.string(), newest); };
    auto sum = migrate_to_f32(io, dir);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_EQ(sum->files.at(0).action, FileAction::kFailed) << sum->files.at(0).detail;
    EXPECT_TRUE(slurp(a) == newest) << "the newest save is not at the slot's name";
    EXPECT_EQ(temps_in(dir), 0u);
  }
}

// Where the swap back fails a plain rename puts the save back (the conversion is dropped).
TEST(MigrateDir, ASaveThatCannotBeSwappedBackIsRenamedBack) {
  if (!system_exchanges_names()) GTEST_SKIP() << "no exchange of two names on this system: the check before the rename is the guard";
  test::TempDir t("kvsnap-migrate-publish-rename-back");
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
  SavedAtPublicationIo io(a.string(), [&] { save_in_place(a.string(), newer); });
  io.exchanges_allowed_ = 1;
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  expect_kept_the_new_save(sum->files.at(0), a, newer);
  EXPECT_EQ(temps_in(dir), 0u);
}

// Where nothing can put it back, the save stays under the temporary's name, never removed, and
// the error says where (a later migrate would remove kvsnap's temporaries).
TEST(MigrateDir, ASaveThatCannotBePutBackIsKeptAndNamed) {
  if (!system_exchanges_names()) GTEST_SKIP() << "no exchange of two names on this system: the check before the rename is the guard";
  test::TempDir t("kvsnap-migrate-publish-no-way-back");
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
  SavedAtPublicationIo io(a.string(), [&] { save_in_place(a.string(), newer); });
  io.exchanges_allowed_ = 1;
  io.fail_renames_ = true;
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  const FileOutcome& f = sum->files.at(0);
  EXPECT_EQ(f.action, FileAction::kFailed) << f.detail;
  ASSERT_EQ(temps_in(dir), 1u) << "the server's save was removed with kvsnap's temporaries";
  fs::path kept;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().string().find(kTempInfix) != std::string::npos) kept = e.path();
  EXPECT_TRUE(slurp(kept) == newer);
  EXPECT_NE(f.detail.find("putting it back failed"), std::string::npos) << f.detail;
  EXPECT_NE(f.detail.find(kept.string()), std::string::npos) << f.detail;
  EXPECT_NE(f.detail.find("before running kvsnap migrate again"), std::string::npos) << f.detail;
}

// Without an exchange (NFS) the check before a plain rename is what remains: the file is converted.
TEST(MigrateDir, WithoutAnExchangeTheFileIsConvertedByARename) {
  test::TempDir t("kvsnap-migrate-no-exchange");
  const fs::path dir = t.path(), a = dir / "a.slot", ref = dir / "ref";
  put_a_slot_and_its_conversion(a, ref);
  NoExchangeIo io;
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ(sum->files.at(0).action, FileAction::kConverted) << sum->files.at(0).detail;
  EXPECT_TRUE(slurp(a) == slurp(ref / "a.slot")) << "not the converted file";
  EXPECT_EQ(temps_in(dir), 0u);
  EXPECT_TRUE(sum->plain_renames) << "the summary does not say the last check could not cover the rename";
  if (system_exchanges_names()) {
    ForwardingIo exchanging;
    fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / "b.slot");
    auto again = migrate_to_f32(exchanging, dir);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_FALSE(again->plain_renames);
  }
}

// A second migrate of a directory while one runs on it is refused, before it touches anything;
// both ran, converting the same files and each reporting the other's work as its own.
// A save that reaches the slot's name right after the exchange (in place, into the conversion,
// or by a rename over it) holds the name: reported FAILED, not "converted" (the writer's bytes
// were kept before too, under a false outcome).
class SavedRightAfterTheExchangeIo final : public ForwardingIo {
 public:
  SavedRightAfterTheExchangeIo(std::string victim, std::function<void()> save)
      : victim_(std::move(victim)), save_(std::move(save)) {}
  Status exchange(const std::string& a, const std::string& b) override {
    Status s = base().exchange(a, b);
    if (b == victim_ && save_) std::exchange(save_, nullptr)();
    return s;
  }

 private:
  std::string victim_;
  std::function<void()> save_;
};

TEST(MigrateDir, ASaveRightAfterTheExchangeIsNotReportedConverted) {
  if (!system_exchanges_names()) GTEST_SKIP() << "no exchange of two names on this system";
  for (auto save : {save_in_place, save_over}) {
    test::TempDir t("kvsnap-migrate-after-exchange");
    const fs::path dir = t.path(), a = dir / "a.slot";
    fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
    const std::string newer = slurp(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot");
    SavedRightAfterTheExchangeIo io(a.string(), [&] { save(a.string(), newer); });
    auto sum = migrate_to_f32(io, dir);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    const FileOutcome& f = sum->files.at(0);
    EXPECT_EQ(f.action, FileAction::kFailed) << f.detail;
    EXPECT_NE(f.detail.find("right after kvsnap replaced it"), std::string::npos) << f.detail;
    EXPECT_TRUE(f.original_gone) << "a backup of it is its only copy";
    EXPECT_TRUE(slurp(a) == newer) << "the save is not at the slot's name";
    EXPECT_EQ(temps_in(dir), 0u);
  }
}

// Another name of the file (a hard link) renamed or removed while it is converted changes the
// inode's link count and ctime, not its bytes: converted, not "changed while kvsnap converted
// it" (with -j 8 most of 40 links of one file failed so).
class LinkedMeanwhileIo final : public ForwardingIo {
 public:
  LinkedMeanwhileIo(std::string victim, std::function<void()> link)
      : victim_(std::move(victim)), link_(std::move(link)) {}
  Result<FileStamp> stamp(const std::string& path) override {
    if (path == victim_ && link_) std::exchange(link_, nullptr)();
    return base().stamp(path);
  }

 private:
  std::string victim_;
  std::function<void()> link_;
};

TEST(MigrateDir, AHardLinkChangedMeanwhileIsNotAChange) {
  test::TempDir t("kvsnap-migrate-hard-links");
  const fs::path dir = t.path(), a = dir / "a.slot", b = dir / "b.slot";
  fs::create_directories(dir / "elsewhere");  // not a file of DIR: migrate leaves it
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  fs::create_hard_link(a, b);
  LinkedMeanwhileIo io(b.string(), [&] { fs::create_hard_link(b, dir / "elsewhere" / "c.slot"); });
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  for (const FileOutcome& f : sum->files) {
    if (f.name == "elsewhere") continue;
    EXPECT_EQ(f.action, FileAction::kConverted) << f.name << ": " << f.detail;
  }
  ForwardingIo plain;
  EXPECT_TRUE(slurp(a) == slurp(b)) << "both names converted alike";
  EXPECT_TRUE(slurp(dir / "elsewhere" / "c.slot") == slurp(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot"))
      << "the third name keeps the original";
}

// Words that cannot be right fail once, before the lock or any file (an empty directory
// exited 0 with --ctk q9_9); so do no jobs and a file given as the directory.
TEST(MigrateDir, BadFlagsFailBeforeAnyFile) {
  test::TempDir t("kvsnap-migrate-bad-flags");
  const fs::path dir = t.path();
  ForwardingIo io;
  auto run = [&](auto edit) {
    MigrateOptions o;
    o.dir = dir.string();
    edit(o);
    return migrate_dir(io, o);
  };
  for (auto edit : std::vector<std::function<void(MigrateOptions&)>>{
           [](MigrateOptions& o) { o.spec.ctk = "q9_9"; }, [](MigrateOptions& o) { o.spec.flash_attn = "maybe"; },
           [](MigrateOptions& o) { o.spec.format = "bogus"; }, [](MigrateOptions& o) { o.spec.rotation = "sideways"; },
           [](MigrateOptions& o) { o.spec.src_rotation = "sideways"; },
           [](MigrateOptions& o) { o.spec.source_build = "yesterday"; }, [](MigrateOptions& o) { o.jobs = 0; }}) {
    auto r = run(edit);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  }
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / "a.slot");
  auto file = run([&](MigrateOptions& o) { o.dir = (dir / "a.slot").string(); });
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), Code::kInvalidArgument) << file.status().ToString();
  EXPECT_NE(file.status().message().find("a file, not a directory"), std::string::npos);
}

TEST(MigrateDir, ASecondMigrateOfTheDirectoryIsRefusedWhileOneRuns) {
  test::TempDir t("kvsnap-migrate-twice");
  const fs::path dir = t.path();
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / "a.slot");
  StopsInListDirIo first;
  std::thread running([&] {
    auto sum = migrate_to_f32(first, dir);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_EQ(sum->count(FileAction::kConverted), 1u);
  });
  first.wait_entered();
  ForwardingIo second;
  auto refused = migrate_to_f32(second, dir);
  first.release();
  running.join();
  ASSERT_FALSE(refused.ok()) << "a second migrate ran alongside the first";
  EXPECT_EQ(refused.status().code(), Code::kIOError);
  EXPECT_NE(refused.status().message().find("another kvsnap migrate is running on " + dir.string()), std::string::npos)
      << refused.status().ToString();
  // once the first is done, the directory is free again
  auto again = migrate_to_f32(second, dir);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->count(FileAction::kAtTarget), 1u);
}

// The scan saw a regular file; a symlink to a file outside DIR was put in its place before the
// file was opened. It was followed: the outside file's conversion was renamed over the link,
// its bytes brought into DIR and reported converted.
TEST(MigrateDir, ASymlinkSwappedInAfterTheScanIsNotFollowed) {
  test::TempDir t("kvsnap-migrate-swap-link");
  const fs::path root = t.path(), dir = root / "slots", a = dir / "a.slot", outside = root / "outside.slot";
  fs::create_directories(dir);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faoff.slot", outside);
  const std::string outside_bytes = slurp(outside);
  SwappedAfterListingIo io([&] {
    fs::remove(a);
    fs::create_symlink(outside, a);
  });
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 1u);
  EXPECT_EQ(sum->files[0].action, FileAction::kSkippedLink) << sum->files[0].detail;
  EXPECT_TRUE(fs::is_symlink(a)) << "the link was replaced by a conversion of what it points at";
  EXPECT_TRUE(slurp(outside) == outside_bytes);
  EXPECT_EQ(temps_in(dir), 0u);
}

// As above with a FIFO: its open waited for a writer that never comes (the run hung).
TEST(MigrateDir, AFifoSwappedInAfterTheScanIsNotWaitedOn) {
  test::TempDir t("kvsnap-migrate-swap-fifo");
  const fs::path dir = t.path(), a = dir / "a.slot";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  SwappedAfterListingIo io([&] {
    fs::remove(a);
    ASSERT_EQ(::mkfifo(a.c_str(), 0600), 0);
  });
  auto run = std::async(std::launch::async, [&] { return migrate_to_f32(io, dir); });
  if (run.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "migrate blocked in the open of a FIFO";
    const int w = ::open(a.c_str(), O_WRONLY | O_NONBLOCK);  // lets the blocked open return
    if (w >= 0) ::close(w);
  }
  auto sum = run.get();
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 1u);
  EXPECT_EQ(sum->files[0].action, FileAction::kSkippedOther) << sum->files[0].detail;
}

// The rename is done when the directory's fsync fails: the file is its conversion, and the outcome
// says so (and that its entry may not be durable) where it said FAILED, as if the original stood.
TEST(MigrateDir, AFailedDirectorySyncAfterTheRenameIsReportedAsConvertedNotDurable) {
  test::TempDir t("kvsnap-migrate-dirsync");
  const fs::path dir = t.path(), a = dir / "a.slot", ref = dir / "ref";
  put_a_slot_and_its_conversion(a, ref);
  FailingDirSyncIo io;
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  const FileOutcome& f = sum->files.at(0);
  ASSERT_EQ(f.name, "a.slot");
  EXPECT_EQ(f.action, FileAction::kConvertedNotDurable) << file_action_name(f.action) << " " << f.detail;
  EXPECT_NE(f.detail.find("may not survive a crash (the original is gone)"), std::string::npos) << f.detail;
  EXPECT_EQ(f.error.code(), Code::kIOError);
  EXPECT_EQ(sum->problems(), 1u);
  EXPECT_TRUE(slurp(a) == slurp(ref / "a.slot")) << "not the converted file";
}

// Only the names kvsnap gives its temporaries are removed as stale: a slot whose name holds
// ".kvsnap-tmp-" without a pid after it was removed (any such name was taken for a dead
// process's); it is converted as any other, and the kept slot scratch file still goes.
TEST(MigrateDir, OnlyKvsnapsOwnTemporaryNamesAreRemovedAsStale) {
  test::TempDir t("kvsnap-migrate-temp-names");
  const fs::path dir = t.path();
  // (999999999: no such process; the user's names hold what follows a pid in kvsnap's, but not only)
  const std::vector<std::string> users = {"x.kvsnap-tmp-notapid", "y.kvsnap-tmp-12abc", "chat.kvsnap-tmp-999999999-old.bin",
                                          "z.kvsnap-tmp-999999999-12.slot", "w.kvsnap-tmp-999999999-1.bin.kvsnap-tmp-old"};
  for (const std::string& name : users) fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / name);
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / ".kvsnap-scratch.kvsnap-tmp-kept");
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / "kvsnap-save.kvsnap-tmp-999999999-77.bin");
  // restore --server's slot file while SlotFileWriter writes it: a temporary of a temporary
  const std::string writing = "kvsnap-restore.kvsnap-tmp-999999999-78.bin.kvsnap-tmp-999999999-79";
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / writing);
  ForwardingIo io;
  auto sum = migrate_to_f32(io, dir);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ(sum->stale_temps_removed, 3u);
  EXPECT_FALSE(fs::exists(dir / ".kvsnap-scratch.kvsnap-tmp-kept"));
  EXPECT_FALSE(fs::exists(dir / "kvsnap-save.kvsnap-tmp-999999999-77.bin")) << "a dead process's temporary kept";
  EXPECT_FALSE(fs::exists(dir / writing)) << "a dead restore's slot file kept";
  for (const std::string& name : users) ASSERT_TRUE(fs::exists(dir / name)) << name << ": a user's file removed as stale";
  EXPECT_EQ(sum->count(FileAction::kConverted), users.size());
}

// A dry run counts the stale temporaries a run would remove (it said nothing of them), removes
// none; a temporary of a kvsnap still running (this test's own pid) is reported as skipped and
// left, by a dry run and by a run.
TEST(MigrateDir, TemporariesAreReportedStaleOrStillInUse) {
  test::TempDir t("kvsnap-migrate-temp-report");
  const fs::path dir = t.path();
  const fs::path slot = kFixtures / "v0.5.0/hd64-f16-f16-faon.slot";
  fs::copy_file(slot, dir / "a.slot");
  fs::copy_file(slot, dir / "kvsnap-save.kvsnap-tmp-999999999-77.bin");  // no such process
  const std::string live = "b.slot.kvsnap-tmp-" + std::to_string(::getpid()) + "-5";
  fs::copy_file(slot, dir / live);
  // restore --server's slot file while it is written (SlotFileWriter's temporary of server_flows'):
  // taken for a slot to convert before, under another kvsnap's feet
  const std::string pid = std::to_string(::getpid());
  const std::string writing = "kvsnap-restore.kvsnap-tmp-" + pid + "-8.bin.kvsnap-tmp-" + pid + "-9";
  fs::copy_file(slot, dir / writing);
  ForwardingIo io;
  for (const bool dry : {true, false}) {
    MigrateOptions o;
    o.dir = dir.string();
    o.spec.ctk = "f32";
    o.spec.ctv = "f32";
    o.dry_run = dry;
    auto sum = migrate_dir(io, o);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_EQ(sum->stale_temps_found, dry ? 1u : 0u);
    EXPECT_EQ(sum->stale_temps_removed, dry ? 0u : 1u);
    // By name (a review's finding: a file someone named so went with only a count said).
    EXPECT_EQ(sum->stale_temp_names, std::vector<std::string>{"kvsnap-save.kvsnap-tmp-999999999-77.bin"});
    EXPECT_EQ(fs::exists(dir / "kvsnap-save.kvsnap-tmp-999999999-77.bin"), dry);
    for (const std::string& name : {live, writing}) {
      ASSERT_TRUE(fs::exists(dir / name)) << name << ": another kvsnap's temporary removed";
      const auto it = std::find_if(sum->files.begin(), sum->files.end(), [&](const FileOutcome& f) { return f.name == name; });
      ASSERT_NE(it, sum->files.end()) << name << ": the live temporary is not in the report";
      EXPECT_EQ(it->action, FileAction::kSkippedOther) << name;
      EXPECT_NE(it->detail.find("a temporary of kvsnap process " + pid + ", still running"), std::string::npos) << it->detail;
    }
    EXPECT_EQ(sum->count(dry ? FileAction::kWouldConvert : FileAction::kConverted), 1u);
  }
}

// A --format of one kind of file in a directory of both: the slot at that format is left at the
// target, the session is FAILED with what a directory of both needs (--target-build), unchanged.
TEST(MigrateDir, AFormatOfTheOtherKindSaysWhatADirectoryOfBothNeeds) {
  test::TempDir t("kvsnap-migrate-format-kind");
  const fs::path dir = t.path();
  fs::copy_file(kFixtures / "v0.5.0/hd64-f16-f16-faon.slot", dir / "a.slot");
  fs::copy_file(kFixtures / "b8390/hd64-f16-f16-faon.session", dir / "b.session");
  const std::string session_before = slurp(dir / "b.session");
  ForwardingIo io;
  MigrateOptions o;
  o.dir = dir.string();
  o.spec.format = "ggsq-v3";
  auto sum = migrate_dir(io, o);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 2u);
  EXPECT_NE(sum->files.at(0).action, FileAction::kFailed) << sum->files.at(0).detail;
  const FileOutcome& f = sum->files.at(1);
  EXPECT_EQ(f.action, FileAction::kFailed) << f.detail;
  EXPECT_EQ(f.error.code(), Code::kInvalidArgument);
  EXPECT_NE(f.detail.find("ggsq-v3 is a format for a sequence state file (ggsq), and this is a session file (ggsn)"),
            std::string::npos) << f.detail;
  EXPECT_NE(f.detail.find("{--target-build} BUILD (the llama.cpp build that will load them)"), std::string::npos)
      << f.detail;
  EXPECT_TRUE(slurp(dir / "b.session") == session_before) << "the session changed";
  // with --target-build given too, the way out is to drop --format
  o.spec.target_build = "b10645";
  sum = migrate_dir(io, o);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 2u);
  EXPECT_EQ(sum->files.at(1).action, FileAction::kFailed) << sum->files.at(1).detail;
  EXPECT_NE(sum->files.at(1).detail.find("drop {--format}: {--target-build} b10645 gives each file its kind's format"),
            std::string::npos) << sum->files.at(1).detail;
  EXPECT_TRUE(slurp(dir / "b.session") == session_before) << "the session changed";
}

// A pid the system gave again: a temporary named with a running process's pid but last written
// long before that process started (this test's pid, the file dated 2001) is a dead
// writer's, removed as stale; one written since that process started is still taken as in use.
TEST(MigrateDir, ATemporaryOfAPidGivenAgainIsStale) {
  if (std::string(os_branch()) != "linux") GTEST_SKIP() << "process start times are read on Linux only";
  if (!std::ifstream("/proc/stat").good()) GTEST_SKIP() << "no /proc/stat here (a /proc of pids only)";
  ASSERT_TRUE(process_start_time(::getpid()).has_value()) << "no start time for this process";
  test::TempDir t("kvsnap-migrate-temp-reused-pid");
  const fs::path dir = t.path();
  const fs::path slot = kFixtures / "v0.5.0/hd64-f16-f16-faon.slot";
  const std::string old_name = "a.slot.kvsnap-tmp-" + std::to_string(::getpid()) + "-6";
  const std::string new_name = "b.slot.kvsnap-tmp-" + std::to_string(::getpid()) + "-7";
  fs::copy_file(slot, dir / old_name);
  fs::copy_file(slot, dir / new_name);
  // written in 2001, before any boot of this machine (under qemu-user, which may give a start time
  // of 0 ticks after boot, too)
  const struct timespec in_2001[2] = {{978307200, 0}, {978307200, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (dir / old_name).c_str(), in_2001, 0), 0);
  ForwardingIo io;
  MigrateOptions o;
  o.dir = dir.string();
  o.spec.ctk = "f32";
  o.spec.ctv = "f32";
  auto sum = migrate_dir(io, o);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_EQ(sum->stale_temps_removed, 1u);
  EXPECT_FALSE(fs::exists(dir / old_name)) << "a temporary older than its pid's process kept";
  EXPECT_TRUE(fs::exists(dir / new_name)) << "a running process's temporary removed";
}

}  // namespace
}  // namespace kvsnap
