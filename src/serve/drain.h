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

// At most one completion per slot of the child at once. A completion beyond that waits here, not in
// llama-server's own queue, where it would start in the slot of the request before it the moment
// that one ends, before its conversation is saved (the save skips a busy slot): with -np 1 and two
// clients, every other conversation was lost. The permit is taken before the completion waits for
// the saves queued before it (Persister::wait_saved) and comes back when its exchange is over, after
// the exchange has queued its own save (Proxy: a stream's when it ends or the client hangs up).
//
// A completion the client pinned to a slot (its id_slot other than -1, taken modulo the slot count
// as llama-server takes it) would wait in llama-server behind that slot's request even with other
// slots free, and start there before that request's save: it waits here while that slot may be
// busy, i.e. while a completion pinned there, or one not pinned (whose slot llama-server picks and
// kvsnap learns only from the answer), is out. And a completion not pinned could be given a pinned
// one's slot by llama-server before the pinned one starts there: it waits while any pinned one is
// out. Pinned and unpinned completions therefore take turns; each kind runs side by side.
//
// Promises:
//   - with capacity 0 (the slot count is not known) enter() admits at once and returns no permit;
//   - at most `capacity` permits are out; a pinned permit for slot s is given only while no other
//     pinned to s and no unpinned permit is out, an unpinned one only while no pinned one is out;
//   - waiters are admitted in arrival order (none overtakes one that waits: a pinned request is not
//     starved by a stream of unpinned ones);
//   - enter() waits for a permit up to `max_wait_s`, then admits without one (reported through
//     `waited_out`), so a lost permit cannot stop the server;
//   - after shut() (kvsnap is stopping) enter() returns no permit at once, the waiting ones too,
//     and shut_down() says so: the caller refuses the completion instead of forwarding it.
class SlotGate {
 public:
  using Permit = std::shared_ptr<void>;  // returned when the last copy goes

  void set_capacity(int slots);
  // `slot`: the client's id_slot, -1 for none.
  Permit enter(double max_wait_s, bool* waited_out = nullptr, int slot = -1);
  int out();
  int waiting();  // completions waiting for a permit
  void shut();
  bool shut_down();

 private:
  bool may_enter(int slot);
  void leave(int slot);
  std::mutex mu_;
  std::condition_variable cv_;
  int capacity_ = 0;
  int out_ = 0;
  int unpinned_out_ = 0;
  std::map<int, int> pinned_out_;   // slot -> permits out pinned there
  std::deque<uint64_t> waiting_;    // the waiters' arrival numbers, oldest first
  uint64_t arrivals_ = 0;
  bool shut_ = false;
};

}  // namespace kvsnap
