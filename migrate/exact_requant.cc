#include "migrate/fp_strict.h"  // first: no FMA contraction (a candidate's q * d + m is to_f32's)

#include "migrate/exact_requant.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <optional>

#include "migrate/half.h"
#include "migrate/quants.h"
#include "migrate/simd_kernels.h"

namespace kvsnap {
namespace {

// Values per block of every quantized KV type (format/ggml_types.h, via quants.h).
constexpr int kBlock = static_cast<int>(quants::kQK);

// iq4_nl's non-linear levels (ggml-common.h kvalues_iq4nl).
constexpr const int8_t* kIq4nlLevels = quants::kIQ4NLValues;

using half::load_u16;
using half::store_u16;

// How exact requantization sees each KV cache type, decided type by type: every row of
// kv_cache_types() must be here (static_assert below), so a new type is never taken on trust.
// What the code below assumes of a quantized row: a block of 32 values starting with its f16
// scale d (an offset type then its f16 min m), levels q in [lo, hi] (value d*q, or d*q + m),
// packed as build() / encode_offset() / block_levels() / stored_levels() / pack_levels() know. A
// new quantized type gets its packing there and its row here, or kNone: exact requantization then
// leaves it to convert_row.
enum class Grid : uint8_t { kNone, kSymmetric, kOffset };
struct GridRow {
  GgmlType id;
  Grid grid;
  int lo, hi;  // the levels q
};
constexpr GridRow kGrids[] = {
    {GgmlType::kF32, Grid::kNone, 0, 0},          {GgmlType::kF16, Grid::kNone, 0, 0},
    {GgmlType::kQ4_0, Grid::kSymmetric, -8, 7},   {GgmlType::kQ4_1, Grid::kOffset, 0, 15},
    {GgmlType::kQ5_0, Grid::kSymmetric, -16, 15}, {GgmlType::kQ5_1, Grid::kOffset, 0, 31},
    {GgmlType::kQ8_0, Grid::kSymmetric, -127, 127},
    {GgmlType::kIQ4_NL, Grid::kSymmetric, quants::kIQ4NLValues[0], quants::kIQ4NLValues[15]},
    {GgmlType::kBF16, Grid::kNone, 0, 0},
};

constexpr const GridRow* grid_of(GgmlType t) {
  for (const GridRow& g : kGrids) {
    if (g.id == t) return &g;
  }
  return nullptr;
}

constexpr bool every_kv_type_decided() {
  for (const TypeLayout& t : kv_cache_types()) {
    const GridRow* g = grid_of(t.id);
    if (!g || (g->grid != Grid::kNone) != t.quantized) return false;
    if (g->grid != Grid::kNone && t.block_elems != uint32_t(kBlock)) return false;
  }
  return std::size(kGrids) == kv_cache_types().size();
}
static_assert(every_kv_type_decided(),
              "exact_requant.cc kGrids: decide every KV cache type of format/ggml_types.h (kNone, or its grid and "
              "packing), quantized types only with blocks of 32");

// Integer levels q with value == d * q exactly (as floats), or false.
bool levels_for_scale(const float* x, float d, int* q) {
  if (!(d != 0.0f) || !std::isfinite(d)) return false;
  for (int i = 0; i < kBlock; ++i) {
    const float r = x[i] / d;
    if (!std::isfinite(r) || r != std::nearbyint(r) || std::fabs(r) > 255.0f) return false;
    q[i] = int(r);
  }
  return true;
}

// The index of each iq4_nl table value, by the value's byte (other bytes: 0, never looked up).
constexpr std::array<uint8_t, 256> kIq4nlIndex = [] {
  std::array<uint8_t, 256> t{};
  for (int k = 0; k < 16; ++k) t[uint8_t(quants::kIQ4NLValues[k])] = uint8_t(k);
  return t;
}();

// Packs a block with f16 scale d16 (and offset m16) and levels q, which fit (iq4_nl: table
// values); false (nothing written) for a type it does not know.
bool pack_levels(GgmlType t, uint16_t d16, uint16_t m16, const int8_t* q, std::byte* out) {
  switch (t) {
    case GgmlType::kQ8_0:
      store_u16(out, d16);
      std::memcpy(out + 2, q, kBlock);
      return true;
    case GgmlType::kIQ4_NL: {  // q: table values
      store_u16(out, d16);
      uint8_t* qs = reinterpret_cast<uint8_t*>(out) + 2;
      for (int j = 0; j < kBlock / 2; ++j) {
        qs[j] = uint8_t(kIq4nlIndex[uint8_t(q[j])] | (kIq4nlIndex[uint8_t(q[j + 16])] << 4));
      }
      return true;
    }
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
      break;
    default:
      return false;  // no packing here: nothing written
  }
  store_u16(out, d16);
  const bool offset = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1, five = t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1;
  const int bias = t == GgmlType::kQ4_0 ? 8 : t == GgmlType::kQ5_0 ? 16 : 0;
  if (offset) store_u16(out + 2, m16);
  uint8_t u[kBlock];  // the levels as stored: 0..15 (0..31 for 5-bit types)
  for (int i = 0; i < kBlock; ++i) u[i] = uint8_t(q[i] + bias);
  uint8_t* qs = reinterpret_cast<uint8_t*>(out) + (offset ? 4 : 2) + (five ? 4 : 0);
  for (int j = 0; j < kBlock / 2; ++j) qs[j] = uint8_t((u[j] & 0x0f) | (u[j + 16] << 4));
  if (!five) return true;
  // bit 4 of level j is bit j of qh: bit 4 of each of 8 bytes gathered into one byte (the
  // multiply puts bit 8i of the word at bit 56 + i, every product term at a different bit)
  uint64_t w[4];
  std::memcpy(w, u, kBlock);
  uint32_t qh = 0;
  for (int g = 0; g < 4; ++g) qh |= uint32_t((((w[g] >> 4) & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56) << (8 * g);
  std::memcpy(out + (offset ? 4 : 2), &qh, 4);
  return true;
}

// The candidate block of `dst` that holds values d*q (+ m for offset types).
// false when the levels do not fit the type.
bool build(GgmlType dst, uint16_t d16, const int* q_sym, std::byte* out, const float* x) {
  (void)x;
  int lo = 0, hi = 0;
  switch (dst) {
    case GgmlType::kQ8_0: lo = -127, hi = 127; break;
    case GgmlType::kQ4_0: lo = -8, hi = 7; break;
    case GgmlType::kQ5_0: lo = -16, hi = 15; break;
    case GgmlType::kIQ4_NL: lo = -128, hi = 127; break;  // and one of the table's, below
    default: return false;
  }
  int8_t q[kBlock];
  for (int i = 0; i < kBlock; ++i) {
    if (q_sym[i] < lo || q_sym[i] > hi) return false;
    q[i] = int8_t(q_sym[i]);
    if (dst == GgmlType::kIQ4_NL && kIq4nlIndex[uint8_t(q[i])] == 0 && q[i] != kIq4nlLevels[0]) return false;
  }
  return pack_levels(dst, d16, 0, q, out);
}

int offset_top(GgmlType t) { return grid_of(t)->hi; }  // an offset type's levels are 0..hi

// Packs an offset-type block (q4_1, q5_1): d, m, [32 high bits], nibbles; q in 0..top.
void encode_offset(GgmlType dst, uint16_t d16, uint16_t m16, const int* q, std::byte* out) {
  int8_t q8[kBlock];
  for (int i = 0; i < kBlock; ++i) q8[i] = int8_t(q[i]);
  (void)pack_levels(dst, d16, m16, q8, out);
}

// Offset types: value = d*q + m with q in 0..top, exactly, or false.
bool build_offset(GgmlType dst, uint16_t d16, uint16_t m16, float d, float m, const float* x, std::byte* out) {
  const int top = offset_top(dst);
  int q[kBlock];
  for (int i = 0; i < kBlock; ++i) {
    const float r = (x[i] - m) / d;
    if (!std::isfinite(r) || r != std::nearbyint(r) || r < 0 || r > float(top)) return false;
    q[i] = int(r);
  }
  encode_offset(dst, d16, m16, q, out);
  return true;
}

bool has_offset(GgmlType t) {
  const GridRow* g = grid_of(t);
  return g && g->grid == Grid::kOffset;
}

double sse(const float* a, const float* b) {
  double s = 0;
  for (int i = 0; i < kBlock; ++i) {
    const double e = double(a[i]) - double(b[i]);
    s += e * e;
  }
  return s;
}

// Symmetric level range of a type without offset (levels relative to 0).
void sym_range(GgmlType t, int& lo, int& hi) {
  lo = grid_of(t)->lo;
  hi = grid_of(t)->hi;
}

// std::nearbyint(r) in the default rounding mode, for a finite or infinite r or a NaN, without a
// libm call (the search below runs it for every value of every candidate scale): |r| + 2^23 is
// rounded to an integer, ties to even, when |r| < 2^23; a larger float, an infinity and a NaN
// are returned as they are, as nearbyint does. The sign of a zero result is r's, as nearbyint's.
float nearbyint_inline(float r) {
  const float a = std::fabs(r);
  if (!(a < 8388608.0f)) return r;
  const float t = (a + 8388608.0f) - 8388608.0f;  // IEEE arithmetic: compilers do not fold this
  return std::copysign(t, r);
}

int nearest_iq4nl(float r) {
  int best = 0;
  float be = std::fabs(r - kIq4nlLevels[0]);
  for (int k = 1; k < 16; ++k) {
    const float e = std::fabs(r - kIq4nlLevels[k]);
    if (e < be) {
      be = e;
      best = k;
    }
  }
  return kIq4nlLevels[best];
}

// One value's level on the target's grid, from its quotient r = (x - m) / d, as the scale
// search picks it (simd_kernels.h, RequantScore8Fn): false where no level stands for it (iq4_nl
// and a non-finite r: build() would refuse such a block).
bool level_for(float r, simd::RequantGrid grid, float lo, float hi, int& level) {
  if (grid == simd::RequantGrid::kIq4nl) {
    level = std::isfinite(r) ? nearest_iq4nl(r) : 0;
    return std::isfinite(r);
  }
  // fmin(fmax(n, lo), hi) for a finite n, without the libm calls
  const float n = nearbyint_inline(r);
  level = std::isfinite(n) ? int(n < lo ? lo : n > hi ? hi : n) : 0;
  return true;
}

// The squared error of x against level * d (+ m for an offset grid), decoded as to_f32 decodes
// it (two roundings, as ggml's dequantizers), in double.
double level_error(float x, int level, float d, float m, simd::RequantGrid grid) {
  const float decoded = grid == simd::RequantGrid::kOffset ? float(level) * d + m : float(level) * d;
  const double diff = double(x) - double(decoded);
  return diff * diff;
}

simd::RequantGrid grid_of_target(GgmlType t) {
  if (t == GgmlType::kIQ4_NL) return simd::RequantGrid::kIq4nl;
  return has_offset(t) ? simd::RequantGrid::kOffset : simd::RequantGrid::kSymmetric;
}

// Byte j of kBitsToBytes[b] is bit j of b (byte j: the j-th in memory; little-endian words).
static_assert(std::endian::native == std::endian::little, "block_levels and pack_levels read bytes as words");
constexpr std::array<uint64_t, 256> kBitsToBytes = [] {
  std::array<uint64_t, 256> t{};
  for (int b = 0; b < 256; ++b) {
    for (int j = 0; j < 8; ++j) t[b] |= uint64_t((b >> j) & 1) << (8 * j);
  }
  return t;
}();

// A q4_0, q4_1, q5_0 or q5_1 block's 32 levels as stored (unsigned: level + the returned bias),
// eight a word in memory order: the low nibbles of the 16 bytes of qs for levels 0..15, their
// high nibbles for 16..31, and bit j of qh (5-bit types) as bit 4 of level j.
int stored_levels(GgmlType t, const uint8_t* b, uint64_t* u) {
  const bool offset = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1, five = t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1;
  const uint8_t* qs = b + (offset ? 4 : 2) + (five ? 4 : 0);
  constexpr uint64_t kLow4 = 0x0f0f0f0f0f0f0f0full;
  uint64_t w[2];
  std::memcpy(w, qs, 16);
  u[0] = w[0] & kLow4;
  u[1] = w[1] & kLow4;
  u[2] = (w[0] >> 4) & kLow4;
  u[3] = (w[1] >> 4) & kLow4;
  if (five) {
    uint32_t qh;
    std::memcpy(&qh, b + (offset ? 4 : 2), 4);
    for (int g = 0; g < 4; ++g) u[g] |= kBitsToBytes[(qh >> (8 * g)) & 0xff] << 4;
  }
  return t == GgmlType::kQ4_0 ? 8 : t == GgmlType::kQ5_0 ? 16 : 0;
}

// Bit j of the result: byte j's bit `bit` (bytes in memory order; little-endian words). The
// multiply adds the eight masked bits into the top byte, byte j's at bit 56 + j, with no carries.
inline uint32_t gather_bits8(uint64_t w, int bit) {
  return uint32_t((((w >> bit) & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56);
}

// Whether every stored level u = nibble + 16 * (qh bit) of a q5_0 block is in [8, 23], i.e. its
// level u - 16 is one of q4_0's (-8 .. 7): u in [8, 15] has qh bit 0 and nibble bit 3 set, u in
// [16, 23] qh bit 1 and nibble bit 3 clear, and no other u has those two bits different. So:
// bit 3 of every nibble differs from its qh bit. On the bits as stored, which is ~5x cheaper
// than unpacking the levels (stored_levels) and testing their range.
bool q5_0_levels_in_8_23(const uint8_t* b) {
  uint32_t qh;
  uint64_t w[2];
  std::memcpy(&qh, b + 2, 4);
  std::memcpy(w, b + 6, 16);
  // levels 0..15: the low nibbles of qs (bit 3 of each byte); 16..31: the high ones (bit 7)
  const uint32_t bit3 = gather_bits8(w[0], 3) | gather_bits8(w[1], 3) << 8 | gather_bits8(w[0], 7) << 16 |
                        gather_bits8(w[1], 7) << 24;
  return (bit3 ^ qh) == 0xffffffffu;
}

// A block's 32 levels as int8, read straight from the bits as ggml's dequantize_row_* reads
// them: value = level * d (q4_0, q5_0, q8_0; iq4_nl: its table value), or level * d + m with
// level 0..top (q4_1, q5_1). The direct path's source levels, and the quick search's reference
// levels.
void block_levels(GgmlType t, const uint8_t* b, int8_t* q) {
  switch (t) {
    case GgmlType::kQ8_0:
      std::memcpy(q, b + 2, kBlock);
      return;
    case GgmlType::kIQ4_NL:
      for (int j = 0; j < 16; ++j) {
        q[j] = kIq4nlLevels[b[2 + j] & 0x0f];
        q[j + 16] = kIq4nlLevels[b[2 + j] >> 4];
      }
      return;
    default:
      break;
  }
  uint64_t u[4];
  const int bias = stored_levels(t, b, u);
  uint8_t biased[kBlock];
  std::memcpy(biased, u, kBlock);
  for (int i = 0; i < kBlock; ++i) q[i] = int8_t(biased[i] - bias);
}

// Gathers blocks for the level's quick search (simd_kernels.h, QuickSearchBlocks), 8 at a time,
// and writes the blocks it improves over their reference blocks. With make_ref (the level's
// kernel that also makes the reference blocks, simd_kernels.h: make_reference) it writes every
// block: the kernel's result, or for a block the kernel leaves its reference block and the scalar
// search of it alone, which gives what any level's kernel gives. (The kernel leaves blocks with a
// value not finite, all zero, a scale whose reciprocal is not finite, or values whose sum
// overflows; the search finds nothing to do in any of those today, an infinite or NaN or zero
// error or an f16 scale of 0 or inf, but it runs so that the bytes do not rest on that.)
class QuickBatch {
 public:
  QuickBatch(const TypeTraits& dst, simd::QuickSearchFn make_ref)
      : dst_(dst.id()), traits_(&dst), search_(make_ref ? make_ref : simd::find_quick_search()) {
    qb_.grid = grid_of_target(dst_);
    qb_.lo = float(grid_of(dst_)->lo);
    qb_.hi = float(grid_of(dst_)->hi);
    qb_.make_reference = make_ref != nullptr;
    qb_.ctx = this;
    qb_.ref_levels = [](const void* ctx, int k, int8_t* q) {
      const QuickBatch& b = *static_cast<const QuickBatch*>(ctx);
      block_levels(b.dst_, reinterpret_cast<const uint8_t*>(b.out_[k]), q);
    };
  }
  QuickBatch(const QuickBatch&) = delete;
  QuickBatch& operator=(const QuickBatch&) = delete;
  ~QuickBatch() { flush(); }

  // x: the block's source values; db: its reference block (ggml's), y: that block decoded. db is
  // rewritten by flush() if a candidate does better; x and y must stay until then. With
  // make_ref, y is not read and db need not hold anything yet: flush() writes it.
  void add(const float* x, const float* y, std::byte* db) {
    const int k = qb_.n++;
    qb_.x[k] = x;
    out_[k] = db;
    if (!qb_.make_reference) {
      qb_.y[k] = y;
      qb_.d16[k] = load_u16(db);
      qb_.m16[k] = qb_.grid == simd::RequantGrid::kOffset ? load_u16(db + 2) : 0;
    }
    if (qb_.n == 8) flush();
  }

  void flush() {
    if (qb_.n == 0) return;
    search_(qb_);
    for (int k = 0; k < qb_.n; ++k) {
      if (qb_.make_reference && !(qb_.referenced >> k & 1)) {
        search_alone(k);
        continue;
      }
      // a type pack_levels does not know keeps its reference block (a new type's row in kGrids
      // without its packing here; make_ref is only given for q4_0 and q5_0)
      if (qb_.make_reference || (qb_.improved >> k & 1)) {
        (void)pack_levels(dst_, qb_.out_d16[k], qb_.out_m16[k], qb_.levels[k], out_[k]);
      }
    }
    qb_.n = 0;
  }

 private:
  // Block k as the row path without make_ref does it: its reference block, then the search.
  void search_alone(int k) {
    std::byte* db = out_[k];
    traits_->from_f32(qb_.x[k], db, kBlock);
    float y[kBlock];
    traits_->to_f32(db, y, kBlock);
    simd::QuickSearchBlocks one;
    one.n = 1;
    one.grid = qb_.grid;
    one.lo = qb_.lo;
    one.hi = qb_.hi;
    one.x[0] = qb_.x[k];
    one.y[0] = y;
    one.d16[0] = load_u16(db);
    one.m16[0] = qb_.grid == simd::RequantGrid::kOffset ? load_u16(db + 2) : 0;
    struct Ctx {
      GgmlType t;
      const std::byte* db;
    } ctx{dst_, db};
    one.ctx = &ctx;
    one.ref_levels = [](const void* c, int, int8_t* q) {
      const Ctx& b = *static_cast<const Ctx*>(c);
      block_levels(b.t, reinterpret_cast<const uint8_t*>(b.db), q);
    };
    simd::quick_search_ref(one);
    if (one.improved & 1) (void)pack_levels(dst_, one.out_d16[0], one.out_m16[0], one.levels[0], db);
  }

  GgmlType dst_;
  const TypeTraits* traits_;
  simd::QuickSearchFn search_;
  simd::QuickSearchBlocks qb_;
  std::byte* out_[8] = {};
};

// Gathers blocks for the level's integer quick search (simd_kernels.h, LevelSearchBlocks), 8 at a
// time; the kernel writes each one's result and says which were exact.
class LevelBatch {
 public:
  // decline(sb, db): writes a block the kernel declined (an offset source's, or one an offset
  // target may hold: simd_kernels.h) and counts it.
  using Decline = std::function<void(const std::byte* sb, std::byte* db)>;
  LevelBatch(GgmlType src, GgmlType dst, uint64_t& exact, uint64_t& requant, Decline decline)
      : search_(simd::find_level_search()), exact_(exact), requant_(requant), decline_(std::move(decline)) {
    lb_.src_type = src;
    lb_.dst_type = dst;
  }
  LevelBatch(const LevelBatch&) = delete;
  LevelBatch& operator=(const LevelBatch&) = delete;
  ~LevelBatch() { flush(); }

  // sb: a source block whose f16 scale is finite and nonzero; db: where its result goes.
  void add(const std::byte* sb, std::byte* db) {
    const int k = lb_.n++;
    lb_.src[k] = sb;
    lb_.dst[k] = db;
    if (lb_.n == 8) flush();
  }

  void flush() {
    if (lb_.n == 0) return;
    search_(lb_);
    const int exact = std::popcount(lb_.embedded), declined = std::popcount(lb_.declined);
    exact_ += exact;
    requant_ += lb_.n - exact - declined;
    for (uint32_t d = lb_.declined; d != 0; d &= d - 1) {
      const int k = std::countr_zero(d);
      decline_(lb_.src[k], lb_.dst[k]);
    }
    lb_.n = 0;
  }

 private:
  simd::LevelSearchFn search_;
  simd::LevelSearchBlocks lb_;
  uint64_t& exact_;
  uint64_t& requant_;
  Decline decline_;
};

// Eight lane sums added pairwise: (l, l + 4), (l, l + 2), (0, 1).
float lane_tree_sum8(const float* acc) {
  float t[4];
  for (int l = 0; l < 4; ++l) t[l] = acc[l] + acc[l + 4];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// The sum of 32 squared differences as every QuickSearchFn adds them (simd_kernels.h).
float lane_tree_sum(const float* sq) {
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = ((sq[l] + sq[8 + l]) + sq[16 + l]) + sq[24 + l];
  return lane_tree_sum8(acc);
}

}  // namespace

bool exact_requant_applies(const TypeTraits& src, const TypeTraits& dst) {
  const GridRow* s = grid_of(src.id());
  const GridRow* d = grid_of(dst.id());
  return s && d && s->grid != Grid::kNone && d->grid != Grid::kNone && src.id() != dst.id();
}

const char* search_name(ExactRequantizer::Search s) {
  switch (s) {
    case ExactRequantizer::Search::kNone: return "exact";
    case ExactRequantizer::Search::kQuick: return "quick";
    case ExactRequantizer::Search::kFull: return "search";
  }
  return "?";
}

ExactRequantizer::Search search_by_default(const TypeTraits& src, const TypeTraits& dst) {
  using Search = ExactRequantizer::Search;
  if (!exact_requant_applies(src, dst)) return Search::kNone;
  if (dst.id() == GgmlType::kIQ4_NL) return Search::kQuick;  // see the header: oracle.server_convert
  return src.id() == GgmlType::kQ8_0 ? Search::kNone : Search::kQuick;
}

Result<ExactRequantizer> ExactRequantizer::make(const TypeTraits& src, const TypeTraits& dst, uint64_t n_elems,
                                               Search search, bool direct) {
  if (!exact_requant_applies(src, dst)) {
    return Status::InvalidArgument("exact requantization is for two different quantized types");
  }
  if (n_elems == 0 || n_elems % kBlock != 0) {
    return Status::InvalidArgument(std::to_string(n_elems) + " values are not whole blocks of 32");
  }
  ExactRequantizer r;
  r.src_ = &src;
  r.dst_ = &dst;
  r.n_elems_ = n_elems;
  r.src_row_ = n_elems / kBlock * src.block_bytes();
  r.dst_row_ = n_elems / kBlock * dst.block_bytes();
  r.search_ = search;
  const GridRow& g = *grid_of(dst.id());
  r.symmetric_source_ = grid_of(src.id())->grid == Grid::kSymmetric;
  r.embed_span_ = g.grid == Grid::kOffset;
  r.embed_lo_ = g.lo;
  r.embed_hi_ = g.hi;
  r.target_span_ = g.grid == Grid::kOffset ? g.hi : g.hi - g.lo;
  r.table_target_ = dst.id() == GgmlType::kIQ4_NL;
  if (!r.embed_span_ && !r.table_target_ && (src.id() == GgmlType::kQ4_0 || src.id() == GgmlType::kQ5_0)) {
    const int bias = src.id() == GgmlType::kQ4_0 ? 8 : 16, top = src.id() == GgmlType::kQ4_0 ? 15 : 31;
    const int lo = std::max(g.lo + bias, 0), hi = std::min(g.hi + bias, top);
    if (lo == 0 && hi == top) {
      r.stored_fit_ = StoredFit::kAll;
    } else if (src.id() == GgmlType::kQ5_0 && lo == 8 && hi == 23) {
      r.stored_fit_ = StoredFit::kQ5_0InQ4_0;
    }
  }
  const bool integer_source = src.id() == GgmlType::kQ8_0 || src.id() == GgmlType::kQ4_0 ||
                              src.id() == GgmlType::kQ5_0 || src.id() == GgmlType::kIQ4_NL ||
                              src.id() == GgmlType::kQ4_1 || src.id() == GgmlType::kQ5_1;
  // Into q4_1 and q5_1 only from sources whose blocks can span more than the target's levels:
  // the kernel leaves every block the target may hold to embed_block (simd_kernels.h), which from
  // q4_0 (into both), q5_0 and q4_1 (into q5_1) is every block.
  const int src_span = src.id() == GgmlType::kQ8_0 ? 255 : src.id() == GgmlType::kIQ4_NL ? 240
                       : src.id() == GgmlType::kQ5_0 || src.id() == GgmlType::kQ5_1   ? 31
                                                                                       : 15;
  const bool offset_target = (dst.id() == GgmlType::kQ4_1 && src_span > 15) || (dst.id() == GgmlType::kQ5_1 && src_span > 31);
  r.level_search_ = search == Search::kQuick && integer_source &&
                    (dst.id() == GgmlType::kQ4_0 || dst.id() == GgmlType::kQ5_0 || offset_target);
  // the row of decoded values and (kQuick's float search) of reference values: not for the paths
  // that read the source blocks themselves
  if (!r.level_search_) r.row_.resize(n_elems);
  if (r.search_ == Search::kQuick && !r.level_search_) r.ref_row_.resize(n_elems);
  r.direct_ = direct && dst.id() == GgmlType::kQ8_0 &&
              (src.id() == GgmlType::kQ4_0 || src.id() == GgmlType::kQ5_0 || src.id() == GgmlType::kIQ4_NL);
  return r;
}

bool ExactRequantizer::embed_block(const std::byte* sb, const float* x, std::byte* db) {
  // Every quantized KV type starts its block with the f16 scale d.
  const uint16_t d16 = load_u16(sb);
  const float d = half::fp16_to_f32(d16);
  const GgmlType dt = dst_->id();
  std::byte cand[64];
  // A candidate counts only if it decodes to the source's values (as numbers:
  // -0 and +0 are the same value to every dot product llama.cpp computes).
  auto decodes_exactly = [&]() {
    float y[kBlock];
    dst_->to_f32(cand, y, kBlock);
    for (int i = 0; i < kBlock; ++i)
      if (!(y[i] == x[i])) return false;
    std::memcpy(db, cand, dst_->block_bytes());
    return true;
  };
  if (!has_offset(dt)) {
    int q[kBlock];
    return levels_for_scale(x, d, q) && build(dt, d16, q, cand, x) && decodes_exactly();
  }
  // Offset targets: the source's own offset; a symmetric source's centre
  // (q4_0 -> q4_1 is m = -8d); the block minimum when it is an f16 value.
  auto try_offset = [&](uint16_t m16) {
    const float m = half::fp16_to_f32(m16);
    return std::isfinite(m) && build_offset(dt, d16, m16, d, m, x, cand) && decodes_exactly();
  };
  if (has_offset(src_->id()) && try_offset(load_u16(sb + 2))) return true;
  const float centre = -float((offset_top(dt) + 1) / 2) * d;
  const uint16_t c16 = half::f32_to_fp16(centre);
  if (half::fp16_to_f32(c16) == centre && try_offset(c16)) return true;
  float mn = x[0];
  for (int i = 1; i < kBlock; ++i) mn = std::fmin(mn, x[i]);
  const uint16_t m16 = half::f32_to_fp16(mn);
  return half::fp16_to_f32(m16) == mn && try_offset(m16);
}

// The reference quantizer's block, unless a nearby scale gives a smaller
// squared error against the source values. A source already on a grid can
// sit exactly between the target's levels (q5_0 -> q4_0: every odd level is
// a tie), where the reference scale is the worst choice; a scale a few
// percent off breaks the ties. Never worse than the reference, by construction.
void ExactRequantizer::requantize_block(const float* x, std::byte* db) {
  if (search_ != Search::kFull) {
    dst_->from_f32(x, db, kBlock);
    if (search_ == Search::kQuick) {
      float y[kBlock];
      dst_->to_f32(db, y, kBlock);
      QuickBatch(*dst_, nullptr).add(x, y, db);  // searched and written as the batch goes out of scope
    }
    return;
  }
  const GgmlType dt = dst_->id();
  const bool offset = has_offset(dt);
  std::byte best[64], cand[64];
  float y[kBlock];
  dst_->from_f32(x, best, kBlock);
  dst_->to_f32(best, y, kBlock);
  double best_err = sse(x, y);
  const float d_ref = half::fp16_to_f32(load_u16(best));
  if (best_err == 0 || !std::isfinite(best_err) || !(std::fabs(d_ref) > 0) ||
      !std::isfinite(d_ref)) {
    std::memcpy(db, best, dst_->block_bytes());
    return;
  }
  // Candidate scales d16 (and offset m16) are scored by the levels they give and the error of
  // the block decoded from them (level_for, level_error: what packing, to_f32 and sse() would
  // give, in sse()'s order), and kept, in the order they are tried, where the error is below
  // best_err as it stands by then. Only a winner is packed.
  const simd::RequantGrid grid = grid_of_target(dt);
  int lo = 0, hi = offset ? offset_top(dt) : 0;
  if (!offset) sym_range(dt, lo, hi);
  auto keep = [&](uint16_t d16, uint16_t m16, const int* q, double e) {
    if (offset) {
      encode_offset(dt, d16, m16, q, cand);
    } else if (!build(dt, d16, q, cand, x)) {
      return;
    }
    best_err = e;
    std::memcpy(best, cand, dst_->block_bytes());
  };
  // One candidate, dropped as soon as its partial sum reaches best_err (the terms are >= 0, so
  // a rounded sum never falls: it could not win).
  auto consider = [&](uint16_t d16, uint16_t m16) {
    const float d = half::fp16_to_f32(d16), m = offset ? half::fp16_to_f32(m16) : 0.0f;
    if (!(std::fabs(d) > 0) || !std::isfinite(d) || !std::isfinite(m)) return;
    int q[kBlock];
    double e = 0;
    for (int i = 0; i < kBlock; ++i) {
      if (!level_for((x[i] - m) / d, grid, float(lo), float(hi), q[i])) return;
      e += level_error(x[i], q[i], d, m, grid);
      if (!(e < best_err)) return;
    }
    keep(d16, m16, q, e);
  };
  // The 16 factor candidates, eight at a time (the level's RequantScore8Fn: SIMD lanes, or
  // requant_score8_ref), sharing the reference block's offset.
  static constexpr float kFactors[] = {0.88f, 0.91f, 0.94f, 0.96f, 0.97f, 0.98f, 0.99f, 0.995f,
                                       1.005f, 1.01f, 1.02f, 1.03f, 1.04f, 1.06f, 1.09f, 1.12f};
  static_assert(std::size(kFactors) % 8 == 0);
  const uint16_t m_ref = offset ? load_u16(best + 2) : 0;
  const float m = offset ? half::fp16_to_f32(m_ref) : 0.0f;
  const simd::RequantScore8Fn score8 = simd::find_requant_score8();
  for (size_t f = 0; std::isfinite(m) && f < std::size(kFactors); f += 8) {
    uint16_t d16[8];
    float d[8];
    bool ok[8];
    for (int k = 0; k < 8; ++k) {
      d16[k] = half::f32_to_fp16(d_ref * kFactors[f + k]);
      d[k] = half::fp16_to_f32(d16[k]);
      ok[k] = std::fabs(d[k]) > 0 && std::isfinite(d[k]);
    }
    double e[8];
    int32_t levels[kBlock * 8];
    if (!score8(x, m, d, lo, hi, grid, best_err, e, levels, ok)) continue;
    for (int k = 0; k < 8; ++k) {
      if (!ok[k] || !(e[k] < best_err)) continue;
      int q[kBlock];
      for (int i = 0; i < kBlock; ++i) q[i] = levels[8 * i + k];
      keep(d16[k], m_ref, q, e[k]);
    }
  }
  // Then least-squares refinements of the best: with its levels fixed, the
  // scale (and offset) that fit the values best; consider() re-picks levels.
  for (int iter = 0; iter < 3; ++iter) {
    const double before = best_err;
    dst_->to_f32(best, y, kBlock);
    const float d0 = half::fp16_to_f32(load_u16(best));
    const float m0 = offset ? half::fp16_to_f32(load_u16(best + 2)) : 0.0f;
    if (!(std::fabs(d0) > 0) || !std::isfinite(d0)) break;
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    for (int i = 0; i < kBlock; ++i) {
      const double lv = nearbyint_inline((y[i] - m0) / d0);
      sq += lv;
      sqq += lv * lv;
      sx += x[i];
      sxq += double(x[i]) * lv;
    }
    if (offset) {
      const double det = kBlock * sqq - sq * sq;
      if (det == 0) break;
      const double d = (kBlock * sxq - sq * sx) / det;
      consider(half::f32_to_fp16(float(d)), half::f32_to_fp16(float((sx - d * sq) / kBlock)));
    } else {
      if (sqq == 0) break;
      consider(half::f32_to_fp16(float(sxq / sqq)), 0);
    }
    if (!(best_err < before)) break;
  }
  std::memcpy(db, best, dst_->block_bytes());
}

void ExactRequantizer::convert_block(const std::byte* sb, const float* x, std::byte* db) {
  if (embed_block(sb, x, db)) {
    ++exact_;
  } else {
    requantize_block(x, db);
    ++requant_;
  }
}

// Blocks whose f16 scale is +-0, inf or NaN do not embed (levels_for_scale): they take the
// general path on their own decoded values; every other block embeds as block_levels says.
// Runs of embedding blocks go through the level's kernel where it has one (simd_kernels.h).
void ExactRequantizer::convert_row_direct(const std::byte* s, std::byte* o) {
  const uint64_t nb = n_elems_ / kBlock;
  const size_t sbytes = src_->block_bytes(), dbytes = dst_->block_bytes();
  const simd::EmbedQ8_0Fn embed = simd::find_embed_q8_0(src_->id());
  auto embeds = [](const std::byte* sb) {
    const uint16_t d16 = load_u16(sb);
    return (d16 & 0x7fff) != 0 && (d16 & 0x7c00) != 0x7c00;
  };
  for (uint64_t b = 0; b < nb;) {
    const std::byte* sb = s + b * sbytes;
    std::byte* db = o + b * dbytes;
    if (!embeds(sb)) {
      float x[kBlock];
      src_->to_f32(sb, x, kBlock);
      convert_block(sb, x, db);
      ++b;
      continue;
    }
    uint64_t end = b + 1;
    while (end < nb && embeds(s + end * sbytes)) ++end;
    if (embed) {
      embed(sb, db, end - b);
    } else {
      for (uint64_t k = b; k < end; ++k) {
        std::memcpy(o + k * dbytes, s + k * sbytes, 2);
        block_levels(src_->id(), reinterpret_cast<const uint8_t*>(s + k * sbytes),
                      reinterpret_cast<int8_t*>(o + k * dbytes + 2));
      }
    }
    exact_ += end - b;
    b = end;
  }
}

// A necessary condition for embed_block: false only where it would fail. A block of a symmetric
// source (q8_0, q4_0, q5_0, iq4_nl) with a finite scale d holds values q * d, each product exact
// (at most 8-bit levels times 11-bit significands), so embed_block's quotients are the levels q
// themselves (symmetric targets: the same d; offset targets: x - m is (q - q_min) * d or
// (q + centre) * d, exact too): it embeds only if every level is in the target's range
// (symmetric; iq4_nl: one of its table's values), or the levels span at most the target's top
// level (offset); with any other d it does not embed at all. An offset source (q4_1, q5_1):
// offset_source_may_embed.
bool ExactRequantizer::may_embed(const std::byte* sb) const {
  if (!symmetric_source_) return offset_source_may_embed(sb);
  int8_t q[kBlock];
  const int8_t* levels = q;
  auto read_levels = [&] {
    if (src_->id() == GgmlType::kQ8_0) {
      levels = reinterpret_cast<const int8_t*>(sb + 2);
    } else {
      block_levels(src_->id(), reinterpret_cast<const uint8_t*>(sb), q);
    }
  };
  if (table_target_) {  // into iq4_nl: every level one of its table's (the same scale, so q is its level)
    read_levels();
    for (int i = 0; i < kBlock; ++i) {
      if (kIq4nlIndex[uint8_t(levels[i])] == 0 && levels[i] != kIq4nlLevels[0]) return false;
    }
    return true;
  }
  if (stored_fit_ == StoredFit::kAll) return true;
  if (stored_fit_ == StoredFit::kQ5_0InQ4_0) return q5_0_levels_in_8_23(reinterpret_cast<const uint8_t*>(sb));
  // The levels biased to unsigned (q + 128), so the minimum and maximum are unsigned byte
  // operations every x86-64 and aarch64 vectorizes.
  read_levels();
  uint8_t umn = 255, umx = 0;
  for (int i = 0; i < kBlock; ++i) {
    const uint8_t u = uint8_t(uint8_t(levels[i]) ^ 0x80);
    umn = u < umn ? u : umn;
    umx = u > umx ? u : umx;
  }
  const int mn = int(umn) - 128, mx = int(umx) - 128;
  if (embed_span_) return mx - mn <= embed_hi_;
  return mn >= embed_lo_ && mx <= embed_hi_;
}

// may_embed for an offset source (q4_1, q5_1; levels n 0..T, scale ds, offset ms): value i is
// float(n[i]) * ds + ms, rounded once (n ds is exact: 5-bit levels, 11-bit significands). Where
// |ms| <= 2^19 |ds| that sum is below 2^20 |ds| in size, so each value is within |ds| / 8 of n ds +
// ms, and two levels L apart give values at least (L - 1/4) |ds| apart. embed_block tries only
// the source's scale ds: every quotient (x - m) / ds, each rounded twice (relative error 2^-23 on
// a level of at most 255), must be a level of the target, all within its span S (top - 0 of an
// offset target, hi - lo of a symmetric one). Levels more than S apart (L >= S + 1) give quotients
// more than S apart: it fails. Elsewhere true: a larger offset can round levels onto one value
// (all of a block's values equal: the target holds them), and a scale of 0 or not finite, or an
// offset not finite, is embed_block's to decide.
bool ExactRequantizer::offset_source_may_embed(const std::byte* sb) const {
  const uint16_t ds16 = load_u16(sb), ms16 = load_u16(sb + 2);
  if ((ds16 & 0x7fff) == 0 || (ds16 & 0x7c00) == 0x7c00 || (ms16 & 0x7c00) == 0x7c00) return true;
  const float ds = half::fp16_to_f32(ds16), ms = half::fp16_to_f32(ms16);
  if (!(std::fabs(ms) <= 524288.0f * std::fabs(ds))) return true;  // 2^19 |ds|: exact (a power of 2)
  // the stored levels as bytes: a minimum and maximum every x86-64 and aarch64 vectorizes
  uint64_t u[4];
  (void)stored_levels(src_->id(), reinterpret_cast<const uint8_t*>(sb), u);
  uint8_t n[kBlock];
  std::memcpy(n, u, kBlock);
  uint8_t mn = 255, mx = 0;
  for (int i = 0; i < kBlock; ++i) {
    mn = n[i] < mn ? n[i] : mn;
    mx = n[i] > mx ? n[i] : mx;
  }
  return mx - mn <= target_span_;
}

// kNone and kQuick: every block's reference block from one from_f32 over the row (ggml's
// quantizers work block by block, so these are the bytes requantize_block would start from),
// then the blocks the target holds exactly written over theirs by embed_block, as convert_block
// would, and the others given to the quick search, 8 at a time. kQuick into q4_0 or q5_0 at a
// level whose search kernel makes the reference blocks itself (simd_kernels.h, make_reference):
// no pass over the row, every block written by embed_block or the search (the same bytes).
void ExactRequantizer::convert_row_from_reference(const std::byte* s, const float* x, std::byte* o) {
  const bool quick = search_ == Search::kQuick;
  const simd::QuickSearchFn make_ref = quick && (dst_->id() == GgmlType::kQ4_0 || dst_->id() == GgmlType::kQ5_0)
                                           ? simd::find_quick_search_reference()
                                           : nullptr;
  if (!make_ref) {
    dst_->from_f32(x, o, n_elems_);
    if (quick) dst_->to_f32(o, ref_row_.data(), n_elems_);  // the reference values
  }
  const uint64_t nb = n_elems_ / kBlock;
  const size_t sbytes = src_->block_bytes(), dbytes = dst_->block_bytes();
  std::optional<QuickBatch> batch;
  if (quick) batch.emplace(*dst_, make_ref);
  for (uint64_t b = 0; b < nb; ++b) {
    const std::byte* sb = s + b * sbytes;
    std::byte* db = o + b * dbytes;
    if (may_embed(sb) && embed_block(sb, x + b * kBlock, db)) {
      ++exact_;
      continue;
    }
    ++requant_;
    if (quick) batch->add(x + b * kBlock, ref_row_.data() + b * kBlock, db);
  }
  if (quick) batch->flush();
}

// kQuick from integer levels (level_search_): every block the target holds exactly is written as
// embed_block would (the level's kernel finds them: same scale, levels in range; into an offset
// target it declines every block the target may hold, and embed_block decides), every other one
// by the integer search; a block whose source scale is 0 or not finite (its values all zero, or
// not finite) as convert_row_from_reference writes it without a search: embed_block, else ggml's
// reference block.
void ExactRequantizer::convert_row_by_levels(const std::byte* s, std::byte* o) {
  const uint64_t nb = n_elems_ / kBlock;
  const size_t sbytes = src_->block_bytes(), dbytes = dst_->block_bytes();
  const bool offset = has_offset(src_->id());
  // a declined block as convert_row_from_reference writes it
  LevelBatch batch(src_->id(), dst_->id(), exact_, requant_, [this](const std::byte* sb, std::byte* db) {
    float x[kBlock];
    src_->to_f32(sb, x, kBlock);
    convert_block(sb, x, db);
  });
  for (uint64_t b = 0; b < nb; ++b) {
    const std::byte* sb = s + b * sbytes;
    std::byte* db = o + b * dbytes;
    const uint16_t ds = load_u16(sb);
    const bool ms_finite = !offset || (load_u16(sb + 2) & 0x7c00) != 0x7c00;
    if ((ds & 0x7fff) != 0 && (ds & 0x7c00) != 0x7c00 && ms_finite) {
      batch.add(sb, db);
      continue;
    }
    float x[kBlock];
    src_->to_f32(sb, x, kBlock);
    if (may_embed(sb) && embed_block(sb, x, db)) {
      ++exact_;
    } else if (offset) {  // a scale of 0 or not finite, or an offset not finite: as convert_row_from_reference
      ++requant_;
      requantize_block(x, db);
    } else {
      ++requant_;
      dst_->from_f32(x, db, kBlock);
    }
  }
}

Status ExactRequantizer::convert(std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() % src_row_ != 0 || out.size() != in.size() / src_row_ * dst_row_) {
    return Status::InvalidArgument("exact requantizer: buffers are not whole rows");
  }
  const uint64_t rows = in.size() / src_row_;
  const uint64_t nb = n_elems_ / kBlock;
  for (uint64_t r = 0; r < rows; ++r) {
    const std::byte* s = in.data() + r * src_row_;
    std::byte* o = out.data() + r * dst_row_;
    if (direct_) {
      convert_row_direct(s, o);
      continue;
    }
    if (level_search_) {  // decodes only the blocks that need their values
      convert_row_by_levels(s, o);
      continue;
    }
    src_->to_f32(s, row_.data(), n_elems_);
    if (search_ != Search::kFull) {
      convert_row_from_reference(s, row_.data(), o);
      continue;
    }
    for (uint64_t b = 0; b < nb; ++b) {
      convert_block(s + b * src_->block_bytes(), row_.data() + b * kBlock, o + b * dst_->block_bytes());
    }
  }
  return Status::OK();
}

namespace simd {

void source_levels(GgmlType t, const std::byte* block, int8_t* levels) {
  block_levels(t, reinterpret_cast<const uint8_t*>(block), levels);
}

void target_block(GgmlType t, uint16_t d16, const int8_t* levels, std::byte* block) {
  (void)pack_levels(t, d16, 0, levels, block);
}

void target_offset_block(GgmlType t, uint16_t d16, uint16_t m16, const int8_t* levels, std::byte* block) {
  (void)pack_levels(t, d16, m16, levels, block);
}

// The scalar RequantScore8Fn (the scalar level's row in simd_kernels.cc): lane by lane, eight
// accumulators, as the SIMD kernels compute it.
bool requant_score8_ref(const float* x, float m, const float* d, int lo, int hi, RequantGrid grid, double best_err,
                        double* e, int32_t* levels, bool* ok) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < kBlock; ++i) {
    bool any_below = false;
    for (int k = 0; k < 8; ++k) {
      int level;
      if (!level_for((x[i] - m) / d[k], grid, float(lo), float(hi), level)) ok[k] = false;
      levels[8 * i + k] = level;
      acc[k] += level_error(x[i], level, d[k], m, grid);
      any_below = any_below || acc[k] < best_err;
    }
    if ((i & 7) == 7 && !any_below) return false;  // no lane can get below best_err
  }
  for (int k = 0; k < 8; ++k) e[k] = acc[k];
  return true;
}

namespace {

// One candidate of the quick search (simd_kernels.h, QuickSearchBlocks): its levels q and error.
float quick_score(const QuickSearchBlocks& b, const float* x, float d, float id, float m, int8_t* q) {
  float sq[kBlock];
  for (int i = 0; i < kBlock; ++i) {
    float n;
    if (b.grid == RequantGrid::kIq4nl) {
      n = float(kIq4nlLevels[quants::ref::iq4_nl_best_index((x[i] - m) * id)]);
    } else {
      n = nearbyint_inline((x[i] - m) * id);
      n = n > b.lo ? n : b.lo;
      n = n < b.hi ? n : b.hi;
    }
    q[i] = int8_t(int(n));
    const float diff = x[i] - (n * d + m);
    sq[i] = diff * diff;
  }
  return lane_tree_sum(sq);
}

// The quick search of block k (simd_kernels.h, QuickSearchBlocks).
void quick_search_block(QuickSearchBlocks& b, int k) {
  const float* x = b.x[k];
  const float* y = b.y[k];
  float sq[kBlock];
  for (int i = 0; i < kBlock; ++i) sq[i] = (x[i] - y[i]) * (x[i] - y[i]);
  float best_err = lane_tree_sum(sq);
  const float d_ref = half::fp16_to_f32(b.d16[k]);
  const bool offset = b.grid == RequantGrid::kOffset;
  const uint16_t m16 = offset ? b.m16[k] : 0;
  const float m = offset ? half::fp16_to_f32(m16) : 0.0f;
  if (!(best_err > 0) || !std::isfinite(best_err) || !(std::fabs(d_ref) > 0) || !std::isfinite(d_ref) ||
      !std::isfinite(m)) {
    return;
  }
  int8_t q[kBlock], best_q[kBlock];
  uint16_t best_d16 = 0, best_m16 = m16;
  bool improved = false;
  auto consider = [&](uint16_t d16, uint16_t cand_m16) {
    const float d = half::fp16_to_f32(d16), cm = offset ? half::fp16_to_f32(cand_m16) : 0.0f;
    if (!(std::fabs(d) > 0) || !std::isfinite(d) || !std::isfinite(cm)) return;
    const float e = quick_score(b, x, d, 1.0f / d, cm, q);
    if (!(e < best_err)) return;
    best_err = e;
    std::memcpy(best_q, q, sizeof q);
    best_d16 = d16;
    best_m16 = cand_m16;
    improved = true;
  };
  for (float f : kQuickFactors) consider(half::f32_to_fp16(d_ref * f), m16);
  // One least-squares refinement of the best: its levels fixed, the scale (and offset) that fit x.
  if (!improved) b.ref_levels(b.ctx, k, best_q);
  int32_t il = 0, ill = 0;
  float ax[8] = {}, axl[8] = {};
  for (int v = 0; v < kBlock / 8; ++v) {
    for (int l = 0; l < 8; ++l) {
      const int32_t q_i = best_q[8 * v + l];
      il += q_i;
      ill += q_i * q_i;
      ax[l] += x[8 * v + l];
      axl[l] += x[8 * v + l] * float(q_i);
    }
  }
  const double sl = il, sll = ill;
  const double sx = lane_tree_sum8(ax), sxl = lane_tree_sum8(axl);
  if (offset) {
    const double det = kBlock * sll - sl * sl;
    if (det != 0) {
      const double d = (kBlock * sxl - sl * sx) / det;
      consider(half::f32_to_fp16(float(d)), half::f32_to_fp16(float((sx - d * sl) / kBlock)));
    }
  } else if (sll != 0) {
    consider(half::f32_to_fp16(float(sxl / sll)), 0);
  }
  if (!improved) return;
  b.improved |= 1u << k;
  b.out_d16[k] = best_d16;
  b.out_m16[k] = best_m16;
  std::memcpy(b.levels[k], best_q, kBlock);
}

}  // namespace

// The scalar QuickSearchFn (the scalar level's row in simd_kernels.cc): block by block.
void quick_search_ref(QuickSearchBlocks& b) {
  b.improved = 0;
  for (int k = 0; k < b.n; ++k) quick_search_block(b, k);
}

}  // namespace simd

}  // namespace kvsnap
