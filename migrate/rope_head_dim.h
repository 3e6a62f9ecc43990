// Does a state file's K cache have the head dim the model (or --head-dim-k) says? Read from
// RoPE, because the file does not record it and a wrong one converts silently wrong: two models
// with the same KV row width (2 heads of 64, 1 of 128) read the same file, but llama.cpp's
// Hadamard block for K follows the head dim, so a rotation with the other model's block gives a
// cache that loads and answers wrongly. docs/rope-witness.md has the numbers and the limits.
//
// The witness: the model's layer 0. Its K for a cell is RoPE(pos) of a vector that depends only
// on the cell's token (nothing but the token's embedding comes before layer 0's attention). So
// two cells holding the same token differ by a rotation of each RoPE channel pair by the same
// angle (p2 - p1) * theta_i, where i is the pair's index within its head; whatever the
// frequencies are (base, scaling, per-dimension factors), every KV head of the row turns pair i
// by the same angle. For a candidate head dim h, with the row cut into heads of h values and
// the pairs taken as RoPE does (adjacent values for llama's rope, halves of the head for NEOX
// and M-RoPE, halves of the head's first n_rot values where the model ropes only those):
//   - a pair keeps its length from one cell to the other (it is rotated), and
//   - pair i turns by the same angle in every head.
// The true head dim passes; a divisor of it fails (the angles of a head fall along it, so its
// two halves do not turn alike); with adjacent pairs a multiple of it passes as well. So the
// smallest h that passes is the file's head dim. Only pairs that turn measurably more than
// their noise count (the noise from the stored type), which leaves out the slow low-frequency
// pairs and a layer without RoPE.
//
// Verdicts, each with the evidence in words:
//   kConfirmed     the claimed head dim passes and every smaller one dividing it fails;
//   kContradicted  another head dim passes and the claim fails (or is a multiple of the one that
//                  passes): the file was not written with this model;
//   kUnsure        not enough evidence (few repeated tokens, no tokens, media, no RoPE on layer
//                  0, a recurrent first layer, heavy quantization noise): nothing is decided.
// Quantized K is examined as stored and, where the candidate's head dim makes llama.cpp rotate,
// un-rotated with that candidate's block, so the check does not depend on knowing the rotation;
// and when the claimed head dim fits in one of the two only, that says how the file was stored
// (stored_rotated), whatever the model's weights (the channel-energy detector of
// migrate/rotation_detect.h needs a trained model's outlier channels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "base/io.h"
#include "base/status.h"
#include "format/llama_era.h"
#include "format/llama_state.h"
#include "format/model_profile.h"

namespace kvsnap {

// What is claimed, and where the witness layer is in the file.
struct HeadDimClaim {
  uint32_t head_dim = 0;     // K head dim of the witness layer
  size_t section = 0;        // the file's KV section holding the model's layer 0
  size_t layer = 0;          // its index among that section's layers
  std::string source;        // for messages: "model.gguf", "{--head-dim-k}"
  // The values RoPE turns at the start of each head (the model's n_rot, partial rotary: phi2,
  // stablelm, gpt-neox...); NEOX and M-RoPE pair i with i + rope_dims/2 there. 0, or not below the
  // head dim: the whole head.
  uint32_t rope_dims = 0;
};

// The claim for `model`'s layer 0, or nullopt when its layer 0 holds no K (a recurrent or
// attention-free first layer) or the model's sections cannot be laid out.
std::optional<HeadDimClaim> model_head_dim_claim(const ModelProfile& model, const std::string& model_name);

struct HeadDimEvidence {
  enum class Verdict { kConfirmed, kContradicted, kUnsure };
  Verdict verdict = Verdict::kUnsure;
  uint32_t claimed = 0;
  uint32_t observed = 0;     // the smallest head dim the data passes; 0: none
  uint32_t cell_pairs = 0;   // pairs of cells holding one token, examined
  // Quantized K at a claimed head dim llama.cpp rotates: kYes when the claim fits only un-rotated
  // with its block, kNo when only as stored; else kUnknown.
  Tri stored_rotated = Tri::kUnknown;
  double agreement = 0;      // the claim's fit: the smaller fraction of its two tests that agreed
  std::string summary;       // one line of evidence
};

const char* verdict_name(HeadDimEvidence::Verdict v);  // "confirmed" | "contradicted" | "unsure"

// Reads at most kHeadDimMaxPairs pairs of cells' K rows of the witness layer (fewer for rows over
// 512 values: 2^17 row values over all pairs; rows over 65,536 values are not read). Errors only for I/O
// and a file whose ranges contradict it (kCorruption); missing evidence is kUnsure.
inline constexpr uint32_t kHeadDimMaxPairs = 256;
Result<HeadDimEvidence> check_head_dim(const ReadableFile& file, const StateFile& f, const HeadDimClaim& claim);

// kMismatch naming the file, the claim and the evidence when `e` is kContradicted, else OK.
Status head_dim_status(const HeadDimEvidence& e, const HeadDimClaim& claim, const std::string& file_name);

}  // namespace kvsnap
