#include "migrate/fp_strict.h"  // first: no FMA contraction (the reference block's x * id + bias is ggml's)

// The scalar LevelSearchFn (simd_kernels.h says what it computes; the scalar level's row in
// simd_kernels.cc): block by block. The SIMD kernels (kernels/*_level_search.cc) compute the same
// per block: the reference block's float operations value by value, integer sums (exact in any
// order) and the same double expression for every error.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "migrate/half.h"
#include "migrate/simd_kernels.h"

namespace kvsnap::simd {
namespace {

constexpr int kBlock = 32;

// The error of scale D with the integer sums of its levels m against the source's levels n
// (simd_kernels.h, LevelSearchBlocks): each product exact in double (f16 significands of 11
// bits, sums below 2^20), so only the two additions round.
double level_error(float ds, float d, int32_t snn, int32_t snm, int32_t smm) {
  const double a = ds, dd = d;
  const double t1 = (a * a) * double(snn), t2 = (a * dd) * double(snm), t3 = (dd * dd) * double(smm);
  return (t1 - (t2 + t2)) + t3;
}

// The level of source level n for multiplier b: (n b + 2^14) >> 15 (for |n| <= 128, |b| <=
// 32767: pmulhrsw and sqrdmulh exactly), clamped to [lo, hi].
inline int32_t level_of(int32_t n, int32_t b, int lo, int hi) {
  return std::min(std::max((n * b + (1 << 14)) >> 15, lo), hi);
}

struct Candidate {
  bool reference = true;  // else its levels are n times b
  uint16_t d16 = 0;
  int32_t b = 0;          // the levels' multiplier (q * 2^15)
  int32_t snm = 0, smm = 0;
  double err = 0;
};

// A block's result from its levels n and scale ds16: its scale and levels (level_search_ref packs
// them), and whether the target holds it exactly.
void search_block(const int8_t* n, uint16_t ds16, int lo, int hi, uint16_t& out_d16, int8_t* out, bool& embedded) {
  embedded = std::all_of(n, n + kBlock, [&](int8_t v) { return v >= lo && v <= hi; });
  if (embedded) {
    out_d16 = ds16;
    std::memcpy(out, n, kBlock);
    return;
  }
  const float ds = half::fp16_to_f32(ds16);
  // ggml's reference block, as quantize_row_q4_0_ref / q5_0_ref compute it from the values.
  float x[kBlock];
  for (int i = 0; i < kBlock; ++i) x[i] = float(n[i]) * ds;
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < kBlock; ++i) {
    const float a = std::fabs(x[i]);
    if (amax < a) {
      amax = a;
      max = x[i];
    }
  }
  const float d = max / float(lo);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const float bias = 0.5f - float(lo);
  int8_t ref[kBlock];
  int32_t snn = 0;
  Candidate best;
  for (int i = 0; i < kBlock; ++i) {
    const int l = std::min(int(x[i] * id + bias), hi - lo) + lo;  // x * id + bias is in [0, 2 hi + 2)
    ref[i] = int8_t(l);
    snn += n[i] * n[i];
    best.snm += n[i] * l;
    best.smm += l * l;
  }
  best.d16 = half::f32_to_fp16(d);
  std::memcpy(out, ref, kBlock);
  out_d16 = best.d16;
  const float d_ref = half::fp16_to_f32(best.d16);
  best.err = level_error(ds, d_ref, snn, best.snm, best.smm);
  if (!(best.err > 0) || !std::isfinite(best.err) || !(std::fabs(d_ref) > 0) || !std::isfinite(d_ref)) return;

  auto consider = [&](uint16_t d16) {
    const float dc = half::fp16_to_f32(d16);
    if (!(std::fabs(dc) > 0) || !std::isfinite(dc)) return;
    const float q = ds / dc;
    if (!(std::fabs(q) < 1.0f)) return;
    const float bq = std::nearbyint(q * 32768.0f);
    if (!(std::fabs(bq) <= 32767.0f)) return;
    Candidate c;
    c.reference = false;
    c.d16 = d16;
    c.b = int32_t(bq);
    for (int i = 0; i < kBlock; ++i) {
      const int32_t m = level_of(n[i], c.b, lo, hi);
      c.snm += n[i] * m;
      c.smm += m * m;
    }
    c.err = level_error(ds, dc, snn, c.snm, c.smm);
    if (c.err < best.err) best = c;
  };
  for (float f : kQuickFactors) consider(half::f32_to_fp16(d_ref * f));
  if (best.smm != 0) consider(half::f32_to_fp16(float(double(ds) * double(best.snm) / double(best.smm))));
  if (best.reference) return;
  out_d16 = best.d16;
  for (int i = 0; i < kBlock; ++i) {
    out[i] = int8_t(level_of(n[i], best.b, lo, hi));
  }
}

}  // namespace

void level_search_ref(LevelSearchBlocks& b) {
  const int lo = b.dst_type == GgmlType::kQ5_0 ? -16 : -8, hi = -lo - 1;
  b.embedded = 0;
  for (int k = 0; k < b.n; ++k) {
    int8_t n[kBlock], levels[kBlock];
    source_levels(b.src_type, b.src[k], n);
    uint16_t d16;
    bool embedded;
    search_block(n, half::load_u16(b.src[k]), lo, hi, d16, levels, embedded);
    target_block(b.dst_type, d16, levels, b.dst[k]);
    b.embedded |= uint32_t(embedded) << k;
  }
}

}  // namespace kvsnap::simd
