#include "base/remedy.h"

#include <gtest/gtest.h>

namespace kvsnap {
namespace {

TEST(Remedy, TheCommandLineSeesTheFlags) {
  EXPECT_EQ(render_remedies_as_flags("pass the model with {--model GGUF} (or {--head-dim-k}/{--head-dim-v})"),
            "pass the model with --model GGUF (or --head-dim-k/--head-dim-v)");
}

TEST(Remedy, AnotherFrontEndNamesItsOwnSetting) {
  auto c_api = [](std::string_view r) { return r == "--model GGUF" ? std::string("a kvsnap_model") : std::string("?"); };
  EXPECT_EQ(render_remedies("x.slot: pass {--model GGUF}, then retry", c_api), "x.slot: pass a kvsnap_model, then retry");
}

TEST(Remedy, TextWithoutARemedyPassesUnchanged) {
  for (const char* t : {"{\n  \"a\": {\"b\": 1}\n}", "no braces", "{-- unterminated", "{--split\n}", "a {b} c", ""}) {
    EXPECT_EQ(render_remedies_as_flags(t), t);
  }
}

// A command without --head-dim-k (migrate) drops the aside that offers only such flags; an aside
// naming one it takes, and text without one, stay as they are.
TEST(Remedy, AnAsideOfFlagsTheCommandLacksIsDropped) {
  const std::string t = "pass the model with {--model GGUF} (or {--head-dim-k}/{--head-dim-v}), then retry";
  EXPECT_EQ(drop_remedy_asides(t, {"--head-dim-k", "--head-dim-v"}), "pass the model with {--model GGUF}, then retry");
  EXPECT_EQ(drop_remedy_asides(t, {"--head-dim-k"}), t);
  EXPECT_EQ(drop_remedy_asides(t, {}), t);
  EXPECT_EQ(drop_remedy_asides("x (or {--a N}) y (or {--b}) z (or {--a", {"--a"}), "x y (or {--b}) z (or {--a");
}

}  // namespace
}  // namespace kvsnap
