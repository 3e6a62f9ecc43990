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

}  // namespace
}  // namespace kvsnap
