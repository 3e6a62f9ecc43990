// kvsnap_make_golden DIR: writes the golden vectors of tests/migrate/golden from the real
// ggml (llama.cpp v0.5.0, libggml-base + CPU backend of node-llama-cpp 3.22.1). Uses only
// ggml and tests/migrate/test_inputs.h, never kvsnap's own conversion code. Run once;
// the files are committed and migrate_tests checks kvsnap against them without ggml.
//
// File format (text, one record a line, '#' comments):
//   <type>.golden
//     inputs <fnv64 of all hard-case floats>          guards test_inputs.h against drift
//     case <name> <n> <hex: ggml_quantize_chunk bytes> <fnv64: ggml to_float of those bytes>
//     random <dist> <seed> <rows> <n> <fnv64 input> <fnv64 bytes> <fnv64 to_float floats>
//     blocks <seed> <n_blocks> <fnv64 to_float of random_blocks(seed)>
//   half.golden
//     codes <type> <fnv64 to_float of all 65536 codes>
//     sweep <type> <count> <fnv64 input> <fnv64 ggml_quantize_chunk of half_sweep()>
//   rotation.golden
//     fwht <n_rot> <dist> <seed> <rows> <n> <fnv64 input> <fnv64 CPU-backend output>
//     vector <n_rot> <name> <hex: input floats> <hex: CPU-backend output floats>
//   pipeline.golden
//     rotate <type> <K|V> <head_dim> <dist> <seed> <rows> <n> <fnv64 f16 input> <fnv64 output>
//     unrotate <type> <K|V> <head_dim> <dist> <seed> <rows> <n> <fnv64 quantized input> <fnv64 f16 output>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "ggml.h"
#include "ggml_oracle.h"
#include "test_inputs.h"

using kvsnap::testing::Dist;
using kvsnap::testing::fnv1a;
using kvsnap::testing::fnv1a_of;
using kvsnap::testing::GgmlOracle;

namespace {

struct TypeInfo {
  int id;
  std::string name;
};
// The KV cache types from kvsnap's one type table (format/ggml_types.h: a constexpr header, no
// kvsnap code is linked), in ggml enum order; main() checks each name against ggml's own.
std::vector<TypeInfo> kv_types() {
  std::vector<TypeInfo> out;
  for (const kvsnap::TypeLayout& t : kvsnap::kv_cache_types()) out.push_back({int(t.id), std::string(t.name)});
  return out;
}
TypeInfo kv_type(const std::string& name) {
  for (const TypeInfo& t : kv_types()) {
    if (t.name == name) return t;
  }
  std::fprintf(stderr, "no KV cache type %s\n", name.c_str());
  std::exit(1);
}

std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; i++) {
    const uint8_t b = static_cast<const uint8_t*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}
std::string h64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

const char* kHeader =
    "# kvsnap migrate golden vectors, made by tests/migrate/make_golden.cc from ggml of llama.cpp v0.5.0\n"
    "# (node-llama-cpp 3.22.1: libggml-base.so + CPU backend). Do not edit; regenerate with\n"
    "#   build-*/tests/migrate/kvsnap_make_golden tests/migrate/golden\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::string err;
  auto o = GgmlOracle::open(KVSNAP_MIGRATE_ORACLE_LIBDIR, &err);
  if (!o) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  std::printf("ggml CPU backend: %s\n", o->describe().c_str());
  const std::vector<TypeInfo> types = kv_types();
  for (const TypeInfo& t : types) {
    if (t.name != ggml_type_name(static_cast<ggml_type>(t.id))) {
      std::fprintf(stderr, "format/ggml_types.h names type %d %s, ggml %s\n", t.id, t.name.c_str(),
                   ggml_type_name(static_cast<ggml_type>(t.id)));
      return 1;
    }
  }
  const auto cases = kvsnap::testing::hard_cases();
  uint64_t inputs = 0xcbf29ce484222325ull;
  for (const auto& c : cases) inputs = fnv1a_of(c.x, inputs);

  for (const TypeInfo& t : types) {
    const auto tt = ggml_get_type_traits(static_cast<ggml_type>(t.id));
    std::ofstream f(dir + "/" + t.name + ".golden");
    f << kHeader << "type " << t.name << "\n";
    f << "inputs " << h64(inputs) << "\n";
    for (const auto& c : cases) {
      const auto q = o->quantize(t.id, c.x.data(), 1, c.x.size());
      const auto back = o->to_float(t.id, q.data(), c.x.size());
      f << "case " << c.name << " " << c.x.size() << " " << hex(q.data(), q.size()) << " " << h64(fnv1a_of(back)) << "\n";
    }
    for (Dist dist : kvsnap::testing::kAllDists) {
      for (uint64_t seed : {1u, 2u}) {
        const size_t n = seed == 1 ? 256 : 1024, rows = seed == 1 ? 32 : 8;
        const auto x = kvsnap::testing::random_rows(dist, seed, rows, n);
        const auto q = o->quantize(t.id, x.data(), rows, n);
        const auto back = o->to_float(t.id, q.data(), rows * n);
        f << "random " << kvsnap::testing::dist_name(dist) << " " << seed << " " << rows << " " << n << " "
          << h64(fnv1a_of(x)) << " " << h64(fnv1a_of(q)) << " " << h64(fnv1a_of(back)) << "\n";
      }
    }
    for (uint64_t seed = 0; seed < 8; seed++) {
      const size_t n_blocks = tt->is_quantized ? 256 : 4096;
      const auto b = kvsnap::testing::random_blocks(seed, n_blocks, tt->type_size, tt->is_quantized);
      const auto back = o->to_float(t.id, b.data(), n_blocks * static_cast<size_t>(tt->blck_size));
      f << "blocks " << seed << " " << n_blocks << " " << h64(fnv1a_of(back)) << "\n";
    }
    std::printf("wrote %s/%s.golden\n", dir.c_str(), t.name.c_str());
  }

  {
    std::ofstream f(dir + "/half.golden");
    f << kHeader;
    std::vector<std::byte> codes(65536 * 2);
    for (uint32_t i = 0; i < 65536; i++) std::memcpy(&codes[2 * i], &i, 2);
    const auto sweep = kvsnap::testing::half_sweep();
    for (const TypeInfo& t : {kv_type("f16"), kv_type("bf16")}) {
      f << "codes " << t.name << " " << h64(fnv1a_of(o->to_float(t.id, codes.data(), 65536))) << "\n";
      f << "sweep " << t.name << " " << sweep.size() << " " << h64(fnv1a_of(sweep)) << " "
        << h64(fnv1a_of(o->quantize(t.id, sweep.data(), 1, sweep.size()))) << "\n";
    }
    std::printf("wrote %s/half.golden\n", dir.c_str());
  }

  {
    std::ofstream f(dir + "/rotation.golden");
    f << kHeader;
    f << "# fwht: ggml_mul_mat(H, x) with GGML_HINT_SRC0_IS_HADAMARD on the CPU backend (llama_mul_mat_hadamard)\n";
    for (uint32_t n_rot : {64u, 128u, 256u}) {
      for (Dist dist : {Dist::kUniform, Dist::kGauss, Dist::kKvLike, Dist::kHeavyTail, Dist::kOutliers,
                        Dist::kTinyScale, Dist::kF16Exact}) {
        const uint64_t seed = 3;
        const size_t rows = 16, n = 1024;
        const auto x = kvsnap::testing::random_rows(dist, seed, rows, n);
        const auto y = o->hadamard(x.data(), x.size(), n_rot, false);
        f << "fwht " << n_rot << " " << kvsnap::testing::dist_name(dist) << " " << seed << " " << rows << " " << n << " "
          << h64(fnv1a_of(x)) << " " << h64(fnv1a_of(y)) << "\n";
      }
      // a few explicit vectors: unit vectors, a ramp
      std::vector<float> e0(n_rot, 0.0f), e5(n_rot, 0.0f), ramp(n_rot);
      e0[0] = 1.0f;
      e5[5] = -2.0f;
      for (uint32_t j = 0; j < n_rot; j++) ramp[j] = static_cast<float>(j) * 0.25f - 3.0f;
      for (auto& [name, v] : {std::pair<const char*, std::vector<float>&>{"e0", e0}, {"e5", e5}, {"ramp", ramp}}) {
        const auto y = o->hadamard(v.data(), v.size(), n_rot, false);
        f << "vector " << n_rot << " " << name << " " << hex(v.data(), v.size() * 4) << " "
          << hex(y.data(), y.size() * 4) << "\n";
      }
    }
    std::printf("wrote %s/rotation.golden\n", dir.c_str());
  }

  {
    std::ofstream f(dir + "/pipeline.golden");
    f << kHeader;
    f << "# rotate: f16 rows -> to_float -> CPU fwht (n_rot of the side) -> ggml_quantize_chunk\n";
    f << "# unrotate: those quantized rows -> to_float -> CPU fwht -> f16 (ggml_quantize_chunk)\n";
    const uint32_t head_dim = 128;
    const size_t n = 8 * head_dim, rows = 16;
    for (const TypeInfo& t : types) {
      const auto tt = ggml_get_type_traits(static_cast<ggml_type>(t.id));
      if (!tt->is_quantized) continue;
      for (const char* side : {"K", "V"}) {
        const uint32_t n_rot = side[0] == 'K' ? 128 : 64;
        for (Dist dist : {Dist::kF16Exact, Dist::kKvLike}) {
          const uint64_t seed = 4;
          const auto x = kvsnap::testing::random_rows(dist, seed, rows, n);
          const auto src = o->quantize(GGML_TYPE_F16, x.data(), rows, n);
          const auto r = o->hadamard(o->to_float(GGML_TYPE_F16, src.data(), rows * n).data(), rows * n, n_rot, false);
          const auto q = o->quantize(t.id, r.data(), rows, n);
          f << "rotate " << t.name << " " << side << " " << head_dim << " " << kvsnap::testing::dist_name(dist) << " "
            << seed << " " << rows << " " << n << " " << h64(fnv1a_of(src)) << " " << h64(fnv1a_of(q)) << "\n";
          const auto u = o->hadamard(o->to_float(t.id, q.data(), rows * n).data(), rows * n, n_rot, false);
          const auto back = o->quantize(GGML_TYPE_F16, u.data(), rows, n);
          f << "unrotate " << t.name << " " << side << " " << head_dim << " " << kvsnap::testing::dist_name(dist)
            << " " << seed << " " << rows << " " << n << " " << h64(fnv1a_of(q)) << " " << h64(fnv1a_of(back)) << "\n";
        }
      }
    }
    std::printf("wrote %s/pipeline.golden\n", dir.c_str());
  }
  return 0;
}
