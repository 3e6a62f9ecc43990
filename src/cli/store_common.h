// What the store commands (save, restore, ls, show, find, rm, gc, verify,
// export, import, server) share: opening the store, rendering a snapshot,
// the --store option bound with each command's callback.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "cli/exit_codes.h"
#include "server/llama_server.h"
#include "store/store.h"

namespace kvsnap::cli {

using json = nlohmann::ordered_json;

std::string mib(uint64_t b, int decimals = 2);  // "1.25 MiB"
// --store, $KVSNAP_HOME, XDG (store_location.h), with the command's key options applied.
// keyless_ok: an encrypted store opens without its key (verify, gc). The store must exist:
// a store whose SQLite catalog is missing is kNotFound, naming where it was looked for, so that
// `restore --store TYPO` does not make an empty store and report the snapshot missing from it.
Result<std::unique_ptr<Store>> open_store(const std::string& dir, bool keyless_ok = false);
// The same, creating the store when it does not exist yet (save, import).
Result<std::unique_ptr<Store>> open_or_create_store(const std::string& dir);
// When `dir` (--store) names an embedded store (catalog and blobs in one directory) whose
// directory is not there yet, the first directory of its path that is not there (the store's own,
// or the highest parent that creating it makes): the one case where a command that creates the
// store and then fails may take it away again (remove_new_store). nullopt otherwise.
Result<std::optional<std::string>> new_store_dirs(const std::string& dir);
// Removes the store directory `dir` that this command created (new_store_dirs gave `first_new`
// before it opened the store, which is closed now) when it still holds only what a new store holds
// (the catalog, listing no snapshot, the gc lock, empty chunks/, packs/ and tmp/), then the
// parents it created up to `first_new` while they are empty; anything more (a concurrent save's
// files, a server profile, another file in a parent) and that directory is left as it is.
Status remove_new_store(const std::string& dir, const std::string& first_new);
Result<StoreLocation> store_location(const std::string& dir);

// The store's key options of the running command (docs/store.md, "Encryption at rest"): every
// store command has --key-file, --key-command and --tenant (bind() adds them; a command with
// its own --tenant, gc's, gets the key options only). One command runs per process, so they
// are kept here rather than in each command's options.
StoreKeyConfig& store_key_flags();
void add_store_key_options(CLI::App* sub);
json info_json(const SnapshotInfo& s);
// The blob bytes reading these snapshots takes (every snapshot when `refs` is empty): the
// total of a progress display. 0 when a ref does not resolve (the command itself will say so).
uint64_t stored_bytes_of(Store& store, const std::vector<std::string>& refs);
std::string label(const SnapshotInfo& s);
// An evicted snapshot: {"snapshot": info_json, "reason": "expired"|"lru", "freed_bytes"}; and as one line.
json victim_json(const EvictionVictim& v);
std::string victim_line(const EvictionVictim& v);  // "chat-42 (id 3)" or "id 3"
Result<std::pair<std::string, std::string>> parse_tag(const std::string& t);  // KEY=VALUE
// kInvalidArgument when `path` exists, unless --force; and, --force or not, when it is a directory,
// a named pipe or a device (refuse_irregular_output; `command`, e.g. "kvsnap restore", names who refuses).
Status refuse_existing(const std::string& path, bool force, const std::string& command);
// Refuses an OUT, --force or not, that is one of `inputs` (path, what it is: the same file by any
// name) or an existing file inside the store's directory (its catalog, a pack): the rename would
// destroy it.
Status refuse_output_over_inputs(const std::string& out, const Store& store,
                                 const std::vector<std::pair<std::string, std::string>>& inputs);
// --tokens FILE: a JSON array, or integers separated by spaces, commas or newlines.
Result<std::vector<int32_t>> read_token_list(const std::string& path);
json server_build_json(const ServerBuild& b);
// "; the server reports llama.cpp b8121-..." or why its build_info was not used.
std::string server_build_note(const ServerBuild& b);

// Adds --store and runs `run` when the subcommand is chosen: its output on
// stdout, an error on stderr, the exit code in exit_status.
template <class Opts, class Run>
void bind(CLI::App* sub, std::shared_ptr<Opts> o, Run run, const char* name, int& exit_status) {
  const std::string_view cmd = name;
  const bool creates = cmd == "save" || cmd == "import" || cmd == "serve";
  const bool reads_stored = !creates && cmd != "doctor" && !cmd.starts_with("server ");
  sub->add_option("--store", o->store,
                  std::string("the store: a directory, or a store config file FILE.json (docs/store.md) (default: "
                              "$KVSNAP_HOME, else $XDG_DATA_HOME/kvsnap, else ~/.local/share/kvsnap)") +
                      (creates          ? "; created where none is yet"
                       : cmd == "digest" ? "; the store of --as SNAPSHOT (it must exist), read only with --as"
                       : reads_stored    ? "; it must exist (save, import and serve create one)"
                                         : ""));
  add_store_key_options(sub);
  sub->callback([o, run, name, &exit_status]() {
    std::string out;
    Status s = run(*o, out);
    // Remedies these commands have no flag for are not offered: save takes no --format (a
    // conversion on store writes the current one); restore takes no head dims (the model, or what
    // the save recorded, gives them).
    const std::string_view command = name;
    exit_status = command == "save"      ? report_with_output(name, s, out, {"--format"})
                  : command == "restore" ? report_with_output(name, s, out, {"--head-dim-k", "--head-dim-v"})
                                         : report_with_output(name, s, out);
  });
}

}  // namespace kvsnap::cli
