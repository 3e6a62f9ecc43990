#include "serve/bounded_pool.h"

#include <algorithm>

namespace kvsnap {

BoundedPool::BoundedPool(size_t threads, size_t max_waiting, std::function<void()> on_deleted)
    : max_waiting_(std::max<size_t>(max_waiting, 1)), on_deleted_(std::move(on_deleted)) {
  for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

BoundedPool::~BoundedPool() {
  shutdown();
  if (on_deleted_) on_deleted_();
}

namespace {

// "Taken" in either release's terms.
template <typename R>
R taken() {
  if constexpr (std::is_void_v<R>) return;
  else return true;
}

}  // namespace

TaskQueueEnqueueResult BoundedPool::enqueue(std::function<void()> fn) {
  {
    std::unique_lock<std::mutex> l(mu_);
    room_.wait(l, [&] { return jobs_.size() < max_waiting_ || unbounded_; });
    jobs_.push_back(std::move(fn));
  }
  work_.notify_one();
  return taken<TaskQueueEnqueueResult>();
}

void BoundedPool::shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopped_) return;
    stopped_ = unbounded_ = true;
  }
  room_.notify_all();
  work_.notify_all();
  for (auto& t : workers_) t.join();
}

void BoundedPool::stop_waiting() {
  {
    std::lock_guard<std::mutex> l(mu_);
    unbounded_ = true;
  }
  room_.notify_all();
}

size_t BoundedPool::waiting() const {
  std::lock_guard<std::mutex> l(mu_);
  return jobs_.size();
}

void BoundedPool::work() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> l(mu_);
      work_.wait(l, [&] { return !jobs_.empty() || stopped_; });
      if (jobs_.empty()) return;  // stopped, and every job queued before it run
      fn = std::move(jobs_.front());
      jobs_.pop_front();
    }
    room_.notify_one();
    fn();
  }
}

}  // namespace kvsnap
