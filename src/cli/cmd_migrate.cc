// kvsnap migrate DIR: convert a directory of llama.cpp slot/session files in place.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "base/json.h"
#include "base/json_access.h"
#include "base/parallel.h"
#include "base/printf_text.h"
#include "base/sha256.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/era_options.h"
#include "cli/exit_codes.h"
#include "migrate/migrate_dir.h"
#include "store/store.h"

#include <filesystem>
#include <map>
#include <mutex>

namespace kvsnap::cli {
namespace {

using json = nlohmann::ordered_json;

// The bytes a migration of DIR reads: every regular file directly in it (kvsnap's own temporaries
// aside), twice with --backup-store (stored, then converted). The total of its progress display.
json to_json(const MigrateSummary& s, bool dry_run) {
  json files = json::array();
  for (const auto& f : s.files) {
    json j = {{"file", f.name}, {"action", file_action_name(f.action)}, {"bytes_before", f.bytes_before},
              {"bytes_after", f.bytes_after}, {"seconds", f.seconds}};
    if (!f.from.empty()) j["from"] = f.from;
    if (!f.to.empty()) j["to"] = f.to;
    if (!f.detail.empty()) j["detail"] = f.detail;
    // JSON holds text: a name that is not UTF-8 shows as U+FFFD there, so two such names could not
    // be told apart; its bytes, in hex, name the file exactly.
    if (!is_valid_utf8(f.name))
      j["file_hex"] = to_hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(f.name.data()), f.name.size()));
    files.push_back(j);
  }
  return {{"dry_run", dry_run},
          {"converted", s.count(dry_run ? FileAction::kWouldConvert : FileAction::kConverted)},
          {"at_target", s.count(FileAction::kAtTarget)},
          {"not_state", s.count(FileAction::kNotState)},
          {"skipped", s.count(FileAction::kSkippedLink) + s.count(FileAction::kSkippedOther)},
          {"failed", s.count(FileAction::kFailed)},
          {"converted_not_durable", s.count(FileAction::kConvertedNotDurable)},
          {"bytes_before", s.bytes_before()},
          {"bytes_after", s.bytes_after()},
          {"stale_temps_removed", s.stale_temps_removed},
          {"stale_temps_found", s.stale_temps_found},
          {"stale_temp_names", s.stale_temp_names},
          {"plain_renames", s.plain_renames},
          {"seconds", s.seconds},
          {"interrupted", !s.interrupted.ok()},
          {"files", files}};
}

std::string to_text(const MigrateSummary& s, bool dry_run) {
  std::string out;
  for (const auto& f : s.files) {
    out += "  " + shown_text(f.name) + ": " + file_action_name(f.action);
    if (f.action == FileAction::kConverted || f.action == FileAction::kConvertedNotDurable ||
        f.action == FileAction::kWouldConvert)
      out += ", " + f.from + " -> " + f.to + ", " + mib(f.bytes_before, 1) + " -> " + mib(f.bytes_after, 1);
    if (!f.detail.empty()) out += " (" + shown_text(f.detail) + ")";
    out += "\n";
  }
  const uint64_t before = s.bytes_before(), after = s.bytes_after();
  std::string buf = printf_text(
                "%s %zu files, %zu already at the target, %zu not state files, %zu skipped, %zu failed; "
                "%s -> %s (%s %s) in %.2f s\n",
                dry_run ? "would convert" : "converted",
                s.count(dry_run ? FileAction::kWouldConvert : FileAction::kConverted), s.count(FileAction::kAtTarget),
                s.count(FileAction::kNotState), s.count(FileAction::kSkippedLink) + s.count(FileAction::kSkippedOther),
                s.count(FileAction::kFailed), mib(before, 1).c_str(), mib(after, 1).c_str(),
                before >= after ? mib(before - after, 1).c_str() : mib(after - before, 1).c_str(),
                before >= after ? (dry_run ? "would be freed" : "freed") : (dry_run ? "more" : "more"), s.seconds);
  out += buf;
  if (const size_t n = s.count(FileAction::kConvertedNotDurable)) {
    out += std::to_string(n) + " of the converted files replaced their originals but their directory entries may not "
                                "survive a crash (the directory's fsync failed; listed above)\n";
  }
  std::string names;
  for (const std::string& n : s.stale_temp_names) names += (names.empty() ? "" : ", ") + quote_text(n);
  if (s.stale_temps_removed)
    out += "removed " + std::to_string(s.stale_temps_removed) + " stale temporary files (left by a kvsnap that was killed): " +
           names + "\n";
  if (s.stale_temps_found)
    out += "would remove " + std::to_string(s.stale_temps_found) + " stale temporary files (left by a kvsnap that was killed): " +
           names + "\n";
  if (s.plain_renames) {
    out += "note: this file system cannot swap two names (NFS?), so the converted files replaced their originals "
           "by a plain rename: a server's save of a slot in the moment between kvsnap's last check and the rename "
           "would have been lost; migrate while no server writes to the directory\n";
  }
  return out;
}

// --server: the directory, types and model a profile keeps (flags win), and
// the target build from the server's /props (--target-build wins).
Status apply_server(MigrateOptions& o, std::string& note) {
  KV_ASSIGN_OR_RETURN(ServerTarget t, server_target(o.srv, o.store, o.ctk, o.ctv, o.flash_attn, o.model));
  if (o.dir.empty()) o.dir = t.slot_dir;
  if (o.dir.empty()) return Status::InvalidArgument("give DIR: the profile " + o.srv.server + " keeps no slot directory");
  o.ctk = t.ctk;
  o.ctv = t.ctv;
  o.flash_attn = t.flash_attn;
  o.model = t.model;
  KV_ASSIGN_OR_RETURN(ServerBuild b, query_server_build(t.endpoint));
  if (!o.target_build.empty()) {
    note = "target: llama.cpp " + o.target_build + " (--target-build)";
  } else if (!b.usable.empty()) {
    o.target_build = b.usable;
    note = "target: llama.cpp " + b.usable + " (" + t.endpoint.url + " /props build_info " + b.reported + ")";
  } else {
    note = "target: the current format (" + t.endpoint.url + " " +
           (b.reported.empty() ? std::string("reports no build_info") : "build_info " + b.reported + ": " + b.why_not) +
           ")";
  }
  return Status::OK();
}

// What --backup-store did beyond saving: what the saves evicted for the store's caps, backups
// unpinned or replaced after the run (settle_backups), and warnings. File names are DIR's.
struct BackupReport {
  std::vector<EvictionVictim> evicted;
  std::vector<std::string> warnings, unpinned, replaced, kept_earlier, kept_pinned, dropped;

  std::string text() const {
    std::string t;
    for (const EvictionVictim& v : evicted) t += "backup store: evicted " + victim_line(v) + " for its caps\n";
    for (const std::string& n : unpinned) t += "backup store: unpinned the backup of " + n + " (not converted: its original stays)\n";
    for (const std::string& n : replaced) t += "backup store: an earlier backup of " + n + " (the same bytes) replaced\n";
    for (const std::string& n : kept_earlier)
      t += "backup store: " + n + " not converted: its earlier backup (the same bytes) kept, this run's dropped\n";
    for (const std::string& n : kept_pinned)
      t += "backup store: the backup of " + n + " stays pinned: a save replaced the file right after its conversion, "
           "so the backup is the only copy of the original\n";
    for (const std::string& n : dropped)
      t += "backup store: dropped this run's backup of " + n + ": the file changed while it was read (a server's "
           "save?), so the backup may mix two saves; the file stays as the save left it\n";
    for (const std::string& w : warnings) t += "warning: backup store: " + w + "\n";
    return t;
  }
  void add_to(json& j) const {
    j["backup_evicted"] = json::array();
    for (const EvictionVictim& v : evicted) j["backup_evicted"].push_back(victim_json(v));
    j["backup_warnings"] = warnings;
    j["backup_unpinned"] = unpinned;
    j["backup_replaced"] = replaced;
    j["backup_kept_earlier"] = kept_earlier;
    j["backup_kept_pinned"] = kept_pinned;
    j["backup_dropped"] = dropped;
  }
};

// A backup's migrated-from tag: the original's absolute path, so that runs started from other
// working directories tag (and find again) one file alike.
std::string backup_tag(const std::string& path) {
  return utf8_escaped(std::filesystem::absolute(path).lexically_normal().string());
}

// Earlier backups of the same bytes as `mine` that migrate itself made: the same migrated-from tag
// and no other, no name, pinned, the same content digest (a SHA-256 tree over the chunks: equal
// digests, equal bytes; encrypted stores' digests are keyed per tenant and never equal a plain one).
std::vector<SnapshotInfo> earlier_backups(Store& store, const std::string& path, const SnapshotInfo& mine) {
  ListFilter same_file;
  same_file.tags = {{"migrated-from", backup_tag(path)}};
  if (store.cipher()) same_file.tenant = store.tenant();
  std::vector<SnapshotInfo> out;
  auto listed = store.catalog().list(same_file);
  if (!listed.ok() || mine.content_sha256.empty()) return out;
  for (const SnapshotInfo& s : *listed)
    if (s.id != mine.id && s.content_sha256 == mine.content_sha256 && !s.name && s.tags.size() == 1 && s.pinned)
      out.push_back(s);
  return out;
}

// After the run, each backup this run saved: a file converted keeps it, and earlier backups of the
// same bytes (a killed run's) go, so one pinned backup per original stays; a file not converted
// because it changed while it was read drops this run's backup (it may mix two saves); another file
// not converted (its original in place) keeps an earlier backup of the same bytes and drops this
// run's, or, without one, has this run's unpinned. Removals by uuid (a name never shadows it).
void settle_backups(Store& store, const std::string& dir, const std::vector<FileOutcome>& files,
                    const std::map<std::string, SnapshotInfo>& backed_up, BackupReport& report) {
  auto remove = [&](const SnapshotInfo& s, const std::string& file) {
    if (Result<SnapshotInfo> gone = store.remove(s.uuid); !gone.ok()) {
      report.warnings.push_back("a backup of " + file + " (id " + std::to_string(s.id) + ") stays: " +
                                gone.status().ToString());
      return false;
    }
    return true;
  };
  for (const FileOutcome& f : files) {
    auto it = backed_up.find(dir + "/" + f.name);
    if (it == backed_up.end()) continue;
    const SnapshotInfo& mine = it->second;
    const std::vector<SnapshotInfo> earlier = earlier_backups(store, it->first, mine);
    if (f.original_gone) {  // converted, then replaced by a save: the backup is the original's only copy
      report.kept_pinned.push_back(f.name);
    } else if (f.action == FileAction::kConverted || f.action == FileAction::kConvertedNotDurable) {
      bool any = false;
      for (const SnapshotInfo& s : earlier) any |= remove(s, f.name);
      if (any) report.replaced.push_back(f.name);
    } else if (f.backup_may_mix) {
      if (remove(mine, f.name)) report.dropped.push_back(f.name);
    } else if (!earlier.empty()) {
      if (remove(mine, f.name)) report.kept_earlier.push_back(f.name);
    } else if (Result<SnapshotInfo> u = store.set_pinned(mine.uuid, false); u.ok()) {
      report.unpinned.push_back(f.name);
    } else {
      report.warnings.push_back("the backup of " + f.name + " (not converted) stays pinned: " + u.status().ToString());
    }
  }
}

// The conversion the flags (and a server profile, once applied) ask for.
ConversionSpec spec_of(const MigrateOptions& o) {
  ConversionSpec spec;
  spec.ctk = o.ctk;
  spec.ctv = o.ctv;
  spec.flash_attn = o.flash_attn;
  spec.format = o.format == "current" ? "" : o.format;
  spec.rotation = o.rotation;
  spec.requant = o.requant;
  spec.src_rotation = o.src_rotation;
  spec.source_build = o.source_build;
  spec.target_build = o.target_build;
  spec.kv_streams = o.kv_streams;
  return spec;
}

}  // namespace

Status run_migrate(const MigrateOptions& given, std::string& out) {
  Io& io = cli_io();
  MigrateOptions o = given;
  std::string server_note;
  // The flags' words first: a typo fails before a server is asked, a model read or a store created.
  KV_RETURN_IF_ERROR(check_spec_words(spec_of(o)));
  if (o.jobs < 1) return Status::InvalidArgument("{--jobs} " + std::to_string(o.jobs) + ": at least 1");
  if (o.srv.given()) KV_RETURN_IF_ERROR(apply_server(o, server_note));
  KV_RETURN_IF_ERROR(refuse_server_flags_without_server(o.srv));
  if (o.dir.empty()) return Status::InvalidArgument("give DIR (or --server PROFILE whose profile keeps a slot directory)");
  kvsnap::MigrateOptions m;
  m.dir = o.dir;
  while (m.dir.size() > 1 && m.dir.back() == '/') m.dir.pop_back();
  m.spec = spec_of(o);
  m.jobs = o.jobs;
  const int cores = int(default_threads());
  m.spec.threads = o.threads > 0 ? o.threads : std::max(1, cores / m.jobs);
  m.dry_run = o.dry_run;
  std::optional<ModelInfo> model;
  if (!o.model.empty()) {
    KV_ASSIGN_OR_RETURN(model, load_model_info(io, o.model));
    m.model = &*model;
  }
  std::unique_ptr<Store> store;
  std::mutex store_mu;  // one catalog connection, shared by the jobs; guards the two below
  BackupReport backups;
  std::map<std::string, SnapshotInfo> backed_up;  // path -> its backup
  if (o.backup_store && !o.dry_run) {
    KV_ASSIGN_OR_RETURN(StoreLocation where, resolve_store_location(io, o.store));
    apply_key_flags(where, store_key_flags());
    KV_ASSIGN_OR_RETURN(store, Store::open(io, where));
    m.backup = [&](const std::string& path, const ReadableFile& file, const StateFile& state) -> Status {
      SaveRequest req;
      req.model = m.model;
      req.head_dim_checked = true;  // migrate read the file with the witness before converting it
      req.tags = {{"migrated-from", backup_tag(path)}};
      req.source_name = path;
      req.threads = 1;
      // Pinned: a store cap must never evict the only copy of an original converted in place (a later
      // backup's save would otherwise take an earlier one; `kvsnap unpin` when it is no longer wanted).
      req.pin = true;
      // Every chunk compressed: on one thread a CPU-bound save would store most of an adaptive
      // one's raw, and these are kept (pinned) where migrate's own time is the conversion's.
      req.adaptive = false;
      std::lock_guard<std::mutex> lock(store_mu);
      KV_ASSIGN_OR_RETURN(SaveResult saved, store->save(file, state, req));
      backed_up[path] = saved.info;
      for (EvictionVictim& v : saved.evicted) backups.evicted.push_back(std::move(v));
      for (const std::string& w : saved.cap_warnings) backups.warnings.push_back("cap not met: " + w);
      for (const std::string& w : saved.gc_warnings) backups.warnings.push_back("gc after eviction: " + w);
      return Status::OK();
    };
  }
  Result<MigrateSummary> migrated = [&] {
    // A dry run reads the files' headers only: its display counts files, not bytes.
    const ProgressMode mode = o.progress ? (o.json ? ProgressMode::kJson : ProgressMode::kAuto) : ProgressMode::kQuiet;
    ProgressDisplay shown("migrate " + m.dir, Counted::kRead, 0, mode);
    const bool backup = o.backup_store;
    // The files to convert are read in full, twice with a backup (the store reads the original).
    m.planned = [&shown, backup, dry_run = o.dry_run](size_t files, uint64_t bytes) {
      shown.set_files(0, files);
      if (!dry_run) shown.set_total(backup ? 2 * bytes : bytes);
    };
    m.progress = [&shown](size_t done, size_t total, const FileOutcome*, const std::string&) {
      shown.set_files(done, total);
    };
    Result<MigrateSummary> r = migrate_dir(io, m);
    (void)shown.finish(r.ok() ? r->interrupted : r.status());
    return r;
  }();
  if (migrated.ok() && store) settle_backups(*store, m.dir, migrated->files, backed_up, backups);
  if (!migrated.ok()) {
    out = o.json ? "" : backups.text();  // what the backups did before the failure
    return migrated.status();
  }
  MigrateSummary sum = std::move(migrated).value();
  if (o.json) {
    json j = to_json(sum, o.dry_run);
    if (o.backup_store && !o.dry_run) backups.add_to(j);
    if (o.srv.given()) j["server"] = {{"target_build", o.target_build.empty() ? json(nullptr) : json(o.target_build)},
                                      {"note", server_note}};
    out = json_text(j, 2) + "\n";
  } else {
    out = (server_note.empty() ? "" : server_note + "\n") + to_text(sum, o.dry_run);
    out += backups.text();
  }
  // Stopped by a signal: what was done is listed above (its JSON too), then the signal's status.
  if (!sum.interrupted.ok()) return sum.interrupted;
  // The exit status is the first failed file's (in name order), as `kvsnap convert` of it would exit.
  // A file converted whose directory fsync failed counts too (its original is gone: not "failed").
  const size_t problems = sum.problems();
  const char* what = sum.count(FileAction::kConvertedNotDurable) ? " failed or are not durable" : " failed";
  for (const FileOutcome& f : sum.files) {
    if (f.action != FileAction::kFailed && f.action != FileAction::kConvertedNotDurable) continue;
    return f.error.Prefixed(std::to_string(problems) + " of the files in " + o.dir + what +
                            " (listed above); the first, " + f.name);
  }
  return Status::OK();
}

void setup_migrate(CLI::App& app, int& exit_status) {
  auto o = std::make_shared<MigrateOptions>();
  auto* sub = app.add_subcommand(
      "migrate",
      "Convert every llama.cpp slot/session file in a directory in place: after a llama.cpp upgrade (format), or "
      "for a server restarted with other -ctk/-ctv/-fa. Each file is replaced atomically; a rerun resumes");
  sub->add_option("dir", o->dir, "the directory (e.g. llama-server's --slot-save-path; default with --server PROFILE: "
                                 "the profile's)");
  add_server_options(sub, o->srv, /*with_slot=*/false);
  sub->add_option("--ctk", o->ctk, "target K type (default: keep each file's)");
  sub->add_option("--ctv", o->ctv, "target V type (default: keep)");
  sub->add_option("--flash-attn,--fa", o->flash_attn, "on|off: the target server's flash attention (default: keep)");
  sub->add_option("--format", o->format,
                  "the files' format, one of " + target_format_names() +
                      " (default: current, or --target-build's); ggsq-* are slot files (llama-server's slot saves), ggsn-* "
                      "session files (llama_state_save_file): a directory of both wants --target-build");
  sub->add_option("--rotation", o->rotation, "auto|on|off (see kvsnap convert --help)");
  sub->add_option("--requant", o->requant, "auto|quick|search|exact|reference (see kvsnap convert --help)")
      ->check(CLI::IsMember({"auto", "quick", "search", "exact", "reference"}));
  add_source_options(sub, o->src_rotation, o->source_build, "the files");
  add_target_build_option(sub, o->target_build, "them");
  sub->add_option("--model,-m", o->model, "the model's GGUF: exact layout and head dims (recommended)");
  sub->add_flag("--backup-store", o->backup_store,
                "save each original in the snapshot store (tag migrated-from=PATH, pinned: a cap never evicts it; "
                "kvsnap unpin when done) before converting it");
  sub->add_option("--store", o->store, "the store for --backup-store and --server profiles (default: $KVSNAP_HOME)");
  add_store_key_options(sub);
  sub->add_option("--kv-streams", o->kv_streams,
                  "KV streams of the server's cache after the change: N for -np N without -kvu, 1 for -kvu or no -np "
                  "(slot files restore only into a cache with as many; default: keep)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--jobs,-j", o->jobs, "files converted at once (default 1, at most 256)")->check(CLI::Range(1, 256));
  sub->add_option("--threads,-t", o->threads, "threads per file (default: cores / jobs)")->check(CLI::Range(0, 256));
  sub->add_flag("--dry-run,-n", o->dry_run, "print the plan and the bytes that would be freed; change nothing");
  sub->add_flag("--json", o->json, "machine-readable summary");
  sub->add_flag_callback("-q,--quiet", [o] { o->progress = false; },
                         "no progress on stderr (it shows on a terminal once the command runs for a second; "
                         "with --json as JSON lines instead)");
  sub->footer(
      "\nOnly regular files directly in DIR are touched; symlinks are never followed. Files already at the\n"
      "target and files that are not llama.cpp states are left alone. When a file fails, the others are still\n"
      "converted and the exit status is the first failed file's (3 damaged, 5 wrong model, 6 rotation unknown, ...).\n"
      "A converted file keeps its original's mode (and, run as root, owner and group). Run as another user than a\n"
      "file's owner (not root), migrate refuses that file (exit 7) and leaves it: run it as the server's user or root.\n"
      "\nExamples:\n"
      "  kvsnap migrate /srv/slots -m model.gguf --dry-run         # what an upgrade to the current format does\n"
      "  kvsnap migrate /srv/slots --ctk q8_0 --ctv q8_0 -m model.gguf   # before restarting with -ctk q8_0\n"
      "  kvsnap migrate --server local --dry-run   # for the upgraded server of profile 'local': its /props build,\n"
      "                                            # the profile's slot dir, types and model\n");
  sub->callback([o, &exit_status]() {
    std::string out;
    Status s = run_migrate(*o, out);
    // The head dims come from --model only here (a directory's files need not share them).
    exit_status = report_with_output("migrate", s, out, {"--head-dim-k", "--head-dim-v"});
  });
}

}  // namespace kvsnap::cli
