// kvsnap export, import: snapshots between stores as one archive.
#include <sys/stat.h>

#include <set>

#include "base/json_access.h"
#include "base/text.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "cli/commands.h"

namespace kvsnap::cli {
namespace {

struct ExportOpts {
  std::vector<std::string> refs;
  std::string out, store;
  bool force = false, json = false, decrypt = false, allow_plain = false;
  ProgressFlags progress;
};

// What an export reads, for its progress total: a snapshot copied as stored reads its blobs twice
// (once for their sizes, Store::export_to's plan, then to write them), one written again as a
// plain file (--decrypt of a sealed one) once. 0 (unknown) when a ref does not resolve: the
// export then fails by name.
uint64_t export_read_bytes(Store& store, const std::vector<std::string>& refs, bool decrypt) {
  uint64_t total = 0;
  std::set<int64_t> seen;
  for (const std::string& r : refs) {
    auto id = store.catalog().resolve(r);
    if (!id.ok()) return 0;
    if (!seen.insert(*id).second) continue;  // named twice: exported once
    auto info = store.catalog().get_info(*id);
    if (!info.ok()) return 0;
    total += info->stored_bytes * (decrypt && info->tenant ? 1 : 2);
  }
  return total;
}

Status run_export(const ExportOpts& o, std::string& out) {
  KV_RETURN_IF_ERROR(refuse_existing(o.out, o.force, "kvsnap export"));
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_RETURN_IF_ERROR(refuse_output_over_inputs(o.out, *store, {}));
  // A snapshot named twice (its id and its name) is exported once: counted once, by the export itself
  // (one removed meanwhile is in the archive, and no longer resolves afterwards).
  size_t exported = 0;
  {
    ProgressDisplay shown("export", Counted::kRead, export_read_bytes(*store, o.refs, o.decrypt), o.progress.mode(o.json));
    KV_RETURN_IF_ERROR(shown.finish(store->export_to(o.refs, o.out, o.decrypt, o.allow_plain, &exported)));
  }
  struct stat st {};
  ::stat(o.out.c_str(), &st);
  if (o.json) {
    out = json_text(json{{"exported", exported}, {"archive", o.out}, {"bytes", uint64_t(st.st_size)}}, 2) + "\n";
    return Status::OK();
  }
  out = "exported " + std::to_string(exported) + (exported == 1 ? " snapshot to " : " snapshots to ") + o.out + " (" +
        mib(uint64_t(st.st_size)) + ")\n";
  return Status::OK();
}

struct ImportOpts {
  std::string file, store;
  StoreKeyConfig from;  // --from-key-file, --from-key-command, --from-tenant
  bool json = false, allow_plain = false;
  ProgressFlags progress;
};

Status run_import(const ImportOpts& o, std::string& out) {
  ImportOptions io;
  KV_ASSIGN_OR_RETURN(io.from_key, load_store_key(o.from));
  io.from_tenant = o.from.tenant;
  io.allow_plain = o.allow_plain;
  // An archive that cannot be read is said before a store is created for it; a store created for
  // an archive it then refuses is taken away again (its entries are checked in <store>/tmp).
  KV_RETURN_IF_ERROR(cli_io().open_read(o.file).status());
  KV_ASSIGN_OR_RETURN(const std::optional<std::string> new_store, new_store_dirs(o.store));
  KV_ASSIGN_OR_RETURN(auto store, open_or_create_store(o.store));
  Result<ImportReport> imported = [&] {
    // No total: an import reads the archive, then each snapshot it unpacked for the checks and
    // again to store it, in amounts the archive's size does not tell (a total from it showed 100%
    // during the checks). The display shows the bytes and the rate.
    ProgressDisplay shown("import " + o.file, Counted::kRead, 0, o.progress.mode(o.json));
    return shown.finish(store->import_from(o.file, io));
  }();
  if (!imported.ok() && new_store) {
    store.reset();
    if (Status removed = remove_new_store(o.store, *new_store); !removed.ok())
      return imported.status().Appended("; the store created for it stays (" + removed.message() + ")");
  }
  KV_ASSIGN_OR_RETURN(ImportReport r, std::move(imported));
  if (o.json) {
    json a = json::array();
    for (const auto& s : r.imported) a.push_back(info_json(s));
    json evicted = json::array();
    for (const auto& v : r.evicted) evicted.push_back(victim_json(v));
    out = json_text(json{{"imported", a}, {"skipped", r.skipped}, {"evicted", evicted}, {"cap_warnings", r.cap_warnings},
                         {"gc_warnings", r.gc_warnings}},
                    2) +
          "\n";
    return Status::OK();
  }
  for (const auto& s : r.imported) out += "imported " + label(s) + ", " + std::to_string(s.n_tokens) + " tokens\n";
  for (const auto& s : r.skipped) out += "skipped " + shown_text(s) + "\n";
  if (r.imported.empty() && r.skipped.empty()) out = "the archive holds no snapshots\n";
  for (const auto& v : r.evicted) out += "evicted " + victim_line(v) + " to keep the store's caps\n";
  for (const auto& w : r.cap_warnings) out += "warning: cap not met: " + w + "\n";
  for (const auto& w : r.gc_warnings) out += "warning: " + w + "\n";
  return Status::OK();
}

}  // namespace

void setup_transfer_commands(CLI::App& app, int& exit_status) {
  {
    auto o = std::make_shared<ExportOpts>();
    auto* sub = app.add_subcommand("export", "Bundle snapshots into one .tar.zst (standalone .kvsnap files + an index)");
    sub->add_option("snapshot", o->refs, "names, ids or uuids")->required();
    sub->add_option("-o,--out", o->out, "the archive to write (atomically)")->required();
    sub->add_flag("--force", o->force, "replace --out if it exists");
    sub->add_flag("--decrypt", o->decrypt,
                  "write encrypted snapshots as plain .kvsnap files with a plain index (needs the key; default: they "
                  "stay sealed, their names, tags and fingerprints too)");
    sub->add_flag("--allow-plain", o->allow_plain,
                  "with a key: export plain (unencrypted) snapshots too; without it that is refused (exit 5), since "
                  "nothing protects a plain snapshot from whoever can write the catalog");
    sub->add_flag("--json", o->json, "machine-readable result (and progress as JSON lines on stderr)");
    add_progress_flags(sub, o->progress);
    bind(sub, o, run_export, "export", exit_status);
  }
  {
    auto o = std::make_shared<ImportOpts>();
    auto* sub = app.add_subcommand("import", "Add the snapshots of an export archive to the store (every chunk re-hashed; "
                                             "hostile archives refused)");
    sub->add_option("file", o->file, "a kvsnap export (.tar.zst, .tar.gz, .tar.xz or .tar)")->required();
    auto* ff = sub->add_option("--from-key-file", o->from.key_file,
                               "the master key the archive's snapshots were sealed with, when not the store's: they "
                               "(and their names, tags, fingerprints) are opened with it and sealed again with the "
                               "store's");
    ff->excludes(sub->add_option("--from-key-command", o->from.key_command, "the same, printed by a command"));
    sub->add_option("--from-tenant", o->from.tenant, "the tenant the archive's snapshots were sealed for (default: --tenant)");
    sub->add_flag("--allow-plain", o->allow_plain,
                  "into an encrypted store: import the archive's plain (unencrypted) snapshots too, sealed with the "
                  "store's key; without it such an archive is refused (exit 5) before anything is stored, since "
                  "nothing shows who made a plain snapshot");
    sub->add_flag("--json", o->json, "machine-readable result");
    add_progress_flags(sub, o->progress);
    bind(sub, o, run_import, "import", exit_status);
  }
}

}  // namespace kvsnap::cli
