#include "store/archive.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "store/lazy_libs.h"

namespace kvsnap {

namespace {

constexpr size_t kMaxNameBytes = 255;
constexpr size_t kQuoteBytes = 120;      // longest name shown in a message
constexpr uint64_t kTarBlock = 512;
constexpr size_t kReadChunk = 64 << 10;  // bytes handed to libarchive per read callback

// ---- Names ------------------------------------------------------------------

// `name` between quotes, with control and non-ASCII bytes escaped and long
// names cut: safe to print whatever an archive contains.
std::string quote(std::string_view name) {
  std::string out = "'";
  for (size_t i = 0; i < name.size() && i < kQuoteBytes; ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
  if (name.size() > kQuoteBytes) out += "... (" + std::to_string(name.size()) + " bytes)";
  return out;
}

std::string char_problem(std::string_view name) {
  for (char ch : name) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == 0) return "name contains a NUL byte";
    if (c == '\\') return "name contains a backslash";
    if (c < 0x20 || c == 0x7f) return "name contains a control character";
    if (c >= 0x80) return "name contains a non-ASCII byte (names are printable ASCII)";
  }
  return {};
}

std::string component_problem(std::string_view name) {
  size_t start = 0;
  while (true) {
    size_t slash = name.find('/', start);
    std::string_view part = name.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty()) return "name has an empty path component ('//' or a trailing '/')";
    if (part == ".") return "name has a '.' component";
    if (part == "..") return "name has a '..' component (path traversal)";
    if (slash == std::string_view::npos) return {};
    start = slash + 1;
  }
}

// Empty when `name` is acceptable, else what is wrong with it.
std::string name_problem(std::string_view name) {
  if (name.empty()) return "empty name";
  if (name.size() > kMaxNameBytes) {
    return "name is " + std::to_string(name.size()) + " bytes long, more than " + std::to_string(kMaxNameBytes);
  }
  if (name.front() == '/') return "absolute path (names must be relative)";
  std::string p = char_problem(name);
  return p.empty() ? component_problem(name) : p;
}

std::string la_message(archive* a) {
  const char* m = archive_error_string(a);
  return (m && *m) ? std::string(m) : std::string("unknown libarchive error");
}

struct ReadDeleter {
  void operator()(archive* a) const { archive_read_free(a); }
};
struct WriteDeleter {
  void operator()(archive* a) const { archive_write_free(a); }
};
struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};
using ReadArchive = std::unique_ptr<archive, ReadDeleter>;
using WriteArchive = std::unique_ptr<archive, WriteDeleter>;
using Entry = std::unique_ptr<archive_entry, EntryDeleter>;

// ---- Writing ----------------------------------------------------------------

// libarchive's output callback: compressed bytes go to a ByteSink; its Status
// is kept so the caller sees the sink's error rather than a generic one.
struct SinkContext {
  ByteSink* out;
  Status status;
  bool abandoned = false;  // the archive failed: drop what libarchive still writes
};

la_ssize_t sink_write(archive* a, void* ctx, const void* buf, size_t n) {
  auto* sink = static_cast<SinkContext*>(ctx);
  if (sink->abandoned) return static_cast<la_ssize_t>(n);
  Status s = sink->out->append(buf, n);
  if (s.ok()) return static_cast<la_ssize_t>(n);
  sink->status = s;
  archive_set_error(a, EIO, "%s", s.message().c_str());
  return -1;
}

Status write_failure(archive* a, const SinkContext& sink, const std::string& what) {
  if (!sink.status.ok()) return sink.status;
  return Status::IOError(what + ": " + la_message(a));
}

// One entry's bytes into libarchive, refusing more than the declared size.
class EntryWriter final : public ByteSink {
 public:
  EntryWriter(archive* a, const SinkContext& sink, const ExportEntry& e)
      : a_(a), sink_(sink), entry_(e), remaining_(e.size) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    if (data.size() > remaining_) {
      return Status::InvalidArgument("archive entry " + quote(entry_.name) + ": more bytes than the declared " +
                                     std::to_string(entry_.size));
    }
    while (!data.empty()) {
      la_ssize_t n = archive_write_data(a_, data.data(), data.size());
      if (n <= 0) return write_failure(a_, sink_, "archive entry " + quote(entry_.name));
      data = data.subspan(static_cast<size_t>(n));
      remaining_ -= static_cast<uint64_t>(n);
    }
    return Status::OK();
  }
  uint64_t remaining() const { return remaining_; }

 private:
  archive* a_;
  const SinkContext& sink_;
  const ExportEntry& entry_;
  uint64_t remaining_;
};

Status check_export_entry(const ExportEntry& e) {
  std::string problem = name_problem(e.name);
  if (!problem.empty()) return Status::InvalidArgument("archive entry " + quote(e.name) + ": " + problem);
  const std::string where = "archive entry " + quote(e.name);
  if (!e.file && !e.produce && !e.make) return Status::InvalidArgument(where + ": neither a file nor a producer");
  if (e.file && e.file->size() != e.size) {
    return Status::InvalidArgument(where + ": declared " + std::to_string(e.size) + " bytes but " + e.file->name() +
                                   " has " + std::to_string(e.file->size()));
  }
  if (e.size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Status::InvalidArgument(where + ": size " + std::to_string(e.size) + " is too large");
  }
  return Status::OK();
}

Status check_export_entries(std::span<const ExportEntry> entries) {
  std::unordered_set<std::string_view> seen;
  for (const ExportEntry& e : entries) {
    KV_RETURN_IF_ERROR(check_export_entry(e));
    if (!seen.insert(e.name).second) {
      return Status::InvalidArgument("archive entry " + quote(e.name) + ": the name appears twice");
    }
  }
  return Status::OK();
}

Status open_writer(archive* a, SinkContext& sink, const ArchiveWriteOptions& o) {
  if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
      archive_write_add_filter_zstd(a) != ARCHIVE_OK) {
    return Status::NotSupported("libarchive cannot write pax+zstd: " + la_message(a));
  }
  const std::string level = std::to_string(o.zstd_level);
  if (o.zstd_level < 1 || o.zstd_level > 19 ||
      archive_write_set_filter_option(a, "zstd", "compression-level", level.c_str()) != ARCHIVE_OK) {
    return Status::InvalidArgument("zstd level " + level + " is not in 1..19");
  }
  // Unpadded output: zero padding after a zstd frame does not read back.
  archive_write_set_bytes_in_last_block(a, 1);
  if (archive_write_open(a, &sink, nullptr, sink_write, nullptr) != ARCHIVE_OK) {
    return write_failure(a, sink, "archive");
  }
  return Status::OK();
}

Status copy_file(const ReadableFile& file, EntryWriter& out, size_t piece_bytes) {
  std::vector<std::byte> buf(static_cast<size_t>(std::min<uint64_t>(std::max<size_t>(piece_bytes, 1), file.size())));
  for (uint64_t off = 0; off < file.size();) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), file.size() - off));
    std::span<std::byte> piece(buf.data(), n);
    KV_RETURN_IF_ERROR(file.read_at(off, piece));
    KV_RETURN_IF_ERROR(out.append(piece));
    off += n;
  }
  return Status::OK();
}

Entry make_header(const ExportEntry& e, const ArchiveWriteOptions& o) {
  Entry h(archive_entry_new());
  archive_entry_copy_pathname(h.get(), e.name.c_str());  // ASCII: no locale conversion
  archive_entry_set_filetype(h.get(), AE_IFREG);
  archive_entry_set_perm(h.get(), 0644);
  archive_entry_set_size(h.get(), static_cast<la_int64_t>(e.size));
  archive_entry_set_mtime(h.get(), o.mtime, 0);
  archive_entry_set_uid(h.get(), 0);
  archive_entry_set_gid(h.get(), 0);
  return h;
}

Status write_entry(archive* a, const SinkContext& sink, const ExportEntry& e, const ArchiveWriteOptions& o) {
  const std::string where = "archive entry " + quote(e.name);
  if (!e.file && !e.produce) {  // made now, copied, dropped
    KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> made, e.make());
    const ExportEntry now = ExportEntry::FromFile(e.name, *made);
    KV_RETURN_IF_ERROR(check_export_entry(now));
    return write_entry(a, sink, now, o);
  }
  Entry h = make_header(e, o);
  if (!h) return Status::IOError(where + ": out of memory");
  if (archive_write_header(a, h.get()) != ARCHIVE_OK) return write_failure(a, sink, where);
  EntryWriter out(a, sink, e);
  KV_RETURN_IF_ERROR(e.file ? copy_file(*e.file, out, o.piece_bytes) : e.produce(out));
  if (out.remaining() != 0) {
    return Status::InvalidArgument(where + ": the producer gave " + std::to_string(e.size - out.remaining()) +
                                   " of the declared " + std::to_string(e.size) + " bytes");
  }
  if (archive_write_finish_entry(a) != ARCHIVE_OK) return write_failure(a, sink, where);
  return Status::OK();
}

// Drops a half-written archive: nothing more reaches the sink, the current
// entry is not padded to its declared size (which could be a TiB of zeros
// through zstd), and libarchive frees all of its buffers (3.6's free() alone
// leaks the output block after fail(); close() in the failed state does not).
void abandon(archive* a, SinkContext& sink) {
  sink.abandoned = true;
  archive_write_fail(a);
  archive_write_close(a);
}

Status write_all(archive* a, SinkContext& sink, std::span<const ExportEntry> entries, const ArchiveWriteOptions& o) {
  KV_RETURN_IF_ERROR(open_writer(a, sink, o));
  for (const ExportEntry& e : entries) KV_RETURN_IF_ERROR(write_entry(a, sink, e, o));
  if (archive_write_close(a) != ARCHIVE_OK) return write_failure(a, sink, "archive");
  return Status::OK();
}

// ---- Reading ----------------------------------------------------------------

// libarchive's input callback: the archive's bytes from a ReadableFile, a
// bounded chunk at a time; counts what was handed over (the compressed size).
struct Source {
  const ReadableFile* file;
  uint64_t offset = 0;
  std::vector<std::byte> buf;
  Status status;
};

la_ssize_t source_read(archive* a, void* ctx, const void** out) {
  auto* src = static_cast<Source*>(ctx);
  size_t n = static_cast<size_t>(std::min<uint64_t>(src->buf.size(), src->file->size() - src->offset));
  if (n == 0) return 0;
  Status s = src->file->read_at(src->offset, std::span<std::byte>(src->buf.data(), n));
  if (!s.ok()) {
    src->status = s;
    archive_set_error(a, EIO, "%s", s.message().c_str());
    return -1;
  }
  src->offset += n;
  *out = src->buf.data();
  return static_cast<la_ssize_t>(n);
}

const char* special_type(mode_t type) {
  switch (type) {
    case AE_IFLNK: return "a symbolic link";
    case AE_IFCHR: return "a character device";
    case AE_IFBLK: return "a block device";
    case AE_IFIFO: return "a fifo";
    case AE_IFSOCK: return "a socket";
    default: return "an entry of unknown type";
  }
}

std::string format_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", r);
  return buf;
}

uint64_t round_up_block(uint64_t n) { return (n + kTarBlock - 1) / kTarBlock * kTarBlock; }

// One walk over one archive: the libarchive handle, the limits and the
// running counts behind them.
class ArchiveWalk {
 public:
  ArchiveWalk(const ReadableFile& file, ArchiveVisitor& v, const ArchiveReadOptions& o)
      : file_(file), visitor_(v), opt_(o), a_(archive_read_new()) {
    src_.file = &file;
    src_.buf.resize(kReadChunk);
    piece_size_ = std::max<size_t>(o.piece_bytes, 1);
    piece_ = std::make_unique_for_overwrite<std::byte[]>(piece_size_);
  }

  Status run() {
    if (file_.size() == 0) return Status::Corruption(file_.name() + ": empty file, not an archive");
    KV_RETURN_IF_ERROR(open());
    while (true) {
      archive_entry* e = nullptr;
      int r = archive_read_next_header(a_.get(), &e);
      if (r == ARCHIVE_EOF) {
        KV_RETURN_IF_ERROR(check_ratio());  // what the last skip decompressed too
        return check_end();
      }
      KV_RETURN_IF_ERROR(entry(r, e));
    }
  }

 private:
  std::string where() const { return file_.name() + ": entry " + std::to_string(index_) + " " + quote(name_); }

  // The reason libarchive failed: the file's own error, else its message.
  Status failure(const std::string& what) const {
    if (!src_.status.ok()) return src_.status;
    return Status::Corruption(what + ": " + la_message(a_.get()));
  }

  Status open() {
    archive* a = a_.get();
    if (!a || archive_read_support_format_tar(a) != ARCHIVE_OK || archive_read_support_filter_gzip(a) != ARCHIVE_OK ||
        archive_read_support_filter_xz(a) != ARCHIVE_OK || archive_read_support_filter_zstd(a) != ARCHIVE_OK) {
      return Status::NotSupported(file_.name() + ": this libarchive cannot read tar with gzip, xz and zstd");
    }
    if (archive_read_open(a, &src_, nullptr, source_read, nullptr) != ARCHIVE_OK) return not_an_archive();
    if (archive_filter_count(a) > 2) {
      return Status::NotSupported(file_.name() + ": nested compression (" + archive_filter_name(a, 0) + " inside " +
                                  archive_filter_name(a, 1) + "); one layer at most");
    }
    return Status::OK();
  }

  Status not_an_archive() const {
    return failure(file_.name() + ": not a readable tar archive (.tar, .tar.zst, .tar.gz, .tar.xz)");
  }

  // The header just read, with `r` its libarchive result.
  Status entry(int r, archive_entry* e) {
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      if (index_ == 0) return not_an_archive();
      return failure(file_.name() + ": damaged archive after entry " + std::to_string(index_) + " " + quote(name_));
    }
    ++index_;
    KV_RETURN_IF_ERROR(read_name(e));
    if (index_ > opt_.max_entries) {
      return Status::NotSupported(where() + ": more than " + std::to_string(opt_.max_entries) +
                                  " entries (ArchiveReadOptions::max_entries)");
    }
    KV_RETURN_IF_ERROR(check_ratio());
    KV_RETURN_IF_ERROR(check_name(archive_entry_filetype(e) == AE_IFDIR));
    if (r == ARCHIVE_WARN) return failure(where() + ": damaged header");
    KV_RETURN_IF_ERROR(check_type(e));
    KV_RETURN_IF_ERROR(note_entry_end(e));
    if (archive_entry_filetype(e) == AE_IFDIR) {  // allowed, ignored; but not data under its name,
      // which libarchive would decompress to skip it, uncounted (a bomb of any size)
      if (archive_entry_size_is_set(e) && archive_entry_size(e) != 0) {
        return Status::NotSupported(where() + ": a directory with " + std::to_string(archive_entry_size(e)) +
                                    " bytes of data; a tar directory entry has none");
      }
      return Status::OK();
    }
    KV_RETURN_IF_ERROR(check_regular(e));
    return deliver();
  }

  Status read_name(archive_entry* e) {
    const char* n = archive_entry_pathname(e);
    if (!n) n = archive_entry_pathname_utf8(e);
    if (!n) {
      name_ = "?";
      return Status::NotSupported(where() + ": the name cannot be decoded (" + la_message(a_.get()) + ")");
    }
    name_ = n;
    return Status::OK();
  }

  Status check_name(bool is_dir) {
    std::string_view n = name_;
    if (is_dir && n.size() > 1 && n.back() == '/') n.remove_suffix(1);
    std::string problem = name_problem(n);
    if (!problem.empty()) return Status::NotSupported(where() + ": " + problem);
    return Status::OK();
  }

  Status check_type(archive_entry* e) const {
    const std::string only = "; only regular files and directories are accepted";
    if (const char* target = archive_entry_hardlink(e)) {
      return Status::NotSupported(where() + ": a hard link to " + quote(target) + only);
    }
    mode_t type = archive_entry_filetype(e);
    if (type == AE_IFREG || type == AE_IFDIR) return Status::OK();
    std::string what = special_type(type);
    if (const char* target = archive_entry_symlink(e)) what += " to " + quote(target);
    return Status::NotSupported(where() + ": " + what + only);
  }

  // Where the entry's data ends in the tar stream, to check the end-of-archive
  // block: libarchive takes a tar cut at an entry boundary for a complete one.
  Status note_entry_end(archive_entry* e) {
    la_int64_t pos = archive_filter_bytes(a_.get(), 0);
    la_int64_t size = archive_entry_size_is_set(e) ? archive_entry_size(e) : 0;
    if (pos < 0 || size < 0) return Status::Corruption(where() + ": invalid position or size in the header");
    entry_end_ = static_cast<uint64_t>(pos) + round_up_block(static_cast<uint64_t>(size));
    return Status::OK();
  }

  Status check_regular(archive_entry* e) {
    if (!archive_entry_size_is_set(e)) return Status::Corruption(where() + ": the header has no size");
    if (archive_entry_sparse_count(e) > 0) {
      return Status::NotSupported(where() + ": a sparse file; only plain regular files are accepted");
    }
    size_ = static_cast<uint64_t>(archive_entry_size(e));
    if (size_ > opt_.max_entry_bytes) {
      return Status::NotSupported(where() + ": " + std::to_string(size_) + " bytes, more than the " +
                                  std::to_string(opt_.max_entry_bytes) +
                                  " allowed per entry (ArchiveReadOptions::max_entry_bytes)");
    }
    if (size_ > opt_.max_total_bytes - total_) {
      return Status::NotSupported(where() + ": brings the archive over the " + std::to_string(opt_.max_total_bytes) +
                                  " bytes allowed in all (ArchiveReadOptions::max_total_bytes)");
    }
    total_ += size_;
    if (!names_.insert(name_).second) return Status::NotSupported(where() + ": the name appears twice");
    return Status::OK();
  }

  Status check_ratio() const {
    if (opt_.max_ratio <= 0) return Status::OK();
    la_int64_t out = archive_filter_bytes(a_.get(), 0);
    if (out <= 0 || static_cast<uint64_t>(out) <= opt_.ratio_floor_bytes) return Status::OK();
    double in = static_cast<double>(std::max<uint64_t>(src_.offset, 1));
    if (static_cast<double>(out) <= opt_.max_ratio * in) return Status::OK();
    return Status::NotSupported(where() + ": " + std::to_string(out) + " bytes decompressed from " +
                                std::to_string(src_.offset) + ", a ratio over " + format_ratio(opt_.max_ratio) +
                                ": refusing a likely decompression bomb (ArchiveReadOptions::max_ratio)");
  }

  Status deliver() {
    KV_RETURN_IF_ERROR(visitor_.begin_entry(ArchiveEntryInfo{index_, name_, size_}));
    uint64_t got = 0;
    while (true) {
      la_ssize_t n = archive_read_data(a_.get(), piece_.get(), piece_size_);
      if (n == 0) break;
      if (n < 0) {
        // libarchive drops the count of a piece it could not complete: `got` is whole pieces.
        return failure(where() + ": truncated or damaged in its " + std::to_string(size_) + " bytes (the piece after byte " +
                       std::to_string(got) + ")");
      }
      got += static_cast<uint64_t>(n);
      if (got > size_) break;
      KV_RETURN_IF_ERROR(check_ratio());
      KV_RETURN_IF_ERROR(visitor_.entry_data(std::span<const std::byte>(piece_.get(), static_cast<size_t>(n))));
    }
    if (got != size_) {
      return Status::Corruption(where() + ": the header says " + std::to_string(size_) + " bytes but " +
                                std::to_string(got) + " were read");
    }
    return visitor_.end_entry();
  }

  Status check_end() const {
    if (!src_.status.ok()) return src_.status;
    la_int64_t pos = archive_filter_bytes(a_.get(), 0);
    if (pos >= 0 && static_cast<uint64_t>(pos) >= entry_end_ + kTarBlock) return Status::OK();
    std::string after = index_ == 0 ? "before any entry" : "after entry " + std::to_string(index_) + " " + quote(name_);
    return Status::Corruption(file_.name() + ": truncated: the archive ends " + after +
                              " without the tar end-of-archive block");
  }

  const ReadableFile& file_;
  ArchiveVisitor& visitor_;
  const ArchiveReadOptions& opt_;
  ReadArchive a_;
  Source src_;
  // Not zero-filled: libarchive writes each piece before it is read, and a walk per truncated
  // prefix (the hostile-input tests) paid for a MiB of zeroes each, 15 s under ASan at -O0.
  std::unique_ptr<std::byte[]> piece_;
  size_t piece_size_ = 0;
  std::unordered_set<std::string> names_;
  uint64_t index_ = 0;      // of the current entry, 1-based
  std::string name_;        // of the current entry
  uint64_t size_ = 0;       // of the current regular file
  uint64_t total_ = 0;      // declared bytes of the regular files so far
  uint64_t entry_end_ = 0;  // tar stream offset where the current entry's data ends
};

}  // namespace

Status validate_archive_entry_name(std::string_view name) {
  std::string problem = name_problem(name);
  if (problem.empty()) return Status::OK();
  return Status::InvalidArgument(quote(name) + ": " + problem);
}

Status write_archive(ByteSink& out, std::span<const ExportEntry> entries, const ArchiveWriteOptions& options) {
  KV_RETURN_IF_ERROR(check_export_entries(entries));
  KV_RETURN_IF_ERROR(load_libarchive());
  WriteArchive a(archive_write_new());
  if (!a) return Status::IOError("archive: out of memory");
  SinkContext sink{&out, Status::OK()};
  Status s = write_all(a.get(), sink, entries, options);
  if (!s.ok()) abandon(a.get(), sink);
  return s;
}

Status export_archive(Io& io, const std::string& path, std::span<const ExportEntry> entries,
                      const ArchiveWriteOptions& options) {
  KV_RETURN_IF_ERROR(check_export_entries(entries));  // before a temporary file exists
  AtomicWriteOptions file;
  file.owner_only = options.owner_only;
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(io, path, file));
  {
    BufferedSink buffered(*writer);
    KV_RETURN_IF_ERROR(write_archive(buffered, entries, options));
    KV_RETURN_IF_ERROR(buffered.flush());
  }
  return writer->commit();  // on any earlier return the writer removes its temporary file
}

Status read_archive(const ReadableFile& file, ArchiveVisitor& visitor, const ArchiveReadOptions& options) {
  KV_RETURN_IF_ERROR(load_libarchive());  // before ArchiveWalk's archive_read_new
  ArchiveWalk walk(file, visitor, options);
  return walk.run();
}

Status import_archive(Io& io, const std::string& path, ArchiveVisitor& visitor, const ArchiveReadOptions& options) {
  KV_ASSIGN_OR_RETURN(auto file, io.open_read(path));
  return read_archive(*file, visitor, options);
}

}  // namespace kvsnap
