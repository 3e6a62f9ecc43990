#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// AVX2 + FMA + F16C iq4_nl quantizer (quantize_iq4_nl, ntry 7), simd::Level::kAvx2. See
// x86_common.h for the rules.
//
// Lane = block: 8 blocks at a time, their values transposed so that row j holds value j of each
// block. Every lane then does the reference's float operations in the reference's order: the
// abs-max scan (first largest |x|), the first pass (d = -max / values[0]), the trial scales
// (itry + values[0]) / max, each pass's sums over j = 0..31 (sumqx += w * q * x, sumq2 += w * q *
// q, w = x * x) and the reference's comparison to keep it, so every float is bit-identical. As
// in the AVX-512 kernel (x86_avx512_iq4_nl.h), a trial gives each value one of two candidate
// indices (computed once, with their products), and only the trials that follow a change of
// index run (see "lanes = blocks" below). best_index_int8 searches the midpoints instead of the
// values: its result is the number of midpoints (val[k] + val[k + 1]) / 2 at or below x, found
// with four vector comparisons (find8), which iq4_nl_index_avx2 exposes and kvsnap-simd-check
// compares with the reference's binary search. Blocks holding inf/NaN, blocks whose abs-max is
// above 1e18 (x * x could overflow) and blocks whose scale comes out non-finite take the scalar
// reference.

#include "migrate/kernels/x86_common.h"
#include "migrate/kernels/x86_avx2_iq4_nl.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {
namespace {

// ---- lanes = blocks, the trials that can change an index only ------------------------------
//
// The facts of x86_avx512_iq4_nl.h, in 8 lanes:
//   - a trial pass p (1..15, itry = p - 8) gives value j the index k0 or k0 + 1, k0 = the index
//     of the smaller of al = id_1 * x[j] and id_15 * x[j], and k0 + 1 exactly when al >= m[k0];
//     so the two candidate products (w*q)*x and (w*q)*q of each value are computed once
//     (Tables), and a trial step is a multiply, a compare, two blends and two additions;
//   - a trial whose indices repeat the trial before gives the same sums and leaves the
//     reference's choice as it is, so each lane runs only the trials that follow a flip
//     (mark_flips, compact_trials) and repeats its last one to fill the vector;
//   - the trial scales (itry + values[0]) / max are the correctly rounded quotients by
//     Markstein's correction from one division (the operations of iq4_nl_trial_ids in
//     x86_avx512_iq4_nl.cc, checked exhaustively there), valid for |max| in [2^-100, 2^100]:
//     the blocks that search have 1e-15 <= |max| <= 1e18 (larger ones take the scalar path),
//     the others search with max = 1.

struct Chunk {
  alignas(32) float x[kQK][8];  // x[j] lane b: value j of block b
  alignas(32) float thr[kQK][8];  // m[k0] (+inf past the last midpoint)
  alignas(32) float plo[kQK][8], phi[kQK][8], rlo[kQK][8], rhi[kQK][8];  // (w*q)*x, (w*q)*q for q[k0], q[k0 + 1]
  alignas(32) float id[16][8];  // step p's id: 0: 1/d (the first pass), 1..steps: the lane's p-th trial
  alignas(32) float sx[16][8], s2[16][8];  // step p's sumqx, sumq2
  int steps;
};

// The extra tables of the candidates: mid[2h], mid[2h + 1] (+inf for 15), values[2h + 2] (15 for h = 7).
struct Cand {
  __m256 mid_even, mid_odd, v_next;
};

KV_AVX2_INLINE Cand cand8() {
  alignas(32) float me[8], mo[8], vn[8];
  for (int k = 0; k < 8; k++) {
    me[k] = kMid[2 * k];
    mo[k] = k < 7 ? kMid[2 * k + 1] : INFINITY;
    vn[k] = static_cast<float>(kIQ4NLValues[k < 7 ? 2 * k + 2 : 15]);
  }
  return {_mm256_load_ps(me), _mm256_load_ps(mo), _mm256_load_ps(vn)};
}

KV_AVX2_INLINE __m256 markstein(__m256 num, __m256 max, __m256 y) {
  const __m256 q = _mm256_mul_ps(num, y);
  const __m256 r = _mm256_fnmadd_ps(q, max, num);  // exact
  return _mm256_fmadd_ps(r, y, q);
}

// The 8 blocks at src transposed into a.x; the classification of each lane: `max` (the first
// value of largest |x|, the reference's strict >), `go` (the lanes that search: amax >=
// GROUP_MAX_EPS, finite, <= 1e18), `search` (!(amax < GROUP_MAX_EPS)), `pre_scalar` (inf/NaN or
// amax > 1e18: the scalar reference).
struct Class {
  __m256 max, go, search, pre_scalar;
};

KV_AVX2_INLINE Class classify(const float* src, Chunk& a) {
  for (int g = 0; g < 4; g++) {
    __m256 r[8];
    for (int b = 0; b < 8; b++) r[b] = _mm256_loadu_ps(src + 32 * b + 8 * g);
    transpose8(r);
    for (int i = 0; i < 8; i++) _mm256_store_ps(a.x[8 * g + i], r[i]);
  }
  const __m256 zero = _mm256_setzero_ps();
  __m256 amax = zero, max = zero, nan = zero;
  for (size_t j = 0; j < kQK; j++) {
    const __m256 x = _mm256_load_ps(a.x[j]);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256 ax = abs8(x);
    const __m256 gt = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);  // if (ax > amax): the first largest
    amax = _mm256_blendv_ps(amax, ax, gt);
    max = _mm256_blendv_ps(max, x, gt);
  }
  const __m256 search = _mm256_cmp_ps(amax, _mm256_set1_ps(1e-15f), _CMP_NLT_UQ);  // !(amax < GROUP_MAX_EPS)
  const __m256 pre_scalar = _mm256_or_ps(nan, _mm256_cmp_ps(amax, _mm256_set1_ps(1e18f), _CMP_NLE_UQ));
  const __m256 go = _mm256_andnot_ps(pre_scalar, search);
  return {_mm256_blendv_ps(_mm256_set1_ps(1.0f), max, go), go, search, pre_scalar};
}

// The candidate tables of every value and the first pass's sums (step 0), j = 0..31 in order.
KV_AVX2_INLINE void tables(Chunk& a, __m256 id0, __m256 id1, __m256 id15, const Search& s, const Cand& c) {
  __m256 sx0 = _mm256_setzero_ps(), s20 = _mm256_setzero_ps();
  for (size_t j = 0; j < kQK; j++) {
    const __m256 x = _mm256_load_ps(a.x[j]);
    const __m256 w = _mm256_mul_ps(x, x);  // weight[j] = xb[j]*xb[j]
    const Found f = find8(_mm256_min_ps(_mm256_mul_ps(id1, x), _mm256_mul_ps(id15, x)), s);  // k0 = 2 half + c0
    const __m256 vodd = _mm256_permutevar8x32_ps(s.vodd, f.half);
    _mm256_store_ps(a.thr[j], _mm256_blendv_ps(_mm256_permutevar8x32_ps(c.mid_even, f.half),
                                               _mm256_permutevar8x32_ps(c.mid_odd, f.half), f.c0));
    const __m256 qlo = _mm256_blendv_ps(_mm256_permutevar8x32_ps(s.veven, f.half), vodd, f.c0);
    const __m256 qhi = _mm256_blendv_ps(vodd, _mm256_permutevar8x32_ps(c.v_next, f.half), f.c0);
    const __m256 wlo = _mm256_mul_ps(w, qlo), whi = _mm256_mul_ps(w, qhi);
    _mm256_store_ps(a.plo[j], _mm256_mul_ps(wlo, x));
    _mm256_store_ps(a.rlo[j], _mm256_mul_ps(wlo, qlo));
    _mm256_store_ps(a.phi[j], _mm256_mul_ps(whi, x));
    _mm256_store_ps(a.rhi[j], _mm256_mul_ps(whi, qhi));
    const __m256 q0 = value8(_mm256_mul_ps(id0, x), s);
    const __m256 w0 = _mm256_mul_ps(w, q0);
    sx0 = _mm256_add_ps(sx0, _mm256_mul_ps(w0, x));  // sumqx += w*q*xb[j]
    s20 = _mm256_add_ps(s20, _mm256_mul_ps(w0, q0));  // sumq2 += w*q*q
  }
  _mm256_store_ps(a.sx[0], sx0);
  _mm256_store_ps(a.s2[0], s20);
}

// How far from the estimated flip of a value (in trials) mark_flips also marks: more than the
// estimate's error (max/x from rcpps and one Newton step: relative error < 1e-6, so < 2e-4 in p*
// for |p* - 135| <= 135) plus the rounding of the trial scales and products (< 3e-5).
constexpr float kStepSlack = 0.02f;

// Lane b, bit p (2..15): a value of block b may change index between trials p - 1 and p:
// floor(p* + 1 -+ slack), p* + 1 = 136 + m[k0] * max / x (the flip of al = (p - 135) x / max at
// m[k0]). Marking more is safe, marking less is not (kvsnap-simd-check compares the schedules
// with the reference's indices). x = 0, +inf thresholds and far flips give shifts >= 32: no bit.
KV_AVX2_INLINE __m256i mark_flips(const Chunk& a, __m256 max) {
  const __m256 p_lo = _mm256_set1_ps(136.0f - kStepSlack), p_hi = _mm256_set1_ps(136.0f + kStepSlack);
  const __m256 two = _mm256_set1_ps(2.0f);
  const __m256i one = _mm256_set1_epi32(1);
  __m256i chg = _mm256_setzero_si256();
  for (size_t j = 0; j < kQK; j++) {
    const __m256 x = _mm256_load_ps(a.x[j]), thr = _mm256_load_ps(a.thr[j]);
    const __m256 r0 = _mm256_rcp_ps(x);
    const __m256 mr = _mm256_mul_ps(max, _mm256_mul_ps(r0, _mm256_fnmadd_ps(x, r0, two)));
    const __m256i s_lo = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_fmadd_ps(thr, mr, p_lo)));
    const __m256i s_hi = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_fmadd_ps(thr, mr, p_hi)));
    chg = _mm256_or_si256(chg, _mm256_or_si256(_mm256_sllv_epi32(one, s_lo), _mm256_sllv_epi32(one, s_hi)));
  }
  return chg;
}

// a.id[1..steps]: trial 1, then each lane's marked trials in order (its last one repeated once
// its marks run out). The ids are recomputed with the same operations, so equal to the table's.
KV_AVX2_INLINE void compact_trials(Chunk& a, __m256 go, __m256 max, __m256 y, __m256 id1, __m256i chg) {
  const __m256i zero = _mm256_setzero_si256();
  __m256i m = _mm256_and_si256(_mm256_and_si256(chg, _mm256_castps_si256(go)), _mm256_set1_epi32(0xFFFC));
  __m256 id = id1;
  _mm256_store_ps(a.id[1], id);
  int steps = 1;
  for (;;) {
    const __m256i dead = _mm256_cmpeq_epi32(m, zero);
    if (_mm256_movemask_ps(_mm256_castsi256_ps(dead)) == 0xff) break;
    const __m256i low = _mm256_and_si256(m, _mm256_sub_epi32(zero, m));
    m = _mm256_xor_si256(m, low);
    // p = log2(low), from the exponent of the (exact) float; numerator p - 135 = itry - 127
    const __m256i p = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(low)), 23);
    const __m256 num = _mm256_cvtepi32_ps(_mm256_sub_epi32(p, _mm256_set1_epi32(127 + 135)));
    id = _mm256_blendv_ps(markstein(num, max, y), id, _mm256_castsi256_ps(dead));
    _mm256_store_ps(a.id[++steps], id);
  }
  a.steps = steps;
}

// m ? b : a for a mask m of all-ones / all-zeros lanes, as one vblendvps. (GCC turns
// _mm256_blendv_ps of a comparison into a vector condition and emits an extra vpcmpgtd for it.)
KV_AVX2_INLINE __m256 select8(__m256 a, __m256 b, __m256 m) {
  __m256 r;
  asm("vblendvps %3, %2, %1, %0" : "=x"(r) : "x"(a), "xm"(b), "x"(m));
  return r;
}

// The sums of steps P0 .. P0 + G - 1, j = 0..31 in order.
template <int G>
KV_AVX2_INLINE void sums(Chunk& a, int P0) {
  __m256 id[G], sx[G], s2[G];
#pragma GCC unroll 8
  for (int k = 0; k < G; k++) {
    id[k] = _mm256_load_ps(a.id[P0 + k]);
    sx[k] = _mm256_setzero_ps();
    s2[k] = _mm256_setzero_ps();
  }
#pragma GCC unroll 2
  for (size_t j = 0; j < kQK; j++) {
    const __m256 x = _mm256_load_ps(a.x[j]), thr = _mm256_load_ps(a.thr[j]);
    const __m256 plo = _mm256_load_ps(a.plo[j]), phi = _mm256_load_ps(a.phi[j]);
    const __m256 rlo = _mm256_load_ps(a.rlo[j]), rhi = _mm256_load_ps(a.rhi[j]);
#pragma GCC unroll 8
    for (int k = 0; k < G; k++) {
      const __m256 ge = _mm256_cmp_ps(_mm256_mul_ps(id[k], x), thr, _CMP_GE_OQ);  // al >= m[k0]
      sx[k] = _mm256_add_ps(sx[k], select8(plo, phi, ge));  // sumqx += w*q*xb[j]
      s2[k] = _mm256_add_ps(s2[k], select8(rlo, rhi, ge));  // sumq2 += w*q*q
    }
  }
#pragma GCC unroll 8
  for (int k = 0; k < G; k++) {
    _mm256_store_ps(a.sx[P0 + k], sx[k]);
    _mm256_store_ps(a.s2[P0 + k], s2[k]);
  }
}

template <int G>
KV_AVX2_INLINE void sums_n(Chunk& a, int p0, int g) {
  if constexpr (G > 1) {
    if (g < G) return sums_n<G - 1>(a, p0, g);
  }
  sums<G>(a, p0);
}

constexpr int kGroup = 4;  // steps per pass over the tables (4 sums x 2 + 6 tables in 16 registers)

// The reference's choice of scale on the sums of steps 0..steps, lane = block: p = 0: d = sumq2
// > 0 ? sumqx/sumq2 : 0; best = d*sumqx; then if (sumq2 > 0 && sumqx*sumqx > best*sumq2)
// { d = sumqx/sumq2; best = d*sumqx; }.
KV_AVX2_INLINE __m256 decide(const Chunk& a) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 qx = _mm256_load_ps(a.sx[0]), q2 = _mm256_load_ps(a.s2[0]);
  __m256 d = _mm256_and_ps(_mm256_cmp_ps(q2, zero, _CMP_GT_OQ), _mm256_div_ps(qx, q2));
  __m256 best = _mm256_mul_ps(d, qx);
  for (int p = 1; p <= a.steps; p++) {
    qx = _mm256_load_ps(a.sx[p]);
    q2 = _mm256_load_ps(a.s2[p]);
    const __m256 take = _mm256_and_ps(_mm256_cmp_ps(q2, zero, _CMP_GT_OQ),
                                      _mm256_cmp_ps(_mm256_mul_ps(qx, qx), _mm256_mul_ps(best, q2), _CMP_GT_OQ));
    const __m256 dn = _mm256_div_ps(qx, q2);
    d = _mm256_blendv_ps(d, dn, take);
    best = _mm256_blendv_ps(best, _mm256_mul_ps(dn, qx), take);
  }
  return d;
}

// The scales d of 8 blocks (src: 8 consecutive blocks of 32 values), lane = block; `scalar`
// gets the blocks that must take the scalar reference.
KV_AVX2_INLINE __m256 scales8(const float* src, Chunk& a, const Search& s, const Cand& c, uint32_t* scalar) {
  const Class k = classify(src, a);
  const __m256 zero = _mm256_setzero_ps();
  // the first pass: d = -max / values[0], id = 1/d
  const __m256 d0 = _mm256_div_ps(_mm256_sub_ps(zero, k.max), _mm256_set1_ps(static_cast<float>(kIQ4NLValues[0])));
  const __m256 y = _mm256_div_ps(_mm256_set1_ps(1.0f), k.max);
  const float v0 = static_cast<float>(kIQ4NLValues[0]);
  const __m256 id1 = markstein(_mm256_set1_ps(v0 - 7), k.max, y), id15 = markstein(_mm256_set1_ps(v0 + 7), k.max, y);
  tables(a, _mm256_div_ps(_mm256_set1_ps(1.0f), d0), id1, id15, s, c);
  compact_trials(a, k.go, k.max, y, id1, mark_flips(a, k.max));
  for (int p = 1; p <= a.steps; p += kGroup) sums_n<kGroup>(a, p, a.steps - p + 1 < kGroup ? a.steps - p + 1 : kGroup);
  const __m256 d = _mm256_and_ps(k.search, decide(a));
  // inf/NaN inputs, amax > 1e18, or a non-finite scale: the scalar reference
  const __m256 bad_d = _mm256_cmp_ps(abs8(d), _mm256_set1_ps(INFINITY), _CMP_NLT_UQ);
  *scalar = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_or_ps(k.pre_scalar, bad_d)));
  return d;
}

// The block's bytes from its scale: L[j] = best_index(id * x[j]), id = d != 0 ? 1 / d : 0.
KV_AVX2_INLINE void block_out(const float* x, float d, const Search& s, std::byte* blk) {
  store_u16(blk, _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));  // d is finite: F16C == ggml
  const __m256 id = _mm256_set1_ps(d != 0.0f ? 1 / d : 0.0f);
  __m256i l[4];
  for (int k = 0; k < 4; k++) l[k] = index8(_mm256_mul_ps(id, _mm256_loadu_ps(x + 8 * k)), s);
  const __m256i b = low_bytes32(l[0], l[1], l[2], l[3]);
  const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(blk + 2), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
}

}  // namespace

KV_AVX2 void iq4_nl_from_f32_avx2(const float* x, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  const size_t nb = n / kQK;
  const Search t = search8();
  const Cand c = cand8();
  Chunk a;
  for (size_t b0 = 0; b0 < nb; b0 += 8) {
    const size_t cnt = nb - b0 < 8 ? nb - b0 : 8;
    const float* src = x + b0 * kQK;
    alignas(32) float pad[8 * kQK];
    if (cnt < 8) {  // zero blocks in the missing lanes (their scales are not used)
      std::memset(pad, 0, sizeof pad);
      std::memcpy(pad, src, cnt * kQK * sizeof(float));
      src = pad;
    }
    uint32_t scalar;
    alignas(32) float d[8];
    _mm256_store_ps(d, scales8(src, a, t, c, &scalar));
    for (size_t b = 0; b < cnt; b++) {
      std::byte* blk = out + (b0 + b) * kIQ4_NLBytes;
      if (__builtin_expect((scalar >> b) & 1, 0)) quants::ref::iq4_nl_from_f32(src + b * kQK, blk, kQK);
      else block_out(src + b * kQK, d[b], t, blk);
    }
  }
}

KV_AVX2 int iq4_nl_trial_schedule_avx2(const float* x, size_t cnt, uint8_t* trials) {
  assert(cnt >= 1 && cnt <= 8);
  alignas(32) float src[8 * kQK] = {};
  std::memcpy(src, x, cnt * kQK * sizeof(float));
  Chunk a;
  uint32_t scalar;
  scales8(src, a, search8(), cand8(), &scalar);
  const float v0 = static_cast<float>(kIQ4NLValues[0]);
  for (size_t b = 0; b < 8; b++) {
    // the lane's max as classify finds it; the blocks that do not search (or take the scalar
    // path) list no trials
    float amax = 0, max = 0;
    bool finite = true;
    for (size_t j = 0; j < kQK; j++) {
      const float v = src[b * kQK + j];
      finite &= std::isfinite(v);
      if (std::fabs(v) > amax) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const bool go = b < cnt && finite && amax >= 1e-15f && amax <= 1e18f;
    for (int k = 0; k < a.steps; k++) {
      trials[8 * k + b] = go ? 0xFF : 0;  // 0xFF: an id that is no trial's
      for (int p = 1; p <= 15 && go; p++) {
        if (a.id[k + 1][b] == (static_cast<float>(p - 8) + v0) / max) trials[8 * k + b] = static_cast<uint8_t>(p);
      }
    }
  }
  return a.steps;
}

KV_AVX2 void iq4_nl_index_avx2(const float* x, uint8_t* idx, size_t n) {
  const Search s = search8();
  for (size_t i = 0; i + 8 <= n; i += 8) {
    alignas(32) int32_t l[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l), index8(_mm256_loadu_ps(x + i), s));
    for (int k = 0; k < 8; k++) idx[i + k] = static_cast<uint8_t>(l[k]);
  }
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
