// parse_token_payload (format/llama_state.h): the words after a state file's
// header, plain or llama-server's packed form (media chunks, lengths).
#include <cstring>

#include "format/llama_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<int32_t> words(size / 4);
  if (!words.empty()) std::memcpy(words.data(), data, words.size() * 4);
  (void)kvsnap::parse_token_payload(std::move(words));
  return 0;
}
