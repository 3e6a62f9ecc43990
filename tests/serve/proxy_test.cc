// serve/proxy.h: a streamed exchange's on_done (the save kvsnap serve queues) runs before the client
// can see the stream's last event, so a client that sends its next request on seeing it finds the
// save queued; ends_a_stream tells that event from the others.
#include "serve/hangup.h"
#include "serve/proxy.h"
#include "serve/requests.h"
#include "http_serving.h"
#include "loopback.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kvsnap {
namespace {

TEST(ServeProxy, EndsAStreamSeesEachRoutesLastEvent) {
  // /completion (and /infill): the final event has "stop":true, the others "stop":false.
  EXPECT_FALSE(ends_a_stream("", "data: {\"content\":\"Hi\",\"stop\":false,\"id_slot\":0}\n\n"));
  EXPECT_TRUE(ends_a_stream("", "data: {\"content\":\"\",\"stop\":true,\"id_slot\":0,\"timings\":{}}\n\n"));
  // OpenAI routes: a choice with a finish_reason, then data: [DONE].
  EXPECT_FALSE(ends_a_stream("", "data: {\"choices\":[{\"finish_reason\":null,\"delta\":{\"content\":\"x\"}}]}\n\n"));
  EXPECT_TRUE(ends_a_stream("", "data: {\"choices\":[{\"finish_reason\":\"stop\",\"delta\":{}}]}\n\n"));
  EXPECT_TRUE(ends_a_stream("", "data: [DONE]\n\n"));
  EXPECT_TRUE(ends_a_stream("", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n"));
  // Anthropic's /v1/messages.
  EXPECT_FALSE(ends_a_stream("", "event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n"));
  EXPECT_TRUE(ends_a_stream("", "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
  // Generated text that spells a marker is inside a JSON string, its quotes escaped: not an end.
  EXPECT_FALSE(ends_a_stream("", R"(data: {"content":"\"stop\":true data: [DONE]","stop":false})"
                             "\n\n"));
  EXPECT_FALSE(ends_a_stream("", R"(data: {"choices":[{"finish_reason":null,"delta":{"content":"\"finish_reason\":\"x"}}]})"
                             "\n\n"));
}

// A marker cut between two chunks (a TCP read can end anywhere) is found across the seam, at every
// cut; one wholly in what came before is not found again with the next chunk; data: [DONE] counts
// only at a line's start, wherever that line began.
TEST(ServeProxy, EndsAStreamSeesALastEventCutBetweenChunks) {
  const std::string events[] = {"data: {\"content\":\"\",\"stop\":true,\"id_slot\":0}\n\n",
                                "data: {\"choices\":[{\"finish_reason\":\"stop\",\"delta\":{}}]}\n\n",
                                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                                "data: {\"type\":\"response.completed\"}\n\n",
                                "data: {\"choices\":[]}\n\ndata: [DONE]\n\n"};
  const std::string earlier = "data: {\"content\":\"Hi\",\"stop\":false}\n\n";
  for (const std::string& e : events) {
    for (size_t cut = 0; cut <= e.size(); ++cut) {
      const std::string before = earlier + e.substr(0, cut), chunk = e.substr(cut);
      // Found with the chunk that completes it; never twice.
      const bool seen_before = ends_a_stream(earlier, e.substr(0, cut));
      EXPECT_TRUE(seen_before || ends_a_stream(before, chunk)) << e << " cut at " << cut;
      EXPECT_FALSE(seen_before && ends_a_stream(before, chunk)) << e << " found twice, cut at " << cut;
    }
  }
  EXPECT_FALSE(ends_a_stream("data: {\"stop\":true}\n\n", "data: {\"content\":\"x\",\"stop\":false}\n\n"));
  // [DONE] not at a line's start, across the seam or not.
  EXPECT_FALSE(ends_a_stream("x", "data: [DONE]\n\n"));
  EXPECT_FALSE(ends_a_stream("xdata: [DO", "NE]\n\n"));
  EXPECT_TRUE(ends_a_stream("\ndata: [DO", "NE]\n\n"));
  EXPECT_TRUE(ends_a_stream("data: [D", "ONE]\n\n"));  // the stream's first bytes: a line's start
}

// A marker cut into three reads (a short read in its middle, so the middle read holds part of it
// and neither seam has the whole): found by the read that completes it, by no read before that one
// and by none after, at every pair of cuts.
TEST(ServeProxy, EndsAStreamSeesALastEventCutAcrossThreeReads) {
  const std::pair<std::string, std::string> events[] = {
      {"data: {\"content\":\"\",\"stop\":true,\"id_slot\":0}\n\n", R"("stop":true)"},
      {"data: {\"choices\":[{\"finish_reason\":\"stop\",\"delta\":{}}]}\n\n", R"("finish_reason":")"},
      {"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", R"("type":"message_stop")"},
      {"data: {\"type\":\"response.completed\"}\n\n", R"("type":"response.completed")"},
      {"data: {\"choices\":[]}\n\ndata: [DONE]\n\n", "data: [DONE]"}};
  const std::string earlier = "data: {\"content\":\"Hi\",\"stop\":false}\n\n";
  for (const auto& [e, marker] : events) {
    const size_t end = e.find(marker) + marker.size();  // the read holding this byte completes it
    ASSERT_NE(e.find(marker), std::string::npos) << marker;
    for (size_t i = 0; i <= e.size(); ++i) {
      for (size_t j = i; j <= e.size(); ++j) {
        const std::string reads[] = {e.substr(0, i), e.substr(i, j - i), e.substr(j)};
        std::string body = earlier;
        std::vector<int> found;
        for (int k = 0; k < 3; ++k) {
          if (ends_a_stream(body, reads[k])) found.push_back(k);
          body += reads[k];
        }
        const int completes = end <= i ? 0 : end <= j ? 1 : 2;
        EXPECT_EQ(found, std::vector<int>{completes}) << marker << " cut at " << i << " and " << j;
      }
    }
  }
}

using test::free_port;
using test::listen_on_loopback;
using test::send_raw;

// A proxy on a free loopback port in front of the child listening on `child_port`.
ProxyOptions in_front_of(int child_port, int threads) {
  ProxyOptions o;
  o.listen_port = free_port();
  o.upstream_port = child_port;
  o.threads = threads;
  return o;
}

// A proxy in front of a child, bound and serving on its own thread from construction until stop() or
// the end of its scope (a failed ASSERT included).
struct ServingProxy {
  Proxy proxy;
  bool bound = false;
  std::thread serving;
  ServingProxy(const ProxyOptions& o, std::function<void(const Exchange&)> on_done,
               std::function<void(const Exchange&)> on_given_up = nullptr)
      : proxy(o, nullptr, std::move(on_done)) {
    if (on_given_up) proxy.set_on_given_up(std::move(on_given_up));
    bound = proxy.bind().ok();
    if (bound) serving = std::thread([this] { proxy.run(); });
  }
  void stop() {
    proxy.stop();
    if (serving.joinable()) serving.join();
  }
  ~ServingProxy() { stop(); }
};

// A child (llama-server's stand-in) on a free loopback port, its routes set by `routes`, serving on
// its own thread until the end of its scope (a failed ASSERT included).
struct Child {
  httplib::Server svr;
  int port = 0;
  std::thread serving;
  explicit Child(const std::function<void(httplib::Server&)>& routes) {
    routes(svr);
    port = test::serve_on_free_port(svr, serving);
  }
  ~Child() { test::stop_serving(svr, serving); }
};

// What the client has seen so far (the child paces itself by it).
struct Seen {
  std::atomic<bool> first{false}, last{false};
};

// Waits until `flag` is set, at most `max`.
void wait_for(const std::atomic<bool>& flag, std::chrono::milliseconds max) {
  const auto until = std::chrono::steady_clock::now() + max;
  while (!flag && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

// A child that streams as llama-server's /completion does: three events, the last one (once the
// client has the first), then the stream's end once the client has the last event, or after 2 s
// (llama-server ends it microseconds after the last event: the window a client's next request races,
// held open here).
struct StreamingChild {
  httplib::Server svr;
  int port = 0;
  std::thread thread;
  explicit StreamingChild(Seen& seen) {
    svr.Get("/completion", [&seen](const httplib::Request&, httplib::Response& res) {
      auto step = std::make_shared<int>(0);
      res.set_chunked_content_provider("text/event-stream", [step, &seen](size_t, httplib::DataSink& sink) {
        const int i = (*step)++;
        if (i < 3) {
          const std::string e = "data: {\"content\":\"t" + std::to_string(i) + "\",\"stop\":false,\"id_slot\":0}\n\n";
          sink.write(e.data(), e.size());
        } else if (i == 3) {
          wait_for(seen.first, std::chrono::seconds(10));
          const std::string e = "data: {\"content\":\"\",\"stop\":true,\"id_slot\":0,\"timings\":{\"prompt_n\":4}}\n\n";
          sink.write(e.data(), e.size());
        } else {
          wait_for(seen.last, std::chrono::seconds(2));
          sink.done();
        }
        return true;
      });
    });
    port = test::serve_on_free_port(svr, thread);
  }
  ~StreamingChild() { test::stop_serving(svr, thread); }
};

TEST(ServeProxy, AStreamsOnDoneRunsBeforeTheClientSeesItsLastEvent) {
  Seen seen;
  StreamingChild child(seen);
  ASSERT_GT(child.port, 0);
  const ProxyOptions o = in_front_of(child.port, 4);
  std::atomic<int> done{0};
  std::string body_seen;
  ServingProxy proxy(o, [&](const Exchange& x) {
    body_seen = x.response_body;
    ++done;
  });
  ASSERT_TRUE(proxy.bound);
  int done_at_last_event = -1, done_at_first_event = -1;
  std::string got;
  {
    httplib::Client cli("127.0.0.1", o.listen_port);
    cli.set_read_timeout(30);
    auto r = cli.Get("/completion", [&](const char* d, size_t n) {
      got.append(d, n);
      if (done_at_first_event < 0 && got.find("\"t0\"") != std::string::npos) {
        done_at_first_event = done.load();
        seen.first = true;
      }
      // What a client that sends its next request on seeing the last event finds at that moment.
      if (done_at_last_event < 0 && got.find("\"stop\":true") != std::string::npos) {
        done_at_last_event = done.load();
        seen.last = true;
      }
      return true;
    });
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
  }
  proxy.stop();
  EXPECT_EQ(done_at_first_event, 0) << "the stream's events before the last are not held back";
  EXPECT_EQ(done_at_last_event, 1) << "on_done must have run when the client sees the stream's last event";
  EXPECT_EQ(done.load(), 1);
  EXPECT_NE(body_seen.find("\"stop\":true"), std::string::npos) << "on_done sees the last event (its slot, timings)";
  EXPECT_NE(got.find("\"t2\""), std::string::npos);
}

// A review's finding: a stream of several completions ("n" > 1) has a last event per completion;
// the first one's was held until the stream's end (up to 5 s), and every event after it with it.
// Such an exchange runs alone (its slot permit keeps the next completion out until on_done), so
// nothing of it is held.
TEST(ServeProxy, AStreamOfSeveralCompletionsIsNotHeldAtTheFirstOnesEnd) {
  Seen seen;
  std::atomic<bool> waited_out{false};
  Child child([&](httplib::Server& svr) {
    svr.Post("/completion", [&](const httplib::Request&, httplib::Response& res) {
      auto step = std::make_shared<int>(0);
      res.set_chunked_content_provider("text/event-stream", [step, &seen, &waited_out](size_t, httplib::DataSink& sink) {
        const int i = (*step)++;
        if (i == 0) {
          const std::string e = "data: {\"index\":0,\"content\":\"a\",\"stop\":true,\"id_slot\":0}\n\n";
          sink.write(e.data(), e.size());
        } else if (i == 1) {
          // the second completion goes on only once the client has seen the first one's end
          wait_for(seen.first, std::chrono::seconds(3));
          waited_out = !seen.first;
          const std::string e = "data: {\"index\":1,\"content\":\"b\",\"stop\":true,\"id_slot\":1}\n\n";
          sink.write(e.data(), e.size());
        } else {
          sink.done();
        }
        return true;
      });
    });
  });
  ASSERT_GT(child.port, 0);
  const ProxyOptions o = in_front_of(child.port, 4);
  std::atomic<int> done{0};
  {
    Proxy proxy(o, [](Forward& f) { f.several_slots = true; }, [&](const Exchange& x) {
      EXPECT_TRUE(x.several_slots);
      ++done;
    });
    ASSERT_TRUE(proxy.bind().ok());
    std::thread run([&] { proxy.run(); });
    std::string got;
    httplib::Client cli("127.0.0.1", o.listen_port);
    cli.set_read_timeout(30);
    httplib::Request req;
    req.method = "POST";
    req.path = "/completion";
    req.body = R"({"prompt":"x","n":2,"stream":true})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      got.append(d, n);
      if (got.find("\"index\":0") != std::string::npos) seen.first = true;
      return true;
    };
    auto r = cli.send(req);
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(got.find("\"index\":1"), std::string::npos);
    proxy.stop();
    run.join();
  }
  EXPECT_FALSE(waited_out.load()) << "the first completion's last event was held back";
  EXPECT_EQ(done.load(), 1);
}

// Reads a request's head (up to its blank line) from `c`.
void read_request_head(int c) {
  std::string req;
  char buf[4096];
  while (req.find("\r\n\r\n") == std::string::npos) {
    const ssize_t k = ::read(c, buf, sizeof buf);
    if (k <= 0) break;
    req.append(buf, size_t(k));
  }
}

// A child that answers one request with `head` and `body`, then closes the connection: an answer
// cut off where its Content-Length or its chunks say there is more (llama-server killed mid-answer).
struct DyingChild {
  int fd = -1, port = 0;
  std::thread thread;
  DyingChild(std::string head, std::string body) {
    fd = listen_on_loopback(&port);
    if (fd < 0) return;
    thread = std::thread([this, head = std::move(head), body = std::move(body)] {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) return;
      read_request_head(c);
      const std::string out = head + body;
      (void)!::write(c, out.data(), out.size());
      ::close(c);
    });
  }
  ~DyingChild() {
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    if (thread.joinable()) thread.join();
  }
};

// Cut off answers are errors for the client and are never saved (on_done): a sized one becomes a
// 502 (passed on, its body would have had a Content-Length of what came, and looked whole); a
// stream ends without its last chunk, which the client sees as a broken stream.
TEST(ServeProxy, AnAnswerCutOffByTheChildIsNeitherWholeNorSaved) {
  struct Case {
    const char* what;
    std::string head, body;
    bool streamed;
  };
  const std::vector<Case> cases = {
      {"sized", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
       R"({"content":"half an answ)", false},
      {"stream", "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
       "1c\r\ndata: {\"content\":\"t0\"}\n\n\r\n", true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    DyingChild child(c.head, c.body);
    ASSERT_GT(child.port, 0);
    const ProxyOptions o = in_front_of(child.port, 2);
    std::atomic<int> done{0};
    ServingProxy proxy(o, [&](const Exchange&) { ++done; });
    ASSERT_TRUE(proxy.bound);
    {
      httplib::Client cli("127.0.0.1", o.listen_port);
      cli.set_read_timeout(30);
      auto r = cli.Post("/completion", R"({"prompt":"a","stream":true})", "application/json");
      if (c.streamed) {
        EXPECT_FALSE(r) << "a cut-off stream reached the client as a whole one";
      } else {
        ASSERT_TRUE(r) << httplib::to_string(r.error());
        EXPECT_EQ(r->status, 502) << r->body;
        EXPECT_NE(r->body.find("cut off"), std::string::npos) << r->body;
      }
    }
    proxy.stop();
    EXPECT_EQ(done.load(), 0) << "a cut-off answer was handed on to be saved";
  }
}

// A child that streams 20 events 20 ms apart, as llama-server generates, and records whether its
// stream was read to the end (llama-server 3.22.1 generates to the end anyway for a request with an
// X-Conversation-Id, for a later GET /v1/stream; without one, a closed connection stops it).
struct PacedChild {
  httplib::Server svr;
  int port = 0;
  std::thread thread;
  std::atomic<bool> finished{false}, cut{false};
  explicit PacedChild(int events = 20) {
    svr.Get("/completion", [this, events](const httplib::Request&, httplib::Response& res) {
      auto step = std::make_shared<int>(0);
      res.set_chunked_content_provider("text/event-stream", [this, step, events](size_t, httplib::DataSink& sink) {
        const int i = (*step)++;
        if (i == events) {
          finished = true;
          sink.done();
          return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        const std::string e = i < events - 1 ? "data: {\"content\":\"t" + std::to_string(i) + "\",\"stop\":false,\"id_slot\":1}\n\n"
                                     : "data: {\"content\":\"\",\"stop\":true,\"id_slot\":1}\n\n";
        if (!sink.write(e.data(), e.size())) cut = true;
        return !cut;
      });
    });
    port = test::serve_on_free_port(svr, thread);
  }
  ~PacedChild() { test::stop_serving(svr, thread); }
};

// A client that hangs up on a stream sent with an X-Conversation-Id: the child goes on generating
// into the slot for a resume, so kvsnap reads its stream to the end and hands the exchange on (its
// save queued) as one that ended. Without the header the hang-up cancels the child's request and
// nothing is handed on, as before.
TEST(ServeProxy, AHangUpWithAConversationIdIsReadToTheEndAndSaved) {
  for (const bool with_id : {true, false}) {
    SCOPED_TRACE(with_id ? "X-Conversation-Id" : "no X-Conversation-Id");
    PacedChild child;
    ASSERT_GT(child.port, 0);
    const ProxyOptions o = in_front_of(child.port, 4);
    std::atomic<int> done{0};
    std::string body_seen;
    std::mutex mu;
    std::atomic<int> given_up{0};
    ServingProxy proxy(
        o,
        [&](const Exchange& x) {
          std::lock_guard<std::mutex> l(mu);
          body_seen = x.response_body;
          ++done;
        },
        [&](const Exchange& x) {
          EXPECT_EQ(x.path, "/completion");
          ++given_up;
        });
    ASSERT_TRUE(proxy.bound);
    {
      httplib::Client cli("127.0.0.1", o.listen_port);
      cli.set_read_timeout(30);
      httplib::Headers h;
      if (with_id) h.emplace("X-Conversation-Id", "conv-1");
      std::string got;
      auto r = cli.Get("/completion", h, [&](const char* d, size_t n) {
        got.append(d, n);
        return got.find("\"t0\"") == std::string::npos;  // hang up after the first event
      });
      EXPECT_FALSE(r) << "the client hung up";
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (with_id && done == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!with_id) std::this_thread::sleep_for(std::chrono::milliseconds(800));  // the child's whole stream
    proxy.stop();
    EXPECT_EQ(done.load(), with_id ? 1 : 0);
    EXPECT_EQ(given_up.load(), with_id ? 0 : 1) << "a hang-up not handed on is handed to on_given_up";
    EXPECT_EQ(child.finished.load(), with_id) << "the child's stream read to its end";
    std::lock_guard<std::mutex> l(mu);
    if (with_id) {
      EXPECT_NE(body_seen.find("\"stop\":true,\"id_slot\":1"), std::string::npos) << body_seen;
    }
  }
}

// kvsnap stopping (the second signal: Proxy::stop) while it reads a hung-up resumable stream to its
// end: it gives the stream up at once (nothing handed on) instead of waiting for the child.
TEST(ServeProxy, StopGivesUpAResumableStreamBeingReadToItsEnd) {
  PacedChild child(500);  // 10 s of events
  ASSERT_GT(child.port, 0);
  const ProxyOptions o = in_front_of(child.port, 4);
  std::atomic<int> done{0};
  ServingProxy proxy(o, [&](const Exchange&) { ++done; });
  ASSERT_TRUE(proxy.bound);
  {
    httplib::Client cli("127.0.0.1", o.listen_port);
    std::string got;
    auto r = cli.Get("/completion", httplib::Headers{{"X-Conversation-Id", "conv-2"}}, [&](const char* d, size_t n) {
      got.append(d, n);
      return got.find("\"t1\"") == std::string::npos;
    });
    EXPECT_FALSE(r);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the proxy notices the hang-up
  const auto t0 = std::chrono::steady_clock::now();
  proxy.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << "stop waited for the child's stream";
  EXPECT_EQ(done.load(), 0);
  EXPECT_FALSE(child.finished.load());
}

// A child that reads the request and answers it only after `hold` (or when destroyed): a long
// non-streamed completion. It watches its connection meanwhile: `cut` once the proxy closed it
// (llama-server then cancels the task), and then it answers nothing.
struct StallingChild {
  int fd = -1, port = 0;
  std::atomic<bool> got{false}, cut{false}, quit{false};
  std::thread thread;
  explicit StallingChild(std::chrono::milliseconds hold) {
    fd = listen_on_loopback(&port);
    if (fd < 0) return;
    thread = std::thread([this, hold] {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) return;
      read_request_head(c);
      got = true;
      const auto until = std::chrono::steady_clock::now() + hold;
      while (!quit && !cut && std::chrono::steady_clock::now() < until) {
        pollfd p{c, POLLIN, 0};
        char b[4096];  // the request's body, then the end of the connection
        if (::poll(&p, 1, 10) > 0 && ::recv(c, b, sizeof b, MSG_DONTWAIT) == 0) cut = true;
      }
      if (!cut) {
        const std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        (void)!::write(c, out.data(), out.size());
      }
      ::close(c);
    });
  }
  ~StallingChild() {
    quit = true;
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    if (thread.joinable()) thread.join();
  }
};

// A review's finding: a second SIGTERM (Proxy::stop while a request is in flight) did not cut a
// non-streamed completion: run() returned only when the child answered (up to its 3600 s timeout),
// and the client got the whole answer. Now the forwarded request is cut: a 502, nothing saved.
TEST(ServeProxy, StopCutsARequestTheChildHasNotAnswered) {
  StallingChild child(std::chrono::milliseconds(20000));
  ASSERT_GT(child.port, 0);
  const ProxyOptions o = in_front_of(child.port, 2);
  std::atomic<int> done{0};
  ServingProxy proxy(o, [&](const Exchange&) { ++done; });
  ASSERT_TRUE(proxy.bound);
  int status = 0;
  std::thread client([&] {
    httplib::Client cli("127.0.0.1", o.listen_port);
    cli.set_read_timeout(30);
    auto r = cli.Post("/completion", R"({"prompt":"a","n_predict":100000})", "application/json");
    status = r ? r->status : -1;
  });
  for (int i = 0; i < 500 && !child.got; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(child.got.load()) << "the request did not reach the child";
  const auto t0 = std::chrono::steady_clock::now();
  proxy.stop();
  client.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << "stop waited for the child's answer";
  EXPECT_NE(status, 200) << "the client got an answer the child never gave";
  EXPECT_EQ(done.load(), 0);
}

// llama-server cancels the completion of a client that hung up (its is_connection_closed, every
// second); through kvsnap the child's connection is kvsnap's, and a non-streamed completion went on
// to its end for nobody, its slot held. Now the hang-up cuts the child's connection, nothing is
// saved and the prompt goes to on_given_up. A client that stays gets its answer (the control), and
// one with an X-Conversation-Id is not cut (the child generates on for its resume).
TEST(ServeProxy, AClientThatHangsUpBeforeItsAnswerCutsTheChildsRequest) {
  struct Case {
    const char* name;
    bool hang_up, conversation_id;
  };
  for (const Case& c : {Case{"hangs up", true, false}, Case{"stays", false, false},
                        Case{"hangs up, X-Conversation-Id", true, true}}) {
    SCOPED_TRACE(c.name);
    StallingChild child(std::chrono::milliseconds(c.hang_up ? 20000 : 1500));
    ASSERT_GT(child.port, 0);
    const ProxyOptions o = in_front_of(child.port, 2);
    std::atomic<int> done{0}, given_up{0};
    ServingProxy proxy(o, [&](const Exchange&) { ++done; }, [&](const Exchange& x) {
      EXPECT_EQ(x.path, "/completion");
      ++given_up;
    });
    ASSERT_TRUE(proxy.bound);
    const std::string body = R"({"prompt":"a","n_predict":100000})";
    const int fd = send_raw(o.listen_port, std::string("POST /completion HTTP/1.1\r\nHost: x\r\n") +
                                               (c.conversation_id ? "X-Conversation-Id: conv-1\r\n" : "") +
                                               "Content-Type: application/json\r\nContent-Length: " +
                                               std::to_string(body.size()) + "\r\n\r\n" + body);
    ASSERT_GE(fd, 0);
    wait_for(child.got, std::chrono::seconds(5));
    ASSERT_TRUE(child.got.load()) << "the request did not reach the child";
    if (c.hang_up) {
      ::close(fd);
      const auto t0 = std::chrono::steady_clock::now();
      wait_for(child.cut, std::chrono::seconds(c.conversation_id ? 2 : 10));
      EXPECT_EQ(child.cut.load(), !c.conversation_id) << "the child's request cut";
      if (!c.conversation_id) {
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
        for (int i = 0; i < 500 && given_up == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_EQ(given_up.load(), 1);
      }
    } else {
      std::string got;
      char b[4096];
      ssize_t k;
      while (got.find("{}") == std::string::npos && (k = ::read(fd, b, sizeof b)) > 0) got.append(b, size_t(k));
      ::close(fd);
      EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
      EXPECT_FALSE(child.cut.load());
      for (int i = 0; i < 500 && done == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_EQ(done.load(), 1);
      EXPECT_EQ(given_up.load(), 0);
    }
    proxy.stop();
    if (c.hang_up && !c.conversation_id) {
      EXPECT_EQ(done.load(), 0) << "nothing saved";
    }
  }
}

// The socket lookup matches cpp-httplib's own view of a connection (its numeric addresses), and a
// closed peer is told from one that is quiet or has sent more.
TEST(ServeHangup, FindsTheSocketByItsEndsAndSeesItsPeerClose) {
  int port = 0;
  const int lfd = listen_on_loopback(&port);
  ASSERT_GE(lfd, 0);
  const int c = send_raw(port, "x");
  ASSERT_GE(c, 0);
  const int s = ::accept(lfd, nullptr, nullptr);
  ASSERT_GE(s, 0);
  sockaddr_in peer{};
  socklen_t n = sizeof peer;
  ASSERT_EQ(::getpeername(s, reinterpret_cast<sockaddr*>(&peer), &n), 0);
  const int peer_port = ntohs(peer.sin_port);
  EXPECT_EQ(find_tcp_socket("127.0.0.1", port, "127.0.0.1", peer_port), s);
  EXPECT_EQ(find_tcp_socket("127.0.0.1", port, "127.0.0.1", peer_port + 1), -1);
  EXPECT_EQ(find_tcp_socket("127.0.0.2", port, "127.0.0.1", peer_port), -1);
  // the client's own end (its local port is the peer port) is not the server's
  EXPECT_EQ(find_tcp_socket("127.0.0.1", peer_port, "127.0.0.1", port), c);
  EXPECT_FALSE(peer_closed(s)) << "a byte waits: the peer is there";
  ClientWatch watch("127.0.0.1", port, "127.0.0.1", peer_port);
  EXPECT_FALSE(watch.gone());
  ::close(c);
  for (int i = 0; i < 100 && !peer_closed(s); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(peer_closed(s)) << "the unread byte comes first: a peek finds it, not the end";
  char b;
  ASSERT_EQ(::read(s, &b, 1), 1);
  EXPECT_TRUE(peer_closed(s));
  EXPECT_TRUE(watch.gone());
  EXPECT_FALSE(ClientWatch("127.0.0.1", port, "127.0.0.1", 0).gone()) << "no socket: never gone";
  ::close(s);
  ::close(lfd);
}

// cpp-httplib percent-decodes header values: "%0d%0a" in one would end the header and smuggle a
// second request to the child (here a slot erase, past the proxy's own 403 for slot actions). The
// request is refused whole and the child sees nothing (a review's finding); a header without one
// passes as before.
TEST(ServeProxy, AHeaderThatDecodesToALineBreakIsRefusedAndNothingReachesTheChild) {
  std::mutex mu;
  std::vector<std::string> seen;
  Child child([&](httplib::Server& svr) {
    svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> g(mu);
      seen.push_back(req.method + " " + req.target);
      res.set_content("{}", "application/json");
      return httplib::Server::HandlerResponse::Handled;
    });
  });
  ASSERT_GT(child.port, 0);
  {
    const ProxyOptions o = in_front_of(child.port, 2);
    ServingProxy proxy(o, [](const Exchange&) {});
    ASSERT_TRUE(proxy.bound);
    httplib::Client cli("127.0.0.1", o.listen_port);
    cli.set_read_timeout(10);
    const httplib::Headers smuggling = {
        {"X-Note", "a%0d%0aHost: h%0d%0a%0d%0aPOST /slots/0?action=erase HTTP/1.1%0d%0aX-B: b"}};
    auto r = cli.Post("/x", smuggling, "{}", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("line break"), std::string::npos) << r->body;
    auto plain = cli.Post("/x", httplib::Headers{{"X-Note", "a b"}}, "{}", "application/json");
    ASSERT_TRUE(plain);
    EXPECT_EQ(plain->status, 200);
    proxy.stop();
  }
  std::lock_guard<std::mutex> g(mu);
  EXPECT_EQ(seen, std::vector<std::string>{"POST /x"}) << "only the plain request reaches the child";
}

// With the child's API keys, a request without one of them goes to the child as it came and runs
// none of kvsnap's work (the `before` hook: slot gate, waiting for saves, prefix lookup and restore);
// with one (Authorization: Bearer, or X-Api-Key as llama-server also reads it) the hook runs.
TEST(ServeProxy, ARequestWithoutTheChildsKeyRunsNoHookAndIsForwarded) {
  std::atomic<int> reached{0};
  Child child([&](httplib::Server& svr) {
    svr.set_pre_routing_handler([&](const httplib::Request&, httplib::Response& res) {
      ++reached;
      res.status = 401;  // the child's own answer
      res.set_content(R"({"error":{"code":401}})", "application/json");
      return httplib::Server::HandlerResponse::Handled;
    });
  });
  ASSERT_GT(child.port, 0);
  std::atomic<int> hooked{0};
  {
    ProxyOptions o = in_front_of(child.port, 2);
    o.api_keys = {"key-alice", "key-bob"};
    Proxy proxy(o, [&](Forward&) { ++hooked; }, [](const Exchange&) {});
    ASSERT_TRUE(proxy.bind().ok());
    std::thread run([&] { proxy.run(); });
    httplib::Client cli("127.0.0.1", o.listen_port);
    cli.set_read_timeout(10);
    const std::string body = R"({"prompt":"hello"})";
    for (const httplib::Headers& h : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer key-alic"}},
                                      httplib::Headers{{"Authorization", "Bearer key-alice2"}},
                                      httplib::Headers{{"X-Api-Key", "key-carol"}},
                                      // the key in a field the Connection field names: not forwarded
                                      httplib::Headers{{"Authorization", "Bearer key-alice"},
                                                       {"Connection", "Authorization"}}}) {
      auto r = cli.Post("/completion", h, body, "application/json");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 401) << "the child's answer, passed on";
    }
    EXPECT_EQ(hooked.load(), 0) << "a request without a valid key ran kvsnap's hook";
    EXPECT_EQ(reached.load(), 5);
    for (const httplib::Headers& h :
         {httplib::Headers{{"Authorization", "Bearer key-alice"}}, httplib::Headers{{"X-Api-Key", "key-bob"}},
          // the child reads X-Api-Key when the Authorization it would have read is not forwarded
          httplib::Headers{{"Authorization", "Bearer x"}, {"X-Api-Key", "key-bob"}, {"Connection", "Authorization"}}}) {
      ASSERT_TRUE(cli.Post("/completion", h, body, "application/json"));
    }
    EXPECT_EQ(hooked.load(), 3);
    proxy.stop();
    run.join();
  }
}

// A review's finding: the answer of a request without a key still went to on_done. A browser's CORS
// preflight (OPTIONS, which llama-server answers 200 with no key) on a completion route was then
// taken for a finished completion whose save filed other clients' unsaved slots as "unattributed".
// Only a keyed exchange is handed on.
TEST(ServeProxy, AnAnswerToARequestWithoutTheChildsKeyIsNotHandedOn) {
  Child child([&](httplib::Server& svr) {
    svr.Options("/completion", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    svr.Post("/completion", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"content":"x","id_slot":0})", "application/json");
    });
  });
  ASSERT_GT(child.port, 0);
  std::atomic<int> handed_on{0};
  std::vector<std::string> methods;
  std::mutex mu;
  {
    ProxyOptions o = in_front_of(child.port, 2);
    o.api_keys = {"key-alice"};
    Proxy proxy(o, [](Forward&) {}, [&](const Exchange& x) {
      std::lock_guard<std::mutex> l(mu);
      ++handed_on;
      methods.push_back(x.method);
    });
    ASSERT_TRUE(proxy.bind().ok());
    std::thread run([&] { proxy.run(); });
    httplib::Client cli("127.0.0.1", o.listen_port);
    cli.set_read_timeout(10);
    auto pre = cli.Options("/completion", {{"Origin", "http://example.test"}, {"Access-Control-Request-Method", "POST"}});
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 200) << "the child's answer, passed on";
    EXPECT_EQ(handed_on.load(), 0) << "a preflight without a key was handed on";
    auto r = cli.Post("/completion", {{"Authorization", "Bearer key-alice"}}, R"({"prompt":"hello"})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(handed_on.load(), 1);
    proxy.stop();
    run.join();
  }
  ASSERT_EQ(methods.size(), 1u);
  EXPECT_EQ(methods[0], "POST");
}

// A review's finding: cpp-httplib undoes a request body's Content-Encoding, and the child got the
// plain body with the field still saying gzip (a llama-server built with zlib then refused it, 400
// "Failed to decompress request body", where direct access worked). The field is not forwarded.
TEST(ServeProxy, AnEncodedRequestBodyReachesTheChildPlainWithoutItsEncodingField) {
  std::mutex mu;
  std::string seen_encoding = "(none)", seen_body;
  Child child([&](httplib::Server& svr) {
    svr.Post("/completion", [&](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> l(mu);
      if (req.has_header("Content-Encoding")) seen_encoding = req.get_header_value("Content-Encoding");
      seen_body = req.body;
      res.set_content(R"({"content":"x"})", "application/json");
    });
  });
  ASSERT_GT(child.port, 0);
  {
    ProxyOptions o = in_front_of(child.port, 2);
    Proxy proxy(o, [](Forward&) {}, [](const Exchange&) {});
    ASSERT_TRUE(proxy.bind().ok());
    std::thread run([&] { proxy.run(); });
    httplib::Client cli("127.0.0.1", o.listen_port);
    cli.set_read_timeout(10);
    cli.set_compress(true);  // gzip where cpp-httplib has zlib (Debian's has)
    const std::string body = R"({"prompt":")" + std::string(4000, 'a') + R"("})";
    auto r = cli.Post("/completion", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    proxy.stop();
    run.join();
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(seen_encoding, "(none)") << "the body arrives decoded, so no Content-Encoding may say otherwise";
    EXPECT_EQ(seen_body, body);
  }
}

// The process's open sockets, counted from /proc/self/fd (client and server ends alike).
int open_sockets() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code lec;
    if (std::filesystem::read_symlink(e.path(), lec).string().rfind("socket:", 0) == 0) n++;
  }
  return n;
}

// A crowd of clients that connect and say nothing: the proxy accepts `threads` + its waiting bound of
// them (each an open socket) and leaves the others in the kernel's backlog, so its file descriptors,
// which the store shares, stay bounded. Before the bound httplib's pool took every one (here 60 more
// sockets). Once they hang up, the proxy answers again.
TEST(ServeProxy, ACrowdOfSilentClientsTakesABoundedNumberOfSockets) {
  Child child([](httplib::Server& svr) {
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "application/json"); });
  });
  ASSERT_GT(child.port, 0);
  ProxyOptions o = in_front_of(child.port, 2);
  o.max_waiting_connections = 3;
  ServingProxy serving(o, [](const Exchange&) {});
  ASSERT_TRUE(serving.bound);
  const int before = open_sockets();
  constexpr int kClients = 60;
  std::vector<int> clients;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(o.listen_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < kClients; i++) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    clients.push_back(fd);
    (void)::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);  // EINPROGRESS past the backlog
  }
  // The accept loop takes what it will (the old pool took all 60 within milliseconds); then at
  // least the workers' two, however slow the machine.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (int i = 0; i < 100 && open_sockets() - before - kClients < 2; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int accepted = open_sockets() - before - kClients;
  // 2 workers' connections, 3 waiting, and the one the accept loop holds while it waits for room.
  EXPECT_LE(accepted, 2 + 3 + 1) << "the proxy accepted silent clients without a bound";
  EXPECT_GE(accepted, 2) << "the proxy took none of them";
  for (int fd : clients) ::close(fd);
  httplib::Client cli("127.0.0.1", o.listen_port);
  cli.set_connection_timeout(20);
  cli.set_read_timeout(20);
  auto r = cli.Get("/health");
  ASSERT_TRUE(r) << "no answer once the crowd had gone";
  EXPECT_EQ(r->status, 200);
  serving.stop();
}

// stop() ends run() while the accept loop waits for room (the worker and the waiting place taken by
// silent clients): the loop goes on, sees the closed socket, and the worker lets its client go after
// httplib's 5 s keep-alive wait (which would free room too: stop_waiting itself is
// BoundedPool.StopWaitingLetsTheWaitingEnqueueGoOn's). A pool whose workers quit at stop() and
// left the loop waiting would hang here (ctest's timeout).
TEST(ServeProxy, StopEndsRunWhileTheAcceptLoopWaitsForRoom) {
  ProxyOptions o = in_front_of(free_port(), 1);
  o.max_waiting_connections = 1;
  ServingProxy serving(o, [](const Exchange&) {});
  ASSERT_TRUE(serving.bound);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(o.listen_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> clients;
  for (int i = 0; i < 6; i++) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    clients.push_back(fd);
    (void)::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  serving.stop();  // joins run(); the silent clients' workers give up after the 5 s keep-alive wait
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << "stop() waited for room";
  for (int fd : clients) ::close(fd);
}

TEST(ServeProxy, ApiKeysAreReadAsLlamaServerReadsThem) {
  using H = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(request_api_key(H{{"authorization", "Bearer k1"}}), "k1");
  EXPECT_EQ(request_api_key(H{{"Authorization", "k1"}}), "k1");
  EXPECT_EQ(request_api_key(H{{"X-Api-Key", "Bearer k2"}}), "k2");
  EXPECT_EQ(request_api_key(H{{"Authorization", ""}, {"X-Api-Key", "k3"}}), "k3");
  EXPECT_EQ(request_api_key(H{}), "");
  const std::vector<std::string> keys = {"abc", "abcd"};
  EXPECT_TRUE(api_key_among(keys, "abc"));
  EXPECT_TRUE(api_key_among(keys, "abcd"));
  for (const char* no : {"", "ab", "abce", "abcde", "xbc"}) EXPECT_FALSE(api_key_among(keys, no)) << no;
  EXPECT_FALSE(api_key_among({}, ""));
}

// kvsnap's routes: with admin keys only those open them (the child's keys no longer); without, the
// child's keys; with neither, anyone.
TEST(ServeProxy, KvsnapsRoutesTakeTheAdminKeysAloneWhenThereAreAny) {
  using H = std::vector<std::pair<std::string, std::string>>;
  const std::vector<std::string> admin = {"root-key"}, child = {"tenant-key"}, none;
  const H as_admin = {{"Authorization", "Bearer root-key"}}, as_admin_x = {{"X-Api-Key", "root-key"}},
          as_tenant = {{"Authorization", "Bearer tenant-key"}}, nobody;
  EXPECT_TRUE(may_use_kvsnap_routes(admin, child, as_admin));
  EXPECT_TRUE(may_use_kvsnap_routes(admin, child, as_admin_x));
  EXPECT_FALSE(may_use_kvsnap_routes(admin, child, as_tenant)) << "a child's key opened an admin-keyed route";
  EXPECT_FALSE(may_use_kvsnap_routes(admin, child, nobody));
  EXPECT_FALSE(may_use_kvsnap_routes(admin, none, nobody)) << "admin keys and a keyless child: still closed";
  EXPECT_FALSE(may_use_kvsnap_routes(admin, none, H{{"Authorization", "Bearer root-ke"}}));
  EXPECT_TRUE(may_use_kvsnap_routes(none, child, as_tenant));
  EXPECT_FALSE(may_use_kvsnap_routes(none, child, as_admin));
  EXPECT_TRUE(may_use_kvsnap_routes(none, none, nobody));
  EXPECT_EQ(route_keys(admin, none), RouteKeys::kAdmin);
  EXPECT_EQ(route_keys(none, child), RouteKeys::kChild);
  EXPECT_EQ(route_keys(none, none), RouteKeys::kOpen);
}

// A request body over ProxyOptions::max_request_bytes, declared (Content-Length) or chunked, is
// answered 413 and never reaches the child; one at the bound is forwarded whole.
TEST(ServeProxy, ABodyOverTheBoundIsRefusedAndNeverForwarded) {
  std::mutex mu;
  std::vector<size_t> bodies;
  Child child([&](httplib::Server& svr) {
    svr.Post(".*", [&](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> g(mu);
      bodies.push_back(req.body.size());
      res.set_content("{}", "application/json");
    });
  });
  ASSERT_GT(child.port, 0);
  {
    ProxyOptions o = in_front_of(child.port, 2);
    o.max_request_bytes = 1000;
    ServingProxy proxy(o, [](const Exchange&) {});
    ASSERT_TRUE(proxy.bound);
    auto post = [&](size_t n, bool chunked) {
      httplib::Client cli("127.0.0.1", o.listen_port);  // a refused body closes its connection
      cli.set_read_timeout(10);
      if (!chunked) return cli.Post("/completion", std::string(n, 'x'), "application/json");
      return cli.Post("/completion", [n](size_t, httplib::DataSink& sink) {
        const std::string piece(100, 'y');
        for (size_t sent = 0; sent < n; sent += piece.size()) sink.write(piece.data(), std::min(piece.size(), n - sent));
        sink.done();
        return true;
      }, "application/json");
    };
    for (bool chunked : {false, true}) {
      // Up to twice the bound the proxy reads the rest and drops it, so the client gets the 413.
      auto big = post(1900, chunked);
      EXPECT_TRUE(big && big->status == 413) << (chunked ? "chunked: " : "sized: ") << (big ? big->body : "no answer");
      auto fits = post(1000, chunked);
      EXPECT_TRUE(fits && fits->status == 200) << (fits ? fits->body : "no answer");
    }
    (void)post(50000, true);  // past that the connection is closed under the client: no answer promised
    proxy.stop();
  }
  std::lock_guard<std::mutex> g(mu);
  EXPECT_EQ(bodies, (std::vector<size_t>{1000, 1000})) << "only the bodies at the bound reach the child";
}

// httplib parses a multipart/form-data body into parts and leaves the body empty: the proxy must
// still forward the bytes the client sent (llama-server's /v1/audio/transcriptions takes them).
TEST(ServeProxy, AMultipartBodyReachesTheChildWhole) {
  std::mutex mu;
  std::multimap<std::string, std::pair<std::string, std::string>> got;  // name -> filename, content
  std::string type;
  Child child([&](httplib::Server& svr) {
    svr.Post(".*", [&](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> g(mu);
      for (const auto& [name, f] : req.files) got.emplace(name, std::make_pair(f.filename, f.content));
      type = req.get_header_value("Content-Type");
      res.set_content("{}", "application/json");
    });
  });
  ASSERT_GT(child.port, 0);
  {
    const ProxyOptions o = in_front_of(child.port, 2);
    ServingProxy proxy(o, [](const Exchange&) {});
    ASSERT_TRUE(proxy.bound);
    httplib::Client cli("127.0.0.1", o.listen_port);
    std::string audio(3000, '\0');
    for (size_t i = 0; i < audio.size(); ++i) audio[i] = char(i * 7);
    const httplib::MultipartFormDataItems items = {{"file", audio, "a.wav", "audio/wav"},
                                                   {"model", "whisper", "", ""}};
    auto r = cli.Post("/v1/audio/transcriptions", items);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    // A client's own header of the name the proxy holds the type under is not taken for it.
    auto spoof = cli.Post("/x", httplib::Headers{{"X-Kvsnap-Held-Content-Type", "multipart/form-data; boundary=b"}},
                          "{}", "application/json");
    ASSERT_TRUE(spoof);
    proxy.stop();
  }
  std::lock_guard<std::mutex> g(mu);
  ASSERT_EQ(got.size(), 2u) << "the child got an empty body";
  std::string audio(3000, '\0');
  for (size_t i = 0; i < audio.size(); ++i) audio[i] = char(i * 7);
  EXPECT_EQ(got.find("file")->second, std::make_pair(std::string("a.wav"), audio));
  EXPECT_EQ(got.find("model")->second.second, "whisper");
  EXPECT_EQ(type, "application/json") << "the last request's own type";
}

// A streaming client that stops reading: the child's stream is held back once 8 MiB wait for the
// client (kMaxPending), as direct access would hold the child's send back, instead of piling up
// in kvsnap's memory. The child offers 128 MiB at once; while the client reads nothing, it gets far
// fewer of them out (the rest is socket buffers); a client that hangs up ends it.
TEST(ServeProxy, AStreamAClientDoesNotReadIsHeldBackNotPiledUp) {
  std::atomic<uint64_t> written{0};
  std::atomic<bool> stop{false};
  Child child([&](httplib::Server& svr) {
    svr.Get("/completion", [&](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/event-stream", [&](size_t, httplib::DataSink& sink) {
        const std::string piece(64 << 10, 'x');
        if (stop || written >= (uint64_t{128} << 20)) {
          sink.done();
          return true;
        }
        if (!sink.write(piece.data(), piece.size())) return false;
        written += piece.size();
        return true;
      });
    });
  });
  ASSERT_GT(child.port, 0);
  {
    const ProxyOptions o = in_front_of(child.port, 2);
    ServingProxy proxy(o, [](const Exchange&) {});
    ASSERT_TRUE(proxy.bound);
    const int fd = send_raw(o.listen_port, "GET /completion HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_GE(fd, 0);
    std::this_thread::sleep_for(std::chrono::seconds(2));  // reading nothing
    const uint64_t held = written;
    EXPECT_LT(held, uint64_t{64} << 20) << "the child's stream went on into kvsnap's memory";
    EXPECT_GT(held, 0u);
    ::close(fd);
    stop = true;
    proxy.stop();
  }
}

// A hook that throws while a stream is passed on (on_done, from httplib's writer) cuts that stream
// and nothing else: before, the exception left httplib's writer and ended the process.
TEST(ServeProxy, AHookThatThrowsDuringAStreamCutsItAndServingGoesOn) {
  Child child([&](httplib::Server& svr) {
    svr.Get("/completion", [](const httplib::Request&, httplib::Response& res) {
      auto step = std::make_shared<int>(0);
      res.set_chunked_content_provider("text/event-stream", [step](size_t, httplib::DataSink& sink) {
        if ((*step)++ == 0) {
          const std::string e = "data: {\"content\":\"\",\"stop\":true,\"id_slot\":0}\n\n";
          sink.write(e.data(), e.size());
        } else {
          sink.done();
        }
        return true;
      });
    });
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "application/json"); });
  });
  ASSERT_GT(child.port, 0);
  const ProxyOptions o = in_front_of(child.port, 2);
  ServingProxy proxy(o, [](const Exchange& x) {
    if (x.streamed) throw std::runtime_error("a hook failed");
  });
  ASSERT_TRUE(proxy.bound);
  httplib::Client cli("127.0.0.1", o.listen_port);
  cli.set_read_timeout(10);
  (void)cli.Get("/completion");  // cut: no promise about what the client saw
  auto after = cli.Get("/health");
  ASSERT_TRUE(after) << "kvsnap serve is gone";
  EXPECT_EQ(after->status, 200);
}

// A stop() before the serving thread has started listening (a signal as kvsnap serve starts):
// run() returns at once. httplib's own stop() does nothing while it is not listening, so before
// the fix run() then served for good and this test would hang; the second stop() below (by then
// listening) turns that into a failure instead.
TEST(ServeProxy, AStopBeforeRunMakesRunReturn) {
  const ProxyOptions o = in_front_of(free_port(), 2);
  Proxy proxy(o, nullptr, [](const Exchange&) {});
  ASSERT_TRUE(proxy.bind().ok());
  proxy.stop();
  std::atomic<bool> returned{false};
  std::thread serving([&] {
    proxy.run();
    returned = true;
  });
  for (int i = 0; i < 300 && !returned; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(returned.load()) << "run() went on serving after stop()";
  if (!returned) proxy.stop();
  serving.join();
}

}  // namespace
}  // namespace kvsnap
