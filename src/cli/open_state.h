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
// `src_types` ("q4_0/q8_0", --src-types): the K/V cache types of a ggsn v6 (b3166) session, which
// records none, for when its sizes fit several pairs; refused for any other file.
// `source_build` (--source-build): decides a version-9 body that reads both with and without
// outputs (ParseOptions::v9_outputs); the build is checked against the file later, as always.
// `check`: kByCaller for a save (Store::save runs the model's RoPE witness beside its reading).
Result<OpenedState> open_state(Io& io, const std::string& path, const std::string& model_path,
                               const std::string& input_format, const std::string& src_types = "",
                               const std::string& source_build = "", HeadDimCheck check = HeadDimCheck::kNow);

// kInvalidArgument when `out`, a file `command` is to write, exists and is not a regular file (or a
// symlink): a directory, a named pipe or a device, which writing by rename would replace with a
// regular file (or fail on, after the work). --force does not change that.
Status refuse_irregular_output(const std::string& out, const std::string& command);

}  // namespace kvsnap::cli
