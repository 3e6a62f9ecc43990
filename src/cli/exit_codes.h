// The one place where error codes become process exit codes (docs/cli.md).
#pragma once

#include "base/status.h"

namespace kvsnap::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;

inline int exit_code(const Status& s) {
  switch (s.code()) {
    case Code::kOk: return 0;
    case Code::kInvalidArgument: return 2;
    case Code::kCorruption: return 3;
    case Code::kNotSupported: return 4;
    case Code::kMismatch: return 5;
    case Code::kAmbiguous: return 6;
    case Code::kIOError: return 7;
    case Code::kNotFound: return 8;
  }
  return 1;
}

}  // namespace kvsnap::cli
