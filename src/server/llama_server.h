// A client for the parts of llama-server's HTTP API that kvsnap drives:
// /health, /props, /slots, POST /slots/{id}?action=save|restore|erase,
// /tokenize and /completion. Blocking, one request at a time, cpp-httplib inside (the client
// kvsnap serve's proxy uses too; http:// always, https:// where cpp-httplib has TLS, as Debian's).
//
// Every error names the server, what kvsnap was doing and what the server
// said ("llama-server http://127.0.0.1:8080: restoring slot 0 from
// 'kvsnap-1a2b.bin': HTTP 400 invalid_request_error: failed to restore slot").
// A refused connection is kIOError ("is the server running?"), 401 a wrong or
// missing API key (kInvalidArgument), 404 an unknown endpoint or slot
// (kNotFound), 503 a server still loading or a busy slot (kIOError), other
// HTTP errors kMismatch. No exceptions leave this module.
#pragma once

#include <memory>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace kvsnap {

struct ServerEndpoint {
  ServerEndpoint() = default;
  ServerEndpoint(std::string u, std::string key, double timeout)
      : url(std::move(u)), api_key(std::move(key)), timeout_s(timeout) {}
  std::string url;      // "http://127.0.0.1:8080" (a trailing slash is fine)
  std::string api_key;  // sent as "Authorization: Bearer KEY", as llama-server expects
  double timeout_s = 3600;  // per read or write of a request (llama-server answers a large slot's
                            // save or restore when done); 10 s to connect
  // A reply's body, once it has begun, arrives whole within this (llama-server's are small JSON):
  // a server that drips it is given up, whatever timeout_s says.
  double body_timeout_s = 30;
  // Asked while a reply's body arrives: true gives the request up (kInterrupted). The CLI's
  // interrupted() (Ctrl-C, SIGTERM); empty: never.
  std::function<bool()> stopped;
};

struct SlotState {
  int id = 0;
  bool is_processing = false;
  int n_ctx = 0;
  nlohmann::json raw;
};

struct SlotFileResult {  // save and restore
  uint64_t n_tokens = 0;  // n_saved / n_restored
  uint64_t n_bytes = 0;   // n_written / n_read
  double ms = 0;          // the server's own timing
};

struct CompletionResult {
  std::string content;
  uint64_t prompt_n = 0;  // prompt tokens the server evaluated (not taken from its cache)
  uint64_t cache_n = 0;   // prompt tokens it reused
  nlohmann::json raw;
};

// A server URL split for the HTTP client: scheme ("http" or "https"), host (an IPv6 literal without
// its brackets), port (80/443 when not given) and the path under it ("" or "/prefix", no trailing
// slash). No scheme means http (as curl read it); a user, query, fragment, space, unbracketed IPv6
// address or a port outside 1..65535 is refused (kInvalidArgument, naming the URL).
struct ServerUrl {
  std::string scheme;
  std::string host;
  int port = 0;
  std::string base;
};
Result<ServerUrl> split_server_url(const std::string& url);

class LlamaServer {
 public:
  explicit LlamaServer(ServerEndpoint ep);
  const std::string& url() const { return ep_.url; }

  Status health();
  Result<nlohmann::json> props();
  Result<std::vector<SlotState>> slots();
  Result<SlotFileResult> save_slot(int slot, const std::string& filename);
  Result<SlotFileResult> restore_slot(int slot, const std::string& filename);
  Status erase_slot(int slot);
  Result<std::vector<int32_t>> tokenize(const std::string& text, bool add_special);
  // POST /completion with `body` plus id_slot and cache_prompt = true.
  Result<CompletionResult> complete(int slot, nlohmann::json body);

  // The raw exchange: kvsnap uses the typed calls above.
  struct Response {
    long status = 0;
    std::string body;
  };
  Result<Response> request(const std::string& method, const std::string& path, const std::string& body,
                           const std::string& doing);

 private:
  // The reply's body, or the HTTP error as a Status.
  Result<std::string> call(const std::string& method, const std::string& path, const nlohmann::json* body,
                           const std::string& doing);
  ServerEndpoint ep_;
};

// The pure parsers of llama-server's replies (no I/O), for the client above
// and the fuzz targets. `doc` names the reply in messages; a reply that is not
// JSON or has a key of the wrong type is kMismatch naming the key path.
Result<std::vector<SlotState>> parse_slots_reply(const std::string& body, const std::string& doc);
// POST /slots/N?action=save (restore = false) or ?action=restore.
Result<SlotFileResult> parse_slot_file_reply(const std::string& body, const std::string& doc, bool restore);
Result<std::vector<int32_t>> parse_tokenize_reply(const std::string& body, const std::string& doc);
Result<CompletionResult> parse_completion_reply(const std::string& body, const std::string& doc);
// What an error reply says ("type: message"), else the start of the body.
std::string parse_error_reply(const std::string& body);

// llama-server's build, as GET /props reports it in build_info ("b8121-1a2b3c4",
// from about b6xxx on). A build compiled without git history (a source
// bundle or tarball) reports a meaningless number such as b0 or b1: it is
// kept as reported but is no evidence of the file layout or the rotation.
struct ServerBuild {
  std::string reported;  // as the server said it; empty: no build_info in /props
  std::string usable;    // "b8121": the build number, when plausible
  std::string why_not;   // when reported but not usable
};
ServerBuild parse_server_build(const nlohmann::json& props);
// No llama-server before this build saved slots (b2xxx, spring 2024).
inline constexpr uint32_t kFirstPlausibleServerBuild = 2000;

// Reads an API key from a file (first line, trimmed), refusing files others can read.
Result<std::string> read_api_key_file(const std::string& path);

}  // namespace kvsnap
