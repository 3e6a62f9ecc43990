// Chunk blobs: filters, the self-describing header, encode/decode round trips,
// hostile blobs. ChunkCodec.MeasureFixtures (KVSNAP_MEASURE=1) prints the
// compression ratios and decode speeds recorded in docs/format.md.
#include "format/chunk_codec.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "format/ggml_types.h"
#include "format/llama_state.h"

namespace kvsnap {
namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> b(n);
  for (auto& x : b) x = std::byte(rng() & 0xff);
  return b;
}

// f16-like values: random low byte, a narrow range of high bytes.
std::vector<std::byte> f16ish(size_t n_elems, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> b(n_elems * 2);
  for (size_t i = 0; i < n_elems; ++i) {
    b[2 * i] = std::byte(rng() & 0xff);
    b[2 * i + 1] = std::byte(0x30 + (rng() % 12) + ((rng() & 1) << 7));
  }
  return b;
}

TEST(ChunkCodec, Sha256KnownAnswer) {
  const std::string abc = "abc";
  const auto h = sha256_of(std::as_bytes(std::span(abc.data(), abc.size())));
  EXPECT_EQ(to_hex(h), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256Digest back{};
  ASSERT_TRUE(from_hex(to_hex(h), back));
  EXPECT_EQ(back, h);
  EXPECT_FALSE(from_hex("xyz", back));
  Sha256 inc;
  inc.update(std::as_bytes(std::span(abc.data(), 1)));
  inc.update(std::as_bytes(std::span(abc.data() + 1, 2)));
  EXPECT_EQ(inc.finish(), h);
}

TEST(ChunkCodec, ShuffleRoundTripsEveryElementSizeAndTail) {
  for (size_t elem : {2u, 3u, 4u, 18u, 34u, 1024u}) {
    for (size_t n : {0u, 1u, 2u, 15u, 16u, 17u, 33u, 64u, 1000u, 4099u}) {
      SCOPED_TRACE(std::to_string(elem) + " x " + std::to_string(n));
      const auto in = random_bytes(n, uint32_t(elem * 7 + n));
      std::vector<std::byte> sh(n), back(n);
      shuffle_bytes(in, elem, sh);
      unshuffle_bytes(sh, elem, back);
      EXPECT_EQ(back, in);
      if (n >= 2 * elem && elem == 2) {
        EXPECT_EQ(sh[0], in[0]);
        EXPECT_EQ(sh[1], in[2]);
        EXPECT_EQ(sh[n / 2], in[1]);  // the second plane starts with byte 1 of element 0
      }
    }
  }
}

TEST(ChunkCodec, FilterPerType) {
  EXPECT_EQ(filter_for_type(1).filter, ChunkFilter::kShuffle);
  EXPECT_EQ(filter_for_type(1).elem_size, 2);
  EXPECT_EQ(filter_for_type(30).elem_size, 2);
  EXPECT_EQ(filter_for_type(0).elem_size, 4);
  EXPECT_EQ(filter_for_type(8).filter, ChunkFilter::kNone);
  EXPECT_EQ(filter_for_type(2).filter, ChunkFilter::kNone);
}

TEST(ChunkCodec, EncodeDecodeRoundTrips) {
  ChunkEncoder enc(3);
  ChunkDecoder dec;
  struct Case {
    std::vector<std::byte> raw;
    FilterChoice filter;
  };
  std::vector<Case> cases = {
      {f16ish(100000, 1), {ChunkFilter::kShuffle, 2}},
      {f16ish(100001, 2), {ChunkFilter::kShuffle, 2}},            // odd element count
      {random_bytes(34 * 1000 + 5, 3), {ChunkFilter::kShuffle, 34}},  // tail of 5 bytes
      {std::vector<std::byte>(50000, std::byte{7}), {ChunkFilter::kNone, 0}},
      {random_bytes(70000, 4), {ChunkFilter::kNone, 0}},         // incompressible: stored
      {{}, {ChunkFilter::kShuffle, 2}},                          // empty
      {random_bytes(1, 5), {ChunkFilter::kShuffle, 4}},          // shorter than one element
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    auto blob = enc.encode(cases[i].raw, cases[i].filter);
    ASSERT_TRUE(blob.ok()) << blob.status().ToString();
    const std::vector<std::byte> copy(blob->begin(), blob->end());
    auto h = read_blob_header(copy);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->raw_size, cases[i].raw.size());
    EXPECT_LE(copy.size(), cases[i].raw.size() + kBlobHeaderBytes);
    std::vector<std::byte> out;
    ASSERT_TRUE(dec.decode(copy, cases[i].raw.size(), out).ok());
    EXPECT_EQ(out, cases[i].raw);
  }
  // Incompressible bytes are stored, compressible ones are not.
  auto stored = enc.encode(random_bytes(70000, 4), {});
  EXPECT_EQ(read_blob_header(std::vector<std::byte>(stored->begin(), stored->end()))->codec, ChunkCodec::kStored);
  auto zst = enc.encode(std::vector<std::byte>(50000, std::byte{7}), {});
  EXPECT_EQ(read_blob_header(std::vector<std::byte>(zst->begin(), zst->end()))->codec, ChunkCodec::kZstd);
  EXPECT_LT(zst->size(), 1000u);
}

TEST(ChunkCodec, RefusesOversizedChunks) {
  ChunkEncoder enc;
  std::vector<std::byte> big(kMaxChunkRawBytes + 1);
  EXPECT_EQ(enc.encode(big, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(enc.encode(std::span<const std::byte>(big).first(10), {ChunkFilter::kShuffle, 0}).status().code(),
            Code::kInvalidArgument);
}

TEST(ChunkCodec, HostileBlobsAreCleanErrors) {
  ChunkEncoder enc;
  ChunkDecoder dec;
  const auto raw = f16ish(4096, 9);
  auto b = enc.encode(raw, {ChunkFilter::kShuffle, 2});
  ASSERT_TRUE(b.ok());
  const std::vector<std::byte> blob(b->begin(), b->end());
  std::vector<std::byte> out;
  auto expect_error = [&](std::vector<std::byte> x, uint64_t expect_size, const char* what) {
    SCOPED_TRACE(what);
    Status s = dec.decode(x, expect_size, out);
    EXPECT_FALSE(s.ok());
    EXPECT_FALSE(s.message().empty());
  };
  expect_error(std::vector<std::byte>(blob.begin(), blob.begin() + 10), raw.size(), "shorter than the header");
  auto x = blob;
  x[0] = std::byte{'X'};
  expect_error(x, raw.size(), "bad magic");
  x = blob;
  x[4] = std::byte{9};
  EXPECT_EQ(dec.decode(x, raw.size(), out).code(), Code::kNotSupported);
  x = blob;
  x[5] = std::byte{9};
  EXPECT_EQ(dec.decode(x, raw.size(), out).code(), Code::kNotSupported);
  x = blob;
  x[6] = std::byte{0};
  x[7] = std::byte{0};
  expect_error(x, raw.size(), "shuffle element 0");
  x = blob;
  x[15] = std::byte{0x40};  // raw size 2^62: refused before any allocation
  expect_error(x, raw.size(), "huge raw size");
  expect_error(blob, raw.size() + 1, "unexpected raw size");
  x = blob;
  x.erase(x.end() - 3, x.end());
  expect_error(x, raw.size(), "truncated payload");
  // Every single-byte flip either fails or decodes to other bytes (the hash
  // catches those); none crashes.
  for (size_t i = 0; i < blob.size(); ++i) {
    x = blob;
    x[i] ^= std::byte{0x5a};
    Status s = dec.decode(x, raw.size(), out);
    if (s.ok()) {
      EXPECT_EQ(out.size(), raw.size());
    }
  }
}

// --- Measurements (docs/format.md) ------------------------------------------------

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

TEST(ChunkCodec, MeasureFixtures) {
  if (!std::getenv("KVSNAP_MEASURE")) GTEST_SKIP() << "set KVSNAP_MEASURE=1 to measure compression and decode speed";
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
    ASSERT_TRUE(st.ok()) << st.status().ToString();
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
}

}  // namespace
}  // namespace kvsnap
