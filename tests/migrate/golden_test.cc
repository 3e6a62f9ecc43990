// kvsnap's codecs, rotation and row pipeline against golden vectors made once from the real
// ggml (tests/migrate/make_golden.cc describes the files). No external library needed.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "migrate/convert_row.h"
#include "migrate/hadamard.h"
#include "migrate/type_traits.h"
#include "test_inputs.h"

#ifndef KVSNAP_MIGRATE_GOLDEN_DIR
#error "KVSNAP_MIGRATE_GOLDEN_DIR must name tests/migrate/golden"
#endif

namespace kvsnap {
namespace {

using Record = std::vector<std::string>;

std::vector<Record> read_golden(const std::string& file) {
  std::ifstream f(std::string(KVSNAP_MIGRATE_GOLDEN_DIR) + "/" + file);
  EXPECT_TRUE(f.good()) << "missing golden file " << file;
  std::vector<Record> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    Record r;
    for (std::string w; ss >> w;) r.push_back(w);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::byte> unhex(const std::string& s) {
  std::vector<std::byte> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); i++) out[i] = static_cast<std::byte>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return out;
}
std::string h64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}
size_t num(const std::string& s) { return static_cast<size_t>(std::stoull(s)); }

testing::Dist dist_by_name(const std::string& name) {
  for (testing::Dist d : testing::kAllDists) {
    if (name == testing::dist_name(d)) return d;
  }
  ADD_FAILURE() << "unknown distribution " << name;
  return testing::Dist::kUniform;
}

std::vector<std::byte> encode(const TypeTraits& t, const std::vector<float>& x) {
  std::vector<std::byte> out(x.size() / t.block_elems() * t.block_bytes());
  t.from_f32(x.data(), out.data(), x.size());
  return out;
}
std::vector<float> decode(const TypeTraits& t, const std::vector<std::byte>& b) {
  std::vector<float> out(b.size() / t.block_bytes() * t.block_elems());
  t.to_f32(b.data(), out.data(), out.size());
  return out;
}

// The KV cache types of format/ggml_types.h's table: a new type gets its golden test (and
// needs its golden file, Golden.OneFilePerKvType) without touching this file.
std::vector<std::string> kv_type_names() {
  std::vector<std::string> out;
  for (const TypeLayout& t : kv_cache_types()) out.emplace_back(t.name);
  return out;
}

class GoldenTypes : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTypes, MatchesGgml) {
  const TypeTraits& t = *find_traits(GetParam());
  const auto recs = read_golden(std::string(t.name()) + ".golden");
  ASSERT_FALSE(recs.empty());
  const auto cases = testing::hard_cases();
  size_t n_case = 0, n_random = 0, n_blocks = 0, bytes = 0;
  for (const Record& r : recs) {
    if (r[0] == "type") {
      ASSERT_EQ(r[1], t.name());
    } else if (r[0] == "inputs") {
      uint64_t h = 0xcbf29ce484222325ull;
      for (const auto& c : cases) h = testing::fnv1a_of(c.x, h);
      ASSERT_EQ(h64(h), r[1]) << "tests/migrate/test_inputs.h hard cases changed: regenerate the golden files";
    } else if (r[0] == "case") {
      ASSERT_EQ(r.size(), 5u);
      const testing::Case* c = nullptr;
      for (const auto& k : cases) {
        if (k.name == r[1]) c = &k;
      }
      ASSERT_NE(c, nullptr) << "golden case " << r[1] << " not in test_inputs.h";
      ASSERT_EQ(c->x.size(), num(r[2]));
      const auto want = unhex(r[3]);
      const auto got = encode(t, c->x);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); i++) {
        ASSERT_EQ(got[i], want[i]) << t.name() << " case " << c->name << ": byte " << i << " (block "
                                   << i / t.block_bytes() << ")";
      }
      EXPECT_EQ(h64(testing::fnv1a_of(decode(t, want))), r[4]) << t.name() << " case " << c->name << ": to_f32";
      n_case++;
      bytes += got.size();
    } else if (r[0] == "random") {
      ASSERT_EQ(r.size(), 8u);
      const auto x = testing::random_rows(dist_by_name(r[1]), num(r[2]), num(r[3]), num(r[4]));
      ASSERT_EQ(h64(testing::fnv1a_of(x)), r[5]) << "random_rows(" << r[1] << ") changed: regenerate the golden files";
      const auto q = encode(t, x);
      EXPECT_EQ(h64(testing::fnv1a_of(q)), r[6]) << t.name() << " random " << r[1] << " seed " << r[2] << ": from_f32";
      EXPECT_EQ(h64(testing::fnv1a_of(decode(t, q))), r[7]) << t.name() << " random " << r[1] << ": to_f32";
      n_random++;
      bytes += q.size();
    } else if (r[0] == "blocks") {
      ASSERT_EQ(r.size(), 4u);
      const auto b = testing::random_blocks(num(r[1]), num(r[2]), t.block_bytes(), t.quantized());
      EXPECT_EQ(h64(testing::fnv1a_of(decode(t, b))), r[3]) << t.name() << " random blocks seed " << r[1];
      n_blocks++;
    } else {
      ADD_FAILURE() << "unknown record " << r[0];
    }
  }
  EXPECT_GT(n_case, 30u);
  EXPECT_GT(n_random, 10u);
  EXPECT_GT(n_blocks, 4u);
  std::printf("golden %-6s: %zu hard cases, %zu random row sets, %zu random block sets, %zu bytes\n",
              std::string(t.name()).c_str(), n_case, n_random, n_blocks, bytes);
}

INSTANTIATE_TEST_SUITE_P(AllKvTypes, GoldenTypes, ::testing::ValuesIn(kv_type_names()),
                         [](const auto& info) { return info.param; });

// golden/ holds exactly one <type>.golden per KV cache type, besides the files of the half,
// rotation and pipeline tests: a type added to the table without its vectors fails here.
TEST(Golden, OneFilePerKvType) {
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(KVSNAP_MIGRATE_GOLDEN_DIR)) {
    if (e.path().extension() == ".golden") files.insert(e.path().stem().string());
  }
  for (const char* other : {"half", "rotation", "pipeline"}) {
    EXPECT_EQ(files.erase(other), 1u) << other << ".golden";
  }
  const std::vector<std::string> names = kv_type_names();
  EXPECT_EQ(files, std::set<std::string>(names.begin(), names.end()));
}

TEST(Golden, HalfConversions) {
  const auto recs = read_golden("half.golden");
  std::vector<std::byte> codes(65536 * 2);
  for (uint32_t i = 0; i < 65536; i++) std::memcpy(&codes[2 * i], &i, 2);
  const auto sweep = testing::half_sweep();
  size_t n = 0;
  for (const Record& r : recs) {
    const TypeTraits& t = *find_traits(r[1]);
    if (r[0] == "codes") {
      EXPECT_EQ(h64(testing::fnv1a_of(decode(t, codes))), r[2]) << t.name();
    } else if (r[0] == "sweep") {
      ASSERT_EQ(num(r[2]), sweep.size());
      ASSERT_EQ(h64(testing::fnv1a_of(sweep)), r[3]);
      EXPECT_EQ(h64(testing::fnv1a_of(encode(t, sweep))), r[4]) << t.name();
    }
    n++;
  }
  EXPECT_EQ(n, 4u);
}

TEST(Golden, RotationMatchesCpuBackendTransform) {
  const auto recs = read_golden("rotation.golden");
  size_t n_fwht = 0, n_vec = 0;
  for (const Record& r : recs) {
    const uint32_t n_rot = static_cast<uint32_t>(num(r[1]));
    if (r[0] == "fwht") {
      auto x = testing::random_rows(dist_by_name(r[2]), num(r[3]), num(r[4]), num(r[5]));
      ASSERT_EQ(h64(testing::fnv1a_of(x)), r[6]);
      hadamard_rotate(x.data(), x.size(), n_rot);
      EXPECT_EQ(h64(testing::fnv1a_of(x)), r[7]) << "n_rot " << n_rot << " " << r[2];
      n_fwht++;
    } else if (r[0] == "vector") {
      const auto in = unhex(r[3]), want = unhex(r[4]);
      std::vector<float> x(in.size() / 4);
      std::memcpy(x.data(), in.data(), in.size());
      hadamard_rotate(x.data(), x.size(), n_rot);
      std::vector<float> w(want.size() / 4);
      std::memcpy(w.data(), want.data(), want.size());
      for (size_t i = 0; i < x.size(); i++) ASSERT_EQ(testing::f32_bits(x[i]), testing::f32_bits(w[i])) << r[2] << " " << i;
      n_vec++;
    }
  }
  EXPECT_EQ(n_fwht, 21u);
  EXPECT_EQ(n_vec, 9u);
}

TEST(Golden, PipelineMatchesGgml) {
  const auto recs = read_golden("pipeline.golden");
  const TypeTraits& f16 = *find_traits("f16");
  std::vector<std::byte> last_q;  // the rotate record's output feeds the next unrotate record
  size_t n = 0;
  for (const Record& r : recs) {
    const TypeTraits& q = *find_traits(r[1]);
    const KvSide side = r[2] == "K" ? KvSide::kK : KvSide::kV;
    const uint32_t head_dim = static_cast<uint32_t>(num(r[3]));
    const size_t rows = num(r[6]), row = num(r[7]);
    if (r[0] == "rotate") {
      const auto x = testing::random_rows(dist_by_name(r[4]), num(r[5]), rows, row);
      const auto src = encode(f16, x);
      ASSERT_EQ(h64(testing::fnv1a_of(src)), r[8]);
      auto plan = plan_rotation(*f16.layout, *q.layout, head_dim, side);
      ASSERT_TRUE(plan.ok());
      auto c = RowConverter::make(f16, q, row, *plan);
      ASSERT_TRUE(c.ok());
      last_q.assign(rows * c->dst_row_bytes(), std::byte{0});
      ASSERT_TRUE(c->convert(src, last_q).ok());
      EXPECT_EQ(h64(testing::fnv1a_of(last_q)), r[9]) << "f16 -> " << q.name() << " " << r[2] << " " << r[4];
    } else if (r[0] == "unrotate") {
      ASSERT_EQ(h64(testing::fnv1a_of(last_q)), r[8]);
      auto plan = plan_rotation(*q.layout, *f16.layout, head_dim, side);
      ASSERT_TRUE(plan.ok());
      auto c = RowConverter::make(q, f16, row, *plan);
      ASSERT_TRUE(c.ok());
      std::vector<std::byte> out(rows * c->dst_row_bytes());
      ASSERT_TRUE(c->convert(last_q, out).ok());
      EXPECT_EQ(h64(testing::fnv1a_of(out)), r[9]) << q.name() << " -> f16 " << r[2] << " " << r[4];
    }
    n++;
  }
  EXPECT_EQ(n, 6u * 2 * 2 * 2);
}

}  // namespace
}  // namespace kvsnap
