// The export index (kvsnap-export.json inside an export archive) as text:
// parse_export_index (src/store/store.h), as Store::import_from reads it.
#include "fuzz/fuzz_input.h"
#include "store/store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)kvsnap::parse_export_index(kvsnap::fuzz::text(data, size), "fuzz.tar");
  return 0;
}
