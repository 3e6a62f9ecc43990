// base/simd_level.h: which level names a build accepts, per architecture.
#include "base/simd_level.h"

#include <gtest/gtest.h>

namespace kvsnap::simd {
namespace {

// Restores the level a test changed.
struct KeepLevel {
  Level was = level();
  ~KeepLevel() { set_level(was); }
};

TEST(SimdLevel, NamesOfTheOtherArchitectureAndUnknownNamesAreRefused) {
  KeepLevel keep;
  EXPECT_TRUE(set_level("scalar"));
  EXPECT_EQ(level(), Level::kScalar);
  EXPECT_FALSE(set_level("sse9"));
  EXPECT_FALSE(set_level(""));
  EXPECT_EQ(level(), Level::kScalar) << "a refused name leaves the level alone";
#ifdef KVSNAP_SIMD_NEON
  EXPECT_EQ(best_level(), Level::kNeon);  // Advanced SIMD is part of every aarch64 CPU
  EXPECT_TRUE(set_level("neon"));
  EXPECT_EQ(level(), Level::kNeon);
  EXPECT_FALSE(set_level("avx2"));
  EXPECT_FALSE(set_level("avx512"));
  EXPECT_EQ(level(), Level::kNeon);
#else
  EXPECT_FALSE(set_level("neon"));
  EXPECT_FALSE(supported(Level::kNeon));
#endif
}

TEST(SimdLevel, LevelsFallBackWithinTheirChainToScalar) {
  EXPECT_EQ(fallback(Level::kAvx512), Level::kAvx2);
  EXPECT_EQ(fallback(Level::kAvx2), Level::kScalar);
  EXPECT_EQ(fallback(Level::kNeon), Level::kScalar);
  EXPECT_STREQ(level_name(Level::kNeon), "neon");
  EXPECT_TRUE(supported(Level::kScalar));
  EXPECT_TRUE(supported(best_level()));
  EXPECT_TRUE(supported(fallback(best_level())));
}

}  // namespace
}  // namespace kvsnap::simd
