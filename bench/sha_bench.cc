// kvsnap-sha-bench: SHA-256 speed on one thread, OpenSSL's one stream beside the Sha256Lanes
// kernels (base/sha256_lanes.h) filling their lanes with independent messages. Prints GB per CPU
// second (this thread's) per kernel; asserts nothing about time.
//
//   kvsnap-sha-bench [--kib 512] [--seconds 1]
//   OPENSSL_ia32cap=":~0x20000000" kvsnap-sha-bench    # OpenSSL as on a CPU without SHA-NI
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "base/sha256_lanes.h"

namespace {

// This thread's CPU seconds: on a shared machine the wall clock counts other processes' turns.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Runs `hash_round` (which hashes `bytes_per_round`) for about `seconds` of CPU; GB per CPU second.
template <typename F>
double rate(double seconds, size_t bytes_per_round, F hash_round) {
  hash_round();  // warm up
  size_t rounds = 0;
  const double t0 = cpu_now();
  double dt = 0;
  do {
    hash_round();
    ++rounds;
    dt = cpu_now() - t0;
  } while (dt < seconds);
  return double(rounds) * double(bytes_per_round) / dt / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvsnap;
  size_t kib = 512;
  double seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--kib") == 0) kib = std::strtoul(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::strtod(argv[i + 1], nullptr);
  }
  const size_t len = kib * 1024;
  std::vector<std::vector<std::byte>> msgs(Sha256Lanes::kMaxLanes, std::vector<std::byte>(len));
  std::mt19937_64 rng(1);
  for (auto& m : msgs)
    for (auto& b : m) b = std::byte(rng());
  Sha256Digest sink{};
  const double one = rate(seconds, len, [&] { sink[0] ^= sha256_of(msgs[0])[0]; });
  std::printf("openssl, one stream%s: %.3f GB/s (messages of %zu KiB)\n",
              std::getenv("OPENSSL_ia32cap") ? " (OPENSSL_ia32cap set)" : "", one, kib);
  for (Sha256Kernel k : kSha256Kernels) {
    if (k == Sha256Kernel::kOpenssl) continue;  // its one stream is the line above
    if (!sha256_kernel_supported(k)) {
      std::printf("%s: not on this CPU\n", sha256_kernel_name(k));
      continue;
    }
    for (size_t n : {size_t(1), size_t(2), size_t(3), size_t(4), size_t(8)}) {
      if (n > sha256_kernel_width(k)) break;
      Sha256Lanes lanes(k);
      // A fast wrong kernel must not look good: its digests first, against OpenSSL's.
      {
        Sha256Lanes::Pieces p{};
        for (size_t i = 0; i < n; ++i) p[i] = msgs[i];
        lanes.update(p);
        for (size_t i = 0; i < n; ++i) {
          if (lanes.finish(i) != sha256_of(msgs[i])) {
            std::printf("%s, %zu lanes: lane %zu's digest differs from OpenSSL's\n", sha256_kernel_name(k), n, i);
            return 1;
          }
        }
      }
      const double r = rate(seconds, n * len, [&] {
        Sha256Lanes::Pieces p{};
        for (size_t i = 0; i < n; ++i) p[i] = msgs[i];
        lanes.update(p);
        for (size_t i = 0; i < n; ++i) sink[0] ^= lanes.finish(i)[0];
      });
      std::printf("%s, %zu lane%s: %.3f GB/s (%.2fx openssl)\n", sha256_kernel_name(k), n, n > 1 ? "s" : "", r, r / one);
    }
  }
  // The digests' bytes go through an empty asm the compiler must assume reads them, so the
  // hashing is not optimised away (and the exit status does not depend on them).
  asm volatile("" : : "r"(sink.data()) : "memory");
  return 0;
}
