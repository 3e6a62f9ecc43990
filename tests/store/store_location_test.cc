// The storage seams (store_location.h, gc_lock.h): what --store means, the
// config file's checks, the backends refused with a clear error, and a
// Store over parts the caller opened, taking its gc locks from them.
#include "store/store_location.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "store/local_blob_store.h"
#include "store/store.h"
#include "test_files.h"

// Key configs below are written with designated initializers.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

class StoreLocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("kvsnap-loc-" + std::to_string(::getpid()) + "-" +
                                         std::to_string(std::random_device{}())))
               .string();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ + "/" + name) << text; }
  Result<StoreLocation> resolve(const std::string& given) { return resolve_store_location(posix_io(), given); }
  std::string dir_;
};

TEST_F(StoreLocationTest, ADirectoryIsTheEmbeddedDefault) {
  auto l = resolve(dir_ + "/store//");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->catalog_kind, CatalogKind::kSqlite);
  EXPECT_EQ(l->catalog, dir_ + "/store/catalog.sqlite");
  EXPECT_EQ(l->blob_kind, BlobKind::kLocal);
  EXPECT_EQ(l->blobs, dir_ + "/store");
  EXPECT_EQ(l->local_dir, dir_ + "/store");
  EXPECT_TRUE(l->config.empty());
  EXPECT_FALSE(fs::exists(dir_ + "/store")) << "resolving creates nothing";
}

TEST_F(StoreLocationTest, TheEnvironmentChoosesWhenNoStoreIsGiven) {
  const char* old = std::getenv("KVSNAP_HOME");
  const std::string saved = old ? old : "";
  ::setenv("KVSNAP_HOME", (dir_ + "/home").c_str(), 1);
  auto l = resolve("");
  if (old) ::setenv("KVSNAP_HOME", saved.c_str(), 1);
  else ::unsetenv("KVSNAP_HOME");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->local_dir, dir_ + "/home");
  auto p = resolve_store_paths(dir_ + "/x");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->root, dir_ + "/x");
}

TEST_F(StoreLocationTest, AConfigFileNamesThePartsApart) {
  write("fleet.json", R"({"catalog": "postgresql://kv:secret@db.internal:5432/kvsnap",
                          "blobs": "s3://kv-cache/team-a", "local_dir": "cache"})");
  auto l = resolve(dir_ + "/fleet.json");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->catalog_kind, CatalogKind::kPostgres);
  EXPECT_EQ(l->catalog, "postgresql://kv:secret@db.internal:5432/kvsnap");
  EXPECT_EQ(l->blob_kind, BlobKind::kS3);
  EXPECT_EQ(l->blobs, "s3://kv-cache/team-a");
  EXPECT_EQ(l->local_dir, dir_ + "/cache") << "relative to the config file";
  EXPECT_EQ(l->config, dir_ + "/fleet.json");
}

TEST_F(StoreLocationTest, ADirectoryWithStoreJsonIsConfiguredByIt) {
  write("store.json", R"({"catalog": "/elsewhere/cat.sqlite"})");
  auto l = resolve(dir_);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->catalog_kind, CatalogKind::kSqlite);
  EXPECT_EQ(l->catalog, "/elsewhere/cat.sqlite");
  EXPECT_EQ(l->blobs, dir_) << "defaults: blobs in the local directory, the config's own";
  EXPECT_EQ(l->local_dir, dir_);
}

TEST_F(StoreLocationTest, TheCompactionThresholdIsAPercentageOrUnset) {
  write("store.json", R"({"compact_dead_percent": 0})");
  auto zero = resolve(dir_);
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ(zero->caps.compact_dead_percent, 0);
  write("store.json", R"({"compact_dead_percent": 100})");
  EXPECT_EQ(resolve(dir_)->caps.compact_dead_percent, 100);
  write("store.json", "{}");
  EXPECT_FALSE(resolve(dir_)->caps.compact_dead_percent.has_value()) << "unset: GcOptions's default";
}

TEST_F(StoreLocationTest, BadConfigsAreRefusedByFileAndKey) {
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {R"({"catalgo": "x.sqlite"})", "catalgo"},
      {R"({"blobs": "ftp://host/x"})", "ftp://host/x"},
      {R"({"blobs": "s3://"})", "names no bucket"},
      {R"({"catalog": "mysql://u:pw@h/db"})", "mysql://u@h/db"},
      {R"({"catalog": ""})", "empty"},
      {R"({"catalog": 3})", "catalog"},
      {R"(["catalog"])", "object"},
      {"{", "JSON"},
      {R"({"max_bytes": "lots"})", "'lots' is not a size"},
      {R"({"max_bytes": -1})", "max_bytes"},
      {R"({"tenant_max_bytes": {"ana": "2X"}})", "tenant_max_bytes.ana"},
      {R"({"tenant_max_bytes": 5})", "tenant_max_bytes"},
      {R"({"cache_max_bytes": "1 G"})", "cache_max_bytes"},
      {R"({"cache_max_bytes": -5})", "cache_max_bytes"},
      {R"({"multipart_max_age": "soon"})", "multipart_max_age"},
      {R"({"multipart_max_age": -1})", "multipart_max_age"},
      {R"({"key_file": ""})", "key_file"},
      {R"({"key_command": 7})", "key_command"},
      {R"({"tenant": "two words"})", "tenant"},
      {R"({"compact_dead_percent": 101})", "compact_dead_percent"},
      {R"({"compact_dead_percent": -1})", "compact_dead_percent"},
      {R"({"compact_dead_percent": 25.5})", "compact_dead_percent"},
      {R"({"compact_dead_percent": "25"})", "compact_dead_percent"},
  };
  for (const Case& c : cases) {
    write("bad.json", c.text);
    auto l = resolve(dir_ + "/bad.json");
    ASSERT_FALSE(l.ok()) << c.text;
    EXPECT_EQ(l.status().code(), Code::kInvalidArgument) << c.text << ": " << l.status().ToString();
    EXPECT_NE(l.status().message().find(dir_ + "/bad.json"), std::string::npos) << l.status().ToString();
    EXPECT_NE(l.status().message().find(c.says), std::string::npos) << l.status().ToString();
    EXPECT_EQ(l.status().message().find("pw@"), std::string::npos) << "no password in messages";
  }
  auto missing = resolve(dir_ + "/none.json");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  auto url = resolve("s3://bucket/prefix");
  EXPECT_EQ(url.status().code(), Code::kInvalidArgument);
  // A review's finding: a password given as a URL's query parameter was printed.
  auto query = resolve("postgresql://h/db?password=hunter2");
  EXPECT_EQ(query.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(query.status().message().find("hunter2"), std::string::npos) << query.status().ToString();
  EXPECT_NE(url.status().message().find("config file"), std::string::npos) << url.status().ToString();
}

TEST_F(StoreLocationTest, TheS3CacheSizeIsASizeAndDefaultsToOneGiB) {
  write("plain.json", R"({"blobs": "s3://b/p"})");
  EXPECT_EQ(resolve(dir_ + "/plain.json")->cache_max_bytes, uint64_t{1} << 30);
  EXPECT_EQ(directory_store(dir_).cache_max_bytes, uint64_t{1} << 30);
  write("small.json", R"({"blobs": "s3://b/p", "cache_max_bytes": "64M"})");
  EXPECT_EQ(resolve(dir_ + "/small.json")->cache_max_bytes, uint64_t{64} << 20);
  write("none.json", R"({"blobs": "s3://b/p", "cache_max_bytes": 0})");
  EXPECT_EQ(resolve(dir_ + "/none.json")->cache_max_bytes, 0u);
  EXPECT_EQ(resolve(dir_ + "/plain.json")->multipart_max_age_s, 24 * 3600);
  write("age.json", R"({"blobs": "s3://b/p", "multipart_max_age": "2h"})");
  EXPECT_EQ(resolve(dir_ + "/age.json")->multipart_max_age_s, 2 * 3600);
  write("age0.json", R"({"blobs": "s3://b/p", "multipart_max_age": 0})");
  EXPECT_EQ(resolve(dir_ + "/age0.json")->multipart_max_age_s, 0);
}

// Encryption at rest: the key's source and the tenant; a relative key file is the config's neighbour,
// and the command line's options win over the file's (apply_key_flags).
TEST_F(StoreLocationTest, KeysAndTenantComeFromTheConfigAndTheFlagsWin) {
  write("keys.json", R"({"key_file": "secret/k.key", "tenant": "team-a"})");
  auto l = resolve(dir_ + "/keys.json");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->keys.key_file, dir_ + "/secret/k.key");
  EXPECT_EQ(l->keys.tenant, "team-a");
  StoreLocation w = *l;
  apply_key_flags(w, {.key_command = "cat /run/k"});
  EXPECT_EQ(w.keys.key_file, "");
  EXPECT_EQ(w.keys.key_command, "cat /run/k");
  EXPECT_EQ(w.keys.tenant, "team-a");
  apply_key_flags(w, {.tenant = "team-b"});
  EXPECT_EQ(w.keys.tenant, "team-b");
  EXPECT_EQ(w.keys.key_command, "cat /run/k") << "a flag left out keeps the config's";
  auto both = load_store_key({.key_file = "a", .key_command = "b"});
  EXPECT_EQ(both.status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(load_store_key({})->has_value());
}

// A config another user could have written runs no key command and reads no key file (a review's
// finding: anyone who could write the store's directory could have kvsnap run their command on the
// next ls); the command line's own key is still taken.
TEST_F(StoreLocationTest, KeysFromAConfigOthersCanWriteAreRefused) {
  const std::string marker = dir_ + "/ran";
  write("keys.json", "{\"key_command\": \"touch " + marker + "; printf %064d 0\"}");
  const std::string config = dir_ + "/keys.json";
  ASSERT_EQ(::chmod(config.c_str(), 0666), 0);
  auto l = resolve(config);
  ASSERT_TRUE(l.ok()) << l.status().ToString() << ": a store without its key still opens for keyless use";
  auto key = load_store_key(l->keys);
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), Code::kInvalidArgument);
  EXPECT_NE(key.status().message().find("store config " + config +
                                        " sets key_command, but the file is writable by other users (mode 0666)"),
            std::string::npos)
      << key.status().ToString();
  EXPECT_FALSE(fs::exists(marker)) << "the command ran";
  StoreLocation flagged = *l;
  apply_key_flags(flagged, {.key_command = "printf %064d 0"});
  EXPECT_TRUE(load_store_key(flagged.keys).ok()) << "the command line's key is the user's own";

  ASSERT_EQ(::chmod(config.c_str(), 0600), 0);
  auto trusted = resolve(config);
  ASSERT_TRUE(trusted.ok());
  auto loaded = load_store_key(trusted->keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(fs::exists(marker));
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);  // a directory others can write: the file could be swapped
  auto in_open_dir = resolve(config);
  ASSERT_TRUE(in_open_dir.ok());
  EXPECT_NE(load_store_key(in_open_dir->keys).status().message().find("its directory " + dir_ +
                                                                      " is writable by other users (mode 0777)"),
            std::string::npos);
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
}

TEST_F(StoreLocationTest, CapsAreSizesInBytesOrWithAUnit) {
  write("caps.json", R"({"max_bytes": "20G", "tenant_max_bytes": {"ana": "512M", "bob": 1000}})");
  auto l = resolve(dir_ + "/caps.json");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->caps.max_bytes, uint64_t{20} << 30);
  EXPECT_EQ(l->caps.tenant_max_bytes, (std::map<std::string, uint64_t>{{"ana", uint64_t{512} << 20}, {"bob", 1000}}));
  EXPECT_EQ(*parse_byte_size("1T"), uint64_t{1} << 40);
  EXPECT_EQ(*parse_byte_size("3KiB"), 3072u);
  EXPECT_EQ(*parse_byte_size("7"), 7u);
  EXPECT_FALSE(parse_byte_size("").ok());
  EXPECT_FALSE(parse_byte_size("5 G").ok());
  EXPECT_FALSE(parse_byte_size("999999999999T").ok()) << "no wrap-around";
  EXPECT_EQ(*parse_duration("90m"), 5400);
  EXPECT_EQ(*parse_duration("2w"), 1209600);
  EXPECT_FALSE(parse_duration("0s").ok());
  EXPECT_FALSE(parse_duration("1y").ok());
  // an expiry must stay a 4-digit year: longer than 1000 years is refused (pin keeps for ever), and
  // a sum past 9999 or a wrapped product never becomes a time
  EXPECT_EQ(*parse_duration("52000w"), int64_t{52000} * 604800);
  for (const char* far : {"3000000d", "420000w", "16000000000w", "999999999999w"}) {
    const auto d = parse_duration(far);
    ASSERT_FALSE(d.ok()) << far;
    EXPECT_NE(d.status().message().find("kvsnap pin"), std::string::npos) << d.status().ToString();
  }
  EXPECT_FALSE(add_seconds("2026-12-31T23:59:30.250Z", int64_t{300000} * 86400 * 365).ok());
  EXPECT_FALSE(add_seconds("2026-12-31T23:59:30.250Z", INT64_MAX).ok()) << "no wrap-around";
  EXPECT_EQ(*add_seconds("9999-12-31T23:59:58.999Z", 1), "9999-12-31T23:59:59.999Z");
  EXPECT_FALSE(add_seconds("9999-12-31T23:59:59.000Z", 1).ok());
  EXPECT_EQ(*add_seconds("2026-12-31T23:59:30.250Z", 45), "2027-01-01T00:00:15.250Z");
  EXPECT_FALSE(add_seconds("yesterday", 1).ok());
}

TEST_F(StoreLocationTest, BackendsThatCannotOpenSayWhyByName) {
  // PostgreSQL is built: an unreachable server is an I/O error naming the URL without its password.
  write("pg.json", R"({"catalog": "postgresql://kv:secret@127.0.0.1:1/kvsnap?connect_timeout=2"})");
  auto pg = resolve(dir_ + "/pg.json");
  ASSERT_TRUE(pg.ok());
  auto opened = Store::open(posix_io(), *pg);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), Code::kIOError) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("postgresql://kv@127.0.0.1:1/kvsnap"), std::string::npos)
      << opened.status().ToString();
  EXPECT_EQ(opened.status().message().find("secret"), std::string::npos) << opened.status().ToString();
  write("s3.json", R"({"blobs": "s3://kv-cache/a"})");
  auto s3 = resolve(dir_ + "/s3.json");
  ASSERT_TRUE(s3.ok());
  // S3 blobs are built (tests/s3 runs them against a real server); without credentials: a clear refusal.
  for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"}) unsetenv(v);
  auto blobs = open_blob_store(posix_io(), *s3);
  EXPECT_EQ(blobs.status().code(), Code::kInvalidArgument);
  EXPECT_NE(blobs.status().message().find("s3://kv-cache/a"), std::string::npos) << blobs.status().ToString();
  EXPECT_NE(blobs.status().message().find("no credentials"), std::string::npos) << blobs.status().ToString();
}

TEST_F(StoreLocationTest, FileGcLocksShareAndExclude) {
  auto a = file_gc_locks(posix_io(), dir_ + "/gc.lock");
  auto b = file_gc_locks(posix_io(), dir_ + "/gc.lock");
  auto s1 = std::move(a->lock_shared(false)).value();
  auto s2 = std::move(b->lock_shared(false)).value();
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(s2, nullptr) << "saves share the lock";
  EXPECT_EQ(*b->lock_exclusive(false), nullptr) << "no gc while a save holds it";
  s1.reset();
  s2.reset();
  auto gc = GcLock::take(*a, false);
  ASSERT_TRUE(gc.ok());
  ASSERT_NE(*gc, nullptr);
  EXPECT_EQ(*b->lock_shared(false), nullptr) << "no save starts while gc runs";
  EXPECT_EQ(*GcLock::take(*b, false), nullptr);
}

// Counts the holds it hands out from the real file locks.
class CountingGcLocks final : public GcLocks {
 public:
  CountingGcLocks(std::unique_ptr<GcLocks> real, int& shared, int& exclusive)
      : real_(std::move(real)), shared_(shared), exclusive_(exclusive) {}
  Result<std::unique_ptr<GcLockHold>> lock_shared(bool wait) override {
    ++shared_;
    return real_->lock_shared(wait);
  }
  Result<std::unique_ptr<GcLockHold>> lock_exclusive(bool wait) override {
    ++exclusive_;
    return real_->lock_exclusive(wait);
  }

 private:
  std::unique_ptr<GcLocks> real_;
  int& shared_;
  int& exclusive_;
};

TEST_F(StoreLocationTest, AStoreOverInjectedPartsUsesTheirLocks) {
  int shared = 0, exclusive = 0;
  const std::string blobs_dir = dir_ + "/blobs", local = dir_ + "/local";
  fs::create_directories(local);
  auto locks = std::make_unique<CountingGcLocks>(file_gc_locks(posix_io(), dir_ + "/shared.lock"), shared, exclusive);
  StoreParts parts;
  parts.blobs = std::move(LocalBlobStore::open(posix_io(), blobs_dir, std::move(locks))).value();
  parts.catalog = std::move(Catalog::open(local + "/cat.sqlite")).value();
  parts.local_dir = local;
  auto opened = Store::open(posix_io(), std::move(parts));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;

  const auto bytes = test::slurp(fs::path(KVSNAP_SOURCE_DIR) / "fixtures/v0.5.0/hd128-f16-f16-faoff.slot");
  MemoryFile file("slot", std::span<const std::byte>(bytes));
  auto state = parse_for_model(file, {}, nullptr);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  auto saved = store.save(file, *state, {});
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(shared, 1) << "a save holds the shared lock of the parts it was given";
  EXPECT_TRUE(fs::exists(dir_ + "/shared.lock"));
  EXPECT_FALSE(fs::exists(blobs_dir + "/gc.lock")) << "not the default lock";
  EXPECT_TRUE(fs::is_directory(local + "/tmp"));
  ASSERT_TRUE(store.remove(std::to_string(saved->info.id)).ok());
  EXPECT_EQ(exclusive, 1) << "rm's cleanup collects under the exclusive lock";
  auto gc = store.gc(true);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(exclusive, 2);
  EXPECT_EQ(fs::directory_iterator(blobs_dir + "/packs"), fs::directory_iterator()) << "the pack was collected";
}

}  // namespace
}  // namespace kvsnap
