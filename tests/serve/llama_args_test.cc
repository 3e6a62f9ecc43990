// serve/llama_args.h: what kvsnap reads from the llama-server command line and the child's argv.
#include "serve/llama_args.h"

#include <gtest/gtest.h>

#include <map>

#include "serve/ladder.h"
#include "serve/serve.h"

namespace kvsnap {
namespace {

// An environment and files of the test's own, read through maps it can change between parses.
ArgsEnvironment fake_environment(const std::map<std::string, std::string>& vars,
                                 const std::map<std::string, std::string>& files) {
  auto find = [](const std::map<std::string, std::string>& m, const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    return it == m.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  ArgsEnvironment env;
  env.getenv = [&vars, find](const std::string& n) { return find(vars, n); };
  env.read_file = [&files, find](const std::string& p) { return find(files, p); };
  return env;
}

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

// -fa in every spelling llama-server reads (common_arg_utils::is_truthy, is_falsey, is_autoy):
// "-fa 0" is off, not a bare -fa followed by a stray word; a requantize replaces the value too.
TEST(LlamaArgs, FlashAttentionInEverySpellingOfLlamaServer) {
  for (const auto& [word, want] : std::vector<std::pair<std::string, std::string>>{
           {"on", "on"}, {"enabled", "on"}, {"true", "on"}, {"1", "on"}, {"off", "off"}, {"disabled", "off"},
           {"false", "off"}, {"0", "off"}, {"auto", "auto"}, {"-1", "auto"}}) {
    for (bool inline_value : {false, true}) {
      std::vector<std::string> argv = {"srv", "-m", "m.gguf"};
      if (inline_value) argv.push_back("--flash-attn=" + word);
      else argv.insert(argv.end(), {"-fa", word});
      argv.insert(argv.end(), {"-t", "2"});
      auto a = parse_llama_args(argv);
      ASSERT_TRUE(a.ok()) << word << ": " << a.status().ToString();
      EXPECT_EQ(a->flash_attn, want) << word;
      auto b = with_cache(*a, "q8_0", "q8_0", "on", 0);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      EXPECT_EQ(b->argv, (std::vector<std::string>{"srv", "-m", "m.gguf", "-t", "2", "-ctk", "q8_0", "-ctv", "q8_0",
                                                   "-fa", "on"}))
          << word;
    }
  }
  auto bad = parse_llama_args({"srv", "--flash-attn=yes"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'yes'"), std::string::npos) << bad.status().message();
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

// llama-server 3.22.1 (common/arg.cpp): the environment first (LLAMA_API_KEY, then LLAMA_ARG_API_KEY_FILE),
// then the command line in order; every key kept; a key file's empty and '#' lines skipped.
TEST(LlamaArgs, ApiKeysFromEnvironmentFilesAndFlags) {
  std::map<std::string, std::string> vars = {{"LLAMA_API_KEY", "e1,\"e,2\""}, {"LLAMA_ARG_API_KEY_FILE", "/env.keys"}};
  std::map<std::string, std::string> files = {{"/env.keys", "f1\n# comment\n\nf2\n"}, {"/cli.keys", "c1\n"}};
  const ArgsEnvironment env = fake_environment(vars, files);
  auto a = parse_llama_args({"s", "--api-key-file", "/cli.keys", "--api_key", "k1,,k2"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->api_keys, (std::vector<std::string>{"e1", "e,2", "f1", "f2", "c1", "k1", "k2"}));
  EXPECT_EQ(a->api_key, "e1");
  a = parse_llama_args({"s", "--api-key-file=/missing"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("/missing"), std::string::npos) << a.status().message();
  vars.clear();
  a = parse_llama_args({"s", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->api_keys.empty());
}

// llama-server reads LLAMA_ARG_* before ARGS (common/arg.cpp): the child of `kvsnap serve` run with
// LLAMA_ARG_CACHE_TYPE_K=q8_0 in its environment (as container images set it) has a q8_0 cache, and
// kvsnap must convert its restores to q8_0, not to the f16 default; a flag in ARGS still wins.
TEST(LlamaArgs, TheEnvironmentIsReadFirstAsLlamaServerReadsIt) {
  std::map<std::string, std::string> vars = {{"LLAMA_ARG_MODEL", "/models/env.gguf"}, {"LLAMA_ARG_CTX_SIZE", "8192"},
                                             {"LLAMA_ARG_N_PARALLEL", "2"}, {"LLAMA_ARG_CACHE_TYPE_K", "q8_0"},
                                             {"LLAMA_ARG_CACHE_TYPE_V", "q4_0"}, {"LLAMA_ARG_FLASH_ATTN", "enabled"}};
  const std::map<std::string, std::string> no_files;
  const ArgsEnvironment env = fake_environment(vars, no_files);
  auto a = parse_llama_args({"llama-server", "-t", "2"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->model, "/models/env.gguf");
  EXPECT_EQ(a->ctx_size, 8192);
  EXPECT_EQ(a->parallel, 2);
  EXPECT_EQ(a->ctk, "q8_0");
  EXPECT_EQ(a->ctv, "q4_0");
  EXPECT_EQ(a->flash_attn, "on");
  a = parse_llama_args({"llama-server", "-ctv", "f16", "-c", "512", "-fa", "off", "-m", "cli.gguf"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->model, "cli.gguf");
  EXPECT_EQ(a->ctx_size, 512);
  EXPECT_EQ(a->ctk, "q8_0");  // not on the command line: the environment's
  EXPECT_EQ(a->ctv, "f16");
  EXPECT_EQ(a->flash_attn, "off");
  // A requantize's new types go on the command line, over the environment's.
  auto b = with_cache(*a, "q4_0", "q4_0", "", 0, env);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->ctk, "q4_0");
  EXPECT_EQ(b->ctv, "q4_0");
  EXPECT_EQ(b->flash_attn, "off");
  // A number as llama-server's std::stoi reads it: "8k" is 8, " +512" is 512; no digits is refused, as
  // llama-server refuses it, and so is -np 0.
  vars["LLAMA_ARG_CTX_SIZE"] = "8k";
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->ctx_size, 8);
  vars["LLAMA_ARG_CTX_SIZE"] = " +512";
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->ctx_size, 512);
  vars["LLAMA_ARG_CTX_SIZE"] = "k8";
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("LLAMA_ARG_CTX_SIZE 'k8' is not a number"), std::string::npos)
      << a.status().message();
  vars["LLAMA_ARG_CTX_SIZE"] = "99999999999";
  EXPECT_FALSE(parse_llama_args({"llama-server"}, env).ok());
  vars["LLAMA_ARG_CTX_SIZE"] = "4096";
  vars["LLAMA_ARG_N_PARALLEL"] = "0";
  EXPECT_FALSE(parse_llama_args({"llama-server"}, env).ok());
  vars["LLAMA_ARG_N_PARALLEL"] = "2";
  EXPECT_FALSE(parse_llama_args({"llama-server", "-np", "0"}, env).ok());
  vars["LLAMA_ARG_FLASH_ATTN"] = "maybe";
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("LLAMA_ARG_FLASH_ATTN 'maybe'"), std::string::npos) << a.status().message();
  vars.erase("LLAMA_ARG_FLASH_ATTN");
  // One variable set: refused, the message naming it; `slots_back` whether a --slots in ARGS undoes it.
  struct Refused {
    const char* var;
    const char* value;
    bool slots_back;
  };
  // The /slots endpoint turned off (as --no-slots is); the child's routes under a prefix, or on a
  // port of its own (Vertex AI's AIP_MODE): not where kvsnap calls it.
  for (const Refused& r : {Refused{"LLAMA_ARG_ENDPOINT_SLOTS", "false", true}, Refused{"LLAMA_ARG_NO_ENDPOINT_SLOTS", "1", true},
                           Refused{"LLAMA_ARG_API_PREFIX", "/llm", false}, Refused{"AIP_MODE", "PREDICTION", false}}) {
    vars[r.var] = r.value;
    a = parse_llama_args({"llama-server"}, env);
    ASSERT_FALSE(a.ok()) << r.var;
    EXPECT_NE(a.status().message().find(r.var), std::string::npos) << a.status().message();
    EXPECT_EQ(parse_llama_args({"llama-server", "--slots"}, env).ok(), r.slots_back) << r.var;
    vars.erase(r.var);
  }
  vars["LLAMA_ARG_ENDPOINT_SLOTS"] = "auto";  // not a boolean: llama-server would not start
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("LLAMA_ARG_ENDPOINT_SLOTS 'auto' is not a boolean"), std::string::npos)
      << a.status().message();
  vars["LLAMA_ARG_ENDPOINT_SLOTS"] = "on";
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->unread_config_files.empty());
  a = parse_llama_args({"llama-server", "--api-prefix", "/llm"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--api-prefix"), std::string::npos) << a.status().message();
  // A model llama-server downloads (its path then points at the download): not the given path.
  for (const char* var : {"LLAMA_ARG_HF_REPO", "LLAMA_ARG_DOCKER_REPO", "LLAMA_ARG_MODEL_URL"}) {
    vars[var] = "someone/model";
    a = parse_llama_args({"llama-server"}, env);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->model, "") << var;
    vars.erase(var);
  }
  for (const char* flag : {"-hf", "--hf-repo", "-dr", "-mu"}) {
    a = parse_llama_args({"llama-server", "-m", "local.gguf", flag, "someone/model"}, env);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->model, "") << flag;
  }
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->model, "/models/env.gguf");
}

// llama-server 3.22.1 applies /etc/llama.cpp/config.ini and the user's ($XDG_CONFIG_HOME, else
// ~/.config) llama.cpp/config.ini first; kvsnap does not read them but names those that exist.
TEST(LlamaArgs, ConfigFilesTheChildWillReadAreNamed) {
  std::map<std::string, std::string> vars = {{"HOME", "/home/u"}};
  std::map<std::string, std::string> files = {{"/etc/llama.cpp/config.ini", "[*]\nctx-size = 8192\n"},
                                              {"/home/u/.config/llama.cpp/config.ini", "cache-type-k = q8_0\n"},
                                              {"/xdg/llama.cpp/config.ini", ""}};
  const ArgsEnvironment env = fake_environment(vars, files);
  auto a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->unread_config_files,
            (std::vector<std::string>{"/etc/llama.cpp/config.ini", "/home/u/.config/llama.cpp/config.ini"}));
  vars["XDG_CONFIG_HOME"] = "/xdg";
  a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->unread_config_files, (std::vector<std::string>{"/etc/llama.cpp/config.ini", "/xdg/llama.cpp/config.ini"}));
  files.clear();
  a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->unread_config_files.empty());
}

TEST(LlamaArgs, WithCacheReplacesTheFlagsWhereverTheyAre) {
  auto a = parse_llama_args({"srv", "-ctk", "f16", "-m", "m.gguf", "--cache-type-v=q8_0", "-fa", "-c", "512", "-t", "2"});
  ASSERT_TRUE(a.ok());
  auto b = with_cache(*a, "q4_0", "q8_0", "on", 1024);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->argv, (std::vector<std::string>{"srv", "-m", "m.gguf", "-t", "2", "-ctk", "q4_0", "-ctv", "q8_0", "-fa",
                                               "on", "-c", "1024"}));
  EXPECT_EQ(b->ctk, "q4_0");
  EXPECT_EQ(b->ctx_size, 1024);
  // flash attention and the context kept when not given
  b = with_cache(*a, "q8_0", "q8_0", "", 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->argv, (std::vector<std::string>{"srv", "-m", "m.gguf", "-fa", "-c", "512", "-t", "2", "-ctk", "q8_0",
                                               "-ctv", "q8_0"}));
  EXPECT_EQ(b->flash_attn, "on");
  EXPECT_EQ(b->ctx_size, 512);
}

TEST(Ladder, Budget) {
  EXPECT_EQ(*parse_budget("1048576"), 1048576u);
  EXPECT_EQ(*parse_budget("512K"), 512u << 10);
  EXPECT_EQ(*parse_budget("2G"), 2ull << 30);
  for (const char* bad : {"", "0", "1.5G", "12Q", "-1"}) {
    auto b = parse_budget(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("--cache-budget"), std::string::npos);
  }
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
