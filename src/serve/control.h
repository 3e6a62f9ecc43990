// kvsnap serve's own routes, answered by the proxy and never forwarded:
//
//   POST /kvsnap/requantize {"ctk","ctv","flash_attn"?,"ctx_size"?,"dry_run"?}
//     drains (new requests wait at the gate, serve/drain.h; the ones in flight
//     finish), saves every filled slot into the store, restarts the child with
//     the new -ctk/-ctv (-fa, -c), restores each slot converted to them, and
//     answers the time per phase and the bytes per slot before and after.
//     dry_run: the estimate only (serve/usage.h), nothing restarted.
//   GET /kvsnap/usage
//     per slot: tokens, bytes, types, the size at every ctk/ctv pair; counters
//     of saves, restores, reuse proofs and requantizes; "requantize": where a
//     running one stands (serve/requantize_progress.h), null when none runs.
//
// Promises:
//   - a bad body (not JSON, an unknown key, a type llama-server does not
//     take, a bad flash_attn or ctx_size) is a 400 naming the problem, before
//     anything is drained;
//   - one requantize at a time (a second one meanwhile: 409);
//   - a failed save stops the requantize before the restart (500, nothing
//     changed); a child that does not start with the new arguments is started
//     again with the previous ones, its slots restored, and the answer is a
//     500 naming the failure: serving continues either way;
//   - with admin keys (--admin-key-file, KVSNAP_ADMIN_KEY), these routes want
//     one of them and nothing else (401 otherwise); without, and with API keys
//     (--api-key, --api-key-file, LLAMA_API_KEY), they want one of those, as
//     llama-server's own routes do (401 otherwise);
//   - with a ladder (--dynamic-cache, serve/ladder.h), after each save a slot
//     at 90% of its context steps the cache down one rung, with the rung's
//     context size, through the same requantize path (its own thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/io.h"
#include "base/json.h"
#include "serve/drain.h"
#include "serve/ladder.h"
#include "serve/llama_args.h"
#include "serve/persist.h"
#include "serve/prefix.h"
#include "serve/proxy.h"
#include "serve/requantize_progress.h"
#include "serve/requests.h"
#include "serve/supervisor.h"
#include "serve/usage.h"
#include "store/store.h"

namespace kvsnap {

struct ControlDeps {
  Io* io = nullptr;
  TenantStores* stores = nullptr;  // guarded by *store_mu (the persister's)
  std::mutex* store_mu = nullptr;
  Drain* drain = nullptr;
  Persister* persist = nullptr;
  PrefixRestorer* prefix = nullptr;
  Supervisor* sup = nullptr;
  SlotBook* book = nullptr;
  std::string child_url;  // "http://127.0.0.1:PORT"
  int child_port = 0;
  std::string slot_dir;
  std::function<void(const std::string&)> log;
  // Keys for kvsnap's own routes (ServeOptions::admin_key_file): when set, the child's keys do not
  // open them.
  std::vector<std::string> admin_keys{};
};

class Control {
 public:
  // `ladder`: the child already runs at its first rung.
  Control(ControlDeps d, LlamaArgs args, std::optional<Ladder> ladder = std::nullopt);
  ~Control();
  void stop();        // the ladder's thread ends (before shutdown saves)
  void note_saved();  // a slot was saved: the ladder looks at the slots
  // False for requests that are not kvsnap's routes.
  bool handle(const LocalRequest& req, LocalAnswer& out);
  uint64_t requantizes() const { return requantized_; }

 private:
  using Ask = RequantizeAsk;
  Result<Ask> parse_ask(const std::string& body);
  void requantize(const std::string& body, LocalAnswer& out);
  void run(const Ask& ask, LocalAnswer& out);
  nlohmann::ordered_json slot_estimate(int slot, const SlotRecord& r, const std::string& ctk, const std::string& ctv);
  void dry_run(const LlamaArgs& next, nlohmann::ordered_json& res);
  void restore_all(const std::map<int, SlotRecord>& book, const LlamaArgs& next, nlohmann::ordered_json& res);
  void watch();
  void usage(LocalAnswer& out);
  // The sizes of snapshot `id` at every pair (cached: a snapshot never changes).
  Result<std::vector<PairSize>> sizes(int64_t id, const std::string& ns);  // of `ns`'s snapshot `id`

  ControlDeps d_;
  std::mutex args_mu_;
  LlamaArgs args_;  // the child's current arguments
  std::mutex busy_;  // one requantize at a time
  std::mutex sizes_mu_;
  std::map<int64_t, std::vector<PairSize>> sizes_;
  std::atomic<uint64_t> requantized_{0}, requantize_failed_{0};
  RequantizeProgress progress_;  // the running requantize, for usage and the log
  std::optional<Ladder> ladder_;
  std::atomic<size_t> rung_{0};
  bool ladder_stopped_ = false;  // a step down failed: no more (the watcher thread only)
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false, saved_ = false;
  std::thread watcher_;
};

}  // namespace kvsnap
