#include "store/catalog.h"
#include "store/local_blob_store.h"
#include "store/pack_compaction.h"
#include "store/sqlite_catalog.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "store/catalog_contract.h"
#include "store/fault_io.h"
#include "temp_dir.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

// Runs SQL on the catalog file directly, bypassing Catalog (to set up odd states).
void raw_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

// chunks.refcount by lowercase hex hash, read from the file directly.
std::map<std::string, int64_t> sqlite_refcounts(const std::string& path) {
  std::map<std::string, int64_t> out;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "SELECT hex(sha256), refcount FROM chunks", -1, &st, nullptr);
  while (sqlite3_step(st) == SQLITE_ROW) {
    std::string h = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    for (char& ch : h) ch = static_cast<char>(std::tolower(ch));
    out[h] = sqlite3_column_int64(st, 1);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// EXPLAIN QUERY PLAN of `sql` (its ?1 bound to a time) on the catalog file: the details, one a line.
std::string sqlite_plan(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, ("EXPLAIN QUERY PLAN " + sql).c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_bind_text(st, 1, "2026-01-02T00:00:00.000Z", -1, SQLITE_STATIC);
  std::string out;
  while (sqlite3_step(st) == SQLITE_ROW) out += reinterpret_cast<const char*>(sqlite3_column_text(st, 3)) + std::string("\n");
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// The SQLite catalog for the behaviour every catalog shares (catalog_contract.h).
struct SqliteBackend {
  using Cat = Catalog;
  static constexpr int kSchemaVersion = SqliteCatalog::kSchemaVersion;
  std::string set_up() {
    dir.emplace("kvsnap-catalog");
    root = dir->path();
    return "";
  }
  void tear_down() { dir.reset(); }
  std::string path() const { return root + "/catalog.sqlite"; }
  Result<std::unique_ptr<Catalog>> open(const CatalogOptions& o = {}) { return Catalog::open(path(), o); }
  void sql(const std::string& s) { raw_sql(path(), s); }
  std::map<std::string, int64_t> refcounts() { return sqlite_refcounts(path()); }
  void set_schema_version(int v) { sql("PRAGMA user_version = " + std::to_string(v)); }
  std::string bytes_literal(const std::string& hex) { return "x'" + hex + "'"; }
  std::string blob_root() const { return root; }
  std::unique_ptr<GcLocks> gc_locks() { return nullptr; }  // LocalBlobStore's own: <root>/gc.lock
  std::string explain_expired() { return sqlite_plan(path(), SqliteCatalog::kExpiredSql); }
  std::optional<test::TempDir> dir;
  std::string root;
};

INSTANTIATE_TYPED_TEST_SUITE_P(Sqlite, CatalogContract, SqliteBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Sqlite, CatalogGc, SqliteBackend);

class CatalogTest : public ::testing::Test {
 protected:
  std::unique_ptr<Catalog> open(const CatalogOptions& o = {}) {
    auto c = Catalog::open(db_path_, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  int64_t add(Catalog& c, SnapshotRecord r, std::vector<ChunkUse> chunks = {}) {
    auto info = c.add_snapshot(std::move(r), chunks);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? info->id : -1;
  }
  std::map<std::string, int64_t> refcounts() { return sqlite_refcounts(db_path_); }
  void expect_consistent(Catalog& c) {
    auto problems = c.integrity_check();
    ASSERT_TRUE(problems.ok()) << problems.status().ToString();
    EXPECT_TRUE(problems->empty()) << problems->front();
  }

  const test::TempDir dir_{"kvsnap-catalog"};
  const std::string root_ = dir_.path();
  const std::string db_path_ = root_ + "/catalog.sqlite";
};

// ---------------------------------------------------------------- schema (SQLite only; the rest is in catalog_contract.h)

// What a reference reads as decides what a name may be: an id (all digits) or a whole uuid (kvsnap
// serve restores by uuid: a name that is another snapshot's uuid would be restored in its place).
TEST(CatalogRules, NamesThatReadAsAnIdOrAUuidAreRefused) {
  const std::map<std::string, std::string> no_tags;
  EXPECT_TRUE(check_snapshot_labels(std::string("chat-1"), no_tags).ok());
  EXPECT_TRUE(check_snapshot_labels(std::nullopt, no_tags).ok());
  EXPECT_FALSE(check_snapshot_labels(std::string(""), no_tags).ok());
  EXPECT_FALSE(check_snapshot_labels(std::string("12345"), no_tags).ok());
  EXPECT_FALSE(check_snapshot_labels(std::string("0f0a3c5e-1b2d-4e6f-8a9b-0c1d2e3f4a5b"), no_tags).ok());
  EXPECT_FALSE(check_snapshot_labels(std::string("0F0A3C5E-1B2D-4E6F-8A9B-0C1D2E3F4A5B"), no_tags).ok());
  EXPECT_TRUE(check_snapshot_labels(std::string("0f0a3c5e"), no_tags).ok()) << "a uuid prefix is a name";
  EXPECT_FALSE(check_snapshot_labels(std::nullopt, {{"", "v"}}).ok());
  EXPECT_EQ(canonical_snapshot_uuid("0F0A3C5E-1B2D-4E6F-8A9B-0C1D2E3F4A5B").value(), "0f0a3c5e-1b2d-4e6f-8a9b-0c1d2e3f4a5b");
  EXPECT_EQ(canonical_snapshot_uuid("").value(), "");
  for (const char* bad : {"u", "0f0a3c5e-1b2d-4e6f-8a9b-0c1d2e3f4a5", "0f0a3c5e_1b2d-4e6f-8a9b-0c1d2e3f4a5b",
                          "0f0a3c5e-1b2d-4e6f-8a9b-0c1d2e3f4a5g", "../../etc/x y"})
    EXPECT_EQ(canonical_snapshot_uuid(bad).status().code(), Code::kInvalidArgument) << bad;
}

TEST_F(CatalogTest, FreshFileIsMigratedToCurrentVersionWithWal) {
  auto c = open();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->schema_version(), SqliteCatalog::kSchemaVersion);
  EXPECT_TRUE(fs::exists(root_ + "/catalog.sqlite-wal")) << "WAL mode";
  expect_consistent(*c);
}

TEST_F(CatalogTest, EmptyVersionZeroDatabaseMigrates) {
  raw_sql(db_path_, "PRAGMA user_version = 0; CREATE TABLE unrelated(x); DROP TABLE unrelated;");
  auto c = open();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->schema_version(), SqliteCatalog::kSchemaVersion);
  EXPECT_GT(add(*c, record("x")), 0);
  // Reopening an up-to-date catalog changes nothing.
  c.reset();
  auto again = open();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->list()->size(), 1u);
}

TEST_F(CatalogTest, NotADatabaseIsCorruption) {
  std::ofstream(db_path_) << std::string(8192, 'z');
  auto c = Catalog::open(db_path_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kCorruption) << c.status().ToString();
}

// ---------------------------------------------------------------- faults: the save protocol

class SaveFaultTest : public CatalogTest, public ::testing::WithParamInterface<int> {};

// Fail each Io operation of a save in turn: whichever fails, there is no
// snapshot, and every file under chunks/ is a complete blob.
TEST_P(SaveFaultTest, AFailedBlobWriteOrSyncLeavesNoSnapshotAndNoPartialBlob) {
  const FaultOp ops[] = {FaultOp::kOpenWrite, FaultOp::kAppend, FaultOp::kSync,
                         FaultOp::kRename,    FaultOp::kSyncDir, FaultOp::kClose};
  FaultOp op = ops[GetParam() % 6];
  int nth = 1 + GetParam() / 6;
  FaultInjectingIo io(posix_io());
  auto blobs = std::move(LocalBlobStore::open(io, root_)).value();
  auto c = open();
  ASSERT_TRUE(save(*blobs, *c, record("before"), {"shared", "old"}).ok());
  if (GetParam() % 7 == 3) {
    io.short_write_nth(nth, 3);
  } else {
    io.fail_nth(op, nth, GetParam() % 2 ? EIO : ENOSPC);
  }
  Status s = save(*blobs, *c, record("after"), {"shared", "new1", "new2", "new3"});
  if (io.injected() == 0) GTEST_SKIP() << "this save does fewer than " << nth << " " << fault_op_name(op) << "s";
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_EQ(c->resolve("after").status().code(), Code::kNotFound);
  EXPECT_EQ(c->list()->size(), 1u);
  expect_consistent(*c);
  for (auto& e : fs::recursive_directory_iterator(root_ + "/chunks")) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(f)), {});
    ASSERT_EQ(content.substr(0, 2), "z:") << e.path();
    EXPECT_EQ(chunk(content.substr(2)).hex(), e.path().filename().string()) << "partial blob " << e.path();
  }
  EXPECT_TRUE(fs::is_empty(root_ + "/tmp"));
  // Retrying without the fault works, and gc afterwards has nothing to take from it.
  io.clear();
  ASSERT_TRUE(save(*blobs, *c, record("after"), {"shared", "new1", "new2", "new3"}).ok());
  auto gc = collect_garbage(*c, *blobs);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->orphans_deleted, 0u);
  EXPECT_EQ(blobs->list()->size(), 5u);
}

INSTANTIATE_TEST_SUITE_P(EachOperation, SaveFaultTest, ::testing::Range(0, 18));

// A SQLite VFS that forwards to the default one and fails writes or syncs of
// the WAL file on demand: a failed commit.
struct FaultVfs {
  static inline sqlite3_vfs* base = nullptr;
  static inline sqlite3_vfs vfs{};
  static inline std::atomic<int> fail_wal_writes{0};  // countdown: the n-th WAL write fails
  static inline std::atomic<int> fail_wal_syncs{0};
  static inline std::atomic<int> wal_full_syncs{0};    // SQLITE_SYNC_FULL: F_FULLFSYNC on macOS
  static inline std::atomic<int> wal_normal_syncs{0};  // SQLITE_SYNC_NORMAL: fsync
  static inline sqlite3_io_methods methods{};

  struct File {
    sqlite3_file base;
    sqlite3_file* real;
    bool wal;
  };
  static sqlite3_file* real(sqlite3_file* f) { return reinterpret_cast<File*>(f)->real; }
  static bool hit(std::atomic<int>& n) {
    int v = n.load();
    while (v > 0 && !n.compare_exchange_weak(v, v - 1)) {
    }
    return v == 1;
  }

  static void install() {
    if (base) return;
    base = sqlite3_vfs_find(nullptr);
    vfs = *base;
    vfs.zName = "kvsnap-fault";
    vfs.szOsFile = static_cast<int>(sizeof(File) + base->szOsFile);
    vfs.xOpen = [](sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out) -> int {
      File* w = reinterpret_cast<File*>(f);
      w->real = reinterpret_cast<sqlite3_file*>(w + 1);
      w->wal = (flags & SQLITE_OPEN_WAL) != 0;
      int rc = base->xOpen(base, name, w->real, flags, out);
      w->base.pMethods = w->real->pMethods ? &methods : nullptr;
      return rc;
    };
    methods.iVersion = 3;
    methods.xClose = [](sqlite3_file* f) { return real(f)->pMethods->xClose(real(f)); };
    methods.xRead = [](sqlite3_file* f, void* p, int n, sqlite3_int64 o) { return real(f)->pMethods->xRead(real(f), p, n, o); };
    methods.xWrite = [](sqlite3_file* f, const void* p, int n, sqlite3_int64 o) {
      if (reinterpret_cast<File*>(f)->wal && hit(fail_wal_writes)) return SQLITE_IOERR_WRITE;
      return real(f)->pMethods->xWrite(real(f), p, n, o);
    };
    methods.xTruncate = [](sqlite3_file* f, sqlite3_int64 s) { return real(f)->pMethods->xTruncate(real(f), s); };
    methods.xSync = [](sqlite3_file* f, int fl) {
      if (reinterpret_cast<File*>(f)->wal && hit(fail_wal_syncs)) return SQLITE_IOERR_FSYNC;
      if (reinterpret_cast<File*>(f)->wal) ++((fl & 0x0F) == SQLITE_SYNC_FULL ? wal_full_syncs : wal_normal_syncs);
      return real(f)->pMethods->xSync(real(f), fl);
    };
    methods.xFileSize = [](sqlite3_file* f, sqlite3_int64* s) { return real(f)->pMethods->xFileSize(real(f), s); };
    methods.xLock = [](sqlite3_file* f, int l) { return real(f)->pMethods->xLock(real(f), l); };
    methods.xUnlock = [](sqlite3_file* f, int l) { return real(f)->pMethods->xUnlock(real(f), l); };
    methods.xCheckReservedLock = [](sqlite3_file* f, int* r) { return real(f)->pMethods->xCheckReservedLock(real(f), r); };
    methods.xFileControl = [](sqlite3_file* f, int op, void* a) { return real(f)->pMethods->xFileControl(real(f), op, a); };
    methods.xSectorSize = [](sqlite3_file* f) { return real(f)->pMethods->xSectorSize(real(f)); };
    methods.xDeviceCharacteristics = [](sqlite3_file* f) { return real(f)->pMethods->xDeviceCharacteristics(real(f)); };
    methods.xShmMap = [](sqlite3_file* f, int pg, int sz, int ext, void volatile** p) {
      return real(f)->pMethods->xShmMap(real(f), pg, sz, ext, p);
    };
    methods.xShmLock = [](sqlite3_file* f, int o, int n, int fl) { return real(f)->pMethods->xShmLock(real(f), o, n, fl); };
    methods.xShmBarrier = [](sqlite3_file* f) { real(f)->pMethods->xShmBarrier(real(f)); };
    methods.xShmUnmap = [](sqlite3_file* f, int d) { return real(f)->pMethods->xShmUnmap(real(f), d); };
    methods.xFetch = [](sqlite3_file* f, sqlite3_int64 o, int n, void** p) { return real(f)->pMethods->xFetch(real(f), o, n, p); };
    methods.xUnfetch = [](sqlite3_file* f, sqlite3_int64 o, void* p) { return real(f)->pMethods->xUnfetch(real(f), o, p); };
    ASSERT_EQ(sqlite3_vfs_register(&vfs, 0), SQLITE_OK);
  }
};

// Options that open a catalog on FaultVfs (installed first).
CatalogOptions fault_vfs_options() {
  FaultVfs::install();
  CatalogOptions o;
  o.vfs = "kvsnap-fault";
  return o;
}

// The WAL's index (-shm) stays when the last connection closes, so the next command needs no new
// space to open the catalog (on a full disk no command, ls included, could open it: "disk I/O
// error (PRAGMA journal_mode=WAL)"); the WAL itself is cut to nothing once checkpointed
// (journal_size_limit), however large its last transaction.
TEST_F(CatalogTest, TheWalIndexStaysAndTheWalIsCutWhenTheLastConnectionCloses) {
  {
    auto c = open();
    ASSERT_TRUE(c);
    for (int i = 0; i < 50; ++i) add(*c, record("s" + std::to_string(i), iota_tokens(5000)), {use("c" + std::to_string(i))});
    EXPECT_GT(std::filesystem::file_size(db_path_ + "-wal"), 1u << 20) << "the test needs a WAL past the limit";
  }
  ASSERT_TRUE(std::filesystem::exists(db_path_ + "-shm"));
  EXPECT_GE(std::filesystem::file_size(db_path_ + "-shm"), 32768u);
  ASSERT_TRUE(std::filesystem::exists(db_path_ + "-wal"));
  EXPECT_EQ(std::filesystem::file_size(db_path_ + "-wal"), 0u);
  auto c = open();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->list()->size(), 50u);
}

TEST_F(CatalogTest, AFailedCommitLeavesTheCatalogUnchanged) {
  const CatalogOptions o = fault_vfs_options();
  auto c = open(o);
  ASSERT_TRUE(c);
  int64_t keep = add(*c, record("keep"), {use("a"), use("b")});
  auto before = refcounts();

  FaultVfs::fail_wal_writes = 2;  // the second WAL page of the commit
  auto r = c->add_snapshot(record("lost", iota_tokens(5000)), {use("a"), use("c")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIOError) << r.status().ToString();
  EXPECT_EQ(c->list()->size(), 1u);
  EXPECT_EQ(refcounts(), before);

  FaultVfs::fail_wal_writes = 1;
  auto rm = c->remove_snapshot(keep);
  ASSERT_FALSE(rm.ok());
  EXPECT_EQ(c->list()->size(), 1u);

  // And after the process "restarts" (the connection is gone), still unchanged.
  c.reset();
  c = open(o);
  EXPECT_EQ(c->list()->size(), 1u);
  EXPECT_EQ(refcounts(), before);
  expect_consistent(*c);
  EXPECT_GT(add(*c, record("lost", iota_tokens(5000)), {use("a"), use("c")}), 0) << "works once the fault is gone";
}

// A durable commit asks the VFS for a full sync (PRAGMA fullfsync), which SQLite's unix VFS does with
// fcntl(F_FULLFSYNC) on macOS; on Linux both kinds are fsync, so this is what can be checked here.
TEST_F(CatalogTest, DurableCommitsAskForFullSyncs) {
  const CatalogOptions o = fault_vfs_options();
  auto c = open(o);
  ASSERT_TRUE(c);
  FaultVfs::wal_full_syncs = 0;
  FaultVfs::wal_normal_syncs = 0;
  add(*c, record("durable"), {use("a")});
  EXPECT_GT(FaultVfs::wal_full_syncs.load(), 0);
  EXPECT_EQ(FaultVfs::wal_normal_syncs.load(), 0);
}

// An fsync failure at commit: the caller is told, and this process does not
// see the snapshot. (Whether it survives a crash is unknowable, as for any
// database whose fsync failed; see docs/store.md.)
TEST_F(CatalogTest, AFailedCommitSyncIsReported) {
  const CatalogOptions o = fault_vfs_options();
  auto c = open(o);
  FaultVfs::fail_wal_syncs = 1;
  auto r = c->add_snapshot(record("maybe"), {use("a")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIOError);
  EXPECT_EQ(FaultVfs::fail_wal_syncs.load(), 0);
  EXPECT_EQ(c->list()->size(), 0u);
  EXPECT_GT(add(*c, record("next"), {use("a")}), 0);
}

// A review's finding: a restore racing an rm of its snapshot read the record, then (the rm
// committed) an empty chunk list, and called the snapshot damaged ("the store lost chunk ...",
// exit 3, "kvsnap rm removes it"). get_with_chunks reads both at one moment: a removal committed
// by another connection between them is not seen, and the next read finds the snapshot gone.
TEST_F(CatalogTest, ASnapshotsRecordAndChunksAreReadAtOneMoment) {
  std::unique_ptr<Catalog> other;
  int64_t remove_id = -1;
  CatalogOptions o;
  o.between_reads_for_test = [&] {
    if (remove_id < 0) return;
    EXPECT_TRUE(other->remove_snapshot(remove_id).ok());
    remove_id = -1;
  };
  auto c = open(o);
  ASSERT_TRUE(c);
  other = open();
  ASSERT_TRUE(other);
  const int64_t id = add(*c, record("p"), {use("a"), use("b")});
  remove_id = id;
  auto rows = c->get_with_chunks(id);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(remove_id, -1) << "the removal ran between the reads";
  EXPECT_EQ(rows->record.info.name, std::optional<std::string>("p"));
  ASSERT_EQ(rows->chunks.size(), 2u);
  EXPECT_EQ(rows->chunks[0].sha256, use("a").sha256);
  EXPECT_EQ(c->get_with_chunks(id).status().code(), Code::kNotFound);
  EXPECT_EQ(c->get(id).status().code(), Code::kNotFound);
}

// A review's finding: compaction deleted its new pack after any failure of the rows' move, also
// one at COMMIT whose fsync failed, which a crash may still find committed (the WAL holds the
// commit frame): the rows would name a deleted pack, and the next gc delete the old one too. The
// new pack now stays unless the move's guard refused it; compaction stops with a warning, and the
// next gc deletes whichever pack no row names and compacts again.
TEST_F(CatalogTest, ACompactionWhoseMoveFailsAtCommitKeepsTheNewPack) {
  const CatalogOptions o = fault_vfs_options();
  auto c = open(o);
  ASSERT_TRUE(c);
  auto blobs = LocalBlobStore::open(posix_io(), root_, nullptr);
  ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
  std::vector<ChunkUse> uses;
  {
    auto batch = (*blobs)->begin_write();
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    for (const char* raw : {"p1", "p2", "p3", "p4"}) {
      const std::string stored = std::string("z:") + raw;
      auto at = (*batch)->append(chunk(raw), bytes_of(stored));
      ASSERT_TRUE(at.ok()) << at.status().ToString();
      uses.push_back(ChunkUse{chunk(raw), 2, stored.size(), at->pack, at->offset});
    }
    ASSERT_TRUE((*batch)->commit().ok());
  }
  const std::string old_pack = uses[0].pack;
  add(*c, record("long"), uses);
  add(*c, record("short"), {uses[1]});
  ASSERT_TRUE(c->remove_snapshot(*c->resolve("long")).ok());
  auto forgotten = collect_garbage(*c, **blobs, GcOptions{.scan_orphans = false, .compact_dead_percent = 0});
  ASSERT_TRUE(forgotten.ok()) << forgotten.status().ToString();
  ASSERT_EQ(*(*blobs)->list_packs(), std::vector<std::string>{old_pack});

  GcReport report;
  {
    auto lock = (*blobs)->lock_for_gc(true);
    ASSERT_TRUE(lock.ok() && *lock);
    FaultVfs::fail_wal_syncs = 1;  // the move's commit
    Status s = compact_packs(*c, **blobs, **lock, {old_pack}, GcOptions{.compact_dead_percent = 50}, report);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(FaultVfs::fail_wal_syncs.load(), 0) << "the fault was met";
  }
  EXPECT_EQ(report.packs_compacted, 0u);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("compaction stopped"), std::string::npos) << report.warnings[0];
  auto packs = (*blobs)->list_packs();
  ASSERT_TRUE(packs.ok());
  EXPECT_EQ(packs->size(), 2u) << "the old pack and the new one both stay";

  auto gc = collect_garbage(*c, **blobs, GcOptions{.compact_dead_percent = 50});  // a full gc: every pack
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->packs_compacted, 1u);
  packs = (*blobs)->list_packs();
  ASSERT_TRUE(packs.ok());
  ASSERT_EQ(packs->size(), 1u) << "the unused one deleted, the old one compacted";
  auto moved = c->find_chunk(chunk("p2"));
  ASSERT_TRUE(moved.ok() && moved->has_value());
  EXPECT_EQ((*moved)->pack, packs->front());
  EXPECT_EQ(*(*blobs)->get(chunk("p2"), (*moved)->location(), 100), bytes_of("z:p2"));
  expect_consistent(*c);
}

}  // namespace
}  // namespace kvsnap
