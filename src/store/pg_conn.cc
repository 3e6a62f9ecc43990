#include "store/pg_conn.h"

#include <libpq-fe.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/byte_order.h"
#include "store/lazy_libs.h"

namespace kvsnap {

namespace {

// pg_type OIDs (catalog/pg_type.dat): fixed since PostgreSQL 7.
constexpr uint32_t kBytea = 17, kInt8 = 20, kText = 25, kTextArray = 1009, kByteaArray = 1001,
                   kInt8Array = 1016;

// The binary array format: ndim, has-nulls flag, element type, then per
// dimension (length, lower bound 1), then each element as (int32 length, bytes),
// length -1 for NULL.
template <class Each>
std::string encode_array(uint32_t elem_oid, size_t n, bool has_nulls, Each each) {
  std::string out;
  append_be(out, n ? 1 : 0, 4);
  append_be(out, has_nulls ? 1 : 0, 4);
  append_be(out, elem_oid, 4);
  if (n) {
    append_be(out, n, 4);
    append_be(out, 1, 4);
  }
  for (size_t i = 0; i < n; ++i) each(i, out);
  return out;
}

void append_element(std::string& out, std::string_view v) {
  append_be(out, v.size(), 4);
  out.append(v);
}

}  // namespace

// ---------------------------------------------------------------- parameters

PgParams& PgParams::add(uint32_t oid, std::string value, bool null) {
  oids_.push_back(oid);
  values_.push_back(std::move(value));
  nulls_.push_back(null);
  return *this;
}

PgParams& PgParams::i64(int64_t v) {
  std::string b;
  append_be(b, static_cast<uint64_t>(v), 8);
  return add(kInt8, std::move(b));
}
PgParams& PgParams::null_i64() { return add(kInt8, {}, true); }
PgParams& PgParams::text(std::string_view v) { return add(kText, std::string(v)); }
PgParams& PgParams::opt_text(const std::optional<std::string>& v) {
  return v ? text(*v) : add(kText, {}, true);
}
PgParams& PgParams::bytes(std::span<const std::byte> v) {
  return add(kBytea, std::string(reinterpret_cast<const char*>(v.data()), v.size()));
}

PgParams& PgParams::i64_array(std::span<const int64_t> v) {
  return add(kInt8Array, encode_array(kInt8, v.size(), false, [&](size_t i, std::string& out) {
               append_be(out, 8, 4);
               append_be(out, static_cast<uint64_t>(v[i]), 8);
             }));
}

PgParams& PgParams::text_array(std::span<const std::optional<std::string>> v) {
  bool nulls = false;
  for (const auto& s : v) nulls |= !s;
  return add(kTextArray, encode_array(kText, v.size(), nulls, [&](size_t i, std::string& out) {
               if (v[i]) {
                 append_element(out, *v[i]);
               } else {
                 append_be(out, 0xffffffffu, 4);
               }
             }));
}

PgParams& PgParams::bytes_array(std::span<const std::span<const std::byte>> v) {
  return add(kByteaArray, encode_array(kBytea, v.size(), false, [&](size_t i, std::string& out) {
               append_element(out, {reinterpret_cast<const char*>(v[i].data()), v[i].size()});
             }));
}

std::vector<const char*> PgParams::value_ptrs() const {
  std::vector<const char*> p(values_.size());
  for (size_t i = 0; i < values_.size(); ++i) p[i] = nulls_[i] ? nullptr : values_[i].data();
  return p;
}

std::vector<int> PgParams::lengths() const {
  std::vector<int> n(values_.size());
  for (size_t i = 0; i < values_.size(); ++i) n[i] = static_cast<int>(values_[i].size());
  return n;
}

// ---------------------------------------------------------------- results

PgResult::PgResult(pg_result* r) : r_(r) {}
PgResult::PgResult(PgResult&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
PgResult& PgResult::operator=(PgResult&& o) noexcept {
  if (this != &o) {
    PQclear(r_);
    r_ = o.r_;
    o.r_ = nullptr;
  }
  return *this;
}
PgResult::~PgResult() { PQclear(r_); }

int PgResult::rows() const { return r_ ? PQntuples(r_) : 0; }

int64_t PgResult::changed() const {
  const char* n = r_ ? PQcmdTuples(r_) : "";
  return n && *n ? std::strtoll(n, nullptr, 10) : 0;
}

bool PgResult::is_null(int row, int col) const { return PQgetisnull(r_, row, col) != 0; }

int64_t PgResult::i64(int row, int col) const {
  auto b = bytes(row, col);
  if (b.size() != 1 && b.size() != 2 && b.size() != 4 && b.size() != 8) return 0;
  uint64_t v = load_be(b.data(), b.size());
  // Sign-extend int2 and int4.
  if (b.size() < 8 && (v >> (8 * b.size() - 1)) && b.size() > 1) v |= ~uint64_t(0) << (8 * b.size());
  return static_cast<int64_t>(v);
}

std::string PgResult::text(int row, int col) const {
  auto b = bytes(row, col);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::span<const std::byte> PgResult::bytes(int row, int col) const {
  if (!r_ || row < 0 || row >= PQntuples(r_) || col < 0 || col >= PQnfields(r_) || PQgetisnull(r_, row, col)) {
    return {};
  }
  const char* p = PQgetvalue(r_, row, col);
  int n = PQgetlength(r_, row, col);
  return {reinterpret_cast<const std::byte*>(p), static_cast<size_t>(n < 0 ? 0 : n)};
}

std::vector<std::string> PgResult::text_array(int row, int col) const {
  std::vector<std::string> out;
  auto b = bytes(row, col);
  size_t pos = 0;
  auto u32 = [&](uint32_t& v) {
    if (b.size() - pos < 4) return false;
    v = static_cast<uint32_t>(load_be(b.data() + pos, 4));
    pos += 4;
    return true;
  };
  uint32_t ndim = 0, flags = 0, oid = 0, n = 0, lower = 0;
  if (!u32(ndim) || !u32(flags) || !u32(oid) || ndim != 1 || !u32(n) || !u32(lower)) return out;
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t len = 0;
    if (!u32(len)) return {};
    if (len == 0xffffffffu) {
      out.emplace_back();
      continue;
    }
    if (b.size() - pos < len) return {};
    out.emplace_back(reinterpret_cast<const char*>(b.data() + pos), len);
    pos += len;
  }
  return out;
}

// ---------------------------------------------------------------- connection

namespace {

// A URL's user part [start, at): from after "://" to the last '@' before the first '/' that follows
// the first '@'. A password may hold a raw '@', '/' or '?' (libpq takes a '?', PgConn::connect
// refuses the others), and no message may show any of it; '@' in the path or the query (after that
// '/') is not the user part's.
struct UserPart {
  size_t start = 0, at = std::string::npos;  // npos: none
};

UserPart user_part(const std::string& url) {
  UserPart u;
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return u;
  u.start = scheme + 3;
  const size_t first_at = url.find('@', u.start);
  if (first_at == std::string::npos) return u;
  const size_t path = std::min(url.find('/', first_at), url.size());
  u.at = url.rfind('@', path - 1);
  return u;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoded where XX is hex; any other '%' kept as it is.
std::string percent_decoded(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const int hi = i + 2 < s.size() && s[i] == '%' ? hex_digit(s[i + 1]) : -1;
    const int lo = hi >= 0 ? hex_digit(s[i + 2]) : -1;
    if (lo >= 0) {
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The password as written in `url` (user part, password= parameters or pairs) and as decoded.
std::vector<std::string> url_secrets(const std::string& url) {
  std::vector<std::string> out;
  const UserPart u = user_part(url);
  if (u.at != std::string::npos) {
    const size_t colon = url.find(':', u.start);
    if (colon != std::string::npos && colon < u.at) out.push_back(url.substr(colon + 1, u.at - colon - 1));
  }
  for (size_t p = url.find("password="); p != std::string::npos; p = url.find("password=", p + 1)) {
    const size_t begin = p + 9, end = std::min(url.find_first_of("& ", begin), url.size());
    out.push_back(url.substr(begin, end - begin));
  }
  const size_t written = out.size();
  for (size_t i = 0; i < written; ++i) out.push_back(percent_decoded(out[i]));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());  // each once: a mask is not masked again
  return out;
}

}  // namespace

std::string without_pg_secrets(std::string message, const std::string& url) {
  for (const std::string& secret : url_secrets(url)) {
    if (secret.empty()) continue;
    // On past each mask: a password of '*'s (or "%2A", decoded) would otherwise match it for ever.
    for (size_t p = 0; (p = message.find(secret, p)) != std::string::npos; p += 3) message.replace(p, secret.size(), "***");
  }
  return message;
}

std::string redact_pg_url(const std::string& url) {
  std::string out = url;
  const UserPart u = user_part(out);
  if (u.at != std::string::npos) {
    const size_t colon = out.find(':', u.start);
    if (colon != std::string::npos && colon < u.at) out.erase(colon, u.at - colon);
  }
  // password=... as a query parameter or a key=value pair.
  for (size_t p; (p = out.find("password=")) != std::string::npos;) {
    size_t begin = p;
    if (begin > 0 && (out[begin - 1] == '&' || out[begin - 1] == ' ')) --begin;
    size_t end = out.find_first_of("& ", p);
    out.erase(begin, (end == std::string::npos ? out.size() : end) - begin);
    if (begin < out.size() && out[begin] == '&' && (begin == 0 || out[begin - 1] == '?')) out.erase(begin, 1);
  }
  if (!out.empty() && out.back() == '?') out.pop_back();
  return out;
}

namespace {

pg_conn* open_connection(const std::string& url) {
  // connect_timeout first, so that one in the URL wins (expand_dbname: later keywords override).
  const char* keys[] = {"connect_timeout", "dbname", nullptr};
  const char* values[] = {"10", url.c_str(), nullptr};
  return PQconnectdbParams(keys, values, 1);
}

}  // namespace

namespace {

// libpq ends a URL's user part at the first '@' or '/': a raw one in the password sends the rest of
// it on as the host or the database name (and into libpq's messages).
Status check_user_part(const std::string& url, const std::string& where) {
  const UserPart u = user_part(url);
  if (u.at == std::string::npos) return Status::OK();  // no user part, or key=value pairs
  const size_t first_at = url.find('@', u.start), slash = url.find('/', u.start);
  if (first_at != u.at || slash < u.at)
    return Status::InvalidArgument(where + ": the catalog URL's user part holds a raw '@' or '/': write them as %40 "
                                   "and %2F (or give the password as PGPASSWORD or in ~/.pgpass)");
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<PgConn>> PgConn::connect(const std::string& url, const PgConnOptions& options) {
  std::string where = redact_pg_url(url);
  KV_RETURN_IF_ERROR(check_user_part(url, where));
  if (Status ready = load_libpq(); !ready.ok()) return Status::IOError(where + ": " + ready.message());
  pg_conn* c = open_connection(url);
  if (!c) return Status::IOError(where + ": cannot connect to the catalog: out of memory");
  if (PQstatus(c) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(c);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    PQfinish(c);
    return Status::IOError(where + ": cannot connect to the catalog: " + without_pg_secrets(msg, url));
  }
  std::unique_ptr<PgConn> conn(new PgConn(c, url, std::move(where), options));
  KV_RETURN_IF_ERROR(conn->session_setup());
  return conn;
}

PgConn::~PgConn() { PQfinish(c_); }

int PgConn::backend_pid() const { return PQstatus(c_) == CONNECTION_OK ? PQbackendPID(c_) : 0; }

Status PgConn::session_setup() {
  std::string set = "SET lock_timeout = " + std::to_string(options_.lock_timeout_ms);
  if (!options_.synchronous_commit) set += "; SET synchronous_commit = off";
  return run(set);
}

Status PgConn::ensure_connected() {
  if (PQstatus(c_) == CONNECTION_OK) return Status::OK();
  if (in_txn_) return Status::IOError(where_ + ": the connection to the catalog was lost inside a transaction");
  PQreset(c_);
  prepared_.clear();
  if (PQstatus(c_) != CONNECTION_OK) {
    std::string msg = PQerrorMessage(c_);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    return Status::IOError(where_ + ": lost the connection to the catalog and cannot reconnect: " +
                           without_pg_secrets(msg, url_));
  }
  return session_setup();
}

Result<PgResult> PgConn::check(pg_result* r, std::string_view what) {
  PgResult owned(r);
  ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return owned;
  const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  last_sqlstate_ = state ? state : "";
  const char* primary = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  std::string msg = primary ? primary : PQerrorMessage(c_);
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  msg = without_pg_secrets(std::move(msg), url_);
  std::string full = where_ + ": " + msg + " (" + std::string(what.substr(0, 80)) + ")";
  if (PQstatus(c_) != CONNECTION_OK) {
    return Status::IOError(where_ + ": lost the connection to the catalog: " + msg);
  }
  std::string_view code = last_sqlstate_;
  if (code.substr(0, 2) == "23") return Status::InvalidArgument(full);  // integrity constraint violation
  if (code == "XX001" || code == "XX002") {
    return Status::Corruption(where_ + ": the catalog is damaged: " + msg);
  }
  if (code == "55P03") {
    return Status::IOError(where_ + ": the catalog is busy: another kvsnap process held a lock for more than " +
                           std::to_string(options_.lock_timeout_ms / 1000) + " s (" + msg + ")");
  }
  return Status::IOError(full);
}

Result<PgResult> PgConn::exec(const char* sql, const PgParams& params) {
  KV_RETURN_IF_ERROR(ensure_connected());
  auto it = prepared_.find(sql);
  if (it == prepared_.end()) {
    std::string name = "kv" + std::to_string(prepared_.size());
    KV_ASSIGN_OR_RETURN(PgResult r, check(PQprepare(c_, name.c_str(), sql, static_cast<int>(params.size()),
                                                    params.oids()),
                                          std::string("prepare ") + sql));
    it = prepared_.emplace(sql, name).first;
  }
  auto values = params.value_ptrs();
  auto lengths = params.lengths();
  auto formats = params.formats();
  return check(PQexecPrepared(c_, it->second.c_str(), static_cast<int>(params.size()), values.data(),
                              lengths.data(), formats.data(), 1),
               sql);
}

Result<PgResult> PgConn::exec_once(const std::string& sql, const PgParams& params) {
  KV_RETURN_IF_ERROR(ensure_connected());
  auto values = params.value_ptrs();
  auto lengths = params.lengths();
  auto formats = params.formats();
  return check(PQexecParams(c_, sql.c_str(), static_cast<int>(params.size()), params.oids(), values.data(),
                            lengths.data(), formats.data(), 1),
               sql);
}

Status PgConn::run(const std::string& sql) {
  KV_RETURN_IF_ERROR(ensure_connected());
  return check(PQexec(c_, sql.c_str()), sql).status();
}

Result<std::vector<PgResult>> PgConn::pipeline(std::span<const Command> commands) {
  KV_RETURN_IF_ERROR(ensure_connected());
  if (PQenterPipelineMode(c_) != 1) return Status::IOError(where_ + ": cannot enter pipeline mode");
  // What each result answers: a command's index, or -1 for a statement being prepared.
  std::vector<int> answers;
  std::vector<std::pair<const char*, std::string>> preparing;
  bool sent = true;
  for (size_t i = 0; i < commands.size() && sent; ++i) {
    const Command& cmd = commands[i];
    if (!cmd.params) {
      sent = PQsendQueryParams(c_, cmd.sql, 0, nullptr, nullptr, nullptr, nullptr, 1) == 1;
      answers.push_back(static_cast<int>(i));
      continue;
    }
    auto it = prepared_.find(cmd.sql);
    std::string name;
    if (it != prepared_.end()) {
      name = it->second;
    } else {
      name = "kv" + std::to_string(prepared_.size() + preparing.size());
      sent = PQsendPrepare(c_, name.c_str(), cmd.sql, static_cast<int>(cmd.params->size()), cmd.params->oids()) == 1;
      answers.push_back(-1);
      preparing.emplace_back(cmd.sql, name);
    }
    auto values = cmd.params->value_ptrs();
    auto lengths = cmd.params->lengths();
    auto formats = cmd.params->formats();
    sent = sent && PQsendQueryPrepared(c_, name.c_str(), static_cast<int>(cmd.params->size()), values.data(),
                                       lengths.data(), formats.data(), 1) == 1;
    answers.push_back(static_cast<int>(i));
  }
  sent = sent && PQpipelineSync(c_) == 1;
  std::vector<PgResult> out;
  Status failed;
  size_t next_prepared = 0;
  // Each command's result is followed by a NULL; then comes the sync point.
  for (size_t k = 0; k < answers.size() && sent && PQstatus(c_) == CONNECTION_OK; ++k) {
    Result<PgResult> r = check(PQgetResult(c_), answers[k] < 0 ? "prepare" : commands[answers[k]].sql);
    while (PGresult* extra = PQgetResult(c_)) PQclear(extra);
    if (!r.ok()) {
      if (failed.ok()) failed = r.status();
      continue;
    }
    if (answers[k] < 0) {
      prepared_.insert(preparing[next_prepared++]);
    } else {
      out.push_back(std::move(r).value());
    }
  }
  for (int i = 0; i < 4 && PQstatus(c_) == CONNECTION_OK; ++i) {  // the sync point
    PGresult* r = PQgetResult(c_);
    bool sync = r && PQresultStatus(r) == PGRES_PIPELINE_SYNC;
    PQclear(r);
    if (sync) break;
  }
  if (PQexitPipelineMode(c_) != 1 || !sent) {
    // Unread results or a lost connection: this connection is in no known
    // state, so it is replaced (a failure shows at the next statement).
    PQfinish(c_);
    c_ = open_connection(url_);
    prepared_.clear();
    in_txn_ = false;
    if (failed.ok()) failed = Status::IOError(where_ + ": lost the connection to the catalog in a pipeline");
    if (PQstatus(c_) == CONNECTION_OK) (void)session_setup();
  }
  if (!failed.ok()) return failed;
  return out;
}

Status PgConn::begin(Isolation iso) {
  last_sqlstate_.clear();
  KV_RETURN_IF_ERROR(run(iso == Isolation::kReadCommitted ? "BEGIN" : kBeginSnapshot));
  in_txn_ = true;
  return Status::OK();
}

Status PgConn::commit() {
  Status s = check(PQexec(c_, "COMMIT"), "COMMIT").status();
  if (!s.ok() && PQstatus(c_) != CONNECTION_OK) {
    in_txn_ = false;
    return Status::IOError(s.message() + "; whether the last change was committed is unknown (kvsnap ls shows it)");
  }
  // A COMMIT of a failed transaction answers "ROLLBACK" without an error: body() reported the failure already.
  in_txn_ = !s.ok();
  return s;
}

void PgConn::rollback() {
  if (in_txn_ && PQstatus(c_) == CONNECTION_OK) PQclear(PQexec(c_, "ROLLBACK"));
  in_txn_ = false;
}

void PgConn::backoff() {
  thread_local std::minstd_rand jitter(static_cast<unsigned>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  std::this_thread::sleep_for(std::chrono::microseconds(200 + jitter() % 5000));
}

}  // namespace kvsnap
