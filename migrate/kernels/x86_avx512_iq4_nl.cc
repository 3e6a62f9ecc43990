#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// The AVX-512 iq4_nl quantizer, part 1 of 2: the row loop and the chunks of 8..16 blocks with
// one block in each lane, the f16 -> iq4_nl fused row, the exported entry points. See
// x86_avx512_iq4_nl.h.

#include "migrate/kernels/x86_avx512_iq4_nl.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {

namespace {

// ---- lanes = blocks: chunks of kIq4AcrossMin..16 blocks -----------------------------------------
//
// Lane b of every vector belongs to block b of the chunk and walks the reference's loops for that
// block: the first pass over j = 0..31, then itry = -7..7, each over j = 0..31, every sum adding
// one value's (w*q)*x or (w*q)*q per step, in that order. The candidates are the same as above
// (a trial pass gives value j index k0 or k0 + 1, k0 + 1 iff al = id*x[j] >= m[k0], al computed
// with the reference's multiply); only the vector direction differs: a step of the sums is now
// 16 blocks' value j in one trial pass (a multiply, a compare, two blends, two additions), and
// the decision needs no transpose. The values are transposed once (x[j] lane b), blocks that do
// not search get zeros (their lanes compute harmless sums that are not used).

// The trial passes' id = (itry + values[0])/max, itry = -7..7, into id[0..14] (lane = block),
// each the correctly rounded quotient. A vector division takes ~10 cycles on the divider, and the
// tables wait for these; so one division gives y = RN(1/max), and each quotient is
// q = RN(a*y), r = a - q*max (exact, one FMA), q' = RN(q + r*y): Markstein's correction, which
// yields RN(a/max) when y is the rounded reciprocal and q is within an ulp of a/max. That holds
// for these numerators (-134..-120) and every divisor in [1, 2), checked exhaustively by
// kvsnap-simd-check; scaling the divisor by 2^k scales y, q and q' by 2^-k and leaves r as it
// is, so it holds for every |max| in [2^-100, 2^100] (all values stay normal). Other lanes take
// the divisions.
// With ends_only, only trials 1 and 15 (id[0..15], id[16 * 14..]) when the ids are exact (the
// trial schedule computes the others it runs, iq4_nl_compact_trials); all of them otherwise.
KV_AVX512_INLINE bool iq4_nl_trial_ids(__m512 max, float* id, __m512* y_out = nullptr, bool ends_only = false) {
  constexpr int ntry = 7;
  const float v0 = static_cast<float>(kIQ4NLValues[0]);
  const __m512 amax = abs16(max);
  const bool in_range = (_mm512_cmp_ps_mask(amax, _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ) &
                         _mm512_cmp_ps_mask(amax, _mm512_set1_ps(0x1p100f), _CMP_LE_OQ)) == 0xffff;
  if (__builtin_expect(!in_range, 0)) {
    for (int itry = -ntry; itry <= ntry; ++itry) {
      _mm512_storeu_ps(id + 16 * (itry + ntry), _mm512_div_ps(_mm512_set1_ps(static_cast<float>(itry) + v0), max));
    }
    return false;
  }
  const __m512 y = _mm512_div_ps(_mm512_set1_ps(1.0f), max);
  if (y_out) *y_out = y;
#pragma GCC unroll 15
  for (int itry = -ntry; itry <= ntry; ++itry) {
    if (ends_only && itry != -ntry && itry != ntry) continue;
    const __m512 a = _mm512_set1_ps(static_cast<float>(itry) + v0);
    const __m512 q = _mm512_mul_ps(a, y);
    const __m512 r = _mm512_fnmadd_ps(q, max, a);
    _mm512_storeu_ps(id + 16 * (itry + ntry), _mm512_fmadd_ps(r, y, q));
  }
  return true;
}

constexpr size_t kIq4AcrossMin = 8;  // fewer blocks: lanes = passes (iq4_nl_chunk_by_block)

// How far from the estimated flip of a value (in trials) iq4_nl_mark_flips also marks: more than
// the estimate's error (< 0.009) plus the rounding of the trial scales and products (< 3e-5).
constexpr float kIq4StepSlack = 0.02f;

// The per-value candidate tables of a chunk: written by its tables step, read only by its sums,
// so consecutive chunks share one (the next chunk's tables start after this chunk's sums), which
// keeps the chunks in flight within L1.
struct Iq4nlCand {
  alignas(64) float thr[kQK][16];  // m[k0] of value j of block b (+inf past the last midpoint)
  alignas(64) float plo[kQK][16], phi[kQK][16], rlo[kQK][16], rhi[kQK][16];  // (w*q)*x, (w*q)*q for q[k0], q[k0+1]
};

struct Iq4nlAcross {
  alignas(64) float x[kQK][16];    // x[j] lane b: value j of block b (0 for the missing blocks b >= cnt)
  Iq4nlCand* cand;  // the candidate tables, shared by the chunks in flight (see Iq4nlCand)
  // id[p] lane b: step p's id: p = 0: 1/d (the first pass); p >= 1: the lane's p-th trial
  // (iq4_nl_compact_trials), or trial p (itry = p - 8) for all 15 when the ids are divisions
  alignas(64) float id[16][16];
  alignas(64) float sx[16][16], s2[16][16];  // step p's sumqx, sumq2, lane b
  alignas(64) float d[16];
  uint8_t kind[kIq4Chunk];
  __mmask16 search;  // kind == 0
  int steps;         // the trial passes that run: id[1..steps] (see iq4_nl_compact_trials)
  int steps_half[2];  // those of lanes 0..7 and 8..15 (the larger is steps)
  alignas(64) float max[16];  // max lane b: the block's first value of largest magnitude (1: no search)
};


// Step p of the reference's choice of scale, lane = block, on the sums of pass p: p = 0 is the
// first pass (d = sumq2 > 0 ? sumqx/sumq2 : 0.f; best = d*sumqx), p = 1..steps are the lane's
// trials in order (iq4_nl_compact_trials) (if (sumq2 > 0 && sumqx*sumqx > best*sumq2) { d =
// sumqx/sumq2; best = d*sumqx; }), on the same floats (a vector lane rounds a division or product
// like the scalar instruction).
KV_AVX512_INLINE void iq4_nl_decide_step(const Iq4nlAcross& a, int p, __m512& d, __m512& best) {
  // the lanes whose half ran pass p (the sums of the others are not there)
  const __mmask16 ran = static_cast<__mmask16>((p <= a.steps_half[0] ? 0x00ff : 0) | (p <= a.steps_half[1] ? 0xff00 : 0));
  const __m512 zero = _mm512_setzero_ps();
  const __m512 qx = _mm512_load_ps(a.sx[p]), q2 = _mm512_load_ps(a.s2[p]);
  if (p == 0) {
    d = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(q2, zero, _CMP_GT_OQ), qx, q2);
    best = _mm512_mul_ps(d, qx);
    return;
  }
  const __mmask16 take = ran & _mm512_cmp_ps_mask(q2, zero, _CMP_GT_OQ) &
                         _mm512_cmp_ps_mask(_mm512_mul_ps(qx, qx), _mm512_mul_ps(best, q2), _CMP_GT_OQ);
  const __m512 dt = _mm512_div_ps(qx, q2);
  d = _mm512_mask_mov_ps(d, take, dt);
  best = _mm512_mask_mov_ps(best, take, _mm512_mul_ps(dt, qx));
}

// Trials that repeat the one before are skipped. Trial p (1..15) gives value j the index
// k0 + (al >= m[k0]), al = id_p * x[j], and that comparison flips at most once along p (al is
// monotone in p), near the real p* where (p* - 135) x / max = m[k0]: the rounding of id_p and
// of the product moves the flip by < 3e-5 (|p* - 135| <= 134 for a flip inside 1..15). When no
// value of a block flips between p - 1 and p, the two trials have the same indices, hence the
// same sums (the same additions in the same order), and the reference's loop does not change
// its choice on the second one: if it took the first, the second gives the same d and best;
// if not, the same comparison fails again. So each lane runs only its trials that follow a
// flip, in order, and repeats its last one to fill the vector.
//
// chg lane b has bit p (2..15) set when a value of block b may flip between p - 1 and p:
// iq4_nl_mark_flips marks floor(p* + 1 -+ slack) with p* estimated from rcp14 (relative error
// < 2^-14, so < 0.009 in p* for the values that can flip: |x| >= 0.03 |max| there, as |al| >=
// 4.5 at a midpoint and |al| <= 134 |x / max|); marking more is safe, marking less is not
// (kvsnap-simd-check compares the schedules with the reference's indices).
// The trial ids are recomputed with iq4_nl_trial_ids's operations, so equal to the table's.
KV_AVX512_INLINE void iq4_nl_compact_trials(Iq4nlAcross& a, __m512 max, __m512 y, __m512i chg) {
  // (blocks that do not search need no trials: zeros, padding, inf/NaN)
  __m512i m = _mm512_maskz_and_epi32(a.search, chg, _mm512_set1_epi32(0xFFFC));
  __m512 id = _mm512_load_ps(a.id[1]);  // every lane runs trial 1 first
  int steps = 1;
  a.steps_half[0] = a.steps_half[1] = 1;
  for (__mmask16 live = _mm512_test_epi32_mask(m, m); live; live = _mm512_test_epi32_mask(m, m)) {
    const __m512i low = _mm512_and_si512(m, _mm512_sub_epi32(_mm512_setzero_si512(), m));
    m = _mm512_xor_si512(m, low);
    // p = log2(low), from the exponent of the (exact) float; numerator p - 135 = itry - 127
    const __m512i p = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(low)), 23),
                                       _mm512_set1_epi32(127));
    const __m512 num = _mm512_cvtepi32_ps(_mm512_sub_epi32(p, _mm512_set1_epi32(135)));
    const __m512 q = _mm512_mul_ps(num, y);
    const __m512 r = _mm512_fnmadd_ps(q, max, num);
    id = _mm512_mask_mov_ps(id, live, _mm512_fmadd_ps(r, y, q));
    _mm512_store_ps(a.id[++steps], id);
    if (live & 0x00ff) a.steps_half[0] = steps;
    if (live & 0xff00) a.steps_half[1] = steps;
  }
  a.steps = steps;
}

// The candidate tables of every value, and the first pass's sums (p = 0), all in order of j.
// With `prev`, the steps of prev's decision (0..prev->steps) are interleaved with the 16 iterations (their
// chain of dependent compares and divisions then hides behind this chunk's arithmetic), and
// prev->d is set.
template <bool kDecide>
KV_AVX512_INLINE void iq4_nl_across_tables(Iq4nlAcross& a, const Iq4nlTables& t, Iq4nlAcross* prev) {
  __m512 dd = _mm512_setzero_ps(), best = _mm512_setzero_ps();
  const __m512 id0 = _mm512_load_ps(a.id[0]), id1 = _mm512_load_ps(a.id[1]), id15 = _mm512_load_ps(a.id[15]);
  const __m512 vals = _mm512_load_ps(t.vals), vals_hi = _mm512_load_ps(t.vals_hi), mid = _mm512_load_ps(t.mid);
  __m512 sx0 = _mm512_setzero_ps(), s20 = _mm512_setzero_ps();
  // two values per step (independent work for the out-of-order core); the sums stay in j order
  for (size_t j = 0; j < kQK; j += 2) {
    if constexpr (kDecide) {
      if (static_cast<int>(j / 2) <= prev->steps) iq4_nl_decide_step(*prev, static_cast<int>(j / 2), dd, best);
    }
    __m512 p0[2], r0[2];
#pragma GCC unroll 2
    for (size_t u = 0; u < 2; u++) {
      const __m512 x = _mm512_load_ps(a.x[j + u]);
      const __m512 w = _mm512_mul_ps(x, x);  // weight[j] = xb[j]*xb[j]
      // |id * x| <= 134.02 for every lane (|id| <= 134/|max| to within rounding, |x| <= |max|)
      // (k0: the index is 0 below -128 and 15 above 127.99, so the clamp keeps it)
      const __m512i k0 = iq4nl_index16_within128(
          _mm512_range_ps(_mm512_min_ps(_mm512_mul_ps(id1, x), _mm512_mul_ps(id15, x)), _mm512_set1_ps(127.99f), 0x02), t);
      _mm512_store_ps(a.cand->thr[j + u], _mm512_permutexvar_ps(k0, mid));
      const __m512 qlo = _mm512_permutexvar_ps(k0, vals), qhi = _mm512_permutexvar_ps(k0, vals_hi);
      const __m512 wlo = _mm512_mul_ps(w, qlo), whi = _mm512_mul_ps(w, qhi);
      _mm512_store_ps(a.cand->plo[j + u], _mm512_mul_ps(wlo, x));
      _mm512_store_ps(a.cand->rlo[j + u], _mm512_mul_ps(wlo, qlo));
      _mm512_store_ps(a.cand->phi[j + u], _mm512_mul_ps(whi, x));
      _mm512_store_ps(a.cand->rhi[j + u], _mm512_mul_ps(whi, qhi));
      // |id0 * x| <= 127 (1 + 2^-22): id0 = 1/d, d = max/127 (two roundings), |x| <= |max|
      const __m512 q0 = _mm512_permutexvar_ps(iq4nl_index16_within128(_mm512_mul_ps(id0, x), t), vals);
      const __m512 w0 = _mm512_mul_ps(w, q0);
      p0[u] = _mm512_mul_ps(w0, x);
      r0[u] = _mm512_mul_ps(w0, q0);
    }
    sx0 = _mm512_add_ps(_mm512_add_ps(sx0, p0[0]), p0[1]);  // sumqx += w*q*xb[j], j then j + 1
    s20 = _mm512_add_ps(_mm512_add_ps(s20, r0[0]), r0[1]);  // sumq2 += w*q*q
  }
  _mm512_store_ps(a.sx[0], sx0);
  _mm512_store_ps(a.s2[0], s20);
  if constexpr (kDecide) _mm512_store_ps(prev->d, _mm512_maskz_mov_ps(prev->search, dd));  // d = 0: no search
}

// The trials where a value of a block may change index (iq4_nl_compact_trials): lane b, bit p
// (2..15) for floor(p* + 1 -+ slack), where p* + 1 = 136 + m[k0] * max / x.
KV_AVX512_INLINE __m512i iq4_nl_mark_flips(const Iq4nlAcross& a, __m512 max) {
  const __m512 p_lo = _mm512_set1_ps(136.0f - kIq4StepSlack), p_hi = _mm512_set1_ps(136.0f + kIq4StepSlack);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i chg = _mm512_setzero_si512();
  for (size_t j = 0; j < kQK; j++) {
    const __m512 x = _mm512_load_ps(a.x[j]), thr = _mm512_load_ps(a.cand->thr[j]);
    const __m512 mr = _mm512_mul_ps(max, _mm512_rcp14_ps(x));
    const __m512i s_lo = _mm512_cvt_roundps_epi32(_mm512_fmadd_ps(thr, mr, p_lo), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512i s_hi = _mm512_cvt_roundps_epi32(_mm512_fmadd_ps(thr, mr, p_hi), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    chg = _mm512_or_si512(chg, _mm512_or_si512(_mm512_sllv_epi32(one, s_lo), _mm512_sllv_epi32(one, s_hi)));
  }
  return chg;
}

// The sums of the trial passes P0 .. P0 + G - 1 of blocks 8h..8h + 7 (half h of the lanes),
// j = 0..31 in order. In 256-bit vectors: as fast per block as 512-bit ones on CPUs that split
// those in two (Zen 4), and each half runs only its own passes (Iq4nlAcross::steps_half).
template <int G>
KV_AVX512_INLINE void iq4_nl_across_sums_half(Iq4nlAcross& a, int P0, int h) {
  __m256 id[G], sx[G], s2[G];
  const size_t o = 8 * static_cast<size_t>(h);
#pragma GCC unroll 16
  for (int k = 0; k < G; k++) {
    id[k] = _mm256_load_ps(a.id[P0 + k] + o);
    sx[k] = _mm256_setzero_ps();
    s2[k] = _mm256_setzero_ps();
  }
#pragma GCC unroll 1
  for (size_t j = 0; j < kQK; j++) {
    const __m256 x = _mm256_load_ps(a.x[j] + o), thr = _mm256_load_ps(a.cand->thr[j] + o);
    const __m256 plo = _mm256_load_ps(a.cand->plo[j] + o), phi = _mm256_load_ps(a.cand->phi[j] + o);
    const __m256 rlo = _mm256_load_ps(a.cand->rlo[j] + o), rhi = _mm256_load_ps(a.cand->rhi[j] + o);
#pragma GCC unroll 16
    for (int k = 0; k < G; k++) {
      const __mmask8 ge = _mm256_cmp_ps_mask(_mm256_mul_ps(id[k], x), thr, _CMP_GE_OQ);  // al >= m[k0]
      sx[k] = _mm256_add_ps(sx[k], _mm256_mask_blend_ps(ge, plo, phi));  // sumqx += w*q*xb[j]
      s2[k] = _mm256_add_ps(s2[k], _mm256_mask_blend_ps(ge, rlo, rhi));  // sumq2 += w*q*q
    }
  }
#pragma GCC unroll 16
  for (int k = 0; k < G; k++) {
    _mm256_store_ps(a.sx[P0 + k] + o, sx[k]);
    _mm256_store_ps(a.s2[P0 + k] + o, s2[k]);
  }
}

// The nibbles of blocks 4L..4L + 3 (r[i], 128-bit lane L: the 16 bytes of block 4L + i).
template <int L>
KV_AVX512_INLINE void iq4_nl_store_nibbles(const __m512i* r, std::byte* outc) {
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(outc + (4 * L + i) * kIQ4_NLBytes + 2), _mm512_extracti32x4_epi32(r[i], L));
  }
}

// The blocks' bytes, lane = block: the scale as fp16 and the indices with id = 1/d, the same
// operations as iq4_nl_finish; the 16 bytes of nibbles of each block are gathered with shifts and
// a 4 x 4 transpose of dwords per 128-bit lane. Blocks whose id is inf/NaN (al may be NaN, which
// best_index sends to 15) go through iq4_nl_finish, those of kind 2 through the scalar reference.
KV_AVX512_INLINE void iq4_nl_finish_across(const Iq4nlAcross& a, const float* xc, std::byte* outc, size_t cnt,
                                           const Iq4nlTables& t) {
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  const __m512 d = _mm512_load_ps(a.d);
  alignas(32) uint16_t dh[kIq4Chunk];
  store_scales_f16(d, dh);
  // id = d != 0.0f ? 1/d : 0 (a NaN d is != 0)
  const __m512 idf = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ), one, d);
  const __mmask16 special = _mm512_fpclass_ps_mask(idf, 0x99);
  __m512i v[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; j++) {
    const __m512i lo = iq4nl_index16(_mm512_mul_ps(idf, _mm512_load_ps(a.x[j])), t);
    const __m512i hi = iq4nl_index16(_mm512_mul_ps(idf, _mm512_load_ps(a.x[j + 16])), t);
    v[j] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4));  // q4[j] = L[j] | L[16 + j] << 4
  }
  __m512i w[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; k++) {  // bytes 4k..4k+3 of every block
    w[k] = _mm512_or_si512(_mm512_or_si512(v[4 * k], _mm512_slli_epi32(v[4 * k + 1], 8)),
                           _mm512_or_si512(_mm512_slli_epi32(v[4 * k + 2], 16), _mm512_slli_epi32(v[4 * k + 3], 24)));
  }
  const __m512i t0 = _mm512_unpacklo_epi32(w[0], w[1]), t1 = _mm512_unpackhi_epi32(w[0], w[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(w[2], w[3]), t3 = _mm512_unpackhi_epi32(w[2], w[3]);
  // r[i], 128-bit lane l: the 16 bytes of block 4l + i
  const __m512i r[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2), _mm512_unpacklo_epi64(t1, t3),
                        _mm512_unpackhi_epi64(t1, t3)};
  for (size_t b = 0; b < cnt; b++) store_u16(outc + b * kIQ4_NLBytes, dh[b]);
  if (cnt == kIq4Chunk) {
    iq4_nl_store_nibbles<0>(r, outc);
    iq4_nl_store_nibbles<1>(r, outc);
    iq4_nl_store_nibbles<2>(r, outc);
    iq4_nl_store_nibbles<3>(r, outc);
  } else {
    alignas(64) uint8_t q[4][64];
    for (int i = 0; i < 4; i++) _mm512_store_si512(q[i], r[i]);
    for (size_t b = 0; b < cnt; b++) std::memcpy(outc + b * kIQ4_NLBytes + 2, q[b % 4] + 16 * (b / 4), 16);
  }
  for (size_t b = 0; b < cnt; b++) {
    if (a.kind[b] == 2) {
      quants::ref::iq4_nl_from_f32(xc + b * kQK, outc + b * kIQ4_NLBytes, kQK);
    } else if ((special >> b) & 1) {
      alignas(64) float d1[kIq4Chunk] = {a.d[b]};
      iq4_nl_finish(xc + b * kQK, outc + b * kIQ4_NLBytes, 1, &a.kind[b], d1, t);
    }
  }
}

// A chunk of 16 blocks (cnt >= kIq4AcrossMin; the missing ones are padded with zeros) in three
// steps: prepare (transpose, classify, scales, tables), sums, decide and write. The row loop runs
// the decision of one chunk inside the next chunk's tables (iq4_nl_across_tables<true>), so that
// its chain of dependent compares and divisions overlaps with that arithmetic; only the last
// chunk of a run decides on its own (iq4_nl_across_decide).
KV_AVX512 void iq4_nl_across_prepare(const float* xc, size_t cnt, Iq4nlAcross& a, const Iq4nlTables& t,
                                     Iq4nlAcross* prev) {
  constexpr int ntry = 7;
  const int8_t* values = kIQ4NLValues;
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  // x[j] lane b (zeros for the missing blocks b >= cnt)
  {
    alignas(64) static const float zeros[kQK] = {};
    for (size_t h = 0; h < 2; h++) {
      const float* hr[kIq4Chunk];
      for (size_t b = 0; b < kIq4Chunk; b++) hr[b] = (b < cnt ? xc + b * kQK : zeros) + 16 * h;
      __m512 xt[16];
      transpose16_rows(hr, xt);
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) _mm512_store_ps(a.x[16 * h + i], xt[i]);
    }
  }
  // classify, lane = block: the reference's `if (ax > amax) { amax = ax; max = xb[j]; }` over
  // j = 0..31 (the first value of largest magnitude wins); blocks with an inf/NaN value take the
  // scalar reference (their lanes compute garbage that is not used: lanes never mix), blocks
  // with amax < GROUP_MAX_EPS get d = 0; those and the missing blocks search with max = 1.
  __m512 max;
  __mmask16 search;
  {
    // amax, and `max` = x[j] at the smallest j with |x[j]| == amax (what the strict > keeps).
    // Over non-NaN values max and min are order-free: the largest value hi and the smallest lo;
    // max is hi when hi > -lo and lo when -lo > hi, whichever j holds it first (the same value).
    // Only when hi == -lo (both signs reach amax) does the order matter: then the lanes that
    // search take the reference's loop. NaN lanes are `bad` and take the scalar reference.
    __m512 hi4[4], lo4[4];
    __mmask16 badk[4] = {0, 0, 0, 0};
#pragma GCC unroll 32
    for (size_t j = 0; j < kQK; j++) {
      const __m512 x = _mm512_load_ps(a.x[j]);
      badk[j % 4] |= _mm512_fpclass_ps_mask(x, 0x99);  // QNaN | +inf | -inf | SNaN
      hi4[j % 4] = j < 4 ? x : _mm512_max_ps(hi4[j % 4], x);
      lo4[j % 4] = j < 4 ? x : _mm512_min_ps(lo4[j % 4], x);
    }
    const __m512 hi = _mm512_max_ps(_mm512_max_ps(hi4[0], hi4[1]), _mm512_max_ps(hi4[2], hi4[3]));
    const __m512 neg_lo = _mm512_sub_ps(_mm512_setzero_ps(),
                                        _mm512_min_ps(_mm512_min_ps(lo4[0], lo4[1]), _mm512_min_ps(lo4[2], lo4[3])));
    __mmask16 bad = static_cast<__mmask16>((badk[0] | badk[1]) | (badk[2] | badk[3]));
    const __m512 amax = _mm512_max_ps(hi, neg_lo);
    __m512 mx = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(neg_lo, hi, _CMP_GT_OQ), hi, _mm512_sub_ps(_mm512_setzero_ps(), neg_lo));
    if (__builtin_expect(_mm512_cmp_ps_mask(hi, neg_lo, _CMP_EQ_OQ) != 0, 0)) {
      __m512 first = _mm512_setzero_ps();
      for (size_t j = kQK; j-- > 0;) {
        const __m512 x = _mm512_load_ps(a.x[j]);
        first = _mm512_mask_mov_ps(first, _mm512_cmp_ps_mask(abs16(x), amax, _CMP_EQ_OQ), x);
      }
      mx = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(hi, neg_lo, _CMP_EQ_OQ), first);
    }
    const __mmask16 valid = static_cast<__mmask16>(cnt >= 16 ? 0xffff : (1u << cnt) - 1);
    bad &= valid;
    search = static_cast<__mmask16>(valid & ~bad & _mm512_cmp_ps_mask(amax, _mm512_set1_ps(1e-15f), _CMP_NLT_UQ));
    a.search = search;
    max = _mm512_mask_mov_ps(one, search, mx);
    _mm512_store_ps(a.max, max);
    for (size_t b = 0; b < kIq4Chunk; b++) a.kind[b] = (bad >> b) & 1 ? 2 : (search >> b) & 1 ? 0 : 1;
  }
  // the scales: d = -max/values[0], id = 1/d for the first pass; id = (itry + values[0])/max
  {
    const __m512 d = ntry > 0 ? _mm512_div_ps(_mm512_sub_ps(zero, max), _mm512_set1_ps(static_cast<float>(values[0])))
                              : _mm512_div_ps(max, _mm512_set1_ps(static_cast<float>(values[0])));
    _mm512_store_ps(a.id[0], _mm512_div_ps(one, d));
  }
  __m512 y = one;
  const bool exact_ids = iq4_nl_trial_ids(max, &a.id[1][0], &y, true);
  if (prev) iq4_nl_across_tables<true>(a, t, prev);
  else iq4_nl_across_tables<false>(a, t, nullptr);
  if (exact_ids) {
    iq4_nl_compact_trials(a, max, y, iq4_nl_mark_flips(a, max));
  } else {
    a.steps = a.steps_half[0] = a.steps_half[1] = 15;
  }
}

template <int G>
KV_AVX512_INLINE void iq4_nl_sums_n(Iq4nlAcross& a, int p0, int g, int h) {
  if constexpr (G > 1) {
    if (g < G) return iq4_nl_sums_n<G - 1>(a, p0, g, h);
  }
  iq4_nl_across_sums_half<G>(a, p0, h);
}

// The sums of passes 1..steps_half[h] of each half h of the lanes, at most 8 at a time (16 sums
// and 8 ids in registers), in two parts of similar size when there are more.
KV_AVX512_INLINE void iq4_nl_across_search(Iq4nlAcross& a) {
  for (int h = 0; h < 2; h++) {
    const int k = a.steps_half[h];
    if (k <= 8) {
      iq4_nl_sums_n<8>(a, 1, k, h);
    } else {
      const int g1 = (k + 1) / 2;
      iq4_nl_sums_n<8>(a, 1, g1, h);
      iq4_nl_sums_n<8>(a, 1 + g1, k - g1, h);
    }
  }
}

KV_AVX512 void iq4_nl_across_decide(Iq4nlAcross& a, const float* xc, std::byte* outc, size_t cnt, const Iq4nlTables& t) {
  __m512 d = _mm512_setzero_ps(), best = _mm512_setzero_ps();
  for (int p = 0; p <= a.steps; ++p) iq4_nl_decide_step(a, p, d, best);
  _mm512_store_ps(a.d, _mm512_maskz_mov_ps(a.search, d));  // d = 0 for the blocks that do not search
  iq4_nl_finish_across(a, xc, outc, cnt, t);
}

}  // namespace

namespace {

// The row loop over chunks of 16 blocks. load(b0, cnt) returns the cnt * 32 values of blocks
// b0.. as floats; they must stay valid until the chunk after next is loaded (the decision of a
// chunk runs after the next chunk's preparation and may read them again).
template <class Load>
KV_AVX512_INLINE void iq4_nl_rows(size_t nb, std::byte* out, const Iq4nlTables& t, Load load) {
  Iq4nlAcross a[2];
  Iq4nlCand cand;
  a[0].cand = a[1].cand = &cand;
  // the decision reads every step's sums and masks the lanes whose half did not run the step;
  // zeros keep that read defined in the first chunks
  for (Iq4nlAcross& c : a) {
    std::memset(c.sx, 0, sizeof c.sx);
    std::memset(c.s2, 0, sizeof c.s2);
  }
  const float* xs[2] = {nullptr, nullptr};
  size_t pending = SIZE_MAX;  // the chunk (first block) whose sums are done, decision not yet
  for (size_t b0 = 0, k = 0; b0 < nb; b0 += kIq4Chunk, k ^= 1) {
    const size_t cnt = nb - b0 < kIq4Chunk ? nb - b0 : kIq4Chunk;
    xs[k] = load(b0, cnt);
    if (cnt < kIq4AcrossMin) {  // the last chunk
      iq4_nl_chunk_by_block(xs[k], out + b0 * kIQ4_NLBytes, cnt, t);
      continue;
    }
    if (pending != SIZE_MAX) {  // prev's decision inside this chunk's tables, then prev's bytes
      iq4_nl_across_prepare(xs[k], cnt, a[k], t, &a[k ^ 1]);
      iq4_nl_finish_across(a[k ^ 1], xs[k ^ 1], out + pending * kIQ4_NLBytes, kIq4Chunk, t);
    } else {
      iq4_nl_across_prepare(xs[k], cnt, a[k], t, nullptr);
    }
    iq4_nl_across_search(a[k]);
    pending = b0;
    if (cnt < kIq4Chunk) {  // the last chunk
      iq4_nl_across_decide(a[k], xs[k], out + b0 * kIQ4_NLBytes, cnt, t);
      pending = SIZE_MAX;
    }
  }
  if (pending != SIZE_MAX) {
    const size_t k = (pending / kIq4Chunk) & 1;
    iq4_nl_across_decide(a[k], xs[k], out + pending * kIQ4_NLBytes, kIq4Chunk, t);
  }
}

}  // namespace

KV_AVX512 int iq4_nl_trial_schedule_avx512(const float* x, size_t cnt, uint8_t* trials) {
  Iq4nlAcross a;
  Iq4nlCand cand;
  a.cand = &cand;
  iq4_nl_across_prepare(x, cnt, a, iq4nl_tables(), nullptr);
  // the trial of each step: the one whose id it carries (a block's trial ids are distinct)
  alignas(64) float ids[15][16];
  iq4_nl_trial_ids(_mm512_load_ps(a.max), &ids[0][0]);
  for (int k = 0; k < a.steps; k++) {
    for (size_t b = 0; b < 16; b++) {
      const bool ran = k < a.steps_half[b / 8] && (a.search >> b & 1);  // 0: the lane's half stopped
      trials[16 * k + b] = ran ? 0xFF : 0;  // 0xFF: an id that is no trial's
      for (int p = 1; p <= 15 && ran; p++) {
        if (a.id[k + 1][b] == ids[p - 1][b]) trials[16 * k + b] = static_cast<uint8_t>(p);
      }
    }
  }
  return a.steps;
}

KV_AVX512 void iq4_nl_trial_ids_avx512(const float* max, float* id, size_t n) {
  for (size_t i = 0; i + 16 <= n; i += 16) iq4_nl_trial_ids(_mm512_loadu_ps(max + i), id + 15 * i);
}

KV_AVX512 void iq4_nl_from_f32_avx512(const float* src, std::byte* out, size_t n) {
  assert(n % kQK == 0);
  iq4_nl_rows(n / kQK, out, iq4nl_tables(), [src](size_t b0, size_t) { return src + b0 * kQK; });
}

// =============================================================================================
// f16 -> (rotation) -> iq4_nl, fused
// =============================================================================================

namespace {

// f16 -> floats rotated in blocks of n_rot (0: not rotated) into dst. For n_rot 64 and 128 each
// rotation block goes from the f16 loads through the rotation in registers (load_rotate_f16,
// the same operations as f16_to_f32_avx512 then hadamard_avx512); a block holding a NaN takes
// those two steps as they are (the NaN that survives depends on the operand order).
template <int NV>
KV_AVX512_INLINE void f16_rotate_blocks(const std::byte* src, float* dst, size_t n) {
  const __m512 scale = _mm512_set1_ps(fwht_scale(16 * NV));
  __m512 s[4];
  load_signs16(s);
  for (size_t b = 0; b < n; b += 16 * NV) {
    __mmask16 nan = 0;
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++) {
      const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * (b + 16 * i))));
      nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
    if (__builtin_expect(nan != 0, 0)) {
      f16_to_f32_avx512(src + 2 * b, dst + b, 16 * NV);
      hadamard_avx512(dst + b, 16 * NV, 16 * NV);
      continue;
    }
    __m512 v[NV];
    load_rotate_f16<NV>(src + 2 * b, v, scale, s);
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++) _mm512_store_ps(dst + b + 16 * i, v[i]);
  }
}

KV_AVX512 void f16_rotate_to_f32(const std::byte* src, float* dst, size_t n, uint32_t n_rot) {
  if (n_rot == 128) {
    f16_rotate_blocks<8>(src, dst, n);
  } else if (n_rot == 64) {
    f16_rotate_blocks<4>(src, dst, n);
  } else {
    f16_to_f32_avx512(src, dst, n);
    if (n_rot) hadamard_avx512(dst, n, n_rot);
  }
}

}  // namespace

// f16 -> (rotation) -> iq4_nl in one pass: each chunk of 16 blocks is converted and rotated into
// an L1 buffer by the same kernels as the three-step path (f16_to_f32_avx512, hadamard_avx512;
// n_rot 0 = no rotation), then quantized; the next chunk's f16 input is prefetched meanwhile.
// n is a multiple of 32 and of n_rot, so every chunk is whole rotation blocks (n_rot <= 512).
KV_AVX512 void f16_rot_iq4_nl(const std::byte* in, std::byte* out, size_t n, uint32_t n_rot) {
  assert(n % kQK == 0 && (n_rot == 0 || (n % n_rot == 0 && (kIq4Chunk * kQK) % n_rot == 0)));
  alignas(64) float buf[2][kIq4Chunk * kQK];
  iq4_nl_rows(n / kQK, out, iq4nl_tables(), [&](size_t b0, size_t cnt) {
    float* x = buf[(b0 / kIq4Chunk) & 1];
    const std::byte* src = in + b0 * kQK * 2;
    const size_t next = (b0 + kIq4Chunk) * kQK * 2, end = n * 2;
    for (size_t off = 0; off < kIq4Chunk * kQK * 2 && next + off < end; off += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(in + next + off), _MM_HINT_T0);
    }
    f16_rotate_to_f32(src, x, cnt * kQK, n_rot);
    return static_cast<const float*>(x);
  });
}

void f16_iq4_nl_fn(const std::byte* in, std::byte* out, size_t n, uint32_t) { f16_rot_iq4_nl(in, out, n, 0); }

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
