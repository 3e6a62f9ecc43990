// The LoRA adapter scales a completion runs with in kvsnap serve's child, and what serve does so that
// a cache made under some scales is never continued under others.
//
// What llama-server 3.22.1 does (server-context.cpp launch_slot_with_task, server-common.cpp
// parse_lora_request): a request's "lora" (an array of {"id", "scale"}) runs the task with those
// scales, every loaded adapter it does not list at 0, and clears the slot's cache when they differ
// from the slot's (its last task's; none for a slot that never ran one). A request without "lora"
// (absent, null or []) runs with the scales the child loaded (--lora, --lora-scaled; GET
// /lora-adapters) *without* that check: it would go on from a cache made under another request's
// scales. A restore (POST /slots/N?action=restore) leaves the slot's scales as they were. With no
// adapter loaded, "lora" changes nothing.
//
// So serve (serve.cc), reading which scales made a slot from the child (slot_scales: its last
// task's params.lora), not from its own bookkeeping:
//   - before a request with the loaded scales runs, erases its slot (every idle one when its slot is
//     not known) if its last task ran under others, and before one with scales of its own, a slot
//     it restored into since its last task (erase_slots_of_other_scales);
//   - keeps no conversation made under other scales than the loaded ones (Persister) and restores
//     nothing for a request of its own scales (PrefixRestorer): the child would clear the slot, whose
//     scales are its last task's, not those of what was restored;
//   - refuses a request's own scales when it cannot keep them apart (ChildScales::settle).
// The parsers (what the child and a request say): serve/lora_scales.h.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "serve/lora_scales.h"
#include "serve/proxy.h"
#include "server/llama_server.h"

namespace kvsnap {

// What the child loaded (GET /lora-adapters). Without an answer: none when its command line loads
// none (`loads_adapters` false: an older llama-server has no such route), else unknown.
ChildAdapters read_child_adapters(LlamaServer& srv, bool loads_adapters);

// The child's adapters as serve last read them, for the request threads (thread-safe).
class ChildScales {
 public:
  // At each start of the child: its adapters and whether its RAM prompt cache is off (llama_args.h
  // ram_cache_off).
  void set(const ChildAdapters& a, bool ram_cache_off);
  // The child ended: its adapters are unknown (the loaded scales kept) until set() again, unless it
  // loaded none and the next one loads none (`loads_adapters`: its command line's --lora flags).
  void restarting(bool loads_adapters, bool ram_cache_off);
  // True when a request's own scales may run now: adapters loaded, and none of scales_refusal's
  // reasons. Otherwise no slot can hold a cache of other scales than the loaded ones.
  bool admits_own_scales() const;
  // True at most every `every_s` while the child's adapters could not be read (not while it
  // restarts): the caller reads them again, so that one failed read does not last the child's life.
  bool read_again(double every_s);
  ChildAdapters adapters() const;
  // Settles a completion's scales before it is forwarded: one with scales of its own (other than the
  // loaded ones) gets Forward::own_scales, or is refused (400, scales_refusal; 503 while the child
  // restarts) when serve cannot keep them apart; with adapters loaded, so is a body kvsnap cannot
  // read (which scales it asks for is unknown). The "lora" of a route that drops it (the Anthropic
  // route's conversion; form data) and of a body the child refuses counts for nothing. The body is
  // never changed.
  void settle(Forward& f) const;

 private:
  mutable std::mutex mu_;
  ChildAdapters adapters_;
  bool ram_cache_off_ = false;
  std::chrono::steady_clock::time_point last_read_again_{};
};

// True when llama-server runs a completion on `path` with the loaded scales whatever its "lora" says:
// the Anthropic route (its conversion keeps only the fields it knows) and form data.
bool takes_loaded_scales_blindly(const std::string& path);

// Erases the slots of the child (`slot`, or every one: -1) whose cache a request would go on from
// under other scales than the cache was made under: for a request with the loaded scales
// (`own_scales` false), a slot whose last (or running) task ran under others; for one with its own, a
// slot that `restored_since(slot, id_task)` says kvsnap restored into since its last task (a restore
// is of the loaded scales; the slot's are its last task's). Before the request runs. With the slot
// gate's `permit` a busy slot counts too (a task whose client hung up, still running: llama-server
// erases it once it ends); without one only idle slots. The sessions erased were saved (the saves
// queued before it have run), or are of other scales (kept nowhere). `erased`: their ids.
Status erase_slots_of_other_scales(LlamaServer& srv, const std::vector<float>& loaded, bool own_scales, int slot,
                                   bool permit, const std::function<bool(int, int64_t)>& restored_since,
                                   std::vector<int>& erased);

}  // namespace kvsnap
