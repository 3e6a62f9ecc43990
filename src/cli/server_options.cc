#include "cli/progress.h"
#include "cli/server_options.h"

#include <CLI/CLI.hpp>

#include "server/llama_server.h"
#include "server/server_profiles.h"
#include "store/store_paths.h"

namespace kvsnap::cli {

void add_server_options(CLI::App* sub, ServerOpts& o, bool with_slot) {
  sub->add_option("--server", o.server, "a llama-server URL (http://127.0.0.1:8080) or a profile name (kvsnap server add)");
  if (with_slot) {
    sub->add_option("--slot", o.slot, "the server's slot id (default 0)");
    sub->add_option("--slot-dir", o.slot_dir, "the server's --slot-save-path as seen from here (default: the profile's)");
    sub->add_flag("--no-scratch", o.no_scratch,
                  "leave no file in --slot-dir (default: the last transfer's file stays as .kvsnap-scratch.kvsnap-tmp-kept and the next "
                  "restore writes over it, faster where new memory is slow)");
  }
  sub->add_option("--api-key", o.api_key, "the server's API key (sent as Authorization: Bearer)");
  sub->add_option("--api-key-file", o.api_key_file, "a chmod-600 file holding the API key");
}

std::string ServerOpts::flags_without_server() const {
  std::string flags;
  auto add = [&flags](bool given, const char* name) {
    if (given) flags += (flags.empty() ? "" : ", ") + std::string(name);
  };
  add(slot != 0, "--slot");
  add(!slot_dir.empty(), "--slot-dir");
  add(no_scratch, "--no-scratch");
  add(!api_key.empty(), "--api-key");
  add(!api_key_file.empty(), "--api-key-file");
  return flags;
}

Status refuse_server_flags_without_server(const ServerOpts& o, std::string extra) {
  if (o.given()) return Status::OK();
  std::string flags = o.flags_without_server();
  if (!extra.empty()) flags += (flags.empty() ? "" : ", ") + extra;
  if (flags.empty()) return Status::OK();
  return Status::InvalidArgument(flags + ": for a llama-server named by --server URL|PROFILE; without --server they "
                                 "would do nothing");
}

Result<ServerTarget> server_target(const ServerOpts& o, const std::string& store_dir, const std::string& ctk,
                                   const std::string& ctv, const std::string& fa, const std::string& model) {
  ServerTarget t;
  std::string key_file = o.api_key_file;
  if (o.server.find("://") == std::string::npos) {
    KV_ASSIGN_OR_RETURN(StorePaths paths, resolve_store_paths(store_dir));
    KV_ASSIGN_OR_RETURN(ServerProfiles profiles, ServerProfiles::load(cli_io(), paths.root));
    const ServerProfile* p = profiles.find(o.server);
    if (!p) return Status::NotFound("--server " + o.server + ": neither a URL nor a profile (kvsnap server ls)");
    t.endpoint.url = p->url;
    t.slot_dir = p->slot_dir;
    t.ctk = p->ctk;
    t.ctv = p->ctv;
    t.flash_attn = p->flash_attn;
    t.model = p->model;
    if (key_file.empty()) key_file = p->api_key_file;
  } else {
    t.endpoint.url = o.server;
  }
  // A URL that cannot be asked anything is refused here, before the command opens a store or
  // reads a file (a profile's too: servers.json may have been edited by hand).
  if (Result<ServerUrl> u = split_server_url(t.endpoint.url); !u.ok()) {
    return Status::InvalidArgument((o.server == t.endpoint.url ? "--server: " : "--server " + o.server + ": ") +
                                   u.status().message());
  }
  t.endpoint.stopped = interrupted;  // Ctrl-C gives up a reply that drips
  t.slot = o.slot;
  t.keep_scratch = !o.no_scratch;
  if (!o.slot_dir.empty()) t.slot_dir = o.slot_dir;
  if (!ctk.empty()) t.ctk = ctk;
  if (!ctv.empty()) t.ctv = ctv;
  if (!fa.empty()) t.flash_attn = fa;
  if (!model.empty()) t.model = model;
  t.endpoint.api_key = o.api_key;
  if (t.endpoint.api_key.empty() && !key_file.empty()) {
    KV_ASSIGN_OR_RETURN(t.endpoint.api_key, read_api_key_file(key_file));
  }
  return t;
}

}  // namespace kvsnap::cli
