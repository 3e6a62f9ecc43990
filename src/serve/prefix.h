// Prefix restore (issue 14, part 3): before a completion is forwarded, kvsnap
// finds its prompt's tokens (the child's /tokenize; /apply-template first for
// chat), looks up the longest snapshot of the request's namespace whose tokens
// are a prefix of them, and when that is longer than what the slot holds (as
// far as kvsnap knows: what it restored or last sent there), restores it into
// the slot, converted to the child's cache types, and pins the request to that
// slot (id_slot). The child then evaluates only the tokens after the prefix.
//
// Promises:
//   - no tenant's snapshot is restored for another: only snapshots tagged
//     with the request's namespace (serve/persist.h namespace_of) are candidates;
//   - nor one of other cache-changing settings: a snapshot's serve.cache tag
//     (absent: none) must be the child's (set_cache_tag); a request with LoRA
//     scales of its own (Forward::own_scales, serve/adapters.h) is restored
//     nothing (the child would clear the slot);
//   - the body is rewritten (id_slot added) only when a restore happened, or
//     when a slot holds what kvsnap restored there (a requantize) for this
//     namespace, not yet used, at least half of it a prefix of the prompt:
//     the request is pinned to it, so that reuse is proven too; otherwise the
//     request goes on untouched;
//   - a failure (tokenizing, the store, the restore) is logged and counted,
//     never fails the request: it is forwarded as it came;
//   - after the answer, how many prompt tokens the child evaluated
//     (timings.prompt_n) is logged beside the restored length and counted:
//     reused when prompt_n <= the prompt's tokens - the restored ones + 1
//     (llama-server always evaluates a prompt's last token again), not_reused
//     otherwise, unverified when the answer carries no timings.prompt_n. For an SWA, hybrid
//     or recurrent model the line names the model's kind: llama-server 3.22.1 re-evaluates a
//     restored SWA state whole (llama.cpp #28194); counted not_reused, never claimed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/io.h"
#include "serve/proxy.h"
#include "serve/requests.h"
#include "serve/usage.h"
#include "server/server_flows.h"
#include "serve/tenant_stores.h"

namespace kvsnap {

struct PrefixStats {
  uint64_t restores = 0, restored_tokens = 0, failed = 0;
  uint64_t reused = 0, not_reused = 0, unverified = 0;  // the answers after a restore
  uint64_t last_prompt_n = 0;  // of the last answer after a restore
};

// A slot as a prefix restore weighs it.
struct SlotChoice {
  int id = -1;
  bool idle = false;     // not processing, not pinned by kvsnap for a request in flight
  bool unsaved = false;  // holds a conversation whose save has not run
  size_t has = 0;        // tokens of the request it holds already, as far as kvsnap knows
};
// The slot a restore goes into: `pinned` (the request's own, llama-server's choice) when >= 0, else
// the idle slot that holds a saved conversation (or none) and least of the request, else the idle
// unsaved one that holds least; -1 when no slot is idle.
int choose_restore_slot(const std::vector<SlotChoice>& slots, int pinned);

class PrefixRestorer {
 public:
  // `target`: the child's endpoint, slot directory, model and cache types (flash_attn "" = detect).
  // `store_mu` guards `stores` (catalog connections of their own: lookups never wait for a save).
  // A request's prefix is looked up in, and restored from, its namespace's store.
  PrefixRestorer(Io& io, TenantStores& stores, std::mutex& store_mu, ServerTarget target,
                 std::function<void(const std::string&)> log);

  // Slot -> how many of the request's prompt tokens it holds, as far as kvsnap knows (what it
  // restored or last sent there), for the slot gate's choice (SlotWant::holds). Tokenizes the prompt
  // (the child's /tokenize) and keeps the tokens in `f` for before(); empty when that fails (before()
  // tries again and logs why).
  std::map<int, size_t> slot_holds(Forward& f, const CompletionRequest& req);
  void before(Forward& f);
  void after(const Exchange& x);
  void forget_slots();  // the child restarted: its slots are empty
  void forget_slot(int slot);  // erased in the child
  // True when kvsnap restored into `slot` since its task `task` (its /slots id_task now, -1 for none):
  // the slot holds what was restored, while its LoRA scales are still its last task's (serve/adapters.h).
  bool restored_since(int slot, int64_t task);
  PrefixStats stats();
  // Each restore is recorded there (before the first request).
  void set_book(SlotBook* book) { book_ = book; }
  // The child's cache-changing settings (serve/llama_args.h cache_settings_tag): only snapshots
  // tagged serve.cache with it (none when it is "") are restored.
  // Called again when a restarted child's settings differ (its config.ini edited meanwhile).
  void set_cache_tag(const std::string& tag);
  // Called after each restore into a slot (before the first request; must not call back here): what
  // the slot holds now is a stored snapshot, not a conversation to save (Persister::note_restored).
  // `task`: the slot's /slots id_task right after the restore (-1 when the child did not say).
  void set_on_restored(std::function<void(int slot, int64_t task)> f) { on_restored_ = std::move(f); }
  // Whether `slot` at `task` (its /slots id_task) holds a conversation not saved yet: a restore goes
  // into another idle slot when there is one (Persister::holds_unsaved).
  void set_holds_unsaved(std::function<bool(int slot, int64_t task)> f) { holds_unsaved_ = std::move(f); }
  // The child's cache types changed (a requantize); flash_attn "" = detect.
  void set_cache(const std::string& ctk, const std::string& ctv, const std::string& flash_attn);
  // Restores snapshot `id` of namespace `ns` into `slot` at the child's types (a requantize); the
  // next request of that namespace that extends it is pinned there.
  Result<ServerRestoreResult> restore_slot(int slot, int64_t id, const std::string& ns);

 private:
  void before_unguarded(Forward& f);
  void after_unguarded(const Exchange& x);
  // The request's prompt as tokens (the child's /apply-template and /tokenize when it is not tokens).
  Result<std::vector<int32_t>> prompt_tokens(const CompletionRequest& req);
  // Pins the request to `slot`: id_slot set in its body; the slot counts as taken (pinned_) until
  // the exchange is over (f.hold's last copy goes).
  void pin(Forward& f, int slot);
  bool taken(int slot);
  // Restores `info` into `slot` (under mu_); records the slot's new contents.
  Result<ServerRestoreResult> restore_into(int slot, const SnapshotInfo& info, const std::vector<int32_t>& tokens,
                                           const std::string& ns);
  // Pins the request to a slot kvsnap restored for `ns` and nobody used since, when at least half of
  // what it holds is a prefix of the request (that much is the reuse to prove).
  void pin_fresh(Forward& f, const std::vector<int32_t>& toks, const std::string& ns,
                 int asked);
  // Forgets what kvsnap restored into `slot` when its task is no longer the restore's (another request
  // ran there); true when it did.
  bool forget_if_replaced(int slot, int64_t task);

  Io& io_;
  TenantStores& stores_;
  std::mutex& store_mu_;
  ServerTarget target_;
  std::string model_fingerprint_;  // "" when the model is unknown: any
  std::string cache_tag_;
  // Whether `info` is a snapshot of namespace `ns` saved under the child's cache-changing settings.
  bool restorable(const SnapshotInfo& info, const std::string& ns) const;
  // "SWA model (sliding window N)", "hybrid model (attention + recurrent)", "recurrent model", or ""
  // (plain KV, or the model unknown): named in every reuse line, since llama-server may not reuse a
  // restored state of such a model (it wants context checkpoints that slot files do not hold).
  std::string memory_kind_;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;  // one decision at a time: two requests never restore into the same slot at once
  std::map<int, std::vector<int32_t>> held_;  // slot -> the tokens kvsnap last put or sent there
  std::map<int, std::string> fresh_;           // slot -> the namespace of a restore nobody used yet
  PrefixStats stats_;
  SlotBook* book_ = nullptr;
  std::function<void(int, int64_t)> on_restored_;
  std::function<bool(int, int64_t)> holds_unsaved_;
  std::map<int, int64_t> restored_task_;  // slot -> its /slots id_task right after kvsnap's restore
  // slot -> requests kvsnap pinned there whose exchange is not over: /slots shows such a slot idle
  // until the child starts the request, and another restore must not choose it meanwhile. Its own
  // mutex: released from the proxy's threads, never held across a call.
  std::mutex pinned_mu_;
  std::map<int, int> pinned_;
};

}  // namespace kvsnap
