// ordered_pipeline (format/snapshot_pipeline.h): what save and restore rely on.
#include "format/snapshot_pipeline.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

namespace kvsnap {
namespace {

// Makes workers finish out of order so that ordering is really tested.
void jitter(uint64_t i) { std::this_thread::sleep_for(std::chrono::microseconds((i * 7919) % 300)); }

TEST(OrderedPipeline, ConsumesEveryItemOnceInOrderWithBoundedSlots) {
  for (uint32_t threads : {1u, 2u, 4u}) {
    for (size_t ring : {1u, 2u, 3u, 8u}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, ring " + std::to_string(ring));
      const uint64_t n = 200;
      std::vector<uint64_t> slot_item(ring, UINT64_MAX);
      std::vector<uint64_t> seen;
      std::atomic<int> in_flight{0}, max_in_flight{0}, bad_worker{0};
      Status s = ordered_pipeline(
          n, threads, ring,
          [&](uint64_t i, size_t slot, uint32_t worker) {
            if (worker >= threads) ++bad_worker;
            const int f = ++in_flight;
            for (int m = max_in_flight; f > m && !max_in_flight.compare_exchange_weak(m, f);) {
            }
            jitter(i);
            slot_item[slot] = i;  // the slot is this item's alone until consumed
            return Status::OK();
          },
          [&](uint64_t i, size_t slot) {
            EXPECT_EQ(slot, i % ring);
            EXPECT_EQ(slot_item[slot], i);
            seen.push_back(i);
            --in_flight;
            return Status::OK();
          });
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(seen.size(), n);
      for (uint64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], i);
      EXPECT_LE(max_in_flight.load(), int(ring));
      EXPECT_EQ(bad_worker.load(), 0);
    }
  }
}

// In a child process that may not create threads (RLIMIT_NPROC below what its user runs; root
// ignores the limit, so the child becomes `nobody` first): the pipeline still produces and
// consumes every item in order and returns, instead of std::terminate from a std::system_error.
// Exit codes: 0 right, 2 could not set up the limit, 3 threads were still allowed, 1 wrong.
int pipeline_under_nproc(rlim_t nproc) {
  if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) return 2;
  const rlimit limit{nproc, nproc};
  if (setrlimit(RLIMIT_NPROC, &limit) != 0) return 2;
  if (nproc == 0) {
    try {
      std::thread probe([] {});
      probe.join();
      return 3;
    } catch (const std::system_error&) {
    }
  }
  std::vector<uint64_t> seen;
  Status s = ordered_pipeline(
      50, 4, 3,
      [&](uint64_t, size_t, uint32_t worker) { return worker == 0 ? Status::OK() : Status::Corruption("worker"); },
      [&](uint64_t i, size_t slot) {
        if (slot != i % 3) return Status::Corruption("slot");
        seen.push_back(i);
        return Status::OK();
      });
  bool right = s.ok() && seen.size() == 50;
  for (uint64_t i = 0; right && i < seen.size(); ++i) right = seen[i] == i;
  return right ? 0 : 1;
}

TEST(OrderedPipeline, EveryItemInOrderWhenTheSystemRefusesThreads) {
  // No thread at all; then one (the child is its user's one process, so a limit of 2 lets one
  // thread start and refuses the next three while the first runs).
  EXPECT_EXIT(_exit(pipeline_under_nproc(0)), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(_exit(pipeline_under_nproc(2)), ::testing::ExitedWithCode(0), "");
}

TEST(OrderedPipeline, NothingToDo) {
  int calls = 0;
  Status s = ordered_pipeline(
      0, 2, 4, [&](uint64_t, size_t, uint32_t) { return ++calls, Status::OK(); },
      [&](uint64_t, size_t) { return ++calls, Status::OK(); });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 0);
}

TEST(OrderedPipeline, AFailedItemStopsEverythingAndIsReturned) {
  for (uint32_t threads : {1u, 3u}) {
    std::atomic<uint64_t> produced{0};
    uint64_t consumed = 0;
    Status s = ordered_pipeline(
        1000, threads, 4,
        [&](uint64_t i, size_t, uint32_t) {
          ++produced;
          jitter(i);
          return i == 37 ? Status::Corruption("item 37 is damaged") : Status::OK();
        },
        [&](uint64_t i, size_t) {
          EXPECT_LT(i, 37u);
          ++consumed;
          return Status::OK();
        });
    EXPECT_EQ(s.code(), Code::kCorruption);
    EXPECT_EQ(s.message(), "item 37 is damaged");
    EXPECT_EQ(consumed, 37u);
    EXPECT_LE(produced.load(), 37u + 4u) << "workers go on after the failure";
  }
}

TEST(OrderedPipeline, AFailedConsumeStopsTheWorkers) {
  std::atomic<uint64_t> produced{0};
  uint64_t consumed = 0;
  Status s = ordered_pipeline(
      1000, 2, 3, [&](uint64_t, size_t, uint32_t) { return ++produced, Status::OK(); },
      [&](uint64_t i, size_t) {
        ++consumed;
        return i == 10 ? Status::IOError("disk full") : Status::OK();
      });
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_EQ(consumed, 11u);
  EXPECT_LE(produced.load(), 11u + 3u);
}

TEST(OrderedPipeline, AnExceptionOfAWorkerReachesTheCaller) {
  auto run = [] {
    return ordered_pipeline(
        50, 2, 2,
        [](uint64_t i, size_t, uint32_t) -> Status {
          if (i == 5) throw std::runtime_error("worker threw");
          return Status::OK();
        },
        [](uint64_t, size_t) { return Status::OK(); });
  };
  EXPECT_THROW((void)run(), std::runtime_error);
}

}  // namespace
}  // namespace kvsnap
