// ExactRequantizer (migrate/exact_requant.h), the quantized -> quantized conversion, at every SIMD
// level this CPU runs against the scalar level, on fuzzer bytes as the source blocks: the kernels
// (the direct path into q8_0, the quick search and the reference blocks it makes into q4_0 and
// q5_0, the integer quick search from q8_0, q4_0, q5_0, iq4_nl, q4_1 and q5_1 into q4_0 and
// q5_0 and from those whose levels can span more than the target's into q4_1 and q5_1, the full
// search's scores) must write the scalar code's bytes. A row that differs aborts.
//
// Input: byte 0 picks the source type and byte 1 the target (among the quantized types, modulo
// their count; a pair the requantizer does not take is skipped), byte 2 the search (kNone, kQuick,
// kFull); the rest, cut to whole source blocks (at most 64), is one row.
#include <cstdlib>
#include <vector>

#include "base/simd_level.h"
#include "fuzz/fuzz_input.h"
#include "migrate/exact_requant.h"
#include "migrate/type_traits.h"

namespace {

using kvsnap::ExactRequantizer;

std::vector<std::byte> convert_at(kvsnap::simd::Level level, const kvsnap::TypeTraits& s, const kvsnap::TypeTraits& d,
                                  uint64_t n_elems, ExactRequantizer::Search search, std::span<const std::byte> in) {
  if (!kvsnap::simd::set_level(level)) std::abort();
  auto r = ExactRequantizer::make(s, d, n_elems, search);
  if (!r.ok()) std::abort();  // a pair exact_requant_applies takes, whole blocks
  std::vector<std::byte> out(r->dst_row_bytes());
  if (!r->convert(in, out).ok()) std::abort();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvsnap;
  if (size < 3) return 0;
  std::vector<const TypeTraits*> quantized;
  for (const TypeTraits& t : type_traits()) {
    if (t.quantized()) quantized.push_back(&t);
  }
  const TypeTraits& s = *quantized[data[0] % quantized.size()];
  const TypeTraits& d = *quantized[data[1] % quantized.size()];
  if (!exact_requant_applies(s, d)) return 0;
  const ExactRequantizer::Search search = data[2] % 3 == 0   ? ExactRequantizer::Search::kNone
                                          : data[2] % 3 == 1 ? ExactRequantizer::Search::kQuick
                                                             : ExactRequantizer::Search::kFull;
  const std::span<const std::byte> rest = fuzz::bytes(data, size).subspan(3);
  const size_t blocks = std::min<size_t>(rest.size() / s.block_bytes(), 64);
  if (blocks == 0) return 0;
  const std::span<const std::byte> in = rest.first(blocks * s.block_bytes());
  const simd::Level was = simd::level();
  const std::vector<std::byte> want = convert_at(simd::Level::kScalar, s, d, blocks * 32, search, in);
  for (size_t l = 1; l < simd::kLevelCount; ++l) {
    if (!simd::supported(simd::Level(l))) continue;
    if (convert_at(simd::Level(l), s, d, blocks * 32, search, in) != want) std::abort();
  }
  simd::set_level(was);
  return 0;
}
