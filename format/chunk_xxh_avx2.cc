// xxhash.h's implementation inlined (XXH_INLINE_ALL: every function static, renamed, so nothing
// clashes with libxxhash's symbols) and compiled for AVX2 under a target pragma. Only C headers
// are included under the pragma, so no C++ inline function compiled for AVX2 can be merged with
// (and replace) the baseline copy the rest of the program uses.
#include "format/chunk_xxh_avx2.h"

#include "base/simd_level.h"

#ifdef KVSNAP_SIMD_X86

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace kvsnap::xxh3_avx2 {

// Every entry point ends with vzeroupper: GCC left it out where the AVX2 loop is a static
// function of this file called from another (XXH3_hashLong_128b_default from hash128), and the
// dirty upper halves then slowed the SSE-encoded SHA-NI rounds that follow (shani_x2: a full
// save took ~12% more CPU, 16% -> 26% of its samples in SHA-256).
namespace {
Digest128 of(XXH128_hash_t h) {
  _mm256_zeroupper();
  return {h.low64, h.high64};
}
}  // namespace

Digest128 hash128(const void* data, size_t n) { return of(XXH3_128bits(data, n)); }

void* new_state() { return XXH3_createState(); }
void free_state(void* state) { XXH3_freeState(static_cast<XXH3_state_t*>(state)); }
void reset(void* state) { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state)); }
void update(void* state, const void* data, size_t n) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state), data, n);
  _mm256_zeroupper();
}
Digest128 digest(const void* state) { return of(XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state))); }

}  // namespace kvsnap::xxh3_avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // KVSNAP_SIMD_X86
