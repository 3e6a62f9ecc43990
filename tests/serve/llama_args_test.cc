// serve/llama_args.h: what kvsnap reads from the llama-server command line and the child's argv.
#include "serve/llama_args.h"

#include <gtest/gtest.h>

#include "serve/serve.h"

namespace kvsnap {
namespace {

TEST(LlamaArgs, ReadsBothSpellingsShortAndLong) {
  auto a = parse_llama_args({"llama-server", "-m", "m.gguf", "--ctx-size=8192", "-np", "3", "-ctk", "q8_0",
                             "--cache-type-v=q4_0", "-fa", "off", "--api-key", "k1,k2", "-t", "2"});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->model, "m.gguf");
  EXPECT_EQ(a->ctx_size, 8192);
  EXPECT_EQ(a->parallel, 3);
  EXPECT_EQ(a->ctk, "q8_0");
  EXPECT_EQ(a->ctv, "q4_0");
  EXPECT_EQ(a->flash_attn, "off");
  EXPECT_EQ(a->api_key, "k1");  // the first of a comma-separated list
  a = parse_llama_args({"srv", "--model=x.gguf", "-c", "512", "--parallel=2", "--cache-type-k", "f16", "-ctv", "q8_0",
                        "--flash-attn=auto"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->model, "x.gguf");
  EXPECT_EQ(a->ctx_size, 512);
  EXPECT_EQ(a->parallel, 2);
  EXPECT_EQ(a->ctv, "q8_0");
  EXPECT_EQ(a->flash_attn, "auto");
}

TEST(LlamaArgs, DefaultsAndBareFlashAttn) {
  auto a = parse_llama_args({"llama-server", "-m", "m.gguf"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ctk, "f16");
  EXPECT_EQ(a->ctv, "f16");
  EXPECT_EQ(a->flash_attn, "auto");
  EXPECT_EQ(a->ctx_size, 0);
  EXPECT_TRUE(a->api_key.empty());
  a = parse_llama_args({"llama-server", "-fa", "-m", "m.gguf"});  // a bare -fa (older servers): on
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->flash_attn, "on");
  EXPECT_EQ(a->model, "m.gguf");
}

TEST(LlamaArgs, RefusesWhatKvsnapOwns) {
  for (std::vector<std::string> v : {std::vector<std::string>{"s", "--port", "9"}, {"s", "--port=9"},
                                     {"s", "--host", "0.0.0.0"}, {"s", "--slot-save-path", "/x"},
                                     {"s", "--slot-save-path=/x"}, {"s", "--no-slots"}}) {
    auto a = parse_llama_args(v);
    ASSERT_FALSE(a.ok()) << v[1];
    EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
    const std::string flag = v[1].substr(0, v[1].find('='));
    EXPECT_NE(a.status().message().find(flag), std::string::npos) << a.status().message();
  }
}

TEST(LlamaArgs, RefusesMissingValuesAndBadNumbers) {
  EXPECT_FALSE(parse_llama_args({}).ok());
  EXPECT_FALSE(parse_llama_args({"s", "-m"}).ok());
  EXPECT_FALSE(parse_llama_args({"s", "-c", "lots"}).ok());
  EXPECT_FALSE(parse_llama_args({"s", "--flash-attn=maybe"}).ok());
  auto a = parse_llama_args({"s", "-np", "2x"});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("-np '2x'"), std::string::npos) << a.status().message();
}

TEST(LlamaArgs, ChildArgvIsArgsPlusKvsnapsOwn) {
  auto a = parse_llama_args({"/opt/llama-server", "-m", "m.gguf", "-c", "4096"});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(child_argv(*a, 40123, "/store/serve/slots"),
            (std::vector<std::string>{"/opt/llama-server", "-m", "m.gguf", "-c", "4096", "--host", "127.0.0.1",
                                      "--port", "40123", "--slot-save-path", "/store/serve/slots/"}));
}

TEST(ServeListen, HostPort) {
  std::string h;
  int p = 0;
  ASSERT_TRUE(parse_listen("0.0.0.0:8081", h, p).ok());
  EXPECT_EQ(h, "0.0.0.0");
  EXPECT_EQ(p, 8081);
  ASSERT_TRUE(parse_listen(":9000", h, p).ok());
  EXPECT_EQ(h, "127.0.0.1");
  ASSERT_TRUE(parse_listen("[::1]:9000", h, p).ok());
  EXPECT_EQ(h, "::1");
  EXPECT_FALSE(parse_listen("8080", h, p).ok());
  EXPECT_FALSE(parse_listen("h:0", h, p).ok());
  EXPECT_FALSE(parse_listen("h:99999", h, p).ok());
}

}  // namespace
}  // namespace kvsnap
