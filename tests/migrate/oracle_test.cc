// migrate/ against the real ggml of llama.cpp v0.5.0 (libggml-base + the CPU backend of
// node-llama-cpp 3.22.1). Built only when $KVSNAP_ORACLE_DIR/3.22.1/lib/libggml-base.so
// exists; label "oracle". Every test prints how much it compared.
//
//   quantize    our from_f32 bytes == ggml_quantize_chunk, every type, random rows of ten
//               distributions x seeds, plus the hard cases
//   dequantize  our to_f32 floats == ggml to_float (bit for bit), on ggml's own quantized
//               rows and on random block bytes (NaN/inf/subnormal scales included)
//   half        f16/bf16 <-> f32 over every 16-bit code, and f32 -> f16/bf16 over a sweep
//               of f32 patterns (all 2^32 with KVSNAP_ORACLE_EXHAUSTIVE=1)
//   rotation    hadamard_rotate == the CPU backend's fast transform (bit for bit); the
//               difference to the plain matmul (use_ref) is measured and printed
//   pipeline    convert_row(f16 -> quantized, rotate) and (quantized -> f16, unrotate) ==
//               the same steps done by ggml
//   cpu store   informational: how often the CPU backend's own store (set_rows) differs
//               from ggml_quantize_chunk
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml_oracle.h"
#include "migrate/convert_row.h"
#include "migrate/hadamard.h"
#include "migrate/type_traits.h"
#include "test_inputs.h"

#ifndef KVSNAP_MIGRATE_ORACLE_LIBDIR
#error "KVSNAP_MIGRATE_ORACLE_LIBDIR must name the directory holding libggml-base.so"
#endif

namespace kvsnap {
namespace {

using testing::Dist;
using testing::GgmlOracle;

GgmlOracle& oracle() {
  static std::unique_ptr<GgmlOracle> o = [] {
    std::string err;
    auto p = GgmlOracle::open(KVSNAP_MIGRATE_ORACLE_LIBDIR, &err);
    if (!p) {
      std::fprintf(stderr, "ggml oracle: %s\n", err.c_str());
      std::abort();
    }
    std::printf("ggml oracle: %s, CPU backend: %s\n", KVSNAP_MIGRATE_ORACLE_LIBDIR, p->describe().c_str());
    return p;
  }();
  return *o;
}

int gid(const TypeTraits& t) { return static_cast<int>(t.id()); }

std::vector<std::byte> ours_from(const TypeTraits& t, const std::vector<float>& x) {
  std::vector<std::byte> out(x.size() / t.block_elems() * t.block_bytes());
  t.from_f32(x.data(), out.data(), x.size());
  return out;
}
std::vector<float> ours_to(const TypeTraits& t, const std::vector<std::byte>& b) {
  const size_t n = b.size() / t.block_bytes() * t.block_elems();
  std::vector<float> out(n);
  t.to_f32(b.data(), out.data(), n);
  return out;
}

// Index of the first differing byte/float bit pattern, or -1.
template <class T>
long first_diff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i++) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<long>(i);
  }
  return -1;
}

std::string hexf(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a (0x%08x)", static_cast<double>(f), testing::f32_bits(f));
  return buf;
}

struct Tally {
  uint64_t rows = 0, values = 0, bytes = 0;
};

// Compares quantize and dequantize for one batch of rows; adds to the tally.
void compare_batch(const TypeTraits& t, const std::vector<float>& x, size_t rows, size_t n, const std::string& what,
                   Tally& tally) {
  const auto want = oracle().quantize(gid(t), x.data(), rows, n);
  const auto got = ours_from(t, x);
  const long d = first_diff(got, want);
  ASSERT_EQ(d, -1) << t.name() << " " << what << ": byte " << d << " (row " << (d / (want.size() / rows))
                   << ") ours 0x" << std::hex << static_cast<int>(got[d]) << " ggml 0x" << static_cast<int>(want[d]);
  const auto want_f = oracle().to_float(gid(t), want.data(), rows * n);
  const auto got_f = ours_to(t, want);
  const long e = first_diff(got_f, want_f);
  ASSERT_EQ(e, -1) << t.name() << " " << what << ": dequantized value " << e << " ours " << hexf(got_f[e]) << " ggml "
                   << hexf(want_f[e]);
  tally.rows += rows;
  tally.values += rows * n;
  tally.bytes += want.size();
}

TEST(GgmlOracle, QuantizeAndDequantizeRandomRows) {
  const int seeds = std::getenv("KVSNAP_ORACLE_SEEDS") ? std::atoi(std::getenv("KVSNAP_ORACLE_SEEDS")) : 24;
  for (const TypeTraits& t : type_traits()) {
    Tally tally;
    for (Dist dist : testing::kAllDists) {
      for (int seed = 0; seed < seeds; seed++) {
        // row lengths: one block, a head (128), a typical n_embd_k_gqa (1024)
        const size_t n = seed % 3 == 0 ? 32 : seed % 3 == 1 ? 128 : 1024;
        const size_t rows = n == 1024 ? 16 : 64;
        const auto x = testing::random_rows(dist, 1000 + seed, rows, n);
        compare_batch(t, x, rows, n, std::string(testing::dist_name(dist)) + " seed " + std::to_string(seed), tally);
        if (HasFatalFailure()) return;
      }
    }
    std::printf("quantize %-6s: %" PRIu64 " rows, %" PRIu64 " values, %" PRIu64
                " bytes byte-identical to ggml_quantize_chunk; dequantized floats bit-identical\n",
                std::string(t.name()).c_str(), tally.rows, tally.values, tally.bytes);
  }
}

TEST(GgmlOracle, QuantizeAndDequantizeHardCases) {
  const auto cases = testing::hard_cases();
  for (const TypeTraits& t : type_traits()) {
    Tally tally;
    for (const auto& c : cases) {
      compare_batch(t, c.x, 1, c.x.size(), c.name, tally);
      if (HasFatalFailure()) return;
    }
    std::printf("hard cases %-6s: %zu cases, %" PRIu64 " bytes identical\n", std::string(t.name()).c_str(),
                cases.size(), tally.bytes);
  }
}

TEST(GgmlOracle, DequantizeRandomBlocks) {
  for (const TypeTraits& t : type_traits()) {
    uint64_t values = 0;
    for (uint64_t seed = 0; seed < 64; seed++) {
      const size_t n_blocks = t.quantized() ? 256 : 4096;
      const auto b = testing::random_blocks(seed, n_blocks, t.block_bytes(), t.quantized());
      const auto want = oracle().to_float(gid(t), b.data(), n_blocks * t.block_elems());
      const auto got = ours_to(t, b);
      const long e = first_diff(got, want);
      ASSERT_EQ(e, -1) << t.name() << " seed " << seed << " value " << e << " ours " << hexf(got[e]) << " ggml "
                       << hexf(want[e]);
      values += want.size();
    }
    std::printf("to_f32 %-6s: %" PRIu64 " values from random blocks bit-identical to ggml to_float\n",
                std::string(t.name()).c_str(), values);
  }
}

TEST(GgmlOracle, HalfConversionsSweep) {
  const TypeTraits& f16 = *find_traits(GgmlType::kF16);
  const TypeTraits& bf16 = *find_traits(GgmlType::kBF16);
  // every 16-bit code -> f32
  std::vector<std::byte> codes(65536 * 2);
  for (uint32_t i = 0; i < 65536; i++) std::memcpy(&codes[2 * i], &i, 2);
  for (const TypeTraits* t : {&f16, &bf16}) {
    const auto want = oracle().to_float(gid(*t), codes.data(), 65536);
    const auto got = ours_to(*t, codes);
    const long e = first_diff(got, want);
    ASSERT_EQ(e, -1) << t->name() << " code 0x" << std::hex << e;
  }
  // f32 -> 16 bit: all 2^32 patterns with KVSNAP_ORACLE_EXHAUSTIVE=1, else half_sweep() (every
  // pattern whose low 16 bits are one of 24 values around the f16/bf16 rounding points) plus
  // 2^24 random patterns.
  const bool all = std::getenv("KVSNAP_ORACLE_EXHAUSTIVE") != nullptr;
  const size_t chunk = 1 << 20;
  std::vector<float> x(chunk);
  uint64_t compared = 0;
  testing::Rng rng(42);
  auto run_chunk = [&](size_t n) {
    std::vector<float> v(x.begin(), x.begin() + static_cast<long>(n));
    for (const TypeTraits* t : {&f16, &bf16}) {
      const auto want = oracle().quantize(gid(*t), v.data(), 1, n);
      const auto got = ours_from(*t, v);
      const long d = first_diff(got, want);
      ASSERT_EQ(d, -1) << t->name() << " input " << hexf(v[d / 2]);
    }
    compared += n;
  };
  size_t fill = 0;
  auto push = [&](uint32_t bits) {
    x[fill++] = testing::bits_f32(bits);
    if (fill == chunk) {
      run_chunk(fill);
      fill = 0;
    }
  };
  if (all) {
    for (uint64_t b = 0; b < (1ull << 32); b++) {
      push(static_cast<uint32_t>(b));
      if ((b & 0xffffff) == 0 && ::testing::Test::HasFatalFailure()) return;
    }
  } else {
    for (float f : testing::half_sweep()) push(testing::f32_bits(f));
    for (uint32_t i = 0; i < (1u << 24); i++) push(rng.u32());
  }
  if (::testing::Test::HasFatalFailure()) return;
  if (fill) run_chunk(fill);
  std::printf("half: 65536 f16 and 65536 bf16 codes -> f32 identical; %" PRIu64
              " f32 patterns -> f16 and -> bf16 identical to ggml_quantize_chunk%s\n",
              compared, all ? " (all 2^32)" : " (set KVSNAP_ORACLE_EXHAUSTIVE=1 for all 2^32)");
}

// Differences between two float arrays cut into blocks of `block` values: how many values
// differ, and the largest |a - b| measured in ulps of the block's largest |b| (the scale
// that matters to a block quantizer) and relative to it.
struct DiffStats {
  uint64_t values = 0, differing = 0;
  double max_ulps_of_max = 0, max_rel = 0;
  void add(const std::vector<float>& a, const std::vector<float>& b, size_t block) {
    for (size_t r = 0; r < a.size() / block; r++) {
      float bmax = 0;
      for (size_t j = 0; j < block; j++) bmax = std::max(bmax, std::fabs(b[r * block + j]));
      const double ulp = bmax > 0 ? std::ldexp(1.0, std::ilogb(bmax) - 23) : 0;
      for (size_t j = 0; j < block; j++) {
        const float x = a[r * block + j], y = b[r * block + j];
        values++;
        if (testing::f32_bits(x) == testing::f32_bits(y)) continue;
        differing++;
        if (!std::isfinite(x) || !std::isfinite(y) || bmax == 0) continue;
        const double d = std::fabs(static_cast<double>(x) - y);
        max_ulps_of_max = std::max(max_ulps_of_max, d / ulp);
        max_rel = std::max(max_rel, d / bmax);
      }
    }
  }
  std::string str() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%" PRIu64 " of %" PRIu64 " values differ, max %.2f ulp of the block max (%.3g relative)",
                  differing, values, max_ulps_of_max, max_rel);
    return buf;
  }
};

uint64_t differing_blocks(const std::vector<std::byte>& a, const std::vector<std::byte>& b, size_t block_bytes) {
  uint64_t n = 0;
  for (size_t i = 0; i < a.size(); i += block_bytes) n += std::memcmp(&a[i], &b[i], block_bytes) != 0;
  return n;
}

TEST(GgmlOracle, RotationMatchesCpuBackend) {
  const Dist dists[] = {Dist::kUniform, Dist::kGauss, Dist::kKvLike, Dist::kHeavyTail, Dist::kOutliers,
                        Dist::kSparse,  Dist::kTinyScale, Dist::kF16Exact};
  const TypeTraits& q8 = *find_traits(GgmlType::kQ8_0);
  const TypeTraits& q4 = *find_traits(GgmlType::kQ4_0);
  for (uint32_t n_rot : {64u, 128u, 256u}) {
    DiffStats vs_matmul, roundtrip;
    uint64_t values = 0, q8_blocks = 0, q8_differ = 0, q4_differ = 0;
    for (Dist dist : dists) {
      for (uint64_t seed = 0; seed < 4; seed++) {
        const size_t rows = 32, n = 1024;
        const auto x = testing::random_rows(dist, 77 + seed, rows, n);
        auto ours = x;
        hadamard_rotate(ours.data(), ours.size(), n_rot);
        const auto fwht = oracle().hadamard(x.data(), x.size(), n_rot, /*use_ref=*/false);
        const long d = first_diff(ours, fwht);
        ASSERT_EQ(d, -1) << "n_rot " << n_rot << " " << testing::dist_name(dist) << " value " << d << " ours "
                         << hexf(ours[d]) << " cpu fwht " << hexf(fwht[d]);
        values += ours.size();
        // the plain matmul with H (the CPU backend with use_ref; other backends sum in yet other orders)
        const auto matmul = oracle().hadamard(x.data(), x.size(), n_rot, /*use_ref=*/true);
        vs_matmul.add(ours, matmul, n_rot);
        if (dist != Dist::kHeavyTail) {  // how often that reaches the quantized bytes
          const auto a8 = ours_from(q8, ours), b8 = ours_from(q8, matmul);
          q8_blocks += a8.size() / q8.block_bytes();
          q8_differ += differing_blocks(a8, b8, q8.block_bytes());
          q4_differ += differing_blocks(ours_from(q4, ours), ours_from(q4, matmul), q4.block_bytes());
        }
        auto back = ours;
        hadamard_unrotate(back.data(), back.size(), n_rot);
        roundtrip.add(back, x, n_rot);
      }
    }
    std::printf("rotation n_rot %3u: %" PRIu64 " values bit-identical to the CPU backend's fwht\n"
                "  vs the f32 matmul with H (use_ref): %s; quantized blocks that differ: q8_0 %" PRIu64
                ", q4_0 %" PRIu64 " of %" PRIu64 "\n"
                "  unrotate(rotate(x)) vs x: %s\n",
                n_rot, values, vs_matmul.str().c_str(), q8_differ, q4_differ, q8_blocks, roundtrip.str().c_str());
  }
}

TEST(GgmlOracle, ConvertRowPipelineMatchesGgml) {
  const TypeTraits& f16 = *find_traits(GgmlType::kF16);
  const size_t head_dim = 128, n = 8 * head_dim, rows = 32;
  for (const TypeTraits& q : type_traits()) {
    if (!q.quantized()) continue;
    uint64_t bytes = 0;
    for (Dist dist : {Dist::kF16Exact, Dist::kKvLike, Dist::kGauss}) {
      // f16 source rows
      auto xf = testing::random_rows(dist, 5, rows, n);
      const auto src = oracle().quantize(gid(f16), xf.data(), rows, n);
      for (KvSide side : {KvSide::kK, KvSide::kV}) {
        auto plan = plan_rotation(*f16.layout, *q.layout, head_dim, side);
        ASSERT_TRUE(plan.ok());
        ASSERT_EQ(plan->step, RotationStep::kRotate);
        auto conv = RowConverter::make(f16, q, n, *plan);
        ASSERT_TRUE(conv.ok()) << conv.status().ToString();
        std::vector<std::byte> got(rows * conv->dst_row_bytes());
        ASSERT_TRUE(conv->convert(src, got).ok());
        // ggml: to_float, mul_mat(H) with the Hadamard hint, ggml_quantize_chunk
        const auto f = oracle().to_float(gid(f16), src.data(), rows * n);
        const auto r = oracle().hadamard(f.data(), f.size(), plan->n_rot, false);
        const auto want = oracle().quantize(gid(q), r.data(), rows, n);
        const long d = first_diff(got, want);
        ASSERT_EQ(d, -1) << "f16 -> " << q.name() << " byte " << d;
        bytes += want.size();

        // and back: quantized -> f16, unrotate
        auto back_plan = plan_rotation(*q.layout, *f16.layout, head_dim, side);
        ASSERT_TRUE(back_plan.ok());
        ASSERT_EQ(back_plan->step, RotationStep::kUnrotate);
        auto back = RowConverter::make(q, f16, n, *back_plan);
        ASSERT_TRUE(back.ok());
        std::vector<std::byte> got16(rows * back->dst_row_bytes());
        ASSERT_TRUE(back->convert(want, got16).ok());
        const auto qf = oracle().to_float(gid(q), want.data(), rows * n);
        const auto ur = oracle().hadamard(qf.data(), qf.size(), back_plan->n_rot, false);
        const auto want16 = oracle().quantize(gid(f16), ur.data(), rows, n);
        const long e = first_diff(got16, want16);
        ASSERT_EQ(e, -1) << q.name() << " -> f16 byte " << e;
        bytes += want16.size();
      }
    }
    std::printf("pipeline f16 <-> %-6s (rotate/unrotate, K n_rot 128 and V n_rot 64): %" PRIu64
                " bytes identical to ggml's to_float + CPU fwht + ggml_quantize_chunk\n",
                std::string(q.name()).c_str(), bytes);
  }
}

TEST(GgmlOracle, CpuBackendStoreDifferences) {
  // Informational: llama.cpp writes its cache with the CPU backend's from_float (ggml_set_rows),
  // which is not always the reference quantizer. Our contract is ggml_quantize_chunk.
  const size_t rows = 256, n = 1024;
  for (const TypeTraits& t : type_traits()) {
    uint64_t blocks = 0, differ = 0;
    for (Dist dist : {Dist::kGauss, Dist::kKvLike, Dist::kF16Exact, Dist::kOutliers, Dist::kSparse}) {
      const auto x = testing::random_rows(dist, 9, rows, n);
      const auto ref = oracle().quantize(gid(t), x.data(), rows, n);
      const auto cpu = oracle().set_rows(gid(t), x.data(), rows, n);
      ASSERT_EQ(ref.size(), cpu.size());
      for (size_t b = 0; b < ref.size() / t.block_bytes(); b++) {
        blocks++;
        differ += std::memcmp(&ref[b * t.block_bytes()], &cpu[b * t.block_bytes()], t.block_bytes()) != 0;
      }
    }
    std::printf("cpu store %-6s: %" PRIu64 " of %" PRIu64 " blocks differ between ggml_set_rows on the CPU backend "
                "and ggml_quantize_chunk\n",
                std::string(t.name()).c_str(), differ, blocks);
  }
}

}  // namespace
}  // namespace kvsnap
