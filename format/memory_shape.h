// What a model profile (GGUF) says about the layout of a state file's memory
// section, in the form the state reader takes (format/llama_state.h).
#pragma once

#include "format/llama_state.h"
#include "format/model_profile.h"

namespace kvsnap {

// kNotSupported for memory kinds kvsnap does not model (ModelProfile::memory == kSpecial).
Result<MemoryShape> memory_shape(const ModelProfile& p, const std::string& source_name);

}  // namespace kvsnap
