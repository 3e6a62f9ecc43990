// The byte-shuffle filter of chunk blobs (format/chunk_codec.h, docs/format.md "Chunk blobs"):
// byte k of every element of `elem` bytes gathered into plane k, and back.
//
// The kernels follow the process's SIMD level (base/simd_level.h), like migrate/'s: the portable
// loops at `scalar`, AVX2 at `avx2` and `avx512` (no AVX-512 kernel of their own), NEON at `neon`,
// each for the element sizes of the float KV types (2: f16/bf16, 4: f32); other sizes take the
// portable loop at every level. Every level writes the same bytes (kvsnap-simd-check and
// tests/format/byte_shuffle_test.cc compare each level with the scalar one).
#pragma once

#include <cstddef>
#include <span>

namespace kvsnap {

// Byte shuffle and its inverse; in and out have the same size, do not overlap. The tail
// (in.size() % elem bytes) is copied as it is after the planes.
void shuffle_bytes(std::span<const std::byte> in, size_t elem, std::span<std::byte> out);
void unshuffle_bytes(std::span<const std::byte> in, size_t elem, std::span<std::byte> out);
// De-interleaves `m` elements of `elem` bytes from in[0, m * elem) into `elem` planes (byte b of
// element k goes to planes[b][k]): shuffle_bytes of a piece, each plane written where it goes.
void shuffle_planes(const std::byte* in, size_t elem, size_t m, std::byte* const* planes);
// Interleaves `m` elements of `elem` bytes from `elem` planes (byte b of element k is
// planes[b][k]) into out[0, m * elem): unshuffle_bytes of a piece of each plane.
void unshuffle_planes(const std::byte* const* planes, size_t elem, size_t m, std::byte* out);

}  // namespace kvsnap
