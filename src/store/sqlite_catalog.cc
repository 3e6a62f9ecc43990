// SqliteCatalog, the embedded catalog (sqlite_catalog.h), its core: the schema
// and its migrations, opening the database, transactions, the statement cache,
// and the snapshot records themselves (add, remove, get, resolve, list). The prefix index is in
// sqlite_catalog_prefix.cc, gc / stats / integrity in sqlite_catalog_gc.cc,
// shared helpers in sqlite_catalog_internal.h.
#include "store/sqlite_catalog.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <bit>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <set>
#include <thread>

#include "base/io.h"
#include "base/os.h"
#include "base/sha256.h"
#include "store/sqlite_catalog_internal.h"

namespace kvsnap {

using namespace catalog_detail;

namespace {

// ---------------------------------------------------------------- schema

// Migration i takes user_version i to i + 1. Append, never edit.
const char* const kMigrations[] = {
    // v1
    R"sql(
CREATE TABLE snapshots(
  id                INTEGER PRIMARY KEY,
  uuid              TEXT NOT NULL UNIQUE,
  name              TEXT UNIQUE,
  created           TEXT NOT NULL,
  model_arch        TEXT NOT NULL DEFAULT '',
  model_fingerprint TEXT NOT NULL DEFAULT '',
  n_tokens          INTEGER NOT NULL,
  k_types           TEXT NOT NULL DEFAULT '',
  v_types           TEXT NOT NULL DEFAULT '',
  v_trans           INTEGER NOT NULL DEFAULT 0,
  source_format     TEXT NOT NULL DEFAULT '',
  raw_bytes         INTEGER NOT NULL,
  stored_bytes      INTEGER NOT NULL,
  lossy             TEXT,
  parent_id         INTEGER REFERENCES snapshots(id) ON DELETE SET NULL,
  content_sha256    TEXT,
  n_chunks          INTEGER NOT NULL,
  anchor_len        INTEGER NOT NULL,
  anchor_hash       BLOB NOT NULL,
  full_hash         BLOB NOT NULL
);
CREATE INDEX snapshots_created ON snapshots(created, id);
CREATE INDEX snapshots_model ON snapshots(model_fingerprint, created, id);
CREATE INDEX snapshots_parent ON snapshots(parent_id);
CREATE INDEX snapshots_anchor ON snapshots(anchor_len, anchor_hash, n_tokens, full_hash);
CREATE INDEX snapshots_full ON snapshots(n_tokens, full_hash);
CREATE TABLE snapshot_blobs(
  snapshot_id INTEGER PRIMARY KEY REFERENCES snapshots(id) ON DELETE CASCADE,
  manifest    BLOB NOT NULL,
  tokens      BLOB NOT NULL
);
CREATE TABLE tags(
  snapshot_id INTEGER NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
  key         TEXT NOT NULL,
  value       TEXT NOT NULL,
  PRIMARY KEY(snapshot_id, key)
) WITHOUT ROWID;
CREATE INDEX tags_kv ON tags(key, value);
CREATE TABLE chunks(
  sha256      BLOB PRIMARY KEY CHECK(length(sha256) = 32),
  raw_size    INTEGER NOT NULL,
  stored_size INTEGER NOT NULL,
  refcount    INTEGER NOT NULL CHECK(refcount >= 0)
) WITHOUT ROWID;
CREATE INDEX chunks_unreferenced ON chunks(refcount) WHERE refcount = 0;
CREATE TABLE snapshot_chunks(
  snapshot_id INTEGER NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
  idx         INTEGER NOT NULL,
  sha256      BLOB NOT NULL REFERENCES chunks(sha256),
  PRIMARY KEY(snapshot_id, idx)
) WITHOUT ROWID;
CREATE INDEX snapshot_chunks_sha ON snapshot_chunks(sha256);
)sql",
    // v2: pack files. NULL pack: a loose blob under chunks/ (stores made before v2).
    R"sql(
ALTER TABLE chunks ADD COLUMN pack TEXT;
ALTER TABLE chunks ADD COLUMN pack_offset INTEGER;
CREATE INDEX chunks_pack ON chunks(pack) WHERE pack IS NOT NULL;
)sql",
    // v3: eviction (eviction.h): pins, expiry and the last restore, ISO 8601 UTC like created.
    R"sql(
ALTER TABLE snapshots ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN expires_at TEXT;
ALTER TABLE snapshots ADD COLUMN last_restored TEXT;
)sql",
    // v4: encryption at rest (docs/store.md): the store's settings ("encryption" = the master
    // key id) and each encrypted snapshot's tenant and key ids (hex). NULL tenant: plain.
    R"sql(
CREATE TABLE IF NOT EXISTS store_meta(
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
ALTER TABLE snapshots ADD COLUMN tenant TEXT;
ALTER TABLE snapshots ADD COLUMN master_key_id TEXT;
ALTER TABLE snapshots ADD COLUMN tenant_key_id TEXT;
)sql",
    // v5: expired_snapshots() (every gc) walks an index of the snapshots that expire, in expiry
    // order, instead of reading every snapshot row. Partial: most snapshots never expire.
    R"sql(
CREATE INDEX snapshots_expires ON snapshots(expires_at, id) WHERE expires_at IS NOT NULL;
)sql",
};
constexpr int kNumMigrations = sizeof(kMigrations) / sizeof(kMigrations[0]);
static_assert(kNumMigrations == SqliteCatalog::kSchemaVersion, "one migration per schema version");

}  // namespace

// ---------------------------------------------------------------- statements

Result<SqliteCatalog::Stmt> SqliteCatalog::stmt(const char* sql) {
  auto it = stmts_.find(sql);
  if (it == stmts_.end()) {
    sqlite3_stmt* s = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr);
    if (rc != SQLITE_OK) return sqlite_error(rc, std::string("prepare ") + sql);
    it = stmts_.emplace(sql, CachedStmt{s, false}).first;
  }
  // Already stepping elsewhere (a nested use of the same SQL): a private copy.
  if (it->second.in_use) return stmt_once(sql);
  it->second.in_use = true;
  return Stmt(*this, it->second.stmt, &it->second.in_use);
}

Result<SqliteCatalog::Stmt> SqliteCatalog::stmt_once(const std::string& sql) {
  sqlite3_stmt* s = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr);
  if (rc != SQLITE_OK) return sqlite_error(rc, "prepare " + sql);
  return Stmt(*this, s, nullptr);
}

// Reads KV_INFO_COLS starting at column 0 (tags are loaded separately).
SnapshotInfo SqliteCatalog::info_from_row(const Stmt& st) {
  SnapshotInfo i;
  i.id = st.col_i64(0);
  i.uuid = st.col_text(1);
  if (!st.is_null(2)) i.name = st.col_text(2);
  i.created = st.col_text(3);
  i.model_arch = st.col_text(4);
  i.model_fingerprint = st.col_text(5);
  i.n_tokens = st.col_i64(6);
  i.k_types = st.col_text(7);
  i.v_types = st.col_text(8);
  i.v_trans = st.col_i64(9) != 0;
  i.source_format = st.col_text(10);
  i.raw_bytes = static_cast<uint64_t>(st.col_i64(11));
  i.stored_bytes = static_cast<uint64_t>(st.col_i64(12));
  i.lossy = st.col_text(13);
  if (!st.is_null(14)) i.parent_id = st.col_i64(14);
  i.content_sha256 = st.col_text(15);
  i.n_chunks = st.col_i64(16);
  i.pinned = st.col_i64(17) != 0;
  if (!st.is_null(18)) i.expires_at = st.col_text(18);
  if (!st.is_null(19)) i.last_restored = st.col_text(19);
  if (!st.is_null(20)) i.tenant = st.col_text(20);
  i.master_key_id = st.col_text(21);
  i.tenant_key_id = st.col_text(22);
  return i;
}

// ---------------------------------------------------------------- open, errors, transactions

Result<std::unique_ptr<SqliteCatalog>> SqliteCatalog::open(const std::string& path, const CatalogOptions& options) {
  sqlite3* db = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE;
  int rc = sqlite3_open_v2(path.c_str(), &db, flags, options.vfs.empty() ? nullptr : options.vfs.c_str());
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close_v2(db);
    return Status::IOError(path + ": cannot open the catalog: " + msg);
  }
  std::unique_ptr<SqliteCatalog> c(new SqliteCatalog(db, path, options));
  sqlite3_busy_timeout(db, options.busy_timeout_ms);
  // The WAL and its index (-wal, -shm) stay when the last connection closes instead of being
  // removed and made again by the next command: on a full disk the next `ls` could not make the
  // index (its 32 KiB) and no command could open the store, not even `rm` to free space.
  int persist = 1;
  sqlite3_file_control(db, "main", SQLITE_FCNTL_PERSIST_WAL, &persist);
  // journal_mode=WAL needs a moment of exclusivity the first time; retry like a write.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.busy_timeout_ms);
  for (;;) {
    sqlite3_stmt* st = nullptr;
    rc = sqlite3_prepare_v2(db, "PRAGMA journal_mode=WAL", -1, &st, nullptr);
    if (rc == SQLITE_OK) rc = sqlite3_step(st);
    const unsigned char* text = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : nullptr;
    std::string mode = text ? lower(reinterpret_cast<const char*>(text)) : "";
    sqlite3_finalize(st);
    if (rc == SQLITE_ROW) {
      if (mode != "wal") {
        return Status::NotSupported(path + ": the catalog needs SQLite's WAL mode, got '" + mode +
                                    "' (a network file system?)");
      }
      break;
    }
    int primary = rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || std::chrono::steady_clock::now() > deadline) {
      return c->sqlite_error(rc, "PRAGMA journal_mode=WAL");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  KV_RETURN_IF_ERROR(c->exec(options.durable_commits ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
  // macOS: SQLite's syncs become F_FULLFSYNC (its fsync leaves the data in the drive's cache; base/os.h
  // sync_fd does the same for kvsnap's own files). Commits only when they are durable; checkpoints
  // always, since they are what make the database file itself durable. Other systems' VFSes see a
  // SQLITE_SYNC_FULL flag and do what they do for any sync (catalog_test checks the flag).
  KV_RETURN_IF_ERROR(c->exec(options.durable_commits ? "PRAGMA fullfsync=ON" : "PRAGMA fullfsync=OFF"));
  KV_RETURN_IF_ERROR(c->exec("PRAGMA checkpoint_fullfsync=ON"));
  KV_RETURN_IF_ERROR(c->exec("PRAGMA foreign_keys=ON"));
  // What a persistent WAL keeps of its largest transaction (a rekey, a large import) once it is
  // checkpointed: at most 1 MiB.
  KV_RETURN_IF_ERROR(c->exec("PRAGMA journal_size_limit=1048576"));
  // 32 MiB of page cache (default 2 MiB): the prefix and list indexes of
  // 100,000 snapshots stay in memory across the queries of one process.
  KV_RETURN_IF_ERROR(c->exec("PRAGMA cache_size=-32768"));
  KV_RETURN_IF_ERROR(c->migrate());
  c->reserve_bytes_ = c->room_reserve_wanted();
  if (options.upgrade_schema) c->keep_room_reserve();
  return c;
}

std::optional<uint64_t> SqliteCatalog::free_bytes_beside() {
  auto free = io().free_bytes(dir_of(path_));
  return free.ok() ? *free : std::nullopt;
}

uint64_t SqliteCatalog::room_reserve_wanted() const {
  const uint64_t least = options_.room_reserve_bytes;
  if (least == 0) return 0;
  // A removal of a snapshot that makes up most of the catalog writes WAL frames for nearly every
  // page, and the catalog grows by its gc's queue: 77 MB of WAL and 11 MB of growth for a catalog
  // of 81 MB that held one snapshot of 262,146 chunks. So 1.25x the catalog as it opened.
  struct stat st {};
  const uint64_t size = ::stat(path_.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  return std::max(least, size + size / 4);
}

void SqliteCatalog::keep_room_reserve() {
  const uint64_t want = reserve_bytes_;
  if (want == 0) return;
  struct stat st {};
  if (::lstat(reserve_path().c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) >= want)) {
    return;  // there (or something not ours by that name, left alone)
  }
  const std::optional<uint64_t> free = free_bytes_beside();
  if (!free || *free / 4 < want) return;  // the last of the disk is not taken for it
  const int fd = ::open(reserve_path().c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const int err = allocate_space(fd, want);
  ::close(fd);
  // A file system that cannot allocate: no reserve rather than a file of nothing
  if (err != 0) ::unlink(reserve_path().c_str());
}

void SqliteCatalog::release_room_reserve_if_short() {
  const uint64_t want = reserve_bytes_;
  if (want == 0) return;
  const std::optional<uint64_t> free = free_bytes_beside();
  if (!free || *free / 2 >= want) return;
  (void)io().remove(reserve_path());  // not there (never made, or another process gave it up): nothing to do
}

Result<std::unique_ptr<Catalog>> Catalog::open(const std::string& path, const CatalogOptions& options) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<SqliteCatalog> c, SqliteCatalog::open(path, options));
  return std::unique_ptr<Catalog>(std::move(c));
}

SqliteCatalog::~SqliteCatalog() {
  for (auto& [sql, s] : stmts_) sqlite3_finalize(s.stmt);
  sqlite3_close_v2(db_);
}

Status SqliteCatalog::sqlite_error(int rc, const std::string& what) {
  std::string msg = path_ + ": " + sqlite3_errmsg(db_) + " (" + what.substr(0, 80) + ")";
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return Status::Corruption(path_ + ": the catalog is damaged or not a kvsnap catalog: " + sqlite3_errmsg(db_));
    case SQLITE_CONSTRAINT:
      return Status::InvalidArgument(msg);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Status::IOError(path_ + ": the catalog is busy: another kvsnap process kept it locked for more than " +
                             std::to_string(options_.busy_timeout_ms / 1000) + " s");
    default:
      return Status::IOError(msg);
  }
}

Status SqliteCatalog::exec(const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  sqlite3_free(err);
  if (rc != SQLITE_OK) return sqlite_error(rc, sql);
  return Status::OK();
}

// BEGIN IMMEDIATE takes the write lock up front, so a transaction never has to
// upgrade a read lock (which in WAL mode fails with SQLITE_BUSY without
// waiting). The busy handler waits inside each attempt; the loop covers the
// cases where SQLite returns BUSY without calling it.
Status SqliteCatalog::begin_immediate() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.busy_timeout_ms);
  std::minstd_rand jitter(static_cast<unsigned>(reinterpret_cast<uintptr_t>(this)));
  for (int attempt = 0;; ++attempt) {
    int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) return Status::OK();
    int primary = rc & 0xff;
    if ((primary != SQLITE_BUSY && primary != SQLITE_LOCKED) || std::chrono::steady_clock::now() > deadline) {
      return sqlite_error(rc, "BEGIN IMMEDIATE");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 + jitter() % (1000 << std::min(attempt, 5))));
  }
}

Status SqliteCatalog::commit() {
  int rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  if (rc == SQLITE_OK) return Status::OK();
  Status s = sqlite_error(rc, "COMMIT");
  rollback();
  return s;
}

void SqliteCatalog::rollback() {
  // After some errors (I/O, full disk) SQLite has already rolled back.
  if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

Result<int> SqliteCatalog::schema_version() {
  KV_ASSIGN_OR_RETURN(Stmt st, stmt("PRAGMA user_version"));
  KV_ASSIGN_OR_RETURN(bool row, st.step());
  return row ? static_cast<int>(st.col_i64(0)) : 0;
}

static Status too_new(const std::string& path, int v) { return schema_too_new(path, v, SqliteCatalog::kSchemaVersion); }

Status SqliteCatalog::migrate() {
  KV_ASSIGN_OR_RETURN(int v, schema_version());
  if (v > kSchemaVersion) return too_new(path_, v);
  if (v == kSchemaVersion) return Status::OK();
  if (!options_.upgrade_schema) return schema_not_upgraded(path_, v, kSchemaVersion);
  return write_txn([&]() -> Status {
    // Read again under the write lock: another process may have migrated.
    KV_ASSIGN_OR_RETURN(int now, schema_version());
    if (now > kSchemaVersion) return too_new(path_, now);
    for (int i = now; i < kSchemaVersion; ++i) {
      KV_RETURN_IF_ERROR(exec(kMigrations[i]).Prefixed("migrating the catalog to version " + std::to_string(i + 1)));
    }
    std::string set = "PRAGMA user_version = " + std::to_string(kSchemaVersion);
    return exec(set.c_str());
  });
}

Result<std::optional<std::string>> SqliteCatalog::get_meta(const std::string& key) {
  KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT value FROM store_meta WHERE key = ?1"));
  q.text(1, key);
  KV_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(q.col_text(0));
}

Result<std::optional<std::string>> SqliteCatalog::any_sealed_key_id() {
  KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT master_key_id FROM snapshots WHERE tenant IS NOT NULL LIMIT 1"));
  KV_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(q.is_null(0) ? std::string() : q.col_text(0));
}

Result<std::string> SqliteCatalog::init_meta(const std::string& key, const std::string& value) {
  std::string now;
  KV_RETURN_IF_ERROR(write_txn([&]() -> Status {
    {
      KV_ASSIGN_OR_RETURN(Stmt ins, stmt("INSERT INTO store_meta(key, value) VALUES(?1, ?2) ON CONFLICT(key) DO NOTHING"));
      ins.text(1, key).text(2, value);
      KV_RETURN_IF_ERROR(ins.run());
    }
    KV_ASSIGN_OR_RETURN(std::optional<std::string> v, get_meta(key));
    now = v.value_or("");
    return Status::OK();
  }));
  return now;
}

// ---------------------------------------------------------------- add / remove

Result<SnapshotInfo> SqliteCatalog::add_snapshot(SnapshotRecord rec, const std::vector<ChunkUse>& chunks) {
  SnapshotInfo& info = rec.info;
  KV_ASSIGN_OR_RETURN(PrefixKey key, prepare_snapshot(rec, chunks.size(), keying()));
  const std::vector<std::byte>& tok = key.tokens;

  Status s = write_txn([&]() -> Status {
    KV_RETURN_IF_ERROR(check_row_key(info));
    if (info.name) {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT id FROM snapshots WHERE name = ?1"));
      q.text(1, *info.name);
      KV_ASSIGN_OR_RETURN(bool taken, q.step());
      if (taken) {
        return name_taken(*info.name, q.col_i64(0));
      }
    }
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT id FROM snapshots WHERE uuid = ?1"));
      q.text(1, info.uuid);
      KV_ASSIGN_OR_RETURN(bool taken, q.step());
      if (taken) {
        return uuid_taken(info.uuid, q.col_i64(0));
      }
    }
    if (info.parent_id) {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT 1 FROM snapshots WHERE id = ?1"));
      q.i64(1, *info.parent_id);
      KV_ASSIGN_OR_RETURN(bool found, q.step());
      // Removed since the save found it (rm, expiry, another save's caps): recorded as none, as
      // ON DELETE SET NULL does for one removed after; its chunks are this snapshot's own uses.
      if (!found) info.parent_id.reset();
    }
    // An id is never given twice (a script holding an id from `save --json` must not restore another
    // conversation after a rm or an eviction): past the highest id ever given, which store_meta
    // keeps, since an INTEGER PRIMARY KEY without AUTOINCREMENT takes max(id) + 1 (PostgreSQL's
    // identity column never goes back).
    int64_t id = 0;
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT max(coalesce((SELECT max(id) FROM snapshots), 0), "
                                       "coalesce((SELECT CAST(value AS INTEGER) FROM store_meta WHERE key = 'last_snapshot_id'), 0))"));
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      id = (row ? q.col_i64(0) : 0) + 1;
      KV_ASSIGN_OR_RETURN(Stmt set, stmt("INSERT INTO store_meta(key, value) VALUES('last_snapshot_id', ?1) "
                                         "ON CONFLICT(key) DO UPDATE SET value = excluded.value"));
      set.text(1, std::to_string(id));
      KV_RETURN_IF_ERROR(set.run());
    }
    {
      KV_ASSIGN_OR_RETURN(
          Stmt ins, stmt("INSERT INTO snapshots(uuid, name, created, model_arch, model_fingerprint, n_tokens, k_types, "
                         "v_types, v_trans, source_format, raw_bytes, stored_bytes, lossy, parent_id, content_sha256, "
                         "n_chunks, anchor_len, anchor_hash, full_hash, pinned, expires_at, tenant, master_key_id, tenant_key_id, id) "
                         "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, "
                         "?22, ?23, ?24, ?25)"));
      ins.i64(25, id);
      ins.text(1, info.uuid).opt_text(2, info.name).text(3, info.created).text(4, info.model_arch);
      ins.text(5, info.model_fingerprint).i64(6, info.n_tokens).text(7, info.k_types).text(8, info.v_types);
      ins.i64(9, info.v_trans ? 1 : 0).text(10, info.source_format);
      ins.i64(11, static_cast<int64_t>(info.raw_bytes)).i64(12, static_cast<int64_t>(info.stored_bytes));
      ins.opt_text(13, info.lossy.empty() ? std::nullopt : std::optional<std::string>(info.lossy));
      if (info.parent_id) ins.i64(14, *info.parent_id);
      ins.opt_text(15, info.content_sha256.empty() ? std::nullopt : std::optional<std::string>(info.content_sha256));
      ins.i64(16, info.n_chunks).i64(17, key.anchor_len).blob(18, key.anchor_hash).blob(19, key.full_hash);
      ins.i64(20, info.pinned ? 1 : 0).opt_text(21, info.expires_at).opt_text(22, info.tenant);
      if (info.tenant) ins.text(23, info.master_key_id).text(24, info.tenant_key_id);
      KV_RETURN_IF_ERROR(ins.run());
    }
    info.id = id;
    {
      KV_ASSIGN_OR_RETURN(Stmt ins, stmt("INSERT INTO snapshot_blobs(snapshot_id, manifest, tokens) VALUES(?1, ?2, ?3)"));
      ins.i64(1, info.id).blob(2, rec.manifest).blob(3, tok);
      KV_RETURN_IF_ERROR(ins.run());
    }
    for (const auto& [k, v] : info.tags) {
      KV_ASSIGN_OR_RETURN(Stmt ins, stmt("INSERT INTO tags(snapshot_id, key, value) VALUES(?1, ?2, ?3)"));
      ins.i64(1, info.id).text(2, k).text(3, v);
      KV_RETURN_IF_ERROR(ins.run());
    }
    return add_chunk_uses(info.id, chunks);
  });
  if (!s.ok()) return s;
  return std::move(info);
}

Result<std::vector<ChunkHash>> SqliteCatalog::remove_snapshot_if(int64_t id, const RemovalCheck& check) {
  std::vector<ChunkHash> freed;
  Status s = write_txn([&]() -> Status {
    freed.clear();
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT pinned, expires_at, last_restored FROM snapshots WHERE id = ?1"));
      q.i64(1, id);
      KV_ASSIGN_OR_RETURN(bool found, q.step());
      if (!found) return no_snapshot(id);
      const std::optional<std::string> expires = q.is_null(1) ? std::nullopt : std::optional<std::string>(q.col_text(1));
      const std::optional<std::string> restored =
          q.is_null(2) ? std::nullopt : std::optional<std::string>(q.col_text(2));
      KV_RETURN_IF_ERROR(removal_allowed(id, q.col_i64(0) != 0, expires, restored, check));
    }
    KV_RETURN_IF_ERROR(drop_chunk_uses(id, freed));
    KV_ASSIGN_OR_RETURN(Stmt del, stmt("DELETE FROM snapshots WHERE id = ?1"));
    del.i64(1, id);
    return del.run();  // tags and blobs go by ON DELETE CASCADE
  });
  if (!s.ok()) return s;
  return freed;
}

// ---------------------------------------------------------------- reading

// The row and its tags, the record and its blobs: several statements, one read transaction (a
// removal committed between them would give a row without tags or without its manifest).
Result<SnapshotInfo> SqliteCatalog::get_info(int64_t id) {
  SnapshotInfo info;
  KV_RETURN_IF_ERROR(read_txn([&]() -> Status {
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT " KV_INFO_COLS " FROM snapshots s WHERE s.id = ?1"));
      q.i64(1, id);
      KV_ASSIGN_OR_RETURN(bool found, q.step());
      if (!found) return no_snapshot(id);
      info = info_from_row(q);
    }
    KV_ASSIGN_OR_RETURN(Stmt t, stmt("SELECT key, value FROM tags WHERE snapshot_id = ?1"));
    t.i64(1, id);
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, t.step());
      if (!row) break;
      info.tags.emplace(t.col_text(0), t.col_text(1));
    }
    return Status::OK();
  }));
  return info;
}

Result<SnapshotRecord> SqliteCatalog::get(int64_t id) {
  SnapshotRecord rec;
  KV_RETURN_IF_ERROR(read_txn([&]() -> Status {
    KV_ASSIGN_OR_RETURN(rec.info, get_info(id));
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT manifest, tokens FROM snapshot_blobs WHERE snapshot_id = ?1"));
    q.i64(1, id);
    KV_ASSIGN_OR_RETURN(bool found, q.step());
    if (!found) return Status::Corruption(path_ + ": snapshot " + std::to_string(id) + " has no manifest row");
    auto m = q.col_blob(0);
    rec.manifest.assign(m.begin(), m.end());
    auto t = q.col_blob(1);
    if (rec.info.tenant) {
      rec.sealed_tokens.assign(t.begin(), t.end());  // the store opens them (and checks their size)
      return Status::OK();
    }
    if (t.size() != static_cast<size_t>(rec.info.n_tokens) * 4) {
      return Status::Corruption(path_ + ": snapshot " + std::to_string(id) + " stores " + std::to_string(t.size()) +
                                " token bytes for " + std::to_string(rec.info.n_tokens) + " tokens");
    }
    rec.tokens = tokens_from_le(t);
    return Status::OK();
  }));
  return rec;
}

Result<SnapshotRows> SqliteCatalog::get_with_chunks(int64_t id) {
  SnapshotRows rows;
  KV_RETURN_IF_ERROR(read_txn([&]() -> Status {
    KV_ASSIGN_OR_RETURN(rows.record, get(id));
    if (options_.between_reads_for_test) options_.between_reads_for_test();
    KV_ASSIGN_OR_RETURN(rows.chunks, chunks_of(id));
    return Status::OK();
  }));
  return rows;
}

// A chunks row as (sha256, raw_size, stored_size, pack, pack_offset); false when the hash is malformed.
Result<std::vector<ChunkUse>> SqliteCatalog::chunks_of(int64_t id) {
  KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT c.sha256, c.raw_size, c.stored_size, c.pack, c.pack_offset "
                                   "FROM snapshot_chunks sc JOIN chunks c ON c.sha256 = sc.sha256 "
                                   "WHERE sc.snapshot_id = ?1 ORDER BY sc.idx"));
  q.i64(1, id);
  std::vector<ChunkUse> out;
  for (;;) {
    KV_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) break;
    ChunkUse u;
    if (!read_chunk_row(q, u)) return Status::Corruption(path_ + ": malformed chunk hash in snapshot " + std::to_string(id));
    out.push_back(u);
  }
  return out;
}

Result<std::optional<ChunkUse>> SqliteCatalog::find_chunk(const ChunkHash& h) {
  KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT sha256, raw_size, stored_size, pack, pack_offset FROM chunks WHERE sha256 = ?1"));
  q.blob(1, h.bytes);
  KV_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return std::optional<ChunkUse>();
  ChunkUse u;
  if (!read_chunk_row(q, u)) return Status::Corruption(path_ + ": malformed chunk hash " + h.hex());
  return std::optional<ChunkUse>(std::move(u));
}

// Each statement binds up to kSqliteLookupBatch hashes; placeholders left unbound are NULL and match nothing.
constexpr int kSqliteLookupBatch = 64;

static const std::string& chunks_in_sql() {
  static const std::string sql = [] {
    std::string s = "SELECT sha256, raw_size, stored_size, pack, pack_offset FROM chunks WHERE sha256 IN (";
    for (int i = 1; i <= kSqliteLookupBatch; ++i) s += (i > 1 ? ", ?" : "?") + std::to_string(i);
    return s + ")";
  }();
  return sql;
}

Result<std::vector<std::optional<ChunkUse>>> SqliteCatalog::find_chunks(std::span<const ChunkHash> hashes) {
  std::map<ChunkHash, ChunkUse> found;
  for (size_t at = 0; at < hashes.size(); at += kSqliteLookupBatch) {
    KV_ASSIGN_OR_RETURN(Stmt q, stmt(chunks_in_sql().c_str()));
    const size_t n = std::min<size_t>(kSqliteLookupBatch, hashes.size() - at);
    for (size_t i = 0; i < n; ++i) q.blob(static_cast<int>(i + 1), hashes[at + i].bytes);
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      ChunkUse u;
      if (!read_chunk_row(q, u)) return Status::Corruption(path_ + ": malformed chunk hash in the chunks table");
      found.emplace(u.sha256, std::move(u));
    }
  }
  std::vector<std::optional<ChunkUse>> out;
  out.reserve(hashes.size());
  for (const ChunkHash& h : hashes) {
    auto it = found.find(h);
    out.push_back(it == found.end() ? std::nullopt : std::optional<ChunkUse>(it->second));
  }
  return out;
}

Result<int64_t> SqliteCatalog::resolve(const std::string& ref) {
  if (ref.empty()) return Status::InvalidArgument("an empty snapshot reference");
  // A whole uuid names the row of that uuid and nothing else: no name reads as one
  // (check_snapshot_labels), so a row named like one was written by someone else (to have another
  // snapshot restored in its place).
  if (auto uuid = canonical_snapshot_uuid(ref); uuid.ok()) {
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT id FROM snapshots WHERE uuid = ?1"));
    q.text(1, *uuid);
    KV_ASSIGN_OR_RETURN(bool found, q.step());
    if (found) return q.col_i64(0);
    return unresolved(ref, "the store at " + std::filesystem::path(path_).parent_path().string());
  }
  {
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT id FROM snapshots WHERE name = ?1"));
    q.text(1, ref);
    KV_ASSIGN_OR_RETURN(bool found, q.step());
    if (found) return q.col_i64(0);
  }
  if (all_digits(ref) && ref.size() <= 18) {
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT id FROM snapshots WHERE id = ?1"));
    q.i64(1, std::stoll(ref));
    KV_ASSIGN_OR_RETURN(bool found, q.step());
    if (found) return q.col_i64(0);
  }
  std::string p = lower(ref);
  bool hexish = uuid_like(p);
  if (hexish && p.size() >= 6) {
    // [p, p with its last character bumped) is exactly the uuids starting with p.
    std::string hi = p;
    hi.back() = static_cast<char>(hi.back() + 1);
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT id, uuid, name FROM snapshots WHERE uuid >= ?1 AND uuid < ?2 "
                                     "ORDER BY uuid LIMIT 6"));
    q.text(1, p).text(2, hi);
    std::vector<std::string> seen;
    int64_t first = 0;
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      if (seen.empty()) first = q.col_i64(0);
      std::string d = q.col_text(1) + " (id " + std::to_string(q.col_i64(0));
      if (!q.is_null(2)) d += ", '" + q.col_text(2) + "'";
      seen.push_back(d + ")");
    }
    if (seen.size() == 1) return first;
    if (seen.size() > 1) return ambiguous_uuid(ref, seen);
  }
  return unresolved(ref, "the store at " + std::filesystem::path(path_).parent_path().string());
}

Result<std::vector<SnapshotInfo>> SqliteCatalog::list(const ListFilter& f) {
  std::string sql = "SELECT " KV_INFO_COLS " FROM snapshots s WHERE 1";
  std::vector<std::string> args;
  auto arg = [&](const std::string& v) {
    args.push_back(v);
    return "?" + std::to_string(args.size());
  };
  if (!f.model_fingerprint.empty()) sql += " AND s.model_fingerprint = " + arg(f.model_fingerprint);
  if (!f.model_arch.empty()) sql += " AND s.model_arch = " + arg(f.model_arch);
  if (!f.name_glob.empty()) sql += " AND s.name GLOB " + arg(f.name_glob);
  if (f.tenant) sql += " AND (s.tenant IS NULL OR s.tenant = " + arg(*f.tenant) + ")";
  if (!f.type.empty()) {
    std::string t = arg("," + f.type + ",");
    sql += " AND (instr(',' || s.k_types || ',', " + t + ") > 0 OR instr(',' || s.v_types || ',', " + t + ") > 0)";
  }
  for (const auto& [k, v] : f.tags) {
    std::string kp = arg(k);
    // IN, not a correlated EXISTS: lets SQLite start from the tags_kv index.
    sql += " AND s.id IN (SELECT t.snapshot_id FROM tags t WHERE t.key = " + kp + " AND t.value = " + arg(v) + ")";
  }
  sql += " ORDER BY s.created DESC, s.id DESC";
  if (f.limit >= 0) sql += " LIMIT " + std::to_string(f.limit);

  std::vector<SnapshotInfo> out;
  // One read transaction: the rows and their tags come from the same moment.
  KV_RETURN_IF_ERROR(exec("BEGIN"));
  Status s = [&]() -> Status {
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt_once(sql));
      for (size_t i = 0; i < args.size(); ++i) q.text(static_cast<int>(i + 1), args[i]);
      for (;;) {
        KV_ASSIGN_OR_RETURN(bool row, q.step());
        if (!row) break;
        out.push_back(info_from_row(q));
      }
    }
    KV_ASSIGN_OR_RETURN(Stmt t, stmt("SELECT key, value FROM tags WHERE snapshot_id = ?1"));
    for (SnapshotInfo& i : out) {
      t.i64(1, i.id);
      for (;;) {
        KV_ASSIGN_OR_RETURN(bool row, t.step());
        if (!row) break;
        i.tags.emplace(t.col_text(0), t.col_text(1));
      }
      t.reset();
    }
    return Status::OK();
  }();
  rollback();
  if (!s.ok()) return s;
  return out;
}

}  // namespace kvsnap
