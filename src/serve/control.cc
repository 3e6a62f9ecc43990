#include "serve/control.h"

#include <algorithm>
#include <chrono>

#include "base/json_access.h"
#include "format/ggml_types.h"
#include "server/llama_server.h"
#include "serve/requests.h"

namespace kvsnap {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void answer(LocalAnswer& out, int status, const ojson& j) {
  out.status = status;
  out.body = json_text(j);
  out.content_type = "application/json";
}

// llama-server's error shape, so clients read kvsnap's errors as they read the server's.
void error(LocalAnswer& out, int status, const std::string& type, const std::string& message) {
  answer(out, status, {{"error", {{"code", status}, {"message", "kvsnap serve: " + message}, {"type", type}}}});
}

ojson sizes_json(const std::vector<PairSize>& sizes) {
  ojson a = ojson::array();
  for (const PairSize& p : sizes)
    a.push_back({{"ctk", p.ctk}, {"ctv", p.ctv}, {"bytes", p.bytes ? ojson(*p.bytes) : ojson(nullptr)}});
  return a;
}

}  // namespace

Control::Control(ControlDeps d, LlamaArgs args, std::optional<Ladder> ladder)
    : d_(std::move(d)), args_(std::move(args)), ladder_(std::move(ladder)) {
  if (ladder_) watcher_ = std::thread([this] { watch(); });
}

Control::~Control() { stop(); }

void Control::stop() {
  {
    std::lock_guard<std::mutex> l(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

void Control::note_saved() {
  if (!ladder_) return;
  {
    std::lock_guard<std::mutex> l(watch_mu_);
    saved_ = true;
  }
  watch_cv_.notify_all();
}

// The ladder's own thread: after each save, a slot at kStepAt of its context steps the cache down a rung
// (through the requantize path, never from a thread a requantize waits for).
void Control::watch() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(watch_mu_);
      watch_cv_.wait(l, [this] { return stopping_ || saved_; });
      if (stopping_) return;
      saved_ = false;
    }
    if (rung_ + 1 >= ladder_->rungs.size() || ladder_stopped_) continue;
    std::string key;
    {
      std::lock_guard<std::mutex> l(args_mu_);
      key = args_.api_key;
    }
    auto live = LlamaServer({d_.child_url, key, 10}).slots();
    if (!live.ok()) continue;
    const auto book = d_.book->all();
    for (const auto& s : *live) {
      auto it = book.find(s.id);
      if (it == book.end() || s.n_ctx <= 0 || double(it->second.n_tokens) < kStepAt * s.n_ctx) continue;
      const Rung& next = ladder_->rungs[rung_ + 1];
      d_.log("dynamic cache: slot " + std::to_string(s.id) + " holds " + std::to_string(it->second.n_tokens) + " of " +
             std::to_string(s.n_ctx) + " tokens: stepping down to " + next.ctk + "/" + next.ctv + " with -c " +
             std::to_string(next.ctx_size) + " (" + std::to_string(next.bytes_per_token) + " bytes a token, budget " +
             std::to_string(ladder_->budget) + ")");
      Ask ask;
      ask.ctk = next.ctk;
      ask.ctv = next.ctv;
      ask.ctx_size = next.ctx_size;
      LocalAnswer out;
      run(ask, out);
      if (out.status == 200) {
        ++rung_;
      } else if (out.status == 409 || out.status == 503) {
        // Not tried: a requantize of its own was running, or llama-server was restarting. Nothing
        // drained or loaded; the step is tried again after the next save.
        d_.log("dynamic cache: the step down waits (" + std::to_string(out.status) + "): " + out.body +
               "; tried again after the next save");
      } else {
        // Tried again after the next save, a step llama-server refuses would cost every completion a drain
        // and two model loads: the ladder stays where it is until serve is started again.
        ladder_stopped_ = true;
        d_.log("dynamic cache: the step down failed (" + std::to_string(out.status) + "): " + out.body +
               "; the ladder stays at " + ladder_->rungs[rung_].ctk + "/" + ladder_->rungs[rung_].ctv +
               " until kvsnap serve is started again");
      }
      break;
    }
  }
}

bool Control::handle(const LocalRequest& req, LocalAnswer& out) {
  if (is_slot_action(req.method, req.path)) {
    error(out, 403, "permission_error",
          "kvsnap serve saves and restores llama-server's slots itself (its store, its slot gate): a client's " +
              req.method + " " + req.path + " is not forwarded; GET /slots is");
    return true;
  }
  if (changes_adapters(req.method, req.path)) {
    error(out, 403, "permission_error",
          "POST /lora-adapters would change the adapters' scales under kvsnap serve's stored sessions, which "
          "record the child's command line only: it is not forwarded; start kvsnap serve with the scales as "
          "llama-server flags (--lora-scaled FILE:SCALE), or send \"lora\" per request (with the child's --cache-ram 0; those are "
          "not kept)");
    return true;
  }
  if (req.path.rfind("/kvsnap/", 0) != 0) return false;
  {
    std::lock_guard<std::mutex> l(args_mu_);
    if (!may_use_kvsnap_routes(d_.admin_keys, args_.api_keys, req.headers)) {
      error(out, 401, "authentication_error",
            route_keys(d_.admin_keys, args_.api_keys) == RouteKeys::kAdmin
                ? "kvsnap's routes want its admin key (--admin-key-file or KVSNAP_ADMIN_KEY), as Authorization: "
                  "Bearer KEY or X-Api-Key: KEY; the child's API keys do not open them"
                : "Invalid API Key (the child's --api-key/--api-key-file/LLAMA_API_KEY)");
      return true;
    }
  }
  if (req.path == "/kvsnap/requantize" && req.method == "POST") requantize(req.body, out);
  else if (req.path == "/kvsnap/usage" && req.method == "GET") usage(out);
  else error(out, 404, "not_found_error", "no route " + req.method + " " + req.path +
                                              " (kvsnap's own: POST /kvsnap/requantize, GET /kvsnap/usage)");
  return true;
}

Result<Control::Ask> Control::parse_ask(const std::string& body) {
  std::string ctk, ctv;
  {
    std::lock_guard<std::mutex> l(args_mu_);
    ctk = args_.ctk;
    ctv = args_.ctv;
  }
  return parse_requantize_body(body, ctk, ctv);
}

Result<std::vector<PairSize>> Control::sizes(int64_t id, const std::string& ns) {
  {
    std::lock_guard<std::mutex> l(sizes_mu_);
    if (auto it = sizes_.find(id); it != sizes_.end()) return it->second;
  }
  Result<std::vector<PairSize>> r = [&]() -> Result<std::vector<PairSize>> {
    std::lock_guard<std::mutex> l(*d_.store_mu);
    KV_ASSIGN_OR_RETURN(Store* store, d_.stores->for_namespace(ns));
    return sizes_at_every_pair(*store, id);
  }();
  if (!r.ok()) return r.status();
  std::lock_guard<std::mutex> l(sizes_mu_);
  if (sizes_.size() >= 256) sizes_.clear();  // the slots' current snapshots are looked up again cheaply
  return sizes_[id] = *r;
}

void Control::requantize(const std::string& body, LocalAnswer& out) {
  auto ask = parse_ask(body);
  if (!ask.ok()) return error(out, 400, "invalid_request_error", "requantize: " + ask.status().message());
  run(*ask, out);
}

// A slot's entry in a requantize answer: what it holds and the estimate at (ctk, ctv).
ojson Control::slot_estimate(int slot, const SlotRecord& r, const std::string& ctk, const std::string& ctv) {
  auto s = sizes(r.snapshot, r.ns);
  std::optional<uint64_t> after = s.ok() ? size_at(*s, ctk, ctv) : std::nullopt;
  return {{"slot", slot}, {"snapshot", r.snapshot}, {"n_tokens", r.n_tokens}, {"bytes_before", r.bytes},
          {"bytes_after_estimate", after ? ojson(*after) : ojson(nullptr)}};
}

void Control::dry_run(const LlamaArgs& next, ojson& res) {
  res["dry_run"] = true;
  uint64_t before = 0, after = 0;
  ojson slots = ojson::array();
  for (const auto& [slot, r] : d_.book->all()) {
    slots.push_back(slot_estimate(slot, r, next.ctk, next.ctv));
    before += r.bytes;
    if (slots.back()["bytes_after_estimate"].is_number()) after += slots.back()["bytes_after_estimate"].get<uint64_t>();
  }
  res["slots"] = slots;
  res["bytes_before"] = before;
  res["bytes_after_estimate"] = after;
}

// Every slot of `book` restored into the child (at its types now); the answer's slots and totals.
void Control::restore_all(const std::map<int, SlotRecord>& book, const LlamaArgs& next, ojson& res) {
  ojson slots = ojson::array();
  uint64_t before = 0, after = 0, restored = 0;
  uint64_t total = 0;
  for (const auto& [slot, r] : book) total += r.bytes;
  progress_.restoring(book.size(), total, Clock::now());
  for (const auto& [slot, r] : book) {
    ojson s = slot_estimate(slot, r, next.ctk, next.ctv);
    const auto ts = Clock::now();
    auto rr = d_.prefix->restore_slot(slot, r.snapshot, r.ns);
    s["ms"] = ms_since(ts);
    before += r.bytes;
    progress_.slot_done(r.bytes, Clock::now());
    const std::string done = "; " + progress_.restore_line(Clock::now());
    if (rr.ok()) {
      ++restored;
      s["bytes_after"] = rr->restore.bytes_out;
      after += rr->restore.bytes_out;
      d_.log("requantize: slot " + std::to_string(slot) + " restored (" + std::to_string(r.n_tokens) + " tokens, " +
             std::to_string(r.bytes) + " -> " + std::to_string(rr->restore.bytes_out) + " bytes)" + done);
    } else {
      s["error"] = rr.status().ToString();
      d_.log("requantize: slot " + std::to_string(slot) + ": " + rr.status().ToString() +
             " (the conversation stays in the store: a returning request restores what fits)" + done);
    }
    slots.push_back(std::move(s));
  }
  res["slots"] = slots;
  res["slots_restored"] = restored;
  res["bytes_before"] = before;
  res["bytes_after"] = after;
}

void Control::run(const Ask& ask, LocalAnswer& out) {
  LlamaArgs old;
  {
    std::lock_guard<std::mutex> l(args_mu_);
    old = args_;
  }
  auto next = with_cache(old, ask.ctk, ask.ctv, ask.flash_attn, ask.ctx_size);
  if (!next.ok()) return error(out, 400, "invalid_request_error", "requantize: " + next.status().message());
  const std::string to = next->ctk + "/" + next->ctv + " fa " + next->flash_attn +
                         (next->ctx_size > 0 ? " -c " + std::to_string(next->ctx_size) : "");
  ojson res = {{"from", {{"ctk", old.ctk}, {"ctv", old.ctv}, {"flash_attn", old.flash_attn}, {"ctx_size", old.ctx_size}}},
               {"to", {{"ctk", next->ctk}, {"ctv", next->ctv}, {"flash_attn", next->flash_attn},
                       {"ctx_size", next->ctx_size}}}};
  if (ask.dry_run) {
    dry_run(*next, res);
    d_.log("requantize (dry run) to " + to + ": " + res["bytes_before"].dump() + " -> " +
           res["bytes_after_estimate"].dump() + " bytes");
    return answer(out, 200, res);
  }
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (!busy.owns_lock()) return error(out, 409, "conflict_error", "a requantize is already running");
  if (!d_.sup->healthy())
    return error(out, 503, "unavailable_error", "requantize: llama-server is restarting now; try again");
  const auto t0 = Clock::now();
  progress_.start(to, t0);
  struct Finished {
    RequantizeProgress& p;
    ~Finished() { p.finish(); }
  } finished{progress_};
  d_.log("requantize to " + to + ": draining (new requests wait)");
  const uint64_t in_flight = d_.drain->close();
  const double drain_ms = ms_since(t0);
  d_.log("requantize: drained (" + std::to_string(in_flight) + " in flight waited for); saving the slots");
  auto t = Clock::now();
  progress_.phase("saving", t);
  const uint64_t failed_before = d_.persist->stats().failed;
  d_.persist->save_all();
  const PersistStats ps = d_.persist->stats();
  const double save_ms = ms_since(t);
  if (ps.failed != failed_before) {
    d_.drain->open();
    ++requantize_failed_;
    d_.log("requantize: a save failed, nothing changed: " + ps.last_error);
    return error(out, 500, "server_error", "requantize: saving the slots failed, nothing changed: " + ps.last_error);
  }
  const auto book = d_.book->all();
  d_.log("requantize: saved in " + std::to_string(int(save_ms)) + " ms, " + std::to_string(book.size()) +
         " slots to restore; restarting llama-server with " + to);
  t = Clock::now();
  progress_.phase("restarting", t);
  Status restarted = d_.sup->replace(child_argv(*next, d_.child_port, d_.slot_dir));
  const double restart_ms = ms_since(t);
  const LlamaArgs& now = restarted.ok() ? *next : old;
  if (restarted.ok()) {
    std::lock_guard<std::mutex> l(args_mu_);
    args_ = *next;
  }
  d_.prefix->set_cache(now.ctk, now.ctv, now.flash_attn == "auto" ? "" : now.flash_attn);
  d_.log(restarted.ok() ? "requantize: llama-server restarted in " + std::to_string(int(restart_ms)) +
                              " ms; restoring the slots"
                        : "requantize: llama-server refused " + to + " (" + restarted.ToString() +
                              "): the previous arguments run again; restoring the slots");
  t = Clock::now();
  restore_all(book, *next, res);
  const double restore_ms = ms_since(t);
  d_.drain->open();
  res["ms"] = {{"drain", drain_ms}, {"save", save_ms}, {"restart", restart_ms}, {"restore", restore_ms},
               {"total", ms_since(t0)}};
  d_.log("requantize: done in " + std::to_string(int(ms_since(t0))) + " ms, " + res["slots_restored"].dump() + " of " +
         std::to_string(book.size()) + " slots restored, " + res["bytes_before"].dump() + " -> " +
         res["bytes_after"].dump() + " bytes");
  if (!restarted.ok()) {
    ++requantize_failed_;
    res["error"] = {{"code", 500}, {"type", "server_error"},
                    {"message", "kvsnap serve: requantize: llama-server did not start with " + to + ": " +
                                    restarted.ToString() + "; it runs again with the previous arguments"}};
    return answer(out, 500, res);
  }
  ++requantized_;
  answer(out, 200, res);
}

void Control::usage(LocalAnswer& out) {
  LlamaArgs a;
  {
    std::lock_guard<std::mutex> l(args_mu_);
    a = args_;
  }
  const auto book = d_.book->all();
  ojson slots = ojson::array();
  auto live = LlamaServer({d_.child_url, a.api_key, 10}).slots();
  std::vector<int> ids;
  if (live.ok())
    for (const auto& s : *live) ids.push_back(s.id);
  for (const auto& [slot, r] : book)
    if (std::find(ids.begin(), ids.end(), slot) == ids.end()) ids.push_back(slot);
  for (int id : ids) {
    ojson s = {{"id", id}};
    if (live.ok())
      for (const auto& l : *live)
        if (l.id == id) s["n_ctx"] = l.n_ctx, s["is_processing"] = l.is_processing;
    auto it = book.find(id);
    if (it == book.end()) {
      s["n_tokens"] = nullptr;  // nothing kvsnap saved or restored there since the child started
      slots.push_back(std::move(s));
      continue;
    }
    const SlotRecord& r = it->second;
    s.update({{"snapshot", r.snapshot}, {"namespace", r.ns}, {"n_tokens", r.n_tokens}, {"bytes", r.bytes},
              {"ctk", r.ctk}, {"ctv", r.ctv}, {"v_rows", r.v_rows}, {"from", r.how}});
    auto sz = sizes(r.snapshot, r.ns);
    if (sz.ok()) s["sizes"] = sizes_json(*sz);
    else s["sizes_error"] = sz.status().ToString();
    slots.push_back(std::move(s));
  }
  const PersistStats ps = d_.persist->stats();
  const PrefixStats pr = d_.prefix->stats();
  ojson j = {{"child", {{"pid", d_.sup->pid()}, {"ctk", a.ctk}, {"ctv", a.ctv}, {"flash_attn", a.flash_attn},
                        {"ctx_size", a.ctx_size}, {"restarts", d_.sup->restarts()}}},
             {"dynamic_cache", nullptr},
             {"slots", slots},
             {"counters",
              {{"saves", {{"ok", ps.saved}, {"failed", ps.failed}}},
               {"restores", {{"ok", pr.restores}, {"failed", pr.failed}, {"tokens", pr.restored_tokens}}},
               {"reuse", {{"reused", pr.reused}, {"not_reused", pr.not_reused}, {"unverified", pr.unverified},
                          {"last_prompt_n", pr.last_prompt_n}}},
               {"requantizes", {{"ok", requantized_.load()}, {"failed", requantize_failed_.load()}}}}}};
  j["requantize"] = progress_.json(Clock::now());
  if (!live.ok()) j["child"]["slots_error"] = live.status().ToString();
  if (ladder_) {
    ojson rungs = ojson::array();
    for (const Rung& r : ladder_->rungs)
      rungs.push_back({{"ctk", r.ctk}, {"ctv", r.ctv}, {"ctx_size", r.ctx_size}, {"bytes_per_token", r.bytes_per_token}});
    j["dynamic_cache"] = {{"budget", ladder_->budget}, {"rung", rung_.load()}, {"rungs", rungs}};
  }
  answer(out, 200, j);
}

}  // namespace kvsnap
