// Internal to migrate/kernels/: the byte tables of the vector MLX code packers (x86_avx2_mlx.cc,
// arm_neon_mlx.cc), for 2..6-bit codes. MLX's stream puts code i at bits [i * bits, (i + 1) *
// bits), LSB first (migrate/mlx_affine.h), so 8 codes are exactly `bits` bytes: the packers work
// on runs of 8 codes, one per 64-bit lane (pack) or one per 16-bit lane (unpack), and the same
// byte shuffle serves every run.
//
// - pack: 8 codes are first merged into one little-endian 64-bit lane (code j at bit j * bits);
//   `gather` then moves the low `bits` bytes of the two 64-bit lanes of a 16-byte register to
//   its first 2 * bits bytes (the others zero: index 0x80, which PSHUFB and TBL both read as 0).
// - unpack: from the `bits` bytes of a run at the start of a register, `spread` puts the two
//   bytes holding code j (the byte of its first bit and the next; bits <= 8, so it never spans
//   three) in 16-bit lane j; code j is then that lane >> `shift[j]`, masked to `bits` bits
//   (AVX2, without per-lane 16-bit shifts: times `mul[j]` = 2^(16 - bits - shift[j]), then >> (16 - bits)).
//
// The packers read or write up to kStreamSlack bytes past a group's n * bits / 8; the kernels
// hand them a padded copy where the row ends sooner.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsnap::simd::mlx_pack {

inline constexpr size_t kStreamSlack = 16;

struct StreamTables {
  uint8_t gather[16];
  uint8_t spread[16];
  int16_t shift[8];
  int16_t mul[8];
};

constexpr StreamTables make_stream_tables(int bits) {
  StreamTables t{};
  for (int k = 0; k < 16; k++) {
    t.gather[k] = k < bits ? uint8_t(k) : k < 2 * bits ? uint8_t(8 + k - bits) : uint8_t(0x80);
  }
  for (int j = 0; j < 8; j++) {
    const int first = j * bits / 8;
    t.spread[2 * j] = uint8_t(first);
    t.spread[2 * j + 1] = uint8_t(first + 1);
    t.shift[j] = int16_t(j * bits % 8);
    t.mul[j] = int16_t(1 << (16 - bits - j * bits % 8));
  }
  return t;
}

// Indexed by bits; rows 0, 1, 7, 8 unused (4 and 8 bits have simpler packers of their own).
inline constexpr StreamTables kStreamTables[9] = {
    {}, {}, make_stream_tables(2), make_stream_tables(3), make_stream_tables(4),
    make_stream_tables(5), make_stream_tables(6), {}, {},
};

}  // namespace kvsnap::simd::mlx_pack
