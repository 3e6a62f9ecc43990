// The proxy's workers, with a bound on the connections accepted and waiting for one.
//
// cpp-httplib 0.11.4's ThreadPool queues every accepted connection (an open socket each) without
// limit, so a crowd of idle or slow clients could take the process's file descriptors, which the
// store needs for its packs and catalog. httplib calls enqueue() from its accept loop: here that
// call waits while `max_waiting` jobs wait, so the loop stops accepting and new clients wait in
// the kernel's listen backlog instead.
//
// Promises:
//   - a job is never dropped (it owns its socket: 0.11.4 has no way to refuse one);
//   - at most `max_waiting` jobs wait for a worker (one more is held by the enqueue() waiting);
//   - stop_waiting() lets every enqueue() go on at once, from then on without the bound;
//   - shutdown() runs every job queued before it, then joins the workers (httplib calls it after
//     its accept loop; the destructor calls it too), then `on_deleted` runs, last.
#pragma once

#include <httplib.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsnap {

// What TaskQueue::enqueue returns: void in cpp-httplib 0.11.4 (Debian 12), bool in later releases
// (false: refused, and httplib closes the socket). This pool never refuses: it waits for room.
using TaskQueueEnqueueResult = decltype(std::declval<httplib::TaskQueue&>().enqueue(std::function<void()>()));

class BoundedPool : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t max_waiting, std::function<void()> on_deleted = nullptr);
  ~BoundedPool() override;

  TaskQueueEnqueueResult enqueue(std::function<void()> fn) override;
  void shutdown() override;
  void stop_waiting();

  size_t waiting() const;  // jobs queued, not yet taken by a worker

 private:
  void work();

  const size_t max_waiting_;
  const std::function<void()> on_deleted_;
  mutable std::mutex mu_;
  std::condition_variable work_, room_;
  std::deque<std::function<void()>> jobs_;
  bool stopped_ = false, unbounded_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvsnap
