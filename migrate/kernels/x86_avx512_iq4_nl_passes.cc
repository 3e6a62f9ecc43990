#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

// The AVX-512 iq4_nl quantizer, part 2 of 2: the index tables, and chunks of fewer than 8
// blocks with the 16 passes of one block in the lanes. See x86_avx512_iq4_nl.h.

#include "migrate/kernels/x86_avx512_iq4_nl.h"

#ifdef KVSNAP_SIMD_X86

namespace kvsnap::simd::x86 {

namespace {

// Buckets [width k, width (k + 1)), k = -16..15 at slot k & 31: the midpoint inside (or +inf),
// and the number of midpoints below.
void fill_iq4nl_buckets(const float* mid, float width, float* thr, int32_t* base) {
  for (int key = -16; key < 16; key++) {
    const int slot = key & 31;
    const float lo = width * static_cast<float>(key), hi = lo + width;
    base[slot] = 0;
    thr[slot] = INFINITY;
    for (int i = 0; i < 15; i++) {
      if (mid[i] < lo) base[slot]++;
      else if (mid[i] < hi) thr[slot] = mid[i];
    }
  }
}

Iq4nlTables make_iq4nl_tables() {
  Iq4nlTables t{};
  float mid[15];
  for (int i = 0; i < 15; i++) mid[i] = static_cast<float>(kIQ4NLValues[i] + kIQ4NLValues[i + 1]) / 2;
  for (int i = 0; i < 16; i++) t.vals[i] = static_cast<float>(kIQ4NLValues[i]);
  for (int i = 0; i < 16; i++) t.vals_hi[i] = static_cast<float>(kIQ4NLValues[i < 15 ? i + 1 : 15]);
  for (int i = 0; i < 32; i++) t.mid[i] = i < 15 ? mid[i] : INFINITY;
  fill_iq4nl_buckets(mid, 9.0f, t.thr, t.base);
  fill_iq4nl_buckets(mid, 8.0f, t.thr8, t.base8);  // over [-128, 128): at most one midpoint each
  return t;
}

}  // namespace

const Iq4nlTables& iq4nl_tables() {
  static const Iq4nlTables t = make_iq4nl_tables();
  return t;
}

KV_AVX512 void iq4_nl_index_within128_avx512(const float* x, uint8_t* idx, size_t n) {
  const Iq4nlTables& t = iq4nl_tables();
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + i),
                     _mm512_cvtepi32_epi8(iq4nl_index16_within128(_mm512_loadu_ps(x + i), t)));
  }
}

KV_AVX512 void iq4_nl_index_avx512(const float* x, uint8_t* idx, size_t n) {
  const Iq4nlTables& t = iq4nl_tables();
  for (size_t i = 0; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + i), _mm512_cvtepi32_epi8(iq4nl_index16(_mm512_loadu_ps(x + i), t)));
  }
}

struct Iq4nlChunk {
  alignas(64) float id[kIq4Chunk][16];    // per block: lane 0 = 1/d, lane 8 + itry = (itry - 127)/max
  alignas(64) float thr[kIq4Chunk][kQK];  // m[k0] per value (+inf past the last midpoint)
  alignas(64) float plo[kIq4Chunk][kQK], phi[kIq4Chunk][kQK], rlo[kIq4Chunk][kQK], rhi[kIq4Chunk][kQK];
  alignas(64) float p0[kIq4Chunk][kQK], r0[kIq4Chunk][kQK];  // lane 0's (w*q)*x and (w*q)*q
  alignas(64) float sx[kIq4Chunk][16], s2[kIq4Chunk][16];
  alignas(64) float sx0[kIq4Chunk], s20[kIq4Chunk];
  alignas(64) float d[kIq4Chunk];
  uint8_t kind[kIq4Chunk];  // 0: search, 1: amax < GROUP_MAX_EPS (d = 0), 2: inf/NaN (scalar reference)
};

// Candidate tables of one block.
KV_AVX512_INLINE void iq4_nl_tables_for(const float* xb, const float* idv, const Iq4nlTables& t, Iq4nlChunk& c,
                                        size_t b) {
  const __m512 id0 = _mm512_set1_ps(idv[0]), id1 = _mm512_set1_ps(idv[1]), id15 = _mm512_set1_ps(idv[15]);
  const __m512 vals = _mm512_load_ps(t.vals);
  const __m512 mid_a = _mm512_load_ps(t.mid), mid_b = _mm512_load_ps(t.mid + 16);
  const __m512i fifteen = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
  for (int h = 0; h < 2; h++) {
    const __m512 x = _mm512_loadu_ps(xb + 16 * h);
    const __m512 w = _mm512_mul_ps(x, x);  // weight[j] = xb[j]*xb[j]
    // |id * x| <= 134.02 for every lane (|id| <= 134/|max| to within rounding, |x| <= |max|)
    const __m512i k0 = iq4nl_index16_bounded(_mm512_min_ps(_mm512_mul_ps(id1, x), _mm512_mul_ps(id15, x)), t);
    _mm512_store_ps(c.thr[b] + 16 * h, _mm512_permutex2var_ps(mid_a, k0, mid_b));
    const __m512 qlo = _mm512_permutexvar_ps(k0, vals);
    const __m512 qhi = _mm512_permutexvar_ps(_mm512_min_epi32(_mm512_add_epi32(k0, one), fifteen), vals);
    const __m512 wlo = _mm512_mul_ps(w, qlo), whi = _mm512_mul_ps(w, qhi);
    _mm512_store_ps(c.plo[b] + 16 * h, _mm512_mul_ps(wlo, x));
    _mm512_store_ps(c.rlo[b] + 16 * h, _mm512_mul_ps(wlo, qlo));
    _mm512_store_ps(c.phi[b] + 16 * h, _mm512_mul_ps(whi, x));
    _mm512_store_ps(c.rhi[b] + 16 * h, _mm512_mul_ps(whi, qhi));
    const __m512 q0 = _mm512_permutexvar_ps(iq4nl_index16_bounded(_mm512_mul_ps(id0, x), t), vals);
    const __m512 w0 = _mm512_mul_ps(w, q0);
    _mm512_store_ps(c.p0[b] + 16 * h, _mm512_mul_ps(w0, x));
    _mm512_store_ps(c.r0[b] + 16 * h, _mm512_mul_ps(w0, q0));
  }
}

// kLaneJ[j] = j in every lane: the permute index of value j's lower candidate (+16: upper).
struct LaneJ {
  alignas(64) int32_t v[16][16];
};
constexpr LaneJ make_lane_j() {
  LaneJ t{};
  for (int j = 0; j < 16; j++) {
    for (int l = 0; l < 16; l++) t.v[j][l] = j;
  }
  return t;
}
constexpr LaneJ kLaneJ = make_lane_j();

// The 16 lanes' sums of one block, j = 0..31 in order.
KV_AVX512_INLINE void iq4_nl_sums_for(const float* xb, Iq4nlChunk& c, size_t b) {
  const __m512 id = _mm512_load_ps(c.id[b]);
  __m512 sumqx = _mm512_setzero_ps(), sumq2 = _mm512_setzero_ps();
  float sumqx0 = 0, sumq20 = 0;
#pragma GCC unroll 2
  for (int h = 0; h < 2; h++) {
    const __m512 plo = _mm512_load_ps(c.plo[b] + 16 * h), phi = _mm512_load_ps(c.phi[b] + 16 * h);
    const __m512 rlo = _mm512_load_ps(c.rlo[b] + 16 * h), rhi = _mm512_load_ps(c.rhi[b] + 16 * h);
    const __m512i sixteen = _mm512_set1_epi32(16);
#pragma GCC unroll 4
    for (int jj = 0; jj < 16; ++jj) {
      const int j = 16 * h + jj;
      const __m512 al = _mm512_mul_ps(id, _mm512_set1_ps(xb[j]));
      __mmask16 ge;
#if defined(__GNUC__) && !defined(__clang__)
      // al >= thr[j] with the threshold as an embedded broadcast (GCC would broadcast it into a
      // register first, one more instruction per value)
      __asm__("vcmpps $0x1d, %[t]%{1to16%}, %[al], %[k]" : [k] "=k"(ge) : [al] "v"(al), [t] "m"(c.thr[b][j]));
#else
      ge = _mm512_cmp_ps_mask(al, _mm512_set1_ps(c.thr[b][j]), _CMP_GE_OQ);
#endif
      const __m512i lj = _mm512_load_si512(kLaneJ.v[jj]);
      const __m512i idx = _mm512_mask_add_epi32(lj, ge, lj, sixteen);
      sumqx = _mm512_add_ps(sumqx, _mm512_permutex2var_ps(plo, idx, phi));  // sumqx += w*q*xb[j]
      sumq2 = _mm512_add_ps(sumq2, _mm512_permutex2var_ps(rlo, idx, rhi));  // sumq2 += w*q*q
      sumqx0 += c.p0[b][j];
      sumq20 += c.r0[b][j];
    }
  }
  _mm512_store_ps(c.sx[b], sumqx);
  _mm512_store_ps(c.s2[b], sumq2);
  c.sx0[b] = sumqx0;
  c.s20[b] = sumq20;
}

// 16 x 16 transpose: out[i] lane b = in[b] lane i.
KV_AVX512_INLINE void transpose16(const float (*in)[16], __m512* out) {
  const float* rows[16];
  for (int b = 0; b < 16; ++b) rows[b] = in[b];
  transpose16_rows(rows, out);
}

// The reference's choice of scale for the 16 blocks of a chunk at once (lane b = block b):
// lane 0's pass, then itry = -7..7 in order, on the same floats (IEEE division and
// multiplication round the same in a vector lane as in a scalar).
KV_AVX512 void iq4_nl_decide16(Iq4nlChunk& c) {
  __m512 sx[16], s2[16];
  transpose16(c.sx, sx);
  transpose16(c.s2, s2);
  const __m512 zero = _mm512_setzero_ps();
  const __m512 sx0 = _mm512_load_ps(c.sx0), s20 = _mm512_load_ps(c.s20);
  // d = sumq2 > 0 ? sumqx/sumq2 : 0.f; best = d*sumqx;
  __m512 d = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(s20, zero, _CMP_GT_OQ), sx0, s20);
  __m512 best = _mm512_mul_ps(d, sx0);
#pragma GCC unroll 15
  for (int lane = 1; lane < 16; ++lane) {  // itry = lane - 8
    const __m512 qx = sx[lane], q2 = s2[lane];
    const __mmask16 take = _mm512_cmp_ps_mask(q2, zero, _CMP_GT_OQ) &
                           _mm512_cmp_ps_mask(_mm512_mul_ps(qx, qx), _mm512_mul_ps(best, q2), _CMP_GT_OQ);
    const __m512 dt = _mm512_div_ps(qx, q2);
    d = _mm512_mask_mov_ps(d, take, dt);
    best = _mm512_mask_mov_ps(best, take, _mm512_mul_ps(dt, qx));
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, d);
  for (size_t b = 0; b < kIq4Chunk; b++) {
    if (c.kind[b] == 0) c.d[b] = out[b];
  }
}

namespace {

// ---- the steps every chunk of up to 16 blocks shares -------------------------------------------

// kind[b]: 0 search, 1 amax < GROUP_MAX_EPS (d = 0), 2 inf/NaN (the scalar reference);
// maxv[b]: the reference's `max` (the signed first value of largest magnitude) of a searching
// block, 1.0 for the others and for the missing blocks b >= cnt.
KV_AVX512_INLINE void iq4_nl_classify(const float* xc, size_t cnt, uint8_t* kind, float* maxv) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  for (size_t b = 0; b < kIq4Chunk; b++) {
    kind[b] = 1;
    maxv[b] = 1.0f;
  }
  for (size_t b = 0; b < cnt; b++) {
    const float* xb = xc + b * kQK;
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    const __mmask16 bad0 = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v0), exp_mask), exp_mask);
    const __mmask16 bad1 = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v1), exp_mask), exp_mask);
    if (__builtin_expect((bad0 | bad1) != 0, 0)) {  // NaN or inf: the scalar reference
      kind[b] = 2;
      continue;
    }
    const __m512 a0 = abs16(v0), a1 = abs16(v1);
    const float amax = hmax16(_mm512_max_ps(a0, a1));
    if (amax < 1e-15f) continue;  // GROUP_MAX_EPS: d = 0
    kind[b] = 0;
    maxv[b] = first_of_amax(xb, a0, a1, amax);
  }
}

}  // namespace

// ---- lanes = trial passes (one block at a time): chunks of fewer than kIq4AcrossMin blocks ------

// Up to 16 blocks: the 16 passes of each block in the lanes of one vector.
KV_AVX512 void iq4_nl_chunk_by_block(const float* xc, std::byte* outc, size_t cnt, const Iq4nlTables& t) {
  constexpr int ntry = 7;
  const int8_t* values = kIQ4NLValues;
  // lane 0: the first pass (its id is set per block); lane 8 + itry: itry + values[0]
  alignas(64) float numer[16];
  numer[0] = 1.0f;
  for (int itry = -ntry; itry <= ntry; ++itry) numer[8 + itry] = static_cast<float>(itry + values[0]);
  const __m512 vnumer = _mm512_load_ps(numer);
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
  Iq4nlChunk c;
  alignas(64) float maxv[kIq4Chunk], id0v[kIq4Chunk];
  // the sums of blocks that do not search (and of the chunk's missing blocks) are zeroed for the
  // vectorized decision
  for (size_t b = 0; b < kIq4Chunk; b++) {
    _mm512_store_ps(c.sx[b], zero);
    _mm512_store_ps(c.s2[b], zero);
    c.d[b] = 0.0f;
  }
  _mm512_store_ps(c.sx0, zero);
  _mm512_store_ps(c.s20, zero);
  iq4_nl_classify(xc, cnt, c.kind, maxv);
  // the first pass's scale of all blocks: d = -max/values[0], id = 1/d (two vector divisions)
  {
    const __m512 max = _mm512_load_ps(maxv);
    const __m512 d = ntry > 0 ? _mm512_div_ps(_mm512_sub_ps(zero, max), _mm512_set1_ps(static_cast<float>(values[0])))
                              : _mm512_div_ps(max, _mm512_set1_ps(static_cast<float>(values[0])));
    _mm512_store_ps(id0v, _mm512_div_ps(one, d));
  }
  for (size_t b = 0; b < cnt; b++) {
    if (c.kind[b] != 0) continue;
    _mm512_store_ps(c.id[b], _mm512_mask_mov_ps(_mm512_div_ps(vnumer, _mm512_set1_ps(maxv[b])), 1, _mm512_set1_ps(id0v[b])));
  }
  // candidate tables; sums; decisions
  for (size_t b = 0; b < cnt; b++) {
    if (c.kind[b] == 0) iq4_nl_tables_for(xc + b * kQK, c.id[b], t, c, b);
  }
  for (size_t b = 0; b < cnt; b++) {
    if (c.kind[b] == 0) iq4_nl_sums_for(xc + b * kQK, c, b);
  }
  iq4_nl_decide16(c);
  iq4_nl_finish(xc, outc, cnt, c.kind, c.d, t);
}

}  // namespace kvsnap::simd::x86

#endif  // KVSNAP_SIMD_X86
