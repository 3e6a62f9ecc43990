#include "base/text.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "cli/open_state.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <set>

#include "migrate/cross_engine.h"
#include "store/s3_client.h"
#include "store/store_seal.h"

namespace kvsnap::cli {

std::string mib(uint64_t b, int decimals) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f MiB", decimals, double(b) / (1 << 20));
  return buf;
}

StoreKeyConfig& store_key_flags() {
  static StoreKeyConfig flags;
  return flags;
}

void add_store_key_options(CLI::App* sub) {
  StoreKeyConfig& f = store_key_flags();
  auto* file = sub->add_option("--key-file", f.key_file,
                               "encrypted store: the master key, 32 raw bytes or 64 hex digits, in a file only its "
                               "owner may read (also store.json \"key_file\")");
  auto* cmd = sub->add_option("--key-command", f.key_command,
                              "encrypted store: a shell command that prints the master key (also \"key_command\")");
  file->excludes(cmd);
  if (!sub->get_option_no_throw("--tenant"))
    sub->add_option("--tenant", f.tenant,
                    "encrypted store: whose keys (derived from the master key) to use (default 'default'; also "
                    "\"tenant\")");
}

Result<StoreLocation> store_location(const std::string& dir) {
  KV_ASSIGN_OR_RETURN(StoreLocation where, resolve_store_location(cli_io(), dir));
  apply_key_flags(where, store_key_flags());
  if (!where.keys.tenant.empty()) {
    Status t = check_tenant_name(where.keys.tenant);
    if (!t.ok()) return Status::InvalidArgument("{--tenant}: " + t.message());
  }
  return where;
}

// Opening a store creates its catalog and layout; a command that reads or changes what is stored
// refuses a store that is not there instead. A PostgreSQL catalog's existence is its server's answer.
static Status require_existing_store(const StoreLocation& where) {
  // A bad address is the first thing to say, before whether anything is stored behind it.
  if (where.blob_kind == BlobKind::kS3) KV_RETURN_IF_ERROR(parse_s3_location(where.blobs).status());
  if (where.catalog_kind != CatalogKind::kSqlite) return Status::OK();
  KV_ASSIGN_OR_RETURN(bool there, cli_io().exists(where.catalog));
  if (there) return Status::OK();
  const std::string& named = where.config.empty() ? where.local_dir : where.config;
  return Status::NotFound("no store at " + named + " (no " + where.catalog +
                          "): nothing has been saved there; `kvsnap save` or `kvsnap import` creates a store, "
                          "--store DIR or $KVSNAP_HOME names another");
}

Result<std::unique_ptr<Store>> open_store(const std::string& dir, bool keyless_ok) {
  KV_ASSIGN_OR_RETURN(StoreLocation where, store_location(dir));
  where.keys.keyless_ok = keyless_ok;
  KV_RETURN_IF_ERROR(require_existing_store(where));
  return Store::open(cli_io(), where);
}

// The directory that holds `path` ("a/b" for "a/b/c" and "a/b/c/"; "" at the top of a relative
// path, "/" at the root).
static std::string parent_of(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return std::filesystem::path(path).parent_path().string();
}

Result<std::optional<std::string>> new_store_dirs(const std::string& dir) {
  KV_ASSIGN_OR_RETURN(StoreLocation where, store_location(dir));
  if (!where.config.empty() || where.catalog_kind != CatalogKind::kSqlite || where.blob_kind != BlobKind::kLocal)
    return std::optional<std::string>();
  KV_ASSIGN_OR_RETURN(bool there, cli_io().exists(where.local_dir));
  if (there) return std::optional<std::string>();
  // A `..` anywhere, or a `.` past the start (`./store` is fine): `typo/../data/kv` names
  // data/kv, whose existing `data` the walk below would take for new (there is no `typo/..` while
  // there is no typo), and `a/./b` would stop the removal at `a/.`. Such a store is never taken away.
  bool first = true;
  for (const std::filesystem::path& part : std::filesystem::path(where.local_dir).relative_path()) {
    if (part == ".." || (part == "." && !first)) return std::optional<std::string>();
    first = false;
  }
  std::string first_new = where.local_dir;
  for (std::string up = parent_of(first_new); !up.empty() && up != first_new; up = parent_of(up)) {
    KV_ASSIGN_OR_RETURN(bool up_there, cli_io().exists(up));
    if (up_there) break;
    first_new = up;
  }
  return std::optional<std::string>(first_new);
}

// What a store just created holds and nothing else: its catalog (and SQLite's side files), the gc
// lock, and the empty directories for chunks, packs and temporaries. nullopt when the directory
// holds anything more (a concurrent save's pack or temporary, a `kvsnap server add` profile, a
// symbolic link where a directory should be): then it is not removed.
static Result<std::optional<std::vector<std::string>>> fresh_store_entries(Io& io, const std::string& dir) {
  static const std::set<std::string> kFiles = {"catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm",
                                               "catalog.sqlite-journal", "catalog.sqlite-reserve", "gc.lock"};
  static const std::set<std::string> kDirs = {"chunks", "packs", "tmp"};
  KV_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, io.list_dir(dir));
  std::vector<std::string> files, dirs;
  for (const DirEntry& e : entries) {
    if (e.is_regular && kFiles.count(e.name)) {
      files.push_back(dir + "/" + e.name);
    } else if (e.is_dir && !e.is_symlink && kDirs.count(e.name)) {
      KV_ASSIGN_OR_RETURN(std::vector<DirEntry> inside, io.list_dir(dir + "/" + e.name));
      if (!inside.empty()) return std::optional<std::vector<std::string>>();
      dirs.push_back(dir + "/" + e.name);
    } else {
      return std::optional<std::vector<std::string>>();
    }
  }
  files.insert(files.end(), dirs.begin(), dirs.end());  // the files, then the empty directories
  files.push_back(dir);
  return std::optional<std::vector<std::string>>(std::move(files));
}

Status remove_new_store(const std::string& dir, const std::string& first_new) {
  KV_ASSIGN_OR_RETURN(StoreLocation where, store_location(dir));
  {
    KV_ASSIGN_OR_RETURN(auto store, Store::open(cli_io(), where));
    KV_ASSIGN_OR_RETURN(auto listed, store->catalog().list());
    if (!listed.empty()) return Status::OK();  // another command stored something meanwhile: it stays
  }
  KV_ASSIGN_OR_RETURN(auto entries, fresh_store_entries(cli_io(), where.local_dir));
  if (!entries) return Status::OK();  // it holds more than a new store: left as it is
  for (const std::string& path : *entries) KV_RETURN_IF_ERROR(cli_io().remove(path));
  // the parents it created, while they are empty (one that is not ends it quietly)
  std::string up = where.local_dir;
  while (up != first_new && up.size() > first_new.size()) {
    up = parent_of(up);
    if (up.empty() || !cli_io().remove(up).ok()) break;
  }
  return Status::OK();
}

Result<std::unique_ptr<Store>> open_or_create_store(const std::string& dir) {
  KV_ASSIGN_OR_RETURN(StoreLocation where, store_location(dir));
  return Store::open(cli_io(), where);
}

uint64_t stored_bytes_of(Store& store, const std::vector<std::string>& refs) {
  uint64_t total = 0;
  if (refs.empty()) {
    auto all = store.catalog().list();
    if (!all.ok()) return 0;
    for (const SnapshotInfo& s : *all) total += s.stored_bytes;
    return total;
  }
  for (const std::string& r : refs) {
    auto id = store.catalog().resolve(r);
    if (!id.ok()) return 0;
    auto info = store.catalog().get_info(*id);
    if (!info.ok()) return 0;
    total += info->stored_bytes;
  }
  return total;
}

json info_json(const SnapshotInfo& s) {
  json j = {{"id", s.id}, {"uuid", s.uuid}, {"name", s.name ? json(*s.name) : json(nullptr)},
            {"created", s.created}, {"model_arch", s.model_arch}, {"model_fingerprint", s.model_fingerprint},
            {"n_tokens", s.n_tokens}, {"k_types", s.k_types}, {"v_types", s.v_types},
            {"v_layout", s.v_trans ? "transposed" : "rows"}, {"source_format", s.source_format},
            {"raw_bytes", s.raw_bytes}, {"stored_bytes", s.stored_bytes},
            {"lossy", s.lossy.empty() ? json(nullptr) : json(s.lossy)},
            {"parent_id", s.parent_id ? json(*s.parent_id) : json(nullptr)},
            {"n_chunks", s.n_chunks}, {"pinned", s.pinned},
            {"expires_at", s.expires_at ? json(*s.expires_at) : json(nullptr)},
            {"last_restored", s.last_restored ? json(*s.last_restored) : json(nullptr)}};
  // `content_sha256` (= sha256sum of the restored file) only where the catalog has that;
  // `content_digest` with its rule always (docs/store.md, "Content digest").
  const ContentDigestText d = split_content_digest(s.content_sha256, s.tenant.has_value());
  if (d.rule == "sha256" || d.rule == "hmac-sha256") j["content_sha256"] = d.hex;
  j["content_digest"] = d.hex;
  j["content_digest_rule"] = d.rule;
  j["tags"] = s.tags;  // built from the sorted map at once (one insert each would search the object: n^2)
  j["encryption"] = s.tenant ? json{{"tenant", *s.tenant}, {"master_key_id", s.master_key_id},
                                    {"tenant_key_id", s.tenant_key_id}}
                             : json(nullptr);
  return j;
}

std::string label(const SnapshotInfo& s) {
  return s.name ? shown_text(*s.name) + " (id " + std::to_string(s.id) + ")" : "id " + std::to_string(s.id);
}

json victim_json(const EvictionVictim& v) {
  return {{"snapshot", info_json(v.info)}, {"reason", v.expired ? "expired" : "lru"}, {"freed_bytes", v.freed_bytes}};
}

std::string victim_line(const EvictionVictim& v) {
  return label(v.info) + (v.expired ? " (expired " + v.info.expires_at.value_or("") + ")"
                                    : " (last used " + v.info.last_restored.value_or(v.info.created) + ")") +
         ", frees " + mib(v.freed_bytes);
}

Result<std::pair<std::string, std::string>> parse_tag(const std::string& t) {
  const auto eq = t.find('=');
  if (eq == std::string::npos || eq == 0) return Status::InvalidArgument("--tag '" + t + "': expected KEY=VALUE");
  return std::make_pair(t.substr(0, eq), t.substr(eq + 1));
}

Status refuse_existing(const std::string& path, bool force, const std::string& command) {
  KV_RETURN_IF_ERROR(refuse_irregular_output(path, command));
  struct stat st {};
  if (!force && ::stat(path.c_str(), &st) == 0)
    return Status::InvalidArgument(path + " exists; pass --force to replace it");
  return Status::OK();
}

Status refuse_output_over_inputs(const std::string& out, const Store& store,
                                 const std::vector<std::pair<std::string, std::string>>& inputs) {
  struct stat b {};
  const bool exists = ::stat(out.c_str(), &b) == 0;
  for (const auto& [path, what] : inputs) {
    struct stat a {};
    if (exists && !path.empty() && ::stat(path.c_str(), &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      return Status::InvalidArgument(out + ": is " + what + "; kvsnap never writes over its input");
  }
  // An existing file inside the store's directory is one of its files (its catalog, a pack); the
  // rename would destroy it. A new file there is not (a config store's directory is often where the
  // user works), except in the directories the store manages, whose files gc deletes when no
  // snapshot names them (tmp/, packs/, chunks/).
  std::error_code ec;
  const std::filesystem::path root = std::filesystem::weakly_canonical(store.paths().root, ec);
  if (ec || root.empty()) return Status::OK();
  const std::filesystem::path dir = std::filesystem::weakly_canonical(std::filesystem::absolute(out).parent_path(), ec);
  if (ec) return Status::OK();
  auto under = [&dir](const std::filesystem::path& top) {
    return std::mismatch(top.begin(), top.end(), dir.begin(), dir.end()).first == top.end();
  };
  for (const char* managed : {"tmp", "packs", "chunks"}) {
    if (under(root / managed)) {
      return Status::InvalidArgument(out + ": is inside the store's " + managed + "/ (" + root.string() +
                                     "), whose files gc deletes; write it elsewhere");
    }
  }
  if (exists && under(root))
    return Status::InvalidArgument(out + ": is inside the store (" + root.string() +
                                   "); kvsnap never writes into its store's directory");
  return Status::OK();
}

Result<std::vector<int32_t>> read_token_list(const std::string& path) {
  KV_ASSIGN_OR_RETURN(auto bytes, read_all(cli_io(), path, uint64_t(256) << 20));
  return parse_token_file_text(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

json server_build_json(const ServerBuild& b) {
  return {{"reported", b.reported.empty() ? json(nullptr) : json(b.reported)},
          {"usable", b.usable.empty() ? json(nullptr) : json(b.usable)},
          {"why_not", b.why_not.empty() ? json(nullptr) : json(b.why_not)}};
}

std::string server_build_note(const ServerBuild& b) {
  if (b.reported.empty()) return "; the server's /props has no build_info";
  if (!b.usable.empty()) return "; the server reports llama.cpp " + b.reported;
  return "; the server's build_info '" + b.reported + "' was not used (" + b.why_not + ")";
}
}  // namespace kvsnap::cli
