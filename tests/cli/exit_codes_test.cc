// The command line's exit statuses and the C API's kvsnap_status values are the same numbers
// for the same error codes (docs/cli.md, capi/kvsnap.h): pinned at compile time, so a change to
// one front end that forgets the other does not build.
#include "cli/exit_codes.h"

#include <gtest/gtest.h>

#include "capi/kvsnap.h"

namespace kvsnap::cli {
namespace {

static_assert(exit_code(Code::kOk) == KVSNAP_OK);
static_assert(exit_code(Code::kInvalidArgument) == KVSNAP_ERR_INVALID_ARGUMENT);
static_assert(exit_code(Code::kCorruption) == KVSNAP_ERR_CORRUPT);
static_assert(exit_code(Code::kNotSupported) == KVSNAP_ERR_NOT_SUPPORTED);
static_assert(exit_code(Code::kMismatch) == KVSNAP_ERR_MISMATCH);
static_assert(exit_code(Code::kAmbiguous) == KVSNAP_ERR_AMBIGUOUS);
static_assert(exit_code(Code::kIOError) == KVSNAP_ERR_IO);
static_assert(exit_code(Code::kNotFound) == KVSNAP_ERR_NOT_FOUND);
static_assert(kExitInternal == KVSNAP_ERR_INTERNAL);
// Interrupted has no C API value: the C API's files are the caller's, kvsnap never stops them.
static_assert(exit_code(Code::kInterrupted) == kExitInterrupted);

TEST(ExitCodes, StatusAndCodeAgree) {
  EXPECT_EQ(exit_code(Status::Mismatch("x")), KVSNAP_ERR_MISMATCH);
  EXPECT_EQ(exit_code(Status::OK()), KVSNAP_OK);
}

}  // namespace
}  // namespace kvsnap::cli
