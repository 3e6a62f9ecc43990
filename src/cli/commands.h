// The kvsnap subcommands. Each has an options struct, a setup function that
// binds it to CLI11, and a run function that does the work and returns a
// Status, so tests can call run_* without the binary.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "cli/progress.h"
#include "cli/server_options.h"

namespace CLI {
class App;
}

namespace kvsnap::cli {

struct InfoOptions {
  std::string file;
  std::string model;        // GGUF, optional
  std::string input_format; // "", "raw-seq", "raw-context"
  std::string source_build; // --source-build
  std::string src_rotation; // --src-rotation on|off
  std::string src_types;    // --src-types K/V: the cache types of a ggsn v6 (b3166) session
  bool json = false;
  bool tokens = false;
};
void setup_info(CLI::App& app, int& exit_status);
Status run_info(const InfoOptions& opts, std::string& out);

// `kvsnap digest FILE`: the content digest a save would record, and the plain SHA-256.
struct DigestOptions {
  std::string file, model, input_format, src_types;
  std::optional<uint32_t> cells_per_chunk;  // unset: the store's default, or with --as the snapshot's
  std::string as;                           // a stored snapshot: its grid and key; compared with its digest
  std::string store;
  bool json = false;
};
void setup_digest(CLI::App& app, int& exit_status);
Status run_digest(const DigestOptions& opts, std::string& out);

struct ConvertOptions {
  std::string in, out;
  std::string ctk, ctv;          // "" keeps the file's
  std::string model;
  std::string flash_attn;        // "", "on", "off"
  std::string rotation, src_rotation, dst_rotation;  // "", auto, on, off
  std::string requant;           // "", search, exact, reference (migrate/convert_state.h)
  std::string format;            // "" = current
  std::string source_build, target_build;  // "" = unknown / not named
  std::string input_format;
  std::string src_types;         // --src-types K/V (ggsn v6 sessions)
  int head_dim_k = 0, head_dim_v = 0;
  int kv_streams = 0;            // 0 = the input's
  int threads = 0;               // 0 = all cores
  bool report = false;
  bool json = false;
  bool force = false;            // replace an existing OUT (never an input)
  ProgressFlags progress;
  // mlx-lm prompt caches (cmd_convert_mlx.cc): "" keeps, "none" dequantizes, else 2..8 bits.
  std::string kv_bits;
  int kv_group_size = 0;         // 0: the file's, else 64 (mlx-lm's default)
  std::string mlx_device = "cpu";
  std::string mlx_lm;            // the mlx-lm release (or layout) that will load the output
  // Between engines (cmd_convert_cross.cc): "mlx" or "llama"; "" converts within one engine.
  std::string to;
  std::string tokens;            // --to llama: the prompt's token ids (mlx-lm stores none)
  std::string mlx_dtype;         // --to mlx: f16|bf16|f32 ("" = the file's float type, else f16)
  std::string llama_file;        // --to llama: slot|session ("" = slot, or the kind --format names)
};
void setup_convert(CLI::App& app, int& exit_status);
Status run_convert(const ConvertOptions& opts, std::string& out, std::string& warnings);
// kvsnap convert on an mlx-lm prompt cache (run_convert sends it there, told by content).
Status run_convert_mlx(const ConvertOptions& opts, const ReadableFile& in, std::string& out);
// kvsnap convert --to mlx|llama: a session moved between llama.cpp and mlx-lm.
Status run_convert_cross(const ConvertOptions& opts, std::string& out);

struct MigrateOptions {
  std::string dir;
  std::string ctk, ctv, flash_attn, format, rotation, requant;
  std::string src_rotation, source_build, target_build;  // as for convert
  std::string model;
  ServerOpts srv;                // --server: the target's build, and a profile's dir, types and model
  bool backup_store = false;
  std::string store;             // --store DIR for --backup-store
  int jobs = 1;
  int kv_streams = 0;            // 0 = each file's
  int threads = 0;               // per file; 0 = cores / jobs
  bool dry_run = false;
  bool json = false;
  bool progress = true;          // on a terminal
};
void setup_migrate(CLI::App& app, int& exit_status);
// Returns kMismatch ("N files failed") after printing the summary when some files failed.
Status run_migrate(const MigrateOptions& opts, std::string& out);

// The store commands, one file each (helpers they share: store_common.h).
void setup_save(CLI::App& app, int& exit_status);               // cmd_save.cc
void setup_restore(CLI::App& app, int& exit_status);            // cmd_restore.cc
void setup_list_commands(CLI::App& app, int& exit_status);      // cmd_list.cc: ls, show, find
void setup_maintain_commands(CLI::App& app, int& exit_status);  // cmd_maintain.cc: rm, gc, verify, pin, unpin, expire
void setup_transfer_commands(CLI::App& app, int& exit_status);  // cmd_transfer.cc: export, import
void setup_server_commands(CLI::App& app, int& exit_status);    // cmd_server.cc: server add, ls, rm
void setup_serve(CLI::App& app, int& exit_status);               // cmd_serve.cc: llama-server behind kvsnap
void setup_doctor(CLI::App& app, int& exit_status);             // cmd_doctor.cc
void setup_man(CLI::App& app, int& exit_status);                // cmd_man.cc: manual pages from the command tree
// cmd_completion.cc: a completion script from the whole command tree; set up last.
void setup_completion(CLI::App& app, int& exit_status);

// Every subcommand, in the order `kvsnap --help` lists them.
void setup_all_commands(CLI::App& app, int& exit_status);
// Only the command that the process's arguments `args` (argv, the program first) name in
// their first word, when they do: defining every command's options is most of a short command's start (under
// AddressSanitizer ~30 of a `kvsnap --version`'s ~90 ms). Every command when the words name none
// (`kvsnap --help`, a mistyped command: the messages list them) or one that walks the whole
// tree (man, completion).
void setup_commands_for(CLI::App& app, int& exit_status, const std::vector<std::string>& args);

// The SNR convert reports (llama.cpp and mlx-lm files, text and --json) show: an exact copy's is
// +infinity, which JSON cannot hold, so 999 dB stands for it.
inline double shown_snr_db(double snr_db) { return std::isfinite(snr_db) ? snr_db : 999.0; }

}  // namespace kvsnap::cli
