// A fork-join loop whose threads outlive one round. fork_join (base/parallel.h)
// starts its threads per call; a loop of many short rounds (the row conversion:
// a round per tensor and block) would pay each round for a new thread, its stack
// pages and whatever it builds thread-locally (the store's chunk decoder and blob
// buffer), all touched for the first time again. WorkerPool starts them once.
//
// run(n, work) runs work(w) for every w in [0, n), the caller as worker 0, and
// returns when all are done. Exceptions behave as in fork_join: kept per worker,
// every worker still finishes, the first (by worker number) rethrown on the
// caller. When the system refuses a thread, its workers run on the caller.
//
// OrderedHandOff lets the workers of one run() hand their blocks on in order
// themselves, each as soon as the block before it is handed on.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"

namespace kvsnap {

class WorkerPool {
 public:
  explicit WorkerPool(size_t workers) {
    failed_.resize(workers > 0 ? workers : 1);
    try {
      for (size_t w = 1; w < failed_.size(); ++w) threads_.emplace_back([this, w] { loop(w); });
    } catch (...) {
      // Fewer threads: run() gives the rest to the caller.
    }
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    go_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  size_t size() const { return failed_.size(); }

  // n <= size().
  void run(size_t n, const std::function<void(size_t)>& work) {
    if (n == 0) return;
    const size_t on_threads = std::min(n - 1, threads_.size());
    {
      std::lock_guard<std::mutex> l(mu_);
      work_ = &work;
      n_ = n;
      pending_ = on_threads;
      ++round_;
    }
    go_.notify_all();
    guarded(0);
    for (size_t w = on_threads + 1; w < n; ++w) guarded(w);
    {
      std::unique_lock<std::mutex> l(mu_);
      done_.wait(l, [&] { return pending_ == 0; });
      work_ = nullptr;
    }
    std::exception_ptr first;
    for (size_t w = 0; w < n; ++w) {
      if (!first) first = failed_[w];
      failed_[w] = nullptr;  // none is left for the next round
    }
    if (first) std::rethrow_exception(first);
  }

 private:
  void guarded(size_t w) noexcept {
    try {
      (*work_)(w);
    } catch (...) {
      failed_[w] = std::current_exception();
    }
  }

  // Thread w (1-based: the caller is worker 0) takes part in every round with n > w.
  void loop(size_t w) {
    size_t seen = 0;
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      go_.wait(l, [&] { return stopping_ || round_ != seen; });
      if (stopping_) return;
      seen = round_;
      if (w >= n_) continue;
      l.unlock();
      guarded(w);
      l.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::vector<std::exception_ptr> failed_;
  std::mutex mu_;
  std::condition_variable go_, done_;
  const std::function<void(size_t)>* work_ = nullptr;
  size_t n_ = 0, pending_ = 0, round_ = 0;
  bool stopping_ = false;
};

// Hands on, in order, blocks that several workers produce out of order: the
// worker holding block b waits only until block b - 1 has been handed on, then
// hands on its own while the others go on producing theirs. So a pool of
// workers converting blocks i, i + n, i + 2n... keeps every core busy, instead
// of all of them waiting while one thread hands on a round's blocks.
//
// The first failure (a block that failed to be produced, or a failed hand-on)
// stops every later block; a worker that throws must call abandon() so none
// waits for its block forever.
class OrderedHandOff {
 public:
  // Waits for block b's turn; then, if `produced` is OK and nothing failed
  // before, runs hand_on(). False: stop producing (this or an earlier block failed).
  template <class HandOn>
  bool hand_on(uint64_t b, const Status& produced, HandOn&& hand_on) {
    std::unique_lock<std::mutex> l(mu_);
    turn_.wait(l, [&] { return next_ == b || stopped(); });
    if (stopped()) return false;
    Status s = produced;
    if (s.ok()) {
      l.unlock();  // the next block's worker only waits for next_: this runs alone
      s = hand_on();
      l.lock();
    }
    if (s.ok()) ++next_;
    else error_ = std::move(s);
    turn_.notify_all();
    return error_.ok();
  }
  void abandon() {
    std::lock_guard<std::mutex> l(mu_);
    abandoned_ = true;
    turn_.notify_all();
  }
  // The first failure, or OK.
  Status status() const {
    std::lock_guard<std::mutex> l(mu_);
    return error_;
  }

 private:
  bool stopped() const { return !error_.ok() || abandoned_; }
  mutable std::mutex mu_;
  std::condition_variable turn_;
  uint64_t next_ = 0;
  Status error_;
  bool abandoned_ = false;
};

}  // namespace kvsnap
