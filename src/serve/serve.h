// kvsnap serve: llama-server supervised as a child on a private loopback
// port, behind a proxy on --listen that forwards everything unchanged and
// persists the slots into the store (serve/supervisor.h, serve/proxy.h,
// serve/persist.h say what each part promises).
//
// run_serve() blocks until SIGTERM or SIGINT; then it stops accepting
// requests, lets the ones in flight finish, saves every filled slot, stops
// the child (no process is left behind) and returns.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "store/store_location.h"

namespace kvsnap {

struct ServeOptions {
  std::string listen = "127.0.0.1:8080";  // HOST:PORT (":PORT" = 127.0.0.1)
  std::string store;                      // --store DIR; empty: $KVSNAP_HOME, else XDG
  StoreKeyConfig keys;                    // --key-file/--key-command/--tenant over store.json's
  bool tenant_per_namespace = false;      // each namespace its own tenant (serve/tenant_stores.h)
  std::string log_file;                   // the child's output; empty: STORE/serve/llama-server.log
  std::vector<std::string> llama;         // llama-server and its ARGS
  int threads = 32;
  std::string dynamic_cache;  // --dynamic-cache LADDER (serve/ladder.h); empty: off
  std::string cache_budget;   // --cache-budget BYTES, with the ladder
  std::string max_request_bytes = "256M";  // --max-request-bytes: the largest request body (ProxyOptions)
  // --admin-key-file (one key a line, '#' comments) and KVSNAP_ADMIN_KEY: with either, kvsnap's own
  // routes (/kvsnap/...) want one of these keys and no longer take the child's API keys.
  std::string admin_key_file;
  std::string admin_key;  // from the environment
};

// "HOST:PORT" -> host, port; kInvalidArgument naming --listen otherwise.
Status parse_listen(const std::string& s, std::string& host, int& port);

// `log` gets one line per event (also the line saying where it listens). A SIGTERM, SIGINT or
// SIGHUP while the child loads its model stops serve (kInterrupted) and is stored in
// `*stopped_by` (when given), so that the process can end by it as every stopped command does
// (cli/progress.h); a stop once serving is graceful and returns OK.
Status run_serve(Io& io, const ServeOptions& o, const std::function<void(const std::string&)>& log,
                 int* stopped_by = nullptr);

}  // namespace kvsnap
