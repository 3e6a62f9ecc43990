// The embedded catalog (catalog.h says what every catalog promises): one
// SQLite database, <root>/catalog.sqlite, in WAL mode with synchronous=FULL (a
// commit that returned OK survives power loss) and foreign keys on. Any number
// of processes may open it at once; writers serialize on BEGIN IMMEDIATE with a
// busy timeout (10 s by default) and retry. Read calls that return several rows
// run in one read transaction.
//
// Schema (PRAGMA user_version, kSchemaVersion; migrations are applied in order
// on open, a newer version than this code knows is refused):
//   snapshots        metadata columns only, so that ls scans small rows
//   snapshot_blobs   manifest and tokens (i32 LE), kept apart from the metadata
//                    because a 32 KiB token array would otherwise make each
//                    snapshots row span its own pages
//   tags             (snapshot_id, key) -> value
//   chunks           sha256 -> raw_size, stored_size, refcount, pack, pack_offset
//                    (v2; a NULL pack is a loose blob)
//   snapshot_chunks  (snapshot_id, idx) -> sha256
//   (v3: snapshots.pinned, expires_at, last_restored, for eviction.h)
//   store_meta       key -> value (v4; "encryption" = an encrypted store's master key id)
//   (v4: snapshots.tenant, master_key_id, tenant_key_id: an encrypted snapshot's, whose
//    manifest and tokens are sealed; catalog.h PrefixKeying keys its prefix hashes)
// integrity_check() adds SQLite's quick_check and foreign_key_check.
//
// Prefix search (find_prefix). Every snapshot of n tokens stores
//   anchor_len  = n rounded down to a multiple of kPrefixStride (64),
//   anchor_hash = SHA-256 of its first anchor_len tokens (16 bytes kept),
//   full_hash   = SHA-256 of all n tokens (16 bytes kept),
// indexed as (anchor_len, anchor_hash, n_tokens, full_hash) and
// (n_tokens, full_hash). A query Q hashes its prefixes at every multiple c of
// 64 (one incremental pass) and asks, for each c, which snapshots are anchored
// at (c, hash of Q[0,c)): those are the only ones of length [c, c+64) that can
// be prefixes of Q. For each such band it either compares the full hashes of
// the few snapshots found (<= 64 rows) or, when the band is crowded (many
// snapshots sharing a system prompt and diverging inside the band), probes
// (n, hash of Q[0,n)) for each of the <= 64 lengths n of the band. So a query
// costs O(|Q|/64) index probes plus at most 64 probes per band that actually
// shares Q's prefix, however many snapshots share it, then one token-by-token
// check per hit (hashes only choose candidates; tokens decide).
//
// One object is one SQLite connection (SQLITE_OPEN_NOMUTEX): one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/io.h"
#include "store/catalog.h"

struct sqlite3;
struct sqlite3_stmt;

namespace kvsnap {

class SqliteCatalog final : public Catalog {
 public:
  static constexpr int kSchemaVersion = 5;
  // expired_snapshots()'s query (?1: now): the snapshots_expires index walked in its own order,
  // no sort (catalog tests EXPLAIN this text).
  static constexpr const char* kExpiredSql =
      "SELECT id FROM snapshots WHERE expires_at <= ?1 AND length(expires_at) = length(?1) AND pinned = 0 "
      "ORDER BY expires_at, id";

  // Catalog::open() is this.
  static Result<std::unique_ptr<SqliteCatalog>> open(const std::string& path, const CatalogOptions& options = {});
  ~SqliteCatalog() override;

  Result<SnapshotInfo> add_snapshot(SnapshotRecord rec, const std::vector<ChunkUse>& chunks) override;
  Result<std::vector<ChunkHash>> remove_snapshot_if(int64_t id, const RemovalCheck& check) override;
  Result<SnapshotRecord> get(int64_t id) override;
  Result<SnapshotInfo> get_info(int64_t id) override;
  Result<std::vector<ChunkUse>> chunks_of(int64_t id) override;
  Result<SnapshotRows> get_with_chunks(int64_t id) override;
  Result<std::optional<ChunkUse>> find_chunk(const ChunkHash& h) override;
  // kSqliteLookupBatch hashes per statement (sha256 IN (?1, ...)).
  Result<std::vector<std::optional<ChunkUse>>> find_chunks(std::span<const ChunkHash> hashes) override;
  uint64_t lookup_hold_bytes() const override { return 0; }  // a local file: no round trip to save
  Result<int64_t> resolve(const std::string& ref) override;
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
  Result<std::vector<std::string>> integrity_check() override;
  Status begin_key_rotation(const std::string& from, const std::string& to) override;
  Result<int64_t> finish_key_rotation(const std::string& from, const std::string& to) override;
  Status replace_sealed(int64_t id, SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                        const std::string& expect_key_id, const PrefixKeying& keying, GcLockHold& hold) override;
  Result<int> schema_version() override;
  Result<std::optional<std::string>> get_meta(const std::string& key) override;
  Result<std::optional<std::string>> any_sealed_key_id() override;
  Result<std::string> init_meta(const std::string& key, const std::string& value) override;
  std::string describe() const override { return path_; }
  const std::string& path() const { return path_; }

 private:
  class Stmt;
  SqliteCatalog(sqlite3* db, std::string path, CatalogOptions options)
      : db_(db), path_(std::move(path)), options_(std::move(options)) {}
  Status migrate();
  Status exec(const char* sql);
  // A cached statement for a constant SQL text (keyed by its address), or a
  // one-off statement for dynamic SQL.
  Result<Stmt> stmt(const char* sql);
  Result<Stmt> stmt_once(const std::string& sql);
  static SnapshotInfo info_from_row(const Stmt& st);
  Status begin_immediate();
  // The room reserve (CatalogOptions::room_reserve_bytes): made when there is room, given up
  // when the disk is nearly full. Best effort: the catalog works without it.
  std::string reserve_path() const { return path_ + "-reserve"; }
  Io& io() const { return options_.io ? *options_.io : posix_io(); }
  std::optional<uint64_t> free_bytes_beside();
  uint64_t room_reserve_wanted() const;  // room_reserve_bytes, or more for a large catalog
  void keep_room_reserve();
  void release_room_reserve_if_short();
  Status commit();
  void rollback();
  // Runs `body` inside BEGIN IMMEDIATE .. COMMIT; rolls back on any error.
  template <class F>
  Status write_txn(F&& body);
  // Runs `body`'s reads at one moment: inside BEGIN .. ROLLBACK, or the transaction already open.
  template <class F>
  Status read_txn(F&& body);
  Status sqlite_error(int rc, const std::string& what);
  // (n_tokens, id) of the snapshots whose hashes say "prefix of query".
  Result<std::vector<std::pair<int64_t, int64_t>>> prefix_candidates(std::span<const int32_t> query);
  // Inside a write transaction: snapshot `id`'s chunk list and the chunks' refcounts, added
  // (rows created as needed) or dropped (the hashes whose refcount reached 0 appended to `freed`).
  Status add_chunk_uses(int64_t id, const std::vector<ChunkUse>& chunks);
  Status drop_chunk_uses(int64_t id, std::vector<ChunkHash>& freed);
  // Inside a write transaction: kMismatch unless an encrypted row's master key is one the
  // store's settings allow (Catalog::begin_key_rotation).
  Status check_row_key(const SnapshotInfo& info);
  // Runs one UPDATE of snapshot `id` (?1) in a write transaction; kNotFound when no row changed.
  Status update_snapshot(int64_t id, Stmt& st);

  sqlite3* db_;
  std::string path_;
  CatalogOptions options_;
  uint64_t reserve_bytes_ = 0;  // the room reserve's size (room_reserve_wanted() at open)
  struct CachedStmt {
    sqlite3_stmt* stmt;
    bool in_use;
  };
  std::unordered_map<const char*, CachedStmt> stmts_;  // keyed by the SQL literal's address
};

}  // namespace kvsnap
