// serve/llama_args.h: what kvsnap reads from the llama-server command line and the child's argv.
#include "serve/llama_args.h"

#include <gtest/gtest.h>

#include <filesystem>
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

// A sleeping llama-server frees its model and every slot's cache without telling its clients;
// kvsnap serve would go on counting the slots as held (measured: the next turn evaluated its whole
// prompt). Refused from ARGS and from a config file; -1 (off, llama-server's default) passes, and
// the last of several flags counts, as in llama-server.
TEST(LlamaArgs, RefusesSleepingWhenIdle) {
  for (std::vector<std::string> v : {std::vector<std::string>{"s", "--sleep-idle-seconds", "2"},
                                     {"s", "--sleep-idle-seconds=30"}, {"s", "--sleep_idle_seconds", "5"},
                                     {"s", "--sleep-idle-seconds", "-1", "--sleep-idle-seconds", "60"}}) {
    auto a = parse_llama_args(v);
    ASSERT_FALSE(a.ok()) << v[1];
    EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
    EXPECT_NE(a.status().message().find("llama-server argument --sleep-idle-seconds "), std::string::npos)
        << a.status().message();
    EXPECT_NE(a.status().message().find("drops every slot's cache"), std::string::npos) << a.status().message();
  }
  for (std::vector<std::string> v : {std::vector<std::string>{"s", "--sleep-idle-seconds", "-1"},
                                     {"s", "--sleep-idle-seconds", "9", "--sleep-idle-seconds=-1"},
                                     {"s", "--sleep-idle-seconds", "-01"}}) {
    auto a = parse_llama_args(v);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    // The value is the flag's, not a positional argument of its own.
    EXPECT_TRUE(a->model.empty());
  }
  std::map<std::string, std::string> vars, files;
  ArgsEnvironment env = fake_environment(vars, files);
  const std::string path = "/etc/llama.cpp/config.ini";
  files[path] = "sleep-idle-seconds = 60\n";
  auto refused = parse_llama_args({"llama-server"}, env);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(path + ": sleep-idle-seconds = '60'"), std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(parse_llama_args({"llama-server", "--sleep-idle-seconds", "-1"}, env).ok());
  files[path] = "sleep-idle-seconds = -1\n";
  EXPECT_TRUE(parse_llama_args({"llama-server"}, env).ok());
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
  EXPECT_TRUE(a->config_files.empty());
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
// ~/.config) llama.cpp/config.ini first, "[*]" then the default section of each; then the
// environment, then ARGS. kvsnap reads them in that order.
TEST(LlamaArgs, ConfigFilesAreReadBeforeTheEnvironmentAndArgs) {
  std::map<std::string, std::string> vars = {{"HOME", "/home/u"}};
  std::map<std::string, std::string> files = {
      {"/etc/llama.cpp/config.ini", "ctv = q4_1\n[*]\nctx-size = 8192\ncache-type-k = q4_0\nnp = 3\n"},
      {"/home/u/.config/llama.cpp/config.ini", "cache-type-k = q8_0 ; the user's file is applied later\nfa = on\n"},
      {"/xdg/llama.cpp/config.ini", "[*]\nm = /models/xdg.gguf\n"}};
  const ArgsEnvironment env = fake_environment(vars, files);
  auto a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->config_files,
            (std::vector<std::string>{"/etc/llama.cpp/config.ini", "/home/u/.config/llama.cpp/config.ini"}));
  EXPECT_EQ(a->ctx_size, 8192);
  EXPECT_EQ(a->parallel, 3);
  EXPECT_EQ(a->ctk, "q8_0");
  EXPECT_EQ(a->ctv, "q4_1");
  EXPECT_EQ(a->flash_attn, "on");
  EXPECT_EQ(a->config_settings.size(), 6u);
  EXPECT_EQ(a->config_settings.back(), "/home/u/.config/llama.cpp/config.ini: fa = on");
  // the environment over the files, ARGS over both
  vars["LLAMA_ARG_CTX_SIZE"] = "4096";
  vars["LLAMA_ARG_CACHE_TYPE_K"] = "q5_0";
  a = parse_llama_args({"llama-server", "-ctv", "f16", "-fa", "off"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->ctx_size, 4096);
  EXPECT_EQ(a->ctk, "q5_0");
  EXPECT_EQ(a->ctv, "f16");
  EXPECT_EQ(a->flash_attn, "off");
  // $XDG_CONFIG_HOME instead of ~/.config
  vars["XDG_CONFIG_HOME"] = "/xdg/";
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->config_files, (std::vector<std::string>{"/etc/llama.cpp/config.ini", "/xdg/llama.cpp/config.ini"}));
  EXPECT_EQ(a->model, "/models/xdg.gguf");
  EXPECT_EQ(a->ctk, "q5_0");  // the environment's; /etc's q4_0 under it
  files.clear();
  a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->config_files.empty());
  // neither XDG_CONFIG_HOME nor HOME: the passwd entry's home
  vars.clear();
  files["/pw/.config/llama.cpp/config.ini"] = "ctk = q8_0\n";
  ArgsEnvironment pw_env = env;
  pw_env.passwd_home = [] { return std::optional<std::string>("/pw"); };
  a = parse_llama_args({"llama-server"}, pw_env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ctk, "q8_0");
}

// Every key llama-server maps to an option: each spelling of the flag without its dashes and the
// option's variable; in one section the last of them in key order wins (llama.cpp's std::map).
TEST(LlamaArgs, ConfigKeysInEverySpelling) {
  std::map<std::string, std::string> vars, files;
  const ArgsEnvironment env = fake_environment(vars, files);
  const std::string path = "/etc/llama.cpp/config.ini";
  struct Case {
    const char* text;
    int ctx;
    const char* ctk;
  };
  for (const Case& c : {Case{"c = 1\n", 1, "f16"}, Case{"ctx-size = 2\nc = 1\n", 2, "f16"},
                        Case{"LLAMA_ARG_CTX_SIZE = 3\nc = 1\n", 1, "f16"}, Case{"LLAMA_ARG_CTX_SIZE = 8k\n", 8, "f16"},
                        Case{"ctk = q4_0\ncache-type-k = q8_0\n", 0, "q4_0"},  // "cache-type-k" < "ctk"
                        Case{"LLAMA_ARG_CACHE_TYPE_K = q5_1\n", 0, "q5_1"}, Case{"CTK = q4_0\n", 0, "f16"},
                        Case{"[model-a]\nctk = q4_0\n", 0, "f16"}, Case{"ctk = q4_0\n[*]\nctk = q8_0\n", 0, "q4_0"}}) {
    files[path] = c.text;
    auto a = parse_llama_args({"llama-server"}, env);
    ASSERT_TRUE(a.ok()) << c.text << a.status().ToString();
    EXPECT_EQ(a->ctx_size, c.ctx) << c.text;
    EXPECT_EQ(a->ctk, c.ctk) << c.text;
  }
  files[path] = "np = 2\nparallel = 4\nLLAMA_ARG_N_PARALLEL = 3\nm = /a.gguf\nmodel = /b.gguf\nctv = q4_0\n"
                "LLAMA_ARG_CACHE_TYPE_V = q8_0\nflash-attn = off\nfa = on\nversion = 7\nthreads = 3\n";
  auto a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->parallel, 4);
  EXPECT_EQ(a->model, "/b.gguf");
  EXPECT_EQ(a->ctv, "q4_0");
  EXPECT_EQ(a->flash_attn, "off");
}

// --cache-idle-slots as llama-server 3.22.1 reads it (serve turns it off unless the user chose):
// config files, then the environment (the LLAMA_ARG_NO_ form first, set to anything: off), then
// ARGS, the last one winning; where it was chosen is kept for serve's log.
TEST(LlamaArgs, CacheIdleSlotsWhereverTheUserChoseIt) {
  std::map<std::string, std::string> vars, files;
  const ArgsEnvironment env = fake_environment(vars, files);
  const std::string path = "/etc/llama.cpp/config.ini";
  auto chosen = [&](std::vector<std::string> argv) -> std::string {
    argv.insert(argv.begin(), "llama-server");
    auto a = parse_llama_args(argv, env);
    if (!a.ok()) return "refused: " + a.status().message();
    if (!a->cache_idle_slots) return "not chosen";
    return std::string(*a->cache_idle_slots ? "on" : "off") + " by " + a->cache_idle_slots_from;
  };
  EXPECT_EQ(chosen({}), "not chosen");
  EXPECT_EQ(chosen({"--cache-idle-slots"}), "on by ARGS --cache-idle-slots");
  EXPECT_EQ(chosen({"--cache-idle-slots", "--no_cache_idle_slots"}), "off by ARGS --no-cache-idle-slots");
  files[path] = "no-cache-idle-slots = true\n";
  EXPECT_EQ(chosen({}), "off by llama-server's config file " + path + ": no-cache-idle-slots (off)");
  files[path] = "cache-idle-slots = on\n";
  EXPECT_EQ(chosen({}), "on by llama-server's config file " + path + ": cache-idle-slots (on)");
  files[path] = "LLAMA_ARG_NO_CACHE_IDLE_SLOTS = 1\n";  // in a file, not a negative (load_from_ini)
  EXPECT_EQ(chosen({}), "on by llama-server's config file " + path + ": LLAMA_ARG_NO_CACHE_IDLE_SLOTS (on)");
  vars["LLAMA_ARG_CACHE_IDLE_SLOTS"] = "0";
  EXPECT_EQ(chosen({}), "off by environment variable LLAMA_ARG_CACHE_IDLE_SLOTS=0") << "beats the file";
  EXPECT_EQ(chosen({"--cache-idle-slots"}), "on by ARGS --cache-idle-slots") << "ARGS beat the environment";
  vars["LLAMA_ARG_CACHE_IDLE_SLOTS"] = "enabled";
  EXPECT_EQ(chosen({}), "on by environment variable LLAMA_ARG_CACHE_IDLE_SLOTS=enabled");
  vars["LLAMA_ARG_NO_CACHE_IDLE_SLOTS"] = "";
  EXPECT_EQ(chosen({}), "off by environment variable LLAMA_ARG_NO_CACHE_IDLE_SLOTS") << "the negative first";
  vars.erase("LLAMA_ARG_NO_CACHE_IDLE_SLOTS");
  for (const char* bad : {"yes", "auto", ""}) {
    vars["LLAMA_ARG_CACHE_IDLE_SLOTS"] = bad;
    EXPECT_EQ(chosen({}).rfind("refused: environment variable LLAMA_ARG_CACHE_IDLE_SLOTS", 0), 0u) << bad;
  }
}

// --cache-ram (llama-server's RAM prompt cache, which knows no LoRA scales: serve/adapters.h), from
// wherever llama-server takes it, the last one winning; off only at 0.
TEST(LlamaArgs, CacheRamWhereverTheUserSetIt) {
  std::map<std::string, std::string> vars, files;
  const ArgsEnvironment env = fake_environment(vars, files);
  const std::string path = "/etc/llama.cpp/config.ini";
  auto ram = [&](std::vector<std::string> argv) -> std::string {
    argv.insert(argv.begin(), "llama-server");
    auto a = parse_llama_args(argv, env);
    if (!a.ok()) return "refused: " + a.status().message();
    if (a->cache_ram.empty()) return "not set";
    return std::string(ram_cache_off(*a) ? "off" : "on") + " by " + a->cache_ram_from;
  };
  EXPECT_EQ(ram({}), "not set");
  EXPECT_EQ(ram({"--cache-ram", "0"}), "off by ARGS --cache-ram 0");
  EXPECT_EQ(ram({"-cram", "0"}), "off by ARGS -cram 0");
  EXPECT_EQ(ram({"-cram", "0", "--cache-ram", "-1"}), "on by ARGS --cache-ram -1");
  files[path] = "cache-ram = 0\n";
  EXPECT_EQ(ram({}), "off by llama-server's config file " + path + ": cache-ram = '0'");
  vars["LLAMA_ARG_CACHE_RAM"] = "4096";
  EXPECT_EQ(ram({}), "on by environment variable LLAMA_ARG_CACHE_RAM=4096") << "beats the file";
  EXPECT_EQ(ram({"--cache-ram", "0"}), "off by ARGS --cache-ram 0") << "ARGS beat the environment";
  // its value is not taken for a flag of its own
  auto a = parse_llama_args({"llama-server", "--cache-ram", "-c", "-m", "x.gguf"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->cache_ram, "-c");
  EXPECT_EQ(a->model, "x.gguf");
}

// Embedding tasks (which serve's slot gate does not hold) run only in a child started with
// --embeddings or --rerank, from wherever llama-server takes them.
TEST(LlamaArgs, EmbeddingsWhereverTheyAreTurnedOn) {
  std::map<std::string, std::string> vars, files;
  const ArgsEnvironment env = fake_environment(vars, files);
  const std::string path = "/etc/llama.cpp/config.ini";
  auto embeds = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), "llama-server");
    auto a = parse_llama_args(argv, env);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return a.ok() && a->embeddings;
  };
  EXPECT_FALSE(embeds({"-m", "m.gguf"}));
  for (const char* flag : {"--embedding", "--embeddings", "--rerank", "--reranking", "--embd-gemma-default"})
    EXPECT_TRUE(embeds({flag})) << flag;
  for (const char* var : {"LLAMA_ARG_EMBEDDINGS", "LLAMA_ARG_RERANKING"}) {
    vars[var] = "0";
    EXPECT_FALSE(embeds({})) << var << "=0";
    vars[var] = "true";
    EXPECT_TRUE(embeds({})) << var << "=true";
    vars.erase(var);
  }
  for (const char* text : {"embeddings = false\n", "reranking = 1\n", "LLAMA_ARG_EMBEDDINGS = x\n",
                           "embd-gemma-default = 1\n"}) {
    files[path] = text;
    EXPECT_TRUE(embeds({})) << text << ": a flag option, applied whatever its value";
  }
  files[path] = "[other]\nembeddings = true\n";
  EXPECT_FALSE(embeds({})) << "another model's section";
}

// What llama-server refuses to start with, kvsnap refuses naming the file; /slots turned off or the
// routes moved are refused as ARGS and the environment that do so are.
TEST(LlamaArgs, ConfigFilesLlamaServerRefusesAreRefused) {
  std::map<std::string, std::string> vars, files;
  ArgsEnvironment env = fake_environment(vars, files);
  const std::string path = "/etc/llama.cpp/config.ini";
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {Case{"[*]\n  ctk = q8_0\n", "config.ini, line 2: white space before a key"},
                        Case{"\xef\xbb\xbf" "ctk = q8_0\n", "line 1: a byte-order mark"},
                        Case{"c = big\n", "c = 'big' is not a number"}, Case{"np = 0\n", "refuses 0 slots"},
                        Case{"fa = maybe\n", "fa = 'maybe' must be on, off or auto"},
                        Case{"no-slots = true\n", "no-slots = 'false' turns the /slots endpoint off"},
                        Case{"slots = maybe\n", "slots = 'maybe' turns the /slots endpoint off"},
                        Case{"LLAMA_ARG_ENDPOINT_SLOTS = 0\n", "LLAMA_ARG_ENDPOINT_SLOTS = '0' turns"},
                        Case{"[*]\napi-prefix = /llm\n", "api-prefix = '/llm' moves llama-server's routes"},
                        Case{"api-key-file = /keys\n", "API key file '/keys' (api-key-file in /etc/llama.cpp/config.ini)"},
                        Case{"ctk = bogus\n", "ctk 'bogus' is not a cache type llama-server takes"},
                        Case{"[*]\ncache-type-v =\n", "cache-type-v '' is not a cache type"}}) {
    files[path] = c.text;
    auto a = parse_llama_args({"llama-server"}, env);
    ASSERT_FALSE(a.ok()) << c.text;
    EXPECT_NE(a.status().message().find(c.message), std::string::npos) << a.status().message();
    EXPECT_NE(a.status().message().find(path), std::string::npos) << a.status().message();
  }
  // /slots off in a file: on again by the environment or ARGS, as llama-server applies them later;
  // LLAMA_ARG_NO_ENDPOINT_SLOTS as a key is no negative (only the no-slots flag's key is)
  files[path] = "no-slots = 1\n";
  EXPECT_TRUE(parse_llama_args({"llama-server", "--slots"}, env).ok());
  vars["LLAMA_ARG_ENDPOINT_SLOTS"] = "true";
  EXPECT_TRUE(parse_llama_args({"llama-server"}, env).ok());
  vars.clear();
  files[path] = "LLAMA_ARG_NO_ENDPOINT_SLOTS = 1\n";
  EXPECT_TRUE(parse_llama_args({"llama-server"}, env).ok());
  files[path] = "LLAMA_ARG_NO_ENDPOINT_SLOTS = 0\n";
  EXPECT_FALSE(parse_llama_args({"llama-server"}, env).ok());
  // an empty prefix from the environment replaces the file's
  files[path] = "api-prefix = /llm\n";
  vars["LLAMA_ARG_API_PREFIX"] = "";
  EXPECT_TRUE(parse_llama_args({"llama-server"}, env).ok());
  vars.clear();
  // a file that exists but cannot be read
  env.exists = [](const std::string& p) { return p == "/etc/llama.cpp/config.ini"; };
  files.clear();
  auto a = parse_llama_args({"llama-server"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("config file /etc/llama.cpp/config.ini exists but cannot be read"),
            std::string::npos)
      << a.status().message();
}

// A cache type llama-server does not take stops it wherever it was set; so does a config.ini that is
// a directory (llama-server: "Is a directory").
TEST(LlamaArgs, CacheTypesLlamaServerRefusesAndADirectoryAreRefused) {
  std::map<std::string, std::string> vars, files;
  const ArgsEnvironment env = fake_environment(vars, files);
  auto a = parse_llama_args({"llama-server", "-ctk", "q6_0"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("llama-server argument -ctk 'q6_0' is not a cache type"), std::string::npos)
      << a.status().message();
  vars["LLAMA_ARG_CACHE_TYPE_V"] = "Q8_0";  // llama.cpp compares the type's name as it is
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("LLAMA_ARG_CACHE_TYPE_V 'Q8_0' is not a cache type"), std::string::npos);
  vars.clear();
  for (const char* t : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})
    EXPECT_TRUE(parse_llama_args({"llama-server", "-ctk", t, "--cache-type-v", t}, env).ok()) << t;

  const std::string home = ::testing::TempDir() + "kvsnap-config-dir";
  std::filesystem::create_directories(home + "/llama.cpp/config.ini");
  ArgsEnvironment real = process_environment();
  real.getenv = [&](const std::string& n) -> std::optional<std::string> {
    if (n == "XDG_CONFIG_HOME") return home;
    return std::nullopt;
  };
  a = parse_llama_args({"llama-server"}, real);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find(home + "/llama.cpp/config.ini exists but cannot be read (or is a directory)"),
            std::string::npos)
      << a.status().message();
  std::filesystem::remove_all(home);
}

// What a config file alone set goes after ARGS on the child's command line (the child reads the
// file again at each restart); what the environment or ARGS set does not.
TEST(LlamaArgs, WhatAConfigFileAloneSetIsPinnedOnTheChildsCommandLine) {
  std::map<std::string, std::string> vars,
      files = {{"/etc/llama.cpp/config.ini", "m = /m.gguf\nc = 8192\nctk = q8_0\nctv = q4_0\nfa = on\nnp = 2\n"}};
  const ArgsEnvironment env = fake_environment(vars, files);
  auto a = parse_llama_args({"llama-server", "-t", "2"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->config_pins, (std::vector<std::string>{"-m", "/m.gguf", "-c", "8192", "-np", "2", "-ctk", "q8_0", "-ctv",
                                                      "q4_0", "-fa", "on"}));
  EXPECT_EQ(child_argv(*a, 9000, "/slots"),
            (std::vector<std::string>{"llama-server", "-t", "2", "-m", "/m.gguf", "-c", "8192", "-np", "2", "-ctk",
                                      "q8_0", "-ctv", "q4_0", "-fa", "on", "--host", "127.0.0.1", "--port", "9000",
                                      "--slot-save-path", "/slots/"}));
  vars["LLAMA_ARG_CACHE_TYPE_K"] = "f16";
  vars["LLAMA_ARG_MODEL"] = "/env.gguf";
  a = parse_llama_args({"llama-server", "-c", "4096", "-fa", "off", "-np", "1", "-ctv", "q8_0"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->config_pins.empty());
  // a requantize's new types (with_cache) are ARGS: nothing of the file's is pinned over them
  vars.clear();
  a = parse_llama_args({"llama-server"}, env);
  ASSERT_TRUE(a.ok());
  auto q = with_cache(*a, "q4_0", "q4_0", "", 0, env);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->ctk, "q4_0");
  EXPECT_EQ(q->config_pins, (std::vector<std::string>{"-m", "/m.gguf", "-c", "8192", "-np", "2", "-fa", "on"}));
}

// API keys: the files' first (a section's api-key before its api-key-file), then the environment's,
// then ARGS'; a model llama-server downloads (set in a file, even with -m) is not the given path.
TEST(LlamaArgs, ConfigKeysAndDownloads) {
  std::map<std::string, std::string> vars = {{"LLAMA_API_KEY", "e1"}},
                                     files = {{"/keys", "f1\n#c\nf2\n"},
                                              {"/etc/llama.cpp/config.ini", "api-key-file = /keys\napi-key = c1,c2\n"}};
  const ArgsEnvironment env = fake_environment(vars, files);
  auto a = parse_llama_args({"llama-server", "--api-key", "k1", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->api_keys, (std::vector<std::string>{"c1", "c2", "f1", "f2", "e1", "k1"}));
  EXPECT_EQ(a->api_key, "c1");
  for (const auto& s : a->config_settings) EXPECT_EQ(s.find("c1"), std::string::npos) << s;  // no key in the log
  EXPECT_EQ(a->model, "m.gguf");
  for (const char* key : {"hf", "hfr", "hf-repo", "LLAMA_ARG_HF_REPO", "dr", "docker-repo", "mu", "model-url"}) {
    files["/etc/llama.cpp/config.ini"] = std::string(key) + " = someone/model\n";
    a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->model, "") << key;
  }
  files["/etc/llama.cpp/config.ini"] = "hf-repo =\n";  // set to nothing: no download
  a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->model, "m.gguf");
  // a download the file sets, set to nothing by the environment or ARGS: none
  files["/etc/llama.cpp/config.ini"] = "hf = someone/model\n";
  a = parse_llama_args({"llama-server", "-m", "m.gguf", "-hf", ""}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->model, "m.gguf");
  vars["LLAMA_ARG_HF_REPO"] = "";
  a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->model, "m.gguf");
  vars.erase("LLAMA_ARG_HF_REPO");
  // llama-server's model presets download too (a config key whatever its value), and may set -c and -np
  files["/etc/llama.cpp/config.ini"] = "gpt-oss-20b-default = off\n";
  a = parse_llama_args({"llama-server", "-m", "m.gguf"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->model, "");
  EXPECT_EQ(a->ctx_size, 262144);
  EXPECT_EQ(a->parallel, 2);
  files.erase("/etc/llama.cpp/config.ini");
  a = parse_llama_args({"llama-server", "-m", "m.gguf", "-c", "4096", "--fim-qwen-7b-default"}, env);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->model, "");
  EXPECT_EQ(a->ctx_size, 0) << "the preset's -c 0, after ARGS' -c 4096";
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

// The settings that change what a cache holds for the same model and tokens are collected wherever
// they are set, with their values (two for --control-vector-layer-range), and make serve's
// serve.cache tag: the same values give the same tag wherever set, another value another tag.
TEST(LlamaArgs, CacheChangingSettingsWhereverSetMakeTheTag) {
  std::map<std::string, std::string> vars, files;
  auto env = fake_environment(vars, files);
  auto plain = parse_llama_args({"srv", "-m", "m.gguf", "-t", "4", "-ctk", "q8_0"}, env);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->cache_settings.empty());
  EXPECT_EQ(cache_settings_tag(*plain), "");

  auto a = parse_llama_args({"srv", "-m", "m.gguf", "--rope-freq-base", "5000", "--lora=a.gguf",
                             "--control-vector-layer-range", "2", "7", "--lora-init-without-apply", "-t", "4"},
                            env);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(a->cache_settings.size(), 4u);
  EXPECT_EQ(a->cache_settings[0].flag, "--rope-freq-base");
  EXPECT_EQ(a->cache_settings[0].value, "5000");
  EXPECT_EQ(a->cache_settings[0].from, "ARGS");
  EXPECT_EQ(a->cache_settings[1].value, "a.gguf");
  EXPECT_EQ(a->cache_settings[2].value, "2 7");  // both values, and "-t 4" after them is no value of theirs
  EXPECT_EQ(a->cache_settings[3].flag, "--lora-init-without-apply");
  EXPECT_EQ(a->argv.size(), 12u);  // the child's command line is untouched
  const std::string tag = cache_settings_tag(*a);
  EXPECT_EQ(tag.size(), 16u);
  EXPECT_FALSE(parse_llama_args({"srv", "--control-vector-layer-range", "2"}, env).ok());  // one value short

  // The same base from the environment or a config file: the same tag; another base: another.
  auto rope = [&](std::vector<std::string> argv) {
    auto r = parse_llama_args(argv, env);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? cache_settings_tag(*r) : std::string("?");
  };
  const std::string args_tag = rope({"srv", "--rope-freq-base=5000"});
  vars["LLAMA_ARG_ROPE_FREQ_BASE"] = "5000";
  EXPECT_EQ(rope({"srv"}), args_tag);
  auto e = parse_llama_args({"srv"}, env);
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->cache_settings.size(), 1u);
  EXPECT_EQ(e->cache_settings[0].from, "environment variable LLAMA_ARG_ROPE_FREQ_BASE");
  vars.clear();
  files["/etc/llama.cpp/config.ini"] = "rope-freq-base = 5000\n";
  EXPECT_EQ(rope({"srv"}), args_tag);
  files.clear();
  EXPECT_NE(rope({"srv", "--rope-freq-base", "10000"}), args_tag);
  EXPECT_NE(rope({"srv", "--rope-freq-base", "5000", "--yarn-ext-factor", "1"}), args_tag);
  EXPECT_NE(rope({"srv", "--override-kv", "llama.rope.freq_base=float:5000"}), args_tag);
  EXPECT_EQ(rope({"srv", "--rope-freq-base", "5000", "-c", "4096", "-ctv", "q4_0"}), args_tag);  // not cache-changing
}

// LLAMA_ATTN_ROT_DISABLE as libllama reads it in the child: atoi(value) != 0.
TEST(LlamaArgs, RotationDisabledAsLibllamaReadsIt) {
  std::map<std::string, std::string> vars, files;
  auto env = fake_environment(vars, files);
  auto by = [&]() {
    auto r = parse_llama_args({"srv", "-m", "m.gguf"}, env);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->rotation_disabled_by : std::string("?");
  };
  EXPECT_EQ(by(), "");
  vars["LLAMA_ATTN_ROT_DISABLE"] = "1";
  EXPECT_EQ(by(), "environment variable LLAMA_ATTN_ROT_DISABLE=1");
  vars["LLAMA_ATTN_ROT_DISABLE"] = " 2x";
  EXPECT_NE(by(), "");
  for (const char* off : {"0", "", "yes", "-0"}) {
    vars["LLAMA_ATTN_ROT_DISABLE"] = off;
    EXPECT_EQ(by(), "") << off;
  }
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

// A review's finding: a rung llama-server refuses (a quantized V under -fa off), or one that grows the
// cache, made a step that failed (or shrank -c under the slots it restores), tried again after every
// save: a drain and two model loads per completion. Such ladders are refused up front.
TEST(Ladder, RungsThatCannotStepDownAreRefused) {
  auto model = load_model_info(posix_io(), std::string(KVSNAP_SOURCE_DIR) + "/fixtures/models/tiny-hd64.gguf");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto good = make_ladder("f16,q8_0,q4_0", 64 << 20, *model, "auto");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->rungs.size(), 3u);
  EXPECT_TRUE(make_ladder("f16,q8_0/f16", 64 << 20, *model, "off").ok()) << "a quantized K needs no flash attention";
  auto off = make_ladder("f16,q8_0", 64 << 20, *model, "off");
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.status().code(), Code::kInvalidArgument);
  EXPECT_NE(off.status().message().find("-fa off"), std::string::npos) << off.status().ToString();
  auto up = make_ladder("q4_0,f16", 64 << 20, *model, "on");
  ASSERT_FALSE(up.ok());
  EXPECT_NE(up.status().message().find("smaller than the one before"), std::string::npos) << up.status().ToString();
  EXPECT_FALSE(make_ladder("q8_0,q8_0", 64 << 20, *model, "on").ok());
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
