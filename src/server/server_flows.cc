#include "server/server_flows.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "base/json_access.h"
#include "format/ggml_types.h"
#include "server/slot_file_writer.h"
#include "store/store_seal.h"

namespace kvsnap {

namespace {

using Clock = std::chrono::steady_clock;

// Removes a file kvsnap put in the slot directory, whatever happens, or, given
// `keep_as` (the slot directory's scratch name), renames it to that, so the next
// transfer writes over its pages instead of new ones.
struct SlotFile {
  Io& io;
  std::string path;
  std::string keep_as;
  ~SlotFile() {
    if (path.empty()) return;
    if (keep_as.empty() || !io.rename(path, keep_as).ok()) (void)io.remove(path);
  }
};

// "kvsnap-save.kvsnap-tmp-<pid>-<random>.bin": a temporary's name (base/io.h's kTempInfix), so
// that a file a killed kvsnap leaves in the slot directory is known for one: migrate removes it
// once its process is gone, and never converts it as a slot.
std::string fresh_name(const char* what) {
  return std::string("kvsnap-") + what + std::string(kTempInfix) + unique_suffix() + ".bin";
}

double ms_since(Clock::time_point& t) {
  const auto now = Clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - t).count();
  t = now;
  return ms;
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string scratch_path(const ServerTarget& t) { return t.keep_scratch ? join(t.slot_dir, kSlotScratchName) : ""; }

// Refuses a slot that is processing a request (saving or restoring it then
// races the request). Servers started with --no-slots cannot tell: proceed.
Status check_idle(LlamaServer& srv, int slot) {
  auto slots = srv.slots();
  if (!slots.ok()) {
    if (slots.status().code() == Code::kNotFound || slots.status().code() == Code::kNotSupported) return Status::OK();
    return slots.status();
  }
  for (const auto& s : *slots) {
    if (s.id != slot) continue;
    if (s.is_processing)
      return Status::IOError("llama-server " + srv.url() + ": slot " + std::to_string(slot) +
                             " is busy processing a request; try again when it is idle");
    return Status::OK();
  }
  return Status::NotFound("llama-server " + srv.url() + " has no slot " + std::to_string(slot) + " (it has " +
                          std::to_string(slots->size()) + ")");
}

Status check_slot_dir(Io& io, const ServerTarget& t) {
  if (t.slot_dir.empty())
    return Status::InvalidArgument("--slot-dir is needed: the directory the server was started with as --slot-save-path");
  KV_ASSIGN_OR_RETURN(bool there, io.exists(t.slot_dir));
  if (!there) return Status::NotFound("--slot-dir " + t.slot_dir + " does not exist");
  return Status::OK();
}

// A save removes (or renames to the scratch name) the file llama-server writes into the slot
// directory: one kvsnap may not write there would stay, one per save, with exit 0 (a review's
// finding). Asked before the server is: a file made and removed.
Status check_slot_dir_writable(Io& io, const ServerTarget& t) {
  const std::string probe = join(t.slot_dir, fresh_name("probe"));
  auto f = io.open_write(probe, /*exclusive=*/true);
  if (!f.ok()) {
    return Status::IOError("kvsnap cannot create files in --slot-dir " + t.slot_dir + " (" + f.status().message() +
                           "): a save removes the file llama-server writes there, which would stay; run kvsnap as "
                           "a user who may write there (as llama-server does)");
  }
  (void)(*f)->close();
  return io.remove(probe).Prefixed("kvsnap cannot remove files from --slot-dir " + t.slot_dir);
}

// The file the server wrote, opened and parsed; a clear error when it is not where --slot-dir says.
Result<std::unique_ptr<ReadableFile>> open_server_file(Io& io, const ServerTarget& t, const std::string& name) {
  auto f = io.open_read(join(t.slot_dir, name));
  if (!f.ok())
    return Status::NotFound("the server saved '" + name + "' but it is not in --slot-dir " + t.slot_dir +
                            ": is that the server's --slot-save-path? (" + f.status().message() + ")");
  return f;
}

struct Model {
  std::optional<ModelInfo> info;
  std::string from;
  std::string missing;  // without info: why
};

// --model / the profile's model, else the server's own model file when readable here.
Result<Model> find_model(Io& io, LlamaServer& srv, const ServerTarget& t) {
  Model m;
  std::string path = t.model;
  m.from = "--model";
  if (path.empty()) {
    auto props = srv.props();
    if (props.ok()) {
      KV_ASSIGN_OR_RETURN(path, JsonRef(*props, "llama-server " + srv.url() + ": /props", Code::kMismatch)
                                    .string_or("model_path", ""));
    }
    if (!path.empty()) {
      m.from = "the server's model_path";
      // Relative to the server's working directory, which is not kvsnap's: a file of that name
      // here may be another model.
      if (!std::filesystem::path(path).is_absolute()) {
        m.missing = "the server's model_path '" + path + "' is relative to its own directory";
        return m;
      }
      auto there = io.exists(path);
      if (!there.ok() || !*there) {  // another machine's path: go without
        m.missing = "the server's model_path " + path + " is not on this machine";
        return m;
      }
    }
  }
  if (path.empty()) {
    m.missing = "no --model, and the server's /props names no model_path";
    return m;
  }
  auto info = load_model_info(io, path);
  if (!info.ok()) {
    // The server's own file, there but not readable by this user (or not a model kvsnap reads):
    // go without, as for another machine's path; the conversion then refuses what needs it.
    if (m.from != "--model") return Model{std::nullopt, "", "the server's model_path " + path + " cannot be read here"};
    return info.status();
  }
  m.info = std::move(info).value();
  return m;
}

// The server's build; a /props the server cannot give is no build, not an error.
ServerBuild server_build(LlamaServer& srv) {
  auto props = srv.props();
  return props.ok() ? parse_server_build(*props) : ServerBuild{};
}

std::string first_type(const StateFile& f, bool v) {
  for (const auto& sec : f.memory.kv)
    for (const auto& st : sec.streams)
      for (const auto& L : st.layers)
        if (!v || L.has_v) return type_name(v ? L.v_type : L.k_type);
  return "";
}

// Reads the cache types and V layout from a file the server saves of the slot; false: it holds no cells.
Result<bool> types_from_saved_slot(Io& io, LlamaServer& srv, const ServerTarget& t, const ModelInfo* model,
                                   std::string& ctk, std::string& ctv, std::string& fa) {
  SlotFile probe{io, "", ""};  // no keep_as: the probe is removed
  const std::string name = fresh_name("probe");
  probe.path = join(t.slot_dir, name);
  KV_RETURN_IF_ERROR(srv.save_slot(t.slot, name).status());
  auto opened = open_server_file(io, t, name);
  if (!opened.ok())
    return opened.status().Prefixed("detecting the server's cache types (pass --ctk/--ctv/--flash-attn to skip "
                                    "this; delete " + name + " from the server's slot directory)");
  auto file = std::move(opened).value();
  KV_ASSIGN_OR_RETURN(StateFile st, parse_for_model(*file, {}, model));
  for (const auto& sec : st.memory.kv)
    for (const auto& s : sec.streams)
      if (s.cell_count) {
        ctk = first_type(st, false);
        ctv = first_type(st, true);
        fa = s.v_trans ? "off" : "on";
        return true;
      }
  return false;
}

// The server's cache types and V layout, from a file it saves of the slot. An empty slot (a server
// just started, the usual case after a restart with other flags) saves no cells: one token evaluated
// in it first makes it savable; the restore then overwrites it. `filled` says whether that happened.
Status detect_types(Io& io, LlamaServer& srv, const ServerTarget& t, const ModelInfo* model, std::string& ctk,
                    std::string& ctv, std::string& fa, bool& filled) {
  filled = false;
  KV_ASSIGN_OR_RETURN(bool found, types_from_saved_slot(io, srv, t, model, ctk, ctv, fa));
  if (found) return Status::OK();
  auto one = srv.complete(t.slot, {{"prompt", "a"}, {"n_predict", 0}});
  if (!one.ok())
    return one.status().Prefixed("detecting the cache types of " + srv.url() + ": slot " + std::to_string(t.slot) +
                                 " is empty and evaluating one token in it failed; pass --ctk/--ctv/--flash-attn, "
                                 "or keep them in a profile (kvsnap server add)");
  filled = true;
  KV_ASSIGN_OR_RETURN(found, types_from_saved_slot(io, srv, t, model, ctk, ctv, fa));
  if (found) return Status::OK();
  return Status::InvalidArgument("cannot detect the cache types of " + srv.url() + ": slot " + std::to_string(t.slot) +
                                 " is still empty after one token was evaluated in it; pass "
                                 "--ctk/--ctv/--flash-attn, or keep them in a profile (kvsnap server add)");
}

// llama.cpp reads a slot file only into a cache with as many KV streams as the one that saved it
// ("n_stream mismatch" in the server's log, a generic "invalid slot save file" in its answer). No
// probe save tells the server's: with a wrong --slot-dir it would leave the server's file where
// kvsnap cannot remove it.
// The snapshot's KV streams and the server's slot count (0, 0 when either cannot be read).
struct StreamCounts {
  size_t have = 0, slots = 0;
};
StreamCounts stream_counts(const ServerTarget& t, Store& store, const std::string& uuid) {
  ServerEndpoint quick = t.endpoint;  // a hung server already cost one timeout
  quick.timeout_s = std::min(quick.timeout_s, 10.0);
  auto snap = store.open_snapshot(uuid);
  auto slots = LlamaServer(quick).slots();
  if (!snap.ok() || (*snap)->reader().cells().empty() || !slots.ok() || slots->empty()) return {};
  return {(*snap)->reader().cells()[0].streams.size(), slots->size()};
}

// The stream counts the server may have that the snapshot's is not: its slot count (-np N without
// -kvu), then 1 (a unified cache).
std::vector<uint32_t> other_stream_counts(const StreamCounts& c) {
  std::vector<uint32_t> out;
  if (c.have == 0 || c.slots == 0) return out;  // either unread: nothing to go by
  for (size_t n : {c.slots, size_t(1)})
    if (n != 0 && n != c.have && (out.empty() || out.back() != n)) out.push_back(uint32_t(n));
  return out;
}

std::string streams_text(size_t k) { return std::to_string(k) + (k == 1 ? " KV stream" : " KV streams"); }

// Why the server may have refused the file, when the KV streams can be why: a llama.cpp cache
// has one stream per slot with -np N and no -kvu, one for all slots with -kvu (or without -np); the
// server does not say which, only its slot count, so a count the snapshot's cannot be is certain
// and one it may be is a possibility. Said after kvsnap rewrote the streams to every count the
// server may have and it refused those too (or {--kv-streams} fixed the count). Empty when nothing
// points at the streams. `certain`: the counts cannot match.
std::string stream_count_hint(const StreamCounts& c, bool& certain) {
  certain = false;
  if (c.have == 0) return "";
  const size_t have = c.have, n = c.slots;
  const std::string rule = "llama.cpp restores a slot file only into a cache with as many streams: start the server "
                           "with -np 1 or -kvu for 1 stream, with -np N and no -kvu for N, or give {--kv-streams}";
  if (have != 1 && have != n) {
    certain = true;
    return "the file holds " + streams_text(have) + " and this server, with " + std::to_string(n) +
           (n == 1 ? " slot, has 1" : " slots, has 1 or " + std::to_string(n)) + "; " + rule;
  }
  if (n == 1) return "";
  return have == 1 ? "if this server keeps a stream per slot (-np " + std::to_string(n) + " without -kvu), its cache has " +
                         streams_text(n) + " and the file holds 1; " + rule
                   : "if this server's cache is unified (-kvu, or no -np), it has 1 KV stream and the file holds " +
                         streams_text(have) + "; " + rule;
}

Status check_model(const SnapshotInfo& s, const Model& m, const std::string& ref) {
  if (!m.info || s.model_fingerprint.empty()) return Status::OK();
  if (m.info->profile.fingerprint != s.model_fingerprint)
    return Status::Mismatch("snapshot " + ref + " was saved from another model (fingerprint " +
                            s.model_fingerprint.substr(0, 16) + "...) than " + m.info->path + " (" + m.from + ", " +
                            m.info->profile.fingerprint.substr(0, 16) + "...): restore into a server running that model, or "
                            "pass {--model GGUF} if the server's /props model_path is not the model it runs");
  return Status::OK();
}

Result<ReuseCheck> check_reuse(LlamaServer& srv, int slot, const std::vector<int32_t>& tokens) {
  nlohmann::json body = {{"prompt", tokens}, {"n_predict", 0}, {"temperature", 0}};
  KV_ASSIGN_OR_RETURN(CompletionResult c, srv.complete(slot, body));
  ReuseCheck r;
  r.n_tokens = tokens.size();
  r.prompt_n = c.prompt_n;
  r.cache_n = c.cache_n;
  r.reused = c.prompt_n <= 1;
  return r;
}

}  // namespace

Result<ServerBuild> query_server_build(const ServerEndpoint& endpoint) {
  LlamaServer srv(endpoint);
  KV_RETURN_IF_ERROR(srv.health());
  return server_build(srv);
}

Result<ServerSaveResult> save_from_server(Io& io, Store& store, const ServerTarget& t, SaveRequest req,
                                          const SaveHook& before_store) {
  return save_from_server(io, [&store](const SaveRequest&) -> Result<Store*> { return &store; }, t, std::move(req),
                          before_store);
}

Result<ServerSaveResult> save_from_server(Io& io, const StorePick& pick, const ServerTarget& t, SaveRequest req,
                                          const SaveHook& before_store) {
  LlamaServer srv(t.endpoint);
  KV_RETURN_IF_ERROR(check_slot_dir(io, t));
  KV_RETURN_IF_ERROR(check_slot_dir_writable(io, t));
  KV_RETURN_IF_ERROR(srv.health());
  KV_RETURN_IF_ERROR(check_idle(srv, t.slot));
  KV_ASSIGN_OR_RETURN(Model model, find_model(io, srv, t));
  if (!req.model && model.info) req.model = &*model.info;
  ServerSaveResult r;
  r.build = server_build(srv);
  req.writer.reported_build = r.build.reported;
  if (req.writer.src_rotation.empty()) req.writer.src_rotation = t.server_rotation;
  if (req.writer.llama_build.empty() && !r.build.usable.empty()) {
    req.writer.llama_build = r.build.usable;
    req.writer.llama_build_from = "llama-server";
  }
  const std::string name = fresh_name("save");
  SlotFile file{io, join(t.slot_dir, name), scratch_path(t)};
  KV_ASSIGN_OR_RETURN(SlotFileResult saved, srv.save_slot(t.slot, name));
  r.n_saved = saved.n_tokens;
  r.server_ms = saved.ms;
  KV_ASSIGN_OR_RETURN(auto in, open_server_file(io, t, name));
  // The model's RoPE witness runs in Store::save, beside its reading.
  KV_ASSIGN_OR_RETURN(StateFile st, parse_for_model(*in, {}, req.model, HeadDimCheck::kByCaller));
  if (before_store) KV_RETURN_IF_ERROR(before_store(st.tokens.tokens, req));
  if (req.source_name.empty()) req.source_name = srv.url() + " slot " + std::to_string(t.slot);
  KV_ASSIGN_OR_RETURN(Store* store, pick(req));
  KV_ASSIGN_OR_RETURN(r.save, store->save(*in, st, req));
  return r;
}

Result<ServerRestoreResult> restore_to_server(Io& io, Store& store, const ServerTarget& t, const std::string& ref,
                                              bool check) {
  const auto t0 = Clock::now();
  LlamaServer srv(t.endpoint);
  KV_RETURN_IF_ERROR(check_slot_dir(io, t));
  // Before the type probe has the server save into it (a review's finding: its files were left there).
  KV_RETURN_IF_ERROR(check_slot_dir_writable(io, t));
  // What the snapshot alone decides comes before anything is asked of the server: a snapshot that
  // is not there, an mlx-lm one (the store would refuse the llama.cpp types this flow fills in,
  // naming flags never given), a sealed one the key cannot open, a plain one under a key, one
  // whose blobs are missing (Store::restore's checks, early). The restore below reads this very
  // row (by uuid), not whatever the name means by then.
  KV_ASSIGN_OR_RETURN(int64_t id, store.catalog().resolve(ref));
  KV_ASSIGN_OR_RETURN(SnapshotInfo info, store.catalog().get_info(id));
  if (info.model_arch == "mlx-lm") {
    return Status::InvalidArgument("snapshot " + ref + " is an mlx-lm prompt cache: llama-server cannot load it; "
                                   "restore it to a file with {-o} OUT.safetensors (or move it to llama.cpp with "
                                   "kvsnap convert --to llama, docs/mlx.md)");
  }
  KV_RETURN_IF_ERROR(check_snapshot_key(info, store.cipher()));
  KV_RETURN_IF_ERROR(check_plain_under_key(info, store.cipher(), t.allow_plain));
  KV_RETURN_IF_ERROR(store.check_labels_of(ref, id));  // the restore below goes by this row's uuid
  KV_RETURN_IF_ERROR(store.check_blobs_present(id, ref));
  KV_RETURN_IF_ERROR(srv.health());
  KV_RETURN_IF_ERROR(check_idle(srv, t.slot));
  KV_ASSIGN_OR_RETURN(Model model, find_model(io, srv, t));
  // Before a type probe (which may evaluate a token in an empty slot).
  KV_RETURN_IF_ERROR(check_model(info, model, ref));

  ServerRestoreResult r;
  r.ctk = t.ctk;
  r.ctv = t.ctv;
  r.flash_attn = t.flash_attn;
  r.types_from = "given";
  if (r.ctk.empty() || r.ctv.empty() || r.flash_attn.empty()) {
    std::string k, v, fa;
    bool filled = false;
    KV_RETURN_IF_ERROR(detect_types(io, srv, t, model.info ? &*model.info : nullptr, k, v, fa, filled));
    if (r.ctk.empty()) r.ctk = k;
    if (r.ctv.empty()) r.ctv = v;
    if (r.flash_attn.empty()) r.flash_attn = fa;
    r.types_from = filled ? "detected from a file the server saved (the empty slot given one token first)"
                          : "detected from a file the server saved";
  }
  r.model_from = model.info ? model.from : "the snapshot's recorded head dims";
  if (!model.info) r.model_unchecked = model.missing;
  else if (info.model_fingerprint.empty()) r.model_unchecked = "the snapshot recorded no model (saved without --model)";

  RestoreRequest req;
  req.spec.ctk = r.ctk;
  req.spec.ctv = r.ctv;
  req.spec.flash_attn = r.flash_attn;
  req.spec.source_build = t.stored_source_build;
  req.spec.src_rotation = t.stored_src_rotation;
  req.spec.rotation = t.rotation;
  req.spec.dst_rotation = t.server_rotation;
  r.build = server_build(srv);
  r.target_build = t.target_build;
  r.target_build_from = "--target-build";
  if (r.target_build.empty() && !r.build.usable.empty()) {
    r.target_build = r.build.usable;
    r.target_build_from = "the server's /props build_info";
  }
  if (r.target_build.empty()) r.target_build_from.clear();
  req.spec.target_build = r.target_build;
  req.spec.threads = t.threads;
  req.allow_plain = t.allow_plain;
  req.model = model.info ? &*model.info : nullptr;
  req.spec.kv_streams = t.kv_streams;
  const std::string name = fresh_name("restore");
  SlotFile file{io, join(t.slot_dir, name), scratch_path(t)};
  auto lap = Clock::now();
  r.phases.prepare = std::chrono::duration<double, std::milli>(lap - t0).count();
  // Writes the slot file for `req` (over the last one: the writer's rename replaces it).
  auto write_file = [&]() -> Status {
    auto w = SlotFileWriter::create(io, file.path, scratch_path(t));
    if (!w.ok()) return w.status().Prefixed("cannot write into --slot-dir " + t.slot_dir);
    r.scratch_reused = (*w)->reused_scratch();
    KV_ASSIGN_OR_RETURN(r.restore, store.restore(info.uuid, req, **w));
    r.phases.write = ms_since(lap);
    KV_RETURN_IF_ERROR((*w)->commit());
    r.phases.commit = ms_since(lap);
    return Status::OK();
  };
  KV_RETURN_IF_ERROR(write_file());
  auto restored_or = srv.restore_slot(t.slot, name);
  const bool refused_file =
      !restored_or.ok() && restored_or.status().message().find("invalid slot save file") != std::string::npos;
  StreamCounts counts;
  std::vector<uint32_t> tried;
  if (refused_file) counts = stream_counts(t, store, info.uuid);
  if (t.kv_streams > 0 && counts.have > 0) counts.have = size_t(t.kv_streams);  // what the file held
  // The server refused the file: its KV stream count may be another than the snapshot's (-np changed,
  // or -kvu), which the server does not show. Each count it may have is tried, the file rewritten.
  if (refused_file && t.kv_streams == 0) {
    for (uint32_t n : other_stream_counts(counts)) {
      req.spec.kv_streams = int(n);
      KV_RETURN_IF_ERROR(write_file());
      tried.push_back(n);
      restored_or = srv.restore_slot(t.slot, name);
      // Another failure (a timeout, the server gone) is not the count: no more rewrites over it.
      if (!restored_or.ok() && restored_or.status().message().find("invalid slot save file") == std::string::npos) break;
      if (restored_or.ok()) {
        r.kv_streams = n;
        r.kv_streams_from = "the server refused the snapshot's " + streams_text(counts.have) + "; it has " +
                            std::to_string(counts.slots) + (counts.slots == 1 ? " slot" : " slots");
        break;
      }
    }
  }
  if (!restored_or.ok()) {
    bool certain = false;
    std::string hint = refused_file && tried.empty() ? stream_count_hint(counts, certain) : "";
    if (certain)
      return Status::Mismatch("restoring snapshot " + ref + " into " + srv.url() + " slot " + std::to_string(t.slot) +
                              ": " + hint);
    Status failed = restored_or.status().Prefixed("kvsnap wrote " + file.path +
                                                  " for the server (is --slot-dir its --slot-save-path? was the file "
                                                  "still there?)");
    if (!tried.empty()) {
      std::string counts_tried;
      for (uint32_t n : tried) counts_tried += (counts_tried.empty() ? "" : " and ") + std::to_string(n);
      return failed.Appended("; rewritten to " + counts_tried + " KV streams (the counts the server may have, for " +
                             std::to_string(counts.slots) + (counts.slots == 1 ? " slot" : " slots") +
                             ") it was refused too: something else does not fit (each slot's context, -c divided "
                             "by -np without -kvu, against the snapshot's tokens; the model; the types)");
    }
    return hint.empty() ? failed : failed.Appended("; or the KV streams: " + hint);
  }
  r.phases.server = ms_since(lap);
  SlotFileResult restored = *restored_or;
  if (restored.n_tokens != r.restore.n_tokens) {
    return Status::Mismatch(srv.url() + " restored " + std::to_string(restored.n_tokens) + " tokens into slot " +
                            std::to_string(t.slot) + " from " + file.path + ", which holds " +
                            std::to_string(r.restore.n_tokens) + ": is it the llama-server whose --slot-save-path is " +
                            t.slot_dir + "?");
  }
  r.n_restored = restored.n_tokens;
  r.server_ms = restored.ms;
  if (check) {
    KV_ASSIGN_OR_RETURN(auto snap, store.open_snapshot(ref));
    const std::vector<int32_t>& tokens = snap->reader().tokens().tokens;
    if (tokens.empty()) {
      r.check = ReuseCheck{};  // an empty slot's snapshot: no prompt to send (the server refuses an empty one)
      r.check->reused = true;
    } else {
      KV_ASSIGN_OR_RETURN(r.check, check_reuse(srv, t.slot, tokens));
    }
    r.phases.check = ms_since(lap);
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace kvsnap
