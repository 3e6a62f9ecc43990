// kvsnap server add, ls, rm: profiles of llama-servers (what a server does not report).
#include <filesystem>

#include "base/json_access.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "cli/commands.h"
#include "server/llama_server.h"
#include "migrate/model_info.h"
#include "server/server_profiles.h"
#include "store/store_paths.h"

namespace kvsnap::cli {
namespace {

struct ServerCmdOpts {
  std::string name, url, slot_dir, ctk, ctv, flash_attn, model, api_key_file, store;
  bool json = false;
};

Status run_server_add(const ServerCmdOpts& o, std::string& out) {
  // With its scheme: --server without "://" names a profile.
  if (o.url.find("://") == std::string::npos) return Status::InvalidArgument("'" + o.url + "': the URL must look like http://HOST:PORT");
  KV_RETURN_IF_ERROR(split_server_url(o.url).status());
  for (const auto* t : {&o.ctk, &o.ctv})
    if (!t->empty()) KV_RETURN_IF_ERROR(parse_kv_type(*t, "--ctk/--ctv").status());
  if (!o.flash_attn.empty() && o.flash_attn != "on" && o.flash_attn != "off")
    return Status::InvalidArgument("--flash-attn must be on or off");
  if (!o.api_key_file.empty()) KV_RETURN_IF_ERROR(read_api_key_file(o.api_key_file).status());
  // Checked and kept absolute, as every later command reads them from wherever it runs (a review's
  // finding: a missing directory or model was kept, and relative paths meant another file elsewhere).
  std::error_code ec;
  if (!std::filesystem::is_directory(o.slot_dir, ec))
    return Status::InvalidArgument("--slot-dir " + o.slot_dir + " is not a directory here (the server's --slot-save-path as "
                                   "this host sees it)");
  if (!o.model.empty()) KV_RETURN_IF_ERROR(load_model_info(cli_io(), o.model).status());
  auto absolute = [](const std::string& p) { return p.empty() ? p : std::filesystem::absolute(p).lexically_normal().string(); };
  KV_ASSIGN_OR_RETURN(StorePaths paths, resolve_store_paths(o.store));
  KV_RETURN_IF_ERROR(cli_io().create_dirs(paths.root));
  KV_ASSIGN_OR_RETURN(ServerProfiles profiles, ServerProfiles::load(cli_io(), paths.root));
  KV_RETURN_IF_ERROR(profiles.put(cli_io(), {o.name, o.url, absolute(o.slot_dir), o.ctk, o.ctv, o.flash_attn,
                                               absolute(o.model), absolute(o.api_key_file)}));
  out = "server profile '" + o.name + "' -> " + o.url + "\n";
  return Status::OK();
}

Status run_server_ls(const ServerCmdOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(StorePaths paths, resolve_store_paths(o.store));
  KV_ASSIGN_OR_RETURN(ServerProfiles profiles, ServerProfiles::load(cli_io(), paths.root));
  json a = json::array();
  for (const auto& p : profiles.all()) {
    a.push_back({{"name", p.name}, {"url", p.url}, {"slot_dir", p.slot_dir}, {"ctk", p.ctk}, {"ctv", p.ctv},
                 {"flash_attn", p.flash_attn}, {"model", p.model}, {"api_key_file", p.api_key_file}});
    if (!o.json)
      out += p.name + "  " + p.url + "  slot-dir " + (p.slot_dir.empty() ? "-" : p.slot_dir) + "  K " +
             (p.ctk.empty() ? "?" : p.ctk) + " V " + (p.ctv.empty() ? "?" : p.ctv) + " fa " +
             (p.flash_attn.empty() ? "?" : p.flash_attn) + (p.model.empty() ? "" : "  model " + p.model) + "\n";
  }
  if (o.json) out = json_text(a, 2) + "\n";
  else if (a.empty()) out = "(no server profiles; kvsnap server add NAME URL --slot-dir DIR ...)\n";
  return Status::OK();
}

Status run_server_rm(const ServerCmdOpts& o, std::string& out) {
  KV_ASSIGN_OR_RETURN(StorePaths paths, resolve_store_paths(o.store));
  KV_ASSIGN_OR_RETURN(ServerProfiles profiles, ServerProfiles::load(cli_io(), paths.root));
  KV_RETURN_IF_ERROR(profiles.remove(cli_io(), o.name));
  out = "removed server profile '" + o.name + "'\n";
  return Status::OK();
}

}  // namespace

void setup_server_commands(CLI::App& app, int& exit_status) {
  auto* server = app.add_subcommand("server", "Profiles of llama-servers: what kvsnap needs to know that the server "
                                              "does not report (cache types, slot directory, model, API key)");
  server->require_subcommand(1);
  {
    auto o = std::make_shared<ServerCmdOpts>();
    auto* sub = server->add_subcommand("add", "Add or replace a server profile");
    sub->add_option("name", o->name, "the profile's name, used as --server NAME")->required();
    sub->add_option("url", o->url, "http://HOST:PORT")->required();
    sub->add_option("--slot-dir", o->slot_dir, "the server's --slot-save-path as seen from here")->required();
    sub->add_option("--ctk", o->ctk, "the server's -ctk");
    sub->add_option("--ctv", o->ctv, "the server's -ctv");
    sub->add_option("--flash-attn,--fa", o->flash_attn, "the server's -fa: on|off");
    sub->add_option("--model,-m", o->model, "the server's model GGUF (head dims, wrong-model check)");
    sub->add_option("--api-key-file", o->api_key_file, "a chmod-600 file holding the server's API key");
    bind(sub, o, run_server_add, "server add", exit_status);
  }
  {
    auto o = std::make_shared<ServerCmdOpts>();
    auto* sub = server->add_subcommand("ls", "List server profiles");
    sub->add_flag("--json", o->json, "machine-readable list");
    bind(sub, o, run_server_ls, "server ls", exit_status);
  }
  {
    auto o = std::make_shared<ServerCmdOpts>();
    auto* sub = server->add_subcommand("rm", "Remove a server profile");
    sub->add_option("name", o->name, "the profile")->required();
    bind(sub, o, run_server_rm, "server rm", exit_status);
  }
}

}  // namespace kvsnap::cli
