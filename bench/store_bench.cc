// kvsnap-store-bench: the store's speed and space, each beside a baseline
// measured in the same run (docs/store.md, "Speed and space"). Not a test.
//
//   kvsnap-store-bench [FILE...] [--threads N] [--rounds R] [--dir D] [--extends BASE] [--level L]
//                      [--server-save-ms MS] [--stages] [--encrypt] [--decode-only] [--simd LEVEL|all]
//                      [--disk-mbps N]
//
// --level L: auto (the store's default: zstd -10 while the disk is behind, else raw), a zstd
// level for every new chunk (-10 is the figure of the older tables), or none: stored raw.
//
// For each llama.cpp state FILE (default: the f16 and q8_0 fixtures):
//   copy      read + write + fsync of the same bytes (what `cp` + sync costs): the baseline
//   save      kvsnap save into a fresh store (chunking, zstd, SHA-256, fsync, catalog commit)
//   restore   kvsnap restore -o at the stored types: a file written as the CLI does (AtomicFileWriter:
//             temporary, fsync, rename), decode and hash checks included
//   decode    restore into memory only (the decode path alone)
//   server    (--server-save-ms, from bench/server_save_time.sh) save against llama-server's own save
//   stages    (--stages) each stage of a save or restore alone, one thread: where the time goes
//   ratio     raw bytes / stored bytes, with the byte-shuffle filter and without
//   dedup     a second session sharing the first 90% of the tokens: bytes it added
//   extend    (--extends BASE, for one FILE that continues the session BASE) save of FILE into a
//             store that holds BASE: time and bytes against a save of FILE into an empty store;
//             then gc's compaction of FILE's pack once FILE is removed (BASE keeps most of it),
//             in GB/s of live bytes moved against a copy + fsync of the pack
//   decode    (--decode-only) save once, then only restores into memory, R rounds: wall and CPU
//             seconds per GB, best and median (old and new builds run alternately compare best)
//   encrypt   (--encrypt) save, restore+fsync and decode into a plain store and into an encrypted
//             one (AES-256-GCM, docs/store.md "Encryption at rest"), the two alternating in each
//             round: wall and CPU seconds, and encrypted/plain ratios
//   --simd    the SIMD level (base/simd_level.h; KVSNAP_SIMD does the same): scalar, avx2, avx512,
//             neon, or `all`: copy, save, restore and decode (or --decode-only's restores) at every
//             level this CPU has, the levels taking turns in each round, then one table of
//             ratios with a row per level (the other figures at the best level)
//   --disk-mbps N  emulates a disk that writes N MB/s (1 MB = 1e6 B) under every file the bench
//             writes (the copy's, then written as the store writes its files, the store's packs,
//             the restore's): an append that crosses an 8 MiB boundary with the file more than
//             32 MiB ahead of its bytes going out at N MB/s sleeps until it is not, and its sync
//             sleeps until all of it is (a disk with a 32 MiB queue, waited for as the pack's
//             write-behind waits). An emulation on top of the real disk, for the adaptive level's other side: a
//             save whose disk is slower than its CPU (docs/store.md "The adaptive level").
//   --dir     the bench's own directory while it runs (default a new one under $TMPDIR): a second
//             bench given the same one exits 1 at once. Every failure exits 1 naming what failed.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <zstd.h>

#include "base/os.h"
#include "base/sha256.h"
#include "base/sha256_lanes.h"
#include "base/simd_level.h"
#include "format/chunk_codec.h"
#include "format/snapshot_internal.h"
#include "format/state_prefix.h"
#include "store/store.h"

using namespace kvsnap;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

int g_level = SaveRequest{}.zstd_level;  // --level
bool g_compress = true;                  // --level none: chunks stored raw
bool g_adaptive = SaveRequest{}.adaptive;  // --level auto (the default); a number: that level for every chunk

// How the chunks are encoded, for the headers.
std::string encoding_text() {
  if (!g_compress) return "chunks stored raw (--level none)";
  return (g_adaptive ? "--level auto: zstd level " + std::to_string(g_level) + " while the disk is behind"
                     : "zstd level " + std::to_string(g_level));
}
double g_server_save_ms = 0;             // --server-save-ms: llama-server's own save of the same slot
double g_disk_bytes_per_s = 0;           // --disk-mbps: the emulated disk's speed (0: the real disk alone)
bool g_stages = false;                   // --stages
bool g_encrypt = false;                  // --encrypt
bool g_decode_only = false;              // --decode-only
// The SIMD levels the timed rounds run at, in turn: the current one, or with --simd all every
// level this CPU has, lowest first.
std::vector<simd::Level> g_levels;

// Exits naming what failed: a bench has no caller to hand an error to, and a crash (an abort, an
// exception) would not say what went wrong.
[[noreturn]] void fail(const std::string& what, const std::string& why) {
  std::fflush(stdout);
  std::fprintf(stderr, "kvsnap-store-bench: %s: %s\n", what.c_str(), why.c_str());
  std::exit(1);
}
void must(const Status& s, const std::string& what) {
  if (!s.ok()) fail(what, s.ToString());
}
// The value of r, or exit naming what failed.
template <class T>
T must(Result<T> r, const std::string& what) {
  must(r.status(), what);
  return std::move(r).value();
}
// An errno of a system call made here, as a Status naming the path.
Status os_error(const std::string& path, const char* call) {
  return Status::IOError(path + ": " + call + ": " + std::strerror(errno));
}
// std::filesystem calls that fail name their path instead of throwing.
void remove_all_or_fail(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) fail("remove " + path, ec.message());
}

double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// CPU seconds (user + system) of this process so far: on a shared machine the
// CPU an operation needs says more than its wall time (which waits for others).
double cpu_now() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// --disk-mbps: a file's bytes leave at g_disk_bytes_per_s, one after the other, the disk busy until
// the last written byte is out (an idle disk builds no credit); as the pack's write-behind does
// (base/io.cc), a writer checks at each kWriteBehindBytes boundary it crosses and, more than
// kEmulatedQueueBytes ahead of the disk, sleeps (a blocked writer, as on a slow disk); a sync
// sleeps until all of it is out.
constexpr double kEmulatedQueueBytes = 32.0 * (1 << 20);
class DiskEmulation {
 public:
  // True when the writer slept (the emulated disk was behind).
  bool wrote(uint64_t n) {
    if (g_disk_bytes_per_s <= 0) return false;
    busy_until_ = std::max(busy_until_, Clock::now()) + seconds(double(n));
    const bool crosses = (written_ + n) / kWriteBehindBytes != written_ / kWriteBehindBytes;
    written_ += n;
    return crosses && sleep_until(busy_until_ - seconds(kEmulatedQueueBytes));
  }
  void synced() {
    if (g_disk_bytes_per_s > 0) (void)sleep_until(busy_until_);
  }

 private:
  static Clock::duration seconds(double bytes) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bytes / g_disk_bytes_per_s));
  }
  static bool sleep_until(Clock::time_point t) {
    if (Clock::now() >= t) return false;
    std::this_thread::sleep_until(t);
    return true;
  }
  Clock::time_point busy_until_{};
  uint64_t written_ = 0;
};

class EmulatedDiskFile final : public WritableFile {
 public:
  explicit EmulatedDiskFile(std::unique_ptr<WritableFile> f) : f_(std::move(f)) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    KV_RETURN_IF_ERROR(f_->append(data));
    waits_ += disk_.wrote(data.size());
    return Status::OK();
  }
  Status sync() override {
    KV_RETURN_IF_ERROR(f_->sync());
    disk_.synced();
    return Status::OK();
  }
  Status close() override { return f_->close(); }
  void take_access_of(const std::string& original, uint32_t mode_mask) override { f_->take_access_of(original, mode_mask); }
  bool pace_to_disk() override { return f_->pace_to_disk(); }
  // The emulated disk's waits and the real file's (the real disk under the emulation).
  std::optional<uint64_t> disk_waits() const override { return waits_ + f_->disk_waits().value_or(0); }

 private:
  std::unique_ptr<WritableFile> f_;
  DiskEmulation disk_;
  uint64_t waits_ = 0;
};

// posix_io() with the written files on the emulated disk (--disk-mbps); otherwise posix_io() itself.
class EmulatedDiskIo final : public Io {
 public:
  Result<std::unique_ptr<ReadableFile>> open_read(const std::string& p) override { return base().open_read(p); }
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& p, bool exclusive) override {
    KV_ASSIGN_OR_RETURN(auto f, base().open_write(p, exclusive));
    return std::unique_ptr<WritableFile>(std::make_unique<EmulatedDiskFile>(std::move(f)));
  }
  Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& p) override {
    KV_ASSIGN_OR_RETURN(auto f, base().create_owner_only(p));
    return std::unique_ptr<WritableFile>(std::make_unique<EmulatedDiskFile>(std::move(f)));
  }
  Status rename(const std::string& from, const std::string& to) override { return base().rename(from, to); }
  Status exchange(const std::string& a, const std::string& b) override { return base().exchange(a, b); }
  Status remove(const std::string& p) override { return base().remove(p); }
  Status sync_dir(const std::string& d) override { return base().sync_dir(d); }
  Result<bool> exists(const std::string& p) override { return base().exists(p); }
  Result<std::vector<DirEntry>> list_dir(const std::string& d) override { return base().list_dir(d); }
  Status create_dirs(const std::string& d) override { return base().create_dirs(d); }
  Result<FileStamp> stamp(const std::string& p) override { return base().stamp(p); }
  Result<std::unique_ptr<FileLock>> lock_dir(const std::string& d) override { return base().lock_dir(d); }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& p, LockMode mode, bool wait) override {
    return base().lock_file(p, mode, wait);
  }
  Result<std::unique_ptr<WritableFile>> open_scratch(const std::string& p) override { return base().open_scratch(p); }
  Result<OpenedRegular> open_regular(const std::string& p) override { return base().open_regular(p); }
  Result<std::optional<uint64_t>> free_bytes(const std::string& d) override { return base().free_bytes(d); }

 private:
  static Io& base() { return posix_io(); }
};

// The Io of every file the bench writes.
Io& bench_io() {
  static EmulatedDiskIo emulated;
  return g_disk_bytes_per_s > 0 ? static_cast<Io&>(emulated) : posix_io();
}

// --disk-mbps: the copy's file through the same emulated disk and write-behind as the store's
// files (a plain write + fsync would pay the real disk's whole sync on top of the emulation).
double copy_file_emulated(const std::string& from, const std::string& to) {
  const auto t0 = Clock::now();
  auto in = must(posix_io().open_read(from), from);
  auto out = must(bench_io().open_write(to, /*exclusive=*/false), to);
  std::vector<std::byte> buf(1 << 20);
  for (uint64_t at = 0; at < in->size(); at += buf.size()) {
    const size_t n = size_t(std::min<uint64_t>(buf.size(), in->size() - at));
    must(in->read_at(at, std::span<std::byte>(buf.data(), n)), from);
    must(out->append(std::span<const std::byte>(buf.data(), n)), to);
  }
  must(out->sync(), to);
  must(out->close(), to);
  return secs(t0);
}

double copy_file(const std::string& from, const std::string& to) {
  if (g_disk_bytes_per_s > 0) return copy_file_emulated(from, to);
  const auto t0 = Clock::now();
  int in = ::open(from.c_str(), O_RDONLY);
  if (in < 0) must(os_error(from, "open"), "copy");
  int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out < 0) must(os_error(to, "open"), "copy");
  std::vector<char> buf(1 << 20);
  ssize_t n;
  while ((n = ::read(in, buf.data(), buf.size())) > 0)
    if (::write(out, buf.data(), size_t(n)) != n) must(os_error(to, "write"), "copy");
  if (n < 0) must(os_error(from, "read"), "copy");
  if (kvsnap::sync_fd(out, /*data_only=*/true) != 0) must(os_error(to, "fsync"), "copy");  // as the store syncs
  ::close(in);
  ::close(out);
  return secs(t0);
}

class FileSink final : public ByteSink {
 public:
  explicit FileSink(const std::string& p) : fd_(::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)) {
    if (fd_ < 0) must(os_error(p, "open"), "write");
  }
  ~FileSink() override {
    (void)kvsnap::sync_fd(fd_, /*data_only=*/true);
    ::close(fd_);
  }
  using ByteSink::append;
  Status append(std::span<const std::byte> d) override {
    return ::write(fd_, d.data(), d.size()) == ssize_t(d.size()) ? Status::OK() : os_error("bench output", "write");
  }

 private:
  int fd_;
};

struct Store_ {
  std::string root;
  std::unique_ptr<Store> s;
  explicit Store_(const std::string& r) : root(r) {
    remove_all_or_fail(r);
    s = must(Store::open(bench_io(), StorePaths{r}), "open the store " + r);
  }
  ~Store_() {
    s.reset();
    std::error_code ec;
    fs::remove_all(root, ec);  // a destructor does not exit; the next Store_ of this root says it
  }
};

double save_seconds(Store& s, const ReadableFile& f, const StateFile& st, uint32_t threads, SaveResult* out = nullptr) {
  SaveRequest req;
  req.threads = threads;
  req.zstd_level = g_level;
  req.compress = g_compress;
  req.adaptive = g_adaptive;
  const auto t0 = Clock::now();
  auto r = s.save(f, st, req);
  const double t = secs(t0);
  SaveResult saved = must(std::move(r), "save " + f.name());
  if (out) *out = saved;
  return t;
}

// Best-of-rounds wall and CPU seconds of one store configuration.
struct Timings {
  double t_copy = 1e9, c_copy = 1e9;  // bench_file's baseline, measured beside the others
  double t_save = 1e9, c_save = 1e9, t_restore = 1e9, c_restore = 1e9, t_decode = 1e9, c_decode = 1e9;
};

// Runs `round(i)` for every level of g_levels in turn (the level set for it), `rounds` times, so
// that every level sees the same machine load; the level in use before is set again after.
template <class Round>
void rounds_at_levels(int rounds, Round&& round) {
  const simd::Level was = simd::level();
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < g_levels.size(); ++i) {
      simd::set_level(g_levels[i]);
      round(i);
    }
  }
  simd::set_level(was);
}

// One round of save, restore into a file + fsync, restore into memory (decode), into a fresh
// store at `root`, encrypted when `key_file` is set.
void measure_round(const std::string& root, const std::string& key_file, const ReadableFile& file,
                   const StateFile& parsed, uint32_t threads, Timings& t) {
  remove_all_or_fail(root);
  StoreLocation where = directory_store(root);
  where.keys.key_file = key_file;
  std::unique_ptr<Store> opened = must(Store::open(bench_io(), where), "open the store " + root);
  Store& s = *opened;
  SaveRequest req;
  req.threads = threads;
  req.zstd_level = g_level;
  req.compress = g_compress;
  req.adaptive = g_adaptive;
  req.name = "a";
  auto t0 = Clock::now();
  double c0 = cpu_now();
  auto saved = s.save(file, parsed, req);
  t.t_save = std::min(t.t_save, secs(t0));
  t.c_save = std::min(t.c_save, cpu_now() - c0);
  must(saved.status(), "save " + file.name() + " into " + root);
  t0 = Clock::now();
  c0 = cpu_now();
  RestoreRequest rr;
  rr.spec.threads = int(threads);
  {
    FileSink out(root + "-restored.bin");
    must(s.restore("a", rr, out).status(), "restore from " + root);
  }
  t.t_restore = std::min(t.t_restore, secs(t0));
  t.c_restore = std::min(t.c_restore, cpu_now() - c0);
  t0 = Clock::now();
  c0 = cpu_now();
  CountingSink count;
  must(s.restore("a", rr, count).status(), "restore (decode only) from " + root);
  t.t_decode = std::min(t.t_decode, secs(t0));
  t.c_decode = std::min(t.c_decode, cpu_now() - c0);
  remove_all_or_fail(root + "-restored.bin");
}

// --encrypt: the plain and the encrypted store alternating in each round, so that both see the
// same machine load.
void bench_encryption(const std::string& path, const std::string& dir, uint32_t threads, int rounds) {
  auto file = must(posix_io().open_read(path), path);
  auto parsed = must(parse_state(*file), path);
  const std::string key = dir + "/bench.key";
  {
    int fd = ::open(key.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) must(os_error(key, "open"), "write the key");
    const std::string hex(64, '7');
    if (::write(fd, hex.data(), hex.size()) != ssize_t(hex.size())) must(os_error(key, "write"), "write the key");
    ::close(fd);
  }
  Timings plain, enc;
  for (int r = 0; r < rounds; ++r) {
    measure_round(dir + "/plain", "", *file, parsed, threads, plain);
    measure_round(dir + "/enc", key, *file, parsed, threads, enc);
  }
  remove_all_or_fail(dir + "/plain");
  remove_all_or_fail(dir + "/enc");
  const double gb = double(file->size()) / 1e9;
  std::printf("%s (%.1f MB), %u threads, %s, best of %d alternating rounds\n", fs::path(path).filename().c_str(),
              gb * 1e3, threads, encoding_text().c_str(), rounds);
  std::printf("  %-16s %13s %13s %13s %13s   %s\n", "", "plain wall s", "plain CPU s", "enc wall s", "enc CPU s",
              "encrypted/plain: wall, CPU");
  auto row = [](const char* what, double tp, double cp, double te, double ce) {
    std::printf("  %-16s %13.3f %13.3f %13.3f %13.3f   %.2fx, %.2fx\n", what, tp, cp, te, ce, te / tp, ce / cp);
  };
  row("save", plain.t_save, plain.c_save, enc.t_save, enc.c_save);
  row("restore+fsync", plain.t_restore, plain.c_restore, enc.t_restore, enc.c_restore);
  row("decode only", plain.t_decode, plain.c_decode, enc.t_decode, enc.c_decode);
}

// FILE extends BASE (same prompt, more tokens): what saving it costs when BASE is stored.
void bench_extension(const std::string& base, const std::string& path, const std::string& dir, uint32_t threads,
                     int rounds) {
  auto bf = must(posix_io().open_read(base), base);
  auto bs = must(parse_state(*bf), base);
  auto ef = must(posix_io().open_read(path), path);
  auto es = must(parse_state(*ef), path);
  double t_full = 1e9, t_inc = 1e9, c_full = 1e9, c_inc = 1e9;
  SaveResult full, inc;
  for (int r = 0; r < rounds; ++r) {
    {
      Store_ st(dir + "/store");
      const double c0 = cpu_now();
      t_full = std::min(t_full, save_seconds(*st.s, *ef, es, threads, &full));
      c_full = std::min(c_full, cpu_now() - c0);
    }
    Store_ st(dir + "/store");
    (void)save_seconds(*st.s, *bf, bs, threads);
    const double c0 = cpu_now();
    t_inc = std::min(t_inc, save_seconds(*st.s, *ef, es, threads, &inc));
    c_inc = std::min(c_inc, cpu_now() - c0);
  }
  const double new_tokens = double(es.tokens.tokens.size() - bs.tokens.tokens.size());
  std::printf("%s extends %s by %.0f tokens (%.1f%%)\n", fs::path(path).filename().c_str(),
              fs::path(base).filename().c_str(), new_tokens, 100.0 * new_tokens / double(es.tokens.tokens.size()));
  std::printf("  save alone      %7.3f s, %.3f CPU s, %.1f MB written\n", t_full, c_full, double(full.bytes_new) / 1e6);
  std::printf("  save after base %7.3f s = %.3fx of alone, %.3f CPU s = %.3fx, %.1f MB written (%llu of %llu chunks new)\n",
              t_inc, t_inc / t_full, c_inc, c_inc / c_full, double(inc.bytes_new) / 1e6,
              (unsigned long long)inc.chunks_new, (unsigned long long)inc.chunks);
}

// gc's compaction (docs/store.md, "Compaction"): FILE saved, then BASE (sharing FILE's first
// chunks), then FILE removed: FILE's pack is left partly dead, and a gc compacting at 1% copies its
// live blobs into a new pack. Against a copy + fsync of that pack, in GB/s of bytes moved.
void bench_compaction(const std::string& base, const std::string& path, const std::string& dir, uint32_t threads,
                      int rounds) {
  auto bf = must(posix_io().open_read(base), base);
  auto bs = must(parse_state(*bf), base);
  auto ef = must(posix_io().open_read(path), path);
  auto es = must(parse_state(*ef), path);
  // Each round's rates from its own bytes and times: an adaptive save's pack differs between rounds.
  double t_compact = 1e9, t_copy = 1e9, moved_gbs = 0, copy_gbs = 0;
  GcReport best;
  uint64_t pack_bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    Store_ st(dir + "/store");
    SaveResult long_one;
    (void)save_seconds(*st.s, *ef, es, threads, &long_one);
    (void)save_seconds(*st.s, *bf, bs, threads);
    const std::string pack = must(st.s->catalog().chunks_of(long_one.info.id), "chunks").front().pack;
    const std::string pack_path = dir + "/store/packs/" + pack + ".pack";
    const uint64_t bytes = fs::file_size(pack_path);
    const double copied = copy_file(pack_path, dir + "/copy");
    if (double(bytes) / copied > copy_gbs * 1e9) {
      copy_gbs = double(bytes) / 1e9 / copied;
      t_copy = copied;
      pack_bytes = bytes;
    }
    fs::remove(dir + "/copy");
    must(st.s->remove(std::to_string(long_one.info.id)).status(), "rm");
    const auto t0 = Clock::now();
    GcReport rep = must(st.s->gc(true, {}, 1), "gc");
    const double t = secs(t0);
    if (rep.packs_compacted != 1) must(Status::Corruption("gc compacted " + std::to_string(rep.packs_compacted) + " packs, not 1"), "compaction");
    if (double(rep.compacted_bytes_moved) / t > moved_gbs * 1e9) {
      moved_gbs = double(rep.compacted_bytes_moved) / 1e9 / t;
      t_compact = t;
      best = rep;
    }
  }
  std::printf("compaction of %s's pack once %s is removed (%.1f MB, %.1f MB live, %.1f MB dead), best of %d\n",
              fs::path(path).filename().c_str(), fs::path(path).filename().c_str(), double(pack_bytes) / 1e6,
              double(best.compacted_bytes_moved) / 1e6, double(best.compacted_bytes_freed) / 1e6, rounds);
  std::printf("  gc (compacting) %7.3f s, %.2f GB/s moved; copy+fsync of the pack %.3f s, %.2f GB/s: %.2fx\n", t_compact,
              moved_gbs, t_copy, copy_gbs, moved_gbs / copy_gbs);
}

// Where the time goes: each stage of a save or restore alone, one thread, on
// the file cut into 512 KiB pieces (the chunk size of this slot's K and V),
// shuffled as f16. Seconds per GB of the original, so the stages add up.
void bench_stages(const std::string& path, const std::string& dir) {
  // The buffer is touched before the clock starts: on this VM a fresh page costs more than the
  // copy into it (a first write runs at ~0.5 GB/s), and the save reads into reused buffers.
  auto file_for_size = must(posix_io().open_read(path), path);
  std::vector<std::byte> all(file_for_size->size(), std::byte{1});
  auto t0 = Clock::now();
  {
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) must(os_error(path, "open"), "stages");
    size_t at = 0;
    for (ssize_t n; at < all.size() && (n = ::pread(fd, all.data() + at, all.size() - at, off_t(at))) > 0;) at += size_t(n);
    ::close(fd);
  }
  const double gb = double(all.size()) / 1e9, t_read = secs(t0);
  // What the save reads: every chunk of the slot from the page cache, through the same reader and
  // one reused buffer (a transposed-V tile is one pread per row of its band).
  double t_chunks = 0;
  {
    auto file = must(posix_io().open_read(path), path);
    auto parsed = parse_state(*file);
    auto table = parsed.ok() ? snapshot_detail::plan_state_segments(*parsed, *file, kDefaultCellsPerChunk)
                             : Result<SegmentTable>(parsed.status());
    if (table.ok()) {
      snapshot_detail::ChunkReader reader(*table, *file);
      std::vector<std::byte> raw;
      t0 = Clock::now();
      for (uint64_t i = 0; i < reader.n_chunks(); ++i) must(reader.read(i, raw), "read a chunk of " + path);
      t_chunks = secs(t0);
    }
  }
  constexpr size_t kPiece = 512 << 10;
  auto piece = [&](size_t at) { return std::span<std::byte>(all).subspan(at, std::min(kPiece, all.size() - at)); };
  t0 = Clock::now();
  for (size_t at = 0; at < all.size(); at += kPiece) (void)sha256_of(piece(at));
  const double t_sha = secs(t0);
  // As many pieces at a time as the process's Sha256Lanes kernel (KVSNAP_SHA) has lanes (2 or 4
  // with SHA-NI, 8 with AVX2), as the decode's and the save's chunk groups go.
  const size_t lanes = std::max<size_t>(2, sha256_kernel_width(sha256_kernel()));
  t0 = Clock::now();
  for (size_t at = 0; at < all.size(); at += lanes * kPiece) {
    std::array<std::span<const std::byte>, Sha256Lanes::kMaxLanes> group{};
    std::array<Sha256Digest, Sha256Lanes::kMaxLanes> ids{};
    size_t k = 0;
    for (; k < lanes && at + k * kPiece < all.size(); ++k) group[k] = piece(at + k * kPiece);
    sha256_many(std::span(group).first(k), ids);
  }
  const double t_sha2 = secs(t0);
  t0 = Clock::now();
  for (size_t at = 0; at < all.size(); at += kPiece) (void)chunk_xxh(piece(at));
  const double t_xxh = secs(t0);
  std::vector<std::byte> shuffled(kPiece);
  t0 = Clock::now();
  for (size_t at = 0; at < all.size(); at += kPiece)
    shuffle_bytes(piece(at), 2, std::span<std::byte>(shuffled.data(), piece(at).size()));
  const double t_shuffle = secs(t0);
  ChunkEncoder enc(g_level, g_compress);
  // Into buffers touched before the clock starts, as the save's reused ones (a fresh buffer per
  // blob timed its page faults with the encode: 1.14 s/GB instead of ~0.7 on the bench slot).
  const size_t n_pieces = (all.size() + kPiece - 1) / kPiece;
  std::vector<std::vector<std::byte>> bufs(n_pieces, std::vector<std::byte>(kPiece + 4096, std::byte{1}));
  std::vector<std::span<const std::byte>> blobs(n_pieces);
  uint64_t stored = 0;
  t0 = Clock::now();
  for (size_t i = 0, at = 0; at < all.size(); ++i, at += kPiece) {
    const size_t n = must(enc.encode_into(piece(at), {ChunkFilter::kShuffle, 2}, bufs[i]),
                          "encode a piece of " + path);
    blobs[i] = std::span<const std::byte>(bufs[i].data(), n);
    stored += n;
  }
  const double t_encode = secs(t0);
  ChunkDecoder dec;
  t0 = Clock::now();
  for (size_t i = 0, at = 0; at < all.size(); ++i, at += kPiece)
    must(dec.decode_into(blobs[i], piece(at)), "decode a piece of " + path);
  const double t_decode = secs(t0);
  t0 = Clock::now();
  {
    FileSink out(dir + "/stage.bin");
    for (const auto& b : blobs) must(out.append(b), "write " + dir + "/stage.bin");
  }
  const double t_write = secs(t0);
  std::printf("  stages alone, 1 thread, seconds per GB of the original (GB/s):\n");
  auto row = [&](const char* what, double t) { std::printf("    %-36s %6.3f s/GB  (%6.2f GB/s)\n", what, t / gb, gb / t); };
  row("read the file (pread, page cache)", t_read);
  if (t_chunks > 0) row("read its chunks as a save does", t_chunks);
  row("SHA-256 (OpenSSL)", t_sha);
  const std::string x2 = "SHA-256 x" + std::to_string(lanes) + " (" + sha256_kernel_name(sha256_kernel()) + ")";
  row(x2.c_str(), t_sha2);
  row("XXH3-128 (the equality digest)", t_xxh);
  row("byte shuffle (part of encode)", t_shuffle);
  row(g_compress ? "encode (shuffle + zstd per plane)" : "encode (stored raw: a copy)", t_encode);
  row(g_compress ? "decode (zstd + unshuffle)" : "decode (stored raw: a copy)", t_decode);
  row("write + fsync the stored bytes", t_write);
  std::printf("    (stored %.1f MB, %s)\n", double(stored) / 1e6, encoding_text().c_str());
}

// Restore into memory only, `rounds` times after one save: the decode path (fetch, zstd,
// unshuffle, SHA-256 and XXH3-128 check of every chunk) with nothing written.
void bench_decode(const std::string& path, const std::string& dir, uint32_t threads, int rounds) {
  auto file = must(posix_io().open_read(path), path);
  auto parsed = must(parse_state(*file), path);
  const double gb = double(file->size()) / 1e9;
  Store_ st(dir + "/store");
  SaveRequest save;
  save.threads = threads;
  save.zstd_level = g_level;
  save.compress = g_compress;
  save.adaptive = g_adaptive;
  save.name = "a";
  must(st.s->save(*file, parsed, save).status(), "save " + path);
  RestoreRequest req;
  req.spec.threads = int(threads);
  std::vector<std::vector<double>> wall(g_levels.size()), cpu(g_levels.size());  // per level
  rounds_at_levels(rounds, [&](size_t li) {
    const auto t0 = Clock::now();
    const double c0 = cpu_now();
    CountingSink count;
    must(st.s->restore("a", req, count).status(), "restore (decode only) " + path);
    wall[li].push_back(secs(t0));
    cpu[li].push_back(cpu_now() - c0);
  });
  std::printf("%s (%.1f MB), %u threads, %d rounds of decode only (restore into memory)\n",
              fs::path(path).filename().c_str(), gb * 1e3, threads, rounds);
  for (size_t li = 0; li < g_levels.size(); ++li) {
    std::sort(wall[li].begin(), wall[li].end());
    std::sort(cpu[li].begin(), cpu[li].end());
    const size_t mid = wall[li].size() / 2;
    std::printf("  %-7s wall: best %.3f GB/s, median %.3f GB/s   CPU: best %.3f CPU s/GB, median %.3f CPU s/GB\n",
                simd::level_name(g_levels[li]), gb / wall[li][0], gb / wall[li][mid], cpu[li][0] / gb,
                cpu[li][mid] / gb);
  }
}

// One round of bench_file at the current level: copy+fsync (the baseline), save into a fresh
// store, restore as `kvsnap restore -o` does, restore into memory (decode). False when the save failed.
bool file_round(const std::string& path, const std::string& dir, const ReadableFile& file, const StateFile& parsed,
                uint32_t threads, Timings& t, uint64_t* stored) {
  // Every timed operation writes a new file: the last round's copy and restore are deleted before
  // the clocks start, as the save's store is (freeing 200 MB inside one timed region and not the
  // others biased the ratios, a review's finding).
  for (const char* old : {"/copy.bin", "/restored.bin"}) {
    std::error_code ec;
    fs::remove(dir + old, ec);
  }
  ::sync();  // those deletions written back before the copy's clock starts, not during it
  double c0 = cpu_now();
  t.t_copy = std::min(t.t_copy, copy_file(path, dir + "/copy.bin"));
  t.c_copy = std::min(t.c_copy, cpu_now() - c0);
  Store_ st(dir + "/store");
  ::sync();  // the last round's store, deleted by Store_, written back before the save's clock starts
  SaveRequest req;
  req.threads = threads;
  req.zstd_level = g_level;
  req.compress = g_compress;
  req.adaptive = g_adaptive;
  req.name = "a";
  auto t0 = Clock::now();
  c0 = cpu_now();
  auto saved = st.s->save(file, parsed, req);
  t.t_save = std::min(t.t_save, secs(t0));
  t.c_save = std::min(t.c_save, cpu_now() - c0);
  if (!saved.ok()) {
    std::printf("save failed: %s\n", saved.status().ToString().c_str());
    return false;
  }
  // Restores on --threads threads, as the save (without it, on every core: a review's finding).
  RestoreRequest rr;
  rr.spec.threads = int(threads);
  *stored = saved->info.stored_bytes;
  t0 = Clock::now();
  c0 = cpu_now();
  {
    // As `kvsnap restore -o`: a temporary, fsynced, renamed into place.
    auto out = must(AtomicFileWriter::create(bench_io(), dir + "/restored.bin"), dir + "/restored.bin");
    must(st.s->restore("a", rr, *out).status(), "restore " + path + " into " + dir + "/restored.bin");
    must(out->commit(), "commit " + dir + "/restored.bin");
  }
  t.t_restore = std::min(t.t_restore, secs(t0));
  t.c_restore = std::min(t.c_restore, cpu_now() - c0);
  t0 = Clock::now();
  c0 = cpu_now();
  CountingSink count;
  must(st.s->restore("a", rr, count).status(), "restore (decode only) " + path);
  t.t_decode = std::min(t.t_decode, secs(t0));
  t.c_decode = std::min(t.c_decode, cpu_now() - c0);
  // A restore that wrote fewer bytes would read as faster: both restores give the file back whole.
  std::error_code ec;
  const uint64_t restored = fs::file_size(dir + "/restored.bin", ec);
  if (ec || restored != file.size() || count.count != file.size()) {
    std::fprintf(stderr, "restore of %s gave %llu bytes to the file and %llu to memory, not its %llu\n", path.c_str(),
                 (unsigned long long)restored, (unsigned long long)count.count, (unsigned long long)file.size());
    std::exit(1);
  }
  return true;
}

// --simd all: a row per level, each against the copy+fsync measured beside it.
void print_level_table(const std::vector<Timings>& best, double gb, uint32_t threads) {
  std::printf("  best of each level's rounds, %u threads, %s; x = of that level's copy+fsync\n", threads,
              encoding_text().c_str());
  std::printf("  %-7s %10s %10s %13s %12s %16s %14s  %s\n", "level", "copy GB/s", "save/copy", "restore/copy",
              "decode GB/s", "decode CPU s/GB", "save CPU s/GB", "sha256");
  const simd::Level was = simd::level();
  for (size_t i = 0; i < best.size(); ++i) {
    const Timings& t = best[i];
    simd::set_level(g_levels[i]);  // the SHA-256 kernel that level hashed with (KVSNAP_SHA may choose)
    std::printf("  %-7s %10.3f %9.2fx %12.2fx %12.3f %16.3f %14.3f  %s\n", simd::level_name(g_levels[i]),
                gb / t.t_copy, t.t_copy / t.t_save, t.t_copy / t.t_restore, gb / t.t_decode, t.c_decode / gb,
                t.c_save / gb, sha256_kernel_name(sha256_kernel()));
  }
  simd::set_level(was);
}

void bench_file(const std::string& path, const std::string& dir, uint32_t threads, int rounds) {
  auto file = must(posix_io().open_read(path), path);
  auto parsed = parse_state(*file);
  if (!parsed.ok()) {
    std::printf("%s: %s\n", path.c_str(), parsed.status().ToString().c_str());
    return;
  }
  const double gb = double(file->size()) / 1e9;
  std::vector<Timings> best(g_levels.size());  // per level
  uint64_t stored = 0, stored_filtered = 0, stored_plain = 0;
  bool failed = false;
  rounds_at_levels(rounds, [&](size_t li) {
    if (!failed) failed = !file_round(path, dir, *file, *parsed, threads, best[li], &stored);
  });
  if (failed) return;
  // The filter's gain, both sides at one zstd level on every chunk: under --level auto two saves
  // would each choose raw for the chunks their disk waited less for, and compare those choices.
  auto stored_at_level = [&](bool shuffle) {
    Store_ st(dir + "/store");
    SaveRequest req;
    req.threads = threads;
    req.zstd_level = g_level;
    req.compress = g_compress;
    req.adaptive = false;
    req.byte_shuffle = shuffle;
    return must(st.s->save(*file, *parsed, req), shuffle ? "save with the filter" : "save without the filter")
        .info.stored_bytes;
  };
  if (g_compress) {
    stored_filtered = stored_at_level(true);
    stored_plain = stored_at_level(false);
  }
  // dedup: the same session cut at 90% of its tokens, saved after the full one
  double dedup = 0;
  uint64_t added = 0, second_alone = 0;
  if (parsed->kind == StateKind::kSeqFile && parsed->tokens.tokens.size() > 10) {
    const uint64_t n = parsed->tokens.tokens.size() * 9 / 10;
    {
      FileSink cut(dir + "/cut.bin");
      must(write_prefix(*parsed, *file, n, cut), "cut " + path + " to 90% of its tokens");
    }
    auto cut_file = must(posix_io().open_read(dir + "/cut.bin"), dir + "/cut.bin");
    auto cut_state = must(parse_state(*cut_file), dir + "/cut.bin");
    Store_ st(dir + "/store");
    SaveRequest req;
    req.threads = threads;
    req.zstd_level = g_level;
    req.compress = g_compress;
    req.adaptive = g_adaptive;
    (void)must(st.s->save(*file, *parsed, req), "save " + path);
    auto second = must(st.s->save(*cut_file, cut_state, req), "save the 90% prefix");
    added = second.bytes_new;
    second_alone = second.info.stored_bytes;
    dedup = double(stored + second_alone) / double(stored + added);
  }
  std::printf("%s (%.1f MB, %zu tokens)\n", fs::path(path).filename().c_str(), double(file->size()) / 1e6,
              parsed->tokens.tokens.size());
  if (g_disk_bytes_per_s > 0)
    std::printf("  on an emulated disk of %.0f MB/s (--disk-mbps): every written file, the copy's too\n",
                g_disk_bytes_per_s / 1e6);
  if (g_levels.size() > 1) {
    print_level_table(best, gb, threads);
    if (g_server_save_ms > 0)
      std::printf("  llama-server's own save of this slot %.3f s: kvsnap save at %s %.2fx of it (>= 1 is not slower)\n",
                  g_server_save_ms / 1e3, simd::level_name(g_levels.back()), g_server_save_ms / 1e3 / best.back().t_save);
  } else {
    const Timings& t = best[0];
    std::printf("  copy+fsync      %7.3f GB/s  (baseline)\n", gb / t.t_copy);
    std::printf("  save            %7.3f GB/s  %5.2fx of copy   (%u threads, %s, SIMD %s)\n",
                gb / t.t_save, t.t_copy / t.t_save, threads, encoding_text().c_str(), simd::level_name(g_levels[0]));
    std::printf("  restore+fsync   %7.3f GB/s  %5.2fx of copy\n", gb / t.t_restore, t.t_copy / t.t_restore);
    if (g_server_save_ms > 0)
      std::printf("  llama-server's own save of this slot %.3f s: kvsnap save %.2fx of it (>= 1 is not slower)\n",
                  g_server_save_ms / 1e3, g_server_save_ms / 1e3 / t.t_save);
    // Decode writes no file: a ratio to copy + fsync would compare memory with a disk (issue 13's
    // decode target is absolute: >= 2 GB/s).
    std::printf("  decode only     %7.3f GB/s  (into memory, no disk; target >= 2 GB/s)\n", gb / t.t_decode);
    std::printf("  CPU seconds (user + system, all threads): copy %.3f, save %.3f, restore %.3f, decode %.3f\n",
                t.c_copy, t.c_save, t.c_restore, t.c_decode);
  }
  std::printf("  stored          %7.3fx smaller (as saved above)", double(file->size()) / double(stored));
  if (g_compress)
    std::printf("; at zstd level %d on every chunk %5.3fx with the filter, %5.3fx without", g_level,
                double(file->size()) / double(stored_filtered), double(file->size()) / double(stored_plain));
  std::printf("\n");
  if (dedup > 0)
    std::printf("  dedup           a 90%% prefix session adds %.1f KB instead of %.1f KB: store %.2fx smaller than "
                "without dedup\n",
                double(added) / 1e3, double(second_alone) / 1e3, dedup);
  if (g_stages) bench_stages(path, dir);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  uint32_t threads = 1;
  int rounds = 3;
  std::string extends, simd_arg;
  std::string dir = fs::temp_directory_path() / ("kvsnap-store-bench-" + std::to_string(::getpid()));
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = uint32_t(std::atoi(argv[++i]));
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--extends" && i + 1 < argc) extends = argv[++i];
    else if (a == "--level" && i + 1 < argc) {
      const std::string v = argv[++i];
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v == "none") {
        g_compress = false;
      } else if (v == "auto") {
        g_compress = true;
        g_adaptive = true;
      } else if (v.empty() || *end != '\0' || n < ZSTD_minCLevel() || n > ZSTD_maxCLevel()) {
        std::fprintf(stderr, "kvsnap-store-bench: --level %s is not a zstd level (%d..%d), auto or none\n", v.c_str(),
                     ZSTD_minCLevel(), ZSTD_maxCLevel());
        return 1;
      } else {
        g_level = int(n);
        g_compress = true;
        g_adaptive = false;
      }
    }
    else if (a == "--server-save-ms" && i + 1 < argc) g_server_save_ms = std::atof(argv[++i]);
    else if (a == "--disk-mbps" && i + 1 < argc) g_disk_bytes_per_s = std::atof(argv[++i]) * 1e6;
    else if (a == "--stages") g_stages = true;
    else if (a == "--encrypt") g_encrypt = true;
    else if (a == "--decode-only") g_decode_only = true;
    else if (a == "--simd" && i + 1 < argc) simd_arg = argv[++i];
    else if (a == "-h" || a == "--help") {
      std::printf("usage: kvsnap-store-bench [FILE...] [--threads N] [--rounds R] [--dir D] [--extends BASE] [--level L]\n"
                  "                          [--server-save-ms MS] [--stages] [--encrypt] [--decode-only]\n"
                  "                          [--simd scalar|avx2|avx512|neon|all] [--disk-mbps N]\n");
      return 0;
    } else if (a.size() > 1 && a[0] == '-') {
      // Refused, not taken for a file: "--level=-10" once ran the default level and printed its figures.
      std::fprintf(stderr, "kvsnap-store-bench: unknown option %s (options take their value as the next word; --help)\n",
                   a.c_str());
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (simd_arg == "all") {
    if (g_encrypt || !extends.empty()) {
      std::fprintf(stderr, "--simd all: with the default run or --decode-only (name one level for --encrypt, --extends)\n");
      return 2;
    }
    for (size_t i = 0; i < simd::kLevelCount; ++i)
      if (simd::supported(simd::Level(i))) g_levels.push_back(simd::Level(i));
  } else {
    if (!simd_arg.empty() && !simd::set_level(simd_arg)) {
      std::fprintf(stderr, "--simd %s: unknown or not supported by this CPU (it has: %s)\n", simd_arg.c_str(),
                   simd::describe().c_str());
      return 2;
    }
    g_levels = {simd::level()};
  }
  std::printf("kvsnap-store-bench: SIMD %s (best %s; %s)\n", simd_arg == "all" ? "all levels" : simd::level_name(simd::level()),
              simd::level_name(simd::best_level()), simd::describe().c_str());
  if (files.empty()) {
    const std::string fx = std::string(KVSNAP_SOURCE_DIR) + "/fixtures/v0.5.0/";
    files = {fx + "hd128-f16-f16-faon.slot", fx + "hd128-q8_0-q8_0-faon.slot"};
  }
  {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) fail("create " + dir, ec.message());
  }
  // One bench per directory: two would remove and reuse each other's stores and files midway.
  std::unique_ptr<FileLock> lock = must(
      posix_io().lock_file(dir + "/kvsnap-store-bench.lock", LockMode::kExclusive, /*wait=*/false), "lock " + dir);
  if (!lock) fail(dir, "another kvsnap-store-bench is using this directory: give each run its own --dir");
  if (g_decode_only) {
    for (const auto& f : files) bench_decode(f, dir, threads, rounds);
  } else if (g_encrypt) {
    for (const auto& f : files) bench_encryption(f, dir, threads, rounds);
  } else if (!extends.empty()) {
    for (const auto& f : files) {
      bench_extension(extends, f, dir, threads, rounds);
      bench_compaction(extends, f, dir, threads, rounds);
    }
  } else {
    for (const auto& f : files) bench_file(f, dir, threads, rounds);
  }
  remove_all_or_fail(dir);  // the lock file too, still held: a bench that opened it before fails to lock it
  return 0;
}
