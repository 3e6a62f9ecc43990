// kvsnap-s3-bench: PUT and GET throughput of S3Client against an S3-compatible
// server, beside a plain local file copy (read + write + fsync of the same
// bytes) measured in the same run. Not a test: nothing asserts time.
//
//   tests/beds/swift-s3.sh run DIR auto build/bench/kvsnap-s3-bench [--objects N] [--mib M] [--threads T]
//
// Reads S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY (S3_REGION) as the bed exports them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/os.h"
#include "base/parallel.h"
#include "store/s3_client.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs job(i) for i in [0, n) on `threads` threads; false when any job failed.
template <class Job>
bool run_parallel(int n, int threads, Job job) {
  std::vector<char> ok(size_t(n), 0);
  kvsnap::parallel_for(size_t(n), size_t(threads), [&](size_t i, size_t) { ok[i] = job(int(i)); });
  return std::all_of(ok.begin(), ok.end(), [](char c) { return c != 0; });
}

bool copy_file(const std::string& from, const std::string& to, std::vector<char>& buf) {
  const int in = ::open(from.c_str(), O_RDONLY);
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  bool ok = in >= 0 && out >= 0;
  for (ssize_t n; ok && (n = ::read(in, buf.data(), buf.size())) != 0;) ok = n > 0 && ::write(out, buf.data(), size_t(n)) == n;
  ok = ok && kvsnap::sync_fd(out, /*data_only=*/true) == 0;  // as the store syncs
  if (in >= 0) ::close(in);
  if (out >= 0) ::close(out);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int objects = 16, mib = 4, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--objects")) objects = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--mib")) mib = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  const char* endpoint = std::getenv("S3_ENDPOINT");
  if (!endpoint || objects < 1 || mib < 1 || threads < 1) {
    std::fprintf(stderr, "usage: tests/beds/swift-s3.sh run DIR auto %s [--objects N] [--mib M] [--threads T]\n", argv[0]);
    return 2;
  }
  kvsnap::S3Config cfg;
  cfg.endpoint = endpoint;
  cfg.access_key = std::getenv("S3_ACCESS_KEY") ? std::getenv("S3_ACCESS_KEY") : "";
  cfg.secret_key = std::getenv("S3_SECRET_KEY") ? std::getenv("S3_SECRET_KEY") : "";
  cfg.bucket = "kvsnap-bench";
  kvsnap::S3Client s3(cfg);
  if (kvsnap::Status s = s3.create_bucket(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const size_t size = size_t(mib) << 20;
  std::vector<std::byte> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = std::byte(i * 2654435761u >> 24);
  const double total_mb = double(size) * objects / 1e6;
  auto key = [](int i) { return "bench/" + std::to_string(i); };

  // Baseline: the same bytes as local files, copied (read + write + fsync) once each.
  const std::string dir = std::string(std::getenv("S3_BED_DIR") ? std::getenv("S3_BED_DIR") : "/var/tmp") + "/bench-copy";
  (void)kvsnap::posix_io().create_dirs(dir);
  for (int i = 0; i < objects; ++i) {
    auto w = kvsnap::posix_io().open_write(dir + "/src" + std::to_string(i), false);
    if (!w.ok() || !(*w)->append(data).ok() || !(*w)->close().ok()) return 1;
  }
  auto t0 = Clock::now();
  const bool copied = run_parallel(objects, threads, [&](int i) {
    std::vector<char> buf(1 << 20);
    return copy_file(dir + "/src" + std::to_string(i), dir + "/dst" + std::to_string(i), buf);
  });
  const double copy_s = seconds_since(t0);

  t0 = Clock::now();
  const bool put = run_parallel(objects, threads, [&](int i) { return s3.put(key(i), data).ok(); });
  const double put_s = seconds_since(t0);
  t0 = Clock::now();
  const bool got = run_parallel(objects, threads, [&](int i) {
    auto r = s3.get(key(i), size);
    return r.ok() && *r == data;
  });
  const double get_s = seconds_since(t0);
  for (int i = 0; i < objects; ++i) (void)s3.remove(key(i));
  if (!copied || !put || !got) {
    std::fprintf(stderr, "kvsnap-s3-bench: a %s failed\n", !copied ? "copy" : !put ? "PUT" : "GET");
    return 1;
  }
  std::printf("%d objects of %d MiB, %d thread(s), %s\n", objects, mib, threads, endpoint);
  std::printf("  copy  %8.1f MB/s  (local read + write + fsync)\n", total_mb / copy_s);
  std::printf("  PUT   %8.1f MB/s  %.2fx copy\n", total_mb / put_s, copy_s / put_s);
  std::printf("  GET   %8.1f MB/s  %.2fx copy\n", total_mb / get_s, copy_s / get_s);
  return 0;
}
