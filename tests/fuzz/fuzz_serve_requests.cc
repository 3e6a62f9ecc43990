// What kvsnap serve reads from clients and from its child (src/serve/requests.h): every parser on
// the same input, as a completion request on each kind of route, a requantize body, the child's
// /apply-template answer and a completion answer both whole and as a "data: " event stream, and
// the proxy's test for a stream's last event (ends_a_stream) on what the child streams, whole and
// cut in two, and the tail of a stream it keeps (trim_stream_tail); and llama-server's config.ini
// files (src/serve/llama_config.h), which serve reads at start, and the llama-server ARGS it reads
// (src/serve/llama_args.h): the input's lines as ARGS, and the input as the child's config.ini; and
// the LoRA scales of a request, a slot and the child's GET /lora-adapters (src/serve/lora_scales.h).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "serve/llama_args.h"
#include "serve/llama_config.h"
#include "serve/lora_scales.h"
#include "serve/requests.h"

// A key of llama.cpp's config grammar (serve/llama_config.h): [a-zA-Z_][a-zA-Z0-9_.-]* as decoded
// UTF-8 characters, an overlong form of one of them included (llama.cpp's decoder lets it pass,
// and the key keeps its bytes); written apart from llama_config.cc's reader on purpose.
static bool grammar_key(const std::string& key) {
  if (key.empty()) return false;
  for (size_t at = 0, index = 0; at < key.size(); ++index) {
    const auto b = static_cast<unsigned char>(key[at]);
    size_t n = 1;
    uint32_t cp = b;
    if (b >= 0x80) {
      if ((b & 0xe0) == 0xc0) n = 2, cp = b & 0x1fu;
      else if ((b & 0xf0) == 0xe0) n = 3, cp = b & 0x0fu;
      else if ((b & 0xf8) == 0xf0) n = 4, cp = b & 0x07u;
      else return false;
      if (at + n > key.size()) return false;
      for (size_t j = 1; j < n; ++j) {
        const auto c = static_cast<unsigned char>(key[at + j]);
        if ((c & 0xc0) != 0x80) return false;
        cp = cp << 6 | (c & 0x3fu);
      }
    }
    const bool letter = (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    const bool rest = letter || (cp >= '0' && cp <= '9') || cp == '.' || cp == '-';
    if (index == 0 ? !letter : !rest) return false;
    at += n;
  }
  return true;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body = kvsnap::fuzz::text(data, size);
  for (const char* path : {"/completion", "/v1/chat/completions"}) {
    auto r = kvsnap::parse_completion_request(path, body);
    if (r.ok() && r->prompt != kvsnap::CompletionRequest::Prompt::kNone) (void)kvsnap::body_with_id_slot(body, 1);
  }
  (void)kvsnap::parse_requantize_body(body, "f16", "f16");
  // The child's adapters, a request's "lora" and a /slots entry's (serve/lora_scales.h).
  if (auto a = kvsnap::parse_lora_adapters_reply(body); a.ok()) (void)kvsnap::scales_refusal(*a, false, a->loaded);
  const auto j = kvsnap::parse_bounded<nlohmann::json>(body);
  if (!j.is_discarded()) {
    (void)kvsnap::scales_as_read(j, {1.0f, 0.5f});
    (void)kvsnap::slot_scales(j, {1.0f});
  }
  (void)kvsnap::parse_apply_template_reply(body);
  for (bool streamed : {false, true}) {
    (void)kvsnap::slot_of_answer_body(streamed, body);
    (void)kvsnap::prompt_n_of_answer(streamed, body);
  }
  // Whole, and cut in two where a read of the child's answer could end (the seam search).
  (void)kvsnap::ends_a_stream("", body);
  for (size_t cut : {size_t(1), size_t(7), body.size() / 2, body.size() > 0 ? body.size() - 1 : 0})
    if (cut <= body.size()) (void)kvsnap::ends_a_stream(body.substr(0, cut), body.substr(cut));
  // The proxy's tail of a stream: a suffix of what came, at least `keep` bytes of it, starting at
  // an event (or the whole body when nothing was cut).
  for (size_t keep : {size_t(0), size_t(1), size_t(16), size_t(64)}) {
    std::string tail(body);
    kvsnap::trim_stream_tail(tail, keep);
    if (tail.size() > body.size() || body.compare(body.size() - tail.size(), tail.size(), tail) != 0) __builtin_trap();
    if (tail.size() < std::min(body.size(), keep)) __builtin_trap();
    if (tail.size() != body.size() && tail.rfind("data: ", 0) != 0) __builtin_trap();
  }
  // A config file read is a "[*]" and a default section of keys llama.cpp's grammar allows.
  if (auto ini = kvsnap::parse_llama_config_ini(body); ini.ok()) {
    for (const auto* section : {&ini->global, &ini->defaults})
      for (const auto& [key, value] : *section) {
        if (!grammar_key(key)) __builtin_trap();
        if (!value.empty() && (value.front() == ' ' || value.back() == ' ' || value.find('\n') != std::string::npos))
          __builtin_trap();
      }
  }
  // ARGS: one a line (at most 64), after the program; the input also as the system config.ini, an
  // environment with nothing set. Whatever the parse says, it says it without a crash.
  std::vector<std::string> argv{"llama-server"};
  for (size_t at = 0; at <= body.size() && argv.size() < 65;) {
    const size_t nl = std::min(body.find('\n', at), body.size());
    argv.emplace_back(body.substr(at, nl - at));
    at = nl + 1;
  }
  kvsnap::ArgsEnvironment env;
  env.getenv = [](const std::string&) { return std::optional<std::string>(); };
  env.read_file = [&](const std::string& path) {
    return path == "/etc/llama.cpp/config.ini" ? std::optional<std::string>(body) : std::nullopt;
  };
  env.passwd_home = [] { return std::optional<std::string>(); };
  (void)kvsnap::parse_llama_args(argv, env);
  (void)kvsnap::parse_llama_args({"llama-server"}, env);
  return 0;
}
