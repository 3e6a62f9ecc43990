// The pure parsers of llama-server's replies (src/server/llama_server.h).
#include "server/llama_server.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvsnap
