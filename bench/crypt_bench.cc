// kvsnap-crypt-bench: what encryption at rest (base/chunk_cipher.h) costs per chunk, beside the
// work a chunk already costs, on real store chunks, one thread, in the same run
// (docs/store.md, "Encryption at rest — design"). Not a test: nothing here asserts time.
//
//   kvsnap-crypt-bench SLOT... [--mb N] [--rounds R] [--level L]
//
// Each SLOT is cut into chunks and encoded exactly as `kvsnap save` does (build_snapshot: 256 cells
// a chunk, byte shuffle, zstd level 1), up to N MB of raw bytes (default 64). Then, over those
// chunks, best of R rounds (default 5), seconds per GB of raw bytes:
//   memcpy        a copy of each stored blob (the least any restore does)
//   zstd decode   ChunkDecoder::decode (zstd + unshuffle), what restore does per chunk today
//   zstd encode   ChunkEncoder at the level, what save does per new chunk today
//   sha256        the plain chunk id / check of the raw bytes (today)
//   hmac id       HMAC-SHA256 keyed chunk id of the raw bytes (encrypted: replaces sha256)
//   seal          AES-256-GCM of each blob (encrypted save, after encode)
//   open          its check and decryption (encrypted restore, before decode)
// and the ratios: seal and open against decode and memcpy, and a whole chunk's restore (open +
// decode + hmac vs decode + sha256) and save (hmac + encode + seal vs sha256 + encode).
//
// Then the whole file end to end in memory, plain against encrypted, with --threads workers
// (default 2): build_snapshot into an in-memory store (what save does minus the disk), and
// open_snapshot + reading original() front to back (what restore does minus the disk); wall
// seconds and CPU seconds (user + system, all threads), best of R.
//
// OpenSSL picks AES-NI / PCLMULQDQ / AVX code itself; OPENSSL_ia32cap masks them, e.g.
//   OPENSSL_ia32cap="~0x200000000000000"   no AES-NI (bit 57)
//   OPENSSL_ia32cap="~0x200000200000000"   no AES-NI and no PCLMULQDQ (bit 33: GHASH by table)
// The bench prints the CPU's flags and the variable so that a table can say what ran.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/chunk_cipher.h"
#include "base/io.h"
#include "base/os.h"
#include "format/chunk_codec.h"
#include "format/llama_state.h"
#include "format/snapshot.h"

namespace kvsnap {
namespace {

using Clock = std::chrono::steady_clock;

struct Chunk {
  std::vector<std::byte> raw, blob;
  FilterChoice filter;
};

// Collects (raw, blob) pairs until `limit` raw bytes; then stops the build with kInterrupted.
class Collect final : public ChunkSink {
 public:
  explicit Collect(uint64_t limit) : limit_(limit) {}
  Status put(const ChunkRef& ref, std::span<const std::byte> blob) override {
    Chunk c;
    c.blob.assign(blob.begin(), blob.end());
    if (!dec_.decode(blob, ref.raw_size, c.raw).ok()) return Status::Corruption("bench: a blob does not decode");
    c.filter = {ref.filter, ref.elem_size};
    raw_ += c.raw.size();
    chunks.push_back(std::move(c));
    return raw_ >= limit_ ? Status::Interrupted("enough chunks") : Status::OK();
  }
  std::vector<Chunk> chunks;

 private:
  uint64_t limit_;
  uint64_t raw_ = 0;
  ChunkDecoder dec_;
};

Result<std::vector<Chunk>> chunks_of(const std::string& path, uint64_t limit, int level) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, posix_io().open_read(path));
  KV_ASSIGN_OR_RETURN(StateFile parsed, parse_state(*f));
  SnapshotOptions o;
  o.zstd_level = level;
  o.created = "2026-01-01T00:00:00Z";
  Collect sink(limit);
  Result<SnapshotManifest> m = build_snapshot(parsed, *f, o, sink);
  if (!m.ok() && m.status().code() != Code::kInterrupted) return m.status();
  return std::move(sink.chunks);
}

// Best of `rounds`: seconds for one pass of `work` over every chunk.
double best_of(int rounds, const std::vector<Chunk>& chunks, const std::function<void(const Chunk&, size_t)>& work) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    for (size_t i = 0; i < chunks.size(); ++i) work(chunks[i], i);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct EndToEnd {
  double save_wall = 1e30, save_cpu = 1e30, read_wall = 1e30, read_cpu = 1e30;
};

// build_snapshot of the whole file into memory, then every byte of original() read back.
Status end_to_end(const std::string& path, const ChunkCipher* cipher, uint32_t threads, int level, int rounds,
                  EndToEnd& e) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, posix_io().open_read(path));
  KV_ASSIGN_OR_RETURN(StateFile parsed, parse_state(*f));
  std::vector<std::byte> buf(4u << 20);
  for (int r = 0; r < rounds; ++r) {
    MemoryChunkStore store;
    SnapshotOptions o;
    o.zstd_level = level;
    o.threads = threads;
    o.cipher = cipher;
    o.created = "2026-01-01T00:00:00Z";
    double c0 = cpu_seconds();
    auto t0 = Clock::now();
    KV_ASSIGN_OR_RETURN(SnapshotManifest m, build_snapshot(parsed, *f, o, store));
    e.save_wall = std::min(e.save_wall, std::chrono::duration<double>(Clock::now() - t0).count());
    e.save_cpu = std::min(e.save_cpu, cpu_seconds() - c0);
    SnapshotReadOptions ro;
    ro.cipher = cipher;
    c0 = cpu_seconds();
    t0 = Clock::now();
    KV_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotReader> reader, open_snapshot(m.bytes, store, ro));
    const ReadableFile& orig = reader->original();
    for (uint64_t at = 0; at < orig.size();) {
      const uint64_t n = std::min<uint64_t>(buf.size(), orig.size() - at);
      KV_RETURN_IF_ERROR(orig.read_at(at, std::span<std::byte>(buf.data(), n)));
      at += n;
    }
    e.read_wall = std::min(e.read_wall, std::chrono::duration<double>(Clock::now() - t0).count());
    e.read_cpu = std::min(e.read_cpu, cpu_seconds() - c0);
  }
  return Status::OK();
}

int run(int argc, char** argv) {
  std::vector<std::string> files;
  double mb = 64;
  int rounds = 5, level = 1;
  uint32_t threads = 2;
  bool whole = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mb" && i + 1 < argc) mb = std::atof(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--level" && i + 1 < argc) level = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = uint32_t(std::max(1, std::atoi(argv[++i])));
    else if (a == "--no-whole") whole = false;
    else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: kvsnap-crypt-bench SLOT... [--mb N] [--rounds R] [--level L] [--threads T] [--no-whole]\n");
      return 2;
    } else files.push_back(a);
  }
  if (files.empty()) {
    std::fprintf(stderr, "kvsnap-crypt-bench: give at least one slot file (bench/make_real_slot.sh makes some)\n");
    return 2;
  }
  const char* cap = std::getenv("OPENSSL_ia32cap");
  std::printf("cpu flags: %s\nOPENSSL_ia32cap: %s\n", cpu_crypto_features().c_str(), cap ? cap : "(unset: OpenSSL's choice)");
  std::array<uint8_t, 32> kb{};
  for (size_t i = 0; i < kb.size(); ++i) kb[i] = uint8_t(i * 7 + 1);
  const MasterKey key = MasterKey::from_bytes(kb).value();
  const ChunkCipher cipher = ChunkCipher::for_tenant(key, "bench").value();

  for (const std::string& path : files) {
    Result<std::vector<Chunk>> got = chunks_of(path, uint64_t(mb * 1e6), level);
    if (!got.ok()) {
      std::fprintf(stderr, "kvsnap-crypt-bench: %s: %s\n", path.c_str(), got.status().ToString().c_str());
      return 1;
    }
    const std::vector<Chunk>& chunks = *got;
    double raw = 0, stored = 0;
    for (const Chunk& c : chunks) raw += double(c.raw.size()), stored += double(c.blob.size());
    std::vector<ChunkId> ids;
    for (const Chunk& c : chunks) ids.push_back(cipher.chunk_id(c.raw));
    std::vector<std::vector<std::byte>> sealed(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      sealed[i].resize(cipher.seal_into(ids[i], chunks[i].blob, sealed[i]).value());
    }
    std::vector<std::byte> out, copy;
    ChunkDecoder dec;
    ChunkEncoder enc(level);
    auto must = [](const Status& s) {
      if (!s.ok()) {
        std::fprintf(stderr, "kvsnap-crypt-bench: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    };
    const double t_copy = best_of(rounds, chunks, [&](const Chunk& c, size_t) {
      copy.resize(c.blob.size());
      std::memcpy(copy.data(), c.blob.data(), c.blob.size());
    });
    const double t_dec = best_of(rounds, chunks, [&](const Chunk& c, size_t) { must(dec.decode(c.blob, c.raw.size(), out)); });
    const double t_enc = best_of(rounds, chunks, [&](const Chunk& c, size_t) { must(enc.encode(c.raw, c.filter).status()); });
    const double t_sha = best_of(rounds, chunks, [&](const Chunk& c, size_t) { (void)sha256_of(c.raw); });
    const double t_hmac = best_of(rounds, chunks, [&](const Chunk& c, size_t) { (void)cipher.chunk_id(c.raw); });
    const double t_seal = best_of(rounds, chunks, [&](const Chunk& c, size_t i) {
      must(cipher.seal_into(ids[i], c.blob, copy).status());
    });
    const double t_open = best_of(rounds, chunks, [&](const Chunk&, size_t i) { must(cipher.open_into(ids[i], sealed[i], out)); });

    const double gb = raw / 1e9;
    std::printf("\n%s: %zu chunks, %.1f MB raw, %.1f MB stored (%.3fx), mean chunk %.0f KiB raw / %.0f KiB stored, "
                "best of %d, one thread\n",
                path.c_str(), chunks.size(), raw / 1e6, stored / 1e6, raw / stored, raw / chunks.size() / 1024,
                stored / chunks.size() / 1024, rounds);
    std::printf("%-14s %9s %9s %10s %10s\n", "step", "s/GB raw", "GB/s raw", "x decode", "x memcpy");
    auto row = [&](const char* name, double t) {
      std::printf("%-14s %9.3f %9.2f %10.2f %10.1f\n", name, t / gb, gb / t, t / t_dec, t / t_copy);
    };
    row("memcpy", t_copy);
    row("zstd decode", t_dec);
    row("zstd encode", t_enc);
    row("sha256", t_sha);
    row("hmac id", t_hmac);
    row("seal", t_seal);
    row("open", t_open);
    std::printf("restore per chunk: open + decode + hmac = %.3f s/GB vs decode + sha256 = %.3f s/GB: %.2fx\n",
                (t_open + t_dec + t_hmac) / gb, (t_dec + t_sha) / gb, (t_open + t_dec + t_hmac) / (t_dec + t_sha));
    std::printf("save per new chunk: hmac + encode + seal = %.3f s/GB vs sha256 + encode = %.3f s/GB: %.2fx\n",
                (t_hmac + t_enc + t_seal) / gb, (t_sha + t_enc) / gb, (t_hmac + t_enc + t_seal) / (t_sha + t_enc));
    if (!whole) continue;
    const int r3 = std::min(rounds, 3);
    EndToEnd pe, ee;  // plain, encrypted
    must(end_to_end(path, nullptr, threads, level, r3, pe));
    must(end_to_end(path, &cipher, threads, level, r3, ee));
    std::printf("whole file in memory, %u threads, best of %d: wall s / CPU s\n", threads, r3);
    std::printf("  save    plain %.3f / %.3f   encrypted %.3f / %.3f   = %.2fx wall, %.2fx CPU\n", pe.save_wall,
                pe.save_cpu, ee.save_wall, ee.save_cpu, ee.save_wall / pe.save_wall, ee.save_cpu / pe.save_cpu);
    std::printf("  restore plain %.3f / %.3f   encrypted %.3f / %.3f   = %.2fx wall, %.2fx CPU\n", pe.read_wall,
                pe.read_cpu, ee.read_wall, ee.read_cpu, ee.read_wall / pe.read_wall, ee.read_cpu / pe.read_cpu);
  }
  return 0;
}

}  // namespace
}  // namespace kvsnap

int main(int argc, char** argv) { return kvsnap::run(argc, argv); }
