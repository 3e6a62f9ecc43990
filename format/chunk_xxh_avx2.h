// XXH3-128 with xxhash's own AVX2 loop, for chunk_xxh and ChunkXxhHasher (chunk_codec.h).
// Debian's libxxhash is built for SSE2 (x86-64's baseline), which hashes ~6-19 GB/s here
// against ~45 with AVX2; XXH3 is defined bit for bit, so both give the same digests
// (ChunkXxh.EveryLevelGivesLibxxhashsDigests). Only for x86-64 builds (KVSNAP_SIMD_X86) and
// CPUs with AVX2: chunk_codec.cc asks simd::level().
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsnap::xxh3_avx2 {

struct Digest128 {
  uint64_t low64, high64;  // XXH128_hash_t's fields
};

Digest128 hash128(const void* data, size_t n);

// A streaming state (XXH3_state_t, 64-byte aligned); nullptr when out of memory.
void* new_state();
void free_state(void* state);
void reset(void* state);
void update(void* state, const void* data, size_t n);
Digest128 digest(const void* state);

}  // namespace kvsnap::xxh3_avx2
