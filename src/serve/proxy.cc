#include "serve/proxy.h"

#include <httplib.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "base/os.h"
#include "base/sha256.h"
#include "serve/bounded_pool.h"
#include "serve/hangup.h"
#include "serve/requests.h"

namespace kvsnap {

const Result<CompletionRequest>& completion_request(Forward& f) {
  if (!f.request) f.request = parse_completion_request(f.path, f.body);
  return *f.request;
}

bool write_id_slot(Forward& f, int slot) {
  auto body = body_with_id_slot(f.body, slot);
  if (!body) return false;
  f.body = std::move(*body);
  f.body_changed = true;
  if (f.request && f.request->ok()) (*f.request)->id_slot = slot;
  return true;
}

namespace {

// The listening socket's backlog (the system caps it: net.core.somaxconn, 4096 on Debian 12):
// clients beyond the workers and the accepted waiting ones wait there.
constexpr int kListenBacklog = 1024;

constexpr size_t kStreamTail = 64 << 10;
// How much of a streamed answer waits for a client that does not read it: past this the child's
// connection is not read either (as with direct access, the child's own send then waits).
constexpr size_t kMaxPending = 8 << 20;
// How long a stream's last event waits for the end of the stream (which llama-server sends right
// after it) before it goes to the client anyway.
constexpr auto kLastEventWait = std::chrono::seconds(5);
// How often a client waiting for the child's answer is looked at for a hang-up (llama-server: 1 s).
constexpr auto kHangUpPoll = std::chrono::milliseconds(250);

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// RFC 9110 7.6.1: hop-by-hop fields, plus those the Connection field names; Content-Length is the
// library's to set for the body it sends; REMOTE_ADDR/PORT, LOCAL_ADDR/PORT are cpp-httplib's own
// annotations of a received request, not fields the client sent.
std::set<std::string> dropped_fields(const httplib::Headers& h) {
  std::set<std::string> drop = {"connection", "keep-alive", "proxy-connection", "te", "trailer",
                                "transfer-encoding", "upgrade", "content-length", "remote_addr",
                                "remote_port", "local_addr", "local_port"};
  auto range = h.equal_range("Connection");
  for (auto it = range.first; it != range.second; ++it) {
    std::string v = it->second;
    size_t p = 0;
    while (p <= v.size()) {
      size_t q = v.find(',', p);
      if (q == std::string::npos) q = v.size();
      std::string name = v.substr(p, q - p);
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      if (!name.empty()) drop.insert(lower(name));
      p = q + 1;
    }
  }
  return drop;
}

// cpp-httplib (0.11) percent-decodes every header value it reads, so "%0d%0a" arrives as CR LF; a
// value forwarded so would end the header early and smuggle a request of the client's making to the
// child (a slot action past the 403 below and past the slot gate). Such a request is refused whole.
bool holds_line_break(const httplib::Headers& h) {
  for (const auto& [k, v] : h) {
    for (const std::string* s : {&k, &v}) {
      if (s->find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) return true;
    }
  }
  return false;
}

httplib::Headers end_to_end(const httplib::Headers& h, bool drop_content_type) {
  const auto drop = dropped_fields(h);
  httplib::Headers out;
  for (const auto& [k, v] : h) {
    const std::string lk = lower(k);
    if (drop.count(lk) || (drop_content_type && lk == "content-type")) continue;
    out.emplace(k, v);
  }
  return out;
}

// One forwarded request: the child's answer as it arrives, shared between the
// thread that talks to the child and the one that answers the client.
struct Upstream {
  std::mutex mu;
  std::condition_variable cv;
  bool have_head = false, done = false, ok = false, cancel = false;
  bool streamed = false;  // the child's answer has no Content-Length: pending is bounded (kMaxPending)
  int status = 0;
  httplib::Headers headers;
  std::string pending;  // received, not yet passed on
  httplib::Error error = httplib::Error::Success;
  std::thread thread;
  bool handed_on = false;  // on_done has run for this exchange (the client's thread only)
  // The upstream thread's client while it sends (under mu): Proxy::stop() shuts its socket, so a
  // request the child has not answered yet ends now instead of at the child's timeout.
  httplib::Client* client = nullptr;

  void join() {
    if (thread.joinable()) thread.join();
  }
};

}  // namespace

std::string header_value(const std::vector<std::pair<std::string, std::string>>& h, const std::string& name) {
  for (const auto& [k, v] : h)
    if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
  return "";
}

namespace {

constexpr const char* kHeldContentType = "X-Kvsnap-Held-Content-Type";

void hold_multipart_type(httplib::Headers& h) {
  h.erase(kHeldContentType);  // a client's own is not kvsnap's
  auto it = h.find("Content-Type");
  if (it == h.end() || it->second.rfind("multipart/form-data", 0) != 0) return;  // httplib's own test
  std::string type = std::move(it->second);
  h.erase(it);
  h.emplace(kHeldContentType, std::move(type));
}

void put_back_multipart_type(httplib::Headers& h) {
  auto it = h.find(kHeldContentType);
  if (it == h.end()) return;
  std::string type = std::move(it->second);
  h.erase(it);
  h.emplace("Content-Type", std::move(type));
}

}  // namespace

std::string request_api_key(const std::vector<std::pair<std::string, std::string>>& h) {
  std::string key = header_value(h, "Authorization");
  if (key.empty()) key = header_value(h, "X-Api-Key");
  return key.rfind("Bearer ", 0) == 0 ? key.substr(7) : key;
}

RouteKeys route_keys(const std::vector<std::string>& admin_keys, const std::vector<std::string>& child_keys) {
  if (!admin_keys.empty()) return RouteKeys::kAdmin;
  return child_keys.empty() ? RouteKeys::kOpen : RouteKeys::kChild;
}

bool may_use_kvsnap_routes(const std::vector<std::string>& admin_keys, const std::vector<std::string>& child_keys,
                           const std::vector<std::pair<std::string, std::string>>& headers) {
  switch (route_keys(admin_keys, child_keys)) {
    case RouteKeys::kAdmin: return api_key_among(admin_keys, request_api_key(headers));
    case RouteKeys::kChild: return api_key_among(child_keys, request_api_key(headers));
    case RouteKeys::kOpen: return true;
  }
  return false;
}

bool api_key_among(const std::vector<std::string>& keys, const std::string& key) {
  // How long a comparison takes must tell a client nothing about its guess (how many leading bytes
  // were right, how long a key is): digests of equal size, every byte of each compared.
  auto digest = [](const std::string& s) { return sha256_of(std::as_bytes(std::span(s.data(), s.size()))); };
  const Sha256Digest given = digest(key);
  bool found = false;
  for (const std::string& k : keys) {
    const Sha256Digest d = digest(k);
    uint8_t diff = 0;
    for (size_t i = 0; i < d.size(); ++i) diff |= uint8_t(d[i]) ^ uint8_t(given[i]);
    found |= diff == 0;
  }
  return found;
}

struct Proxy::Impl {
  ProxyOptions o;
  // Set by stop(): a stream read to its end for a resume (finish_for_resume) is given up, and a
  // run() that has not started listening returns instead.
  std::atomic<bool> stopping{false};
  // run()'s progress, for stop() (see there): entered, and returned from httplib's listen.
  std::atomic<bool> run_entered{false}, run_returned{false};
  // The workers of the listen in progress (httplib owns them; their destructor clears this).
  std::mutex pool_mu;
  BoundedPool* pool = nullptr;
  std::function<void(Forward&)> before;
  std::function<void(const Exchange&)> on_done;
  std::function<void(const Exchange&)> on_given_up;
  std::function<bool(const LocalRequest&, LocalAnswer&)> local;
  Drain* drain = nullptr;
  // The requests being forwarded, for stop() to cut (a second signal): expired ones are pruned.
  std::mutex live_mu;
  std::vector<std::weak_ptr<Upstream>> live;

  void cut_upstreams() {
    std::lock_guard<std::mutex> g(live_mu);
    for (const auto& w : live) {
      if (auto st = w.lock()) {
        std::lock_guard<std::mutex> l(st->mu);
        st->cancel = true;
        st->cv.notify_all();  // an upstream thread waiting for room in `pending`
        if (st->client) st->client->stop();
      }
    }
  }
  double drain_wait_s = 0;
  httplib::Server svr;

  bool answer_locally(const httplib::Request& req, httplib::Response& res) {
    if (!local) return false;
    LocalRequest lr{req.method, req.path, req.body, {}};
    for (const auto& [k, v] : req.headers) lr.headers.emplace_back(k, v);
    LocalAnswer a;
    if (!local(lr, a)) return false;
    res.status = a.status;
    for (const auto& [k, v] : a.headers) res.set_header(k, v);
    res.set_content(a.body, a.content_type);
    return true;
  }

  void start_upstream(const std::shared_ptr<Upstream>& st, const httplib::Request& req, const Forward& f) {
    {
      std::lock_guard<std::mutex> g(live_mu);
      live.erase(std::remove_if(live.begin(), live.end(), [](const std::weak_ptr<Upstream>& w) { return w.expired(); }),
                 live.end());
      live.push_back(st);
    }
    httplib::Request up;
    up.method = req.method;
    up.path = req.target;  // path and query exactly as the client wrote them
    up.headers = end_to_end(req.headers, false);
    // cpp-httplib has undone the body's Content-Encoding (gzip, deflate, br; it answers 415 to
    // another): the child gets the plain body, so not the field that says it is encoded.
    up.headers.erase("Content-Encoding");  // Headers compare names case-insensitively
    up.body = f.body_changed ? f.body : req.body;
    st->thread = std::thread([st, up = std::move(up), port = o.upstream_port, t = o.upstream_timeout_s]() mutable {
      httplib::Client cli("127.0.0.1", port);
      cli.set_url_encode(false);
      cli.set_decompress(false);
      cli.set_connection_timeout(5);
      cli.set_read_timeout(time_t(t));
      cli.set_write_timeout(time_t(t));
      up.response_handler = [st](const httplib::Response& r) {
        std::lock_guard<std::mutex> l(st->mu);
        st->status = r.status;
        st->headers = r.headers;
        st->have_head = true;
        st->streamed = !r.has_header("Content-Length");
        st->cv.notify_all();
        return !st->cancel;
      };
      up.content_receiver = [st](const char* d, size_t n, uint64_t, uint64_t) {
        std::unique_lock<std::mutex> l(st->mu);
        // A sized answer is passed on once whole (bounded by its length); a stream is passed on as it
        // comes, so a client that stops reading must not have it pile up here without end.
        if (st->streamed) st->cv.wait(l, [&] { return st->pending.size() < kMaxPending || st->cancel; });
        st->pending.append(d, n);
        st->cv.notify_all();
        return !st->cancel;
      };
      httplib::Response r;
      httplib::Error err = httplib::Error::Canceled;
      bool cut = false;
      {
        std::lock_guard<std::mutex> l(st->mu);
        cut = st->cancel;  // stop() came first: not sent
        if (!cut) st->client = &cli;
      }
      const bool ok = !cut && cli.send(up, r, err);
      std::lock_guard<std::mutex> l(st->mu);
      st->client = nullptr;
      if (!st->have_head && ok) {  // 204 and HEAD answers skip the response handler
        st->status = r.status;
        st->headers = r.headers;
        st->have_head = true;
      }
      st->ok = ok;
      st->error = err;
      st->done = true;
      st->cv.notify_all();
    });
  }

  Exchange exchange_of(const httplib::Request& req, const Forward& f, int status) {
    Exchange x;
    x.prompt_tokens = f.prompt_tokens;
    x.pinned_slot = f.pinned_slot;
    x.several_slots = f.several_slots;
    x.own_after_task = f.own_after_task;
    x.arrived = f.arrived;
    x.restored_tokens = f.restored_tokens;
    x.own_scales = f.own_scales;
    x.request_unreadable = f.request && !f.request->ok();
    x.method = req.method;
    x.path = req.path;
    for (const auto& [k, v] : end_to_end(req.headers, false)) x.request_headers.emplace_back(k, v);  // as the child had them
    x.request_body = req.body;
    x.status = status;
    x.keyed = authorized(req);
    return x;
  }

  // on_done and on_given_up, for an exchange that carried a key (Exchange::keyed) only.
  void hand_on(const Exchange& x) const {
    if (x.keyed && on_done) on_done(x);
  }
  void give_up(const Exchange& x) const {
    if (x.keyed && on_given_up) on_given_up(x);
  }

  // A client that hung up on a stream it asked for with an X-Conversation-Id: llama-server 3.22.1
  // goes on generating for a later GET /v1/stream?conv_id= (tools/server/server-stream.cpp:
  // should_stop() asks the stream session, not the connection), so the slot stays busy and ends up
  // holding the whole exchange. Its stream is read to the end here (only the tail kept, as for a
  // client), then the exchange is handed on as one that ended, its save queued, before the slot
  // permit and the drain ticket go back.
  // kvsnap stopping (Proxy::stop, the second signal) gives it up: nothing handed on. (llama-server
  // goes on generating until the child is stopped; serve's last saves skip its busy slot, so that
  // exchange is not saved: what a second signal means.)
  void finish_for_resume(Upstream& st, Exchange& x) {
    std::unique_lock<std::mutex> l(st.mu);
    for (;;) {
      st.cv.wait_for(l, std::chrono::milliseconds(200), [&] { return !st.pending.empty() || st.done; });
      if (stopping) return;
      if (!st.pending.empty()) {
        x.response_body += st.pending;
        st.pending.clear();
        st.cv.notify_all();  // room for the upstream thread
        trim_stream_tail(x.response_body, kStreamTail);
      }
      if (st.done) break;
    }
    const bool whole = st.ok;
    st.handed_on = true;
    l.unlock();
    if (whole) hand_on(x);
  }

  // The client hung up before the child's answer began: the child's request is cut (llama-server
  // cancels the task when that connection closes; its slot keeps what it had evaluated), nothing is
  // saved, and the prompt goes to on_given_up as a stream's whose client hung up. The answer set here
  // goes nowhere.
  void give_up_hung_up(Upstream& st, std::unique_lock<std::mutex>& l, const httplib::Request& req, const Forward& f,
                       httplib::Response& res) {
    st.cancel = true;
    if (st.client) st.client->stop();
    st.cv.notify_all();
    l.unlock();
    st.join();
    give_up(exchange_of(req, f, 0));
    res.status = 499;  // nginx's "client closed request": in no log of a client
    res.set_header("Connection", "close");
  }

  // Whether the child keeps generating after a hang-up: an X-Conversation-Id it was sent (not one
  // the client's Connection field made hop-by-hop).
  static bool resumable_stream(const httplib::Request& req) {
    const httplib::Headers sent = end_to_end(req.headers, false);
    auto it = sent.find("X-Conversation-Id");
    return it != sent.end() && !it->second.empty();
  }

  // The body into req.body, at most o.max_request_bytes of it; false (answered) when larger or cut off.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
    std::string& body = const_cast<httplib::Request&>(req).body;  // the server's own object, as in handle()
    // Past the bound the rest is read and dropped, up to as much again, so that the client (still
    // sending) gets the 413 rather than a reset connection (httplib reads and drops all of a declared
    // body over the bound, set_payload_max_length above).
    uint64_t dropped = 0;
    const bool whole = read([&](const char* d, size_t n) {
      if (dropped == 0 && body.size() + n <= o.max_request_bytes) {
        body.append(d, n);
        return true;
      }
      dropped += n;
      return dropped <= o.max_request_bytes;
    });
    const bool too_large = dropped > 0 || res.status == 413;  // 413: httplib's refusal of a declared length
    if (whole && !too_large) return true;
    body.clear();
    res.status = too_large ? 413 : 400;
    res.set_header("Connection", "close");  // the rest of the body is not read: the connection cannot go on
    const std::string message =
        too_large ? "the request body is larger than " + std::to_string(o.max_request_bytes) +
                        " bytes (kvsnap serve --max-request-bytes)"
                  : std::string("the request body could not be read whole");
    res.set_content(R"({"error":{"code":)" + std::to_string(res.status) + R"(,"message":"kvsnap serve: )" + message +
                        R"(","type":"invalid_request_error"}})",
                    "application/json");
    return false;
  }

  // Read from the headers the child receives (a field the Connection field names is not forwarded),
  // so that kvsnap and llama-server take the same key.
  bool authorized(const httplib::Request& req) const {
    if (o.api_keys.empty()) return true;
    std::vector<std::pair<std::string, std::string>> h;
    for (const auto& [k, v] : end_to_end(req.headers, false)) h.emplace_back(k, v);
    return api_key_among(o.api_keys, request_api_key(h));
  }

  void handle(const httplib::Request& req, httplib::Response& res) {
    put_back_multipart_type(const_cast<httplib::Request&>(req).headers);
    // cpp-httplib would gzip or brotli a text answer for a client that accepts it: the child's bytes
    // must pass unchanged, so the client's Accept-Encoding goes to the child only. (The request is
    // the server's own non-const object, handed to the handler as const.)
    httplib::Request& mreq = const_cast<httplib::Request&>(req);
    if (holds_line_break(req.headers)) {
      res.status = 400;
      res.set_content(R"({"error":{"code":400,"message":"kvsnap serve: a header holds a line break or NUL (after )"
                      R"(percent-decoding); the request is not forwarded","type":"invalid_request_error"}})",
                      "application/json");
      return;
    }
    if (answer_locally(req, res)) return;
    // llama-server's resumable-stream routes use no slot: a resume or a stop (DELETE) of a stream
    // kvsnap is reading to its end (finish_for_resume) must not wait behind a drain that waits for
    // it; it still counts, so that a shutdown lets a resume finish.
    const bool slotless = req.path == "/v1/stream" || req.path == "/v1/streams/lookup";
    // A request without one of the child's keys gets no kvsnap work (ProxyOptions::api_keys): no
    // drain ticket either (it goes on to the child's 401 even while a requantize restarts it).
    const bool keyed = authorized(req);
    Drain::Ticket ticket;
    if (drain && keyed && slotless) ticket = drain->enter_slotless();
    if (drain && keyed && !slotless && !(ticket = drain->enter(drain_wait_s))) {
      res.status = 503;
      res.set_header("Retry-After", "10");
      if (drain->shut_down())
        res.set_content(R"({"error":{"code":503,"message":"kvsnap serve is shutting down (SIGTERM or SIGINT); )"
                        R"(try again when it is back","type":"unavailable_error"}})",
                        "application/json");
      else
        res.set_content(R"({"error":{"code":503,"message":"kvsnap serve: llama-server is being restarted with other )"
                        R"(cache types (POST /kvsnap/requantize); try again","type":"unavailable_error"}})",
                        "application/json");
      return;
    }
    Forward f;
    if (before && keyed) {
      f.method = req.method;
      f.path = req.path;
      for (const auto& [k, v] : end_to_end(req.headers, false)) f.headers.emplace_back(k, v);  // as the child gets them
      f.body = req.body;
      before(f);
      if (!f.refused.empty()) {
        res.status = f.refused_status;
        if (f.refused_status == 503) res.set_header("Retry-After", "10");
        res.set_content(f.refused, "application/json");
        return;
      }
    }
    auto st = std::make_shared<Upstream>();
    start_upstream(st, req, f);
    mreq.headers.erase("Accept-Encoding");
    std::unique_lock<std::mutex> l(st->mu);
    // Until the child's answer begins (a completion not streamed: until it has generated it all), a
    // client that hangs up cuts the child's request, as it would cut llama-server's own (its
    // is_connection_closed, every second). Not a resumable stream: the child generates on for it.
    ClientWatch client(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    const bool watch = !resumable_stream(req);
    while (!st->cv.wait_for(l, kHangUpPoll, [&] { return st->have_head || st->done; })) {
      if (!watch) continue;
      l.unlock();
      const bool gone = client.gone();
      l.lock();
      if (gone && !st->have_head && !st->done) {
        give_up_hung_up(*st, l, req, f, res);
        return;
      }
    }
    if (!st->have_head) {
      const std::string why = httplib::to_string(st->error);
      l.unlock();
      st->join();
      res.status = 502;
      res.set_content(R"({"error":{"code":502,"message":"kvsnap serve: llama-server is not answering ()" + why +
                          R"(); it may be restarting","type":"unavailable_error"}})",
                      "application/json");
      return;
    }
    res.status = st->status;
    res.headers = end_to_end(st->headers, true);
    auto ct = st->headers.find("Content-Type");  // Headers compare names case-insensitively
    const std::string ctype = ct == st->headers.end() ? "" : ct->second;
    const bool sized = st->headers.count("Content-Length") > 0;
    // A sized answer (or one that finished without a body) is sent whole. A chunked one stays chunked even
    // when the child finished before this thread woke up (on a loaded machine a short stream can): its
    // framing must match direct access, so it goes out through the chunked provider, in one chunk.
    if (sized || (st->done && st->pending.empty())) {  // a whole body: wait for it
      st->cv.wait(l, [&] { return st->done; });
      std::string body = std::move(st->pending);
      const bool whole = st->ok;
      const std::string why = httplib::to_string(st->error);
      l.unlock();
      st->join();
      if (!whole) {
        // The child's answer was cut off (it died, or the connection broke): passed on, it would
        // look complete (a Content-Length of what came) and be saved. An error instead, no save.
        res.status = 502;
        res.headers.clear();
        res.set_content(R"({"error":{"code":502,"message":"kvsnap serve: llama-server's answer was cut off ()" + why +
                            R"(); it may be restarting","type":"unavailable_error"}})",
                        "application/json");
        return;
      }
      if (!body.empty() || !ctype.empty()) res.set_content(body, ctype);
      Exchange x = exchange_of(req, f, res.status);
      x.response_body = std::move(body);
      hand_on(x);
      return;
    }
    l.unlock();
    auto x = std::make_shared<Exchange>(exchange_of(req, f, res.status));
    x->streamed = true;
    res.set_chunked_content_provider(
        ctype,
        [this, st, x](size_t, httplib::DataSink& sink) {
          // An exception (out of memory, a hook's) must not leave httplib's writer: it would end
          // the process. The client's stream is cut instead.
          try {
            std::unique_lock<std::mutex> l(st->mu);
            st->cv.wait(l, [&] { return !st->pending.empty() || st->done; });
            std::string chunk = std::move(st->pending);
            st->pending.clear();
            st->cv.notify_all();  // room for the upstream thread
            // A client may send its next request on seeing a stream's last event, before the stream's
            // end: that event waits here for the end (llama-server sends it at once), so that
            // on_done (the save this exchange queues) runs before the client can see the event.
            // Not for an exchange of several completions ("n" > 1): each ends with such an event
            // while the others go on (held, the first would wait up to kLastEventWait), and it runs
            // alone in the slot gate, so a next completion waits for its permit, which comes back
            // after on_done (the releaser below).
            if (!st->done && !x->several_slots && ends_a_stream(x->response_body, chunk)) {
              st->cv.wait_for(l, kLastEventWait, [&] { return st->done; });
              chunk += st->pending;
              st->pending.clear();
              st->cv.notify_all();  // room for the upstream thread (it may have filled pending meanwhile)
            }
            const bool done = st->done, whole = st->ok;
            l.unlock();
            if (done && !whole) {
              // Cut off by the child (it died, or the connection broke): the client must not see a
              // complete stream, and nothing is saved. Closing without the last chunk tells it.
              if (!chunk.empty()) (void)sink.write(chunk.data(), chunk.size());
              return false;
            }
            if (!chunk.empty()) {
              x->response_body += chunk;
              trim_stream_tail(x->response_body, kStreamTail);
            }
            // on_done before the client sees the end: a client that sends its next request at once must
            // find this exchange's bookkeeping (its queued save) done.
            if (done) st->handed_on = true;
            if (done) hand_on(*x);
            if (!chunk.empty() && !sink.write(chunk.data(), chunk.size())) return false;
            if (done) sink.done();
            return true;
          } catch (...) {
            return false;
          }
        },
        [this, st, x, ticket, hold = f.hold, resumable = resumable_stream(req)](bool) {
          if (resumable && !st->handed_on) {
            try {
              finish_for_resume(*st, *x);
            } catch (...) {  // a releaser runs in a destructor: nothing may leave it
            }
          }
          // Not handed on: the client hung up (the child's request is cancelled below, its slot keeps
          // what it had evaluated), the child's stream was cut off, or kvsnap is stopping.
          if (!st->handed_on) {
            try {
              give_up(*x);
            } catch (...) {  // a releaser runs in a destructor: nothing may leave it
            }
          }
          {
            std::lock_guard<std::mutex> l(st->mu);
            st->cancel = true;  // a no-op once the child has finished
            st->cv.notify_all();
          }
          st->join();
        });
  }
};

Proxy::Proxy(ProxyOptions o, std::function<void(Forward&)> before, std::function<void(const Exchange&)> on_done)
    : impl_(std::make_unique<Impl>()) {
  impl_->o = std::move(o);
  impl_->before = std::move(before);
  impl_->on_done = std::move(on_done);
  impl_->svr.new_task_queue = [impl = impl_.get()] {
    const int waiting = impl->o.max_waiting_connections > 0 ? impl->o.max_waiting_connections : 4 * impl->o.threads;
    auto* pool = new BoundedPool(size_t(impl->o.threads), size_t(waiting), [impl] {
      std::lock_guard<std::mutex> l(impl->pool_mu);
      impl->pool = nullptr;
    });
    std::lock_guard<std::mutex> l(impl->pool_mu);
    impl->pool = pool;
    if (impl->stopping) pool->stop_waiting();
    return pool;
  };
  impl_->svr.set_keep_alive_max_count(1000);
  impl_->svr.set_keep_alive_timeout(5);  // also bounds how long stop() waits for idle connections
  impl_->svr.set_read_timeout(600);
  impl_->svr.set_write_timeout(600);
  // A declared Content-Length over the bound is refused by httplib before it reads the body (413); a
  // chunked body (which 0.11.4 reads without that bound) is read here, through the same bound.
  impl_->svr.set_payload_max_length(size_t(impl_->o.max_request_bytes));
  // httplib parses a multipart/form-data body into parts and leaves the body empty (a handler with a
  // content reader fails on it with 500): so such a request's Content-Type is held under another name
  // until its body has been read as bytes, and put back before anything looks at the headers
  // (llama-server's /v1/audio/transcriptions takes multipart bodies).
  impl_->svr.set_pre_routing_handler([](const httplib::Request& req, httplib::Response&) {
    hold_multipart_type(const_cast<httplib::Request&>(req).headers);  // the server's own object
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto h = [impl = impl_.get()](const httplib::Request& req, httplib::Response& res) { impl->handle(req, res); };
  auto with_body = [impl = impl_.get()](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& read) {
    if (impl->read_body(req, res, read)) impl->handle(req, res);
  };
  impl_->svr.Get(".*", h);
  impl_->svr.Post(".*", with_body);
  impl_->svr.Put(".*", with_body);
  impl_->svr.Patch(".*", with_body);
  impl_->svr.Delete(".*", with_body);
  impl_->svr.Options(".*", h);
}

Proxy::~Proxy() { stop(); }

void Proxy::set_local(std::function<bool(const LocalRequest&, LocalAnswer&)> local) {
  impl_->local = std::move(local);
}

void Proxy::set_on_given_up(std::function<void(const Exchange&)> f) { impl_->on_given_up = std::move(f); }

void Proxy::set_drain(Drain* drain, double max_wait_s) {
  impl_->drain = drain;
  impl_->drain_wait_s = max_wait_s;
}

Status Proxy::bind() {
  if (!impl_->svr.bind_to_port(impl_->o.listen_host, impl_->o.listen_port))
    return Status::IOError("cannot listen on " + impl_->o.listen_host + ":" + std::to_string(impl_->o.listen_port) +
                           " (address in use, or not this machine's?)");
  // httplib 0.11.4 listens with a backlog of 5: a burst of clients (20 at once in
  // tests/oracle/serve_test.py) overflows it whenever the accept loop waits for a core.
  (void)raise_listen_backlog(impl_->o.listen_port, kListenBacklog);
  return Status::OK();
}

void Proxy::run() {
  impl_->run_entered = true;
  if (!impl_->stopping) impl_->svr.listen_after_bind();
  impl_->run_returned = true;
}

// httplib's stop() does nothing until listen has set is_running(), so a stop() that came between
// run()'s look at `stopping` and that moment (a signal as kvsnap serve starts) would leave run()
// serving for good. The atomics are sequentially consistent: a run() not yet entered will see
// `stopping`; one entered either returns or gets to is_running(), which this waits for. A run()
// that returns without listening leaves the bound socket open until the process exits (httplib
// closes it only in a stop() while listening): clients connecting then wait instead of being refused.
void Proxy::stop() {
  if (!impl_) return;
  impl_->stopping = true;
  impl_->cut_upstreams();  // after a drain nothing is in flight; after a second signal, what is is cut
  while (impl_->run_entered && !impl_->run_returned) {
    if (impl_->svr.is_running()) {
      impl_->svr.stop();
      break;
    }
    std::this_thread::yield();
  }
  // After the listening socket is closed: an accept loop waiting for room goes on and sees it.
  std::lock_guard<std::mutex> l(impl_->pool_mu);
  if (impl_->pool) impl_->pool->stop_waiting();
}

}  // namespace kvsnap
