#include "migrate/simd_level.h"

#include "migrate/simd_kernels.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace kvsnap::simd {
namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// F16C (CPUID.1:ECX bit 29); not every compiler's __builtin_cpu_supports knows it. Its registers
// are the AVX ones, whose OS support the "avx2" check below includes.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

Level detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512) return Level::kAvx512;
  if (avx2) return Level::kAvx2;
#endif
#ifdef KVSNAP_SIMD_NEON
  return Level::kNeon;  // Advanced SIMD is mandatory in ARMv8-A (and the kernels use nothing beyond it)
#endif
  return Level::kScalar;
}

// ---- the level table: one row per Level, lowest first ----------------------------------------
// A new level (e.g. NEON): its enumerator in simd_level.h, its row here, its detection in
// detect(), its column in the codec table (migrate/type_traits.cc), its kernels in
// migrate/kernels/ declared in simd_kernels.h.
#ifdef KVSNAP_SIMD_X86
#define KVSNAP_X86(fn) x86::fn
#else
#define KVSNAP_X86(fn) nullptr  // never selected: detect() finds no x86 level in such a build
#endif
#ifdef KVSNAP_SIMD_NEON
#define KVSNAP_ARM(fn) arm::fn
#else
#define KVSNAP_ARM(fn) nullptr  // never selected: detect() finds no ARM level in such a build
#endif
constexpr LevelKernels kLevels[] = {
    //  level          name      Hadamard kernel               min n_rot  fused row kernels
    //                 MLX affine quantize, dequantize
    {Level::kScalar, "scalar", hadamard_ref::rotate, 2, nullptr,  //
     mlx_affine_quantize_row_ref, mlx_affine_dequantize_row_ref},
    {Level::kAvx2, "avx2", KVSNAP_X86(hadamard_avx2), 8, KVSNAP_X86(find_fused_avx2),  //
     KVSNAP_X86(mlx_affine_quantize_row_avx2), KVSNAP_X86(mlx_affine_dequantize_row_avx2)},
    {Level::kAvx512, "avx512", KVSNAP_X86(hadamard_avx512), 16, KVSNAP_X86(find_fused_avx512),  //
     nullptr, nullptr},  // no AVX-512 MLX kernels: AVX2's serve
    {Level::kNeon, "neon", KVSNAP_ARM(hadamard_neon), 4, nullptr,  //
     KVSNAP_ARM(mlx_affine_quantize_row_neon), KVSNAP_ARM(mlx_affine_dequantize_row_neon)},
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

bool parse(std::string_view name, Level* out) {
  for (const LevelKernels& k : kLevels) {
    if (name == k.name) {
      *out = k.level;
      return true;
    }
  }
  return false;
}

std::atomic<int>& current() {
  static std::atomic<int> lvl = [] {
    Level l = best_level();
    if (const char* env = std::getenv("KVSNAP_SIMD")) {
      Level want;
      if (parse(env, &want) && supported(want)) l = want;
    }
    return static_cast<int>(l);
  }();
  return lvl;
}

}  // namespace

Level best_level() {
  static const Level best = detect();
  return best;
}

Level level() { return static_cast<Level>(current().load(std::memory_order_relaxed)); }

bool supported(Level l) {
  for (Level k = best_level();; k = fallback(k)) {
    if (k == l) return true;
    if (k == Level::kScalar) return false;
  }
}

bool set_level(Level l) {
  if (!supported(l)) return false;
  current().store(static_cast<int>(l), std::memory_order_relaxed);
  return true;
}

bool set_level(std::string_view name) {
  Level l;
  return parse(name, &l) && set_level(l);
}

const char* level_name(Level l) {
  const size_t i = static_cast<size_t>(l);
  return i < kLevelCount ? kLevels[i].name : "?";
}

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

MlxQuantizeFn find_mlx_quantize() { return find_in_chain(&LevelKernels::mlx_quantize); }
MlxDequantizeFn find_mlx_dequantize() { return find_in_chain(&LevelKernels::mlx_dequantize); }

std::string describe() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  std::string s = "x86-64:";
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl"}) {
    bool has = false;
    if (!std::strcmp(f, "avx2")) has = __builtin_cpu_supports("avx2");
    if (!std::strcmp(f, "fma")) has = __builtin_cpu_supports("fma");
    if (!std::strcmp(f, "f16c")) has = has_f16c();
    if (!std::strcmp(f, "avx512f")) has = __builtin_cpu_supports("avx512f");
    if (!std::strcmp(f, "avx512bw")) has = __builtin_cpu_supports("avx512bw");
    if (!std::strcmp(f, "avx512dq")) has = __builtin_cpu_supports("avx512dq");
    if (!std::strcmp(f, "avx512vl")) has = __builtin_cpu_supports("avx512vl");
    if (has) s += std::string(" ") + f;
  }
  return s;
#elif defined(KVSNAP_SIMD_NEON)
  return "aarch64: neon";
#else
  return "no SIMD kernels in this build";
#endif
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
