// --dynamic-cache LADDER --cache-budget BYTES: the rungs of cache types kvsnap
// serve steps down through as the context fills, and the context size that
// keeps the K/V cache inside the same budget at each rung.
//
// Promises:
//   - LADDER is comma-separated rungs, each a type for K and V ("q8_0") or a
//     K/V pair ("q8_0/q4_0"), every type one llama-server takes; fewer than
//     two rungs, an unknown type or a budget that does not hold 256 tokens at
//     the first rung is kInvalidArgument naming it;
//   - a rung's bytes per token come from the model's GGUF (every KV layer's
//     K and V row widths) and the type table's row sizes (format/ggml_types.h
//     row_bytes); its context is budget / bytes per token, rounded down to a
//     multiple of 256 (llama.cpp pads the cache's size to 256 cells);
//   - every rung holds fewer bytes a token than the one before (a step down
//     that grows the cache would shrink -c under the slots it restores), and
//     with `flash_attn` "off" no rung has a quantized V (llama-server refuses
//     it): kInvalidArgument, so that no step is bound to fail;
//   - a step down is due when a slot holds at least 90% of its context
//     (kStepAt) and a lower rung is left.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "migrate/model_info.h"

namespace kvsnap {

struct Rung {
  std::string ctk, ctv;
  uint64_t bytes_per_token = 0;  // the K/V rows of one cell, every layer
  int ctx_size = 0;              // what fits the budget
};

struct Ladder {
  std::vector<Rung> rungs;
  uint64_t budget = 0;
};

inline constexpr double kStepAt = 0.9;

// `flash_attn`: the child's -fa (on, off, auto).
Result<Ladder> make_ladder(const std::string& spec, uint64_t budget, const ModelInfo& model,
                           const std::string& flash_attn);
// "1048576", "512K", "64M", "2G" (powers of 1024); kInvalidArgument naming --cache-budget otherwise.
Result<uint64_t> parse_budget(const std::string& s);

}  // namespace kvsnap
