// SHA-256 of several independent messages at once, each fed in pieces.
//
// One SHA-256 stream is bound by the latency of its round chain, not by the core's throughput:
// two or four streams interleaved in one thread (SHA-NI; two with ARMv8's SHA-2 instructions) or
// eight in the lanes of AVX2 registers
// (CPUs without SHA-NI; with AVX-512VL's rotate and three-input logic where the CPU has it) hash
// more bytes per second than one. Sha256Lanes gives the same digests as
// Sha256 (base/sha256.h, OpenSSL) for every message, whatever the kernel, the lane count and
// the way a message is cut into pieces: lanes have their own lengths and finish at different
// times. Blocks of two or more lanes fed in the same update() go through the kernel together.
//
// The kernel is chosen once per process: KVSNAP_SHA=openssl|shani-x2|shani-x4|avx2-x8|avx512-x8|armv8-x2
// (tests, benches; a kernel this CPU lacks falls back to the best it has), KVSNAP_SIMD=scalar means
// openssl (and KVSNAP_SIMD=avx2 avx2-x8 for avx512-x8), otherwise where the CPU has SHA-NI
// shani-x4 on AMD Zen 5 (measured faster there) and shani-x2 on the others, avx512-x8 where it has
// AVX-512VL, avx2-x8 where it has AVX2; on aarch64 armv8-x2 where the CPU has the SHA-2
// instructions; else openssl.
//
// Failure policy: as base/sha256.h (allocation only, std::bad_alloc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "base/sha256.h"

namespace kvsnap {

enum class Sha256Kernel { kOpenssl, kShaniX2, kAvx2X8, kShaniX4, kAvx512X8, kArmv8X2 };
// Every kernel, for the lists of those a CPU runs (kvsnap doctor, the tests).
inline constexpr Sha256Kernel kSha256Kernels[] = {Sha256Kernel::kOpenssl, Sha256Kernel::kShaniX2,
                                                  Sha256Kernel::kShaniX4, Sha256Kernel::kAvx2X8,
                                                  Sha256Kernel::kAvx512X8, Sha256Kernel::kArmv8X2};

// The process's kernel (see above).
Sha256Kernel sha256_kernel();
// "openssl", "shani-x2", "shani-x4", "avx2-x8", "avx512-x8", "armv8-x2".
const char* sha256_kernel_name(Sha256Kernel k);
// Whether this CPU (and build) can run `k`.
bool sha256_kernel_supported(Sha256Kernel k);
// How many lanes a caller should fill at once for `k` to run at full speed: 1, 2, 4 or 8.
size_t sha256_kernel_width(Sha256Kernel k);

class Sha256Lanes {
 public:
  static constexpr size_t kMaxLanes = 8;
  using Pieces = std::array<std::span<const std::byte>, kMaxLanes>;

  // `k` must be supported (sha256_kernel_supported); the default is the process's.
  explicit Sha256Lanes(Sha256Kernel k = sha256_kernel());
  ~Sha256Lanes();
  Sha256Lanes(const Sha256Lanes&) = delete;
  Sha256Lanes& operator=(const Sha256Lanes&) = delete;

  Sha256Kernel kernel() const { return kernel_; }

  // Appends pieces[i] to lane i's message (an empty piece appends nothing).
  void update(const Pieces& pieces);
  void update(size_t lane, std::span<const std::byte> piece);
  // The digest of lane `lane`'s message; that lane starts over, the others go on.
  Sha256Digest finish(size_t lane);

 private:
  struct Lane {
    std::array<uint32_t, 8> h;
    std::array<uint8_t, 64> buf;  // a partial block
    size_t buffered = 0;
    uint64_t total = 0;  // bytes fed
  };
  void reset(Lane& l);
  // Runs the kernel over `blocks[i]` whole blocks from `data[i]` for each lane.
  void compress(const std::array<const uint8_t*, kMaxLanes>& data, const std::array<size_t, kMaxLanes>& blocks);

  Sha256Kernel kernel_;
  std::array<Lane, kMaxLanes> lanes_;
  std::unique_ptr<Sha256[]> openssl_;  // kOpenssl: one hasher per lane
};

// The SHA-256 of each message, together (messages.size() <= Sha256Lanes::kMaxLanes).
void sha256_many(std::span<const std::span<const std::byte>> messages, std::span<Sha256Digest> out,
                 Sha256Kernel k = sha256_kernel());

}  // namespace kvsnap
