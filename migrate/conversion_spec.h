// What a user asks a conversion for, in the words of llama.cpp's flags
// (-ctk q8_0, -fa off, ...), turned into a ConvertRequest checked against the
// source state and the model. One place for these rules, shared by
// `kvsnap convert`, `kvsnap restore --ctk ...`, server restores and the C API.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "format/llama_state.h"
#include "migrate/convert_state.h"
#include "migrate/model_info.h"

namespace kvsnap {

struct ConversionSpec {
  std::string ctk, ctv;          // type names; empty: keep
  std::string flash_attn;        // "on" | "off" | "": keep the V layout
  std::string rotation;          // "auto" | "on" | "off" | "" (both ends)
  std::string src_rotation;      // per end, overriding `rotation`
  std::string dst_rotation;
  std::string format;            // target_format_names(); empty: current
  int head_dim_k = 0;            // without a model: the head dims for the rotation
  int head_dim_v = 0;
  // Without a model and head dims: the rotation geometry recorded elsewhere
  // (a snapshot's model facts).
  std::optional<RotationGeometry> geometry;
  int threads = 0;               // 0: every core
  bool report = false;
};

// kInvalidArgument for unknown words, kNotSupported for conversions kvsnap
// refuses (an old M-RoPE file upgraded). Notes for the user (not errors) are
// appended to `warnings` when given.
Result<ConvertRequest> make_request(const ConversionSpec& spec, const StateFile& src, const ModelInfo* model,
                                    const std::string& src_name, std::string* warnings = nullptr);

// "f16", "q8_0", ...: the type id, or kInvalidArgument naming `flag` and the choices.
Result<int32_t> parse_kv_type(const std::string& name, const std::string& flag);

}  // namespace kvsnap
