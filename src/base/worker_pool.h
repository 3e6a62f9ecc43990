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
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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

}  // namespace kvsnap
