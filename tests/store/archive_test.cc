// Export archives: round trips, deterministic bytes, atomic export under
// injected faults, and every hostile archive refused with a message naming the
// archive and the entry.
#include "store/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

namespace kvsnap {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  return v;
}

std::vector<std::byte> to_bytes(const std::string& s) {
  std::vector<std::byte> v(s.size());
  if (!s.empty()) std::memcpy(v.data(), s.data(), s.size());
  return v;
}

// ---- Reading into memory --------------------------------------------------------

struct Got {
  std::string name;
  uint64_t size = 0;
  std::vector<std::byte> data;
  bool ended = false;
};

class Collector final : public ArchiveVisitor {
 public:
  Status begin_entry(const ArchiveEntryInfo& info) override {
    entries.push_back(Got{info.name, info.size, {}, false});
    return Status::OK();
  }
  Status entry_data(std::span<const std::byte> piece) override {
    largest_piece = std::max(largest_piece, piece.size());
    entries.back().data.insert(entries.back().data.end(), piece.begin(), piece.end());
    return Status::OK();
  }
  Status end_entry() override {
    entries.back().ended = true;
    return Status::OK();
  }
  std::vector<Got> entries;
  size_t largest_piece = 0;
};

Status read_bytes(const std::vector<std::byte>& bytes, const std::string& name, Collector& c,
                  const ArchiveReadOptions& o = {}) {
  MemoryFile f(name, std::span<const std::byte>(bytes));
  return read_archive(f, c, o);
}

// ---- Writing with libarchive directly: the hostile archives ------------------------

enum class Filter { kNone, kGzip, kXz, kZstd, kBzip2, kGzipInZstd };

struct Raw {
  std::string name;
  mode_t type = AE_IFREG;
  std::vector<std::byte> data;
  std::string symlink;
  std::string hardlink;
};

la_ssize_t append_cb(struct archive*, void* ctx, const void* buf, size_t n) {
  auto* v = static_cast<std::vector<std::byte>*>(ctx);
  v->insert(v->end(), static_cast<const std::byte*>(buf), static_cast<const std::byte*>(buf) + n);
  return static_cast<la_ssize_t>(n);
}

void add_filter(struct archive* a, Filter f) {
  switch (f) {
    case Filter::kNone: break;
    case Filter::kGzip: archive_write_add_filter_gzip(a); break;
    case Filter::kXz: archive_write_add_filter_xz(a); break;
    case Filter::kZstd: archive_write_add_filter_zstd(a); break;
    case Filter::kBzip2: archive_write_add_filter_bzip2(a); break;
    case Filter::kGzipInZstd:
      archive_write_add_filter_gzip(a);
      archive_write_add_filter_zstd(a);
      break;
  }
}

std::vector<std::byte> build(const std::vector<Raw>& entries, Filter filter = Filter::kNone) {
  std::vector<std::byte> out;
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  add_filter(a, filter);
  archive_write_set_bytes_in_last_block(a, 1);
  EXPECT_EQ(archive_write_open(a, &out, nullptr, append_cb, nullptr), ARCHIVE_OK) << archive_error_string(a);
  for (const Raw& r : entries) {
    struct archive_entry* e = archive_entry_new();
    archive_entry_copy_pathname(e, r.name.c_str());
    archive_entry_set_filetype(e, r.type);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(r.data.size()));
    if (!r.symlink.empty()) archive_entry_copy_symlink(e, r.symlink.c_str());
    if (!r.hardlink.empty()) archive_entry_copy_hardlink(e, r.hardlink.c_str());
    if (r.type == AE_IFCHR || r.type == AE_IFBLK) archive_entry_set_rdev(e, 0x0103);
    EXPECT_GE(archive_write_header(a, e), ARCHIVE_WARN) << archive_error_string(a);
    if (!r.data.empty()) archive_write_data(a, r.data.data(), r.data.size());
    archive_write_finish_entry(a);
    archive_entry_free(e);
  }
  EXPECT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  return out;
}

// A hand-made ustar header block: lets a test write what libarchive's writer
// will not (an empty name, a size that lies).
std::vector<std::byte> ustar_header(const std::string& name, uint64_t size, char typeflag = '0') {
  std::vector<char> h(512, 0);
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h.data() + 136, 12, "%011o", 0);
  h[156] = typeflag;
  std::memcpy(h.data() + 257, "ustar", 6);
  std::memcpy(h.data() + 263, "00", 2);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  std::vector<std::byte> out(512);
  std::memcpy(out.data(), h.data(), 512);
  return out;
}

void append(std::vector<std::byte>& to, const std::vector<std::byte>& more) { to.insert(to.end(), more.begin(), more.end()); }

// ---- A file system that fails on request --------------------------------------------

struct Faults {
  uint64_t fail_after_bytes = UINT64_MAX;  // appends beyond this many bytes fail (ENOSPC)
  bool fail_sync = false;
  bool fail_rename = false;
};

class FaultyFile final : public WritableFile {
 public:
  FaultyFile(std::unique_ptr<WritableFile> f, const Faults& faults) : f_(std::move(f)), faults_(faults) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    if (written_ + data.size() > faults_.fail_after_bytes) return Status::IOError("injected: No space left on device");
    written_ += data.size();
    return f_->append(data);
  }
  Status sync() override { return faults_.fail_sync ? Status::IOError("injected: fdatasync failed") : f_->sync(); }
  Status close() override { return f_->close(); }
  void take_access_of(const std::string& original, uint32_t mode_mask) override {
    f_->take_access_of(original, mode_mask);
  }
  bool pace_to_disk() override { return f_->pace_to_disk(); }
  std::optional<uint64_t> disk_waits() const override { return f_->disk_waits(); }

 private:
  std::unique_ptr<WritableFile> f_;
  Faults faults_;
  uint64_t written_ = 0;
};

class FaultyIo final : public Io {
 public:
  explicit FaultyIo(Faults f) : faults_(f) {}
  Result<std::unique_ptr<ReadableFile>> open_read(const std::string& p) override { return real().open_read(p); }
  Result<std::unique_ptr<WritableFile>> open_write(const std::string& p, bool exclusive) override {
    KV_ASSIGN_OR_RETURN(auto f, real().open_write(p, exclusive));
    return std::unique_ptr<WritableFile>(new FaultyFile(std::move(f), faults_));
  }
  Result<std::unique_ptr<WritableFile>> create_owner_only(const std::string& p) override {
    KV_ASSIGN_OR_RETURN(auto f, real().create_owner_only(p));
    return std::unique_ptr<WritableFile>(new FaultyFile(std::move(f), faults_));
  }
  Status rename(const std::string& from, const std::string& to) override {
    return faults_.fail_rename ? Status::IOError("injected: rename failed") : real().rename(from, to);
  }
  Status exchange(const std::string& a, const std::string& b) override {
    return faults_.fail_rename ? Status::IOError("injected: exchange failed") : real().exchange(a, b);
  }
  Status remove(const std::string& p) override { return real().remove(p); }
  Status sync_dir(const std::string& d) override { return real().sync_dir(d); }
  Result<bool> exists(const std::string& p) override { return real().exists(p); }
  Result<std::vector<DirEntry>> list_dir(const std::string& d) override { return real().list_dir(d); }
  Status create_dirs(const std::string& d) override { return real().create_dirs(d); }
  Result<std::unique_ptr<FileLock>> lock_dir(const std::string& d) override { return real().lock_dir(d); }
  Result<FileStamp> stamp(const std::string& p) override { return real().stamp(p); }
  Result<OpenedRegular> open_regular(const std::string& p) override { return real().open_regular(p); }

 private:
  static Io& real() { return posix_io(); }
  Faults faults_;
};

std::string fresh_dir(const std::string& name) {
  auto dir = std::filesystem::path(::testing::TempDir()) / ("kvsnap_archive_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::vector<std::string> dir_names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- Names ---------------------------------------------------------------------

TEST(ArchiveNames, GoodAndBad) {
  for (const std::string& good :
       {std::string("a"), std::string("snap/manifest.json"), std::string("x y"), std::string("a.b/c-d_e"),
        std::string("..."), std::string("a/..b/c.."), std::string(255, 'n')}) {
    EXPECT_TRUE(validate_archive_entry_name(good).ok()) << good;
  }
  const std::pair<std::string, const char*> bad[] = {
      {"", "empty name"},
      {"/etc/passwd", "absolute path"},
      {"..", "'..' component"},
      {"../x", "'..' component"},
      {"a/../../x", "'..' component"},
      {"a/..", "'..' component"},
      {"./a", "'.' component"},
      {"a//b", "empty path component"},
      {"a/", "empty path component"},
      {std::string("a\0b", 3), "NUL"},
      {"a\\b", "backslash"},
      {"a\nb", "control character"},
      {"a\x7f", "control character"},
      {"caf\xc3\xa9", "non-ASCII"},
      {std::string(256, 'n'), "256 bytes long"},
  };
  for (const auto& [name, why] : bad) {
    Status s = validate_archive_entry_name(name);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr(why)) << name;
  }
  // Messages print hostile names safely.
  EXPECT_THAT(validate_archive_entry_name("a\nb\x1b[31m").message(), HasSubstr("'a\\x0ab\\x1b[31m'"));
}

// ---- Round trips ------------------------------------------------------------------

TEST(ArchiveRoundTrip, SeveralEntriesThroughAFile) {
  const std::string dir = fresh_dir("roundtrip");
  const std::string path = dir + "/bundle.tar.zst";
  MemoryFile big("big.bin", pattern((5 << 20) + 123, 1));
  const auto produced = pattern((3 << 20) + 7, 2);
  const auto small = to_bytes("{\"name\": \"snap\"}\n");
  std::vector<ExportEntry> entries;
  entries.push_back(ExportEntry::FromProducer("snap/manifest.json", small.size(),
                                              [&](ByteSink& out) { return out.append(small); }));
  entries.push_back(ExportEntry::FromProducer("snap/empty", 0, [](ByteSink&) { return Status::OK(); }));
  entries.push_back(ExportEntry::FromFile("snap/big.bin", big));
  entries.push_back(ExportEntry::FromProducer("other/produced", produced.size(), [&](ByteSink& out) {
    for (size_t off = 0; off < produced.size(); off += 65536) {
      size_t n = std::min<size_t>(65536, produced.size() - off);
      KV_RETURN_IF_ERROR(out.append(produced.data() + off, n));
    }
    return Status::OK();
  }));
  ArchiveWriteOptions wo;
  wo.piece_bytes = 100'000;
  Status s = export_archive(posix_io(), path, entries, wo);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(dir_names(dir), std::vector<std::string>{"bundle.tar.zst"});  // no temporary left

  auto bytes = read_all(posix_io(), path, 64 << 20);
  ASSERT_TRUE(bytes.ok());
  ASSERT_GE(bytes->size(), 4u);
  EXPECT_EQ((*bytes)[0], std::byte{0x28});  // zstd frame magic 28 b5 2f fd
  EXPECT_EQ((*bytes)[3], std::byte{0xfd});

  Collector c;
  ArchiveReadOptions ro;
  ro.piece_bytes = 256 << 10;
  s = import_archive(posix_io(), path, c, ro);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(c.entries.size(), 4u);
  const std::vector<std::byte>* want[] = {&small, nullptr, nullptr, &produced};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(c.entries[i].name, entries[i].name);
    EXPECT_EQ(c.entries[i].size, entries[i].size);
    EXPECT_TRUE(c.entries[i].ended);
  }
  EXPECT_EQ(c.entries[0].data, *want[0]);
  EXPECT_TRUE(c.entries[1].data.empty());
  EXPECT_TRUE(std::equal(c.entries[2].data.begin(), c.entries[2].data.end(), big.bytes().begin(), big.bytes().end()));
  EXPECT_EQ(c.entries[3].data, *want[3]);
  EXPECT_LE(c.largest_piece, ro.piece_bytes);
  EXPECT_GT(c.largest_piece, 0u);
}

TEST(ArchiveRoundTrip, EmptyArchive) {
  VectorSink sink;
  ASSERT_TRUE(write_archive(sink, {}).ok());
  Collector c;
  Status s = read_bytes(sink.bytes, "empty.tar.zst", c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(c.entries.empty());
}

std::vector<std::byte> export_to_memory(const std::vector<ExportEntry>& entries, const ArchiveWriteOptions& o = {}) {
  VectorSink sink;
  Status s = write_archive(sink, entries, o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return sink.bytes;
}

TEST(ArchiveRoundTrip, DeterministicBytes) {
  MemoryFile a("a", pattern(300'000, 3));
  MemoryFile b("b", to_bytes(std::string(70'000, 'z')));
  const std::string long_name = std::string(120, 'd') + "/" + std::string(100, 'f');  // needs a pax header
  std::vector<ExportEntry> entries = {ExportEntry::FromFile("a", a), ExportEntry::FromFile(long_name, b)};
  auto first = export_to_memory(entries);
  auto second = export_to_memory(entries);
  EXPECT_EQ(first, second);
  ArchiveWriteOptions later;
  later.mtime = 1700000000;
  EXPECT_NE(export_to_memory(entries, later), first);
  EXPECT_EQ(export_to_memory(entries, later), export_to_memory(entries, later));

  // And via files, twice, with different temporary names.
  const std::string dir = fresh_dir("deterministic");
  ASSERT_TRUE(export_archive(posix_io(), dir + "/1.tar.zst", entries).ok());
  ASSERT_TRUE(export_archive(posix_io(), dir + "/2.tar.zst", entries).ok());
  auto f1 = read_all(posix_io(), dir + "/1.tar.zst", 1 << 20);
  auto f2 = read_all(posix_io(), dir + "/2.tar.zst", 1 << 20);
  ASSERT_TRUE(f1.ok() && f2.ok());
  EXPECT_EQ(*f1, first);
  EXPECT_EQ(*f2, first);

  Collector c;
  ASSERT_TRUE(read_bytes(first, "det.tar.zst", c).ok());
  ASSERT_EQ(c.entries.size(), 2u);
  EXPECT_EQ(c.entries[1].name, long_name);
}

TEST(ArchiveRead, AcceptsTarGzXzZstAndDirectories) {
  const std::vector<Raw> entries = {{"d/", AE_IFDIR, {}, "", ""},
                                    {"d/f", AE_IFREG, pattern(40'000, 4), "", ""},
                                    {"g", AE_IFREG, {}, "", ""}};
  for (Filter f : {Filter::kNone, Filter::kGzip, Filter::kXz, Filter::kZstd}) {
    Collector c;
    Status s = read_bytes(build(entries, f), "in.tar", c);
    ASSERT_TRUE(s.ok()) << int(f) << ": " << s.ToString();
    ASSERT_EQ(c.entries.size(), 2u);  // the directory is skipped
    EXPECT_EQ(c.entries[0].name, "d/f");
    EXPECT_EQ(c.entries[0].data, entries[1].data);
    EXPECT_EQ(c.entries[1].name, "g");
    EXPECT_TRUE(c.entries[1].ended);
  }
}

// ---- Export failures -----------------------------------------------------------

TEST(ArchiveExport, RefusesBadEntriesWithoutCreatingAFile) {
  const std::string dir = fresh_dir("bad_entries");
  const std::string path = dir + "/out.tar.zst";
  MemoryFile f("f", pattern(10, 5));
  auto ok = [](ByteSink&) { return Status::OK(); };
  auto three = [](ByteSink& out) { return out.append("abc", 3); };
  struct Case {
    std::vector<ExportEntry> entries;
    const char* why;
  };
  Case cases[] = {
      {{ExportEntry::FromProducer("../x", 0, ok)}, "'..' component"},
      {{ExportEntry::FromProducer("/abs", 0, ok)}, "absolute path"},
      {{ExportEntry::FromProducer("a", 0, ok), ExportEntry::FromProducer("a", 0, ok)}, "appears twice"},
      {{ExportEntry{"a", 10, nullptr, nullptr, nullptr}}, "neither a file nor a producer"},
      {{ExportEntry{"a", 11, &f, nullptr, nullptr}}, "declared 11 bytes"},
      {{ExportEntry::FromProducer("a", 2, three)}, "more bytes than the declared 2"},
      {{ExportEntry::FromProducer("a", 4, three)}, "gave 3 of the declared 4"},
  };
  for (const Case& c : cases) {
    Status s = export_archive(posix_io(), path, c.entries);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(c.why));
    EXPECT_TRUE(dir_names(dir).empty()) << c.why;
  }
  ArchiveWriteOptions bad_level;
  bad_level.zstd_level = 40;
  EXPECT_EQ(export_archive(posix_io(), path, {}, bad_level).code(), Code::kInvalidArgument);
  EXPECT_TRUE(dir_names(dir).empty());
}

TEST(ArchiveExport, FailedWriteLeavesNoFileAndKeepsTheOldOne) {
  MemoryFile big("big", pattern(2 << 20, 6));  // incompressible: the output is > 2 MiB
  std::vector<ExportEntry> entries = {ExportEntry::FromFile("big", big)};
  Faults enospc_early{4096, false, false};
  Faults enospc_late{(2 << 20) - 1000, false, false};  // fails in the final flush
  Faults sync{UINT64_MAX, true, false};
  Faults rename{UINT64_MAX, false, true};
  for (const Faults& faults : {enospc_early, enospc_late, sync, rename}) {
    const std::string dir = fresh_dir("faults");
    FaultyIo io(faults);
    Status s = export_archive(io, dir + "/out.tar.zst", entries);
    EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("injected"));
    EXPECT_TRUE(dir_names(dir).empty()) << s.ToString();

    // An existing file survives a failed export untouched.
    const auto old = to_bytes("old contents");
    MemoryFile oldf("old", old);
    ASSERT_TRUE(export_archive(posix_io(), dir + "/out.tar.zst", std::vector<ExportEntry>{ExportEntry::FromFile("old", oldf)}).ok());
    auto before = read_all(posix_io(), dir + "/out.tar.zst", 1 << 20);
    EXPECT_FALSE(export_archive(io, dir + "/out.tar.zst", entries).ok());
    auto after = read_all(posix_io(), dir + "/out.tar.zst", 1 << 20);
    ASSERT_TRUE(before.ok() && after.ok());
    EXPECT_EQ(*before, *after);
    EXPECT_EQ(dir_names(dir), std::vector<std::string>{"out.tar.zst"});
  }
}

TEST(ArchiveExport, ProducerErrorIsReturnedUnchangedAndLeavesNoFile) {
  const std::string dir = fresh_dir("producer_error");
  auto half_then_fail = [](ByteSink& out) {
    KV_RETURN_IF_ERROR(out.append(std::string(5000, 'x').data(), 5000));
    return Status::NotFound("chunk ab12 is missing");
  };
  Status s = export_archive(posix_io(), dir + "/out.tar.zst",
                            std::vector<ExportEntry>{ExportEntry::FromProducer("s", 10000, half_then_fail)});
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), "chunk ab12 is missing");
  EXPECT_TRUE(dir_names(dir).empty());
}

// ---- Hostile archives -------------------------------------------------------------

struct Refusal {
  Code code;
  std::string text;
};

// Reads `bytes` named `name` and checks the refusal: its code, its words, and
// that it names the archive.
void expect_refused(const std::vector<std::byte>& bytes, const std::string& name, const Refusal& want,
                    const ArchiveReadOptions& o = {}) {
  Collector c;
  Status s = read_bytes(bytes, name, c, o);
  ASSERT_FALSE(s.ok()) << name << " was accepted";
  EXPECT_EQ(s.code(), want.code) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(want.text));
  EXPECT_THAT(s.message(), HasSubstr(name));
}

TEST(ArchiveHostile, UnsafeNames) {
  const std::pair<std::string, const char*> cases[] = {
      {"/etc/passwd", "entry 1 '/etc/passwd': absolute path"},
      {"../x", "entry 1 '../x': name has a '..' component"},
      {"a/../../x", "entry 1 'a/../../x': name has a '..' component"},
      {"./x", "'.' component"},
      {"a\\b", "backslash"},
      {"a\x01" "b", "entry 1 'a\\x01b': name contains a control character"},
      {"caf\xc3\xa9", "non-ASCII"},
      {std::string(300, 'n'), "300 bytes long"},
  };
  for (const auto& [name, why] : cases) {
    expect_refused(build({{"ok", AE_IFREG, {}, "", ""}, {name, AE_IFREG, pattern(10, 7), "", ""}}), "names.tar",
                   {Code::kNotSupported, "names.tar: entry 2 "});
    Collector c;
    Status s = read_bytes(build({{name, AE_IFREG, pattern(10, 7), "", ""}}), "names.tar", c);
    EXPECT_EQ(s.code(), Code::kNotSupported) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(why));
    EXPECT_TRUE(c.entries.empty());
  }
  // A directory named "../" is refused like a file.
  expect_refused(build({{"../", AE_IFDIR, {}, "", ""}}), "dir.tar", {Code::kNotSupported, "'..' component"});
  // An empty name, which libarchive's writer will not produce.
  auto raw = ustar_header("", 0);
  append(raw, std::vector<std::byte>(1024));
  expect_refused(raw, "empty-name.tar", {Code::kNotSupported, "entry 1 '': empty name"});
}

TEST(ArchiveHostile, LinksDevicesAndFifos) {
  const std::pair<Raw, const char*> cases[] = {
      {{"link", AE_IFLNK, {}, "/etc/passwd", ""}, "entry 2 'link': a symbolic link to '/etc/passwd'"},
      {{"hard", AE_IFREG, {}, "", "ok"}, "entry 2 'hard': a hard link to 'ok'"},
      {{"tty", AE_IFCHR, {}, "", ""}, "entry 2 'tty': a character device"},
      {{"disk", AE_IFBLK, {}, "", ""}, "entry 2 'disk': a block device"},
      {{"pipe", AE_IFIFO, {}, "", ""}, "entry 2 'pipe': a fifo"},
  };
  for (const auto& [raw, why] : cases) {
    expect_refused(build({{"ok", AE_IFREG, pattern(5, 8), "", ""}, raw}), "links.tar",
                   {Code::kNotSupported, why});
  }
}

TEST(ArchiveHostile, SparseFilesAndHugeSpecialHeaders) {
  std::vector<std::byte> sparse;
  {
    struct archive* a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_open(a, &sparse, nullptr, append_cb, nullptr);
    struct archive_entry* e = archive_entry_new();
    archive_entry_copy_pathname(e, "holes");
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_size(e, 1 << 20);
    archive_entry_sparse_add_entry(e, 0, 512);
    archive_entry_sparse_add_entry(e, 1 << 19, 512);
    ASSERT_EQ(archive_write_header(a, e), ARCHIVE_OK);
    const auto data = pattern(512, 30);
    archive_write_data(a, data.data(), data.size());
    archive_write_data(a, data.data(), data.size());
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
  }
  expect_refused(sparse, "sparse.tar", {Code::kNotSupported, "entry 1 'holes': a sparse file"});
  // pax extended (x), pax global (g), GNU long name (L) and long link (K)
  // headers that claim 8 GiB: refused by libarchive's own 1 MiB limit.
  for (char type : {'x', 'g', 'L', 'K'}) {
    auto raw = ustar_header("hdr", uint64_t{1} << 33, type);
    append(raw, std::vector<std::byte>(2048));
    expect_refused(raw, "special.tar", {Code::kCorruption, "Special header too large"});
  }
}

TEST(ArchiveHostile, HeaderSizeLies) {
  // Says 100000 bytes, holds 1000 and then the archive ends.
  auto longer = ustar_header("x", 100000);
  append(longer, pattern(1024, 9));
  {
    Collector c;
    Status s = read_bytes(longer, "lies.tar", c);
    EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("lies.tar: entry 1 'x': truncated or damaged in its"));
    ASSERT_EQ(c.entries.size(), 1u);
    EXPECT_FALSE(c.entries[0].ended);  // the partial entry is never completed
  }
  // Says 10 bytes, holds 1000: the rest is read as a header and is garbage.
  auto shorter = ustar_header("x", 10);
  append(shorter, pattern(1024, 10));
  append(shorter, std::vector<std::byte>(1024));
  expect_refused(shorter, "short.tar", {Code::kCorruption, "damaged archive after entry 1 'x'"});

  // A real archive cut in the middle of an entry's data.
  auto whole = build({{"a", AE_IFREG, pattern(5000, 11), "", ""}});
  whole.resize(512 + 3000);
  expect_refused(whole, "cut.tar", {Code::kCorruption, "entry 1 'a': truncated or damaged in its"});
}

TEST(ArchiveHostile, TarCutAtAnEntryBoundary) {
  auto whole = build({{"a", AE_IFREG, pattern(600, 12), "", ""}, {"b", AE_IFREG, pattern(600, 13), "", ""}});
  // libarchive reads these as complete archives; kvsnap wants the end block.
  for (size_t cut : {size_t{512 + 1024}, size_t{2 * (512 + 1024)}}) {
    std::vector<std::byte> prefix(whole.begin(), whole.begin() + cut);
    expect_refused(prefix, "boundary.tar", {Code::kCorruption, "without the tar end-of-archive block"});
  }
  // A lone zero block is enough (GNU tar writes two, accepts one).
  std::vector<std::byte> one_block(whole.begin(), whole.begin() + 2 * (512 + 1024) + 512);
  Collector c;
  EXPECT_TRUE(read_bytes(one_block, "one.tar", c).ok());
}

TEST(ArchiveHostile, DecompressionBomb) {
  const auto bomb = build({{"zeros", AE_IFREG, std::vector<std::byte>(16 << 20), "", ""}}, Filter::kGzip);
  ASSERT_LT(bomb.size(), 64u << 10);  // gzip's ratio on zeros is about 1000
  ArchiveReadOptions o;
  o.max_ratio = 100;
  o.ratio_floor_bytes = 1 << 20;
  expect_refused(bomb, "bomb.tar.gz", {Code::kNotSupported, "decompression bomb"}, o);
  // The same archive within the default floor (64 MiB) is fine.
  Collector c;
  EXPECT_TRUE(read_bytes(bomb, "bomb.tar.gz", c).ok());
  // And 0 disables the guard.
  o.max_ratio = 0;
  EXPECT_TRUE(read_bytes(bomb, "bomb.tar.gz", c, o).ok());
}

// A directory entry with data: libarchive skips (decompresses) it unasked and uncounted, so an
// 8 GiB one in a 458 KB .tar.zst passed the ratio guard and the caps (41 s of CPU, exit 0).
TEST(ArchiveHostile, ADirectoryWithDataIsRefused) {
  // Its size in a pax record (as a size past ustar's 8 GiB must be): libarchive ignores a
  // directory's ustar size field, not a pax one.
  const std::string record = "16 size=1048576\n";
  std::vector<std::byte> tar = ustar_header("PaxHeaders/d", record.size(), 'x');
  std::vector<std::byte> pax(512);
  std::memcpy(pax.data(), record.data(), record.size());
  append(tar, pax);
  append(tar, ustar_header("d/", 0, '5'));
  append(tar, std::vector<std::byte>(1 << 20));
  append(tar, std::vector<std::byte>(1024));  // the end-of-archive blocks
  expect_refused(tar, "dirdata.tar", {Code::kNotSupported, "entry 1 'd/': a directory with 1048576 bytes of data"});
  // An empty one is fine.
  std::vector<std::byte> empty = ustar_header("d/", 0, '5');
  append(empty, std::vector<std::byte>(1024));
  Collector c;
  EXPECT_TRUE(read_bytes(empty, "dir.tar", c).ok());
}

TEST(ArchiveHostile, Caps) {
  std::vector<Raw> many;
  for (int i = 0; i < 11; ++i) many.push_back({"e" + std::to_string(i), AE_IFREG, {}, "", ""});
  ArchiveReadOptions o;
  o.max_entries = 10;
  expect_refused(build(many), "many.tar", {Code::kNotSupported, "entry 11 'e10': more than 10 entries"}, o);
  many.pop_back();
  Collector c;
  EXPECT_TRUE(read_bytes(build(many), "ten.tar", c, o).ok());

  ArchiveReadOptions small;
  small.max_entry_bytes = 1024;
  small.max_total_bytes = 1500;
  {
    Collector c2;
    Status s = read_bytes(build({{"big", AE_IFREG, pattern(2048, 14), "", ""}}), "big.tar", c2, small);
    EXPECT_EQ(s.code(), Code::kNotSupported);
    EXPECT_THAT(s.message(), HasSubstr("big.tar: entry 1 'big': 2048 bytes, more than the 1024 allowed per entry"));
    EXPECT_TRUE(c2.entries.empty());  // refused before any byte
  }
  expect_refused(build({{"a", AE_IFREG, pattern(1000, 15), "", ""}, {"b", AE_IFREG, pattern(1000, 16), "", ""}}),
                 "total.tar", {Code::kNotSupported, "entry 2 'b': brings the archive over the 1500 bytes"}, small);
}

TEST(ArchiveHostile, DuplicateNames) {
  expect_refused(build({{"a", AE_IFREG, pattern(3, 17), "", ""}, {"a", AE_IFREG, pattern(3, 18), "", ""}}),
                 "dup.tar", {Code::kNotSupported, "entry 2 'a': the name appears twice"});
}

TEST(ArchiveHostile, NotArchives) {
  expect_refused({}, "empty.tar.zst", {Code::kCorruption, "empty.tar.zst: empty file, not an archive"});
  expect_refused(pattern(4096, 19), "garbage.tar", {Code::kCorruption, "not a readable tar archive"});
  expect_refused(to_bytes("hello\n"), "text.tar", {Code::kCorruption, "not a readable tar archive"});
  expect_refused(build({{"a", AE_IFREG, pattern(100, 20), "", ""}}, Filter::kBzip2), "a.tar.bz2",
                 {Code::kCorruption, "not a readable tar archive"});
  expect_refused(build({{"a", AE_IFREG, pattern(100, 21), "", ""}}, Filter::kGzipInZstd), "nested.tar.gz.zst",
                 {Code::kNotSupported, "nested compression"});
  // A zip file is not a tar.
  std::vector<std::byte> zip;
  {
    struct archive* a = archive_write_new();
    archive_write_set_format_zip(a);
    archive_write_open(a, &zip, nullptr, append_cb, nullptr);
    struct archive_entry* e = archive_entry_new();
    archive_entry_copy_pathname(e, "a");
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_size(e, 0);
    archive_write_header(a, e);
    archive_entry_free(e);
    archive_write_close(a);
    archive_write_free(a);
  }
  expect_refused(zip, "a.zip", {Code::kCorruption, "not a readable tar archive"});
}

TEST(ArchiveHostile, TruncatedZstdAtManyPrefixes) {
  MemoryFile a("a", pattern(300'000, 22));
  MemoryFile b("b", pattern(1000, 23));
  const auto whole = export_to_memory({ExportEntry::FromFile("a", a), ExportEntry::FromFile("b", b)});
  std::vector<size_t> cuts = {1, 3, 4, 10, 100, 512, whole.size() / 3, whole.size() / 2, whole.size() - 100,
                              whole.size() - 10, whole.size() - 1};
  for (size_t cut = 0; cut < whole.size(); cut += 997) cuts.push_back(cut + 1);
  for (size_t cut : cuts) {
    if (cut == 0 || cut >= whole.size()) continue;
    std::vector<std::byte> prefix(whole.begin(), whole.begin() + cut);
    Collector c;
    Status s = read_bytes(prefix, "cut.tar.zst", c);
    EXPECT_EQ(s.code(), Code::kCorruption) << "cut at " << cut << ": " << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("cut.tar.zst"));
    for (const Got& g : c.entries) {  // what was completed is exact
      if (!g.ended) continue;
      EXPECT_EQ(g.data.size(), g.size);
    }
  }
}

TEST(ArchiveHostile, VisitorErrorStopsTheWalk) {
  class Refuser final : public ArchiveVisitor {
   public:
    Status begin_entry(const ArchiveEntryInfo& info) override {
      ++seen;
      return info.name == "b" ? Status::Mismatch("store says no") : Status::OK();
    }
    Status entry_data(std::span<const std::byte>) override { return Status::OK(); }
    Status end_entry() override { return Status::OK(); }
    int seen = 0;
  } v;
  auto bytes = build({{"a", AE_IFREG, {}, "", ""}, {"b", AE_IFREG, {}, "", ""}, {"c", AE_IFREG, {}, "", ""}});
  MemoryFile f("v.tar", bytes);
  Status s = read_archive(f, v);
  EXPECT_EQ(s.code(), Code::kMismatch);
  EXPECT_EQ(s.message(), "store says no");
  EXPECT_EQ(v.seen, 2);
}

TEST(ArchiveHostile, ReadErrorIsReturnedAsIs) {
  class Failing final : public ReadableFile {
   public:
    explicit Failing(std::vector<std::byte> b) : inner_("failing.tar.zst", std::move(b)) {}
    uint64_t size() const override { return inner_.size(); }
    const std::string& name() const override { return inner_.name(); }
    Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
      if (offset > 0) return Status::IOError("failing.tar.zst: injected: read error");
      return inner_.read_at(offset, dst);
    }

   private:
    MemoryFile inner_;
  };
  MemoryFile big("big", pattern(1 << 20, 31));  // more than one 64 KiB read
  Failing f(export_to_memory({ExportEntry::FromFile("big", big)}));
  Collector c;
  Status s = read_archive(f, c);
  EXPECT_EQ(s.code(), Code::kIOError) << s.ToString();
  EXPECT_EQ(s.message(), "failing.tar.zst: injected: read error");
}

TEST(ArchiveHostile, MissingFile) {
  Collector c;
  Status s = import_archive(posix_io(), fresh_dir("missing") + "/nope.tar.zst", c);
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("nope.tar.zst"));
}

}  // namespace
}  // namespace kvsnap
