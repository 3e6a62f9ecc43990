// The commands as a library (src/cli/commands.h): run_* called without the
// binary, with the same results and errors the binary prints.
#include "cli/commands.h"

#include <gtest/gtest.h>

#include <string>

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

TEST(Commands, RunMigrateWithoutADirectoryIsAUsageError) {
  MigrateOptions o;
  std::string out;
  Status s = run_migrate(o, out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace kvsnap::cli
