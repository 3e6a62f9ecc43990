// A store over the PostgreSQL catalog (tests/beds/postgres.sh): where only a
// shared database can fail it (the save's gc lock lost mid-save: the lock's
// backend terminated, as a server restart would, a gc from another host in
// between), and the store-level caps of store_test.cc.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "beds/postgres_bed.h"
#include "store/local_blob_store.h"
#include "store/crypt_bed.h"
#include "store/read_race_scenario.h"
#include "store/pg_catalog.h"
#include "store/pg_gc_locks.h"
#include "store/store.h"
#include "store/store_caps_scenario.h"
#include "store/store_location.h"
#include "test_files.h"

namespace kvsnap {
namespace {

using namespace std::chrono_literals;

class PgStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PostgresBed& bed = PostgresBed::instance();
    if (!bed.unavailable().empty()) {
      if (!bed.not_installed()) ADD_FAILURE() << bed.unavailable();
      GTEST_SKIP() << bed.unavailable();
    }
    url_ = bed.create_database(&db_);
    ASSERT_FALSE(url_.empty());
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvsnap-pgstore-XXXXXX").string();
    ASSERT_TRUE(mkdtemp(tmpl.data()));
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!db_.empty()) PostgresBed::instance().drop_database(db_);
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // A store on this database and dir_'s blobs with `locks` (nullptr: PgGcLocks, as store.json opens it).
  std::unique_ptr<Store> open(std::unique_ptr<GcLocks> locks = nullptr) { return must(open_keyed(std::move(locks))); }
  static std::unique_ptr<Store> must(Result<std::unique_ptr<Store>> s) {
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  // The same with a master key and tenant (encryption at rest).
  Result<std::unique_ptr<Store>> open_keyed(std::unique_ptr<GcLocks> locks = nullptr,
                                            std::optional<MasterKey> key = std::nullopt, const std::string& tenant = "",
                                            Io& io = posix_io()) {
    if (!locks) locks = std::make_unique<PgGcLocks>(url_);
    StoreParts parts;
    auto blobs = LocalBlobStore::open(io, dir_, std::move(locks));
    auto catalog = PgCatalog::open(url_);
    EXPECT_TRUE(blobs.ok() && catalog.ok()) << blobs.status().ToString() << catalog.status().ToString();
    if (!blobs.ok()) return blobs.status();
    if (!catalog.ok()) return catalog.status();
    parts.blobs = std::move(blobs).value();
    parts.catalog = std::move(catalog).value();
    parts.local_dir = dir_;
    parts.key = std::move(key);
    parts.tenant = tenant;
    return Store::open(io, std::move(parts));
  }
  // read_race_scenario.h's opener: tenant alice with the master key in `key_file`, through `io`.
  read_race::OpenWith alice() {
    return [this](Io& io, const std::filesystem::path& key_file) -> Result<std::unique_ptr<Store>> {
      KV_ASSIGN_OR_RETURN(MasterKey key, load_key_file(key_file.string()));
      return open_keyed(nullptr, std::move(key), "alice", io);
    };
  }
  std::string url_, db_, dir_;
};

struct Fixture {
  std::vector<std::byte> bytes;
  std::unique_ptr<MemoryFile> file;
  StateFile state;
  explicit Fixture(const std::string& name) {
    bytes = test::slurp(std::string(KVSNAP_SOURCE_DIR) + "/fixtures/b8121/" + name);
    file = std::make_unique<MemoryFile>(name, std::span<const std::byte>(bytes));
    auto st = parse_for_model(*file, {}, nullptr);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (st.ok()) state = std::move(st).value();
  }
};

// PgGcLocks whose first shared hold runs `at_commit` when the catalog asks for
// their session, i.e. at the save's commit, after its blobs are written.
class HookedLocks final : public GcLocks {
 public:
  HookedLocks(std::string url, std::function<void(const GcHoldSession&)> at_commit)
      : inner_(std::move(url)), at_commit_(std::move(at_commit)) {}
  Result<std::unique_ptr<GcLockHold>> lock_shared(bool wait) override {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLockHold> h, inner_.lock_shared(wait));
    if (!h) return h;
    return std::unique_ptr<GcLockHold>(new Hold(std::move(h), std::exchange(at_commit_, nullptr)));  // once
  }
  Result<std::unique_ptr<GcLockHold>> lock_exclusive(bool wait) override { return inner_.lock_exclusive(wait); }

 private:
  struct Hold final : GcLockHold {
    Hold(std::unique_ptr<GcLockHold> h, std::function<void(const GcHoldSession&)> f) : inner(std::move(h)), hook(std::move(f)) {}
    Status still_held() override { return inner->still_held(); }
    std::optional<GcHoldSession> session() const override {
      if (hook) std::exchange(hook, nullptr)(*inner->session());
      return inner->session();
    }
    std::unique_ptr<GcLockHold> inner;
    mutable std::function<void(const GcHoldSession&)> hook;
  };
  PgGcLocks inner_;
  std::function<void(const GcHoldSession&)> at_commit_;
};

// The lock's backend is terminated after the save wrote its pack and before
// its commit; a gc on "another host" then takes the exclusive lock and deletes
// that pack (no row names it yet). The save must fail, commit nothing, and
// leave a store that verifies.
TEST_F(PgStoreTest, ASaveWhoseGcLockWasLostFailsAndCommitsNothing) {
  Fixture a("hd128-f16-f16-faoff.slot"), b("hd128-q8_0-q8_0-faon.slot");
  auto other_host = open();
  ASSERT_TRUE(other_host);
  auto kept = other_host->save(*a.file, a.state, {});
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();

  GcReport gc;
  Status gc_status;
  bool terminated = false;
  auto store = open(std::make_unique<HookedLocks>(url_, [&](const GcHoldSession& s) {
    auto r = pg_query(url_, "SELECT pg_terminate_backend(" + std::to_string(s.pid) + ")");
    terminated = r.ok() && !r->empty() && (*r)[0][0] == "t";
    auto g = other_host->gc(/*wait=*/true);  // waits until the server has let the lock go
    gc_status = g.status();
    if (g.ok()) gc = *g;
  }));
  ASSERT_TRUE(store);
  SaveRequest req;
  req.name = "doomed";
  auto saved = store->save(*b.file, b.state, req);
  ASSERT_TRUE(terminated) << "the hook ran and terminated the lock's backend";
  ASSERT_TRUE(gc_status.ok()) << gc_status.ToString();
  EXPECT_EQ(gc.packs_deleted, 1u) << "the other host's gc took the save's pack: the danger is real";
  ASSERT_FALSE(saved.ok()) << "a save whose gc lock was lost committed";
  EXPECT_EQ(saved.status().code(), Code::kIOError);
  EXPECT_NE(saved.status().message().find("gc lock"), std::string::npos) << saved.status().ToString();
  EXPECT_NE(saved.status().message().find("nothing was committed"), std::string::npos) << saved.status().ToString();

  EXPECT_FALSE(other_host->catalog().resolve("doomed").ok()) << "nothing of the save is visible";
  auto list = other_host->catalog().list();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 1u);
  auto problems = other_host->catalog().integrity_check();
  ASSERT_TRUE(problems.ok());
  EXPECT_TRUE(problems->empty()) << problems->front();
  auto v = other_host->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
  VectorSink out;
  ASSERT_TRUE(other_host->restore(std::to_string(kept->info.id), {}, out).ok());
  EXPECT_EQ(out.bytes, a.bytes);

  // The same store saves again with a fresh lock.
  auto again = store->save(*b.file, b.state, req);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  VectorSink out2;
  ASSERT_TRUE(other_host->restore("doomed", {}, out2).ok());
  EXPECT_EQ(out2.bytes, b.bytes);
}

// A hold reports its loss itself too (what gc asks before deleting).
TEST_F(PgStoreTest, AHoldKnowsWhenItsBackendIsGone) {
  PgGcLocks locks(url_);
  auto ex = locks.lock_exclusive(true);
  ASSERT_TRUE(ex.ok() && *ex) << ex.status().ToString();
  EXPECT_TRUE((*ex)->still_held().ok());
  auto sh = locks.lock_shared(false);
  ASSERT_TRUE(sh.ok());
  EXPECT_FALSE(*sh);
  ASSERT_TRUE(pg_query(url_, "SELECT pg_terminate_backend(" + std::to_string((*ex)->session()->pid) + ")").ok());
  Status s = (*ex)->still_held();
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("was lost"), std::string::npos) << s.ToString();
}

// Compaction's move (Catalog::move_chunks) checks gc's hold inside its transaction, as a save's
// commit does: with the hold's backend gone (another gc may have deleted the new pack since), no
// row moves and the error says why.
TEST_F(PgStoreTest, AMoveOfChunksWhoseGcHoldWasLostMovesNothing) {
  Fixture a("hd128-f16-f16-faoff.slot");
  auto store = open();
  ASSERT_TRUE(store);
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto saved = store->save(*a.file, a.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto rows = store->catalog().chunks_of(saved->info.id);
  ASSERT_TRUE(rows.ok() && rows->size() >= 2) << rows.status().ToString();
  std::vector<ChunkMove> moves;
  for (size_t i = 0; i < 2; ++i)
    moves.push_back({(*rows)[i].sha256, (*rows)[i].location(),
                     BlobLocation{"00000000000000fe", i * (*rows)[0].stored_size, (*rows)[i].stored_size}});
  PgGcLocks locks(url_);
  auto ex = locks.lock_exclusive(true);
  ASSERT_TRUE(ex.ok() && *ex) << ex.status().ToString();
  const std::string pid = std::to_string((*ex)->session()->pid);
  ASSERT_TRUE(pg_query(url_, "SELECT pg_terminate_backend(" + pid + ")").ok());
  // pg_terminate_backend only signals: the backend (and its advisory lock) goes a moment later.
  bool gone = false;
  for (int i = 0; i < 1000 && !gone; ++i) {
    auto r = pg_query(url_, "SELECT count(*) FROM pg_stat_activity WHERE pid = " + pid);
    gone = r.ok() && !r->empty() && (*r)[0][0] == "0";
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(gone) << "backend " << pid << " still there after 10 s";
  Status s = store->catalog().move_chunks(moves, **ex);
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("was lost"), std::string::npos) << s.ToString();
  auto after = store->catalog().chunks_of(saved->info.id);
  ASSERT_TRUE(after.ok());
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ((*after)[i].pack, (*rows)[i].pack) << "a row moved under a lost hold";
  ex->reset();
  auto fresh = locks.lock_exclusive(true);  // the same move under a live hold goes through
  ASSERT_TRUE(fresh.ok() && *fresh) << fresh.status().ToString();
  EXPECT_TRUE(store->catalog().move_chunks(moves, **fresh).ok());
  EXPECT_EQ((*store->catalog().chunks_of(saved->info.id))[0].pack, "00000000000000fe");
}

// The commit fence: a new exclusive hold waits for a save's commit
// transaction in flight (one that holds the fence) before it returns.
TEST_F(PgStoreTest, AnExclusiveHoldWaitsForCommitsInFlight) {
  PGconn* c = PQconnectdb(url_.c_str());
  ASSERT_EQ(PQstatus(c), CONNECTION_OK);
  auto run = [&](const std::string& sql) {
    PGresult* r = PQexec(c, sql.c_str());
    EXPECT_TRUE(PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK) << PQerrorMessage(c);
    PQclear(r);
  };
  run("BEGIN");
  run("SELECT pg_advisory_xact_lock_shared(" + std::to_string(PgGcLocks::kCommitFenceKey) + ")");
  PgGcLocks locks(url_);
  auto waiting = std::async(std::launch::async, [&] { return locks.lock_exclusive(true); });
  // The gc lock itself is granted at once (no save holds it); the fence is what it waits for.
  for (int i = 0; i < 2000; ++i) {
    auto r = pg_query(url_, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND NOT granted");
    if (r.ok() && (*r)[0][0] == "1") break;
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(waiting.wait_for(0ms), std::future_status::timeout) << "gc went ahead of a commit in flight";
  run("COMMIT");
  auto got = waiting.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got);
  PQfinish(c);
}

// The store-level cap scenario of store_test.cc, on the PostgreSQL catalog.
TEST_F(PgStoreTest, CapEnforcedWithPinsKept) {
  auto store = open();
  ASSERT_TRUE(store);
  test::cap_enforced_with_pins_kept(*store);
}

// Key rotation on PostgreSQL (docs/store.md, "Key rotation"): two tenants rotated, the first run
// stopped after its first swap as a crash would leave it, the same rekey again finishes; every
// snapshot restores byte for byte with the new key, verify is clean, the old key is refused.
TEST_F(PgStoreTest, RekeyRotatesEveryTenantAndAStoppedRunResumes) {
  crypt_bed::Bed keys;  // its key files only: the store is this database and dir_
  auto key = [&](const std::filesystem::path& p) { return std::optional<MasterKey>(*load_key_file(p.string())); };
  crypt_bed::Loaded l = crypt_bed::load(crypt_bed::fixtures() / crypt_bed::kSlot);
  const std::string want(reinterpret_cast<const char*>(l.bytes.data()), l.bytes.size());
  std::vector<std::pair<int64_t, std::string>> saved;  // id, tenant
  for (const char* tenant : {"alice", "alice", "bob"}) {
    auto s = must(open_keyed(nullptr, key(keys.key_a), tenant));
    ASSERT_TRUE(s);
    auto r = s->save(*l.file, l.state, crypt_bed::small_chunks());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    saved.emplace_back(r->info.id, tenant);
  }
  RekeyOptions stop;
  stop.test_hook = [](std::string_view step) { return step == "swapped" ? Status::IOError("killed") : Status::OK(); };
  ASSERT_FALSE(must(open_keyed(nullptr, key(keys.key_a), "alice"))->rekey(*key(keys.key_b), stop).ok());
  auto resumed = must(open_keyed(nullptr, key(keys.key_a), "alice"))->rekey(*key(keys.key_b));
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_TRUE(resumed->resumed);
  EXPECT_EQ(resumed->rekeyed, 2u) << "the first run swapped one";
  for (const auto& [id, tenant] : saved) {
    auto s = must(open_keyed(nullptr, key(keys.key_b), tenant));
    ASSERT_TRUE(s);
    EXPECT_EQ(crypt_bed::restore_all(*s, std::to_string(id)), want) << "snapshot " << id;
    auto v = s->verify({});
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  }
  auto old_key = open_keyed(nullptr, key(keys.key_a), "alice");
  ASSERT_FALSE(old_key.ok());
  EXPECT_EQ(old_key.status().code(), Code::kMismatch);
}

// A restore's hold on PostgreSQL (the shared advisory lock): a restore that read its rows before
// rekey swapped them, or before an rm, still reads their packs; the gc beside it is skipped.
TEST_F(PgStoreTest, ARestoreBesideRekeyAndGcKeepsThePacksItReads) {
  crypt_bed::Bed keys;
  read_race::restore_beside_rekey_and_gc(keys, alice());
}

TEST_F(PgStoreTest, ARestoreBesideRmOfItsSnapshotFinishes) {
  crypt_bed::Bed keys;
  read_race::restore_beside_rm(keys, alice());
}

// A sealed export's name, tags and fingerprint on the PostgreSQL catalog: exported, removed and
// imported back with the key, they are the catalog's again (StoreCrypt.* tests every combination
// on SQLite; the store's code is the same over both catalogs).
TEST_F(PgStoreTest, ASealedExportKeepsItsLabelsThroughImport) {
  const std::vector<uint8_t> raw(32, 0x5c);
  auto key = MasterKey::from_bytes(raw);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto store = must(open_keyed(nullptr, *key, "alice"));
  ASSERT_TRUE(store);
  Fixture f("hybrid-f16-f16-faon.slot");
  SaveRequest req;
  req.name = "labelled";
  req.tags = {{"project", "zebra"}};
  req.model_fingerprint = "fp-zebra";
  auto saved = store->save(*f.file, f.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const std::string archive = dir_ + "/sealed.tar.zst";
  ASSERT_TRUE(store->export_to({"labelled"}, archive).ok());
  ASSERT_TRUE(store->remove("labelled").ok());
  auto in = store->import_from(archive);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->imported.size(), 1u);
  auto id = store->catalog().resolve("labelled");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto back = store->catalog().get_info(*id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->uuid, saved->info.uuid);
  EXPECT_EQ(back->tags, req.tags);
  EXPECT_EQ(back->model_fingerprint, "fp-zebra");
  EXPECT_EQ(back->created, saved->info.created);
  EXPECT_EQ(back->tenant, "alice");
  auto v = store->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
}

}  // namespace
}  // namespace kvsnap
