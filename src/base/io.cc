#include "base/io.h"

#include <dirent.h>
#include <sys/file.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "base/os.h"

namespace kvsnap {

Status MemoryFile::read_at(uint64_t offset, std::span<std::byte> dst) const {
  if (offset > view_.size() || dst.size() > view_.size() - offset) {
    return Status::Corruption(name_ + ": read of " + std::to_string(dst.size()) + " bytes at offset " +
                              std::to_string(offset) + " runs past the end (" + std::to_string(view_.size()) +
                              " bytes)");
  }
  if (!dst.empty()) std::memcpy(dst.data(), view_.data() + offset, dst.size());
  return Status::OK();
}

namespace {

Status errno_status(const std::string& what, const std::string& path, int err) {
  // A path that does not exist is "not found" (exit 8), whatever was being done to it; every other
  // refusal of the OS is an I/O error (exit 7).
  if (err == ENOENT) return Status::NotFound(path + ": " + what + ": " + std::strerror(err));
  return Status::IOError(path + ": " + what + ": " + std::strerror(err));
}

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixReadableFile() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return path_; }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > size_ || dst.size() > size_ - offset) {
      return Status::Corruption(path_ + ": read of " + std::to_string(dst.size()) + " bytes at offset " +
                                std::to_string(offset) + " runs past the end (" + std::to_string(size_) + " bytes)");
    }
    size_t done = 0;
    while (done < dst.size()) {
      ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno_status("read", path_, errno);
      }
      if (n == 0) return Status::IOError(path_ + ": file shrank while being read");
      done += static_cast<size_t>(n);
    }
    return Status::OK();
  }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

// Write-behind: every kWriteBehindBytes appended, the kernel is asked to start
// writing them to the disk (sync_file_range WRITE: it does not wait), so the
// disk works while the caller computes the next bytes and the final fdatasync
// waits only for the tail. With pace_to_disk the oldest of more than
// kWriteBehindWindows windows in flight is waited for, so a writer faster than the
// disk blocks in its appends (io.h; one window in flight instead of four took a
// save of the bench slot from 0.65-0.71x to 0.53-0.54x a copy + fsync on the VM's
// disk, which needs a deep queue for its speed: docs/store.md, "The adaptive level"). Without it a 200 MB pack or restore stays dirty in
// the page cache (below the kernel's background threshold) until sync(), which
// then flushes all of it after the CPU work (docs/store.md, "Speed and space").

class PosixWritableFile final : public WritableFile {
 public:
  // scratch: Io::open_scratch's file (no write-behind; close() truncates to the bytes written).
  PosixWritableFile(std::string path, int fd, bool scratch = false)
      : path_(std::move(path)), fd_(fd), scratch_(scratch) {}
  ~PosixWritableFile() override { (void)close(); }
  void take_access_of(const std::string& original, uint32_t mode_mask) override {
    struct stat want {}, have {};
    if (fd_ < 0 || ::lstat(original.c_str(), &want) != 0 || !S_ISREG(want.st_mode) || ::fstat(fd_, &have) != 0) return;
    const mode_t mode = want.st_mode & 0777 & static_cast<mode_t>(mode_mask);
    if ((have.st_mode & 0777) != mode) (void)::fchmod(fd_, mode);
    // Only root can give a file away; anyone else's new file is theirs, as any file they create.
    if (::geteuid() == 0 && (have.st_uid != want.st_uid || have.st_gid != want.st_gid))
      (void)::fchown(fd_, want.st_uid, want.st_gid);
  }
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno_status("write", path_, errno);
      }
      done += static_cast<size_t>(n);
    }
    written_ += data.size();
    if (!scratch_ && written_ - flushing_from_ >= kWriteBehindBytes) start_writeback();
    if (writeback_error_ != 0) return errno_status("write", path_, writeback_error_);
    return Status::OK();
  }
  bool pace_to_disk() override {
    pace_ = !scratch_;  // a scratch file has no write-behind
    if (!thread_blocked_count()) waits_known_ = false;
    return pace_;
  }
  std::optional<uint64_t> disk_waits() const override {
    if (!pace_ || !waits_known_) return std::nullopt;
    return disk_waits_;
  }
  Status sync() override {
    if (writeback_error_ != 0) return errno_status("write", path_, writeback_error_);
    if (const int e = sync_fd(fd_, /*data_only=*/true); e != 0) return errno_status(sync_fd_call(true), path_, e);
    return Status::OK();
  }
  Status close() override {
    if (fd_ < 0) return Status::OK();
    if (scratch_ && ::ftruncate(fd_, off_t(written_)) != 0) {
      const int e = errno;
      ::close(fd_);
      fd_ = -1;
      return errno_status("truncate", path_, e);
    }
    int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return errno_status("close", path_, errno);
    return Status::OK();
  }

 private:
  // A hint: its failure (a file system without it) changes nothing that sync() promises.
  void start_writeback() {
    // Paced: a block while the window is handed over (the device's queue full) or while an old
    // one is waited for is the disk's (disk_waits).
    const std::optional<uint64_t> blocked_before = pace_ ? thread_blocked_count() : std::nullopt;
    if (!kvsnap::start_writeback(fd_, flushing_from_, written_ - flushing_from_)) waits_known_ = false;
    // Paced: the windows before the last kWriteBehindWindows are waited for.
    const uint64_t in_flight = kWriteBehindWindows * kWriteBehindBytes;
    if (pace_ && written_ > waited_to_ + in_flight) {
      const uint64_t to = written_ - in_flight;
      // A write error the wait reports is not reported again by the final sync (the kernel marks
      // it seen): kept for sync() and the next append.
      const WritebackWait w = kvsnap::wait_writeback(fd_, waited_to_, to - waited_to_);
      if (w.error != 0 && writeback_error_ == 0) writeback_error_ = w.error;
      if (!w.supported) waits_known_ = false;
      waited_to_ = to;
    }
    if (pace_) {
      const std::optional<uint64_t> blocked_after = thread_blocked_count();
      if (!blocked_before || !blocked_after) waits_known_ = false;
      else if (*blocked_after != *blocked_before) ++disk_waits_;
    }
    flushing_from_ = written_;
  }

  std::string path_;
  int fd_;
  bool scratch_ = false;
  bool pace_ = false;           // pace_to_disk()
  int writeback_error_ = 0;     // an errno wait_writeback reported
  uint64_t written_ = 0;        // bytes appended so far
  uint64_t flushing_from_ = 0;  // bytes before this were handed to start_writeback()
  uint64_t waited_to_ = 0;      // bytes before this were on the disk (wait_writeback)
  uint64_t disk_waits_ = 0;     // write-backs of a paced file that blocked
  bool waits_known_ = true;     // no wait found unsupported, the thread's blocks counted
};

class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { ::close(fd_); }  // closing the last descriptor drops the flock

 private:
  int fd_;
};

// fstat(2) of a descriptor just opened; on failure the descriptor is closed.
Status fstat_or_close(int fd, const std::string& path, struct stat& st) {
  if (::fstat(fd, &st) == 0) return Status::OK();
  const int e = errno;
  ::close(fd);
  return errno_status("stat", path, e);
}

class PosixIo final : public Io {
 public:
  Result<std::unique_ptr<ReadableFile>> open_read(const std::string& path) override {
    // O_NONBLOCK: a FIFO's open waits for a writer (`kvsnap info FIFO` hung); it is refused below.
    // Reads of a regular file ignore the flag.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return errno_status("cannot open", path, errno);
    struct stat st {};
    KV_RETURN_IF_ERROR(fstat_or_close(fd, path, st));
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::InvalidArgument(path + ": not a regular file");
    }
    return std::unique_ptr<ReadableFile>(new PosixReadableFile(path, fd, static_cast<uint64_t>(st.st_size)));
  }
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool exclusive) override {
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC);
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return errno_status("cannot create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
  Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errno_status("cannot create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
  Result<std::unique_ptr<WritableFile>> open_scratch(const std::string& path) override {
    // Written in place: only a regular file of this user with no other name, never through a link
    // someone planted (it would write the slot's bytes into the file it points at).
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) return errno_status("cannot create", path, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != ::geteuid()) {
      ::close(fd);
      return Status::InvalidArgument(path + ": not a scratch file kvsnap may write in place (a regular file of its "
                                     "user with no other name)");
    }
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, /*scratch=*/true));
  }
  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return errno_status("rename to " + to, from, errno);
    return Status::OK();
  }
  Status exchange(const std::string& a, const std::string& b) override {
    const int e = exchange_paths(a.c_str(), b.c_str());
    if (e == 0) return Status::OK();
    if (e == ENOSYS || e == EINVAL || e == ENOTSUP || e == EOPNOTSUPP) {
      return Status::NotSupported(a + ": this system or file system cannot exchange two names (" + std::strerror(e) + ")");
    }
    return errno_status("exchange with " + b, a, e);
  }
  Status remove(const std::string& path) override {
    if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::OK();
    const int unlink_errno = errno;
    if (unlink_errno != EISDIR && unlink_errno != EPERM) return errno_status("remove", path, unlink_errno);
    if (::rmdir(path.c_str()) == 0 || errno == ENOENT) return Status::OK();  // EPERM: a directory (POSIX)
    return errno_status("remove", path, errno == ENOTDIR ? unlink_errno : errno);  // a file unlink refused
  }
  Status sync_dir(const std::string& dir) override {
    int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_status("open directory", dir, errno);
    const int e = sync_fd(fd, /*data_only=*/false);
    ::close(fd);
    if (e != 0) return errno_status(std::string(sync_fd_call(false)) + " of the directory", dir, e);
    return Status::OK();
  }
  Result<bool> exists(const std::string& path) override {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT) return false;
    return errno_status("stat", path, errno);
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return errno_status("cannot list", dir, errno);
    std::vector<DirEntry> out;
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      struct stat st {};
      DirEntry de;
      de.name = n;
      if (::fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        de.is_regular = S_ISREG(st.st_mode);
        de.is_dir = S_ISDIR(st.st_mode);
        de.is_symlink = S_ISLNK(st.st_mode);
      } else if (errno == ENOENT) {
        continue;  // removed since readdir saw it: not there (a migrate reported it "not a regular file")
      }
      out.push_back(std::move(de));
    }
    ::closedir(d);
    return out;
  }
  Status create_dirs(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::IOError(dir + ": cannot create directory: " + ec.message());
    return Status::OK();
  }
  Result<std::optional<uint64_t>> free_bytes(const std::string& dir) override {
    struct statvfs v {};
    if (::statvfs(dir.c_str(), &v) != 0) return errno_status("statvfs", dir, errno);
    return std::optional<uint64_t>(uint64_t(v.f_bavail) * uint64_t(v.f_frsize));
  }
  Result<FileStamp> stamp(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno_status("stat", path, errno);
    return stamp_of(st);
  }
  Result<OpenedRegular> open_regular(const std::string& path) override {
    OpenedRegular r;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ELOOP) {  // O_NOFOLLOW's answer for a symlink
      r.symlink = true;
      r.not_regular = "a symlink";
      return r;
    }
    if (fd < 0) return errno_status("cannot open", path, errno);
    struct stat st {};
    KV_RETURN_IF_ERROR(fstat_or_close(fd, path, st));
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      r.not_regular = S_ISDIR(st.st_mode) ? "a directory" : "a FIFO, socket or device";
      return r;
    }
    r.stamp = stamp_of(st);
    r.file.reset(new PosixReadableFile(path, fd, static_cast<uint64_t>(st.st_size)));
    return r;
  }
  static FileStamp stamp_of(const struct stat& st) {
    FileStamp f;
    f.device = uint64_t(st.st_dev);
    f.inode = uint64_t(st.st_ino);
    f.size = uint64_t(st.st_size);
    f.links = uint64_t(st.st_nlink);
    if (st.st_uid != ::geteuid() && ::geteuid() != 0) {
      f.replacement_changes_owner = true;
      f.owner = uint32_t(st.st_uid);
    }
#if defined(__APPLE__)
    f.mtime_ns = int64_t(st.st_mtimespec.tv_sec) * 1000000000 + st.st_mtimespec.tv_nsec;
    f.ctime_ns = int64_t(st.st_ctimespec.tv_sec) * 1000000000 + st.st_ctimespec.tv_nsec;
#else
    f.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    f.ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
#endif
    return f;
  }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, LockMode mode, bool wait) override {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return errno_status("cannot open lock file", path, errno);
    int op = (mode == LockMode::kShared ? LOCK_SH : LOCK_EX) | (wait ? 0 : LOCK_NB);
    return flock_fd(fd, op, path);
  }
  Result<std::unique_ptr<FileLock>> lock_dir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_status("cannot open directory", dir, errno);
    return flock_fd(fd, LOCK_EX | LOCK_NB, dir);
  }

 private:
  // Takes the flock on `fd` (closed unless it is held): nullptr when LOCK_NB found another holder.
  static Result<std::unique_ptr<FileLock>> flock_fd(int fd, int op, const std::string& path) {
    int rc;
    do {
      rc = ::flock(fd, op);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      int e = errno;
      ::close(fd);
      if (e == EWOULDBLOCK) return std::unique_ptr<FileLock>();
      return errno_status("lock", path, e);
    }
    return std::unique_ptr<FileLock>(new PosixFileLock(fd));
  }
};

}  // namespace

Result<std::unique_ptr<FileLock>> Io::lock_file(const std::string& path, LockMode, bool) {
  return Status::NotSupported(path + ": this Io has no file locks");
}

Result<std::unique_ptr<FileLock>> Io::lock_dir(const std::string& dir) {
  return Status::NotSupported(dir + ": this Io has no directory locks");
}

Result<std::optional<uint64_t>> Io::free_bytes(const std::string&) { return std::optional<uint64_t>(); }

Result<FileStamp> Io::stamp(const std::string& path) { return Status::NotSupported(path + ": this Io has no file stamps"); }

Result<OpenedRegular> Io::open_regular(const std::string& path) {
  OpenedRegular r;
  if (auto st = stamp(path); st.ok()) r.stamp = *st;  // before the open: a later change shows
  KV_ASSIGN_OR_RETURN(r.file, open_read(path));
  return r;
}

Result<std::unique_ptr<WritableFile>> Io::open_scratch(const std::string& path) {
  return open_write(path, /*exclusive=*/false);
}

Io& posix_io() {
  static PosixIo io;
  return io;
}

Result<std::vector<std::byte>> read_all(Io& io, const std::string& path, uint64_t max_bytes) {
  KV_ASSIGN_OR_RETURN(auto f, io.open_read(path));
  if (f->size() > max_bytes) {
    return Status::InvalidArgument(path + ": " + std::to_string(f->size()) + " bytes is more than the " +
                                   std::to_string(max_bytes) + " this reader accepts");
  }
  std::vector<std::byte> buf(f->size());
  KV_RETURN_IF_ERROR(f->read_at(0, buf));
  return buf;
}

std::string unique_suffix() {
  // 64 random bits: many threads of one process may write temporaries for the
  // same target at once (two saves of one chunk), and the opens are exclusive.
  thread_local std::mt19937_64 rng{std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32)};
  return std::to_string(::getpid()) + "-" + std::to_string(rng());
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string file_name_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string temp_path_beside(const std::string& path) {
  constexpr size_t kNameMax = 255;
  const std::string tail = std::string(kTempInfix) + unique_suffix();
  const size_t slash = path.rfind('/');
  const size_t name_at = slash == std::string::npos ? 0 : slash + 1;
  size_t name_len = path.size() - name_at;
  if (name_len + tail.size() > kNameMax) {
    name_len = kNameMax - tail.size();
    // not inside a character: back off over UTF-8 continuation bytes (10xxxxxx)
    while (name_len > 0 && (static_cast<unsigned char>(path[name_at + name_len]) & 0xC0) == 0x80) --name_len;
  }
  return path.substr(0, name_at + name_len) + tail;
}

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::create(Io& io, const std::string& path) {
  return create(io, path, AtomicWriteOptions{});
}

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::create(Io& io, const std::string& path,
                                                                   const AtomicWriteOptions& options) {
  std::string base = options.temp_dir.empty() ? path : options.temp_dir + "/" +
                                                           std::filesystem::path(path).filename().string();
  std::string tmp = temp_path_beside(base);
  auto f = options.owner_only ? io.create_owner_only(tmp) : io.open_write(tmp, /*exclusive=*/true);
  if (!f.ok()) {
    // Named as the caller's path: the temporary beside it is kvsnap's own business.
    std::string dir = std::filesystem::path(tmp).parent_path().string();
    if (dir.empty()) dir = ".";
    if (f.status().code() == Code::kNotFound) {
      return Status::NotFound(path + ": cannot write it: the directory " + dir +
                              " does not exist (create it first, or write elsewhere)");
    }
    return f.status().Prefixed(path + ": cannot write it (a temporary in " + dir + " first)");
  }
  // The file it replaces: its mode (and owner) from the first byte; an owner-only file stays so.
  (*f)->take_access_of(path, options.owner_only ? 0700 : 0777);
  if (options.disk_pace) (void)(*f)->pace_to_disk();  // a file without write-behind goes as it can
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(io, path, tmp, std::move(*f), options.sync_dir));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_ && !keep_temp_) {
    if (file_) (void)file_->close();
    (void)io_.remove(tmp_path_);
  }
}

Status AtomicFileWriter::append(std::span<const std::byte> data) {
  if (committed_ || synced_) return Status::InvalidArgument(path_ + ": append after commit");
  return file_->append(data);
}

Status AtomicFileWriter::commit() {
  KV_RETURN_IF_ERROR(sync());
  return publish();
}

Status AtomicFileWriter::sync() {
  if (synced_ || committed_) return Status::OK();
  KV_RETURN_IF_ERROR(file_->sync());
  KV_RETURN_IF_ERROR(file_->close());
  synced_ = true;
  return Status::OK();
}

Status AtomicFileWriter::publish() {
  if (committed_) return Status::OK();
  KV_RETURN_IF_ERROR(sync());
  KV_RETURN_IF_ERROR(io_.rename(tmp_path_, path_));
  committed_ = true;
  if (!sync_dir_) return Status::OK();
  std::string dir = std::filesystem::path(path_).parent_path().string();
  return io_.sync_dir(dir.empty() ? "." : dir);
}

Status AtomicFileWriter::publish_if_unchanged(const std::function<Status(const std::string&, bool)>& unchanged) {
  if (committed_) return Status::OK();
  KV_RETURN_IF_ERROR(sync());
  KV_RETURN_IF_ERROR(unchanged(path_, /*moved=*/false));
  // The new file as written, to know it again after a swap back (nullopt: an Io without stamps).
  std::optional<FileStamp> written;
  if (auto st = io_.stamp(tmp_path_); st.ok()) written = *st;
  const Status swapped = io_.exchange(tmp_path_, path_);
  if (swapped.code() == Code::kNotSupported) {
    renamed_plainly_ = true;
    return publish();
  }
  KV_RETURN_IF_ERROR(swapped);
  committed_ = true;  // the new bytes are at path_, the original under tmp_path_
  std::string dir = std::filesystem::path(path_).parent_path().string();
  if (dir.empty()) dir = ".";
  // Whether path_ (or, after a swap back, tmp_path_) still holds the new file as written: a save
  // may have reached it at path_ (in place, or a new file renamed over it).
  auto still_ours = [&](const std::string& p) {
    if (!written) return true;
    auto now = io_.stamp(p);
    if (now.ok()) now->ctime_ns = written->ctime_ns;
    return now.ok() && *now == *written;
  };
  Status still = unchanged(tmp_path_, /*moved=*/true);
  if (still.ok()) {
    // The original's removal may fail (a read-only mount would have failed the exchange): its name
    // is a temporary of this process, which migrate's next scan removes once the process is gone.
    original_removed_ = io_.remove(tmp_path_).ok();
    const Status synced = sync_dir_ ? io_.sync_dir(dir) : Status::OK();
    // A save that reached path_ right after the swap holds it now: the writer's bytes stay, and
    // the outcome is not "converted".
    if (!still_ours(path_)) {
      committed_ = false;  // not the conversion at the name (its temporary, the original, is gone)
      return Status::IOError(path_ + ": written by another process right after kvsnap replaced it: that file stays "
                             "as it was written (not converted); migrate again while no server writes to it");
    }
    return synced;
  }
  // Written meanwhile: the writer's file goes back to its name.
  committed_ = false;
  if (const Status back = io_.exchange(tmp_path_, path_); !back.ok()) {
    // A plain rename does it too (the conversion at path_ is dropped), unless a second save is at
    // path_ now: that one is the newest and keeps the name. Failing the rename, the writer's file
    // stays under the temporary's name, which a later migrate would remove: say so.
    if (!still_ours(path_)) {
      if (sync_dir_) (void)io_.sync_dir(dir);
      return still;
    }
    if (const Status renamed = io_.rename(tmp_path_, path_); !renamed.ok()) {
      keep_temp_ = true;
      return Status::IOError(path_ + ": written by another process as kvsnap replaced it, and putting it back failed (" +
                             back.ToString() + "; " + renamed.ToString() + "): that file is at " + tmp_path_ +
                             ", the conversion of the older bytes at " + path_ + "; rename " + tmp_path_ + " to " +
                             path_ + " before running kvsnap migrate again (which removes kvsnap's temporaries)");
    }
  } else {
    // The swap back put under tmp_path_ whatever held path_: the conversion as written, unless a
    // second save reached it there meanwhile (in place, or a new file renamed over it). That one
    // is the newest and takes the name, replacing the first.
    if (!still_ours(tmp_path_)) {
      if (const Status renamed = io_.rename(tmp_path_, path_); !renamed.ok()) {
        keep_temp_ = true;
        return Status::IOError(path_ + ": written twice by another process as kvsnap replaced it: the second file is at " +
                               tmp_path_ + ", the first at " + path_ + " (putting the second in its place failed: " +
                               renamed.ToString() + "); rename " + tmp_path_ + " to " + path_ +
                               ", replacing the first, before running kvsnap migrate again");
      }
    }
  }
  if (sync_dir_) (void)io_.sync_dir(dir);  // the names as a writer left them: either order is whole
  return still;
}

}  // namespace kvsnap
