// kvsnap doctor: checks a setup (the SIMD level, the store, its catalog, every server profile:
// reachable, its build, its slot directory, its cache types and model) and
// says what to fix. Changes nothing.
#include <unistd.h>

#include <cstdlib>

#include "base/json_access.h"
#include "base/sha256_lanes.h"
#include "base/simd_level.h"
#include "cli/progress.h"
#include "cli/commands.h"
#include "cli/store_common.h"
#include "server/server_flows.h"
#include "server/server_profiles.h"
#include "store/catalog.h"
#include "store/pg_conn.h"
#include "store/store_identity.h"
#include "store/store_location.h"

namespace kvsnap::cli {
namespace {

enum class Verdict { kOk, kWarn, kFail };

struct Check {
  Verdict verdict;
  std::string what, detail, fix;  // fix: empty when nothing is to do
};

const char* verdict_word(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kWarn: return "warn";
    case Verdict::kFail: return "FAIL";
  }
  return "?";
}

bool is_dir(const std::string& p) {
  auto there = cli_io().exists(p);
  return there.ok() && *there && ::access(p.c_str(), X_OK) == 0;
}

bool writable(const std::string& p) { return ::access(p.c_str(), W_OK) == 0; }

// The SIMD level every kernel uses (base/simd_level.h), and whether KVSNAP_SIMD asked for one this
// CPU cannot run or KVSNAP_AVX512_HALVES is neither 1 nor 0 (either is then ignored).
void check_simd(std::vector<Check>& out) {
  std::string runs;
  for (size_t i = 0; i < simd::kLevelCount; ++i)
    if (simd::supported(simd::Level(i))) runs += std::string(runs.empty() ? "" : " ") + simd::level_name(simd::Level(i));
  const std::string in_use = simd::level_name(simd::level());
  const std::string cpu = "this CPU runs: " + runs + "; " + simd::describe();
  const char* env = std::getenv("KVSNAP_SIMD");
  if (env && in_use != env) {
    out.push_back({Verdict::kWarn, "simd", std::string("KVSNAP_SIMD=") + env + " is not a level this CPU runs, so " +
                                               in_use + " is used (" + cpu + ")",
                   "unset KVSNAP_SIMD, or set it to one of: " + runs});
    return;
  }
  const char* halves = std::getenv("KVSNAP_AVX512_HALVES");
  if (halves && std::string_view(halves) != "0" && std::string_view(halves) != "1") {
    out.push_back({Verdict::kWarn, "simd",
                   std::string("KVSNAP_AVX512_HALVES=") + halves + " is neither 1 nor 0, so it is ignored (" + cpu + ")",
                   "unset KVSNAP_AVX512_HALVES, or set it to 1 (the avx512 level's q8_0 rows as for 512-bit operations "
                   "split in halves, as on Zen 4) or 0 (as at full width)"});
    return;
  }
  out.push_back({Verdict::kOk, "simd",
                 in_use + (env ? std::string(", set by KVSNAP_SIMD (best here: ") + simd::level_name(simd::best_level()) + "; "
                               : std::string(" (the best here; ")) +
                     cpu + ")",
                 ""});
}

// The SHA-256 kernel the store's chunk ids and checks use (base/sha256_lanes.h), and whether
// KVSNAP_SHA asked for one this CPU cannot run (the best it has is then used).
void check_sha256(std::vector<Check>& out) {
  std::string runs;
  for (Sha256Kernel k : kSha256Kernels)
    if (sha256_kernel_supported(k)) runs += std::string(runs.empty() ? "" : " ") + sha256_kernel_name(k);
  const std::string in_use = sha256_kernel_name(sha256_kernel());
  const char* env = std::getenv("KVSNAP_SHA");
  bool env_runs = false;
  for (Sha256Kernel k : kSha256Kernels)
    env_runs = env_runs || (env && sha256_kernel_supported(k) && std::string_view(env) == sha256_kernel_name(k));
  if (env && !env_runs) {
    out.push_back({Verdict::kWarn, "sha256",
                   std::string("KVSNAP_SHA=") + env + " is not a kernel this CPU runs, so " + in_use +
                       " is used (this CPU runs: " + runs + ")",
                   "unset KVSNAP_SHA, or set it to one of: " + runs});
    return;
  }
  const char* simd_env = std::getenv("KVSNAP_SIMD");
  if (env && in_use != env) {  // a kernel this CPU runs, lowered by KVSNAP_SIMD (scalar, or avx2 for avx512-x8)
    const bool scalar = simd::level() == simd::Level::kScalar;
    out.push_back({Verdict::kWarn, "sha256",
                   std::string("KVSNAP_SHA=") + env + " is overridden by KVSNAP_SIMD=" + (simd_env ? simd_env : "") +
                       (scalar ? " (no SIMD anywhere)" : " (AVX2's lanes)") + ", so " + in_use +
                       " is used (this CPU runs: " + runs + ")",
                   "unset KVSNAP_SIMD or KVSNAP_SHA"});
    return;
  }
  // Not the best this CPU runs without KVSNAP_SHA: KVSNAP_SIMD lowered it (scalar: OpenSSL's one
  // stream; avx2: avx2-x8 for avx512-x8).
  const bool lowered = !env && simd_env &&
                       (std::string(simd_env) == "scalar" ||
                        (in_use == sha256_kernel_name(Sha256Kernel::kAvx2X8) &&
                         sha256_kernel_supported(Sha256Kernel::kAvx512X8)));
  const std::string why = env       ? " (set by KVSNAP_SHA"
                          : lowered ? std::string(" (KVSNAP_SIMD=") + simd_env
                                    : " (the best here";
  out.push_back({Verdict::kOk, "sha256", in_use + why + "; this CPU runs: " + runs + ")", ""});
}

// The packs and, without packs, the loose blobs a local blob directory holds, listed without
// creating anything (a LocalBlobStore makes its directories when opened) and by its rules (a pack
// name; a blob name in the shard of its first two digits). A missing directory holds none.
Result<std::pair<size_t, size_t>> count_local_blobs(const std::string& root) {
  size_t packs = 0, loose = 0;
  auto listed = cli_io().list_dir(root + "/packs");
  if (!listed.ok() && listed.status().code() != Code::kNotFound) return listed.status();
  if (listed.ok())
    for (const DirEntry& f : *listed) packs += f.is_regular && is_pack_name(f.name);
  if (packs > 0) return std::make_pair(packs, loose);
  auto shards = cli_io().list_dir(root + "/chunks");
  if (!shards.ok() && shards.status().code() != Code::kNotFound) return shards.status();
  if (!shards.ok()) return std::make_pair(packs, loose);
  for (const DirEntry& shard : *shards) {
    if (!shard.is_dir || shard.name.size() != 2) continue;
    KV_ASSIGN_OR_RETURN(auto files, cli_io().list_dir(root + "/chunks/" + shard.name));
    for (const DirEntry& f : files)
      loose += f.is_regular && is_blob_name(f.name) && f.name.compare(0, 2, shard.name) == 0;
  }
  return std::make_pair(packs, loose);
}

// The blobs' store id as written beside them (nullopt: none yet), and the blob store itself when
// it is remote (a local one is read without opening it: opening creates its directories).
struct BlobsSide {
  std::optional<std::string> id;
  std::string name;
  std::unique_ptr<BlobStore> remote;
};

Result<BlobsSide> read_blobs_side(const StoreLocation& where) {
  BlobsSide b;
  b.name = where.blobs;
  if (where.blob_kind == BlobKind::kLocal) {
    auto bytes = read_all(cli_io(), where.blobs + "/" + kStoreIdName, kMaxStoreIdBytes);
    if (bytes.ok() && !bytes->empty())  // empty: a crash's leftover, replaced by the next save (none)
      b.id = std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
    else if (bytes.status().code() != Code::kNotFound) return bytes.status();
    return b;
  }
  KV_ASSIGN_OR_RETURN(b.remote, open_blob_store(cli_io(), where));
  b.name = b.remote->describe();
  KV_ASSIGN_OR_RETURN(b.id, b.remote->read_store_id());
  return b;
}

// Whether the blobs are this catalog's (store/store_identity.h), read without writing either id.
// `catalog` nullptr: none yet (the next save creates an empty one, with no id and no chunk).
void check_store_id(const StoreLocation& where, Catalog* catalog, const std::string& catalog_name,
                    std::vector<Check>& out) {
  auto blobs = read_blobs_side(where);
  if (!blobs.ok() && where.blob_kind != BlobKind::kLocal) return;  // reported by check_store
  std::optional<std::string> mine;
  CatalogStats stats;
  Status s = blobs.status();
  if (s.ok() && catalog) {
    auto id = catalog->get_meta(kMetaStoreId);
    auto counted = catalog->stats();
    s = !id.ok() ? id.status() : counted.status();
    if (s.ok()) {
      mine = *id;
      stats = *counted;
    }
  }
  if (!s.ok()) {
    out.push_back({Verdict::kFail, "store id", s.ToString(), "fix what the message names, then run kvsnap doctor again"});
    return;
  }
  s = compare_store_ids(catalog_name, mine, blobs->name, blobs->id);
  if (s.ok() && !mine && !blobs->id) {
    // A store from before ids, or a catalog still to be made: the rule for blobs no catalog names.
    std::pair<size_t, size_t> held;
    if (blobs->remote) {
      auto packs = blobs->remote->list_packs();
      auto loose = packs.ok() && packs->empty() ? blobs->remote->list() : Result<std::vector<ChunkHash>>(std::vector<ChunkHash>());
      s = !packs.ok() ? packs.status() : loose.status();
      if (s.ok()) held = {packs->size(), loose->size()};
    } else if (auto counted = count_local_blobs(where.blobs); counted.ok()) {
      held = *counted;
    } else {
      s = counted.status();
    }
    if (!s.ok()) {
      out.push_back({Verdict::kFail, "store id", s.ToString(), "fix what the message names, then run kvsnap doctor again"});
      return;
    }
    s = compare_unnamed_blobs(catalog_name, stats, blobs->name, held.first, held.second);
  }
  if (!s.ok()) {
    out.push_back({Verdict::kFail, "store id", s.ToString(),
                   "saves and gc refuse this store until the catalog and the blobs belong together"});
  } else if (mine) {
    out.push_back({Verdict::kOk, "store id",
                   *mine + (blobs->id ? " (the catalog's and the blobs')"
                                      : " (the catalog's; the next save writes it beside the blobs)"),
                   ""});
  } else {
    out.push_back({Verdict::kOk, "store id", "none yet (the next save gives the store one)", ""});
  }
}

// The catalog: opened read-only in effect (a missing SQLite file is not created, an older
// schema not upgraded, an empty PostgreSQL database given no tables).
void check_catalog(const StoreLocation& where, std::vector<Check>& out) {
  if (where.catalog_kind == CatalogKind::kSqlite) {
    auto has_catalog = cli_io().exists(where.catalog);
    if (!has_catalog.ok() || !*has_catalog) {
      out.push_back({Verdict::kOk, "catalog", "none yet (the first `kvsnap save` creates it)", ""});
      check_store_id(where, nullptr, where.catalog, out);  // blobs there already: would the save take them?
      return;
    }
  }
  CatalogOptions as_found;
  as_found.upgrade_schema = false;
  auto catalog = open_catalog(where, as_found);
  if (catalog.status().code() == Code::kNotFound) {
    out.push_back({Verdict::kOk, "catalog", catalog.status().message(), ""});
    check_store_id(where, nullptr, redact_pg_url(where.catalog), out);
    return;
  }
  if (catalog.status().code() == Code::kMismatch) {  // an older schema, left as it is
    out.push_back({Verdict::kWarn, "catalog", catalog.status().message(),
                   "upgrade every kvsnap that uses this store first, if others share it"});
    return;
  }
  if (!catalog.ok()) {
    out.push_back({Verdict::kFail, "catalog", catalog.status().ToString(),
                   where.catalog_kind == CatalogKind::kSqlite
                       ? "restore a backup of " + where.catalog + ", or move the store aside and import your exports"
                       : "fix the catalog in " + where.config});
    return;
  }
  auto problems = (*catalog)->integrity_check();
  auto listed = (*catalog)->list();
  if (!problems.ok() || !problems->empty()) {
    out.push_back({Verdict::kFail, "catalog",
                   problems.ok() ? std::to_string(problems->size()) + " problems, the first: " + problems->front()
                                 : problems.status().ToString(),
                   "run `kvsnap verify --all` for the details"});
    return;
  }
  out.push_back({Verdict::kOk, "catalog",
                 std::to_string(listed.ok() ? listed->size() : 0) + " snapshots, consistent (`kvsnap verify --all` "
                                                                     "re-hashes the chunks too)",
                 ""});
  check_store_id(where, catalog->get(), (*catalog)->describe(), out);
}

void check_store(const StoreLocation& where, std::vector<Check>& out) {
  const std::string& root = where.local_dir;
  if (!is_dir(root)) {
    out.push_back({Verdict::kWarn, "store", root + " does not exist yet",
                   "nothing to do: `kvsnap save` creates it (or pass --store DIR / set KVSNAP_HOME)"});
    return;
  }
  if (!writable(root)) {
    out.push_back({Verdict::kFail, "store", root + " is not writable by this user",
                   "fix its permissions, or use another store (--store DIR, KVSNAP_HOME)"});
    return;
  }
  out.push_back({Verdict::kOk, "store", root + " is writable", ""});
  if (where.blob_kind != BlobKind::kLocal) {  // a local directory's layout is created by the first save
    auto blobs = open_blob_store(cli_io(), where);
    if (!blobs.ok()) {
      out.push_back({Verdict::kFail, "blobs", blobs.status().ToString(), "fix the blobs in " + where.config});
      return;
    }
    out.push_back({Verdict::kOk, "blobs", (*blobs)->describe(), ""});
  }
  check_catalog(where, out);
}

void check_profile(const ServerProfile& p, std::vector<Check>& out) {
  const std::string what = "server " + p.name;
  ServerEndpoint ep;
  ep.url = p.url;
  ep.timeout_s = 10;
  ep.stopped = interrupted;
  if (!p.api_key_file.empty()) {
    auto key = read_api_key_file(p.api_key_file);
    if (!key.ok()) {
      out.push_back({Verdict::kFail, what, key.status().ToString(), "kvsnap server add " + p.name + " ... --api-key-file F"});
    } else {
      ep.api_key = *key;
    }
  }
  auto build = query_server_build(ep);
  if (!build.ok()) {
    out.push_back({Verdict::kFail, what, build.status().ToString(),
                   "start llama-server at " + p.url + " (with --slot-save-path " + p.slot_dir +
                       "), or correct the profile: kvsnap server add " + p.name + " URL ..."});
  } else if (!build->usable.empty()) {
    out.push_back({Verdict::kOk, what, p.url + " answers; llama.cpp " + build->reported, ""});
  } else {
    out.push_back({Verdict::kWarn, what,
                   p.url + " answers, but its build is unknown (" +
                       (build->reported.empty() ? std::string("no build_info in /props")
                                                : build->reported + ": " + build->why_not) +
                       ")",
                   "saves record no build and restores keep the stored format: pass --source-build / --target-build "
                   "where it matters"});
  }
  if (!is_dir(p.slot_dir)) {
    out.push_back({Verdict::kFail, what + " slot dir", p.slot_dir + " is not a directory here",
                   "mount the server's --slot-save-path here and set it: kvsnap server add " + p.name + " " + p.url +
                       " --slot-dir DIR"});
  } else if (!writable(p.slot_dir)) {
    out.push_back({Verdict::kFail, what + " slot dir", p.slot_dir + " is not writable by this user",
                   "restores write converted files there: fix its permissions"});
  } else {
    out.push_back({Verdict::kOk, what + " slot dir", p.slot_dir + " is writable", ""});
  }
  if (p.ctk.empty() || p.ctv.empty() || p.flash_attn.empty()) {
    out.push_back({Verdict::kWarn, what + " cache types", "the profile does not say the server's -ctk/-ctv/-fa",
                   "restores detect them from a file the server saves (not from an empty slot); or add them: "
                   "kvsnap server add " + p.name + " " + p.url + " --slot-dir " + p.slot_dir + " --ctk T --ctv T --fa on|off"});
  } else {
    out.push_back({Verdict::kOk, what + " cache types", "-ctk " + p.ctk + " -ctv " + p.ctv + " -fa " + p.flash_attn, ""});
  }
  if (p.model.empty()) {
    out.push_back({Verdict::kWarn, what + " model", "no model in the profile",
                   "without it kvsnap uses the server's /props model_path when readable here, else the head dims "
                   "recorded at save; add --model GGUF to the profile for the wrong-model check"});
  } else if (::access(p.model.c_str(), R_OK) != 0) {
    out.push_back({Verdict::kFail, what + " model", p.model + " is not readable here", "correct the profile's --model"});
  } else {
    out.push_back({Verdict::kOk, what + " model", p.model, ""});
  }
}

struct DoctorOpts {
  std::string store, server;
  bool json = false;
};

// Every profile of the store (or --server's only).
void check_profiles(const StoreLocation& where, const std::string& only, std::vector<Check>& checks) {
  auto profiles = ServerProfiles::load(cli_io(), where.local_dir);
  if (!profiles.ok()) {
    checks.push_back({Verdict::kFail, "server profiles", profiles.status().ToString(),
                      "fix or remove " + where.local_dir + "/servers.json, then kvsnap server add again"});
    return;
  }
  size_t n = 0;
  for (const auto& p : profiles->all()) {
    if (!only.empty() && p.name != only) continue;
    check_profile(p, checks);
    ++n;
  }
  if (!only.empty() && n == 0) checks.push_back({Verdict::kFail, "server " + only, "no such profile", "kvsnap server ls"});
  if (only.empty() && n == 0)
    checks.push_back({Verdict::kOk, "server profiles", "none (kvsnap server add keeps a llama-server's details)", ""});
}

Status run_doctor(const DoctorOpts& o, std::string& out) {
  std::vector<Check> checks;
  check_simd(checks);
  check_sha256(checks);
  // A store that cannot even be located is a failed check like any other (with --json, in the
  // JSON): doctor is run when the setup is broken.
  Result<StoreLocation> where = resolve_store_location(cli_io(), o.store);
  if (where.ok()) {
    check_store(*where, checks);
    check_profiles(*where, o.server, checks);
  } else {
    checks.push_back({Verdict::kFail, "store", where.status().ToString(),
                      "fix --store / KVSNAP_HOME, or the store config file it names (docs/store.md)"});
  }
  size_t failed = 0;
  json arr = json::array();
  for (const auto& c : checks) {
    failed += c.verdict == Verdict::kFail;
    arr.push_back({{"check", c.what}, {"verdict", verdict_word(c.verdict)}, {"detail", c.detail},
                   {"fix", c.fix.empty() ? json(nullptr) : json(c.fix)}});
    if (!o.json) {
      out += std::string(verdict_word(c.verdict)) + std::string(6 - std::string(verdict_word(c.verdict)).size(), ' ') +
             c.what + ": " + c.detail + "\n";
      if (!c.fix.empty()) out += "      -> " + c.fix + "\n";
    }
  }
  if (o.json) out = json_text(json{{"checks", arr}, {"failed", failed}}, 2) + "\n";
  if (failed) return Status::Mismatch(std::to_string(failed) + " check(s) failed (listed above)");
  return Status::OK();
}

}  // namespace

void setup_doctor(CLI::App& app, int& exit_status) {
  auto o = std::make_shared<DoctorOpts>();
  auto* sub = app.add_subcommand("doctor", "Check the setup: the SIMD level, the SHA-256 kernel, the store and its catalog, every server "
                                           "profile (reachable, its llama.cpp build, slot directory, cache types, "
                                           "model); says what to fix");
  sub->add_option("--server", o->server, "only this profile");
  sub->add_flag("--json", o->json, "machine-readable: {checks: [{check, verdict: ok|warn|FAIL, detail, fix}], failed}");
  sub->footer("\nChanges nothing. Exit status 5 when a check failed (warnings do not fail).\n");
  bind(sub, o, run_doctor, "doctor", exit_status);
}

}  // namespace kvsnap::cli
