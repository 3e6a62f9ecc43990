// base/sha256_lanes.h: every kernel this CPU runs gives OpenSSL's digest (base/sha256.h) for
// every message, however it is cut into pieces and whatever the other lanes do.
#include "base/sha256_lanes.h"

#include "base/simd_level.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace kvsnap {
namespace {

using Bytes = std::vector<std::byte>;

Bytes random_bytes(std::mt19937_64& rng, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = std::byte(rng());
  return b;
}

// The kernels this machine runs (OpenSSL always); a test names the kernel in its failures.
std::vector<Sha256Kernel> kernels() {
  std::vector<Sha256Kernel> ks;
  for (Sha256Kernel k : kSha256Kernels)
    if (sha256_kernel_supported(k)) ks.push_back(k);
  return ks;
}

// Feeds `msgs` (one per lane) to `h` in random pieces, every lane in each update, until all is
// fed; then checks each lane's digest against OpenSSL's.
void check_random_pieces(Sha256Lanes& h, const std::vector<Bytes>& msgs, std::mt19937_64& rng, size_t max_piece) {
  std::vector<size_t> at(msgs.size(), 0);
  for (bool more = true; more;) {
    more = false;
    Sha256Lanes::Pieces p{};
    for (size_t i = 0; i < msgs.size(); ++i) {
      const size_t n = std::min<size_t>(rng() % (max_piece + 1), msgs[i].size() - at[i]);
      p[i] = std::span(msgs[i]).subspan(at[i], n);
      at[i] += n;
      more = more || at[i] < msgs[i].size();
    }
    h.update(p);
  }
  for (size_t i = 0; i < msgs.size(); ++i)
    ASSERT_EQ(to_hex(h.finish(i)), to_hex(sha256_of(msgs[i])))
        << sha256_kernel_name(h.kernel()) << ", lane " << i << " of " << msgs.size() << ", " << msgs[i].size() << " bytes";
}

TEST(Sha256Lanes, KnownVectorsOnEveryKernel) {
  const std::string abc = "abc";
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  for (Sha256Kernel k : kernels()) {
    Sha256Lanes h(k);
    EXPECT_EQ(h.kernel(), k);
    h.update(1, std::as_bytes(std::span(abc)));
    h.update(2, std::as_bytes(std::span(two)));
    EXPECT_EQ(to_hex(h.finish(0)), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") << sha256_kernel_name(k);
    EXPECT_EQ(to_hex(h.finish(1)), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") << sha256_kernel_name(k);
    EXPECT_EQ(to_hex(h.finish(2)), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") << sha256_kernel_name(k);
  }
}

TEST(Sha256Lanes, EveryLengthUpTo300InOnePieceAndByteByByte) {
  std::mt19937_64 rng(1);
  const Bytes m = random_bytes(rng, 300);
  for (Sha256Kernel k : kernels()) {
    Sha256Lanes h(k);
    for (size_t n = 0; n <= 300; ++n) {
      const std::span<const std::byte> msg = std::span(m).first(n);
      const size_t lane = n % Sha256Lanes::kMaxLanes;
      h.update(lane, msg);
      ASSERT_EQ(h.finish(lane), sha256_of(msg)) << sha256_kernel_name(k) << ", " << n << " bytes in one piece";
      for (size_t i = 0; i < n; ++i) h.update(lane, msg.subspan(i, 1));
      ASSERT_EQ(h.finish(lane), sha256_of(msg)) << sha256_kernel_name(k) << ", " << n << " bytes one by one";
    }
  }
}

TEST(Sha256Lanes, LanesOfUnequalLengthInRandomPieces) {
  std::mt19937_64 rng(2);
  for (Sha256Kernel k : kernels()) {
    Sha256Lanes h(k);
    for (int round = 0; round < 60; ++round) {
      const size_t lanes = 1 + rng() % Sha256Lanes::kMaxLanes;
      std::vector<Bytes> msgs;
      for (size_t i = 0; i < lanes; ++i) msgs.push_back(random_bytes(rng, rng() % (round < 30 ? 700 : 20000)));
      check_random_pieces(h, msgs, rng, round % 2 ? 200 : 5000);
    }
  }
}

TEST(Sha256Lanes, LargeMessagesInBlockPieces) {
  // As a decode feeds them: 64 KiB pieces, lanes ending at different times, one lane alone at the end.
  std::mt19937_64 rng(3);
  std::vector<Bytes> msgs;
  for (size_t i = 0; i < Sha256Lanes::kMaxLanes; ++i) msgs.push_back(random_bytes(rng, (1 << 20) + 4096 * i + (i % 3) * 17));
  for (Sha256Kernel k : kernels()) {
    for (size_t lanes : {size_t(2), size_t(3), size_t(8)}) {
      Sha256Lanes h(k);
      std::vector<Bytes> some(msgs.begin(), msgs.begin() + lanes);
      std::vector<size_t> at(lanes, 0);
      for (bool more = true; more;) {
        more = false;
        Sha256Lanes::Pieces p{};
        for (size_t i = 0; i < lanes; ++i) {
          const size_t n = std::min<size_t>(65536, some[i].size() - at[i]);
          p[i] = std::span(some[i]).subspan(at[i], n);
          at[i] += n;
          more = more || at[i] < some[i].size();
        }
        h.update(p);
      }
      for (size_t i = 0; i < lanes; ++i) ASSERT_EQ(h.finish(i), sha256_of(some[i])) << sha256_kernel_name(k) << " lane " << i;
    }
  }
}

TEST(Sha256Lanes, FinishingOneLaneLeavesTheOthersGoing) {
  std::mt19937_64 rng(4);
  const Bytes a = random_bytes(rng, 1000), b = random_bytes(rng, 3000);
  for (Sha256Kernel k : kernels()) {
    Sha256Lanes h(k);
    h.update(0, std::span(a).first(500));
    h.update(1, std::span(b).first(1500));
    EXPECT_EQ(h.finish(1), sha256_of(std::span(b).first(1500))) << sha256_kernel_name(k);
    h.update(0, std::span(a).subspan(500));
    h.update(1, b);
    EXPECT_EQ(h.finish(0), sha256_of(a)) << sha256_kernel_name(k);
    EXPECT_EQ(h.finish(1), sha256_of(b)) << sha256_kernel_name(k);
  }
}

TEST(Sha256Lanes, ManyAtOnce) {
  std::mt19937_64 rng(5);
  std::vector<Bytes> msgs;
  for (size_t i = 0; i < 5; ++i) msgs.push_back(random_bytes(rng, 777 * i));
  std::vector<std::span<const std::byte>> views(msgs.begin(), msgs.end());
  for (Sha256Kernel k : kernels()) {
    std::vector<Sha256Digest> out(msgs.size());
    sha256_many(views, out, k);
    for (size_t i = 0; i < msgs.size(); ++i) EXPECT_EQ(out[i], sha256_of(msgs[i])) << sha256_kernel_name(k);
  }
}

TEST(Sha256Lanes, KernelNamesAndWidths) {
  EXPECT_STREQ(sha256_kernel_name(Sha256Kernel::kShaniX2), "shani-x2");
  EXPECT_STREQ(sha256_kernel_name(Sha256Kernel::kShaniX4), "shani-x4");
  EXPECT_STREQ(sha256_kernel_name(Sha256Kernel::kAvx2X8), "avx2-x8");
  EXPECT_STREQ(sha256_kernel_name(Sha256Kernel::kAvx512X8), "avx512-x8");
  EXPECT_STREQ(sha256_kernel_name(Sha256Kernel::kArmv8X2), "armv8-x2");
  EXPECT_STREQ(sha256_kernel_name(Sha256Kernel::kOpenssl), "openssl");
  EXPECT_EQ(sha256_kernel_width(Sha256Kernel::kShaniX2), 2u);
  EXPECT_EQ(sha256_kernel_width(Sha256Kernel::kShaniX4), 4u);
  EXPECT_EQ(sha256_kernel_width(Sha256Kernel::kAvx2X8), 8u);
  EXPECT_EQ(sha256_kernel_width(Sha256Kernel::kAvx512X8), 8u);
  EXPECT_EQ(sha256_kernel_width(Sha256Kernel::kArmv8X2), 2u);
  EXPECT_EQ(sha256_kernel_width(Sha256Kernel::kOpenssl), 1u);
  EXPECT_TRUE(sha256_kernel_supported(sha256_kernel()));
  // A kernel this CPU lacks falls back to OpenSSL instead of faulting.
  for (Sha256Kernel k : {Sha256Kernel::kShaniX2, Sha256Kernel::kShaniX4, Sha256Kernel::kAvx2X8, Sha256Kernel::kAvx512X8,
                         Sha256Kernel::kArmv8X2})
    if (!sha256_kernel_supported(k)) {
      EXPECT_EQ(Sha256Lanes(k).kernel(), Sha256Kernel::kOpenssl);
    }
}

// The kernel chosen without KVSNAP_SHA: four SHA-NI chains on Zen 5 (AMD family 0x1A), two on
// other SHA-NI CPUs, else the widest lanes.
Sha256Kernel best_kernel() {
  const Sha256Kernel shani = simd::amd_family() == 0x1A ? Sha256Kernel::kShaniX4 : Sha256Kernel::kShaniX2;
  return sha256_kernel_supported(Sha256Kernel::kShaniX2)    ? shani
         : sha256_kernel_supported(Sha256Kernel::kAvx512X8) ? Sha256Kernel::kAvx512X8
         : sha256_kernel_supported(Sha256Kernel::kAvx2X8)   ? Sha256Kernel::kAvx2X8
         : sha256_kernel_supported(Sha256Kernel::kArmv8X2)  ? Sha256Kernel::kArmv8X2
                                                            : Sha256Kernel::kOpenssl;
}

// Run by ctest also as base.sha256_kernel_env.* with KVSNAP_SHA / KVSNAP_SIMD set.
TEST(Sha256Lanes, EnvironmentChoosesTheKernel) {
  const char* simd = std::getenv("KVSNAP_SIMD");
  const char* want = std::getenv("KVSNAP_SHA");
  // KVSNAP_SIMD=scalar lowers a CPU that has more; one whose best is scalar (SHA-NI without AVX2)
  // keeps its kernel and goes on below.
  if (simd && std::string(simd) == "scalar" && simd::best_level() != simd::Level::kScalar) {
    EXPECT_EQ(sha256_kernel(), Sha256Kernel::kOpenssl);
  } else if (simd && std::string(simd) == "avx2" && want && std::string(want) == "avx512-x8" &&
             sha256_kernel_supported(Sha256Kernel::kAvx512X8)) {
    // KVSNAP_SIMD=avx2 on an AVX-512 CPU runs what an AVX2 CPU runs: AVX2's lanes.
    EXPECT_EQ(sha256_kernel(), Sha256Kernel::kAvx2X8);
  } else if (want) {
    const std::string got = sha256_kernel_name(sha256_kernel());
    bool known = false, supported = false;
    for (Sha256Kernel k : kSha256Kernels) known = known || want == std::string(sha256_kernel_name(k));
    for (Sha256Kernel k : kernels()) supported = supported || want == std::string(sha256_kernel_name(k));
    // A name no kernel has is a mistake in the test's list (ctest), not a CPU without it.
    EXPECT_TRUE(known) << "KVSNAP_SHA=" << want << " names no kernel";
    if (supported) {
      EXPECT_EQ(got, want);
    } else {
      // A kernel this CPU lacks gives the best it has (an audit's finding: nothing was checked then).
      EXPECT_EQ(sha256_kernel(), best_kernel()) << "KVSNAP_SHA=" << want << " on a CPU without it gave " << got;
    }
  } else {
    EXPECT_EQ(sha256_kernel(), best_kernel());
  }
}

}  // namespace
}  // namespace kvsnap
