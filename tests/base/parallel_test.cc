// base/parallel.h: every worker and every item runs exactly once.
#include "base/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
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

TEST(Parallel, DefaultThreadsIsTheHardwareThreadsAndAtLeastOne) {
  const unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ(default_threads(), hw > 0 ? hw : 1u);
}

}  // namespace
}  // namespace kvsnap
