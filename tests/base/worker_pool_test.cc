// base/worker_pool.h: every worker runs once per round, on threads kept across
// rounds, and an exception reaches the caller after every worker finished.
// OrderedHandOff: blocks produced out of order by the workers are handed on in
// order, and a failure stops every later block without a worker left waiting.
#include "base/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvsnap {
namespace {

TEST(WorkerPool, EachRoundRunsEachWorkerOnceAndNoOther) {
  WorkerPool pool(3);
  ASSERT_EQ(pool.size(), 3u);
  for (size_t n : {3u, 1u, 0u, 2u, 3u}) {
    std::vector<std::atomic<int>> ran(4);
    pool.run(n, [&](size_t w) { ran[w]++; });
    for (size_t w = 0; w < ran.size(); ++w) EXPECT_EQ(ran[w].load(), w < n ? 1 : 0) << n << " " << w;
  }
}

TEST(WorkerPool, WorkersKeepTheirThreadsAcrossRounds) {
  WorkerPool pool(2);
  std::set<std::thread::id> ids[2];
  for (int round = 0; round < 50; ++round) pool.run(2, [&](size_t w) { ids[w].insert(std::this_thread::get_id()); });
  EXPECT_EQ(ids[0], std::set<std::thread::id>{std::this_thread::get_id()}) << "worker 0 is the caller";
  EXPECT_EQ(ids[1].size(), 1u) << "one thread for worker 1 in every round";
}

TEST(WorkerPool, RethrowsTheFirstWorkersExceptionAfterAllFinish) {
  WorkerPool pool(3);
  std::atomic<int> finished{0};
  try {
    pool.run(3, [&](size_t w) {
      finished++;
      if (w >= 1) throw std::runtime_error("worker " + std::to_string(w));
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 1");
  }
  EXPECT_EQ(finished.load(), 3);
  std::atomic<int> again{0};
  pool.run(3, [&](size_t) { again++; });  // the pool still works
  EXPECT_EQ(again.load(), 3);
}

TEST(WorkerPool, ZeroWorkersMeansOne) {
  WorkerPool pool(0);
  EXPECT_EQ(pool.size(), 1u);
  int ran = 0;
  pool.run(1, [&](size_t) { ++ran; });
  EXPECT_EQ(ran, 1);
}

// Worker w produces blocks w, w + 4, ... with uneven delays; the hand-on sees 0, 1, 2, ...
TEST(OrderedHandOff, HandsOnInBlockOrder) {
  WorkerPool pool(4);
  OrderedHandOff order;
  std::vector<uint64_t> seen;
  constexpr uint64_t kBlocks = 103;
  pool.run(4, [&](size_t w) {
    for (uint64_t b = w; b < kBlocks; b += 4) {
      if ((b * 7) % 5 == 0) std::this_thread::yield();
      if (!order.hand_on(b, Status::OK(), [&] {
            seen.push_back(b);  // runs alone: no lock needed
            return Status::OK();
          }))
        return;
    }
  });
  ASSERT_TRUE(order.status().ok()) << order.status().ToString();
  ASSERT_EQ(seen.size(), kBlocks);
  for (uint64_t b = 0; b < kBlocks; ++b) EXPECT_EQ(seen[b], b);
}

// A block that fails (to be produced, or to be handed on) is the status; nothing after it is handed on.
TEST(OrderedHandOff, AFailureStopsEveryLaterBlock) {
  for (bool in_hand_on : {false, true}) {
    WorkerPool pool(3);
    OrderedHandOff order;
    std::mutex mu;
    std::vector<uint64_t> seen;
    pool.run(3, [&](size_t w) {
      for (uint64_t b = w; b < 60; b += 3) {
        const bool bad = b == 17;
        Status produced = bad && !in_hand_on ? Status::IOError("block 17 unreadable") : Status::OK();
        if (!order.hand_on(b, produced, [&] {
              if (bad) return Status::IOError("block 17 unwritable");
              std::lock_guard<std::mutex> l(mu);
              seen.push_back(b);
              return Status::OK();
            }))
          return;
      }
    });
    EXPECT_EQ(order.status().message(), in_hand_on ? "block 17 unwritable" : "block 17 unreadable");
    ASSERT_EQ(seen.size(), 17u) << in_hand_on;
    EXPECT_EQ(seen.back(), 16u);
  }
}

// A worker that throws abandons the hand-off: the others stop instead of waiting for its block.
TEST(OrderedHandOff, AnAbandonedHandOffReleasesTheOthers) {
  WorkerPool pool(2);
  OrderedHandOff order;
  std::atomic<int> handed{0};
  EXPECT_THROW(pool.run(2, [&](size_t w) {
                 try {
                   for (uint64_t b = w; b < 10; b += 2) {
                     if (b == 4) throw std::runtime_error("block 4");
                     if (!order.hand_on(b, Status::OK(), [&] {
                           handed++;
                           return Status::OK();
                         }))
                       return;
                   }
                 } catch (...) {
                   order.abandon();
                   throw;
                 }
               }),
               std::runtime_error);
  EXPECT_LE(handed.load(), 4);
}

}  // namespace
}  // namespace kvsnap
