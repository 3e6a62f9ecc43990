// read_gguf (format/gguf.h) and what is derived from a header: the model
// profile, its memory sections and shape, and the fingerprint.
#include "format/gguf.h"
#include "format/memory_shape.h"
#include "format/model_profile.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvsnap::MemoryFile file("fuzz.gguf", kvsnap::fuzz::bytes(data, size));
  auto header = kvsnap::read_gguf(file);
  if (!header.ok()) return 0;
  (void)kvsnap::gguf_fingerprint(file, *header);
  auto profile = kvsnap::profile_from_gguf(*header);
  if (!profile.ok()) return 0;
  (void)kvsnap::memory_sections(*profile);
  (void)kvsnap::memory_shape(*profile, "fuzz.gguf");
  return 0;
}
