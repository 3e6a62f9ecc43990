// The PostgreSQL catalog against a real PostgreSQL 15 on 127.0.0.1
// (tests/beds/postgres.sh): every behaviour of catalog_contract.h, then what
// only a shared server has: concurrent writers on other connections and
// processes, clients killed mid-transaction, dropped connections, the gc
// advisory locks.
#include "store/pg_catalog.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "beds/postgres_bed.h"
#include "migrate/model_info.h"
#include "store/catalog_contract.h"
#include "store/pg_gc_locks.h"
#include "store/store.h"
#include "store/store_location.h"
#include "test_files.h"

namespace kvsnap {
namespace {

using namespace std::chrono_literals;

// "" when the bed runs; the reason otherwise (a failure unless PostgreSQL is not installed).
std::string bed_problem() {
  PostgresBed& bed = PostgresBed::instance();
  if (bed.unavailable().empty()) return "";
  if (!bed.not_installed()) ADD_FAILURE() << bed.unavailable();
  return bed.unavailable();
}

struct PgBackend {
  using Cat = PgCatalog;
  static constexpr int kSchemaVersion = PgCatalog::kSchemaVersion;
  std::string set_up() {
    if (std::string why = bed_problem(); !why.empty()) return why;
    url = PostgresBed::instance().create_database(&db);
    if (url.empty()) ADD_FAILURE() << "cannot create a database";
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvsnap-pgblobs-XXXXXX").string();
    if (mkdtemp(tmpl.data())) root = tmpl;
    return url.empty() ? "no database" : "";
  }
  void tear_down() {
    PostgresBed::instance().drop_database(db);
    if (!root.empty()) std::filesystem::remove_all(root);
  }
  std::string blob_root() const { return root; }
  std::unique_ptr<GcLocks> gc_locks() { return std::make_unique<PgGcLocks>(url); }
  Result<std::unique_ptr<PgCatalog>> open(const CatalogOptions& o = {}) { return PgCatalog::open(url, o); }
  void sql(const std::string& s) {
    auto r = pg_query(url, s);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
  }
  std::map<std::string, int64_t> refcounts() {
    std::map<std::string, int64_t> out;
    auto r = pg_query(url, "SELECT encode(sha256, 'hex'), refcount FROM chunks");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok())
      for (const auto& row : *r) out[row[0]] = std::stoll(row[1]);
    return out;
  }
  void set_schema_version(int v) {
    sql("UPDATE kvsnap_meta SET value = '" + std::to_string(v) + "' WHERE key = 'schema_version'");
  }
  std::string bytes_literal(const std::string& hex) { return "'\\x" + hex + "'::bytea"; }
  // On a tiny table the planner's cheapest plan is a sequential or bitmap scan and a sort whatever
  // the indexes; with those two off it shows whether an index can serve the query in its order
  // (when none can, a disabled Seq Scan is still chosen and named).
  std::string explain_expired() {
    auto r = pg_query(url, std::string("SET enable_seqscan = off; SET enable_bitmapscan = off; "
                                       "PREPARE expired(text) AS ") + PgCatalog::kExpiredSql +
                               "; EXPLAIN EXECUTE expired('2026-01-02T00:00:00.000Z')");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::string out;
    if (r.ok())
      for (const auto& row : *r) out += row[0] + "\n";
    return out;
  }
  std::string url, db, root;
};

INSTANTIATE_TYPED_TEST_SUITE_P(Postgres, CatalogContract, PgBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Postgres, CatalogGc, PgBackend);

// ---------------------------------------------------------------- PostgreSQL only

class PgCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = b_.set_up();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override { b_.tear_down(); }
  std::unique_ptr<PgCatalog> open() {
    auto c = b_.open();
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  void expect_consistent(PgCatalog& c) {
    auto problems = c.integrity_check();
    ASSERT_TRUE(problems.ok()) << problems.status().ToString();
    EXPECT_TRUE(problems->empty()) << problems->front();
  }
  // Rows of `sql` on this test's database.
  PgRows query(const std::string& sql) {
    auto r = pg_query(b_.url, sql);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : PgRows{};
  }
  PgBackend b_;
};

TEST_F(PgCatalogTest, FreshDatabaseGetsTheSchemaAndAVersionRow) {
  auto c = open();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->schema_version(), PgCatalog::kSchemaVersion);
  EXPECT_EQ(query("SELECT value FROM kvsnap_meta WHERE key = 'schema_version'"),
            (PgRows{{std::to_string(PgCatalog::kSchemaVersion)}}));
  // A database holding other tables is fine: kvsnap only adds its own.
  b_.sql("CREATE TABLE unrelated(x int)");
  c.reset();
  EXPECT_TRUE(open());
}

TEST_F(PgCatalogTest, ErrorsNameTheUrlWithoutThePassword) {
  auto c = PgCatalog::open("postgresql://kvsnap:s3cret@127.0.0.1:1/nowhere?connect_timeout=2");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kIOError);
  EXPECT_NE(c.status().message().find("postgresql://kvsnap@127.0.0.1:1/nowhere"), std::string::npos)
      << c.status().message();
  EXPECT_EQ(c.status().message().find("s3cret"), std::string::npos) << c.status().message();
  auto missing_db = PgCatalog::open(PostgresBed::instance().url_of("no_such_db"));
  ASSERT_FALSE(missing_db.ok());
  EXPECT_NE(missing_db.status().message().find("no_such_db"), std::string::npos) << missing_db.status().message();
}

TEST_F(PgCatalogTest, ServerErrorsCarryTheServersMessage) {
  auto c = open();
  ASSERT_TRUE(c);
  b_.sql("ALTER TABLE snapshots ADD CONSTRAINT no_big CHECK (n_tokens < 10)");
  auto r = c->add_snapshot(record("big", iota_tokens(20)), {use("a")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no_big"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(b_.url), std::string::npos) << r.status().message();
  EXPECT_TRUE(this->query("SELECT 1 FROM chunks").empty()) << "the whole add rolled back";
  EXPECT_TRUE(c->add_snapshot(record("small", iota_tokens(5)), {use("a")}).ok());
}

// A save waiting on a chunk row another transaction holds gives up after
// busy_timeout_ms, says the catalog is busy, and leaves nothing behind.
TEST_F(PgCatalogTest, ARowLockHeldTooLongIsBusy) {
  auto c = open();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->add_snapshot(record("first"), {use("hot")}).ok());
  PGconn* holder = PQconnectdb(b_.url.c_str());
  ASSERT_EQ(PQstatus(holder), CONNECTION_OK);
  PQclear(PQexec(holder, "BEGIN"));
  PQclear(PQexec(holder, "SELECT 1 FROM chunks FOR UPDATE"));
  CatalogOptions quick;
  quick.busy_timeout_ms = 300;
  auto waiting = PgCatalog::open(b_.url, quick);
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  auto r = (*waiting)->add_snapshot(record("second"), {use("hot")});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIOError);
  EXPECT_NE(r.status().message().find("the catalog is busy"), std::string::npos) << r.status().message();
  PQclear(PQexec(holder, "ROLLBACK"));
  PQfinish(holder);
  EXPECT_EQ(c->resolve("second").status().code(), Code::kNotFound);
  ASSERT_TRUE((*waiting)->add_snapshot(record("second"), {use("hot")}).ok()) << "fine once the lock is gone";
  EXPECT_EQ(b_.refcounts()[chunk("hot").hex()], 2);
}

TEST_F(PgCatalogTest, AMalformedSchemaVersionIsCorruption) {
  { ASSERT_TRUE(open()); }
  b_.sql("UPDATE kvsnap_meta SET value = 'two' WHERE key = 'schema_version'");
  auto c = PgCatalog::open(b_.url);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kCorruption) << c.status().ToString();
  EXPECT_NE(c.status().message().find("'two'"), std::string::npos) << c.status().message();
}

// The server ends the catalog's connection (a restart, a failover, an admin):
// the call in flight fails with kIOError, the next one reconnects.
TEST_F(PgCatalogTest, ADroppedConnectionIsAnErrorThenReconnects) {
  auto opened = PgCatalog::open(b_.url + "?application_name=kvsnap-dropped");
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto& c = *opened;
  ASSERT_TRUE(c->add_snapshot(record("before"), {use("a")}).ok());
  query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kvsnap-dropped'");
  auto r = c->list();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIOError);
  EXPECT_NE(r.status().message().find("connection"), std::string::npos) << r.status().message();
  auto again = c->list();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->size(), 1u);
  ASSERT_TRUE(c->add_snapshot(record("after"), {use("a")}).ok()) << "statements are prepared again";
  expect_consistent(*c);
  // The same for find_prefix, whose statements travel in pipelines.
  query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kvsnap-dropped'");
  auto lost = c->find_prefix(std::vector<int32_t>{1, 2, 3, 4});
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), Code::kIOError) << lost.status().ToString();
  auto found = c->find_prefix(std::vector<int32_t>{1, 2, 3, 4});
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->size(), 2u);
  auto twice = c->find_prefix(std::vector<int32_t>{1, 2, 3, 4}, "", 1);
  ASSERT_TRUE(twice.ok()) << twice.status().ToString();
  EXPECT_EQ(twice->size(), 1u);
}

// A save killed (kill -9) in the middle of its transaction: nothing of it is
// visible, its row locks are gone, refcounts stay exact.
TEST_F(PgCatalogTest, AClientKilledMidTransactionLeavesNothingHalfVisible) {
  { ASSERT_TRUE(open()); }
  std::string victim_url = b_.url + "?application_name=kvsnap-victim";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto c = PgCatalog::open(victim_url);
    if (!c.ok()) _exit(2);
    for (int i = 0;; ++i) {
      std::vector<ChunkUse> chunks;
      for (int k = 0; k < 3000; ++k) chunks.push_back(use("shared" + std::to_string(k)));
      chunks.push_back(use("own" + std::to_string(i)));
      if (!(*c)->add_snapshot(record("v" + std::to_string(i), iota_tokens(100)), chunks).ok()) _exit(3);
    }
  }
  // Wait until the victim's transaction has written something (it has an xid), then kill it.
  bool caught = false;
  for (int i = 0; i < 2000 && !caught; ++i) {
    caught = !query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'kvsnap-victim' "
                    "AND backend_xid IS NOT NULL")
                  .empty();
    if (!caught) std::this_thread::sleep_for(1ms);
  }
  kill(pid, SIGKILL);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(caught) << "never saw the victim inside a transaction";
  // The server notices the closed connection and rolls back.
  for (int i = 0; i < 500; ++i) {
    if (query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'kvsnap-victim'").empty()) break;
    std::this_thread::sleep_for(10ms);
  }
  auto c = open();
  ASSERT_TRUE(c);
  expect_consistent(*c);
  auto snaps = c->list();
  ASSERT_TRUE(snaps.ok());
  int64_t committed = static_cast<int64_t>(snaps->size());
  for (const auto& s : *snaps) EXPECT_EQ(s.n_chunks, 3001);
  auto rc = b_.refcounts();
  EXPECT_EQ(rc[chunk("shared0").hex()], committed) << "no increment of the killed save survives";
  EXPECT_EQ(query("SELECT COUNT(*) FROM snapshot_chunks"), (PgRows{{std::to_string(committed * 3001)}}));
  // Its locks are gone: another save of the same chunks goes through at once.
  CatalogOptions quick;
  quick.busy_timeout_ms = 2000;
  auto other = PgCatalog::open(b_.url, quick);
  ASSERT_TRUE(other.ok());
  std::vector<ChunkUse> chunks;
  for (int k = 0; k < 3000; ++k) chunks.push_back(use("shared" + std::to_string(k)));
  ASSERT_TRUE((*other)->add_snapshot(record("after"), chunks).ok());
  EXPECT_EQ(b_.refcounts()[chunk("shared2999").hex()], committed + 1);
  expect_consistent(*c);
}

// Processes saving snapshots that share many chunks, listed in random orders,
// while others remove: refcounts exact, nobody deadlocks or fails.
TEST_F(PgCatalogTest, ConcurrentSavesAndRemovesInRandomChunkOrderKeepRefcountsExact) {
  { ASSERT_TRUE(open()); }
  constexpr int kProcs = 4, kEach = 20, kShared = 40;
  run_in_processes(kProcs, [&](int p) {
    auto c = PgCatalog::open(b_.url);
    if (!c.ok()) return 2;
    std::mt19937 rng(static_cast<unsigned>(p));
    for (int i = 0; i < kEach; ++i) {
      std::vector<ChunkUse> chunks;
      for (int k = 0; k < kShared; ++k) chunks.push_back(use("s" + std::to_string(k)));
      std::shuffle(chunks.begin(), chunks.end(), rng);
      chunks.push_back(use("own" + std::to_string(p) + "-" + std::to_string(i)));
      auto info = (*c)->add_snapshot(record(std::nullopt, iota_tokens(10 + i)), chunks);
      if (!info.ok()) return 3;
      if (i % 2 == 1 && !(*c)->remove_snapshot(info->id).ok()) return 4;
    }
    return 0;
  });
  auto c = open();
  size_t survivors = c->list()->size();
  EXPECT_EQ(survivors, static_cast<size_t>(kProcs * kEach / 2));
  auto rc = b_.refcounts();
  for (int k = 0; k < kShared; ++k) EXPECT_EQ(rc[chunk("s" + std::to_string(k)).hex()], static_cast<int64_t>(survivors));
  expect_consistent(*c);
}

// ---------------------------------------------------------------- a whole store

// A store whose config file names this database as its catalog: save (the
// parent found by find_prefix, chunks deduplicated through find_chunk),
// restore byte for byte, remove, gc under the advisory locks, verify.
TEST_F(PgCatalogTest, AStoreWithAPostgresCatalogSavesRestoresAndCollects) {
  std::string dir = b_.blob_root();
  std::ofstream(dir + "/store.json") << R"({"catalog": ")" << b_.url << R"("})";
  auto where = resolve_store_location(posix_io(), dir);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  ASSERT_EQ(where->catalog_kind, CatalogKind::kPostgres);
  auto opened = Store::open(posix_io(), *where);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  const std::string fixtures = std::string(KVSNAP_SOURCE_DIR) + "/fixtures/b8121/";
  std::vector<std::vector<std::byte>> originals;
  std::vector<int64_t> ids;
  for (const char* name : {"hd128-f16-f16-faoff.slot", "hd128-f16-f16-faon.slot"}) {
    originals.push_back(test::slurp(fixtures + name));
    MemoryFile file(name, std::span<const std::byte>(originals.back()));
    auto state = parse_for_model(file, {}, nullptr);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    auto saved = store.save(file, *state, {});
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    ids.push_back(saved->info.id);
  }
  EXPECT_EQ(store.catalog().get_info(ids[1])->parent_id, ids[0]) << "the parent came from find_prefix";
  for (size_t i = 0; i < ids.size(); ++i) {
    VectorSink out;
    auto r = store.restore(std::to_string(ids[i]), {}, out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(out.bytes, originals[i]);
  }
  ASSERT_TRUE(store.remove(std::to_string(ids[0])).ok());
  auto gc = store.gc(true);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  auto v = store.verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  VectorSink out;
  ASSERT_TRUE(store.restore(std::to_string(ids[1]), {}, out).ok());
  EXPECT_EQ(out.bytes, originals[1]);
  expect_consistent(*PgCatalog::open(b_.url).value());
  EXPECT_FALSE(std::filesystem::exists(dir + "/gc.lock")) << "the gc lock is in the database, not a local file";
}

// Two processes on one store (the PostgreSQL catalog, one blob directory): one
// saves in a loop, the other collects garbage in a loop; both are killed with
// SIGKILL at some moment. Whatever was committed restores byte for byte, the
// refcounts are exact, and a last gc leaves a store that verifies.
TEST_F(PgCatalogTest, SaverAndCollectorKilledMidWayLeaveAWholeStore) {
  std::string dir = b_.blob_root();
  std::ofstream(dir + "/store.json") << R"({"catalog": ")" << b_.url << R"("})";
  auto where = resolve_store_location(posix_io(), dir);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  const std::string fixtures = std::string(KVSNAP_SOURCE_DIR) + "/fixtures/b8121/";
  const std::vector<std::string> names = {"hd128-f16-f16-faoff.slot", "hd128-f16-f16-faon.slot",
                                          "hd128-q8_0-q8_0-faon.slot", "hd128-q4_0-q8_0-faon.slot"};
  std::vector<std::vector<std::byte>> originals;
  for (const auto& n : names) originals.push_back(test::slurp(fixtures + n));
  { ASSERT_TRUE(Store::open(posix_io(), *where).ok()); }  // schema created once, before the race

  pid_t saver = fork();
  ASSERT_GE(saver, 0);
  if (saver == 0) {
    auto store = Store::open(posix_io(), *where);
    if (!store.ok()) _exit(2);
    for (int i = 0;; ++i) {
      size_t k = static_cast<size_t>(i) % names.size();
      MemoryFile file(names[k], std::span<const std::byte>(originals[k]));
      auto state = parse_for_model(file, {}, nullptr);
      SaveRequest req;
      req.name = "s" + std::to_string(i) + "-" + std::to_string(k);
      if (!state.ok() || !(*store)->save(file, *state, req).ok()) _exit(3);
      if (i % 3 == 2 && !(*store)->remove("s" + std::to_string(i - 1) + "-" + std::to_string((i - 1) % names.size())).ok()) _exit(4);
    }
  }
  pid_t collector = fork();
  ASSERT_GE(collector, 0);
  if (collector == 0) {
    auto store = Store::open(posix_io(), *where);
    if (!store.ok()) _exit(2);
    for (;;) {
      if (!(*store)->gc(true).ok()) _exit(3);
    }
  }
  // Let both run until a dozen snapshots are in, then kill them where they are.
  for (int i = 0; i < 3000; ++i) {
    auto n = pg_query(b_.url, "SELECT COUNT(*) FROM snapshots");
    if (n.ok() && !n->empty() && std::stoi((*n)[0][0]) >= 12) break;
    std::this_thread::sleep_for(5ms);
  }
  kill(saver, SIGKILL);
  std::this_thread::sleep_for(20ms);
  kill(collector, SIGKILL);
  for (pid_t p : {saver, collector}) {
    int st = 0;
    ASSERT_EQ(waitpid(p, &st, 0), p);
    EXPECT_TRUE(WIFSIGNALED(st)) << "a child stopped by itself (status " << st << "): it hit an error";
  }

  auto opened = Store::open(posix_io(), *where);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  auto gc = store.gc(true);  // waits until the server has noticed the dead holders
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  expect_consistent(*PgCatalog::open(b_.url).value());
  auto v = store.verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  auto all = store.catalog().list();
  ASSERT_TRUE(all.ok());
  EXPECT_GE(all->size(), 8u);
  for (const SnapshotInfo& i : *all) {
    size_t k = static_cast<size_t>(std::stoi(i.name->substr(i.name->find('-') + 1)));
    VectorSink out;
    auto r = store.restore(std::to_string(i.id), {}, out);
    ASSERT_TRUE(r.ok()) << *i.name << ": " << r.status().ToString();
    EXPECT_EQ(out.bytes, originals[k]) << *i.name;
  }
}

// ---------------------------------------------------------------- gc locks

TEST_F(PgCatalogTest, GcLocksSharedAndExclusive) {
  PgGcLocks locks(b_.url);
  auto s1 = locks.lock_shared(false);
  auto s2 = locks.lock_shared(false);
  ASSERT_TRUE(s1.ok() && s2.ok()) << s1.status().ToString() << s2.status().ToString();
  ASSERT_TRUE(*s1 && *s2) << "saves share the lock";
  auto ex = locks.lock_exclusive(false);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  EXPECT_FALSE(*ex) << "gc cannot take it while saves hold it";
  s1->reset();
  EXPECT_FALSE(*locks.lock_exclusive(false)) << "one save still holds it";
  // A waiting gc gets it as soon as the last save lets go.
  auto waiting = std::async(std::launch::async, [&] { return locks.lock_exclusive(true); });
  EXPECT_EQ(waiting.wait_for(200ms), std::future_status::timeout);
  s2->reset();
  auto got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(*got);
  EXPECT_FALSE(*locks.lock_shared(false)) << "no save starts under gc";
  EXPECT_FALSE(*locks.lock_exclusive(false)) << "nor another gc";
  got->reset();
  EXPECT_TRUE(*locks.lock_shared(false));
}

// Locks are per database: two catalogs on one server do not block each other.
TEST_F(PgCatalogTest, GcLocksArePerDatabase) {
  PgBackend other;
  ASSERT_EQ(other.set_up(), "");
  PgGcLocks a(b_.url), b(other.url);
  auto ex = a.lock_exclusive(false);
  ASSERT_TRUE(ex.ok() && *ex);
  auto ex2 = b.lock_exclusive(false);
  ASSERT_TRUE(ex2.ok());
  EXPECT_TRUE(*ex2);
  ex2->reset();
  other.tear_down();
}

// A process that dies holding the gc lock (kill -9) holds nothing.
TEST_F(PgCatalogTest, AKilledHolderReleasesTheGcLock) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    PgGcLocks locks(b_.url);
    auto hold = locks.lock_exclusive(true);
    char ok = hold.ok() && *hold ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(2);
    for (;;) pause();
  }
  close(ready[1]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  ASSERT_EQ(ok, 'y');
  PgGcLocks locks(b_.url);
  EXPECT_FALSE(*locks.lock_shared(false)) << "the child holds it";
  kill(pid, SIGKILL);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  // The server releases it once it sees the connection closed: wait for it, without a deadline on success.
  auto got = locks.lock_shared(true);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got);
}

}  // namespace
}  // namespace kvsnap
