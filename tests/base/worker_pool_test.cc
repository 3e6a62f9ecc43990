// base/worker_pool.h: every worker runs once per round, on threads kept across
// rounds, and an exception reaches the caller after every worker finished.
#include "base/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace kvsnap
