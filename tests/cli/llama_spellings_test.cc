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

}  // namespace
}  // namespace kvsnap::cli
