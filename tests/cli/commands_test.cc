// The commands as a library (src/cli/commands.h): run_* called without the
// binary, with the same results and errors the binary prints.
#include "cli/commands.h"

#include "base/os.h"
#include "cli/command_tree.h"
#include "cli/progress.h"

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <unistd.h>

#include <map>
#include <string>
#include <vector>

namespace kvsnap::cli {
namespace {

const std::string kFixtures = std::string(KVSNAP_SOURCE_DIR) + "/fixtures";

TEST(Commands, RunInfoReadsAFixture) {
  InfoOptions o;
  o.file = kFixtures + "/v0.5.0/hd64-f16-f16-faon.slot";
  o.model = kFixtures + "/models/tiny-hd64.gguf";
  o.json = true;
  std::string out;
  Status s = run_info(o, out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(out.find("\"format\": \"ggsq\""), std::string::npos) << out.substr(0, 400);
}

TEST(Commands, RunConvertRefusesAMissingInputByName) {
  ConvertOptions o;
  o.in = kFixtures + "/no-such.slot";
  o.out = "/tmp/kvsnap-commands-test-never-written.slot";
  o.ctk = o.ctv = "q8_0";
  std::string out, warnings;
  Status s = run_convert(o, out, warnings);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no-such.slot"), std::string::npos) << s.ToString();
}

// An mlx-lm prompt cache (a real 3-bit file of mlx-lm 0.28.0 from the fuzz corpus): convert takes
// mlx-lm's --kv-bits/--kv-group-size and refuses llama.cpp's options, and the reverse.
const std::string kMlxQ3 = std::string(KVSNAP_SOURCE_DIR) + "/tests/fuzz/corpus/mlx_prompt_cache/meta_step_q3g128.safetensors";

TEST(Commands, RunConvertRequantizesAnMlxPromptCache) {
  ConvertOptions o;
  o.in = kMlxQ3;
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-q8.safetensors";
  o.force = true;  // TempDir outlives a run
  o.kv_bits = "8";
  o.kv_group_size = 32;
  o.report = true;
  std::string out, warnings;
  Status s = run_convert(o, out, warnings);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(out.find("K/V q8g32 (mx.quantize, CPU)"), std::string::npos) << out;
  EXPECT_NE(out.find("q3g128 BF16->q8g32 BF16"), std::string::npos) << out;
  InfoOptions i;
  i.file = o.out;
  std::string info;
  ASSERT_TRUE(run_info(i, info).ok());
  EXPECT_NE(info.find("8-bit g32"), std::string::npos) << info;
}

TEST(Commands, RunConvertKeepsMlxAndLlamaOptionsApart) {
  std::string out, warnings;
  ConvertOptions o;
  o.in = kMlxQ3;
  o.out = ::testing::TempDir() + "kvsnap-commands-never-written.safetensors";
  o.force = true;  // TempDir outlives a run
  o.ctk = "q8_0";
  Status s = run_convert(o, out, warnings);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("llama.cpp options were given (--ctk)"), std::string::npos) << s.ToString();
  o.ctk.clear();
  s = run_convert(o, out, warnings);  // nothing asked
  EXPECT_NE(s.message().find("nothing to do"), std::string::npos) << s.ToString();
  o.kv_bits = "7";
  s = run_convert(o, out, warnings);
  EXPECT_NE(s.message().find("meta_step_q3g128.safetensors: bits 7"), std::string::npos) << s.ToString();
  o.kv_bits = "four";
  s = run_convert(o, out, warnings);
  EXPECT_NE(s.message().find("{--kv-bits} 'four'"), std::string::npos) << s.ToString();
  o.kv_bits = "none";
  o.kv_group_size = 64;
  s = run_convert(o, out, warnings);
  EXPECT_NE(s.message().find("a float cache has no groups"), std::string::npos) << s.ToString();
  ConvertOptions l;
  l.in = kFixtures + "/v0.5.0/hd64-f16-f16-faon.slot";
  l.out = o.out;
  l.kv_bits = "4";
  s = run_convert(l, out, warnings);
  EXPECT_NE(s.message().find("not an mlx-lm prompt cache"), std::string::npos) << s.ToString();
}

// --mlx-lm alone moves the file to that release's layout; with --kv-bits it moves and requantizes.
TEST(Commands, RunConvertMovesAnMlxPromptCacheToAnotherRelease) {
  ConvertOptions o;
  o.in = kMlxQ3;  // QuantizedKVCache, meta_state with `step` (mlx-lm 0.28.0)
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-0.32.safetensors";
  o.force = true;  // TempDir outlives a run
  o.mlx_lm = "0.32.2";
  o.json = true;
  std::string out, warnings;
  Status s = run_convert(o, out, warnings);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(out.find("\"layout_from\": \"meta_state-with-step\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"layout_to\": \"scalars\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"target\": \"mlx-lm 0.32.2\""), std::string::npos) << out;
  InfoOptions i;
  i.file = o.out;
  std::string info;
  ASSERT_TRUE(run_info(i, info).ok());
  EXPECT_NE(info.find("layout scalars"), std::string::npos) << info;
  EXPECT_NE(info.find("3-bit g128"), std::string::npos) << info;
  // Moved and requantized: the 0.32 layout at 8 bits.
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-0.32-q8.safetensors";
  o.force = true;  // TempDir outlives a run
  o.kv_bits = "8";
  o.kv_group_size = 32;
  o.json = false;
  s = run_convert(o, out, warnings);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(out.find("scalars layout for mlx-lm 0.32.2"), std::string::npos) << out;
  i.file = o.out;
  ASSERT_TRUE(run_info(i, info).ok());
  EXPECT_NE(info.find("layout scalars"), std::string::npos) << info;
  EXPECT_NE(info.find("8-bit g32"), std::string::npos) << info;
  // A release kvsnap does not write for, and a class the release cannot load: refused, no file.
  o.kv_bits.clear();
  o.kv_group_size = 0;
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-never.safetensors";
  o.force = true;  // TempDir outlives a run
  o.mlx_lm = "0.18.2";
  s = run_convert(o, out, warnings);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  o.mlx_lm = "0.19.1";
  s = run_convert(o, out, warnings);
  EXPECT_EQ(s.code(), Code::kNotSupported) << s.ToString();
  EXPECT_NE(s.message().find("layer 0 (QuantizedKVCache): mlx-lm 0.19.1 has no QuantizedKVCache"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(::access(o.out.c_str(), F_OK), -1);
  // Float K/V quantized for 0.19.1 (a review's finding: the requantizer made QuantizedKVCache layers
  // that release cannot load, exit 0): refused before anything is written.
  o.mlx_lm = "0.32.2";
  o.kv_bits = "none";
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-float.safetensors";
  o.force = true;  // TempDir outlives a run
  ASSERT_TRUE(run_convert(o, out, warnings).ok());
  o.in = o.out;
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-never-q4.safetensors";
  o.force = true;  // TempDir outlives a run
  ::unlink(o.out.c_str());
  o.mlx_lm = "0.19.1";
  o.kv_bits = "4";
  o.kv_group_size = 64;
  s = run_convert(o, out, warnings);
  EXPECT_EQ(s.code(), Code::kNotSupported) << s.ToString();
  EXPECT_NE(s.message().find("mlx-lm 0.19.1 has no QuantizedKVCache (0.19.3 added it): quantized K/V"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(::access(o.out.c_str(), F_OK), -1);
  o.mlx_lm = "0.19.3";
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-0.19.3-q4.safetensors";
  o.force = true;  // TempDir outlives a run
  ASSERT_TRUE(run_convert(o, out, warnings).ok()) << "0.19.3 loads a QuantizedKVCache";
  o.kv_bits.clear();
  o.kv_group_size = 0;
  // An ArraysCache of mlx-lm 0.32 for 0.28.0, whose loader only builds MambaCache without arguments.
  o.in = std::string(KVSNAP_SOURCE_DIR) + "/tests/fuzz/corpus/mlx_prompt_cache/scalars_arrays.safetensors";
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-mamba.safetensors";
  o.force = true;  // TempDir outlives a run
  o.mlx_lm = "0.28.0";
  s = run_convert(o, out, warnings);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(out.find("layer 0: ArraysCache -> MambaCache"), std::string::npos) << out;
}

// A float meta_state file (which does not say whether its release needs `step`) quantized for
// mlx-lm 0.28.0 is written in that release's layout, and the report names what was written (a
// review's finding: it named the input's layout, meta_state, for a meta_state-with-step file).
TEST(Commands, RunConvertReportsTheLayoutItWrote) {
  ConvertOptions o;
  o.in = kMlxQ3;
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-float-0.31.safetensors";
  o.force = true;  // TempDir outlives a run
  o.mlx_lm = "0.31.3";
  o.kv_bits = "none";
  std::string out, warnings;
  ASSERT_TRUE(run_convert(o, out, warnings).ok());
  o.in = o.out;
  o.out = ::testing::TempDir() + "kvsnap-commands-mlx-q4-0.28.0.safetensors";
  o.force = true;  // TempDir outlives a run
  o.mlx_lm = "0.28.0";
  o.kv_bits = "4";
  o.json = true;
  Status s = run_convert(o, out, warnings);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(out.find("\"layout_from\": \"meta_state\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"layout\": \"meta_state-with-step\""), std::string::npos) << out;
  InfoOptions i;
  i.file = o.out;
  std::string info;
  ASSERT_TRUE(run_info(i, info).ok());
  EXPECT_NE(info.find("layout meta_state-with-step"), std::string::npos) << info;
}

// The Io every command runs on forwards the exchange of two names (migrate's publication rests on
// it: a wrapper without it fell back to a plain rename, silently, in the shipped binary only).
TEST(Commands, TheCommandsIoExchangesTwoNames) {
  if (std::string(os_branch()) == "posix") GTEST_SKIP() << "no exchange of two names on this system";
  const std::string dir = ::testing::TempDir() + "kvsnap-cli-exchange-" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir + " && printf A > " + dir + "/a && printf B > " + dir + "/b").c_str()), 0);
  const Status s = cli_io().exchange(dir + "/a", dir + "/b");
  if (s.code() == Code::kNotSupported && !posix_io().exchange(dir + "/a", dir + "/b").ok())
    GTEST_SKIP() << "the file system of " << dir << " cannot exchange two names";
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto a = read_all(posix_io(), dir + "/a", 16);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(a->data()), a->size()), "B");
  (void)std::system(("rm -rf " + dir).c_str());
}

// The same for a save's pack going at the disk's pace (base/io.h pace_to_disk): a wrapper that
// dropped it left every default save of the shipped binary storing raw chunks on a slow disk.
TEST(Commands, TheCommandsIoPacesAFileToTheDisk) {
  const std::string dir = ::testing::TempDir() + "kvsnap-cli-pace-" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  auto posix = posix_io().open_write(dir + "/posix.bin", true);
  auto cli = cli_io().open_write(dir + "/cli.bin", true);
  ASSERT_TRUE(posix.ok() && cli.ok());
  const bool posix_paces = (*posix)->pace_to_disk();
  EXPECT_TRUE(posix_paces);
  EXPECT_EQ((*cli)->pace_to_disk(), posix_paces);
  (void)(*posix)->close();
  (void)(*cli)->close();
  (void)std::system(("rm -rf " + dir).c_str());
}

TEST(Commands, RunMigrateWithoutADirectoryIsAUsageError) {
  MigrateOptions o;
  std::string out;
  Status s = run_migrate(o, out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
}

// The paths of a tree's commands ("convert", "server add") and each one's --help.
std::map<std::string, std::string> helps_of(const CLI::App& root) {
  std::map<std::string, std::string> out;
  for (const Command& c : commands_of(root)) out[c.path] = c.app->help();
  return out;
}

std::map<std::string, std::string> helps_for(const std::vector<std::string>& args) {
  CLI::App app{"kvsnap"};
  int exit_status = 0;
  setup_commands_for(app, exit_status, args);
  return helps_of(app);
}

// A process defines only the command its first word names: that command must be defined exactly
// as in the whole tree (every option, every spelling noted in --help), and every word of the
// tree must be found (a command missing from the table would still run, but set up slowly).
TEST(Commands, TheCommandAProcessNamesIsDefinedAsInTheWholeTree) {
  CLI::App all{"kvsnap"};
  int exit_status = 0;
  setup_all_commands(all, exit_status);
  const std::map<std::string, std::string> whole = helps_of(all);
  ASSERT_GT(whole.size(), 20u);
  for (const CLI::App* top : all.get_subcommands({})) {
    const std::string& word = top->get_name();
    const std::map<std::string, std::string> one = helps_for({"kvsnap", word, "--help"});
    if (word == "man" || word == "completion") {
      EXPECT_EQ(one, whole) << word << " walks the whole tree";
      continue;
    }
    EXPECT_LT(one.size(), whole.size()) << word << ": the whole tree was set up";
    ASSERT_TRUE(one.count(word)) << word << ": not defined for `kvsnap " << word << "`";
    for (const auto& [path, help] : one) {
      ASSERT_TRUE(whole.count(path)) << path;
      EXPECT_EQ(help, whole.at(path)) << path;
    }
    for (const auto& [path, help] : whole) {
      if (path == word || path.rfind(word + " ", 0) == 0) {
        EXPECT_TRUE(one.count(path)) << path << " missing";
      }
    }
  }
  // No command word, an option first or a word that is no command: the whole tree (its help and
  // its messages list every command).
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"kvsnap"}, {"kvsnap", "--help"}, {"kvsnap", "--version", "info"}, {"kvsnap", "infoo"}, {"kvsnap", ""}}) {
    EXPECT_EQ(helps_for(args), whole) << (args.size() > 1 ? args[1] : "(no word)");
  }
}

}  // namespace
}  // namespace kvsnap::cli
