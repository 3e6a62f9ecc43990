// serve/requests.h: the JSON kvsnap serve reads from clients and from the child, parsed without
// exceptions; hostile inputs end in an error or an empty answer.
#include "serve/persist.h"
#include "serve/proxy.h"
#include "serve/requests.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#include <string>

namespace kvsnap {
namespace {

using Prompt = CompletionRequest::Prompt;

std::string nested(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(ServeRequests, CompletionPromptText) {
  auto r = parse_completion_request("/completion", R"({"prompt": "Hello", "n_predict": 4, "id_slot": 1})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt, Prompt::kText);
  EXPECT_EQ(r->text, "Hello");
  EXPECT_EQ(r->id_slot, 1);
}

// A review's finding: POST /slots/N?action=save|restore|erase reached the child from any client.
TEST(ServeRequests, SlotActionsAreKvsnapsOwn) {
  EXPECT_TRUE(is_slot_action("POST", "/slots/0"));
  EXPECT_TRUE(is_slot_action("POST", "/slots/12"));
  EXPECT_TRUE(is_slot_action("POST", "/slots"));
  EXPECT_TRUE(is_slot_action("PUT", "/slots/0"));
  EXPECT_TRUE(is_slot_action("DELETE", "/slots/0"));
  EXPECT_FALSE(is_slot_action("GET", "/slots"));
  EXPECT_FALSE(is_slot_action("GET", "/slots/0"));
  EXPECT_FALSE(is_slot_action("POST", "/slotsx"));
  EXPECT_FALSE(is_slot_action("POST", "/completion"));
  EXPECT_FALSE(is_slot_action("POST", "/v1/slots/0"));
}

// A request's "lora" as llama-server 3.22.1 reads it: null is absent (has_value), anything else is
// kept for serve/adapters.h (an array names scales, [] none; another value the child refuses);
// POST /lora-adapters changes the scales of every later request.
TEST(ServeRequests, PerRequestAdaptersAndTheirRouteAreSeen) {
  auto lora = [](const char* path, const char* body) {
    auto r = parse_completion_request(path, body);
    EXPECT_TRUE(r.ok()) << body;
    return r.ok() && r->lora ? r->lora->dump() : std::string("absent");
  };
  EXPECT_EQ(lora("/completion", R"({"prompt": "Hi", "lora": [{"id": 0, "scale": 0.5}]})"), R"([{"id":0,"scale":0.5}])");
  EXPECT_EQ(lora("/v1/chat/completions", R"({"messages": [], "lora": [{"id": 1, "scale": 1}]})"), R"([{"id":1,"scale":1}])");
  EXPECT_EQ(lora("/infill", R"({"lora": "x"})"), R"("x")");
  EXPECT_EQ(lora("/completion", R"({"prompt": "Hi", "lora": []})"), "[]");
  EXPECT_EQ(lora("/completion", R"({"prompt": "Hi"})"), "absent");
  EXPECT_EQ(lora("/completion", R"({"prompt": "Hi", "lora": null})"), "absent");
  EXPECT_TRUE(changes_adapters("POST", "/lora-adapters"));
  EXPECT_FALSE(changes_adapters("GET", "/lora-adapters"));
  EXPECT_FALSE(changes_adapters("POST", "/lora-adapters/x"));
}

// The completion routes whose id_slot reaches llama-server's task (3.22.1): the Anthropic route's
// conversion keeps only the fields it knows, so kvsnap cannot choose its slot (it runs alone).
TEST(ServeRequests, EveryCompletionRouteButAnthropicsTakesIdSlot) {
  for (const char* p : {"/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions",
                        "/infill", "/responses", "/v1/responses"})
    EXPECT_TRUE(route_takes_id_slot(p)) << p;
  EXPECT_FALSE(route_takes_id_slot("/v1/messages"));
}

TEST(ServeRequests, CompletionPromptTokens) {
  auto r = parse_completion_request("/v1/completions", R"({"prompt": [1, 15043, 2147483647, -2147483648]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt, Prompt::kTokens);
  EXPECT_EQ(r->tokens, (std::vector<int32_t>{1, 15043, INT32_MAX, INT32_MIN}));
  EXPECT_EQ(r->id_slot, -1);
}

TEST(ServeRequests, CompletionTokensOfWrongTypeOrRangeAreAnError) {
  for (const char* body : {R"({"prompt": [1, "a"]})", R"({"prompt": [1, [2]]})", R"({"prompt": [1, 2.5]})",
                           R"({"prompt": [1, 1e300]})", R"({"prompt": [1, null]})", R"({"prompt": [2147483648]})",
                           R"({"prompt": [-2147483649]})", R"({"prompt": [1, 18446744073709551615]})"}) {
    auto r = parse_completion_request("/completion", body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << body;
  }
}

TEST(ServeRequests, CompletionWithoutAPromptItLooksUp) {
  for (const char* body : {R"({"n_predict": 4})", R"({"prompt": 5})", R"({"prompt": null})", R"({"prompt": []})",
                           R"({"prompt": ["a", "b"]})", R"({"prompt": [[1, 2], [3]]})", R"({"prompt": [1.5, 2]})",
                           R"({"prompt": {"multimodal_data": []}})", R"([1, 2])", R"("prompt")", "null", "", "{",
                           "{\"prompt\": \"\xff\xfe\"}", "{\"prompt\": \"a\x80\"}"}) {
    auto r = parse_completion_request("/completion", body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.status().ToString();
    EXPECT_EQ(r->prompt, Prompt::kNone) << body;
  }
}

// A review's finding: llama-server reads "id_slot" with nlohmann's get<int> (json_value), so 1.0, true
// and 4294967297 all run in slot 1, where kvsnap read them as any slot: its gate let two such
// completions into slot 1 at once, the second before the first's save. Read as llama-server reads it.
TEST(ServeRequests, IdSlotIsReadAsLlamaServerReadsIt) {
  const std::pair<const char*, int> cases[] = {
      {R"({"prompt": "a", "id_slot": 1})", 1},
      {R"({"prompt": "a", "id_slot": 1.0})", 1},
      {R"({"prompt": "a", "id_slot": 1.7})", 1},
      {R"({"prompt": "a", "id_slot": -1.5})", -1},
      {R"({"prompt": "a", "id_slot": true})", 1},
      {R"({"prompt": "a", "id_slot": false})", 0},
      {R"({"prompt": "a", "id_slot": 4294967297})", 1},
      {R"({"prompt": "a", "id_slot": 18446744073709551615})", -1},
      {R"({"prompt": "a", "id_slot": -9223372036854775808})", 0},
      {R"({"prompt": "a", "id_slot": 1e300})", INT_MIN},
      {R"({"prompt": "a", "id_slot": -3})", -3},
      {R"({"prompt": "a", "id_slot": "1"})", -1},
      {R"({"prompt": "a", "id_slot": null})", -1},
      {R"({"prompt": "a", "id_slot": [1]})", -1},
      {R"({"prompt": "a"})", -1},
  };
  for (const auto& [body, want] : cases) {
    auto r = parse_completion_request("/completion", body);
    ASSERT_TRUE(r.ok()) << body;
    EXPECT_EQ(r->id_slot, want) << body;
  }
  // The slot it runs in (get_slot_by_id): any value but -1 wraps modulo the slot count.
  EXPECT_EQ(pinned_slot_of(-1, 2), -1);
  EXPECT_EQ(pinned_slot_of(1, 2), 1);
  EXPECT_EQ(pinned_slot_of(5, 2), 1);
  EXPECT_EQ(pinned_slot_of(-3, 2), 1);  // (2^64 - 3) % 2
  EXPECT_EQ(pinned_slot_of(-3, 3), int((UINT64_MAX - 2) % 3));
  EXPECT_EQ(pinned_slot_of(INT_MIN, 4), 0);
}

// The child renders /apply-template from the whole body, as the chat completion itself
// (llama-server 3.22.1's oaicompat_chat_params_parse): reasoning_effort, add_generation_prompt and
// the others change the prompt, so the body goes to it as it came.
TEST(ServeRequests, ChatSendsTheWholeBodyToTheTemplate) {
  const std::string body =
      R"({"chat_template_kwargs": {"x": 1}, "model": "m", "messages": [{"role": "user", "content": "hi"}],
          "tools": [], "reasoning_effort": "high", "add_generation_prompt": false, "stream": true})";
  auto r = parse_completion_request("/v1/chat/completions", body);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompt, Prompt::kChat);
  EXPECT_EQ(r->template_body, body);
  // Messages of any type go to the child's template (it answers for them), as they came.
  r = parse_completion_request("/chat/completions", R"({"messages": 7})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt, Prompt::kChat);
  EXPECT_EQ(r->template_body, R"({"messages": 7})");
  r = parse_completion_request("/chat/completions", R"({"prompt": "a"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt, Prompt::kNone);  // a chat without messages is not looked up
}

// Only the completion routes' "prompt" is a whole prompt: /infill's is the middle of a fill-in
// (llama-server 3.22.1 builds the prompt from input_prefix, input_suffix and it), so it is not
// looked up; the Responses routes are completions too (saved), without a lookup.
TEST(ServeRequests, OnlyTheCompletionRoutesPromptIsLookedUp) {
  const std::string body = R"({"input_prefix": "def f", "input_suffix": "return 1", "prompt": "x"})";
  for (const char* path : {"/infill", "/v1/messages", "/responses", "/v1/responses"}) {
    auto r = parse_completion_request(path, body);
    ASSERT_TRUE(r.ok()) << path;
    EXPECT_EQ(r->prompt, Prompt::kNone) << path;
  }
  for (const char* path : {"/completion", "/completions", "/v1/completions"}) {
    auto r = parse_completion_request(path, body);
    ASSERT_TRUE(r.ok()) << path;
    EXPECT_EQ(r->prompt, Prompt::kText) << path;
  }
  for (const char* path : {"/responses", "/v1/responses", "/infill", "/v1/messages", "/completion"})
    EXPECT_TRUE(is_completion_route(path)) << path;
  EXPECT_FALSE(is_completion_route("/v1/responses/input_tokens"));
}

// A long stream keeps its events whole: the last event of a /completion stream holds the whole
// prompt's text (llama-server 3.22.1), so for a prompt over the kept tail a cut at a byte lost its
// start, where id_slot and timings are, and the save and the reuse proof went without them.
TEST(ServeRequests, AStreamTailKeepsItsLastEventWhole) {
  std::string body;
  for (int i = 0; i < 2000; ++i) body += "data: {\"content\":\"tok" + std::to_string(i) + "\",\"stop\":false}\n\n";
  const std::string prompt(300000, 'p');
  body += "data: {\"id_slot\":1,\"stop\":true,\"timings\":{\"prompt_n\":7},\"prompt\":\"" + prompt + "\"}\n\n";
  std::string kept = body;
  trim_stream_tail(kept, 64 << 10);
  EXPECT_LT(kept.size(), body.size());
  EXPECT_EQ(kept.rfind("data: ", 0), 0u) << "cut inside an event";
  EXPECT_EQ(slot_of_answer_body(true, kept), 1);
  auto n = prompt_n_of_answer(true, kept);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->value_or(0), 7u);
  // a body of small events: cut at an event, at least `keep` bytes kept, at most 2 x keep
  std::string small;
  for (int i = 0; i < 10000; ++i) small += "data: {\"n\":" + std::to_string(i) + "}\n\n";
  trim_stream_tail(small, 4096);
  EXPECT_EQ(small.rfind("data: ", 0), 0u);
  EXPECT_GE(small.size(), 4096u);
  EXPECT_LE(small.size(), 4096u + 64);
  std::string short_body = "data: {\"id_slot\":0}\n\n";
  trim_stream_tail(short_body, 4096);
  EXPECT_EQ(short_body, "data: {\"id_slot\":0}\n\n");
}

TEST(ServeRequests, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = "{\"prompt\": \"a\", \"x\": " + nested(100000) + "}";
  auto r = parse_completion_request("/completion", deep);
  EXPECT_FALSE(r.ok());
  r = parse_completion_request("/v1/chat/completions", "{\"messages\": " + nested(600) + "}");
  EXPECT_FALSE(r.ok());
  // Brackets inside strings are not nesting.
  r = parse_completion_request("/completion", "{\"prompt\": \"" + std::string(5000, '[') + "\"}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt, Prompt::kText);
  r = parse_completion_request("/completion", "{\"prompt\": \"a\", \"x\": " + nested(500) + "}");
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(body_with_id_slot(deep, 0));
  EXPECT_FALSE(parse_requantize_body("{\"ctk\": " + nested(100000) + "}", "f16", "f16").ok());
  EXPECT_FALSE(parse_apply_template_reply(nested(100000)).ok());
  EXPECT_EQ(slot_of_answer_body(false, nested(100000, "{\"id_slot\": 1}")), -1);
}

// "n": 2 runs the second completion in another free slot (llama-server's get_free_slots), one the slot
// gate may have given another client: serve runs such a request alone. n_cmpl is read first, "n" is
// its alias; both as llama-server's field_num<int32_t> reads them.
TEST(ServeRequests, CompletionsAskedAreReadAsLlamaServerReadsThem) {
  const std::pair<const char*, int> cases[] = {
      {R"({"prompt": "a"})", 1},
      {R"({"prompt": "a", "n": 2})", 2},
      {R"({"prompt": "a", "n_cmpl": 3})", 3},
      {R"({"prompt": "a", "n_cmpl": 1, "n": 2})", 1},
      {R"({"prompt": "a", "n_cmpl": null, "n": 2})", 2},
      {R"({"prompt": "a", "n": 2.9})", 2},
      {R"({"prompt": "a", "n": true})", 1},
      {R"({"prompt": "a", "n": 4294967297})", 1},
      {R"({"prompt": "a", "n": "2"})", 0},
      {R"({"prompt": "a", "n": [2]})", 0},
      {R"({"messages": [], "n": 2})", 2},
  };
  for (const auto& [body, want] : cases) {
    auto r = parse_completion_request(std::string(body).find("messages") != std::string::npos ? "/v1/chat/completions"
                                                                                              : "/completion",
                                      body);
    ASSERT_TRUE(r.ok()) << body;
    EXPECT_EQ(r->n_cmpl, want) << body;
  }
}

TEST(ServeRequests, BodyWithIdSlotKeepsTheRestInOrder) {
  EXPECT_EQ(body_with_id_slot(R"({"prompt":"a","id_slot":-1,"n_predict":2})", 3),
            R"({"prompt":"a","id_slot":3,"n_predict":2})");
  EXPECT_EQ(body_with_id_slot(R"({"z":1,"a":2})", 0), R"({"z":1,"a":2,"id_slot":0})");
  EXPECT_FALSE(body_with_id_slot("[1]", 0));
  EXPECT_FALSE(body_with_id_slot("{", 0));
}

// A forwarded request is read once (slot gate, pin, prefix lookup read the same parse), and a pin
// written into its body is in that reading too.
TEST(ServeRequests, AForwardIsReadOnceAndItsPinKeptInStep) {
  Forward f;
  f.path = "/completion";
  f.body = R"({"prompt":"a","n_predict":2})";
  const Result<CompletionRequest>& r = completion_request(f);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->object);
  EXPECT_EQ(r->id_slot, -1);
  EXPECT_EQ(&completion_request(f), &r) << "parsed once";
  EXPECT_TRUE(write_id_slot(f, 2));
  EXPECT_EQ(f.body, R"({"prompt":"a","n_predict":2,"id_slot":2})");
  EXPECT_TRUE(f.body_changed);
  EXPECT_EQ(completion_request(f)->id_slot, 2);
  EXPECT_EQ(completion_request(f)->text, "a");

  Forward list;
  list.path = "/completion";
  list.body = "[1]";
  EXPECT_FALSE(completion_request(list)->object);
  EXPECT_FALSE(write_id_slot(list, 0));
  EXPECT_EQ(list.body, "[1]");
  EXPECT_FALSE(list.body_changed);

  for (const char* path : {"/v1/audio/transcriptions", "/audio/transcriptions"}) {
    EXPECT_TRUE(is_completion_route(path)) << path;
    EXPECT_TRUE(is_form_data_route(path)) << path;
  }
  EXPECT_FALSE(is_form_data_route("/v1/chat/completions"));
  EXPECT_FALSE(is_form_data_route("/v1/audio/speech"));
}

TEST(ServeRequests, ApplyTemplateReply) {
  auto r = parse_apply_template_reply(R"({"prompt": "<|user|>hi"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "<|user|>hi");
  for (const char* body : {R"({"prompt": 1})", R"({})", R"([])", "", "nope", R"({"prompt": null})"}) {
    auto bad = parse_apply_template_reply(body);
    ASSERT_FALSE(bad.ok()) << body;
    EXPECT_EQ(bad.status().code(), Code::kMismatch);
  }
}

TEST(ServeRequests, SlotOfAnswer) {
  EXPECT_EQ(slot_of_answer_body(false, R"({"content": "x", "id_slot": 2})"), 2);
  EXPECT_EQ(slot_of_answer_body(false, R"({"slot_id": 3})"), 3);
  EXPECT_EQ(slot_of_answer_body(false, R"({"id_slot": -1, "slot_id": 3})"), -1);  // the first one named counts
  EXPECT_EQ(slot_of_answer_body(false, R"({"id_slot": "2", "slot_id": 3})"), 3);  // a string names none
  EXPECT_EQ(slot_of_answer_body(false, R"({"id_slot": 4294967298})"), -1);
  EXPECT_EQ(slot_of_answer_body(false, R"({"id_slot": 2.0})"), -1);
  EXPECT_EQ(slot_of_answer_body(false, "not json"), -1);
  EXPECT_EQ(slot_of_answer_body(true, "data: {\"id_slot\": 1}\n\ndata: {\"content\": \"a\"}\n\n"
                                      "data: {\"id_slot\": 4}\n\ndata: [DONE]\n\n"),
            4);
  EXPECT_EQ(slot_of_answer_body(true, "data: {\"id_slot\": 1"), -1);  // cut off
}

TEST(ServeRequests, PromptNOfAnswer) {
  auto r = prompt_n_of_answer(false, R"({"timings": {"prompt_n": 7, "predicted_n": 2}})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::optional<uint64_t>(7));
  r = prompt_n_of_answer(true,
                         "data: {\"content\":\"a\"}\n\ndata: {\"timings\":{\"prompt_n\":1}}\n\n"
                         "data: {\"timings\":{\"prompt_n\":9}}\n\ndata: [DONE]\n\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::optional<uint64_t>(9));
  for (const char* none : {R"({"content": "a"})", R"({"timings": 5})", R"({"timings": [1]})", R"({"timings": {}})",
                           "", "data: x", R"([{"timings": {"prompt_n": 1}}])"}) {
    r = prompt_n_of_answer(false, none);
    ASSERT_TRUE(r.ok()) << none;
    EXPECT_EQ(*r, std::nullopt) << none;
  }
  for (const char* bad : {R"({"timings": {"prompt_n": -1}})", R"({"timings": {"prompt_n": "7"}})",
                          R"({"timings": {"prompt_n": 1e300}})", R"({"timings": {"prompt_n": true}})",
                          R"({"timings": {"prompt_n": null}})", R"({"timings": {"prompt_n": 2.5}})"}) {
    r = prompt_n_of_answer(false, bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kMismatch);
  }
  r = prompt_n_of_answer(false, R"({"timings": {"prompt_n": 18446744073709551615}})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, std::optional<uint64_t>(UINT64_MAX));
}

TEST(ServeRequests, RequantizeBody) {
  auto a = parse_requantize_body(R"({"ctk": "q8_0", "flash_attn": true, "ctx_size": 4096, "dry_run": true})", "f16",
                                 "q4_0");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->ctk, "q8_0");
  EXPECT_EQ(a->ctv, "q4_0");  // kept
  EXPECT_EQ(a->flash_attn, "on");
  EXPECT_EQ(a->ctx_size, 4096);
  EXPECT_TRUE(a->dry_run);
  a = parse_requantize_body(R"({"ctv": "q8_0", "flash_attn": "auto"})", "f16", "f16");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ctk, "f16");
  EXPECT_EQ(a->flash_attn, "auto");
  EXPECT_EQ(a->ctx_size, 0);
  EXPECT_FALSE(a->dry_run);
}

TEST(ServeRequests, RequantizeBodyRefusals) {
  struct Case {
    const char* body;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"", "must be a JSON object"},
           {"[]", "must be a JSON object"},
           {"{\"ctk\": \"\xff\"}", "must be a JSON object"},  // not UTF-8: not JSON
           {R"({})", "name ctk and/or ctv"},
           {R"({"dry_run": true})", "name ctk and/or ctv"},
           {R"({"ctk": "q9_9"})", "ctk \"q9_9\" is not a cache type"},
           {R"({"ctk": 8})", "ctk 8 is not a cache type"},
           {R"({"ctv": ["q8_0"]})", "ctv [\"q8_0\"] is not a cache type"},
           {R"({"ctk": "q8_0", "flash_attn": "yes"})", "flash_attn \"yes\" must be"},
           {R"({"ctk": "q8_0", "flash_attn": 1})", "flash_attn 1 must be"},
           {R"({"ctk": "q8_0", "ctx_size": 0})", "ctx_size 0 must be"},
           {R"({"ctk": "q8_0", "ctx_size": -5})", "ctx_size -5 must be"},
           {R"({"ctk": "q8_0", "ctx_size": 16777217})", "ctx_size 16777217 must be"},
           {R"({"ctk": "q8_0", "ctx_size": 18446744073709551615})", "ctx_size 18446744073709551615 must be"},
           {R"({"ctk": "q8_0", "ctx_size": 1e300})", "must be a positive whole number"},
           {R"({"ctk": "q8_0", "ctx_size": 4096.0})", "must be a positive whole number"},
           {R"({"ctk": "q8_0", "dry_run": "yes"})", "dry_run \"yes\" must be true or false"},
           {R"({"ctk": "q8_0", "model": "x"})", "unknown key \"model\""},
       }) {
    auto a = parse_requantize_body(c.body, "f16", "f16");
    ASSERT_FALSE(a.ok()) << c.body;
    EXPECT_EQ(a.status().code(), Code::kInvalidArgument) << c.body;
    EXPECT_NE(a.status().message().find(c.says), std::string::npos) << c.body << ": " << a.status().message();
  }
}

}  // namespace
}  // namespace kvsnap
