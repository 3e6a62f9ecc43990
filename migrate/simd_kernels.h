// Internal to migrate/: the row kernels behind the codec table (type_traits.cc: TypeTraits's
// to_f32 / from_f32), the Hadamard rotation (hadamard.cc) and the fused row conversions
// (convert_row.cc), reached only through the dispatch tables named below.
//
//   quants::ref::*     the scalar transcriptions of ggml's reference code (quants.h/.cc). They
//                      define the bytes; every other kernel must agree with them exactly.
//   simd::x86::*_avx2  AVX2 + FMA + F16C kernels (kernels/x86_avx2*.cc), compiled with target attributes
//   simd::x86::*_avx512 AVX-512 F/BW/DQ/VL kernels (kernels/x86_avx512.cc, x86_avx512_iq4_nl*.cc)
//   simd::arm::*_neon   aarch64 Advanced SIMD kernels (kernels/arm_neon*.cc), aarch64 builds only
// A new ISA's kernels go in migrate/kernels/<isa>_*.cc, declared here in a section of their own.
//
// Only call a kernel when simd::level() (base/simd_level.h) says the CPU has it; the
// dispatch tables do that: the codec table (migrate/type_traits.cc, a column per level) and
// the level table (simd_kernels.cc: Hadamard, fused and MLX affine row kernels per level).
//
// A kernel computes the reference's float operations in the reference's order for every value
// (lanes are values, blocks or trial scales, never partial sums of one reduction), uses
// instructions whose results are fully specified by IEEE 754 / the x86 manuals (F16C for f16
// only where it equals ggml's rounding, truncating conversions with x86's INT32_MIN for NaN and
// out-of-range values, as the reference does on x86-64), and hands a block to the scalar
// reference whenever its input could take the vector shortcut off the reference's path (NaN or
// infinite values).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/simd_level.h"  // Level, level(); KVSNAP_SIMD_X86, KVSNAP_SIMD_NEON
#include "format/ggml_types.h"
#include "migrate/mlx_affine.h"
#include "migrate/quants.h"  // quants::ref: the scalar kernels every other one falls back to

namespace kvsnap::hadamard_ref {
// The scalar fast Walsh-Hadamard transform (== the CPU backend's fwht), block by block.
void rotate(float* x, size_t n, uint32_t n_rot);
}  // namespace kvsnap::hadamard_ref

namespace kvsnap::simd {

// A whole row conversion in one pass (to_f32, rotation step, from_f32 per rotation block, in
// registers), giving the same bytes as the three steps: n values, a multiple of 32 and of n_rot,
// of `src` in `in` -> `dst` in `out`. Rows are independent, so n may span several rows.
using FusedRowFn = void (*)(const std::byte* in, std::byte* out, size_t n, uint32_t n_rot);

// The fused kernel for src -> dst at the current level or the nearest level below it (rotate: whether the values are
// multiplied by the n_rot Hadamard matrix on the way), or nullptr: then use the three steps.
FusedRowFn find_fused(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot);

using HadamardFn = void (*)(float* x, size_t n, uint32_t n_rot);
using FindFusedFn = FusedRowFn (*)(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot);
// mlx_affine_quantize_row / mlx_affine_dequantize_row (migrate/mlx_affine.h), same arguments.
using MlxQuantizeFn = void (*)(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                               std::byte* codes, float* scales, float* biases);
using MlxDequantizeFn = void (*)(const std::byte* codes, const float* scales, const float* biases, int64_t dim,
                                 int bits, int group_size, MlxFloat t, float* out);

// ExactRequantizer's direct path (migrate/exact_requant.h): n_blocks blocks of q4_0, q5_0 or
// iq4_nl -> q8_0 blocks with the same f16 scale and the source's levels as int8 (value = level *
// d either way), the bytes of its scalar loop. Every block's scale must be finite and nonzero
// (the caller takes the others through the general path).
using EmbedQ8_0Fn = void (*)(const std::byte* in, std::byte* out, size_t n_blocks);
using FindEmbedQ8_0Fn = EmbedQ8_0Fn (*)(GgmlType src);
// The kernel for src at the current level or the nearest level below it, or nullptr: then the
// scalar loop.
EmbedQ8_0Fn find_embed_q8_0(GgmlType src);

// ExactRequantizer's scale search (migrate/exact_requant.cc): scores 8 candidate scales d[0..7]
// (one offset m for all) of one block of 32 values x, each lane exactly as the scalar search
// scores one: the level of x[i] is the nearest on the target's grid of (x[i] - m) / d[k] (round
// half to even, clamped to [lo, hi], 0 where not finite; kIq4nl: the first nearest of the 16
// iq4_nl levels, and a non-finite quotient marks the candidate unusable: ok[k] = false), its
// decoded value level * d[k] (+ m for kOffset, two roundings), and e[k] the sum over i, in
// order, of (double(x[i]) - double(decoded))^2. Writes levels[i * 8 + k] and e[k]; returns false
// (levels and e incomplete) when it stopped because no e[k] could get below best_err.
enum class RequantGrid { kSymmetric, kOffset, kIq4nl };
using RequantScore8Fn = bool (*)(const float* x, float m, const float* d, int lo, int hi, RequantGrid grid,
                                 double best_err, double* e, int32_t* levels, bool* ok);
// The kernel at the current level or the nearest level below it (the scalar level's is
// requant_score8_ref, migrate/exact_requant.cc).
RequantScore8Fn find_requant_score8();
bool requant_score8_ref(const float* x, float m, const float* d, int lo, int hi, RequantGrid grid, double best_err,
                        double* e, int32_t* levels, bool* ok);

// ExactRequantizer's quick search (migrate/exact_requant.cc, --requant quick) for up to 8 blocks
// of 32 values at once, block k in lane k, on a linear grid (levels lo..hi, value level * d, or
// level * d + m with an offset) or iq4_nl's (value level * d, levels its table). For each block
// k < n, with x its source values and y the values of its reference block (ggml's, decoded),
// whose f16 scale and offset are d16[k], m16[k]:
//   - the reference's error is the sum of (x[i] - y[i])^2, and a candidate's the sum of
//     (x[i] - (n[i] * d + m))^2 (m = 0 without an offset) with, for r = (x[i] - m) * id, id =
//     1 / d: on a linear grid n[i] = min(max(nearbyint(r), lo), hi) (round half to even; max and
//     min as x86's maxps / minps with the level first), on iq4_nl's the table value at ggml's
//     best_index_int8(r) (the nearest; between two, the upper); each sum in float, lane l = i % 8
//     adding i = l, l + 8, l + 16, l + 24 in turn, then the lanes pairwise: (l, l + 4), (l, l +
//     2), (0, 1);
//   - nothing is done unless that error is finite and > 0 and the reference's scale (and offset)
//     are finite, the scale nonzero;
//   - the candidates, in order, each kept when its error is below the best so far: the f16 of
//     d_ref * f for each f of kQuickFactors with the reference's offset; then one least-squares
//     fit to x of the best's levels n (the reference's, ref_levels, if no factor did better):
//     with il = sum n, ill = sum n^2, sx and sxl the sums of x[i] and of x[i] * n[i] (float, the
//     lanes as above, starting from 0), in double: d = sxl / ill (if ill != 0) or, with an
//     offset, d = (32 sxl - il sx) / det and m = (sx - d il) / 32, det = 32 ill - il^2 (if det !=
//     0), each rounded to float then f16. A candidate whose f16 scale is 0 or not finite, or whose
//     offset is not finite, is skipped.
// Bit k of `improved` says whether block k is replaced: by out_d16[k], out_m16[k] (m16[k] for a
// factor's candidate, 0 without an offset) and levels[k] (iq4_nl: table values). Every level
// gives the same result.
//
// make_reference (a symmetric linear grid, lo = -2^(B-1): q4_0, q5_0; only for the kernels of
// find_quick_search_reference): the kernel makes each block's reference block itself, as ggml's
// quantize_row_q4_0_ref / q5_0_ref would from x, and reads no y, d16, m16 or ref_levels. Bit k of
// `referenced` says it did for block k: out_d16[k] and levels[k] then hold block k's result
// whether improved or not (the reference block's where not), the same the search above gives
// with that reference block. A block it did not (a value not finite, all values zero, a scale
// whose reciprocal is not finite, values whose float sum overflows) is the caller's to do as above.
inline constexpr float kQuickFactors[] = {0.94f, 0.97f, 1.03f, 1.06f};
struct QuickSearchBlocks {
  int n = 0;  // blocks, 1..8
  RequantGrid grid = RequantGrid::kSymmetric;
  float lo = 0, hi = 0;  // a linear grid's levels
  const float* x[8] = {};
  const float* y[8] = {};
  uint16_t d16[8] = {}, m16[8] = {};
  // Writes the reference block k's 32 levels; called for the blocks no factor improved.
  void (*ref_levels)(const void* ctx, int k, int8_t* q) = nullptr;
  const void* ctx = nullptr;
  bool make_reference = false;

  uint32_t improved = 0;
  uint32_t referenced = 0;  // make_reference: the blocks whose results are out_d16 and levels
  uint16_t out_d16[8] = {}, out_m16[8] = {};
  alignas(32) int8_t levels[8][32] = {};
};
using QuickSearchFn = void (*)(QuickSearchBlocks& b);
// The kernel at the current level or the nearest level below it (the scalar level's is
// quick_search_ref, migrate/exact_requant.cc).
QuickSearchFn find_quick_search();
void quick_search_ref(QuickSearchBlocks& b);
// The kernel that also makes the reference blocks (make_reference above) at the current level or
// the nearest level below it that has one; nullptr at the scalar and NEON levels (there the caller
// makes the reference blocks of a row at once and runs find_quick_search's kernel).
QuickSearchFn find_quick_search_reference();

// The quick search for a source whose values are integer levels times its f16 scale (q8_0, q4_0,
// q5_0, iq4_nl: value i = n[i] * ds, exact in float) into q4_0 or q5_0 (levels lo..hi: -8..7,
// -16..15), up to 8 blocks at once, in integers where QuickSearchBlocks works in float. For each
// block k < n, whose scale ds must be finite and nonzero, exactly as level_search_ref does it:
//   - if every n[i] is in [lo, hi] the target holds the block exactly: its scale and levels are
//     the source's (bit k of `embedded`), as ExactRequantizer's embed_block finds;
//   - else the reference block is ggml's quantize_row_q4_0_ref / q5_0_ref of the values (in
//     float, as ggml: max the first value of largest |x|, d = max / lo, id = d ? 1 / d : 0, level
//     = min(trunc(x * id + 0.5 - lo), hi - lo) + lo), its scale D the f16 of d;
//   - a candidate (f16 scale D, levels m) has the exact error sum (n ds - m D)^2, computed in
//     double from the integer sums Snn = sum n^2, Snm = sum n m, Smm = sum m^2 (each product
//     below exact in double, so only the two additions round): t1 = (ds ds) Snn, t2 = (ds D) Snm,
//     t3 = (D D) Smm, E = (t1 - (t2 + t2)) + t3;
//   - a scale D's levels: with q = ds / D (float) and B = nearbyint(q * 2^15), m[i] =
//     min(max((n[i] B + 2^14) >> 15, lo), hi) (x86's pmulhrsw, aarch64's sqrdmulh); D is skipped
//     unless it is finite and nonzero, |q| < 1 and |B| <= 32767;
//   - nothing is done (the reference block stands) unless its E is finite and > 0 and its D finite
//     and nonzero; then the candidates in order, each kept when its E is below the best so far:
//     the f16 of D_ref * f for f in kQuickFactors, then the f16 of float(double(ds) * Snm /
//     Smm) with the best's sums (if Smm != 0: the least-squares scale of its levels).
// Writes each block's result to dst[k]. Every level gives the same bytes.
//
// An offset source (q4_1, q5_1: value i = float(n[i]) * ds + ms, n[i] in 0..T, T = 15 or 31, h =
// (T + 1) / 2; ds finite and nonzero, ms finite), block by block as level_search_ref does it:
//   - k = nearbyint(r), r = double(ms) / double(ds): if r == k and every n[i] + k is in [lo, hi],
//     the target holds the block exactly (bit k of `embedded`: scale ds, levels n + k, what
//     embed_block finds); if r != k, |r| <= 2^20 and |r - k| <= 2^-15 a float rounding could put
//     every value on a multiple of ds, and the block is declined (bit k of `declined`, dst[k] not
//     written: the caller's);
//   - the reference block is ggml's from the values x[i] (float(n) * ds + ms in float, as
//     to_f32): the values are monotone in n, so max is x at the smallest or the largest n,
//     whichever |x| is larger; a block where the two |x| are equal and the two x are not (ggml's
//     choice is then by index), or both 0, is declined;
//   - with c[i] = n[i] - h and mc = ms + h ds (double, exact), a candidate (f16 scale D, levels
//     m) has the error of the exact values n ds + ms, in double: A = ((ds ds) Scc + (t + t)) + (mc
//     mc) 32, t = (ds mc) Sc, s = (ds D) Scm + (mc D) Sm, E = (A - (s + s)) + (D D) Smm (Scc = sum
//     c^2, Sc = sum c, Scm = sum c m, Sm = sum m, Smm = sum m^2);
//   - a scale D's levels, with F = 11 (q4_1) or 10 (q5_1): q = ds / D (float), B = nearbyint(q
//     2^14), v = ((ms + float(h) * ds) / D) * 2^F (float) clamped to [-65536, 65536], C =
//     nearbyint(v) + 2^(F - 1) clamped to [-32768, 32767]; m[i] = min(max(sat16(((c[i] 2^(F + 1))
//     B + 2^14) >> 15) + C) >> F, lo), hi) (pmulhrsw, a saturating add, an arithmetic shift); D
//     is skipped unless it is finite and nonzero and |B| <= 32767;
//   - the candidates, their order and when the reference block stands as above; the fit is the
//     f16 of float((ds Scm + mc Sm) / Smm) (double) with the best's sums, if Smm != 0.
//
// An offset target (q4_1, q5_1: value t D + M, t in 0..T, T = 15 or 31, H = (T + 1) / 2), from any
// of those sources (c = n - hs: hs = 8 or 16 for q4_1 / q5_1, else 0; value c ds + mc, mc = ms + hs
// ds, ms = 0 for a symmetric source), block by block as offset_target_block (level_search.cc) does
// it; no block is embedded:
//   - declined (bit k of `declined`, dst[k] not written: the caller's embed_block, then its float
//     search) where the target may hold the block: its levels at most T apart, or (an offset
//     source) |ms| > 2^19 |ds| (ExactRequantizer::may_embed's two tests);
//   - the reference block is ggml's quantize_row_q4_1_ref / q5_1_ref of the values as to_f32 gives
//     them (float(n) ds, + ms): min and max are the values of the smallest and largest level, d =
//     (max - min) / T, id = d ? 1 / d : 0, level min(T, trunc((x - min) id + 0.5)) (q5_1: the low 5
//     bits, as its uint8_t packing keeps), D the f16 of d, M the f16 of min;
//   - a candidate (D, M, centred levels t' = t - H) has the error of the exact values, in double:
//     u = (mc - M) - H D, w = (ds u) Sc, A = ((ds ds) Scc + (w + w)) + (u u) 32, s = (ds D) Sct +
//     (u D) St, E = (A - (s + s)) + (D D) Stt (sums over c and t');
//   - a candidate's levels, with F = the smaller of the source's (11 for q4_0 / q4_1, 10 for q5_0 /
//     q5_1, 7 for q8_0 / iq4_nl) and the target's (11, 10): B = nearbyint((ds / D) 2^14), v =
//     (((centre - M) / D) - H) 2^F (float; centre = ms + float(hs) ds) clamped to [-65536, 65536],
//     C = nearbyint(v) + 2^(F - 1) clamped to [-32768, 32767]; t' = min(max(sat16(((c 2^(F + 1)) B
//     + 2^14) >> 15) + C) >> F, -H), T - H); skipped unless D is finite and nonzero, M finite and
//     |B| <= 32767;
//   - the search runs unless the reference's E is not finite or not > 0, or its D not finite and
//     nonzero, or its M not finite; the candidates: (the f16 of D_ref f, M_ref) for f in
//     kQuickFactors, then the least-squares line through the best's levels, det = 32 Stt - St^2
//     (if != 0), Sx = ds Sc + 32 mc, Sxt = ds Sct + mc St, D = (32 Sxt - St Sx) / det, M = (Sx - D
//     St) / 32 - H D (double), each the f16 of its float; each kept when its E is below the best's.
struct LevelSearchBlocks {
  int n = 0;  // blocks, 1..8
  GgmlType src_type = GgmlType::kQ8_0;  // q8_0, q4_0, q5_0, iq4_nl, q4_1 or q5_1
  GgmlType dst_type = GgmlType::kQ4_0;  // q4_0, q5_0, q4_1 or q5_1
  const std::byte* src[8] = {};         // the source blocks (their levels n: source_levels)
  std::byte* dst[8] = {};
  uint32_t embedded = 0;
  uint32_t declined = 0;  // offset sources and offset targets: the blocks not written
};
using LevelSearchFn = void (*)(LevelSearchBlocks& b);
// A q8_0, q4_0, q5_0 or iq4_nl block's 32 levels (iq4_nl: its table values; q4_1 and q5_1: the
// stored levels 0..T) as ggml's dequantize_row_* reads them, and a q4_0 or q5_0 block of scale
// d16 and levels q (which fit) packed (migrate/exact_requant.cc).
void source_levels(GgmlType t, const std::byte* block, int8_t* levels);
void target_block(GgmlType t, uint16_t d16, const int8_t* levels, std::byte* block);
// A q4_1 or q5_1 block of scale d16, offset m16 and levels 0..T packed.
void target_offset_block(GgmlType t, uint16_t d16, uint16_t m16, const int8_t* levels, std::byte* block);
// The kernel at the current level or the nearest level below it (the scalar level's is
// level_search_ref, migrate/level_search.cc).
LevelSearchFn find_level_search();
void level_search_ref(LevelSearchBlocks& b);

// What one SIMD level brings besides its row codecs (those are its column of the codec table
// in migrate/type_traits.cc). One row per Level in simd_kernels.cc's kLevels.
struct LevelKernels {
  Level level;
  HadamardFn hadamard;            // nullptr: the level below's
  uint32_t hadamard_min_n_rot;    // the smallest rotation block `hadamard` takes (a smaller one: the level below's)
  FindFusedFn find_fused;         // nullptr: no fused row kernels at this level
  MlxQuantizeFn mlx_quantize;     // MLX affine rows; nullptr: the level below's
  MlxDequantizeFn mlx_dequantize;
  FindEmbedQ8_0Fn find_embed_q8_0;  // nullptr: no direct-path kernels at this level
  RequantScore8Fn requant_score8;   // nullptr: the level below's
  QuickSearchFn quick_search;       // nullptr: the level below's
  QuickSearchFn quick_search_reference;  // make_reference's kernel; nullptr: the level below's (none at scalar)
  LevelSearchFn level_search;       // nullptr: the level below's
};
const LevelKernels& level_kernels(Level l);

// The Hadamard kernel for blocks of n_rot at the current level: the best level at or below it
// whose kernel takes n_rot (the scalar one takes every power of two >= 2).
HadamardFn find_hadamard(uint32_t n_rot);

// The MLX affine row kernels at the current level (or the nearest level below that has them).
MlxQuantizeFn find_mlx_quantize();
MlxDequantizeFn find_mlx_dequantize();

}  // namespace kvsnap::simd

#ifdef KVSNAP_SIMD_X86
namespace kvsnap::simd::x86 {

// AVX2 + FMA + F16C
void f16_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void f16_from_f32_avx2(const float* src, std::byte* dst, size_t n);
void bf16_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void bf16_from_f32_avx2(const float* src, std::byte* dst, size_t n);
void q4_0_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void q4_0_from_f32_avx2(const float* src, std::byte* dst, size_t n);
void q8_0_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void q8_0_from_f32_avx2(const float* src, std::byte* dst, size_t n);
void q4_1_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void q4_1_from_f32_avx2(const float* src, std::byte* dst, size_t n);
void q5_0_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void q5_0_from_f32_avx2(const float* src, std::byte* dst, size_t n);
void q5_1_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void q5_1_from_f32_avx2(const float* src, std::byte* dst, size_t n);
void iq4_nl_to_f32_avx2(const std::byte* src, float* dst, size_t n);
void iq4_nl_from_f32_avx2(const float* src, std::byte* dst, size_t n);
// best_index_int8(16, kvalues_iq4nl, x[i]) as the AVX2 iq4_nl kernel counts it, for n (a
// multiple of 8) non-NaN values (exposed for kvsnap-simd-check)
void iq4_nl_index_avx2(const float* x, uint8_t* idx, size_t n);
// The trial passes the AVX2 iq4_nl kernel runs for cnt (1..8) blocks of 32 values at x, as
// iq4_nl_trial_schedule_avx512 (below) with 8 lanes: trials[8 k + b] (exposed for kvsnap-simd-check)
int iq4_nl_trial_schedule_avx2(const float* x, size_t cnt, uint8_t* trials);
void hadamard_avx2(float* x, size_t n, uint32_t n_rot);  // n_rot >= 8

// q4_0 / q5_0 / iq4_nl -> q8_0 blocks for ExactRequantizer's direct path (EmbedQ8_0Fn above)
EmbedQ8_0Fn find_embed_q8_0_avx2(GgmlType src);
// ExactRequantizer's scale search, 8 candidates in the lanes (RequantScore8Fn above)
bool requant_score8_avx2(const float* x, float m, const float* d, int lo, int hi, RequantGrid grid, double best_err,
                         double* e, int32_t* levels, bool* ok);
// ExactRequantizer's quick search, 8 blocks in the lanes (QuickSearchFn above; x86_avx2_requant.cc)
void quick_search_avx2(QuickSearchBlocks& b);
// The same kernel compiled with AVX-512VL's 32 registers, the avx512 level's
void quick_search_avx2_vl(QuickSearchBlocks& b);
// Both with make_reference (x86_avx2_requant.cc)
void quick_search_reference_avx2(QuickSearchBlocks& b);
void quick_search_reference_avx2_vl(QuickSearchBlocks& b);
// The integer quick search, 8 blocks (LevelSearchFn above; x86_avx2_level_search.cc), and the
// same kernel compiled for the avx512 level
void level_search_avx2(LevelSearchBlocks& b);
void level_search_avx2_vl(LevelSearchBlocks& b);

// roundf(x[i]) converted to int32 the way the AVX2 quantizers compute it (exposed for
// kvsnap-simd-check's exhaustive comparison with roundf), n a multiple of 8.
void roundf_i32_avx2(const float* x, int32_t* out, size_t n);

// f16 -> q8_0 / q4_0 / q4_1 / q5_0 / q5_1 with rotation, q8_0 -> f16 with rotation (n_rot 64,
// 128, 256); the other conversions at this level take the three steps (each an AVX2 kernel)
FusedRowFn find_fused_avx2(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot);
// The AVX2 fused rows compiled for the avx512 level where they beat its own (f16 -> q8_0 at
// n_rot 64, 128, 256; q8_0 -> f16 at n_rot 64), else nullptr.
FusedRowFn find_fused_avx2_vl(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot);

// MLX affine quantization (migrate/mlx_affine.h): mlx_affine_quantize_row and
// mlx_affine_dequantize_row, the same bytes and floats (kernels/x86_avx2_mlx.cc)
void mlx_affine_quantize_row_avx2(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                                  std::byte* codes, float* scales, float* biases);
void mlx_affine_dequantize_row_avx2(const std::byte* codes, const float* scales, const float* biases, int64_t dim,
                                    int bits, int group_size, MlxFloat t, float* out);

// AVX-512 F/BW/DQ/VL (+ F16C)
void f16_to_f32_avx512(const std::byte* src, float* dst, size_t n);
void f16_from_f32_avx512(const float* src, std::byte* dst, size_t n);
void q4_0_from_f32_avx512(const float* src, std::byte* dst, size_t n);
void q8_0_from_f32_avx512(const float* src, std::byte* dst, size_t n);
void iq4_nl_from_f32_avx512(const float* src, std::byte* dst, size_t n);
void hadamard_avx512(float* x, size_t n, uint32_t n_rot);  // n_rot >= 16

// best_index_int8(16, kvalues_iq4nl, x[i]) for n (a multiple of 16) non-NaN values, the way the
// iq4_nl kernel computes it (exposed for kvsnap-simd-check's exhaustive comparison).
void iq4_nl_index_avx512(const float* x, uint8_t* idx, size_t n);
// The same for values in [-128, 128), by the kernel's other bucketing (width 8, no multiply).
void iq4_nl_index_within128_avx512(const float* x, uint8_t* idx, size_t n);

// The iq4_nl trial scales (itry + kvalues_iq4nl[0]) / max, itry = -7..7, for n (a multiple of 16)
// finite nonzero maxima, the way the kernel computes them: for maxima max[i..i+15], id[15 i + 16 k
// + l] is trial k (itry = k - 7) of max[i + l]. Exposed for kvsnap-simd-check, which compares
// them with the division.
void iq4_nl_trial_ids_avx512(const float* max, float* id, size_t n);

// The trial passes the iq4_nl kernel runs for one chunk of cnt (8..16) blocks of 32 values at
// x: trials[16 k + b] = the trial (1..15, itry = trial - 8) of step k of block b, for k < the
// returned number of steps, or 0 once the steps of the block's half of the lanes are done;
// blocks that do not search (all zero, inf/NaN) have 0s. Exposed for
// kvsnap-simd-check, which checks that every trial whose indices differ from the trial before
// is among them, in order.
int iq4_nl_trial_schedule_avx512(const float* x, size_t cnt, uint8_t* trials);

// f16 -> q8_0 / q4_0 with rotation, q8_0 -> f16 with rotation (n_rot 64, 128, 256), q4_0 -> q8_0,
// f16 -> iq4_nl with rotation (n_rot 64, 128, 256) or without
FusedRowFn find_fused_avx512(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot);

}  // namespace kvsnap::simd::x86
#endif

#ifdef KVSNAP_SIMD_NEON
namespace kvsnap::simd::arm {

// aarch64 Advanced SIMD (kernels/arm_common.h says why each gives the reference's bytes)
void f16_to_f32_neon(const std::byte* src, float* dst, size_t n);
void f16_from_f32_neon(const float* src, std::byte* dst, size_t n);
void bf16_to_f32_neon(const std::byte* src, float* dst, size_t n);
void bf16_from_f32_neon(const float* src, std::byte* dst, size_t n);
void q4_0_to_f32_neon(const std::byte* src, float* dst, size_t n);
void q4_0_from_f32_neon(const float* src, std::byte* dst, size_t n);
void q4_1_to_f32_neon(const std::byte* src, float* dst, size_t n);
void q4_1_from_f32_neon(const float* src, std::byte* dst, size_t n);
void q5_0_to_f32_neon(const std::byte* src, float* dst, size_t n);
void q5_0_from_f32_neon(const float* src, std::byte* dst, size_t n);
void q5_1_to_f32_neon(const std::byte* src, float* dst, size_t n);
void q5_1_from_f32_neon(const float* src, std::byte* dst, size_t n);
void q8_0_to_f32_neon(const std::byte* src, float* dst, size_t n);
void q8_0_from_f32_neon(const float* src, std::byte* dst, size_t n);
void iq4_nl_to_f32_neon(const std::byte* src, float* dst, size_t n);
void iq4_nl_from_f32_neon(const float* src, std::byte* dst, size_t n);  // kernels/arm_neon_iq4_nl.cc
void hadamard_neon(float* x, size_t n, uint32_t n_rot);  // n_rot >= 4
// ExactRequantizer's quick search, 4 blocks in the lanes (QuickSearchFn above; arm_neon_requant.cc)
void quick_search_neon(QuickSearchBlocks& b);
// The integer quick search, 8 blocks (LevelSearchFn above; arm_neon_level_search.cc)
void level_search_neon(LevelSearchBlocks& b);

// MLX affine quantization (migrate/mlx_affine.h): mlx_affine_quantize_row and
// mlx_affine_dequantize_row, the same bytes and floats (kernels/arm_neon_mlx.cc)
void mlx_affine_quantize_row_neon(const float* x, int64_t dim, int bits, int group_size, MlxDevice device,
                                  std::byte* codes, float* scales, float* biases);
void mlx_affine_dequantize_row_neon(const std::byte* codes, const float* scales, const float* biases, int64_t dim,
                                    int bits, int group_size, MlxFloat t, float* out);

}  // namespace kvsnap::simd::arm
#endif
