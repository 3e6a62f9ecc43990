// A model, as far as KV states care: what its GGUF says about a state file's
// layout, its rotation blocks, and whether a state file belongs to it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "base/io.h"
#include "base/json.h"
#include "format/llama_state.h"
#include "format/model_profile.h"

namespace kvsnap {

struct ModelInfo {
  std::string path;
  MemoryShape shape;
  nlohmann::ordered_json summary;  // arch, n_layer, head dims, fingerprint...
  std::string arch;
  // Per KV section and layer: head dims (0 when unknown).
  std::vector<std::vector<uint32_t>> head_dim_k, head_dim_v;
  uint32_t layer0_head_dim_k = 0, layer0_head_dim_v = 0;  // llama.cpp's rotation test uses layer 0's
  uint32_t n_vocab = 0;
  ModelProfile profile;  // everything read from the GGUF header

  nlohmann::ordered_json to_json() const { return summary; }
  // llama.cpp's Hadamard block for this layer's K or V, or nullopt when it
  // does not rotate (head dim not a multiple of 64, or mixed head dims for K).
  std::optional<uint32_t> rotation_block(bool is_v, size_t section, size_t layer) const;
  // The head dim llama.cpp's rotation rule sees for a KV section: the
  // section's shared head dim when layer 0's is a multiple of 64, else 0.
  uint32_t rotation_head_dim(bool is_v, size_t section) const;
  // kMismatch when the state file cannot belong to this model.
  Status check_state(const StateFile& f, const std::string& file_name) const;
};

Result<ModelInfo> load_model_info(Io& io, const std::string& path);

// Whether parse_for_model also asks the data if the model's K head dim is the file's (the RoPE
// witness, migrate/rope_head_dim.h, some milliseconds of one core): kNow, or kByCaller for a
// caller that runs check_model_head_dim itself (Store::save, beside its reading of the file).
enum class HeadDimCheck { kNow, kByCaller };

// Parses a state file with the model's layout when a model is given. When
// that fails but the file reads fine on its own, the file does not belong to
// the model: kMismatch, saying both. With a model, kMismatch also when layer 0's
// RoPE shows another K head dim than the model's (unless `check` is kByCaller).
Result<StateFile> parse_for_model(const ReadableFile& file, ParseOptions opts, const ModelInfo* model,
                                  HeadDimCheck check = HeadDimCheck::kNow);

// The RoPE witness alone: OK, or kMismatch naming `file` when the K cache of `state` (parsed from
// it with the model's layout) has another head dim than `model`'s. Thread-safe for one file
// read by others meanwhile (it reads with read_at only).
Status check_model_head_dim(const ReadableFile& file, const StateFile& state, const ModelInfo& model);

}  // namespace kvsnap
