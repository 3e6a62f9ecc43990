#include "store/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "base/parallel.h"
#include "base/sha256.h"
#include "base/text.h"
#include "store/lazy_libs.h"
#include "store/s3_sigv4.h"

namespace kvsnap {

using Headers = std::vector<std::pair<std::string, std::string>>;

// One HTTP exchange as the client asks for it.
struct S3Client::Call {
  Call(std::string m, std::string_view k) : method(std::move(m)), key(k) {}
  std::string method;
  std::string key;  // "" = the bucket itself
  Headers query;    // unencoded
  Headers headers;  // besides host, x-amz-date, x-amz-content-sha256 (all signed)
  std::span<const std::byte> body;
  // Where a 2xx body goes: `into_vec` (up to `max` bytes), `into_span`
  // (exactly; more is an error) or, with neither, Reply::body (XML, capped).
  std::vector<std::byte>* into_vec = nullptr;
  std::span<std::byte> into_span;
  bool to_span = false;
  uint64_t max = 0;
};

struct S3Client::Reply {
  long status = 0;
  std::string body;  // an error body, or a 2xx body with no sink
  std::string etag;  // the ETag header, quotes kept
  uint64_t received = 0;
  int64_t content_length = -1;
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  bool over_cap = false;  // the body was larger than the caller's cap
  int attempts = 0;
  double seconds = 0;
};

namespace {

constexpr uint64_t kMaxXmlBytes = 16ull << 20;
constexpr uint64_t kMaxErrorBytes = 64ull << 10;

struct Transfer {
  CURL* h;
  S3Client::Call* call;
  S3Client::Reply* reply;
  size_t sent = 0;
};

size_t on_body(char* p, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  long status = 0;
  curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
  S3Client::Call& c = *t->call;
  S3Client::Reply& r = *t->reply;
  const bool ok = status >= 200 && status < 300;
  if (ok && c.to_span) {
    if (r.received + len > c.into_span.size()) return r.over_cap = true, 0;
    std::memcpy(c.into_span.data() + r.received, p, len);
  } else if (ok && c.into_vec) {
    if (r.received + len > c.max) return r.over_cap = true, 0;
    const auto* b = reinterpret_cast<const std::byte*>(p);
    c.into_vec->insert(c.into_vec->end(), b, b + len);
  } else if (!ok) {
    // An error body: its start holds <Code> and <Message>; the rest is dropped, not an error.
    if (r.body.size() < kMaxErrorBytes) r.body.append(p, std::min(len, size_t(kMaxErrorBytes - r.body.size())));
  } else {
    if (r.body.size() + len > kMaxXmlBytes) return r.over_cap = true, 0;
    r.body.append(p, len);
  }
  r.received += len;
  return len;
}

size_t on_header(char* p, size_t size, size_t n, void* user) {
  auto* r = static_cast<S3Client::Reply*>(user);
  const std::string_view line(p, size * n);
  constexpr std::string_view kEtag = "etag:";
  if (line.size() > kEtag.size() && strncasecmp(line.data(), kEtag.data(), kEtag.size()) == 0) {
    std::string_view v = line.substr(kEtag.size());
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
    r->etag = v;
  }
  return size * n;
}

size_t on_read(char* dst, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t left = t->call->body.size() - t->sent;
  const size_t len = std::min(left, size * n);
  std::memcpy(dst, t->call->body.data() + t->sent, len);
  t->sent += len;
  return len;
}

int on_seek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || uint64_t(offset) > t->call->body.size()) return CURL_SEEKFUNC_CANTSEEK;
  t->sent = size_t(offset);
  return CURL_SEEKFUNC_OK;
}

bool retriable(const S3Client::Reply& r) {
  if (r.over_cap) return false;
  if (r.curl != CURLE_OK)
    return r.curl != CURLE_URL_MALFORMAT && r.curl != CURLE_UNSUPPORTED_PROTOCOL && r.curl != CURLE_OUT_OF_MEMORY;
  if (r.status == 501) return false;  // Not Implemented: the same request fails the same way again
  if (r.status >= 500 || r.status == 429) return true;
  const std::string code = parse_s3_error(r.body).code;
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError";
}

// Full jitter on half the delay: spreads many writers that failed together.
int backoff_ms(const S3RetryPolicy& p, int attempt) {
  const int64_t d = std::min<int64_t>(p.max_delay_ms, int64_t(p.base_delay_ms) << std::min(attempt - 1, 20));
  thread_local std::mt19937 rng{std::random_device{}()};
  return int(std::uniform_int_distribution<int64_t>(d / 2, d)(rng));
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    uint8_t v = 0;
    if (s[i] == '%' && i + 2 < s.size() && from_hex(s.substr(i + 1, 2), std::span<uint8_t>(&v, 1))) {
      out += char(v);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// What a message may show of an S3 address: never its credentials, whatever they hold. A bare
// s3:// address has none, unless its query names an endpoint with some (then the query is hidden);
// any other (s3+http(s)://ACCESS:SECRET@HOST/..., or no known scheme) is shown from its last '@' on,
// since a secret pasted with a raw '/', '?' or '@' does not end where a URL's user part would.
std::string shown_s3_location(std::string_view loc) {
  const size_t scheme_end = loc.find("://");
  if (scheme_end != std::string_view::npos && loc.substr(0, scheme_end) == "s3") {
    const size_t q = loc.find('?');
    if (q != std::string_view::npos) {
      std::string query(loc.substr(q));
      for (char& ch : query) ch = char(std::tolower(static_cast<unsigned char>(ch)));
      if (query.find('@') != std::string::npos || query.find("%40") != std::string::npos)
        return quote_text(std::string(loc.substr(0, q)) + "?...", 200);
    }
    return quote_text(loc, 200);
  }
  const size_t at = loc.rfind('@');
  if (at == std::string_view::npos) return quote_text(loc, 200);
  const std::string scheme = scheme_end != std::string_view::npos && scheme_end < at
                                 ? std::string(loc.substr(0, scheme_end + 3)) : std::string();
  return quote_text(scheme + std::string(loc.substr(at + 1)), 200);
}

}  // namespace

Result<S3Location> parse_s3_location(std::string_view loc) {
  const std::string shown = shown_s3_location(loc);
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("S3 location " + shown + ": " + why +
                                   " (expected s3://BUCKET[/PREFIX][?endpoint=URL&region=R] or "
                                   "s3+http[s]://[ACCESS:SECRET@]HOST[:PORT]/BUCKET[/PREFIX][?region=R])");
  };
  const size_t scheme_end = loc.find("://");
  if (scheme_end == std::string_view::npos) return bad("no scheme");
  const std::string_view scheme = loc.substr(0, scheme_end);
  const bool bare = scheme == "s3";  // s3://BUCKET/PREFIX: the endpoint from ?endpoint= or the environment
  if (!bare && scheme != "s3+http" && scheme != "s3+https") return bad("unknown scheme");
  std::string_view rest = loc.substr(scheme_end + 3);
  std::string_view query;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  S3Location out;
  S3Config& c = out.config;
  std::string_view authority;
  if (!bare) {
    const size_t slash = rest.find('/');
    authority = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
      const std::string_view user = authority.substr(0, at);
      const size_t colon = user.find(':');
      if (colon == std::string_view::npos) return bad("credentials without ':' between access key and secret");
      c.access_key = percent_decode(user.substr(0, colon));
      c.secret_key = percent_decode(user.substr(colon + 1));
      authority = authority.substr(at + 1);
    }
    if (authority.empty()) return bad("no host");
    c.endpoint = std::string(scheme.substr(3)) + "://" + std::string(authority);
  }
  // An '@' past the host: the credentials held a raw '/' or '?', which ended the host early (their
  // pieces are now in the path or the query, so nothing of either is parsed or shown).
  if (!bare && (rest.find('@') != std::string_view::npos || query.find('@') != std::string_view::npos))
    return bad("an '@' after the host: write a '/', '?' or '@' of the access key or secret as %2F, %3F or %40");
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t bslash = rest.find('/');
  c.bucket = std::string(rest.substr(0, bslash));
  if (c.bucket.empty()) return bad("no bucket");
  if (bslash != std::string_view::npos) {
    out.prefix = std::string(rest.substr(bslash + 1));
    // "BUCKET//PREFIX" or "A//B": a key prefix with an empty segment, a typo more likely than meant
    // (and not the same keys as without it): refused rather than read either way.
    if (out.prefix.empty() || out.prefix.front() == '/' || out.prefix.find("//") != std::string::npos)
      return bad("an empty segment ('//') in the key prefix");
  }
  bool region_given = false;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (kv.starts_with("region=") && kv.size() > 7) {
      c.region = percent_decode(kv.substr(7));
      region_given = true;
    } else if (bare && kv.starts_with("endpoint=") && kv.size() > 9) {
      c.endpoint = percent_decode(kv.substr(9));
    } else {
      return bad("unknown parameter " + quote_text(kv, 40));
    }
  }
  if (!region_given) {
    if (const char* r = env_or_null("AWS_REGION")) c.region = r;
    else if (const char* r2 = env_or_null("AWS_DEFAULT_REGION")) c.region = r2;
  }
  if (c.endpoint.empty()) {
    if (const char* e = env_or_null("AWS_ENDPOINT_URL_S3")) c.endpoint = e;
    else if (const char* e2 = env_or_null("AWS_ENDPOINT_URL")) c.endpoint = e2;
    else c.endpoint = "https://s3." + c.region + ".amazonaws.com";
  }
  if (c.endpoint.find('@') != std::string::npos)  // not shown: what precedes it may be a password
    return bad("the endpoint has a user part: give the credentials as ACCESS:SECRET@ of s3+http[s]://, or in "
               "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
  if (!c.endpoint.starts_with("http://") && !c.endpoint.starts_with("https://"))
    return bad("endpoint " + quote_text(c.endpoint, 80) + " is not an http:// or https:// URL");
  if (c.access_key.empty()) {
    const char* a = env_or_null("AWS_ACCESS_KEY_ID");
    const char* s = env_or_null("AWS_SECRET_ACCESS_KEY");
    if (!a || !s) return bad("no credentials: give ACCESS:SECRET@ or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
    c.access_key = a;
    c.secret_key = s;
  }
  const std::string path = c.bucket + (out.prefix.empty() ? "" : "/" + out.prefix);
  out.redacted = bare ? "s3://" + path + " at " + c.endpoint : std::string(scheme) + "://" + std::string(authority) + "/" + path;
  return out;
}

S3Client::S3Client(S3Config config) : cfg_(std::move(config)) {
  while (!cfg_.endpoint.empty() && cfg_.endpoint.back() == '/') cfg_.endpoint.pop_back();
  const size_t scheme_end = cfg_.endpoint.find("://");
  host_ = scheme_end == std::string::npos ? cfg_.endpoint : cfg_.endpoint.substr(scheme_end + 3);
}

S3Client::~S3Client() {
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

std::string S3Client::url(std::string_view key) const {
  return cfg_.endpoint + uri_encode_path("/" + cfg_.bucket + (key.empty() ? "" : "/" + std::string(key)));
}

uint64_t S3Client::attempts() const {
  std::lock_guard lock(mu_);
  return attempts_;
}

void* S3Client::take_handle() {
  {
    std::lock_guard lock(mu_);
    ++attempts_;
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  CURL* h = curl_easy_init();
  if (!h) throw std::bad_alloc();  // libcurl fails here only when it cannot allocate
  return h;
}

void S3Client::give_handle(void* h) {
  std::lock_guard lock(mu_);
  idle_.push_back(h);
}

S3Client::Reply S3Client::perform_once(Call& call) {
  Reply r;
  CURL* h = static_cast<CURL*>(take_handle());
  curl_easy_reset(h);  // keeps the handle's open connections
  if (call.into_vec) call.into_vec->clear();

  const std::string date = utc_now("%Y%m%dT%H%M%SZ");
  SigV4Request sr;
  sr.method = call.method;
  sr.path = "/" + cfg_.bucket + (call.key.empty() ? "" : "/" + call.key);
  sr.query = call.query;
  sr.payload_sha256 = to_hex(sha256_of(call.body));
  sr.headers = call.headers;
  sr.headers.emplace_back("host", host_);
  sr.headers.emplace_back("x-amz-date", date);
  sr.headers.emplace_back("x-amz-content-sha256", sr.payload_sha256);
  const SigV4Credentials cred{cfg_.access_key, cfg_.secret_key, cfg_.region, "s3"};
  curl_slist* list = nullptr;
  for (const auto& [k, v] : sr.headers) list = curl_slist_append(list, (k + ": " + v).c_str());
  list = curl_slist_append(list, ("Authorization: " + sigv4_authorization(sr, cred, date)).c_str());
  list = curl_slist_append(list, "Expect:");  // no 100-continue round trip
  list = curl_slist_append(list, "Content-Type:");
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> hold(list, curl_slist_free_all);

  const std::string target = cfg_.endpoint + uri_encode_path(sr.path) +
                             (call.query.empty() ? "" : "?" + canonical_query(call.query));
  Transfer t{h, &call, &r};
  curl_easy_setopt(h, CURLOPT_URL, target.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, cfg_.connect_timeout_ms);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, cfg_.low_speed_time_s);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
  if (call.method == "GET") {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else if (call.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (call.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, curl_off_t(call.body.size()));
  } else if (call.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, call.body.empty() ? "" : reinterpret_cast<const char*>(call.body.data()));
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(call.body.size()));
  } else {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, call.method.c_str());
  }
  r.curl = curl_easy_perform(h);
  if (r.curl != CURLE_OK) r.curl_error = curl_easy_strerror(r.curl);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  curl_off_t len = -1;
  curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
  r.content_length = len;
  give_handle(h);
  return r;
}

Result<S3Client::Reply> S3Client::perform(Call& call) {
  if (Status ready = load_libcurl(); !ready.ok())  // before the first handle (take_handle)
    return Status::IOError("s3: " + call.method + " " + url(call.key) + ": " + ready.message());
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int attempt = 1;; ++attempt) {
    Reply r = perform_once(call);
    r.attempts = attempt;
    r.seconds = double(elapsed_ms()) / 1000;
    if (retriable(r) && attempt < cfg_.retry.max_attempts) {
      const int wait = backoff_ms(cfg_.retry, attempt);
      if (elapsed_ms() + wait <= cfg_.retry.max_total_ms) {
        std::this_thread::sleep_for(std::chrono::milliseconds(wait));
        continue;
      }
    }
    const std::string where = "s3: " + call.method + " " + url(call.key) +
                              (call.query.empty() ? "" : "?" + canonical_query(call.query));
    char tries[64] = "";
    if (attempt > 1) std::snprintf(tries, sizeof tries, " (after %d attempts in %.1f s)", attempt, r.seconds);
    if (r.over_cap) {
      if (call.to_span)
        return Status::Corruption(where + ": the server sent more than the " + std::to_string(call.into_span.size()) +
                                  " bytes asked for");
      return Status::InvalidArgument(where + ": the object is larger than " +
                                     std::to_string(call.into_vec ? call.max : kMaxXmlBytes) + " bytes");
    }
    if (r.curl != CURLE_OK) return Status::IOError(where + ": " + r.curl_error + tries);
    if (r.status >= 200 && r.status < 300) return r;
    const S3ErrorBody e = parse_s3_error(r.body);
    std::string m = where + ": HTTP " + std::to_string(r.status);
    if (!e.code.empty()) m += " " + e.code;
    if (!e.message.empty()) m += ": " + quote_text(e.message, 200);
    m += tries;
    if (r.status == 404) return Status::NotFound(m);
    if (r.status == 416) return Status::Corruption(m + " (the object is shorter than the range asked for)");
    if (e.code == "SignatureDoesNotMatch" || e.code == "InvalidAccessKeyId" || r.status == 403)
      m += " (check the access key and secret)";
    // Keep the HTTP status and S3 code findable for callers that accept some (409 on create).
    return Status::IOError(m);
  }
}

Status S3Client::create_bucket() {
  Call c("PUT", "");
  const auto r = perform(c);
  if (!r.ok() && r.status().message().find("BucketAlreadyOwnedByYou") != std::string::npos) return Status::OK();
  return r.status();
}

Status S3Client::put(std::string_view key, std::span<const std::byte> data) {
  return put_file(key, MemoryFile(url(key), data));
}

Status S3Client::put_if_absent(std::string_view key, std::span<const std::byte> data) {
  // Looked for first: not every S3 server takes the condition (Swift's s3api ignores it), and
  // there the look is what keeps an id that is there.
  KV_ASSIGN_OR_RETURN(const std::optional<uint64_t> there, head(key));
  if (there) return Status::OK();
  Call c("PUT", key);
  c.headers.emplace_back("if-none-match", "*");
  c.body = data;
  auto r = perform(c);
  if (r.ok()) return Status::OK();
  const std::string& m = r.status().message();
  // One is there (412), or another conditional PUT of it is under way (AWS: 409
  // ConditionalRequestConflict): the caller reads back whose it is.
  if (m.find(": HTTP 412") != std::string::npos || m.find("ConditionalRequestConflict") != std::string::npos)
    return Status::OK();
  if (m.find(": HTTP 501") != std::string::npos || m.find("NotImplemented") != std::string::npos) return put(key, data);
  return r.status();
}

Status S3Client::put_file(std::string_view key, const ReadableFile& src) {
  if (src.size() > cfg_.multipart_threshold) return multipart(key, src);
  std::vector<std::byte> buf;
  return put_part_range(key, src, 0, src.size(), buf, {}, nullptr);
}

// PUT of src[offset, offset+n) as the object or, with `query`, one part of it.
Status S3Client::put_part_range(std::string_view key, const ReadableFile& src, uint64_t offset, uint64_t n,
                                std::vector<std::byte>& buf, const Headers& query, std::string* etag) {
  std::span<const std::byte> body;
  if (const auto* mem = dynamic_cast<const MemoryFile*>(&src)) {
    body = mem->bytes().subspan(offset, n);  // no copy of the caller's bytes
  } else {
    buf.resize(n);
    KV_RETURN_IF_ERROR(src.read_at(offset, buf));
    body = buf;
  }
  Call c("PUT", key);
  c.query = query;
  c.body = body;
  KV_ASSIGN_OR_RETURN(Reply r, perform(c));
  if (etag) {
    if (r.etag.empty()) return Status::Corruption("s3: PUT " + url(key) + ": no ETag in the reply to a part upload");
    *etag = r.etag;
  }
  return Status::OK();
}

Status S3Client::multipart(std::string_view key, const ReadableFile& src) {
  const uint64_t part = std::max<uint64_t>(cfg_.part_size, 5ull << 20);
  KV_ASSIGN_OR_RETURN(const std::string upload_id, start_upload(key));

  auto upload = [&]() -> Status {
    // Parts go up `upload_threads` at a time, each worker with its own buffer; the first failure
    // stops the parts not started yet.
    const uint64_t count = (src.size() + part - 1) / part;
    const size_t threads = size_t(std::clamp(cfg_.upload_threads, 1, 16));
    std::vector<std::string> etags(count);
    std::vector<Status> errors(count);
    std::vector<std::vector<std::byte>> bufs(std::min<uint64_t>(threads, count));
    std::atomic<bool> failed{false};
    parallel_for(count, threads, [&](size_t i, size_t w) {
      if (failed.load()) return;
      const uint64_t off = i * part;
      errors[i] = put_part_range(key, src, off, std::min(part, src.size() - off), bufs[w],
                                 {{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}}, &etags[i]);
      if (!errors[i].ok()) failed = true;
    });
    for (const Status& e : errors) KV_RETURN_IF_ERROR(e);
    return complete_upload(key, upload_id, etags);
  };
  Status s = upload();
  if (!s.ok()) (void)abort_upload(key, upload_id);  // best effort: the first error is the one to report
  return s;
}

Result<std::string> S3Client::upload_part(std::string_view key, const std::string& upload_id, int part_number,
                                          std::span<const std::byte> data) {
  std::vector<std::byte> unused;  // a MemoryFile's bytes go out without a copy
  std::string etag;
  KV_RETURN_IF_ERROR(put_part_range(key, MemoryFile(url(key), data), 0, data.size(), unused,
                                    {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}}, &etag));
  return etag;
}

namespace {

// The ETag S3 (and Swift's s3api, Ceph RGW) gives an object made of parts with these ETags: the MD5
// of their MD5s, "-", their count, in quotes; "" when a part's ETag is no MD5 (an encrypted bucket's).
std::string multipart_etag(const std::vector<std::string>& etags) {
  std::vector<uint8_t> md5s;
  for (const std::string& e : etags) {
    const std::string hex = e.size() == 34 && e.front() == '"' && e.back() == '"' ? e.substr(1, 32) : e;
    uint8_t b[16];
    if (hex.size() != 32 || !from_hex(hex, std::span<uint8_t>(b))) return "";
    md5s.insert(md5s.end(), b, b + 16);
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(md5s.data(), md5s.size(), digest, &n, EVP_md5(), nullptr) != 1 || n != 16) return "";
  return "\"" + to_hex(std::span<const uint8_t>(digest, 16)) + "-" + std::to_string(etags.size()) + "\"";
}

}  // namespace

Status S3Client::complete_upload(std::string_view key, const std::string& upload_id,
                                 const std::vector<std::string>& etags) {
  std::string done = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i)
    done += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + xml_escape(etags[i]) + "</ETag></Part>";
  done += "</CompleteMultipartUpload>";
  Call complete("POST", key);
  complete.query = {{"uploadId", upload_id}};
  complete.body = std::as_bytes(std::span(done.data(), done.size()));
  Result<Reply> completed = perform(complete);
  if (!completed.ok() && completed.status().code() == Code::kNotFound) {
    // NoSuchUpload: a retry of a complete whose first try went through (its reply lost), or a second
    // complete. The object whose ETag is these parts' says the upload is whole.
    Call h("HEAD", key);
    const Result<Reply> object = perform(h);
    const std::string want = multipart_etag(etags);
    if (object.ok() && !want.empty() && object->etag == want) return Status::OK();
  }
  KV_ASSIGN_OR_RETURN(Reply r, std::move(completed));
  // S3 may answer 200 and put the error in the body (it failed after the headers went out).
  const S3ErrorBody e = parse_s3_error(r.body);
  if (!e.code.empty())
    return Status::IOError("s3: POST " + url(key) + "?uploadId=" + upload_id + ": " + e.code + ": " +
                           quote_text(e.message, 200));
  return Status::OK();
}

Result<std::string> S3Client::start_upload(std::string_view key) {
  Call create("POST", key);
  create.query = {{"uploads", ""}};
  KV_ASSIGN_OR_RETURN(Reply created, perform(create));
  return parse_upload_id(created.body, "s3: POST " + url(key) + "?uploads");
}

Status S3Client::abort_upload(std::string_view key, const std::string& upload_id) {
  Call abort("DELETE", key);
  abort.query = {{"uploadId", upload_id}};
  Status s = perform(abort).status();
  return s.code() == Code::kNotFound ? Status::OK() : s;
}

Result<std::vector<S3Upload>> S3Client::list_uploads(std::string_view prefix) {
  std::vector<S3Upload> all;
  std::string key_marker, id_marker;
  for (;;) {
    Call c("GET", "");
    c.query = {{"uploads", ""}, {"prefix", std::string(prefix)}};
    if (!key_marker.empty()) c.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) c.query.emplace_back("upload-id-marker", id_marker);
    KV_ASSIGN_OR_RETURN(Reply r, perform(c));
    KV_ASSIGN_OR_RETURN(S3UploadsPage page, parse_list_uploads(r.body, "s3: GET " + url("") + "?" + canonical_query(c.query)));
    for (S3Upload& u : page.uploads) all.push_back(std::move(u));
    if (!page.truncated) return all;
    if (page.next_key_marker == key_marker && page.next_upload_id_marker == id_marker)
      return Status::Corruption("s3: GET " + url("") + "?uploads: the server repeats key marker " + quote_text(key_marker, 80));
    key_marker = page.next_key_marker;
    id_marker = page.next_upload_id_marker;
  }
}

Result<std::vector<std::byte>> S3Client::get(std::string_view key, uint64_t max_bytes) {
  std::vector<std::byte> out;
  KV_RETURN_IF_ERROR(get_into(key, max_bytes, out));
  return out;
}

Status S3Client::get_into(std::string_view key, uint64_t max_bytes, std::vector<std::byte>& out) {
  Call c("GET", key);
  c.into_vec = &out;
  c.max = max_bytes;
  return perform(c).status();
}

Status S3Client::get_range(std::string_view key, uint64_t offset, std::span<std::byte> dst) {
  if (dst.empty()) return Status::OK();
  Call c("GET", key);
  c.headers = {{"range", "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + dst.size() - 1)}};
  c.into_span = dst;
  c.to_span = true;
  KV_ASSIGN_OR_RETURN(Reply r, perform(c));
  // 200 means the server ignored the range: only right when it sent exactly what was asked.
  if ((r.status != 206 && !(r.status == 200 && offset == 0)) || r.received != dst.size())
    return Status::Corruption("s3: GET " + url(key) + " bytes " + std::to_string(offset) + "+" +
                              std::to_string(dst.size()) + ": HTTP " + std::to_string(r.status) + " with " +
                              std::to_string(r.received) + " bytes (the object is shorter than the range)");
  return Status::OK();
}

Result<std::optional<uint64_t>> S3Client::head(std::string_view key) {
  Call c("HEAD", key);
  Result<Reply> r = perform(c);
  if (!r.ok()) {
    if (r.status().code() == Code::kNotFound) return std::optional<uint64_t>();
    return r.status();
  }
  if (r->content_length < 0) return Status::Corruption("s3: HEAD " + url(key) + ": no Content-Length in the reply");
  return std::optional<uint64_t>(uint64_t(r->content_length));
}

Status S3Client::remove(std::string_view key) {
  Call c("DELETE", key);
  Status s = perform(c).status();
  return s.code() == Code::kNotFound ? Status::OK() : s;
}

Result<S3ListPage> S3Client::list_page(std::string_view prefix, const std::string& token, int max_keys) {
  Call c("GET", "");
  c.query = {{"list-type", "2"}, {"prefix", std::string(prefix)}, {"max-keys", std::to_string(max_keys)}};
  if (!token.empty()) c.query.emplace_back("continuation-token", token);
  KV_ASSIGN_OR_RETURN(Reply r, perform(c));
  return parse_list_objects_v2(r.body, "s3: GET " + url("") + "?" + canonical_query(c.query));
}

Result<std::vector<S3Object>> S3Client::list(std::string_view prefix, int page_size) {
  std::vector<S3Object> all;
  std::string token;
  for (;;) {
    KV_ASSIGN_OR_RETURN(S3ListPage page, list_page(prefix, token, page_size));
    for (S3Object& o : page.objects) all.push_back(std::move(o));
    if (!page.truncated) return all;
    if (page.next_token == token)
      return Status::Corruption("s3: GET " + url("") + "?list-type=2: the server repeats continuation token " +
                                quote_text(token, 80));
    token = page.next_token;
  }
}

}  // namespace kvsnap
