// kvsnap ls, show, find: what the store holds.
#include "base/json_access.h"
#include "base/printf_text.h"
#include "base/text.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "cli/commands.h"
#include "cli/open_state.h"
#include "format/snapshot_mlx.h"
#include "store/store_seal.h"

namespace kvsnap::cli {
namespace {

// --limit N: a negative N was taken as "no limit" (a review's finding).
const CLI::Validator non_negative_limit(
    [](const std::string& v) { return !v.empty() && v[0] == '-' ? std::string("--limit is 0 or more") : std::string(); },
    "N >= 0");

std::string table(const std::vector<SnapshotInfo>& v) {
  std::string out;
  std::string buf;
  buf = printf_text("%-5s %-24s %8s %-12s %-10s %11s %11s  %-20s %-20s %-24s %s\n", "ID", "NAME", "TOKENS",
                "K/V", "ARCH", "RAW", "STORED", "CREATED", "RESTORED", "KEEP", "TAGS");
  out += buf;
  for (const auto& s : v) {
    const std::string name = s.name ? shown_text(*s.name) : "-", arch = shown_text(s.model_arch);
    std::string tags;
    for (const auto& [k, val] : s.tags) tags += (tags.empty() ? "" : ",") + shown_text(k) + "=" + shown_text(val);
    std::string types = s.k_types + "/" + s.v_types + (s.lossy.empty() ? "" : "*");
    // Eviction: pinned, or when it expires ("-": evicted by last use only).
    std::string keep = s.pinned ? "pinned" : "-";
    if (s.expires_at) keep = (s.pinned ? "pinned,exp " : "exp ") + s.expires_at->substr(0, 16);
    buf = printf_text("%-5lld %-24s %8lld %-12s %-10s %11s %11s  %-20s %-20s %-24s %s\n", (long long)s.id,
                  name.c_str(), (long long)s.n_tokens, types.c_str(), arch.c_str(),
                  mib(s.raw_bytes).c_str(), mib(s.stored_bytes).c_str(), s.created.substr(0, 19).c_str(),
                  s.last_restored ? s.last_restored->substr(0, 19).c_str() : "never", keep.c_str(), tags.c_str());
    out += buf;
  }
  if (v.empty()) out += "(no snapshots)\n";
  return out;
}


struct ListOpts {
  std::string model, fingerprint, name, type, store;
  std::vector<std::string> tags;
  int64_t limit = -1;
  bool json = false;
};

Result<std::string> fingerprint_of(const std::string& model, const std::string& fingerprint) {
  if (!fingerprint.empty()) return fingerprint;
  if (model.empty()) return std::string();
  KV_ASSIGN_OR_RETURN(ModelInfo m, load_model_info(cli_io(), model));
  return m.profile.fingerprint;
}

std::string render_list(const std::vector<SnapshotInfo>& v, bool as_json) {
  if (!as_json) return table(v);
  json a = json::array();
  for (const auto& s : v) a.push_back(info_json(s));
  return json_text(a, 2) + "\n";
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
  if (store->cipher()) f.tenant = store->tenant();  // an encrypted store lists the key's tenant (and plain snapshots)
  KV_ASSIGN_OR_RETURN(auto v, store->catalog().list(f));
  out = render_list(v, o.json);
  return Status::OK();
}

struct ShowOpts {
  std::string ref, store;
  bool json = false, tokens = false;
};

// "sha256     HEX" where the catalog holds the original's SHA-256 (version-1 snapshots), else the
// content digest and its rule (`kvsnap digest FILE` computes both for any file).
std::string digest_line(const SnapshotInfo& s) {
  const ContentDigestText d = split_content_digest(s.content_sha256, s.tenant.has_value());
  if (d.whole_file_sha256()) return "sha256     " + d.hex + "\n";
  return "digest     " + d.hex + " (" + d.rule + ")\n";
}

// `show` of an mlx-lm prompt cache: what the file and the user said (format/snapshot_mlx.h).
std::string show_mlx(const SnapshotInfo& s, const MlxCacheSummary& m, const SnapshotReader& r, bool tokens) {
  std::string out = "snapshot   " + label(s) + "\nuuid       " + s.uuid + "\ncreated    " + s.created +
                    "\nengine     mlx-lm prompt cache, " + m.layout + " layout (" + shown_text(m.written_by) + ")" +
                    "\nmodel      " + (m.model.empty() ? "- (not given at save, not in the file)" : shown_text(m.model)) +
                    "\nlayers     " + std::to_string(m.n_layers) + ": " + m.classes + "\nkv         K " + m.k_types +
                    ", V " + m.v_types + "\noffset     " +
                    (m.offset ? std::to_string(*m.offset) : std::string("differs by layer")) + "\ntokens     " +
                    (r.tokens().tokens.empty() ? std::string("- (none given at save)")
                                               : std::to_string(r.tokens().tokens.size())) +
                    "\nsize       " + mib(s.raw_bytes) + " as mlx-lm wrote it, " + mib(s.stored_bytes) + " stored in " +
                    std::to_string(r.chunks().size()) + " chunks\n" + digest_line(s);
  if (s.parent_id) out += "parent     id " + std::to_string(*s.parent_id) + "\n";
  for (const auto& [k, v] : s.tags) out += "tag        " + shown_text(k) + "=" + shown_text(v) + "\n";
  if (tokens) out += "tokens     " + json_text(json(r.tokens().tokens)) + "\n";
  return out;
}

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
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  const SnapshotInfo& s = snap->info();
  if (auto mlx = mlx_summary_of(r.manifest())) {
    out = show_mlx(s, *mlx, r, o.tokens);
    return Status::OK();
  }
  out = "snapshot   " + label(s) + "\nuuid       " + s.uuid + "\ncreated    " + s.created + "\nmodel      " +
        (s.model_arch.empty() ? "-" : shown_text(s.model_arch)) +
        (s.model_fingerprint.empty() ? "" : " (" + shown_text(s.model_fingerprint.substr(0, 16)) + "...)") + "\ntokens     " +
        std::to_string(s.n_tokens) + "\ntypes      K " + s.k_types + ", V " + s.v_types + " (" +
        (s.v_trans ? "transposed" : "rows") + ")" + (s.lossy.empty() ? "" : ", lossy: " + s.lossy) +
        "\nformat     " + s.source_format + "\nsize       " + mib(s.raw_bytes) + " as llama.cpp wrote it, " +
        mib(s.stored_bytes) + " stored in " + std::to_string(r.chunks().size()) + " chunks\n" + digest_line(s);
  const SourceClaims& w = r.manifest().provenance.writer;
  if (!w.llama_build.empty()) out += "written by llama.cpp " + shown_text(w.llama_build) + " (" + w.llama_build_from + ")\n";
  if (!w.reported_build.empty() && w.llama_build_from != "llama-server")
    out += "server     reported build_info " + shown_text(w.reported_build) + "\n";
  if (!w.src_rotation.empty()) out += "rotation   declared " + w.src_rotation + " at save\n";
  if (s.parent_id) out += "parent     id " + std::to_string(*s.parent_id) + "\n";
  for (const auto& [k, v] : s.tags) out += "tag        " + shown_text(k) + "=" + shown_text(v) + "\n";
  if (o.tokens) out += "tokens     " + json_text(json(r.tokens().tokens)) + "\n";
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
    KV_ASSIGN_OR_RETURN(OpenedState st, open_state(cli_io(), o.like, o.model, o.input_format));
    query = st.state.tokens.tokens;
    if (st.model) fingerprint = st.model->profile.fingerprint;
  }
  KV_ASSIGN_OR_RETURN(auto store, open_store(o.store));
  KV_ASSIGN_OR_RETURN(auto v, store->catalog().find_prefix(query, fingerprint,
                                                           o.limit < 0 ? SIZE_MAX : size_t(o.limit)));
  out = render_list(v, o.json);
  return Status::OK();
}

}  // namespace

void setup_list_commands(CLI::App& app, int& exit_status) {
  {
    auto o = std::make_shared<ListOpts>();
    auto* sub = app.add_subcommand("ls", "List stored snapshots, newest first");
    sub->add_option("--model,-m", o->model, "only snapshots of this GGUF (by fingerprint)");
    sub->add_option("--fingerprint", o->fingerprint, "only snapshots with this model fingerprint");
    sub->add_option("--tag", o->tags, "KEY=VALUE, repeatable (all must match)");
    sub->add_option("--name", o->name, "name glob, case-sensitive: * any text, ? one character, [abc] [a-z] [^0-9] a set; '[[]' a literal '[' (e.g. 'chat-*', 'a[[]1]' for a[1])");
    sub->add_option("--type", o->type, "only snapshots with this K or V type");
    sub->add_option("--limit", o->limit, "at most N")->check(non_negative_limit);
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
    sub->add_option("--limit", o->limit, "at most N")->check(non_negative_limit);
    sub->add_flag("--json", o->json, "machine-readable list");
    bind(sub, o, run_find, "find", exit_status);
  }
}

}  // namespace kvsnap::cli
