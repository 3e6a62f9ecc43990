#include "base/status.h"

namespace kvsnap {

const char* code_name(Code c) {
  switch (c) {
    case Code::kOk: return "ok";
    case Code::kCorruption: return "corrupt input";
    case Code::kNotSupported: return "not supported";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kIOError: return "I/O error";
    case Code::kNotFound: return "not found";
    case Code::kMismatch: return "mismatch";
    case Code::kAmbiguous: return "ambiguous";
    case Code::kInterrupted: return "interrupted";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(code_name(code_)) + ": " + msg_;
}

Status Status::Prefixed(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + msg_);
}

Status Status::Appended(const std::string& suffix) const {
  if (ok()) return *this;
  return Status(code_, msg_ + suffix);
}

}  // namespace kvsnap
