#include "server/llama_server.h"

#include <httplib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <fstream>

#include "base/json_access.h"
#include "base/os.h"
#include "format/llama_era.h"

namespace kvsnap {

using json = nlohmann::json;

namespace {

std::string strip_slash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// Where a reply's keys are named in messages.
std::string reply_doc(const std::string& url, const std::string& what) { return "llama-server " + url + ": " + what; }

Result<json> parse_reply(const std::string& body, const std::string& doc) {
  auto j = parse_json(body, doc, Code::kMismatch);
  if (!j.ok()) return Status::Mismatch(doc + ": the answer is not JSON: " + body.substr(0, 200));
  return j;
}

Result<int> int_or(const JsonRef& j, const char* key, int fallback) {
  KV_ASSIGN_OR_RETURN(int64_t v, j.integer_or(key, fallback, INT32_MIN, INT32_MAX));
  return int(v);
}

Status http_error(const std::string& prefix, long status, const std::string& body) {
  std::string m = prefix + ": HTTP " + std::to_string(status) + " " + parse_error_reply(body);
  switch (status) {
    case 401:
    case 403: return Status::InvalidArgument(m + " (check --api-key / the server profile's key)");
    case 404: return Status::NotFound(m);
    case 503: return Status::IOError(m + " (the server is loading or the slot is busy; try again)");
    case 501: return Status::NotSupported(m + " (start llama-server with --slot-save-path DIR)");
    default:
      // llama-server answers 500 when a restored file does not fit its context (other cache
      // types, another -c, another model): the usual cause on this path, said so.
      return Status::Mismatch(m + (status >= 500 ? " (see the server's log; " : " (") +
                              "does the file fit the server: its model, -c, -ctk/-ctv/-fa?)");
  }
}

// What went wrong below HTTP, in words (cpp-httplib's own names are one word: "Read").
// The largest reply kvsnap reads from llama-server: /slots and /tokenize of long prompts stay far
// below it.
constexpr size_t kMaxReplyBytes = size_t{64} << 20;

std::string transport_error(httplib::Error e, const std::string& url, double timeout_s) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect (is llama-server running at " + url + "?)";
    case httplib::Error::ConnectionTimeout: return "connecting timed out after 10 s";
    case httplib::Error::Read:
      return "no complete answer (the connection closed, or nothing came within the " +
             std::to_string(int(std::ceil(timeout_s))) + " s timeout)";
    case httplib::Error::Write: return "the request could not be sent (the connection closed)";
    case httplib::Error::SSLConnection: return "the TLS handshake failed";
    case httplib::Error::SSLLoadingCerts: return "the system's CA certificates could not be loaded";
    case httplib::Error::SSLServerVerification: return "the server's TLS certificate did not verify";
    default: return "HTTP client error: " + httplib::to_string(e);
  }
}

}  // namespace

Result<ServerUrl> split_server_url(const std::string& url) {
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("llama-server URL '" + url + "': " + why +
                                   " (expected http[s]://HOST[:PORT][/PATH], e.g. http://127.0.0.1:8080)");
  };
  if (url.find_first_of("?# \t\r\n") != std::string::npos) return refuse("a query, fragment or space is not supported");
  if (std::any_of(url.begin(), url.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return refuse("a control character is not allowed");
  ServerUrl u;
  std::string rest = url;
  u.scheme = "http";  // as curl took a bare host:port
  if (const size_t sep = rest.find("://"); sep != std::string::npos) {
    u.scheme = rest.substr(0, sep);
    for (char& c : u.scheme) c = char(std::tolower(static_cast<unsigned char>(c)));
    rest.erase(0, sep + 3);
  }
  if (u.scheme != "http" && u.scheme != "https") return refuse("the scheme is not http or https");
  const size_t path_at = rest.find('/');
  const std::string authority = rest.substr(0, path_at);
  if (path_at != std::string::npos) u.base = strip_slash(rest.substr(path_at));
  if (authority.find('@') != std::string::npos) return refuse("a user in the URL is not supported (use --api-key)");
  std::string port;
  bool has_port = false;
  if (authority.starts_with('[')) {  // an IPv6 literal
    const size_t close = authority.find(']');
    if (close == std::string::npos) return refuse("an IPv6 address without its ']'");
    u.host = authority.substr(1, close - 1);
    if (u.host.find('%') != std::string::npos) return refuse("an IPv6 zone id (%25...) is not supported");
    // Only an IPv6 address goes in brackets (hex digits and ':', '.' for an IPv4 tail): "[[fd00]"
    // or "[localhost]" would have gone to the resolver as a name with brackets.
    if (u.host.find(':') == std::string::npos || u.host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos)
      return refuse("'[" + u.host + "]' is not an IPv6 address");
    const std::string after = authority.substr(close + 1);
    if (!after.empty() && after[0] != ':') return refuse("something after the IPv6 address that is not :PORT");
    has_port = !after.empty();
    if (has_port) port = after.substr(1);
  } else {
    const size_t colon = authority.find(':');
    u.host = authority.substr(0, colon);
    has_port = colon != std::string::npos;
    if (has_port) port = authority.substr(colon + 1);
    if (port.find(':') != std::string::npos) return refuse("an IPv6 address must be in brackets ([::1]:8080)");
    if (u.host.find_first_of("[]") != std::string::npos) return refuse("a '[' or ']' outside an IPv6 address's brackets");
  }
  if (u.host.empty()) return refuse("no host");
  u.port = u.scheme == "https" ? 443 : 80;
  if (has_port && !port.empty()) {  // an empty port is the scheme's (RFC 3986 3.2.3), as curl took it
    // At most 5 digits, so stoi cannot throw.
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      return refuse("the port is not a number from 1 to 65535");
    u.port = std::stoi(port);
  }
  return u;
}

LlamaServer::LlamaServer(ServerEndpoint ep) : ep_(std::move(ep)) { ep_.url = strip_slash(ep_.url); }

Result<LlamaServer::Response> LlamaServer::request(const std::string& method, const std::string& path,
                                                   const std::string& body, const std::string& doing) {
  const std::string prefix = "llama-server " + ep_.url + ": " + doing;
  KV_ASSIGN_OR_RETURN(ServerUrl where, split_server_url(ep_.url));
  // /health and /props are answered by the HTTP thread at once, whatever the slots do: 30 s at most,
  // so that a server that hangs (stopped, or not llama-server) fails the command instead of holding
  // it, Ctrl-C included, for the hour a large slot's save may take. (/slots goes through the task
  // queue and waits for the batch being decoded: it keeps the long timeout.)
  constexpr double kQuestionTimeoutS = 30;
  const bool question = method == "GET" && (path == "/health" || path == "/props");
  const double timeout = std::max(question ? std::min(ep_.timeout_s, kQuestionTimeoutS) : ep_.timeout_s, 0.001);
  // cpp-httplib's client writes without MSG_NOSIGNAL: a server that closes the connection while
  // the request is sent would otherwise end the process with SIGPIPE.
  const ScopedSigpipeBlock no_sigpipe;
  try {
    // One connection per request, as kvsnap asks a few questions a command. Host and port are
    // given apart (the library's own URL parsing takes IPv6 literals of digits only). No proxy
    // from the environment, no redirects, no compression, the path sent as kvsnap wrote it.
    std::unique_ptr<httplib::ClientImpl> client;
    if (where.scheme == "https") {
#ifdef CPPHTTPLIB_OPENSSL_SUPPORT
      client = std::make_unique<httplib::SSLClient>(where.host, where.port);  // verifies the certificate
#else
      return Status::NotSupported(prefix + ": this kvsnap's HTTP client (cpp-httplib) was built without TLS: "
                                  "use http://");
#endif
    } else {
      client = std::make_unique<httplib::ClientImpl>(where.host, where.port);
    }
    const auto each = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(timeout));
    client->set_connection_timeout(10, 0);
    client->set_read_timeout(each);  // per read: llama-server answers a save or restore when done
    client->set_write_timeout(each);
    client->set_decompress(false);
    client->set_url_encode(false);
    // Host as RFC 9110 writes it (0.11.4 sends a bare IPv6 address, which proxies refuse).
    const bool v6 = where.host.find(':') != std::string::npos;
    const bool default_port = where.port == (where.scheme == "https" ? 443 : 80);
    httplib::Headers headers{{"Accept-Encoding", "identity"},
                             {"Host", (v6 ? "[" + where.host + "]" : where.host) +
                                          (default_port ? "" : ":" + std::to_string(where.port))}};
    if (!ep_.api_key.empty()) headers.emplace("Authorization", "Bearer " + ep_.api_key);
    httplib::Request req;
    req.method = method;
    req.path = where.base + path;
    req.headers = std::move(headers);
    if (method == "POST") {
      req.headers.emplace("Content-Type", "application/json");
      req.body = body;
    }
    // The body kvsnap keeps: at most kMaxReplyBytes (/health and /props: 1 MiB), whole within
    // body_timeout_s of its first byte (/health and /props: within 30 s of the request), given up
    // when ep_.stopped says so. A server that drips its reply, or sends one without end, would
    // otherwise hold the command (Ctrl-C included) or fill the memory.
    const size_t cap = question ? (size_t{1} << 20) : kMaxReplyBytes;
    const auto started = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> body_began;
    enum class Cut { kNone, kTooLarge, kTooSlow, kStopped } cut = Cut::kNone;
    std::string reply;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      const auto now = std::chrono::steady_clock::now();
      if (!body_began) body_began = now;
      const double body_s = std::chrono::duration<double>(now - *body_began).count();
      const double all_s = std::chrono::duration<double>(now - started).count();
      if (reply.size() + n > cap) cut = Cut::kTooLarge;
      else if (body_s > ep_.body_timeout_s || (question && all_s > kQuestionTimeoutS)) cut = Cut::kTooSlow;
      else if (ep_.stopped && ep_.stopped()) cut = Cut::kStopped;
      if (cut != Cut::kNone) return false;
      reply.append(data, n);
      return true;
    };
    httplib::Result res = client->send(req);
    switch (cut) {
      case Cut::kNone: break;
      case Cut::kTooLarge:
        return Status::IOError(prefix + ": the reply is larger than " + std::to_string(cap >> 20) +
                               " MiB, which no llama-server answer is (is " + ep_.url + " llama-server?)");
      case Cut::kTooSlow:
        return Status::IOError(prefix + ": the reply did not arrive whole within " +
                               std::to_string(int(std::ceil(question ? kQuestionTimeoutS : ep_.body_timeout_s))) +
                               " s (is " + ep_.url + " llama-server?)");
      case Cut::kStopped: return Status::Interrupted(prefix + ": stopped");
    }
    if (!res) return Status::IOError(prefix + ": " + transport_error(res.error(), ep_.url, timeout));
    Response r;
    r.status = res->status;
    r.body = std::move(reply);
    return r;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // no exception leaves the module
    return Status::IOError(prefix + ": HTTP client error: " + e.what());
  }
}

Result<std::string> LlamaServer::call(const std::string& method, const std::string& path, const json* body,
                                      const std::string& doing) {
  KV_ASSIGN_OR_RETURN(Response r, request(method, path, body ? json_text(*body) : std::string(), doing));
  if (r.status < 200 || r.status >= 300) return http_error(reply_doc(ep_.url, doing), r.status, r.body);
  return std::move(r.body);
}

Status LlamaServer::health() {
  KV_ASSIGN_OR_RETURN(std::string body, call("GET", "/health", nullptr, "checking /health"));
  return parse_reply(body, reply_doc(ep_.url, "checking /health")).status();
}

Result<json> LlamaServer::props() {
  KV_ASSIGN_OR_RETURN(std::string body, call("GET", "/props", nullptr, "reading /props"));
  return parse_reply(body, reply_doc(ep_.url, "reading /props"));
}

Result<std::vector<SlotState>> LlamaServer::slots() {
  KV_ASSIGN_OR_RETURN(std::string body, call("GET", "/slots", nullptr, "listing slots"));
  return parse_slots_reply(body, reply_doc(ep_.url, "listing slots"));
}

Result<SlotFileResult> LlamaServer::save_slot(int slot, const std::string& filename) {
  json body = {{"filename", filename}};
  const std::string doing = "saving slot " + std::to_string(slot) + " to '" + filename + "'";
  KV_ASSIGN_OR_RETURN(std::string reply, call("POST", "/slots/" + std::to_string(slot) + "?action=save", &body, doing));
  return parse_slot_file_reply(reply, reply_doc(ep_.url, doing), /*restore=*/false);
}

Result<SlotFileResult> LlamaServer::restore_slot(int slot, const std::string& filename) {
  json body = {{"filename", filename}};
  const std::string doing = "restoring slot " + std::to_string(slot) + " from '" + filename + "'";
  KV_ASSIGN_OR_RETURN(std::string reply,
                      call("POST", "/slots/" + std::to_string(slot) + "?action=restore", &body, doing));
  return parse_slot_file_reply(reply, reply_doc(ep_.url, doing), /*restore=*/true);
}

Status LlamaServer::erase_slot(int slot) {
  json body = json::object();
  const std::string doing = "erasing slot " + std::to_string(slot);
  KV_ASSIGN_OR_RETURN(std::string reply, call("POST", "/slots/" + std::to_string(slot) + "?action=erase", &body, doing));
  return parse_reply(reply, reply_doc(ep_.url, doing)).status();
}

Result<std::vector<int32_t>> LlamaServer::tokenize(const std::string& text, bool add_special) {
  json body = {{"content", text}, {"add_special", add_special}};
  KV_ASSIGN_OR_RETURN(std::string reply, call("POST", "/tokenize", &body, "tokenizing"));
  return parse_tokenize_reply(reply, reply_doc(ep_.url, "tokenizing"));
}

Result<CompletionResult> LlamaServer::complete(int slot, json body) {
  body["id_slot"] = slot;
  body["cache_prompt"] = true;
  const std::string doing = "completing on slot " + std::to_string(slot);
  KV_ASSIGN_OR_RETURN(std::string reply, call("POST", "/completion", &body, doing));
  return parse_completion_reply(reply, reply_doc(ep_.url, doing));
}

// --- Replies: outside JSON, read only through JsonRef -----------------------------------

ServerBuild parse_server_build(const nlohmann::json& props) {
  ServerBuild b;
  auto text = JsonRef(props, "/props").string_or("build_info", "");
  if (!text.ok() || text->empty()) return b;
  b.reported = *text;
  // "b<number>-<commit>" (format/llama_era.h reads builds; a server reports no release tag)
  const Result<LlamaBuild> build = parse_llama_build(b.reported);
  if (b.reported[0] != 'b' || !build.ok() || build->is_tag()) {
    b.why_not = "not of the form b<number>-<commit>";
    return b;
  }
  const uint32_t number = build->number;
  if (number < kFirstPlausibleServerBuild) {
    b.why_not = "build number " + std::to_string(number) + " is below any llama-server that saves slots: a build "
                "without git history (source bundle, tarball) says nothing of its era";
    return b;
  }
  b.usable = "b" + std::to_string(number);
  return b;
}

std::string parse_error_reply(const std::string& body) {
  // {"error": {"code": 400, "message": "...", "type": "..."}} or {"error": "..."}; else the body itself.
  auto j = parse_json(body, "error reply");
  if (j.ok()) {
    const JsonRef root(*j, "error reply");
    auto e = root.find("error");
    if (e.ok() && *e) {
      if (auto msg = (*e)->string(); msg.ok()) return *msg;
      auto type = (*e)->string_or("type", "");
      auto msg = (*e)->string_or("message", "");
      if (type.ok() && msg.ok()) return type->empty() ? *msg : *type + ": " + *msg;
    }
  }
  std::string b = body.substr(0, 300);
  return b.empty() ? "(empty response)" : b;
}


Result<std::vector<SlotState>> parse_slots_reply(const std::string& body, const std::string& doc) {
  KV_ASSIGN_OR_RETURN(json j, parse_reply(body, doc));
  const JsonRef root(j, doc, Code::kMismatch);
  if (!j.is_array()) return root.error("did not return a list");
  return root.elements_as<SlotState>([](const JsonRef& s) -> Result<SlotState> {
    SlotState st;
    KV_ASSIGN_OR_RETURN(st.id, int_or(s, "id", -1));
    KV_ASSIGN_OR_RETURN(st.is_processing, s.boolean_or("is_processing", false));
    KV_ASSIGN_OR_RETURN(st.n_ctx, int_or(s, "n_ctx", 0));
    st.raw = s.json();
    return st;
  });
}

// save and restore answer alike: {"n_saved"|"n_restored", "n_written"|"n_read", "timings": {"save_ms"|"restore_ms"}}.
Result<SlotFileResult> parse_slot_file_reply(const std::string& body, const std::string& doc, bool restore) {
  KV_ASSIGN_OR_RETURN(json j, parse_reply(body, doc));
  const JsonRef root(j, doc, Code::kMismatch);
  SlotFileResult r;
  // Required: a reply without them (another JSON API on that port, a gateway's {"ok": true}) did
  // not save or restore anything, whatever its status (a review's finding: "slot 0: 0 tokens", exit 0).
  KV_ASSIGN_OR_RETURN(r.n_tokens, root.unsigned_at(restore ? "n_restored" : "n_saved"));
  KV_ASSIGN_OR_RETURN(r.n_bytes, root.unsigned_at(restore ? "n_read" : "n_written"));
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> timings, root.find("timings"));
  if (timings && timings->json().is_object()) {
    KV_ASSIGN_OR_RETURN(r.ms, timings->number_or(restore ? "restore_ms" : "save_ms", 0.0));
  }
  return r;
}

Result<std::vector<int32_t>> parse_tokenize_reply(const std::string& body, const std::string& doc) {
  KV_ASSIGN_OR_RETURN(json j, parse_reply(body, doc));
  const JsonRef root(j, doc, Code::kMismatch);
  auto tokens = root.at("tokens");
  if (!tokens.ok() || !tokens->json().is_array()) return root.error("returned no token list");
  return tokens->elements_as<int32_t>([](const JsonRef& t) -> Result<int32_t> {
    // A token is a number, or {"id": N, "piece": ...} when pieces were asked for.
    auto id = t.json().is_number() ? t.integer(INT32_MIN, INT32_MAX) : t.integer_or("id", -1, INT32_MIN, INT32_MAX);
    if (!id.ok()) return id.status();
    return int32_t(*id);
  });
}

Result<CompletionResult> parse_completion_reply(const std::string& body, const std::string& doc) {
  KV_ASSIGN_OR_RETURN(json j, parse_reply(body, doc));
  const JsonRef root(j, doc, Code::kMismatch);
  CompletionResult r;
  KV_ASSIGN_OR_RETURN(r.content, root.string_or("content", ""));
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> timings, root.find("timings"));
  if (timings) {
    KV_ASSIGN_OR_RETURN(r.prompt_n, timings->unsigned_or("prompt_n", 0));
    KV_ASSIGN_OR_RETURN(r.cache_n, timings->unsigned_or("cache_n", 0));
  }
  r.raw = std::move(j);
  return r;
}

Result<std::string> read_api_key_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::NotFound(path + ": cannot read the API key file");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    return Status::InvalidArgument(path + ": the API key file is readable by others; chmod 600 it");
  std::ifstream in(path);
  std::string key;
  std::getline(in, key);
  while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) key.pop_back();
  if (key.empty()) return Status::InvalidArgument(path + ": the API key file is empty");
  return key;
}

}  // namespace kvsnap
