#include "base/json_access.h"
#include "base/os.h"
#include "cli/progress.h"

#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "cli/store_common.h"

namespace kvsnap::cli {
namespace {

std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signal{0};  // the first signal the handler took
std::atomic<uint64_t> g_read{0};
std::atomic<uint64_t> g_written{0};
std::atomic<uint64_t> g_freed{0};

extern "C" void on_signal(int sig) {
  note_interrupting_signal(sig);  // a lock-free atomic: safe in a handler
  g_interrupted.store(true);
}

// KVSNAP_TEST_INTERRUPT_SIGNAL (progress.h): the signal the knob below raises.
int interrupt_signal() {
  static const int sig = [] {
    const std::string v = std::getenv("KVSNAP_TEST_INTERRUPT_SIGNAL") ? std::getenv("KVSNAP_TEST_INTERRUPT_SIGNAL") : "";
    return v == "TERM" ? SIGTERM : v == "HUP" ? SIGHUP : SIGINT;
  }();
  return sig;
}

// KVSNAP_TEST_INTERRUPT_TO_GROUP=1 (progress.h): the signal goes to the whole process group, as a
// terminal's Ctrl-C does, instead of this process alone.
bool interrupt_to_group() {
  static const bool group = [] {
    const char* v = std::getenv("KVSNAP_TEST_INTERRUPT_TO_GROUP");
    return v && std::string(v) == "1";
  }();
  return group;
}

// KVSNAP_TEST_INTERRUPT_AFTER_BYTES (progress.h): 0 = off.
uint64_t interrupt_after() {
  static const uint64_t n = [] {
    const char* v = std::getenv("KVSNAP_TEST_INTERRUPT_AFTER_BYTES");
    return v ? std::strtoull(v, nullptr, 10) : 0;
  }();
  return n;
}

void count(std::atomic<uint64_t>& counter, uint64_t n) {
  counter.fetch_add(n);
  static std::atomic<bool> raised{false};
  const uint64_t after = interrupt_after();
  if (after && g_read.load() + g_written.load() + g_freed.load() >= after && !raised.exchange(true)) {
    if (interrupt_to_group()) kill(0, interrupt_signal());
    else raise(interrupt_signal());
  }
}

Status stopped(const std::string& name) {
  return Status::Interrupted(name + ": stopped by a signal (Ctrl-C, SIGTERM or SIGHUP); what was being written is removed");
}

class CountingReadable final : public ReadableFile {
 public:
  explicit CountingReadable(std::unique_ptr<ReadableFile> f) : f_(std::move(f)) {}
  uint64_t size() const override { return f_->size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    if (interrupted()) return stopped(f_->name());
    KV_RETURN_IF_ERROR(f_->read_at(offset, dst));
    count(g_read, dst.size());
    return Status::OK();
  }
  const std::string& name() const override { return f_->name(); }

 private:
  std::unique_ptr<ReadableFile> f_;
};

class CountingWritable final : public WritableFile {
 public:
  CountingWritable(std::unique_ptr<WritableFile> f, std::string name) : f_(std::move(f)), name_(std::move(name)) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    if (interrupted()) return stopped(name_);
    KV_RETURN_IF_ERROR(f_->append(data));
    count(g_written, data.size());
    return Status::OK();
  }
  // A file is made durable only when the operation means to keep it: not after Ctrl-C.
  Status sync() override { return interrupted() ? stopped(name_) : f_->sync(); }
  Status close() override { return f_->close(); }  // always: cleanup must work after Ctrl-C
  void take_access_of(const std::string& original, uint32_t mode_mask) override {
    f_->take_access_of(original, mode_mask);
  }
  bool pace_to_disk() override { return f_->pace_to_disk(); }
  std::optional<uint64_t> disk_waits() const override { return f_->disk_waits(); }

 private:
  std::unique_ptr<WritableFile> f_;
  std::string name_;
};

// posix_io() with the counters and the interrupt check on file contents. Renames and
// removes always go through: they are how a failed operation cleans up.
class CountingIo final : public Io {
 public:
  Result<std::unique_ptr<ReadableFile>> open_read(const std::string& path) override {
    KV_ASSIGN_OR_RETURN(auto f, base().open_read(path));
    return std::unique_ptr<ReadableFile>(std::make_unique<CountingReadable>(std::move(f)));
  }
  Result<OpenedRegular> open_regular(const std::string& path) override {
    KV_ASSIGN_OR_RETURN(OpenedRegular r, base().open_regular(path));
    if (r.file) r.file = std::make_unique<CountingReadable>(std::move(r.file));
    return r;
  }
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool exclusive) override {
    if (interrupted()) return stopped(path);
    KV_ASSIGN_OR_RETURN(auto f, base().open_write(path, exclusive));
    return std::unique_ptr<WritableFile>(std::make_unique<CountingWritable>(std::move(f), path));
  }
  Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& path) override {
    if (interrupted()) return stopped(path);
    KV_ASSIGN_OR_RETURN(auto f, base().create_owner_only(path));
    return std::unique_ptr<WritableFile>(std::make_unique<CountingWritable>(std::move(f), path));
  }
  Result<std::unique_ptr<WritableFile>> open_scratch(const std::string& path) override {
    if (interrupted()) return stopped(path);
    KV_ASSIGN_OR_RETURN(auto f, base().open_scratch(path));
    return std::unique_ptr<WritableFile>(std::make_unique<CountingWritable>(std::move(f), path));
  }
  Status rename(const std::string& from, const std::string& to) override { return base().rename(from, to); }
  Status exchange(const std::string& a, const std::string& b) override { return base().exchange(a, b); }
  Result<FileStamp> stamp(const std::string& path) override { return base().stamp(path); }
  Result<std::optional<uint64_t>> free_bytes(const std::string& dir) override { return base().free_bytes(dir); }
  Status remove(const std::string& path) override { return base().remove(path); }
  Status sync_dir(const std::string& dir) override { return base().sync_dir(dir); }
  Result<bool> exists(const std::string& path) override { return base().exists(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& dir) override { return base().list_dir(dir); }
  Status create_dirs(const std::string& dir) override { return base().create_dirs(dir); }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, LockMode mode, bool wait) override {
    return base().lock_file(path, mode, wait);
  }
  Result<std::unique_ptr<FileLock>> lock_dir(const std::string& dir) override { return base().lock_dir(dir); }

 private:
  static Io& base() { return posix_io(); }
};

std::string human_duration(double s) {
  char b[32];
  if (s < 60) std::snprintf(b, sizeof b, "%.0f s", s);
  else if (s < 3600) std::snprintf(b, sizeof b, "%d min %02d s", int(s) / 60, int(s) % 60);
  else std::snprintf(b, sizeof b, "%d h %02d min", int(s) / 3600, int(s) / 60 % 60);
  return b;
}

// KVSNAP_PROGRESS_DELAY_MS: how long an operation runs before progress shows (default 1000).
std::chrono::milliseconds first_draw_delay() {
  const char* v = std::getenv("KVSNAP_PROGRESS_DELAY_MS");
  return std::chrono::milliseconds(v ? std::strtoll(v, nullptr, 10) : 1000);
}

}  // namespace

Io& cli_io() {
  static CountingIo io;
  return io;
}
uint64_t cli_bytes_read() { return g_read.load(); }
uint64_t cli_bytes_written() { return g_written.load(); }
uint64_t cli_bytes_freed() { return g_freed.load(); }
void count_freed(uint64_t n) { count(g_freed, n); }

void install_interrupt_handler() {
  // A signal the parent set to be ignored stays ignored: `nohup kvsnap migrate ...` must outlive its
  // terminal, and a shell starts background jobs with SIGINT ignored so that Ctrl-C spares them.
  const auto take = [](int sig, int flags) {
    if (signal_ignored(sig)) return;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = flags;
    sigaction(sig, &sa, nullptr);
  };
  take(SIGINT, SA_RESETHAND);  // the second Ctrl-C has the default action: the process ends at once
  take(SIGTERM, SA_RESETHAND);
  // The terminal closing (an ssh session lost) under a long migrate or save: stopped as Ctrl-C
  // stops it, its temporaries removed, rather than killed with them left for the next run. Every
  // SIGHUP is taken (no reset): a lost session often sends two (the shell passes one on, the
  // kernel sends the foreground group another), and the second must not kill what the first stops.
  take(SIGHUP, 0);
}

void note_interrupting_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);  // the first one stands
}

void end_by_interrupting_signal() {
  const int sig = g_signal.load();
  if (sig == 0) return;
  std::fflush(nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);  // its default action ends the process; a shell reports 128 + sig
}

bool interrupted() { return g_interrupted.load(); }

void add_progress_flags(CLI::App* sub, ProgressFlags& flags) {
  sub->add_flag("-q,--quiet", flags.quiet,
                "no progress on stderr (it shows on a terminal once the command runs for a second; "
                "with --json as JSON lines instead)");
}

ProgressDisplay::ProgressDisplay(std::string what, Counted counted, uint64_t total, ProgressMode mode)
    : what_(std::move(what)), counted_(counted), total_(total), mode_(mode), start_(std::chrono::steady_clock::now()) {
  if (mode_ == ProgressMode::kAuto && !::isatty(2)) mode_ = ProgressMode::kQuiet;
  if (mode_ == ProgressMode::kQuiet) return;
  base_ = counted_now();
  if (first_draw_delay().count() <= 0) {  // shown from the start (tests, and users who set the delay to 0)
    draw(/*final=*/false);
    drew_ = true;
  }
  thread_ = std::thread([this] { run(); });
}

ProgressDisplay::~ProgressDisplay() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (drew_) draw(/*final=*/true);
}

uint64_t ProgressDisplay::counted_now() const {
  switch (counted_) {
    case Counted::kRead: return cli_bytes_read();
    case Counted::kWritten: return cli_bytes_written();
    case Counted::kFreed: break;
  }
  return cli_bytes_freed();
}

uint64_t ProgressDisplay::done() const { return counted_now() - base_; }

void ProgressDisplay::run() {
  const auto period = mode_ == ProgressMode::kJson ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(200);
  std::unique_lock<std::mutex> lock(mu_);
  if (!drew_ && cv_.wait_for(lock, first_draw_delay(), [this] { return stop_; })) return;
  while (!drew_ || !cv_.wait_for(lock, period, [this] { return stop_; })) {
    draw(/*final=*/false);
    drew_ = true;
  }
}

void ProgressDisplay::draw(bool final) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const uint64_t total = total_.load();
  uint64_t d = done();
  if (total && d > total) d = total;
  const double rate = secs > 0 ? d / secs : 0;
  if (mode_ == ProgressMode::kJson) {
    json j = {{"op", what_}, {"done_bytes", d}, {"elapsed_s", secs}, {"bytes_per_s", rate}};
    if (total) j["total_bytes"] = total;
    if (files_total_.load()) {
      j["files_done"] = files_done_.load();
      j["files_total"] = files_total_.load();
    }
    if (final) j["finished"] = succeeded_ && !interrupted();
    std::fprintf(stderr, "%s\n", json_text(json{{"progress", j}}).c_str());
    return;
  }
  if (final) {
    std::fputs("\r\033[K", stderr);  // the line goes; the command's own output follows
    return;
  }
  std::string line = "kvsnap " + what_ + ": ";
  if (files_total_.load()) line += "[" + std::to_string(files_done_.load()) + "/" + std::to_string(files_total_.load()) + "] ";
  line += mib(d);
  if (total) {
    char pct[16];
    std::snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * d / total);
    line += " / " + mib(total) + pct;
  }
  line += ", " + mib(uint64_t(rate)) + "/s";
  if (total && rate > 0 && d < total) line += ", ETA " + human_duration((total - d) / rate);
  if (interrupted()) line += ", stopping (Ctrl-C)";
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
}

}  // namespace kvsnap::cli
