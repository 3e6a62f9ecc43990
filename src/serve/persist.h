// kvsnap serve's persistence: slots saved into the store in the background
// after completions, and every filled slot at shutdown.
//
// Promises:
//   - note_completion() only queues work: the response it follows is never
//     held up by the store (one worker thread does every save, in order);
//   - wait_saved() holds the next completion until the saves queued before it
//     have run, so a request that takes a slot (with -np 1, every request)
//     never replaces a conversation before it is saved;
//   - a slot is saved when its last task (/slots id_task) differs from the one
//     last saved, so a slot is written once per completion it served; the
//     store's content addressing makes a conversation's next turn write only
//     its new chunks;
//   - each snapshot is tagged serve.ns (the namespace, namespace_of below),
//     serve.slot, serve.task and, when the child has cache-changing settings
//     (--rope-freq-base, --lora, ...: set_cache_tag), serve.cache. A slot whose
//     last task ran with LoRA scales other than the loaded ones (its /slots
//     params.lora: serve/adapters.h) is not saved. The
//     namespace is the one of the request whose prompt the saved file's tokens
//     start with (owner_of_tokens), never merely the one whose completion asked
//     for the save: by the time a queued save runs, another tenant's request may
//     have used the slot. Contents no recent request's prompt matches are left
//     for that request's own save; those of a request whose prompt kvsnap could
//     not tokenize (and at shutdown, any left) are tagged "unattributed", which
//     no request's namespace is, so they are never restored for a tenant;
//   - a failed save (disk full, the child restarting) is logged and counted,
//     never fatal: serving continues;
//   - save_all() (shutdown) saves every filled slot that changed, then returns.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <chrono>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/io.h"
#include "serve/proxy.h"
#include "serve/usage.h"
#include "server/server_flows.h"
#include "serve/tenant_stores.h"

namespace kvsnap {

// The namespace of a request: "key-" + the first 16 hex digits of SHA-256(API
// key), and with X-Kvsnap-Session NAME "key-HEX-session-NAME"; without a key
// "session-NAME", else "default". So a session name never reaches the
// conversations another key holder kept under it. The key is read as
// llama-server reads it: Authorization (without "Bearer "), else X-Api-Key.
std::string namespace_of(const Exchange& x);
// The namespace a completion's conversation is saved under: namespace_of(x), or "unattributed" (no
// tenant's: never restored) when kvsnap could not read its JSON.
std::string owner_namespace(const Exchange& x);
// True for the routes that run a completion in a slot (llama-server 3.22.1's, transcriptions too).
bool is_completion_route(const std::string& path);
// True for the completion routes whose body is form data (an audio file), not JSON: nothing in it
// is read (its bytes are no JSON to scan), and it runs alone (its slot cannot be named).
bool is_form_data_route(const std::string& path);
// The slot a completion answer names (id_slot / slot_id; in a stream, its
// last event that has one), or -1. The parsing: slot_of_answer_body (serve/requests.h).
int slot_of_answer(const Exchange& x);

// A recent completion's namespace and prompt tokens (as kvsnap tokenized them for the prefix lookup).
struct PromptOwner {
  std::string ns;
  std::vector<int32_t> tokens;
  bool may_be_partial = false;  // its stream was given up: the child may have evaluated a part of it
};
// The namespace of the request whose prompt is the longest prefix of `slot_tokens` (an empty prompt
// matches nothing), or "" when none is. Prompts of two namespaces that tie leave it to `preferred`
// (the namespace of the exchange whose answer named this slot, "" for none) when it is one of them,
// else to no one: the slot holds one of the two conversations, and a guess would give it to the
// other tenant. Also "" when another namespace's
// given-up prompt (may_be_partial) shares more of its start with the slot than that one: the slot
// may hold a part of it (a request whose client hung up while the child evaluated its prompt), and
// that part begins with the shorter prompt ("Hello", a chat template's opening).
std::string owner_of_tokens(const std::deque<PromptOwner>& recent, const std::vector<int32_t>& slot_tokens,
                            const std::string& preferred = "");

// The namespace a save files a slot's contents under: owner_of_tokens, else `fallback`. A save that an
// exchange kvsnap did not tokenize asked for (an array prompt, /v1/messages, /responses, /infill)
// files what it finds under `fallback` without looking at the recent prompts: its conversation may
// begin with another namespace's shorter prompt ("Hello", a chat template's opening), and would be
// filed, and with --tenant-per-namespace sealed, as that namespace's. (Persister's `fallback` for
// such an exchange's own slot is its namespace when the slot is certainly its, else "unattributed".)
std::string slot_owner(const std::deque<PromptOwner>& recent, const std::vector<int32_t>& slot_tokens,
                       bool untokenized_job, const std::string& fallback, const std::string& preferred = "");

// Whose an exchange kvsnap did not tokenize has in its own slots: its namespace `ns` when they are
// certainly its, else "unattributed" (no tenant's): kvsnap has no prompt tokens to tell. Certain
// takes `every_task_gated` (no embedding task, which the slot gate does not hold, can take a slot),
// no `unguarded` event from shortly before the exchange came to the gate until its save
// (Persister::note_unguarded), and the slot: `own_slot` >= 0, the one its answer named or serve
// pinned it to, or, `own_after` >= 0, one whose task is newer than the newest when it was let in to
// run alone.
std::string untokenized_exchange_owner(const std::string& ns, int own_slot, int64_t own_after, bool every_task_gated,
                                       bool unguarded);

struct PersistStats {
  uint64_t saved = 0, failed = 0;
  std::string last_error;
};

class Persister {
 public:
  // `target`: the child's endpoint, slot directory and model (slot is set per save).
  // `store_mu` guards `stores` (catalog connections, shared with serve/control.h). Each
  // snapshot goes into its namespace's store.
  Persister(Io& io, TenantStores& stores, std::mutex& store_mu, ServerTarget target,
            std::function<void(const std::string&)> log);
  ~Persister();  // finishes the queued saves

  void note_completion(const Exchange& x);
  // A completion that did not end (its client hung up, Proxy::set_on_given_up): its prompt is
  // known as its namespace's for the later saves' attribution (owner_of_tokens); no save is queued.
  void note_prompt(const Exchange& x);
  // `slot` now holds a stored snapshot (a prefix restore, a requantize's): the task it shows is not
  // a conversation to save (after a restart, the restore's -fa probe gives it a new one).
  // `task`: its /slots id_task after the restore (the restorer read it; -1: unknown, nothing noted).
  void note_restored(int slot, int64_t task);
  // Whether `slot` at `task` (its /slots id_task) holds a conversation whose save has not run: a
  // task it has not saved (or noted as restored) since the child started.
  bool holds_unsaved(int slot, int64_t task);
  // Waits until the saves queued before this call have run (or failed), at most `max_wait_s`; false
  // when it gave up (the save then races the caller's request for the slot). Called before a
  // completion is forwarded: llama-server may give it the slot whose conversation is still queued.
  bool wait_saved(double max_wait_s);
  // The newest id_task the child's slots show (-1 when none or they cannot be listed): tasks started
  // later have larger ids (llama-server numbers them in order).
  int64_t newest_task();
  void save_all();
  void forget_slots();  // after a restart of the child: its slots are empty
  PersistStats stats();
  // Each save is recorded there (before the first completion).
  void set_book(SlotBook* book) { book_ = book; }
  // Called (from the saving thread) after each successful save; must return quickly.
  void set_on_saved(std::function<void()> f) { on_saved_ = std::move(f); }
  // Whether every task the child runs in a slot came through serve's slot gate (false when the
  // child takes embedding tasks, LlamaArgs::embeddings, which the gate does not hold): then a slot
  // whose task is newer than a run-alone exchange's admission is certainly that exchange's.
  // Before the first completion.
  void set_every_task_gated(bool gated) { every_task_gated_ = gated; }
  // The child's cache-changing settings (serve/llama_args.h cache_settings_tag): each snapshot is
  // tagged serve.cache with it when it is not "".
  // Called again when a restarted child's settings differ (its config.ini edited meanwhile).
  void set_cache_tag(const std::string& tag);
  // The scales of the adapters the child loaded (serve/adapters.h ChildAdapters::loaded): a slot whose
  // last task ran with others is not saved. At each start of the child.
  void set_loaded_scales(const std::vector<float>& scales);
  // A task may have started in a slot without the slot gate's guarantee: a completion went on without
  // a permit (the wait ran out, or the gate has no slot count) or without waiting for the saves
  // queued before it; a stream was given up (note_prompt: llama-server may still start its later
  // prompts' tasks); the child restarted (forget_slots: task ids start again). For exchanges that came
  // to the gate up to kUnguardedMarginS before it and are saved after it, no slot is certainly their
  // own (untokenized_exchange_owner).
  void note_unguarded();

 private:
  struct Job {
    int slot;  // -1: the answer did not say; save the slots whose task changed
    bool unverifiable;  // kvsnap has no prompt tokens of the request (not tokenized)
    std::string ns;     // the namespace of the exchange that asked for it, preferred for the slot(s)
                        // it ran in; "" when the slot is not known to be its
    // Which of the slots saved are the exchange's own (`ns`, `unverifiable` apply to those): `own_slot`,
    // else (-1) those whose task is newer than `own_after` (Exchange::own_after_task; -1: all).
    int own_slot = -1;
    int64_t own_after = -1;
    std::chrono::steady_clock::time_point arrived{};  // Exchange::arrived
    std::vector<int32_t> prompt;  // the exchange's prompt tokens (empty: not tokenized)
  };
  void worker();
  void remember_prompt(const Exchange& x, bool may_be_partial);  // mu_ held
  // `fallback`: the namespace for contents no recent prompt matches ("" = leave them for a later save);
  // `untokenized_job`: asked for by an exchange kvsnap did not tokenize (slot_owner).
  // `job_ns`: the namespace of the exchange whose answer named `only_slot` (slot_owner's `preferred`).
  // `own_slot`, `own_after` (Job's): `fallback`, `untokenized_job` and `job_ns` apply to the job's
  // exchange's own slots; another still changed is attributed by its tokens alone.
  // `job_prompt`: the exchange's prompt tokens: its own slot, when it begins with them and no
  // namespace can be told (owner_of_tokens: a tie, another's given-up prompt), is kept as
  // "unattributed" rather than left for a save that will not come.
  void save_changed(int only_slot, const std::string& fallback, bool untokenized_job = false,
                    const std::string& job_ns = "", int own_slot = -1, int64_t own_after = -1,
                    const std::vector<int32_t>& job_prompt = {});

  Io& io_;
  TenantStores& stores_;
  std::mutex& store_mu_;
  ServerTarget target_;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false, busy_ = false;
  uint64_t queued_ = 0, finished_ = 0;  // jobs ever queued, ever run (wait_saved's marks)
  std::map<int, int64_t> saved_task_;   // slot -> id_task of its last save
  uint64_t generation_ = 0;             // forget_slots() calls: the child's life saved_task_ is of
  std::deque<PromptOwner> recent_;      // the last kRecent completions with prompt tokens, newest last
  bool every_task_gated_ = false;
  std::string cache_tag_;
  std::vector<float> loaded_scales_;  // set_loaded_scales
  std::optional<std::chrono::steady_clock::time_point> last_unguarded_;  // note_unguarded's latest
  PersistStats stats_;
  // When each cap ("the store", "tenant 'x'") was last logged as not met: at most every 10 minutes
  // each, not at every save (pinned snapshots over a cap leave it unmet at each).
  std::map<std::string, std::chrono::steady_clock::time_point> cap_logged_;
  SlotBook* book_ = nullptr;
  std::function<void()> on_saved_;
  std::thread thread_;
};

}  // namespace kvsnap
