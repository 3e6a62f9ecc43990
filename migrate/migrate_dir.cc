#include "migrate/migrate_dir.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <new>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "base/byte_order.h"
#include "base/os.h"
#include "base/parallel.h"
#include "base/stale_temps.h"
#include "format/ggml_types.h"
#include "format/llama_era.h"
#include "format/state_summary.h"
#include "migrate/convert_state.h"

namespace kvsnap {

namespace {

// Whether any K or V layer of `s` is of a quantized type (the ones llama.cpp rotates).
bool holds_quantized_kv(const StateFile& s) {
  for (const KvSection& sec : s.memory.kv)
    for (const KvStream& st : sec.streams)
      for (const KvLayer& l : st.layers) {
        const TypeLayout* k = find_type(l.k_type);
        const TypeLayout* v = find_type(l.v_type);
        if ((k && k->quantized) || (l.has_v && v && v->quantized)) return true;
      }
  return false;
}


using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Emits zeros of each target tensor's size: the exact output size without converting.
class ZeroTensorSource final : public TensorSource {
 public:
  Status emit(const StateFile& t, const TensorRef& ref, ByteSink& out) override {
    const KvLayer& L = t.memory.kv.at(ref.section).streams.at(ref.stream).layers.at(ref.layer);
    uint64_t n = ref.is_v ? L.v.size : L.k.size;
    static const std::vector<std::byte> zeros(1 << 20);
    while (n > 0) {
      const uint64_t k = std::min<uint64_t>(n, zeros.size());
      KV_RETURN_IF_ERROR(out.append(std::span<const std::byte>(zeros.data(), k)));
      n -= k;
    }
    return Status::OK();
  }
};

bool same_layout(const StateFile& a, const StateFile& b) {
  if (a.kind != b.kind || a.version != b.version || a.raw_seq_tagged != b.raw_seq_tagged) return false;
  if (a.memory.kv.size() != b.memory.kv.size()) return false;
  for (size_t s = 0; s < a.memory.kv.size(); ++s) {
    const KvSection &x = a.memory.kv[s], &y = b.memory.kv[s];
    if (x.stream_prefix != y.stream_prefix || x.ext_bytes != y.ext_bytes || x.streams.size() != y.streams.size())
      return false;
    for (size_t i = 0; i < x.streams.size(); ++i) {
      const KvStream &p = x.streams[i], &q = y.streams[i];
      if (p.cell_count != q.cell_count || (p.cell_count && p.v_trans != q.v_trans)) return false;
      for (size_t l = 0; l < p.layers.size() && l < q.layers.size(); ++l) {
        const KvLayer &m = p.layers[l], &n = q.layers[l];
        if (m.k_type != n.k_type || m.k_row_bytes != n.k_row_bytes) return false;
        if (m.has_v && (m.v_type != n.v_type || m.v_row_bytes != n.v_row_bytes || m.v_elem_bytes != n.v_elem_bytes))
          return false;
      }
    }
  }
  return true;
}

// Compares what is appended with `file`'s bytes from its start; the first difference stops the
// writer (an error it returns), so a file that is not at the target is seldom read far.
class MatchesFileSink final : public ByteSink {
 public:
  explicit MatchesFileSink(const ReadableFile& file) : file_(file) {}
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override {
    while (!data.empty()) {
      const size_t n = std::min<size_t>(data.size(), size_t(1) << 20);
      if (n > file_.size() - pos_) return differ();
      buf_.resize(n);
      KV_RETURN_IF_ERROR(file_.read_at(pos_, buf_));
      if (std::memcmp(buf_.data(), data.data(), n) != 0) return differ();
      pos_ += n;
      data = data.subspan(n);
    }
    return Status::OK();
  }
  bool differs() const { return differs_; }
  bool matched() const { return !differs_ && pos_ == file_.size(); }

 private:
  Status differ() {
    differs_ = true;
    return Status::Mismatch(file_.name() + ": differs from its conversion");
  }
  const ReadableFile& file_;
  uint64_t pos_ = 0;
  bool differs_ = false;
  std::vector<std::byte> buf_;
};

bool has_state_magic(const ReadableFile& f) {
  std::byte head[4];
  if (f.size() < 4 || !f.read_at(0, head).ok()) return false;
  const uint32_t magic = load_le<uint32_t>(head);
  return magic == kMagicGgsq || magic == kMagicGgsn;
}

class Migrator {
 public:
  Migrator(Io& io, const MigrateOptions& o) : io_(io), o_(o) {}

  // Decides from the file's header and layout alone whether it needs converting: an outcome with
  // `needs_conversion` set, or a final one (not a state file, already at the target, failed).
  FileOutcome examine_one(const std::string& name) {
    return timed(name, [&](FileOutcome& r) {
      Examined e;
      return examine(o_.dir + "/" + name, r, e);
    });
  }

  FileOutcome run_one(const std::string& name) {
    return timed(name, [&](FileOutcome& r) { return convert_one(o_.dir + "/" + name, r); });
  }
  // The Io said stop (Ctrl-C): no further file is started.
  bool interrupted() const { return interrupted_.load(); }
  bool plain_renames() const { return plain_renames_.load(); }

 private:
  struct Examined {
    std::unique_ptr<ReadableFile> file;
    std::optional<FileStamp> stamp;  // the file as it was opened (nullopt: this Io has no stamps)
    StateFile src, target;
    ConvertRequest req;
  };

  template <class Step>
  FileOutcome timed(const std::string& name, Step step) {
    FileOutcome r;
    r.name = name;
    const auto t0 = Clock::now();
    Status s = [&]() -> Status {
      try {  // one file's failure is that file's: the others are still converted
        return step(r);
      } catch (const std::bad_alloc&) {
        return Status::IOError(o_.dir + "/" + name + ": out of memory");
      } catch (const std::exception& e) {
        return Status::IOError(o_.dir + "/" + name + ": " + e.what());
      }
    }();
    if (s.code() == Code::kInterrupted) interrupted_.store(true);
    if (!s.ok()) {
      r.action = FileAction::kFailed;
      r.detail = s.ToString();
      r.error = s;
    }
    r.seconds = since(t0);
    return r;
  }

  Status examine(const std::string& path, FileOutcome& r, Examined& e) {
    return with_rerun_hint(examine_file(path, r, e), o_.spec);
  }

  Status examine_file(const std::string& path, FileOutcome& r, Examined& e) {
    // The listing said a regular file; by now it may be a symlink out of DIR or a FIFO (swapped
    // meanwhile): neither is followed or waited on.
    KV_ASSIGN_OR_RETURN(OpenedRegular opened, io_.open_regular(path));
    if (!opened.file) {
      r.action = opened.symlink ? FileAction::kSkippedLink : FileAction::kSkippedOther;
      r.detail = opened.not_regular + " by now (a regular file when the directory was listed): not followed or read";
      return Status::OK();
    }
    e.file = std::move(opened.file);
    e.stamp = opened.stamp;
    r.bytes_before = e.file->size();
    ParseOptions po;
    po.v9_outputs = v9_outputs_of_build(o_.spec.source_build);  // migrate --source-build
    auto parsed = parse_for_model(*e.file, po, o_.model);
    if (!parsed.ok()) {
      // A file with a state magic that does not parse is a damaged state (an error);
      // anything else in the directory is simply not ours.
      if (!has_state_magic(*e.file) &&
          (parsed.status().code() == Code::kCorruption || parsed.status().code() == Code::kNotSupported)) {
        r.action = FileAction::kNotState;
        r.detail = parsed.status().message();
        return Status::OK();
      }
      // Read while a server saved it: not damaged, only not whole yet (a review's finding: exit 3).
      if (!check_unchanged(path, path, e.stamp, false).ok())
        return Status::IOError(path + ": changed while kvsnap read it (did a llama-server save this slot?): " +
                               parsed.status().message() + "; left as it is; migrate the directory while no server "
                               "writes to it");
      return parsed.status();
    }
    e.src = std::move(*parsed);
    r.from = describe_state(e.src);
    KV_RETURN_IF_ERROR(check_format_kind(path, e.src));
    // --source-build and --src-rotation name the build and the rotation of the old files; a file
    // already in the current format was converted by an earlier (interrupted) run or written by a
    // current build, and is read as its format says (rotated). The one exception is a declared
    // `--src-rotation off` for such a file holding quantized K/V: a current server run with
    // LLAMA_ATTN_ROT_DISABLE=1 writes those, and so does nothing kvsnap writes here, so the file is
    // refused rather than read either way (convert it alone, where the declaration is the user's).
    ConversionSpec spec = o_.spec;
    if (era_of_file(e.src, std::nullopt).rotates == Tri::kYes && e.src.version >= 3) {
      if (spec.src_rotation == "off" && holds_quantized_kv(e.src)) {
        return Status::Ambiguous(
            path + ": {--src-rotation off} describes the old-format files, and this one is in the current format with "
                   "quantized K/V: written rotated by a current llama.cpp or by an earlier migrate, unrotated only by a "
                   "server run with LLAMA_ATTN_ROT_DISABLE=1. Migrate it without {--src-rotation} (to finish an "
                   "interrupted migrate, name the old files' build with {--source-build} instead, e.g. b8121: it "
                   "describes only old-format files), or, if that server wrote it, `kvsnap convert` it with "
                   "{--src-rotation off} into another directory");
      }
      spec.source_build.clear();
      spec.src_rotation.clear();
    }
    KV_ASSIGN_OR_RETURN(e.req, make_request(spec, e.src, o_.model, path, nullptr, e.file.get()));
    KV_ASSIGN_OR_RETURN(e.target, plan_target(e.src, e.req));
    r.to = describe_state(e.target);
    // Without the model, make_request refuses an upgrade to the v0.5.0 format (the M-RoPE cell extra).
    const bool same = same_layout(e.src, e.target);
    // A current-format output is read as rotated by any later run (above), whatever the flags.
    const bool header_proves_rotation = era_of_file(e.target, std::nullopt).rotates == Tri::kYes && e.target.version >= 3;
    if (same || (e.src.kind == e.target.kind && e.src.version == e.target.version && !header_proves_rotation &&
                 holds_quantized_kv(e.target))) {
      // The values change their rotation and the header does not show it (the same format
      // version): a converted file would look like an original to the next run with the same
      // flags, which would read its quantized K/V with the originals' rotation (a silently wrong
      // cache). Not done in place.
      KV_ASSIGN_OR_RETURN(const bool rotates, rotates_values(e.src, e.target, e.req));
      if (rotates && same) {
        return Status::NotSupported(
            path + ": its quantized K/V must be Hadamard-rotated (or un-rotated) for the target, but the converted "
                   "file would have the same header (format, types, layout) as this one, so a later or interrupted "
                   "migrate could not tell them apart and would rotate it again. migrate converts in place only what "
                   "the header shows; convert this file with `kvsnap convert` into another directory, then move it in");
      }
      if (rotates) {
        return Status::NotSupported(
            path + ": the converted file would hold quantized K/V " +
            (e.req.dst_rotates.value_or(false) ? "rotated" : "not rotated") + " in the same format version as this one (v" +
            std::to_string(e.src.version) + "), whose header does not show the rotation, so a later or "
            "interrupted migrate with the same {--source-build}/{--src-rotation} would read it as an original and "
            "decode it wrongly. migrate converts in place only what the header shows; convert this file with `kvsnap "
            "convert` into another directory, then move it in");
      }
    }
    if (same) {
      KV_ASSIGN_OR_RETURN(const bool at_target, converts_to_itself(e));
      if (at_target) {
        r.action = FileAction::kAtTarget;
        r.bytes_after = r.bytes_before;
        return Status::OK();
      }
    }
    r.needs_conversion = true;
    return Status::OK();
  }

  // A {--format} of the other kind of file (a ggsq format for a session, a ggsn one for a slot):
  // said with what a directory holding both kinds needs, where convert_state would only say the
  // kinds differ.
  Status check_format_kind(const std::string& path, const StateFile& src) const {
    if (o_.spec.format.empty() || (src.kind != StateKind::kSeqFile && src.kind != StateKind::kSessionFile))
      return Status::OK();
    auto fmt = parse_target_format(o_.spec.format);
    if (!fmt.ok()) return Status::OK();  // the flag's own check says it
    for (const TargetFormatRow& row : kTargetFormats) {
      if (row.format != *fmt || !row.kind || *row.kind == src.kind) continue;
      return Status::InvalidArgument(
          path + ": {--format} " + o_.spec.format + " is a format for a " + kind_name(*row.kind) + ", and this is a " +
          kind_name(src.kind) + ": left as it is. One {--format} fits one kind of file; " +
          (o_.spec.target_build.empty()
               ? std::string("for a directory of both, {--target-build} BUILD (the llama.cpp build that will load "
                             "them) gives each file its kind's format")
               : "drop {--format}: {--target-build} " + o_.spec.target_build + " gives each file its kind's format"));
    }
    return Status::OK();
  }

  // An old-format file whose rotation is unknown, in a run that writes old-format files for
  // {--target-build}: it may be an earlier, interrupted run's output, which that build's name
  // reads (the flag describes only old-format files; current-format ones go by their header).
  Status with_rerun_hint(const Status& s, const ConversionSpec& spec) const {
    if (s.code() != Code::kAmbiguous || spec.target_build.empty() || !spec.source_build.empty()) return s;
    return Status::Ambiguous(s.message() + ". If an earlier, interrupted run of this migrate wrote it ({--target-build} " +
                             spec.target_build + " writes this format), it is that build's: add {--source-build} " +
                             spec.target_build);
  }

  // Whether the file is byte for byte what its conversion would write. The same header, types
  // and layout (same_layout) do not make it so: a session's outputs, the seq ids of ggsq cells and
  // M-RoPE cell extras differ between builds of one version, and a file a target build cannot
  // load was reported at the target. Only asked when the layout is the same, and a difference
  // stops at the first byte, so a file already at the target is the one read in full.
  Result<bool> converts_to_itself(const Examined& e) {
    MatchesFileSink same(*e.file);
    auto converted = convert_state(e.src, *e.file, e.req, same);
    if (same.differs()) return false;
    KV_RETURN_IF_ERROR(converted.status());
    return same.matched();
  }

  // A server that saves its slot while the file is converted writes a newer conversation (or, in
  // place, mixes it into the bytes read): the conversion of the older one must not replace it.
  // `moved`: the original was renamed meanwhile (AtomicFileWriter::publish_if_unchanged), which
  // changes its ctime but not what a writer changes (its size and mtime; a new file, its inode).
  Status check_unchanged(const std::string& path, const std::string& now_at, const std::optional<FileStamp>& before,
                         bool moved) {
    if (!before) return Status::OK();
    auto now = io_.stamp(now_at);
    // A hard link of the file renamed or removed meanwhile (another name this migrate converted)
    // changes its link count and ctime, not its bytes, size or mtime; with --jobs > 1 the
    // sibling's exchange changes the ctime before its removal lowers the count (a review's
    // finding: "changed while kvsnap converted it" on 5 of 60 runs over 8 names of one file), so a
    // file with several names is judged by its size, mtime and inode alone.
    if (now.ok() && (moved || before->links > 1 || now->links != before->links)) {
      now->ctime_ns = before->ctime_ns;
      now->links = before->links;
    }
    if (now.ok() && *now == *before) return Status::OK();
    return Status::IOError(path + ": changed while kvsnap converted it (did a llama-server save this slot?): left "
                           "as it is now; migrate the directory while no server writes to it");
  }

  Status convert_one(const std::string& path, FileOutcome& r) {
    Examined e;
    KV_RETURN_IF_ERROR(examine(path, r, e));
    if (!r.needs_conversion) return Status::OK();
    // Its conversion is a new file, which would be kvsnap's user's: a server running as the file's
    // owner might then save it no more, or not even read it (a review's finding: "converted 2",
    // exit 0, and every later save of the server failed).
    if (e.stamp && e.stamp->replacement_changes_owner)
      return Status::IOError(path + ": owned by user id " + std::to_string(e.stamp->owner) +
                             ", not by kvsnap's user: its conversion would belong to kvsnap's user, which the "
                             "server's user may not be able to save over or read; run kvsnap migrate as the file's "
                             "owner (the server's user) or as root, which keeps each file's owner");
    if (o_.dry_run) {
      CountingSink count;
      ZeroTensorSource zeros;
      KV_RETURN_IF_ERROR(write_state(e.target, zeros, *e.file, count));
      r.bytes_after = count.count;
      r.action = FileAction::kWouldConvert;
      return Status::OK();
    }
    if (!o_.backup) return convert_and_publish(path, e, r);
    Status backed_up = o_.backup(path, *e.file, e.src).Prefixed("backing up " + path);
    Status s = backed_up.ok() ? convert_and_publish(path, e, r) : backed_up;
    // A save during the backup's read (in place) gives a backup of no save's bytes; it shows as a
    // file changed since it was examined (a review's finding: such a backup stayed in the store).
    if (!s.ok() && !r.original_gone) r.backup_may_mix = !check_unchanged(path, path, e.stamp, false).ok();
    return s;
  }

  Status convert_and_publish(const std::string& path, Examined& e, FileOutcome& r) {
    KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(io_, path));
    KV_ASSIGN_OR_RETURN(ConvertResult res, convert_state(e.src, *e.file, e.req, *writer));
    // The checks after the fdatasync, which can take seconds: a save during it must show. The last
    // runs on the original after it left its name, so a save that began before is seen too.
    KV_RETURN_IF_ERROR(writer->sync());
    const Status published = writer->publish_if_unchanged(
        [&](const std::string& now_at, bool moved) { return check_unchanged(path, now_at, e.stamp, moved); });
    if (writer->renamed_plainly()) plain_renames_.store(true);
    // Not published: the file at `path` is the original, or a server's save of it (the error says
    // where a save that could not be put back is).
    if (!published.ok() && !writer->published()) {
      r.original_gone = writer->original_removed();
      return published;
    }
    r.bytes_after = res.bytes_out;
    r.action = FileAction::kConverted;
    if (!published.ok()) {
      // Renamed, then the directory's fsync failed: saying FAILED would claim the original is
      // still there, and it is not.
      r.action = FileAction::kConvertedNotDurable;
      r.error = published;
      r.detail = "replaced by its conversion, but the fsync of the directory failed, so the new entry may not "
                 "survive a crash (the original is gone): " + published.ToString();
    }
    return Status::OK();
  }

  Io& io_;
  const MigrateOptions& o_;
  std::atomic<bool> interrupted_{false};
  std::atomic<bool> plain_renames_{false};
};

Result<std::vector<std::string>> scan(Io& io, const MigrateOptions& o, MigrateSummary& sum) {
  KV_ASSIGN_OR_RETURN(auto entries, io.list_dir(o.dir));
  std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  std::vector<std::string> todo;
  for (const DirEntry& e : entries) {
    if (const std::optional<long> pid = kvsnap_temp_pid(e.name)) {
      std::optional<int64_t> written_ns;
      if (auto stamp = io.stamp(o.dir + "/" + e.name); stamp.ok()) written_ns = stamp->mtime_ns;
      if (!is_stale_temp(*pid, written_ns)) {  // another kvsnap's, still at work: said, left alone
        FileOutcome busy;
        busy.name = e.name;
        busy.action = FileAction::kSkippedOther;
        busy.detail = "a temporary of kvsnap process " + std::to_string(*pid) + ", still running";
        sum.files.push_back(std::move(busy));
      } else if (e.is_regular && o.dry_run) {
        ++sum.stale_temps_found;
        sum.stale_temp_names.push_back(e.name);
      } else if (e.is_regular && io.remove(o.dir + "/" + e.name).ok()) {
        ++sum.stale_temps_removed;
        sum.stale_temp_names.push_back(e.name);
      }
      continue;
    }
    FileOutcome skip;
    skip.name = e.name;
    if (e.is_symlink) {
      skip.action = FileAction::kSkippedLink;
      skip.detail = "a symlink; kvsnap migrate never follows links out of the directory";
    } else if (!e.is_regular) {
      skip.action = FileAction::kSkippedOther;
      skip.detail = e.is_dir ? "a directory (not descended into)" : "not a regular file";
    } else {
      todo.push_back(e.name);
      continue;
    }
    sum.files.push_back(std::move(skip));
  }
  return todo;
}

// Two migrations of one directory at once convert the same files, each replacing the other's
// output and reporting it as its own (or failing it as "changed"): the second is refused. Held for
// the whole run, the stale temporaries' removal included. An Io without directory locks (memory)
// runs unlocked.
Result<std::unique_ptr<FileLock>> lock_for_migrate(Io& io, const std::string& dir) {
  auto lock = io.lock_dir(dir);
  if (!lock.ok() && lock.status().code() == Code::kNotSupported) return std::unique_ptr<FileLock>();
  KV_RETURN_IF_ERROR(lock.status());
  if (!*lock) {
    return Status::IOError("another kvsnap migrate is running on " + dir +
                           " (it holds the directory's lock): let it finish, then run again to check");
  }
  return std::move(*lock);
}

}  // namespace

const char* file_action_name(FileAction a) {
  switch (a) {
    case FileAction::kConverted: return "converted";
    case FileAction::kConvertedNotDurable: return "converted, NOT DURABLE";
    case FileAction::kWouldConvert: return "would convert";
    case FileAction::kAtTarget: return "at target";
    case FileAction::kNotState: return "not a state file";
    case FileAction::kSkippedLink: return "skipped (symlink)";
    case FileAction::kSkippedOther: return "skipped";
    case FileAction::kFailed: return "FAILED";
  }
  return "?";
}

size_t MigrateSummary::count(FileAction a) const {
  return size_t(std::count_if(files.begin(), files.end(), [a](const FileOutcome& f) { return f.action == a; }));
}

size_t MigrateSummary::problems() const { return count(FileAction::kFailed) + count(FileAction::kConvertedNotDurable); }

namespace {
bool was_converted(FileAction a) {
  return a == FileAction::kConverted || a == FileAction::kConvertedNotDurable || a == FileAction::kWouldConvert;
}
}  // namespace

uint64_t MigrateSummary::bytes_before() const {
  uint64_t n = 0;
  for (const auto& f : files)
    if (was_converted(f.action)) n += f.bytes_before;
  return n;
}

uint64_t MigrateSummary::bytes_after() const {
  uint64_t n = 0;
  for (const auto& f : files)
    if (was_converted(f.action)) n += f.bytes_after;
  return n;
}

// Whether a file can be created (and removed) in `dir`, as each conversion's temporary is.
Status probe_writable(Io& io, const std::string& dir, size_t files) {
  const std::string probe = temp_path_beside(dir + "/.kvsnap-write-probe");
  auto f = io.open_write(probe, /*exclusive=*/true);
  Status s = f.ok() ? (*f)->close() : f.status();
  if (f.ok()) (void)io.remove(probe);
  if (s.ok() || s.code() == Code::kInterrupted) return s;  // a signal during the probe: the run stops as interrupted
  return Status::IOError(dir + ": kvsnap cannot create files there (" + s.message() + "), and each of the " +
                         std::to_string(files) + " files to convert is replaced by a new one: nothing converted, no "
                         "backup stored; run migrate as the directory's owner (or root)");
}

Result<MigrateSummary> migrate_dir(Io& io, const MigrateOptions& o) {
  const auto t0 = Clock::now();
  // A typo in a flag fails here, once, before the lock is taken or a temporary removed.
  KV_RETURN_IF_ERROR(check_spec_words(o.spec));
  if (o.jobs < 1) return Status::InvalidArgument("{--jobs} " + std::to_string(o.jobs) + ": at least 1");
  if (auto opened = io.open_regular(o.dir); opened.ok() && opened->file) {
    return Status::InvalidArgument(o.dir + ": a file, not a directory (kvsnap migrate converts the files of a "
                                   "directory; kvsnap convert converts one file)");
  }
  KV_ASSIGN_OR_RETURN(const std::unique_ptr<FileLock> held, lock_for_migrate(io, o.dir));
  MigrateSummary sum;
  KV_ASSIGN_OR_RETURN(std::vector<std::string> listed, scan(io, o, sum));
  Migrator m(io, o);
  // Headers first, so the progress counts only the files that will be converted (not the other
  // files of the directory, nor those already at the target).
  std::vector<std::string> todo;
  uint64_t todo_bytes = 0;
  for (const std::string& name : listed) {
    if (m.interrupted()) break;
    FileOutcome r = m.examine_one(name);
    if (r.needs_conversion) {
      todo.push_back(name);
      todo_bytes += r.bytes_before;
    } else {
      sum.files.push_back(std::move(r));
    }
  }
  // Each conversion is a new file in DIR: a directory kvsnap cannot write into fails them all, after
  // each file's backup was stored and dropped again. Probed once, before any of that.
  if (!o.dry_run && !todo.empty()) KV_RETURN_IF_ERROR(probe_writable(io, o.dir, todo.size()));
  if (o.planned && !m.interrupted()) o.planned(todo.size(), todo_bytes);
  std::vector<FileOutcome> done(todo.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  size_t finished = 0;
  auto worker = [&] {
    for (size_t i; !m.interrupted() && (i = next.fetch_add(1)) < todo.size();) {
      if (o.progress) {
        std::lock_guard<std::mutex> lock(mu);
        o.progress(finished, todo.size(), nullptr, todo[i]);
      }
      done[i] = m.run_one(todo[i]);
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      if (o.progress) o.progress(finished, todo.size(), &done[i], "");
    }
  };
  const int jobs = std::max(1, std::min<int>(o.jobs, int(todo.size())));
  fork_join(size_t(jobs), [&](size_t) { worker(); });
  if (m.interrupted()) {
    size_t converted = 0;
    for (const auto& f : done) converted += f.action == FileAction::kConverted || f.action == FileAction::kConvertedNotDurable;
    sum.interrupted = Status::Interrupted(o.dir + ": stopped by a signal after converting " + std::to_string(converted) +
                                          " of " + std::to_string(todo.size()) +
                                          " files; every file is either converted or untouched: run the same migrate "
                                          "again to finish");
  }
  for (auto& f : done)
    if (!f.name.empty()) sum.files.push_back(std::move(f));  // (not reached when interrupted)
  std::sort(sum.files.begin(), sum.files.end(), [](const FileOutcome& a, const FileOutcome& b) { return a.name < b.name; });
  sum.seconds = since(t0);
  sum.plain_renames = m.plain_renames();
  return sum;
}

}  // namespace kvsnap
