// Which instruction set the row kernels use (the codec table of migrate/type_traits.cc, the
// Hadamard, fused and MLX affine kernels of simd_level.cc's level table).
//
// Every level produces the same bytes and floats: the SIMD kernels (migrate/simd_kernels.h)
// perform the reference's float operations in the reference's order, lane by lane, and fall
// back to the scalar transcription for the blocks where a vector shortcut could differ (NaN/inf inputs).
// The level only changes speed. It is picked once from the CPU (__builtin_cpu_supports on x86-64;
// NEON is part of every aarch64 CPU), can be lowered with the environment variable
// KVSNAP_SIMD=scalar|avx2|avx512|neon (read at first use), or with set_level() (tests, the benchmark).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvsnap::simd {

enum class Level : int {
  kScalar = 0,  // the literal transcriptions of ggml's reference code
  kAvx2 = 1,    // AVX2 + FMA + F16C (x86-64-v3)
  kAvx512 = 2,  // AVX-512 F/BW/DQ/VL + F16C (x86-64-v4)
  kNeon = 3,    // aarch64 Advanced SIMD (every aarch64 CPU has it)
};
// Levels form one chain per ISA family, each resting on the scalar level: scalar < avx2 < avx512
// on x86-64, scalar < neon on aarch64. A level includes the ones below it in its chain, and a
// kernel missing at a level is fallback(level)'s. A build for one architecture supports only
// the levels of its chain (set_level refuses the others).
// A new level: an enumerator here (and kLevelCount, fallback()), its row in simd_level.cc's
// kLevels (name, detection, Hadamard/fused/MLX affine kernels), its column in
// migrate/type_traits.cc's codec table.
inline constexpr size_t kLevelCount = 4;

// The level whose kernel serves where `l` has none: the one below it in its chain.
constexpr Level fallback(Level l) {
  switch (l) {
    case Level::kAvx512: return Level::kAvx2;
    default: return Level::kScalar;  // avx2, neon: the bottom of their chains
  }
}

// The level in use (the best the CPU has, unless lowered).
Level level();
// The best level this CPU (and build) supports.
Level best_level();
// Whether this CPU (and build) can run level l: the scalar level, and best_level() and the
// levels below it in its chain.
bool supported(Level l);
// Sets the level; false (and no change) when the CPU does not support it.
bool set_level(Level l);
// "scalar", "avx2", "avx512", "neon"; false for an unknown name or an unsupported level.
bool set_level(std::string_view name);
const char* level_name(Level l);
// The CPU features seen, e.g. "x86-64: avx2 f16c avx512f avx512bw avx512dq avx512vl", "aarch64: neon".
std::string describe();

}  // namespace kvsnap::simd
