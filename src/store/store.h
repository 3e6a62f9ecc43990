// The snapshot store: what `kvsnap save / restore / ls / show / find / rm /
// gc / verify / export / import` do, over three parts with their own
// promises: the snapshot format (format/snapshot.h), the content-addressed
// blobs (store/blob_store.h, with their gc locks, store/gc_lock.h) and the
// catalog (store/catalog.h). The store uses the blobs and the catalog only
// through those interfaces; store_location.h says which implementations a
// location opens.
//
// Promises:
//   - save: a snapshot becomes visible only after all its blobs are written
//     and fsynced and its catalog transaction committed; a crash at any point
//     leaves no half snapshot (at most orphan blobs or temporaries, which gc
//     reclaims). Saves hold the shared gc lock, so a concurrent gc never
//     deletes a blob a save is about to reference.
//   - restore at the snapshot's own types writes the original llama.cpp file
//     byte for byte, and checks it against the recorded SHA-256 as it goes;
//     restore at other types is exactly `kvsnap convert` of that file; both
//     stream from chunks in bounded memory; every chunk is hash-checked when
//     decoded, so a flipped stored byte is an error, never a silently wrong
//     cache. --tokens N reads only the chunks the prefix needs.
//   - caps (StoreCaps, from the store config) are enforced after every save:
//     evict() with the new snapshot kept, for the store and for the new
//     snapshot's tenant; pinned snapshots are never evicted. When pinned
//     snapshots and the new one alone exceed a cap, the save still succeeds
//     (its data is committed and the cap cannot be met by evicting) and
//     SaveResult::cap_warnings says so. A restore records its time
//     (last_restored), the order eviction follows (eviction.h).
//   - a restore (and export, verify) holds the shared gc lock from before it
//     reads the snapshot's rows until its last blob read, so a concurrent
//     rekey or rm cannot have gc delete what it is reading.
//   - verify re-hashes everything it is asked about and lists every problem.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/llama_state.h"
#include "format/mlx_prompt_cache.h"
#include "format/snapshot.h"
#include "format/snapshot_reseal.h"
#include "migrate/conversion_spec.h"
#include "migrate/model_info.h"
#include "store/blob_store.h"
#include "store/catalog.h"
#include "store/eviction.h"
#include "store/pack_compaction.h"
#include "store/store_location.h"
#include "store/store_paths.h"

namespace kvsnap {

namespace store_detail {
class BlobSink;
}

struct SaveRequest {
  std::string name;                          // optional, unique
  std::map<std::string, std::string> tags;
  // Records the fingerprint and head dims; and the save asks the file's layer 0 RoPE whether its K
  // has the model's head dim (migrate/model_info.h check_model_head_dim), beside its reading:
  // nothing is stored when it contradicts. So a caller parses with HeadDimCheck::kByCaller.
  const ModelInfo* model = nullptr;
  bool head_dim_checked = false;             // the caller ran that check on this file already
  // Without `model`: the model facts another snapshot recorded, recorded again (an import that saves
  // an original again keeps what its restores decide by: head dims, the M-RoPE cell extra).
  std::optional<SnapshotModelInfo> recorded_model;
  std::optional<ConversionSpec> store_type;  // quantize on store (recorded as lossy)
  bool find_parent = true;                   // parent = the longest stored prefix of the same model
  std::string source_name;                   // the file's name, recorded in the snapshot
  // The llama.cpp that wrote the file (--source-build, llama-server's /props)
  // and a declared rotation: checked against the file, recorded, and used by
  // restores that convert (format/snapshot.h SourceClaims).
  SourceClaims writer;
  uint32_t threads = 0;                      // 0: every core
  int zstd_level = -10;  // fast, Huffman literals: measured 1.5x the encode speed of 1 for 2% of space (docs/store.md)
  bool compress = true;  // false (save --level none): chunks stored raw, the fastest save and restore, more space
  // With compress: zstd_level only while the disk is behind the encoders, else raw (save --level
  // auto, the default: format/snapshot.h SnapshotOptions::adaptive); false: every new chunk at zstd_level.
  bool adaptive = true;
  bool byte_shuffle = true;                  // false: benchmarks of the filter's gain
  uint32_t cells_per_chunk = kDefaultCellsPerChunk;
  // Called with the file's size when the save starts reading it: a progress display's total for a
  // caller that could not know it before (save --server: the server writes the file).
  std::function<void(uint64_t file_bytes)> on_start;
  // Called once the file is read in full, before anything is committed: an error stores nothing
  // (the CLI's: the file's stamp is still the one taken before its first read, so that a file
  // rewritten in place meanwhile, a llama-server saving that slot again, is not stored as a mix
  // of two versions).
  std::function<Status()> source_unchanged;
  std::optional<int64_t> ttl_seconds;        // expires this long after the save
  bool pin = false;                          // never evicted
  // What an import keeps of the archive's snapshot when it saves its original again (re-sealed
  // for this store's key or tenant): empty = new uuid, now, the model's fingerprint.
  std::string uuid, created, model_fingerprint;
  // An import's own hold on the gc lock (BlobStore::begin_write_under), kept from unpacking its
  // archive into tmp/ to its last entry so that no gc takes those files: the save borrows it.
  GcLockHold* under_hold = nullptr;
  // save_mlx only (mlx-lm files name neither their model reliably nor their tokens):
  std::string mlx_model;                     // the model's name ("": the file's "model" metadata)
  std::vector<int32_t> tokens;               // the prompt's tokens: find --tokens, parents
};

struct SaveResult {
  SnapshotInfo info;
  uint64_t chunks = 0;        // in the snapshot
  uint64_t chunks_new = 0;    // written now (the rest were already stored: dedup)
  uint64_t bytes_new = 0;     // blob bytes written now
  double seconds = 0;
  std::vector<EvictionVictim> evicted;    // removed to keep the store's caps
  std::vector<std::string> cap_warnings;  // caps that pinned snapshots and this one alone exceed
  std::vector<std::string> gc_warnings{};  // of the collection after an eviction (a pack left uncompacted)
};

struct EvictResult {
  EvictionPlan plan;  // victims: those removed (or, dry run, those that would be)
  bool dry_run = false;
  GcReport gc;        // the collection that followed (not on a dry run)
};

// Requantizing an mlx-lm snapshot on the way out, with mlx-lm's flags (migrate/mlx_kv_target.h):
// exactly `kvsnap convert RESTORED OUT --kv-bits B --kv-group-size G ...` of the restored file.
struct MlxRestoreSpec {
  std::string kv_bits;     // "": the file's; "none": float
  int kv_group_size = 0;   // 0: the file's, else 64
  std::string device;      // "" or "cpu", "gpu" (MlxDevice)
  std::string mlx_lm;      // the mlx-lm release that will load it (mlx_layout_for)
  bool given() const { return !kv_bits.empty() || kv_group_size || !device.empty() || !mlx_lm.empty(); }
  std::string flags() const;  // "{--kv-bits}, {--mlx-lm}": the ones given, for messages
};

struct RestoreRequest {
  MlxRestoreSpec mlx;                // mlx-lm snapshots only (refused for llama.cpp ones)
  ConversionSpec spec;               // nothing set: the snapshot's own types, byte for byte
  const ModelInfo* model = nullptr;  // overrides the snapshot's recorded head dims
  std::optional<uint64_t> tokens;    // only the first N tokens
  bool allow_plain = false;          // with a key: read a plain snapshot too (check_plain_under_key)
};

struct RestoreResult {
  SnapshotInfo info;
  uint64_t bytes_out = 0;
  uint64_t n_tokens = 0;
  bool converted = false;
  double seconds = 0;
};

struct VerifyReport {
  size_t snapshots = 0;
  uint64_t chunks = 0;
  uint64_t bytes = 0;                 // raw bytes re-hashed
  std::vector<std::string> problems;  // empty: everything checked out
  // Encrypted snapshots checked without the key (their sealed headers, key ids and sizes only):
  // what was not checked is said in not_checked.
  size_t sealed_only = 0;
  std::vector<std::string> not_checked;
};

// Where an encrypted archive's snapshots were sealed when that is not this store's key and tenant:
// import opens them with this key and saves them again with the store's (or plain).
struct ImportOptions {
  std::optional<MasterKey> from_key;  // unset: the store's own key
  std::string from_tenant;            // empty: the store's tenant
  // An encrypted store takes an archive's plain snapshots (sealing them on the way in) only with
  // this: nothing shows who made a plain snapshot, and once sealed it would restore like the
  // store's own (check_plain_under_key for restore and export). Refused before anything is stored.
  bool allow_plain = false;
};

struct ImportReport {
  std::vector<SnapshotInfo> imported;
  std::vector<std::string> skipped;   // already in the store (same uuid)
  // The store's caps kept as a save keeps them, the imported snapshots never evicted (SaveResult).
  std::vector<EvictionVictim> evicted;
  std::vector<std::string> cap_warnings;
  std::vector<std::string> gc_warnings{};
};

// kvsnap rekey: replacing the store's master key (docs/store.md, "Key rotation").
struct RekeyProgress {
  uint64_t snapshots_done = 0, snapshots_total = 0;
  uint64_t bytes_done = 0, bytes_total = 0;  // stored bytes of the snapshots' chunks
};
struct RekeyOptions {
  uint32_t threads = 0;  // chunks opened and sealed again at once; 0: every core
  // Called before the first snapshot and after each one is swapped. An error stops the rotation
  // there and is returned: the store stays whole and mid-rotation; kvsnap rekey again finishes it.
  std::function<Status(const RekeyProgress&)> progress;
  // Tests: called at each step ("begun"; per snapshot "sealed" (new blobs durable, row not yet
  // swapped) and "swapped"; "finished" (before the collection)). An error stops the rotation
  // there as a crash would (nothing is undone).
  std::function<Status(std::string_view step)> test_hook;
};
struct RekeyReport {
  std::string from_key_id, to_key_id;
  bool resumed = false;            // the store was already rotating between these keys
  size_t rekeyed = 0;              // snapshots sealed again by this run
  size_t plain = 0;                // plain snapshots (nothing to rotate; they stay plain)
  uint64_t chunks = 0, bytes = 0;  // chunk uses sealed again, their stored bytes
  GcReport gc;                     // the collection of the old key's chunks
};

// A snapshot opened from the store: its reader and the source of its blobs.
class StoredSnapshot {
 public:
  virtual ~StoredSnapshot() = default;
  virtual const SnapshotInfo& info() const = 0;
  virtual const SnapshotReader& reader() const = 0;
};

class Store {
 public:
  // Opens (creating it when missing) the directory store at `paths.root`: the
  // embedded default (directory_store()).
  static Result<std::unique_ptr<Store>> open(Io& io, const StorePaths& paths);
  // Opens the parts `where` names (open_store_parts).
  static Result<std::unique_ptr<Store>> open(Io& io, const StoreLocation& where);
  // A store over parts opened by the caller (any implementations). Creates
  // <local_dir>/tmp, where restores and imports keep their temporaries.
  static Result<std::unique_ptr<Store>> open(Io& io, StoreParts parts);
  ~Store();

  Result<SaveResult> save(const ReadableFile& file, const StateFile& parsed, const SaveRequest& req);
  // An mlx-lm prompt cache (format/snapshot_mlx.h). The llama.cpp-only fields of `req` (model,
  // store_type, writer) are refused; the catalog row says engine "mlx-lm" as its arch, the
  // model's name as "mlx-lm:NAME" for its fingerprint, K/V settings ("bf16", "q4g64") as types.
  // In an encrypted store it is sealed exactly as save() seals a llama.cpp state.
  Result<SaveResult> save_mlx(const ReadableFile& file, const MlxPromptCache& cache, const SaveRequest& req);
  Result<RestoreResult> restore(const std::string& ref, const RestoreRequest& req, ByteSink& out);
  // While the snapshot is open it holds the shared gc lock (blob_store.h, "readers"), so the
  // blobs its rows named stay even if rekey or rm changes the rows meanwhile; a gc that does not
  // wait skips until it is closed. Close it before a gc that waits, in the same thread.
  Result<std::unique_ptr<StoredSnapshot>> open_snapshot(const std::string& ref);
  // For a caller that resolved `ref` itself and then reads the snapshot by its uuid (restore
  // --server): kMismatch when `ref` names an encrypted snapshot whose catalog name or tags are not
  // the ones sealed in its manifest (store_seal.h check_sealed_labels); OK for a uuid or a plain row.
  // `id`: the row `ref` resolved to, the one the caller then reads; `change`: check_sealed_labels's.
  Status check_labels_of(const std::string& ref, int64_t id, const std::string& change = "");
  // Whether every blob the rows of snapshot `id` name is there, none read: each loose blob
  // present, each pack at least as long as the end of its last blob. kNotFound naming `ref` and
  // the first blob or pack missing, kCorruption for a pack cut short. For a flow that asks for
  // outside work before it reads the snapshot (restore --server asks nothing of the server for a
  // snapshot it could not read); the read itself still checks every blob (a gc may come between).
  Status check_blobs_present(int64_t id, const std::string& ref);

  // Also deletes blobs nobody uses any more, and compacts packs at compact_dead_percent(), best
  // effort (skipped while another gc runs; `gc` gets that collection's report when given).
  // remove, set_pinned and set_expiry act on an encrypted snapshot named by anything but its uuid
  // only when its catalog name and tags are the sealed ones (check_labels_of; kMismatch, nothing
  // changed): a name swapped by someone without the key would have them change another snapshot.
  Result<SnapshotInfo> remove(const std::string& ref, GcReport* gc = nullptr);
  // `progress`: GcOptions::progress (an error from it stops gc before its next deletion);
  // `compact_dead_percent`: GcOptions's (0: no compaction).
  Result<GcReport> gc(bool wait, std::function<Status(const GcProgress&)> progress = {},
                      int compact_dead_percent = GcOptions::kDefaultCompactDeadPercent);
  // What a gc at `compact_dead_percent` would compact as the store is now (every pack): a
  // preview for `gc --dry-run`, reading only, no lock taken (a gc or save beside it may change
  // what it sees). Storage or catalog errors are the plan's warnings.
  CompactionPlan plan_compaction(int compact_dead_percent);
  Result<VerifyReport> verify(const std::vector<std::string>& refs);  // empty: everything

  // Pin / unpin; the snapshot's info after the change.
  Result<SnapshotInfo> set_pinned(const std::string& ref, bool pinned);
  // Expires `seconds` from now (nullopt: never).
  Result<SnapshotInfo> set_expiry(const std::string& ref, std::optional<int64_t> seconds);
  // Removes plan_eviction()'s victims (req.now filled from the clock when
  // empty; a victim pinned, given a later expiry or restored since the plan was
  // read is skipped, and the plan's figures then read again), then collects
  // garbage without waiting for saves (wait_gc: waits). dry_run: only plans.
  Result<EvictResult> evict(EvictionRequest req, bool dry_run, bool wait_gc = false);
  // Seals every snapshot under the master key `to` instead of the store's key, which the store
  // was opened with (docs/store.md, "Key rotation"): crash-safe and resumable, beside running
  // saves and restores. When it returns OK the store's settings name only `to`.
  Result<RekeyReport> rekey(const MasterKey& to, const RekeyOptions& opts = {});
  const StoreCaps& caps() const { return caps_; }
  // The compaction threshold of the collections a removal or a save's eviction runs (the store
  // config's "compact_dead_percent", else GcOptions's default; 0: never).
  int compact_dead_percent() const {
    return caps_.compact_dead_percent.value_or(GcOptions::kDefaultCompactDeadPercent);
  }
  // The tenant's cipher when a key was given (nullptr: none).
  const ChunkCipher* cipher() const { return cipher_ ? &*cipher_ : nullptr; }
  // The master key id of an encrypted store (store_meta "encryption"); empty: plain so far.
  const std::string& encryption_key_id() const { return store_key_id_; }
  const std::string& tenant() const { return tenant_; }
  void set_caps(StoreCaps caps) { caps_ = std::move(caps); }
  // The clock for restores' marks, TTLs and expiry (tests set their own).
  void set_clock(std::function<std::string()> now) { now_ = std::move(now); }

  // One .tar.zst with each snapshot as a standalone .kvsnap file plus an index.
  // decrypt: encrypted snapshots are written as plain .kvsnap files (the key is needed; each
  // chunk opened and encoded again with plain ids); otherwise they stay sealed, their name, tags,
  // fingerprint and created too (the index entry's sealed_metadata, bound to the uuid).
  // With a key, a plain snapshot is exported only with `allow_plain` (check_plain_under_key).
  // `exported` (when given): how many snapshots the archive holds (one named twice counts once; one
  // removed while the export ran is in it all the same: its blobs were held).
  Status export_to(const std::vector<std::string>& refs, const std::string& path, bool decrypt = false,
                   bool allow_plain = false, size_t* exported = nullptr);
  // A snapshot sealed for this store's key and tenant (or plain into a plain store) is copied as
  // it is; any other (plain into an encrypted store, another key or tenant: opts) has its original
  // saved again with this store's key, keeping uuid, created, name, tags and fingerprint (of a
  // sealed snapshot: opened from its sealed_metadata with the key that opens its file).
  Result<ImportReport> import_from(const std::string& path, const ImportOptions& opts = {});

  Catalog& catalog() { return *catalog_; }
  BlobStore& blobs() { return *blobs_; }
  // The local directory (StoreLocation::local_dir).
  const StorePaths& paths() const { return paths_; }

 private:
  Store(Io& io, StorePaths paths, std::unique_ptr<BlobStore> blobs, std::unique_ptr<Catalog> catalog);
  Result<SaveResult> save_manifest(const SnapshotManifest& m, const std::vector<ChunkUse>& uses,
                                   const StateFile& parsed, const SaveRequest& req, double t0);
  Result<RestoreResult> restore_unlabeled(const std::string& ref, const RestoreRequest& req, ByteSink& out);
  // open_snapshot() under a hold the caller took (nullptr: one it keeps itself, as export does);
  // the snapshot keeps `hold` while it is open. `check_labels`: an encrypted snapshot named by
  // anything but its uuid must carry its sealed name and tags (check_sealed_labels).
  Result<std::unique_ptr<StoredSnapshot>> open_snapshot_held(const std::string& ref, std::unique_ptr<GcLockHold> hold,
                                                             bool check_labels = true);
  // The key checks of open(): see docs/store.md, "Encryption at rest".
  Status open_encryption(StoreParts& parts);
  // rekey() of one snapshot: its chunks and rows sealed again from `from` to `to` (one tenant's
  // ciphers), then its rows swapped. False when it was removed or rotated meanwhile.
  // `resealed`: the tenant's chunks sealed under `to` by the snapshots swapped before (a chunk
  // shared by several snapshots is decoded once); this snapshot's are added once it is swapped.
  Result<bool> rekey_snapshot(const SnapshotInfo& info, const ChunkCipher& from, const ChunkCipher& to,
                              const RekeyOptions& opts, ResealedChunks& resealed, RekeyReport& rep);
  // rekey_snapshot(): which of `resealed` the catalog still has rows for, of `m`'s chunks.
  Result<ResealedChunks> still_stored(const SnapshotManifest& m, const ResealedChunks& resealed);
  // A batch of new blobs (under `under`, the caller's gc lock hold, when given), once the blobs are
  // known to be this catalog's (store_identity.h; checked once per Store).
  Result<std::unique_ptr<BlobWriteBatch>> begin_blob_write(GcLockHold* under);
  // Marks the store encrypted with the given key on its first encrypted snapshot.
  Status init_encryption_meta();
  // Before every save: an encrypted store takes no plain snapshot (no key given); the first
  // encrypted save marks the store (init_encryption_meta).
  // With `mark`, a keyed save into a store without an encryption setting records it (the store is
  // encrypted from then on); import marks only once its archive passed every check.
  Status check_save_keys(bool mark = true);
  // A snapshot's manifest bytes (opened when sealed: the key checks first).
  Result<std::vector<std::byte>> manifest_of(const SnapshotRecord& rec) const;
  // What verify checks of an encrypted snapshot without the key.
  void verify_sealed(const SnapshotInfo& info, VerifyReport& rep);
  // An mlx-lm snapshot: the file byte for byte, or requantized (req.mlx); llama.cpp options refused.
  Result<RestoreResult> restore_mlx(const StoredSnapshot& snap, const std::string& ref, const RestoreRequest& req,
                                    ByteSink& out, std::chrono::steady_clock::time_point t0);
  // The end of every restore: bytes and time, and the restore's time in the catalog (eviction's order).
  RestoreResult finish_restore(RestoreResult r, uint64_t bytes_out, std::chrono::steady_clock::time_point t0);
  // The parent of a save with these tokens (the longest stored prefix of the same model), its
  // chunks, which the save hashes but does not encode again, and (`grid`, when asked for) its
  // segment table, whose cell grid the save continues (SnapshotOptions::parent_grid).
  Result<std::optional<int64_t>> find_parent(const std::vector<int32_t>& tokens, const std::string& fingerprint,
                                             const SaveRequest& req, std::map<Sha256Digest, ChunkRef>& chunks,
                                             std::optional<SegmentTable>* grid = nullptr);
  // The end of every save: name, tags, parent, pin, TTL from `req`; the catalog row (then the
  // batch is released); the caps.
  Result<SaveResult> commit_save(SnapshotRecord rec, const SnapshotManifest& m, const store_detail::BlobSink& sink,
                                 std::unique_ptr<BlobWriteBatch>& batch, const SaveRequest& req,
                                 std::optional<int64_t> parent_id, double seconds);
  // The caps after a save of `info` (see the promises above).
  Status enforce_caps(const SnapshotInfo& info, SaveResult& r);
  Status recount_after_kept_victims(const EvictionRequest& req, const std::vector<EvictionVictim>& removed,
                                    EvictionPlan& plan);
  Status enforce_caps_after_import(ImportReport& rep);
  Io& io_;
  StorePaths paths_;
  void delete_abandoned_temps(GcReport& r);  // trouble goes to r.warnings
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<Catalog> catalog_;
  std::atomic<bool> blobs_bound_{false};  // begin_blob_write's check passed
  StoreCaps caps_;
  std::string name_;                     // the store in messages
  std::string tenant_ = kDefaultTenant;
  std::optional<MasterKey> key_;         // the master key given
  std::optional<ChunkCipher> cipher_;    // the tenant's keys, when a key was given
  std::string store_key_id_;             // store_meta "encryption"
  std::string rotating_from_;            // store_meta "encryption_previous": a rotation is running
  std::function<std::string()> now_ = utc_now_iso8601;
};

// An export archive's index (kvsnap-export.json): one entry per .kvsnap in the archive.
struct ExportIndexEntry {
  std::string file;                       // the archive entry it describes
  std::string uuid, created, model_fingerprint;  // empty when absent
  std::optional<std::string> name;
  std::map<std::string, std::string> tags;
  // An encrypted snapshot's: name, tags, fingerprint and created sealed for its tenant (hex;
  // empty when absent, as in a plain entry or an archive from before they were sealed).
  std::string sealed_metadata;
};
// Parses and type-checks the index text (outside input); errors name
// `archive`, the index, the key path and what was wrong.
Result<std::vector<ExportIndexEntry>> parse_export_index(std::string_view text, const std::string& archive);

// The rotation geometry a snapshot recorded (from the model given at save), if any.
std::optional<RotationGeometry> recorded_geometry(const SnapshotManifest& m);

}  // namespace kvsnap
