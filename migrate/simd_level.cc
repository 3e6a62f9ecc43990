#include "migrate/simd_level.h"

#include "migrate/simd_kernels.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

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
  return Level::kScalar;
}

bool parse(std::string_view name, Level* out) {
  if (name == "scalar") *out = Level::kScalar;
  else if (name == "avx2") *out = Level::kAvx2;
  else if (name == "avx512") *out = Level::kAvx512;
  else return false;
  return true;
}

std::atomic<int>& current() {
  static std::atomic<int> lvl = [] {
    Level l = best_level();
    if (const char* env = std::getenv("KVSNAP_SIMD")) {
      Level want;
      if (parse(env, &want) && static_cast<int>(want) < static_cast<int>(l)) l = want;
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

bool set_level(Level l) {
  if (static_cast<int>(l) > static_cast<int>(best_level())) return false;
  current().store(static_cast<int>(l), std::memory_order_relaxed);
  return true;
}

bool set_level(std::string_view name) {
  Level l;
  return parse(name, &l) && set_level(l);
}

const char* level_name(Level l) {
  switch (l) {
    case Level::kScalar: return "scalar";
    case Level::kAvx2: return "avx2";
    case Level::kAvx512: return "avx512";
  }
  return "?";
}

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
#else
  return "no x86-64 SIMD in this build";
#endif
}

FusedRowFn find_fused(GgmlType src, GgmlType dst, bool rotate, uint32_t n_rot) {
#ifdef KVSNAP_SIMD_X86
  if (level() == Level::kAvx512) return x86::find_fused_avx512(src, dst, rotate, n_rot);
#endif
  (void)src, (void)dst, (void)rotate, (void)n_rot;
  return nullptr;
}

}  // namespace kvsnap::simd
