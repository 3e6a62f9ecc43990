// The JSON `kvsnap serve` reads from outside, parsed without I/O and without
// exceptions: a client's completion request and requantize body, and what the
// child (llama-server) answers to /apply-template and to a completion (a body,
// or a stream of "data: " events). Every function here takes hostile input:
// wrong types, numbers out of range, deep nesting and bytes that are not UTF-8
// end in an error or an empty answer, never in a throw or a crash
// (tests/fuzz/fuzz_serve_requests.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace kvsnap {

// JSON nested deeper than this is not read (copying and writing JSON recurse once per level).
inline constexpr size_t kMaxServeJsonDepth = 512;

// The document, or a discarded value when it is not JSON or is nested deeper than kMaxServeJsonDepth
// (for nlohmann::json and nlohmann::ordered_json).
template <class Json>
Json parse_bounded(std::string_view text);

// A JSON value as nlohmann's get<int> converts it (llama-server's json_value<int>): an integer of any
// size wraps to int, a float truncates (NaN or out of int range: INT_MIN, as x86's conversion gives), a
// boolean is 0 or 1; `other` for anything else (for nlohmann::json and nlohmann::ordered_json).
template <class Json>
int int_as_read(const Json& v, int other);

// What the prefix lookup needs of a completion request.
struct CompletionRequest {
  enum class Prompt {
    kNone,    // not a JSON object, or no prompt kvsnap looks up (none, several, multimodal): forwarded untouched
    kTokens,  // "prompt" is an array of token ids: `tokens`
    kText,    // "prompt" is a string: `text`, to tokenize
    kChat,    // a chat route with "messages": `template_body`, the child's /apply-template request
  };
  Prompt prompt = Prompt::kNone;
  bool object = false;  // the body is a JSON object (body_with_id_slot can pin it to a slot)
  std::vector<int32_t> tokens;
  std::string text;
  std::string template_body;  // the chat request's body as it came: what the child renders its prompt from
  int id_slot = -1;           // "id_slot" as llama-server reads it (id_slot_as_read): -1 is any slot
  // "n_cmpl" (or "n") as llama-server reads it (completions_as_read): anything but 1 runs in several
  // slots at once (or is refused), in slots kvsnap does not name.
  int n_cmpl = 1;
  // "lora" as the body has it (absent or null: nullopt, as llama-server reads it): an array names the
  // adapter scales the child runs the request with (serve/adapters.h scales_as_read; [] names none),
  // anything else the child refuses.
  std::optional<nlohmann::ordered_json> lora;
};

// "id_slot" of a request as llama-server 3.22.1 reads it (json_value<int>: nlohmann's get<int>, -1 when
// absent, null or not a number or boolean): an integer of any size wraps to int, a float truncates
// (NaN or out of int range: INT_MIN, as x86's conversion gives), a boolean is 0 or 1. So 1.0, true and
// 4294967297 all ask for slot 1, and serve's gate and prefix lookup must reserve that slot for them.
int id_slot_as_read(const nlohmann::ordered_json& body);

// How many completions a request asks for, as llama-server 3.22.1 reads it (field_num<int32_t>
// "n_cmpl", else its alias "n", when present and not null; 1 without either): converted as
// id_slot_as_read converts, and 0 for a value llama-server refuses (a string, an array, an object).
// With more than 1, llama-server runs the copies in other free slots (get_free_slots).
int completions_as_read(const nlohmann::ordered_json& body);

// The slot llama-server runs a request with `id_slot` in, out of `n_slots` (get_slot_by_id: any value
// but -1 wraps, as an unsigned 64-bit number, modulo the slot count, so -3 is a slot too); -1: any.
int pinned_slot_of(int id_slot, size_t n_slots);

// True for the completion routes whose body's id_slot reaches llama-server's task (3.22.1): all but
// the Anthropic route, whose conversion to a chat completion (server_chat_convert_anthropic_to_oai)
// keeps only the fields it knows, so that kvsnap cannot choose its slot.
bool route_takes_id_slot(std::string_view path);

// True for the chat routes (their prompt is "messages", rendered by the child's chat template).
bool is_chat_route(std::string_view path);

// True for llama-server's slot actions (POST /slots/N?action=save|restore|erase): serve saves and
// restores the slots itself, behind its slot gate and its queued saves, so a client's is answered
// 403 and never reaches the child (one would erase or overwrite another conversation's slot before
// its save, restore into a slot another completion is about to use, or write files of its naming
// into serve's slot directory).
bool is_slot_action(std::string_view method, std::string_view path);

// True for llama-server's POST /lora-adapters, which sets the adapters' scales for every later task
// that does not name its own: the caches made after it hold other values than the stored sessions
// of the same prompts, which no snapshot would tell apart. Answered 403 by serve (restart it with
// --lora-scaled instead).
bool changes_adapters(std::string_view method, std::string_view path);

// A completion request's body (`path`: its route). An error (kInvalidArgument) when the body is a
// JSON object whose prompt kvsnap cannot take: token ids that are not all integers in int32 range,
// or nesting deeper than kMaxServeJsonDepth; the request is then forwarded as it came.
Result<CompletionRequest> parse_completion_request(std::string_view path, std::string_view body);

// The body with "id_slot": slot set (the other members as they were, in their order); nullopt when
// it is not a JSON object (or nested too deep).
std::optional<std::string> body_with_id_slot(std::string_view body, int slot);

// The "prompt" of the child's /apply-template answer (kMismatch when it has none).
Result<std::string> parse_apply_template_reply(std::string_view body);

// Calls `f` with a completion answer's JSON: the body, or each "data: " event of a stream;
// unparsable (or too deep) ones are skipped.
void for_each_answer_json(bool streamed, std::string_view body, const std::function<void(const nlohmann::json&)>& f);

// The slot a completion answer names (id_slot / slot_id, an integer in int range; in a stream, its
// last event that names one), or -1.
int slot_of_answer_body(bool streamed, std::string_view body);

// What a proxy keeps of a stream it forwards, for the two readers above: once `body` holds more
// than 2 x `keep` bytes, the events before the last `keep` bytes are dropped, cutting at the start of
// an event (a line beginning "data: "), never inside one: the stream's last event, which names the
// slot and the timings, is kept whole however long (3.22.1's holds the whole prompt's text).
void trim_stream_tail(std::string& body, size_t keep);

// timings.prompt_n of a completion answer (in a stream, its last event that has one): how many
// prompt tokens the child evaluated. nullopt when no event has one; an error (kMismatch) when one
// is not a non-negative integer.
Result<std::optional<uint64_t>> prompt_n_of_answer(bool streamed, std::string_view body);

// A POST /kvsnap/requantize body: {"ctk", "ctv", "flash_attn", "ctx_size", "dry_run"}.
struct RequantizeAsk {
  std::string ctk, ctv, flash_attn;  // flash_attn "" = unchanged
  int ctx_size = 0;                  // 0 = unchanged
  bool dry_run = false;
};
// `ctk`, `ctv`: the child's current types (kept for the one the body does not name). Errors are
// kInvalidArgument, their message meant for the client.
Result<RequantizeAsk> parse_requantize_body(std::string_view body, const std::string& ctk, const std::string& ctv);

// Whether a piece of a streamed answer holds the event that ends a llama-server stream (which a
// client may act on before the stream's end): /completion's and /infill's `"stop":true`, an OpenAI
// choice's `"finish_reason":"..."`, `data: [DONE]`, Anthropic's `message_stop`, the Responses API's
// `response.completed`.
// `before`: what the stream sent before `chunk` (its tail is enough), for a marker cut between them.
bool ends_a_stream(std::string_view before, std::string_view chunk);

}  // namespace kvsnap
