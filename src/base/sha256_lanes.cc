#include "base/sha256_lanes.h"

#include "base/simd_level.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

// SHA256_Transform (deprecated in OpenSSL 3, still built by Debian's and every default build):
// OpenSSL's one-stream block function, for AVX2 lanes too few to pay for eight-lane rounds.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSNAP_SHA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define KVSNAP_SHA_ARM 1
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif
#endif

namespace kvsnap {
namespace {

using State = std::array<uint32_t, 8>;

constexpr State kInit = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

[[maybe_unused]] alignas(64) constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// Register I (0..3) of a lane's message schedule (ShaniLane, ArmLane: w0..w3, four words each),
// by name: GCC keeps a lane's registers in registers only when every access is by name. No
// intrinsics, so it inlines into any target's kernel.
template <int I, class Lane>
[[maybe_unused]] __attribute__((always_inline)) inline auto& schedule_word(Lane& x) {
  if constexpr (I == 0) return x.w0;
  else if constexpr (I == 1) return x.w1;
  else if constexpr (I == 2) return x.w2;
  else return x.w3;
}

#ifdef KVSNAP_SHA_X86

// SHA-NI, several messages interleaved in one thread: each sha256rnds2 waits for the one before
// it in its own message only, so two chains keep the unit busy where one leaves it idle half the
// time. The round and message-schedule steps and the state (un)shuffle are those of Bitcoin
// Core's src/crypto/sha256_x86_shani.cpp (MIT licence; after Intel's and Jeffrey Walton's
// public-domain code), generalised from its fixed 64-byte Transform_2way to any number of blocks.
// No arrays and no loops over lanes or rounds: GCC keeps a lane's registers in registers only
// when every access is by name (indexed arrays were spilled and ran no faster than one lane).
#define KV_SHA __attribute__((target("sha,sse4.1,ssse3"), always_inline)) inline

struct ShaniLane {
  __m128i s0, s1;  // ABEF, CDGH
  __m128i o0, o1;  // at the start of the block
  __m128i w0, w1, w2, w3;  // the message schedule, four words each
  const uint8_t* d;
};

// Rounds 4Q..4Q+3 of one lane.
template <int Q>
KV_SHA void quad(ShaniLane& x) {
  __m128i& w = schedule_word<Q & 3>(x);
  if constexpr (Q < 4) {
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    w = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.d + 16 * Q)), bswap);
  } else {
    // W[q] = msg2(msg1(W[q-4], W[q-3]) + W[q-7 words], W[q-1]), four words at a time.
    const __m128i prev = schedule_word<(Q + 3) & 3>(x);
    w = _mm_sha256msg2_epu32(
        _mm_add_epi32(_mm_sha256msg1_epu32(w, schedule_word<(Q + 1) & 3>(x)),
                      _mm_alignr_epi8(prev, schedule_word<(Q + 2) & 3>(x), 4)),
        prev);
  }
  const __m128i msg = _mm_add_epi32(w, _mm_load_si128(reinterpret_cast<const __m128i*>(kK + 4 * Q)));
  x.s1 = _mm_sha256rnds2_epu32(x.s1, x.s0, msg);
  x.s0 = _mm_sha256rnds2_epu32(x.s0, x.s1, _mm_shuffle_epi32(msg, 0x0e));
}

template <int Q, typename... X>
KV_SHA void quads(X&... x) {
  (quad<Q>(x), ...);
}

KV_SHA void shani_load(ShaniLane& x, const State& h, const uint8_t* d) {
  const __m128i t1 = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h.data())), 0xB1);
  const __m128i t2 = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h.data() + 4)), 0x1B);
  x.s0 = _mm_alignr_epi8(t1, t2, 8);
  x.s1 = _mm_blend_epi16(t2, t1, 0xF0);
  x.d = d;
}

KV_SHA void shani_store(const ShaniLane& x, State& h) {
  const __m128i t1 = _mm_shuffle_epi32(x.s0, 0x1B);
  const __m128i t2 = _mm_shuffle_epi32(x.s1, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h.data()), _mm_blend_epi16(t1, t2, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h.data() + 4), _mm_alignr_epi8(t2, t1, 8));
}

// `n` blocks of every lane, the lanes' rounds interleaved.
template <typename... X>
KV_SHA void shani_run(size_t n, X&... x) {
  for (; n > 0; --n) {
    ((x.o0 = x.s0, x.o1 = x.s1), ...);
    quads<0>(x...), quads<1>(x...), quads<2>(x...), quads<3>(x...);
    quads<4>(x...), quads<5>(x...), quads<6>(x...), quads<7>(x...);
    quads<8>(x...), quads<9>(x...), quads<10>(x...), quads<11>(x...);
    quads<12>(x...), quads<13>(x...), quads<14>(x...), quads<15>(x...);
    ((x.s0 = _mm_add_epi32(x.s0, x.o0), x.s1 = _mm_add_epi32(x.s1, x.o1), x.d += 64), ...);
  }
}
#undef KV_SHA

__attribute__((target("sha,sse4.1,ssse3"))) void shani_x1(State& h, const uint8_t* p, size_t n) {
  ShaniLane a;
  shani_load(a, h, p);
  shani_run(n, a);
  shani_store(a, h);
}

__attribute__((target("sha,sse4.1,ssse3"))) void shani_x2(State& ha, const uint8_t* pa, State& hb, const uint8_t* pb,
                                                          size_t n) {
  ShaniLane a, b;
  shani_load(a, ha, pa);
  shani_load(b, hb, pb);
  shani_run(n, a, b);
  shani_store(a, ha);
  shani_store(b, hb);
}

// Three and four chains: on Zen 5 a `sha256rnds2` issues every ~2 cycles while one waits ~4 for
// the one before it in its chain, so a third and fourth message still fill gaps (x4 hashes 1.27x
// x2's bytes there although 32 vector registers' worth of state spills into 16), while on Zen 4
// two chains already keep the unit busy (shani-x4 is chosen by CPU: choose_kernel below).
__attribute__((target("sha,sse4.1,ssse3"))) void shani_x3(State& ha, const uint8_t* pa, State& hb, const uint8_t* pb,
                                                          State& hc, const uint8_t* pc, size_t n) {
  ShaniLane a, b, c;
  shani_load(a, ha, pa);
  shani_load(b, hb, pb);
  shani_load(c, hc, pc);
  shani_run(n, a, b, c);
  shani_store(a, ha);
  shani_store(b, hb);
  shani_store(c, hc);
}

__attribute__((target("sha,sse4.1,ssse3"))) void shani_x4(State& ha, const uint8_t* pa, State& hb, const uint8_t* pb,
                                                          State& hc, const uint8_t* pc, State& hd, const uint8_t* pd,
                                                          size_t n) {
  ShaniLane a, b, c, d;
  shani_load(a, ha, pa);
  shani_load(b, hb, pb);
  shani_load(c, hc, pc);
  shani_load(d, hd, pd);
  shani_run(n, a, b, c, d);
  shani_store(a, ha);
  shani_store(b, hb);
  shani_store(c, hc);
  shani_store(d, hd);
}

// AVX2, eight messages in the eight 32-bit lanes: the plain FIPS 180-4 rounds on vectors (as
// Bitcoin Core's sha256_avx2.cpp Transform_8way and Intel's isa-l_crypto mb_sha256 do). A lane
// with stride 0 reads the same block again and again; its state is not written back. The framing
// (state in and out, a block's sixteen words) is shared; the 64 rounds are one function per ISA:
// AVX2 (a rotation is two shifts and an or) and AVX-512VL on the same 8-lane registers, whose
// vprord rotates in one instruction and vpternlogd makes the three-input xor, Ch and Maj in one
// each (~25 instructions a round against ~50: the kernel for AVX-512 CPUs without SHA-NI, Intel
// Skylake-SP to Cooper Lake).
#define KV_AVX2 __attribute__((target("avx2"), always_inline)) inline
#define KV_AVX512VL __attribute__((target("avx2,avx512f,avx512vl"), always_inline)) inline
template <int N>
KV_AVX2 __m256i rotr(__m256i x) {
  return _mm256_or_si256(_mm256_srli_epi32(x, N), _mm256_slli_epi32(x, 32 - N));
}
KV_AVX2 __m256i add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
KV_AVX2 __m256i xor3(__m256i a, __m256i b, __m256i c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }

struct Lanes8 {
  __m256i s[8];  // the state, word w of every lane
  const uint8_t* d[8];
};

KV_AVX2 Lanes8 load_lanes8(State* const* h, const uint8_t* const* p) {
  alignas(32) uint32_t lane[8][8];  // [word][lane]
  for (int w = 0; w < 8; ++w)
    for (int l = 0; l < 8; ++l) lane[w][l] = (*h[l])[w];
  Lanes8 x;
  for (int w = 0; w < 8; ++w) x.s[w] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane[w]));
  for (int l = 0; l < 8; ++l) x.d[l] = p[l];
  return x;
}

KV_AVX2 void store_lanes8(const Lanes8& x, State* const* h, const size_t* stride) {
  alignas(32) uint32_t lane[8][8];
  for (int w = 0; w < 8; ++w) _mm256_store_si256(reinterpret_cast<__m256i*>(lane[w]), x.s[w]);
  for (int l = 0; l < 8; ++l)
    if (stride[l] != 0)
      for (int w = 0; w < 8; ++w) (*h[l])[w] = lane[w][l];
}

// The current block's sixteen big-endian words, word t of every lane in w[t]: each lane's eight
// words at a time as one load, then an 8 x 8 transpose (24 shuffles for 64 words, where
// gathering each word into its lane took ~8 instructions).
KV_AVX2 void load_words8(const Lanes8& x, __m256i* w) {
  const __m256i bswap = _mm256_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL, 0x0c0d0e0f08090a0bLL,
                                          0x0405060700010203LL);
  for (int half = 0; half < 2; ++half) {
    __m256i r[8];
    for (int l = 0; l < 8; ++l) r[l] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.d[l] + 32 * half));
    // lanes (0, 1), (2, 3), ... word by word; then pairs of words; then the 128-bit halves
    __m256i a[8], b[8];
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        b[4 * i + 2 * j] = _mm256_unpacklo_epi64(a[4 * i + j], a[4 * i + 2 + j]);
        b[4 * i + 2 * j + 1] = _mm256_unpackhi_epi64(a[4 * i + j], a[4 * i + 2 + j]);
      }
    }
    // b[4 i + k] holds words k, k + 4 of lanes 4 i .. 4 i + 3 (one per 128-bit half)
    for (int k = 0; k < 4; ++k) {
      w[8 * half + k] = _mm256_shuffle_epi8(_mm256_permute2x128_si256(b[k], b[4 + k], 0x20), bswap);
      w[8 * half + 4 + k] = _mm256_shuffle_epi8(_mm256_permute2x128_si256(b[k], b[4 + k], 0x31), bswap);
    }
  }
}

// After a block's rounds (r: a..h): the state plus r, and every lane on to its next block.
KV_AVX2 void end_block8(Lanes8& x, const __m256i* r, const size_t* stride) {
  for (int i = 0; i < 8; ++i) x.s[i] = add(x.s[i], r[i]);
  for (int l = 0; l < 8; ++l) x.d[l] += stride[l];
}

// The 64 rounds of one block on r (a..h, in place), AVX2.
KV_AVX2 void rounds8_avx2(__m256i* r, __m256i* w) {
  __m256i a = r[0], b = r[1], c = r[2], dd = r[3], e = r[4], f = r[5], g = r[6], hh = r[7];
#pragma GCC unroll 8
  for (int t = 0; t < 64; ++t) {
    if (t >= 16) {
      const __m256i w15 = w[(t - 15) & 15], w2 = w[(t - 2) & 15];
      const __m256i s0 = xor3(rotr<7>(w15), rotr<18>(w15), _mm256_srli_epi32(w15, 3));
      const __m256i s1 = xor3(rotr<17>(w2), rotr<19>(w2), _mm256_srli_epi32(w2, 10));
      w[t & 15] = add(add(w[t & 15], s0), add(w[(t - 7) & 15], s1));
    }
    const __m256i ch = _mm256_xor_si256(_mm256_and_si256(e, f), _mm256_andnot_si256(e, g));
    const __m256i t1 = add(add(hh, xor3(rotr<6>(e), rotr<11>(e), rotr<25>(e))),
                           add(ch, add(_mm256_set1_epi32(int(kK[t])), w[t & 15])));
    const __m256i maj = _mm256_or_si256(_mm256_and_si256(a, _mm256_or_si256(b, c)), _mm256_and_si256(b, c));
    const __m256i t2 = add(xor3(rotr<2>(a), rotr<13>(a), rotr<22>(a)), maj);
    hh = g, g = f, f = e, e = add(dd, t1), dd = c, c = b, b = a, a = add(t1, t2);
  }
  r[0] = a, r[1] = b, r[2] = c, r[3] = dd, r[4] = e, r[5] = f, r[6] = g, r[7] = hh;
}

// The same rounds with AVX-512VL's rotate and three-input logic (vpternlogd's table: 0x96 is
// a ^ b ^ c, 0xCA is Ch = a ? b : c, 0xE8 is Maj = the majority of a, b, c).
KV_AVX512VL __m256i xor3_vl(__m256i a, __m256i b, __m256i c) { return _mm256_ternarylogic_epi32(a, b, c, 0x96); }

KV_AVX512VL void rounds8_avx512(__m256i* r, __m256i* w) {
  __m256i a = r[0], b = r[1], c = r[2], dd = r[3], e = r[4], f = r[5], g = r[6], hh = r[7];
#pragma GCC unroll 8
  for (int t = 0; t < 64; ++t) {
    if (t >= 16) {
      const __m256i w15 = w[(t - 15) & 15], w2 = w[(t - 2) & 15];
      const __m256i s0 = xor3_vl(_mm256_ror_epi32(w15, 7), _mm256_ror_epi32(w15, 18), _mm256_srli_epi32(w15, 3));
      const __m256i s1 = xor3_vl(_mm256_ror_epi32(w2, 17), _mm256_ror_epi32(w2, 19), _mm256_srli_epi32(w2, 10));
      w[t & 15] = add(add(w[t & 15], s0), add(w[(t - 7) & 15], s1));
    }
    const __m256i ch = _mm256_ternarylogic_epi32(e, f, g, 0xCA);
    const __m256i t1 = add(add(hh, xor3_vl(_mm256_ror_epi32(e, 6), _mm256_ror_epi32(e, 11), _mm256_ror_epi32(e, 25))),
                           add(ch, add(_mm256_set1_epi32(int(kK[t])), w[t & 15])));
    const __m256i maj = _mm256_ternarylogic_epi32(a, b, c, 0xE8);
    const __m256i t2 = add(xor3_vl(_mm256_ror_epi32(a, 2), _mm256_ror_epi32(a, 13), _mm256_ror_epi32(a, 22)), maj);
    hh = g, g = f, f = e, e = add(dd, t1), dd = c, c = b, b = a, a = add(t1, t2);
  }
  r[0] = a, r[1] = b, r[2] = c, r[3] = dd, r[4] = e, r[5] = f, r[6] = g, r[7] = hh;
}
#undef KV_AVX2
#undef KV_AVX512VL

__attribute__((target("avx2"))) void avx2_blocks8(State* const* h, const uint8_t* const* p, const size_t* stride, size_t n) {
  Lanes8 x = load_lanes8(h, p);
  for (; n > 0; --n) {
    __m256i w[16], r[8];
    load_words8(x, w);
    std::copy(x.s, x.s + 8, r);
    rounds8_avx2(r, w);
    end_block8(x, r, stride);
  }
  store_lanes8(x, h, stride);
}

__attribute__((target("avx2,avx512f,avx512vl"))) void avx512_blocks8(State* const* h, const uint8_t* const* p,
                                                                       const size_t* stride, size_t n) {
  Lanes8 x = load_lanes8(h, p);
  for (; n > 0; --n) {
    __m256i w[16], r[8];
    load_words8(x, w);
    std::copy(x.s, x.s + 8, r);
    rounds8_avx512(r, w);
    end_block8(x, r, stride);
  }
  store_lanes8(x, h, stride);
}

bool cpu_has_avx512vl() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
}

bool cpu_has_shani() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & (1u << 29)) != 0 && __builtin_cpu_supports("sse4.1") && __builtin_cpu_supports("ssse3");
}

#endif  // KVSNAP_SHA_X86

#ifdef KVSNAP_SHA_ARM

// ARMv8's SHA-2 instructions, two messages interleaved in one thread, as shani_x2 does on x86:
// sha256h and sha256h2 each wait for the pair before them in their own message only, so a second
// chain fills the gaps one leaves (the Linux kernel's arm64 sha256_ce_finup2x, which "nearly
// doubles hashing performance" on some CPUs, interleaves two for the same reason). The steps
// per four rounds are ARM's (ACLE: vsha256hq_u32, vsha256h2q_u32, vsha256su0q_u32,
// vsha256su1q_u32); state ABCD and EFGH in two registers in word order, no shuffle. Every lane's
// registers by name, as in ShaniLane.
#if defined(__clang__)
#define KV_SHA2 __attribute__((target("sha2"), always_inline)) inline
#define KV_SHA2_FN __attribute__((target("sha2")))
#else  // GCC 12's arm_neon.h declares the SHA-2 intrinsics under +crypto (SHA-2 and AES)
#define KV_SHA2 __attribute__((target("+crypto"), always_inline)) inline
#define KV_SHA2_FN __attribute__((target("+crypto")))
#endif

struct ArmLane {
  uint32x4_t abcd, efgh;
  uint32x4_t o0, o1;  // at the start of the block
  uint32x4_t w0, w1, w2, w3;
  const uint8_t* d;
};

// Rounds 4Q..4Q+3 of one lane.
template <int Q>
KV_SHA2 void arm_quad(ArmLane& x) {
  uint32x4_t& w = schedule_word<Q & 3>(x);
  if constexpr (Q < 4) {
    w = vreinterpretq_u32_u8(vrev32q_u8(vld1q_u8(x.d + 16 * Q)));  // big-endian words
  } else {
    // W[q] = su1(su0(W[q-4], W[q-3]), W[q-2], W[q-1]), four words at a time.
    w = vsha256su1q_u32(vsha256su0q_u32(w, schedule_word<(Q + 1) & 3>(x)), schedule_word<(Q + 2) & 3>(x),
                        schedule_word<(Q + 3) & 3>(x));
  }
  const uint32x4_t wk = vaddq_u32(w, vld1q_u32(kK + 4 * Q));
  const uint32x4_t abcd = x.abcd;
  x.abcd = vsha256hq_u32(abcd, x.efgh, wk);
  x.efgh = vsha256h2q_u32(x.efgh, abcd, wk);
}

template <int Q, typename... X>
KV_SHA2 void arm_quads(X&... x) {
  (arm_quad<Q>(x), ...);
}

// `n` blocks of every lane, the lanes' rounds interleaved.
template <typename... X>
KV_SHA2 void arm_run(size_t n, X&... x) {
  for (; n > 0; --n) {
    ((x.o0 = x.abcd, x.o1 = x.efgh), ...);
    arm_quads<0>(x...), arm_quads<1>(x...), arm_quads<2>(x...), arm_quads<3>(x...);
    arm_quads<4>(x...), arm_quads<5>(x...), arm_quads<6>(x...), arm_quads<7>(x...);
    arm_quads<8>(x...), arm_quads<9>(x...), arm_quads<10>(x...), arm_quads<11>(x...);
    arm_quads<12>(x...), arm_quads<13>(x...), arm_quads<14>(x...), arm_quads<15>(x...);
    ((x.abcd = vaddq_u32(x.abcd, x.o0), x.efgh = vaddq_u32(x.efgh, x.o1), x.d += 64), ...);
  }
}

KV_SHA2 void arm_load(ArmLane& x, const State& h, const uint8_t* d) {
  x.abcd = vld1q_u32(h.data());
  x.efgh = vld1q_u32(h.data() + 4);
  x.d = d;
}

KV_SHA2 void arm_store(const ArmLane& x, State& h) {
  vst1q_u32(h.data(), x.abcd);
  vst1q_u32(h.data() + 4, x.efgh);
}
#undef KV_SHA2

KV_SHA2_FN void armv8_x1(State& h, const uint8_t* p, size_t n) {
  ArmLane a;
  arm_load(a, h, p);
  arm_run(n, a);
  arm_store(a, h);
}

KV_SHA2_FN void armv8_x2(State& ha, const uint8_t* pa, State& hb, const uint8_t* pb, size_t n) {
  ArmLane a, b;
  arm_load(a, ha, pa);
  arm_load(b, hb, pb);
  arm_run(n, a, b);
  arm_store(a, ha);
  arm_store(b, hb);
}
#undef KV_SHA2_FN

bool cpu_has_sha2() {
#if defined(__APPLE__)
  return true;  // every Apple arm64 CPU has the SHA-2 instructions
#elif defined(__linux__) && defined(HWCAP_SHA2)
  return (getauxval(AT_HWCAP) & HWCAP_SHA2) != 0;
#else
  return false;
#endif
}

#endif  // KVSNAP_SHA_ARM

[[maybe_unused]] void openssl_blocks(State& h, const uint8_t* p, size_t n) {
  SHA256_CTX c{};
  std::copy(h.begin(), h.end(), c.h);
  for (; n > 0; --n, p += 64) SHA256_Transform(&c, p);
  std::copy(c.h, c.h + 8, h.begin());
}

Sha256Kernel choose_kernel() {
  if (const char* want = std::getenv("KVSNAP_SHA")) {
    for (Sha256Kernel k : kSha256Kernels) {
      if (std::string_view(want) == sha256_kernel_name(k) && sha256_kernel_supported(k)) return k;
    }
  }
  // Four chains where measured faster than two (Zen 5, AMD family 0x1A: 3.7 against 2.9 GB/s a
  // thread); two elsewhere: on Zen 4 four chains' rounds ran no faster, and Intel's are unmeasured.
  if (sha256_kernel_supported(Sha256Kernel::kShaniX2))
    return simd::amd_family() == 0x1A ? Sha256Kernel::kShaniX4 : Sha256Kernel::kShaniX2;
  if (sha256_kernel_supported(Sha256Kernel::kAvx512X8)) return Sha256Kernel::kAvx512X8;
  if (sha256_kernel_supported(Sha256Kernel::kAvx2X8)) return Sha256Kernel::kAvx2X8;
  // aarch64 with the SHA-2 instructions: two chains, not measured on ARM hardware here (qemu-user
  // proves the bytes only); the Linux kernel's arm64 SHA-256 interleaves two for the same reason.
  if (sha256_kernel_supported(Sha256Kernel::kArmv8X2)) return Sha256Kernel::kArmv8X2;
  return Sha256Kernel::kOpenssl;
}

}  // namespace

Sha256Kernel sha256_kernel() {
  static const Sha256Kernel k = choose_kernel();
  // The scalar level set by hand (KVSNAP_SIMD=scalar, a bench's --simd scalar) means no SIMD
  // anywhere, SHA-NI included; read on every call because set_level() may change it within a
  // process. A CPU whose best level is scalar (SHA-NI without AVX2: Goldmont) keeps its kernel.
  if (simd::level() == simd::Level::kScalar && simd::best_level() != simd::Level::kScalar) return Sha256Kernel::kOpenssl;
  // Likewise the AVX2 level set by hand on an AVX-512 CPU means AVX2's lanes, so that a bench's
  // --simd avx2 row is what an AVX2 CPU without SHA-NI runs.
  if (k == Sha256Kernel::kAvx512X8 && simd::level() == simd::Level::kAvx2 && simd::best_level() == simd::Level::kAvx512)
    return Sha256Kernel::kAvx2X8;
  return k;
}

const char* sha256_kernel_name(Sha256Kernel k) {
  switch (k) {
    case Sha256Kernel::kShaniX2: return "shani-x2";
    case Sha256Kernel::kShaniX4: return "shani-x4";
    case Sha256Kernel::kAvx2X8: return "avx2-x8";
    case Sha256Kernel::kAvx512X8: return "avx512-x8";
    case Sha256Kernel::kArmv8X2: return "armv8-x2";
    case Sha256Kernel::kOpenssl: break;
  }
  return "openssl";
}

bool sha256_kernel_supported(Sha256Kernel k) {
#ifdef KVSNAP_SHA_X86
  static const bool shani = cpu_has_shani();
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (k == Sha256Kernel::kShaniX2 || k == Sha256Kernel::kShaniX4) return shani;
  if (k == Sha256Kernel::kAvx2X8) return avx2;
  static const bool avx512vl = cpu_has_avx512vl();
  if (k == Sha256Kernel::kAvx512X8) return avx512vl;
  if (k == Sha256Kernel::kArmv8X2) return false;
#elif defined(KVSNAP_SHA_ARM)
  static const bool sha2 = cpu_has_sha2();
  if (k == Sha256Kernel::kArmv8X2) return sha2;
  if (k != Sha256Kernel::kOpenssl) return false;
#else
  if (k != Sha256Kernel::kOpenssl) return false;
#endif
  return true;
}

size_t sha256_kernel_width(Sha256Kernel k) {
  switch (k) {
    case Sha256Kernel::kShaniX2:
    case Sha256Kernel::kArmv8X2: return 2;
    case Sha256Kernel::kShaniX4: return 4;
    case Sha256Kernel::kAvx2X8:
    case Sha256Kernel::kAvx512X8: return 8;
    case Sha256Kernel::kOpenssl: break;
  }
  return 1;
}

Sha256Lanes::Sha256Lanes(Sha256Kernel k) : kernel_(sha256_kernel_supported(k) ? k : Sha256Kernel::kOpenssl) {
  for (Lane& l : lanes_) reset(l);
  if (kernel_ == Sha256Kernel::kOpenssl) openssl_ = std::make_unique<Sha256[]>(kMaxLanes);
}

Sha256Lanes::~Sha256Lanes() = default;

void Sha256Lanes::reset(Lane& l) {
  l.h = kInit;
  l.buffered = 0;
  l.total = 0;
}

void Sha256Lanes::update(size_t lane, std::span<const std::byte> piece) {
  Pieces p{};
  p[lane] = piece;
  update(p);
}

void Sha256Lanes::update(const Pieces& pieces) {
  if (kernel_ == Sha256Kernel::kOpenssl) {
    for (size_t i = 0; i < kMaxLanes; ++i) openssl_[i].update(pieces[i]);
    return;
  }
  Pieces rest = pieces;
  std::array<const uint8_t*, kMaxLanes> data{};
  std::array<size_t, kMaxLanes> blocks{};
  // First the partial blocks left by earlier pieces, completed where this piece allows.
  bool any = false;
  for (size_t i = 0; i < kMaxLanes; ++i) {
    Lane& l = lanes_[i];
    l.total += rest[i].size();
    if (l.buffered == 0 || rest[i].empty()) continue;
    const size_t take = std::min(rest[i].size(), 64 - l.buffered);
    std::memcpy(l.buf.data() + l.buffered, rest[i].data(), take);
    l.buffered += take;
    rest[i] = rest[i].subspan(take);
    if (l.buffered == 64) {
      data[i] = l.buf.data();
      blocks[i] = 1;
      l.buffered = 0;
      any = true;
    }
  }
  if (any) compress(data, blocks);
  // Then the whole blocks of every lane, together; the tails wait for the next piece.
  for (size_t i = 0; i < kMaxLanes; ++i) {
    data[i] = reinterpret_cast<const uint8_t*>(rest[i].data());
    blocks[i] = rest[i].size() / 64;
  }
  compress(data, blocks);
  for (size_t i = 0; i < kMaxLanes; ++i) {
    const size_t tail = rest[i].size() % 64;
    if (tail == 0) continue;
    std::memcpy(lanes_[i].buf.data() + lanes_[i].buffered, rest[i].data() + rest[i].size() - tail, tail);
    lanes_[i].buffered += tail;
  }
}

Sha256Digest Sha256Lanes::finish(size_t lane) {
  if (kernel_ == Sha256Kernel::kOpenssl) return openssl_[lane].finish();
  Lane& l = lanes_[lane];
  std::array<const uint8_t*, kMaxLanes> data{};
  std::array<size_t, kMaxLanes> blocks{};
  data[lane] = l.buf.data();
  blocks[lane] = 1;
  l.buf[l.buffered++] = 0x80;
  if (l.buffered > 56) {
    std::fill(l.buf.begin() + l.buffered, l.buf.end(), 0);
    compress(data, blocks);
    l.buffered = 0;
  }
  std::fill(l.buf.begin() + l.buffered, l.buf.begin() + 56, 0);
  const uint64_t bits = l.total * 8;
  for (int i = 0; i < 8; ++i) l.buf[56 + i] = uint8_t(bits >> (56 - 8 * i));
  compress(data, blocks);
  Sha256Digest out;
  for (int w = 0; w < 8; ++w)
    for (int i = 0; i < 4; ++i) out[4 * w + i] = uint8_t(l.h[w] >> (24 - 8 * i));
  reset(l);
  return out;
}

void Sha256Lanes::compress(const std::array<const uint8_t*, kMaxLanes>& data,
                           const std::array<size_t, kMaxLanes>& blocks) {
  std::array<const uint8_t*, kMaxLanes> at = data;
  std::array<size_t, kMaxLanes> left = blocks;
  // The interleaving kernels (SHA-NI, ARMv8): up to the kernel's width of lanes with blocks left
  // run together for as many blocks as each of them has; then the ones still left, fewer at a
  // time. run(found, g, n): lanes g[0..found) for n blocks.
  [[maybe_unused]] auto interleave = [&](auto run) {
    const size_t width = sha256_kernel_width(kernel_);
    for (;;) {
      size_t g[4], found = 0;
      for (size_t i = 0; i < kMaxLanes && found < width; ++i)
        if (left[i] != 0) g[found++] = i;
      if (found == 0) return;
      size_t n = left[g[0]];
      for (size_t j = 1; j < found; ++j) n = std::min(n, left[g[j]]);
      run(found, g, n);
      for (size_t j = 0; j < found; ++j) at[g[j]] += 64 * n, left[g[j]] -= n;
    }
  };
#ifdef KVSNAP_SHA_X86
  if (kernel_ == Sha256Kernel::kShaniX2 || kernel_ == Sha256Kernel::kShaniX4) {
    interleave([&](size_t found, const size_t* g, size_t n) {
      State& h0 = lanes_[g[0]].h;
      if (found == 1) shani_x1(h0, at[g[0]], n);
      if (found == 2) shani_x2(h0, at[g[0]], lanes_[g[1]].h, at[g[1]], n);
      if (found == 3) shani_x3(h0, at[g[0]], lanes_[g[1]].h, at[g[1]], lanes_[g[2]].h, at[g[2]], n);
      if (found == 4)
        shani_x4(h0, at[g[0]], lanes_[g[1]].h, at[g[1]], lanes_[g[2]].h, at[g[2]], lanes_[g[3]].h, at[g[3]], n);
    });
    return;
  }
  if (kernel_ == Sha256Kernel::kAvx2X8 || kernel_ == Sha256Kernel::kAvx512X8) {
    // Lanes without blocks left ride along on a fixed block (stride 0), their state untouched.
    // Eight-lane rounds cost the same however many lanes are busy: with fewer than kMinBusy,
    // OpenSSL's one-stream code (the same bytes, one lane after the other) is faster. Without
    // SHA-NI (the only CPUs these kernels are chosen on) OpenSSL's stream hashes 0.57-0.72 GB/s on
    // the Zen 5, avx2-x8's eight lanes 1.35-1.54 and avx512-x8's 2.09-2.18: three busy lanes pay
    // with avx512-x8 (0.81), four with avx2-x8.
    const size_t kMinBusy = kernel_ == Sha256Kernel::kAvx512X8 ? 3 : 4;
    static const uint8_t kIdle[64] = {};
    State scratch[kMaxLanes];
    for (State& s : scratch) s = kInit;
    for (;;) {
      size_t n = 0, busy = 0;
      for (size_t i = 0; i < kMaxLanes; ++i)
        if (left[i] != 0) n = n == 0 ? left[i] : std::min(n, left[i]), ++busy;
      if (n == 0) return;
      if (busy < kMinBusy) {
        for (size_t i = 0; i < kMaxLanes; ++i)
          if (left[i] != 0) openssl_blocks(lanes_[i].h, at[i], left[i]);
        return;
      }
      State* h[kMaxLanes];
      const uint8_t* p[kMaxLanes];
      size_t stride[kMaxLanes];
      for (size_t i = 0; i < kMaxLanes; ++i) {
        const bool on = left[i] != 0;
        h[i] = on ? &lanes_[i].h : &scratch[i];
        p[i] = on ? at[i] : kIdle;
        stride[i] = on ? 64 : 0;
      }
      if (kernel_ == Sha256Kernel::kAvx512X8) {
        avx512_blocks8(h, p, stride, n);
      } else {
        avx2_blocks8(h, p, stride, n);
      }
      for (size_t i = 0; i < kMaxLanes; ++i)
        if (left[i] != 0) at[i] += 64 * n, left[i] -= n;
    }
  }
#elif defined(KVSNAP_SHA_ARM)
  if (kernel_ == Sha256Kernel::kArmv8X2) {
    interleave([&](size_t found, const size_t* g, size_t n) {
      if (found == 1) armv8_x1(lanes_[g[0]].h, at[g[0]], n);
      if (found == 2) armv8_x2(lanes_[g[0]].h, at[g[0]], lanes_[g[1]].h, at[g[1]], n);
    });
  }
#endif
}

void sha256_many(std::span<const std::span<const std::byte>> messages, std::span<Sha256Digest> out, Sha256Kernel k) {
  // One hasher per kernel, indexed by its enum value: kSha256Kernels lists every value.
  static_assert(static_cast<size_t>(Sha256Kernel::kShaniX4) < std::size(kSha256Kernels) &&
                static_cast<size_t>(Sha256Kernel::kAvx2X8) < std::size(kSha256Kernels) &&
                static_cast<size_t>(Sha256Kernel::kAvx512X8) < std::size(kSha256Kernels) &&
                static_cast<size_t>(Sha256Kernel::kArmv8X2) < std::size(kSha256Kernels));
  thread_local std::unique_ptr<Sha256Lanes> lanes[std::size(kSha256Kernels)];
  std::unique_ptr<Sha256Lanes>& h = lanes[static_cast<int>(k)];
  if (!h) h = std::make_unique<Sha256Lanes>(k);
  Sha256Lanes::Pieces p{};
  for (size_t i = 0; i < messages.size(); ++i) p[i] = messages[i];
  h->update(p);
  for (size_t i = 0; i < messages.size(); ++i) out[i] = h->finish(i);
}

}  // namespace kvsnap
