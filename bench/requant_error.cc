// kvsnap-requant-error: what each quantized -> quantized requantization mode costs in accuracy.
//
// For every pair S -> T of two different quantized KV types (30 pairs), on K/V-like rows
// (bench/kv_rows.h), optionally Hadamard-rotated as llama.cpp stores a quantized K:
//   x          the original float values
//   S          x quantized to S by ggml's reference quantizer (what a native S cache holds)
//   T native   x quantized to T directly (what a native T cache holds)
//   search, quick, exact, reference   S -> T by ExactRequantizer with the full scale search, the
//              quick one, none, and by RowConverter (ggml's reference requantization of the decoded
//              values); and which of them --requant auto takes
// and prints each mode's mean squared error against x, divided by T native's. That ratio is the
// question a user's cache asks: how far from a cache made natively in T does a converted one land.
// The search columns against exact's are what a search buys (docs/conversion.md, "--requant").
// Nothing here asserts anything; docs/fidelity.md has the figures and the end-to-end KL test.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/kv_rows.h"
#include "migrate/convert_row.h"
#include "migrate/exact_requant.h"
#include "migrate/hadamard.h"
#include "migrate/type_traits.h"

namespace kvsnap::bench {
namespace {

constexpr GgmlType kQuantized[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                   GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL};

double mse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = double(a[i]) - double(b[i]);
    s += e * e;
  }
  return s / double(a.size());
}

std::vector<std::byte> quantize(const TypeTraits& t, const std::vector<float>& x) {
  std::vector<std::byte> q(x.size() / t.block_elems() * t.block_bytes());
  t.from_f32(x.data(), q.data(), x.size());
  return q;
}

std::vector<float> decode(const TypeTraits& t, const std::vector<std::byte>& q, size_t n) {
  std::vector<float> y(n);
  t.to_f32(q.data(), y.data(), n);
  return y;
}

struct Modes {
  double search = 0, quick = 0, exact = 0, reference = 0;
  double exact_share = 0;  // blocks kept exactly, of all blocks
};

Modes run_pair(const TypeTraits& s, const TypeTraits& t, const std::vector<float>& x, uint32_t n) {
  const std::vector<std::byte> in = quantize(s, x);
  std::vector<std::byte> out(x.size() / t.block_elems() * t.block_bytes());
  Modes m;
  using Search = ExactRequantizer::Search;
  for (Search mode : {Search::kFull, Search::kQuick, Search::kNone}) {
    auto r = ExactRequantizer::make(s, t, n, mode);
    if (!r.ok() || !r->convert(in, out).ok()) {
      std::fprintf(stderr, "kvsnap-requant-error: %s -> %s failed\n", std::string(s.name()).c_str(),
                   std::string(t.name()).c_str());
      std::exit(1);
    }
    (mode == Search::kFull ? m.search : mode == Search::kQuick ? m.quick : m.exact) = mse(x, decode(t, out, x.size()));
    if (mode == Search::kNone) m.exact_share = double(r->blocks_exact()) / double(r->blocks_exact() + r->blocks_requantized());
  }
  auto rc = RowConverter::make(s, t, n, RotationPlan{});
  if (!rc.ok() || !rc->convert(in, out).ok()) std::exit(1);
  m.reference = mse(x, decode(t, out, x.size()));
  return m;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--rows N] [--n N] [--seed S] [--rotate N_ROT]\n"
               "  --rows N       rows of data (default 2048)\n"
               "  --n N          values per row (default 1024: 8 heads of 128)\n"
               "  --rotate N     Hadamard-rotate each row in blocks of N first, as llama.cpp stores a\n"
               "                 quantized K (default 128; 0: the values as generated)\n"
               "Prints, per pair S -> T of quantized KV types, each requantization mode's mean squared\n"
               "error against the original values over that of T made natively from them.\n",
               argv0);
  return 2;
}

int run(int argc, char** argv) {
  uint64_t rows = 2048, seed = 4242;
  uint32_t n = 1024, n_rot = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> uint64_t { return i + 1 < argc ? std::strtoull(argv[++i], nullptr, 10) : 0; };
    if (a == "--rows") rows = next();
    else if (a == "--n") n = uint32_t(next());
    else if (a == "--seed") seed = next();
    else if (a == "--rotate") n_rot = uint32_t(next());
    else return usage(argv[0]);
  }
  if (rows == 0 || n == 0 || n % 32 != 0 || (n_rot && (n % n_rot != 0 || (n_rot & (n_rot - 1))))) return usage(argv[0]);
  std::vector<float> x = make_rows(rows, n, seed);
  if (n_rot) hadamard_rotate(x.data(), x.size(), n_rot);
  std::printf("kvsnap-requant-error: %llu rows of %u values, seed %llu, %s\n", (unsigned long long)rows, n,
              (unsigned long long)seed, n_rot ? ("rotated in blocks of " + std::to_string(n_rot)).c_str() : "not rotated");
  std::printf("MSE against the original values / MSE of T made natively from them (lower is better)\n\n");
  std::printf("%-16s %8s %8s %8s %8s %8s %7s  %s\n", "S -> T", "S", "search", "quick", "exact", "refer.", "kept", "auto");
  for (GgmlType si : kQuantized) {
    for (GgmlType ti : kQuantized) {
      if (si == ti) continue;
      const TypeTraits& s = *find_traits(si);
      const TypeTraits& t = *find_traits(ti);
      const double native_t = mse(x, decode(t, quantize(t, x), x.size()));
      const double native_s = mse(x, decode(s, quantize(s, x), x.size()));
      const Modes m = run_pair(s, t, x, n);
      const std::string name = std::string(s.name()) + " -> " + std::string(t.name());
      std::printf("%-16s %8.3f %8.3f %8.3f %8.3f %8.3f %6.1f%%  %s\n", name.c_str(), native_s / native_t,
                  m.search / native_t, m.quick / native_t, m.exact / native_t, m.reference / native_t,
                  100 * m.exact_share, search_name(search_by_default(s, t)));
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvsnap::bench

int main(int argc, char** argv) { return kvsnap::bench::run(argc, argv); }
