// The LoRA scales of kvsnap serve's child, as it and a request state them, read as llama-server 3.22.1
// reads them (server-common.cpp parse_lora_request, server-context.cpp construct_lora_list): pure
// functions, no I/O. What serve does with them: serve/adapters.h. Every parser here takes hostile
// JSON: no throw, no crash (tests/fuzz/fuzz_serve_requests.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace kvsnap {

// The adapters a child loaded, as its GET /lora-adapters answers.
struct ChildAdapters {
  bool known = true;          // false: it loads adapters kvsnap could not read the scales of
  bool restarting = false;    // (with !known) the child is restarting: they are read again once it is up
  bool activated = false;     // one is an activated LoRA (alora_invocation_tokens): its cache rules differ
  std::vector<float> loaded;  // the scale of each adapter, by id; empty: none loaded
  std::string why_unknown;    // when !known: what went wrong, for the log and the refusal
  // The child runs embedding tasks (--embeddings), which serve's slot gate does not hold: one can
  // take a slot made under a request's own scales, and its task then hides them in /slots.
  bool ungated_tasks = false;
};

// GET /lora-adapters' answer: an array of {"id": i, "scale": s, ...} with id i at index i. Anything
// else is kMismatch naming what is wrong.
Result<ChildAdapters> parse_lora_adapters_reply(std::string_view body);

// The scales a request's "lora" value runs with (an array; anything else: `loaded`), as
// llama-server 3.22.1 reads it: each entry's id and scale as json_value reads them (an id that is
// not a number: -1; a scale that is not a number: 0; a boolean: 0 or 1), the last entry of an id
// wins, ids outside the loaded ones are ignored, every loaded adapter not named runs at 0. An empty
// array runs with `loaded`.
std::vector<float> scales_as_read(const nlohmann::json& lora, const std::vector<float>& loaded);
std::vector<float> scales_as_read(const nlohmann::ordered_json& lora, const std::vector<float>& loaded);

// The scales a slot's cache was made under: those of its last task's request (a /slots entry's
// params.lora), `loaded` when it names none.
std::vector<float> slot_scales(const nlohmann::json& slot, const std::vector<float>& loaded);

// Why serve cannot keep a request's own scales apart from the loaded ones' ("" when it can): the
// child's adapters are unknown, one is activated, or its RAM prompt cache (`--cache-ram`, on unless
// `ram_cache_off`) can hand a cache made under one request's scales to a request of others, or it
// runs tasks outside the slot gate (ChildAdapters::ungated_tasks); or a scale is no finite float
// (the child's /slots would show it as null).
std::string scales_refusal(const ChildAdapters& a, bool ram_cache_off, const std::vector<float>& scales);

}  // namespace kvsnap
