// serve/drain.h: the gate a requantize closes and the shutdown shuts.
#include "serve/drain.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
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
  EXPECT_EQ(g.enter(0.01, &waited_out), nullptr) << "capacity unknown: admitted without a permit";
  EXPECT_FALSE(waited_out);
  g.set_capacity(1);
  SlotGate::Permit first = g.enter(0.01, &waited_out);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(g.out(), 1);
  EXPECT_EQ(g.enter(0.05, &waited_out), nullptr);
  EXPECT_TRUE(waited_out) << "a second completion got the one slot";
  std::thread back([p = std::move(first)]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    p.reset();  // the exchange is over
  });
  SlotGate::Permit second = g.enter(10, &waited_out);
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

// A completion pinned to a slot (the client's id_slot, modulo the slot count as llama-server reads
// it) waits while that slot may be busy: while a completion pinned there, or one not pinned
// (llama-server picks its slot), is out; an unpinned one waits while a pinned one is out (it could
// be given that slot first); pinned ones to other slots go on together; and nobody overtakes a
// waiter (arrival order).
TEST(ServeSlotGate, PinnedAndUnpinnedCompletionsTakeTurns) {
  SlotGate g;
  g.set_capacity(3);
  bool waited_out = false;
  SlotGate::Permit a0 = g.enter(0.01, &waited_out, 0);
  ASSERT_NE(a0, nullptr);
  EXPECT_EQ(g.enter(0.05, &waited_out, 3), nullptr) << "id_slot 3 with 3 slots is slot 0";
  EXPECT_TRUE(waited_out) << "a second completion pinned to slot 0 went in beside the first";
  // llama-server reads any id_slot but -1 as a size_t modulo the slot count: -2 is 2^64 - 2, and
  // 2^64 = 1 (mod 3), so slot 2; -4 is slot 0
  EXPECT_EQ(g.enter(0.05, &waited_out, -4), nullptr) << "id_slot -4 with 3 slots is slot 0";
  SlotGate::Permit b1 = g.enter(0.01, &waited_out, 1);
  EXPECT_NE(b1, nullptr) << "slot 1 is free";
  EXPECT_EQ(g.enter(0.05, &waited_out), nullptr);
  EXPECT_TRUE(waited_out) << "an unpinned completion went in while pinned ones were out";
  b1.reset();
  a0.reset();
  SlotGate::Permit u = g.enter(0.01, &waited_out);
  ASSERT_NE(u, nullptr) << "no pinned completion out: an unpinned one goes";
  EXPECT_EQ(g.enter(0.05, &waited_out, 1), nullptr);
  EXPECT_TRUE(waited_out) << "pinned to slot 1 while an unpinned completion (slot unknown) is out";
  // A pinned waiter first, an unpinned one behind it: the unpinned one does not overtake (a permit
  // is free for it), and both go, in that order, once the unpinned completion out comes back.
  std::atomic<int> order{0};
  int pinned_at = -1, unpinned_at = -1;
  SlotGate::Permit pinned_permit, unpinned_permit;
  std::thread pinned([&] {
    pinned_permit = g.enter(10, nullptr, 0);
    pinned_at = ++order;
  });
  wait_for_waiters(g, 1);
  std::thread unpinned([&] {
    unpinned_permit = g.enter(10);
    unpinned_at = ++order;
  });
  wait_for_waiters(g, 2);
  EXPECT_EQ(order.load(), 0);
  u.reset();
  pinned.join();
  EXPECT_EQ(pinned_at, 1);
  EXPECT_NE(pinned_permit, nullptr);
  EXPECT_EQ(g.waiting(), 1) << "the unpinned one waits while the pinned one is out";
  pinned_permit.reset();
  unpinned.join();
  EXPECT_EQ(unpinned_at, 2);
  EXPECT_NE(unpinned_permit, nullptr);
  unpinned_permit.reset();
  EXPECT_EQ(g.out(), 0);
}

// Shut (kvsnap stopping): the completions waiting for a slot come back at once without a permit, so
// that serve refuses them instead of forwarding each in turn while the shutdown waits; so do later ones.
TEST(ServeSlotGate, ShutSendsTheWaitersBackAtOnce) {
  SlotGate g;
  g.set_capacity(1);
  SlotGate::Permit in = g.enter(0.01);
  ASSERT_NE(in, nullptr);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::thread waiter([&] {
    bool waited_out = true;
    EXPECT_EQ(g.enter(60, &waited_out, 0), nullptr);
    EXPECT_FALSE(waited_out) << "sent back by the shut, not by its wait running out";
  });
  wait_for_waiters(g, 1);
  EXPECT_FALSE(g.shut_down());
  g.shut();
  waiter.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_TRUE(g.shut_down());
  EXPECT_EQ(g.enter(60), nullptr);
  in.reset();
  EXPECT_EQ(g.out(), 0);
}

}  // namespace
}  // namespace kvsnap
