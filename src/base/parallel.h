// The one fork-join helper: kvsnap's parallel loops (chunk encoding, row
// conversion, restore copies, files of a directory migration) all run a
// fixed set of workers and wait for them.
#pragma once

#include <atomic>
#include <cstddef>
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
// worker gets a thread; returns when all are done. `work` must not throw
// (errors are Status values the caller collects per worker).
template <class Work>
void fork_join(size_t workers, Work&& work) {
  std::vector<std::thread> threads;
  if (workers > 1) threads.reserve(workers - 1);
  for (size_t w = 1; w < workers; ++w) threads.emplace_back([&work, w] { work(w); });
  if (workers > 0) work(size_t(0));
  for (auto& t : threads) t.join();
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
