// Is the input stored Hadamard-rotated? The file does not say (ggsq v2 / ggsn
// v9 come from builds that rotate quantized K/V and from builds that do not),
// so kvsnap decides from evidence, strongest first, and reports it:
//
//   1. a declaration: --src-rotation on|off, or --source-build bNNNN|vX.Y.Z
//      (checked against the file: a build that cannot have written it is an error);
//   2. the build llama-server reported (/props build_info) when the file came from it;
//   3. the file's layout, where it proves the era (format/llama_era.h);
//   4. the data: layer 0's K, whose RoPE fits the model's head dim either as stored or
//      un-rotated, for any model's weights when the prompt repeats tokens
//      (migrate/rope_head_dim.h); then quantized caches of trained models are measurably
//      flatter per channel when stored rotated (migrate/rotation_detect.h). When the two
//      disagree the conversion is refused.
//
// When none of them decides and a conversion depends on it, the conversion is
// refused (migrate/convert_state.h); a guess is never made. The data is also
// checked against 2 and 3: a build that rotates by default may have run with
// LLAMA_ATTN_ROT_DISABLE=1, and a clear contradiction stops with an error.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/json.h"
#include "base/status.h"
#include "format/llama_era.h"
#include "format/llama_state.h"
#include "migrate/convert_state.h"
#include "migrate/rotation_detect.h"

namespace kvsnap {

struct RotationClaims {
  std::string src_rotation;   // --src-rotation: "on" | "off" | "auto" | ""
  std::string source_build;   // --source-build
  std::string server_build;   // what llama-server reported, when the file came from it
};

struct SourceRotation {
  bool matters = false;        // the input holds quantized K/V that llama.cpp's rule rotates (or may)
  Tri rotated = Tri::kUnknown; // stored rotated where llama.cpp's rule applies
  // "not-needed" | "declared" | "source-build" | "server-build" | "file-format" | "rope" | "data" | "undecided"
  std::string decided_by = "undecided";
  std::vector<std::string> evidence;  // every fact considered, in words
  double confidence = 0;       // 1 for declarations and the layout; rope: the fit's agreement; data: the detector's
  std::optional<RotationEvidence> data;
};

// `file`: the input's bytes (nullptr: the data is not examined). `geometry`:
// the rotation geometry from the model (empty without one; the data cannot be
// examined then). `model_has_cell_ext`: the model is M-RoPE, when known.
// kMismatch when a declared or reported build cannot have written the file;
// kAmbiguous when the data clearly contradicts the build's default rotation.
Result<SourceRotation> decide_source_rotation(const ReadableFile* file, const StateFile& f,
                                              const RotationGeometry& geometry, std::optional<bool> model_has_cell_ext,
                                              const RotationClaims& claims);

// Puts a decision into a request: src_rotates when decided.
void apply_source_rotation(const SourceRotation& d, ConvertRequest& req);

// For `info --json` and `convert --json` (docs/info-json.md, "source_rotation"):
// {"needed", "rotated": true|false|null, "decided_by", "confidence", "evidence": [...], "data": {...}|null}.
nlohmann::ordered_json source_rotation_json(const SourceRotation& d);
// Lines for the human reports: "rotation: stored rotated (decided by the file format)" and the evidence.
std::string source_rotation_text(const SourceRotation& d);

}  // namespace kvsnap
