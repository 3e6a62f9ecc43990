// An ordered pipeline: items produced on worker threads, consumed in order on
// the calling thread. Saving (encode chunks -> append them to a pack) and
// restoring (decode blocks -> write them) both have this shape.
//
// ordered_pipeline(n, threads, ring, produce, consume):
//  - produce(i, slot, worker) runs for every i in [0, n) on one of `threads`
//    persistent workers (worker in [0, threads): for per-thread state), which take the next item as soon as its slot is free: no worker
//    waits for a round of others to finish;
//  - consume(i, slot) runs on the calling thread in order of i, as soon as
//    item i is produced, so consuming overlaps producing;
//  - slot = i % ring: item i reuses the slot of item i - ring only after
//    consume(i - ring) returned, so memory is bounded by `ring` slots;
//  - the first failed status (produce's, in order of i, or consume's) stops
//    the pipeline and is returned once every worker has stopped; an exception
//    thrown by produce is rethrown on the calling thread;
//  - when the system refuses threads, the workers that did start do all the
//    work; with none, the calling thread produces and consumes each item.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"

namespace kvsnap {

template <class Produce, class Consume>
Status ordered_pipeline(uint64_t n, uint32_t threads, size_t ring, Produce&& produce, Consume&& consume) {
  ring = std::max<size_t>(ring, 1);
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  uint64_t next = 0, consumed = 0;
  std::vector<uint64_t> ready(ring, UINT64_MAX);  // the item each slot holds, once produced
  std::vector<Status> status(ring);
  std::exception_ptr thrown;
  auto work = [&](uint32_t worker) {
    for (;;) {
      uint64_t i;
      {
        std::unique_lock<std::mutex> g(mu);
        cv.wait(g, [&] { return stop || next >= n || next < consumed + ring; });
        if (stop || next >= n) return;
        i = next++;
      }
      const size_t slot = size_t(i % ring);
      Status s;
      try {
        s = produce(i, slot, worker);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu);
        if (!thrown) thrown = std::current_exception();
        s = Status::Interrupted("a pipeline worker failed");
      }
      {
        std::lock_guard<std::mutex> g(mu);
        status[slot] = std::move(s);
        ready[slot] = i;
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> workers;
  try {
    const uint32_t wanted = uint32_t(std::min<uint64_t>(std::max(threads, 1u), n));
    workers.reserve(wanted);
    for (uint32_t t = 0; t < wanted; ++t) workers.emplace_back(work, t);
  } catch (...) {
    // The system refused a thread (std::system_error, EAGAIN on a loaded or limited machine): the
    // workers already started take every item between them; an exception out of here would
    // destroy running threads (std::terminate) or cross the caller's module edge.
  }
  if (workers.empty()) {
    // Not one thread: the calling thread produces each item itself, in order.
    Status failed;
    for (uint64_t i = 0; i < n && failed.ok(); ++i) {
      const size_t slot = size_t(i % ring);
      failed = produce(i, slot, 0u);
      if (failed.ok()) failed = consume(i, slot);
    }
    return failed;
  }
  Status failed;
  for (uint64_t i = 0; i < n && failed.ok(); ++i) {
    const size_t slot = size_t(i % ring);
    {
      std::unique_lock<std::mutex> g(mu);
      cv.wait(g, [&] { return ready[slot] == i; });
    }
    failed = status[slot].ok() ? consume(i, slot) : status[slot];
    {
      // A failure stops the workers at once: advancing `consumed` past the failed item would let
      // them start one more item each before the stop below.
      std::lock_guard<std::mutex> g(mu);
      if (failed.ok()) consumed = i + 1;
      else stop = true;
    }
    cv.notify_all();
  }
  {
    std::lock_guard<std::mutex> g(mu);
    stop = true;
  }
  cv.notify_all();
  for (std::thread& w : workers) w.join();
  if (thrown) std::rethrow_exception(thrown);
  return failed;
}

}  // namespace kvsnap
