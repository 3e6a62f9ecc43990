// The gate a requantize closes, and the shutdown: requests take a ticket while
// they are forwarded and answered (a stream until its last byte); close() stops
// admitting new ones and waits until every ticket is back (the child idle),
// open() lets the waiting ones through; shut() stops admitting for good.
//
// Promises:
//   - while the gate is closed, enter() waits (the request is queued, not
//     refused) up to `max_wait_s`; then it returns no ticket and the caller
//     answers 503 with Retry-After;
//   - close() returns once no ticket is out: nothing is being forwarded;
//   - after shut(), enter() returns no ticket at once (the waiting ones too),
//     whatever open() does; wait_idle() says whether the tickets out came back.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace kvsnap {

class Drain {
 public:
  using Ticket = std::shared_ptr<void>;  // returned when the last copy goes

  // A ticket, or nullptr when the gate stayed closed for `max_wait_s`.
  Ticket enter(double max_wait_s);
  // A ticket at once, closed or shut: for requests that use no slot of the child (a resume of a
  // stream being read to its end), which close() and wait_idle() still wait for.
  Ticket enter_slotless();
  // Stops admitting, then waits for the tickets out; returns how many there were when it closed.
  uint64_t close();
  void open();
  // For good (kvsnap is stopping); returns how many tickets were out.
  uint64_t shut();
  bool shut_down();
  // True once no ticket is out, false after `max_wait_s` with some still out.
  bool wait_idle(double max_wait_s);

 private:
  Ticket issue();  // under mu_: one more ticket out
  void leave();
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t out_ = 0;
  bool closed_ = false;
  bool shut_ = false;
};

// At most one completion per slot of the child at once, and kvsnap, not llama-server, says which
// slot. A completion beyond the slot count waits here, not in llama-server's own queue, where it
// would start in the slot of the request before it the moment that one ends, before its
// conversation is saved (the save skips a busy slot): with -np 1 and two clients, every other
// conversation was lost. A permit is a slot: taken before the completion waits for the saves queued
// before it (Persister::wait_saved), given back when its exchange is over, after the exchange has
// queued its own save (Proxy: a stream's when it ends or the client hangs up).
//
// The slot is named because llama-server frees a slot when its generation ends, before kvsnap has
// read the answer's end and queued the save: with -np 2, a completion admitted when the other
// slot's permit came back was given the slot just freed (llama-server's choice: prompt similarity,
// else least recently used) and took it over unsaved (2 to 8 of 20 concurrent sessions lost). So a
// completion the client did not pin gets a free slot here (kAny: the one llama-server would take,
// from what kvsnap knows of the slots) and serve pins it there (id_slot);
// one the client pinned (its id_slot other than -1, taken modulo the slot count as llama-server takes
// it) waits for that slot (kSlot). A completion that cannot be pinned (llama-server's Anthropic
// route drops id_slot; a body that is not a JSON object) or takes several slots ("n" > 1) runs alone
// (kAlone): llama-server may put it in any slot it sees idle.
//
// Promises:
//   - with capacity 0 (the slot count is not known) enter() admits at once and returns no permit;
//   - no two permits out hold one slot; a kAlone permit is out only while no other is;
//   - waiters are admitted in arrival order (none overtakes one that waits: a pinned request is not
//     starved by a stream of unpinned ones);
//   - enter() waits for a permit up to `max_wait_s`, then admits without one (reported through
//     `waited_out`), so a lost permit cannot stop the server;
//   - after shut() (kvsnap is stopping) enter() returns no permit at once, the waiting ones too,
//     and shut_down() says so: the caller refuses the completion instead of forwarding it.
struct SlotWant {
  enum class Kind { kAny, kSlot, kAlone };
  Kind kind = Kind::kAny;
  int id_slot = -1;  // kSlot: the client's id_slot
  // kAny: slot -> how many of the request's `prompt_tokens` it holds (kvsnap's knowledge). The slot
  // given is llama-server's own choice (get_available_slot, 3.22.1) on that knowledge: the free slot
  // holding the largest share of the prompt above its --slot-prompt-similarity (0.1), the first of
  // equals; else the one given back longest ago, the last of equals (a slot never used first).
  // Matching it keeps what a client sees (the answer's id_slot, its cached tokens) as direct access.
  std::map<int, size_t> holds;
  size_t prompt_tokens = 0;
};

class SlotGate {
 public:
  using Permit = std::shared_ptr<void>;  // returned when the last copy goes

  // Once, before the first completion.
  void set_capacity(int slots);
  // `slot`: the slot the permit holds (-1 for kAlone and without a permit).
  Permit enter(double max_wait_s, const SlotWant& want, bool* waited_out = nullptr, int* slot = nullptr);
  int out();
  int waiting();  // completions waiting for a permit
  void shut();
  bool shut_down();

 private:
  // The slot a waiter at the front would take now: -1 for kAlone, -2 when it must wait. `asked`:
  // kSlot's slot.
  int slot_for(SlotWant::Kind kind, const SlotWant& want, int asked);
  void leave(int slot);
  std::mutex mu_;
  std::condition_variable cv_;
  int capacity_ = 0;
  int out_ = 0;
  bool alone_out_ = false;
  std::vector<char> taken_;              // per slot: a permit holds it
  std::vector<uint64_t> given_back_at_;  // per slot: when its last permit came back (a counter)
  uint64_t give_backs_ = 0;
  std::deque<uint64_t> waiting_;  // the waiters' arrival numbers, oldest first
  uint64_t arrivals_ = 0;
  bool shut_ = false;
};

}  // namespace kvsnap
