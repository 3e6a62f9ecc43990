// kvsnap-codec-bench: the chunk filters on the fixtures' K/V tensors (no
// filter, byte shuffle, the per-type choice) and single-thread decode speed,
// alone and with the SHA-256 check (docs/format.md, "Measurements"). Not a test.
//
//   kvsnap-codec-bench      (run from anywhere; reads the source tree's fixtures/)
//   kvsnap-codec-bench --slot SLOT [CHUNK_KIB]   each byte plane of a real slot's K/V chunks
//       through zstd settings (and ISA-L igzip): ratio, order-0 entropy, encode and decode
//       MB/s of one thread's CPU time (docs/store.md, "The codec of a plane")
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <ctime>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#if defined(KVSNAP_HAVE_ISAL)
#include <isa-l/igzip_lib.h>
#endif

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

// --- The real slot's planes (--slot FILE) ---------------------------------------------
// Each K/V tensor of an f16 (or q8_0/q4_0) slot cut into 512 KiB chunks (256 cells of a
// 8 x 128 head, as a save cuts them), shuffled as the encoder does; then each codec setting
// compresses every chunk's planes and decodes them, one thread. Prints the plane's size
// ratio, its order-0 entropy bound and MB/s of plane bytes for encode and decode.

using Chunks = std::vector<std::vector<std::byte>>;

double order0_bits(std::span<const std::byte> p) {
  size_t h[256] = {};
  for (std::byte b : p) ++h[uint8_t(b)];
  double bits = 0;
  for (size_t c : h)
    if (c) bits -= double(c) * std::log2(double(c) / double(p.size()));
  return bits;
}

struct Codec {
  std::string name;
  std::function<size_t(std::span<const std::byte>, std::vector<std::byte>&)> enc;  // returns size
  std::function<void(std::span<const std::byte>, std::span<std::byte>)> dec;
};

// This thread's CPU time: steadier than wall time on a shared machine.
double thread_secs() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

void run_codec(const Codec& c, const Chunks& planes, double raw) {
  std::vector<std::vector<std::byte>> out(planes.size());
  double enc_s = 1e9, dec_s = 1e9, stored = 0;
  for (int r = 0; r < 3; ++r) {  // best of three: the machine is shared
    stored = 0;
    const double t0 = thread_secs();
    for (size_t i = 0; i < planes.size(); ++i) {
      const size_t n = c.enc(planes[i], out[i]);
      out[i].resize(n);
      stored += n;
    }
    enc_s = std::min(enc_s, thread_secs() - t0);
  }
  std::vector<std::byte> back;
  for (int r = 0; r < 3; ++r) {
    const double t0 = thread_secs();
    for (size_t i = 0; i < planes.size(); ++i) {
      back.resize(planes[i].size());
      c.dec(out[i], back);
      if (r == 0 && std::memcmp(back.data(), planes[i].data(), back.size()) != 0) {
        std::fprintf(stderr, "%s: round trip differs\n", c.name.c_str());
        std::abort();
      }
    }
    dec_s = std::min(dec_s, thread_secs() - t0);
  }
  std::printf("%-44s %7.3f %9.0f %9.0f\n", c.name.c_str(), raw / stored, raw / enc_s / 1e6, raw / dec_s / 1e6);
}

Codec zstd_codec(std::string name, std::function<void(ZSTD_CCtx*)> set) {
  auto cctx = std::shared_ptr<ZSTD_CCtx>(ZSTD_createCCtx(), ZSTD_freeCCtx);
  auto dctx = std::shared_ptr<ZSTD_DCtx>(ZSTD_createDCtx(), ZSTD_freeDCtx);
  set(cctx.get());
  return {std::move(name),
          [cctx](std::span<const std::byte> in, std::vector<std::byte>& out) {
            out.resize(ZSTD_compressBound(in.size()));
            const size_t n = ZSTD_compress2(cctx.get(), out.data(), out.size(), in.data(), in.size());
            if (ZSTD_isError(n)) std::abort();
            return n;
          },
          [dctx](std::span<const std::byte> in, std::span<std::byte> out) {
            const size_t n = ZSTD_decompressDCtx(dctx.get(), out.data(), out.size(), in.data(), in.size());
            if (ZSTD_isError(n) || n != out.size()) std::abort();
          }};
}

Codec zstd_level(int level, bool huf_literals, int min_match = 0, int window_log = 0, int target_length = -1) {
  std::string name = "zstd " + std::to_string(level) + (huf_literals ? " +huf" : "");
  if (min_match) name += " mml" + std::to_string(min_match);
  if (window_log) name += " wlog" + std::to_string(window_log);
  if (target_length >= 0) name += " tlen" + std::to_string(target_length);
  return zstd_codec(name, [=](ZSTD_CCtx* c) {
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
    if (huf_literals) ZSTD_CCtx_setParameter(c, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
    if (min_match) ZSTD_CCtx_setParameter(c, ZSTD_c_minMatch, min_match);
    if (window_log) ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, window_log);
    if (target_length >= 0) ZSTD_CCtx_setParameter(c, ZSTD_c_targetLength, target_length);
  });
}

#if defined(KVSNAP_HAVE_ISAL)
// ISA-L deflate (raw, no header); `custom`: Huffman tables from this input's histogram.
Codec igzip(int level, bool custom) {
  const uint32_t lvl_bytes[] = {ISAL_DEF_LVL0_DEFAULT, ISAL_DEF_LVL1_DEFAULT, ISAL_DEF_LVL2_DEFAULT,
                                ISAL_DEF_LVL3_DEFAULT};
  auto lvl = std::make_shared<std::vector<uint8_t>>(lvl_bytes[level]);
  auto tables = std::make_shared<isal_hufftables>();
  return {"igzip " + std::to_string(level) + (custom ? " custom tables" : ""),
          [=](std::span<const std::byte> in, std::vector<std::byte>& out) {
            out.resize(in.size() + in.size() / 8 + 1024);
            isal_zstream s;
            isal_deflate_stateless_init(&s);
            s.level = level;
            s.level_buf = lvl->data();
            s.level_buf_size = lvl->size();
            if (custom) {
              isal_huff_histogram hist{};
              isal_update_histogram((uint8_t*)in.data(), in.size(), &hist);
              isal_create_hufftables(tables.get(), &hist);
              s.hufftables = tables.get();
            }
            s.next_in = (uint8_t*)in.data();
            s.avail_in = in.size();
            s.next_out = (uint8_t*)out.data();
            s.avail_out = out.size();
            s.end_of_stream = 1;
            s.flush = NO_FLUSH;
            if (isal_deflate_stateless(&s) != COMP_OK) std::abort();
            return size_t(s.total_out);
          },
          [](std::span<const std::byte> in, std::span<std::byte> out) {
            inflate_state s;
            isal_inflate_init(&s);
            s.next_in = (uint8_t*)in.data();
            s.avail_in = in.size();
            s.next_out = (uint8_t*)out.data();
            s.avail_out = out.size();
            if (isal_inflate_stateless(&s) != ISAL_DECOMP_OK || s.total_out != out.size()) std::abort();
          }};
}

#endif

int run_slot(const char* path, size_t chunk_bytes) {
  const auto bytes = slurp(path);
  MemoryFile f(path, std::span<const std::byte>(bytes));
  auto st = parse_state(f);
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", path, st.status().ToString().c_str());
    return 1;
  }
  // Plane k of every chunk (one plane per chunk when the type is not shuffled).
  std::vector<Chunks> planes;
  for (const auto& sec : st->memory.kv)
    for (const auto& s : sec.streams)
      for (const auto& L : s.layers)
        for (auto [r, type] : {std::pair{L.k, L.k_type}, std::pair{L.v, L.v_type}}) {
          if (r.size == 0) continue;
          const FilterChoice fc = filter_for_type(type);
          for (uint64_t at = 0; at < r.size; at += chunk_bytes) {
            std::span<const std::byte> raw(bytes.data() + r.offset + at, std::min<uint64_t>(chunk_bytes, r.size - at));
            std::vector<std::byte> sh(raw.begin(), raw.end());
            size_t e = 1;
            if (fc.filter == ChunkFilter::kShuffle) {
              e = fc.elem_size;
              shuffle_bytes(raw, e, sh);
            }
            if (planes.size() < e) planes.resize(e);
            const size_t n = raw.size() / e;
            for (size_t b = 0; b < e; ++b) planes[b].push_back({sh.begin() + b * n, sh.begin() + (b + 1) * n});
          }
        }
  std::printf("%s: %zu KiB chunks, %zu plane(s)\n", path, chunk_bytes >> 10, planes.size());
  for (size_t b = 0; b < planes.size(); ++b) {
    double raw = 0, bits = 0, bits_all = 0;
    std::vector<std::byte> all;
    for (const auto& p : planes[b]) {
      raw += p.size();
      bits += order0_bits(p);
      all.insert(all.end(), p.begin(), p.end());
    }
    bits_all = order0_bits(all);
    std::printf("plane %zu: %.1f MB, order-0 entropy %.3f bits/byte per chunk (bound %.3fx), %.3f over all (%.3fx)\n", b,
                raw / 1e6, bits / raw, 8 * raw / bits, bits_all / raw, 8 * raw / bits_all);
    std::printf("%-44s %7s %9s %9s\n", "codec", "ratio", "enc MB/s", "dec MB/s");
    std::vector<Codec> codecs;
    for (int level : {1, -1, -3, -5, -10})
      for (bool huf : {false, true})
        if (level < 0 || !huf) codecs.push_back(zstd_level(level, huf));
    for (int level : {1, -1, -3, -5, -10}) codecs.push_back(zstd_level(level, level < 0, 7));
    codecs.push_back(zstd_level(-5, true, 7, 17));
    codecs.push_back(zstd_level(-20, true, 7));
    codecs.push_back(zstd_level(-1000, true, 7));
#if defined(KVSNAP_HAVE_ISAL)
    codecs.push_back(igzip(0, true));
    codecs.push_back(igzip(1, false));
#endif
    for (const auto& c : codecs) run_codec(c, planes[b], raw);
  }
  return 0;
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

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--slot") == 0)
    return kvsnap::run_slot(argv[2], argc >= 4 ? std::strtoul(argv[3], nullptr, 10) << 10 : 512u << 10);
  return kvsnap::run();
}
