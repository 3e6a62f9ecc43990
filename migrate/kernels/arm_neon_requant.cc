#include "migrate/fp_strict.h"  // first: no implicit FMLA contraction in this file

// ExactRequantizer's quick search at NEON (simd_kernels.h, QuickSearchBlocks): 4 blocks at a
// time, block k in lane k, as x86_avx2_requant.cc does with 8: the values transposed once, the
// scalar search's 8 partial sums and their pairwise tree as vectors, every choice a per-lane
// select; iq4_nl's level is iq4_index4 (arm_common.h), ggml's best_index_int8 by its definition.
// Why each operation is the scalar one: FRINTN rounds half to even like nearbyint; FMAX
// and FMIN equal the scalar's (n > lo ? n : lo) and (n < hi ? n : hi) for the finite levels
// they see (-0 against +0 included: both give +0 from max(-0, +0) and keep -0 against a nonzero
// bound); FCVT to and from f16 round to nearest even and keep subnormals (arm_common.h); the
// least-squares fit is the same double operations. tests/migrate/exact_requant_test.cc compares
// it with the scalar search under qemu-aarch64 (tests/cross/run.sh).

#include <limits>

#include "migrate/kernels/arm_common.h"

#ifdef KVSNAP_SIMD_NEON

namespace kvsnap::simd::arm {
namespace {

// 4 x 4 transpose: r[i] lane k <- r[k] lane i.
inline void transpose4(float32x4_t* r) {
  const float32x4x2_t t01 = vtrnq_f32(r[0], r[1]), t23 = vtrnq_f32(r[2], r[3]);
  r[0] = vcombine_f32(vget_low_f32(t01.val[0]), vget_low_f32(t23.val[0]));
  r[1] = vcombine_f32(vget_low_f32(t01.val[1]), vget_low_f32(t23.val[1]));
  r[2] = vcombine_f32(vget_high_f32(t01.val[0]), vget_high_f32(t23.val[0]));
  r[3] = vcombine_f32(vget_high_f32(t01.val[1]), vget_high_f32(t23.val[1]));
}

// The scalar search's tree over its 8 partial sums: (l, l + 4), (l, l + 2), (0, 1).
inline float32x4_t tree8(const float32x4_t* a) {
  const float32x4_t t0 = vaddq_f32(a[0], a[4]), t1 = vaddq_f32(a[1], a[5]);
  const float32x4_t t2 = vaddq_f32(a[2], a[6]), t3 = vaddq_f32(a[3], a[7]);
  return vaddq_f32(vaddq_f32(t0, t2), vaddq_f32(t1, t3));
}

inline uint32x4_t finite(float32x4_t v) {
  return vcaltq_f32(v, vdupq_n_f32(std::numeric_limits<float>::infinity()));
}

struct Grid {
  float32x4_t lo, hi;  // a linear grid's levels
};

// As x86_avx2_requant.cc's level(): without an offset, x * id gives what the scalar's
// (x - 0) * id does, up to the sign of a zero the level does not keep (and best_index_int8
// gives +0 and -0 one index).
template <RequantGrid G>
inline float32x4_t level(float32x4_t x, float32x4_t id, float32x4_t m, const Grid& g) {
  if (G == RequantGrid::kIq4nl) {
    uint32x4_t idx;
    float32x4_t v;
    iq4_index4(vmulq_f32(x, id), &idx, &v);
    return v;
  }
  const float32x4_t r = G == RequantGrid::kOffset ? vmulq_f32(vsubq_f32(x, m), id) : vmulq_f32(x, id);
  return vminq_f32(vmaxq_f32(vrndnq_f32(r), g.lo), g.hi);
}

template <RequantGrid G>
inline float32x4_t score(const float32x4_t* xt, float32x4_t d, float32x4_t id, float32x4_t m, const Grid& g) {
  constexpr bool kOffset = G == RequantGrid::kOffset;
  auto sq = [&](int i) {
    const float32x4_t n = level<G>(xt[i], id, m, g);
    // Without an offset, x - n * d in one multiply-subtract (vfmsq_f32(a, b, c) = a - b c, one
    // rounding): n * d is exact, as x86_avx2_requant.cc's score() says.
    const float32x4_t diff = kOffset ? vsubq_f32(xt[i], vaddq_f32(vmulq_f32(n, d), m)) : vfmsq_f32(xt[i], n, d);
    return vmulq_f32(diff, diff);
  };
  float32x4_t acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = sq(l);
  for (int v = 1; v < 4; ++v) {
    for (int l = 0; l < 8; ++l) acc[l] = vaddq_f32(acc[l], sq(8 * v + l));
  }
  return tree8(acc);
}

struct Best {
  float32x4_t err, d, id, m;
  uint32x4_t d16, m16;  // f16 bits
  uint32x4_t improved;
};

template <RequantGrid G>
inline void consider(const float32x4_t* xt, uint16x4_t d16, uint16x4_t m16, uint32x4_t valid, const Grid& g,
                     Best& b) {
  constexpr bool kOffset = G == RequantGrid::kOffset;
  const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(d16));
  const float32x4_t m = kOffset ? vcvt_f32_f16(vreinterpret_f16_u16(m16)) : vdupq_n_f32(0.0f);
  uint32x4_t ok = vandq_u32(valid, vcagtq_f32(d, vdupq_n_f32(0.0f)));
  ok = vandq_u32(ok, finite(d));
  if (kOffset) ok = vandq_u32(ok, finite(m));
  if (vmaxvq_u32(ok) == 0) return;
  const float32x4_t id = vdivq_f32(vdupq_n_f32(1.0f), d);
  const float32x4_t e = score<G>(xt, d, id, m, g);
  const uint32x4_t better = vandq_u32(ok, vcltq_f32(e, b.err));
  b.err = vbslq_f32(better, e, b.err);
  b.d = vbslq_f32(better, d, b.d);
  b.id = vbslq_f32(better, id, b.id);
  b.m = vbslq_f32(better, m, b.m);
  b.d16 = vbslq_u32(better, vmovl_u16(d16), b.d16);
  b.m16 = vbslq_u32(better, vmovl_u16(m16), b.m16);
  b.improved = vorrq_u32(b.improved, better);
}

// The least-squares candidate of 2 lanes, in double as the scalar search.
template <RequantGrid G>
inline void fit2(float64x2_t sl, float64x2_t sll, float64x2_t sx, float64x2_t sxl, float64x2_t& d,
                 float64x2_t& m, uint64x2_t& ok) {
  constexpr bool kOffset = G == RequantGrid::kOffset;
  const float64x2_t n = vdupq_n_f64(32.0), zero = vdupq_n_f64(0.0);
  if (kOffset) {
    const float64x2_t det = vsubq_f64(vmulq_f64(n, sll), vmulq_f64(sl, sl));
    ok = vreinterpretq_u64_u32(vmvnq_u32(vreinterpretq_u32_u64(vceqq_f64(det, zero))));
    d = vdivq_f64(vsubq_f64(vmulq_f64(n, sxl), vmulq_f64(sl, sx)), det);
    m = vdivq_f64(vsubq_f64(sx, vmulq_f64(d, sl)), n);
  } else {
    ok = vreinterpretq_u64_u32(vmvnq_u32(vreinterpretq_u32_u64(vceqq_f64(sll, zero))));
    d = vdivq_f64(sxl, sll);
    m = zero;
  }
}

template <RequantGrid G>
void quick_search_lanes4(QuickSearchBlocks& q, int k0) {
  constexpr bool kOffset = G == RequantGrid::kOffset;
  const Grid g{vdupq_n_f32(q.lo), vdupq_n_f32(q.hi)};
  // Lanes past q.n repeat block 0 and are never chosen.
  const float* xp[4];
  const float* yp[4];
  uint16_t d16[4], m16[4];
  for (int k = 0; k < 4; ++k) {
    const int s = k0 + k < q.n ? k0 + k : 0;
    xp[k] = q.x[s];
    yp[k] = q.y[s];
    d16[k] = q.d16[s];
    m16[k] = kOffset ? q.m16[s] : 0;
  }
  // The reference block's error: per block, lane l of `lo` the partial sum of values l, l + 8,
  // l + 16, l + 24 (l < 4), of `hi` those of l + 4; then (l, l + 4) added, and the other two
  // steps of the tree across the 4 blocks after a transpose.
  float32x4_t t[4];
  for (int k = 0; k < 4; ++k) {
    float32x4_t part[2];
    for (int h = 0; h < 2; ++h) {
      for (int v = 0; v < 4; ++v) {
        const float32x4_t diff = vsubq_f32(vld1q_f32(xp[k] + 8 * v + 4 * h), vld1q_f32(yp[k] + 8 * v + 4 * h));
        const float32x4_t sq = vmulq_f32(diff, diff);
        part[h] = v == 0 ? sq : vaddq_f32(part[h], sq);
      }
    }
    t[k] = vaddq_f32(part[0], part[1]);
  }
  transpose4(t);
  float32x4_t xt[32];
  for (int c = 0; c < 8; ++c) {  // values 4c .. 4c + 3
    float32x4_t r[4];
    for (int k = 0; k < 4; ++k) r[k] = vld1q_f32(xp[k] + 4 * c);
    transpose4(r);
    for (int j = 0; j < 4; ++j) xt[4 * c + j] = r[j];
  }
  const uint16x4_t d16_ref = vld1_u16(d16), m16_ref = vld1_u16(m16);
  Best b;
  b.err = vaddq_f32(vaddq_f32(t[0], t[2]), vaddq_f32(t[1], t[3]));
  b.d = vcvt_f32_f16(vreinterpret_f16_u16(d16_ref));
  b.m = kOffset ? vcvt_f32_f16(vreinterpret_f16_u16(m16_ref)) : vdupq_n_f32(0.0f);
  b.id = vdivq_f32(vdupq_n_f32(1.0f), b.d);
  b.d16 = vmovl_u16(d16_ref);
  b.m16 = vmovl_u16(m16_ref);
  b.improved = vdupq_n_u32(0);
  static const uint32_t kLane[4] = {0, 1, 2, 3};
  uint32x4_t valid = vcltq_u32(vaddq_u32(vld1q_u32(kLane), vdupq_n_u32(uint32_t(k0))), vdupq_n_u32(uint32_t(q.n)));
  valid = vandq_u32(valid, vcgtq_f32(b.err, vdupq_n_f32(0.0f)));
  valid = vandq_u32(valid, finite(b.err));
  valid = vandq_u32(valid, vcagtq_f32(b.d, vdupq_n_f32(0.0f)));
  valid = vandq_u32(valid, finite(b.d));
  if (kOffset) valid = vandq_u32(valid, finite(b.m));
  if (vmaxvq_u32(valid) == 0) return;

  for (float f : kQuickFactors) {
    const uint16x4_t cand =
        vreinterpret_u16_f16(vcvt_f16_f32(vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(d16_ref)), vdupq_n_f32(f))));
    consider<G>(xt, cand, m16_ref, valid, g, b);
  }

  // The least-squares fit of the best's levels: the reference block's where no factor did better.
  uint32_t valid_l[4], improved_l[4];
  vst1q_u32(valid_l, valid);
  vst1q_u32(improved_l, b.improved);
  float ref_q[32][4] = {};
  bool reference = false;
  for (int k = 0; k < 4; ++k) {
    if (!valid_l[k] || improved_l[k]) continue;
    int8_t lv[32];
    q.ref_levels(q.ctx, k0 + k, lv);
    for (int i = 0; i < 32; ++i) ref_q[i][k] = float(lv[i]);
    reference = true;
  }
  float32x4_t il = vdupq_n_f32(0.0f), ill = vdupq_n_f32(0.0f);
  float32x4_t ax[8], axl[8];
  for (int l = 0; l < 8; ++l) {
    ax[l] = vdupq_n_f32(0.0f);
    axl[l] = vdupq_n_f32(0.0f);
    for (int v = 0; v < 4; ++v) {
      const int i = 8 * v + l;
      float32x4_t n = level<G>(xt[i], b.id, b.m, g);
      if (reference) n = vbslq_f32(b.improved, n, vld1q_f32(ref_q[i]));
      il = vaddq_f32(il, n);  // integers below 2^24: exact in any order
      ill = vaddq_f32(ill, vmulq_f32(n, n));
      ax[l] = vaddq_f32(ax[l], xt[i]);
      axl[l] = vaddq_f32(axl[l], vmulq_f32(xt[i], n));
    }
  }
  const float32x4_t sx = tree8(ax), sxl = tree8(axl);
  float64x2_t d_lo, d_hi, m_lo, m_hi;
  uint64x2_t ok_lo, ok_hi;
  fit2<G>(vcvt_f64_f32(vget_low_f32(il)), vcvt_f64_f32(vget_low_f32(ill)), vcvt_f64_f32(vget_low_f32(sx)),
                vcvt_f64_f32(vget_low_f32(sxl)), d_lo, m_lo, ok_lo);
  fit2<G>(vcvt_high_f64_f32(il), vcvt_high_f64_f32(ill), vcvt_high_f64_f32(sx), vcvt_high_f64_f32(sxl), d_hi,
                m_hi, ok_hi);
  const float32x4_t fit_d = vcvt_high_f32_f64(vcvt_f32_f64(d_lo), d_hi);
  const float32x4_t fit_m = vcvt_high_f32_f64(vcvt_f32_f64(m_lo), m_hi);
  const uint16x4_t fit_d16 = vreinterpret_u16_f16(vcvt_f16_f32(fit_d));
  const uint16x4_t fit_m16 = kOffset ? vreinterpret_u16_f16(vcvt_f16_f32(fit_m)) : vdup_n_u16(0);
  const uint32x4_t fit_ok = vcombine_u32(vmovn_u64(ok_lo), vmovn_u64(ok_hi));
  consider<G>(xt, fit_d16, fit_m16, vandq_u32(valid, fit_ok), g, b);

  vst1q_u32(improved_l, b.improved);
  uint32_t out_d[4], out_m[4];
  vst1q_u32(out_d, b.d16);
  vst1q_u32(out_m, b.m16);
  bool any = false;
  for (int k = 0; k < 4; ++k) any = any || improved_l[k] != 0;
  if (!any) return;
  // The best's levels, transposed back to one block per row, then to int8.
  float32x4_t n[32];
  for (int i = 0; i < 32; ++i) n[i] = level<G>(xt[i], b.id, b.m, g);
  for (int c = 0; c < 8; ++c) transpose4(n + 4 * c);
  for (int k = 0; k < 4; ++k) {
    if (!improved_l[k]) continue;
    const int blk = k0 + k;
    q.improved |= 1u << blk;
    q.out_d16[blk] = uint16_t(out_d[k]);
    q.out_m16[blk] = uint16_t(out_m[k]);
    // block k's values 4c .. 4c + 3 are n[4c + k]; the levels are small integers, exact in int32
    const int8x16_t a = low_bytes16(vcvtq_s32_f32(n[k]), vcvtq_s32_f32(n[4 + k]), vcvtq_s32_f32(n[8 + k]),
                                    vcvtq_s32_f32(n[12 + k]));
    const int8x16_t c = low_bytes16(vcvtq_s32_f32(n[16 + k]), vcvtq_s32_f32(n[20 + k]), vcvtq_s32_f32(n[24 + k]),
                                    vcvtq_s32_f32(n[28 + k]));
    vst1q_s8(q.levels[blk], a);
    vst1q_s8(q.levels[blk] + 16, c);
  }
}

}  // namespace

void quick_search_neon(QuickSearchBlocks& q) {
  q.improved = 0;
  for (int k0 = 0; k0 < q.n; k0 += 4) {
    switch (q.grid) {
      case RequantGrid::kOffset: quick_search_lanes4<RequantGrid::kOffset>(q, k0); break;
      case RequantGrid::kSymmetric: quick_search_lanes4<RequantGrid::kSymmetric>(q, k0); break;
      case RequantGrid::kIq4nl: quick_search_lanes4<RequantGrid::kIq4nl>(q, k0); break;
    }
  }
}

}  // namespace kvsnap::simd::arm

#endif  // KVSNAP_SIMD_NEON
