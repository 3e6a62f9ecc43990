#include "format/byte_shuffle.h"

#include <cstring>
#include <iterator>
#include <vector>

#include "base/simd_level.h"

#ifdef KVSNAP_SIMD_X86
#include <immintrin.h>
#endif
#ifdef KVSNAP_SIMD_NEON
#include <arm_neon.h>
#endif

namespace kvsnap {
namespace {

// ---- kernels: each does a prefix of the elements and returns how many; the portable loops
// below finish the rest (and do all of it at the scalar level).

#ifdef KVSNAP_SIMD_X86
// 32 f16/bf16 elements at a time into their low and high bytes (the hot path of encoding f16
// chunks: the portable loop was ~15% of an encode).
__attribute__((target("avx2"))) size_t shuffle2_avx2(const std::byte* src, size_t n, std::byte* p0, std::byte* p1) {
  const __m256i low = _mm256_set1_epi16(0x00FF);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i + 32));
    // packus works within 128-bit lanes (a0 b0 | a1 b1); 0xD8 puts the quarters in order (a0 a1 b0 b1).
    const __m256i lo = _mm256_packus_epi16(_mm256_and_si256(a, low), _mm256_and_si256(b, low));
    const __m256i hi = _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p0 + i), _mm256_permute4x64_epi64(lo, 0xD8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p1 + i), _mm256_permute4x64_epi64(hi, 0xD8));
  }
  return i;
}

// Two planes interleaved 32 elements at a time (the hot path of decoding f16 chunks; measured
// 1.7-2x the 16-byte SSE2 loop on pieces in cache).
__attribute__((target("avx2"))) size_t unshuffle2_avx2(const std::byte* p0, const std::byte* p1, size_t m,
                                                        std::byte* dst) {
  size_t i = 0;
  for (; i + 32 <= m; i += 32) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + i));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1 + i));
    // unpack works within 128-bit lanes: a = elements 0-7 | 16-23, b = 8-15 | 24-31.
    const __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i), _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i + 32), _mm256_permute2x128_si256(a, b, 0x31));
  }
  return i;
}

// Four planes (f32) interleaved 32 elements at a time.
__attribute__((target("avx2"))) size_t unshuffle4_avx2(const std::byte* const* q, size_t m, std::byte* dst) {
  size_t i = 0;
  for (; i + 32 <= m; i += 32) {
    // (no lambda for the loads: it would not inherit the target attribute)
    const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[0] + i));
    const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[1] + i));
    const __m256i p2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[2] + i));
    const __m256i p3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[3] + i));
    // Within 128-bit lanes: a = bytes 0,1 of elements 0-7 | 16-23, b = of 8-15 | 24-31 (c, d: bytes 2,3).
    const __m256i a = _mm256_unpacklo_epi8(p0, p1), b = _mm256_unpackhi_epi8(p0, p1);
    const __m256i c = _mm256_unpacklo_epi8(p2, p3), d = _mm256_unpackhi_epi8(p2, p3);
    // Whole elements: e0 = 0-3 | 16-19, e1 = 4-7 | 20-23, e2 = 8-11 | 24-27, e3 = 12-15 | 28-31.
    const __m256i e0 = _mm256_unpacklo_epi16(a, c), e1 = _mm256_unpackhi_epi16(a, c);
    const __m256i e2 = _mm256_unpacklo_epi16(b, d), e3 = _mm256_unpackhi_epi16(b, d);
    __m256i* o = reinterpret_cast<__m256i*>(dst + 4 * i);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(e0, e1, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(e2, e3, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(e0, e1, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(e2, e3, 0x31));
  }
  return i;
}
#endif

#ifdef KVSNAP_SIMD_NEON
// vld2q/vst2q/vst4q (de)interleave 2 or 4 byte streams in one instruction.
size_t shuffle2_neon(const std::byte* src, size_t n, std::byte* p0, std::byte* p1) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const uint8x16x2_t v = vld2q_u8(reinterpret_cast<const uint8_t*>(src + 2 * i));
    vst1q_u8(reinterpret_cast<uint8_t*>(p0 + i), v.val[0]);
    vst1q_u8(reinterpret_cast<uint8_t*>(p1 + i), v.val[1]);
  }
  return i;
}

size_t unshuffle2_neon(const std::byte* p0, const std::byte* p1, size_t m, std::byte* dst) {
  size_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const uint8x16x2_t v = {{vld1q_u8(reinterpret_cast<const uint8_t*>(p0 + i)),
                             vld1q_u8(reinterpret_cast<const uint8_t*>(p1 + i))}};
    vst2q_u8(reinterpret_cast<uint8_t*>(dst + 2 * i), v);
  }
  return i;
}

size_t unshuffle4_neon(const std::byte* const* q, size_t m, std::byte* dst) {
  size_t i = 0;
  for (; i + 16 <= m; i += 16) {
    auto load = [&](int b) { return vld1q_u8(reinterpret_cast<const uint8_t*>(q[b] + i)); };
    const uint8x16x4_t v = {{load(0), load(1), load(2), load(3)}};
    vst4q_u8(reinterpret_cast<uint8_t*>(dst + 4 * i), v);
  }
  return i;
}
#endif

// ---- the kernels of each simd::Level (nullptr: the level below's; the scalar row has none) ----
struct ShuffleKernels {
  simd::Level level;
  size_t (*shuffle2)(const std::byte* src, size_t n, std::byte* p0, std::byte* p1);
  size_t (*unshuffle2)(const std::byte* p0, const std::byte* p1, size_t m, std::byte* dst);
  size_t (*unshuffle4)(const std::byte* const* planes, size_t m, std::byte* dst);
};
#ifdef KVSNAP_SIMD_X86
#define KVSNAP_X86(fn) fn
#else
#define KVSNAP_X86(fn) nullptr  // never selected: no x86 level is supported in such a build
#endif
#ifdef KVSNAP_SIMD_NEON
#define KVSNAP_ARM(fn) fn
#else
#define KVSNAP_ARM(fn) nullptr  // never selected: no ARM level is supported in such a build
#endif
constexpr ShuffleKernels kKernels[] = {
    {simd::Level::kScalar, nullptr, nullptr, nullptr},
    {simd::Level::kAvx2, KVSNAP_X86(shuffle2_avx2), KVSNAP_X86(unshuffle2_avx2), KVSNAP_X86(unshuffle4_avx2)},
    {simd::Level::kAvx512, nullptr, nullptr, nullptr},  // AVX2's: the loops are bound by memory, not width
    {simd::Level::kNeon, KVSNAP_ARM(shuffle2_neon), KVSNAP_ARM(unshuffle2_neon), KVSNAP_ARM(unshuffle4_neon)},
};
#undef KVSNAP_X86
#undef KVSNAP_ARM
static_assert(std::size(kKernels) == simd::kLevelCount, "one row per simd::Level");

// The current level's kernel for `field`, else the nearest level's below it; nullptr at the bottom.
template <class Fn>
Fn find(Fn ShuffleKernels::*field) {
  for (simd::Level l = simd::level(); l != simd::Level::kScalar; l = simd::fallback(l)) {
    if (Fn fn = kKernels[static_cast<size_t>(l)].*field) return fn;
  }
  return nullptr;
}

}  // namespace

void shuffle_bytes(std::span<const std::byte> in, size_t elem, std::span<std::byte> out) {
  const size_t n = in.size() / elem;
  std::vector<std::byte*> planes(elem);
  for (size_t b = 0; b < elem; ++b) planes[b] = out.data() + b * n;
  shuffle_planes(in.data(), elem, n, planes.data());
  if (in.size() > n * elem) std::memcpy(out.data() + n * elem, in.data() + n * elem, in.size() - n * elem);
}

void shuffle_planes(const std::byte* src, size_t elem, size_t m, std::byte* const* planes) {
  if (elem == 1) {
    if (m) std::memcpy(planes[0], src, m);
    return;
  }
  if (elem == 2) {
    std::byte *p0 = planes[0], *p1 = planes[1];
    size_t i = 0;
    if (auto kernel = find(&ShuffleKernels::shuffle2)) i = kernel(src, m, p0, p1);
    for (; i < m; ++i) {
      p0[i] = src[2 * i];
      p1[i] = src[2 * i + 1];
    }
    return;
  }
  for (size_t b = 0; b < elem; ++b) {
    std::byte* plane = planes[b];
    for (size_t i = 0; i < m; ++i) plane[i] = src[i * elem + b];
  }
}

void unshuffle_bytes(std::span<const std::byte> in, size_t elem, std::span<std::byte> out) {
  const size_t n = in.size() / elem;
  std::vector<const std::byte*> planes(elem);
  for (size_t b = 0; b < elem; ++b) planes[b] = in.data() + b * n;
  unshuffle_planes(planes.data(), elem, n, out.data());
  if (in.size() > n * elem) std::memcpy(out.data() + n * elem, in.data() + n * elem, in.size() - n * elem);
}

void unshuffle_planes(const std::byte* const* planes, size_t elem, size_t m, std::byte* dst) {
  size_t i = 0;
  if (elem == 2) {
    const std::byte *p0 = planes[0], *p1 = planes[1];
    if (auto kernel = find(&ShuffleKernels::unshuffle2)) i = kernel(p0, p1, m, dst);
    for (; i < m; ++i) {
      dst[2 * i] = p0[i];
      dst[2 * i + 1] = p1[i];
    }
  } else if (elem == 4) {
    if (auto kernel = find(&ShuffleKernels::unshuffle4)) i = kernel(planes, m, dst);
    for (; i < m; ++i) {
      for (size_t b = 0; b < 4; ++b) dst[4 * i + b] = planes[b][i];
    }
  } else {
    for (size_t b = 0; b < elem; ++b) {
      const std::byte* plane = planes[b];
      for (size_t k = 0; k < m; ++k) dst[k * elem + b] = plane[k];
    }
  }
}

}  // namespace kvsnap
