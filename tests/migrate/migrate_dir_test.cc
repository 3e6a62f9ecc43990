// migrate_dir (migrate/migrate_dir.h) against a slot directory that a server writes to meanwhile:
// a file saved again while it was converted keeps the server's new bytes.
#include "migrate/migrate_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "temp_dir.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The real file system, where a "server" replaces `victim` (a new file renamed over it, as a save
// does) right after migrate has opened it to convert it (its second open: the first reads the
// headers of every file before any conversion).
class SavedMeanwhileIo final : public Io {
 public:
  SavedMeanwhileIo(std::string victim, std::string newer) : victim_(std::move(victim)), newer_(std::move(newer)) {}
  Result<std::unique_ptr<ReadableFile>> open_read(const std::string& path) override {
    auto f = base().open_read(path);
    if (f.ok() && path == victim_ && ++opens_ == 2) {
      const std::string tmp = path + ".server-save";
      std::ofstream(tmp, std::ios::binary) << newer_;
      fs::rename(tmp, path);
    }
    return f;
  }
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool exclusive) override {
    return base().open_write(path, exclusive);
  }
  Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& path) override {
    return base().create_owner_only(path);
  }
  Status rename(const std::string& from, const std::string& to) override { return base().rename(from, to); }
  Status remove(const std::string& path) override { return base().remove(path); }
  Status sync_dir(const std::string& dir) override { return base().sync_dir(dir); }
  Result<bool> exists(const std::string& path) override { return base().exists(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& dir) override { return base().list_dir(dir); }
  Status create_dirs(const std::string& dir) override { return base().create_dirs(dir); }
  Result<FileStamp> stamp(const std::string& path) override { return base().stamp(path); }

 private:
  static Io& base() { return posix_io(); }
  std::string victim_, newer_;
  int opens_ = 0;
};

TEST(MigrateDir, AFileSavedAgainWhileConvertedKeepsTheNewSave) {
  test::TempDir t("kvsnap-migrate-race");
  const fs::path fixtures = fs::path(KVSNAP_SOURCE_DIR) / "fixtures";
  const fs::path dir = t.path(), a = dir / "a.slot", b = dir / "b.slot";
  fs::copy_file(fixtures / "v0.5.0/hd64-f16-f16-faon.slot", a);
  fs::copy_file(fixtures / "v0.5.0/hd64-f16-f16-faon.slot", b);
  const std::string newer = slurp(fixtures / "v0.5.0/hd64-f16-f16-faoff.slot");  // the server's later save
  SavedMeanwhileIo io(a.string(), newer);
  MigrateOptions o;
  o.dir = dir.string();
  o.spec.ctk = "f32";
  o.spec.ctv = "f32";
  auto sum = migrate_dir(io, o);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  ASSERT_EQ(sum->files.size(), 2u);
  EXPECT_EQ(sum->files[0].action, FileAction::kFailed) << sum->files[0].detail;
  EXPECT_NE(sum->files[0].detail.find("changed while kvsnap converted it"), std::string::npos) << sum->files[0].detail;
  EXPECT_EQ(slurp(a), newer) << "the conversion of the older file replaced the server's save";
  EXPECT_EQ(sum->files[1].action, FileAction::kConverted) << sum->files[1].detail;
  size_t temps = 0;
  for (const auto& e : fs::directory_iterator(dir)) temps += e.path().string().find(kTempInfix) != std::string::npos;
  EXPECT_EQ(temps, 0u);
}

}  // namespace
}  // namespace kvsnap
