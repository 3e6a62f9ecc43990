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
#include <thread>

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

TEST(ServerUrl, SplitsOriginAndBasePath) {
  struct Case {
    const char* url;
    const char* origin;
    const char* base;
  };
  for (const Case& c : {Case{"http://127.0.0.1:8080", "http://127.0.0.1:8080", ""},
                        Case{"http://127.0.0.1:8080/", "http://127.0.0.1:8080", ""},
                        Case{"127.0.0.1:8080", "http://127.0.0.1:8080", ""},  // no scheme: http, as curl read it
                        Case{"HTTPS://llm.internal/team/llama//", "https://llm.internal", "/team/llama"},
                        Case{"http://[::1]:8080/x", "http://[::1]:8080", "/x"}}) {
    SCOPED_TRACE(c.url);
    auto u = split_server_url(c.url);
    ASSERT_TRUE(u.ok()) << u.status().ToString();
    EXPECT_EQ(u->origin, c.origin);
    EXPECT_EQ(u->base, c.base);
  }
  for (const char* bad : {"ftp://h:1", "http://", "http://user:pw@h:1", "http://h:1/x?y=1", "http://h:1/#top",
                          "http://h :1"}) {
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
      auth_ = req.get_header_value("Authorization");
      if (auth_ == "Bearer wrong") {
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
    port_ = server_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/llama/"; }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::string auth_;
};

TEST_F(ServerExchange, AsksUnderTheBasePathWithTheKey) {
  LlamaServer srv({url(), "secret", 10});
  EXPECT_TRUE(srv.health().ok());
  EXPECT_EQ(auth_, "Bearer secret");
  LlamaServer keyless({url(), "", 10});
  EXPECT_TRUE(keyless.health().ok());
  EXPECT_EQ(auth_, "");
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

TEST(ServerConnection, NoServerIsAnIoErrorThatSaysSo) {
  // A port nothing listens on: bound for a moment to learn a free one, then closed.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  close(fd);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  LlamaServer srv({url, "", 5});
  Status s = srv.health();
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_NE(s.message().find("is llama-server running at " + url + "?"), std::string::npos) << s.message();
  LlamaServer bad({"gopher://h:1", "", 5});
  EXPECT_EQ(bad.health().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kvsnap
