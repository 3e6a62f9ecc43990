// llama-server's replies (src/server/llama_server.h): every reply parser on
// the same body (/slots, save, restore, /tokenize, /completion, /props build_info, error bodies).
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
  const auto props = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!props.is_discarded()) (void)kvsnap::parse_server_build(props);  // GET /props
  return 0;
}
