// The catalog in PostgreSQL: what catalog.h promises, shared by every host
// that points kvsnap at the same database.
//
// Address: a libpq URI, postgresql://user[:password]@host:port/db[?param=...]
// (or a key=value connection string). Messages name it without the password.
// Text (names, tags, model strings) must be valid in the database's encoding
// (UTF-8 for a database created by tests/beds/postgres.sh); other bytes are an
// error from the server, where SQLite would store them.
//
// Same semantics as the SQLite catalog (catalog.h): add_snapshot() and
// remove_snapshot() are each one transaction; refcounts equal the chunk-list
// rows naming a chunk; the prefix index stores the same (anchor_len,
// anchor_hash, n_tokens, full_hash) keys as 16-byte bytea and answers
// find_prefix() by the same band/probe plan, but sends all of a query's
// anchor probes in one statement (a round trip costs more than an index probe)
// and has the server compare the candidates' tokens with the query.
//
// Concurrency (many processes, many hosts). Transactions run at READ COMMITTED
// and take row locks explicitly instead of relying on SERIALIZABLE:
//   - refcounts only ever change by relative, single-statement updates
//     (INSERT .. ON CONFLICT DO UPDATE SET refcount = refcount + n, UPDATE ..
//     SET refcount = refcount - n RETURNING refcount), which lock the chunk row
//     and apply to its newest version, so concurrent saves sharing chunks queue
//     on those rows and every increment counts. SERIALIZABLE would instead abort
//     and retry every save that touches a popular chunk (a shared system
//     prompt's chunks are in nearly every snapshot) while another is in flight.
//   - Chunk rows are locked in hash order (adds insert sorted; removes lock with
//     SELECT .. ORDER BY sha256 FOR UPDATE first), so saves and removes do not
//     deadlock one another; a deadlock or serialization failure the server
//     reports anyway is retried from the start of the transaction.
//   - Name and uuid uniqueness are unique indexes: of two concurrent saves of
//     one name, one gets kInvalidArgument.
//   - Reads that need one consistent view of several statements (find_prefix,
//     integrity_check, gc_candidates) run in a REPEATABLE READ READ ONLY
//     transaction; list (with its tags) and stats are single statements.
//   - A client that dies mid-transaction (kill -9, a lost host) holds nothing
//     once the server notices the connection is gone: the transaction is rolled
//     back whole. (For a host that vanishes without closing its TCP connection
//     that takes the server's tcp_keepalives_* settings.)
//   - Row-lock waits end after CatalogOptions::busy_timeout_ms with kIOError
//     ("the catalog is busy"), as the SQLite catalog's busy timeout does.
//
// Schema (version kSchemaVersion, in table kvsnap_meta(key, value), key
// 'schema_version'; migrations are applied in order in one transaction under an
// advisory lock, so concurrent first opens migrate once; a newer version than
// this code knows is refused with kNotSupported): the
// tables of the SQLite catalog (snapshots, snapshot_blobs, tags, chunks,
// snapshot_chunks) with the same columns and indexes; text that is compared or
// ordered (uuid, name, created, tags) uses COLLATE "C" so ordering and uuid
// prefix ranges do not depend on the database's locale.
//
// gc across hosts: PgGcLocks (pg_gc_locks.h) replaces the local flock with
// advisory locks in the same database.
//
// A PgCatalog object is one connection: use one per thread.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "store/catalog.h"

namespace kvsnap {

class PgConn;

class PgCatalog : public Catalog {
 public:
  static constexpr int kSchemaVersion = 4;
  // expired_snapshots()'s query ($1: now): the snapshots_expires index walked in its own order,
  // no sort (catalog tests EXPLAIN this text).
  static constexpr const char* kExpiredSql =
      "SELECT id FROM snapshots WHERE expires_at <= $1 AND length(expires_at) = length($1) AND NOT pinned "
      "ORDER BY expires_at, id";

  // Connects to `url` and creates or migrates the schema. options:
  // busy_timeout_ms bounds row-lock waits; durable_commits=false sets
  // synchronous_commit=off for this connection (bulk loads); vfs is ignored.
  static Result<std::unique_ptr<PgCatalog>> open(const std::string& url, const CatalogOptions& options = {});
  ~PgCatalog() override;

  // catalog.h's methods, with its promises.
  Result<SnapshotInfo> add_snapshot(SnapshotRecord rec, const std::vector<ChunkUse>& chunks) override;
  // Checks the hold's session (PgGcHold) inside the commit transaction.
  Result<SnapshotInfo> commit_save(SnapshotRecord rec, const std::vector<ChunkUse>& chunks, GcLockHold& hold) override;
  Result<std::vector<ChunkHash>> remove_snapshot_if(int64_t id, const RemovalCheck& check) override;
  Result<SnapshotRecord> get(int64_t id) override;
  Result<SnapshotInfo> get_info(int64_t id) override;
  Result<std::vector<ChunkUse>> chunks_of(int64_t id) override;
  Result<SnapshotRows> get_with_chunks(int64_t id) override;
  Result<std::optional<ChunkUse>> find_chunk(const ChunkHash& h) override;
  // One statement (sha256 = ANY($1)): one round trip however many hashes.
  Result<std::vector<std::optional<ChunkUse>>> find_chunks(std::span<const ChunkHash> hashes) override;
  Result<int64_t> resolve(const std::string& ref) override;
  // name_glob has SQLite GLOB's syntax (* ? [...] [^...]), case-sensitive.
  Result<std::vector<SnapshotInfo>> list(const ListFilter& filter = {}) override;
  Result<std::vector<SnapshotInfo>> find_prefix(std::span<const int32_t> query, const std::string& model_fingerprint = "",
                                                size_t limit = SIZE_MAX) override;
  Result<GcCandidates> gc_candidates(const std::vector<ChunkHash>& on_disk) override;
  Result<std::vector<ChunkHash>> forget_unreferenced(const std::vector<ChunkHash>& hashes) override;
  Result<std::vector<std::string>> unused_packs(const std::vector<std::string>& packs) override;
  Result<std::map<std::string, uint64_t>> live_packs() override;
  Result<std::vector<PackUsage>> pack_usage(const std::vector<std::string>& packs) override;
  Result<std::vector<ChunkUse>> chunks_in_pack(const std::string& pack) override;
  Status move_chunks(const std::vector<ChunkMove>& moves, GcLockHold& hold) override;
  Status mark_restored(int64_t id, const std::string& when) override;
  Status set_pinned(int64_t id, bool pinned) override;
  Status set_expiry(int64_t id, const std::optional<std::string>& expires_at) override;
  Result<EvictionScope> eviction_scope(const std::optional<std::string>& tenant) override;
  Result<std::vector<int64_t>> expired_snapshots(const std::string& now) override;
  Result<CatalogStats> stats() override;
  // Refcounts against chunk lists, n_chunks against the lists, token sizes
  // (PostgreSQL enforces the foreign keys itself).
  Result<std::vector<std::string>> integrity_check() override;
  Result<int> schema_version() override;
  Result<std::optional<std::string>> get_meta(const std::string& key) override;
  Result<std::optional<std::string>> any_sealed_key_id() override;
  Result<std::string> init_meta(const std::string& key, const std::string& value) override;
  // Key rotation: the settings' rows are locked (FOR UPDATE here, FOR SHARE by add_snapshot's key
  // check), so under READ COMMITTED a finish and a commit of an old-key row are ordered.
  Status begin_key_rotation(const std::string& from, const std::string& to) override;
  Result<int64_t> finish_key_rotation(const std::string& from, const std::string& to) override;
  Status replace_sealed(int64_t id, SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                        const std::string& expect_key_id, const PrefixKeying& keying, GcLockHold& hold) override;
  // The URL without its password.
  std::string describe() const override { return where_; }

 private:
  explicit PgCatalog(std::unique_ptr<PgConn> conn);
  Status migrate();
  // add_snapshot(), checking `hold` first inside its transaction (commit_save).
  Result<SnapshotInfo> add(SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                           const std::optional<GcHoldSession>& hold);
  // Inside a transaction: a snapshot's chunk list and refcounts added, or dropped (the hashes
  // at refcount 0 appended to `freed`), chunk rows locked in hash order.
  Status add_chunk_uses(int64_t id, const std::vector<ChunkUse>& chunks);
  Status drop_chunk_uses(int64_t id, std::vector<ChunkHash>& freed);
  // Inside a transaction: the settings (encryption, encryption_previous), their rows locked
  // FOR UPDATE when `exclusive` (begin, finish), else FOR SHARE (a commit).
  Result<std::pair<std::optional<std::string>, std::optional<std::string>>> lock_key_settings(bool exclusive);
  // Inside a transaction: kMismatch unless an encrypted row's master key is one the settings
  // allow (Catalog::begin_key_rotation).
  Status check_row_key(const SnapshotInfo& info);
  // OK when the session still holds the gc lock, under the commit fence (pg_gc_locks.h).
  Status check_hold(const GcHoldSession& hold);
  // Infos (with tags) of `ids` that exist, in the order of `ids`.
  Result<std::vector<SnapshotInfo>> infos(const std::vector<int64_t>& ids);
  // (n_tokens, id) of the snapshots whose hashes say "prefix of query".
  // With `begin`, a REPEATABLE READ READ ONLY transaction starts with the first statement.
  Result<std::vector<std::pair<int64_t, int64_t>>> prefix_candidates(std::span<const int32_t> query, bool begin);

  std::unique_ptr<PgConn> conn_;
  std::string where_;
  bool upgrade_schema_ = true;  // CatalogOptions::upgrade_schema
};

// SQLite's GLOB pattern as an anchored PostgreSQL regular expression (for ~).
std::string glob_to_regex(const std::string& glob);

}  // namespace kvsnap
