// base/parallel.h: every worker and every item runs exactly once.
#include "base/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kvsnap {
namespace {

TEST(Parallel, ForkJoinRunsEachWorkerOnce) {
  for (size_t workers : {0u, 1u, 2u, 7u}) {
    std::vector<std::atomic<int>> ran(8);
    fork_join(workers, [&](size_t w) { ran[w]++; });
    for (size_t w = 0; w < ran.size(); ++w) EXPECT_EQ(ran[w].load(), w < workers ? 1 : 0) << workers << " " << w;
  }
}

TEST(Parallel, ParallelForRunsEachItemOnceOnAValidWorker) {
  for (size_t threads : {1u, 3u, 16u}) {
    for (size_t count : {0u, 1u, 5u, 100u}) {
      std::vector<std::atomic<int>> ran(count);
      std::atomic<bool> bad_worker{false};
      parallel_for(count, threads, [&](size_t i, size_t w) {
        ran[i]++;
        if (w >= threads || w >= count) bad_worker = true;
      });
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(ran[i].load(), 1) << threads << " " << count << " " << i;
      EXPECT_FALSE(bad_worker);
    }
  }
}

// A worker that runs out of memory must not std::terminate the process from its thread: the
// exception comes back on the caller's thread once every worker ran and was joined, so it reaches
// main's handler (exit 70) or the C API's (an error return), as a failed allocation anywhere does.
TEST(Parallel, ForkJoinRethrowsAWorkersBadAllocOnTheCallerAfterJoiningAll) {
  for (size_t thrower : {0u, 2u, 4u}) {
    std::vector<std::atomic<int>> ran(5);
    EXPECT_THROW(fork_join(5,
                           [&](size_t w) {
                             ran[w]++;
                             if (w == thrower) throw std::bad_alloc();
                           }),
                 std::bad_alloc)
        << thrower;
    for (size_t w = 0; w < ran.size(); ++w) EXPECT_EQ(ran[w].load(), 1) << thrower << " " << w;
  }
}

TEST(Parallel, ForkJoinRethrowsTheFirstWorkersException) {
  try {
    fork_join(3, [](size_t w) {
      if (w >= 1) throw std::runtime_error("worker " + std::to_string(w));
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 1");
  }
}

TEST(Parallel, ParallelForRethrowsAnItemsBadAlloc) {
  std::atomic<int> items{0};
  EXPECT_THROW(parallel_for(50, 4,
                            [&](size_t i, size_t) {
                              items++;
                              if (i == 7) throw std::bad_alloc();
                            }),
               std::bad_alloc);
  EXPECT_EQ(items.load(), 50);  // the other workers finish every item
}

TEST(Parallel, DefaultThreadsIsTheHardwareThreadsAndAtLeastOne) {
  const unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ(default_threads(), hw > 0 ? hw : 1u);
}

}  // namespace
}  // namespace kvsnap
