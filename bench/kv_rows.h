// Synthetic K/V-like rows for the benches (kvsnap-bench, kvsnap-requant-error): one generator, so
// a figure in docs/performance.md and one in docs/fidelity.md come from the same data.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace kvsnap::bench {

// splitmix64
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
};

// K-like rows: N(0,1) per value times a per-channel scale in [0.25, 4], a few outlier channels
// (x20), and a per-row drift; realistic for post-RoPE keys and for values.
inline std::vector<float> make_rows(uint64_t rows, uint32_t n, uint64_t seed) {
  Rng rng{seed};
  std::vector<float> scale(n);
  for (uint32_t c = 0; c < n; c++) {
    scale[c] = static_cast<float>(std::exp2(rng.uniform() * 4.0 - 2.0));
    if (rng.next() % 64 == 0) scale[c] *= 20.0f;
  }
  std::vector<float> x(rows * n);
  for (uint64_t r = 0; r < rows; r++) {
    const double drift = 0.75 + 0.5 * rng.uniform();
    for (uint32_t c = 0; c < n; c += 2) {
      const double u1 = rng.uniform() + 0x1p-60, u2 = rng.uniform();
      const double m = std::sqrt(-2.0 * std::log(u1));
      x[r * n + c] = static_cast<float>(m * std::cos(2 * M_PI * u2) * scale[c] * drift);
      if (c + 1 < n) x[r * n + c + 1] = static_cast<float>(m * std::sin(2 * M_PI * u2) * scale[c + 1] * drift);
    }
  }
  return x;
}

}  // namespace kvsnap::bench
