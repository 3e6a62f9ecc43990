#include "migrate/fp_strict.h"  // first: no implicit FMLA contraction in this file

// The integer quick search at NEON (simd_kernels.h, LevelSearchBlocks): 8 blocks at a time,
// block k in lane k of int16x8 vectors (one vector per value i), its scale, multiplier and sums
// in two float32x4 / int32x4 and four float64x2 halves. Why each operation is the scalar one:
// SQRDMULH is (2 n B + 2^15) >> 16 = (n B + 2^14) >> 15 (no saturation: |n| <= 128); the sums
// are exact integers; FCVTNS rounds half to even like nearbyint (and a scale the search skips
// gets NaN, so its error is NaN and never kept: ARM converts a NaN to 0, not x86's INT32_MIN);
// FCVTZS truncates like the reference's (int8_t) cast for the in-range values it sees; FCVT to
// and from f16 and from double round to nearest even and keep subnormals (arm_common.h); the
// errors are the same double operations in the same order. The levels are decoded and the
// blocks packed by the scalar helpers (source_levels, target_block).
// tests/migrate/exact_requant_test.cc compares it with level_search_ref under qemu-aarch64
// (tests/cross/run.sh).

#include <algorithm>
#include <limits>

#include "migrate/kernels/arm_common.h"
#include "migrate/offset_levels.h"

#ifdef KVSNAP_SIMD_NEON

namespace kvsnap::simd::arm {
namespace {

constexpr int kBlock = 32;

struct Halves {
  int32x4_t lo, hi;  // blocks 0..3, 4..7
};

inline Halves add_products(Halves acc, int16x8_t a, int16x8_t b) {
  return {vmlal_s16(acc.lo, vget_low_s16(a), vget_low_s16(b)), vmlal_high_s16(acc.hi, a, b)};
}

// The error of 2 blocks (level_search.cc, level_error): t1 = (a a) Snn, t2 = (a D) Snm, t3 =
// (D D) Smm, (t1 - (t2 + t2)) + t3.
inline float64x2_t error2(float64x2_t a, float64x2_t t1, float64x2_t d, int64x2_t snm, int64x2_t smm) {
  const float64x2_t t2 = vmulq_f64(vmulq_f64(a, d), vcvtq_f64_s64(snm));
  const float64x2_t t3 = vmulq_f64(vmulq_f64(d, d), vcvtq_f64_s64(smm));
  return vaddq_f64(vsubq_f64(t1, vaddq_f64(t2, t2)), t3);
}

// A float32x4's 4 lanes as two float64x2, an int32x4's as two int64x2.
inline void widen(float32x4_t v, float64x2_t* out) {
  out[0] = vcvt_f64_f32(vget_low_f32(v));
  out[1] = vcvt_high_f64_f32(v);
}
inline void widen(int32x4_t v, int64x2_t* out) {
  out[0] = vmovl_s32(vget_low_s32(v));
  out[1] = vmovl_high_s32(v);
}

struct Batch {
  int16x8_t v[kBlock];  // v[i]: level i of the 8 blocks
  int16x8_t lo, hi;
  float32x4_t ds[2];
  float64x2_t a[4], t1[4];  // ds and (ds ds) Snn in double, blocks 2j, 2j + 1
  uint32x4_t search[2];     // the blocks the search runs for
};

struct Best {
  float64x2_t err[4];
  uint32x4_t d16[2];      // f16 bits
  int16x8_t b;            // the multiplier; 0 where the reference block is best
  int32x4_t snm[2], smm[2];
  uint16x8_t reference;   // all ones where the reference block is best
};

// The error of the 8 blocks for scale d (f16 bits, as uint32 lanes) and sums.
inline void errors8(const Batch& k, const float32x4_t* d, const int32x4_t* snm, const int32x4_t* smm,
                    float64x2_t* e) {
  for (int h = 0; h < 2; ++h) {
    float64x2_t dd[2];
    int64x2_t nm[2], mm[2];
    widen(d[h], dd);
    widen(snm[h], nm);
    widen(smm[h], mm);
    for (int j = 0; j < 2; ++j) e[2 * h + j] = error2(k.a[2 * h + j], k.t1[2 * h + j], dd[j], nm[j], mm[j]);
  }
}

// Scores the scale d16 except where `skip` and keeps it where it does better (a lane it skips
// gets the scale NaN: its error is NaN).
inline void consider(const Batch& k, const uint32x4_t* d16, const uint32x4_t* skip, Best& best) {
  float32x4_t d[2];
  int32x4_t bq[2];
  uint32x4_t off[2];
  for (int h = 0; h < 2; ++h) {
    const float32x4_t dh = vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(d16[h])));
    const float32x4_t q = vdivq_f32(k.ds[h], dh);
    bq[h] = vcvtnq_s32_f32(vmulq_f32(q, vdupq_n_f32(32768.0f)));  // saturating; NaN gives 0
    const uint32x4_t in_range = vandq_u32(vcltq_s32(vqabsq_s32(bq[h]), vdupq_n_s32(32768)), vceqq_f32(q, q));
    const uint32x4_t ok = vandq_u32(in_range, k.search[h]);
    off[h] = vorrq_u32(vmvnq_u32(ok), skip[h]);
    d[h] = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(dh), off[h]));
    bq[h] = vbicq_s32(bq[h], vreinterpretq_s32_u32(off[h]));
  }
  const int16x8_t b = vcombine_s16(vmovn_s32(bq[0]), vmovn_s32(bq[1]));
  Halves nm{vdupq_n_s32(0), vdupq_n_s32(0)}, mm = nm;
  for (int i = 0; i < kBlock; ++i) {
    const int16x8_t m = vminq_s16(vmaxq_s16(vqrdmulhq_s16(k.v[i], b), k.lo), k.hi);
    nm = add_products(nm, k.v[i], m);
    mm = add_products(mm, m, m);
  }
  const int32x4_t snm[2] = {nm.lo, nm.hi}, smm[2] = {mm.lo, mm.hi};
  float64x2_t e[4];
  errors8(k, d, snm, smm, e);
  uint32x4_t better[2];
  for (int h = 0; h < 2; ++h) {
    const uint64x2_t b0 = vcltq_f64(e[2 * h], best.err[2 * h]), b1 = vcltq_f64(e[2 * h + 1], best.err[2 * h + 1]);
    best.err[2 * h] = vbslq_f64(b0, e[2 * h], best.err[2 * h]);
    best.err[2 * h + 1] = vbslq_f64(b1, e[2 * h + 1], best.err[2 * h + 1]);
    better[h] = vcombine_u32(vmovn_u64(b0), vmovn_u64(b1));
    best.d16[h] = vbslq_u32(better[h], d16[h], best.d16[h]);
    best.snm[h] = vbslq_s32(better[h], snm[h], best.snm[h]);
    best.smm[h] = vbslq_s32(better[h], smm[h], best.smm[h]);
  }
  const uint16x8_t better16 = vcombine_u16(vmovn_u32(better[0]), vmovn_u32(better[1]));
  best.b = vbslq_s16(better16, b, best.b);
  best.reference = vbicq_u16(best.reference, better16);
}

// An offset source (q4_1, q5_1): each block's constants, reference block and exactness are
// OffsetBlock's (offset_levels.h, the scalar search's own steps), and so are each candidate's
// terms, error and choice, lane by lane; the candidates' levels and sums, 32 values x 8 blocks,
// are the vector part: SQRDMULH of c << (F + 1) by B ((a B + 2^14) >> 15, as pmulhrsw), a
// saturating add of C, an arithmetic shift by F, the clamps, and sum w m (w = 1024 c + 1: 1024
// Scm + Sm) and sum m m.
template <int kShift>
void offset_search_neon(LevelSearchBlocks& q) {
  const int lo = q.dst_type == GgmlType::kQ5_0 ? -16 : -8, hi = -lo - 1;
  OffsetBlock ob[8];
  int16_t ta[kBlock][8], tw[kBlock][8];
  for (int k = 0; k < 8; ++k) {  // lanes past q.n repeat block 0 and are never written
    ob[k] = offset_block(q.src_type, q.src[k < q.n ? k : 0], lo, hi);
    for (int i = 0; i < kBlock; ++i) {
      ta[i][k] = int16_t(ob[k].c[i] * (1 << (kShift + 1)));
      tw[i][k] = int16_t(ob[k].c[i] * 1024 + 1);
    }
  }
  int16x8_t a[kBlock], w[kBlock];
  for (int i = 0; i < kBlock; ++i) {
    a[i] = vld1q_s16(ta[i]);
    w[i] = vld1q_s16(tw[i]);
  }
  const int16x8_t vlo = vdupq_n_s16(int16_t(lo)), vhi = vdupq_n_s16(int16_t(hi));
  CandidateBest best[8];
  bool any = false;
  for (int k = 0; k < 8; ++k) {
    best[k].sums = ob[k].ref_sums;
    best[k].err = ob[k].ref_err;
    any = any || ob[k].kind == OffsetBlock::Kind::kSearch;
  }
  // Scores scale d16[k] in every lane k where `on` (the search's and not skipped).
  auto score = [&](const uint16_t* d16, const bool* try_lane) {
    int16_t bb[8], cc[8];
    bool on[8], some = false;
    for (int k = 0; k < 8; ++k) {
      int32_t b = 0, c = 0;
      on[k] = try_lane[k] && ob[k].kind == OffsetBlock::Kind::kSearch &&
              offset_terms(ob[k], half::fp16_to_f32(d16[k]), b, c);
      bb[k] = on[k] ? int16_t(b) : 0;
      cc[k] = on[k] ? int16_t(c) : 0;
      some = some || on[k];
    }
    if (!some) return;
    const int16x8_t b = vld1q_s16(bb), c = vld1q_s16(cc);
    Halves wm{vdupq_n_s32(0), vdupq_n_s32(0)}, mm = wm;
    for (int i = 0; i < kBlock; ++i) {
      const int16x8_t m = vminq_s16(vmaxq_s16(vshrq_n_s16(vqaddq_s16(vqrdmulhq_s16(a[i], b), c), kShift), vlo), vhi);
      wm = add_products(wm, w[i], m);
      mm = add_products(mm, m, m);
    }
    int32_t t[8], smm[8];
    vst1q_s32(t, wm.lo);
    vst1q_s32(t + 4, wm.hi);
    vst1q_s32(smm, mm.lo);
    vst1q_s32(smm + 4, mm.hi);
    for (int k = 0; k < 8; ++k) {
      if (!on[k]) continue;
      const LevelSums s = unpack_sums(t[k], smm[k]);
      const double e = offset_error(ob[k], half::fp16_to_f32(d16[k]), s);
      if (e < best[k].err) best[k] = {false, d16[k], 0, bb[k], cc[k], s, e};
    }
  };
  if (any) {
    uint16_t d16[8];
    bool all[8];
    for (float f : kQuickFactors) {
      for (int k = 0; k < 8; ++k) {
        d16[k] = half::f32_to_fp16(ob[k].d_ref * f);
        all[k] = true;
      }
      score(d16, all);
    }
    bool fit[8];
    for (int k = 0; k < 8; ++k) {
      fit[k] = best[k].sums.squares != 0;
      d16[k] = fit[k] ? offset_fit(ob[k], best[k].sums) : 0;
    }
    score(d16, fit);
  }
  q.embedded = 0;
  q.declined = 0;
  for (int k = 0; k < q.n; ++k) {
    const OffsetBlock& o = ob[k];
    if (o.kind == OffsetBlock::Kind::kDeclined) {
      q.declined |= 1u << k;
      continue;
    }
    q.embedded |= uint32_t(o.kind == OffsetBlock::Kind::kEmbedded) << k;
    if (o.kind != OffsetBlock::Kind::kSearch || best[k].reference) {
      target_block(q.dst_type, o.d16, o.levels, q.dst[k]);
      continue;
    }
    int8_t levels[kBlock];
    for (int i = 0; i < kBlock; ++i) levels[i] = int8_t(offset_level(o, o.c[i], best[k].b, best[k].c, lo, hi));
    target_block(q.dst_type, best[k].d16, levels, q.dst[k]);
  }
}

// An offset target (q4_1, q5_1): each block's constants, reference block and declining are
// TargetBlock's (offset_levels.h, the scalar search's own steps), and so are each candidate's
// terms, error, fit and choice, lane by lane; the candidates' centred levels and sums, 32 values x
// 8 blocks, are the vector part: SQRDMULH of c << (F + 1) by B, a saturating add of C, an
// arithmetic shift by F, the clamps to [-H, T - H], and sum c t', sum t' (one product with w =
// 1024 c + 1 where |c| <= 16, two for 8-bit sources) and sum t' t'.
template <bool kWide>
void target_search_neon(LevelSearchBlocks& q) {
  TargetBlock ob[8];
  int16_t ta[kBlock][8], tw[kBlock][8];
  for (int k = 0; k < 8; ++k) {  // lanes past q.n repeat block 0 and are never written
    ob[k] = target_block_steps(q.src_type, q.dst_type, q.src[k < q.n ? k : 0]);
    for (int i = 0; i < kBlock; ++i) {
      ta[i][k] = int16_t(ob[k].c[i] * (1 << (ob[k].shift + 1)));
      tw[i][k] = kWide ? int16_t(ob[k].c[i]) : int16_t(ob[k].c[i] * 1024 + 1);
    }
  }
  const int shift = ob[0].shift, ht = ob[0].ht, top = ob[0].top;  // the same for every block of a pair
  int16x8_t a[kBlock], w[kBlock];
  for (int i = 0; i < kBlock; ++i) {
    a[i] = vld1q_s16(ta[i]);
    w[i] = vld1q_s16(tw[i]);
  }
  const int16x8_t vlo = vdupq_n_s16(int16_t(-ht)), vhi = vdupq_n_s16(int16_t(top - ht));
  const int16x8_t vshift = vdupq_n_s16(int16_t(-shift));  // VSHL by a negative count: an arithmetic right shift
  const int16x8_t one = vdupq_n_s16(1);
  CandidateBest best[8];
  bool any = false;
  for (int k = 0; k < 8; ++k) {
    best[k].sums = ob[k].ref_sums;
    best[k].err = ob[k].ref_err;
    any = any || ob[k].kind == TargetBlock::Kind::kSearch;
  }
  // Scores (d16[k], m16[k]) in every lane k where `on` (the search's and not skipped).
  auto score = [&](const uint16_t* d16, const uint16_t* m16, const bool* try_lane) {
    int16_t bb[8], cc[8];
    bool on[8], some = false;
    for (int k = 0; k < 8; ++k) {
      int32_t b = 0, c = 0;
      on[k] = try_lane[k] && ob[k].kind == TargetBlock::Kind::kSearch &&
              target_terms(ob[k], half::fp16_to_f32(d16[k]), half::fp16_to_f32(m16[k]), b, c);
      bb[k] = on[k] ? int16_t(b) : 0;
      cc[k] = on[k] ? int16_t(c) : 0;
      some = some || on[k];
    }
    if (!some) return;
    const int16x8_t b = vld1q_s16(bb), c = vld1q_s16(cc);
    Halves ct{vdupq_n_s32(0), vdupq_n_s32(0)}, st = ct, tt = ct;
    for (int i = 0; i < kBlock; ++i) {
      const int16x8_t t = vminq_s16(vmaxq_s16(vshlq_s16(vqaddq_s16(vqrdmulhq_s16(a[i], b), c), vshift), vlo), vhi);
      ct = add_products(ct, w[i], t);
      if (kWide) st = add_products(st, one, t);
      tt = add_products(tt, t, t);
    }
    int32_t tc[8], ts[8], t2[8];
    vst1q_s32(tc, ct.lo);
    vst1q_s32(tc + 4, ct.hi);
    vst1q_s32(ts, st.lo);
    vst1q_s32(ts + 4, st.hi);
    vst1q_s32(t2, tt.lo);
    vst1q_s32(t2 + 4, tt.hi);
    for (int k = 0; k < 8; ++k) {
      if (!on[k]) continue;
      const LevelSums s = kWide ? LevelSums{tc[k], ts[k], t2[k]} : unpack_sums(tc[k], t2[k]);
      const double e = target_error(ob[k], half::fp16_to_f32(d16[k]), half::fp16_to_f32(m16[k]), s);
      if (e < best[k].err) best[k] = {false, d16[k], m16[k], bb[k], cc[k], s, e};
    }
  };
  if (any) {
    uint16_t d16[8], m16[8];
    bool all[8];
    for (float f : kQuickFactors) {
      for (int k = 0; k < 8; ++k) {
        d16[k] = half::f32_to_fp16(half::fp16_to_f32(ob[k].d16) * f);
        m16[k] = ob[k].m16;
        all[k] = true;
      }
      score(d16, m16, all);
    }
    bool fit[8];
    for (int k = 0; k < 8; ++k) fit[k] = target_fit(ob[k], best[k].sums, d16[k], m16[k]);
    score(d16, m16, fit);
  }
  q.embedded = 0;
  q.declined = 0;
  for (int k = 0; k < q.n; ++k) {
    const TargetBlock& o = ob[k];
    if (o.kind == TargetBlock::Kind::kDeclined) {
      q.declined |= 1u << k;
      continue;
    }
    if (o.kind != TargetBlock::Kind::kSearch || best[k].reference) {
      target_offset_block(q.dst_type, o.d16, o.m16, o.levels, q.dst[k]);
      continue;
    }
    int8_t levels[kBlock];
    for (int i = 0; i < kBlock; ++i) levels[i] = int8_t(target_level(o, o.c[i], best[k].b, best[k].c) + o.ht);
    target_offset_block(q.dst_type, best[k].d16, best[k].m16, levels, q.dst[k]);
  }
}

}  // namespace

void level_search_neon(LevelSearchBlocks& q) {
  if (q.dst_type == GgmlType::kQ4_1 || q.dst_type == GgmlType::kQ5_1) {
    if (q.src_type == GgmlType::kQ8_0 || q.src_type == GgmlType::kIQ4_NL) return target_search_neon<true>(q);
    return target_search_neon<false>(q);
  }
  if (q.src_type == GgmlType::kQ4_1) return offset_search_neon<11>(q);
  if (q.src_type == GgmlType::kQ5_1) return offset_search_neon<10>(q);
  const int lo = q.dst_type == GgmlType::kQ5_0 ? -16 : -8, hi = -lo - 1;
  // Lanes past q.n repeat block 0 and are never written.
  int16_t t[kBlock][8];
  float ds_in[8];
  for (int k = 0; k < 8; ++k) {
    const std::byte* src = q.src[k < q.n ? k : 0];
    int8_t n[kBlock];
    source_levels(q.src_type, src, n);
    for (int i = 0; i < kBlock; ++i) t[i][k] = n[i];
    ds_in[k] = half::fp16_to_f32(half::load_u16(src));
  }
  Batch k;
  for (int i = 0; i < kBlock; ++i) k.v[i] = vld1q_s16(t[i]);
  k.lo = vdupq_n_s16(int16_t(lo));
  k.hi = vdupq_n_s16(int16_t(hi));
  k.ds[0] = vld1q_f32(ds_in);
  k.ds[1] = vld1q_f32(ds_in + 4);

  // The blocks the target holds exactly; ggml's reference block (max: the first largest |n|, by
  // its loop: a later |n| replaces it only when larger).
  int16x8_t vmin = k.v[0], vmax = k.v[0], amax = vdupq_n_s16(0), max_n = vdupq_n_s16(0);
  Halves snn{vdupq_n_s32(0), vdupq_n_s32(0)};
  for (int i = 0; i < kBlock; ++i) {
    vmin = vminq_s16(vmin, k.v[i]);
    vmax = vmaxq_s16(vmax, k.v[i]);
    const int16x8_t a = vabsq_s16(k.v[i]);
    max_n = vbslq_s16(vcgtq_s16(a, amax), k.v[i], max_n);
    amax = vmaxq_s16(amax, a);
    snn = add_products(snn, k.v[i], k.v[i]);
  }
  const uint16x8_t exact = vandq_u16(vcgeq_s16(vmin, k.lo), vcleq_s16(vmax, k.hi));
  float32x4_t d[2], id[2];
  const float32x4_t bias = vdupq_n_f32(0.5f - float(lo));
  const int32x4_t top = vdupq_n_s32(hi - lo);
  for (int h = 0; h < 2; ++h) {
    const int32x4_t mx = h == 0 ? vmovl_s16(vget_low_s16(max_n)) : vmovl_high_s16(max_n);
    d[h] = vdivq_f32(vmulq_f32(vcvtq_f32_s32(mx), k.ds[h]), vdupq_n_f32(float(lo)));
    const uint32x4_t nonzero = vmvnq_u32(vceqq_f32(d[h], vdupq_n_f32(0.0f)));
    id[h] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vdivq_f32(vdupq_n_f32(1.0f), d[h])), nonzero));
  }
  int16x8_t ref[kBlock];
  Halves rnm{vdupq_n_s32(0), vdupq_n_s32(0)}, rmm = rnm;
  for (int i = 0; i < kBlock; ++i) {
    int32x4_t l[2];
    for (int h = 0; h < 2; ++h) {
      const int32x4_t n = h == 0 ? vmovl_s16(vget_low_s16(k.v[i])) : vmovl_high_s16(k.v[i]);
      const float32x4_t x = vmulq_f32(vcvtq_f32_s32(n), k.ds[h]);
      l[h] = vaddq_s32(vminq_s32(vcvtq_s32_f32(vaddq_f32(vmulq_f32(x, id[h]), bias)), top), vdupq_n_s32(lo));
    }
    ref[i] = vcombine_s16(vmovn_s32(l[0]), vmovn_s32(l[1]));
    rnm = add_products(rnm, k.v[i], ref[i]);
    rmm = add_products(rmm, ref[i], ref[i]);
  }
  const int32x4_t snn_h[2] = {snn.lo, snn.hi};
  for (int h = 0; h < 2; ++h) {
    float64x2_t a[2];
    int64x2_t s[2];
    widen(k.ds[h], a);
    widen(snn_h[h], s);
    for (int j = 0; j < 2; ++j) {
      k.a[2 * h + j] = a[j];
      k.t1[2 * h + j] = vmulq_f64(vmulq_f64(a[j], a[j]), vcvtq_f64_s64(s[j]));
    }
  }
  Best best;
  float32x4_t d_ref[2];
  for (int h = 0; h < 2; ++h) {
    best.d16[h] = vmovl_u16(vreinterpret_u16_f16(vcvt_f16_f32(d[h])));
    d_ref[h] = vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(best.d16[h])));
  }
  best.b = vdupq_n_s16(0);
  best.snm[0] = rnm.lo;
  best.snm[1] = rnm.hi;
  best.smm[0] = rmm.lo;
  best.smm[1] = rmm.hi;
  best.reference = vdupq_n_u16(0xffff);
  errors8(k, d_ref, best.snm, best.smm, best.err);
  const float64x2_t inf = vdupq_n_f64(std::numeric_limits<double>::infinity()), zero = vdupq_n_f64(0.0);
  bool any = false;
  for (int h = 0; h < 2; ++h) {
    const uint64x2_t e0 = vandq_u64(vcgtq_f64(best.err[2 * h], zero), vcltq_f64(best.err[2 * h], inf));
    const uint64x2_t e1 = vandq_u64(vcgtq_f64(best.err[2 * h + 1], zero), vcltq_f64(best.err[2 * h + 1], inf));
    const uint32x4_t err_ok = vcombine_u32(vmovn_u64(e0), vmovn_u64(e1));
    const float32x4_t ad = vabsq_f32(d_ref[h]);
    const uint32x4_t d_ok = vandq_u32(vcgtq_f32(ad, vdupq_n_f32(0.0f)), vcltq_f32(ad, vdupq_n_f32(std::numeric_limits<float>::infinity())));
    // sign-extended: all ones stay all ones
    const int16x8_t not_exact16 = vreinterpretq_s16_u16(vmvnq_u16(exact));
    const uint32x4_t not_exact =
        vreinterpretq_u32_s32(h == 0 ? vmovl_s16(vget_low_s16(not_exact16)) : vmovl_high_s16(not_exact16));
    k.search[h] = vandq_u32(vandq_u32(err_ok, d_ok), not_exact);
    any = any || vmaxvq_u32(k.search[h]) != 0;
  }
  if (any) {
    const uint32x4_t none[2] = {vdupq_n_u32(0), vdupq_n_u32(0)};
    for (float f : kQuickFactors) {
      uint32x4_t cand[2];
      for (int h = 0; h < 2; ++h) {
        cand[h] = vmovl_u16(vreinterpret_u16_f16(vcvt_f16_f32(vmulq_f32(d_ref[h], vdupq_n_f32(f)))));
      }
      consider(k, cand, none, best);
    }
    uint32x4_t fit[2], skip[2];
    for (int h = 0; h < 2; ++h) {
      float64x2_t a[2];
      int64x2_t nm[2], mm[2];
      widen(k.ds[h], a);
      widen(best.snm[h], nm);
      widen(best.smm[h], mm);
      const float64x2_t f0 = vdivq_f64(vmulq_f64(a[0], vcvtq_f64_s64(nm[0])), vcvtq_f64_s64(mm[0]));
      const float64x2_t f1 = vdivq_f64(vmulq_f64(a[1], vcvtq_f64_s64(nm[1])), vcvtq_f64_s64(mm[1]));
      const float32x4_t ff = vcombine_f32(vcvt_f32_f64(f0), vcvt_f32_f64(f1));
      fit[h] = vmovl_u16(vreinterpret_u16_f16(vcvt_f16_f32(ff)));
      skip[h] = vceqq_s32(best.smm[h], vdupq_n_s32(0));
    }
    consider(k, fit, skip, best);
  }

  // The best's levels (the reference block's where it stands; the source's where exact), a block
  // per row again, packed.
  int16_t out[kBlock][8];
  for (int i = 0; i < kBlock; ++i) {
    const int16x8_t m = vminq_s16(vmaxq_s16(vqrdmulhq_s16(k.v[i], best.b), k.lo), k.hi);
    vst1q_s16(out[i], vbslq_s16(exact, k.v[i], vbslq_s16(best.reference, ref[i], m)));
  }
  uint32_t d16_out[8];
  vst1q_u32(d16_out, best.d16[0]);
  vst1q_u32(d16_out + 4, best.d16[1]);
  uint16_t lanes[8];
  vst1q_u16(lanes, exact);
  q.embedded = 0;
  q.declined = 0;
  for (int b = 0; b < q.n; ++b) {
    int8_t levels[kBlock];
    for (int i = 0; i < kBlock; ++i) levels[i] = int8_t(out[i][b]);
    const uint16_t d16 = lanes[b] ? half::load_u16(q.src[b]) : uint16_t(d16_out[b]);
    target_block(q.dst_type, d16, levels, q.dst[b]);
    q.embedded |= uint32_t(lanes[b] != 0) << b;
  }
}

}  // namespace kvsnap::simd::arm

#endif  // KVSNAP_SIMD_NEON
