// The HTTP face of kvsnap serve: a cpp-httplib server on --listen that
// forwards every request to the llama-server child and its answer back.
//
// Promises:
//   - method, request target (path and query, byte for byte), headers and
//     body go to the child unchanged (a body the `before` hook rewrote: as it left it), and its status, headers and body come
//     back unchanged, except the hop-by-hop headers (RFC 9110 7.6.1:
//     Connection and the fields it names, Keep-Alive, Proxy-Connection, TE,
//     Trailer, Transfer-Encoding, Upgrade), which each hop sets for itself;
//   - an answer without a Content-Length (llama-server's SSE streams) is
//     forwarded chunk by chunk as the child sends it, never buffered whole;
//     a client that goes away cancels the child's request, except one that
//     sent an X-Conversation-Id (llama-server generates on for a resume): its
//     stream is read to the end and handed to `on_done` as one that ended;
//   - a client that goes away before the child's answer begins (a completion
//     not streamed, until the child has generated all of it) cancels the
//     child's request too, within a quarter of a second (serve/hangup.h; the
//     same exception), and is handed to `on_given_up`;
//   - kvsnap never re-encodes a body (no compression of its own);
//   - clients are served concurrently (a thread pool), with keep-alive;
//   - a child that does not answer (restarting) is a 502 with a JSON error;
//   - a request body over ProxyOptions::max_request_bytes is a 413 with a JSON error, never forwarded;
//   - when an exchange has finished, `on_done` sees it (from the serving
//     thread: it must return quickly, e.g. hand the work to another thread),
//     before the client gets the answer's end: a sized answer's body, a
//     stream's end, and a stream's last event (ends_a_stream, serve/requests.h, even when
//     two chunks of the child's answer cut its marker), which waits
//     for the stream's end (at most 5 s) when the child sends it first;
//   - a stream that ends without being handed to `on_done` (its client hung
//     up, the child's stream was cut off, kvsnap is stopping), and a request
//     whose client hung up before its answer began, is handed to
//     `on_given_up` (set_on_given_up), from the serving thread;
//   - requests `local` claims (kvsnap's own routes) are answered here and
//     never forwarded, and never wait for the drain gate;
//   - every forwarded request holds a ticket of the drain gate (serve/drain.h)
//     from before the `before` hook until its answer has been passed on; one
//     that cannot get a ticket in time is answered 503 with Retry-After.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "serve/drain.h"
#include "serve/requests.h"

namespace kvsnap {

struct ProxyOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 8080;
  int upstream_port = 0;        // the child, on 127.0.0.1
  int threads = 32;             // concurrent clients (a streaming client holds one)
  // Connections accepted and waiting for one of `threads` (0: 4 x threads). Past them the proxy
  // stops accepting and new clients wait in the kernel's listen backlog: the open sockets stay
  // bounded whatever the number of clients.
  int max_waiting_connections = 0;
  double upstream_timeout_s = 3600;
  // The largest request body taken (after a Content-Encoding is undone, chunked or not): a larger one
  // is answered 413 and its connection closed, before anything is forwarded (kvsnap holds a body in
  // memory several times while it forwards it and parses a completion's).
  uint64_t max_request_bytes = uint64_t{256} << 20;
  // The child's API keys (--api-key, --api-key-file, LLAMA_API_KEY). With keys, a request whose key
  // is none of them goes to the child as it came, without the `before` hook (no slot gate, no
  // waiting for saves, no prefix lookup or restore into a slot): the child answers it (401, or one
  // of its public routes), so a client without a key makes kvsnap do no work on its behalf.
  std::vector<std::string> api_keys;
};

// A request about to be forwarded: a hook may rewrite its body (then body_changed).
struct Forward {
  std::string method, path;  // path without the query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool body_changed = false;
  // The body as a completion request: completion_request(), which parses it once for every reader.
  std::optional<Result<CompletionRequest>> request;
  // What the hook learned, carried into the Exchange.
  std::vector<int32_t> prompt_tokens;
  bool tokenized = false;  // prompt_tokens are the prompt's (an empty prompt: none)
  int pinned_slot = -1;
  bool several_slots = false;  // "n" > 1: the child may have used any free slot, not only the answer's
  // A completion that ran alone: the newest /slots id_task when it was let in, so that a slot whose
  // task is newer is its own (-1: unknown; every slot its save finds changed is taken as its own).
  int64_t own_after_task = -1;
  // When a completion came to the slot gate (Persister::note_unguarded's window starts before it).
  std::chrono::steady_clock::time_point arrived{};
  uint64_t restored_tokens = 0;
  // It runs with LoRA scales of its own, other than the child's loaded ones (serve/adapters.h).
  bool own_scales = false;
  // Set by the hook: the request is not forwarded; the client gets refused_status (503: with
  // Retry-After) with this JSON body.
  std::string refused;
  int refused_status = 503;
  // Held until the exchange is over, after on_done (a stream: until it ends or the client hangs up;
  // with an X-Conversation-Id, until it ends).
  std::shared_ptr<void> hold;
};

// f's body as parse_completion_request() reads it on f's route: parsed the first time, kept in f.request.
const Result<CompletionRequest>& completion_request(Forward& f);

// Sets "id_slot": slot in f's body (a JSON object's; false, the body untouched, for any other) and in
// f.request, which stays the reading of the body that goes to the child.
bool write_id_slot(Forward& f, int slot);

// A finished exchange, as far as kvsnap's persistence needs it.
struct Exchange {
  std::string method, path;  // path without the query
  std::vector<std::pair<std::string, std::string>> request_headers;
  std::string request_body;
  int status = 0;
  bool streamed = false;
  std::string response_body;  // a streamed answer: its last 64 KiB (the final events)
  std::vector<int32_t> prompt_tokens;  // from the Forward hook
  int pinned_slot = -1;
  bool several_slots = false;
  int64_t own_after_task = -1;
  std::chrono::steady_clock::time_point arrived{};
  uint64_t restored_tokens = 0;
  bool own_scales = false;  // Forward::own_scales
  // Its body is JSON kvsnap could not read (parse_completion_request's error): which LoRA scales
  // it ran with is unknown.
  bool request_unreadable = false;
  // The request carried one of the child's keys, or none is needed (ProxyOptions::api_keys): only
  // such an exchange reaches on_done / on_given_up. Without it (a browser's CORS preflight, which
  // llama-server answers 200 with no key) kvsnap does nothing for it.
  bool keyed = true;
};

// A request kvsnap answers itself, and its answer.
struct LocalRequest {
  std::string method, path, body;  // path without the query
  std::vector<std::pair<std::string, std::string>> headers;
};
struct LocalAnswer {
  int status = 200;
  std::string body, content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
};

class Proxy {
 public:
  // `before` (may be empty) runs on the serving thread before a request is forwarded; the client
  // waits for it.
  Proxy(ProxyOptions o, std::function<void(Forward&)> before, std::function<void(const Exchange&)> on_done);
  ~Proxy();
  // Both before run(). `local` returns false for the requests it does not answer.
  void set_local(std::function<bool(const LocalRequest&, LocalAnswer&)> local);
  void set_drain(Drain* drain, double max_wait_s);
  // Sees a stream not handed to `on_done`, as it stood (must return quickly).
  void set_on_given_up(std::function<void(const Exchange&)> f);
  // Binds --listen; kIOError naming the address when it is taken.
  Status bind();
  // Serves until stop() (blocks).
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The value of header `name` (case-insensitive), "" when absent.
std::string header_value(const std::vector<std::pair<std::string, std::string>>& h, const std::string& name);

// The API key of a request as llama-server reads it: Authorization (its "Bearer " cut), else X-Api-Key.
std::string request_api_key(const std::vector<std::pair<std::string, std::string>>& h);
// Whether `key` is one of `keys`, comparing every key in full (no early exit on a first differing byte).
bool api_key_among(const std::vector<std::string>& keys, const std::string& key);

// Who may use kvsnap's own routes (/kvsnap/...): with admin keys, a request carrying one of them and
// nobody else; without, with the child's API keys, one of those (as llama-server's own routes); with
// neither, anyone.
enum class RouteKeys { kAdmin, kChild, kOpen };
RouteKeys route_keys(const std::vector<std::string>& admin_keys, const std::vector<std::string>& child_keys);
bool may_use_kvsnap_routes(const std::vector<std::string>& admin_keys, const std::vector<std::string>& child_keys,
                           const std::vector<std::pair<std::string, std::string>>& headers);

}  // namespace kvsnap
