#include "migrate/type_traits.h"

#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "migrate/half.h"
#include "migrate/quants.h"
#include "migrate/simd_kernels.h"

namespace kvsnap {
namespace {

namespace ref = quants::ref;
#ifdef KVSNAP_SIMD_X86
#define KVSNAP_X86(fn) simd::x86::fn
#else
#define KVSNAP_X86(fn) nullptr  // a build without the x86 kernels: those levels are never selected
#endif
#ifdef KVSNAP_SIMD_NEON
#define KVSNAP_ARM(fn) simd::arm::fn
#else
#define KVSNAP_ARM(fn) nullptr  // a build without the NEON kernels: that level is never selected
#endif

// One row per KV cache type, in the order of kv_cache_types() (ggml enum order); one column
// per simd::Level, in enum order. nullptr: this level has no kernel of its own for it, the one of
// simd::fallback(level) serves (the scalar column is complete).
//
// Whether an entry is there is recorded when the row is built (`Slot::set`), not found by
// comparing the pointer with nullptr: gcc cannot compare the address of a function defined
// in another file with nullptr in a constant expression under -fsanitize=undefined.
template <class Fn>
struct Slot {
  Fn fn = nullptr;
  bool set = false;
  constexpr Slot() = default;
  constexpr Slot(std::nullptr_t) {}
  constexpr Slot(Fn f) : fn(f), set(true) {}
};
struct LevelCodec {
  Slot<ToF32Fn> to_f32;
  Slot<FromF32Fn> from_f32;
};
struct CodecRow {
  GgmlType id;
  std::array<LevelCodec, simd::kLevelCount> level;
};

constexpr CodecRow kCodecRows[] = {
    //                scalar                                   avx2                                          avx512
    //   neon
    {GgmlType::kF32, {{{ref::f32_to_f32, ref::f32_from_f32}, {}, {},
       {}}}},
    {GgmlType::kF16,
     {{{ref::f16_to_f32, ref::f16_from_f32},
       {KVSNAP_X86(f16_to_f32_avx2), KVSNAP_X86(f16_from_f32_avx2)},
       {KVSNAP_X86(f16_to_f32_avx512), KVSNAP_X86(f16_from_f32_avx512)},
       {KVSNAP_ARM(f16_to_f32_neon), KVSNAP_ARM(f16_from_f32_neon)}}}},
    {GgmlType::kQ4_0,
     {{{ref::q4_0_to_f32, ref::q4_0_from_f32},
       {KVSNAP_X86(q4_0_to_f32_avx2), KVSNAP_X86(q4_0_from_f32_avx2)},
       {nullptr, KVSNAP_X86(q4_0_from_f32_avx512)},
       {KVSNAP_ARM(q4_0_to_f32_neon), KVSNAP_ARM(q4_0_from_f32_neon)}}}},
    {GgmlType::kQ4_1,
     {{{ref::q4_1_to_f32, ref::q4_1_from_f32},
       {KVSNAP_X86(q4_1_to_f32_avx2), KVSNAP_X86(q4_1_from_f32_avx2)},
       {},
       {KVSNAP_ARM(q4_1_to_f32_neon), KVSNAP_ARM(q4_1_from_f32_neon)}}}},
    {GgmlType::kQ5_0,
     {{{ref::q5_0_to_f32, ref::q5_0_from_f32},
       {KVSNAP_X86(q5_0_to_f32_avx2), KVSNAP_X86(q5_0_from_f32_avx2)},
       {},
       {KVSNAP_ARM(q5_0_to_f32_neon), KVSNAP_ARM(q5_0_from_f32_neon)}}}},
    {GgmlType::kQ5_1,
     {{{ref::q5_1_to_f32, ref::q5_1_from_f32},
       {KVSNAP_X86(q5_1_to_f32_avx2), KVSNAP_X86(q5_1_from_f32_avx2)},
       {},
       {KVSNAP_ARM(q5_1_to_f32_neon), KVSNAP_ARM(q5_1_from_f32_neon)}}}},
    {GgmlType::kQ8_0,
     {{{ref::q8_0_to_f32, ref::q8_0_from_f32},
       {KVSNAP_X86(q8_0_to_f32_avx2), KVSNAP_X86(q8_0_from_f32_avx2)},
       {nullptr, KVSNAP_X86(q8_0_from_f32_avx512)},
       {KVSNAP_ARM(q8_0_to_f32_neon), KVSNAP_ARM(q8_0_from_f32_neon)}}}},
    {GgmlType::kIQ4_NL,
     {{{ref::iq4_nl_to_f32, ref::iq4_nl_from_f32},
       {KVSNAP_X86(iq4_nl_to_f32_avx2), KVSNAP_X86(iq4_nl_from_f32_avx2)},
       {nullptr, KVSNAP_X86(iq4_nl_from_f32_avx512)},
       {KVSNAP_ARM(iq4_nl_to_f32_neon), KVSNAP_ARM(iq4_nl_from_f32_neon)}}}},
    {GgmlType::kBF16,
     {{{ref::bf16_to_f32, ref::bf16_from_f32},
       {KVSNAP_X86(bf16_to_f32_avx2), KVSNAP_X86(bf16_from_f32_avx2)},
       {},
       {KVSNAP_ARM(bf16_to_f32_neon), KVSNAP_ARM(bf16_from_f32_neon)}}}},
};
#undef KVSNAP_X86
#undef KVSNAP_ARM

constexpr size_t kTypes = std::size(kCodecRows);
static_assert(kTypes == kKvCacheTypes.size(), "one codec row per KV cache type of format/ggml_types.h");

constexpr bool rows_follow_layouts() {
  for (size_t i = 0; i < kTypes; i++) {
    if (kCodecRows[i].id != kKvCacheTypes[i].id) return false;
  }
  return true;
}
static_assert(rows_follow_layouts(), "kCodecRows must follow kv_cache_types() order");

constexpr bool scalar_column_complete() {
  for (const CodecRow& r : kCodecRows) {
    if (!r.level[0].to_f32.set || !r.level[0].from_f32.set) return false;
  }
  return true;
}
static_assert(scalar_column_complete(), "every KV type needs its scalar reference pair");

// kCodecRows with every empty entry filled from simd::fallback(level) (resolved before it: every
// fallback is a lower enumerator).
constexpr std::array<std::array<RowCodec, simd::kLevelCount>, kTypes> resolve_levels() {
  std::array<std::array<RowCodec, simd::kLevelCount>, kTypes> out{};
  for (size_t i = 0; i < kTypes; i++) {
    for (size_t l = 0; l < simd::kLevelCount; l++) {
      const LevelCodec& own = kCodecRows[i].level[l];
      const size_t below = static_cast<size_t>(simd::fallback(static_cast<simd::Level>(l)));
      out[i][l].to_f32 = own.to_f32.set ? own.to_f32.fn : out[i][below].to_f32;
      out[i][l].from_f32 = own.from_f32.set ? own.from_f32.fn : out[i][below].from_f32;
    }
  }
  return out;
}
constexpr auto kCodecs = resolve_levels();

// The entry points TypeTraits::to_f32 / from_f32 of row I: the codec of the current level.
template <size_t I>
void to_f32_at_level(const std::byte* src, float* dst, size_t n) {
  kCodecs[I][static_cast<size_t>(simd::level())].to_f32(src, dst, n);
}
template <size_t I>
void from_f32_at_level(const float* src, std::byte* dst, size_t n) {
  kCodecs[I][static_cast<size_t>(simd::level())].from_f32(src, dst, n);
}

template <size_t... I>
constexpr std::array<TypeTraits, kTypes> make_table(std::index_sequence<I...>) {
  return {{TypeTraits{&kKvCacheTypes[I], to_f32_at_level<I>, from_f32_at_level<I>, kCodecs[I]}...}};
}
constexpr std::array<TypeTraits, kTypes> kTraits = make_table(std::make_index_sequence<kTypes>{});

const std::array<TypeTraits, kTypes>& table() { return kTraits; }

}  // namespace

std::span<const TypeTraits> type_traits() { return table(); }

const TypeTraits* find_traits(int32_t ggml_id) {
  for (const TypeTraits& t : table()) {
    if (static_cast<int32_t>(t.id()) == ggml_id) return &t;
  }
  return nullptr;
}

const TypeTraits* find_traits(GgmlType id) { return find_traits(static_cast<int32_t>(id)); }

const TypeTraits* find_traits(std::string_view name) {
  for (const TypeTraits& t : table()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

const TypeTraits* find_traits(const TypeLayout& layout) { return find_traits(layout.id); }

namespace {

// An IEEE float inside a block that ggml_validate_row_data checks: where it
// is, how wide, and its exponent and mantissa bits (all exponent bits set:
// NaN or infinite).
struct FloatField {
  uint8_t offset;  // bytes into the block
  uint8_t bytes;   // 4 (f32) or 2 (f16, bf16)
  uint32_t exp_mask, mantissa_mask;
  const char* what;
};
constexpr FloatField kF32Value{0, 4, 0x7f800000, 0x007fffff, "value"};
constexpr FloatField kF16Value{0, 2, 0x7c00, 0x03ff, "value"};
constexpr FloatField kBF16Value{0, 2, 0x7f80, 0x007f, "value"};
// Every quantized KV type starts with an f16 scale; q4_1/q5_1 follow it with an f16 min.
constexpr FloatField kScale{0, 2, 0x7c00, 0x03ff, "scale of block"};
constexpr FloatField kMin{2, 2, 0x7c00, 0x03ff, "min of block"};

std::span<const FloatField> float_fields(GgmlType id) {
  static constexpr FloatField f32[] = {kF32Value}, f16[] = {kF16Value}, bf16[] = {kBF16Value};
  static constexpr FloatField scale[] = {kScale}, scale_min[] = {kScale, kMin};
  switch (id) {
    case GgmlType::kF32: return f32;
    case GgmlType::kF16: return f16;
    case GgmlType::kBF16: return bf16;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1: return scale_min;
    default: return scale;
  }
}

uint32_t load_field(const std::byte* blk, const FloatField& f) {
  if (f.bytes == 2) return half::load_u16(blk + f.offset);
  uint32_t w;
  std::memcpy(&w, blk + f.offset, 4);
  return w;
}

}  // namespace

Status validate_row(const TypeTraits& t, std::span<const std::byte> row) {
  if (row.size() % t.block_bytes() != 0) {
    return Status::Corruption(std::to_string(row.size()) + " bytes are not a whole number of " +
                              std::string(t.name()) + " blocks of " + std::to_string(t.block_bytes()));
  }
  const size_t nb = row.size() / t.block_bytes();
  const std::span<const FloatField> fields = float_fields(t.id());
  for (size_t i = 0; i < nb; i++) {
    const std::byte* blk = row.data() + i * t.block_bytes();
    for (const FloatField& f : fields) {
      const uint32_t v = load_field(blk, f);
      if ((v & f.exp_mask) == f.exp_mask) {
        return Status::Corruption(std::string(t.name()) + " " + f.what + " " + std::to_string(i) + " is " +
                                  ((v & f.mantissa_mask) != 0 ? "NaN" : "infinite"));
      }
    }
  }
  return Status::OK();
}

}  // namespace kvsnap
