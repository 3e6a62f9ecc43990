// Which instruction set kvsnap's CPU-specific code uses: the one decision every layer follows.
//
// Decided once per process: the best level the CPU (and build) has (__builtin_cpu_supports on
// x86-64; NEON is part of every aarch64 CPU), lowered by the environment variable
// KVSNAP_SIMD=scalar|avx2|avx512|neon (read at first use; a name the CPU cannot run is ignored)
// or by set_level() (tests, the benchmarks' --simd). Every SIMD path reads level() when it
// picks a kernel, so forcing a level forces it everywhere:
//   migrate/  the row codecs (type_traits.cc's codec table, a column per level) and the
//             Hadamard, fused and MLX affine kernels (migrate/simd_kernels.h's level table)
//   format/   the chunk byte shuffle and unshuffle (format/byte_shuffle.h), and the chunks'
//             XXH3-128 (format/chunk_xxh_avx2.h at avx2 and avx512, libxxhash below)
// Every level produces the same bytes: a level changes speed only. Each table holds its own
// kernels; this header only says which column of them is in use.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

// The ISA families this build has kernels for (a build for one architecture has one chain).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSNAP_SIMD_X86 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define KVSNAP_SIMD_NEON 1
#endif

namespace kvsnap::simd {

enum class Level : int {
  kScalar = 0,  // portable C++ only (in migrate/, the literal transcriptions of ggml's reference code)
  kAvx2 = 1,    // AVX2 + FMA + F16C (x86-64-v3)
  kAvx512 = 2,  // AVX-512 F/BW/DQ/VL + F16C (x86-64-v4)
  kNeon = 3,    // aarch64 Advanced SIMD (every aarch64 CPU has it)
};
// Levels form one chain per ISA family, each resting on the scalar level: scalar < avx2 < avx512
// on x86-64, scalar < neon on aarch64. A level includes the ones below it in its chain, and a
// kernel missing at a level is fallback(level)'s. A build for one architecture supports only
// the levels of its chain (set_level refuses the others).
// A new level: an enumerator here (and kLevelCount, fallback(), its name and detection in
// simd_level.cc), then a row or column in each kernel table named above (docs/conversion.md).
inline constexpr size_t kLevelCount = 4;

// The level whose kernel serves where `l` has none: the one below it in its chain.
constexpr Level fallback(Level l) {
  switch (l) {
    case Level::kAvx512: return Level::kAvx2;
    default: return Level::kScalar;  // avx2, neon: the bottom of their chains
  }
}

// The level in use (the best the CPU has, unless lowered). Cheap: one relaxed atomic load.
Level level();
// The best level this CPU (and build) supports.
Level best_level();
// Whether this CPU (and build) can run level l: the scalar level, and best_level() and the
// levels below it in its chain.
bool supported(Level l);
// Sets the level for the whole process; false (and no change) when the CPU does not support it.
bool set_level(Level l);
// "scalar", "avx2", "avx512", "neon"; false for an unknown name or an unsupported level.
bool set_level(std::string_view name);
const char* level_name(Level l);
// The CPU features seen, e.g. "x86-64: avx2 f16c avx512f avx512bw avx512dq avx512vl (512-bit operations at
// full width)", "aarch64: neon".
std::string describe();

// Whether this CPU splits a 512-bit vector operation into two 256-bit halves: AMD Zen 4 (family
// 0x19 with AVX-512) does; Intel's AVX-512 cores and Zen 5 run it at full width. The avx512 level
// picks its q8_0 rows by it (migrate/kernels/x86_avx512.cc, find_fused_avx512): AVX2 code with
// AVX-512VL's registers on halves, 512-bit code at full width; both write the same bytes.
// KVSNAP_AVX512_HALVES=1|0 (read at first use) or set_avx512_in_halves() overrides the detection
// (kvsnap-simd-check proves both choices' bytes on any AVX-512 CPU; the benches compare them).
bool avx512_in_halves();
void set_avx512_in_halves(bool halves);

// The CPU's family when it is AMD's (CPUID leaf 1: the base family plus the extended one;
// 0x19 Zen 3 and Zen 4, 0x1A Zen 5), 0 on any other CPU or architecture. For choices that
// were measured on one microarchitecture and not on others (avx512_in_halves above, the
// SHA-256 kernel of base/sha256_lanes.h).
unsigned amd_family();

}  // namespace kvsnap::simd
