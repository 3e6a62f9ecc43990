// The pure parsers of llama-server's replies (src/server/llama_server.h), the URL split, and the
// client's HTTP exchange against a real HTTP server (cpp-httplib's, on loopback).
#include "server/llama_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "http_serving.h"

namespace kvsnap {
namespace {

// /props build_info is "b<number>-<commit>" (common/build-info.cpp.in); a build
// compiled without git history says b0/b1, which is kept but not used.
TEST(ServerBuild, ABuildNumberFromPropsIsUsableWhenPlausible) {
  ServerBuild b = parse_server_build({{"build_info", "b10361-3f2a1bc"}, {"model_path", "/m.gguf"}});
  EXPECT_EQ(b.reported, "b10361-3f2a1bc");
  EXPECT_EQ(b.usable, "b10361");
  EXPECT_TRUE(b.why_not.empty());

  b = parse_server_build({{"build_info", "b1-1a2b3c4"}});  // node-llama-cpp's squashed source bundle
  EXPECT_EQ(b.reported, "b1-1a2b3c4");
  EXPECT_TRUE(b.usable.empty());
  EXPECT_NE(b.why_not.find("without git history"), std::string::npos) << b.why_not;

  b = parse_server_build({{"build_info", "unknown"}});
  EXPECT_TRUE(b.usable.empty());
  EXPECT_FALSE(b.why_not.empty());
}

TEST(ServerBuild, PropsWithoutBuildInfoOrOfTheWrongShapeSayNothing) {
  EXPECT_TRUE(parse_server_build({{"model_path", "/m.gguf"}}).reported.empty());  // b5640 has no build_info
  EXPECT_TRUE(parse_server_build({{"build_info", 12345}}).reported.empty());
  EXPECT_TRUE(parse_server_build(nlohmann::json::array()).reported.empty());
  ServerBuild b = parse_server_build({{"build_info", "b99999999999999999999-x"}});
  EXPECT_TRUE(b.usable.empty()) << "a number too long to be a build";
}

TEST(ServerUrl, SplitsSchemeHostPortAndBasePath) {
  struct Case {
    const char* url;
    const char* scheme;
    const char* host;
    int port;
    const char* base;
  };
  for (const Case& c : {Case{"http://127.0.0.1:8080", "http", "127.0.0.1", 8080, ""},
                        Case{"http://127.0.0.1:8080/", "http", "127.0.0.1", 8080, ""},
                        Case{"127.0.0.1:8080", "http", "127.0.0.1", 8080, ""},  // no scheme: http, as curl read it
                        Case{"HTTPS://llm-1.internal/team/llama//", "https", "llm-1.internal", 443, "/team/llama"},
                        Case{"http://localhost", "http", "localhost", 80, ""},
                        Case{"http://[::1]:8080/x", "http", "::1", 8080, "/x"},
                        Case{"http://[fd00::5]:65535", "http", "fd00::5", 65535, ""},
                        Case{"https://[2001:db8::1]", "https", "2001:db8::1", 443, ""},
                        Case{"http://h:/v1", "http", "h", 80, "/v1"},  // an empty port: the scheme's
                        Case{"https://[::1]:", "https", "::1", 443, ""}}) {
    SCOPED_TRACE(c.url);
    auto u = split_server_url(c.url);
    ASSERT_TRUE(u.ok()) << u.status().ToString();
    EXPECT_EQ(u->scheme, c.scheme);
    EXPECT_EQ(u->host, c.host);
    EXPECT_EQ(u->port, c.port);
    EXPECT_EQ(u->base, c.base);
  }
  for (const char* bad : {"ftp://h:1", "http://", "http://:8080", "http://user:pw@h:1", "http://h:1/x?y=1",
                          "http://h:1/#top", "http://h :1", "http://h:0", "http://[fe80::1%25eth0]:80", "https://[[fd00]:5", "http://[fd00]:5", "http://[localhost]:80", "http://a]b:1", "http://h\x01:80", "http://h:80/a\x7f", "http://h:65536",
                          "http://h:99999999999", "http://h:80x", "http://fd00::5:80", "http://[::1", "http://[::1]x",
                          "http://[]:80"}) {
    SCOPED_TRACE(bad);
    auto u = split_server_url(bad);
    ASSERT_FALSE(u.ok());
    EXPECT_EQ(u.status().code(), Code::kInvalidArgument);
    EXPECT_NE(u.status().message().find(std::string("llama-server URL '") + bad + "'"), std::string::npos);
  }
}

// A real HTTP server on loopback under a path prefix, as behind a reverse proxy.
class ServerExchange : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Get("/llama/health", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string auth = req.get_header_value("Authorization");
      {
        std::lock_guard lock(mu_);
        auth_ = auth;
        encoding_ = req.get_header_value("Accept-Encoding");
        host_header_ = req.get_header_value("Host");
      }
      if (auth == "Bearer wrong") {
        res.status = 401;
        res.set_content(R"({"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}})",
                        "application/json");
        return;
      }
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    server_.Get("/llama/props", [](const httplib::Request&, httplib::Response& res) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      res.set_content("{}", "application/json");
    });
    // Not llama-server: a JSON API that answers anything with {"ok": true}, one whose health is
    // 2 MiB long, one that drips its answer a byte every 100 ms (a review's findings).
    server_.Post("/other/slots/0", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"ok":true})", "application/json");
    });
    server_.Get("/big/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(size_t{2} << 20, ' ') + "{}", "application/json");
    });
    server_.Post("/drip/slots/0", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("application/json", [](size_t offset, httplib::DataSink& sink) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (offset >= 100) {
          sink.done();
          return true;
        }
        return sink.write(" ", 1);
      });
    });
    port_ = test::serve_on_free_port(server_, thread_, host_);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override { test::stop_serving(server_, thread_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/llama/"; }
  std::string auth() {
    std::lock_guard lock(mu_);
    return auth_;
  }

  std::string host_ = "127.0.0.1";
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::string auth_, encoding_, host_header_;
};

TEST_F(ServerExchange, AsksUnderTheBasePathWithTheKey) {
  LlamaServer srv({url(), "secret", 10});
  EXPECT_TRUE(srv.health().ok());
  EXPECT_EQ(auth(), "Bearer secret");
  LlamaServer keyless({url(), "", 10});
  EXPECT_TRUE(keyless.health().ok());
  EXPECT_EQ(auth(), "");
  std::lock_guard lock(mu_);
  EXPECT_EQ(encoding_, "identity") << "an uncompressed answer asked for";
  EXPECT_EQ(host_header_, "127.0.0.1:" + std::to_string(port_));
}

// An IPv6 literal with hex digits (cpp-httplib 0.11.4's own URL parsing took digits-only ones and
// looked the whole URL up as a host name): the IPv4 server through its v4-mapped address.
TEST_F(ServerExchange, AnIpv6LiteralWithLettersIsAsked) {
  const std::string url = "http://[::ffff:127.0.0.1]:" + std::to_string(port_) + "/llama";
  LlamaServer srv({url, "mapped", 10});
  Status s = srv.health();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(auth(), "Bearer mapped");
  std::lock_guard lock(mu_);
  EXPECT_EQ(host_header_, "[::ffff:127.0.0.1]:" + std::to_string(port_)) << "bracketed, with its port";
}

TEST_F(ServerExchange, HttpsIsAStatusNeverAThrow) {
  // Nothing speaks TLS there: a Status either way (no TLS in this build, or no handshake).
  LlamaServer srv({"https://127.0.0.1:" + std::to_string(port_), "", 5});
  Status s = srv.health();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == Code::kIOError || s.code() == Code::kNotSupported) << s.ToString();
}

TEST_F(ServerExchange, AWrongKeyIsNamed) {
  LlamaServer srv({url(), "wrong", 10});
  Status s = srv.health();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("HTTP 401"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--api-key"), std::string::npos) << s.message();
}

TEST_F(ServerExchange, ASlowAnswerPastTheTimeoutIsAnIoError) {
  LlamaServer srv({url(), "", 0.3});
  auto props = srv.props();
  ASSERT_FALSE(props.ok());
  EXPECT_EQ(props.status().code(), Code::kIOError);
  EXPECT_NE(props.status().message().find("reading /props: no complete answer"), std::string::npos)
      << props.status().message();
}

// A reply without n_restored / n_read restored nothing, whatever its status (it was "0 tokens", exit 0).
TEST_F(ServerExchange, AReplyThatIsNotASlotActionsIsRefused) {
  const std::string base = "http://127.0.0.1:" + std::to_string(port_);
  LlamaServer other({base + "/other", "", 10});
  auto r = other.restore_slot(0, "x.bin");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kMismatch) << r.status().ToString();
  EXPECT_NE(r.status().message().find("n_restored"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(other.save_slot(0, "x.bin").status().code(), Code::kMismatch);
}

// A reply too large for any llama-server answer, or dripped past its time, is given up; so is one
// the caller says to stop (Ctrl-C).
TEST_F(ServerExchange, AHugeOrDrippingReplyIsGivenUp) {
  const std::string base = "http://127.0.0.1:" + std::to_string(port_);
  LlamaServer big({base + "/big", "", 10});
  Status s = big.health();
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("the reply is larger than 1 MiB"), std::string::npos) << s.ToString();
  ServerEndpoint drip{base + "/drip", "", 10};
  drip.body_timeout_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = LlamaServer(drip).restore_slot(0, "x.bin");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIOError) << r.status().ToString();
  EXPECT_NE(r.status().message().find("did not arrive whole within 1 s"), std::string::npos) << r.status().ToString();
  ServerEndpoint stop{base + "/drip", "", 10};
  stop.stopped = [] { return true; };
  EXPECT_EQ(LlamaServer(stop).restore_slot(0, "x.bin").status().code(), Code::kInterrupted);
}

TEST(ServerConnection, NoServerIsAnIoErrorThatSaysSo) {
  // A port bound here but not listening (kept until the end, so nothing else takes it): refused.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  LlamaServer srv({url, "", 5});
  Status s = srv.health();
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("is llama-server running at " + url + "?"), std::string::npos) << s.message();
  LlamaServer bad({"gopher://h:1", "", 5});
  EXPECT_EQ(bad.health().code(), Code::kInvalidArgument);
  close(fd);
}

// An IPv6 literal reaches the server (the library's own URL parsing takes digits-only ones).
class ServerExchangeV6 : public ServerExchange {
 protected:
  void SetUp() override {
    const int fd = socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    const bool v6 = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) close(fd);
    if (!v6) GTEST_SKIP() << "no IPv6 loopback on this machine";
    host_ = "::1";
    ServerExchange::SetUp();
  }
};

TEST_F(ServerExchangeV6, ABracketedAddressIsAsked) {
  LlamaServer srv({"http://[::1]:" + std::to_string(port_) + "/llama", "k6", 10});
  Status s = srv.health();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(auth(), "Bearer k6");
  std::lock_guard lock(mu_);
  EXPECT_EQ(host_header_, "[::1]:" + std::to_string(port_));
}

}  // namespace
}  // namespace kvsnap
