// kvsnap-codec-bench: the chunk filters on the fixtures' K/V tensors (no
// filter, byte shuffle, the per-type choice) and single-thread decode speed,
// alone and with the SHA-256 check (docs/format.md, "Measurements"). Not a test.
//
//   kvsnap-codec-bench      (run from anywhere; reads the source tree's fixtures/)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "format/chunk_codec.h"
#include "format/ggml_types.h"
#include "format/llama_state.h"

namespace kvsnap {
namespace {

std::vector<std::byte> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}

struct Measured {
  double raw = 0, none = 0, shuffled = 0, chosen = 0, dec_gbs = 0, dec_sha_gbs = 0;
};

// Ratios with no filter, with the shuffle of the type's block, and with the
// per-type choice; decode speed (single thread) of the chosen blobs, alone
// and with the SHA-256 check, over about 512 MiB of output.
Measured measure(const std::vector<std::pair<std::vector<std::byte>, int32_t>>& chunks) {
  ChunkEncoder enc(3);
  ChunkDecoder dec;
  Measured m;
  std::vector<std::pair<std::vector<std::byte>, uint64_t>> blobs;
  for (const auto& [t, type] : chunks) {
    m.raw += t.size();
    m.none += enc.encode(t, {})->size();
    m.shuffled += enc.encode(t, {ChunkFilter::kShuffle, uint16_t(find_type(type)->block_bytes)})->size();
    auto c = enc.encode(t, filter_for_type(type));
    m.chosen += c->size();
    blobs.push_back({{c->begin(), c->end()}, t.size()});
  }
  std::vector<std::byte> out;
  const int reps = int(512e6 / m.raw) + 1;
  auto time = [&](bool sha) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r)
      for (const auto& [b, n] : blobs) {
        if (!dec.decode(b, n, out).ok()) std::abort();
        if (sha) (void)sha256_of(out);
      }
    return m.raw * reps / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };
  // Best of three: the test machine is shared.
  for (int i = 0; i < 3; ++i) {
    m.dec_gbs = std::max(m.dec_gbs, time(false));
    m.dec_sha_gbs = std::max(m.dec_sha_gbs, time(true));
  }
  return m;
}

int run() {
  const auto root = std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures";
  const char* files[] = {"v0.5.0/hd64-f16-f16-faon.slot",  "v0.5.0/hd128-f16-f16-faon.slot",
                         "v0.5.0/hd64-f16-f16-faoff.slot", "v0.5.0/hd64-bf16-bf16-faoff.slot",
                         "v0.5.0/hd64-q8_0-q8_0-faon.slot", "b8121/hd64-q8_0-q8_0-faon.slot",
                         "v0.5.0/hd64-q4_0-q8_0-faon.slot"};
  std::printf("%-34s %-7s %9s %7s %7s %7s %9s %9s\n", "fixture", "chunks", "raw B", "none", "shuffle", "chosen",
              "dec GB/s", "+sha GB/s");
  for (const char* rel : files) {
    const auto bytes = slurp(root / rel);
    MemoryFile f(rel, std::span<const std::byte>(bytes));
    auto st = parse_state(f);
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", rel, st.status().ToString().c_str());
      return 1;
    }
    // Per tensor: the fixtures hold fewer than 256 cells, so one chunk per
    // tensor, as the snapshot cuts them.
    std::vector<std::pair<std::vector<std::byte>, int32_t>> tensors;
    std::map<int32_t, std::vector<std::byte>> by_type;
    auto add = [&](ByteRange r, int32_t type) {
      tensors.push_back({{bytes.begin() + r.offset, bytes.begin() + r.offset + r.size}, type});
      auto& all = by_type[type];
      all.insert(all.end(), bytes.begin() + r.offset, bytes.begin() + r.offset + r.size);
    };
    for (const auto& sec : st->memory.kv)
      for (const auto& s : sec.streams)
        for (const auto& L : s.layers) {
          add(L.k, L.k_type);
          if (L.has_v) add(L.v, L.v_type);
        }
    // 512 KiB chunks (a 256-cell chunk of a real model) of the fixture's
    // elements (quantized: blocks) drawn in random order: the same value
    // statistics without the repeats a plain concatenation would add.
    std::vector<std::pair<std::vector<std::byte>, int32_t>> big;
    std::mt19937 rng(1);
    for (const auto& [type, all] : by_type) {
      const size_t e = find_type(type)->block_bytes, n = all.size() / e;
      for (int c = 0; c < 2; ++c) {
        std::vector<std::byte> b;
        while (b.size() + e <= (512u << 10)) {
          const size_t k = rng() % n;
          b.insert(b.end(), all.begin() + k * e, all.begin() + (k + 1) * e);
        }
        big.push_back({b, type});
      }
    }
    for (auto [label, set] : {std::pair{"tensor", &tensors}, std::pair{"512KiB*", &big}}) {
      const Measured m = measure(*set);
      std::printf("%-34s %-7s %9.0f %7.3f %7.3f %7.3f %9.2f %9.2f\n", rel, label, m.raw, m.raw / m.none,
                  m.raw / m.shuffled, m.raw / m.chosen, m.dec_gbs, m.dec_sha_gbs);
    }
  }
  std::printf("* 512 KiB chunks of the fixture's elements (blocks) in random order: real chunk size, order-0 "
              "statistics (no repeats)\n");
  return 0;
}

}  // namespace
}  // namespace kvsnap

int main() { return kvsnap::run(); }
