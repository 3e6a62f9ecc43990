// The level table: which Hadamard, fused-row and MLX affine kernels each simd::Level brings
// (base/simd_level.h decides the level; the row codecs are type_traits.cc's codec table).
#include "migrate/simd_kernels.h"

#include <iterator>

namespace kvsnap::simd {
namespace {

// ---- the level table: one row per Level, lowest first ----------------------------------------
// A new level: its enumerator, name and detection in base/simd_level.{h,cc}, its row here, its
// column in the codec table (migrate/type_traits.cc), its kernels in migrate/kernels/ declared in
// simd_kernels.h.
#ifdef KVSNAP_SIMD_X86
#define KVSNAP_X86(fn) x86::fn
#else
#define KVSNAP_X86(fn) nullptr  // never selected: no x86 level is supported in such a build
#endif
#ifdef KVSNAP_SIMD_NEON
#define KVSNAP_ARM(fn) arm::fn
#else
#define KVSNAP_ARM(fn) nullptr  // never selected: no ARM level is supported in such a build
#endif
constexpr LevelKernels kLevels[] = {
    //  level          Hadamard kernel               min n_rot  fused row kernels
    //                 MLX affine quantize, dequantize, requantizer's direct path and search
    {Level::kScalar, hadamard_ref::rotate, 2, nullptr,  //
     mlx_affine_quantize_row_ref, mlx_affine_dequantize_row_ref, nullptr, requant_score8_ref, quick_search_ref,
     nullptr, level_search_ref},
    {Level::kAvx2, KVSNAP_X86(hadamard_avx2), 8, KVSNAP_X86(find_fused_avx2),  //
     KVSNAP_X86(mlx_affine_quantize_row_avx2), KVSNAP_X86(mlx_affine_dequantize_row_avx2),
     KVSNAP_X86(find_embed_q8_0_avx2), KVSNAP_X86(requant_score8_avx2), KVSNAP_X86(quick_search_avx2),
     KVSNAP_X86(quick_search_reference_avx2), KVSNAP_X86(level_search_avx2)},
    {Level::kAvx512, KVSNAP_X86(hadamard_avx512), 16, KVSNAP_X86(find_fused_avx512),  //
     nullptr, nullptr, nullptr, nullptr,  // no AVX-512 MLX, direct-path or full-search kernels: AVX2's serve
     KVSNAP_X86(quick_search_avx2_vl), KVSNAP_X86(quick_search_reference_avx2_vl), KVSNAP_X86(level_search_avx2_vl)},
    {Level::kNeon, KVSNAP_ARM(hadamard_neon), 4, nullptr,  //
     KVSNAP_ARM(mlx_affine_quantize_row_neon), KVSNAP_ARM(mlx_affine_dequantize_row_neon), nullptr, nullptr,
     KVSNAP_ARM(quick_search_neon), nullptr, KVSNAP_ARM(level_search_neon)},
};
#undef KVSNAP_X86
#undef KVSNAP_ARM
static_assert(std::size(kLevels) == kLevelCount, "one row per simd::Level");
constexpr bool levels_in_order() {
  for (size_t i = 0; i < kLevelCount; i++) {
    if (static_cast<size_t>(kLevels[i].level) != i) return false;
  }
  return true;
}
static_assert(levels_in_order(), "kLevels: row i is Level i (the scalar row, complete, ends every fallback)");

}  // namespace

const LevelKernels& level_kernels(Level l) { return kLevels[static_cast<size_t>(l)]; }

HadamardFn find_hadamard(uint32_t n_rot) {
  for (Level l = level(); l != Level::kScalar; l = fallback(l)) {
    const LevelKernels& k = kLevels[static_cast<size_t>(l)];
    if (k.hadamard && n_rot >= k.hadamard_min_n_rot) return k.hadamard;
  }
  return kLevels[0].hadamard;
}

// The first kernel of the chain from the current level down; the scalar row has every one.
template <class Fn>
Fn find_in_chain(Fn LevelKernels::*field) {
  for (Level l = level();; l = fallback(l)) {
    if (Fn fn = kLevels[static_cast<size_t>(l)].*field) return fn;
  }
}

LevelSearchFn find_level_search() { return find_in_chain(&LevelKernels::level_search); }
MlxQuantizeFn find_mlx_quantize() { return find_in_chain(&LevelKernels::mlx_quantize); }
MlxDequantizeFn find_mlx_dequantize() { return find_in_chain(&LevelKernels::mlx_dequantize); }

RequantScore8Fn find_requant_score8() { return find_in_chain(&LevelKernels::requant_score8); }
QuickSearchFn find_quick_search() { return find_in_chain(&LevelKernels::quick_search); }
QuickSearchFn find_quick_search_reference() {
  for (Level l = level(); l != Level::kScalar; l = fallback(l)) {
    if (QuickSearchFn fn = level_kernels(l).quick_search_reference) return fn;
  }
  return nullptr;
}

EmbedQ8_0Fn find_embed_q8_0(GgmlType src) {
  for (Level l = level(); l != Level::kScalar; l = fallback(l)) {
    const FindEmbedQ8_0Fn find = level_kernels(l).find_embed_q8_0;
    if (EmbedQ8_0Fn fn = find ? find(src) : nullptr) return fn;
  }
  return nullptr;
}

// The current level's fused kernel, else the one of a level below (AVX-512 has no fused
// f16 -> q4_1/q5_x of its own; AVX2's beats the three-step path at any level above it).
FusedRowFn find_fused(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot) {
  for (Level l = level(); l != Level::kScalar; l = fallback(l)) {
    const FindFusedFn find = level_kernels(l).find_fused;
    if (FusedRowFn fn = find ? find(src, dst, rotate, n_rot) : nullptr) return fn;
  }
  return nullptr;
}

}  // namespace kvsnap::simd
