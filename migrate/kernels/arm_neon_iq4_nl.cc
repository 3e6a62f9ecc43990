#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// aarch64 NEON iq4_nl quantizer, simd::Level::kNeon: quantize_row_iq4_nl_impl (ntry = 7, no
// weights) with lane = one block, 4 blocks per vector. Each lane runs the reference's sums over
// j = 0..31 in order with the same operations, so every sum, scale and comparison is the
// reference's; best_index_int8 is computed by its definition (the bracket val[mu-1] <= x <
// val[mu] the binary search finds, then the same float comparison `x - val[mu-1] < val[mu] - x`).
// Blocks holding NaN/inf, and the blocks after the last whole group of 4, take the scalar path.
// Fresh NaNs (overflowing sums) are the same default NaN in the lanes as in the scalar code.

#include "migrate/kernels/arm_common.h"

#ifdef KVSNAP_SIMD_NEON

#include <cassert>
#include <cmath>

namespace kvsnap::simd::arm {

using quants::kIQ4_NLBytes;
using quants::kIQ4NLValues;

namespace {

// One pass of the reference's sums: sumqx += w * q * x, sumq2 += w * q * q over j = 0..31,
// q = values[best_index(id * x)]; xt / wt hold x[j] / weight[j] of the 4 blocks at [4 j].
inline void iq4_sums4(const float* xt, const float* wt, float32x4_t id, float32x4_t* sumqx, float32x4_t* sumq2) {
  float32x4_t sqx = vdupq_n_f32(0.0f), sq2 = vdupq_n_f32(0.0f);
  for (int j = 0; j < 32; j++) {
    const float32x4_t x = vld1q_f32(xt + 4 * j);
    uint32x4_t idx;
    float32x4_t q;
    iq4_index4(vmulq_f32(id, x), &idx, &q);
    const float32x4_t wq = vmulq_f32(vld1q_f32(wt + 4 * j), q);
    sqx = vaddq_f32(sqx, vmulq_f32(wq, x));
    sq2 = vaddq_f32(sq2, vmulq_f32(wq, q));
  }
  *sumqx = sqx;
  *sumq2 = sq2;
}

// Four blocks at x (non-NaN, finite) -> four iq4_nl blocks at out.
void iq4_nl_blocks4(const float* x, std::byte* out) {
  alignas(16) float xt[128], wt[128], maxv[4];
  for (int b = 0; b < 4; b++) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++) {
      const float v = x[32 * b + j];
      xt[4 * j + b] = v;
      wt[4 * j + b] = v * v;
      const float ax = std::fabs(v);
      if (ax > amax) {
        amax = ax;
        max = v;
      }
    }
    maxv[b] = max;
  }
  const float32x4_t max = vld1q_f32(maxv), zero = vdupq_n_f32(0.0f);
  const uint32x4_t search = vcgeq_f32(vabsq_f32(max), vdupq_n_f32(1e-15f));  // !(amax < GROUP_MAX_EPS)
  float32x4_t d = vdivq_f32(vnegq_f32(max), vdupq_n_f32(kIQ4NLValues[0]));  // -max / values[0]
  float32x4_t sumqx, sumq2;
  iq4_sums4(xt, wt, vdivq_f32(vdupq_n_f32(1.0f), d), &sumqx, &sumq2);
  d = vbslq_f32(vcgtq_f32(sumq2, zero), vdivq_f32(sumqx, sumq2), zero);
  float32x4_t best = vmulq_f32(d, sumqx);
  for (int itry = -7; itry <= 7; ++itry) {
    const float32x4_t id = vdivq_f32(vdupq_n_f32(static_cast<float>(itry + kIQ4NLValues[0])), max);
    iq4_sums4(xt, wt, id, &sumqx, &sumq2);
    const uint32x4_t better = vandq_u32(vcgtq_f32(sumq2, zero),
                                        vcgtq_f32(vmulq_f32(sumqx, sumqx), vmulq_f32(best, sumq2)));
    const float32x4_t dn = vdivq_f32(sumqx, sumq2);
    d = vbslq_f32(better, dn, d);
    best = vbslq_f32(better, vmulq_f32(dn, sumqx), best);
  }
  d = vbslq_f32(search, d, zero);
  const float32x4_t id = vbslq_f32(vceqq_f32(d, zero), zero, vdivq_f32(vdupq_n_f32(1.0f), d));
  alignas(16) uint32_t L[128];
  for (int j = 0; j < 32; j++) {
    uint32x4_t idx;
    float32x4_t q;
    iq4_index4(vmulq_f32(id, vld1q_f32(xt + 4 * j)), &idx, &q);
    vst1q_u32(L + 4 * j, idx);
  }
  alignas(16) float dv[4];
  vst1q_f32(dv, d);
  for (int b = 0; b < 4; b++) {
    std::byte* blk = out + b * kIQ4_NLBytes;
    store_u16(blk, half::f32_to_fp16(dv[b]));
    uint8_t* q4 = u8(blk) + 2;
    for (int j = 0; j < 16; j++) q4[j] = static_cast<uint8_t>(L[4 * j + b] | (L[4 * (16 + j) + b] << 4));
  }
}

bool finite32(const float* x) {
  uint32x4_t ok = vdupq_n_u32(~0u);
  for (int k = 0; k < 8; k++) ok = vandq_u32(ok, vcaltq_f32(vld1q_f32(x + 4 * k), vdupq_n_f32(INFINITY)));
  return vminvq_u32(ok) != 0;  // |x| < inf: false for inf and NaN
}

}  // namespace

void iq4_nl_from_f32_neon(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  const size_t nb = n / kQK;
  size_t ib = 0;
  for (; ib + 4 <= nb; ib += 4) {
    const float* xb = x + ib * kQK;
    std::byte* ob = out + ib * kIQ4_NLBytes;
    iq4_nl_blocks4(xb, ob);
    for (int b = 0; b < 4; b++) {
      if (!finite32(xb + 32 * b)) quants::ref::iq4_nl_from_f32(xb + 32 * b, ob + b * kIQ4_NLBytes, kQK);
    }
  }
  if (ib < nb) quants::ref::iq4_nl_from_f32(x + ib * kQK, out + ib * kIQ4_NLBytes, (nb - ib) * kQK);
}

}  // namespace kvsnap::simd::arm

#endif  // KVSNAP_SIMD_NEON
