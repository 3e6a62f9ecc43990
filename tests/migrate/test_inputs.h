// Deterministic inputs shared by the migrate unit tests, the golden generator and the
// oracle test: named hard-case rows, seeded random rows in several distributions, and a
// digest. Everything is integer arithmetic or exact float operations (no libm, no <random>
// distributions), so the same seed gives the same floats on every platform and compiler.
// Keep every a*b+c exact (b a power of two, or small integers): a compiler may fuse it into
// an FMA (-march=native), and the golden files pin these inputs by digest.
#pragma once

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvsnap::testing {

inline float bits_f32(uint32_t w) { return std::bit_cast<float>(w); }
inline uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }

// splitmix64
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t u32() { return static_cast<uint32_t>(next() >> 32); }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>((next() >> 32) % n); }
  // [-1, 1), multiples of 2^-23: exact
  float uniform() { return static_cast<float>(static_cast<int32_t>(u32() >> 8) - (1 << 23)) * 0x1p-23f; }

 private:
  uint64_t s_;
};

// FNV-1a 64 over bytes: the digest stored in golden files.
inline uint64_t fnv1a(std::span<const std::byte> bytes, uint64_t h = 0xcbf29ce484222325ull) {
  for (std::byte b : bytes) {
    h ^= static_cast<uint8_t>(b);
    h *= 0x100000001b3ull;
  }
  return h;
}
template <class T>
uint64_t fnv1a_of(const std::vector<T>& v, uint64_t h = 0xcbf29ce484222325ull) {
  return fnv1a(std::as_bytes(std::span<const T>(v)), h);
}

// ---- random rows ------------------------------------------------------------------------

enum class Dist {
  kUniform,     // [-1, 1)
  kGauss,       // sum of four uniforms, times 2: bell-shaped, exact arithmetic
  kKvLike,      // gauss times a per-channel scale 2^[-4, 4], a few 30x outlier channels
  kHeavyTail,   // random sign, exponent 2^[-30, 30], random mantissa
  kOutliers,    // small uniform, 1 in 16 values 1000x larger
  kSparse,      // 3 in 4 values exactly zero
  kTinyScale,   // uniform times 2^-20 (fp16 scales become subnormal)
  kBigScale,    // uniform times 2^17 (fp16 scales overflow for the 4/5-bit types)
  kF16Exact,    // random fp16 codes (no NaN), as float: what an f16 cache dequantizes to
  kRandomBits,  // any 32-bit pattern: NaN, inf, denormals included
};
inline constexpr Dist kAllDists[] = {Dist::kUniform,  Dist::kGauss,     Dist::kKvLike,   Dist::kHeavyTail,
                                     Dist::kOutliers, Dist::kSparse,    Dist::kTinyScale, Dist::kBigScale,
                                     Dist::kF16Exact, Dist::kRandomBits};

inline const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kUniform: return "uniform";
    case Dist::kGauss: return "gauss";
    case Dist::kKvLike: return "kvlike";
    case Dist::kHeavyTail: return "heavytail";
    case Dist::kOutliers: return "outliers";
    case Dist::kSparse: return "sparse";
    case Dist::kTinyScale: return "tinyscale";
    case Dist::kBigScale: return "bigscale";
    case Dist::kF16Exact: return "f16exact";
    case Dist::kRandomBits: return "randombits";
  }
  return "?";
}

// fp16 code -> float, independent of the code under test (exact for non-NaN codes).
inline float f16_code_value(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = static_cast<float>(man) * 0x1p-24f;
  } else if (exp == 31) {
    v = std::numeric_limits<float>::infinity();
  } else {
    v = bits_f32(((exp + 112) << 23) | (man << 13));
  }
  return bits_f32(f32_bits(v) | sign);
}

// rows x n values, row-major.
inline std::vector<float> random_rows(Dist dist, uint64_t seed, size_t rows, size_t n) {
  Rng rng(seed * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(dist) + 1);
  std::vector<float> scale(n, 1.0f);
  if (dist == Dist::kKvLike) {
    for (size_t j = 0; j < n; j++) {
      scale[j] = bits_f32(static_cast<uint32_t>(127 + static_cast<int>(rng.below(9)) - 4) << 23);
      if (rng.below(32) == 0) scale[j] *= 30.0f;
    }
  }
  std::vector<float> out(rows * n);
  for (size_t i = 0; i < rows * n; i++) {
    const size_t j = i % n;
    float v = 0;
    switch (dist) {
      case Dist::kUniform: v = rng.uniform(); break;
      case Dist::kGauss: v = (rng.uniform() + rng.uniform() + rng.uniform() + rng.uniform()) * 2.0f; break;
      case Dist::kKvLike:
        v = (rng.uniform() + rng.uniform() + rng.uniform() + rng.uniform()) * scale[j];
        break;
      case Dist::kHeavyTail: {
        const uint32_t e = 127 - 30 + rng.below(61);
        v = bits_f32((rng.u32() & 0x80000000u) | (e << 23) | (rng.u32() & 0x7fffffu));
        break;
      }
      case Dist::kOutliers: v = rng.uniform() * (rng.below(16) == 0 ? 1000.0f : 1.0f); break;
      case Dist::kSparse: v = rng.below(4) == 0 ? rng.uniform() : 0.0f; break;
      case Dist::kTinyScale: v = rng.uniform() * 0x1p-20f; break;
      case Dist::kBigScale: v = rng.uniform() * 0x1p17f; break;
      case Dist::kF16Exact: {
        uint16_t h;
        do {
          h = static_cast<uint16_t>(rng.u32());
        } while ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
        v = f16_code_value(h);
        break;
      }
      case Dist::kRandomBits: v = bits_f32(rng.u32()); break;
    }
    out[i] = v;
  }
  return out;
}

// Random bytes, with every block's scale (and min) drawn from special fp16 codes half the
// time: for testing to_f32 on arbitrary rows, including NaN/inf/subnormal scales.
inline std::vector<std::byte> random_blocks(uint64_t seed, size_t n_blocks, size_t block_bytes, bool quantized) {
  Rng rng(seed ^ 0xA5A5A5A5ull);
  std::vector<std::byte> out(n_blocks * block_bytes);
  for (auto& b : out) b = static_cast<std::byte>(rng.u32() & 0xff);
  if (quantized) {
    static constexpr uint16_t kSpecial[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x3c00, 0xbc00,
                                            0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe01};
    for (size_t i = 0; i < n_blocks; i++) {
      for (size_t k = 0; k < 2; k++) {
        if (rng.below(2) == 0) {
          const uint16_t h = kSpecial[rng.below(sizeof(kSpecial) / sizeof(kSpecial[0]))];
          std::memcpy(out.data() + i * block_bytes + 2 * k, &h, 2);
        }
      }
    }
  }
  return out;
}

// f32 bit patterns around every f16 and bf16 rounding point: for each of the 65536 high
// halves, 24 low halves (ties, neighbours of ties, truncation edges). 1.5M values.
inline std::vector<float> half_sweep() {
  static constexpr uint32_t kLow[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001,
                                      0x3000, 0x5000, 0x7000, 0x7fff, 0x8000, 0x8001, 0x8fff, 0x9000,
                                      0x9001, 0xa000, 0xbfff, 0xc000, 0xe000, 0xefff, 0xf000, 0xffff};
  std::vector<float> out;
  out.reserve(65536 * std::size(kLow));
  for (uint32_t hi = 0; hi < 65536; hi++) {
    for (uint32_t lo : kLow) out.push_back(bits_f32((hi << 16) | lo));
  }
  return out;
}

// ---- hard cases ---------------------------------------------------------------------------

struct Case {
  std::string name;
  std::vector<float> x;  // 64 values: two blocks of 32
};

inline std::vector<Case> hard_cases() {
  constexpr size_t n = 64;
  const float inf = std::numeric_limits<float>::infinity();
  const float qnan = bits_f32(0x7fc00000);
  std::vector<Case> cs;
  auto add = [&](std::string name, auto fill) {
    Case c{std::move(name), std::vector<float>(n, 0.0f)};
    for (size_t j = 0; j < n; j++) c.x[j] = fill(j);
    cs.push_back(std::move(c));
  };
  auto ramp = [](size_t j) { return (static_cast<float>(j) - 31.5f) / 32.0f; };

  add("zeros", [](size_t) { return 0.0f; });
  add("neg_zeros", [](size_t) { return -0.0f; });
  add("mixed_zeros", [](size_t j) { return j % 2 ? -0.0f : 0.0f; });
  add("equal_pos", [](size_t) { return 0.7f; });
  add("equal_neg", [](size_t) { return -3.25f; });
  add("equal_per_block", [](size_t j) { return j < 32 ? 1.0f : -1.0f; });
  add("spike", [](size_t j) { return j == 5 ? 2.5f : j == 40 ? -1e-3f : 0.0f; });
  add("ramp", ramp);
  add("alternating_large", [](size_t j) { return (j % 2 ? -1.0f : 1.0f) * (1.0f + 0.125f * static_cast<float>(j)); });
  add("denormals", [](size_t j) { return (j % 2 ? -1.0f : 1.0f) * bits_f32(static_cast<uint32_t>(1 + 37 * j)); });
  add("denormal_and_normal",
      [](size_t j) { return j == 7 || j == 50 ? 1e-38f : bits_f32(static_cast<uint32_t>(1000 + j)); });
  add("min_denormal", [](size_t j) { return j % 3 == 0 ? bits_f32(1) : j % 3 == 1 ? -bits_f32(1) : 0.0f; });
  add("near_group_eps", [](size_t j) {
    const float v[] = {9.99e-16f, 1e-15f, 1.0001e-15f, 2e-15f};
    return (j % 2 ? -1.0f : 1.0f) * v[j / 16];
  });
  add("scale_fp16_subnormal", [&](size_t j) { return ramp(j) * 2e-6f; });
  add("scale_fp16_underflow", [&](size_t j) { return ramp(j) * 1e-9f; });
  add("scale_fp16_overflow", [&](size_t j) { return ramp(j) * 2e6f; });
  add("scale_fp16_edge", [&](size_t j) { return j < 32 ? ramp(j) * 65504.0f * 8.0f * 2.0f : ramp(j) * 65504.0f * 127.0f * 2.0f; });
  add("huge_range", [](size_t j) {
    const float v[] = {1e30f, -1e-30f, FLT_MAX, -FLT_MAX, 1e-45f, 1.0f, -2.0f, 3e38f};
    return v[j % 8];
  });
  add("flt_max_pair", [](size_t j) { return j % 2 ? FLT_MAX : -FLT_MAX; });
  add("flt_max_one", [](size_t j) { return j == 9 || j == 33 ? FLT_MAX : 1.0f; });
  add("inf_pos", [&](size_t j) { return j == 3 || j == 60 ? inf : ramp(j); });
  add("inf_neg", [&](size_t j) { return j == 3 || j == 60 ? -inf : ramp(j); });
  add("inf_both", [&](size_t j) { return j == 3 || j == 40 ? inf : j == 4 || j == 41 ? -inf : ramp(j); });
  add("inf_all", [&](size_t j) { return j % 2 ? -inf : inf; });
  add("nan_first", [&](size_t j) { return j % 32 == 0 ? qnan : ramp(j); });
  add("nan_last", [&](size_t j) { return j % 32 == 31 ? qnan : ramp(j); });
  add("nan_at_max", [&](size_t j) { return j == 10 ? qnan : j == 11 ? -5.0f : ramp(j); });
  add("nan_all", [&](size_t) { return qnan; });
  add("nan_signalling_and_negative",
      [&](size_t j) { return j % 4 == 0 ? bits_f32(0x7f800001) : j % 4 == 1 ? bits_f32(0xffc00000) : ramp(j); });
  add("nan_and_inf", [&](size_t j) { return j % 5 == 0 ? qnan : j % 5 == 1 ? inf : ramp(j); });
  // q8_0: amax 127 -> d = 1, id = 1: x.5 values are roundf ties (away from zero).
  add("ties_q8_0", [](size_t j) {
    if (j == 0) return 127.0f;
    if (j == 32) return -127.0f;
    return (static_cast<float>(j % 32) - 16.0f) + 0.5f;
  });
  // q4_0: max -8 -> d = 1, id = 1: (int8_t)(x + 8.5f) at and next to integer boundaries.
  add("ties_q4_0", [](size_t j) {
    if (j % 32 == 0) return -8.0f;
    const float base = static_cast<float>(static_cast<int>(j % 16)) - 7.5f;
    const int k = static_cast<int>(j / 16);
    return k == 0 ? base : k == 1 ? std::nextafter(base, 100.0f) : k == 2 ? std::nextafter(base, -100.0f) : base * 0.5f;
  });
  add("ties_q5_0", [](size_t j) {
    if (j % 32 == 0) return -16.0f;
    return static_cast<float>(static_cast<int>(j % 32)) - 15.5f;
  });
  // q4_1/q5_1: min 0, max 15 (31) -> d = 1: x + 0.5 at half-integers.
  add("ties_q4_1", [](size_t j) {
    if (j % 32 == 0) return 0.0f;
    if (j % 32 == 1) return 15.0f;
    return static_cast<float>(j % 16) + (j < 32 ? 0.5f : 0.49999997f);
  });
  add("ties_q5_1", [](size_t j) {
    if (j % 32 == 0) return 0.0f;
    if (j % 32 == 1) return 31.0f;
    return static_cast<float>(j % 31) + 0.5f;
  });
  // fp16 round-to-nearest-even ties and edges.
  add("ties_fp16", [](size_t j) {
    const float v[] = {1.0f + 0x1p-11f,     1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-23f, 65504.0f,
                       65519.996f,           65520.0f,            0x1p-25f,                   3 * 0x1p-25f,
                       0x1p-24f,             0x1p-14f,            0x1p-14f - 0x1p-25f,        0x1.ffcp-15f,
                       -(1.0f + 0x1p-11f),   2049.0f,             2051.0f,                    -0x1p-25f};
    return v[j % 16] * (j < 32 ? 1.0f : -1.0f);
  });
  add("ties_bf16", [](size_t j) {
    const uint32_t v[] = {0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff, 0x7f7fffff, 0x7f7f8000,
                          0x7f7f7fff, 0x00008000, 0x00018000, 0x00007fff, 0x80008000, 0xbf808000,
                          0x7f800000, 0x7f800001, 0x7fffffff, 0xff800001};
    return bits_f32(v[j % 16]);
  });
  // iq4_nl: the table values times a scale, and the midpoints between neighbours.
  add("iq4_nl_grid", [](size_t j) {
    static constexpr int8_t kv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    const float d = 0.01f;
    if (j < 32) return d * static_cast<float>(kv[j % 16]);
    const size_t k = j % 15;
    return d * (static_cast<float>(kv[k]) + static_cast<float>(kv[k + 1])) * 0.5f;
  });
  add("iq4_nl_max_positive", [&](size_t j) { return j % 32 == 17 ? 4.0f : ramp(j); });
  return cs;
}

}  // namespace kvsnap::testing
