// BoundedPool (src/serve/bounded_pool.h): the accept loop's enqueue waits at the bound, stop_waiting
// releases it, and shutdown runs every queued job.
#include "serve/bounded_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace kvsnap {
namespace {

using namespace std::chrono_literals;

// A job that holds its worker until `release` is set.
std::function<void()> held_job(const std::shared_future<void>& release, std::atomic<int>& ran) {
  return [release, &ran] {
    release.wait();
    ++ran;
  };
}

// One worker held by a job, `waiting` jobs queued behind it (the bound), and an "accept loop"
// thread enqueueing one more.
struct FullPool {
  std::promise<void> go;
  std::shared_future<void> release = go.get_future().share();
  bool released = false;
  std::atomic<int> ran{0};
  BoundedPool pool;
  std::atomic<bool> one_more_in{false};
  std::thread accept_loop;
  explicit FullPool(size_t waiting) : pool(1, waiting) {
    pool.enqueue(held_job(release, ran));  // taken by the worker
    for (int i = 0; i < 50 && pool.waiting() != 0; i++) std::this_thread::sleep_for(10ms);
    for (size_t i = 0; i < waiting; i++) pool.enqueue(held_job(release, ran));
    accept_loop = std::thread([this] {
      pool.enqueue(held_job(release, ran));
      one_more_in = true;
    });
  }
  void release_jobs() {
    if (!released) go.set_value();
    released = true;
  }
  ~FullPool() {
    release_jobs();
    if (accept_loop.joinable()) accept_loop.join();
  }
};

TEST(BoundedPool, EnqueueWaitsAtTheBoundUntilAWorkerTakesAJob) {
  FullPool full(2);
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(full.one_more_in.load()) << "enqueue went past the bound";
  EXPECT_EQ(full.pool.waiting(), 2u);
  full.release_jobs();  // the worker finishes and takes the next: room for one more
  full.accept_loop.join();
  EXPECT_TRUE(full.one_more_in.load());
  full.pool.shutdown();
  EXPECT_EQ(full.ran.load(), 4) << "every job ran";
}

TEST(BoundedPool, StopWaitingLetsTheWaitingEnqueueGoOn) {
  FullPool full(1);
  std::this_thread::sleep_for(100ms);
  ASSERT_FALSE(full.one_more_in.load()) << "enqueue went past the bound";
  full.pool.stop_waiting();  // the worker is still held: only stop_waiting can let it in
  for (int i = 0; i < 200 && !full.one_more_in; i++) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(full.one_more_in.load()) << "stop_waiting left enqueue waiting";
  full.release_jobs();
  full.accept_loop.join();
  full.pool.shutdown();
  EXPECT_EQ(full.ran.load(), 3);
}

TEST(BoundedPool, ShutdownRunsEveryQueuedJobThenTheDeletionHook) {
  std::atomic<int> ran{0};
  std::atomic<bool> deleted{false};
  int ran_when_deleted = -1;
  {
    BoundedPool pool(2, 64, [&] {
      ran_when_deleted = ran.load();
      deleted = true;
    });
    for (int i = 0; i < 40; i++)
      pool.enqueue([&ran] {
        std::this_thread::sleep_for(1ms);
        ++ran;
      });
  }
  EXPECT_TRUE(deleted.load());
  EXPECT_EQ(ran_when_deleted, 40) << "jobs were dropped at shutdown";
}

}  // namespace
}  // namespace kvsnap
