// llama-server's replies (src/server/llama_server.h): every reply parser on
// the same body (/slots, save, restore, /tokenize, /completion, error bodies).
#include "fuzz/fuzz_input.h"
#include "server/llama_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(kvsnap::fuzz::text(data, size));
  (void)kvsnap::parse_slots_reply(body, "fuzz");
  (void)kvsnap::parse_slot_file_reply(body, "fuzz", /*restore=*/false);
  (void)kvsnap::parse_slot_file_reply(body, "fuzz", /*restore=*/true);
  (void)kvsnap::parse_tokenize_reply(body, "fuzz");
  (void)kvsnap::parse_completion_reply(body, "fuzz");
  (void)kvsnap::parse_error_reply(body);
  return 0;
}
