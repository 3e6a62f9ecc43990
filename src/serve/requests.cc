#include "serve/requests.h"

#include <algorithm>
#include <climits>
#include <string>

#include "base/json_access.h"
#include "format/ggml_types.h"
#include "server/llama_server.h"

namespace kvsnap {

namespace {

using ojson = nlohmann::ordered_json;

// True when `text`, read as JSON, opens more than `max` arrays/objects at once (brackets inside
// strings do not count). Checked before parsing: nlohmann parses any depth, but copying and
// writing a value recurse once per level.
bool nested_deeper_than(std::string_view text, size_t max) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

// `v` when it is an integer in min..max (the token ids of a long prompt go through here: no
// JsonRef, whose messages cost an allocation per value).
template <class Json>
std::optional<int64_t> integer_in(const Json& v, int64_t min, int64_t max) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (max < 0 || u > uint64_t(max) || (min > 0 && u < uint64_t(min))) return std::nullopt;
    return int64_t(u);
  }
  if (!v.is_number_integer()) return std::nullopt;
  const int64_t i = v.template get<int64_t>();
  return i >= min && i <= max ? std::optional<int64_t>(i) : std::nullopt;
}

// The slot an answer's JSON names: its first integer member of id_slot, slot_id (-1 when that is
// out of int range), else -1.
int slot_in(const nlohmann::json& j) {
  if (!j.is_object()) return -1;
  for (const char* k : {"id_slot", "slot_id"})
    if (auto it = j.find(k); it != j.end() && it->is_number_integer())
      return int(integer_in(*it, INT_MIN, INT_MAX).value_or(-1));
  return -1;
}

}  // namespace

bool route_takes_id_slot(std::string_view path) { return path != "/v1/messages"; }

bool is_chat_route(std::string_view path) { return path == "/v1/chat/completions" || path == "/chat/completions"; }

template <class Json>
Json parse_bounded(std::string_view text) {
  if (nested_deeper_than(text, kMaxServeJsonDepth)) return Json(nlohmann::detail::value_t::discarded);
  return Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}
template nlohmann::json parse_bounded<nlohmann::json>(std::string_view);
template ojson parse_bounded<ojson>(std::string_view);

template <class Json>
int int_as_read(const Json& v, int other) {
  if (v.is_boolean()) return v.template get<bool>() ? 1 : 0;
  if (v.is_number_unsigned()) return int(uint32_t(v.template get<uint64_t>()));  // modular, as static_cast<int>
  if (v.is_number_integer()) return int(uint32_t(uint64_t(v.template get<int64_t>())));
  if (v.is_number_float()) {
    const double d = v.template get<double>();
    return d > double(INT_MIN) - 1.0 && d < double(INT_MAX) + 1.0 ? int(d) : INT_MIN;  // cvttsd2si's INT_MIN
  }
  return other;
}
template int int_as_read<nlohmann::json>(const nlohmann::json&, int);
template int int_as_read<ojson>(const ojson&, int);

int id_slot_as_read(const nlohmann::ordered_json& body) {
  auto it = body.find("id_slot");
  if (it == body.end()) return -1;
  return int_as_read(*it, -1);  // null, a string, an array, an object: json_value's default
}

int completions_as_read(const nlohmann::ordered_json& body) {
  for (const char* key : {"n_cmpl", "n"}) {
    auto it = body.find(key);
    if (it != body.end() && !it->is_null()) return int_as_read(*it, 0);  // get<int32_t> throws: refused
  }
  return 1;
}

int pinned_slot_of(int id_slot, size_t n_slots) {
  if (id_slot == -1 || n_slots == 0) return -1;
  return int(uint64_t(int64_t(id_slot)) % uint64_t(n_slots));
}

bool is_slot_action(std::string_view method, std::string_view path) {
  return method != "GET" && method != "HEAD" && (path == "/slots" || path.rfind("/slots/", 0) == 0);
}

bool changes_adapters(std::string_view method, std::string_view path) {
  return method == "POST" && path == "/lora-adapters";
}

Result<CompletionRequest> parse_completion_request(std::string_view path, std::string_view body) {
  CompletionRequest out;
  if (nested_deeper_than(body, kMaxServeJsonDepth))
    return Status::InvalidArgument("the request's JSON is nested deeper than " + std::to_string(kMaxServeJsonDepth) +
                                   " levels");
  const auto j = ojson::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;  // the child answers malformed JSON itself
  out.object = true;
  out.id_slot = id_slot_as_read(j);
  out.n_cmpl = completions_as_read(j);
  if (auto lora = j.find("lora"); lora != j.end() && !lora->is_null()) out.lora = *lora;
  if (is_chat_route(path)) {
    if (j.find("messages") == j.end()) return out;
    // The whole request: llama-server renders /apply-template from the body as it does the chat
    // completion (oaicompat_chat_params_parse), and more than messages, tools and the template's
    // kwargs change the prompt (reasoning_effort, add_generation_prompt, continue_final_message,
    // tool_choice, ...). A prompt rendered from part of it is not the slot's, and the save of that
    // conversation found no owner.
    out.prompt = CompletionRequest::Prompt::kChat;
    out.template_body = std::string(body);
    return out;
  }
  // "prompt" is the whole prompt on these routes only: /infill's is the middle of a fill-in between
  // input_prefix and input_suffix, and /v1/messages and /responses have none.
  if (path != "/completion" && path != "/completions" && path != "/v1/completions") return out;
  auto it = j.find("prompt");
  if (it == j.end()) return out;
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    // Token ids; a list whose first element is one is taken only when all are.
    out.tokens.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
      const ojson& t = (*it)[i];
      auto v = integer_in(t, INT32_MIN, INT32_MAX);
      if (!v)
        return Status::InvalidArgument("prompt[" + std::to_string(i) +
                                       "]: a token id must be an integer in int32 range, got " +
                                       (t.is_number() ? json_text(t) : std::string(t.type_name())));
      out.tokens.push_back(int32_t(*v));
    }
    out.prompt = CompletionRequest::Prompt::kTokens;
    return out;
  }
  if (!it->is_string()) return out;  // several prompts, multimodal: not looked up
  out.text = it->get_ref<const std::string&>();
  out.prompt = CompletionRequest::Prompt::kText;
  return out;
}

std::optional<std::string> body_with_id_slot(std::string_view body, int slot) {
  auto j = parse_bounded<ojson>(body);
  if (!j.is_object()) return std::nullopt;
  j["id_slot"] = slot;
  return json_text(j);
}

Result<std::string> parse_apply_template_reply(std::string_view body) {
  const auto j = parse_bounded<ojson>(body);
  if (!j.is_object()) return Status::Mismatch("/apply-template answered without a prompt");
  auto it = j.find("prompt");
  if (it == j.end() || !it->is_string()) return Status::Mismatch("/apply-template answered without a prompt");
  return it->get<std::string>();
}

void for_each_answer_json(bool streamed, std::string_view body, const std::function<void(const nlohmann::json&)>& f) {
  auto one = [&f](std::string_view text) {
    auto j = parse_bounded<nlohmann::json>(text);
    if (!j.is_discarded()) f(j);
  };
  if (!streamed) return one(body);
  for (size_t p = 0; (p = body.find("data: ", p)) != std::string_view::npos;) {
    size_t e = body.find('\n', p);
    if (e == std::string_view::npos) e = body.size();
    one(body.substr(p + 6, e - p - 6));
    p = e;
  }
}

void trim_stream_tail(std::string& body, size_t keep) {
  if (body.size() <= 2 * keep) return;
  const size_t cut = body.size() - keep;
  // The start of the event that holds byte `cut`: its "data: " at the start of a line (a JSON event
  // escapes its newlines, so no event holds "\ndata: " inside it).
  const size_t line = body.rfind("\ndata: ", cut - 1);
  if (line != std::string::npos) body.erase(0, line + 1);
}

int slot_of_answer_body(bool streamed, std::string_view body) {
  int slot = -1;  // in a stream, the last event that names one
  for_each_answer_json(streamed, body, [&slot](const nlohmann::json& j) {
    if (int s = slot_in(j); s >= 0) slot = s;
  });
  return slot;
}

Result<std::optional<uint64_t>> prompt_n_of_answer(bool streamed, std::string_view body) {
  std::optional<uint64_t> prompt_n;
  Status bad;
  for_each_answer_json(streamed, body, [&](const nlohmann::json& j) {
    if (!bad.ok() || !j.is_object()) return;
    auto t = j.find("timings");
    if (t == j.end() || !t->is_object()) return;
    auto n = t->find("prompt_n");
    if (n == t->end()) return;
    auto v = JsonRef(*n, "the answer", Code::kMismatch).unsigned_integer();
    if (!v.ok()) bad = Status::Mismatch("timings.prompt_n: " + v.status().message());
    else prompt_n = *v;
  });
  if (!bad.ok()) return bad;
  return prompt_n;
}

Result<RequantizeAsk> parse_requantize_body(std::string_view body, const std::string& ctk, const std::string& ctv) {
  const auto j = parse_bounded<ojson>(body);
  if (!j.is_object())
    return Status::InvalidArgument(R"(the body must be a JSON object such as {"ctk":"q8_0","ctv":"q8_0"})");
  RequantizeAsk a;
  a.ctk = ctk;
  a.ctv = ctv;
  for (auto& [k, v] : j.items()) {
    if (k == "ctk" || k == "ctv") {
      if (!v.is_string() || !find_type(v.get<std::string>()))
        return Status::InvalidArgument(k + " " + json_text(v) + " is not a cache type llama-server takes (" +
                                       kv_cache_type_names() + ")");
      (k == "ctk" ? a.ctk : a.ctv) = v.get<std::string>();
    } else if (k == "flash_attn") {
      if (v.is_boolean()) a.flash_attn = v.get<bool>() ? "on" : "off";
      else if (v.is_string() && (v == "on" || v == "off" || v == "auto")) a.flash_attn = v.get<std::string>();
      else
        return Status::InvalidArgument("flash_attn " + json_text(v) +
                                       " must be \"on\", \"off\", \"auto\" or a boolean");
    } else if (k == "ctx_size") {
      // Not JsonRef::integer: it lets 0 through as 1..N (its unsigned branch checks only the maximum).
      auto n = integer_in(v, 1, 1 << 24);
      if (!n)
        return Status::InvalidArgument("ctx_size " + json_text(v) + " must be a positive whole number of tokens");
      a.ctx_size = int(*n);
    } else if (k == "dry_run") {
      if (!v.is_boolean()) return Status::InvalidArgument("dry_run " + json_text(v) + " must be true or false");
      a.dry_run = v.get<bool>();
    } else {
      return Status::InvalidArgument("unknown key \"" + k + "\" (ctk, ctv, flash_attn, ctx_size, dry_run)");
    }
  }
  if (!j.contains("ctk") && !j.contains("ctv")) return Status::InvalidArgument("name ctk and/or ctv");
  return a;
}

bool ends_a_stream(std::string_view before, std::string_view chunk) {
  // Each marker holds a quote outside a JSON string or starts a line, so no generated text (whose
  // quotes are escaped inside its string) can make one. A marker may be cut between two chunks:
  // each is also looked for across the seam, in its length less one on each side (so a match there
  // always has bytes on both sides: one wholly in `before` was seen with its own chunk).
  auto seam = [&](size_t keep_before, size_t keep_after) {
    return std::string(before.substr(before.size() - std::min(before.size(), keep_before))) +
           std::string(chunk.substr(0, std::min(chunk.size(), keep_after)));
  };
  for (std::string_view m : {std::string_view(R"("stop":true)"), std::string_view(R"("finish_reason":")"),
                             std::string_view(R"("type":"message_stop")"), std::string_view(R"("type":"response.completed")")})
    if (chunk.find(m) != std::string_view::npos || seam(m.size() - 1, m.size() - 1).find(m) != std::string::npos)
      return true;
  // data: [DONE] at a line's start: in the chunk, or across the seam with the byte before it.
  constexpr std::string_view kDone = "data: [DONE]";
  auto line_start = [](std::string_view text, size_t p, bool text_starts_stream) {
    return p == 0 ? text_starts_stream : text[p - 1] == '\n';
  };
  for (size_t p = chunk.find(kDone); p != std::string_view::npos; p = chunk.find(kDone, p + 1))
    if (p == 0 ? before.empty() || before.back() == '\n' : chunk[p - 1] == '\n') return true;
  const std::string w = seam(kDone.size(), kDone.size() - 1);
  const size_t t = std::min(before.size(), kDone.size());  // the bytes of `before` in w
  for (size_t p = w.find(kDone); p != std::string::npos; p = w.find(kDone, p + 1))
    if (p < t && p + kDone.size() > t && line_start(w, p, t == before.size())) return true;
  return false;
}

}  // namespace kvsnap
