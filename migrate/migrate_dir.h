// `kvsnap migrate DIR`: convert every llama.cpp slot/session file in a
// directory in place, e.g. after a llama.cpp upgrade (format version) or a
// -ctk/-ctv/-fa change of the server that uses the directory.
//
// Promises:
//   - Each file is replaced atomically (temporary file beside it, fsync,
//     rename): at any moment, even after kill -9, every file is either its
//     original or a complete converted file.
//   - Files already at the target (byte for byte what their conversion would write: compared
//     when the header, types and layout match, as builds of one version differ in outputs, cell
//     seq ids and cell extras) are left alone, so a rerun after an interruption resumes where it
//     stopped; stale temporary files of dead kvsnap processes (by the names kvsnap gives
//     them only) are removed first.
//   - One run at a time per directory: a run holds an exclusive flock on DIR itself (Io::lock_dir,
//     no file created in it) for its whole length; a second is refused (kIOError, "another kvsnap
//     migrate is running on DIR") before it touches anything.
//   - Confined to DIR: only regular files directly in DIR are touched;
//     symlinks (wherever they point), subdirectories and special files are
//     skipped and reported (llama.cpp #26316 followed symlinks out of its slot
//     directory), also when one takes a file's place after the listing (Io::open_regular: no
//     symlink followed, no FIFO waited on; the stamp is the opened file's). A file that is not a llama.cpp state is skipped, not an error.
//   - A file that changes while it is converted (a llama-server saving that slot again) is left
//     as it is now and reported failed: the conversion of its older bytes never replaces it
//     (its stamp, base/io.h's FileStamp, is compared after the converted temporary's fsync, just
//     before the rename: a save during a long fsync shows too).
//   - A conversion that would change the values but not the header (only a rotation) is refused:
//     a rerun could not tell the converted file from its original.
//   - One file failing does not stop the others; the summary lists it. A file renamed into place
//     whose directory fsync then fails is reported as that (kConvertedNotDurable), not as failed:
//     its original is gone, the converted file is there but its entry may not survive a crash.
//   - With a backup hook (--backup-store), a file is converted only after its
//     original has been stored.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/llama_state.h"
#include "migrate/conversion_spec.h"
#include "migrate/model_info.h"

namespace kvsnap {

enum class FileAction {
  kConverted,
  kConvertedNotDurable,  // replaced by its conversion, but the directory's fsync failed: the new
                         // entry may not survive a crash (the original is gone either way); an error
  kWouldConvert,   // --dry-run
  kAtTarget,       // already what was asked: left alone
  kNotState,       // not a llama.cpp state file
  kSkippedLink,    // a symlink: never followed
  kSkippedOther,   // a directory or special file
  kFailed,
};
const char* file_action_name(FileAction a);

struct FileOutcome {
  std::string name;           // relative to DIR
  FileAction action = FileAction::kFailed;
  uint64_t bytes_before = 0;
  uint64_t bytes_after = 0;   // converted size (estimated exactly for --dry-run)
  std::string from, to;       // "ggsq v3 K f16 V f16 rows" -> "..."
  std::string detail;         // why skipped or failed
  Status error;               // kFailed: the error itself (its code is what `kvsnap convert` of the file exits
                              // with); kConvertedNotDurable: the directory fsync's
  double seconds = 0;
  bool needs_conversion = false;  // it is not what its conversion would write
  // kFailed after the original was replaced and removed: a save reached the name right after the
  // conversion took it (the save holds it). The original is nowhere in DIR (its backup, if any, is
  // the only copy).
  bool original_gone = false;
  // kFailed after the backup hook ran, and the file is no longer as it was examined (a save
  // rewrote or replaced it): the backup, read meanwhile, may mix two saves' bytes and must not be
  // kept as the original's.
  bool backup_may_mix = false;
};

struct MigrateSummary {
  std::vector<FileOutcome> files;  // in name order
  uint64_t stale_temps_removed = 0;
  uint64_t stale_temps_found = 0;  // --dry-run: the stale temporaries a run would remove
  // Their names (removed, or --dry-run: found): a file someone named like a temporary of a dead
  // kvsnap is removed as one, and said by name.
  std::vector<std::string> stale_temp_names;
  double seconds = 0;
  // A converted file took its original's name by a plain rename: the file system cannot exchange
  // two names (NFS), so a save that began in the moment between the last check and the rename
  // was not seen (AtomicFileWriter::publish_if_unchanged).
  bool plain_renames = false;
  // Stopped by a signal: `files` holds the outcomes of the files looked at so far (each is its
  // original or its converted file), `interrupted` says what was left (kInterrupted).
  Status interrupted;
  size_t count(FileAction a) const;
  // kFailed and kConvertedNotDurable: the files that make the run an error.
  size_t problems() const;
  uint64_t bytes_before() const;   // of converted (or would-convert) files
  uint64_t bytes_after() const;
};

struct MigrateOptions {
  std::string dir;
  ConversionSpec spec;                 // ctk/ctv/flash_attn/format/rotation; spec.threads per file
  const ModelInfo* model = nullptr;
  int jobs = 1;                        // files converted at once
  bool dry_run = false;
  // Called with each original before it is replaced; an error leaves the file untouched.
  std::function<Status(const std::string& path, const ReadableFile& file, const StateFile& state)> backup;
  // Called once, after every file's header was read and before the first conversion: how many
  // files (and bytes of them) will be converted; `progress` then counts those files only.
  std::function<void(size_t files, uint64_t bytes)> planned;
  // Called (from any job's thread, serialized) when a file starts and when it ends.
  std::function<void(size_t done, size_t total, const FileOutcome* finished, const std::string& starting)> progress;
};

// kNotFound / kInvalidArgument when DIR is missing or not a directory; kIOError when another
// migrate holds DIR; per-file problems are outcomes, not errors (an exception out of one file's
// conversion too: that file FAILED); a signal ends the run with MigrateSummary::interrupted set.
Result<MigrateSummary> migrate_dir(Io& io, const MigrateOptions& opts);

}  // namespace kvsnap
