// base/small_vector.h: the same contents as a std::vector through every move between the inline
// storage and the heap.
#include "base/small_vector.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kvsnap {
namespace {

using Ids = SmallVector<int32_t, 2>;

std::vector<int32_t> as_vector(const Ids& v) { return {v.begin(), v.end()}; }

TEST(SmallVector, ResizeKeepsAPrefixAndZeroesWhatItAdds) {
  Ids v;
  EXPECT_TRUE(v.empty());
  v.resize(2);
  v[0] = 7;
  v[1] = 8;
  v.resize(5);  // to the heap
  EXPECT_EQ(as_vector(v), (std::vector<int32_t>{7, 8, 0, 0, 0}));
  v[4] = 9;
  v.resize(1);  // back inside
  EXPECT_EQ(as_vector(v), (std::vector<int32_t>{7}));
  v.resize(2);  // the old second element must not come back
  EXPECT_EQ(as_vector(v), (std::vector<int32_t>{7, 0}));
  v.resize(4);
  EXPECT_EQ(as_vector(v), (std::vector<int32_t>{7, 0, 0, 0}));
  v.clear();
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(v.begin(), v.end());
}

// Random resizes, writes, copies and assignments against a std::vector doing the same.
TEST(SmallVector, MatchesAStdVectorThroughRandomOperations) {
  std::mt19937 rng(1234);
  Ids v;
  std::vector<int32_t> ref;
  for (int step = 0; step < 5000; ++step) {
    switch (rng() % 5) {
      case 0: {
        const size_t n = rng() % 6;
        v.resize(n);
        ref.resize(n);
        break;
      }
      case 1:
        if (!ref.empty()) {
          const size_t i = rng() % ref.size();
          v[i] = ref[i] = int32_t(rng());
        }
        break;
      case 2: {
        Ids copy = v;  // copy, then move back
        v = std::move(copy);
        break;
      }
      case 3:
        v = {int32_t(step), -1};
        ref = {int32_t(step), -1};
        break;
      case 4:
        v = {};
        ref = {};
        break;
    }
    ASSERT_EQ(v.size(), ref.size()) << step;
    ASSERT_EQ(as_vector(v), ref) << step;
  }
}

TEST(SmallVector, AMovedFromVectorIsEmpty) {
  for (size_t n : {1u, 2u, 3u, 9u}) {
    Ids a;
    a.resize(n);
    a[n - 1] = 5;
    Ids b = std::move(a);
    EXPECT_TRUE(a.empty()) << n;  // NOLINT(bugprone-use-after-move): the promise under test
    EXPECT_EQ(b.size(), n);
    EXPECT_EQ(b[n - 1], 5);
    Ids c;
    c = std::move(b);
    EXPECT_TRUE(b.empty()) << n;  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(c.size(), n);
    EXPECT_EQ(c[n - 1], 5);
    a.resize(1);  // a moved-from vector is usable
    EXPECT_EQ(a[0], 0);
  }
}

TEST(SmallVector, EqualityComparesContentsWhereverTheyAreKept) {
  Ids a = {1, 2, 3};
  Ids b = {1, 2};
  EXPECT_FALSE(a == b);
  a.resize(2);  // heap -> inline
  EXPECT_TRUE(a == b);
  b.resize(3);
  EXPECT_FALSE(a == b);
  EXPECT_TRUE(Ids{} == Ids{});
}

}  // namespace
}  // namespace kvsnap
