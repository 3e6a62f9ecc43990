#include "base/json_access.h"
#include "serve/prefix.h"

#include <algorithm>
#include <set>

#include "migrate/model_info.h"
#include "serve/persist.h"
#include "serve/requests.h"

namespace kvsnap {

namespace {

using ojson = nlohmann::ordered_json;

// restored_task_'s value for a restore after which the slots could not be listed.
constexpr int64_t kTaskUnknown = INT64_MIN;

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Longest first: the namespace's own is almost always among the first few; this bounds the
// token-by-token checks when many conversations share a system prompt.
constexpr size_t kMaxCandidates = 256;

// The memory kinds whose restored state llama-server may not reuse, for the log.
std::string memory_kind(const ModelProfile& p) {
  const std::string window = p.n_swa > 0 ? " (sliding window " + std::to_string(p.n_swa) + ")" : "";
  if (p.is_hybrid()) return std::string(p.is_iswa() ? "hybrid SWA" : "hybrid") + " model (attention + recurrent)";
  if (p.is_recurrent_only()) return "recurrent model";
  if (p.is_iswa() || (p.swa != SwaKind::kNone && p.n_swa > 0)) return "SWA model" + window;
  return "";
}

}  // namespace

PrefixRestorer::PrefixRestorer(Io& io, TenantStores& stores, std::mutex& store_mu, ServerTarget target,
                               std::function<void(const std::string&)> log)
    : io_(io), stores_(stores), store_mu_(store_mu), target_(std::move(target)), log_(std::move(log)) {
  // Only snapshots of the child's model are candidates (a restore would refuse the others anyway).
  if (!target_.model.empty()) {
    auto m = load_model_info(io_, target_.model);
    if (m.ok()) {
      model_fingerprint_ = m->profile.fingerprint;
      memory_kind_ = memory_kind(m->profile);
      if (!memory_kind_.empty())
        log_("prefix: " + memory_kind_ + ": llama-server may evaluate a restored prompt anew " +
             "(it wants context checkpoints that slot files do not hold, llama.cpp #28194); each reuse is measured");
    } else log_("prefix: cannot read the model " + target_.model + " (any model's snapshot is a candidate): " +
              m.status().ToString());
  }
}

Result<std::vector<int32_t>> PrefixRestorer::prompt_tokens(const CompletionRequest& req) {
  LlamaServer srv(target_.endpoint);
  std::string text;
  switch (req.prompt) {
    case CompletionRequest::Prompt::kNone: return std::vector<int32_t>{};
    case CompletionRequest::Prompt::kTokens: return req.tokens;
    case CompletionRequest::Prompt::kText: text = req.text; break;
    case CompletionRequest::Prompt::kChat: {
      KV_ASSIGN_OR_RETURN(auto r,
                          srv.request("POST", "/apply-template", req.template_body, "applying the chat template"));
      if (r.status != 200) return Status::IOError("/apply-template answered " + std::to_string(r.status));
      KV_ASSIGN_OR_RETURN(text, parse_apply_template_reply(r.body));
      break;
    }
  }
  // As llama-server tokenizes a prompt: with BOS and special tokens parsed.
  ojson tok = {{"content", text}, {"add_special", true}, {"parse_special", true}};
  KV_ASSIGN_OR_RETURN(auto r, srv.request("POST", "/tokenize", json_text(tok), "tokenizing the prompt"));
  if (r.status != 200) return Status::IOError("/tokenize answered " + std::to_string(r.status));
  return parse_tokenize_reply(r.body, "/tokenize");
}

void PrefixRestorer::pin(Forward& f, int slot) {
  if (!write_id_slot(f, slot)) return;  // not reached: the body was parsed as an object before
  f.pinned_slot = slot;
  {
    std::lock_guard<std::mutex> l(pinned_mu_);
    ++pinned_[slot];
  }
  // Held with whatever the exchange already holds (the slot gate's permit): the slot is free again
  // when the exchange is over, however it ends.
  f.hold = std::shared_ptr<void>(new std::shared_ptr<void>(std::move(f.hold)), [this, slot](void* p) {
    {
      std::lock_guard<std::mutex> l(pinned_mu_);
      if (--pinned_[slot] == 0) pinned_.erase(slot);
    }
    delete static_cast<std::shared_ptr<void>*>(p);  // then the permit: the next completion sees the slot free
  });
}

std::map<int, size_t> PrefixRestorer::slot_holds(Forward& f, const CompletionRequest& req) {
  std::map<int, size_t> holds;
  if (req.prompt == CompletionRequest::Prompt::kNone) return holds;
  std::lock_guard<std::mutex> l(mu_);
  Result<std::vector<int32_t>> toks = Status::InvalidArgument("not tokenized");
  try {  // as before(): a backstop, no nlohmann exception leaves this module
    toks = prompt_tokens(req);
  } catch (const nlohmann::json::exception&) {
  }
  if (!toks.ok()) return holds;
  f.prompt_tokens = std::move(*toks);
  f.tokenized = true;
  for (const auto& [slot, held] : held_) holds[slot] = common_prefix(held, f.prompt_tokens);
  return holds;
}

bool PrefixRestorer::taken(int slot) {
  std::lock_guard<std::mutex> l(pinned_mu_);
  return pinned_.count(slot) > 0;
}

void PrefixRestorer::before_unguarded(Forward& f) {
  if (f.method != "POST" || !is_completion_route(f.path) || is_form_data_route(f.path)) return;
  const Result<CompletionRequest>& req = completion_request(f);
  if (!req.ok()) {
    log_("prefix: the request's JSON is not what a completion takes (forwarded as is): " + req.status().message());
    return;
  }
  if (req->prompt == CompletionRequest::Prompt::kNone) return;
  if (f.own_scales) {
    log_("prefix: the request runs with LoRA scales of its own: nothing is restored for it (the child clears a "
         "slot for a request whose scales differ from the slot's last task's, and a restore leaves those as they were)");
    return;
  }
  Exchange who;
  who.request_headers = f.headers;
  const std::string ns = namespace_of(who);
  std::lock_guard<std::mutex> l(mu_);
  auto toks = f.tokenized ? Result<std::vector<int32_t>>(f.prompt_tokens) : prompt_tokens(*req);
  if (!toks.ok()) {
    ++stats_.failed;
    log_("prefix: cannot tokenize the request (forwarded as is): " + toks.status().ToString());
    return;
  }
  if (toks->empty()) return;
  f.prompt_tokens = *toks;
  const int asked = req->id_slot;
  // The longest stored prefix of this namespace.
  std::optional<SnapshotInfo> best;
  {
    std::lock_guard<std::mutex> s(store_mu_);
    auto store = stores_.for_namespace(ns);
    auto found = store.ok() ? (*store)->catalog().find_prefix(*toks, model_fingerprint_, kMaxCandidates)
                            : Result<std::vector<SnapshotInfo>>(store.status());
    if (!found.ok()) {
      ++stats_.failed;
      log_("prefix: the store's lookup failed (forwarded as is): " + found.status().ToString());
      return;
    }
    for (auto& info : *found) {
      if (restorable(info, ns)) {
        best = info;
        break;
      }
    }
  }
  if (!best) return pin_fresh(f, *toks, ns, asked);  // no stored prefix; a requantize's slot may still serve
  // What the slots hold, as far as kvsnap knows; the slot to use: the one asked for, else the idle
  // slot whose contents are worth least to this request.
  LlamaServer srv(target_.endpoint);
  auto slots = srv.slots();
  if (!slots.ok()) return;
  // The slot the request is pinned to as llama-server picks it (and the gate reserved): -3 is one too.
  const int pinned = pinned_slot_of(asked, slots->size());
  // An unpinned request goes to the idle slot worth least to it, and first to one whose conversation
  // is saved: one just finished whose save is not queued yet would be lost to the restore.
  std::vector<SlotChoice> choices;
  size_t best_has = 0;
  for (const auto& s : *slots) {
    const int64_t task = s.raw.value("id_task", int64_t(-1));
    forget_if_replaced(s.id, task);
    SlotChoice c;
    c.id = s.id;
    c.idle = !s.is_processing && !taken(s.id);
    c.unsaved = holds_unsaved_ && holds_unsaved_(s.id, task);
    c.has = common_prefix(held_[s.id], *toks);
    best_has = std::max(best_has, c.has);
    choices.push_back(c);
  }
  const int slot = choose_restore_slot(choices, pinned);
  if (slot < 0) return;
  size_t slot_has = 0;
  for (const SlotChoice& c : choices)
    if (c.id == slot) slot_has = c.has;
  if (uint64_t(best->n_tokens) <= (pinned >= 0 ? slot_has : best_has)) return pin_fresh(f, *toks, ns, asked);
  auto r = restore_into(slot, *best, *toks, ns);
  if (!r.ok()) {
    log_("prefix: " + r.status().ToString() + " (forwarded as is)");
    return;
  }
  fresh_.erase(slot);
  pin(f, slot);
  f.restored_tokens = best->n_tokens;
  log_("prefix: restored snapshot " + std::to_string(best->id) + " (" + std::to_string(best->n_tokens) + " of " +
       std::to_string(toks->size()) + " prompt tokens, " + ns + ", " + best->k_types + "/" + best->v_types + " -> " +
       r->ctk + "/" + r->ctv + " fa " + r->flash_attn + ") into slot " + std::to_string(slot) + " in " +
       std::to_string(int(r->seconds * 1000)) + " ms");
}

Result<ServerRestoreResult> PrefixRestorer::restore_into(int slot, const SnapshotInfo& info,
                                                         const std::vector<int32_t>& tokens, const std::string& ns) {
  ServerTarget t = target_;
  t.slot = slot;
  // -fa auto (flash_attn empty): restore_to_server detects the child's V layout from a file the child
  // saves of this slot (an empty slot is given one token first; the restore overwrites it).
  auto restore = [&]() -> Result<ServerRestoreResult> {
    std::lock_guard<std::mutex> s(store_mu_);
    KV_ASSIGN_OR_RETURN(Store* store, stores_.for_namespace(ns));
    // By uuid: an id a removal frees may be another snapshot's by now (SQLite reuses the highest),
    // and a missing all-digit id falls back to a uuid prefix; a uuid is never reused, and no name
    // reads as one (check_snapshot_labels).
    return restore_to_server(io_, *store, t, info.uuid.empty() ? std::to_string(info.id) : info.uuid, false);
  };
  Result<ServerRestoreResult> r = restore();
  if (!r.ok()) {
    ++stats_.failed;
    held_.erase(slot);  // unknown now
    return r.status().Prefixed("restoring snapshot " + std::to_string(info.id) + " into slot " + std::to_string(slot) +
                               " failed");
  }
  if (target_.flash_attn.empty()) {
    target_.flash_attn = r->flash_attn;  // what -fa auto chose: the same for every later restore
    log_("prefix: the child's -fa auto is " + r->flash_attn + " (detected from a slot file it saved)");
  }
  held_[slot].assign(tokens.begin(), tokens.begin() + std::min<size_t>(tokens.size(), size_t(info.n_tokens)));
  // Unlisted, the restore still counts as one since the slot's last task (restored_since).
  restored_task_[slot] = kTaskUnknown;
  if (auto now = LlamaServer(target_.endpoint).slots(); now.ok())
    for (const auto& s : *now)
      if (s.id == slot) restored_task_[slot] = s.raw.value("id_task", int64_t(-1));
  ++stats_.restores;
  stats_.restored_tokens += info.n_tokens;
  if (on_restored_) {
    auto task = restored_task_.find(slot);
    on_restored_(slot, task == restored_task_.end() ? -1 : task->second);
  }
  if (book_)
    book_->put(slot, {info.id, ns, uint64_t(info.n_tokens), r->restore.bytes_out, r->ctk, r->ctv,
                      r->flash_attn == "on", "restored"});
  return r;
}

int choose_restore_slot(const std::vector<SlotChoice>& slots, int pinned) {
  const SlotChoice* best = nullptr;
  for (const SlotChoice& c : slots) {
    if (pinned >= 0) {
      if (c.id == pinned) return c.id;
      continue;
    }
    if (!c.idle) continue;
    if (!best || (c.unsaved != best->unsaved ? !c.unsaved : c.has < best->has)) best = &c;
  }
  return best ? best->id : -1;
}

bool PrefixRestorer::forget_if_replaced(int slot, int64_t task) {
  auto it = restored_task_.find(slot);
  if (it == restored_task_.end() || it->second == task || it->second == kTaskUnknown) return false;
  restored_task_.erase(it);
  held_.erase(slot);
  fresh_.erase(slot);
  return true;
}

void PrefixRestorer::pin_fresh(Forward& f, const std::vector<int32_t>& toks, const std::string& ns,
                               int asked) {
  if (fresh_.empty()) return;
  // A slot restored for `ns` that another request has used since (its task changed), or that one is
  // running in now, holds no longer (or not yet again) what was restored.
  LlamaServer srv(target_.endpoint);
  auto slots = srv.slots();
  if (!slots.ok()) return;
  std::set<int> busy;
  for (const auto& s : *slots) {
    forget_if_replaced(s.id, s.raw.value("id_task", int64_t(-1)));
    if (s.is_processing) busy.insert(s.id);
  }
  // A chat's next turn renders the last answer anew (its tokens may differ from the ones generated):
  // the slot is worth it when most of what was restored is a prefix of the request.
  int slot = -1;
  size_t has = 0;
  for (const auto& [s, owner] : fresh_) {
    if (busy.count(s)) continue;
    const auto& held = held_[s];
    const size_t c = common_prefix(held, toks);
    // Any id_slot but -1 pins the request (pinned_slot_of; a value that only wraps to a slot is never
    // one of these ids, so such a request is left where the gate reserved it).
    if (owner != ns || (asked != -1 && s != asked) || held.empty() || 2 * c < held.size() || taken(s)) continue;
    if (c > has) slot = s, has = c;
  }
  if (slot < 0) return;
  fresh_.erase(slot);
  pin(f, slot);
  f.restored_tokens = has;
  log_("prefix: slot " + std::to_string(slot) + " holds " + std::to_string(has) + " of the " +
       std::to_string(toks.size()) + " prompt tokens (" + ns + ", restored by a requantize): the request goes there");
}

bool PrefixRestorer::restorable(const SnapshotInfo& info, const std::string& ns) const {
  auto tag = [&info](const char* name) {
    auto t = info.tags.find(name);
    return t == info.tags.end() ? std::optional<std::string>() : t->second;
  };
  // No serve.cache tag: saved by a child without cache-changing settings (or before serve tagged them).
  return tag("serve.ns") == ns && tag("serve.cache").value_or("") == cache_tag_;
}

Result<ServerRestoreResult> PrefixRestorer::restore_slot(int slot, int64_t id, const std::string& ns) {
  std::lock_guard<std::mutex> l(mu_);
  SnapshotRecord rec;
  {
    std::lock_guard<std::mutex> s(store_mu_);
    KV_ASSIGN_OR_RETURN(Store* store, stores_.for_namespace(ns));
    KV_ASSIGN_OR_RETURN(rec, store->catalog().get(id));
  }
  // The book's id, checked against what it names now: removed and reused, it is another snapshot.
  if (!restorable(rec.info, ns))
    return Status::NotFound("snapshot " + std::to_string(id) + " is no longer " + ns +
                            "'s (removed meanwhile), or was saved under other cache settings than the child's now");
  auto r = restore_into(slot, rec.info, rec.tokens, ns);
  if (r.ok()) fresh_[slot] = ns;
  return r;
}

void PrefixRestorer::set_cache_tag(const std::string& tag) {
  std::lock_guard<std::mutex> l(mu_);
  cache_tag_ = tag;
}

void PrefixRestorer::set_cache(const std::string& ctk, const std::string& ctv, const std::string& flash_attn) {
  std::lock_guard<std::mutex> l(mu_);
  target_.ctk = ctk;
  target_.ctv = ctv;
  target_.flash_attn = flash_attn;
}

void PrefixRestorer::after_unguarded(const Exchange& x) {
  if (x.status != 200) return;
  int slot = slot_of_answer(x);
  if (slot < 0) slot = x.pinned_slot;
  std::lock_guard<std::mutex> l(mu_);
  // A request with its own adapter scales: its slot holds no prefix a request of the loaded ones
  // may count on (the child clears it for the next: serve/adapters.h); slot unknown, none is.
  if (x.own_scales) {
    if (slot < 0) held_.clear();
    held_.erase(slot);
    fresh_.erase(slot);
    restored_task_.erase(slot);
    return;
  }
  // What the slots used hold is no longer what kvsnap put there: with "n" > 1 any free slot may have
  // taken a copy; a prompt kvsnap did not tokenize (several prompts, multimodal) is unknown.
  if (x.several_slots) held_.clear();
  if (x.prompt_tokens.empty()) {
    if (slot >= 0) held_.erase(slot);
    return;
  }
  if (slot >= 0) {
    held_[slot] = x.prompt_tokens;
    fresh_.erase(slot);
    restored_task_.erase(slot);  // what it holds is this exchange's now, not a restore's
  }
  if (x.restored_tokens == 0) return;
  // Proof of reuse: what the child evaluated of the prompt after the restore.
  auto found = prompt_n_of_answer(x.streamed, x.response_body);
  if (!found.ok()) {
    log_("prefix: an answer's JSON is not what llama-server sends: " + found.status().message());
    return;
  }
  if (!*found) {
    ++stats_.unverified;
    log_("prefix: reuse on slot " + std::to_string(slot) + " unverified: the answer has no timings.prompt_n");
    return;
  }
  const uint64_t prompt_n = **found;
  stats_.last_prompt_n = prompt_n;
  const bool reused = prompt_n + x.restored_tokens <= x.prompt_tokens.size() + 1;
  ++(reused ? stats_.reused : stats_.not_reused);
  log_("prefix: reuse on slot " + std::to_string(slot) + ": the child evaluated " + std::to_string(prompt_n) + " of " +
       std::to_string(x.prompt_tokens.size()) + " prompt tokens (" + std::to_string(x.restored_tokens) +
       " restored)" + (reused ? "" : ": NOT reused") +
       (memory_kind_.empty() ? "" : ", " + memory_kind_ + (reused ? "" : ": llama-server evaluated the prompt anew"
                                                                        " (no context checkpoint in a slot file)")));
}

// A request's JSON is the client's: a value of an unexpected type is no reason to fail it. The
// parsers (serve/requests.h) do not throw; this catch is a backstop, so that no nlohmann exception
// leaves this module.
void PrefixRestorer::before(Forward& f) {
  try {
    before_unguarded(f);
  } catch (const nlohmann::json::exception& e) {
    log_(std::string("prefix: the request's JSON is not what a completion takes (forwarded as is): ") + e.what());
  }
}

void PrefixRestorer::after(const Exchange& x) {
  try {
    after_unguarded(x);
  } catch (const nlohmann::json::exception& e) {
    log_(std::string("prefix: an answer's JSON is not what llama-server sends: ") + e.what());
  }
}

void PrefixRestorer::forget_slot(int slot) {
  std::lock_guard<std::mutex> l(mu_);
  held_.erase(slot);
  fresh_.erase(slot);
  restored_task_.erase(slot);
}

bool PrefixRestorer::restored_since(int slot, int64_t task) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = restored_task_.find(slot);
  return it != restored_task_.end() && (it->second == task || it->second == kTaskUnknown);
}

void PrefixRestorer::forget_slots() {
  std::lock_guard<std::mutex> l(mu_);
  held_.clear();
  fresh_.clear();
  restored_task_.clear();
}

PrefixStats PrefixRestorer::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace kvsnap
