// base/sha256_lanes.h against OpenSSL's SHA-256 (base/sha256.h) on fuzzer input, for every
// kernel this CPU runs: a digest that differs aborts.
//
// Input: byte 0 = the number of lanes (low 3 bits + 1); byte 1 seeds the piece sizes; the rest
// is cut into that many messages of lengths taken from it. Each update feeds every lane a piece
// (sizes from a small generator seeded by byte 1), so lanes end at different times.
#include <array>
#include <cstdlib>
#include <vector>

#include "base/sha256_lanes.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvsnap;
  if (size < 2) return 0;
  const size_t lanes = (data[0] & 7) + 1;
  uint32_t seed = data[1] | 1u;
  const std::span<const std::byte> in = fuzz::bytes(data, size).subspan(2);
  // Lane i takes the i-th of `lanes` near-equal parts, shifted by the seed so lengths differ.
  std::vector<std::span<const std::byte>> msgs;
  for (size_t i = 0, at = 0; i < lanes; ++i) {
    size_t n = i + 1 == lanes ? in.size() - at : std::min(in.size() - at, in.size() / lanes + (seed >> i) % 97);
    msgs.push_back(in.subspan(at, n));
    at += n;
  }
  auto next_piece = [&seed] {
    seed = seed * 1103515245u + 12345u;
    const uint32_t r = seed >> 16;
    return size_t(r % 4 == 0 ? r % 3 : r % 4 == 1 ? r % 130 : r % 2000);
  };
  for (Sha256Kernel k : kSha256Kernels) {
    if (!sha256_kernel_supported(k)) continue;
    Sha256Lanes h(k);
    std::vector<size_t> at(lanes, 0);
    for (bool more = true; more;) {
      more = false;
      Sha256Lanes::Pieces p{};
      for (size_t i = 0; i < lanes; ++i) {
        const size_t n = std::min(next_piece(), msgs[i].size() - at[i]);
        p[i] = msgs[i].subspan(at[i], n);
        at[i] += n;
        more = more || at[i] < msgs[i].size();
      }
      h.update(p);
    }
    for (size_t i = 0; i < lanes; ++i)
      if (h.finish(i) != sha256_of(msgs[i])) std::abort();
  }
  return 0;
}
