// The catalog: which snapshots exist, what they are, which chunks they use.
// This is the storage interface for that record; SqliteCatalog
// (sqlite_catalog.h, one SQLite file beside the blobs) is the embedded default,
// and Catalog::open() opens one. Other implementations (a catalog server shared
// by a fleet) keep the same promises.
//
// What every catalog promises:
//   - Transactions. add_snapshot() and remove_snapshot() are each one atomic,
//     durable transaction (a call that returned OK survives a crash or power
//     loss): the snapshot, its tags, its chunk list and the chunk refcounts
//     appear or go together or not at all. A snapshot is visible to anyone only
//     after that commit, so a save writes (and commits) its blobs first and
//     calls add_snapshot() last. The read calls that return several rows (list,
//     find_prefix, stats, gc_candidates, integrity_check) see one consistent
//     moment.
//   - Refcounts. A chunk's refcount == the number of uses of it in snapshot
//     chunk lists (a chunk used twice by one snapshot counts twice);
//     integrity_check() checks it. A chunk row records where its blob is (the
//     first save's location, kept by later uses). A row whose refcount drops to
//     0 stays until forget_unreferenced(), so a save holding the shared gc lock
//     that finds it (find_chunk) may reuse its blob; its blob is deleted by
//     collect_garbage() under the exclusive gc lock (blob_store.h says why not
//     directly).
//   - Prefix search. find_prefix() returns exactly the snapshots whose tokens
//     are a prefix of the query, checked token by token (an index may only
//     choose candidates), longest first, and costs about O(|query|) index
//     probes, not O(snapshots): a save asks it for every save's parent.
//   - Names. resolve() accepts a name, a decimal id, a uuid or a unique uuid
//     prefix of >= 6 characters; names are unique and never all digits.
//   - The manifest is opaque bytes; tokens are the snapshot's prompt tokens.
//   - Errors: kNotFound for a missing snapshot, kInvalidArgument for a taken
//     name or uuid, kCorruption for a damaged catalog, kIOError when the
//     catalog cannot be reached; messages name the catalog (describe()).
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
#include <vector>

#include "base/sha256.h"
#include "base/status.h"
#include "store/blob_store.h"

namespace kvsnap {

class Io;

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
  // Eviction (eviction.h). Times are ISO 8601 UTC with milliseconds, as `created`.
  bool pinned = false;                       // never evicted
  std::optional<std::string> expires_at;     // evicted first once past; unset: never expires
  std::optional<std::string> last_restored;  // the last restore; unset: never restored
  // Encryption at rest (docs/store.md, "Encryption at rest"): the tenant the snapshot was sealed
  // for and its key ids (16 hex digits each: fingerprints, never key bytes). Unset: plain.
  std::optional<std::string> tenant;
  std::string master_key_id, tenant_key_id;
};

struct SnapshotRecord {
  SnapshotInfo info;
  std::vector<std::byte> manifest;  // opaque to the catalog (sealed when info.tenant is set)
  // Plain: stored. Encrypted (info.tenant set): given to add_snapshot only to compute the keyed
  // prefix index (Catalog::keying()), never stored, and empty from get().
  std::vector<int32_t> tokens;
  // Encrypted: the token list as stored, sealed by the store (what get() returns instead).
  std::vector<std::byte> sealed_tokens;
};

// How an encrypted tenant's prefix index is keyed (docs/store.md, "Encryption at rest"). The
// store sets it on its catalog (Catalog::set_keying) when it holds a key:
//   - add_snapshot of an encrypted record hashes secret ‖ tokens (SHA-256, 16 bytes kept), so
//     anchor_hash and full_hash say nothing to whoever reads the catalog without the key;
//   - find_prefix hashes the query the same way, so it finds only this tenant's snapshots (a
//     plain or another tenant's row cannot match), and checks each candidate's tokens with
//     open_tokens (the catalog cannot read sealed tokens itself).
struct PrefixKeying {
  Sha256Digest secret{};
  std::function<Result<std::vector<int32_t>>(const SnapshotRecord&)> open_tokens;
};

// One position of a snapshot's chunk list.
struct ChunkUse {
  ChunkHash sha256;
  uint64_t raw_size = 0;
  uint64_t stored_size = 0;
  std::string pack;          // empty: a loose blob
  uint64_t pack_offset = 0;  // where the blob starts in the pack

  BlobLocation location() const { return {pack, pack_offset, stored_size}; }
};

// A snapshot's record and chunk list read at one moment (Catalog::get_with_chunks).
struct SnapshotRows {
  SnapshotRecord record;
  std::vector<ChunkUse> chunks;  // in chunk list order
};

struct ListFilter {
  std::string model_fingerprint;                          // exact; empty = any
  std::string model_arch;                                 // exact; empty = any
  std::vector<std::pair<std::string, std::string>> tags;  // all must match
  std::string name_glob;                                  // glob as SQLite GLOB (* ? [..], case-sensitive); empty = any
  std::string type;                                       // a K or V type name; empty = any
  // Encryption tenant: only plain snapshots and those sealed for this tenant; unset = any.
  std::optional<std::string> tenant;
  int64_t limit = -1;                                     // < 0: all
};

struct GcCandidates {
  std::vector<ChunkHash> unreferenced;  // chunk rows with refcount 0
  // Those of them whose blob is in a pack: it goes with the pack (unused_packs), there is no
  // loose blob of theirs to delete.
  std::vector<ChunkHash> unreferenced_packed;
  std::vector<ChunkHash> orphans;       // loose blobs in storage without a chunk row
  // The packs that hold blobs of unreferenced rows (each once): the packs this gc leaves partly
  // dead, which a gc that does not scan everything considers for compaction (pack_compaction.h).
  std::vector<std::string> packs_losing_chunks;
};

// What the live chunk rows (refcount > 0) say about a pack: how many name it, the stored bytes they
// use, and where the last of them ends (a pack shorter than that is damaged). Rows a removal left
// at 0 are garbage a gc forgets first; a preview (gc --dry-run) counts them as gone too.
struct PackUsage {
  uint64_t rows = 0, live_bytes = 0, end = 0;
};

// A packed chunk's blob copied into another pack by gc's compaction: the row of `sha256` names
// `from` now and is to name `to`.
struct ChunkMove {
  ChunkHash sha256;
  BlobLocation from, to;
};

// What eviction (eviction.h) needs to know about the snapshots in its scope,
// read in one consistent moment.
struct EvictionUse {
  int64_t snapshot_id = 0;
  ChunkHash sha256;
  int64_t uses = 0;          // how often the snapshot's chunk list names the chunk
  uint64_t stored_size = 0;
  int64_t refcount = 0;      // over the whole store, not only the scope
};
struct EvictionScope {
  std::vector<SnapshotInfo> snapshots;  // tags not loaded
  std::vector<EvictionUse> uses;        // one row per (snapshot, chunk)
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

// Options of the embedded SQLite catalog (Catalog::open).
struct CatalogOptions {
  int busy_timeout_ms = 10000;
  std::string vfs;  // SQLite VFS name; empty = default (tests inject faults here)
  // false: synchronous=NORMAL, commits survive a process crash but maybe not
  // power loss. Only for bulk loads that can be redone (the benchmark's fill).
  bool durable_commits = true;
  // false: a catalog of an older schema, or none, is refused instead of upgraded or created
  // (kvsnap doctor changes nothing): kNotFound when there is no catalog, kMismatch when its
  // schema is older (schema_not_upgraded).
  bool upgrade_schema = true;
  // A file beside the catalog, `<catalog>-reserve`, that holds this much of its disk for the
  // catalog's own writes, so that on a full disk `rm` and `gc` still have room for their WAL
  // frames; more for a large catalog (1.25x its size when it opens: a removal of a snapshot that
  // makes up most of it writes nearly every page to the WAL). Made (allocated, nothing written)
  // when the catalog opens with upgrade_schema and at least 4x the reserve is free, removed before
  // a write transaction when less than 2x is free (a later open makes it again once there is
  // room). A file system that cannot allocate without writing gets none. 0: none. The embedded
  // SQLite catalog only.
  uint64_t room_reserve_bytes = uint64_t{16} << 20;
  // The file system that free space is measured through and the reserve removed from;
  // nullptr: posix_io(). (The reserve is made with base/os.h allocate_space.)
  Io* io = nullptr;
  // Tests only: called by get_with_chunks between its read of the record and that of the chunk
  // list, where a removal committed by another connection must not tear them apart.
  std::function<void()> between_reads_for_test;
};

// Store settings (Catalog::get_meta): the master key id saves seal under, and the one a key
// rotation is replacing (set only while it runs).
inline constexpr const char* kMetaEncryption = "encryption";
inline constexpr const char* kMetaEncryptionPrevious = "encryption_previous";
// The store's id, which its blob store keeps too (store/store_identity.h).
inline constexpr const char* kMetaStoreId = "store_id";

// The tag that names a snapshot's tenant: kvsnap serve's namespace (serve/persist.h).
inline constexpr const char* kTenantTag = "serve.ns";

class Catalog {
 public:
  // The stride of the prefix index (find_prefix): snapshots are anchored at
  // multiples of it (sqlite_catalog.h describes the scheme).
  static constexpr int64_t kPrefixStride = 64;

  // Opens (creating if missing) and migrates the embedded SQLite catalog at
  // `path` (a SqliteCatalog). The directory must exist. kNotSupported when the
  // file's schema is newer than this kvsnap knows.
  static Result<std::unique_ptr<Catalog>> open(const std::string& path, const CatalogOptions& options = {});
  virtual ~Catalog() = default;
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // The keyed prefix index of an encrypted tenant (PrefixKeying); nullptr: plain hashes.
  void set_keying(std::shared_ptr<const PrefixKeying> k) { keying_ = std::move(k); }
  const PrefixKeying* keying() const { return keying_.get(); }

  // Store-wide settings (key -> value): "encryption" = the master key id of an encrypted store.
  virtual Result<std::optional<std::string>> get_meta(const std::string& key) = 0;
  // The master key id of a sealed (encrypted) snapshot row, if the catalog holds one: a catalog
  // without the "encryption" setting that holds one had the setting removed (Store::open).
  virtual Result<std::optional<std::string>> any_sealed_key_id() = 0;
  // Sets `key` to `value` unless it is set; returns the value it holds after (the first
  // writer's, when two race).
  virtual Result<std::string> init_meta(const std::string& key, const std::string& value) = 0;

  // Key rotation (docs/store.md, "Key rotation"). "encryption" names the key saves use;
  // "encryption_previous", set only while a rotation runs, the key being replaced: rows sealed
  // under either are valid then. add_snapshot refuses, inside its transaction, an encrypted
  // row whose master key is neither (kMismatch), so a save that read the settings before a
  // rotation finished cannot add a row only the retired key opens.
  //
  // In one transaction: {encryption = from} becomes {encryption = to, encryption_previous =
  // from}; a rotation already at that state (a resumed one) is left as it is. kMismatch when
  // the store is on another key or rotating between other keys.
  virtual Status begin_key_rotation(const std::string& from, const std::string& to);
  // In one transaction: when no snapshot row names `from`, drops encryption_previous (the
  // rotation is over) and returns 0; otherwise changes nothing and returns how many still do.
  virtual Result<int64_t> finish_key_rotation(const std::string& from, const std::string& to);
  // Swaps snapshot `id`'s sealed content for the same content sealed under another key, in one
  // transaction, only while `hold` (the writer's shared gc lock) stands and the row still
  // names `expect_key_id` (kMismatch: rotated meanwhile; kNotFound: removed). Replaced:
  // manifest, sealed tokens, key ids, content hash, the prefix index keyed by `keying` (from
  // rec.tokens), the chunk list, refcounts (the new chunks gain a use, the old lose one; those
  // at 0 go with gc). Kept: id, uuid, name, tags, parent, created, pin, expiry, last restore.
  virtual Status replace_sealed(int64_t id, SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                                const std::string& expect_key_id, const PrefixKeying& keying, GcLockHold& hold);

  // Inserts the snapshot, its tags and chunk list and bumps the chunks'
  // refcounts in one transaction. A chunk already recorded keeps its recorded
  // location (and stored size): find_chunk() is how a save learns it. Returns
  // the stored info (id, uuid, created filled in). kInvalidArgument for a
  // taken name or uuid, a missing parent, an all-digit name; kMismatch when a
  // chunk hash is known with another raw size.
  virtual Result<SnapshotInfo> add_snapshot(SnapshotRecord rec, const std::vector<ChunkUse>& chunks) = 0;
  // add_snapshot() as a save's commit: it commits only if `hold`, the save's
  // shared gc lock (BlobWriteBatch::hold), has stood from the save's start
  // through the commit, so no gc can have deleted a blob the snapshot names.
  // A lost hold is kIOError saying so, and nothing is committed. The default
  // checks hold.still_held() just before add_snapshot(): enough for a hold
  // that cannot be lost while its process lives (a flock). A catalog whose
  // database keeps the hold (hold.session()) checks it inside the commit
  // transaction (PgCatalog says why that is race-free).
  virtual Result<SnapshotInfo> commit_save(SnapshotRecord rec, const std::vector<ChunkUse>& chunks,
                                           GcLockHold& hold);

  // Deletes the snapshot (its children's parent_id becomes unset) and drops its
  // chunk references in one transaction. Returns the chunks whose refcount
  // reached 0. kNotFound when there is no such snapshot.
  Result<std::vector<ChunkHash>> remove_snapshot(int64_t id) { return remove_snapshot_if(id, RemovalCheck{}); }
  // What must still hold of an eviction's victim when it is removed, checked inside the removal's
  // transaction: a pin, a later expiry or a restore committed after the plan was made (by another
  // process or host) keeps it.
  struct RemovalCheck {
    bool unpinned = false;                     // kept when pinned
    std::optional<std::string> expired_as_of;  // kept unless its expires_at <= this (ISO 8601 UTC)
    // Chosen as least recently restored: kept unless its last_restored is still `last_restored`
    // (unset: never restored), i.e. no restore since the plan read it.
    bool unrestored_since_plan = false;
    std::optional<std::string> last_restored;
  };
  // remove_snapshot() when `check` holds; kMismatch (nothing changed) when it does not.
  virtual Result<std::vector<ChunkHash>> remove_snapshot_if(int64_t id, const RemovalCheck& check) = 0;

  // Each read sees one moment: a removal committed meanwhile gives kNotFound, never a row
  // without its manifest.
  virtual Result<SnapshotRecord> get(int64_t id) = 0;
  virtual Result<SnapshotInfo> get_info(int64_t id) = 0;
  virtual Result<std::vector<ChunkUse>> chunks_of(int64_t id) = 0;  // in chunk list order
  // get() and chunks_of() at one moment: what a reader of the snapshot's blobs needs (a removal
  // committed between two reads would leave a record whose chunk list is empty).
  virtual Result<SnapshotRows> get_with_chunks(int64_t id) = 0;
  // The chunk's row (where its blob is), if any. A row means a committed
  // snapshot named it, so its blob is durable; under the shared gc lock it
  // stays, even at refcount 0.
  virtual Result<std::optional<ChunkUse>> find_chunk(const ChunkHash& h) = 0;
  // find_chunk() for many hashes: one answer per hash, in their order. A save
  // asks this once per batch of chunks (kChunkLookupBatch), so a catalog
  // server costs a round trip per batch, not per chunk. The default asks
  // find_chunk() for each.
  virtual Result<std::vector<std::optional<ChunkUse>>> find_chunks(std::span<const ChunkHash> hashes);
  static constexpr size_t kChunkLookupBatch = 256;
  // How many bytes of new (encoded) chunks a save holds before it asks find_chunks() about them
  // and writes them. A catalog server's round trip is worth batching (kLookupHoldBytes); a local
  // catalog's lookup is not, and every held chunk is a buffer the save touches for the first time
  // (a page fault per 4 KiB), so it says 0: each new chunk is looked up and written as it comes.
  virtual uint64_t lookup_hold_bytes() const { return kLookupHoldBytes; }
  static constexpr uint64_t kLookupHoldBytes = 8u << 20;

  // What the user typed, tried in this order: exact name, decimal id, full
  // uuid, unique uuid prefix of >= 6 characters. kAmbiguous names the
  // candidates; kNotFound says what was tried.
  virtual Result<int64_t> resolve(const std::string& ref) = 0;

  // Newest first (created, then id).
  virtual Result<std::vector<SnapshotInfo>> list(const ListFilter& filter = {}) = 0;

  // Snapshots whose tokens are a prefix of `query` (1 <= n_tokens <= |query|),
  // longest first, then most recently added (highest id); at most `limit`
  // (candidates are verified in that order, so limit 1 stops at the longest).
  // Empty snapshots are never returned (they are a prefix of everything and
  // restore nothing), so an empty query finds nothing. `model_fingerprint`:
  // only that model's (empty = any).
  virtual Result<std::vector<SnapshotInfo>> find_prefix(std::span<const int32_t> query,
                                                        const std::string& model_fingerprint = "",
                                                        size_t limit = SIZE_MAX) = 0;

  // Garbage as the catalog sees it. `on_disk` is BlobStore::list(). Only
  // meaningful while holding the exclusive gc lock (see collect_garbage).
  virtual Result<GcCandidates> gc_candidates(const std::vector<ChunkHash>& on_disk) = 0;
  // Deletes the chunk rows among `hashes` whose refcount is still 0; returns those.
  virtual Result<std::vector<ChunkHash>> forget_unreferenced(const std::vector<ChunkHash>& hashes) = 0;
  // The packs among `packs` that no chunk row names (garbage under the
  // exclusive gc lock: a crashed save's, or one whose every chunk is gone).
  virtual Result<std::vector<std::string>> unused_packs(const std::vector<std::string>& packs) = 0;
  // Every pack a live chunk row (refcount > 0) names, with how many name it: a full gc compares
  // them with the packs in storage (one missing is damage to report, not garbage).
  virtual Result<std::map<std::string, uint64_t>> live_packs() = 0;
  // PackUsage of each of `packs`, in their order (zeros for a pack no row names).
  virtual Result<std::vector<PackUsage>> pack_usage(const std::vector<std::string>& packs) = 0;
  // The chunk rows whose blob is in `pack` (any refcount), by offset: what compaction copies.
  virtual Result<std::vector<ChunkUse>> chunks_in_pack(const std::string& pack) = 0;
  // Points each move's row at its new location, all in one transaction: a row that no longer names
  // `from` exactly (pack, offset and size) changes nothing and fails the whole call (kMismatch).
  // `hold` is gc's exclusive hold, checked inside the transaction where a database keeps it (as
  // commit_save checks a save's): a lost lock may have let another gc delete the new pack.
  virtual Status move_chunks(const std::vector<ChunkMove>& moves, GcLockHold& hold) = 0;

  // Eviction marks (SnapshotInfo). Each is one small transaction; kNotFound
  // when there is no such snapshot. `when`/`expires_at`: ISO 8601 UTC.
  virtual Status mark_restored(int64_t id, const std::string& when) = 0;
  virtual Status set_pinned(int64_t id, bool pinned) = 0;
  virtual Status set_expiry(int64_t id, const std::optional<std::string>& expires_at) = 0;
  // The snapshots of the scope (all, or those tagged kTenantTag = *tenant)
  // and their chunk uses with the chunks' store-wide refcounts.
  virtual Result<EvictionScope> eviction_scope(const std::optional<std::string>& tenant) = 0;
  // The snapshots that are not pinned and whose expires_at <= `now`, oldest
  // expiry first (then by id): what an eviction without a cap looks for first,
  // from the snapshot rows alone, so a gc that finds none reads no chunk uses.
  virtual Result<std::vector<int64_t>> expired_snapshots(const std::string& now) = 0;

  virtual Result<CatalogStats> stats() = 0;
  // Problems found, empty when none: the backend's own consistency check,
  // references to missing rows, refcounts that disagree with the chunk lists,
  // chunk counts and token lists that disagree with the snapshot rows.
  virtual Result<std::vector<std::string>> integrity_check() = 0;

  // The schema version the catalog's data has (each backend numbers its own).
  virtual Result<int> schema_version() = 0;
  // What the catalog is, for messages: a file path, a URL without its password.
  virtual std::string describe() const = 0;

 protected:
  Catalog() = default;

 private:
  std::shared_ptr<const PrefixKeying> keying_;
};

// A fresh random (v4) uuid: what add_snapshot assigns when none is given (an encrypted save
// needs it first, to bind its sealed manifest and tokens to the row).
std::string new_snapshot_uuid();
// `uuid` in lower case, "" for "" (none given); kInvalidArgument unless it is 8-4-4-4-12 hex digits.
Result<std::string> canonical_snapshot_uuid(const std::string& uuid);
// kInvalidArgument for labels no snapshot may have: an empty or all-digit name (it would read as
// an id), a name that is a uuid (it would read as that snapshot's), an empty tag key.
Status check_snapshot_labels(const std::optional<std::string>& name, const std::map<std::string, std::string>& tags);
// Bounds on new labels (a save, an import): a name, each tag's key and value and an imported model
// fingerprint at most kMaxLabelBytes, at most kMaxTags tags. Far above what kvsnap makes itself (a
// kvsnap serve session name from an HTTP header of at most 8 KB, migrate's migrated-from path);
// every `ls` and `show` prints them, and an archive's index could otherwise plant millions.
inline constexpr size_t kMaxLabelBytes = 64 << 10;
inline constexpr size_t kMaxTags = 4096;
// New labels must be UTF-8 text without NUL: JSON (ls --json, an encrypted snapshot's sealed copy in
// INFO.labels) and PostgreSQL take nothing else, and bytes of another encoding would come back as
// U+FFFD, no longer matching the catalog; and within the bounds above. kInvalidArgument naming the
// label. Rows already stored keep theirs (rekey rewrites them as they are).
Status check_new_labels_text(const std::optional<std::string>& name, const std::map<std::string, std::string>& tags);
// What an archive's index may not put in the store on top: a model fingerprint that is not one
// (over kMaxLabelBytes, not UTF-8, or holding terminal controls: has_terminal_controls). Names and
// tags are the user's text, as a save takes them (an export of a store brings back what it held);
// listings and messages show them through shown_text (base/text.h), so none rewrites or reorders
// the terminal of whoever lists the store. kInvalidArgument naming the fingerprint.
Status check_imported_fingerprint(const std::string& model_fingerprint);

// Where a gc stands: its deletions (blobs, packs, temporaries, and their sizes in storage).
struct GcProgress {
  uint64_t files_done = 0, files_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;
  // After the deletions: compacting packs (pack_compaction.h). A stop then leaves the packs
  // compacted so far done and the one in progress as it was.
  bool compacting = false;
};

struct GcOptions {
  bool wait = false;          // wait for running saves instead of skipping
  bool scan_orphans = true;   // also list the blobs on disk (slower) and empty tmp/
  // Compaction (pack_compaction.h): a pack whose dead bytes are at least this percent of it has
  // its live blobs copied into a new pack and goes. 0: never. Which packs are looked at: every
  // pack with scan_orphans, else those this gc's unreferenced rows were in.
  int compact_dead_percent = kDefaultCompactDeadPercent;  // 0..100
  static constexpr int kDefaultCompactDeadPercent = 25;
  // Called once the deletions are planned (the catalog rows already gone) and after each file deleted,
  // with the files' sizes (looked up only when this is set), then before each blob compaction copies
  // (`compacting`). An error stops gc before its next deletion or copy and is returned: what is left
  // is garbage the next gc deletes, the store stays whole.
  std::function<Status(const GcProgress&)> progress;
};

struct GcReport {
  bool skipped_busy = false;  // a save held the lock and wait was false
  size_t unreferenced_deleted = 0;
  size_t orphans_deleted = 0;
  size_t packs_deleted = 0;
  size_t temporaries_deleted = 0;
  size_t uploads_aborted = 0;  // BlobStore::abort_stale_uploads (scan_orphans only)
  size_t packs_compacted = 0;  // packs whose live blobs were copied into a new pack (then deleted)
  uint64_t compacted_bytes_moved = 0;  // the live bytes copied
  uint64_t compacted_bytes_freed = 0;  // the dead bytes of the compacted packs
  // What compaction left alone and why: a pack missing, damaged or unreadable (`kvsnap verify`
  // names the snapshots hurt), or compaction stopped by a storage error (a full disk); and (a gc
  // that scans) each pack live rows name that storage does not have. gc's deletions are done by
  // then; these never fail it.
  std::vector<std::string> warnings;
};

// Deletes what no snapshot uses, under the exclusive gc lock: chunk rows with
// refcount 0 and their loose blobs, packs no chunk row names, and
// (scan_orphans) loose blobs without a chunk row and leftover temporaries.
// Generic: it uses only the Catalog and BlobStore interfaces (catalog_gc.cc). A
// pack with enough dead bytes is compacted after the deletions (options.compact_dead_percent). Rows go before blobs, so a crash in between leaves an
// orphan blob, which the next gc removes. Call with scan_orphans=false after
// remove_snapshot() for a cheap cleanup.
Result<GcReport> collect_garbage(Catalog& catalog, BlobStore& blobs, const GcOptions& options = {});

}  // namespace kvsnap
