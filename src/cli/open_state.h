// A state file opened the way every command takes it: FILE [--model GGUF]
// [--input-format raw-seq|raw-context].
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "base/io.h"
#include "format/llama_state.h"
#include "migrate/model_info.h"

namespace kvsnap::cli {

// A state file opened the way every command takes it: FILE [--model GGUF]
// [--input-format raw-seq|raw-context].
struct OpenedState {
  std::optional<ModelInfo> model;
  std::unique_ptr<ReadableFile> file;
  StateFile state;
  const ModelInfo* model_ptr() const { return model ? &*model : nullptr; }
};
Result<OpenedState> open_state(Io& io, const std::string& path, const std::string& model_path,
                               const std::string& input_format);


}  // namespace kvsnap::cli
