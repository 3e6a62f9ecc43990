// The bed the s3 tests run in (tests/beds/swift-s3.sh run exports S3_*): its
// client configuration, a fresh bucket per test, and the bed's own controls.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <random>
#include <string>

#include "store/s3_client.h"

namespace kvsnap::s3test {

inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// The bed's configuration with a bucket of its own, or nullopt outside a bed.
inline std::optional<S3Config> bed_config() {
  if (!env("S3_ENDPOINT") || !env("S3_ACCESS_KEY") || !env("S3_SECRET_KEY")) return std::nullopt;
  S3Config c;
  c.endpoint = env("S3_ENDPOINT");
  c.access_key = env("S3_ACCESS_KEY");
  c.secret_key = env("S3_SECRET_KEY");
  if (env("S3_REGION")) c.region = env("S3_REGION");
  static std::mt19937_64 rng{std::random_device{}()};
  c.bucket = "kvsnap-test-" + std::to_string(rng() % 1000000000000ull);
  return c;
}

#define KVSNAP_S3_BED_OR_SKIP(cfg)                                                                           \
  std::optional<::kvsnap::S3Config> cfg = ::kvsnap::s3test::bed_config();                                    \
  if (!cfg) GTEST_SKIP() << "no S3 bed: run through tests/beds/swift-s3.sh run DIR auto CMD (ctest -L s3)"; \
  do {                                                                                                       \
  } while (0)

// `swift-s3.sh pause|resume <bed dir>`: stops or restarts the bed's proxy.
inline int bed_control(const std::string& what) {
  const char* script = env("S3_BED_SCRIPT");
  const char* dir = env("S3_BED_DIR");
  if (!script || !dir) return -1;
  return std::system(("bash '" + std::string(script) + "' " + what + " '" + dir + "'").c_str());
}

inline std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    b = std::byte(x);
  }
  return v;
}

}  // namespace kvsnap::s3test
