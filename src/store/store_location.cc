#include "store/store_location.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <mutex>

#include "base/io.h"
#include "base/json_access.h"
#include "base/key_source.h"
#include "store/eviction.h"
#include "store/local_blob_store.h"
#include "store/pg_catalog.h"
#include "store/pg_conn.h"
#include "store/pg_gc_locks.h"
#include "store/s3_blob_store.h"

namespace kvsnap {

namespace {

constexpr uint64_t kMaxConfigBytes = 1 << 20;
constexpr const char* kConfigName = "store.json";

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string strip_trailing_slashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// The scheme of a URL ("postgresql"), empty when `s` is no URL.
std::string scheme_of(std::string_view s) {
  const size_t colon = s.find("://");
  if (colon == std::string_view::npos || colon == 0) return "";
  for (char c : s.substr(0, colon))
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.')) return "";
  return std::string(s.substr(0, colon));
}

std::string anchored(const std::string& base, const std::string& path) {
  return !path.empty() && path[0] == '/' ? path : base + "/" + path;
}

// One part of a config file: a URL of `scheme`, or a path.
struct Part {
  bool url = false;
  std::string value;
};

Result<Part> config_part(const JsonRef& root, const char* key, std::initializer_list<const char*> schemes,
                         const std::string& base) {
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> v, root.find(key));
  if (!v) return Part{};
  KV_ASSIGN_OR_RETURN(std::string s, v->string());
  if (s.empty()) return v->error("is empty");
  const std::string scheme = scheme_of(s);
  if (scheme.empty()) return Part{false, strip_trailing_slashes(anchored(base, s))};
  for (const char* ok : schemes)
    if (scheme == ok) return Part{true, s};
  std::string known;
  for (const char* ok : schemes) known += std::string(known.empty() ? "" : " or ") + ok + "://";
  return v->error("'" + redact_pg_url(s) + "' is not a path and not a " + known + " URL");
}

// A number, or a string that `parse` reads ("20G", "24h"); errors name the key.
template <class Parse>
Result<uint64_t> number_or_text(const JsonRef& v, Parse parse) {
  if (!v.json().is_string()) return v.unsigned_integer();
  KV_ASSIGN_OR_RETURN(std::string s, v.string());
  auto n = parse(s);
  if (!n.ok()) return v.error(n.status().message());
  return static_cast<uint64_t>(*n);
}

// A size: a number of bytes or a string such as "20G".
Result<uint64_t> config_size(const JsonRef& v) { return number_or_text(v, parse_byte_size); }

// A duration: a number of seconds (0 allowed) or a string such as "24h".
Result<int64_t> config_seconds(const JsonRef& v) {
  KV_ASSIGN_OR_RETURN(uint64_t n, number_or_text(v, parse_duration));
  if (n > uint64_t{1} << 40) return v.error("is too long a duration");
  return static_cast<int64_t>(n);
}

Result<StoreCaps> config_caps(const JsonRef& root) {
  StoreCaps caps;
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> max, root.find("max_bytes"));
  if (max) {
    KV_ASSIGN_OR_RETURN(caps.max_bytes, config_size(*max));
  }
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> tenants, root.find("tenant_max_bytes"));
  if (tenants) {
    KV_ASSIGN_OR_RETURN(auto members, tenants->members());
    for (const auto& [tenant, v] : members) {
      KV_ASSIGN_OR_RETURN(caps.tenant_max_bytes[tenant], config_size(v));
    }
  }
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> compact, root.find("compact_dead_percent"));
  if (compact) {
    KV_ASSIGN_OR_RETURN(int64_t percent, compact->integer(0, 100));  // 0: never compact
    caps.compact_dead_percent = int(percent);
  }
  return caps;
}

// "key_file", "key_command", "tenant": strings; a relative key file is anchored at `base`.
Result<StoreKeyConfig> config_keys(const JsonRef& root, const std::string& base) {
  StoreKeyConfig k;
  for (auto [key, out] : {std::pair{"key_file", &k.key_file}, {"key_command", &k.key_command}, {"tenant", &k.tenant}}) {
    KV_ASSIGN_OR_RETURN(std::optional<JsonRef> v, root.find(key));
    if (!v) continue;
    KV_ASSIGN_OR_RETURN(*out, v->string());
    if (out->empty()) return v->error("is empty");
    if (out == &k.tenant) {
      Status t = check_tenant_name(k.tenant);
      if (!t.ok()) return v->error(t.message());
    }
  }
  if (!k.key_file.empty()) k.key_file = anchored(base, k.key_file);
  return k;
}

// Whether another user could have written `path`: it is not owned by this user or root, or is
// writable by group or others; "" when only its owner (or root) could.
std::string written_by_others(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "cannot be checked (stat failed)";
  if (st.st_uid != ::geteuid() && st.st_uid != 0) return "is owned by uid " + std::to_string(st.st_uid);
  const bool sticky_dir = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX);  // /tmp: others cannot replace files
  if ((st.st_mode & 022) && !sticky_dir) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    return std::string("is writable by other users (mode ") + mode + ")";
  }
  return "";
}

// A config that names a key command (run through /bin/sh) or a key file is taken only when no other
// user could have written it or put it there: anyone who can write the store's directory (its
// SQLite catalog's WAL lives there) could otherwise have kvsnap run their command, or seal new
// snapshots under a key they know (a review's finding).
// "" when trusted; else why not (load_store_key refuses the config's key settings with it, unless
// the command line names the key).
std::string key_config_distrust(const std::string& config, const StoreKeyConfig& keys) {
  if (keys.key_command.empty() && keys.key_file.empty()) return "";
  const char* what = keys.key_command.empty() ? "key_file" : "key_command";
  for (const std::string& path : {config, dir_of(config)}) {
    const std::string problem = written_by_others(path);
    if (problem.empty()) continue;
    return "store config " + config + " sets " + what + ", but " +
           (path == config ? std::string("the file ") : "its directory " + path + " ") + problem +
           ": kvsnap takes keys only from a config no other user could have written (chmod go-w it, or pass "
           "{--key-file} / {--key-command} on the command line)";
  }
  return "";
}

}  // namespace

void apply_key_flags(StoreLocation& where, const StoreKeyConfig& flags) {
  if (!flags.key_file.empty() || !flags.key_command.empty()) {
    where.keys.key_file = flags.key_file;
    where.keys.key_command = flags.key_command;
    where.keys.distrusted.clear();  // the command line's own
  }
  if (!flags.tenant.empty()) where.keys.tenant = flags.tenant;
  where.keys.keyless_ok = where.keys.keyless_ok || flags.keyless_ok;
}

Result<std::optional<MasterKey>> load_store_key(const StoreKeyConfig& keys) {
  if (!keys.key_file.empty() && !keys.key_command.empty())
    return Status::InvalidArgument("give the store's key once: {--key-file} or {--key-command}, not both");
  if (keys.key_file.empty() && keys.key_command.empty()) return std::optional<MasterKey>();
  if (!keys.distrusted.empty()) return Status::InvalidArgument(keys.distrusted);
  // Once per process: a key command may prompt, and serve opens its store more than once.
  static std::mutex mu;
  static std::map<std::string, Result<MasterKey>>* loaded = new std::map<std::string, Result<MasterKey>>();
  const std::string source = keys.key_file.empty() ? "command:" + keys.key_command : "file:" + keys.key_file;
  std::lock_guard<std::mutex> hold(mu);
  auto it = loaded->find(source);
  if (it == loaded->end())
    it = loaded->emplace(source, keys.key_file.empty() ? run_key_command(keys.key_command) : load_key_file(keys.key_file))
             .first;
  if (!it->second.ok()) return it->second.status();
  return std::optional<MasterKey>(*it->second);
}

StoreLocation directory_store(std::string dir) {
  dir = strip_trailing_slashes(std::move(dir));
  StoreLocation l;
  l.catalog = dir + "/catalog.sqlite";
  l.blobs = dir;
  l.local_dir = std::move(dir);
  return l;
}

Result<StoreLocation> parse_store_config(std::string_view text, const std::string& file) {
  KV_ASSIGN_OR_RETURN(nlohmann::json doc, parse_json(text, file, Code::kInvalidArgument));
  const JsonRef root(doc, file, Code::kInvalidArgument);
  KV_ASSIGN_OR_RETURN(auto members, root.members());
  for (const auto& [key, value] : members)
    if (key != "catalog" && key != "blobs" && key != "local_dir" && key != "max_bytes" && key != "tenant_max_bytes" &&
        key != "cache_max_bytes" && key != "multipart_max_age" && key != "key_file" && key != "key_command" &&
        key != "tenant" && key != "compact_dead_percent")
      return value.error("is not a store config key (catalog, blobs, local_dir, max_bytes, tenant_max_bytes, "
                         "compact_dead_percent, cache_max_bytes, multipart_max_age, key_file, key_command, tenant)");
  const std::string base = dir_of(file);
  KV_ASSIGN_OR_RETURN(Part local, config_part(root, "local_dir", {}, base));
  StoreLocation l = directory_store(local.value.empty() ? base : local.value);
  l.config = file;
  KV_ASSIGN_OR_RETURN(l.caps, config_caps(root));
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> cache, root.find("cache_max_bytes"));
  if (cache) {
    KV_ASSIGN_OR_RETURN(l.cache_max_bytes, config_size(*cache));
  }
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> age, root.find("multipart_max_age"));
  if (age) {
    KV_ASSIGN_OR_RETURN(l.multipart_max_age_s, config_seconds(*age));
  }
  KV_ASSIGN_OR_RETURN(Part catalog, config_part(root, "catalog", {"postgresql", "postgres"}, base));
  if (!catalog.value.empty()) {
    l.catalog_kind = catalog.url ? CatalogKind::kPostgres : CatalogKind::kSqlite;
    l.catalog = catalog.value;
  }
  KV_ASSIGN_OR_RETURN(Part blobs, config_part(root, "blobs", {"s3"}, base));
  if (!blobs.value.empty()) {
    l.blob_kind = blobs.url ? BlobKind::kS3 : BlobKind::kLocal;
    l.blobs = blobs.value;
  }
  KV_ASSIGN_OR_RETURN(l.keys, config_keys(root, base));
  if (l.blob_kind == BlobKind::kS3 && (l.blobs.size() <= 5 || l.blobs[5] == '/'))
    return Status::InvalidArgument(file + ": blobs: '" + l.blobs + "' names no bucket (s3://BUCKET[/PREFIX])");
  return l;
}

Result<StoreLocation> resolve_store_location(Io& io, const std::string& given) {
  std::string where = given;
  if (where.empty()) where = env("KVSNAP_HOME");
  if (where.empty()) {
    std::string data = env("XDG_DATA_HOME");
    if (data.empty()) {
      std::string home = env("HOME");
      if (home.empty())
        return Status::InvalidArgument("no store directory: set KVSNAP_HOME or HOME, or pass {--store DIR}");
      data = home + "/.local/share";
    }
    where = data + "/kvsnap";
  }
  if (!scheme_of(where).empty())
    return Status::InvalidArgument("store '" + redact_pg_url(where) + "': a URL names only a store's catalog or "
                                   "its blobs; write a store config file (JSON: catalog, blobs, local_dir) and give "
                                   "its path (docs/store.md, \"Storage interface\")");
  where = strip_trailing_slashes(std::move(where));
  std::string config;
  if (ends_with(where, ".json")) {
    config = where;
  } else {
    // A regular file named as a store would fail below as "FILE/store.json: Not a directory", a path
    // the user never gave (a review's finding).
    std::error_code ec;
    if (std::filesystem::exists(where, ec) && !std::filesystem::is_directory(where, ec))
      return Status::InvalidArgument("store " + where + ": neither a store directory nor a store config file (.json)");
    KV_ASSIGN_OR_RETURN(bool configured, io.exists(where + "/" + kConfigName));
    if (!configured) return directory_store(where);
    config = where + "/" + kConfigName;
  }
  KV_ASSIGN_OR_RETURN(bool present, io.exists(config));
  if (!present) return Status::NotFound("store config file " + config + " does not exist");
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, read_all(io, config, kMaxConfigBytes));
  KV_ASSIGN_OR_RETURN(StoreLocation loc,
                      parse_store_config(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), config));
  loc.keys.distrusted = key_config_distrust(config, loc.keys);
  return loc;
}

Result<std::unique_ptr<Catalog>> open_catalog(const StoreLocation& where, const CatalogOptions& options) {
  if (where.catalog_kind == CatalogKind::kPostgres) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<PgCatalog> pg, PgCatalog::open(where.catalog, options));
    return std::unique_ptr<Catalog>(std::move(pg));
  }
  return Catalog::open(where.catalog, options);
}

Result<std::unique_ptr<BlobStore>> open_blob_store(Io& io, const StoreLocation& where) {
  // The gc locks follow the catalog: a PostgreSQL catalog shared by hosts locks in its database; a
  // SQLite catalog's store locks a file on this host (gc_lock.h).
  std::unique_ptr<GcLocks> locks;
  if (where.catalog_kind == CatalogKind::kPostgres) locks = std::make_unique<PgGcLocks>(where.catalog);
  if (where.blob_kind == BlobKind::kS3) {
    KV_ASSIGN_OR_RETURN(S3Location s3, parse_s3_location(where.blobs));
    S3BlobStoreOptions opt;
    opt.staging_dir = where.local_dir + "/tmp/s3-packs";
    if (where.cache_max_bytes > 0) opt.cache_dir = where.local_dir + "/s3-cache";
    opt.cache_bytes = where.cache_max_bytes;
    opt.upload_max_age_s = where.multipart_max_age_s;
    if (!locks) locks = file_gc_locks(io, where.local_dir + "/gc.lock");
    KV_ASSIGN_OR_RETURN(std::unique_ptr<S3BlobStore> blobs,
                        S3BlobStore::open(io, std::move(s3), std::move(opt), std::move(locks)));
    return std::unique_ptr<BlobStore>(std::move(blobs));
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<LocalBlobStore> blobs, LocalBlobStore::open(io, where.blobs, std::move(locks)));
  return std::unique_ptr<BlobStore>(std::move(blobs));
}

// A SQLite catalog file cut to nothing (truncated, or emptied by a disk or a user) beside local
// blobs that hold a store id, which only a catalog with its schema ever wrote: SQLite would take
// it for a new catalog, so ls and verify would report an empty store, all good, and write a new
// schema over the evidence. Refused before it is opened (gc and doctor refused it already, by the
// ids). A store whose first save never got as far as the id is a new store still.
Status refuse_emptied_catalog(Io& io, const StoreLocation& where) {
  if (where.catalog_kind != CatalogKind::kSqlite || where.blob_kind != BlobKind::kLocal) return Status::OK();
  auto stamp = io.stamp(where.catalog);
  if (!stamp.ok() || stamp->size != 0) return Status::OK();
  auto has_id = io.exists(where.blobs + "/" + kStoreIdName);
  if (!has_id.ok() || !*has_id) return Status::OK();
  return Status::Corruption(where.catalog + ": the catalog is empty (0 bytes), and the blobs at " + where.blobs +
                            " belong to a store that had one: it was lost or cut; put back a copy of catalog.sqlite "
                            "(kvsnap cannot rebuild it from the blobs)");
}

Result<StoreParts> open_store_parts(Io& io, const StoreLocation& where) {
  StoreParts parts;
  KV_ASSIGN_OR_RETURN(parts.key, load_store_key(where.keys));
  KV_RETURN_IF_ERROR(io.create_dirs(where.local_dir));
  KV_RETURN_IF_ERROR(refuse_emptied_catalog(io, where));
  // The catalog first: a damaged one is refused before the blob store makes its directories (a
  // review's finding: `ls` beside a damaged catalog left chunks/, packs/ and tmp/ behind).
  CatalogOptions catalog_options;
  catalog_options.io = &io;  // where the room reserve's free space is measured
  KV_ASSIGN_OR_RETURN(parts.catalog, open_catalog(where, catalog_options));
  KV_ASSIGN_OR_RETURN(parts.blobs, open_blob_store(io, where));
  parts.local_dir = where.local_dir;
  parts.caps = where.caps;
  parts.name = where.config.empty() ? where.local_dir : where.config;
  if (!where.keys.tenant.empty()) parts.tenant = where.keys.tenant;
  parts.keyless_ok = where.keys.keyless_ok;
  return parts;
}

}  // namespace kvsnap
