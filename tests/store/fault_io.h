// FaultInjectingIo: an Io that forwards to another Io (normally posix_io())
// and fails chosen operations, for testing what a failed write, fsync or
// rename leaves behind.
//
//   FaultInjectingIo io(posix_io());
//   io.fail_nth(FaultOp::kSync, 2, ENOSPC);        // the 2nd file fsync from now fails
//   io.short_write_nth(1, 100);                    // the next append writes 100 bytes, then fails
//   io.fail_matching(FaultOp::kRename, "/chunks/"); // every rename whose path contains "/chunks/"
//   io.pause_reading("/packs/");                   // the next look at a pack waits for resume()
//
// Operations are counted per kind from construction; fail_nth counts from the
// moment it is called. Thread-safe. Injected errors say "(injected)".
#pragma once

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"

namespace kvsnap {

enum class FaultOp { kOpenWrite, kAppend, kSync, kClose, kRename, kRemove, kSyncDir, kCreateDirs, kLock, kRead };

inline const char* fault_op_name(FaultOp op) {
  switch (op) {
    case FaultOp::kOpenWrite: return "open";
    case FaultOp::kAppend: return "write";
    case FaultOp::kSync: return "fsync";
    case FaultOp::kClose: return "close";
    case FaultOp::kRename: return "rename";
    case FaultOp::kRemove: return "remove";
    case FaultOp::kSyncDir: return "fsync directory";
    case FaultOp::kCreateDirs: return "mkdir";
    case FaultOp::kLock: return "lock";
    case FaultOp::kRead: return "read";
  }
  return "?";
}

class FaultInjectingIo final : public Io {
 public:
  explicit FaultInjectingIo(Io& base) : base_(base) {}

  // The n-th (1-based) operation of this kind from now fails with `err`.
  void fail_nth(FaultOp op, int n, int err = ENOSPC) {
    std::lock_guard<std::mutex> g(mu_);
    faults_.push_back(Fault{op, count_[op] + n, err, std::nullopt, ""});
  }
  // Every operation of this kind whose path contains `needle` fails.
  void fail_matching(FaultOp op, std::string needle, int err = EIO) {
    std::lock_guard<std::mutex> g(mu_);
    faults_.push_back(Fault{op, -1, err, std::nullopt, std::move(needle)});
  }
  // The n-th append from now writes only `keep` bytes, then fails with `err`.
  void short_write_nth(int n, size_t keep, int err = ENOSPC) {
    std::lock_guard<std::mutex> g(mu_);
    faults_.push_back(Fault{FaultOp::kAppend, count_[FaultOp::kAppend] + n, err, keep, ""});
  }
  void clear() {
    std::lock_guard<std::mutex> g(mu_);
    faults_.clear();
  }
  int count(FaultOp op) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = count_.find(op);
    return it == count_.end() ? 0 : it->second;
  }
  int injected() const { return injected_.load(); }
  // What every written file says of its disk's waits (WritableFile::disk_waits): the real file's;
  // that the disk made each append wait, as a disk slower than the CPU would (what a save's
  // adaptive level hears from its pack); or that it cannot tell.
  enum class DiskWaits { kReal, kEveryAppend, kUnknown };
  void set_disk_waits(DiskWaits d) { disk_waits_ = d; }

  // The next exists() or open_read() whose path contains `needle` waits, before looking, until
  // resume(): a reader stopped between reading the catalog and reading its blobs (tests of what
  // runs meanwhile).
  void pause_reading(std::string needle) {
    std::lock_guard<std::mutex> g(mu_);
    pause_needle_ = std::move(needle);
    paused_ = resumed_ = false;
  }
  // The next rename whose "FROM -> TO" contains `needle` waits for resume() as a paused read does
  // (wait_paused): a save or import stopped between its pack and its catalog row.
  void pause_renaming(std::string needle) {
    std::lock_guard<std::mutex> g(mu_);
    pause_rename_needle_ = std::move(needle);
    paused_ = resumed_ = false;
  }
  // Blocks until a reader (or renamer) waits in the paused operation.
  void wait_paused() {
    std::unique_lock<std::mutex> g(mu_);
    pause_cv_.wait(g, [&] { return paused_; });
  }
  void resume() {
    std::lock_guard<std::mutex> g(mu_);
    resumed_ = true;
    pause_cv_.notify_all();
  }
  // From now on, counts the bytes read from files opened later whose path contains `needle`.
  void count_reads(std::string needle) {
    std::lock_guard<std::mutex> g(mu_);
    count_needle_ = std::move(needle);
    bytes_read_ = 0;
  }
  uint64_t bytes_read() const { return bytes_read_.load(); }

  // Counts the operation; returns the fault to apply, if any.
  std::optional<std::pair<int, std::optional<size_t>>> hit(FaultOp op, const std::string& path) {
    std::lock_guard<std::mutex> g(mu_);
    int n = ++count_[op];
    for (auto it = faults_.begin(); it != faults_.end(); ++it) {
      if (it->op != op) continue;
      bool match = it->nth >= 0 ? it->nth == n : path.find(it->needle) != std::string::npos;
      if (!match) continue;
      auto r = std::make_pair(it->err, it->keep);
      if (it->nth >= 0) faults_.erase(it);
      ++injected_;
      return r;
    }
    return std::nullopt;
  }
  static Status injected_status(FaultOp op, const std::string& path, int err) {
    return Status::IOError(path + ": " + fault_op_name(op) + ": " + std::strerror(err) + " (injected)");
  }

  Result<std::unique_ptr<ReadableFile>> open_read(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool exclusive) override;
  Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override {
    maybe_pause(from + " -> " + to, pause_rename_needle_);
    if (auto f = hit(FaultOp::kRename, from + " -> " + to)) return injected_status(FaultOp::kRename, from, f->first);
    return base_.rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    if (auto f = hit(FaultOp::kRename, a + " <-> " + b)) return injected_status(FaultOp::kRename, a, f->first);
    return base_.exchange(a, b);
  }
  Status remove(const std::string& path) override {
    if (auto f = hit(FaultOp::kRemove, path)) return injected_status(FaultOp::kRemove, path, f->first);
    return base_.remove(path);
  }
  Status sync_dir(const std::string& dir) override {
    if (auto f = hit(FaultOp::kSyncDir, dir)) return injected_status(FaultOp::kSyncDir, dir, f->first);
    return base_.sync_dir(dir);
  }
  Result<bool> exists(const std::string& path) override {
    maybe_pause(path);
    return base_.exists(path);
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& dir) override { return base_.list_dir(dir); }
  Status create_dirs(const std::string& dir) override {
    if (auto f = hit(FaultOp::kCreateDirs, dir)) return injected_status(FaultOp::kCreateDirs, dir, f->first);
    return base_.create_dirs(dir);
  }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, LockMode mode, bool wait) override {
    if (auto f = hit(FaultOp::kLock, path)) return injected_status(FaultOp::kLock, path, f->first);
    return base_.lock_file(path, mode, wait);
  }
  // The base's directory locks, stamps and regular-file opens (Io's defaults would refuse or lose
  // O_NOFOLLOW): the code under test runs as it does on the real Io.
  Result<std::unique_ptr<FileLock>> lock_dir(const std::string& dir) override {
    if (auto f = hit(FaultOp::kLock, dir)) return injected_status(FaultOp::kLock, dir, f->first);
    return base_.lock_dir(dir);
  }
  Result<FileStamp> stamp(const std::string& path) override { return base_.stamp(path); }
  Result<std::optional<uint64_t>> free_bytes(const std::string& dir) override {
    if (free_bytes_) return free_bytes_;
    return base_.free_bytes(dir);
  }
  // What free_bytes() says from now on (a nearly full disk).
  void report_free_bytes(uint64_t n) { free_bytes_ = n; }
  Result<OpenedRegular> open_regular(const std::string& path) override;

 private:
  struct Fault {
    FaultOp op;
    int nth;  // -1: match by needle
    int err;
    std::optional<size_t> keep;  // short write: bytes written before failing
    std::string needle;
  };
  class File;
  class CountedFile;
  void maybe_pause(const std::string& path) { maybe_pause(path, pause_needle_); }
  void maybe_pause(const std::string& path, std::string& needle) {
    std::unique_lock<std::mutex> g(mu_);
    if (needle.empty() || path.find(needle) == std::string::npos) return;
    needle.clear();
    paused_ = true;
    pause_cv_.notify_all();
    pause_cv_.wait(g, [&] { return resumed_; });
  }

  Io& base_;
  std::optional<uint64_t> free_bytes_;
  mutable std::mutex mu_;
  std::map<FaultOp, int> count_;
  std::vector<Fault> faults_;
  std::atomic<int> injected_{0};
  std::atomic<DiskWaits> disk_waits_{DiskWaits::kReal};
  std::condition_variable pause_cv_;
  std::string pause_needle_;
  std::string pause_rename_needle_;
  bool paused_ = false, resumed_ = false;
  std::string count_needle_;
  std::atomic<uint64_t> bytes_read_{0};
};

// A file opened for reading: its reads can fail (FaultOp::kRead, by the file's name) and are
// counted when its path matched count_reads().
class FaultInjectingIo::CountedFile final : public ReadableFile {
 public:
  CountedFile(FaultInjectingIo& io, std::unique_ptr<ReadableFile> f, bool counted)
      : io_(io), f_(std::move(f)), counted_(counted) {}
  uint64_t size() const override { return f_->size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    if (auto fault = io_.hit(FaultOp::kRead, f_->name())) return injected_status(FaultOp::kRead, f_->name(), fault->first);
    if (counted_) io_.bytes_read_ += dst.size();
    return f_->read_at(offset, dst);
  }
  const std::string& name() const override { return f_->name(); }

 private:
  FaultInjectingIo& io_;
  std::unique_ptr<ReadableFile> f_;
  bool counted_;
};

inline Result<std::unique_ptr<ReadableFile>> FaultInjectingIo::open_read(const std::string& path) {
  maybe_pause(path);
  KV_ASSIGN_OR_RETURN(auto file, base_.open_read(path));
  bool counted = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    counted = !count_needle_.empty() && path.find(count_needle_) != std::string::npos;
  }
  return std::unique_ptr<ReadableFile>(new CountedFile(*this, std::move(file), counted));
}

inline Result<OpenedRegular> FaultInjectingIo::open_regular(const std::string& path) {
  maybe_pause(path);
  KV_ASSIGN_OR_RETURN(OpenedRegular r, base_.open_regular(path));
  std::lock_guard<std::mutex> g(mu_);
  if (r.file) {
    const bool counted = !count_needle_.empty() && path.find(count_needle_) != std::string::npos;
    r.file = std::unique_ptr<ReadableFile>(new CountedFile(*this, std::move(r.file), counted));
  }
  return r;
}

class FaultInjectingIo::File final : public WritableFile {
 public:
  File(FaultInjectingIo& io, std::string path, std::unique_ptr<WritableFile> f)
      : io_(io), path_(std::move(path)), f_(std::move(f)) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    if (auto f = io_.hit(FaultOp::kAppend, path_)) {
      if (f->second) {
        size_t keep = std::min(*f->second, data.size());
        KV_RETURN_IF_ERROR(f_->append(data.first(keep)));
      }
      return injected_status(FaultOp::kAppend, path_, f->first);
    }
    ++appends_;
    return f_->append(data);
  }
  Status sync() override {
    if (auto f = io_.hit(FaultOp::kSync, path_)) return injected_status(FaultOp::kSync, path_, f->first);
    return f_->sync();
  }
  Status close() override {
    if (closed_) return f_->close();
    closed_ = true;
    if (auto f = io_.hit(FaultOp::kClose, path_)) {
      (void)f_->close();
      return injected_status(FaultOp::kClose, path_, f->first);
    }
    return f_->close();
  }
  void take_access_of(const std::string& original, uint32_t mode_mask) override {
    f_->take_access_of(original, mode_mask);
  }
  bool pace_to_disk() override { return f_->pace_to_disk(); }
  std::optional<uint64_t> disk_waits() const override {
    switch (io_.disk_waits_.load()) {
      case DiskWaits::kEveryAppend: return appends_;
      case DiskWaits::kUnknown: return std::nullopt;
      case DiskWaits::kReal: break;
    }
    return f_->disk_waits();
  }

 private:
  FaultInjectingIo& io_;
  std::string path_;
  std::unique_ptr<WritableFile> f_;
  bool closed_ = false;
  uint64_t appends_ = 0;
};

inline Result<std::unique_ptr<WritableFile>> FaultInjectingIo::open_write(const std::string& path, bool exclusive) {
  if (auto f = hit(FaultOp::kOpenWrite, path)) return injected_status(FaultOp::kOpenWrite, path, f->first);
  KV_ASSIGN_OR_RETURN(auto file, base_.open_write(path, exclusive));
  return std::unique_ptr<WritableFile>(new File(*this, path, std::move(file)));
}

// A create like open_write's, for the same faults.
inline Result<std::unique_ptr<WritableFile>> FaultInjectingIo::create_owner_only(const std::string& path) {
  if (auto f = hit(FaultOp::kOpenWrite, path)) return injected_status(FaultOp::kOpenWrite, path, f->first);
  KV_ASSIGN_OR_RETURN(auto file, base_.create_owner_only(path));
  return std::unique_ptr<WritableFile>(new File(*this, path, std::move(file)));
}

}  // namespace kvsnap
