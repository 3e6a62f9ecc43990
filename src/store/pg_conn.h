// A thin layer over libpq for the PostgreSQL catalog and its gc locks: one
// connection, statements prepared once per connection, parameters and results
// in PostgreSQL's binary format, transactions that retry what the server
// rolled back by itself (serialization failures, deadlocks), and errors that
// name the catalog URL (never its password) and carry the server's message.
//
// What it promises:
//   - Nothing here throws or crashes on a server error, a malformed or short
//     value, or a dropped connection: every call returns a Status.
//   - A connection found broken is re-established at the start of the next
//     statement outside a transaction (prepared statements are prepared again).
//     Inside a transaction a lost connection is an error: the server rolled the
//     transaction back, or, if COMMIT was in flight, its outcome is unknown and
//     the message says so. Such transactions are never retried blindly.
//   - Result values are read by their wire length: an integer column may be
//     int2, int4 or int8; anything else reads as 0, never out of bounds.
//
// A PgConn is one connection: use one per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

struct pg_conn;
struct pg_result;

namespace kvsnap {

// Positional parameters ($1, $2, ...) in the order they are added, in binary
// format with their types, so a statement is prepared with exact types.
class PgParams {
 public:
  PgParams& i64(int64_t v);
  PgParams& null_i64();
  PgParams& text(std::string_view v);
  PgParams& opt_text(const std::optional<std::string>& v);
  PgParams& bytes(std::span<const std::byte> v);
  PgParams& bytes(const void* p, size_t n) { return bytes({static_cast<const std::byte*>(p), n}); }
  // One-dimensional arrays (int8[], text[] with NULLs for nullopt, bytea[]).
  PgParams& i64_array(std::span<const int64_t> v);
  PgParams& text_array(std::span<const std::optional<std::string>> v);
  PgParams& bytes_array(std::span<const std::span<const std::byte>> v);

  size_t size() const { return values_.size(); }
  const uint32_t* oids() const { return oids_.data(); }
  // Pointers into this object: valid while it lives and is not changed.
  std::vector<const char*> value_ptrs() const;
  std::vector<int> lengths() const;
  std::vector<int> formats() const { return std::vector<int>(values_.size(), 1); }

 private:
  PgParams& add(uint32_t oid, std::string value, bool null = false);
  std::vector<uint32_t> oids_;
  std::vector<std::string> values_;
  std::vector<bool> nulls_;
};

// A statement's result (binary format). Row and column indexes must be in range.
class PgResult {
 public:
  explicit PgResult(pg_result* r);
  PgResult(PgResult&&) noexcept;
  PgResult& operator=(PgResult&&) noexcept;
  ~PgResult();

  int rows() const;
  // Rows an INSERT/UPDATE/DELETE changed (PQcmdTuples).
  int64_t changed() const;
  bool is_null(int row, int col) const;
  int64_t i64(int row, int col) const;
  bool boolean(int row, int col) const { return i64(row, col) != 0; }
  std::string text(int row, int col) const;
  std::span<const std::byte> bytes(int row, int col) const;
  // A text[] value; empty for NULL or a value that is not a one-dimensional array.
  std::vector<std::string> text_array(int row, int col) const;

 private:
  pg_result* r_;
};

struct PgConnOptions {
  int lock_timeout_ms = 10000;  // 0: wait for row and advisory locks forever
  bool synchronous_commit = true;
};

class PgConn {
 public:
  enum class Isolation { kReadCommitted, kRepeatableReadOnly };

  // `url` is a libpq connection URI or key=value string.
  static Result<std::unique_ptr<PgConn>> connect(const std::string& url, const PgConnOptions& options = {});
  ~PgConn();
  PgConn(const PgConn&) = delete;
  PgConn& operator=(const PgConn&) = delete;

  // The URL without its password: what messages name.
  const std::string& where() const { return where_; }

  // A constant SQL text, prepared on first use on this connection (keyed by
  // the literal's address).
  Result<PgResult> exec(const char* sql, const PgParams& params = {});
  // Dynamic SQL, not kept prepared.
  Result<PgResult> exec_once(const std::string& sql, const PgParams& params = {});
  // One or more statements without parameters (DDL, SET).
  Status run(const std::string& sql);

  // Statements sent together and answered in one round trip (libpq's pipeline
  // mode): a constant SQL text with its parameters (prepared as by exec()), or,
  // with params nullptr, a command without parameters (BEGIN, COMMIT). The
  // results in order; the first failure is the answer, and what came after it
  // did not run.
  struct Command {
    const char* sql;
    const PgParams* params;
  };
  Result<std::vector<PgResult>> pipeline(std::span<const Command> commands);
  // For transactions begun or ended inside a pipeline (kBeginSnapshot, "COMMIT").
  void set_in_transaction(bool in) { in_txn_ = in; }
  // Rolls back a transaction begun that way, whatever state the pipeline left
  // (a ROLLBACK outside a transaction is only a warning).
  void abandon_transaction() {
    in_txn_ = true;
    rollback();
  }

  // Runs `body` between BEGIN and COMMIT; rolls back on any error. Retried from
  // the start (up to ~10 times) when the server reports a serialization failure
  // or a deadlock, so `body` must reset whatever it collects.
  template <class F>
  Status transaction(Isolation iso, F&& body);

  // The backend's process id (pg_stat_activity.pid), 0 when not connected.
  int backend_pid() const;
  // False once the connection is known to be broken (the next statement would reconnect).
  bool connected() const { return backend_pid() != 0; }

 private:
  PgConn(pg_conn* c, std::string url, std::string where, PgConnOptions options)
      : c_(c), url_(std::move(url)), where_(std::move(where)), options_(options) {}
  Status session_setup();
  Status ensure_connected();
  Result<PgResult> check(pg_result* r, std::string_view what);
  Status begin(Isolation iso);
  Status commit();
  void rollback();
  // serialization_failure or deadlock_detected: the server rolled back, so trying again is safe.
  bool last_error_retryable() const { return last_sqlstate_ == "40001" || last_sqlstate_ == "40P01"; }
  void backoff();  // a short random sleep before a retry

  pg_conn* c_;
  std::string url_;
  std::string where_;
  PgConnOptions options_;
  bool in_txn_ = false;
  std::string last_sqlstate_;
  std::unordered_map<const char*, std::string> prepared_;  // SQL literal -> statement name
};

// `url` without a password, for messages: postgresql://user:secret@host/db ->
// postgresql://user@host/db; password=... in a key=value string or a query
// parameter is dropped.
std::string redact_pg_url(const std::string& url);
// `message` (libpq's, which may quote the URL's parts) with every password `url` holds, as written
// and percent-decoded, replaced by "***".
std::string without_pg_secrets(std::string message, const std::string& url);

// What Isolation::kRepeatableReadOnly begins with, for a pipeline.
inline constexpr const char* kBeginSnapshot = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

template <class F>
Status PgConn::transaction(Isolation iso, F&& body) {
  for (int attempt = 0;; ++attempt) {
    KV_RETURN_IF_ERROR(begin(iso));
    Status s = body();
    if (s.ok()) s = commit();
    if (s.ok()) return s;
    bool retry = last_error_retryable() && attempt < 10;
    rollback();
    if (!retry) return s;
    backoff();
  }
}

}  // namespace kvsnap
