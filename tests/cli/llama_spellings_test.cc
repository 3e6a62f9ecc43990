// with_kvsnap_spellings: llama-server's option names become kvsnap's, and nothing else moves.
#include "cli/llama_spellings.h"

#include <gtest/gtest.h>

namespace kvsnap::cli {
namespace {

using Args = std::vector<std::string>;

TEST(LlamaSpellings, RenamesLlamaServersCacheOptions) {
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "convert", "a", "b", "-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on"}),
            (Args{"kvsnap", "convert", "a", "b", "--ctk", "q8_0", "--ctv", "q4_0", "--fa", "on"}));
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "restore", "x", "--cache-type-k=q8_0", "--cache-type-v", "f16", "-fa=off"}),
            (Args{"kvsnap", "restore", "x", "--ctk=q8_0", "--ctv", "f16", "--fa=off"}));
}

TEST(LlamaSpellings, LeavesEverythingElseAlone) {
  // kvsnap's own names, look-alikes, a renamed option's value, and everything after "--"
  const Args same{"kvsnap", "convert", "--ctk", "q8_0", "--fa", "on", "-ctkx", "-ctk-", "--cache-type-kv", "-f"};
  EXPECT_EQ(with_kvsnap_spellings(same), same);
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "save", "-ctk", "-ctv"}), (Args{"kvsnap", "save", "--ctk", "-ctv"}));
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "save", "--", "-ctk", "q8_0"}), (Args{"kvsnap", "save", "--", "-ctk", "q8_0"}));
  EXPECT_EQ(with_kvsnap_spellings({}), Args{});
}

TEST(LlamaSpellings, ABareFaIsOn) {  // llama-server's older flag; -fa on|off|auto keeps its word
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "convert", "a", "b", "-fa", "-ctk", "q8_0"}),
            (Args{"kvsnap", "convert", "a", "b", "--fa", "on", "--ctk", "q8_0"}));
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "convert", "a", "b", "-fa"}), (Args{"kvsnap", "convert", "a", "b", "--fa", "on"}));
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "convert", "-fa", "off"}), (Args{"kvsnap", "convert", "--fa", "off"}));
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "convert", "-fa", "auto"}), (Args{"kvsnap", "convert", "--fa", "auto"}));
}

TEST(LlamaSpellings, AnOptionsValueIsNeverRenamed) {
  const TakesValue takes_value = [](const std::string& w) { return w == "-o" || w == "--name"; };
  const Args same{"kvsnap", "restore", "s", "-o", "-fa", "--name", "-ctk"};
  EXPECT_EQ(with_kvsnap_spellings(same, takes_value), same);
  EXPECT_EQ(with_kvsnap_spellings({"kvsnap", "restore", "s", "-o", "x", "-fa", "on"}, takes_value),
            (Args{"kvsnap", "restore", "s", "-o", "x", "--fa", "on"}));
}

TEST(LlamaSpellings, EachOfKvsnapsOptionsKnowsItsLlamaSpellings) {  // for --help
  EXPECT_EQ(llama_spellings_of("--ctk"), (Args{"-ctk", "--cache-type-k"}));
  EXPECT_EQ(llama_spellings_of("--ctv"), (Args{"-ctv", "--cache-type-v"}));
  EXPECT_EQ(llama_spellings_of("--fa"), (Args{"-fa"}));
  EXPECT_TRUE(llama_spellings_of("--flash-attn").empty());
  EXPECT_TRUE(llama_spellings_of("--model").empty());
}

}  // namespace
}  // namespace kvsnap::cli
