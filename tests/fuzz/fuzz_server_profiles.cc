// servers.json (src/server/server_profiles.h) as ServerProfiles::load reads it.
#include "fuzz/fuzz_input.h"
#include "server/server_profiles.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)kvsnap::parse_server_profiles(kvsnap::fuzz::text(data, size), "servers.json");
  return 0;
}
