// kvsnap rm, gc, verify: keeping the store tidy and proving it intact.
#include "base/json_access.h"
#include "cli/store_common.h"
#include "cli/commands.h"

namespace kvsnap::cli {
namespace {

struct RmOpts {
  std::vector<std::string> refs;
  std::string store;
  bool json = false;
};

Status run_rm(const RmOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  json a = json::array();
  for (const auto& ref : o.refs) {
    KV_ASSIGN_OR_RETURN(SnapshotInfo s, store->remove(ref));
    a.push_back(info_json(s));
    if (!o.json) out += "removed " + label(s) + "\n";
  }
  if (o.json) out = json_text(a, 2) + "\n";
  return Status::OK();
}

struct GcOpts {
  std::string store;
  bool wait = false, json = false;
  ProgressFlags progress;
};

// The store's gc with its progress drawn (bytes of garbage deleted) and Ctrl-C honoured between
// deletions: the catalog rows went first, so a stopped gc leaves a whole store and the rest of the
// garbage for the next gc.
Result<GcReport> collect_with_progress(Store& store, const GcOpts& o) {
  ProgressDisplay shown("gc", Counted::kFreed, 0, o.progress.mode(o.json));
  uint64_t freed = 0;
  return store.gc(o.wait, [&](const GcProgress& p) -> Status {
    shown.set_total(p.bytes_total);
    count_freed(p.bytes_done - freed);
    freed = p.bytes_done;
    if (!interrupted()) return Status::OK();
    return Status::Interrupted(store.paths().root + ": gc stopped by a signal (Ctrl-C) after deleting " +
                               std::to_string(p.files_done) + " of " + std::to_string(p.files_total) +
                               " files; the store is whole, and the next kvsnap gc deletes the rest");
  });
}

Status run_gc(const GcOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(GcReport r, collect_with_progress(*store, o));
  KV_ASSIGN_OR_RETURN(CatalogStats s, store->catalog().stats());
  json j = {{"skipped_busy", r.skipped_busy}, {"unreferenced_deleted", r.unreferenced_deleted},
            {"orphans_deleted", r.orphans_deleted}, {"packs_deleted", r.packs_deleted},
            {"temporaries_deleted", r.temporaries_deleted}, {"snapshots", s.snapshots}, {"chunks", s.chunks},
            {"stored_bytes", s.stored_bytes}, {"raw_bytes", s.raw_bytes}, {"dedup_ratio", s.dedup_ratio}};
  if (o.json) {
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  if (r.skipped_busy) {
    out = "gc: a save is running; nothing deleted (kvsnap gc --wait waits for it)\n";
    return Status::OK();
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "gc: deleted %zu unreferenced chunks, %zu orphan blobs, %zu unused packs, %zu temporaries\n"
                "store: %lld snapshots, %lld chunks, %s stored for %s of states (dedup %.2fx)\n",
                r.unreferenced_deleted, r.orphans_deleted, r.packs_deleted, r.temporaries_deleted,
                (long long)s.snapshots, (long long)s.chunks, mib(s.stored_bytes).c_str(), mib(s.raw_bytes).c_str(),
                s.dedup_ratio);
  out = buf;
  return Status::OK();
}

struct VerifyOpts {
  std::vector<std::string> refs;
  std::string store;
  bool all = false, json = false;
  ProgressFlags progress;
};

Status run_verify(const VerifyOpts& o, std::string& out) {
  if (o.all == !o.refs.empty()) return Status::InvalidArgument("give snapshot names/ids or --all");
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  Result<VerifyReport> verified = [&] {
    ProgressDisplay shown("verify", Counted::kRead, stored_bytes_of(*store, o.refs), o.progress.mode(o.json));
    return store->verify(o.refs);
  }();
  KV_ASSIGN_OR_RETURN(VerifyReport r, std::move(verified));
  if (o.json) {
    out = json_text(json{{"snapshots", r.snapshots}, {"chunks", r.chunks}, {"bytes", r.bytes}, {"problems", r.problems}}, 2) +
          "\n";
  } else {
    for (const auto& p : r.problems) out += "problem: " + p + "\n";
    out += "verified " + std::to_string(r.snapshots) + " snapshots, " + std::to_string(r.chunks) + " chunks, " +
           mib(r.bytes) + ": " + (r.problems.empty() ? "all good" : std::to_string(r.problems.size()) + " problems") +
           "\n";
  }
  if (!r.problems.empty())
    return Status::Corruption(std::to_string(r.problems.size()) + " problems found (listed above)");
  return Status::OK();
}

}  // namespace

void setup_maintain_commands(CLI::App& app, int& exit_status) {
  {
    auto o = std::make_shared<RmOpts>();
    auto* sub = app.add_subcommand("rm", "Remove snapshots (their chunks go when nothing else uses them)");
    sub->add_option("snapshot", o->refs, "names, ids or uuids")->required();
    sub->add_flag("--json", o->json, "machine-readable result");
    bind(sub, o, run_rm, "rm", exit_status);
  }
  {
    auto o = std::make_shared<GcOpts>();
    auto* sub = app.add_subcommand("gc", "Delete chunks nobody uses, orphans of crashed saves and temporaries");
    sub->add_flag("--wait", o->wait, "wait for running saves instead of skipping");
    sub->add_flag("--json", o->json, "machine-readable result");
    add_progress_flags(sub, o->progress);
    bind(sub, o, run_gc, "gc", exit_status);
  }
  {
    auto o = std::make_shared<VerifyOpts>();
    auto* sub = app.add_subcommand("verify", "Re-hash stored snapshots (every chunk and the whole file); exit 3 on any "
                                             "problem");
    sub->add_option("snapshot", o->refs, "names, ids or uuids");
    sub->add_flag("--all", o->all, "every snapshot, and the catalog's own consistency");
    sub->add_flag("--json", o->json, "machine-readable result");
    add_progress_flags(sub, o->progress);
    bind(sub, o, run_verify, "verify", exit_status);
  }
}

}  // namespace kvsnap::cli
