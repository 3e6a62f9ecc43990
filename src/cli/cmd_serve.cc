// kvsnap serve: llama-server behind kvsnap, its slots persisted into the store (src/serve/serve.h).
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/store_common.h"
#include "serve/serve.h"

namespace kvsnap::cli {
namespace {

struct ServeCmdOpts {
  std::string listen = "127.0.0.1:8080", store, log;
  std::vector<std::string> llama;
  int threads = 32;
  std::string dynamic_cache, cache_budget;
  std::string max_request_bytes = "256M";
  bool tenant_per_namespace = false;
  std::string admin_key_file;
};

void log_line(const std::string& s) {
  std::time_t now = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::fprintf(stderr, "%s kvsnap serve: %s\n", ts, s.c_str());
  std::fflush(stderr);
}

Status run_serve_cmd(const ServeCmdOpts& o, std::string& out) {
  ServeOptions so;
  so.listen = o.listen;
  so.store = o.store;
  so.keys = store_key_flags();
  so.tenant_per_namespace = o.tenant_per_namespace;
  so.log_file = o.log;
  so.llama = o.llama;
  so.threads = o.threads;
  so.dynamic_cache = o.dynamic_cache;
  so.cache_budget = o.cache_budget;
  so.max_request_bytes = o.max_request_bytes;
  so.admin_key_file = o.admin_key_file;
  if (const char* k = std::getenv("KVSNAP_ADMIN_KEY")) {
    // Set but empty (a unit file's unset variable): refused rather than leaving the routes open.
    if (!*k)
      return Status::InvalidArgument("KVSNAP_ADMIN_KEY is set but empty: give it a key, or unset it (then the "
                                     "child's API keys open kvsnap's routes)");
    so.admin_key = k;
    ::unsetenv("KVSNAP_ADMIN_KEY");  // not handed on to llama-server's environment
  }
  int stopped_by = 0;
  Status s = run_serve(cli_io(), so, log_line, &stopped_by);
  if (stopped_by != 0) note_interrupting_signal(stopped_by);
  return s;
}

}  // namespace

void setup_serve(CLI::App& app, int& exit_status) {
  auto o = std::make_shared<ServeCmdOpts>();
  auto* sub = app.add_subcommand(
      "serve", "Run llama-server behind kvsnap: every request forwarded unchanged, slots saved into the store");
  sub->add_option("--listen", o->listen, "HOST:PORT clients connect to (default 127.0.0.1:8080)");
  sub->add_option("--log", o->log, "llama-server's output, appended (default: STORE/serve/llama-server.log)");
  sub->add_option("--threads", o->threads, "concurrent client connections (default 32; a stream holds one); 4 x N more wait for one, accepted, the rest in the kernel's listen backlog");
  sub->add_option("--dynamic-cache", o->dynamic_cache,
                  "LADDER of cache types, e.g. f16,q8_0,q4_0 (a rung may be K/V: q8_0/q4_0): start at the first; "
                  "when a slot holds 90% of its context, step down one rung with the context that fits --cache-budget");
  sub->add_option("--cache-budget", o->cache_budget, "with --dynamic-cache: the K/V cache's bytes (K, M, G suffixes)");
  sub->add_option("--max-request-bytes", o->max_request_bytes,
                  "the largest request body taken (default 256M; K, M, G suffixes); a larger one is answered 413 "
                  "and never forwarded");
  sub->add_flag("--tenant-per-namespace", o->tenant_per_namespace,
                "seal each namespace's snapshots under its own tenant's keys (needs a key: --key-file, "
                "--key-command or the store config's; not with --tenant)");
  sub->add_option("--admin-key-file", o->admin_key_file,
                  "FILE of keys (one a line, # comments) that alone open kvsnap's routes (/kvsnap/requantize, "
                  "/kvsnap/usage); KVSNAP_ADMIN_KEY adds one. Without: the child's API keys open them");
  sub->add_option("llama-server", o->llama, "after --: the llama-server program and its arguments");
  sub->footer(
      "\nkvsnap serve starts llama-server ARGS as a child on a private loopback port with a kvsnap-owned\n"
      "--slot-save-path (so ARGS must not set --host, --port, --slot-save-path or --no-slots: use\n"
      "--listen; nor --sleep-idle-seconds, whose sleep drops every slot's cache unseen), waits until it\n"
      "is healthy and forwards every request to it unchanged (streaming\n"
      "included). After each completion the slot it used is saved into the store in the background\n"
      "(kvsnap ls --tag serve.ns=default); on SIGTERM or Ctrl-C the requests in flight finish (a second one cuts them),\n"
      "every filled slot is saved, then llama-server stops.\n"
      "Before a completion is forwarded, the longest stored prefix of its prompt (same namespace) is\n"
      "restored into the slot, converted to the server's -ctk/-ctv/-fa, when the slot holds less: after\n"
      "a restart with other cache types, or beyond -np conversations, only the new tokens are evaluated.\n"
      "The server's model, -c, -np, -ctk/-ctv, -fa and API keys are read as llama-server reads them: its\n"
      "config.ini files (/etc/llama.cpp/, then ~/.config/llama.cpp/), then LLAMA_ARG_* variables, then ARGS.\n"
      "A session is restored only under the cache-changing settings it was saved with (--rope-*, --yarn-*,\n"
      "--lora*, --control-vector*, --override-kv). A request with LoRA scales of its own (\"lora\") runs only\n"
      "with the child's --cache-ram 0 and is not kept; serve erases a slot before a request of other scales\n"
      "would go on from it.\n"
      "A llama-server that dies is restarted. Sessions are namespaced by the API key (a hash of it) and\n"
      "the X-Kvsnap-Session header within it (one key's session names are not another's), else 'default'.\n"
      "kvsnap's own routes: POST /kvsnap/requantize {\"ctk\":\"q8_0\",\"ctv\":\"q8_0\"} (optional \"flash_attn\",\n"
      "\"ctx_size\", \"dry_run\") drains, saves the slots, restarts llama-server with the new types and restores\n"
      "them converted; GET /kvsnap/usage: per-slot tokens, bytes, types, the size at every ctk/ctv, and the\n"
      "save/restore/reuse counters. With API keys both take any of the child's keys; with --admin-key-file\n"
      "(or KVSNAP_ADMIN_KEY) they take those admin keys only. See docs/serve.md.\n"
      "\nExamples:\n"
      "  kvsnap serve --listen 0.0.0.0:8080 -- llama-server -m model.gguf -c 8192 -np 2 -ctk q8_0 -ctv q8_0 -fa on\n"
      "  kvsnap serve --store /srv/kvsnap --log /var/log/llama.log -- /opt/llama/llama-server -m m.gguf\n"
      "  curl -d '{\"ctk\":\"q4_0\",\"ctv\":\"q4_0\",\"dry_run\":true}' http://127.0.0.1:8080/kvsnap/requantize\n");
  bind(sub, o, run_serve_cmd, "serve", exit_status);
}

}  // namespace kvsnap::cli
