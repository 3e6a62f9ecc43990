// The C libraries the store opens on their first use (base/lazy_library.h says why): PostgreSQL's
// libpq (the fleet catalog), libcurl (the S3 blob store), libarchive (export and import).
//
// Each load_*() returns OK once its library is usable: opened and every function kvsnap calls
// resolved (when the build loads it lazily: CMake's KVSNAP_LAZY_LIBRARIES, the default on ELF
// systems; a build that links it returns OK at once), and for libcurl, curl_global_init() done.
// A module edge calls it before its first call into the library and returns its Status, which
// names the library, what needs it and the package that has it (exit 7). A stub reached without
// it loads the library itself, or aborts with that message.
#pragma once

#include "base/status.h"

namespace kvsnap {

Status load_libpq();
Status load_libcurl();
Status load_libarchive();

}  // namespace kvsnap
