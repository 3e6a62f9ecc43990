// Where a store is, and opening its parts. What the user gives `--store` (or
// $KVSNAP_HOME) is parsed into three parts:
//
//   catalog    which snapshots exist (catalog.h): a SQLite file, or a
//              PostgreSQL database, postgresql://USER@HOST[:PORT]/DB (pg_catalog.h)
//   blobs      the chunk blobs (blob_store.h): a directory, or an S3-compatible
//              bucket, s3://BUCKET[/PREFIX][?endpoint=URL] (s3_blob_store.h; packs
//              are staged in the bucket, blobs read are cached in
//              <local_dir>/s3-cache)
//   local_dir  this host's own directory, always local: temporaries of
//              restores and imports (tmp/), server profiles (servers.json),
//              kvsnap serve's slots
//
// Today's store, a directory DIR, is all three in one place: DIR/catalog.sqlite,
// blobs under DIR (local_blob_store.h), the file gc lock DIR/gc.lock. A store
// config file (JSON) names the parts apart:
//
//   {"catalog": "postgresql://kvsnap@db.internal/kvsnap",
//    "blobs": "s3://kv-cache/team-a",
//    "local_dir": "/var/cache/kvsnap"}
//
// Every key is optional: catalog defaults to <local_dir>/catalog.sqlite, blobs
// to local_dir, local_dir to the config file's directory; relative paths are
// relative to that directory; an unknown key is an error (a typo must not
// silently give another store). `--store FILE.json` names a config file, and a
// directory holding store.json is configured by it.
//
// "cache_max_bytes" bounds this host's read-through cache of S3 blobs
// (<local_dir>/s3-cache; default 1 GiB, 0: no cache), a size as below;
// "multipart_max_age" is how old an incomplete multipart upload of a pack must
// be for gc to abort it (a duration, "24h" by default, or seconds; 0: any).
//
// Two more optional keys cap the store's size (eviction.h; docs/store.md,
// "Caps and eviction"), enforced after every save: "max_bytes" for the whole
// store and "tenant_max_bytes": {"TENANT": N, ...} per tenant (the serve.ns
// tag); a size is a number of bytes or a string like "20G".
//
// Encryption at rest (docs/store.md, "Encryption at rest"): "key_file" (a path, relative to
// the config file's directory) or "key_command" (run with /bin/sh -c) gives the master key,
// "tenant" the tenant (default "default"); the command line's --key-file, --key-command and
// --tenant override them (StoreKeyConfig). The key is loaded once per process
// (load_store_key), however many times the store is opened.
//
// The gc locks (gc_lock.h) follow the catalog: a SQLite catalog's store locks
// <blob directory>/gc.lock (<local_dir>/gc.lock for blobs that are not local,
// as a SQLite catalog serves one host); a PostgreSQL catalog's store uses
// advisory locks in its database (pg_gc_locks.h), so that gc is safe across
// hosts. open_blob_store() is where a backend's locks are handed to the blob store.
//
// Not yet handled for a configured store: the store's own temporaries
// (restore, import) stay in <local_dir>/tmp, which gc empties only when the
// blobs are local in that same directory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/chunk_cipher.h"
#include "base/io.h"
#include "base/status.h"
#include "store/blob_store.h"
#include "store/catalog.h"

namespace kvsnap {

enum class CatalogKind { kSqlite, kPostgres };
enum class BlobKind { kLocal, kS3 };

// Size caps a store enforces after every save (store config keys).
struct StoreCaps {
  std::optional<uint64_t> max_bytes;
  std::map<std::string, uint64_t> tenant_max_bytes;
  // "compact_dead_percent": the compaction threshold of the collections a removal or a save's
  // eviction runs, and of `kvsnap gc` without --compact-dead (0: never; unset: GcOptions's 25).
  std::optional<int> compact_dead_percent{};
};

// Where an encrypted store's master key comes from, and the tenant whose keys are used.
struct StoreKeyConfig {
  std::string key_file;     // at most one of key_file and key_command; both empty: no key
  std::string key_command;
  std::string tenant;       // empty: "default"
  // Open an encrypted store without its key (what verify and gc need, which can check or
  // collect what is sealed without reading it). Otherwise such a store refuses to open.
  bool keyless_ok = false;
  // Set when key_file/key_command came from a store config another user could have written: why
  // (load_store_key refuses it then, and runs no command). Cleared by the command line's own key.
  std::string distrusted;
};

inline constexpr const char* kDefaultTenant = "default";

struct StoreLocation {
  CatalogKind catalog_kind = CatalogKind::kSqlite;
  std::string catalog;    // kSqlite: the file; kPostgres: the postgresql:// URL
  BlobKind blob_kind = BlobKind::kLocal;
  std::string blobs;      // kLocal: the directory; kS3: the s3:// URL
  std::string local_dir;  // a directory on this host
  std::string config;     // the store config file it came from; empty for a plain directory
  StoreCaps caps;
  uint64_t cache_max_bytes = uint64_t{1} << 30;  // S3 blobs' read-through cache; 0: none
  int64_t multipart_max_age_s = 24 * 3600;       // gc aborts older incomplete S3 uploads
  StoreKeyConfig keys;
};

// The embedded default in `dir`: DIR/catalog.sqlite, blobs in DIR.
StoreLocation directory_store(std::string dir);

// Parses a store config file's text (`file` names it in messages and anchors
// relative paths). kInvalidArgument names the file, the key and the problem.
Result<StoreLocation> parse_store_config(std::string_view text, const std::string& file);

// `given` (--store) when non-empty, else $KVSNAP_HOME, else
// ${XDG_DATA_HOME:-~/.local/share}/kvsnap; then: a FILE.json is a config file,
// a directory holding store.json is configured by it, any other directory
// (existing or not) is the embedded default. A bare postgresql:// or s3:// URL
// is refused: it names one part only. kInvalidArgument when no environment
// variable names a home.
Result<StoreLocation> resolve_store_location(Io& io, const std::string& given);

// The command line's key options over the config file's: a non-empty key_file or key_command
// replaces both of the config's, a non-empty tenant replaces its tenant.
void apply_key_flags(StoreLocation& where, const StoreKeyConfig& flags);

// The opened parts of a store, for Store::open (tests may pass any implementation).
struct StoreParts {
  std::unique_ptr<Catalog> catalog;
  std::unique_ptr<BlobStore> blobs;  // with the gc locks every user of the store shares
  std::string local_dir;
  StoreCaps caps;
  std::string name;                  // the store in messages: its config file or directory
  std::optional<MasterKey> key;      // the master key given (load_store_key)
  std::string tenant = kDefaultTenant;
  bool keyless_ok = false;           // StoreKeyConfig::keyless_ok
};

// The master key `keys` names (nullopt when none): from the key file or key command, each
// loaded once per process (a second call with the same source returns the first result).
// kInvalidArgument when both are given.
Result<std::optional<MasterKey>> load_store_key(const StoreKeyConfig& keys);

// Opens the catalog `where` names (a SQLite file's directory must exist).
// Errors name the catalog (never its password).
Result<std::unique_ptr<Catalog>> open_catalog(const StoreLocation& where, const CatalogOptions& options = {});
// Opens the blobs (creating a local directory's layout) with their gc locks.
Result<std::unique_ptr<BlobStore>> open_blob_store(Io& io, const StoreLocation& where);
// Both, and local_dir created when missing.
Result<StoreParts> open_store_parts(Io& io, const StoreLocation& where);

}  // namespace kvsnap
