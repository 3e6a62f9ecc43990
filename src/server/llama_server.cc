#include "server/llama_server.h"

#include <curl/curl.h>
#include <sys/stat.h>

#include <fstream>
#include <mutex>

namespace kvsnap {

using json = nlohmann::json;

namespace {

void global_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t collect(char* p, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(p, size * n);
  return size * n;
}

std::string strip_slash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

// llama-server's error body: {"error": {"code": 400, "message": "...", "type": "..."}}.
std::string server_message(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const json& e = j["error"];
    if (e.is_object()) {
      std::string type = e.value("type", "");
      std::string msg = e.value("message", "");
      return type.empty() ? msg : type + ": " + msg;
    }
    if (e.is_string()) return e.get<std::string>();
  }
  std::string b = body.substr(0, 300);
  return b.empty() ? "(empty response)" : b;
}

Status http_error(const std::string& prefix, long status, const std::string& body) {
  std::string m = prefix + ": HTTP " + std::to_string(status) + " " + server_message(body);
  switch (status) {
    case 401:
    case 403: return Status::InvalidArgument(m + " (check --api-key / the server profile's key)");
    case 404: return Status::NotFound(m);
    case 503: return Status::IOError(m + " (the server is loading or the slot is busy; try again)");
    case 501: return Status::NotSupported(m + " (start llama-server with --slot-save-path DIR)");
    default: return Status::Mismatch(m);
  }
}

}  // namespace

LlamaServer::LlamaServer(ServerEndpoint ep) : ep_(std::move(ep)) { ep_.url = strip_slash(ep_.url); }

Result<LlamaServer::Response> LlamaServer::request(const std::string& method, const std::string& path,
                                                   const std::string& body, const std::string& doing) {
  global_init_once();
  const std::string prefix = "llama-server " + ep_.url + ": " + doing;
  std::unique_ptr<CURL, void (*)(CURL*)> h(curl_easy_init(), curl_easy_cleanup);
  if (!h) return Status::IOError(prefix + ": cannot initialize libcurl");
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Content-Type: application/json");
  if (!ep_.api_key.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + ep_.api_key).c_str());
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> hold(headers, curl_slist_free_all);
  Response r;
  const std::string url = ep_.url + path;
  curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h.get(), CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(h.get(), CURLOPT_TIMEOUT_MS, long(ep_.timeout_s * 1000));
  curl_easy_setopt(h.get(), CURLOPT_NOPROXY, "*");  // a local server; a proxy would only get in the way
  if (method == "POST") {
    curl_easy_setopt(h.get(), CURLOPT_POST, 1L);
    curl_easy_setopt(h.get(), CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(h.get(), CURLOPT_POSTFIELDSIZE, long(body.size()));
  }
  CURLcode rc = curl_easy_perform(h.get());
  if (rc != CURLE_OK) {
    std::string why = curl_easy_strerror(rc);
    if (rc == CURLE_COULDNT_CONNECT) why += " (is llama-server running at " + ep_.url + "?)";
    return Status::IOError(prefix + ": " + why);
  }
  curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &r.status);
  return r;
}

Result<json> LlamaServer::call(const std::string& method, const std::string& path, const json* body,
                               const std::string& doing) {
  KV_ASSIGN_OR_RETURN(Response r, request(method, path, body ? body->dump() : std::string(), doing));
  const std::string prefix = "llama-server " + ep_.url + ": " + doing;
  if (r.status < 200 || r.status >= 300) return http_error(prefix, r.status, r.body);
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return Status::Mismatch(prefix + ": the answer is not JSON: " + r.body.substr(0, 200));
  return j;
}

Status LlamaServer::health() { return call("GET", "/health", nullptr, "checking /health").status(); }

Result<json> LlamaServer::props() { return call("GET", "/props", nullptr, "reading /props"); }

Result<std::vector<SlotState>> LlamaServer::slots() {
  KV_ASSIGN_OR_RETURN(json j, call("GET", "/slots", nullptr, "listing slots"));
  if (!j.is_array()) return Status::Mismatch("llama-server " + ep_.url + ": /slots did not return a list");
  std::vector<SlotState> out;
  for (const json& s : j) {
    SlotState st;
    st.id = s.value("id", -1);
    st.is_processing = s.value("is_processing", false);
    st.n_ctx = s.value("n_ctx", 0);
    st.raw = s;
    out.push_back(std::move(st));
  }
  return out;
}

namespace {

// save and restore answer alike: {"n_saved"|"n_restored", "n_written"|"n_read", "timings": {"save_ms"|"restore_ms"}}.
SlotFileResult slot_file_result(const json& j, const char* tokens, const char* bytes, const char* ms) {
  SlotFileResult r;
  r.n_tokens = j.value(tokens, uint64_t(0));
  r.n_bytes = j.value(bytes, uint64_t(0));
  if (j.contains("timings") && j["timings"].is_object()) r.ms = j["timings"].value(ms, 0.0);
  return r;
}

}  // namespace

Result<SlotFileResult> LlamaServer::save_slot(int slot, const std::string& filename) {
  json body = {{"filename", filename}};
  KV_ASSIGN_OR_RETURN(json j, call("POST", "/slots/" + std::to_string(slot) + "?action=save", &body,
                                   "saving slot " + std::to_string(slot) + " to '" + filename + "'"));
  return slot_file_result(j, "n_saved", "n_written", "save_ms");
}

Result<SlotFileResult> LlamaServer::restore_slot(int slot, const std::string& filename) {
  json body = {{"filename", filename}};
  KV_ASSIGN_OR_RETURN(json j, call("POST", "/slots/" + std::to_string(slot) + "?action=restore", &body,
                                   "restoring slot " + std::to_string(slot) + " from '" + filename + "'"));
  return slot_file_result(j, "n_restored", "n_read", "restore_ms");
}

Status LlamaServer::erase_slot(int slot) {
  json body = json::object();
  return call("POST", "/slots/" + std::to_string(slot) + "?action=erase", &body,
              "erasing slot " + std::to_string(slot))
      .status();
}

Result<std::vector<int32_t>> LlamaServer::tokenize(const std::string& text, bool add_special) {
  json body = {{"content", text}, {"add_special", add_special}};
  KV_ASSIGN_OR_RETURN(json j, call("POST", "/tokenize", &body, "tokenizing"));
  std::vector<int32_t> out;
  if (!j.contains("tokens") || !j["tokens"].is_array())
    return Status::Mismatch("llama-server " + ep_.url + ": /tokenize returned no token list");
  for (const json& t : j["tokens"]) out.push_back(t.is_number() ? t.get<int32_t>() : t.value("id", -1));
  return out;
}

Result<CompletionResult> LlamaServer::complete(int slot, json body) {
  body["id_slot"] = slot;
  body["cache_prompt"] = true;
  KV_ASSIGN_OR_RETURN(json j, call("POST", "/completion", &body, "completing on slot " + std::to_string(slot)));
  CompletionResult r;
  r.content = j.value("content", "");
  if (j.contains("timings")) {
    r.prompt_n = j["timings"].value("prompt_n", uint64_t(0));
    r.cache_n = j["timings"].value("cache_n", uint64_t(0));
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
