// Deciding from the data whether a quantized K/V cache was stored Hadamard-rotated.
//
// llama.cpp since PR #21038 (b8740..b10375 for ggsq v2 / ggsn v9, and every ggsq v3 /
// ggsn v10 build) stores quantized K/V rows rotated (migrate/hadamard.h); builds up to
// b8390, and any build run with LLAMA_ATTN_ROT_DISABLE=1, store them plain. The file
// does not say which. Trained models have outlier channels in K (and some in V): in
// the natural domain a few channels of each rotation block carry much of the energy,
// and a Hadamard transform spreads that energy flat. So of the two domains "as stored"
// and "H . stored", the one whose per-channel energy profile is spikier is the
// natural one. Random-weight models have no such channels: there neither domain
// stands out and the answer must be kUnsure. docs/rotation-detection.md has the
// statistic, the thresholds, how they were measured against real llama.cpp, and the
// limits.
//
// The statistic, per examined tensor (one K or V tensor of one layer and stream):
//   - sample up to max_cells cells (rows): runs of 32 consecutive cells spread evenly over
//     the stream (all cells when there are no more than max_cells);
//     Rows longer than 16,384 values are examined in their first 16,384 (bounded memory);
//   - per rotation block position b (a row holds n_embd / n_rot blocks) and channel j,
//     the energy E_D[b][j] = sum over sampled cells of y_j^2, y = the block in domain D;
//   - the concentration C_D[b] = n_rot * sum_j p_j^2 with p = E_D[b] / sum(E_D[b]):
//     1 for a flat profile, n_rot when one channel holds everything;
//   - L_D = mean over b of ln C_D[b], for D = stored (L_s), H.stored (L_h), and
//     kNullDomains "generic" domains H.D2.H.D1.stored (D1, D2 fixed pseudo-random
//     signs), whose spread sigma says how much ln C wanders between arbitrary bases
//     for this data and this number of cells;
//   - score d = L_h - L_s (natural log of a concentration ratio; > 0: H.stored is
//     spikier, i.e. the stored data was rotated), z = d / (sigma * sqrt 2).
// A tensor is decisive for "rotated" when d >= kMinLogRatio, z >= kMinZ and the spiky
// domain itself stands kMinZ sigmas above the generic level; likewise for "plain".
// The file verdict needs agreement (see detect_rotation). RotationEvidence::score is
// the median d over the examined tensors (same unit).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/llama_state.h"
#include "migrate/convert_state.h"

namespace kvsnap {

struct RotationEvidence {
  enum class Verdict { kRotated, kNotRotated, kUnsure };
  Verdict verdict = Verdict::kUnsure;
  // Median over the examined tensors of d = L_h - L_s: the natural log of how much more
  // concentrated the per-channel energy is after un-rotating (H . stored) than as stored.
  // > 0 favours "stored rotated", < 0 "stored plain"; +-0.69 = one domain twice as
  // concentrated. 0 when nothing was examined.
  double score = 0;
  // 0 for kUnsure. Otherwise agreement * (1 - exp(-excess)), where agreement =
  // (agreeing - contrary) / (agreeing + contrary) decisive tensors, and excess = the
  // median over agreeing tensors of min(|d| / kMinLogRatio, |z| / kMinZ) - 1 (how far past
  // the per-tensor threshold, in units of the threshold). 0.63 = median tensor twice past.
  double confidence = 0;
  uint32_t tensors = 0;                     // quantized tensors examined (enough cells, rotating geometry)
  uint32_t for_rotated = 0, for_plain = 0;  // tensors whose own evidence is decisive each way
  std::string summary;                      // one human line
};

struct DetectOptions {
  uint32_t max_cells = 1024;  // sample at most this many cells per tensor (bounded memory and time)
};

// Per-tensor and file-level thresholds (docs/rotation-detection.md says why these).
inline constexpr uint32_t kDetectMinCells = 16;    // fewer sampled cells: the tensor is not examined
inline constexpr double kDetectMinLogRatio = 0.75;  // |d|: one domain >= 2.1x as concentrated
inline constexpr double kDetectMinZ = 8.0;         // |z| and the spiky domain vs the generic level
inline constexpr uint32_t kDetectMinAgree = 2;     // decisive tensors agreeing, at least
inline constexpr uint32_t kDetectNullDomains = 4;

// Only tensors whose type is quantized and whose geometry rotates are examined; none:
// kUnsure with tensors == 0. The file verdict is kRotated (kNotRotated) when at least
// kDetectMinAgree tensors are decisive that way, they are at least a quarter of the
// examined tensors, and tensors decisive the other way are at most a tenth of the
// decisive ones; else kUnsure. Transposed V (always float) is skipped. Errors:
// kCorruption when a tensor's range or row size contradicts the file, kMismatch when
// a row is not whole rotation blocks of the geometry's head dim; I/O errors as read.
Result<RotationEvidence> detect_rotation(const ReadableFile& file, const StateFile& state,
                                         const RotationGeometry& geometry, const DetectOptions& opts = {});

const char* verdict_name(RotationEvidence::Verdict v);  // "rotated" | "not-rotated" | "unsure"

// One examined tensor's numbers (for the evaluation tool and tests).
struct TensorEvidence {
  size_t section = 0, stream = 0, layer = 0;
  bool is_v = false;
  uint32_t n_rot = 0;
  uint32_t cells = 0;          // sampled rows used
  double l_stored = 0, l_h = 0, l_null = 0, sigma = 0;
  double d = 0, z = 0;
  int decisive = 0;            // +1 rotated, -1 plain, 0 neither
};
// detect_rotation, also returning each examined tensor's evidence.
Result<RotationEvidence> detect_rotation_detailed(const ReadableFile& file, const StateFile& state,
                                                  const RotationGeometry& geometry, const DetectOptions& opts,
                                                  std::vector<TensorEvidence>* per_tensor);

}  // namespace kvsnap
