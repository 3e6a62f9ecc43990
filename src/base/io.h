// The file-system seam. Everything kvsnap reads or writes goes through Io, so
// tests can substitute memory files or inject faults (short writes, ENOSPC,
// failed fsync) without touching the code under test. Only PosixIo (io.cc)
// talks to the operating system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvsnap {

// Random-access read-only bytes: a file, or memory.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly dst.size() bytes at `offset`; a short read is an error.
  virtual Status read_at(uint64_t offset, std::span<std::byte> dst) const = 0;
  // The name used in error messages (the path for files).
  virtual const std::string& name() const = 0;
};

// Where bytes go. Appends are all-or-error.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status append(std::span<const std::byte> data) = 0;
  Status append(const void* p, size_t n) {
    return append(std::span<const std::byte>(static_cast<const std::byte*>(p), n));
  }
};

class WritableFile : public ByteSink {
 public:
  virtual Status sync() = 0;   // data durable on return (sync_fd in base/os.h: fdatasync, F_FULLFSYNC on macOS)
  virtual Status close() = 0;  // idempotent
  // Gives this file the permission bits of the regular file at `original` that `mode_mask` keeps
  // (0777: all of them; 0700 for a file created owner-only, which must stay so), and run as root
  // its owner and group, when there is one (a symlink there is not followed: a rename replaces the
  // link itself). Through the open descriptor, before anything is written, so the bytes are never
  // more readable than the file they replace, and no path swapped in meanwhile is touched. Best
  // effort: a file system without modes or owners (vfat, NFS's root_squash) keeps its own. The
  // default does nothing (a file without permissions).
  virtual void take_access_of(const std::string& original, uint32_t mode_mask) {
    (void)original;
    (void)mode_mask;
  }
  // From now on, appends go at the disk's pace: with more than kWriteBehindWindows windows of
  // kWriteBehindBytes handed to the disk and not yet written, an append waits for the oldest
  // (PosixWritableFile; base/os.h wait_writeback). Without it the page cache takes hundreds of MB
  // and only the final sync waits. For a writer that watches whether it blocks (a save's adaptive
  // level, format/snapshot.h); a file read back soon (a restore) is better left to the page cache.
  // True when the file will. Pure virtual, as Io::exchange: a wrapper that did not pass it on
  // (the CLI's counting file) silently left the shipped binary's saves unpaced.
  virtual bool pace_to_disk() = 0;
  // How many times the disk has made this paced file's appends wait so far (PosixWritableFile: a
  // voluntary context switch while it handed a window to the disk or waited for an old one);
  // nullopt where the file cannot tell: it does not pace, the system has no such wait for it (not a
  // regular file, a kernel or sandbox without sync_file_range, not Linux), or no count of a
  // thread's blocks. The adaptive level's signal that the disk, not the CPU, is the limit: a
  // thread's own count of blocks in its appends also counts page-cache reclaim and catalog round
  // trips, which made a save whose disk never held it back compress a third of its chunks. Pure
  // virtual, as pace_to_disk.
  virtual std::optional<uint64_t> disk_waits() const = 0;
};

// Write-behind (PosixWritableFile): every kWriteBehindBytes appended are handed to the disk at once;
// with pace_to_disk, at most kWriteBehindWindows such windows are in flight.
inline constexpr uint64_t kWriteBehindBytes = uint64_t(8) << 20;
inline constexpr uint64_t kWriteBehindWindows = 4;

// Bytes in memory; the reading side keeps its own copy or a view.
class MemoryFile final : public ReadableFile {
 public:
  MemoryFile(std::string name, std::vector<std::byte> bytes)
      : name_(std::move(name)), owned_(std::move(bytes)), view_(owned_) {}
  // A view: `bytes` must outlive this object.
  MemoryFile(std::string name, std::span<const std::byte> bytes) : name_(std::move(name)), view_(bytes) {}
  uint64_t size() const override { return view_.size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override;
  const std::string& name() const override { return name_; }
  std::span<const std::byte> bytes() const { return view_; }

 private:
  std::string name_;
  std::vector<std::byte> owned_;
  std::span<const std::byte> view_;
};

class VectorSink final : public ByteSink {
 public:
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    bytes.insert(bytes.end(), data.begin(), data.end());
    return Status::OK();
  }
  std::vector<std::byte> bytes;
};

// Counts bytes: the exact output size before anything is written.
class CountingSink final : public ByteSink {
 public:
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    count += data.size();
    return Status::OK();
  }
  uint64_t count = 0;
};

// Appends to two sinks (e.g. the output and a CountingSink).
class TeeSink final : public ByteSink {
 public:
  TeeSink(ByteSink& a, ByteSink& b) : a_(a), b_(b) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    KV_RETURN_IF_ERROR(a_.append(data));
    return b_.append(data);
  }

 private:
  ByteSink& a_;
  ByteSink& b_;
};

// Collects small appends into large ones for a slower sink. An append of a
// quarter of the capacity or more is already large: it is passed on as it is
// (after what is held), not copied. flush() (or destruction, errors dropped)
// passes the rest on.
class BufferedSink final : public ByteSink {
 public:
  explicit BufferedSink(ByteSink& out, size_t capacity = 1 << 20) : out_(out), cap_(capacity) { buf_.reserve(cap_); }
  ~BufferedSink() override { (void)flush(); }
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    if (data.size() >= cap_ / 4) {
      KV_RETURN_IF_ERROR(flush());
      return out_.append(data);
    }
    if (buf_.size() + data.size() > cap_) KV_RETURN_IF_ERROR(flush());
    buf_.insert(buf_.end(), data.begin(), data.end());
    return Status::OK();
  }
  Status flush() {
    if (buf_.empty()) return Status::OK();
    Status s = out_.append(buf_);
    buf_.clear();
    return s;
  }

 private:
  ByteSink& out_;
  size_t cap_;
  std::vector<std::byte> buf_;
};

struct DirEntry {
  std::string name;  // file name only
  bool is_regular = false;
  bool is_dir = false;
  bool is_symlink = false;
};

// What tells one version of a file from another without reading it: a file rewritten in place
// or replaced changes at least one of these (stat(2)'s ctime moves on every change).
struct FileStamp {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t links = 0;  // hard links (st_nlink)
  // A file this process made in its place would belong to another user: the file is not this
  // process's user's, and only root can give a file away (fchown).
  bool replacement_changes_owner = false;
  uint32_t owner = 0;  // its user id (posix_io; 0 where replacement_changes_owner is false)
  bool operator==(const FileStamp&) const = default;
};

// An advisory whole-file lock (flock(2)), held until the object is destroyed.
// The kernel drops it when the process dies, so a crash never leaves it stale.
class FileLock {
 public:
  virtual ~FileLock() = default;
};
enum class LockMode { kShared, kExclusive };

// What Io::open_regular found at a path.
struct OpenedRegular {
  std::unique_ptr<ReadableFile> file;  // null when something else is there
  std::optional<FileStamp> stamp;      // of the opened file itself (nullopt: this Io has no stamps)
  bool symlink = false;                // not followed
  std::string not_regular;             // what is there instead ("a symlink", "a FIFO, socket or device", ...)
};

class Io {
 public:
  virtual ~Io() = default;
  virtual Result<std::unique_ptr<ReadableFile>> open_read(const std::string& path) = 0;
  // Creates or truncates `path`. `exclusive` fails if it exists.
  virtual Result<std::unique_ptr<WritableFile>> open_write(const std::string& path, bool exclusive) = 0;
  // Creates `path`, which must not exist, readable and writable by its owner only from the create
  // itself (POSIX: mode 0600), so that no other user can open it at any instant and read what is
  // written later, as they could between a create and a chmod: for plaintext copies of what an
  // encrypted store keeps sealed. Where files have no modes, an ordinary new file.
  virtual Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& path) = 0;
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // Swaps the names of the two existing files `a` and `b` atomically (base/os.h exchange_paths).
  // kNotSupported where the system or the file system has no such call. Not defaulted: an Io that
  // wraps another must forward it, or its callers silently lose what it guards (migrate's check).
  virtual Status exchange(const std::string& a, const std::string& b) = 0;
  // Removes a file, a symbolic link or an empty directory; a path not there is OK.
  virtual Status remove(const std::string& path) = 0;
  virtual Status sync_dir(const std::string& dir) = 0;
  virtual Result<bool> exists(const std::string& path) = 0;
  virtual Result<std::vector<DirEntry>> list_dir(const std::string& dir) = 0;
  virtual Status create_dirs(const std::string& dir) = 0;
  // Locks `path` (created if missing). With wait=false, a conflicting holder
  // gives nullptr instead of blocking. Not every Io has locks: the default
  // says kNotSupported.
  virtual Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, LockMode mode, bool wait);
  // Locks the directory `dir` itself, exclusively, without waiting (flock on an O_DIRECTORY
  // descriptor: no lock file appears among the directory's files, which may all be someone
  // else's, e.g. a server's slots). nullptr when another holder has it. The default says
  // kNotSupported.
  virtual Result<std::unique_ptr<FileLock>> lock_dir(const std::string& dir);
  // A file handed to another process and then removed or written again (a slot
  // file for llama-server), never synced: written from its start over what
  // `path` holds (created if missing), without truncating first, so the page
  // cache pages of its previous contents are reused instead of new ones
  // allocated; close() cuts it to the bytes written. No write-behind: a file
  // that is soon removed or rewritten gains nothing from reaching the disk early.
  // kInvalidArgument for anything but a regular file of this user with one name
  // (a symlink is not followed). The default is open_write(path, false): the same
  // bytes, none of the reuse.
  virtual Result<std::unique_ptr<WritableFile>> open_scratch(const std::string& path);
  // `path`'s stamp (following symlinks). The default says kNotSupported (an Io without them).
  virtual Result<FileStamp> stamp(const std::string& path);
  // Opens `path` for reading only if it is itself a regular file, and stamps what was opened: a
  // symlink is not followed and a FIFO is not waited on (POSIX: O_NOFOLLOW | O_NONBLOCK, then
  // fstat), so a name swapped after a directory listing can neither lead out of the directory
  // nor block. Something else there is an OpenedRegular without a file, not an error. The default
  // (an Io without links or special files, e.g. memory): open_read and stamp.
  virtual Result<OpenedRegular> open_regular(const std::string& path);
  // Bytes this user may still write on the file system that holds `dir` (POSIX: statvfs's
  // f_bavail * f_frsize); nullopt when the Io cannot tell (the default).
  virtual Result<std::optional<uint64_t>> free_bytes(const std::string& dir);
};

// The process-wide real file system.
Io& posix_io();

// Reads a whole (small) file into memory; refuses files larger than `max_bytes`.
Result<std::vector<std::byte>> read_all(Io& io, const std::string& path, uint64_t max_bytes);

struct AtomicWriteOptions {
  // Where the temporary file goes; empty = beside `path`. Must be on the same
  // file system as `path` (rename).
  std::string temp_dir;
  // false: commit() stops after the rename and the caller fsyncs the
  // directory of `path` itself (batching many files into one directory sync).
  // Until it does, the new name may not survive a crash.
  bool sync_dir = true;
  // The new file readable by its owner only (Io::create_owner_only), whatever the mode of a file it
  // replaces: it holds what an encrypted store keeps sealed.
  bool owner_only = false;
  // The file's appends go at the disk's pace (WritableFile::pace_to_disk): a save's pack.
  bool disk_pace = false;
};

// What marks AtomicFileWriter's temporary files: `<target>.kvsnap-tmp-<pid>-<random>` (the target's
// name cut when that would be too long: temp_path_beside).
// Cleaners of stale temporaries (migrate_dir) match this and read the pid after its last occurrence
// (a temporary of a file that is itself a temporary holds it twice: SlotFileWriter's of a slot file).
inline constexpr std::string_view kTempInfix = ".kvsnap-tmp-";
// The one such name without a pid: the scratch file kvsnap keeps in a llama-server slot directory
// (server/server_flows.h, kSlotScratchName), only ever a cache, which migrate_dir removes too.
inline constexpr std::string_view kKeptScratchName = ".kvsnap-scratch.kvsnap-tmp-kept";

// The directory part of a path: "a/b" for "a/b/c", "." for a bare name, "/" for "/c".
std::string dir_of(const std::string& path);
// The name part of a path: "c" for "a/b/c" and for "c".
std::string file_name_of(const std::string& path);

// "<pid>-<64 random bits>": what makes every kvsnap temporary name unique across processes and
// threads (AtomicFileWriter, the store's tmp/ files, slot files handed to llama-server).
std::string unique_suffix();
// `<path>.kvsnap-tmp-<unique_suffix>`, the file name part cut (at a UTF-8 character's start) so
// that the temporary's name fits in 255 bytes (NAME_MAX): a file whose own name is that long can
// still be written (it failed with "File name too long" past ~215 bytes).
std::string temp_path_beside(const std::string& path);

// Writes `path` so that a reader sees either the old file or the complete new
// one, never a mix: a temporary file in the same directory, fsync, rename,
// fsync of the directory. A file it replaces keeps its mode (and owner, as
// root): WritableFile::take_access_of, on the temporary before it is written. Dropping the writer without commit() removes the
// temporary file.
class AtomicFileWriter final : public ByteSink {
 public:
  static Result<std::unique_ptr<AtomicFileWriter>> create(Io& io, const std::string& path);
  static Result<std::unique_ptr<AtomicFileWriter>> create(Io& io, const std::string& path,
                                                          const AtomicWriteOptions& options);
  ~AtomicFileWriter() override;
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override;
  // sync() then publish().
  Status commit();
  // commit() in two steps, for a caller that must check something after the new bytes are durable
  // and before they replace `path` (migrate_dir: that the original did not change meanwhile, which
  // a check before a long fdatasync could not see). sync(): the temporary is durable and closed.
  Status sync();
  // Renames the temporary over `path` (syncing it first if sync() was not called), then fsyncs the
  // directory. Once the rename is done, published() is true whatever the directory sync says.
  Status publish();
  // publish() for a caller that must not replace a file someone else wrote after it was read
  // (migrate_dir: a llama-server saving the slot). `unchanged(p, moved)` says whether the file at
  // `p` is still the one that caller read (`moved`: it was renamed meanwhile, which changes its
  // ctime). It is asked about `path` first; then, where the Io can exchange two names, the new
  // bytes and the original swap names and it is asked again about the original under the
  // temporary's name: a writer that truncated or replaced `path` before the swap wrote into the
  // original, so that answer sees it, and the writer's file goes back to its name (swapped back,
  // else renamed back; a second save that reached the new file meanwhile is the newest and takes
  // the name), the error returned, published() false. A writer's file that cannot be put back
  // stays under the temporary's name, never removed, and the error says where. With no exchange
  // (kNotSupported) the first answer is followed by a plain rename (renamed_plainly()), so a write
  // between the two is not seen. After a successful swap the original is removed (a failure, or a
  // crash just before, leaves it under the temporary's name, which migrate's next scan removes).
  Status publish_if_unchanged(const std::function<Status(const std::string& p, bool moved)>& unchanged);
  bool published() const { return committed_; }
  // Whether publish_if_unchanged removed the original it swapped out: also when a save then took
  // the name from the new file (published() false), so that no copy of the original is left here.
  bool original_removed() const { return original_removed_; }
  // The file's WritableFile::disk_waits.
  std::optional<uint64_t> disk_waits() const { return file_ ? file_->disk_waits() : std::nullopt; }
  // Whether publish_if_unchanged fell back to a plain rename (no exchange here): its last check
  // could not see a writer between it and the rename.
  bool renamed_plainly() const { return renamed_plainly_; }
  const std::string& temp_path() const { return tmp_path_; }

 private:
  AtomicFileWriter(Io& io, std::string path, std::string tmp, std::unique_ptr<WritableFile> f, bool sync_dir)
      : io_(io), path_(std::move(path)), tmp_path_(std::move(tmp)), file_(std::move(f)), sync_dir_(sync_dir) {}
  Io& io_;
  std::string path_;
  std::string tmp_path_;
  std::unique_ptr<WritableFile> file_;
  bool sync_dir_ = true;
  bool synced_ = false;
  bool committed_ = false;
  bool original_removed_ = false;
  bool keep_temp_ = false;  // the temporary's name holds someone else's file: never removed
  bool renamed_plainly_ = false;
};

}  // namespace kvsnap
