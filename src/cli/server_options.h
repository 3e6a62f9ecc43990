// The options that name a llama-server (--server URL|PROFILE, --slot,
// --slot-dir, --no-scratch, --api-key, --api-key-file), shared by save, restore and migrate,
// and their resolution against the server profiles (kvsnap server add).
#pragma once

#include <string>

#include "base/status.h"
#include "server/server_flows.h"

namespace CLI {
class App;
}

namespace kvsnap::cli {

struct ServerOpts {
  std::string server, slot_dir, api_key, api_key_file;
  int slot = 0;
  bool no_scratch = false;  // ServerTarget::keep_scratch
  bool given() const { return !server.empty(); }
  // The server-only flags given without --server (their values differ from the defaults), e.g.
  // "--slot, --api-key"; empty when none is.
  std::string flags_without_server() const;
};

// Refuses (exit 2) server-only flags, and `extra` ones (e.g. restore's --check), given without
// --server: they would do nothing, silently (a review's finding).
Status refuse_server_flags_without_server(const ServerOpts& o, std::string extra = "");

// with_slot = false (migrate): only --server and the API key options.
void add_server_options(CLI::App* sub, ServerOpts& o, bool with_slot = true);

// Flags override the profile; a URL needs no profile. Empty ctk/ctv/fa/model
// keep the profile's.
Result<ServerTarget> server_target(const ServerOpts& o, const std::string& store_dir, const std::string& ctk,
                                   const std::string& ctv, const std::string& fa, const std::string& model);

}  // namespace kvsnap::cli
