// kvsnap-simd-check: every SIMD level against the scalar reference, byte for byte.
//
// The scalar codecs are pinned to ggml by tests/migrate (golden files and the live-ggml oracle);
// this tool pins the SIMD kernels and the fused row kernels to the scalar codecs, on the same
// hard cases and random distributions as the tests plus NaN/inf/tie/zero-heavy rows, for every
// codec, every rotation block size and every (source, destination, rotation) RowConverter; and
// the chunk byte shuffle of format/byte_shuffle.h and the chunks' XXH3-128 (format/chunk_codec.h),
// which follow the same level.
//
//   kvsnap-simd-check                 the sweeps above (seconds; about a minute under qemu-aarch64)
//   kvsnap-simd-check --exhaustive    also every f32 bit pattern through f16/bf16 conversion and
//                                     every non-NaN float through the iq4_nl index equivalence
//                                     (about a minute)
//   kvsnap-simd-check --emulated      for a CPU emulated in software (tests/cross/x86-cpus.sh:
//                                     qemu's AVX2 is ~50x slower than the hardware's): every edge
//                                     case and sweep as above, 1 in 8 of the random row sets, random
//                                     iq4_nl values and trial-schedule chunks. The full run proves
//                                     the same kernels' bytes natively; under the emulator the
//                                     question is which kernels the CPU's CPUID picks and that none
//                                     uses an instruction the CPU lacks.
// Exit status 0 when everything matches. It asserts bytes, never time.
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <string>
#include <vector>

#include "format/byte_shuffle.h"
#include "format/chunk_codec.h"
#include "migrate/convert_row.h"
#include "migrate/hadamard.h"
#include "migrate/mlx_affine.h"
#include "migrate/quants.h"
#include "migrate/simd_kernels.h"
#include "migrate/type_traits.h"
#include "test_inputs.h"

namespace kvsnap {
namespace {

using simd::Level;
using testing::Dist;

int g_failures = 0;
uint64_t g_compared = 0;
// --emulated: 1 in this many of the random row sets and random iq4_nl samples (1: all).
size_t g_random_stride = 1;

void fail(const std::string& what) {
  if (g_failures < 20) std::printf("MISMATCH %s\n", what.c_str());
  g_failures++;
}

template <class T>
long first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<long>(i);
  }
  return -1;
}

// The scalar reference's results, computed once per check for all levels.
template <class T>
std::map<std::string, std::vector<T>>& reference_cache() {
  static std::map<std::string, std::vector<T>> cache;
  return cache;
}

// fn's result at the scalar level, computed once per key.
template <class Fn>
const decltype(std::declval<Fn>()())& scalar_once(const std::string& key, Fn fn) {
  using Vec = decltype(fn());
  auto& cache = reference_cache<typename Vec::value_type>();
  auto it = cache.find("scalar " + key);
  if (it == cache.end()) {
    const Level was = simd::level();
    simd::set_level(Level::kScalar);
    it = cache.emplace("scalar " + key, fn()).first;
    simd::set_level(was);
  }
  return it->second;
}

// Runs fn at `l` and at the scalar level, compares the results.
template <class Fn>
void compare(Level l, const std::string& what, Fn fn) {
  using Vec = decltype(fn());
  auto& cache = reference_cache<typename Vec::value_type>();
  auto it = cache.find(what);
  if (it == cache.end()) {
    simd::set_level(Level::kScalar);
    it = cache.emplace(what, fn()).first;
  }
  const Vec& want = it->second;
  simd::set_level(l);
  const auto got = fn();
  simd::set_level(simd::best_level());
  const long d = first_diff(got, want);
  if (d >= 0) {
    std::string detail;
    if constexpr (sizeof(want[0]) == 4) {
      char buf[64];
      uint32_t g, w;
      std::memcpy(&g, &got[d], 4);
      std::memcpy(&w, &want[d], 4);
      std::snprintf(buf, sizeof buf, " (0x%08x, reference 0x%08x)", g, w);
      detail = buf;
    }
    fail(std::string(simd::level_name(l)) + " " + what + " at element " + std::to_string(d) + detail);
  }
  g_compared += want.size() * sizeof(want[0]);
}

// Whether row_sets()[i] is used by a check that takes 1 in `stride` of its random sets (the sets
// of testing::kAllDists) and every other one (the hard cases, the mixed, tie and zero sets).
bool random_set_taken(size_t i, size_t stride) {
  const size_t first = testing::hard_cases().size(), n = std::size(testing::kAllDists) * 6;
  return i < first || i >= first + n || (i - first) % stride == 0;
}

std::vector<std::vector<float>> row_sets() {
  std::vector<std::vector<float>> sets;
  for (const auto& c : testing::hard_cases()) sets.push_back(c.x);
  for (Dist dist : testing::kAllDists) {
    for (uint64_t seed = 0; seed < 6; seed++) sets.push_back(testing::random_rows(dist, 500 + seed, 4, 1024));
  }
  // Blocks mixing a hard case into ordinary data (one odd block among good ones).
  const auto cases = testing::hard_cases();
  for (size_t i = 0; i < cases.size(); i++) {
    auto x = testing::random_rows(Dist::kGauss, 900 + i, 1, 1024);
    std::memcpy(x.data() + 32 * (i % 30), cases[i].x.data(), 32 * sizeof(float));
    sets.push_back(std::move(x));
  }
  // Exact ties of opposite sign at the block maximum (q4_0/q5_0/iq4_nl "first max wins").
  for (int pos = 0; pos < 4; pos++) {
    auto x = testing::random_rows(Dist::kUniform, 77 + pos, 1, 256);
    for (size_t b = 0; b < 8; b++) {
      x[b * 32 + (pos * 7 + b) % 32] = (b % 2 ? 3.0f : -3.0f);
      x[b * 32 + (pos * 11 + 5 * b + 3) % 32] = (b % 2 ? -3.0f : 3.0f);
    }
    sets.push_back(std::move(x));
  }
  // Signed zeros: rotation blocks of zeros only (their rotated values mix +0 and -0, so the
  // minimum and maximum that q4_1/q5_1 store are zeros whose sign depends on the order), beside
  // ordinary blocks.
  for (int pat = 0; pat < 4; pat++) {
    auto x = testing::random_rows(Dist::kGauss, 990 + pat, 1, 512);
    for (size_t i = 0; i < 256; i++) {
      const bool neg = pat == 0 || (pat == 1 && i % 2) || (pat == 2 && i % 7 == 3) || (pat == 3 && i >= 128);
      x[(pat % 2) * 256 + i] = neg ? -0.0f : 0.0f;
    }
    sets.push_back(std::move(x));
  }
  // Quant blocks that come out of a rotation with one sign only, or one value only (q4_1's and
  // q5_1's minimum and maximum on the same side of zero; the AVX2 f16 -> q4_1 row reduces them on
  // the floats' bits, which takes both signs to be present): rows made by rotating such blocks
  // (the normalized Hadamard transform is its own inverse), one set per n_rot the pipelines run.
  for (uint32_t n_rot : {64u, 128u, 256u}) {
    auto y = testing::random_rows(Dist::kGauss, 970 + n_rot, 1, 512);
    for (size_t b = 0; b < 16; b++) {
      for (size_t i = 0; i < 32; i++) {
        float& v = y[32 * b + i];
        if (b % 4 == 0) v = 0.5f + 0.05f * static_cast<float>(i);        // positive
        else if (b % 4 == 1) v = -0.5f - 0.05f * static_cast<float>(i);  // negative
        else if (b % 4 == 2) v = b < 8 ? 1.0f : -0.75f;  // one value (nearly, after f16, at 128 and 256)
      }
    }
    hadamard_rotate(y.data(), y.size(), n_rot);
    sets.push_back(std::move(y));
  }
  return sets;
}

void check_codecs(Level l) {
  const auto sets = row_sets();
  for (const TypeTraits& t : type_traits()) {
    for (size_t s = 0; s < sets.size(); s++) {
      const auto& x = sets[s];
      const size_t n = x.size() / t.block_elems() * t.block_elems();
      compare(l, std::string(t.name()) + " from_f32 set " + std::to_string(s), [&] {
        std::vector<std::byte> out(n / t.block_elems() * t.block_bytes());
        t.from_f32(x.data(), out.data(), n);
        return out;
      });
      // to_f32 of what the reference made of it
      const std::vector<std::byte>& q = scalar_once(std::string(t.name()) + " from_f32 set " + std::to_string(s), [&] {
        std::vector<std::byte> out(n / t.block_elems() * t.block_bytes());
        t.from_f32(x.data(), out.data(), n);
        return out;
      });
      compare(l, std::string(t.name()) + " to_f32 set " + std::to_string(s), [&] {
        std::vector<float> out(n);
        t.to_f32(q.data(), out.data(), n);
        return out;
      });
    }
    for (uint64_t seed = 0; seed < 16; seed++) {
      const size_t n_blocks = t.quantized() ? 257 : 4099;  // odd counts: vector tails
      const auto b = testing::random_blocks(seed, n_blocks, t.block_bytes(), t.quantized());
      compare(l, std::string(t.name()) + " to_f32 random blocks " + std::to_string(seed), [&] {
        std::vector<float> out(n_blocks * t.block_elems());
        t.to_f32(b.data(), out.data(), out.size());
        return out;
      });
    }
  }
  // float types on odd lengths (tails)
  for (const TypeTraits& t : type_traits()) {
    if (t.quantized()) continue;
    for (size_t n : {1, 7, 15, 17, 31, 33, 100}) {
      const auto x = testing::random_rows(Dist::kRandomBits, n, 1, n);
      compare(l, std::string(t.name()) + " from_f32 n=" + std::to_string(n), [&] {
        std::vector<std::byte> out(n * t.block_bytes());
        t.from_f32(x.data(), out.data(), n);
        return out;
      });
    }
  }
}

void check_rotation(Level l) {
  const auto sets = row_sets();
  for (uint32_t n_rot = 2; n_rot <= 1024; n_rot *= 2) {
    for (size_t s = 0; s < sets.size(); s++) {
      const auto& x = sets[s];
      const size_t n = x.size() / n_rot * n_rot;
      if (n == 0) continue;
      compare(l, "hadamard n_rot " + std::to_string(n_rot) + " set " + std::to_string(s), [&] {
        std::vector<float> y(x.begin(), x.begin() + static_cast<long>(n));
        hadamard_rotate(y.data(), n, n_rot);
        return y;
      });
    }
  }
}

// Every RowConverter (source, destination, rotation step) on rows made from the sets, through
// whatever path the level picks (fused kernels included).
void check_pipelines(Level l) {
  // every other random set (the scalar iq4_nl reference is slow), all the mixed and tie sets
  std::vector<std::vector<float>> sets;
  const auto all = row_sets();
  for (size_t i = 0; i < all.size(); i++) {
    if (random_set_taken(i, 2 * g_random_stride)) sets.push_back(all[i]);
  }
  const TypeTraits& f32 = *find_traits(GgmlType::kF32);
  for (const TypeTraits& src : type_traits()) {
    for (const TypeTraits& dst : type_traits()) {
      for (uint32_t n_rot : {0u, 64u, 128u, 256u}) {
        RotationPlan plan;
        if (n_rot) {
          plan.step = RotationStep::kRotate;
          plan.n_rot = n_rot;
        }
        for (size_t s = 0; s < sets.size(); s++) {
          const auto& x = sets[s];
          const size_t n = x.size() >= 256 ? 256 : 0;
          if (n == 0) continue;
          const size_t rows = x.size() / n;
          // source rows: the reference's encoding of x (for f32 sources: x itself, NaNs and all)
          const std::vector<std::byte>& in = scalar_once(std::string(src.name()) + " rows of set " + std::to_string(s), [&] {
            std::vector<std::byte> b(rows * n / src.block_elems() * src.block_bytes());
            if (src.id() == f32.id()) std::memcpy(b.data(), x.data(), rows * n * sizeof(float));
            else src.from_f32(x.data(), b.data(), rows * n);
            return b;
          });
          auto conv = RowConverter::make(src, dst, n, plan);
          if (!conv.ok()) continue;
          compare(l, std::string(src.name()) + " -> " + std::string(dst.name()) + " n_rot " + std::to_string(n_rot) +
                         " set " + std::to_string(s),
                  [&] {
                    std::vector<std::byte> out(rows * conv->dst_row_bytes());
                    (void)conv->convert(in, out);
                    return out;
                  });
          // one row through convert_row() too
          compare(l, std::string(src.name()) + " -> " + std::string(dst.name()) + " convert_row n_rot " +
                         std::to_string(n_rot) + " set " + std::to_string(s),
                  [&] {
                    std::vector<std::byte> out(conv->dst_row_bytes());
                    std::vector<float> scratch(n);
                    (void)convert_row(src, dst, plan, std::span<const std::byte>(in).first(conv->src_row_bytes()), out,
                                      scratch);
                    return out;
                  });
        }
      }
    }
  }
}

// The fused row kernels on rows that are not whole 256-value units: the f16 -> q8_0 kernel works
// in units of 128 values (two n_rot 64 blocks) and ends a row of an odd number of n_rot 64 blocks
// with a one-block step; f16 -> iq4_nl works in chunks of 16 blocks (512 values) across rows and
// ends with a partial chunk (padded, or lanes = passes below 8 blocks); rows of 64..640 values,
// converted one at a time and as runs of rows, on every set (NaN/inf rows take the scalar path
// per unit).
void check_row_lengths(Level l) {
  const auto sets = row_sets();
  // (source, destination): the fused kernels of every level (AVX2: 64-value chunks, the last
  // stage of n_rot 128/256 on the way out), and the quantizers of the 4/5-bit types
  const std::pair<GgmlType, GgmlType> pairs[] = {
      {GgmlType::kF16, GgmlType::kQ8_0}, {GgmlType::kF16, GgmlType::kQ4_0}, {GgmlType::kF16, GgmlType::kIQ4_NL},
      {GgmlType::kF16, GgmlType::kQ4_1}, {GgmlType::kF16, GgmlType::kQ5_0}, {GgmlType::kF16, GgmlType::kQ5_1},
      {GgmlType::kQ8_0, GgmlType::kF16}};
  for (const auto& [st, dt] : pairs) {
    const TypeTraits& src = *find_traits(st);
    const TypeTraits& dst = *find_traits(dt);
    for (uint32_t n_rot : {64u, 128u, 256u}) {
      for (size_t n : {64, 128, 192, 256, 320, 384, 640}) {
        if (n % n_rot != 0) continue;
        RotationPlan plan;
        plan.step = RotationStep::kRotate;
        plan.n_rot = n_rot;
        for (size_t s = 0; s < sets.size(); s++) {
          if (!random_set_taken(s, g_random_stride)) continue;
          const auto& x = sets[s];
          const size_t rows = x.size() / n;
          if (rows == 0) continue;
          const size_t whole = x.size() / src.block_elems() * src.block_elems();
          const std::vector<std::byte>& in =
              scalar_once(std::string(src.name()) + " whole rows of set " + std::to_string(s), [&] {
                std::vector<std::byte> b(whole / src.block_elems() * src.block_bytes());
                src.from_f32(x.data(), b.data(), whole);
                return b;
              });
          auto conv = RowConverter::make(src, dst, n, plan);
          if (!conv.ok()) continue;
          compare(l, std::string(src.name()) + " -> " + std::string(dst.name()) + " n_rot " + std::to_string(n_rot) + " rows of " +
                         std::to_string(n) + " set " + std::to_string(s),
                  [&] {
                    std::vector<std::byte> out(rows * conv->dst_row_bytes());
                    (void)conv->convert(std::span<const std::byte>(in).first(rows * conv->src_row_bytes()), out);
                    return out;
                  });
        }
      }
    }
  }
}

// iq4_nl from_f32 on runs of blocks of every length the kernel splits differently: fewer than 8
// blocks (lanes = trial passes), 8..16 (lanes = blocks, padded), and longer runs whose last chunk
// is partial; the blocks mix all-zero, tiny (amax < 1e-15), denormal, huge dynamic range
// (1e30 next to 1e-30), exact ties of opposite sign at the maximum, inf/NaN and ordinary data,
// so that one chunk of 16 blocks holds several kinds at once.
void check_iq4_nl_runs(Level l) {
  const TypeTraits& iq4 = *find_traits(GgmlType::kIQ4_NL);
  testing::Rng rng(4242);
  auto block = [&](int kind, float* b) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng.below(40)) - 20);
    for (int j = 0; j < 32; j++) {
      float v = rng.uniform() * scale;
      switch (kind) {
        case 0: break;                                                                        // ordinary
        case 1: v = 0.0f; break;                                                              // all zero
        case 2: v = rng.uniform() * 1e-16f; break;                                            // amax < GROUP_MAX_EPS
        case 3: v = testing::bits_f32(rng.u32() & 0x807fffffu); break;                        // denormals
        case 4: v = (j % 3 == 0 ? 1e30f : 1e-30f) * rng.uniform(); break;                     // huge range
        case 5: v = j == 5 ? -7.0f : (j == 20 ? 7.0f : rng.uniform() * 6.0f); break;          // tie at max
        case 6: v = j == 9 ? INFINITY : v; break;                                             // inf
        case 7: v = j == 30 ? NAN : v; break;                                                 // NaN
        case 8: v = rng.below(4) == 0 ? v * 3e4f : (rng.below(3) == 0 ? 0.0f : v * 1e-4f); break;  // sparse spikes
        case 9: v = std::ldexp(rng.uniform(), static_cast<int>(rng.below(200)) - 100); break;  // wide exponents
        default: break;
      }
      b[j] = v;
    }
  };
  const size_t lengths[] = {1, 2, 5, 7, 8, 9, 15, 16, 17, 23, 24, 31, 32, 33, 40, 47, 48, 63, 64, 65, 100, 257};
  for (int mix = 0; mix < 4; mix++) {
    for (size_t nb : lengths) {
      std::vector<float> x(nb * 32);
      for (size_t b = 0; b < nb; b++) {
        int kind = 0;
        if (mix == 1) kind = static_cast<int>(rng.below(10));                   // every kind, anywhere
        if (mix == 2) kind = rng.below(8) == 0 ? static_cast<int>(rng.below(10)) : 0;  // rare odd blocks
        if (mix == 3) kind = rng.below(2) ? 9 : 4;                                // NaN-free extremes
        block(kind, x.data() + 32 * b);
      }
      compare(l, "iq4_nl from_f32 run of " + std::to_string(nb) + " blocks mix " + std::to_string(mix), [&] {
        std::vector<std::byte> out(nb * iq4.block_bytes());
        iq4.from_f32(x.data(), out.data(), x.size());
        return out;
      });
    }
  }
  // many rows of K-like data (the bench's shape), NaN-free, in one call and row by row
  for (Dist dist : {Dist::kKvLike, Dist::kGauss, Dist::kHeavyTail, Dist::kOutliers, Dist::kTinyScale, Dist::kBigScale}) {
    const auto x = testing::random_rows(dist, 31 + static_cast<uint64_t>(dist), 24, 1024);
    compare(l, std::string("iq4_nl from_f32 24 rows ") + testing::dist_name(dist), [&] {
      std::vector<std::byte> out(x.size() / 32 * iq4.block_bytes());
      iq4.from_f32(x.data(), out.data(), x.size());
      return out;
    });
    compare(l, std::string("iq4_nl from_f32 row by row (96 values) ") + testing::dist_name(dist), [&] {
      std::vector<std::byte> out(x.size() / 32 * iq4.block_bytes());
      for (size_t i = 0; i + 96 <= x.size(); i += 96) iq4.from_f32(x.data() + i, out.data() + i / 32 * iq4.block_bytes(), 96);
      return out;
    });
  }
}

// Every f32 bit pattern through f32 -> f16 and f32 -> bf16.
void check_half_exhaustive(Level l) {
  const TypeTraits& f16 = *find_traits(GgmlType::kF16);
  const TypeTraits& bf16 = *find_traits(GgmlType::kBF16);
  const size_t chunk = 1 << 22;
  std::vector<float> x(chunk);
  std::vector<std::byte> a(2 * chunk), b(2 * chunk);
  for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
    for (size_t i = 0; i < chunk; i++) x[i] = testing::bits_f32(static_cast<uint32_t>(base + i));
    for (const TypeTraits* t : {&f16, &bf16}) {
      simd::set_level(Level::kScalar);
      t->from_f32(x.data(), a.data(), chunk);
      simd::set_level(l);
      t->from_f32(x.data(), b.data(), chunk);
      if (std::memcmp(a.data(), b.data(), a.size()) != 0) {
        for (size_t i = 0; i < chunk; i++) {
          if (std::memcmp(&a[2 * i], &b[2 * i], 2) != 0) {
            char buf[96];
            std::snprintf(buf, sizeof buf, "%s from_f32 of bits 0x%08" PRIx64, std::string(t->name()).c_str(), base + i);
            fail(buf);
            break;
          }
        }
      }
    }
    g_compared += 4 * chunk;
  }
  simd::set_level(simd::best_level());
  std::printf("  %s: all 2^32 f32 patterns -> f16 and bf16 identical to the scalar reference\n", simd::level_name(l));
}

#ifdef KVSNAP_SIMD_X86
// The AVX2 quantizers' roundf (trunc(x + copysign(0.49999997f, x)), x86_common.h) against
// roundf then cvttss2si, the reference's (int8_t)roundf(x) before the cast, for every f32 pattern.
void check_roundf_exhaustive() {
  if (simd::best_level() < Level::kAvx2) return;
  const size_t chunk = 1 << 22;
  std::vector<float> x(chunk);
  std::vector<int32_t> got(chunk);
  for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
    for (size_t i = 0; i < chunk; i++) x[i] = testing::bits_f32(static_cast<uint32_t>(base + i));
    simd::x86::roundf_i32_avx2(x.data(), got.data(), chunk);
    for (size_t i = 0; i < chunk; i++) {
      const float r = std::round(x[i]);
      // cvttss2si: INT32_MIN for NaN and out-of-range values
      const int32_t want = std::isnan(r) || r >= 2147483648.0f || r < -2147483648.0f ? INT32_MIN : static_cast<int32_t>(r);
      if (got[i] != want) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "avx2 roundf of bits 0x%08" PRIx64 ": %d, roundf %d", base + i, got[i], want);
        fail(buf);
      }
    }
    g_compared += 4 * chunk;
  }
  std::printf("  avx2: roundf of all 2^32 f32 patterns == the quantizers' vector rounding\n");
}

// The iq4_nl best_index equivalence: the bucketed count of midpoints == ggml's binary search.
// The AVX2 kernel's count of midpoints is checked on the same values (and, where the CPU has
// AVX-512, the AVX-512 kernel's two bucketings).
void check_iq4_index(bool exhaustive) {
  if (simd::best_level() < Level::kAvx2) return;
  const bool avx512 = simd::best_level() >= Level::kAvx512;
  const size_t chunk = 1 << 20;
  std::vector<float> x(chunk), x128(chunk + 16);
  std::vector<uint8_t> got(chunk), got128(chunk + 16), got2(chunk);
  uint64_t checked = 0, checked128 = 0;
  auto run = [&](size_t n) {
    simd::x86::iq4_nl_index_avx2(x.data(), got2.data(), n);
    if (!avx512) {  // the AVX2 count only
      for (size_t i = 0; i < n; i++) got[i] = got2[i];
    } else {
      simd::x86::iq4_nl_index_avx512(x.data(), got.data(), n);
    }
    // the kernel's other bucketing, for values in [-128, 128)
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
      if (x[i] >= -128.0f && x[i] < 128.0f) x128[m++] = x[i];
    }
    for (size_t i = m; i % 16 != 0; i++) x128[m++] = 0.0f;
    if (avx512) simd::x86::iq4_nl_index_within128_avx512(x128.data(), got128.data(), m);
    else m = 0;
    auto check = [&](const char* what, float v, int idx) {
      if (idx == quants::ref::iq4_nl_best_index(v)) return true;
      char buf[128];
      std::snprintf(buf, sizeof buf, "iq4_nl %s of %a (0x%08x): %d, reference %d", what, static_cast<double>(v),
                    testing::f32_bits(v), idx, quants::ref::iq4_nl_best_index(v));
      fail(buf);
      return false;
    };
    for (size_t i = 0; i < n; i++) {
      if (!check("index", x[i], got[i]) || !check("index (avx2)", x[i], got2[i])) return;
    }
    for (size_t i = 0; i < m; i++) {
      if (!check("index (within 128)", x128[i], got128[i])) return;
    }
    checked += n;
    checked128 += m;
  };
  size_t fill = 0;
  auto push = [&](float v) {
    if (v != v) return;  // NaN never reaches the vector index (the kernel sends those blocks to the scalar path)
    x[fill++] = v;
    if (fill == chunk) {
      run(fill);
      fill = 0;
    }
  };
  if (exhaustive) {
    for (uint64_t b = 0; b < (1ull << 32); b++) push(testing::bits_f32(static_cast<uint32_t>(b)));
  } else {
    // +-4096 ulps around every integer and half-integer in [-140, 140] (all midpoints, table
    // values, bucket edges), plus 16M random patterns
    for (int h = -280; h <= 280; h++) {
      const float c = static_cast<float>(h) * 0.5f;
      uint32_t bits = testing::f32_bits(c);
      for (int k = -4096; k <= 4096; k++) {
        if (c == 0.0f) push(testing::bits_f32(static_cast<uint32_t>(std::abs(k))) * (k < 0 ? -1.0f : 1.0f));
        else push(testing::bits_f32(static_cast<uint32_t>(static_cast<int64_t>(bits) + k)));
      }
    }
    testing::Rng rng(7);
    for (size_t i = 0; i < (size_t{1} << 24) / g_random_stride; i++) push(testing::bits_f32(rng.u32()));
  }
  fill = fill / 16 * 16;
  if (fill) run(fill);
  std::printf("  %s: iq4_nl index == ggml's best_index_int8 for %" PRIu64 " floats%s (the AVX2 count of midpoints%s), and %" PRIu64
              " of them in [-128, 128) by the width-8 buckets\n",
              avx512 ? "avx2, avx512" : "avx2", checked, exhaustive ? " (every non-NaN f32)" : "",
              avx512 ? " and the AVX-512 bucketing" : "", checked128);
}

// The iq4_nl trial scales: every divisor in [1, 2) exhaustively (by the scaling argument in
// migrate/kernels/x86_avx512_iq4_nl.cc that covers every |max| in [2^-100, 2^100]), both signs,
// plus random maxima of any magnitude (the kernel divides outside that range); each must equal
// the division.
void check_iq4_trial_ids() {
  if (simd::best_level() < Level::kAvx512) return;
  const size_t chunk = 1 << 16;
  std::vector<float> max(chunk), id(15 * chunk);
  uint64_t checked = 0;
  auto run = [&](size_t n) {
    simd::x86::iq4_nl_trial_ids_avx512(max.data(), id.data(), n);
    for (size_t i = 0; i < n; i++) {
      for (int k = 0; k < 15; k++) {
        const float want = (static_cast<float>(k - 7) + static_cast<float>(quants::kIQ4NLValues[0])) / max[i];
        const float got = id[15 * (i / 16 * 16) + 16 * k + i % 16];
        if (testing::f32_bits(got) != testing::f32_bits(want)) {
          char buf[128];
          std::snprintf(buf, sizeof buf, "iq4_nl trial id %d / %a: %a, division %a", k - 7 - 127,
                        static_cast<double>(max[i]), static_cast<double>(got), static_cast<double>(want));
          fail(buf);
          return;
        }
      }
    }
    checked += 15 * n;
  };
  size_t fill = 0;
  auto push = [&](float v) {
    max[fill++] = v;
    if (fill == chunk) {
      run(fill);
      fill = 0;
    }
  };
  for (uint32_t m = 0; m < (1u << 23); m++) {
    const float b = testing::bits_f32(0x3f800000u | m);
    push(b);
    push(-b);
  }
  testing::Rng rng(11);
  for (int i = 0; i < (1 << 20); i++) {
    const float v = testing::bits_f32(rng.u32());
    if (std::isfinite(v) && v != 0.0f) push(v);
  }
  fill = fill / 16 * 16;
  if (fill) run(fill);
  std::printf("  avx512: iq4_nl trial scales == (itry - 127) / max for %" PRIu64 " quotients\n", checked);
}

// The iq4_nl kernels skip the trials whose indices repeat the trial before (see
// iq4_nl_compact_trials, and compact_trials in x86_avx2_iq4_nl.cc). For each block: its schedule
// starts at trial 1, is in order, and holds every trial whose indices differ from the previous
// trial's (computed here the reference's way: id = (itry - 127) / max, al = id * x,
// best_index_int8), on random blocks and on blocks built so that a value's index flips right at
// a trial (x = m / id_p and its neighbours, m a midpoint). AVX-512 chunks hold 8..16 blocks,
// AVX2 ones 1..8.
void check_iq4_trial_schedule(Level level) {
  if (simd::best_level() < level) return;
  const bool avx2 = level == Level::kAvx2;
  const size_t lanes = avx2 ? 8 : 16;
  testing::Rng rng(23);
  const float v0 = static_cast<float>(quants::kIQ4NLValues[0]);
  uint64_t blocks = 0, steps_sum = 0, chunks = 0, flips = 0;
  const int failures_before = g_failures;
  std::vector<float> x(16 * 32);
  const int iters = int(40000 / g_random_stride);
  for (int iter = 0; iter < iters && g_failures == failures_before; iter++) {
    const size_t cnt = iter % 9 == 0 ? lanes / 2 + rng.below(lanes / 2 + 1) : lanes;
    const bool built = iter % 2 == 1;  // a chunk of random blocks skips more trials
    for (size_t b = 0; b < 16; b++) {
      float* xb = x.data() + 32 * b;
      const int kind = built ? static_cast<int>(rng.below(4)) : 0;
      float scale = std::ldexp(1.0f, static_cast<int>(rng.below(60)) - 30);
      if (rng.below(64) == 0) scale = 0x1p110f;  // outside the range of the recomputed trial ids
      for (int j = 0; j < 32; j++) xb[j] = scale * (rng.uniform() + rng.uniform() + rng.uniform() + rng.uniform());
      if (kind >= 2) {  // flips at a trial: max = xb[0], value j = m / id_p (+- a few ulps)
        xb[0] = (rng.below(2) ? 4.0f : -4.0f) * scale;
        for (int j = 1; j < 32; j++) {
          if (rng.below(8) != 0) continue;  // a few flips per block, so that trials get skipped
          const int p = 1 + static_cast<int>(rng.below(15));
          const float id = (static_cast<float>(p - 8) + v0) / xb[0];
          const int mi = static_cast<int>(rng.below(15));
          const float m = static_cast<float>(quants::kIQ4NLValues[mi] + quants::kIQ4NLValues[mi + 1]) / 2;
          float v = m / id;
          const int nudge = static_cast<int>(rng.below(7)) - 3;
          for (int k = 0; k < std::abs(nudge); k++) v = std::nextafter(v, nudge > 0 ? INFINITY : -INFINITY);
          if (std::fabs(v) < std::fabs(xb[0])) xb[j] = v;
        }
      }
      if (kind == 3 && rng.below(4) == 0) xb[5] = -xb[0];  // both signs at the maximum
    }
    alignas(64) uint8_t trials[15 * 16];
    const int steps = avx2 ? simd::x86::iq4_nl_trial_schedule_avx2(x.data(), cnt, trials)
                           : simd::x86::iq4_nl_trial_schedule_avx512(x.data(), cnt, trials);
    chunks++;
    steps_sum += static_cast<uint64_t>(steps);
    for (size_t b = 0; b < cnt; b++) {
      const float* xb = x.data() + 32 * b;
      float amax = 0, max = 0;
      for (int j = 0; j < 32; j++) {
        if (std::fabs(xb[j]) > amax) {
          amax = std::fabs(xb[j]);
          max = xb[j];
        }
      }
      if (amax < 1e-15f || (avx2 && amax > 1e18f)) continue;  // (AVX2: larger ones take the scalar path)
      blocks++;
      bool listed[16] = {};
      int last = 0;
      bool padding = false;  // the lane repeats its last trial from here on
      for (int k = 0; k < steps; k++) {
        const int p = trials[lanes * k + b];
        if (p == 0 && k > 0) break;  // the block's half of the lanes ran no more passes
        const bool repeat = k > 0 && p == last;
        if (p < 1 || p > 15 || p < last || (k == 0 && p != 1) || (padding && !repeat)) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "iq4_nl trial schedule: block %zu step %d runs trial %d after %d", b, k, p, last);
          fail(buf);
          return;
        }
        padding |= repeat;
        listed[p] = true;
        last = p;
      }
      int prev[32];
      for (int p = 1; p <= 15; p++) {
        const float id = (static_cast<float>(p - 8) + v0) / max;
        bool differs = false;
        for (int j = 0; j < 32; j++) {
          const int l = quants::ref::iq4_nl_best_index(id * xb[j]);
          differs |= p > 1 && l != prev[j];
          prev[j] = l;
        }
        flips += differs;
        if (differs && !listed[p]) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "iq4_nl trial schedule: block %zu (max %a) skips trial %d, whose indices differ",
                        b, static_cast<double>(max), p);
          fail(buf);
          return;
        }
      }
    }
  }
  std::printf("  %s: iq4_nl trial schedules hold every trial that changes an index: %" PRIu64
              " blocks, %" PRIu64 " such trials, %.2f passes per chunk of 15\n",
              simd::level_name(level), blocks, flips, static_cast<double>(steps_sum) / static_cast<double>(chunks));
}
#endif

// MLX affine quantization (migrate/mlx_affine.h): rows quantized at every bits, group size and
// rounding rule, and dequantized to every float type, the codes with their own scales and biases
// rounded to T and with the row's values (inf, NaN, huge, tiny included) as scales and biases.
void check_mlx_affine(Level l) {
  const auto sets = row_sets();
  for (size_t s = 0; s < sets.size(); s++) {
    const std::vector<float>& x = sets[s];
    for (int group : {32, 64, 128}) {
      const int64_t dim = int64_t(x.size()) / group * group;
      if (dim == 0) continue;
      for (int bits : {2, 3, 4, 5, 6, 8}) {
        const std::string key = "mlx q" + std::to_string(bits) + "g" + std::to_string(group) + " set " + std::to_string(s);
        const size_t groups = size_t(dim / group), cb = mlx_affine_row_bytes(dim, bits);
        for (MlxDevice dev : {MlxDevice::kCpu, MlxDevice::kGpu}) {
          compare(l, key + " quantize " + mlx_device_name(dev), [&] {
            std::vector<uint8_t> out(cb + 8 * groups);
            std::vector<float> sc(groups), bi(groups);
            mlx_affine_quantize_row(x.data(), dim, bits, group, dev, reinterpret_cast<std::byte*>(out.data()), sc.data(),
                                    bi.data());
            std::memcpy(out.data() + cb, sc.data(), 4 * groups);
            std::memcpy(out.data() + cb + 4 * groups, bi.data(), 4 * groups);
            return out;
          });
        }
        std::vector<std::byte> codes(cb);
        std::vector<float> sc(groups), bi(groups);
        simd::set_level(Level::kScalar);
        mlx_affine_quantize_row(x.data(), dim, bits, group, MlxDevice::kCpu, codes.data(), sc.data(), bi.data());
        for (MlxFloat t : {MlxFloat::kF32, MlxFloat::kF16, MlxFloat::kBF16}) {
          std::vector<float> st(groups), bt(groups), sx(groups), bx(groups);
          for (size_t g = 0; g < groups; g++) {
            st[g] = mlx_round_to(t, sc[g]), bt[g] = mlx_round_to(t, bi[g]);
            sx[g] = mlx_round_to(t, x[(7 * g) % x.size()]), bx[g] = mlx_round_to(t, x[(7 * g + 3) % x.size()]);
          }
          for (int own = 0; own < 2; own++) {
            compare(l, key + " dequantize " + mlx_float_name(t) + (own ? " own scales" : " row values as scales"), [&] {
              std::vector<float> y(static_cast<size_t>(dim));
              mlx_affine_dequantize_row(codes.data(), own ? st.data() : sx.data(), own ? bt.data() : bx.data(), dim,
                                        bits, group, t, y.data());
              return y;
            });
          }
        }
      }
    }
  }
}

// The chunk byte shuffle (format/byte_shuffle.h), which follows the same level: shuffle_bytes,
// unshuffle_bytes and unshuffle_planes of random bytes, element sizes 2 and 4 (the ones with
// kernels) and 3, element counts around the kernels' 16 and 32 steps, with tails, from unaligned
// addresses. tests/format/byte_shuffle_test.cc does the same under the sanitizers.
void check_byte_shuffle(Level l) {
  for (size_t elem : {2u, 3u, 4u}) {
    for (size_t count : {15u, 32u, 33u, 100u, 65536u / 2 + 17}) {
      const size_t n = count * elem + elem - 1;
      std::mt19937 rng(uint32_t(elem * 131 + count));
      std::vector<uint8_t> in(n + 1);
      for (auto& b : in) b = uint8_t(rng());
      const auto* src = reinterpret_cast<const std::byte*>(in.data() + 1);  // unaligned
      const std::string key = "byte shuffle elem " + std::to_string(elem) + " x " + std::to_string(count);
      compare(l, key + " shuffle", [&] {
        std::vector<uint8_t> out(n + 1);
        shuffle_bytes({src, n}, elem, {reinterpret_cast<std::byte*>(out.data() + 1), n});
        return out;
      });
      compare(l, key + " unshuffle", [&] {
        std::vector<uint8_t> out(n + 1);
        unshuffle_bytes({src, n}, elem, {reinterpret_cast<std::byte*>(out.data() + 1), n});
        return out;
      });
      compare(l, key + " unshuffle planes", [&] {
        std::vector<const std::byte*> planes;
        for (size_t b = 0; b < elem; ++b) planes.push_back(src + b * (count + 5) % (n - count));  // apart, overlapping
        std::vector<uint8_t> out(count * elem + 1);
        unshuffle_planes(planes.data(), elem, count, reinterpret_cast<std::byte*>(out.data() + 1));
        return out;
      });
    }
  }
}

// The chunks' XXH3-128 (format/chunk_codec.h: xxhash's AVX2 loop at avx2 and avx512), whole and
// fed in pieces, around XXH3's size classes and its 256-byte streaming buffer, from unaligned
// addresses. tests/format/chunk_codec_test.cc compares with libxxhash itself.
void check_chunk_xxh(Level l) {
  for (size_t n : {0u, 3u, 16u, 17u, 129u, 241u, 257u, 1025u, 100003u}) {
    std::mt19937 rng(uint32_t(n * 31 + 7));
    std::vector<uint8_t> in(n + 1);
    for (auto& b : in) b = uint8_t(rng());
    const std::span<const std::byte> src(reinterpret_cast<const std::byte*>(in.data() + 1), n);  // unaligned
    compare(l, "chunk xxh3-128 of " + std::to_string(n) + " bytes", [&] {
      std::vector<uint8_t> out;
      const ChunkXxh whole = chunk_xxh(src);
      out.insert(out.end(), whole.begin(), whole.end());
      ChunkXxhHasher h;
      for (size_t piece : {size_t(5), size_t(300)}) {
        for (size_t at = 0; at < n; at += piece) h.update(src.subspan(at, std::min(piece, n - at)));
        const ChunkXxh d = h.finish();
        out.insert(out.end(), d.begin(), d.end());
      }
      return out;
    });
  }
}

}  // namespace
}  // namespace kvsnap

int main(int argc, char** argv) {
  using namespace kvsnap;
  bool exhaustive = false;
  for (int i = 1; i < argc; i++) {
    if (std::string(argv[i]) == "--exhaustive") {
      exhaustive = true;
    } else if (std::string(argv[i]) == "--emulated") {
      g_random_stride = 8;
    } else {
      std::fprintf(stderr, "usage: kvsnap-simd-check [--exhaustive] [--emulated]\n");
      return 2;
    }
  }
  if (g_random_stride > 1) {
    std::printf("kvsnap-simd-check: --emulated: every hard case, mixed, tie and zero set; 1 in %zu of the random row"
                " sets and random iq4_nl samples\n", g_random_stride);
  }
  std::printf("kvsnap-simd-check: best level %s (%s)\n", simd::level_name(simd::best_level()), simd::describe().c_str());
  for (size_t i = 1; i < simd::kLevelCount; i++) {  // every level but the scalar one
    const Level l = static_cast<Level>(i);
    if (!simd::supported(l)) {
      std::printf("  %s: not supported by this CPU or build, skipped\n", simd::level_name(l));
      continue;
    }
    // Each part's seconds: under an emulator (tests/cross) they say where its minutes go.
    std::string took;
    auto timed = [&](const char* part, void (*check)(Level)) {
      const auto t0 = std::chrono::steady_clock::now();
      check(l);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s %.1f s", took.empty() ? "" : ", ", part,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      took += buf;
    };
    timed("codecs", check_codecs);
    timed("rotation", check_rotation);
    timed("row pipelines", check_pipelines);
    timed("row lengths", check_row_lengths);
    timed("iq4_nl runs", check_iq4_nl_runs);
    timed("MLX affine", check_mlx_affine);
    timed("byte shuffle", check_byte_shuffle);
    timed("chunk XXH3", check_chunk_xxh);
    std::printf("  %s: codecs, rotation, row pipelines, MLX affine rows and the chunk byte shuffle compared (%s)\n",
                simd::level_name(l), took.c_str());
    if (l == Level::kAvx512) {
      // the q8_0 rows this CPU's vector width did not pick (simd::avx512_in_halves)
      const bool halves = simd::avx512_in_halves();
      simd::set_avx512_in_halves(!halves);
      took.clear();
      timed("row pipelines", check_pipelines);
      timed("row lengths", check_row_lengths);
      simd::set_avx512_in_halves(halves);
      std::printf("  %s: row pipelines compared again with the q8_0 rows built for %s (%s)\n", simd::level_name(l),
                  halves ? "full-width 512-bit operations" : "512-bit operations split in halves", took.c_str());
    }
    if (exhaustive) check_half_exhaustive(l);
  }
#ifdef KVSNAP_SIMD_X86
  const auto t0 = std::chrono::steady_clock::now();
  if (exhaustive) check_roundf_exhaustive();
  check_iq4_index(exhaustive);
  check_iq4_trial_ids();
  check_iq4_trial_schedule(Level::kAvx2);
  check_iq4_trial_schedule(Level::kAvx512);
  std::printf("  (the iq4_nl index, trial scales and schedules: %.1f s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
#endif
  std::printf("%" PRIu64 " bytes compared, %d mismatches\n", g_compared, g_failures);
  return g_failures == 0 ? 0 : 1;
}
