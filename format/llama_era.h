// Which llama.cpp builds write a state file's layout, and what that says about
// the one thing the bytes do not show: whether quantized K/V are stored
// Hadamard-rotated. The one place for these rules (docs/llama-formats.md,
// "Eras"); `info`, `convert`, the store and the server flows all ask here.
//
// llama.cpp changed the body of its files several times without bumping the
// version (ggsq v2 / ggsn v9 cover eras C..G). What a parsed file proves:
//
//   era  builds           ggsq/ggsn  body                               rotation
//   A    b3166            1 / 6      ggsq v1 layout; ggsn v6 legacy     no
//                                     dump (types inferred, --model)
//   B    b3543            2 / 8      as C, + RNG text in sessions       no
//   C    b3889..b5869     2 / 9      no n_stream prefix, v9 outputs     no
//   D    b6122..b8121     2 / 9      n_stream, v9 outputs               no
//   E    b8179..b8189     2 / 9      v9 without outputs                 no
//   F    b8352..b8390     2 / 9      + 8-byte cell ext (M-RoPE models)  no
//   G    b8643..b10375    2 / 9      as F                               yes (quantized K/V)
//   H    b10645..v0.5.0   3 / 10     12-byte cell ext (M-RoPE)          yes
//
// Sequence files up to b4980 (B and early C) store cells without their seq id
// (n_seq_id 0); from b5640 each cell holds the saved sequence (n_seq_id 1), and
// each side refuses the other's.
//
// Between the last build seen without a change and the first seen with it
// (b3166|b3543, b3543|b3889, b4980|b5640, b5869|b6122, b8121|b8179,
// b8189|b8352, b8390|b8643, b10375|b10645) the property is unknown, and is
// reported as such, never guessed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "format/llama_state.h"

namespace kvsnap {

// A llama.cpp build as people name it: "b8121" (build number; "8121" and
// llama-server's "b8121-abc1234" too) or a release tag "v0.5.0".
struct LlamaBuild {
  uint32_t number = 0;                 // build number; 0 for a release tag
  int major = -1, minor = 0, patch = 0;  // release tag; major -1 for a build number
  std::string text;                    // as given
  bool is_tag() const { return major >= 0; }
};
Result<LlamaBuild> parse_llama_build(std::string_view s);

// Yes, no, or not known from the evidence.
enum class Tri { kNo, kYes, kUnknown };
const char* tri_name(Tri t);  // "no" | "yes" | "unknown"

// What a build writes. Unknown parts (a build inside a gap of the table
// above) are nullopt / Tri::kUnknown.
struct BuildLayout {
  std::string era;                          // "B".."H", "F|G" in a gap
  std::optional<uint32_t> ggsq_version;     // 2 or 3
  std::optional<uint32_t> ggsn_version;     // 8, 9 or 10
  Tri seq_cell_ids = Tri::kUnknown;         // ggsq cells hold the seq id (n_seq_id 1), else none (0)
  Tri stream_prefix = Tri::kUnknown;        // u32 n_stream before each KV section
  Tri session_outputs = Tri::kUnknown;      // v9 output ids, logits, embeddings
  std::optional<uint32_t> mrope_ext_bytes;  // per-cell extra for M-RoPE models: 0, 8, 12
  Tri rotates = Tri::kUnknown;              // quantized K/V stored rotated (unless LLAMA_ATTN_ROT_DISABLE=1)
};
// kNotSupported for builds before b3543 other than b3166 (era A: ggsq 1 / ggsn 6), whose layout
// kvsnap does not know.
Result<BuildLayout> layout_of_build(const LlamaBuild& b);
// ParseOptions::v9_outputs for a build named by the user ("b8121"): its session_outputs; nullopt
// when the text is no build or the build's layout is not known (the rotation's check of the same
// flag says why).
std::optional<bool> v9_outputs_of_build(const std::string& text);

// What a parsed file proves about the build that wrote it.
struct FileEra {
  std::string eras;       // "H", "D..G", "F|G", "B"
  std::string builds;     // "b6122..b10375"
  Tri rotates = Tri::kUnknown;
  std::string why;        // the structural fact that decided, in words
};
// `model_has_cell_ext`: whether the model is M-RoPE (its GGUF), when known.
FileEra era_of_file(const StateFile& f, std::optional<bool> model_has_cell_ext);

// kMismatch when build `b` cannot have written `f` (its version, n_stream
// prefix, v9 outputs or cell ext contradict what `b` writes); the message
// names the fact. OK when nothing contradicts it.
Status check_build_wrote(const StateFile& f, const LlamaBuild& b, std::optional<bool> model_has_cell_ext);

}  // namespace kvsnap
