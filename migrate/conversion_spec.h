// What a user asks a conversion for, in the words of llama.cpp's flags
// (-ctk q8_0, -fa off, ...), turned into a ConvertRequest checked against the
// source state and the model. One place for these rules, shared by
// `kvsnap convert`, `kvsnap restore --ctk ...`, server restores and the C API.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "format/llama_state.h"
#include "format/snapshot.h"
#include "migrate/convert_state.h"
#include "migrate/model_info.h"
#include "migrate/source_rotation.h"

namespace kvsnap {

struct ConversionSpec {
  std::string ctk, ctv;          // type names; empty: keep
  std::string flash_attn;        // "on" | "off" | "": keep the V layout
  std::string rotation;          // "auto" | "on" | "off" | "" (both ends)
  std::string src_rotation;      // per end, overriding `rotation`
  std::string dst_rotation;
  std::string format;            // target_format_names(); empty: current (or --target-build's)
  std::string source_build;      // the llama.cpp that wrote the input: "b8121", "v0.5.0"
  std::string server_build;      // what llama-server reported for the input (/props build_info)
  std::string target_build;      // the llama.cpp that will load the output: picks format, rotation, extras
  int head_dim_k = 0;            // without a model: the head dims for the rotation
  int head_dim_v = 0;
  // Without a model and head dims: the rotation geometry recorded elsewhere
  // (a snapshot's model facts).
  std::optional<RotationGeometry> geometry;
  // Without a model: its cell extra in v0.5.0 files (SnapshotModelInfo::cell_ext_bytes), which an
  // old-format input's upgrade to that format needs.
  std::optional<uint32_t> cell_ext_bytes;
  int kv_streams = 0;            // the output's KV stream count (ConvertRequest::kv_streams); 0: keep
  int threads = 0;               // 0: every core
  bool report = false;
  std::string requant;           // "auto" | "quick" | "search" | "exact" | "reference" | "": auto (convert_state.h)
};

// The words of `spec` checked alone, before any file is read (kInvalidArgument naming the flag):
// the types, on/off and auto/on/off words, the format name, the requant mode, the thread count
// and that the builds named parse. make_request checks them too; a command that converts many
// files (migrate) calls this first, so a typo fails once and before anything is touched.
Status check_spec_words(const ConversionSpec& spec);

// kInvalidArgument for unknown words, kNotSupported for conversions kvsnap
// refuses (an old M-RoPE file upgraded), kMismatch when a named build cannot
// have written the input. Whether the input is stored rotated is decided as
// migrate/source_rotation.h says, from the data too when `file` is given; the
// decision goes to `decision` when given. Notes for the user (not errors) are
// appended to `warnings` when given.
Result<ConvertRequest> make_request(const ConversionSpec& spec, const StateFile& src, const ModelInfo* model,
                                    const std::string& src_name, std::string* warnings = nullptr,
                                    const ReadableFile* file = nullptr, SourceRotation* decision = nullptr);

// What a snapshot recorded about the llama.cpp that wrote its original, as
// the claims of a conversion: fills source_build (declared), server_build
// (reported by llama-server) and src_rotation where `spec` names none.
void apply_writer_claims(const SourceClaims& writer, ConversionSpec& spec);

// Checks claims about who wrote `src` before they are recorded: a build that
// parses and could have written the file (kMismatch naming it otherwise), a
// rotation word that is on or off.
Status check_writer_claims(const SourceClaims& writer, const StateFile& src, const ModelInfo* model,
                           const std::string& src_name);

// The rotation geometry llama.cpp's rule sees for the model's KV sections.
RotationGeometry model_rotation_geometry(const ModelInfo& model);

// "f16", "q8_0", ...: the type id, or kInvalidArgument naming `flag` and the choices.
Result<int32_t> parse_kv_type(const std::string& name, const std::string& flag);

}  // namespace kvsnap
