// Status and Result<T>: errors are values in kvsnap.
//
// No exception crosses format/, migrate/ or the store. A failing call returns a
// Status whose code callers branch on and whose message names the file, the
// offset and the problem in words a user can act on. The CLI maps codes to exit
// codes in one place (src/cli/exit_codes.h).
//
// The one exception: running out of memory is std::bad_alloc, as for every
// standard container, including the few C libraries whose context allocation
// fails (OpenSSL, zstd). It is never an answer about the input; the process
// edge (src/cli/main.cc, exit 70) and the C API (KVSNAP_ERR_IO "out of memory") catch it.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace kvsnap {

enum class Code {
  kOk = 0,
  kCorruption,       // the bytes contradict the format (truncated, bad count, bad magic)
  kNotSupported,     // well-formed but outside what kvsnap handles
  kInvalidArgument,  // the caller asked for something impossible
  kIOError,          // the OS said no
  kNotFound,
  kMismatch,         // two valid things disagree (file vs model, type vs row size)
  kAmbiguous,        // more than one reading fits: more information (--model) needed
  kInterrupted,      // the user stopped the operation (Ctrl-C): nothing was committed
};

const char* code_name(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  static Status OK() { return Status(); }
  static Status Corruption(std::string m) { return Status(Code::kCorruption, std::move(m)); }
  static Status NotSupported(std::string m) { return Status(Code::kNotSupported, std::move(m)); }
  static Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
  static Status IOError(std::string m) { return Status(Code::kIOError, std::move(m)); }
  static Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
  static Status Mismatch(std::string m) { return Status(Code::kMismatch, std::move(m)); }
  static Status Ambiguous(std::string m) { return Status(Code::kAmbiguous, std::move(m)); }
  static Status Interrupted(std::string m) { return Status(Code::kInterrupted, std::move(m)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  // "corruption: <message>" style, for logs and the CLI.
  std::string ToString() const;
  // The same status with "<prefix>: " in front of the message (OK stays OK).
  Status Prefixed(const std::string& prefix) const;
  // The same status with `suffix` after the message (OK stays OK).
  Status Appended(const std::string& suffix) const;

 private:
  Status(Code c, std::string m) : code_(c), msg_(std::move(m)) {}
  Code code_ = Code::kOk;
  std::string msg_;
};

// A value or the Status that explains why there is none. Constructing a
// Result from an OK Status is a programming error.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {            // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result from an OK Status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvsnap

#define KV_CONCAT_INNER(a, b) a##b
#define KV_CONCAT(a, b) KV_CONCAT_INNER(a, b)

// Return the Status of `expr` from the enclosing function unless it is OK.
#define KV_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::kvsnap::Status kv_status_ = (expr);            \
    if (!kv_status_.ok()) return kv_status_;         \
  } while (0)

// `lhs = value of expr`, or return its Status from the enclosing function.
#define KV_ASSIGN_OR_RETURN(lhs, expr) \
  KV_ASSIGN_OR_RETURN_IMPL(KV_CONCAT(kv_result_, __LINE__), lhs, expr)
#define KV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
