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
#include "migrate/offset_levels.h"
#include "migrate/simd_kernels.h"

namespace kvsnap::simd {
namespace {

constexpr int kBlock = 32;

// The sums of a candidate whose level for centred source level c is level(c).
template <class Level>
LevelSums level_sums(const int8_t* c, Level level) {
  LevelSums s;
  for (int i = 0; i < kBlock; ++i) s.add(c[i], level(c[i]));
  return s;
}

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

// The exact-multiple test (simd_kernels.h): 1 the offset is k times the scale (k returned), 0 it
// is not and no value can round onto a multiple, -1 it is within 2^-15 of one (declined).
int offset_multiple(float ds, float ms, double& k) {
  const double ratio = double(ms) / double(ds);
  k = std::nearbyint(ratio);
  if (ratio == k) return 1;
  return std::fabs(ratio) <= 1048576.0 && std::fabs(ratio - k) <= 1.0 / 32768.0 ? -1 : 0;
}

// An offset source's block by OffsetBlock's steps, then its candidates (search_block's).
bool search_offset_block(GgmlType src, const std::byte* block, int lo, int hi, uint16_t& out_d16, int8_t* out,
                         bool& embedded) {
  const OffsetBlock o = offset_block(src, block, lo, hi);
  embedded = o.kind == OffsetBlock::Kind::kEmbedded;
  if (o.kind == OffsetBlock::Kind::kDeclined) return false;
  out_d16 = o.d16;
  std::memcpy(out, o.levels, kBlock);
  if (o.kind != OffsetBlock::Kind::kSearch) return true;
  CandidateBest best{.sums = o.ref_sums, .err = o.ref_err};
  auto consider = [&](uint16_t d16) {
    const float dc = half::fp16_to_f32(d16);
    int32_t b, cc;
    if (!offset_terms(o, dc, b, cc)) return;
    const LevelSums s = level_sums(o.c, [&](int32_t c) { return offset_level(o, c, b, cc, lo, hi); });
    const double e = offset_error(o, dc, s);
    if (e < best.err) best = {false, d16, 0, b, cc, s, e};
  };
  for (float f : kQuickFactors) consider(half::f32_to_fp16(o.d_ref * f));
  if (best.sums.squares != 0) consider(offset_fit(o, best.sums));
  if (best.reference) return true;
  out_d16 = best.d16;
  for (int i = 0; i < kBlock; ++i) out[i] = int8_t(offset_level(o, o.c[i], best.b, best.c, lo, hi));
  return true;
}

}  // namespace

OffsetBlock offset_block(GgmlType src, const std::byte* block, int lo, int hi) {
  OffsetBlock o;
  const int top = src == GgmlType::kQ4_1 ? 15 : 31;
  o.h = (top + 1) / 2;
  o.shift = top == 15 ? 11 : 10;
  o.ds = half::fp16_to_f32(half::load_u16(block));
  const float ms = half::fp16_to_f32(half::load_u16(block + 2));
  o.centre = ms + float(o.h) * o.ds;
  o.mc = double(ms) + double(o.h) * double(o.ds);
  int8_t n[kBlock];
  source_levels(src, block, n);
  int nmin = 255, nmax = -1;
  for (int i = 0; i < kBlock; ++i) {
    o.c[i] = int8_t(n[i] - o.h);
    nmin = std::min(nmin, int(n[i]));
    nmax = std::max(nmax, int(n[i]));
  }
  double k = 0;
  const int multiple = offset_multiple(o.ds, ms, k);
  if (multiple < 0) return o;  // kDeclined
  if (multiple > 0 && nmin + k >= lo && nmax + k <= hi) {
    o.kind = OffsetBlock::Kind::kEmbedded;
    o.d16 = half::load_u16(block);
    for (int i = 0; i < kBlock; ++i) o.levels[i] = int8_t(n[i] + int(k));
    return o;
  }
  // ggml's reference block. The values are monotone in n, so the largest |x| is at the smallest or
  // the largest level; ggml takes the first of equal |x|, which only the index order tells where
  // both ends have it with opposite signs (declined), or where it is 0 (declined).
  const float x_lo = float(nmin) * o.ds + ms, x_hi = float(nmax) * o.ds + ms;
  const float a_lo = std::fabs(x_lo), a_hi = std::fabs(x_hi);
  if (!(std::max(a_lo, a_hi) > 0) || (a_lo == a_hi && x_lo != x_hi)) return o;  // kDeclined
  const float max = a_hi > a_lo ? x_hi : x_lo;
  const float d = max / float(lo);
  const float id = 1.0f / d;
  const float bias = 0.5f - float(lo);
  int32_t scc = 0, sc = 0;
  for (int i = 0; i < kBlock; ++i) {
    const float x = float(n[i]) * o.ds + ms;
    const int l = std::min(int(x * id + bias), hi - lo) + lo;
    o.levels[i] = int8_t(l);
    scc += o.c[i] * o.c[i];
    sc += o.c[i];
    o.ref_sums.add(o.c[i], l);
  }
  o.d16 = half::f32_to_fp16(d);
  const double dsd = o.ds;
  const double t = (dsd * o.mc) * double(sc);
  o.a = ((dsd * dsd) * double(scc) + (t + t)) + (o.mc * o.mc) * double(kBlock);
  o.d_ref = half::fp16_to_f32(o.d16);
  o.ref_err = offset_error(o, o.d_ref, o.ref_sums);
  const bool search = o.ref_err > 0 && std::isfinite(o.ref_err) && std::fabs(o.d_ref) > 0 && std::isfinite(o.d_ref);
  o.kind = search ? OffsetBlock::Kind::kSearch : OffsetBlock::Kind::kReference;
  return o;
}

bool offset_terms(const OffsetBlock& o, float dc, int32_t& b, int32_t& c) {
  if (!(std::fabs(dc) > 0) || !std::isfinite(dc)) return false;
  const float q = o.ds / dc;
  const float bq = std::nearbyint(q * 16384.0f);
  if (!(std::fabs(bq) <= 32767.0f)) return false;  // also NaN
  b = int32_t(bq);
  const float v = std::fmin(std::fmax(o.centre / dc * float(1 << o.shift), -65536.0f), 65536.0f);
  c = std::min(std::max(int32_t(std::nearbyint(v)) + (1 << (o.shift - 1)), -32768), 32767);
  return true;
}

// pmulhrsw of c << (F + 1) by b, a saturating add of cc, an arithmetic shift by F, the clamps.
int32_t offset_level(const OffsetBlock& o, int32_t c, int32_t b, int32_t cc, int lo, int hi) {
  const int32_t a = c * (1 << (o.shift + 1));
  const int32_t p = (a * b + (1 << 14)) >> 15;
  const int32_t s = std::min(std::max(p + cc, -32768), 32767);
  return std::min(std::max(s >> o.shift, lo), hi);
}

// E = (A - (s + s)) + (D D) Smm, s = (ds D) Scm + (mc D) Sm (simd_kernels.h).
double offset_error(const OffsetBlock& o, float d, const LevelSums& s) {
  const double dd = d;
  const double x = (double(o.ds) * dd) * double(s.cross) + (o.mc * dd) * double(s.sum);
  return (o.a - (x + x)) + (dd * dd) * double(s.squares);
}

uint16_t offset_fit(const OffsetBlock& o, const LevelSums& s) {
  return half::f32_to_fp16(float((double(o.ds) * double(s.cross) + o.mc * double(s.sum)) / double(s.squares)));
}

TargetBlock target_block_steps(GgmlType src, GgmlType dst, const std::byte* block) {
  TargetBlock o;
  const bool offset_src = src == GgmlType::kQ4_1 || src == GgmlType::kQ5_1;
  o.top = dst == GgmlType::kQ5_1 ? 31 : 15;
  o.ht = (o.top + 1) / 2;
  const int f_src = src == GgmlType::kQ4_0 || src == GgmlType::kQ4_1 ? 11
                    : src == GgmlType::kQ5_0 || src == GgmlType::kQ5_1 ? 10
                                                                        : 7;  // 8-bit levels: c << 8 fits
  o.shift = std::min(f_src, o.top == 15 ? 11 : 10);
  o.ds = half::fp16_to_f32(half::load_u16(block));
  const float ms = offset_src ? half::fp16_to_f32(half::load_u16(block + 2)) : 0.0f;
  // ExactRequantizer::may_embed's test, negated: only blocks that no offset at the source's scale
  // can hold are searched here (an offset beyond 2^19 scales can round levels together).
  if (offset_src && !(std::fabs(ms) <= 524288.0f * std::fabs(o.ds))) return o;  // kDeclined
  int8_t n[kBlock];
  source_levels(src, block, n);
  int nmin = n[0], nmax = n[0];
  for (int i = 1; i < kBlock; ++i) {
    nmin = std::min(nmin, int(n[i]));
    nmax = std::max(nmax, int(n[i]));
  }
  if (nmax - nmin <= o.top) return o;  // kDeclined
  const int hs = offset_src ? (src == GgmlType::kQ4_1 ? 8 : 16) : 0;
  o.centre = ms + float(hs) * o.ds;
  o.dsd = o.ds;
  o.mc = double(ms) + double(hs) * o.dsd;
  for (int i = 0; i < kBlock; ++i) {
    o.c[i] = int8_t(n[i] - hs);
    o.scc += o.c[i] * o.c[i];
    o.sc += o.c[i];
  }
  // ggml's reference block (quantize_row_q4_1_ref / q5_1_ref) of the values as to_f32 gives
  // them (float(n) ds, + ms for an offset source): monotone in n, so the smallest and largest
  // are the values of nmin and nmax, and they differ (levels more than T apart).
  auto value = [&](int l) { return offset_src ? float(l) * o.ds + ms : float(l) * o.ds; };
  const float x_lo = value(nmin), x_hi = value(nmax);
  const float min = x_lo < x_hi ? x_lo : x_hi, max = x_lo < x_hi ? x_hi : x_lo;
  const float d = (max - min) / float(o.top);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  o.d16 = half::f32_to_fp16(d);
  o.m16 = half::f32_to_fp16(min);
  for (int i = 0; i < kBlock; ++i) {
    const int l = int((value(n[i]) - min) * id + 0.5f);  // >= 0: ggml's (int8_t) and (uint8_t) casts
    const int level = o.top == 15 ? std::min(l, 15) : l & 31;  // q5_1_ref keeps the low 5 bits
    o.levels[i] = int8_t(level);
    const int32_t t = level - o.ht;
    o.ref_sums.add(o.c[i], t);
  }
  const float d_ref = half::fp16_to_f32(o.d16), m_ref = half::fp16_to_f32(o.m16);
  o.ref_err = target_error(o, d_ref, m_ref, o.ref_sums);
  const bool search = o.ref_err > 0 && std::isfinite(o.ref_err) && std::fabs(d_ref) > 0 && std::isfinite(d_ref) &&
                      std::isfinite(m_ref);
  o.kind = search ? TargetBlock::Kind::kSearch : TargetBlock::Kind::kReference;
  return o;
}

// E = (A - (s + s)) + (D D) Stt, u = (mc - M) - H D, s = (ds D) Sct + (u D) St, A = ((ds ds) Scc
// + (w + w)) + (u u) 32, w = (ds u) Sc: the exact values c ds + mc against t' D + M + H D.
double target_error(const TargetBlock& o, float d, float m, const LevelSums& s) {
  const double dd = d;
  const double u = (o.mc - double(m)) - double(o.ht) * dd;
  const double w = (o.dsd * u) * double(o.sc);
  const double a = ((o.dsd * o.dsd) * double(o.scc) + (w + w)) + (u * u) * 32.0;
  const double sum = (o.dsd * dd) * double(s.cross) + (u * dd) * double(s.sum);
  return (a - (sum + sum)) + (dd * dd) * double(s.squares);
}

bool target_terms(const TargetBlock& o, float d, float m, int32_t& b, int32_t& c) {
  if (!(std::fabs(d) > 0) || !std::isfinite(d) || !std::isfinite(m)) return false;
  const float bq = std::nearbyint(o.ds / d * 16384.0f);
  if (!(std::fabs(bq) <= 32767.0f)) return false;  // also NaN
  b = int32_t(bq);
  const float v = ((o.centre - m) / d - float(o.ht)) * float(1 << o.shift);
  const float vc = std::fmin(std::fmax(v, -65536.0f), 65536.0f);
  c = std::min(std::max(int32_t(std::nearbyint(vc)) + (1 << (o.shift - 1)), -32768), 32767);
  return true;
}

// pmulhrsw of c << (F + 1) by b, a saturating add of cc, an arithmetic shift by F, the clamps to
// [-H, T - H].
int32_t target_level(const TargetBlock& o, int32_t c, int32_t b, int32_t cc) {
  const int32_t p = (c * (1 << (o.shift + 1)) * b + (1 << 14)) >> 15;
  const int32_t s = std::min(std::max(p + cc, -32768), 32767);
  return std::min(std::max(s >> o.shift, -o.ht), o.top - o.ht);
}

// The line through the values c ds + mc against t' D + M' (double), then M = M' - H D.
bool target_fit(const TargetBlock& o, const LevelSums& s, uint16_t& d16, uint16_t& m16) {
  const double st = s.sum;
  const double det = 32.0 * double(s.squares) - st * st;
  if (det == 0) return false;
  const double sx = o.dsd * double(o.sc) + 32.0 * o.mc;
  const double sxt = o.dsd * double(s.cross) + o.mc * st;
  const double dfit = (32.0 * sxt - st * sx) / det;
  const double mfit = (sx - dfit * st) / 32.0 - double(o.ht) * dfit;
  d16 = half::f32_to_fp16(float(dfit));
  m16 = half::f32_to_fp16(float(mfit));
  return true;
}

OffsetTargetResult offset_target_block(GgmlType src, GgmlType dst, const std::byte* block) {
  const TargetBlock o = target_block_steps(src, dst, block);
  OffsetTargetResult r;
  if (o.kind == TargetBlock::Kind::kDeclined) return r;
  r.declined = false;
  r.d16 = o.d16;
  r.m16 = o.m16;
  std::memcpy(r.levels, o.levels, kBlock);
  if (o.kind != TargetBlock::Kind::kSearch) return r;
  CandidateBest best{.sums = o.ref_sums, .err = o.ref_err};
  auto consider = [&](uint16_t d16, uint16_t m16) {
    const float dc = half::fp16_to_f32(d16), mc = half::fp16_to_f32(m16);
    int32_t b, cc;
    if (!target_terms(o, dc, mc, b, cc)) return;
    const LevelSums s = level_sums(o.c, [&](int32_t c) { return target_level(o, c, b, cc); });
    const double e = target_error(o, dc, mc, s);
    if (e < best.err) best = {false, d16, m16, b, cc, s, e};
  };
  for (float f : kQuickFactors) consider(half::f32_to_fp16(half::fp16_to_f32(o.d16) * f), o.m16);
  uint16_t fd16, fm16;
  if (target_fit(o, best.sums, fd16, fm16)) consider(fd16, fm16);
  if (best.reference) return r;
  r.d16 = best.d16;
  r.m16 = best.m16;
  for (int i = 0; i < kBlock; ++i) r.levels[i] = int8_t(target_level(o, o.c[i], best.b, best.c) + o.ht);
  return r;
}

void level_search_ref(LevelSearchBlocks& b) {
  if (b.dst_type == GgmlType::kQ4_1 || b.dst_type == GgmlType::kQ5_1) {
    b.embedded = 0;
    b.declined = 0;
    for (int k = 0; k < b.n; ++k) {
      const OffsetTargetResult r = offset_target_block(b.src_type, b.dst_type, b.src[k]);
      if (r.declined) {
        b.declined |= 1u << k;
        continue;
      }
      target_offset_block(b.dst_type, r.d16, r.m16, r.levels, b.dst[k]);
    }
    return;
  }
  const int lo = b.dst_type == GgmlType::kQ5_0 ? -16 : -8, hi = -lo - 1;
  const bool offset = b.src_type == GgmlType::kQ4_1 || b.src_type == GgmlType::kQ5_1;
  b.embedded = 0;
  b.declined = 0;
  for (int k = 0; k < b.n; ++k) {
    int8_t n[kBlock], levels[kBlock];
    source_levels(b.src_type, b.src[k], n);
    uint16_t d16;
    bool embedded;
    if (!offset) {
      search_block(n, half::load_u16(b.src[k]), lo, hi, d16, levels, embedded);
    } else if (!search_offset_block(b.src_type, b.src[k], lo, hi, d16, levels, embedded)) {
      b.declined |= 1u << k;
      continue;
    }
    target_block(b.dst_type, d16, levels, b.dst[k]);
    b.embedded |= uint32_t(embedded) << k;
  }
}

}  // namespace kvsnap::simd
