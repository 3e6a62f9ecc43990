// The one fork-join helper: kvsnap's parallel loops (chunk encoding, row
// conversion, restore copies, files of a directory migration) all run a
// fixed set of workers and wait for them.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace kvsnap {

// Threads for a parallel loop when the user gives none: one per hardware
// thread, at least one (hardware_concurrency() may say 0 when it cannot tell).
inline unsigned default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? n : 1u;
}

// Runs work(w) for every w in [0, workers): the caller runs w = 0, each other
// worker gets a thread (or, when the system refuses a thread, runs on the
// caller); returns when all are done. Errors are Status values the caller
// collects per worker; `work` throws only what any allocation may
// (std::bad_alloc). Such an exception never leaves a worker's thread (where it
// would call std::terminate): it is kept, every worker still runs and is
// joined, and the first one (by worker number) is rethrown here, on the
// caller's thread, to reach the process or C API edge like any other failed
// allocation (kvsnap's exit 70, the C API's error return).
template <class Work>
void fork_join(size_t workers, Work&& work) {
  std::vector<std::exception_ptr> failed(workers);
  auto guarded = [&work, &failed](size_t w) noexcept {
    try {
      work(w);
    } catch (...) {
      failed[w] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  size_t started = 1;
  try {
    if (workers > 1) threads.reserve(workers - 1);
    for (; started < workers; ++started) threads.emplace_back(guarded, started);
  } catch (...) {
    // No more threads: the workers not started run below, on this thread.
  }
  if (workers > 0) guarded(0);
  for (size_t w = started; w < workers; ++w) guarded(w);
  for (auto& t : threads) t.join();
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

// Hands each item of [0, count) to one of min(threads, count) workers, in
// order of asking: item(i, w) runs item i on worker w.
template <class Item>
void parallel_for(size_t count, size_t threads, Item&& item) {
  std::atomic<size_t> next{0};
  const size_t workers = count < threads ? count : threads;
  fork_join(workers == 0 && count ? 1 : workers, [&](size_t w) {
    for (size_t i; (i = next.fetch_add(1)) < count;) item(i, w);
  });
}

}  // namespace kvsnap
