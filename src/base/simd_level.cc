#include "base/simd_level.h"

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <utility>

#ifdef KVSNAP_SIMD_X86
#include <cpuid.h>
#endif

namespace kvsnap::simd {
namespace {

// Indexed by Level: KVSNAP_SIMD=<name>, kvsnap-bench --simd <name>, kvsnap-store-bench --simd <name>.
constexpr const char* kNames[] = {"scalar", "avx2", "avx512", "neon"};
static_assert(std::size(kNames) == kLevelCount, "one name per simd::Level");

#ifdef KVSNAP_SIMD_X86
// F16C (CPUID.1:ECX bit 29); not every compiler's __builtin_cpu_supports knows it. Its registers
// are the AVX ones, whose OS support the "avx2" check below includes.
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

Level detect() {
#ifdef KVSNAP_SIMD_X86
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

bool parse(std::string_view name, Level* out) {
  for (size_t i = 0; i < kLevelCount; i++) {
    if (name == kNames[i]) {
      *out = static_cast<Level>(i);
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

#ifdef KVSNAP_SIMD_X86
// CPUID.0's vendor "AuthenticAMD", CPUID.1:EAX's family (base 0xF plus the extended family).
unsigned detect_amd_family() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "Auth" "enti" "cAMD"
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const unsigned base = (a >> 8) & 0xF;
  return base == 0xF ? base + ((a >> 20) & 0xFF) : base;
}
#endif

std::atomic<bool>& in_halves() {
  static std::atomic<bool> halves = [] {
    bool h = amd_family() == 0x19;  // Zen 3 and Zen 4; of those only Zen 4 has AVX-512
    if (const char* env = std::getenv("KVSNAP_AVX512_HALVES")) {
      if (std::string_view(env) == "1") h = true;
      if (std::string_view(env) == "0") h = false;
    }
    return h;
  }();
  return halves;
}

}  // namespace

unsigned amd_family() {
#ifdef KVSNAP_SIMD_X86
  static const unsigned family = detect_amd_family();
  return family;
#else
  return 0;
#endif
}

bool avx512_in_halves() { return in_halves().load(std::memory_order_relaxed); }
void set_avx512_in_halves(bool halves) { in_halves().store(halves, std::memory_order_relaxed); }

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
  return i < kLevelCount ? kNames[i] : "?";
}

std::string describe() {
#if defined(KVSNAP_SIMD_X86)
  __builtin_cpu_init();
  // __builtin_cpu_supports takes only a string literal, hence one line per feature.
  const std::pair<const char*, bool> features[] = {
      {"avx2", __builtin_cpu_supports("avx2")},         {"fma", __builtin_cpu_supports("fma")},
      {"f16c", has_f16c()},                             {"avx512f", __builtin_cpu_supports("avx512f")},
      {"avx512bw", __builtin_cpu_supports("avx512bw")}, {"avx512dq", __builtin_cpu_supports("avx512dq")},
      {"avx512vl", __builtin_cpu_supports("avx512vl")},
  };
  std::string s = "x86-64:";
  for (const auto& [name, has] : features) {
    if (has) s += std::string(" ") + name;
  }
  if (__builtin_cpu_supports("avx512f")) {
    s += avx512_in_halves() ? " (512-bit operations in two halves)" : " (512-bit operations at full width)";
  }
  return s;
#elif defined(KVSNAP_SIMD_NEON)
  return "aarch64: neon";
#else
  return "no SIMD kernels in this build";
#endif
}

}  // namespace kvsnap::simd
