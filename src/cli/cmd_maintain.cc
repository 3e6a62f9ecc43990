// kvsnap rm, gc, verify, pin, unpin, expire, rekey: keeping the store tidy (and
// within its caps, store/eviction.h), proving it intact, replacing its key.
#include "base/json_access.h"
#include "base/printf_text.h"
#include "base/text.h"
#include "cli/store_common.h"
#include "cli/commands.h"

namespace kvsnap::cli {
namespace {

struct RmOpts {
  std::vector<std::string> refs;
  std::string store;
  bool json = false;
};

// A change may add warnings (rm: what its collection could not compact), shown with its line.
using ChangeOne = std::function<Result<SnapshotInfo>(Store&, const std::string&, std::vector<std::string>& warnings)>;
using DescribeOne = std::function<std::string(const SnapshotInfo&)>;

// rm, pin, unpin and expire: one change to each snapshot named, in order, each
// reported as it is afterwards (a line, or an element of the --json array). A
// failure stops there; the snapshots changed before it are still reported, in
// the JSON too, so a script knows what was done.
Status change_each(const std::string& store_dir, const std::vector<std::string>& refs, bool as_json, std::string& out,
                   const ChangeOne& change, const DescribeOne& describe) {
  KV_ASSIGN_OR_RETURN(auto store, open_store(store_dir));
  json a = json::array();
  Status failed;
  for (const auto& ref : refs) {
    std::vector<std::string> warnings;
    Result<SnapshotInfo> s = change(*store, ref, warnings);
    if (!s.ok()) {
      failed = s.status();
      break;
    }
    a.push_back(info_json(*s));
    if (!warnings.empty()) a.back()["warnings"] = warnings;
    if (as_json) continue;
    out += describe(*s) + "\n";
    for (const std::string& w : warnings) out += "warning: " + w + "\n";
  }
  if (as_json) out = json_text(a, 2) + "\n";
  return failed;
}

Status run_rm(const RmOpts& o, std::string& out) {
  return change_each(
      o.store, o.refs, o.json, out,
      [](Store& s, const std::string& ref, std::vector<std::string>& warnings) {
        GcReport gc;
        Result<SnapshotInfo> gone = s.remove(ref, &gc);
        for (const std::string& w : gc.warnings) warnings.push_back("gc after rm: " + w);
        return gone;
      },
      [](const SnapshotInfo& s) { return "removed " + label(s); });
}

struct GcOpts {
  std::string store, max_bytes, tenant;
  bool wait = false, json = false, dry_run = false;
  int compact_dead = -1;  // -1: the store config's "compact_dead_percent" (Store::compact_dead_percent)
  ProgressFlags progress;
};

// gc's eviction: expired snapshots always, then --max-bytes (for --tenant's snapshots only when given).
Result<EvictResult> evict_for_gc(Store& store, const GcOpts& o) {
  EvictionRequest req;
  req.compact_dead_percent = o.compact_dead;
  req.gc_progress = [&store](const GcProgress&) -> Status {
    if (!interrupted()) return Status::OK();
    return Status::Interrupted(store.paths().root + ": gc stopped by a signal (Ctrl-C, SIGTERM or SIGHUP) while collecting what "
                               "eviction freed; the store is whole, and the next kvsnap gc finishes it");
  };
  if (!o.max_bytes.empty()) {
    auto cap = parse_byte_size(o.max_bytes);
    if (!cap.ok()) return cap.status().Prefixed("--max-bytes");
    req.max_bytes = *cap;
  }
  if (!o.tenant.empty()) {
    if (!req.max_bytes) return Status::InvalidArgument("--tenant needs --max-bytes: the cap to hold that tenant to");
    req.tenant = o.tenant;
  }
  return store.evict(req, o.dry_run, o.wait);
}

void render_eviction(const EvictResult& e, const GcOpts& o, json& j, std::string& text) {
  j["evicted"] = json::array();
  for (const auto& v : e.plan.victims) j["evicted"].push_back(victim_json(v));
  j["dry_run"] = e.dry_run;
  j["scope"] = o.tenant.empty() ? json("store") : json(o.tenant);
  j["bytes_before"] = e.plan.bytes_before;
  j["bytes_after"] = e.plan.bytes_after;
  j["bytes_freed"] = e.plan.freed_bytes;
  j["cap_met"] = e.plan.cap_met;
  const std::string verb = e.dry_run ? "would evict " : "evicted ";
  for (const auto& v : e.plan.victims) text += verb + victim_line(v) + "\n";
  const std::string scope = o.tenant.empty() ? "the store" : "tenant '" + o.tenant + "'";
  if (!o.max_bytes.empty())
    text += scope + ": " + mib(e.plan.bytes_before) + " -> " + mib(e.plan.bytes_after) + " after dedup" +
            (e.plan.cap_met ? "" : ", still over --max-bytes " + o.max_bytes + ": the rest is pinned") + "\n";
}

// The store's gc with its progress drawn (bytes of garbage deleted) and Ctrl-C honoured between
// deletions: the catalog rows went first, so a stopped gc leaves a whole store and the rest of the
// garbage for the next gc.
Result<GcReport> collect_with_progress(Store& store, const GcOpts& o) {
  ProgressDisplay shown("gc", Counted::kFreed, 0, o.progress.mode(o.json));
  uint64_t freed = 0;
  const auto progress = [&](const GcProgress& p) -> Status {
    if (!p.compacting) {  // compaction's calls only ask whether to go on
      shown.set_total(p.bytes_total);
      count_freed(p.bytes_done - freed);
      freed = p.bytes_done;
    }
    if (!interrupted()) return Status::OK();
    if (p.compacting)
      return Status::Interrupted(store.paths().root + ": gc stopped by a signal (Ctrl-C, SIGTERM or SIGHUP) while compacting packs: "
                                 "the garbage is deleted, the packs compacted so far are done and the one in "
                                 "progress is as it was; the next kvsnap gc compacts the rest");
    return Status::Interrupted(store.paths().root + ": gc stopped by a signal (Ctrl-C, SIGTERM or SIGHUP) after deleting " +
                               std::to_string(p.files_done) + " of " + std::to_string(p.files_total) +
                               " files; the store is whole, and the next kvsnap gc deletes the rest");
  };
  return shown.finish(store.gc(o.wait, progress, o.compact_dead));
}

Status run_gc(const GcOpts& given, std::string& out) {
  KV_ASSIGN_OR_RETURN(auto store, open_store(given.store, /*keyless_ok=*/true));
  GcOpts o = given;
  if (o.compact_dead < 0) o.compact_dead = store->compact_dead_percent();
  KV_ASSIGN_OR_RETURN(EvictResult evicted, evict_for_gc(*store, o));
  json ej;
  std::string etext;
  render_eviction(evicted, o, ej, etext);
  if (o.dry_run) {
    // Compaction as the store is now: the evictions above would leave more dead bytes.
    const CompactionPlan plan = store->plan_compaction(o.compact_dead);
    ej["compaction"] = {{"packs", plan.packs.size()}, {"bytes_to_move", plan.live_bytes},
                        {"bytes_to_free", plan.dead_bytes}, {"warnings", plan.warnings}};
    if (o.json) {
      out = json_text(ej, 2) + "\n";
      return Status::OK();
    }
    out = etext.empty() ? "nothing to evict\n" : etext;
    for (const std::string& w : plan.warnings) out += "warning: gc --dry-run: " + w + "\n";
    const std::string when = evicted.plan.victims.empty() ? "" : ", before the evictions above";
    out += plan.packs.empty() ? "no pack to compact" + when + "\n"
                              : "would compact " + std::to_string(plan.packs.size()) +
                                    (plan.packs.size() == 1 ? " pack (" : " packs (") + mib(plan.live_bytes) +
                                    " of live chunks to move, " + mib(plan.dead_bytes) + " to free), as the store is now" +
                                    when + "\n";
    return Status::OK();
  }
  KV_ASSIGN_OR_RETURN(GcReport r, collect_with_progress(*store, o));
  // What the eviction's own collection compacted counts as this gc's too.
  r.packs_compacted += evicted.gc.packs_compacted;
  r.compacted_bytes_moved += evicted.gc.compacted_bytes_moved;
  r.compacted_bytes_freed += evicted.gc.compacted_bytes_freed;
  r.warnings.insert(r.warnings.begin(), evicted.gc.warnings.begin(), evicted.gc.warnings.end());
  KV_ASSIGN_OR_RETURN(CatalogStats s, store->catalog().stats());
  json j = {{"skipped_busy", r.skipped_busy}, {"unreferenced_deleted", r.unreferenced_deleted},
            {"orphans_deleted", r.orphans_deleted}, {"packs_deleted", r.packs_deleted},
            {"temporaries_deleted", r.temporaries_deleted}, {"uploads_aborted", r.uploads_aborted},
            {"packs_compacted", r.packs_compacted}, {"compacted_bytes_moved", r.compacted_bytes_moved},
            {"compacted_bytes_freed", r.compacted_bytes_freed}, {"warnings", r.warnings}, {"snapshots", s.snapshots}, {"chunks", s.chunks},
            {"stored_bytes", s.stored_bytes}, {"raw_bytes", s.raw_bytes}, {"dedup_ratio", s.dedup_ratio}};
  j.update(ej);
  out = etext;
  if (o.json) {
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  for (const std::string& w : r.warnings) out += "warning: gc: " + w + "\n";  // the eviction's too
  if (r.skipped_busy) {
    out += "gc: a save or a restore is running; nothing deleted (kvsnap gc --wait waits for it)\n";
    return Status::OK();
  }
  std::string buf;
  if (r.packs_compacted)
    out += "gc: compacted " + std::to_string(r.packs_compacted) + (r.packs_compacted == 1 ? " pack" : " packs") +
           " (moved " + mib(r.compacted_bytes_moved) + " of live chunks into a new pack, freed " +
           mib(r.compacted_bytes_freed) + ")\n";
  buf = printf_text(
                "gc: deleted %zu unreferenced chunks, %zu orphan blobs, %zu unused packs, %zu temporaries\n"
                "store: %lld snapshots, %lld chunks, %s stored for %s of states (dedup %.2fx)\n",
                r.unreferenced_deleted, r.orphans_deleted, r.packs_deleted, r.temporaries_deleted,
                (long long)s.snapshots, (long long)s.chunks, mib(s.stored_bytes).c_str(), mib(s.raw_bytes).c_str(),
                s.dedup_ratio);
  out += buf;
  if (r.uploads_aborted) out += "gc: aborted " + std::to_string(r.uploads_aborted) + " stale multipart uploads\n";
  return Status::OK();
}

struct MarkOpts {
  std::vector<std::string> refs;
  std::string store, duration;
  bool json = false;
};

// pin, unpin and expire: each snapshot's marks afterwards.
Status mark_each(const MarkOpts& o, std::string& out, const ChangeOne& change) {
  return change_each(o.store, o.refs, o.json, out, change, [](const SnapshotInfo& s) {
    return label(s) + ": " + (s.pinned ? "pinned" : "not pinned") + ", " +
           (s.expires_at ? "expires " + *s.expires_at : "never expires");
  });
}

Status run_pin(const MarkOpts& o, std::string& out) {
  return mark_each(o, out, [](Store& s, const std::string& ref, auto&) { return s.set_pinned(ref, true); });
}
Status run_unpin(const MarkOpts& o, std::string& out) {
  return mark_each(o, out, [](Store& s, const std::string& ref, auto&) { return s.set_pinned(ref, false); });
}
Status run_expire(const MarkOpts& o, std::string& out) {
  std::optional<int64_t> seconds;
  if (o.duration != "never") {
    auto d = parse_duration(o.duration);
    if (!d.ok()) return d.status().Prefixed("expire: DURATION (or never)");
    seconds = *d;
  }
  return mark_each(o, out, [&](Store& s, const std::string& ref, auto&) { return s.set_expiry(ref, seconds); });
}

struct VerifyOpts {
  std::vector<std::string> refs;
  std::string store;
  bool all = false, json = false;
  ProgressFlags progress;
};

Status run_verify(const VerifyOpts& o, std::string& out) {
  if (o.all == !o.refs.empty()) return Status::InvalidArgument("give snapshot names/ids or --all");
  // Without the key an encrypted store is checked as far as it can be (VerifyReport::not_checked).
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store, /*keyless_ok=*/true));
  Result<VerifyReport> verified = [&] {
    ProgressDisplay shown("verify", Counted::kRead, stored_bytes_of(*store, o.refs), o.progress.mode(o.json));
    return shown.finish(store->verify(o.refs));
  }();
  KV_ASSIGN_OR_RETURN(VerifyReport r, std::move(verified));
  if (o.json) {
    out = json_text(json{{"snapshots", r.snapshots}, {"chunks", r.chunks}, {"bytes", r.bytes}, {"problems", r.problems},
                         {"sealed_only", r.sealed_only}, {"not_checked", r.not_checked}}, 2) +
          "\n";
  } else {
    for (const auto& p : r.problems) out += "problem: " + shown_text(p) + "\n";
    for (const auto& n : r.not_checked) out += "not checked: " + shown_text(n) + "\n";
    out += "verified " + std::to_string(r.snapshots) + " snapshots, " + std::to_string(r.chunks) + " chunks, " +
           mib(r.bytes) + ": " + (r.problems.empty() ? "all good" : std::to_string(r.problems.size()) + " problems") +
           "\n";
  }
  if (!r.problems.empty())
    return Status::Corruption(std::to_string(r.problems.size()) + " problems found (listed above)");
  return Status::OK();
}

struct RekeyOpts {
  std::string store;
  StoreKeyConfig next;  // --new-key-file, --new-key-command
  bool json = false;
  int threads = 0;
  ProgressFlags progress;
};

Status run_rekey(const RekeyOpts& o, std::string& out) {
  if (o.next.key_file.empty() && o.next.key_command.empty())
    return Status::InvalidArgument("rekey: give the new key: {--new-key-file FILE} or {--new-key-command CMD}");
  KV_ASSIGN_OR_RETURN(std::optional<MasterKey> next, load_store_key(o.next));
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  Result<RekeyReport> rekeyed = [&] {
    ProgressDisplay shown("rekey", Counted::kRead, 0, o.progress.mode(o.json));
    RekeyOptions ro;
    ro.threads = uint32_t(std::max(0, o.threads));
    ro.progress = [&](const RekeyProgress& p) -> Status {
      shown.set_total(p.bytes_total);
      shown.set_files(p.snapshots_done, p.snapshots_total);
      if (!interrupted()) return Status::OK();
      return Status::Interrupted(store->paths().root + ": rekey stopped by a signal (Ctrl-C, SIGTERM or SIGHUP) after " +
                                 std::to_string(p.snapshots_done) + " of " + std::to_string(p.snapshots_total) +
                                 " snapshots; every snapshot opens with the old or the new key, and kvsnap rekey "
                                 "with the same keys finishes the job");
    };
    return shown.finish(store->rekey(*next, ro));
  }();
  KV_ASSIGN_OR_RETURN(RekeyReport r, std::move(rekeyed));
  if (o.json) {
    out = json_text(json{{"from_key_id", r.from_key_id}, {"to_key_id", r.to_key_id}, {"resumed", r.resumed},
                         {"snapshots_rekeyed", r.rekeyed}, {"plain_snapshots", r.plain}, {"chunks", r.chunks},
                         {"bytes", r.bytes}, {"unreferenced_deleted", r.gc.unreferenced_deleted},
                         {"packs_deleted", r.gc.packs_deleted}},
                    2) + "\n";
    return Status::OK();
  }
  out = std::string(r.resumed ? "resumed the rotation: " : "") + "sealed " + std::to_string(r.rekeyed) +
        " snapshots again (" + std::to_string(r.chunks) + " chunks, " + mib(r.bytes) + ") with key " + r.to_key_id +
        "; the store's key is now " + r.to_key_id + " and key " + r.from_key_id + " is refused\n";
  if (r.plain) out += std::to_string(r.plain) + " plain snapshots stay plain\n";
  out += "gc: deleted " + std::to_string(r.gc.unreferenced_deleted) + " chunks and " +
         std::to_string(r.gc.packs_deleted) + " packs of the old key\n";
  return Status::OK();
}

// The operands of rm, pin, unpin, expire: snapshot names, and --json.
void add_snapshots_and_json(CLI::App* sub, std::vector<std::string>& refs, bool& json) {
  sub->add_option("snapshot", refs, "names, ids or uuids")->required();
  sub->add_flag("--json", json, "machine-readable result");
}

}  // namespace

void setup_maintain_commands(CLI::App& app, int& exit_status) {
  {
    auto o = std::make_shared<RmOpts>();
    auto* sub = app.add_subcommand("rm", "Remove snapshots (their chunks go when nothing else uses them)");
    add_snapshots_and_json(sub, o->refs, o->json);
    sub->footer("\nEach removal is its own transaction, followed by a collection: the chunks nobody uses any more go,\n"
                "and the packs it left at least the store config's \"compact_dead_percent\" dead are compacted (25\n"
                "when unset; 0: never). What a collection could not do is a 'warning: gc after rm: ...' line (JSON:\n"
                "the element's \"warnings\"); the snapshot is removed either way. While a save or a restore runs the\n"
                "collection is skipped: kvsnap gc finishes it. A failure stops rm (a name that is no snapshot: exit 8):\n"
                "the ones before it are removed and listed, the ones after it are not tried. In an encrypted store a\n"
                "snapshot named by anything but its uuid is removed only if its name and tags are the ones sealed in\n"
                "it (exit 5 otherwise, nothing removed: someone without the key renamed it; kvsnap verify --all with\n"
                "the key lists each such snapshot with its uuid and the name it was saved as: name the one you mean\n"
                "by its uuid; another tenant's: exit 5, pass --tenant), and one whose sealed manifest row is damaged\n"
                "only by its uuid (exit 3 by name).\n"
                "\nExamples:\n  kvsnap rm chat-42\n  kvsnap rm 3 4 --json\n");
    bind(sub, o, run_rm, "rm", exit_status);
  }
  {
    auto o = std::make_shared<GcOpts>();
    auto* sub = app.add_subcommand("gc", "Delete chunks nobody uses, orphans of crashed saves and temporaries");
    sub->add_flag("--wait", o->wait, "wait for running saves and restores instead of skipping");
    sub->add_option("--max-bytes", o->max_bytes,
                    "first evict snapshots until the store holds at most N bytes after dedup (N, or 500M, 20G, 1T)");
    sub->add_option("--tenant", o->tenant, "with --max-bytes: cap only this tenant's snapshots (tag serve.ns)");
    sub->add_flag("--dry-run", o->dry_run, "list what would be evicted and compacted; change nothing");
    sub->add_option("--compact-dead", o->compact_dead,
                    "copy the live chunks of every pack whose dead bytes are at least PERCENT of it into a new pack, "
                    "and delete the old one (0: never)")
        ->option_text("PERCENT (default: the store config's \"compact_dead_percent\", else " +
                      std::to_string(GcOptions::kDefaultCompactDeadPercent) + ")")
        ->check(CLI::Range(0, 100));
    sub->add_flag("--json", o->json, "machine-readable result (evicted snapshots and bytes freed included)");
    add_progress_flags(sub, o->progress);
    sub->footer("\nEviction (docs/store.md, \"Caps and eviction\"): expired snapshots (save --ttl, kvsnap expire) go\n"
                "first, then the least recently restored, until the cap is met; pinned snapshots never go, and a\n"
                "chunk another snapshot uses is never deleted.\n"
                "\nCompaction: a save writes one pack; when a snapshot goes, the chunks only it used become dead\n"
                "bytes in that pack (a longer session saved later keeps the shared ones alive). gc copies the live\n"
                "chunks of a pack that is --compact-dead percent dead into a new pack and deletes the old one\n"
                "(rm and eviction do the same for the packs they touched, at the store config's\n"
                "\"compact_dead_percent\", 25 when it has none; 0 turns compaction off there too).\n"
                "\nExamples:\n  kvsnap gc                               # expired snapshots and garbage\n"
                "  kvsnap gc --max-bytes 20G --dry-run     # what a 20 GiB cap would evict\n"
                "  kvsnap gc --max-bytes 2G --tenant ana   # hold tenant ana to 2 GiB\n");
    bind(sub, o, run_gc, "gc", exit_status);
  }
  {
    auto o = std::make_shared<MarkOpts>();
    auto* sub = app.add_subcommand("pin", "Keep snapshots whatever the store's caps: eviction never removes them");
    add_snapshots_and_json(sub, o->refs, o->json);
    sub->footer("\nkvsnap rm still removes a pinned snapshot. In an encrypted store, pin, unpin and expire check the\n"
                "name and tags of a snapshot named by anything but its uuid against the ones sealed in it (exit 5,\n"
                "nothing changed, when they differ). Example:\n  kvsnap pin chat-42\n");
    bind(sub, o, run_pin, "pin", exit_status);
  }
  {
    auto o = std::make_shared<MarkOpts>();
    auto* sub = app.add_subcommand("unpin", "Let eviction remove snapshots again (undoes kvsnap pin)");
    add_snapshots_and_json(sub, o->refs, o->json);
    bind(sub, o, run_unpin, "unpin", exit_status);
  }
  {
    auto o = std::make_shared<MarkOpts>();
    auto* sub = app.add_subcommand("expire", "Set when snapshots expire (gc and later saves evict expired ones first)");
    sub->add_option("duration", o->duration, "from now: 90m, 12h, 7d, 2w; or never")->required();
    add_snapshots_and_json(sub, o->refs, o->json);
    sub->footer("\nA pinned snapshot is kept even once expired.\nExamples:\n  kvsnap expire 7d chat-42\n"
                "  kvsnap expire never chat-42\n");
    bind(sub, o, run_expire, "expire", exit_status);
  }
  {
    auto o = std::make_shared<RekeyOpts>();
    auto* sub = app.add_subcommand("rekey", "Replace an encrypted store's master key: every snapshot sealed again "
                                            "with the new key, on a live store");
    auto* nf = sub->add_option("--new-key-file", o->next.key_file,
                               "the new master key (32 raw bytes or 64 hex digits, mode 0600); --key-file names the "
                               "current one");
    nf->excludes(sub->add_option("--new-key-command", o->next.key_command, "the same, printed by a command"));
    sub->add_flag("--json", o->json, "machine-readable result (and progress as JSON lines on stderr)");
    sub->add_option("--threads,-t", o->threads, "chunks opened and sealed again at once (default: all cores)")->check(CLI::Range(0, 256));
    add_progress_flags(sub, o->progress);
    sub->footer("\nEvery snapshot is read with the current key (--key-file or --key-command) and sealed again\n"
                "with the new one, chunk by chunk (ids change: they are keyed), then its catalog rows are swapped\n"
                "in one transaction; gc then deletes the old key's chunks. Saves and restores may run meanwhile.\n"
                "Until it ends the store opens with either key and each snapshot with the key it is sealed\n"
                "with; saves need the new key. Stopped or killed at any point, the store is whole: run the same\n"
                "command again to finish. When it ends the old key is refused. docs/store.md, \"Key rotation\".\n"
                "\nExample:\n  kvsnap rekey --key-file old.key --new-key-file new.key\n");
    bind(sub, o, run_rekey, "rekey", exit_status);
  }
  {
    auto o = std::make_shared<VerifyOpts>();
    auto* sub = app.add_subcommand("verify", "Re-hash stored snapshots (every chunk and the whole file); exit 3 on any "
                                             "problem");
    sub->add_option("snapshot", o->refs, "names, ids or uuids");
    sub->add_flag("--all", o->all, "every snapshot, and the catalog's own consistency");
    sub->add_flag("--json", o->json, "machine-readable result");
    add_progress_flags(sub, o->progress);
    sub->footer("\nFor each snapshot: every chunk decodes to its SHA-256, the rebuilt file has the content digest\n"
                "recorded at save, and the catalog's row matches the snapshot (token list, content hash, K and V\n"
                "types, V layout, size; the name and tags sealed in an encrypted one). Every problem is listed\n"
                "and the rest still checked. Without its key an encrypted snapshot is checked for what needs none\n"
                "(docs/store.md).\n"
                "\nExamples:\n  kvsnap verify chat-42\n  kvsnap verify --all --json\n");
    bind(sub, o, run_verify, "verify", exit_status);
  }
}

}  // namespace kvsnap::cli
