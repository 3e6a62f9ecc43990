// Export archives: snapshot bundles as pax tar files, written and read with
// libarchive, safe against hostile input.
//
// Writing (write_archive, export_archive):
//   - a pax ("restricted") tar compressed with zstd; entries are regular files
//     only, in the order given, each with its name, size and bytes;
//   - deterministic: the same entries and options give the same bytes (mtime
//     ArchiveWriteOptions::mtime, uid/gid 0, mode 0644, no user or group names,
//     no atime/ctime, single-threaded zstd);
//   - export_archive writes through AtomicFileWriter: on any error (a bad
//     entry, a producer's error, a failing disk) no file appears at `path` and
//     an existing file there is left as it was; on success it is replaced.
//
// Reading (read_archive, import_archive):
//   - accepts .tar, .tar.zst, .tar.gz and .tar.xz (by content, not by name);
//     one compression layer at most; tar formats only;
//   - never touches the file system: each regular file's bytes go to an
//     ArchiveVisitor in pieces of at most ArchiveReadOptions::piece_bytes; the
//     whole entry is never held in memory;
//   - refuses, with a Status naming the archive and the entry (its 1-based
//     index and its name, escaped), and before any of that entry's bytes are
//     delivered where the header decides it:
//       kNotSupported  an unsafe name (see validate_archive_entry_name), a
//                      symlink, hardlink, device, fifo, socket or sparse file,
//                      a name that appears twice, nested compression, more
//                      entries / bytes than the caps, a compression ratio above
//                      the cap (decompression bombs);
//       kCorruption    an empty file, bytes that are no supported archive, a
//                      truncated or damaged archive (including a tar that stops
//                      at an entry boundary without its end-of-archive block),
//                      an entry whose bytes do not match its header's size;
//       kNotFound      the file does not exist;
//       kIOError       the file could not be read;
//       anything else  returned unchanged from the visitor, which stops the walk.
//   - directories are validated like files, then skipped without a callback.
//   Because an entry can fail after some of its bytes were delivered (a
//   truncated archive), the bytes of an entry are only final once end_entry()
//   was called, and an error means the caller discards everything it received.
//
// Entry names (both directions): 1..255 bytes of printable ASCII (0x20-0x7e)
// without backslash, '/'-separated components that are neither empty, "." nor
// "..": no absolute paths, no "a//b", no trailing '/' (except on directories
// when reading). Non-ASCII is refused because libarchive's handling of it
// depends on the process locale (and its pax writer crashes on UTF-8 names in
// the C locale).
//
// Thread safety: the functions are reentrant; one call uses one libarchive
// handle of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "base/io.h"
#include "base/status.h"

namespace kvsnap {

// OK, or kInvalidArgument saying what is wrong with `name` (rules above).
Status validate_archive_entry_name(std::string_view name);

// ---- Writing ----------------------------------------------------------------

// One regular file of an archive: its bytes come from `file` (read in pieces),
// from `produce`, which must append exactly `size` bytes to the sink it is
// given, in pieces of the size it likes (each piece goes straight to the
// compressor; nothing is buffered per entry), or from the file `make` returns
// when the writer reaches the entry (its size is that file's; it is dropped
// once copied): bytes whose size is known only once they are made, made once.
struct ExportEntry {
  std::string name;
  uint64_t size = 0;
  const ReadableFile* file = nullptr;            // not owned; outlives the write
  std::function<Status(ByteSink& out)> produce;  // used when file is null
  std::function<Result<std::unique_ptr<ReadableFile>>()> make;  // used when both are null

  static ExportEntry FromFile(std::string name, const ReadableFile& file) {
    return ExportEntry{std::move(name), file.size(), &file, nullptr, nullptr};
  }
  static ExportEntry FromProducer(std::string name, uint64_t size, std::function<Status(ByteSink& out)> produce) {
    return ExportEntry{std::move(name), size, nullptr, std::move(produce), nullptr};
  }
  static ExportEntry FromMadeFile(std::string name, std::function<Result<std::unique_ptr<ReadableFile>>()> make) {
    return ExportEntry{std::move(name), 0, nullptr, nullptr, std::move(make)};
  }
};

struct ArchiveWriteOptions {
  int64_t mtime = 0;              // of every entry, seconds since the epoch
  int zstd_level = 3;             // 1..19
  size_t piece_bytes = 1 << 20;   // read size for ExportEntry::file
  bool owner_only = false;        // export_archive: the file mode 0600 (it holds decrypted snapshots)
};

// Writes the archive to `out`. Errors: kInvalidArgument for a bad or
// duplicate name, an entry with neither or a wrong-sized file, a producer that
// gives more or fewer bytes than `size`; the sink's, file's or producer's own
// Status; kIOError when libarchive fails. On error `out` holds an unusable
// prefix.
Status write_archive(ByteSink& out, std::span<const ExportEntry> entries, const ArchiveWriteOptions& options = {});

// write_archive into `path`, atomically (see the top of this file).
Status export_archive(Io& io, const std::string& path, std::span<const ExportEntry> entries,
                      const ArchiveWriteOptions& options = {});

// ---- Reading ----------------------------------------------------------------

struct ArchiveReadOptions {
  uint64_t max_entries = 100'000;               // every entry, directories included
  uint64_t max_entry_bytes = uint64_t{1} << 40; // per regular file (1 TiB)
  uint64_t max_total_bytes = uint64_t{1} << 40; // all regular files together
  // Decompression-bomb guard: refuse once more than `ratio_floor_bytes` were
  // decompressed and that is more than `max_ratio` times the compressed bytes
  // read so far. 0 disables the guard.
  double max_ratio = 1000;
  uint64_t ratio_floor_bytes = uint64_t{64} << 20;
  size_t piece_bytes = 1 << 20;                 // largest piece given to entry_data
};

struct ArchiveEntryInfo {
  uint64_t index = 0;  // 1-based position among all entries of the archive
  std::string name;    // validated (rules above)
  uint64_t size = 0;   // from the header; exactly this many bytes will follow
};

// Receives the regular files of an archive, in archive order:
// begin_entry, entry_data zero or more times, end_entry. A non-OK Status from
// any of them stops the walk and is returned by read_archive unchanged.
class ArchiveVisitor {
 public:
  virtual ~ArchiveVisitor() = default;
  virtual Status begin_entry(const ArchiveEntryInfo& info) = 0;
  virtual Status entry_data(std::span<const std::byte> piece) = 0;
  // All `info.size` bytes were delivered and matched the header.
  virtual Status end_entry() = 0;
};

// Walks the archive in `file` (see the top of this file for the rules).
Status read_archive(const ReadableFile& file, ArchiveVisitor& visitor, const ArchiveReadOptions& options = {});

// read_archive of the file at `path`, opened through `io`.
Status import_archive(Io& io, const std::string& path, ArchiveVisitor& visitor,
                      const ArchiveReadOptions& options = {});

}  // namespace kvsnap
