// The store commands: save, restore, ls, show, find, rm, gc, verify, export, import.
// Each parses its options, opens the store (--store DIR, $KVSNAP_HOME, XDG) and
// renders the result as text or --json.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/json_access.h"
#include "cli/commands.h"
#include "cli/era_options.h"
#include "cli/exit_codes.h"
#include "cli/open_state.h"
#include "cli/server_options.h"
#include "server/server_flows.h"
#include "server/server_profiles.h"
#include "store/store.h"

namespace kvsnap::cli {
namespace {

using json = nlohmann::ordered_json;

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / (1 << 20));
  return buf;
}

Result<std::unique_ptr<Store>> open_store(const std::string& dir) {
  KV_ASSIGN_OR_RETURN(StorePaths p, resolve_store_paths(dir));
  return Store::open(posix_io(), p);
}

json info_json(const SnapshotInfo& s) {
  json j = {{"id", s.id}, {"uuid", s.uuid}, {"name", s.name ? json(*s.name) : json(nullptr)},
            {"created", s.created}, {"model_arch", s.model_arch}, {"model_fingerprint", s.model_fingerprint},
            {"n_tokens", s.n_tokens}, {"k_types", s.k_types}, {"v_types", s.v_types},
            {"v_layout", s.v_trans ? "transposed" : "rows"}, {"source_format", s.source_format},
            {"raw_bytes", s.raw_bytes}, {"stored_bytes", s.stored_bytes},
            {"lossy", s.lossy.empty() ? json(nullptr) : json(s.lossy)},
            {"parent_id", s.parent_id ? json(*s.parent_id) : json(nullptr)}, {"content_sha256", s.content_sha256},
            {"n_chunks", s.n_chunks}};
  j["tags"] = json::object();
  for (const auto& [k, v] : s.tags) j["tags"][k] = v;
  return j;
}

std::string label(const SnapshotInfo& s) {
  return s.name ? *s.name + " (id " + std::to_string(s.id) + ")" : "id " + std::to_string(s.id);
}

std::string table(const std::vector<SnapshotInfo>& v) {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-5s %-24s %8s %-12s %-10s %11s %11s  %-20s %s\n", "ID", "NAME", "TOKENS", "K/V",
                "ARCH", "RAW", "STORED", "CREATED", "TAGS");
  out += buf;
  for (const auto& s : v) {
    std::string tags;
    for (const auto& [k, val] : s.tags) tags += (tags.empty() ? "" : ",") + k + "=" + val;
    std::string types = s.k_types + "/" + s.v_types + (s.lossy.empty() ? "" : "*");
    std::snprintf(buf, sizeof buf, "%-5lld %-24s %8lld %-12s %-10s %11s %11s  %-20s %s\n", (long long)s.id,
                  s.name ? s.name->c_str() : "-", (long long)s.n_tokens, types.c_str(), s.model_arch.c_str(),
                  mib(s.raw_bytes).c_str(), mib(s.stored_bytes).c_str(), s.created.substr(0, 19).c_str(), tags.c_str());
    out += buf;
  }
  if (v.empty()) out += "(no snapshots)\n";
  return out;
}

Result<std::pair<std::string, std::string>> parse_tag(const std::string& t) {
  const auto eq = t.find('=');
  if (eq == std::string::npos || eq == 0) return Status::InvalidArgument("--tag '" + t + "': expected KEY=VALUE");
  return std::make_pair(t.substr(0, eq), t.substr(eq + 1));
}

Status refuse_existing(const std::string& path, bool force) {
  struct stat st {};
  if (!force && ::stat(path.c_str(), &st) == 0)
    return Status::InvalidArgument(path + " exists; pass --force to replace it");
  return Status::OK();
}

// --tokens FILE: a JSON array, or integers separated by spaces, commas or newlines.
Result<std::vector<int32_t>> read_token_list(const std::string& path) {
  KV_ASSIGN_OR_RETURN(auto bytes, read_all(posix_io(), path, uint64_t(256) << 20));
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto parsed = parse_json(text, path, Code::kInvalidArgument);
  if (parsed.ok() && parsed->is_array()) {
    return JsonRef(*parsed, path, Code::kInvalidArgument).elements_as<int32_t>([](const JsonRef& t) -> Result<int32_t> {
      KV_ASSIGN_OR_RETURN(int64_t id, t.integer(INT32_MIN, INT32_MAX));
      return int32_t(id);
    });
  }
  std::vector<int32_t> out;
  for (char& c : text)
    if (c == ',' || c == '[' || c == ']') c = ' ';
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    char* end = nullptr;
    long v = std::strtol(w.c_str(), &end, 10);
    if (*end != 0) return Status::InvalidArgument(path + ": '" + w + "' is not a token id");
    out.push_back(int32_t(v));
  }
  return out;
}

// ---- --server URL|PROFILE --slot N --slot-dir DIR --api-key K ----


// ---- save ----

struct SaveOpts {
  std::string file, name, model, store_type, store_ctk, store_ctv, input_format, store;
  std::string src_rotation, source_build;  // recorded with the snapshot
  std::vector<std::string> tags;
  int level = 3, threads = 0;
  unsigned cells_per_chunk = kDefaultCellsPerChunk;
  bool json = false;
  ServerOpts srv;
};

Status run_save_server(const SaveOpts& o, SaveRequest req, std::string& out);

json server_build_json(const ServerBuild& b) {
  return {{"reported", b.reported.empty() ? json(nullptr) : json(b.reported)},
          {"usable", b.usable.empty() ? json(nullptr) : json(b.usable)},
          {"why_not", b.why_not.empty() ? json(nullptr) : json(b.why_not)}};
}

// "; the server is llama.cpp b8121" or why its build_info was not used.
std::string server_build_note(const ServerBuild& b) {
  if (b.reported.empty()) return "; the server's /props has no build_info";
  if (!b.usable.empty()) return "; the server reports llama.cpp " + b.reported;
  return "; the server's build_info '" + b.reported + "' was not used (" + b.why_not + ")";
}
// `extra` (JSON only): more keys for the result.
Status render_save(const SaveResult& r, const std::string& root, bool as_json, std::string& out,
                   const json* extra = nullptr);

Status run_save(const SaveOpts& o, std::string& out) {
  if (o.file.empty() == !o.srv.given())
    return Status::InvalidArgument("give a state FILE, or --server URL|PROFILE (with --slot and --slot-dir)");
  SaveRequest req;
  req.name = o.name;
  for (const auto& t : o.tags) {
    KV_ASSIGN_OR_RETURN(auto kv, parse_tag(t));
    req.tags[kv.first] = kv.second;
  }
  if (!o.store_type.empty() || !o.store_ctk.empty() || !o.store_ctv.empty()) {
    ConversionSpec spec;
    spec.ctk = o.store_ctk.empty() ? o.store_type : o.store_ctk;
    spec.ctv = o.store_ctv.empty() ? o.store_type : o.store_ctv;
    req.store_type = spec;
  }
  if (!o.source_build.empty()) {
    req.writer.llama_build = o.source_build;
    req.writer.llama_build_from = "declared";
  }
  req.writer.src_rotation = o.src_rotation;
  req.zstd_level = o.level;
  req.threads = uint32_t(std::max(0, o.threads));
  req.cells_per_chunk = o.cells_per_chunk;
  if (o.srv.given()) return run_save_server(o, req, out);
  KV_ASSIGN_OR_RETURN(OpenedState st, open_state(posix_io(), o.file, o.model, o.input_format));
  req.model = st.model_ptr();
  req.source_name = o.file;
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(SaveResult r, store->save(*st.file, st.state, req));
  return render_save(r, store->paths().root, o.json, out);
}

Status run_save_server(const SaveOpts& o, SaveRequest req, std::string& out) {
  KV_ASSIGN_OR_RETURN(ServerTarget t, server_target(o.srv, o.store, "", "", "", o.model));
  std::optional<ModelInfo> model;
  if (!t.model.empty()) {
    KV_ASSIGN_OR_RETURN(model, load_model_info(posix_io(), t.model));
    req.model = &*model;
  }
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(ServerSaveResult r, save_from_server(posix_io(), *store, t, req));
  const json extra = {{"server_build", server_build_json(r.build)}};
  KV_RETURN_IF_ERROR(render_save(r.save, store->paths().root, o.json, out, &extra));
  if (o.json) return Status::OK();
  out += "  from " + t.endpoint.url + " slot " + std::to_string(t.slot) + ": " + std::to_string(r.n_saved) +
         " tokens saved by the server in " + std::to_string(int(r.server_ms)) + " ms" + server_build_note(r.build) + "\n";
  return Status::OK();
}

Status render_save(const SaveResult& r, const std::string& root, bool as_json, std::string& out, const json* extra) {
  if (as_json) {
    json j = info_json(r.info);
    if (extra) j.update(*extra);
    j["chunks_new"] = r.chunks_new;
    j["bytes_new"] = r.bytes_new;
    j["seconds"] = r.seconds;
    j["store"] = root;
    out = j.dump(2) + "\n";
    return Status::OK();
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "saved %s: %lld tokens, K %s V %s%s, %s -> %s stored (%llu of %llu chunks new, %s written), %.2f s\n"
                "  uuid %s%s\n",
                label(r.info).c_str(), (long long)r.info.n_tokens, r.info.k_types.c_str(), r.info.v_types.c_str(),
                r.info.lossy.empty() ? "" : (" (lossy: " + r.info.lossy + ")").c_str(), mib(r.info.raw_bytes).c_str(),
                mib(r.info.stored_bytes).c_str(), (unsigned long long)r.chunks_new, (unsigned long long)r.chunks,
                mib(r.bytes_new).c_str(), r.seconds, r.info.uuid.c_str(),
                r.info.parent_id ? (", parent id " + std::to_string(*r.info.parent_id)).c_str() : "");
  out = buf;
  return Status::OK();
}

// ---- restore ----

struct RestoreOpts {
  std::string ref, out, ctk, ctv, flash_attn, format, rotation, model, store;
  std::string src_rotation, source_build;  // of the stored file (convert --help)
  std::string target_build;                // of the llama.cpp that loads it
  uint64_t tokens = 0;
  int threads = 0;
  bool force = false, json = false, check = false;
  ServerOpts srv;
};

Status run_restore_server(const RestoreOpts& o, std::string& out) {
  if (!o.out.empty() || o.tokens || !o.format.empty())
    return Status::InvalidArgument("--server restores into the server; --out, --tokens and --format do not apply");
  KV_ASSIGN_OR_RETURN(ServerTarget t, server_target(o.srv, o.store, o.ctk, o.ctv, o.flash_attn, o.model));
  t.stored_source_build = o.source_build;
  t.stored_src_rotation = o.src_rotation;
  t.target_build = o.target_build;
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(ServerRestoreResult r, restore_to_server(posix_io(), *store, t, o.ref, o.check));
  json j = {{"snapshot", info_json(r.restore.info)}, {"server", t.endpoint.url}, {"slot", t.slot},
            {"n_restored", r.n_restored}, {"ctk", r.ctk}, {"ctv", r.ctv}, {"flash_attn", r.flash_attn},
            {"types_from", r.types_from}, {"model_from", r.model_from}, {"converted", r.restore.converted},
            {"bytes", r.restore.bytes_out}, {"server_ms", r.server_ms}, {"seconds", r.seconds},
            {"server_build", server_build_json(r.build)},
            {"target_build", r.target_build.empty() ? json(nullptr) : json(r.target_build)},
            {"target_build_from", r.target_build_from}};
  if (r.check)
    j["check"] = {{"n_tokens", r.check->n_tokens}, {"prompt_n", r.check->prompt_n}, {"cache_n", r.check->cache_n},
                  {"reused", r.check->reused}};
  if (o.json) {
    out = j.dump(2) + "\n";
  } else {
    char buf[768];
    std::snprintf(buf, sizeof buf,
                  "restored %s into %s slot %d: %llu tokens, K %s V %s fa %s (%s), %s, %.2f s (server %.0f ms)\n",
                  label(r.restore.info).c_str(), t.endpoint.url.c_str(), t.slot, (unsigned long long)r.n_restored,
                  r.ctk.c_str(), r.ctv.c_str(), r.flash_attn.c_str(), r.types_from.c_str(),
                  r.restore.converted ? "converted" : "as stored", r.seconds, r.server_ms);
    out = buf;
    out += "  written for " + (r.target_build.empty() ? std::string("the stored file's format")
                                                     : "llama.cpp " + r.target_build + " (" + r.target_build_from + ")") +
           server_build_note(r.build) + "\n";
    if (r.check) {
      std::snprintf(buf, sizeof buf, "check: the stored prompt (%llu tokens) needed %llu evaluated, %llu from the cache: %s\n",
                    (unsigned long long)r.check->n_tokens, (unsigned long long)r.check->prompt_n,
                    (unsigned long long)r.check->cache_n,
                    r.check->reused ? "the server reused the cache" : "the server did NOT reuse the cache");
      out += buf;
    }
  }
  if (r.check && !r.check->reused)
    return Status::Mismatch("the server restored the slot but reprocessed the prompt (see above)");
  return Status::OK();
}

Status run_restore(const RestoreOpts& o, std::string& out) {
  if (o.srv.given()) return run_restore_server(o, out);
  if (o.out.empty()) return Status::InvalidArgument("--out FILE is needed (or --server to restore into a server)");
  KV_RETURN_IF_ERROR(refuse_existing(o.out, o.force));
  std::optional<ModelInfo> model;
  if (!o.model.empty()) {
    KV_ASSIGN_OR_RETURN(model, load_model_info(posix_io(), o.model));
  }
  RestoreRequest req;
  req.spec.ctk = o.ctk;
  req.spec.ctv = o.ctv;
  req.spec.flash_attn = o.flash_attn;
  req.spec.format = o.format;
  req.spec.rotation = o.rotation;
  req.spec.src_rotation = o.src_rotation;
  req.spec.source_build = o.source_build;
  req.spec.target_build = o.target_build;
  req.spec.threads = o.threads;
  req.model = model ? &*model : nullptr;
  if (o.tokens) req.tokens = o.tokens;
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(posix_io(), o.out));
  KV_ASSIGN_OR_RETURN(RestoreResult r, store->restore(o.ref, req, *writer));
  KV_RETURN_IF_ERROR(writer->commit());
  if (o.json) {
    json j = {{"snapshot", info_json(r.info)}, {"output", o.out}, {"bytes", r.bytes_out},
              {"n_tokens", r.n_tokens}, {"converted", r.converted}, {"seconds", r.seconds}};
    out = j.dump(2) + "\n";
    return Status::OK();
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "restored %s -> %s: %llu tokens, %s%s, %.2f s\n", label(r.info).c_str(),
                o.out.c_str(), (unsigned long long)r.n_tokens, mib(r.bytes_out).c_str(),
                r.converted ? " (converted)" : req.tokens ? " (prefix, stored types)" : " (original bytes)", r.seconds);
  out = buf;
  return Status::OK();
}

// ---- ls / show / find ----

struct ListOpts {
  std::string model, fingerprint, name, type, store;
  std::vector<std::string> tags;
  int64_t limit = -1;
  bool json = false;
};

Result<std::string> fingerprint_of(const std::string& model, const std::string& fingerprint) {
  if (!fingerprint.empty()) return fingerprint;
  if (model.empty()) return std::string();
  KV_ASSIGN_OR_RETURN(ModelInfo m, load_model_info(posix_io(), model));
  return m.profile.fingerprint;
}

std::string render_list(const std::vector<SnapshotInfo>& v, bool as_json) {
  if (!as_json) return table(v);
  json a = json::array();
  for (const auto& s : v) a.push_back(info_json(s));
  return a.dump(2) + "\n";
}

Status run_ls(const ListOpts& o, std::string& out) {
  ListFilter f;
  KV_ASSIGN_OR_RETURN(f.model_fingerprint, fingerprint_of(o.model, o.fingerprint));
  for (const auto& t : o.tags) {
    KV_ASSIGN_OR_RETURN(auto kv, parse_tag(t));
    f.tags.push_back(kv);
  }
  f.name_glob = o.name;
  f.type = o.type;
  f.limit = o.limit;
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(auto v, store->catalog().list(f));
  out = render_list(v, o.json);
  return Status::OK();
}

struct ShowOpts {
  std::string ref, store;
  bool json = false, tokens = false;
};

Status run_show(const ShowOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(auto snap, store->open_snapshot(o.ref));
  const SnapshotReader& r = snap->reader();
  json j = info_json(snap->info());
  j["snapshot"] = r.info();
  j["chunks"] = {{"count", r.chunks().size()}, {"raw_bytes", r.manifest().raw_bytes()},
                 {"stored_bytes", r.manifest().stored_bytes()}};
  if (o.tokens) j["tokens"] = r.tokens().tokens;
  if (o.json) {
    out = j.dump(2) + "\n";
    return Status::OK();
  }
  const SnapshotInfo& s = snap->info();
  out = "snapshot   " + label(s) + "\nuuid       " + s.uuid + "\ncreated    " + s.created + "\nmodel      " +
        (s.model_arch.empty() ? "-" : s.model_arch) +
        (s.model_fingerprint.empty() ? "" : " (" + s.model_fingerprint.substr(0, 16) + "...)") + "\ntokens     " +
        std::to_string(s.n_tokens) + "\ntypes      K " + s.k_types + ", V " + s.v_types + " (" +
        (s.v_trans ? "transposed" : "rows") + ")" + (s.lossy.empty() ? "" : ", lossy: " + s.lossy) +
        "\nformat     " + s.source_format + "\nsize       " + mib(s.raw_bytes) + " as llama.cpp wrote it, " +
        mib(s.stored_bytes) + " stored in " + std::to_string(r.chunks().size()) + " chunks\nsha256     " +
        s.content_sha256 + "\n";
  const SourceClaims& w = r.manifest().provenance.writer;
  if (!w.llama_build.empty()) out += "written by llama.cpp " + w.llama_build + " (" + w.llama_build_from + ")\n";
  if (!w.reported_build.empty() && w.llama_build_from != "llama-server")
    out += "server     reported build_info " + w.reported_build + "\n";
  if (!w.src_rotation.empty()) out += "rotation   declared " + w.src_rotation + " at save\n";
  if (s.parent_id) out += "parent     id " + std::to_string(*s.parent_id) + "\n";
  for (const auto& [k, v] : s.tags) out += "tag        " + k + "=" + v + "\n";
  if (o.tokens) out += "tokens     " + json(r.tokens().tokens).dump() + "\n";
  return Status::OK();
}

struct FindOpts {
  std::string tokens_file, like, model, input_format, store;
  int64_t limit = -1;
  bool json = false;
};

Status run_find(const FindOpts& o, std::string& out) {
  if (o.tokens_file.empty() == o.like.empty())
    return Status::InvalidArgument("give exactly one of --tokens FILE or --like SLOTFILE");
  std::vector<int32_t> query;
  std::string fingerprint;
  if (!o.tokens_file.empty()) {
    KV_ASSIGN_OR_RETURN(query, read_token_list(o.tokens_file));
    KV_ASSIGN_OR_RETURN(fingerprint, fingerprint_of(o.model, ""));
  } else {
    KV_ASSIGN_OR_RETURN(OpenedState st, open_state(posix_io(), o.like, o.model, o.input_format));
    query = st.state.tokens.tokens;
    if (st.model) fingerprint = st.model->profile.fingerprint;
  }
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(auto v, store->catalog().find_prefix(query, fingerprint,
                                                           o.limit < 0 ? SIZE_MAX : size_t(o.limit)));
  out = render_list(v, o.json);
  return Status::OK();
}

// ---- rm / gc / verify ----

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
  if (o.json) out = a.dump(2) + "\n";
  return Status::OK();
}

struct GcOpts {
  std::string store;
  bool wait = false, json = false;
};

Status run_gc(const GcOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(GcReport r, store->gc(o.wait));
  KV_ASSIGN_OR_RETURN(CatalogStats s, store->catalog().stats());
  json j = {{"skipped_busy", r.skipped_busy}, {"unreferenced_deleted", r.unreferenced_deleted},
            {"orphans_deleted", r.orphans_deleted}, {"temporaries_deleted", r.temporaries_deleted},
            {"snapshots", s.snapshots}, {"chunks", s.chunks}, {"stored_bytes", s.stored_bytes},
            {"raw_bytes", s.raw_bytes}, {"dedup_ratio", s.dedup_ratio}};
  if (o.json) {
    out = j.dump(2) + "\n";
    return Status::OK();
  }
  if (r.skipped_busy) {
    out = "gc: a save is running; nothing deleted (kvsnap gc --wait waits for it)\n";
    return Status::OK();
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "gc: deleted %zu unreferenced chunks, %zu orphan blobs, %zu temporaries\n"
                "store: %lld snapshots, %lld chunks, %s stored for %s of states (dedup %.2fx)\n",
                r.unreferenced_deleted, r.orphans_deleted, r.temporaries_deleted, (long long)s.snapshots,
                (long long)s.chunks, mib(s.stored_bytes).c_str(), mib(s.raw_bytes).c_str(), s.dedup_ratio);
  out = buf;
  return Status::OK();
}

struct VerifyOpts {
  std::vector<std::string> refs;
  std::string store;
  bool all = false, json = false;
};

Status run_verify(const VerifyOpts& o, std::string& out) {
  if (o.all == !o.refs.empty()) return Status::InvalidArgument("give snapshot names/ids or --all");
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(VerifyReport r, store->verify(o.refs));
  if (o.json) {
    out = json{{"snapshots", r.snapshots}, {"chunks", r.chunks}, {"bytes", r.bytes}, {"problems", r.problems}}.dump(2) +
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

// ---- export / import ----

struct ExportOpts {
  std::vector<std::string> refs;
  std::string out, store;
  bool force = false;
};

Status run_export(const ExportOpts& o, std::string& out) {
  KV_RETURN_IF_ERROR(refuse_existing(o.out, o.force));
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_RETURN_IF_ERROR(store->export_to(o.refs, o.out));
  struct stat st {};
  ::stat(o.out.c_str(), &st);
  out = "exported " + std::to_string(o.refs.size()) + " snapshots to " + o.out + " (" + mib(uint64_t(st.st_size)) + ")\n";
  return Status::OK();
}

struct ImportOpts {
  std::string file, store;
  bool json = false;
};

Status run_import(const ImportOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(ImportReport r, store->import_from(o.file));
  if (o.json) {
    json a = json::array();
    for (const auto& s : r.imported) a.push_back(info_json(s));
    out = json{{"imported", a}, {"skipped", r.skipped}}.dump(2) + "\n";
    return Status::OK();
  }
  for (const auto& s : r.imported) out += "imported " + label(s) + ", " + std::to_string(s.n_tokens) + " tokens\n";
  for (const auto& s : r.skipped) out += "skipped " + s + "\n";
  if (r.imported.empty() && r.skipped.empty()) out = "the archive holds no snapshots\n";
  return Status::OK();
}

// ---- server add / ls / rm ----

struct ServerCmdOpts {
  std::string name, url, slot_dir, ctk, ctv, flash_attn, model, api_key_file, store;
  bool json = false;
};

Status run_server_add(const ServerCmdOpts& o, std::string& out) {
  if (o.url.find("://") == std::string::npos) return Status::InvalidArgument("URL must look like http://HOST:PORT");
  for (const auto* t : {&o.ctk, &o.ctv})
    if (!t->empty()) KV_RETURN_IF_ERROR(parse_kv_type(*t, "--ctk/--ctv").status());
  if (!o.flash_attn.empty() && o.flash_attn != "on" && o.flash_attn != "off")
    return Status::InvalidArgument("--flash-attn must be on or off");
  if (!o.api_key_file.empty()) KV_RETURN_IF_ERROR(read_api_key_file(o.api_key_file).status());
  KV_ASSIGN_OR_RETURN(StorePaths paths, resolve_store_paths(o.store));
  KV_RETURN_IF_ERROR(posix_io().create_dirs(paths.root));
  KV_ASSIGN_OR_RETURN(ServerProfiles profiles, ServerProfiles::load(posix_io(), paths.root));
  KV_RETURN_IF_ERROR(profiles.put(posix_io(), {o.name, o.url, o.slot_dir, o.ctk, o.ctv, o.flash_attn, o.model,
                                               o.api_key_file}));
  out = "server profile '" + o.name + "' -> " + o.url + "\n";
  return Status::OK();
}

Status run_server_ls(const ServerCmdOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(StorePaths paths, resolve_store_paths(o.store));
  KV_ASSIGN_OR_RETURN(ServerProfiles profiles, ServerProfiles::load(posix_io(), paths.root));
  json a = json::array();
  for (const auto& p : profiles.all()) {
    a.push_back({{"name", p.name}, {"url", p.url}, {"slot_dir", p.slot_dir}, {"ctk", p.ctk}, {"ctv", p.ctv},
                 {"flash_attn", p.flash_attn}, {"model", p.model}, {"api_key_file", p.api_key_file}});
    if (!o.json)
      out += p.name + "  " + p.url + "  slot-dir " + (p.slot_dir.empty() ? "-" : p.slot_dir) + "  K " +
             (p.ctk.empty() ? "?" : p.ctk) + " V " + (p.ctv.empty() ? "?" : p.ctv) + " fa " +
             (p.flash_attn.empty() ? "?" : p.flash_attn) + (p.model.empty() ? "" : "  model " + p.model) + "\n";
  }
  if (o.json) out = a.dump(2) + "\n";
  else if (a.empty()) out = "(no server profiles; kvsnap server add NAME URL --slot-dir DIR ...)\n";
  return Status::OK();
}

Status run_server_rm(const ServerCmdOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(StorePaths paths, resolve_store_paths(o.store));
  KV_ASSIGN_OR_RETURN(ServerProfiles profiles, ServerProfiles::load(posix_io(), paths.root));
  KV_RETURN_IF_ERROR(profiles.remove(posix_io(), o.name));
  out = "removed server profile '" + o.name + "'\n";
  return Status::OK();
}

template <class Opts, class Run>
void bind(CLI::App* sub, std::shared_ptr<Opts> o, Run run, const char* name, int& exit_status) {
  sub->add_option("--store", o->store, "the store directory (default: $KVSNAP_HOME, else ~/.local/share/kvsnap)");
  sub->callback([o, run, name, &exit_status]() {
    std::string out;
    Status s = run(*o, out);
    if (!s.ok() && !out.empty()) std::fputs(out.c_str(), stdout);
    exit_status = report(name, s, s.ok() ? out : "");
  });
}

}  // namespace

void setup_server_commands(CLI::App& app, int& exit_status) {
  auto* server = app.add_subcommand("server", "Profiles of llama-servers: what kvsnap needs to know that the server "
                                              "does not report (cache types, slot directory, model, API key)");
  server->require_subcommand(1);
  {
    auto o = std::make_shared<ServerCmdOpts>();
    auto* sub = server->add_subcommand("add", "Add or replace a server profile");
    sub->add_option("name", o->name, "the profile's name, used as --server NAME")->required();
    sub->add_option("url", o->url, "http://HOST:PORT")->required();
    sub->add_option("--slot-dir", o->slot_dir, "the server's --slot-save-path as seen from here")->required();
    sub->add_option("--ctk", o->ctk, "the server's -ctk");
    sub->add_option("--ctv", o->ctv, "the server's -ctv");
    sub->add_option("--flash-attn,--fa", o->flash_attn, "the server's -fa: on|off");
    sub->add_option("--model,-m", o->model, "the server's model GGUF (head dims, wrong-model check)");
    sub->add_option("--api-key-file", o->api_key_file, "a chmod-600 file holding the server's API key");
    bind(sub, o, run_server_add, "server add", exit_status);
  }
  {
    auto o = std::make_shared<ServerCmdOpts>();
    auto* sub = server->add_subcommand("ls", "List server profiles");
    sub->add_flag("--json", o->json, "machine-readable list");
    bind(sub, o, run_server_ls, "server ls", exit_status);
  }
  {
    auto o = std::make_shared<ServerCmdOpts>();
    auto* sub = server->add_subcommand("rm", "Remove a server profile");
    sub->add_option("name", o->name, "the profile")->required();
    bind(sub, o, run_server_rm, "server rm", exit_status);
  }
}

void setup_store_commands(CLI::App& app, int& exit_status) {
  setup_server_commands(app, exit_status);
  {
    auto o = std::make_shared<SaveOpts>();
    auto* sub = app.add_subcommand("save", "Store a llama.cpp slot/session file in the snapshot store (compressed, "
                                           "checksummed, deduplicated by chunk)");
    sub->add_option("file", o->file, "the state file (a llama-server slot file, a session file, a raw buffer)");
    add_server_options(sub, o->srv);
    sub->add_option("--name", o->name, "a unique name to restore it by (default: none; ids and uuids always work)");
    sub->add_option("--tag", o->tags, "KEY=VALUE, repeatable; filter with ls --tag");
    sub->add_option("--model,-m", o->model, "the model's GGUF: records its fingerprint and head dims (recommended)");
    sub->add_option("--store-type", o->store_type, "quantize K and V to this type on store (lossy, recorded as such)");
    sub->add_option("--store-ctk", o->store_ctk, "quantize only K on store");
    sub->add_option("--store-ctv", o->store_ctv, "quantize only V on store");
    sub->add_option("--input-format", o->input_format, "raw-seq or raw-context for raw buffers");
    add_source_options(sub, o->src_rotation, o->source_build,
                       "the file (recorded with the snapshot; with --server, default: the server's /props build_info)");
    sub->add_option("--level", o->level, "zstd level (default 3)");
    sub->add_option("--cells-per-chunk", o->cells_per_chunk, "cells per chunk (default 256)");
    sub->add_option("--threads,-t", o->threads, "compression threads (default: all cores)");
    sub->add_flag("--json", o->json, "machine-readable result");
    sub->footer("\nExamples:\n  kvsnap save slot0.bin --name chat-42 --tag user=ana -m model.gguf\n"
                "  kvsnap save slot0.bin --store-type q8_0 -m model.gguf    # half the space, lossy\n"
                "  kvsnap save --server http://127.0.0.1:8080 --slot 0 --slot-dir /srv/slots --name chat-42\n");
    bind(sub, o, run_save, "save", exit_status);
  }
  {
    auto o = std::make_shared<RestoreOpts>();
    auto* sub = app.add_subcommand("restore", "Write a stored snapshot as a llama.cpp file, optionally at other cache "
                                              "types / flash attention / format, or only its first N tokens");
    sub->add_option("snapshot", o->ref, "name, id or uuid (prefix) of the snapshot")->required();
    sub->add_option("--out,-o", o->out, "the llama.cpp file to write (atomically)");
    add_server_options(sub, o->srv);
    sub->add_flag("--check", o->check, "after --server: send the stored prompt and report whether the server reused the cache");
    sub->add_option("--ctk", o->ctk, "K type of the server that will load it (default: as stored)");
    sub->add_option("--ctv", o->ctv, "V type (default: as stored)");
    sub->add_option("--flash-attn,--fa", o->flash_attn, "on|off of that server (default: as stored)");
    sub->add_option("--format", o->format, "output format: " + target_format_names());
    sub->add_option("--rotation", o->rotation, "auto|on|off (see kvsnap convert --help)");
    add_source_options(sub, o->src_rotation, o->source_build, "the stored file (default: as recorded at save)");
    add_target_build_option(sub, o->target_build, "the file (with --server, default: the server's /props build_info)");
    sub->add_option("--tokens", o->tokens, "restore only the first N tokens (a slot file without media)");
    sub->add_option("--model,-m", o->model, "the model's GGUF (default: the head dims recorded at save)");
    sub->add_option("--threads,-t", o->threads, "conversion threads (default: all cores)");
    sub->add_flag("--force", o->force, "replace --out if it exists");
    sub->add_flag("--json", o->json, "machine-readable result");
    sub->footer("\nWithout --ctk/--ctv/--fa/--format/--tokens the output is the saved file, byte for byte.\n"
                "With --server, --ctk/--ctv/--fa are the server's (else its profile's, else detected from a file it saves).\n"
                "\nExamples:\n  kvsnap restore chat-42 -o slot.bin --ctk q8_0 --ctv q8_0\n"
                "  kvsnap restore chat-42 --server http://127.0.0.1:8080 --slot-dir /srv/slots --ctk q8_0 --ctv q8_0 --check\n");
    bind(sub, o, run_restore, "restore", exit_status);
  }
  {
    auto o = std::make_shared<ListOpts>();
    auto* sub = app.add_subcommand("ls", "List stored snapshots, newest first");
    sub->add_option("--model,-m", o->model, "only snapshots of this GGUF (by fingerprint)");
    sub->add_option("--fingerprint", o->fingerprint, "only snapshots with this model fingerprint");
    sub->add_option("--tag", o->tags, "KEY=VALUE, repeatable (all must match)");
    sub->add_option("--name", o->name, "name glob, e.g. 'chat-*'");
    sub->add_option("--type", o->type, "only snapshots with this K or V type");
    sub->add_option("--limit", o->limit, "at most N");
    sub->add_flag("--json", o->json, "machine-readable list");
    bind(sub, o, run_ls, "ls", exit_status);
  }
  {
    auto o = std::make_shared<ShowOpts>();
    auto* sub = app.add_subcommand("show", "Everything about one snapshot");
    sub->add_option("snapshot", o->ref, "name, id or uuid (prefix)")->required();
    sub->add_flag("--tokens", o->tokens, "include the token ids");
    sub->add_flag("--json", o->json, "machine-readable (includes the snapshot's INFO section)");
    bind(sub, o, run_show, "show", exit_status);
  }
  {
    auto o = std::make_shared<FindOpts>();
    auto* sub = app.add_subcommand("find", "Stored snapshots whose tokens are a prefix of a prompt, longest first");
    sub->add_option("--tokens", o->tokens_file, "a file of token ids (JSON array or whitespace separated)");
    sub->add_option("--like", o->like, "a llama.cpp state file whose tokens are the prompt");
    sub->add_option("--model,-m", o->model, "only snapshots of this GGUF");
    sub->add_option("--input-format", o->input_format, "raw-seq or raw-context for --like raw buffers");
    sub->add_option("--limit", o->limit, "at most N");
    sub->add_flag("--json", o->json, "machine-readable list");
    bind(sub, o, run_find, "find", exit_status);
  }
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
    bind(sub, o, run_gc, "gc", exit_status);
  }
  {
    auto o = std::make_shared<VerifyOpts>();
    auto* sub = app.add_subcommand("verify", "Re-hash stored snapshots (every chunk and the whole file); exit 3 on any "
                                             "problem");
    sub->add_option("snapshot", o->refs, "names, ids or uuids");
    sub->add_flag("--all", o->all, "every snapshot, and the catalog's own consistency");
    sub->add_flag("--json", o->json, "machine-readable result");
    bind(sub, o, run_verify, "verify", exit_status);
  }
  {
    auto o = std::make_shared<ExportOpts>();
    auto* sub = app.add_subcommand("export", "Bundle snapshots into one .tar.zst (standalone .kvsnap files + an index)");
    sub->add_option("snapshot", o->refs, "names, ids or uuids")->required();
    sub->add_option("-o,--out", o->out, "the archive to write (atomically)")->required();
    sub->add_flag("--force", o->force, "replace --out if it exists");
    bind(sub, o, run_export, "export", exit_status);
  }
  {
    auto o = std::make_shared<ImportOpts>();
    auto* sub = app.add_subcommand("import", "Add the snapshots of an export archive to the store (every chunk re-hashed; "
                                             "hostile archives refused)");
    sub->add_option("file", o->file, "a kvsnap export (.tar.zst, .tar.gz, .tar.xz or .tar)")->required();
    sub->add_flag("--json", o->json, "machine-readable result");
    bind(sub, o, run_import, "import", exit_status);
  }
}

}  // namespace kvsnap::cli
