#include "serve/persist.h"

#include <algorithm>
#include <chrono>

#include "base/chunk_cipher.h"
#include "base/sha256.h"
#include "base/text.h"
#include "serve/adapters.h"
#include "serve/requests.h"

namespace kvsnap {

namespace {

constexpr size_t kRecent = 64;
// How long before an exchange came to the slot gate an unguarded event still counts against it: a
// completion forwarded a moment earlier may reach the child after the exchange's admission, and a
// given-up stream's later prompts start within llama-server's poll of the connection (1 s).
constexpr std::chrono::seconds kUnguardedMargin(10);
constexpr const char* kUnattributed = "unattributed";

}  // namespace

std::string owner_namespace(const Exchange& x) {
  return x.request_unreadable ? kUnattributed : namespace_of(x);
}

std::string namespace_of(const Exchange& x) {
  const std::string key = request_api_key(x.request_headers);
  std::string key_ns;
  if (!key.empty()) {
    const auto d = sha256_of(std::span<const std::byte>(reinterpret_cast<const std::byte*>(key.data()), key.size()));
    key_ns = "key-" + to_hex(d).substr(0, 16);
  }
  // A session name is the client's choice: under a key it is that key's session, so that a holder
  // of another key who names it gets a namespace of their own, not the conversations kept for it.
  if (std::string s = header_value(x.request_headers, "X-Kvsnap-Session"); !s.empty())
    return key_ns.empty() ? "session-" + s : key_ns + "-session-" + s;
  return key_ns.empty() ? "default" : key_ns;
}

namespace {

// llama-server 3.22.1's routes that run a completion in a slot, and whether the body is form data
// (transcriptions: an audio file, no JSON and no id_slot) rather than JSON.
struct CompletionRoute {
  const char* path;
  bool form_data;
};
constexpr CompletionRoute kCompletionRoutes[] = {
    {"/completion", false},       {"/completions", false},          {"/v1/completions", false},
    {"/chat/completions", false}, {"/v1/chat/completions", false},  {"/infill", false},
    {"/v1/messages", false},      {"/responses", false},            {"/v1/responses", false},
    {"/v1/audio/transcriptions", true}, {"/audio/transcriptions", true},
};

const CompletionRoute* completion_route(const std::string& path) {
  for (const CompletionRoute& r : kCompletionRoutes)
    if (path == r.path) return &r;
  return nullptr;
}

}  // namespace

bool is_completion_route(const std::string& path) { return completion_route(path) != nullptr; }

bool is_form_data_route(const std::string& path) {
  const CompletionRoute* r = completion_route(path);
  return r && r->form_data;
}

int slot_of_answer(const Exchange& x) { return slot_of_answer_body(x.streamed, x.response_body); }

namespace {

size_t shared_start(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return size_t(std::mismatch(a.begin(), a.begin() + std::min(a.size(), b.size()), b.begin()).first - a.begin());
}

}  // namespace

std::string owner_of_tokens(const std::deque<PromptOwner>& recent, const std::vector<int32_t>& slot_tokens,
                            const std::string& preferred) {
  const PromptOwner* best = nullptr;
  bool tied = false;  // another namespace's prompt as long as the best
  for (const auto& o : recent) {
    if (o.tokens.empty() || o.tokens.size() > slot_tokens.size() || shared_start(o.tokens, slot_tokens) < o.tokens.size())
      continue;
    if (best && o.tokens.size() == best->tokens.size()) {
      if (o.ns != best->ns) tied = true;
      if (o.ns == preferred) best = &o;
    } else if (!best || o.tokens.size() > best->tokens.size()) {
      best = &o;
      tied = false;
    }
  }
  if (!best || (tied && best->ns != preferred)) return "";
  for (const auto& o : recent)
    if (o.may_be_partial && o.ns != best->ns && shared_start(o.tokens, slot_tokens) > best->tokens.size()) return "";
  return best->ns;
}

std::string slot_owner(const std::deque<PromptOwner>& recent, const std::vector<int32_t>& slot_tokens,
                       bool untokenized_job, const std::string& fallback, const std::string& preferred) {
  std::string owner = untokenized_job ? "" : owner_of_tokens(recent, slot_tokens, preferred);
  return owner.empty() ? fallback : owner;
}

std::string untokenized_exchange_owner(const std::string& ns, int own_slot, int64_t own_after, bool every_task_gated,
                                       bool unguarded) {
  const bool certain = every_task_gated && !unguarded && (own_slot >= 0 || own_after >= 0);
  return certain && !ns.empty() ? ns : kUnattributed;
}

void Persister::note_unguarded() {
  std::lock_guard<std::mutex> l(mu_);
  last_unguarded_ = std::chrono::steady_clock::now();
}

Persister::Persister(Io& io, TenantStores& stores, std::mutex& store_mu, ServerTarget target,
                     std::function<void(const std::string&)> log)
    : io_(io), stores_(stores), store_mu_(store_mu), target_(std::move(target)), log_(std::move(log)) {
  thread_ = std::thread([this] { worker(); });
}

Persister::~Persister() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Completions are POSTs: an OPTIONS (a CORS preflight, 200 with no key) or a GET on a completion
// route generated nothing, and queued as an untokenized exchange its save would file other
// clients' unsaved slots under "unattributed".
void Persister::note_completion(const Exchange& x) {
  if (x.status != 200 || x.method != "POST" || !is_completion_route(x.path)) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    remember_prompt(x, false);
    // "n" > 1: the copies ran in slots the answer may not name (a stream names the last one): every
    // changed slot is saved, those of tasks newer than its admission (it ran alone: serve's slot
    // gate) as its own. An OpenAI-style answer names no slot: the one serve pinned it to.
    // Other slots still changed (a stream given up) are saved too, as any pass saves them.
    const int slot = x.several_slots ? -1 : slot_of_answer(x);
    Job j{slot, x.prompt_tokens.empty(), "", slot, x.own_after_task, x.arrived, x.prompt_tokens};
    if (slot < 0 && !x.several_slots && x.pinned_slot >= 0) j.own_slot = x.pinned_slot;
    if (j.own_slot >= 0 || j.own_after >= 0 || x.several_slots) j.ns = owner_namespace(x);
    jobs_.push_back(std::move(j));
    ++queued_;
  }
  cv_.notify_all();
}

void Persister::note_prompt(const Exchange& x) {
  if (x.method != "POST" || !is_completion_route(x.path)) return;
  std::lock_guard<std::mutex> l(mu_);
  remember_prompt(x, true);
  last_unguarded_ = std::chrono::steady_clock::now();  // its later prompts may still start (note_unguarded)
}

void Persister::remember_prompt(const Exchange& x, bool may_be_partial) {
  if (x.prompt_tokens.empty()) return;
  recent_.push_back({owner_namespace(x), x.prompt_tokens, may_be_partial});
  if (recent_.size() > kRecent) recent_.pop_front();
}

void Persister::worker() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, everything saved
    Job j = jobs_.front();
    jobs_.pop_front();
    busy_ = true;
    // read under mu_: request threads write it (note_unguarded, note_prompt)
    const bool unguarded = last_unguarded_ && *last_unguarded_ >= j.arrived - kUnguardedMargin;
    l.unlock();
    const std::string fallback =
        j.unverifiable ? untokenized_exchange_owner(j.ns, j.own_slot, j.own_after, every_task_gated_, unguarded) : "";
    save_changed(j.slot, fallback, j.unverifiable, j.ns, j.own_slot, j.own_after, j.prompt);
    l.lock();
    busy_ = false;
    ++finished_;
    cv_.notify_all();
  }
}

void Persister::save_changed(int only_slot, const std::string& fallback, bool untokenized_job,
                             const std::string& job_ns, int own_slot, int64_t own_after,
                             const std::vector<int32_t>& job_prompt) {
  // The child's life these tasks are of: one that restarts while the saves below run (forget_slots)
  // numbers its tasks anew, and a task id recorded now could match a new conversation's later.
  uint64_t generation = 0;
  std::string cache_tag;
  std::vector<float> loaded;
  {
    std::lock_guard<std::mutex> l(mu_);
    generation = generation_;
    cache_tag = cache_tag_;
    loaded = loaded_scales_;
  }
  LlamaServer srv(target_.endpoint);
  auto slots = srv.slots();
  if (!slots.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.failed;
    stats_.last_error = slots.status().ToString();
    log_("persist: cannot list the slots: " + stats_.last_error);
    return;
  }
  struct Changed {
    int slot;
    int64_t task;
  };
  std::vector<Changed> changed;
  for (const auto& s : *slots) {
    const int64_t task = s.raw.value("id_task", int64_t(-1));
    const int64_t n_prompt = s.raw.value("n_prompt_tokens", int64_t(1));  // absent: assume filled
    if (s.is_processing || n_prompt <= 0 || task < 0) continue;
    if (only_slot >= 0 && s.id != only_slot) continue;
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = saved_task_.find(s.id); it != saved_task_.end() && it->second == task) continue;
    // Made under LoRA scales of a request's own (its last task's, as the child reports them): kept
    // nowhere, since serve restores no such conversation (serve/adapters.h).
    if (slot_scales(s.raw, loaded) != loaded) {
      if (generation == generation_) saved_task_[s.id] = task;  // done with
      if (book_) book_->forget(s.id);
      log_("persist: slot " + std::to_string(s.id) + " ran a request with LoRA scales of its own: not kept");
      continue;
    }
    changed.push_back({s.id, task});
  }
  for (const Changed& c : changed) {
    // Named variables, not a structured binding: clang before 16 cannot capture one in a lambda.
    const int slot = c.slot;
    const int64_t task = c.task;
    ServerTarget t = target_;
    t.slot = slot;
    SaveRequest req;
    req.tags = {{"serve.slot", std::to_string(slot)}, {"serve.task", std::to_string(task)}};
    if (!cache_tag.empty()) req.tags["serve.cache"] = cache_tag;
    std::string slot_ns;
    bool unowned = false, no_tenant = false, restarted = false;
    // Tagged by what the slot holds: the request whose prompt its tokens start with.
    auto attribute = [&](const std::vector<int32_t>& tokens, SaveRequest& r) -> Status {
      // With adapters loaded: another task (of a request's own scales) may have run in the slot since
      // it was listed (a save for every slot, queued by an exchange without a permit, lists them
      // before a gated request starts there); the file is then that task's. Left to the next pass.
      if (!loaded.empty()) {
        auto now = srv.slots();
        bool same = false;
        if (now.ok())
          for (const auto& s : *now)
            if (s.id == slot)
              same = s.raw.value("id_task", int64_t(-1)) == task && slot_scales(s.raw, loaded) == loaded;
        if ((restarted = !same))  // not kept, not a failure: the next pass judges the slot again
          return Status::Interrupted("slot " + std::to_string(slot) + " ran another task while it was saved: not "
                                     "kept now");
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        // The child ended since the slots were listed: the file may be its successor's, made under
        // settings (a config.ini edited meanwhile) the tags above are not of.
        if ((restarted = generation != generation_))
          return Status::Interrupted("the child restarted while slot " + std::to_string(slot) +
                                     " was saved: not kept (the new child's slot may hold another conversation)");
        const bool own = own_slot >= 0 ? slot == own_slot : task > own_after;
        slot_ns = slot_owner(recent_, tokens, own && untokenized_job, own ? fallback : "", own ? job_ns : "");
        // The save of the slot's own request: no later save would tag it. Contents that begin with its
        // prompt whose namespace cannot be told (a tie, another's given-up prompt that may be a part of
        // them) are kept for no tenant rather than lost.
        if (slot_ns.empty() && own_slot >= 0 && slot == own_slot && !job_prompt.empty() &&
            tokens.size() >= job_prompt.size() &&
            std::equal(job_prompt.begin(), job_prompt.end(), tokens.begin())) {
          slot_ns = kUnattributed;
          log_("persist: slot " + std::to_string(slot) + " holds its request's conversation, but another namespace's "
               "prompt fits it as well: kept as unattributed (restored for no one)");
        }
      }
      if ((unowned = slot_ns.empty()))
        return Status::NotFound("slot " + std::to_string(slot) + " holds a conversation that begins with no recent "
                                "request's prompt: not saved now, its own request's save will tag it");
      // A session name that is not UTF-8 text cannot be a tag (nor a tenant): not kept, and no
      // failure of persistence either (it would be retried, and fail, on every pass).
      if (!is_valid_utf8(slot_ns)) {
        no_tenant = true;
        return Status::InvalidArgument("slot " + std::to_string(slot) + " holds a conversation whose session name " +
                                       "is not UTF-8 text: not saved");
      }
      // A client's X-Kvsnap-Session that is no tenant name: its conversations are not kept (docs/serve.md),
      // and that is no failure of persistence (a failed save stops a requantize).
      if (stores_.per_namespace()) {
        if (Status s = check_tenant_name(slot_ns); !s.ok()) {
          no_tenant = true;
          return Status::InvalidArgument("slot " + std::to_string(slot) + " holds namespace '" +
                                         shown_text(slot_ns.substr(0, 140)) + "', which cannot be a tenant (" + s.message() +
                                         "): not saved");
        }
      }
      r.tags["serve.ns"] = slot_ns;
      return Status::OK();
    };
    auto save = [&] {
      std::lock_guard<std::mutex> s(store_mu_);
      auto pick = [this](const SaveRequest& r) { return stores_.for_namespace(r.tags.at("serve.ns")); };
      return save_from_server(io_, pick, t, req, attribute);
    };
    auto r = save();
    std::lock_guard<std::mutex> l(mu_);
    if (!r.ok() && restarted) {
      log_("persist: " + r.status().message());
      continue;
    }
    if (!r.ok() && unowned) {
      log_("persist: " + r.status().message());
      if (book_) book_->forget(slot);  // it holds another conversation than its last snapshot now
      continue;
    }
    if (!r.ok() && no_tenant) {
      log_("persist: " + r.status().message());
      if (generation == generation_) saved_task_[slot] = task;  // done with: not retried by every later pass
      if (book_) book_->forget(slot);  // its last snapshot is no longer what it holds
      continue;
    }
    if (!r.ok()) {
      ++stats_.failed;
      stats_.last_error = r.status().ToString();
      log_("persist: saving slot " + std::to_string(slot) + " failed (serving continues): " + stats_.last_error);
      continue;
    }
    if (generation == generation_) saved_task_[slot] = task;
    ++stats_.saved;
    const SnapshotInfo& info = r->save.info;
    if (book_ && generation == generation_)  // not the new child's slot
      book_->put(slot, {info.id, slot_ns, uint64_t(info.n_tokens), info.raw_bytes, info.k_types, info.v_types,
                        !info.v_trans, "saved"});
    log_("persist: slot " + std::to_string(slot) + " (" + shown_text(slot_ns) + ") saved as snapshot " +
         std::to_string(r->save.info.id) + ": " + std::to_string(r->n_saved) + " tokens, " +
         std::to_string(r->save.chunks_new) + "/" + std::to_string(r->save.chunks) + " chunks new" +
         (r->save.evicted.empty() ? "" : ", " + std::to_string(r->save.evicted.size()) + " evicted for the caps"));
    for (const std::string& w : r->save.cap_warnings) {
      const std::string scope = w.substr(0, w.find(" holds "));
      const auto now = std::chrono::steady_clock::now();
      auto it = cap_logged_.find(scope);
      if (it != cap_logged_.end() && now - it->second < std::chrono::minutes(10)) continue;
      cap_logged_[scope] = now;
      log_("persist: cap not met: " + w + " (said at most every 10 minutes)");
    }
    for (const std::string& w : r->save.gc_warnings) log_("persist: gc after eviction: " + w);
  }
  if (on_saved_ && !changed.empty()) on_saved_();
}

void Persister::set_cache_tag(const std::string& tag) {
  std::lock_guard<std::mutex> l(mu_);
  cache_tag_ = tag;
}

void Persister::set_loaded_scales(const std::vector<float>& scales) {
  std::lock_guard<std::mutex> l(mu_);
  loaded_scales_ = scales;
}

bool Persister::wait_saved(double max_wait_s) {
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t mark = queued_;  // later saves are not this caller's to wait for
  return cv_.wait_for(l, std::chrono::duration<double>(max_wait_s), [&] { return finished_ >= mark || stop_; });
}

int64_t Persister::newest_task() {
  auto slots = LlamaServer(target_.endpoint).slots();
  int64_t newest = -1;
  if (slots.ok())
    for (const auto& s : *slots) newest = std::max(newest, s.raw.value("id_task", int64_t(-1)));
  return newest;
}

void Persister::save_all() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [this] { return jobs_.empty() && !busy_; });
  l.unlock();
  save_changed(-1, kUnattributed);  // the last chance: whatever no prompt matches is kept, for no tenant
}

void Persister::note_restored(int slot, int64_t task) {
  if (task < 0) return;
  std::lock_guard<std::mutex> l(mu_);
  saved_task_[slot] = task;
}

bool Persister::holds_unsaved(int slot, int64_t task) {
  if (task < 0) return false;
  std::lock_guard<std::mutex> l(mu_);
  auto it = saved_task_.find(slot);
  return it == saved_task_.end() || it->second != task;
}

void Persister::forget_slots() {
  std::lock_guard<std::mutex> l(mu_);
  saved_task_.clear();
  ++generation_;
  last_unguarded_ = std::chrono::steady_clock::now();  // task ids start again (note_unguarded)
}

PersistStats Persister::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace kvsnap
