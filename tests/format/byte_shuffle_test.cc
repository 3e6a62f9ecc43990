// format/byte_shuffle.h at every SIMD level this CPU has: byte for byte the scalar level's
// output, which is the filter's definition (byte b of element i goes to plane b, the tail stays).
#include "format/byte_shuffle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "base/simd_level.h"

namespace kvsnap {
namespace {

using Bytes = std::vector<std::byte>;

// Restores the level a test changed.
struct KeepLevel {
  simd::Level was = simd::level();
  ~KeepLevel() { simd::set_level(was); }
};

Bytes random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = std::byte(rng() & 0xff);
  return b;
}

// The first index where a and b differ, or -1 (a failure names it instead of dumping the bytes).
long first_diff(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return long(std::min(a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return long(i);
  return -1;
}

// What each entry point writes for `in` (placed at byte `skew` of its buffer, so the kernels
// see unaligned pointers) at the current level: shuffled, unshuffled, and interleaved from
// planes that lie apart in memory as a decoder's runs do.
struct Outputs {
  Bytes shuffled, unshuffled, from_planes;
};
Outputs run(const Bytes& in, size_t elem, size_t skew) {
  const size_t n = in.size();
  Bytes src(skew + n), dst(skew + n);
  std::copy(in.begin(), in.end(), src.begin() + ptrdiff_t(skew));
  Outputs o;
  shuffle_bytes({src.data() + skew, n}, elem, {dst.data() + skew, n});
  o.shuffled.assign(dst.begin() + ptrdiff_t(skew), dst.end());
  unshuffle_bytes({src.data() + skew, n}, elem, {dst.data() + skew, n});
  o.unshuffled.assign(dst.begin() + ptrdiff_t(skew), dst.end());
  const size_t m = n / elem;
  std::vector<Bytes> planes(elem);
  std::vector<const std::byte*> ptrs(elem);
  for (size_t b = 0; b < elem; ++b) {
    planes[b].resize(skew + m + 1);
    std::copy(in.begin() + ptrdiff_t(b * m), in.begin() + ptrdiff_t((b + 1) * m), planes[b].begin() + ptrdiff_t(skew));
    ptrs[b] = planes[b].data() + skew;
  }
  Bytes out(skew + m * elem);
  unshuffle_planes(ptrs.data(), elem, m, out.data() + skew);
  o.from_planes.assign(out.begin() + ptrdiff_t(skew), out.end());
  return o;
}

TEST(ByteShuffle, EveryLevelWritesTheScalarLevelsBytes) {
  KeepLevel keep;
  int levels = 0;
  for (size_t li = 0; li < simd::kLevelCount; ++li) {
    const auto l = static_cast<simd::Level>(li);
    if (!simd::supported(l)) continue;
    ++levels;
    // Element counts around the kernels' steps (16 and 32 elements), with and without a tail.
    for (size_t elem : {2u, 4u, 3u, 8u}) {
      for (size_t count : {0u, 1u, 15u, 16u, 17u, 31u, 32u, 33u, 63u, 64u, 65u, 97u, 1000u, 4099u}) {
        for (size_t tail : {size_t(0), elem - 1}) {
          for (size_t skew : {0u, 1u, 7u}) {
            const size_t n = count * elem + tail;
            SCOPED_TRACE(std::string(simd::level_name(l)) + ": elem " + std::to_string(elem) + ", " +
                         std::to_string(count) + " elements + " + std::to_string(tail) + ", skew " +
                         std::to_string(skew));
            const Bytes in = random_bytes(n, uint32_t(elem * 1000003 + count * 7 + tail));
            ASSERT_TRUE(simd::set_level(simd::Level::kScalar));
            const Outputs want = run(in, elem, skew);
            ASSERT_TRUE(simd::set_level(l));
            const Outputs got = run(in, elem, skew);
            ASSERT_EQ(first_diff(got.shuffled, want.shuffled), -1) << "shuffle_bytes";
            ASSERT_EQ(first_diff(got.unshuffled, want.unshuffled), -1) << "unshuffle_bytes";
            ASSERT_EQ(first_diff(got.from_planes, want.from_planes), -1) << "unshuffle_planes";
            if (l != simd::Level::kScalar) continue;
            // The scalar level against the definition, and the two directions against each other.
            for (size_t i = 0; i < count; ++i)
              for (size_t b = 0; b < elem; ++b) ASSERT_EQ(want.shuffled[b * count + i], in[i * elem + b]);
            for (size_t k = count * elem; k < n; ++k) ASSERT_EQ(want.shuffled[k], in[k]);
            ASSERT_EQ(run(want.shuffled, elem, skew).unshuffled, in);
            ASSERT_EQ(Bytes(want.unshuffled.begin(), want.unshuffled.begin() + ptrdiff_t(count * elem)), want.from_planes);
          }
        }
      }
    }
  }
  // A SIMD build has more than the scalar level on every CPU it runs on (NEON: always; x86-64:
  // any with AVX2), so on CI this compares at least one kernel set.
  RecordProperty("levels", levels);
  EXPECT_GE(levels, 1);
}

}  // namespace
}  // namespace kvsnap
