#include "serve/serve.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "base/io.h"
#include "base/json_access.h"
#include "base/os.h"
#include "base/stale_temps.h"
#include "serve/adapters.h"
#include "serve/control.h"
#include "serve/drain.h"
#include "serve/ladder.h"
#include "serve/llama_args.h"
#include "serve/persist.h"
#include "serve/prefix.h"
#include "serve/proxy.h"
#include "serve/requests.h"
#include "serve/supervisor.h"
#include "server/llama_server.h"
#include "store/store.h"
#include "store/store_location.h"

namespace kvsnap {

namespace {

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM"; }

// How long a completion waits for the saves queued before it (a slot of a long context takes seconds).
constexpr double kSaveWaitS = 120;
// How long a completion waits for a slot when every one is taken by a completion kvsnap forwarded:
// a long generation holds its slot that long; past it the request goes on (a lost permit never
// stops the server).
constexpr double kSlotWaitS = 3600;

// What a completion asks of the slot gate: the slot its client pinned it to; any slot, as
// llama-server would choose it (kvsnap tokenizes the prompt for that now: PrefixRestorer::slot_holds
// keeps the tokens for its lookup); or, when kvsnap cannot pin it (a route that drops id_slot, a body that is
// not a JSON object) or it runs in several slots ("n" > 1: llama-server takes other free slots for the
// copies), to run alone.
SlotWant slot_want(PrefixRestorer& prefix, Forward& f) {
  SlotWant want;
  if (is_form_data_route(f.path)) {  // transcriptions: no id_slot in form data
    want.kind = SlotWant::Kind::kAlone;
    return want;
  }
  const Result<CompletionRequest>& req = completion_request(f);
  // A body kvsnap cannot read may ask for several too (llama-server's parser takes deeper JSON).
  if (!req.ok() || req->n_cmpl != 1) f.several_slots = true;
  if (!req.ok() || !route_takes_id_slot(f.path) || !req->object || f.several_slots) {
    want.kind = SlotWant::Kind::kAlone;
  } else if (req->id_slot != -1) {
    want.kind = SlotWant::Kind::kSlot;
    want.id_slot = req->id_slot;
  } else {
    want.holds = prefix.slot_holds(f, *req);
    want.prompt_tokens = f.prompt_tokens.size();
  }
  return want;
}

// Before completion `f` runs in its slot (every one when it runs alone, every idle one without a
// permit): a slot whose cache the child would go on from under other LoRA scales than it was made
// under is erased (serve/adapters.h). Nothing to do while no request's own scales can run. An error
// (the child cannot list or erase its slots): the request is not forwarded.
Status clear_other_scales(const ServerEndpoint& child, const ChildScales& scales, const Forward& f,
                          PrefixRestorer& prefix, SlotBook& book, const std::function<void(const std::string&)>& log) {
  if (!scales.admits_own_scales()) return Status::OK();
  LlamaServer srv(child);
  std::vector<int> erased;
  const Status s = erase_slots_of_other_scales(
      srv, scales.adapters().loaded, f.own_scales, f.hold ? f.pinned_slot : -1, bool(f.hold),
      [&prefix](int slot, int64_t task) { return prefix.restored_since(slot, task); }, erased);
  for (int e : erased) {
    book.forget(e);
    prefix.forget_slot(e);
  }
  if (!erased.empty())
    log("persist: erased " + std::to_string(erased.size()) + " slot(s) whose cache was made under other LoRA scales " +
        "than the next request's");
  return s;
}

// True when the child's command line loads LoRA adapters (--lora, --lora-scaled, wherever set).
bool loads_adapters(const LlamaArgs& args) {
  for (const LlamaArgs::Setting& c : args.cache_settings)
    if (c.flag == "--lora" || c.flag == "--lora-scaled") return true;
  return false;
}

// The child's LoRA adapters (GET /lora-adapters), read at each of its starts for the request threads
// and the saves; `at_start`: said in the log (a restart says it only when they changed).
void read_scales(const ServerEndpoint& child, const LlamaArgs& args, ChildScales& scales, Persister& persist,
                 const std::function<void(const std::string&)>& log, bool at_start) {
  LlamaServer srv(child);
  ChildAdapters a = read_child_adapters(srv, loads_adapters(args));
  a.ungated_tasks = args.embeddings;
  const ChildAdapters before = scales.adapters();
  scales.set(a, ram_cache_off(args));
  persist.set_loaded_scales(a.loaded);
  if (!at_start && a.loaded == before.loaded && a.known) return;
  if (!at_start && !a.known && !before.known && !before.restarting) return;  // still unreadable: said before
  if (!a.known) {
    log("the child's LoRA adapters cannot be read (" + a.why_unknown + "): requests with scales of their own are "
        "refused (400)");
    return;
  }
  if (a.loaded.empty()) return;
  std::string shown;
  for (float f : a.loaded) shown += (shown.empty() ? "" : ", ") + std::to_string(f);
  const std::string why = scales_refusal(a, ram_cache_off(args), a.loaded);
  log("the child loaded " + std::to_string(a.loaded.size()) + " LoRA adapter(s) at scales " + shown +
      ": a request's own scales are " +
      (why.empty() ? "served (a slot is erased before a request of other scales would go on from it; their "
                     "conversations are not kept)"
                   : "refused (400): " + why));
}

// Sends an unpinned completion to the slot the gate gave it (id_slot in its body). Either way the
// exchange runs in `slot` (pinned_slot: the slot its save is for when the answer names none).
void pin_to_slot(Forward& f, int slot) {
  f.pinned_slot = slot;
  const Result<CompletionRequest>& req = completion_request(f);
  if (!req.ok() || req->id_slot != -1) return;  // the client's own pin (the gate gave that slot)
  write_id_slot(f, slot);  // an object: slot_want found one
}

// The slot files a killed kvsnap serve (or save/restore --server) left in `dir`: kvsnap temporaries
// whose process is gone (base/stale_temps.h). Removed at start: nothing else there would.
void remove_stale_slot_files(Io& io, const std::string& dir, const std::function<void(const std::string&)>& log) {
  auto entries = io.list_dir(dir);
  if (!entries.ok()) return;  // the child's saves will say what is wrong with the directory
  size_t removed = 0;
  for (const DirEntry& e : *entries) {
    const std::optional<long> pid = kvsnap_temp_pid(e.name);
    // The kept scratch file (pid 0) is only ever a restore --server's, which may be at work.
    if (!pid || *pid == 0 || !e.is_regular) continue;
    const std::string path = dir + "/" + e.name;
    std::optional<int64_t> written_ns;
    if (auto stamp = io.stamp(path); stamp.ok()) written_ns = stamp->mtime_ns;
    if (is_stale_temp(*pid, written_ns) && io.remove(path).ok()) ++removed;
  }
  if (removed)
    log("removed " + std::to_string(removed) + " slot file" + (removed == 1 ? "" : "s") + " a stopped kvsnap left in " +
        dir);
}

// The child's port (base/os.h: outside the ephemeral range, so no other process is given it
// before the child binds it).
Result<int> child_port() {
  const int port = free_loopback_port();
  if (port <= 0) return Status::IOError("cannot find a free loopback port for llama-server (outside the ephemeral range)");
  return port;
}

Result<Ladder> ladder_of(Io& io, const ServeOptions& o, const LlamaArgs& args) {
  if (o.dynamic_cache.empty() || o.cache_budget.empty())
    return Status::InvalidArgument("--dynamic-cache and --cache-budget go together (e.g. --dynamic-cache "
                                   "f16,q8_0,q4_0 --cache-budget 2G)");
  if (args.model.empty())
    return Status::InvalidArgument("--dynamic-cache sizes the cache from the model: llama-server's ARGS need -m MODEL (or "
                                   "LLAMA_ARG_MODEL; a model llama-server downloads is not read)");
  KV_ASSIGN_OR_RETURN(uint64_t budget, parse_budget(o.cache_budget));
  auto model = load_model_info(io, args.model);
  if (!model.ok()) return model.status().Prefixed("--dynamic-cache: reading the model " + args.model);
  return make_ladder(o.dynamic_cache, budget, *model, args.flash_attn);
}

// llama-server (3.22.1: --cache-idle-slots, on by default) clears every idle slot when a task starts
// if its KV cache is unified (the default without -np: 4 slots sharing one cache): a conversation that
// ended a moment before, whose save is not done, is gone before kvsnap saves it (oracle.serve, "many
// clients" without -np: 7 and 9 of 20 lost). Off in the child's environment unless the user chose it
// (a config file, the environment or ARGS: LlamaArgs::cache_idle_slots); chosen on, it is warned about.
// Before any thread starts (setenv).
void keep_idle_slots(const LlamaArgs& args, const std::function<void(const std::string&)>& log) {
  if (args.cache_idle_slots) {
    if (*args.cache_idle_slots)
      log("persist: " + args.cache_idle_slots_from +
          " turns on llama-server's --cache-idle-slots (unless --cache-ram 0 turns it off): with a unified KV cache "
          "(no -np, or -kvu) it clears idle slots when a task starts, and a conversation whose save is not done by "
          "then is lost");
    return;
  }
  ::setenv("LLAMA_ARG_CACHE_IDLE_SLOTS", "0", 1);
  log("persist: llama-server runs with LLAMA_ARG_CACHE_IDLE_SLOTS=0 (its --no-cache-idle-slots): with a unified KV cache "
      "it would clear idle slots before kvsnap has saved them");
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The keys of kvsnap's own routes: --admin-key-file's lines (no trimming, '#' comments, as an API
// key file of llama-server's) and KVSNAP_ADMIN_KEY.
Result<std::vector<std::string>> admin_keys_of(Io& io, const ServeOptions& o) {
  std::vector<std::string> keys;
  if (!o.admin_key.empty()) keys.push_back(o.admin_key);
  if (o.admin_key.find_first_of("\r\n") != std::string::npos)
    return Status::InvalidArgument("KVSNAP_ADMIN_KEY holds a carriage return or line feed: no client can send it "
                                   "in a header");
  if (o.admin_key_file.empty()) return keys;
  auto bytes = read_all(io, o.admin_key_file, 1 << 20);
  if (!bytes.ok())  // a bad argument, whatever the reason (exit 2, as a bad --api-key-file)
    return Status::InvalidArgument("--admin-key-file " + o.admin_key_file + " cannot be read: " +
                                   bytes.status().message());
  const size_t before = keys.size();
  std::istringstream in(std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') keys.push_back(line);
  for (const std::string& k : keys)
    if (k.find_first_of("\r\n") != std::string::npos)  // no client could send it (a header value)
      return Status::InvalidArgument("--admin-key-file " + o.admin_key_file +
                                     ": a key holds a carriage return (saved with CRLF line ends?); no client can "
                                     "send it in a header");
  if (keys.size() == before)
    return Status::InvalidArgument("--admin-key-file " + o.admin_key_file +
                                   " names no key (one key a line; empty lines and lines starting with # are skipped)");
  return keys;
}

}  // namespace

Status parse_listen(const std::string& s, std::string& host, int& port) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos)
    return Status::InvalidArgument("--listen '" + s + "' must be HOST:PORT (e.g. 127.0.0.1:8080 or 0.0.0.0:8080)");
  host = colon == 0 ? "127.0.0.1" : s.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string p = s.substr(colon + 1);
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
  if (ec != std::errc() || end != p.data() + p.size() || port <= 0 || port > 65535)
    return Status::InvalidArgument("--listen '" + s + "': the port must be a number from 1 to 65535");
  return Status::OK();
}

Status run_serve(Io& io, const ServeOptions& o, const std::function<void(const std::string&)>& log, int* stopped_by) {
  // SIGTERM/SIGINT/SIGHUP are taken by sigwait below: blocked first, before the store is opened
  // (a key command) and before any thread starts, so every thread inherits the mask (the child
  // gets default signals back: supervisor.cc) and the CLI's handler (cli/progress.cc), which would
  // fail every later file access, never sees them. One that comes during the start waits, pending,
  // for the first check. SIGHUP (the terminal closed) shuts down as SIGTERM does.
  // A signal kvsnap was started with ignored stays ignored, as the CLI's handler leaves it: `nohup
  // kvsnap serve` outlives its terminal, a script's background `kvsnap serve &` a Ctrl-C. It is
  // left out of the set: on Linux a blocked signal is queued even while ignored, and sigwait would
  // take it.
  sigset_t sigs;
  sigemptyset(&sigs);
  std::string ignored;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    if (signal_ignored(sig)) {
      ignored += std::string(ignored.empty() ? "" : ", ") + signal_name(sig);
      continue;
    }
    sigaddset(&sigs, sig);
  }
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  if (!ignored.empty())
    log("started with " + ignored + " ignored (nohup, or a background job of a script): it does not stop serve");
  // The proxy's pool: 0 threads would take connections and never answer them.
  if (o.threads < 1 || o.threads > 4096)
    return Status::InvalidArgument("{--threads} " + std::to_string(o.threads) +
                                   ": the connections served at once must be 1 to 4096");
  KV_ASSIGN_OR_RETURN(LlamaArgs args, parse_llama_args(o.llama));
  keep_idle_slots(args, log);
  KV_ASSIGN_OR_RETURN(std::vector<std::string> admin_keys, admin_keys_of(io, o));
  std::optional<Ladder> ladder;
  if (!o.dynamic_cache.empty() || !o.cache_budget.empty()) {
    KV_ASSIGN_OR_RETURN(ladder, ladder_of(io, o, args));
    // The child starts at the first rung, with the context the budget holds there.
    const Rung& r = ladder->rungs[0];
    KV_ASSIGN_OR_RETURN(args, with_cache(args, r.ctk, r.ctv, "", r.ctx_size));
    log("dynamic cache: starting at " + r.ctk + "/" + r.ctv + " with -c " + std::to_string(r.ctx_size) + " (" +
        std::to_string(r.bytes_per_token) + " bytes a token, budget " + std::to_string(ladder->budget) + " bytes)");
  }
  ProxyOptions po;
  KV_RETURN_IF_ERROR(parse_listen(o.listen, po.listen_host, po.listen_port));
  po.threads = o.threads;
  po.api_keys = args.api_keys;  // a client without one of them makes kvsnap do no work (ProxyOptions)
  {
    auto max = parse_byte_size(o.max_request_bytes);
    if (!max.ok() || *max == 0)
      return Status::InvalidArgument("--max-request-bytes '" + o.max_request_bytes +
                                     "' must be a size above 0, like 256M or 1G (binary multiples)");
    po.max_request_bytes = *max;
  }
  KV_ASSIGN_OR_RETURN(StoreLocation where, resolve_store_location(io, o.store));
  apply_key_flags(where, o.keys);  // the key is loaded once (load_store_key), for every connection
  KV_ASSIGN_OR_RETURN(auto stores, TenantStores::open(io, where, o.tenant_per_namespace));
  const std::string serve_dir = where.local_dir + "/serve", slot_dir = serve_dir + "/slots";
  KV_RETURN_IF_ERROR(io.create_dirs(slot_dir));
  remove_stale_slot_files(io, slot_dir, log);
  KV_ASSIGN_OR_RETURN(po.upstream_port, child_port());

  signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not the end of kvsnap

  ServerTarget target;
  target.endpoint = {"http://127.0.0.1:" + std::to_string(po.upstream_port), args.api_key, 3600};
  target.slot_dir = slot_dir;
  // No scratch file (server_flows.h): it would hold disk space the next save needs when the slot
  // directory's disk is nearly full, where a save must fail only for its own file (serve_test.py).
  target.keep_scratch = false;
  target.model = args.model;
  target.ctk = args.ctk;
  target.ctv = args.ctv;
  // "auto" is the server's choice, which it does not report: restores detect it from a saved slot.
  target.flash_attn = args.flash_attn == "auto" ? "" : args.flash_attn;
  // The child inherits LLAMA_ATTN_ROT_DISABLE: its quantized caches are stored plain, saved so and
  // restored so (a restore would otherwise write them rotated, as its build does by default).
  if (!args.rotation_disabled_by.empty()) {
    target.server_rotation = "off";
    log("the child stores quantized caches unrotated (" + args.rotation_disabled_by + "): its saves are recorded so "
        "and restores written so");
  }
  // Snapshots are tagged with the child's cache-changing settings and only restored under the same.
  std::string cache_tag = cache_settings_tag(args);
  if (!cache_tag.empty()) {
    std::string shown;
    for (const LlamaArgs::Setting& c : args.cache_settings)
      shown += (shown.empty() ? "" : ", ") + c.flag + (c.value.empty() ? "" : " " + c.value) + " (" + c.from + ")";
    log("the child's cache-changing settings: " + shown + "; its snapshots are tagged serve.cache=" + cache_tag +
        " and only snapshots of the same settings are restored");
  }
  // Two connections to the store (a Catalog is one SQLite connection, for one thread at a time): the
  // background saves never hold up a request's prefix lookup (SQLite's WAL lets them run together).
  KV_ASSIGN_OR_RETURN(auto lookup_stores, TenantStores::open(io, where, o.tenant_per_namespace));
  std::mutex store_mu, lookup_mu;
  Persister persist(io, *stores, store_mu, target, log);
  PrefixRestorer prefix(io, *lookup_stores, lookup_mu, target, log);
  SlotBook book;
  persist.set_book(&book);
  persist.set_every_task_gated(!args.embeddings);
  persist.set_cache_tag(cache_tag);
  prefix.set_cache_tag(cache_tag);
  prefix.set_book(&book);
  prefix.set_on_restored([&persist](int slot, int64_t task) { persist.note_restored(slot, task); });
  prefix.set_holds_unsaved([&persist](int slot, int64_t task) { return persist.holds_unsaved(slot, task); });
  Drain drain;
  SlotGate slot_gate;
  ChildScales scales;
  Proxy proxy(
      po,
      [&persist, &prefix, &slot_gate, &scales, &book, &target, &args, &log](Forward& f) {
        if (f.method == "POST" && is_completion_route(f.path)) {
          if (scales.read_again(10)) read_scales(target.endpoint, args, scales, persist, log, false);
          scales.settle(f);  // the LoRA scales it runs with (serve/adapters.h)
          if (!f.refused.empty()) return;
          // One completion per slot in the child, and kvsnap names it (SlotGate, serve/drain.h):
          // llama-server would put one more in its queue, or in a slot freed by a generation whose
          // save is not queued yet, and start it there before that conversation is saved.
          bool waited_out = false;
          int slot = -1;
          f.arrived = std::chrono::steady_clock::now();
          f.hold = slot_gate.enter(kSlotWaitS, slot_want(prefix, f), &waited_out, &slot);
          if (slot >= 0) pin_to_slot(f, slot);
          if (!f.hold && slot_gate.shut_down()) {
            // kvsnap is stopping: a completion still waiting for a slot is refused, not forwarded
            // in turn while the shutdown waits for it
            f.refused = R"({"error":{"code":503,"message":"kvsnap serve is shutting down (SIGTERM or SIGINT); )"
                        R"(try again when it is back","type":"unavailable_error"}})";
            return;
          }
          // Own scales run only in a slot reserved for them (clear_other_scales counts on the permit).
          if (f.own_scales && !f.hold) {
            f.refused_status = waited_out ? 503 : 400;
            f.refused = json_text(nlohmann::json{
                {"error",
                 {{"code", f.refused_status},
                  {"message", waited_out ? "kvsnap serve: no slot came free for a request with LoRA scales of its own; "
                                           "try again"
                                         : "kvsnap serve: a request with LoRA scales of its own needs a slot of its "
                                           "own, and the child's slots could not be counted at start"},
                  {"type", waited_out ? "unavailable_error" : "invalid_request_error"}}}});
            return;
          }
          if (!f.hold) persist.note_unguarded();  // no permit: the wait ran out, or no slot count
          if (waited_out)
            log("persist: every slot stayed busy for " + std::to_string(int(kSlotWaitS)) + " s; a " + f.path +
                " request goes on without waiting, a conversation it displaces may be lost");
          // The slot given may hold a conversation whose save is queued (its permit came back once
          // the save was queued): the save goes first, or the conversation is lost. Before the
          // prefix lookup too, which may restore into that slot.
          if (!persist.wait_saved(kSaveWaitS)) {
            persist.note_unguarded();
            log("persist: the saves queued before a " + f.path + " request took over " +
                std::to_string(int(kSaveWaitS)) + " s; the request goes on, a slot they were for may be lost");
          }
          if (Status s = clear_other_scales(target.endpoint, scales, f, prefix, book, log); !s.ok()) {
            log("persist: a " + f.path + " request is not forwarded: the slots of other LoRA scales could not be "
                "checked or erased: " + s.ToString());
            f.refused = R"({"error":{"code":503,"message":"kvsnap serve could not check the child's slots for a )"
                        R"(cache of other LoRA scales; try again","type":"unavailable_error"}})";
            return;
          }
          // Alone (no slot named): a slot whose task is newer than the newest now is this request's;
          // an older one that is still unsaved (two tenants' prompts tied) is not.
          if (f.hold && slot < 0) f.own_after_task = persist.newest_task();
        }
        prefix.before(f);
      },
      [&persist, &prefix](const Exchange& x) {
        prefix.after(x);
        persist.note_completion(x);
      });
  SupervisorOptions so;
  so.argv = child_argv(args, po.upstream_port, slot_dir);
  so.health_url = target.endpoint.url;
  so.api_key = args.api_key;
  so.log_path = o.log_file.empty() ? serve_dir + "/llama-server.log" : o.log_file;
  // Tests on Linux run the lifeline alone, as macOS has it (docs/serve.md, "Shutdown").
  if (const char* e = std::getenv("KVSNAP_SERVE_NO_PDEATHSIG"); e && std::string(e) == "1") so.parent_death_signal = false;
  Supervisor sup(so, log);
  // Read again before the child starts again: a save across the restart keeps nothing (Persister), and
  // what the next child reads (its config.ini files) is serve's before that child can answer.
  std::optional<LlamaArgs> restarted_args;
  sup.on_exit([&persist, &prefix, &args, &cache_tag, &scales, &restarted_args, &log] {
    // Its tasks are over: a save across the restart keeps nothing. (The book, /kvsnap/usage's view,
    // stays until the next child is up: a requantize restores what it shows.)
    persist.forget_slots();
    // The child reads its config.ini files again as it starts: an edit since kvsnap read them may
    // have changed its cache settings (the ones a config file alone set are not pinned on its
    // command line: --lora there would load twice). Read them again as it will.
    auto now = parse_llama_args(args.argv);
    restarted_args = now.ok() ? *now : args;
    // Unreadable: a tag no other start has, so that nothing saved now is restored later.
    const std::string tag = now.ok() ? cache_settings_tag(*now) : "unreadable-" + unique_suffix();
    scales.restarting(loads_adapters(*restarted_args), ram_cache_off(*restarted_args));  // read again once it is up
    if (tag == cache_tag) return;
    log("the restarted child's cache-changing settings differ from its last start's (" +
        (now.ok() ? "a config.ini edited meanwhile" : "its config.ini cannot be read now: " + now.status().message()) +
        "): snapshots are tagged serve.cache=" + (tag.empty() ? std::string("(none)") : tag) +
        " from now on, and those of the earlier settings are no longer restored");
    cache_tag = tag;
    persist.set_cache_tag(tag);
    prefix.set_cache_tag(tag);
  });
  sup.on_restart([&persist, &prefix, &book, &args, &scales, &restarted_args, &target, &log] {
    persist.forget_slots();  // a save since the exit kept nothing: task ids start again
    prefix.forget_slots();
    book.clear();
    read_scales(target.endpoint, restarted_args ? *restarted_args : args, scales, persist, log, false);
  });
  ControlDeps cd{&io, stores.get(), &store_mu, &drain, &persist, &prefix, &sup, &book,
                 target.endpoint.url, po.upstream_port, slot_dir, log};
  cd.admin_keys = admin_keys;
  Control control(cd, args, ladder);
  persist.set_on_saved([&control] { control.note_saved(); });
  proxy.set_local([&control](const LocalRequest& r, LocalAnswer& a) { return control.handle(r, a); });
  // Requests wait while a requantize restarts the child (a large model can take minutes to load).
  proxy.set_drain(&drain, 600);
  // A hung-up stream's slot keeps what the child had evaluated, its prompt or a part of it: a later
  // save must know whose it is (Persister::note_prompt).
  proxy.set_on_given_up([&persist](const Exchange& x) { persist.note_prompt(x); });
  KV_RETURN_IF_ERROR(proxy.bind());
  for (const auto& c : args.config_files)
    log("read llama-server's config file " + c + " as llama-server does (before its environment and ARGS, which win)");
  for (const auto& c : args.config_settings) log("  from " + c);
  // A SIGINT or SIGTERM while the model loads (minutes for a large one) stops the load, not after it.
  int load_sig = 0;
  if (Status s = sup.start([&] { return take_pending_signal(sigs, &load_sig); }); !s.ok()) {
    if (load_sig == 0) return s;
    log(std::string("got ") + signal_name(load_sig) + " while llama-server was loading: stopped it");
    if (stopped_by) *stopped_by = load_sig;
    return Status::Interrupted("kvsnap serve: stopped while llama-server was loading its model (nothing was saved)");
  }
  // The slot count (-np, or llama-server's default) from the child itself; unknown: no gate.
  if (auto slots = LlamaServer(target.endpoint).slots(); slots.ok() && !slots->empty()) {
    slot_gate.set_capacity(int(slots->size()));
  } else {
    log("persist: the child's slots could not be listed (" +
        (slots.ok() ? std::string("none") : slots.status().ToString()) +
        "): completions are not held to one per slot, and with more clients than slots a conversation may be lost");
  }

  read_scales(target.endpoint, args, scales, persist, log, true);
  std::thread server([&proxy] { proxy.run(); });
  log("listening on http://" + o.listen + " (llama-server pid " + std::to_string(sup.pid()) + " on " +
      target.endpoint.url + ", store " + where.local_dir + ", its log " + so.log_path + ")");
  if (!admin_keys.empty())
    log("kvsnap's routes (/kvsnap/...) take the " + std::to_string(admin_keys.size()) + " admin key(s) only");
  else if (args.api_keys.size() > 1)
    log("kvsnap's routes (/kvsnap/requantize, /kvsnap/usage) take any of the child's " +
        std::to_string(args.api_keys.size()) + " API keys: --admin-key-file gives them a key of their own");
  else if (args.api_keys.empty() && !is_loopback_host(po.listen_host))
    log("no API key and no admin key: llama-server's routes and kvsnap's (/kvsnap/requantize drains and restarts "
        "it) are open to anyone who reaches " + o.listen + " (--api-key-file, --admin-key-file)");
  int sig = 0;
  sigwait(&sigs, &sig);
  const uint64_t in_flight = drain.shut();  // new requests: 503 from here on
  slot_gate.shut();  // and the completions still waiting for a slot
  log(std::string("got ") + signal_name(sig) + ": finishing the " + std::to_string(in_flight) +
      " requests in flight (streams to their end; SIGTERM or SIGINT again stops at once), saving the slots, "
      "stopping llama-server");
  // Stopping the HTTP server cuts the streams it is writing: first wait for every ticket to come back.
  while (!drain.wait_idle(0.2)) {
    // A second SIGHUP is the same lost terminal again (a shell and the kernel each send one): only
    // a SIGTERM or SIGINT cuts the requests in flight.
    if (take_pending_signal(sigs, &sig) && sig != SIGHUP) {
      log("second signal: stopping now, the requests still in flight are cut");
      break;
    }
  }
  proxy.stop();
  server.join();
  control.stop();
  persist.save_all();
  sup.stop();
  const PersistStats st = persist.stats();
  const PrefixStats pr = prefix.stats();
  log("stopped: " + std::to_string(st.saved) + " slot saves, " + std::to_string(st.failed) + " failed; " +
      std::to_string(pr.restores) + " prefix restores (" + std::to_string(pr.restored_tokens) + " tokens), " +
      std::to_string(pr.failed) + " failed; " + std::to_string(sup.restarts()) + " restarts of llama-server");
  return Status::OK();
}

}  // namespace kvsnap
