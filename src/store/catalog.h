// The catalog: which snapshots exist, what they are, which chunks they use.
//
// One SQLite database, <root>/catalog.sqlite, in WAL mode with
// synchronous=FULL (a commit that returned OK survives power loss) and foreign
// keys on. Any number of processes may open it at once; writers serialize on
// BEGIN IMMEDIATE with a busy timeout (10 s by default) and retry.
//
// What the catalog promises:
//   - add_snapshot() is one transaction: the snapshot, its tags, its chunk list
//     and the chunk refcounts appear together or not at all. A snapshot is
//     visible to anyone only after that commit, so a save writes (and syncs)
//     its blobs first and calls add_snapshot() last.
//   - chunks.refcount == number of snapshot_chunks rows naming the chunk (a
//     chunk used twice by one snapshot counts twice). integrity_check() checks it.
//   - remove_snapshot() is one transaction and reports the chunks that nobody
//     uses any more; their blobs are deleted by collect_garbage() under the gc
//     lock (see blob_store.h for why not directly).
//   - The manifest is opaque bytes; tokens are the snapshot's prompt tokens.
//
// Schema (version 1, PRAGMA user_version; migrations are applied in order on
// open, a newer version than this code knows is refused):
//   snapshots        metadata columns only, so that ls scans small rows
//   snapshot_blobs   manifest and tokens (i32 LE), kept apart from the metadata
//                    because a 32 KiB token array would otherwise make each
//                    snapshots row span its own pages
//   tags             (snapshot_id, key) -> value
//   chunks           sha256 -> raw_size, stored_size, refcount
//   snapshot_chunks  (snapshot_id, idx) -> sha256
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
// A Catalog object is one connection: use one per thread.
#pragma once

#include <cstdint>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "store/blob_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace kvsnap {

// The metadata of a snapshot: what ls shows.
struct SnapshotInfo {
  int64_t id = 0;                  // assigned by add_snapshot
  std::string uuid;                // generated (v4) when empty
  std::optional<std::string> name; // unique when set; not all digits
  std::string created;             // ISO 8601 UTC; now when empty
  std::string model_arch;
  std::string model_fingerprint;
  int64_t n_tokens = 0;            // set from the tokens
  std::string k_types;             // distinct type names, comma-separated ("q8_0" or "f16,q8_0")
  std::string v_types;
  bool v_trans = false;
  std::string source_format;
  uint64_t raw_bytes = 0;          // the state's size as llama.cpp wrote it
  uint64_t stored_bytes = 0;       // what this snapshot's blobs take (before dedup)
  std::string lossy;               // empty: lossless
  std::optional<int64_t> parent_id;
  std::string content_sha256;
  int64_t n_chunks = 0;            // set from the chunk list
  std::map<std::string, std::string> tags;
};

struct SnapshotRecord {
  SnapshotInfo info;
  std::vector<std::byte> manifest;  // opaque to the catalog
  std::vector<int32_t> tokens;
};

// One position of a snapshot's chunk list.
struct ChunkUse {
  ChunkHash sha256;
  uint64_t raw_size = 0;
  uint64_t stored_size = 0;
  std::string pack;          // empty: a loose blob (chunks/ab/<sha>)
  uint64_t pack_offset = 0;  // where the blob starts in the pack

  BlobLocation location() const { return {pack, pack_offset, stored_size}; }
};

struct ListFilter {
  std::string model_fingerprint;                          // exact; empty = any
  std::string model_arch;                                 // exact; empty = any
  std::vector<std::pair<std::string, std::string>> tags;  // all must match
  std::string name_glob;                                  // SQLite GLOB (* ? [..]); empty = any
  std::string type;                                       // a K or V type name; empty = any
  int64_t limit = -1;                                     // < 0: all
};

struct GcCandidates {
  std::vector<ChunkHash> unreferenced;  // chunk rows with refcount 0
  std::vector<ChunkHash> orphans;       // blobs on disk without a chunk row
};

struct CatalogStats {
  int64_t snapshots = 0;
  int64_t chunks = 0;               // chunk rows in use
  int64_t unreferenced_chunks = 0;  // refcount 0, waiting for gc
  uint64_t raw_bytes = 0;           // sum of snapshots' raw_bytes
  uint64_t chunk_raw_bytes = 0;     // sum of raw sizes over chunk uses (before dedup)
  uint64_t stored_bytes = 0;        // sum of stored sizes of chunks in use (after dedup)
  uint64_t manifest_bytes = 0;
  double dedup_ratio = 0;           // chunk_raw_bytes / stored_bytes (0 when empty)
};

struct CatalogOptions {
  int busy_timeout_ms = 10000;
  std::string vfs;  // SQLite VFS name; empty = default (tests inject faults here)
  // false: synchronous=NORMAL, commits survive a process crash but maybe not
  // power loss. Only for bulk loads that can be redone (the benchmark's fill).
  bool durable_commits = true;
};

class Catalog {
 public:
  static constexpr int kSchemaVersion = 2;
  static constexpr int64_t kPrefixStride = 64;

  // Opens (creating if missing) and migrates the catalog at `path`. The
  // directory must exist. kNotSupported when the file's schema is newer than
  // kSchemaVersion.
  static Result<std::unique_ptr<Catalog>> open(const std::string& path, const CatalogOptions& options = {});
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // Inserts the snapshot, its tags and chunk list and bumps the chunks'
  // refcounts in one transaction. A chunk already recorded keeps its recorded
  // location (and stored size): find_chunk() is how a save learns it. Returns the stored info (id, uuid, created
  // filled in). kInvalidArgument for a taken name or uuid, a missing parent,
  // an all-digit name; kMismatch when a chunk hash is known with another raw size.
  Result<SnapshotInfo> add_snapshot(SnapshotRecord rec, const std::vector<ChunkUse>& chunks);

  // Deletes the snapshot (its children's parent_id becomes NULL) and drops its
  // chunk references in one transaction. Returns the chunks whose refcount
  // reached 0. kNotFound when there is no such snapshot.
  Result<std::vector<ChunkHash>> remove_snapshot(int64_t id);

  Result<SnapshotRecord> get(int64_t id);
  Result<SnapshotInfo> get_info(int64_t id);
  Result<std::vector<ChunkUse>> chunks_of(int64_t id);  // in idx order
  // The chunk's row (where its blob is), if any. A row means a committed
  // snapshot named it, so its blob is durable; under the shared gc lock it
  // stays, even at refcount 0.
  Result<std::optional<ChunkUse>> find_chunk(const ChunkHash& h);

  // What the user typed, tried in this order: exact name, decimal id, full
  // uuid, unique uuid prefix of >= 6 characters. kAmbiguous names the
  // candidates; kNotFound says what was tried.
  Result<int64_t> resolve(const std::string& ref);

  // Newest first (created, then id).
  Result<std::vector<SnapshotInfo>> list(const ListFilter& filter = {});

  // Snapshots whose tokens are a prefix of `query` (1 <= n_tokens <= |query|),
  // longest first, then most recently added (highest id); at most `limit`
  // (candidates are verified in that order, so limit 1 stops at the longest).
  // Empty snapshots are never returned (they are a prefix of everything and
  // restore nothing), so an empty query finds nothing.
  Result<std::vector<SnapshotInfo>> find_prefix(std::span<const int32_t> query,
                                                const std::string& model_fingerprint = "",
                                                size_t limit = SIZE_MAX);

  // Garbage as the catalog sees it. `on_disk` is BlobStore::list(). Only
  // meaningful while holding the exclusive gc lock (see collect_garbage).
  Result<GcCandidates> gc_candidates(const std::vector<ChunkHash>& on_disk);
  // Deletes the chunk rows among `hashes` whose refcount is still 0; returns those.
  Result<std::vector<ChunkHash>> forget_unreferenced(const std::vector<ChunkHash>& hashes);
  // The packs among `packs` that no chunk row names (garbage under the
  // exclusive gc lock: a crashed save's, or one whose every chunk is gone).
  Result<std::vector<std::string>> unused_packs(const std::vector<std::string>& packs);

  Result<CatalogStats> stats();
  // Problems found, empty when none: SQLite's quick_check, foreign keys,
  // refcounts that disagree with the chunk lists.
  Result<std::vector<std::string>> integrity_check();

  Result<int> schema_version();
  const std::string& path() const { return path_; }

 private:
  class Stmt;
  Catalog(sqlite3* db, std::string path, CatalogOptions options)
      : db_(db), path_(std::move(path)), options_(std::move(options)) {}
  Status migrate();
  Status exec(const char* sql);
  // A cached statement for a constant SQL text (keyed by its address), or a
  // one-off statement for dynamic SQL.
  Result<Stmt> stmt(const char* sql);
  Result<Stmt> stmt_once(const std::string& sql);
  static SnapshotInfo info_from_row(const Stmt& st);
  Status begin_immediate();
  Status commit();
  void rollback();
  // Runs `body` inside BEGIN IMMEDIATE .. COMMIT; rolls back on any error.
  template <class F>
  Status write_txn(F&& body);
  Status sqlite_error(int rc, const std::string& what);
  // (n_tokens, id) of the snapshots whose hashes say "prefix of query".
  Result<std::vector<std::pair<int64_t, int64_t>>> prefix_candidates(std::span<const int32_t> query);

  sqlite3* db_;
  std::string path_;
  CatalogOptions options_;
  struct CachedStmt {
    sqlite3_stmt* stmt;
    bool in_use;
  };
  std::unordered_map<const char*, CachedStmt> stmts_;  // keyed by the SQL literal's address
};

// Where a gc stands: its deletions (files, and their sizes on disk).
struct GcProgress {
  uint64_t files_done = 0, files_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;
};

struct GcOptions {
  bool wait = false;          // wait for running saves instead of skipping
  bool scan_orphans = true;   // also list the blobs on disk (slower) and empty tmp/
  // Called once the deletions are planned (the catalog rows already gone) and after each file deleted,
  // with the files' sizes (looked up only when this is set). An error stops gc before its next
  // deletion and is returned: what is left is garbage the next gc deletes, the store stays whole.
  std::function<Status(const GcProgress&)> progress;
};

struct GcReport {
  bool skipped_busy = false;  // a save held the lock and wait was false
  size_t unreferenced_deleted = 0;
  size_t orphans_deleted = 0;
  size_t packs_deleted = 0;
  size_t temporaries_deleted = 0;
};

// Deletes what no snapshot uses, under the exclusive gc lock: chunk rows with
// refcount 0 and their loose blobs, packs no chunk row names, and
// (scan_orphans) loose blobs without a chunk row and leftover temporaries. A
// pack with some live chunks stays whole (no compaction). Rows go before blobs, so a crash in between leaves an
// orphan blob, which the next gc removes. Call with scan_orphans=false after
// remove_snapshot() for a cheap cleanup.
Result<GcReport> collect_garbage(Catalog& catalog, BlobStore& blobs, const GcOptions& options = {});

}  // namespace kvsnap
