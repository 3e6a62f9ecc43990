// serve/drain.h: the gate a requantize closes and the shutdown shuts.
#include "serve/drain.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>

namespace kvsnap {
namespace {

using Clock = std::chrono::steady_clock;

TEST(ServeDrain, ShutRefusesAtOnceAndWaitIdleSeesTheTicketsOut) {
  Drain d;
  Drain::Ticket in_flight = d.enter(0);
  ASSERT_NE(in_flight, nullptr);
  EXPECT_FALSE(d.shut_down());
  EXPECT_EQ(d.shut(), 1u);
  EXPECT_TRUE(d.shut_down());
  const auto t0 = Clock::now();
  EXPECT_EQ(d.enter(30), nullptr);  // no wait: refused at once
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  d.open();  // a requantize that ends meanwhile does not let requests in again
  EXPECT_EQ(d.enter(0), nullptr);
  EXPECT_FALSE(d.wait_idle(0.05));  // the ticket in flight is still out
  std::thread done([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    in_flight.reset();
  });
  EXPECT_TRUE(d.wait_idle(30));
  done.join();
}

TEST(ServeDrain, ShutWakesARequestWaitingAtAClosedGate) {
  Drain d;
  d.close();  // a requantize: new requests wait
  std::atomic<bool> refused{false};
  const auto t0 = Clock::now();
  std::thread waiter([&] { refused = d.enter(30) == nullptr; });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  d.shut();
  waiter.join();
  EXPECT_TRUE(refused);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(d.wait_idle(0));
}

// SlotGate (serve/drain.h): one completion per slot; a permit comes back when its last copy goes;
// a gate whose slot count is unknown admits everyone; a wait that runs out admits without a permit.
TEST(ServeSlotGate, OnePermitPerSlotAndTheNextWaitsForOneToComeBack) {
  SlotGate g;
  bool waited_out = true;
  int slot = 7;
  EXPECT_EQ(g.enter(0.01, {}, &waited_out, &slot), nullptr) << "capacity unknown: admitted without a permit";
  EXPECT_FALSE(waited_out);
  EXPECT_EQ(slot, -1);
  g.set_capacity(1);
  SlotGate::Permit first = g.enter(0.01, {}, &waited_out, &slot);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(slot, 0);
  EXPECT_EQ(g.out(), 1);
  EXPECT_EQ(g.enter(0.05, {}, &waited_out), nullptr);
  EXPECT_TRUE(waited_out) << "a second completion got the one slot";
  std::thread back([p = std::move(first)]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    p.reset();  // the exchange is over
  });
  SlotGate::Permit second = g.enter(10, {}, &waited_out);
  back.join();
  EXPECT_NE(second, nullptr);
  EXPECT_FALSE(waited_out);
  EXPECT_EQ(g.out(), 1);
  second.reset();
  EXPECT_EQ(g.out(), 0);
}

// A slotless ticket (a resume of a stream kvsnap reads to its end) is given closed or shut, and is
// waited for like any other.
TEST(ServeDrain, ASlotlessTicketPassesAClosedGateAndIsWaitedFor) {
  Drain d;
  EXPECT_EQ(d.close(), 0u);  // nothing out: closed at once
  EXPECT_EQ(d.enter(0.01), nullptr) << "closed";
  Drain::Ticket t = d.enter_slotless();
  ASSERT_NE(t, nullptr);
  d.shut();
  EXPECT_NE(d.enter_slotless(), nullptr) << "shut";
  EXPECT_FALSE(d.wait_idle(0.01)) << "the shutdown waits for it";
  t.reset();
  EXPECT_TRUE(d.wait_idle(0));
}

// Waits until `n` completions wait at the gate (each waiter is queued before it blocks).
void wait_for_waiters(SlotGate& g, int n) {
  for (int i = 0; i < 10000 && g.waiting() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(g.waiting(), n);
}

SlotWant any(std::map<int, size_t> holds = {}, size_t prompt_tokens = 100) {
  SlotWant w;
  w.holds = std::move(holds);
  w.prompt_tokens = prompt_tokens;
  return w;
}
SlotWant pinned_to(int id_slot) {
  SlotWant w;
  w.kind = SlotWant::Kind::kSlot;
  w.id_slot = id_slot;
  return w;
}
SlotWant alone() {
  SlotWant w;
  w.kind = SlotWant::Kind::kAlone;
  return w;
}

// The loss this prevents (-np 2, 20 clients, 5 to 9 sessions lost): a slot whose permit is out may be
// idle in llama-server already (its generation ended, kvsnap has not queued the save yet). A
// completion admitted when the other permit comes back is given that other slot, never the one still
// held. Among free slots, llama-server's own choice: the largest share of the prompt above 0.1, the
// first of equals; else the one given back longest ago, the last of equals (llama-server's `<=`).
TEST(ServeSlotGate, AnUnpinnedCompletionGetsAFreeSlotNeverOneStillHeld) {
  SlotGate g;
  g.set_capacity(3);
  int a_slot = -1, b_slot = -1, c_slot = -1;
  SlotGate::Permit a = g.enter(0.01, any(), nullptr, &a_slot);
  SlotGate::Permit b = g.enter(0.01, any(), nullptr, &b_slot);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a_slot, 2) << "none used yet: llama-server takes the last";
  EXPECT_EQ(b_slot, 1);
  b.reset();
  // c's prompt is in a's slot (still held) and some of it in slot 0: slot 0 (b's has none of it)
  SlotGate::Permit c = g.enter(0.01, any({{2, 100}, {0, 11}}), nullptr, &c_slot);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c_slot, 0) << "the free slot holding more than a tenth of the prompt";
  c.reset();
  int d_slot = -1;
  SlotGate::Permit d = g.enter(0.01, any({{0, 10}, {1, 10}}), nullptr, &d_slot);
  EXPECT_EQ(d_slot, 1) << "a tenth is not above llama-server's 0.1: least recently used (1, then 0)";
  d.reset();
  SlotGate::Permit e = g.enter(0.01, any({{0, 30}, {1, 30}}), nullptr, &d_slot);
  EXPECT_EQ(d_slot, 0) << "equal shares: the first";
  e.reset();
  a.reset();
  SlotGate::Permit f = g.enter(0.01, any(), nullptr, &d_slot);
  EXPECT_EQ(d_slot, 1) << "given back 1 (b), 0 (c), 1 (d), 0 (e), 2 (a): 1 is the least recent";
}

// A completion pinned to a slot (the client's id_slot, modulo the slot count as llama-server reads
// it) waits while that slot is held, and takes it from the ones kAny is given; one kvsnap cannot pin
// (kAlone) runs only while no other permit is out, and none goes in beside it; nobody overtakes a
// waiter (arrival order).
TEST(ServeSlotGate, PinnedCompletionsWaitForTheirSlotAndUnpinnableOnesRunAlone) {
  SlotGate g;
  g.set_capacity(3);
  bool waited_out = false;
  int slot = -1;
  SlotGate::Permit a0 = g.enter(0.01, pinned_to(0), &waited_out, &slot);
  ASSERT_NE(a0, nullptr);
  EXPECT_EQ(slot, 0);
  EXPECT_EQ(g.enter(0.05, pinned_to(3), &waited_out), nullptr) << "id_slot 3 with 3 slots is slot 0";
  EXPECT_TRUE(waited_out) << "a second completion pinned to slot 0 went in beside the first";
  // llama-server reads any id_slot but -1 as a size_t modulo the slot count: -2 is 2^64 - 2, and
  // 2^64 = 1 (mod 3), so slot 2; -4 is slot 0
  EXPECT_EQ(g.enter(0.05, pinned_to(-4), &waited_out), nullptr) << "id_slot -4 with 3 slots is slot 0";
  SlotGate::Permit c2 = g.enter(0.01, pinned_to(-2), &waited_out, &slot);
  ASSERT_NE(c2, nullptr);
  EXPECT_EQ(slot, 2);
  SlotGate::Permit u = g.enter(0.01, any({{0, 9}, {2, 9}}), &waited_out, &slot);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(slot, 1) << "the only free slot";
  EXPECT_EQ(g.enter(0.05, pinned_to(-1), &waited_out), nullptr) << "id_slot -1 pins nothing: any slot, none free";
  u.reset();
  c2.reset();
  EXPECT_EQ(g.enter(0.05, alone(), &waited_out), nullptr);
  EXPECT_TRUE(waited_out) << "an unpinnable completion went in beside another";
  // An unpinnable waiter first, a pinned one behind it: the pinned one does not overtake (its slot is
  // free), and both go, in that order, once slot 0 comes back; the pinned one after the alone one.
  std::atomic<int> order{0};
  int alone_at = -1, pinned_at = -1;
  SlotGate::Permit alone_permit, pinned_permit;
  std::thread unpinnable([&] {
    alone_permit = g.enter(10, alone());
    alone_at = ++order;
  });
  wait_for_waiters(g, 1);
  std::thread pinned([&] {
    pinned_permit = g.enter(10, pinned_to(1));
    pinned_at = ++order;
  });
  wait_for_waiters(g, 2);
  EXPECT_EQ(order.load(), 0);
  a0.reset();
  unpinnable.join();
  EXPECT_EQ(alone_at, 1);
  EXPECT_NE(alone_permit, nullptr);
  EXPECT_EQ(g.waiting(), 1) << "the pinned one waits while the unpinnable one is out";
  alone_permit.reset();
  pinned.join();
  EXPECT_EQ(pinned_at, 2);
  EXPECT_NE(pinned_permit, nullptr);
  pinned_permit.reset();
  EXPECT_EQ(g.out(), 0);
}

// Shut (kvsnap stopping): the completions waiting for a slot come back at once without a permit, so
// that serve refuses them instead of forwarding each in turn while the shutdown waits; so do later ones.
TEST(ServeSlotGate, ShutSendsTheWaitersBackAtOnce) {
  SlotGate g;
  g.set_capacity(1);
  SlotGate::Permit in = g.enter(0.01, {});
  ASSERT_NE(in, nullptr);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::thread waiter([&] {
    bool waited_out = true;
    EXPECT_EQ(g.enter(60, pinned_to(0), &waited_out), nullptr);
    EXPECT_FALSE(waited_out) << "sent back by the shut, not by its wait running out";
  });
  wait_for_waiters(g, 1);
  EXPECT_FALSE(g.shut_down());
  g.shut();
  waiter.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_TRUE(g.shut_down());
  EXPECT_EQ(g.enter(60, {}), nullptr);
  in.reset();
  EXPECT_EQ(g.out(), 0);
}

}  // namespace
}  // namespace kvsnap
