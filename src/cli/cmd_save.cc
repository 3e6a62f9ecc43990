// kvsnap save: a state file, or a llama-server slot (--server), into the store.
#include <charconv>

#include "base/json_access.h"
#include "base/printf_text.h"
#include "base/text.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "cli/commands.h"
#include "cli/era_options.h"
#include "cli/open_state.h"
#include "cli/server_options.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/conversion_spec.h"
#include "server/server_flows.h"

namespace kvsnap::cli {
namespace {

struct SaveOpts {
  std::string file, name, model, store_type, store_ctk, store_ctv, input_format, store;
  std::string src_rotation, source_build;  // recorded with the snapshot
  std::string ttl;
  std::string tokens;  // mlx-lm prompt caches: the prompt's token ids (a file, or a comma list)
  bool pin = false;
  std::vector<std::string> tags;
  std::string level = "auto";  // auto, a zstd level, or "none"
  int threads = 0;
  unsigned cells_per_chunk = kDefaultCellsPerChunk;
  bool json = false;
  ProgressFlags progress;
  ServerOpts srv;
};

Status run_save_server(const SaveOpts& o, SaveRequest req, std::string& out);
std::function<Status()> unchanged_since(const std::string& path);
Status run_save_mlx(const SaveOpts& o, SaveRequest req, const ReadableFile& file, std::string& out);
// `extra` (JSON only): more keys for the result.
Status render_save(const SaveResult& r, const std::string& root, bool as_json, std::string& out,
                   const json* extra = nullptr);

// --level: "auto" compresses at the default zstd level while the disk is behind (SaveRequest::
// adaptive); "none" stores the chunks raw; a number is zstd's level for every new chunk (its range
// is checked by the save).
Status parse_level(const std::string& level, SaveRequest& req) {
  if (level == "auto") {
    req.adaptive = true;
    return Status::OK();
  }
  if (level == "none") {
    req.compress = false;
    return Status::OK();
  }
  int n = 0;
  const auto [end, ec] = std::from_chars(level.data(), level.data() + level.size(), n);
  if (ec != std::errc() || end != level.data() + level.size())
    return Status::InvalidArgument("--level '" + level + "' is not a zstd level (a whole number, e.g. " +
                                   std::to_string(SaveRequest{}.zstd_level) + "), auto or none");
  req.zstd_level = n;
  req.adaptive = false;
  return Status::OK();
}

Status run_save(const SaveOpts& o, std::string& out) {
  if (o.file.empty() == !o.srv.given())
    return Status::InvalidArgument("give a state FILE, or --server URL|PROFILE (with --slot and --slot-dir)");
  KV_RETURN_IF_ERROR(refuse_server_flags_without_server(o.srv));
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
    // Checked here so that a typo names the flag the user typed, not the conversion's --ctk/--ctv.
    const char* k_flag = o.store_ctk.empty() ? "--store-type" : "--store-ctk";
    const char* v_flag = o.store_ctv.empty() ? "--store-type" : "--store-ctv";
    if (!spec.ctk.empty()) KV_RETURN_IF_ERROR(parse_kv_type(spec.ctk, k_flag).status());
    if (!spec.ctv.empty()) KV_RETURN_IF_ERROR(parse_kv_type(spec.ctv, v_flag).status());
    req.store_type = spec;
  }
  if (!o.source_build.empty()) {
    req.writer.llama_build = o.source_build;
    req.writer.llama_build_from = "declared";
  }
  req.writer.src_rotation = o.src_rotation;
  KV_RETURN_IF_ERROR(parse_level(o.level, req));
  req.threads = uint32_t(std::max(0, o.threads));
  req.cells_per_chunk = o.cells_per_chunk;
  req.pin = o.pin;
  if (!o.ttl.empty()) {
    auto ttl = parse_duration(o.ttl);
    if (!ttl.ok()) return ttl.status().Prefixed("--ttl");
    req.ttl_seconds = *ttl;
  }
  if (o.srv.given()) {
    // The server writes a llama.cpp slot file, whose own header holds its tokens and format.
    if (!o.tokens.empty() || !o.input_format.empty()) {
      return Status::InvalidArgument(std::string(!o.tokens.empty() ? "{--tokens}" : "{--input-format}") +
                                     " with {--server}: the server's slot file records its tokens and format itself");
    }
    return run_save_server(o, req, out);
  }
  req.source_unchanged = unchanged_since(o.file);  // before the first read
  // An mlx-lm prompt cache (a safetensors header, told by content) goes its own way.
  if (auto f = cli_io().open_read(o.file); f.ok() && looks_like_mlx_prompt_cache(**f)) {
    return run_save_mlx(o, std::move(req), **f, out);
  }
  if (!o.tokens.empty()) {
    return Status::InvalidArgument(o.file + ": {--tokens} is for mlx-lm prompt caches; a llama.cpp state holds its "
                                   "own tokens");
  }
  KV_ASSIGN_OR_RETURN(OpenedState st, open_state(cli_io(), o.file, o.model, o.input_format, "", o.source_build,
                                                   HeadDimCheck::kByCaller));
  req.model = st.model_ptr();
  req.source_name = o.file;
  KV_ASSIGN_OR_RETURN(auto store, open_or_create_store(o.store));
  Result<SaveResult> saved = [&] {
    ProgressDisplay shown("save " + o.file, Counted::kRead, st.file->size(), o.progress.mode(o.json));
    return shown.finish(store->save(*st.file, st.state, req));
  }();
  KV_ASSIGN_OR_RETURN(SaveResult r, std::move(saved));
  return render_save(r, store->paths().root, o.json, out);
}

// SaveRequest::source_unchanged for `path`: its stamp now (before the save's first read) is still
// its stamp once the save has read it all. A llama-server saving the slot again writes the same
// file in place, and the snapshot would hold part of each version (every chunk's SHA-256 is of
// what was read, so nothing would ever flag it).
std::function<Status()> unchanged_since(const std::string& path) {
  auto before = cli_io().stamp(path);
  if (!before.ok()) return nullptr;  // not there (the open says so) or an Io without stamps
  return [path, was = *before] {
    auto now = cli_io().stamp(path);
    if (now.ok() && *now == was) return Status::OK();
    return Status::IOError(path + ": changed while kvsnap read it (did a llama-server save this slot again?): nothing "
                           "stored; save it again once nothing writes to it");
  };
}

// --tokens: a file of token ids (JSON array, or separated by commas or spaces), else the list itself.
Result<std::vector<int32_t>> tokens_arg(const std::string& arg) {
  if (cli_io().open_read(arg).ok()) return read_token_list(arg);
  std::vector<int32_t> out;
  size_t at = 0;
  while (at <= arg.size()) {
    const size_t comma = std::min(arg.find(',', at), arg.size());
    const std::string w = arg.substr(at, comma - at);
    int32_t v = 0;
    const auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (w.empty() || ec != std::errc() || p != w.data() + w.size()) {
      return Status::InvalidArgument("{--tokens} '" + quote_text(arg, 40) + "': neither a file nor a comma-separated list "
                                     "of token ids ('" + w + "')");
    }
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

Status run_save_mlx(const SaveOpts& o, SaveRequest req, const ReadableFile& file, std::string& out) {
  if (!o.input_format.empty()) {
    return Status::InvalidArgument(o.file + ": an mlx-lm prompt cache: {--input-format} is for llama.cpp raw buffers");
  }
  req.mlx_model = o.model;  // a name here (mlx-lm loads models by name or directory), not a GGUF
  if (!o.tokens.empty()) {
    KV_ASSIGN_OR_RETURN(req.tokens, tokens_arg(o.tokens));
  }
  req.source_name = o.file;
  KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(file));
  KV_ASSIGN_OR_RETURN(auto store, open_or_create_store(o.store));
  Result<SaveResult> saved = [&] {
    ProgressDisplay shown("save " + o.file, Counted::kRead, file.size(), o.progress.mode(o.json));
    return shown.finish(store->save_mlx(file, cache, req));
  }();
  KV_ASSIGN_OR_RETURN(SaveResult r, std::move(saved));
  return render_save(r, store->paths().root, o.json, out);
}

Status run_save_server(const SaveOpts& o, SaveRequest req, std::string& out) {
  KV_ASSIGN_OR_RETURN(ServerTarget t, server_target(o.srv, o.store, "", "", "", o.model));
  std::optional<ModelInfo> model;
  if (!t.model.empty()) {
    KV_ASSIGN_OR_RETURN(model, load_model_info(cli_io(), t.model));
    req.model = &*model;
  }
  KV_ASSIGN_OR_RETURN(auto store, open_or_create_store(o.store));
  Result<ServerSaveResult> saved = [&] {
    ProgressDisplay shown("save slot " + std::to_string(t.slot), Counted::kRead, 0, o.progress.mode(o.json));
    req.on_start = [&shown](uint64_t file_bytes) { shown.set_total(file_bytes); };  // once the server wrote it
    return shown.finish(save_from_server(cli_io(), *store, t, req));
  }();
  KV_ASSIGN_OR_RETURN(ServerSaveResult r, std::move(saved));
  const json extra = {{"server_build", server_build_json(r.build)}, {"server", t.endpoint.url}, {"slot", t.slot},
                      {"n_saved", r.n_saved}, {"server_ms", r.server_ms}};
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
    j["evicted"] = json::array();
    for (const auto& v : r.evicted) j["evicted"].push_back(victim_json(v));
    j["cap_warnings"] = r.cap_warnings;
    j["gc_warnings"] = r.gc_warnings;
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  std::string buf;
  buf = printf_text(
                "saved %s: %lld tokens, K %s V %s%s, %s -> %s stored (%llu of %llu chunks new, %s written), %.2f s\n"
                "  uuid %s%s\n",
                label(r.info).c_str(), (long long)r.info.n_tokens, r.info.k_types.c_str(), r.info.v_types.c_str(),
                r.info.lossy.empty() ? "" : (" (lossy: " + r.info.lossy + ")").c_str(), mib(r.info.raw_bytes).c_str(),
                mib(r.info.stored_bytes).c_str(), (unsigned long long)r.chunks_new, (unsigned long long)r.chunks,
                mib(r.bytes_new).c_str(), r.seconds, r.info.uuid.c_str(),
                r.info.parent_id ? (", parent id " + std::to_string(*r.info.parent_id)).c_str() : "");
  out = buf;
  for (const auto& v : r.evicted) out += "  evicted " + victim_line(v) + "\n";
  for (const auto& w : r.cap_warnings) out += "  warning: cap not met: " + w + "\n";
  for (const auto& w : r.gc_warnings) out += "  warning: gc after eviction: " + w + "\n";
  return Status::OK();
}

}  // namespace

void setup_save(CLI::App& app, int& exit_status) {
  {
    auto o = std::make_shared<SaveOpts>();
    auto* sub = app.add_subcommand("save", "Store a llama.cpp slot/session file in the snapshot store (compressed, "
                                           "checksummed, deduplicated by chunk)");
    sub->add_option("file", o->file, "the state file (a llama-server slot file, a session file, a raw buffer, or an "
                                     "mlx-lm prompt cache, told by content)");
    add_server_options(sub, o->srv);
    sub->add_option("--name", o->name, "a unique name to restore it by (default: none; ids and uuids always work)");
    sub->add_option("--tag", o->tags, "KEY=VALUE, repeatable; filter with ls --tag");
    sub->add_option("--model,-m", o->model, "the model's GGUF: records its fingerprint and head dims (recommended); "
                                            "for an mlx-lm prompt cache, the model's name (recorded as given)");
    sub->add_option("--tokens", o->tokens, "mlx-lm prompt caches: the prompt's token ids, a file (JSON array or "
                                           "whitespace separated) or a comma list: find --tokens then finds it");
    sub->add_option("--store-type", o->store_type, "quantize K and V to this type on store (lossy, recorded as such)");
    sub->add_option("--store-ctk", o->store_ctk, "quantize only K on store");
    sub->add_option("--store-ctv", o->store_ctv, "quantize only V on store");
    sub->add_option("--input-format", o->input_format, "raw-seq or raw-context for raw buffers");
    add_source_options(sub, o->src_rotation, o->source_build,
                       "the file (recorded with the snapshot; with --server, default: the server's /props build_info)");
    sub->add_option("--ttl", o->ttl, "expire after DURATION (90m, 12h, 7d, 2w): gc and later saves evict it");
    sub->add_flag("--pin", o->pin, "never evict it (kvsnap unpin undoes)");
    sub->add_option("--level", o->level,
                    "auto (the default): zstd -10 for the first ~40 MiB and while the disk is the limit, raw while "
                    "the CPU is, so the save goes at the pace of the slower; a zstd level for every new chunk (-10: fast, "
                    "f16 ~18% smaller; 1 and up trade time for space); or none: every new chunk stored raw (the "
                    "fastest save and restore when the CPU, not the disk, is the limit)");
    sub->add_option("--cells-per-chunk", o->cells_per_chunk, "cells per chunk (default 256)");
    sub->add_option("--threads,-t", o->threads, "compression threads (default: all cores)")->check(CLI::Range(0, 256));
    sub->add_flag("--json", o->json, "machine-readable result");
    add_progress_flags(sub, o->progress);
    sub->footer("\nExamples:\n  kvsnap save slot0.bin --name chat-42 --tag user=ana -m model.gguf\n"
                "  kvsnap save slot0.bin --store-type q8_0 -m model.gguf    # half the space, lossy\n"
                "  kvsnap save slot0.bin --ttl 7d                            # gc evicts it after a week\n"
                "  kvsnap save --server http://127.0.0.1:8080 --slot 0 --slot-dir /srv/slots --name chat-42\n"
                "  kvsnap save prompt.safetensors --model mlx-community/Qwen3-4B-4bit --tokens prompt.json   # mlx-lm\n");
    bind(sub, o, run_save, "save", exit_status);
  }
}

}  // namespace kvsnap::cli
