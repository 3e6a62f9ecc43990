// An httplib::Server serving on a thread of its own in a test (a stand-in for llama-server or for
// a client's peer): bound before its thread starts (no port race), waited for until it listens, and
// stopped and joined at the end. Every wait is bounded: httplib's stop() does nothing before
// listen has started, and a server whose listen returned at once never runs, so an unbounded wait
// for either would hang the test program (idly: under qemu-user in CI, with no word of where).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <string>
#include <thread>

namespace kvsnap::test {

// Binds `svr` to a free port of `host` and serves it on `thread`; returns the port once it
// listens, or -1 (a failure added) when it cannot bind or does not listen within 30 s.
inline int serve_on_free_port(httplib::Server& svr, std::thread& thread, const std::string& host = "127.0.0.1") {
  const int port = svr.bind_to_any_port(host);
  if (port <= 0) {
    ADD_FAILURE() << "cannot bind a test server to a free port of " << host;
    return -1;
  }
  thread = std::thread([&svr] { svr.listen_after_bind(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!svr.is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the test server on port " << port << " did not listen within 30 s";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return port;
}

// Stops a server serve_on_free_port started (or one whose thread runs listen_after_bind) and
// joins its thread: first waits, at most 30 s, until it listens, since a stop() before that is
// lost and the thread would then serve for ever.
inline void stop_serving(httplib::Server& svr, std::thread& thread) {
  if (!thread.joinable()) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!svr.is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  svr.stop();
  thread.join();
}

}  // namespace kvsnap::test
