// Quantized -> quantized: exact where the target can hold the block, never
// worse than ggml's reference quantizer where it cannot.
#include "migrate/exact_requant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "base/simd_level.h"
#include "migrate/half.h"
#include "migrate/offset_levels.h"
#include "migrate/quants.h"
#include "migrate/simd_kernels.h"
#include "test_inputs.h"

namespace kvsnap {
namespace {

constexpr size_t kN = 32 * 64;  // 64 blocks

std::vector<std::byte> quantize(const char* type, const std::vector<float>& x) {
  const TypeTraits* t = find_traits(type);
  std::vector<std::byte> b(kN / 32 * t->block_bytes());
  t->from_f32(x.data(), b.data(), kN);
  return b;
}

std::vector<float> values(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(kN);
  for (auto& v : x) v = g(rng);
  return x;
}

using Search = ExactRequantizer::Search;

std::vector<std::byte> requant(const char* from, const char* to, const std::vector<std::byte>& in,
                               uint64_t* exact = nullptr, Search search = Search::kFull) {
  auto r = ExactRequantizer::make(*find_traits(from), *find_traits(to), kN, search);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::byte> out(r->dst_row_bytes());
  EXPECT_TRUE(r->convert(in, out).ok());
  if (exact) *exact = r->blocks_exact();
  return out;
}

std::vector<float> decode(const char* type, const std::vector<std::byte>& b) {
  std::vector<float> y(kN);
  find_traits(type)->to_f32(b.data(), y.data(), kN);
  return y;
}

// Wider types hold narrower blocks exactly, and the way back restores the bytes.
TEST(ExactRequant, EmbeddingsAreExactAndRoundTripByteIdentical) {
  const std::pair<const char*, const char*> pairs[] = {
      {"q4_0", "q8_0"}, {"q4_0", "q4_1"}, {"q4_0", "q5_0"}, {"q4_0", "q5_1"}, {"q5_0", "q5_1"},
      {"q5_0", "q8_0"}, {"q4_1", "q5_1"}, {"iq4_nl", "q8_0"}};
  for (auto [from, to] : pairs) {
    SCOPED_TRACE(std::string(from) + " -> " + to);
    const auto src = quantize(from, values(3));
    uint64_t exact = 0;
    const auto wide = requant(from, to, src, &exact);
    EXPECT_EQ(exact, kN / 32) << "every block held exactly";
    const auto a = decode(from, src), b = decode(to, wide);
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(a[i], b[i]) << "value " << i;
    EXPECT_EQ(requant(to, from, wide), src) << "and back to the original bytes";
  }
}

double sse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return s;
}

// Where the grids differ, the result is never worse than the reference
// quantizer on the decoded values, and clearly better on the q5_0 -> q4_0
// tie case.
TEST(ExactRequant, LossyPairsAreNeverWorseThanTheReference) {
  const char* types[] = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl"};
  for (const char* from : types) {
    for (const char* to : types) {
      if (std::string(from) == to) continue;
      SCOPED_TRACE(std::string(from) + " -> " + to);
      const auto src = quantize(from, values(5));
      const auto x = decode(from, src);
      const double ours = sse(x, decode(to, requant(from, to, src)));
      const double quick = sse(x, decode(to, requant(from, to, src, nullptr, Search::kQuick)));
      const double ref = sse(x, decode(to, requant(from, to, src, nullptr, Search::kNone)));
      EXPECT_LE(ours, ref);
      EXPECT_LE(quick, ref);
    }
  }
  const auto src = quantize("q5_0", values(9));
  const auto x = decode("q5_0", src);
  const double ours = sse(x, decode("q4_0", requant("q5_0", "q4_0", src)));
  const double quick = sse(x, decode("q4_0", requant("q5_0", "q4_0", src, nullptr, Search::kQuick)));
  const double ref = sse(x, decode("q4_0", requant("q5_0", "q4_0", src, nullptr, Search::kNone)));
  EXPECT_LT(ours, 0.8 * ref) << "the reference scale lands half the q5_0 levels on ties";
  EXPECT_LT(quick, 0.8 * ref) << "the quick search breaks the ties too";
}

// q4_0 / q5_0 / iq4_nl -> q8_0 rewrite the bits of blocks with a finite nonzero scale directly;
// that must give the general path's bytes for any source block: random bits, with every kind of
// f16 scale (+-0, subnormal, normal, the largest, +-inf, NaN), at every SIMD level this CPU has
// (the direct path's kernels, migrate/simd_kernels.h), in runs of embedding blocks of every
// length between the others.
TEST(ExactRequant, DirectPathEqualsTheGeneralOne) {
  const uint16_t scales[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x3c00, 0xb800, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0xfd01};
  const simd::Level was = simd::level();
  for (size_t l = 0; l < simd::kLevelCount; ++l) {
    if (!simd::supported(simd::Level(l))) continue;
    ASSERT_TRUE(simd::set_level(simd::Level(l)));
    SCOPED_TRACE(simd::level_name(simd::Level(l)));
    std::mt19937 rng(13);
    for (const char* from : {"q4_0", "q5_0", "iq4_nl"}) {
      SCOPED_TRACE(from);
      const TypeTraits& src = *find_traits(from);
      std::vector<std::byte> in(kN / 32 * src.block_bytes());
      for (auto& b : in) b = std::byte(rng() & 0xff);
      // a named scale every 1 + (k % 7) blocks: runs of 0..6 random-bit blocks between them
      for (size_t b = 0, k = 0; b < kN / 32; b += 1 + k++ % 7) {
        const uint16_t d = scales[k % std::size(scales)];
        in[b * src.block_bytes()] = std::byte(d & 0xff);
        in[b * src.block_bytes() + 1] = std::byte(d >> 8);
      }
      for (Search search : {Search::kNone, Search::kQuick, Search::kFull}) {
        SCOPED_TRACE(search_name(search));
        auto fast = ExactRequantizer::make(src, *find_traits("q8_0"), kN, search);
        auto general = ExactRequantizer::make(src, *find_traits("q8_0"), kN, search, /*direct=*/false);
        ASSERT_TRUE(fast.ok() && general.ok());
        std::vector<std::byte> a(fast->dst_row_bytes()), b(general->dst_row_bytes());
        ASSERT_TRUE(fast->convert(in, a).ok());
        ASSERT_TRUE(general->convert(in, b).ok());
        EXPECT_EQ(a, b);
        EXPECT_EQ(fast->blocks_exact(), general->blocks_exact());
        EXPECT_EQ(fast->blocks_requantized(), general->blocks_requantized());
        EXPECT_GT(general->blocks_requantized(), 0u) << "the zero / inf / NaN scales take the general path";
      }
    }
  }
  simd::set_level(was);
}

// Without the search, a row's bytes come from one from_f32 over the row with the embedding
// blocks written over theirs, and a q8_0 source skips embed_block where its levels cannot fit
// (may_embed). That must be what the block-by-block definition gives: a block the target holds
// exactly (the search requantizer on that block alone keeps it) has those bytes, any other ggml's
// reference block of its values. The quick search, which starts from the same row, must give each
// block what it gives that block alone. Every pair, every SIMD level, sources with random bits, every
// kind of f16 scale, and (symmetric sources) levels that fit the narrow grids, just fit, and just
// do not.
// Levels for block number b of a q4_0, q5_0 or iq4_nl source, packed over blk's bits (its scale
// kept): levels that fit [-8, 7], a span of 15, 16 or 31 anywhere in the source's range (iq4_nl:
// its value 1 alone, or with its neighbours -10 and 13), or the random bits left as they are.
void craft_levels(GgmlType t, size_t b, std::mt19937& rng, std::byte* blk) {
  uint8_t* u = reinterpret_cast<uint8_t*>(blk);
  const int kind = int(b % 6);
  if (kind == 4 || (kind == 5 && t == GgmlType::kIQ4_NL)) return;
  if (t == GgmlType::kIQ4_NL) {  // indexes into the table: 7 -> -10, 8 -> 1, 9 -> 13
    static constexpr int kFirst[] = {8, 7, 8, 7}, kCount[] = {1, 2, 2, 3};
    for (int j = 0; j < 16; ++j) {
      const int a = kFirst[kind] + int(rng() % kCount[kind]), c = kFirst[kind] + int(rng() % kCount[kind]);
      u[2 + j] = uint8_t(a | (c << 4));
    }
    return;
  }
  const int bias = t == GgmlType::kQ4_0 ? 8 : 16;  // levels -bias .. bias - 1
  const int span = kind == 0 ? 15 : kind == 1 ? 15 : kind == 2 ? 16 : 31;
  const int width = std::min(span, 2 * bias - 1);
  const int base = kind == 0 ? -8 : -bias + int(rng() % uint32_t(2 * bias - width));
  int q[32];
  for (int i = 0; i < 32; ++i) q[i] = base + int(rng() % uint32_t(width + 1)) + bias;  // 0 .. 2 * bias - 1
  if (kind == 5) {  // iq4_nl table values only (-10, 1, 13 for q5_0; 1 for q4_0): such blocks embed in iq4_nl
    static constexpr int kTable[] = {-10, 1, 13};
    for (int i = 0; i < 32; ++i) q[i] = (t == GgmlType::kQ4_0 ? 1 : kTable[rng() % 3]) + bias;
  }
  if (t == GgmlType::kQ4_0) {
    for (int j = 0; j < 16; ++j) u[2 + j] = uint8_t(q[j] | (q[j + 16] << 4));
    return;
  }
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    u[6 + j] = uint8_t((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    qh |= uint32_t(q[j] >> 4) << j;
    qh |= uint32_t(q[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(u + 2, &qh, 4);
}

// Levels 0..T (ggml's stored levels) packed into a q4_1 or q5_1 block, its scale and offset kept.
void store_offset_levels(GgmlType t, const int* lv, std::byte* blk) {
  const size_t qs = t == GgmlType::kQ4_1 ? 4 : 8;
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    blk[qs + j] = std::byte(uint8_t((lv[j] & 0x0f) | ((lv[j + 16] & 0x0f) << 4)));
    qh |= uint32_t(lv[j] >> 4 & 1) << j;
    qh |= uint32_t(lv[j + 16] >> 4 & 1) << (j + 16);
  }
  if (t == GgmlType::kQ5_1) std::memcpy(blk + 4, &qh, 4);
}

// q4_1 / q5_1 blocks for the tests below, by b % 6: an offset k times the scale (levels shifted
// by -8 or -16, so they fit q4_0 or q5_0 where the range allows); one f16 step off such a
// multiple; a scale of 1 with an offset of 2^-24 .. 2^-21 and levels 4..7 (every value rounds
// onto its level: the float path embeds it, the integer search must leave it to that path); the
// two end values of equal size and opposite signs (ggml's max by index); random bytes; and
// may_embed's bound for offset sources (exact_requant.cc, offset_source_may_embed): an offset
// of +-2^19 scales exactly, levels spanning 0..16 (q4_1: 0..15), where it skips embed_block, or
// of 2^28 scales, where q5_1's levels 0 and 16 round onto one value that the target holds (all
// levels 0) and it must not.
void craft_offset(GgmlType t, size_t b, std::mt19937& rng, std::byte* blk) {
  const int h = t == GgmlType::kQ4_1 ? 8 : 16;
  const size_t qs = t == GgmlType::kQ4_1 ? 4 : 8;
  if (b % 6 == 5) {
    const int top = t == GgmlType::kQ4_1 ? 15 : 31;
    int lv[32];
    if (b % 12 == 5) {  // d 2^-10, m +-512
      half::store_u16(blk, 0x1400);
      half::store_u16(blk + 2, rng() % 2 ? 0x6000 : 0xe000);
      for (int i = 0; i < 32; ++i) lv[i] = int(rng() % uint32_t(std::min(top, 16) + 1));
      lv[0] = 0;
      lv[1] = std::min(top, 16);
    } else {  // d 2^-14, m 2^14
      half::store_u16(blk, 0x0400);
      half::store_u16(blk + 2, 0x7400);
      for (int i = 0; i < 32; ++i) lv[i] = rng() % 2 ? std::min(top, 16) : 0;
    }
    store_offset_levels(t, lv, blk);
    return;
  }
  float d = half::fp16_to_f32(half::load_u16(blk));
  if (!std::isfinite(d) || d == 0) return;
  uint16_t m = half::load_u16(blk + 2);
  switch (b % 6) {
    case 0: m = half::f32_to_fp16(-float(h) * d); break;
    case 1: m = uint16_t(half::f32_to_fp16(-float(h) * d) + (rng() % 2 ? 1 : -1)); break;
    case 2:
      half::store_u16(blk, 0x3c00);
      for (size_t i = 0; i < 16; ++i) blk[qs + i] = std::byte(uint8_t(4 + rng() % 4) | uint8_t((4 + rng() % 4) << 4));
      if (t == GgmlType::kQ5_1) std::memset(blk + 4, 0, 4);
      m = uint16_t(1u << (rng() % 4));  // 2^-24 .. 2^-21
      break;
    case 3: {
      int8_t lv[32];
      simd::source_levels(t, blk, lv);
      m = half::f32_to_fp16(-float(*std::min_element(lv, lv + 32) + *std::max_element(lv, lv + 32)) * d / 2.0f);
      break;
    }
    default: break;
  }
  half::store_u16(blk + 2, m);
}

TEST(ExactRequant, NoSearchRowEqualsBlockByBlock) {
  const uint16_t scales[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x3c00, 0xb800, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x2e66};
  const simd::Level was = simd::level();
  for (size_t l = 0; l < simd::kLevelCount; ++l) {
    if (!simd::supported(simd::Level(l))) continue;
    ASSERT_TRUE(simd::set_level(simd::Level(l)));
    SCOPED_TRACE(simd::level_name(simd::Level(l)));
    for (const TypeTraits& s : type_traits()) {
      for (const TypeTraits& d : type_traits()) {
        if (!exact_requant_applies(s, d)) continue;
        SCOPED_TRACE(std::string(s.name()) + " -> " + std::string(d.name()));
        std::mt19937 rng(29);
        const size_t sb = s.block_bytes(), db = d.block_bytes(), nb = kN / 32;
        std::vector<std::byte> in(nb * sb);
        for (auto& b : in) b = std::byte(rng() & 0xff);
        for (size_t b = 0; b < nb; ++b) {
          std::byte* blk = in.data() + b * sb;
          if (b % 3 == 0) {  // a named scale
            const uint16_t h = scales[(b / 3) % std::size(scales)];
            blk[0] = std::byte(h & 0xff);
            blk[1] = std::byte(h >> 8);
          }
          if (s.id() == GgmlType::kQ4_0 || s.id() == GgmlType::kQ5_0 || s.id() == GgmlType::kIQ4_NL) {
            craft_levels(s.id(), b, rng, blk);
            continue;
          }
          if (s.id() == GgmlType::kQ4_1 || s.id() == GgmlType::kQ5_1) {
            craft_offset(s.id(), b, rng, blk);
            continue;
          }
          if (s.id() != GgmlType::kQ8_0) continue;
          // q8_0 levels: [-8, 7], [-16, 15], a span of 15 or 16 or 31 or 32 anywhere, the iq4_nl table
          const int kind = int(b % 7);
          const int span = kind == 2 ? 15 : kind == 3 ? 16 : kind == 4 ? 31 : 32;
          const int base = kind == 0 ? -8 : kind == 1 ? -16 : int(rng() % (255 - span)) - 127;
          for (int i = 0; i < 32; ++i) {
            int q = kind == 6 ? quants::kIQ4NLValues[rng() % 16] : base + int(rng() % (span + 1));
            if (kind == 0) q = -8 + int(rng() % 16);
            if (kind == 1) q = -16 + int(rng() % 32);
            blk[2 + i] = std::byte(uint8_t(int8_t(q)));
          }
          if (b % 14 == 5) blk[2 + b % 32] = std::byte(0x80);  // -128, outside q8_0's own range
        }
        auto fast = ExactRequantizer::make(s, d, kN, Search::kNone);
        ASSERT_TRUE(fast.ok());
        std::vector<std::byte> got(fast->dst_row_bytes());
        ASSERT_TRUE(fast->convert(in, got).ok());
        std::vector<std::byte> want(got.size());
        uint64_t exact = 0;
        for (size_t b = 0; b < nb; ++b) {
          auto one = ExactRequantizer::make(s, d, 32, Search::kFull);
          ASSERT_TRUE(one.ok());
          std::span<const std::byte> src(in.data() + b * sb, sb);
          std::span<std::byte> dst(want.data() + b * db, db);
          ASSERT_TRUE(one->convert(src, dst).ok());
          if (one->blocks_exact() == 1) {
            ++exact;
            continue;
          }
          float x[32];
          s.to_f32(src.data(), x, 32);
          d.from_f32(x, dst.data(), 32);
        }
        EXPECT_EQ(got, want);
        EXPECT_EQ(fast->blocks_exact(), exact);
        EXPECT_EQ(fast->blocks_requantized(), nb - exact);
        // The quick search over the row: each block as the quick search makes it alone (nothing
        // carries over from one block to the next).
        auto quick = ExactRequantizer::make(s, d, kN, Search::kQuick);
        ASSERT_TRUE(quick.ok());
        std::vector<std::byte> quick_row(got.size()), quick_blocks(got.size());
        ASSERT_TRUE(quick->convert(in, quick_row).ok());
        for (size_t b = 0; b < nb; ++b) {
          auto one = ExactRequantizer::make(s, d, 32, Search::kQuick);
          ASSERT_TRUE(one.ok());
          ASSERT_TRUE(one->convert(std::span<const std::byte>(in.data() + b * sb, sb),
                                   std::span<std::byte>(quick_blocks.data() + b * db, db))
                          .ok());
        }
        EXPECT_EQ(quick_row, quick_blocks);
        EXPECT_EQ(quick->blocks_exact(), exact);
        const bool crafted = s.id() == GgmlType::kQ8_0 || s.id() == GgmlType::kQ4_0 || s.id() == GgmlType::kQ5_0 ||
                             s.id() == GgmlType::kIQ4_NL ||
                             ((s.id() == GgmlType::kQ4_1 || s.id() == GgmlType::kQ5_1) &&
                              (d.id() == GgmlType::kQ4_0 || d.id() == GgmlType::kQ5_0));
        if (crafted) {
          EXPECT_GT(exact, 0u) << "the crafted levels embed somewhere";
        }
      }
    }
  }
  simd::set_level(was);
}

// The quick search's rows at every level against the scalar level's, byte for byte, on source
// blocks of random bytes with odd scales (0, -0, subnormal, largest, infinite, NaN) and offsets
// (infinite, NaN, 0): the levels whose kernel makes the reference blocks into q4_0 and q5_0
// (make_reference) take a different path through the row from the scalar level's, which makes them
// with one from_f32 over the row, and must write the same bytes, the blocks it leaves to the
// caller included.
TEST(ExactRequant, QuickRowsAreTheSameAtEveryLevel) {
  const uint16_t scales[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x3c00, 0xb800, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x2e66};
  const uint16_t offsets[] = {0x7c00, 0xfc00, 0x7e00, 0x0000, 0xbc00};
  const simd::Level was = simd::level();
  size_t compared = 0;
  for (const TypeTraits& s : type_traits()) {
    for (const TypeTraits& d : type_traits()) {
      if (!exact_requant_applies(s, d)) continue;
      SCOPED_TRACE(std::string(s.name()) + " -> " + std::string(d.name()));
      std::mt19937 rng(41);
      const size_t sb = s.block_bytes(), nb = kN / 32;
      const bool offset = s.id() == GgmlType::kQ4_1 || s.id() == GgmlType::kQ5_1;
      std::vector<std::byte> in(nb * sb);
      for (auto& b : in) b = std::byte(rng() & 0xff);
      for (size_t b = 0; b < nb; ++b) {
        std::byte* blk = in.data() + b * sb;
        uint16_t h = 0x2e66;  // an ordinary scale, ~0.1
        if (b % 3 == 0) h = scales[(b / 3) % std::size(scales)];
        blk[0] = std::byte(h & 0xff);
        blk[1] = std::byte(h >> 8);
        if (offset && b % 5 == 1) {
          const uint16_t m = offsets[(b / 5) % std::size(offsets)];
          blk[2] = std::byte(m & 0xff);
          blk[3] = std::byte(m >> 8);
        }
      }
      ASSERT_TRUE(simd::set_level(simd::Level::kScalar));
      auto ref = ExactRequantizer::make(s, d, kN, Search::kQuick);
      ASSERT_TRUE(ref.ok());
      std::vector<std::byte> want(ref->dst_row_bytes());
      ASSERT_TRUE(ref->convert(in, want).ok());
      for (size_t l = 1; l < simd::kLevelCount; ++l) {
        if (!simd::supported(simd::Level(l))) continue;
        ASSERT_TRUE(simd::set_level(simd::Level(l)));
        auto r = ExactRequantizer::make(s, d, kN, Search::kQuick);
        ASSERT_TRUE(r.ok());
        std::vector<std::byte> got(r->dst_row_bytes(), std::byte{0xa5});
        ASSERT_TRUE(r->convert(in, got).ok());
        EXPECT_EQ(got, want) << "at " << simd::level_name(simd::Level(l));
        EXPECT_EQ(r->blocks_exact(), ref->blocks_exact());
        ++compared;
      }
    }
  }
  simd::set_level(was);
  if (simd::supported(simd::Level::kAvx2) || simd::supported(simd::Level::kNeon)) {
    EXPECT_GT(compared, 0u);
  }
}

// may_embed's test for an offset source (exact_requant.cc, offset_source_may_embed) skips
// embed_block where levels span more than the target's range and the offset is at most 2^19
// scales. Beyond that bound levels can round onto one value: q5_1 with scale 2^-14 and offset 2^14
// (2^28 scales; a float step there is 32 scales) holds levels 0 and 16 as the same value 16384,
// which q4_1 holds exactly (all levels 0), so it must still embed; at 2^19 scales (scale 2^-10,
// offset 512: every value exact) levels 0 and 16 do not fit q4_1, and the row path must say so
// as embed_block itself does.
TEST(ExactRequant, AnOffsetSourceEmbedsWhereItsLevelsRoundOntoTheTargetsRange) {
  const TypeTraits& q51 = *find_traits("q5_1");
  const TypeTraits& q41 = *find_traits("q4_1");
  for (const bool beyond : {true, false}) {
    SCOPED_TRACE(beyond ? "offset 2^28 scales" : "offset 2^19 scales");
    std::vector<std::byte> in(q51.block_bytes());
    half::store_u16(in.data(), beyond ? 0x0400 : 0x1400);
    half::store_u16(in.data() + 2, beyond ? 0x7400 : 0x6000);
    int lv[32];
    for (int i = 0; i < 32; ++i) lv[i] = i % 2 ? 16 : 0;
    store_offset_levels(GgmlType::kQ5_1, lv, in.data());
    float x[32];
    q51.to_f32(in.data(), x, 32);
    EXPECT_EQ(x[0] == x[1], beyond) << x[0] << " " << x[1];
    for (const Search search : {Search::kNone, Search::kQuick, Search::kFull}) {
      auto r = ExactRequantizer::make(q51, q41, 32, search);
      ASSERT_TRUE(r.ok());
      std::vector<std::byte> out(q41.block_bytes());
      ASSERT_TRUE(r->convert(in, out).ok());
      EXPECT_EQ(r->blocks_exact(), beyond ? 1u : 0u) << search_name(search);
      float y[32];
      q41.to_f32(out.data(), y, 32);
      if (beyond) {
        EXPECT_EQ(std::memcmp(x, y, sizeof x), 0) << search_name(search);
      }
    }
  }
}

// may_embed's bit test for q5_0 into q4_0 (a level fits exactly when bit 3 of its nibble differs
// from its qh bit), level by level and position by position: a block of scale 1 whose levels
// are all 0 but one, stored as u at position j, embeds exactly when u - 16 is one of q4_0's.
TEST(ExactRequant, EveryQ5_0LevelAtEveryPositionEmbedsInQ4_0ExactlyWhenQ4_0HasIt) {
  const TypeTraits& q5 = *find_traits("q5_0");
  const TypeTraits& q4 = *find_traits("q4_0");
  constexpr size_t kBlocks = 32 * 32;  // position j, stored level u: block 32 j + u
  std::vector<std::byte> in(kBlocks * q5.block_bytes());
  for (size_t j = 0; j < 32; ++j) {
    for (uint32_t u = 0; u < 32; ++u) {
      uint8_t* b = reinterpret_cast<uint8_t*>(in.data() + (32 * j + u) * q5.block_bytes());
      b[0] = 0x00, b[1] = 0x3c;             // d = 1
      uint32_t qh = 0xffffffffu;            // every other level 0: stored 16 (nibble 0, qh bit 1)
      std::memset(b + 6, 0, 16);
      qh = (qh & ~(1u << j)) | ((u >> 4) << j);
      b[6 + j % 16] |= uint8_t((u & 15) << (j < 16 ? 0 : 4));
      std::memcpy(b + 2, &qh, 4);
    }
  }
  auto r = ExactRequantizer::make(q5, q4, kBlocks * 32, Search::kNone);
  ASSERT_TRUE(r.ok());
  std::vector<std::byte> out(r->dst_row_bytes());
  ASSERT_TRUE(r->convert(in, out).ok());
  for (size_t j = 0; j < 32; ++j) {
    for (uint32_t u = 0; u < 32; ++u) {
      const size_t blk = 32 * j + u;
      // the level back from the source block, so that the crafting above is checked too
      float x[32];
      q5.to_f32(in.data() + blk * q5.block_bytes(), x, 32);
      ASSERT_EQ(x[j], float(int(u) - 16)) << "position " << j << ", stored level " << u;
      const bool fits = u >= 8 && u <= 23;
      const auto* o = reinterpret_cast<const uint8_t*>(out.data() + blk * q4.block_bytes());
      EXPECT_EQ(o[0] == 0x00 && o[1] == 0x3c, fits) << "position " << j << ", stored level " << u;
      if (fits) {
        float y[32];
        q4.to_f32(out.data() + blk * q4.block_bytes(), y, 32);
        EXPECT_EQ(std::memcmp(x, y, sizeof(x)), 0) << "position " << j << ", stored level " << u;
      }
    }
  }
  EXPECT_EQ(r->blocks_exact(), 32u * 16u);
}

struct PinnedBytes {
  const char *src, *dst, *hash;
};

// FNV-1a 64 of the requantized bytes of five value distributions, for every pair, against `want`
// at every SIMD level. No infinite or NaN values or scales: which NaN an operation makes is the
// hardware's (x86-64 and aarch64 differ; tests/cross/run.sh), and these bytes hold on both.
// KVSNAP_PRINT_PINNED=1 prints the table this code gives.
void expect_pinned(Search search, std::span<const PinnedBytes> want) {
  const bool print = std::getenv("KVSNAP_PRINT_PINNED") != nullptr;
  const simd::Level was = simd::level();
  for (size_t l = 0; l < simd::kLevelCount; ++l) {
    if (!simd::supported(simd::Level(l))) continue;
    ASSERT_TRUE(simd::set_level(simd::Level(l)));
    size_t checked = 0;
    for (const TypeTraits& s : type_traits()) {
      for (const TypeTraits& d : type_traits()) {
        if (!exact_requant_applies(s, d)) continue;
        uint64_t h = 0xcbf29ce484222325ull;
        for (testing::Dist dist : {testing::Dist::kKvLike, testing::Dist::kGauss, testing::Dist::kSparse,
                                   testing::Dist::kOutliers, testing::Dist::kTinyScale}) {
          const std::vector<float> x = testing::random_rows(dist, 3, 4, 256);
          std::vector<std::byte> src(x.size() / 32 * s.block_bytes());
          s.from_f32(x.data(), src.data(), x.size());
          auto r = ExactRequantizer::make(s, d, 256, search);
          ASSERT_TRUE(r.ok());
          std::vector<std::byte> out(4 * r->dst_row_bytes());
          ASSERT_TRUE(r->convert(src, out).ok());
          h = testing::fnv1a_of(out, h);
        }
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
        if (print && l == 0) std::printf("    {\"%s\", \"%s\", \"%s\"},\n", std::string(s.name()).c_str(),
                                         std::string(d.name()).c_str(), hex);
        for (const PinnedBytes& w : want) {
          if (s.name() == w.src && d.name() == w.dst) {
            EXPECT_EQ(std::string(hex), w.hash) << s.name() << " -> " << d.name() << " at " << simd::level_name(simd::Level(l));
            ++checked;
          }
        }
      }
    }
    EXPECT_EQ(checked, want.size()) << "every pinned pair is still a pair the requantizer takes";
  }
  simd::set_level(was);
}

// The full search's bytes for every pair, pinned: the search is a chain of float and double
// operations whose order decides near ties, so a change that alters any choice shows up here. The
// hashes come from the search as it was before it scored candidates as it found them, four at a
// time, without libm calls (those changes kept every byte).
TEST(ExactRequant, BytesArePinned) {
  static const PinnedBytes kWant[] = {
#include "exact_requant_pinned.inc"
  };
  expect_pinned(Search::kFull, kWant);
}

// The quick search's bytes, pinned the same way (made by its scalar code when it was written).
// Every level runs its own QuickSearchFn, so this also holds the SIMD kernels to the scalar one on
// real blocks.
TEST(ExactRequant, QuickBytesArePinned) {
  static const PinnedBytes kWant[] = {
#include "exact_requant_quick_pinned.inc"
  };
  expect_pinned(Search::kQuick, kWant);
}

// Every QuickSearchFn against the scalar one, bit for bit: which blocks it replaces, and with
// what scale, offset and levels. Batches of 1 to 8 blocks on every linear grid (q8_0's
// included), with and without an offset; values on and off the grid at scales from tiny to huge
// and negative; levels that clamp at both ends and land on rounding ties (power-of-two scales);
// reference blocks near and far from the values; and blocks the search must leave alone or whose
// candidates it must skip: non-finite values, zero, subnormal, huge, infinite and NaN scales, an
// infinite offset, an offset that swamps the scale, a zero error.
TEST(ExactRequant, QuickSearchKernelsMatchTheScalarOne) {
  std::mt19937 rng(71);
  std::normal_distribution<float> g(0.f, 1.f);
  static constexpr float kLo[] = {-8, -16, -127, 0, 0, -127}, kHi[] = {7, 15, 127, 15, 31, 113};
  static constexpr uint16_t kOddScales[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x0001, 0x8003, 0x7bff, 0xfbff};
  struct Trial {
    float x[8][32], y[8][32];
    int8_t ref[8][32];
    int n = 0;
    mutable uint32_t asked = 0;  // the blocks whose reference levels were asked for
    mutable bool asked_past_n = false;
  };
  const simd::Level was = simd::level();
  for (size_t l = 0; l < simd::kLevelCount; ++l) {
    if (!simd::supported(simd::Level(l))) continue;
    ASSERT_TRUE(simd::set_level(simd::Level(l)));
    SCOPED_TRACE(simd::level_name(simd::Level(l)));
    const simd::QuickSearchFn search = simd::find_quick_search();
    rng.seed(71);
    size_t improved = 0, fitted = 0, from_reference = 0;
    for (int t = 0; t < 4800; ++t) {
      const int grid = t % 6;  // 5: iq4_nl's table
      const bool offset = grid == 3 || grid == 4, table = grid == 5;
      Trial tr;
      simd::QuickSearchBlocks want;
      want.n = 1 + int(rng() % 8);
      want.grid = table ? simd::RequantGrid::kIq4nl : offset ? simd::RequantGrid::kOffset : simd::RequantGrid::kSymmetric;
      want.lo = kLo[grid];
      want.hi = kHi[grid];
      want.ctx = &tr;
      want.ref_levels = [](const void* ctx, int k, int8_t* q) {
        const Trial& tr = *static_cast<const Trial*>(ctx);
        if (k < 0 || k >= tr.n) {
          tr.asked_past_n = true;
          std::memset(q, 0, 32);
          return;
        }
        tr.asked |= 1u << k;
        std::memcpy(q, tr.ref[k], 32);
      };
      for (int k = 0; k < want.n; ++k) {
        const float scale = std::ldexp(1.0f, int(rng() % 30) - 20);
        const float sign = rng() % 5 == 0 ? -1.0f : 1.0f;
        // every sixth block a power-of-two scale, so that the half levels below are exact ties
        const float d = rng() % 6 == 0 ? scale * sign : scale * (0.5f + float(rng() % 1000) / 1000.0f) * sign;
        const float m = offset ? -8.0f * d + scale * g(rng) * 0.1f : 0.0f;
        const float spread = grid == 2 ? 60.0f : 12.0f;
        const bool on_grid = rng() % 3 == 0;
        for (int i = 0; i < 32; ++i) {
          // on iq4_nl's grid: its values and the midpoints between them, beyond both ends too
          const int j = int(rng() % 15);
          const float mid = 0.5f * float(quants::kIQ4NLValues[j] + quants::kIQ4NLValues[j + 1]);
          const float on_table = rng() % 2 ? float(quants::kIQ4NLValues[rng() % 16]) : rng() % 8 ? mid : 1.3f * mid;
          tr.x[k][i] = on_grid && table ? on_table * d
                       : on_grid ? (float(int(rng() % uint32_t(4 * kHi[grid] + 8)) - int(2 * kHi[grid] + 4)) * 0.5f) * d + m
                                 : g(rng) * spread * std::fabs(d) + m;
        }
        // The reference block: the values on a scale near d (as ggml's would be), its levels and
        // their decoded values; every fourth block levels and values that disagree with them.
        const uint16_t d16 = half::f32_to_fp16(d * (0.9f + 0.2f * float(rng() % 100) / 100.0f));
        const uint16_t m16 = offset ? half::f32_to_fp16(m) : 0;
        const float dd = half::fp16_to_f32(d16), mm = half::fp16_to_f32(m16);
        const bool noisy = rng() % 4 == 0;
        for (int i = 0; i < 32; ++i) {
          float n = std::nearbyint((tr.x[k][i] - mm) / dd);
          n = std::min(std::max(n, want.lo), want.hi);
          if (table) n = float(quants::kIQ4NLValues[quants::ref::iq4_nl_best_index(tr.x[k][i] / dd)]);
          const int8_t any = table ? quants::kIQ4NLValues[rng() % 16]
                                   : int8_t(int(want.lo) + int(rng() % uint32_t(want.hi - want.lo + 1)));
          tr.ref[k][i] = noisy ? any : int8_t(n);
          tr.y[k][i] = noisy ? tr.x[k][i] + g(rng) * dd : n * dd + mm;
        }
        want.d16[k] = d16;
        want.m16[k] = m16;
        switch (rng() % 24) {  // the odd blocks
          case 0: want.d16[k] = kOddScales[rng() % std::size(kOddScales)]; break;
          case 1: tr.x[k][rng() % 32] = (rng() % 2 ? 1 : -1) * std::numeric_limits<float>::infinity(); break;
          case 2: tr.y[k][rng() % 32] = std::numeric_limits<float>::quiet_NaN(); break;
          case 3: want.m16[k] = offset ? 0x7c00 : 0; break;
          case 4:  // an offset that swamps the scale: levels collapse in the decoded values
            if (offset) {
              want.m16[k] = half::f32_to_fp16(4096.0f);
              want.d16[k] = half::f32_to_fp16(0.01f);
              for (int i = 0; i < 32; ++i) tr.x[k][i] = 4096.0f + g(rng) * 0.05f;
            }
            break;
          case 5: std::memcpy(tr.y[k], tr.x[k], sizeof tr.y[k]); break;  // no error to reduce
          case 6: std::fill(std::begin(tr.x[k]), std::end(tr.x[k]), 0.0f); break;
          default: break;
        }
        want.x[k] = tr.x[k];
        want.y[k] = tr.y[k];
      }
      tr.n = want.n;
      simd::QuickSearchBlocks got = want;
      simd::quick_search_ref(want);
      const uint32_t asked_by_ref = tr.asked;
      tr.asked = 0;
      search(got);
      ASSERT_FALSE(tr.asked_past_n) << "trial " << t << ": reference levels asked for a block past n";
      ASSERT_EQ(tr.asked, asked_by_ref) << "trial " << t << ": the blocks whose reference levels are asked for";
      ASSERT_EQ(got.improved, want.improved) << "trial " << t;
      // a block whose reference levels were asked for had no factor do better: the fit from them won
      from_reference += size_t(std::popcount(want.improved & asked_by_ref));
      for (int k = 0; k < want.n; ++k) {
        if (!(want.improved >> k & 1)) continue;
        ++improved;
        const bool fit = want.out_d16[k] != half::f32_to_fp16(half::fp16_to_f32(want.d16[k]) * 0.94f) &&
                           want.out_d16[k] != half::f32_to_fp16(half::fp16_to_f32(want.d16[k]) * 0.97f) &&
                           want.out_d16[k] != half::f32_to_fp16(half::fp16_to_f32(want.d16[k]) * 1.03f) &&
                           want.out_d16[k] != half::f32_to_fp16(half::fp16_to_f32(want.d16[k]) * 1.06f);
        fitted += fit;
        ASSERT_EQ(got.out_d16[k], want.out_d16[k]) << "trial " << t << " block " << k;
        ASSERT_EQ(got.out_m16[k], want.out_m16[k]) << "trial " << t << " block " << k;
        ASSERT_EQ(std::memcmp(got.levels[k], want.levels[k], 32), 0) << "trial " << t << " block " << k;
      }
    }
    EXPECT_GT(improved, 5000u) << "the candidates win somewhere";
    EXPECT_GT(fitted, 500u) << "the least-squares candidate wins somewhere";
    EXPECT_GT(from_reference, 50u) << "the least-squares fit from the reference's levels wins somewhere";
  }
  simd::set_level(was);
}

// The quick search kernels that make the reference blocks themselves (make_reference: q4_0 and
// q5_0, at the levels that have one) against the path without: ggml's reference quantizer
// (quants::ref), its block decoded, and the scalar search. For every block the kernel says it made
// (`referenced`), the same result, improved or not: scale and levels; and it makes exactly the
// blocks whose values are all finite (their float sum too), not all zero, and whose reference
// scale has a finite reciprocal. Values: on and off the grid (q5_0's levels on ties), scales from
// subnormal to beyond f16's range, the largest |x| twice with both signs (ggml keeps the first),
// -0, infinities, NaNs, a block of zeros, and a maximum too small for its reciprocal.
TEST(ExactRequant, QuickSearchKernelsMakeGgmlsReferenceBlocks) {
  std::mt19937 rng(97);
  std::normal_distribution<float> g(0.f, 1.f);
  const float inf = std::numeric_limits<float>::infinity();
  const simd::Level was = simd::level();
  size_t levels_with_kernel = 0;
  for (size_t l = 0; l < simd::kLevelCount; ++l) {
    if (!simd::supported(simd::Level(l))) continue;
    ASSERT_TRUE(simd::set_level(simd::Level(l)));
    SCOPED_TRACE(simd::level_name(simd::Level(l)));
    const simd::QuickSearchFn search = simd::find_quick_search_reference();
    if (search == nullptr) continue;
    ++levels_with_kernel;
    rng.seed(97);
    size_t referenced = 0, improved = 0, left = 0;
    for (int t = 0; t < 3000; ++t) {
      const bool five = t % 2 == 1;  // q5_0, else q4_0
      const float lo = five ? -16.f : -8.f, hi = five ? 15.f : 7.f;
      float x[8][32];
      simd::QuickSearchBlocks got;
      got.n = 1 + int(rng() % 8);
      got.grid = simd::RequantGrid::kSymmetric;
      got.lo = lo;
      got.hi = hi;
      got.make_reference = true;
      for (int k = 0; k < got.n; ++k) {
        const float scale = std::ldexp(1.0f, int(rng() % 60) - 40);
        const bool on_grid = rng() % 3 == 0;
        for (int i = 0; i < 32; ++i) {
          x[k][i] = on_grid ? float(int(rng() % 32) - 16) * scale : g(rng) * scale;
        }
        switch (rng() % 20) {
          case 0: {  // the largest |x| twice, with both signs
            const int a = int(rng() % 32), b = int(rng() % 32);
            x[k][a] = 40.0f * scale;
            x[k][b] = -40.0f * scale;
            break;
          }
          case 1: x[k][rng() % 32] = rng() % 2 ? inf : -inf; break;
          case 2: x[k][rng() % 32] = std::numeric_limits<float>::quiet_NaN(); break;
          case 3: std::fill(std::begin(x[k]), std::end(x[k]), rng() % 2 ? 0.0f : -0.0f); break;
          case 4: x[k][rng() % 32] = -0.0f; break;
          case 5:  // a maximum whose scale has no finite reciprocal, or a subnormal one
            for (float& v : x[k]) v = g(rng) * std::ldexp(1.0f, rng() % 2 ? -130 : -125);
            break;
          case 6:  // beyond f16: the reference scale is stored as an infinity
            for (float& v : x[k]) v = g(rng) * 3e5f;
            break;
          case 7:  // a sum that overflows float: left to the caller
            for (float& v : x[k]) v = 3e38f;
            break;
          case 8:  // one that overflows in the kernel's order (i % 8 first) but not from left to right
            for (int i = 0; i < 32; ++i) x[k][i] = i % 2 ? 2e38f : -2e38f;
            break;
          case 9:  // one huge value among ordinary ones: made, its scale stored as an f16 infinity
            x[k][rng() % 32] = (rng() % 2 ? 1.0f : -1.0f) * 3e38f;
            break;
          case 10: {  // a scale at the edge of f16's range: max / 8 or / 16 in [65504, 65520)
            const float edge = (65504.0f + float(rng() % 17)) * (five ? 16.0f : 8.0f);
            x[k][rng() % 32] = rng() % 2 ? edge : -edge;
            for (float& v : x[k]) v = std::fabs(v) == edge ? v : g(rng) * 1e5f;
            break;
          }
          case 11:  // subnormal values beside a normal maximum
            for (int i = 0; i < 32; ++i) x[k][i] = i % 3 ? g(rng) * 1e-40f : g(rng) * scale;
            break;
          default: break;
        }
        got.x[k] = x[k];
      }
      search(got);
      ASSERT_EQ(got.referenced >> got.n, 0u) << "trial " << t << ": a block past n made";
      ASSERT_EQ(got.improved >> got.n, 0u) << "trial " << t << ": a block past n improved";
      ASSERT_EQ(got.improved & ~got.referenced, 0u) << "trial " << t << ": an improved block not made";
      for (int k = 0; k < got.n; ++k) {
        std::byte ref[22];
        float y[32];
        five ? quants::ref::q5_0_from_f32(x[k], ref, 32) : quants::ref::q4_0_from_f32(x[k], ref, 32);
        five ? quants::ref::q5_0_to_f32(ref, y, 32) : quants::ref::q4_0_to_f32(ref, y, 32);
        const uint16_t d16 = half::load_u16(ref);
        int8_t ref_levels[32];
        uint32_t qh = 0;
        if (five) std::memcpy(&qh, ref + 2, 4);
        const uint8_t* qs = reinterpret_cast<const uint8_t*>(ref) + (five ? 6 : 2);
        for (int j = 0; j < 16; ++j) {
          ref_levels[j] = int8_t((qs[j] & 0x0f) + (five ? ((qh >> j) & 1) << 4 : 0) + int(lo));
          ref_levels[j + 16] = int8_t((qs[j] >> 4) + (five ? ((qh >> (j + 16)) & 1) << 4 : 0) + int(lo));
        }
        // which blocks the kernel must make (its sum: 8 partial sums of i = l, l + 8, ..., then
        // pairwise, so that an overflow is predicted exactly)
        float amax = 0, max = 0, part[8] = {};
        for (int i = 0; i < 32; ++i) {
          const float v = x[k][i];
          if (amax < std::fabs(v)) {
            amax = std::fabs(v);
            max = v;
          }
          part[i % 8] += v;
        }
        const float sum = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
        const float id = 1.0f / (max / lo);
        const bool plain = std::isfinite(sum) && std::isfinite(id) && amax > 0;
        ASSERT_EQ(bool(got.referenced >> k & 1), plain) << "trial " << t << " block " << k;
        if (!plain) {
          ++left;
          continue;
        }
        ++referenced;
        simd::QuickSearchBlocks want;
        want.n = 1;
        want.grid = simd::RequantGrid::kSymmetric;
        want.lo = lo;
        want.hi = hi;
        want.x[0] = x[k];
        want.y[0] = y;
        want.d16[0] = d16;
        want.ctx = ref_levels;
        want.ref_levels = [](const void* ctx, int, int8_t* q) { std::memcpy(q, ctx, 32); };
        simd::quick_search_ref(want);
        const bool better = want.improved & 1;
        ASSERT_EQ(bool(got.improved >> k & 1), better) << "trial " << t << " block " << k;
        improved += better;
        ASSERT_EQ(got.out_d16[k], better ? want.out_d16[0] : d16) << "trial " << t << " block " << k;
        ASSERT_EQ(std::memcmp(got.levels[k], better ? want.levels[0] : ref_levels, 32), 0)
            << "trial " << t << " block " << k;
      }
    }
    EXPECT_GT(referenced, 8000u) << "the kernel makes most reference blocks";
    EXPECT_GT(improved, 4000u) << "and improves on many";
    EXPECT_GT(left, 500u) << "and leaves the odd ones to the caller";
  }
  simd::set_level(was);
#ifdef KVSNAP_SIMD_X86
  if (simd::supported(simd::Level::kAvx2)) {
    EXPECT_GT(levels_with_kernel, 0u) << "the AVX2 kernel was tested";
  }
#endif
}

// Every LevelSearchFn against the scalar one, byte for byte, and which blocks it finds exact:
// batches of 1 to 8 blocks of every integer-level source into q4_0 and q5_0, with scales from
// subnormal to f16's largest and negative; random levels; levels the target holds (exact); all
// one level (q8_0's and q4_0's zeros; q5_0's -16, iq4_nl's -127); q8_0's extremes -128 and 127
// only; the largest |level| with both signs (ggml keeps the first), in either order.
TEST(ExactRequant, LevelSearchKernelsMatchTheScalarOne) {
  std::mt19937 rng(113);
  const simd::Level was = simd::level();
  static constexpr uint16_t kScales[] = {0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3555,
                                         0x7bff, 0xfbff, 0x2e66, 0x1234, 0xa0f1};
  const GgmlType sources[] = {GgmlType::kQ8_0, GgmlType::kQ4_0,   GgmlType::kQ5_0,
                              GgmlType::kIQ4_NL, GgmlType::kQ4_1, GgmlType::kQ5_1};
  size_t compared = 0, compared_to_ggml = 0, declined = 0, offset_embedded = 0;
  for (size_t l = 1; l < simd::kLevelCount; ++l) {
    if (!simd::supported(simd::Level(l))) continue;
    ASSERT_TRUE(simd::set_level(simd::Level(l)));
    const simd::LevelSearchFn fn = simd::find_level_search();
    if (fn == simd::level_search_ref) continue;
    for (GgmlType st : sources) {
      const size_t sb = find_traits(st)->block_bytes();
      for (GgmlType dt : {GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_1, GgmlType::kQ5_1}) {
        const size_t db = find_traits(dt)->block_bytes();
        const bool offset_target = dt == GgmlType::kQ4_1 || dt == GgmlType::kQ5_1;
        for (int trial = 0; trial < 400; ++trial) {
          SCOPED_TRACE(std::string(find_traits(st)->name()) + " -> " + std::string(find_traits(dt)->name()) + " trial " +
                       std::to_string(trial) + " at " + simd::level_name(simd::Level(l)));
          const int n = 1 + trial % 8;
          std::vector<std::byte> src(8 * sb), got(8 * db, std::byte{0x5a}), want(8 * db, std::byte{0x5a});
          for (auto& b : src) b = std::byte(rng() & 0xff);
          for (int k = 0; k < n; ++k) {
            std::byte* blk = src.data() + k * sb;
            const int kind = int(rng() % 6);
            uint8_t* body = reinterpret_cast<uint8_t*>(blk) + 2;
            const size_t body_bytes = sb - 2;
            if (kind == 1) std::memset(body, 0, body_bytes);  // one level throughout
            if (kind == 2 && st == GgmlType::kQ8_0) {         // the target's range only: exact
              const int span = dt == GgmlType::kQ4_0 ? 16 : 32;
              for (int i = 0; i < 32; ++i) body[i] = uint8_t(int8_t(int(rng() % span) - span / 2));
            }
            if (kind == 3 && st == GgmlType::kQ8_0) {  // the extremes only
              for (int i = 0; i < 32; ++i) body[i] = uint8_t(int8_t(rng() % 2 ? -128 : 127));
            }
            if (kind == 4 && st == GgmlType::kQ8_0) {  // the largest |level| with both signs
              for (int i = 0; i < 32; ++i) body[i] = uint8_t(int8_t(int(rng() % 101) - 50));
              const int a = int(rng() % 32), b = int(rng() % 32), m = 60 + int(rng() % 68);
              body[a] = uint8_t(int8_t(m));
              body[b] = uint8_t(int8_t(-m));
            }
            if (kind == 5 && st == GgmlType::kQ4_0) {  // nibbles 0 and 15 only (levels -8 and 7)
              for (size_t i = 0; i < 16; ++i) body[i] = uint8_t(rng() % 2 ? 0x0f : 0xf0);
            }
            uint16_t h = rng() % 3 ? kScales[rng() % std::size(kScales)]
                                   : uint16_t((rng() % 0x7bff + 1) | (rng() % 2 ? 0x8000 : 0));
            if (kind == 3 && rng() % 2) h = 0x6bd0;  // |max| 127 x ~4000: the factors' scales overflow f16
            blk[0] = std::byte(h & 0xff);
            blk[1] = std::byte(h >> 8);
            if (st == GgmlType::kQ4_1 || st == GgmlType::kQ5_1) {
              // the offset: random finite; k times the scale (embeds where the levels fit); within
              // 2^-15 of such a multiple (declined); the two ends' values of equal size (declined)
              const float d = half::fp16_to_f32(h);
              uint16_t m = uint16_t(rng() % 0x7c00) | uint16_t(rng() % 2 ? 0x8000 : 0);
              const int mode = int(rng() % 5);
              if (mode == 1) m = half::f32_to_fp16(d * float(int(rng() % 41) - 28));
              if (mode == 2) {  // a tiny offset beside a large scale: exact value n d + m rounds onto n d
                h = 0x3c00;  // 1.0
                blk[0] = std::byte(0x00);
                blk[1] = std::byte(0x3c);
                m = uint16_t(rng() % 4 + 1);  // 2^-24 .. 2^-22
              }
              if (mode == 3) {  // m = -(smallest + largest level) d / 2: x_lo = -x_hi (where exact)
                int8_t lv[32];
                simd::source_levels(st, blk, lv);
                const int sum_ends = *std::min_element(lv, lv + 32) + *std::max_element(lv, lv + 32);
                m = half::f32_to_fp16(-float(sum_ends) * d / 2.0f);
              }
              blk[2] = std::byte(m & 0xff);
              blk[3] = std::byte(m >> 8);
            }
          }
          simd::LevelSearchBlocks a, b;
          a.n = b.n = n;
          a.src_type = b.src_type = st;
          a.dst_type = b.dst_type = dt;
          for (int k = 0; k < n; ++k) {
            a.src[k] = b.src[k] = src.data() + k * sb;
            a.dst[k] = got.data() + k * db;
            b.dst[k] = want.data() + k * db;
          }
          const bool offset = st == GgmlType::kQ4_1 || st == GgmlType::kQ5_1;
          if (offset) {  // the caller gives an offset source's blocks only with a finite offset
            for (int k = 0; k < n; ++k) {
              std::byte* blk = src.data() + k * sb;
              if ((half::load_u16(blk + 2) & 0x7c00) == 0x7c00) blk[3] = std::byte(0x3b);
            }
          }
          fn(a);
          simd::level_search_ref(b);
          ASSERT_EQ(got, want);
          ASSERT_EQ(a.embedded, b.embedded);
          ASSERT_EQ(a.declined, b.declined);
          if (!offset && !offset_target) {
            EXPECT_EQ(b.declined, 0u);
          }
          if (offset_target) {
            EXPECT_EQ(b.embedded, 0u);  // every block the target may hold is declined (the float path's)
          }
          declined += size_t(std::popcount(b.declined));
          for (int k = 0; k < n; ++k) {
            if (b.declined >> k & 1) {  // not written
              EXPECT_TRUE(std::all_of(want.begin() + k * db, want.begin() + (k + 1) * db, [](std::byte v) { return v == std::byte{0x5a}; }));
            }
            if (offset && !offset_target && !((b.embedded | b.declined) >> k & 1)) {  // searched: the target cannot hold it at ds
              float x[32];
              find_traits(st)->to_f32(src.data() + k * sb, x, 32);
              const float d = half::fp16_to_f32(half::load_u16(src.data() + k * sb));
              const int lo = dt == GgmlType::kQ4_0 ? -8 : -16;
              const bool holds = std::all_of(x, x + 32, [&](float v) {
                const float r = v / d;
                return r == std::nearbyint(r) && r >= float(lo) && r <= float(-lo - 1) && r * d == v;
              });
              EXPECT_FALSE(holds) << "block " << k << " embeds at its own scale but was searched";
            }
            if (offset && (b.embedded >> k & 1)) {  // exact: every value decodes as it was
              float x[32], y[32];
              find_traits(st)->to_f32(src.data() + k * sb, x, 32);
              find_traits(dt)->to_f32(want.data() + k * db, y, 32);
              for (int i = 0; i < 32; ++i) ASSERT_EQ(x[i], y[i]) << "block " << k << " value " << i;
              ++offset_embedded;
            }
          }
          // Never worse than ggml's reference block (quants::ref, not the search's own), by the exact
          // error against the source's values (up to the rounding of the search's double error; an
          // offset source's: against n ds + ms, which its search scores, not their floats).
          for (int k = 0; k < n; ++k) {
            if ((b.embedded | b.declined) >> k & 1) continue;
            float x[32], y[32], r[32];
            long double exact_x[32];
            std::byte ref[32];
            find_traits(st)->to_f32(src.data() + k * sb, x, 32);
            for (int i = 0; i < 32; ++i) exact_x[i] = x[i];
            if (offset) {
              int8_t lv[32];
              simd::source_levels(st, src.data() + k * sb, lv);
              const long double d = half::fp16_to_f32(half::load_u16(src.data() + k * sb));
              const long double m = half::fp16_to_f32(half::load_u16(src.data() + k * sb + 2));
              for (int i = 0; i < 32; ++i) exact_x[i] = lv[i] * d + m;
            }
            find_traits(dt)->to_f32(want.data() + k * db, y, 32);
            if (dt == GgmlType::kQ4_0) {
              quants::ref::q4_0_from_f32(x, ref, 32);
              quants::ref::q4_0_to_f32(ref, r, 32);
            } else if (dt == GgmlType::kQ5_0) {
              quants::ref::q5_0_from_f32(x, ref, 32);
              quants::ref::q5_0_to_f32(ref, r, 32);
            } else if (dt == GgmlType::kQ4_1) {
              quants::ref::q4_1_from_f32(x, ref, 32);
              quants::ref::q4_1_to_f32(ref, r, 32);
            } else {
              quants::ref::q5_1_from_f32(x, ref, 32);
              quants::ref::q5_1_to_f32(ref, r, 32);
            }
            long double e_out = 0, e_ref = 0;
            for (int i = 0; i < 32; ++i) {
              e_out += (exact_x[i] - y[i]) * (exact_x[i] - y[i]);
              e_ref += (exact_x[i] - r[i]) * (exact_x[i] - r[i]);
            }
            if (!std::isfinite(static_cast<double>(e_ref))) continue;  // an f16 scale out of range: nothing to compare
            ASSERT_LE(e_out, e_ref * (1 + 1e-9L)) << "block " << k;
            ++compared_to_ggml;
          }
          ++compared;
        }
      }
    }
  }
  simd::set_level(was);
  if (simd::supported(simd::Level::kAvx2) || simd::supported(simd::Level::kNeon)) {
    EXPECT_GT(compared, 0u) << "a SIMD level search kernel was tested";
    EXPECT_GT(compared_to_ggml, 1000u) << "searched blocks were compared with ggml's reference block";
    EXPECT_GT(declined, 50u) << "offset blocks the kernels decline were made";
    EXPECT_GT(offset_embedded, 50u) << "offset blocks the target holds exactly were made";
  }
}

TEST(ExactRequant, RefusesPairsItIsNotFor) {
  EXPECT_FALSE(ExactRequantizer::make(*find_traits("f16"), *find_traits("q8_0"), kN, Search::kFull).ok());
  EXPECT_FALSE(ExactRequantizer::make(*find_traits("q8_0"), *find_traits("q8_0"), kN, Search::kFull).ok());
  EXPECT_FALSE(ExactRequantizer::make(*find_traits("q8_0"), *find_traits("q4_0"), 31, Search::kFull).ok());
}

// Every pair of two different quantized KV types, and only those: the grids of exact_requant.cc
// cover the whole table (its static_assert), so no quantized type is left out or assumed.
TEST(ExactRequant, AppliesToEveryPairOfDifferentQuantizedTypes) {
  for (const TypeTraits& s : type_traits()) {
    for (const TypeTraits& d : type_traits()) {
      EXPECT_EQ(exact_requant_applies(s, d), s.quantized() && d.quantized() && s.id() != d.id())
          << s.name() << " -> " << d.name();
    }
  }
}

// The integer quick search into an offset target (simd_kernels.h, "An offset target"; scalar only
// so far): from every source it takes (its levels more than q4_1's or q5_1's span apart), on
// K-like rows quantized as llama.cpp stores them and on random bytes. A block it searches has an
// error (decoded, against the source's values, in double) never above ggml's reference block of
// the same values, and is that block, bytes and all, where the search found nothing better; a
// block whose levels the target could hold at the source's own scale is declined (the float
// path's embed_block decides it). On the K-like rows its mean error is within 2% of the float quick
// search's (ExactRequantizer, --requant quick), which it is meant to replace.
TEST(ExactRequant, OffsetTargetSearchIsNeverWorseThanTheReferenceBlock) {
  struct Pair {
    const char* src;
    const char* dst;
  };
  const Pair pairs[] = {{"q5_0", "q4_1"}, {"q5_1", "q4_1"}, {"iq4_nl", "q4_1"},
                        {"q8_0", "q4_1"}, {"iq4_nl", "q5_1"}, {"q8_0", "q5_1"}};
  for (const Pair& p : pairs) {
    SCOPED_TRACE(std::string(p.src) + " -> " + p.dst);
    const TypeTraits& s = *find_traits(p.src);
    const TypeTraits& d = *find_traits(p.dst);
    const int top = d.id() == GgmlType::kQ5_1 ? 31 : 15;
    constexpr size_t kBlocks = 4096;
    std::mt19937 rng(5);
    std::vector<float> v(kBlocks * 32);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (size_t b = 0; b < kBlocks; ++b) {
      const float scale = std::exp(nd(rng));
      for (int i = 0; i < 32; ++i) v[b * 32 + i] = nd(rng) * scale + (b % 4 == 0 ? scale : 0.0f);
    }
    std::vector<std::byte> src(kBlocks * s.block_bytes());
    s.from_f32(v.data(), src.data(), v.size());
    for (size_t b = kBlocks - 256; b < kBlocks; ++b) {  // random bytes, finite scales and offsets
      std::byte* blk = src.data() + b * s.block_bytes();
      for (size_t i = 0; i < s.block_bytes(); ++i) blk[i] = std::byte(rng() & 0xff);
      half::store_u16(blk, uint16_t((rng() & 0x83ff) | ((1 + rng() % 29) << 10)));
      if (s.id() == GgmlType::kQ5_1) half::store_u16(blk + 2, uint16_t((rng() & 0x83ff) | ((1 + rng() % 29) << 10)));
    }
    size_t searched = 0, improved = 0, declined = 0;
    double err_int = 0, err_float = 0;
    for (size_t b = 0; b < kBlocks; ++b) {
      const std::byte* blk = src.data() + b * s.block_bytes();
      int8_t n[32];
      simd::source_levels(s.id(), blk, n);
      const int span = *std::max_element(n, n + 32) - *std::min_element(n, n + 32);
      const simd::OffsetTargetResult r = simd::offset_target_block(s.id(), d.id(), blk);
      float x[32];
      s.to_f32(blk, x, 32);
      const float ds = half::fp16_to_f32(half::load_u16(blk));
      const float ms = s.id() == GgmlType::kQ5_1 ? half::fp16_to_f32(half::load_u16(blk + 2)) : 0.0f;
      const bool beyond = s.id() == GgmlType::kQ5_1 && !(std::fabs(ms) <= 524288.0f * std::fabs(ds));
      ASSERT_EQ(r.declined, span <= top || beyond) << "block " << b;
      if (r.declined) {
        ++declined;
        continue;
      }
      ++searched;
      std::vector<std::byte> got(d.block_bytes()), ref(d.block_bytes());
      simd::target_offset_block(d.id(), r.d16, r.m16, r.levels, got.data());
      d.from_f32(x, ref.data(), 32);  // ggml's reference block (the level's from_f32: the same bytes)
      float yg[32], yr[32];
      d.to_f32(got.data(), yg, 32);
      d.to_f32(ref.data(), yr, 32);
      double eg = 0, er = 0;
      for (int i = 0; i < 32; ++i) {
        eg += (double(x[i]) - yg[i]) * (double(x[i]) - yg[i]);
        er += (double(x[i]) - yr[i]) * (double(x[i]) - yr[i]);
      }
      if (!std::isfinite(er)) continue;
      ASSERT_LE(eg, er * (1 + 1e-9)) << "block " << b;
      if (got != ref) {
        ++improved;
        ASSERT_LT(eg, er) << "block " << b << ": not the reference block, yet no better";
      }
      if (b < kBlocks - 256) {  // the float quick search (QuickSearchBlocks) of the same block
        std::vector<std::byte> fq = ref;
        simd::QuickSearchBlocks one;
        one.n = 1;
        one.grid = simd::RequantGrid::kOffset;
        one.lo = 0;
        one.hi = float(top);
        one.x[0] = x;
        one.y[0] = yr;
        one.d16[0] = half::load_u16(ref.data());
        one.m16[0] = half::load_u16(ref.data() + 2);
        struct RefBlock {
          GgmlType t;
          const std::byte* blk;
        } rb{d.id(), ref.data()};
        one.ctx = &rb;
        one.ref_levels = [](const void* c, int, int8_t* lv) {
          const RefBlock& r = *static_cast<const RefBlock*>(c);
          simd::source_levels(r.t, r.blk, lv);  // the stored levels 0..T
        };
        simd::quick_search_ref(one);
        if (one.improved & 1) simd::target_offset_block(d.id(), one.out_d16[0], one.out_m16[0], one.levels[0], fq.data());
        float yq[32];
        d.to_f32(fq.data(), yq, 32);
        for (int i = 0; i < 32; ++i) err_float += (double(x[i]) - yq[i]) * (double(x[i]) - yq[i]);
        err_int += eg;
      }
    }
    std::printf("%s -> %s: %zu searched (%zu better than the reference), %zu declined; error / the float quick search's %.4f\n",
                p.src, p.dst, searched, improved, declined, err_float > 0 ? err_int / err_float : 0.0);
    EXPECT_GT(searched, kBlocks / 2);
    EXPECT_GT(improved, 0u);
    EXPECT_LT(err_int, err_float * 1.02);
  }
}

}  // namespace
}  // namespace kvsnap
