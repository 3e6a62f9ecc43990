// Moving sessions between a running llama-server and the store, over its HTTP
// API and its --slot-save-path directory:
//
//   save:    ask the server to save slot N under a fresh temporary name in its
//            slot directory, ingest that file into the store, remove it;
//   restore: write the snapshot, converted to the server's cache types and V
//            layout, into the slot directory under a fresh name, ask the server
//            to restore slot N from it, remove it; optionally prove that the
//            server reuses the cache (--check).
//
// llama-server does not report its cache types. They come from the caller
// (flags or a server profile), else are detected from a file the server saves
// of the same slot. Its build comes from /props build_info (when the number
// is plausible): recorded at save as the file's writer (it decides whether a
// ggsq v2 file is stored rotated), used at restore as the target build (file
// format, cell extra, rotation). The model (for the rotation's head dims and the
// wrong-model check) comes from the caller, else from the server's /props
// model_path when that file is readable here.
//
// Whatever happens, no file kvsnap put in the slot directory is left behind
// under the name the server was given, and every error says what kvsnap was
// doing and what the server answered. One file stays, unless the caller says
// not (ServerTarget::keep_scratch, restore/save --no-scratch): the last
// transfer's file, renamed to `.kvsnap-scratch.kvsnap-tmp-kept`, which the next restore claims
// (a rename: two at once never share it) and writes over in place. On a machine
// where memory touched for the first time is slow, writing over pages already in
// the page cache is many times faster than filling new ones (docs/performance.md,
// "End to end"); the price is that file's disk space and, unlike a file removed
// at once, its pages reaching the disk in the background. The server never sees
// it under its own name, only after the complete file is renamed to the name it
// is given.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "server/llama_server.h"
#include "store/store.h"

namespace kvsnap {

struct ServerTarget {
  ServerEndpoint endpoint;
  int slot = 0;
  std::string slot_dir;                 // the server's --slot-save-path, as seen from here
  std::string ctk, ctv, flash_attn;     // the server's cache; empty: detect
  std::string model;                    // GGUF path; empty: the server's /props model_path if readable
  // Restores: the llama.cpp build that wrote the stored file and how its
  // quantized caches are stored, when the file's layout does not tell.
  std::string stored_source_build, stored_src_rotation;
  // How the server stores quantized K/V: "off" when it runs with LLAMA_ATTN_ROT_DISABLE=1, "on", or
  // "" (its build decides, as --target-build says). A restore writes its file so (dst_rotation); a
  // save declares it as the file's src_rotation unless the request declares one.
  std::string server_rotation;
  std::string rotation;  // restores: auto|on|off for both ends of the conversion (restore --rotation)
  // Restores: the llama.cpp that will load the file (--target-build); empty:
  // the server's /props build_info when it is usable, else the stored format.
  std::string target_build;
  int threads = 0;                      // conversion threads; 0: all cores
  // Restores: the KV stream count of the server's cache (one per slot with -np N and no -kvu, one
  // with -kvu); 0: the snapshot's, and when the server refuses the file, each other count it may
  // have (its slot count, then 1), the file rewritten each time.
  int kv_streams = 0;
  bool allow_plain = false;             // restores with a key: a plain snapshot too (RestoreRequest)
  // Keep the file of the last transfer in slot_dir as kSlotScratchName and write
  // the next restore over it in place (see above); false: leave nothing behind.
  bool keep_scratch = true;
};

// The one file kvsnap keeps in a slot directory (ServerTarget::keep_scratch). It
// carries kTempInfix (base/io.h) without a pid, so what cleans kvsnap's stale
// temporaries (kvsnap migrate of that directory) removes it instead of taking it
// for a slot file: it is only ever a cache.
inline constexpr const char* kSlotScratchName = kKeptScratchName.data();  // base/io.h

struct ServerSaveResult {
  SaveResult save;
  ServerBuild build;         // what /props said; recorded unless --source-build named one
  uint64_t n_saved = 0;      // tokens the server wrote
  double server_ms = 0;
};

struct ReuseCheck {
  uint64_t n_tokens = 0;     // the stored prompt
  uint64_t prompt_n = 0;     // tokens the server evaluated for it
  uint64_t cache_n = 0;      // tokens it took from the cache
  bool reused = false;       // prompt_n <= 1: only the last token, which llama-server always re-evaluates
};

// Where a restore's time went (wall clock, ms), for `restore --json` and bench/resume_bench.py.
struct ServerRestorePhases {
  double prepare = 0;  // /health, /slots, /props, the model, the catalog (and detecting types)
  double write = 0;    // reading the snapshot, converting, writing into the slot directory
  double commit = 0;   // the last writes and the rename
  double server = 0;   // POST /slots/N?action=restore, round trip
  double check = 0;    // --check's completion
};

struct ServerRestoreResult {
  RestoreResult restore;
  ServerRestorePhases phases;
  uint64_t n_restored = 0;
  double server_ms = 0;
  double seconds = 0;        // everything: convert, write, server restore
  std::string ctk, ctv, flash_attn, types_from;  // what kvsnap wrote for, and how it knew
  std::string model_from;
  // Why the server's model was not compared with the snapshot's ("" = it was): no model file
  // readable here, or no fingerprint recorded. Then nothing shows that the server runs the
  // snapshot's model (two models of one layout take each other's files).
  std::string model_unchecked;
  ServerBuild build;                // what /props said
  std::string target_build, target_build_from;  // what kvsnap wrote for ("" = the stored format)
  std::optional<ReuseCheck> check;
  bool scratch_reused = false;      // the slot file was written over the kept scratch file
  uint32_t kv_streams = 0;          // the KV streams kvsnap rewrote the file to after a refusal (0: none)
  std::string kv_streams_from;      // why, for the report
};

// The server's build (GET /health, then /props); kIOError when it is not running.
Result<ServerBuild> query_server_build(const ServerEndpoint& endpoint);

// `before_store`, when given, sees the prompt tokens of the file the server saved before it goes into
// the store: it may change the request (its tags) or refuse (its Status is returned, nothing stored).
using SaveHook = std::function<Status(const std::vector<int32_t>& tokens, SaveRequest& req)>;
Result<ServerSaveResult> save_from_server(Io& io, Store& store, const ServerTarget& t, SaveRequest req,
                                          const SaveHook& before_store = {});
// The same into the store `pick` chooses once `before_store` has tagged the request (kvsnap serve:
// the store of the namespace the saved tokens belong to, serve/tenant_stores.h).
using StorePick = std::function<Result<Store*>(const SaveRequest& req)>;
Result<ServerSaveResult> save_from_server(Io& io, const StorePick& pick, const ServerTarget& t, SaveRequest req,
                                          const SaveHook& before_store = {});
Result<ServerRestoreResult> restore_to_server(Io& io, Store& store, const ServerTarget& t, const std::string& ref,
                                              bool check);

}  // namespace kvsnap
