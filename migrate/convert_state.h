// Converting a whole llama.cpp state to other cache types, V layout or file
// format, streaming: the target is described as a StateFile (headers only)
// and its tensors are produced on demand by a TensorSource that reads the
// source in bounded blocks of cells, converts them through the type-traits
// table (migrate/type_traits.h) with llama.cpp's rotation rule
// (migrate/hadamard.h), and hands them to the writer (format/llama_state.h).
//
// Memory: O(threads x block) for rows; re-transposing V (flash attention
// switched) holds one column block of a layer, bounded by column_budget_bytes,
// and re-reads the source V once per column block (stated in
// docs/conversion.md). Nothing is ever sized by the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/llama_era.h"
#include "format/llama_state.h"
#include "migrate/hadamard.h"

namespace kvsnap {

// The file format of the output.
enum class TargetFormat {
  kSameKindCurrent,  // default: the input's kind, in v0.5.0's version (ggsq 3, ggsn 10, tagged raw)
  kGgsqV3,
  kGgsqV2,           // b6xxx..b8121: n_stream prefix
  kGgsqV2NoStream,   // b5640..b5869 (no n_stream prefix; cells hold their seq id)
  kGgsqV2NoSeqIds,   // b3543..b4980: as kGgsqV2NoStream, cells without their seq id (n_seq_id 0)
  kGgsqV1,           // b3166: the v1 sequence layout (cell positions only, one n_embd_v_gqa)
  kGgsnV10,
  kGgsnV9,
  kGgsnV9NoStream,
  kGgsnV8,           // b3543: RNG text + outputs + a memory section without the n_stream prefix
  kGgsnV6,           // b3166: the legacy dump; only from a ggsn v6 input (its llama_hparams header)
  // (kGgsnV6 stays last: convert_state.cc checks kTargetFormats has one row per enumerator up to it)
};

// THE table of output formats: a new file era is one row here (and its case in apply_format).
// `name` is --format's spelling; the rest says which builds' files it is: the kind, its version
// and, for the old versions whose layout changed without a bump, the n_stream prefix and the
// seq ids of ggsq cells (kUnknown: either). set_target_build (conversion_spec.cc) picks the row
// a named build's layout (format/llama_era.h) matches.
struct TargetFormatRow {
  std::string_view name;
  TargetFormat format;
  std::optional<StateKind> kind;     // kSeqFile or kSessionFile; nullopt for "current" (any kind)
  uint32_t version;                  // 0 for "current"
  Tri stream_prefix = Tri::kUnknown;
  Tri seq_cell_ids = Tri::kUnknown;
  std::string_view builds;           // the llama.cpp builds that write it (docs/llama-formats.md)
};
inline constexpr TargetFormatRow kTargetFormats[] = {
    {"current", TargetFormat::kSameKindCurrent, std::nullopt, 0, Tri::kUnknown, Tri::kUnknown,
     "the input's kind as v0.5.0 writes it"},
    {"ggsq-v3", TargetFormat::kGgsqV3, StateKind::kSeqFile, 3, Tri::kUnknown, Tri::kUnknown, "b10645.., v0.4.0, v0.5.0"},
    {"ggsq-v2", TargetFormat::kGgsqV2, StateKind::kSeqFile, 2, Tri::kYes, Tri::kUnknown, "b6122..b10375"},
    {"ggsq-v2-b5640", TargetFormat::kGgsqV2NoStream, StateKind::kSeqFile, 2, Tri::kNo, Tri::kYes, "b5640..b5869"},
    {"ggsq-v2-b3543", TargetFormat::kGgsqV2NoSeqIds, StateKind::kSeqFile, 2, Tri::kNo, Tri::kNo, "b3543..b4980"},
    {"ggsq-v1-b3166", TargetFormat::kGgsqV1, StateKind::kSeqFile, 1, Tri::kUnknown, Tri::kUnknown, "b3166"},
    {"ggsn-v10", TargetFormat::kGgsnV10, StateKind::kSessionFile, 10, Tri::kUnknown, Tri::kUnknown,
     "b10645.., v0.4.0, v0.5.0"},
    {"ggsn-v9", TargetFormat::kGgsnV9, StateKind::kSessionFile, 9, Tri::kYes, Tri::kUnknown, "b6122..b10375"},
    {"ggsn-v9-b5640", TargetFormat::kGgsnV9NoStream, StateKind::kSessionFile, 9, Tri::kNo, Tri::kUnknown,
     "b3889..b5869"},
    {"ggsn-v8-b3543", TargetFormat::kGgsnV8, StateKind::kSessionFile, 8, Tri::kUnknown, Tri::kUnknown, "b3543"},
    {"ggsn-v6-b3166", TargetFormat::kGgsnV6, StateKind::kSessionFile, 6, Tri::kUnknown, Tri::kUnknown, "b3166"},
};

Result<TargetFormat> parse_target_format(const std::string& s);  // a kTargetFormats name; "" is "current"
std::string target_format_names();                               // for --help: the names, in table order
const TargetFormatRow& target_format_row(TargetFormat f);

// What llama.cpp's rotation rule sees, per KV section: the head dim of the
// cache's layers when they share one and layer 0's is a multiple of 64, else
// 0 (never rotates). Unknown (empty) means: ask for the model when it matters.
struct RotationGeometry {
  std::vector<uint32_t> k_head_dim;  // per KV section
  std::vector<uint32_t> v_head_dim;
  uint32_t rope_dims = 0;  // the model's n_rot (partial rotary: below the head dim); 0: unknown
  // Layer 0's head dims, which llama.cpp's rule also reads (0: unknown, as from
  // --head-dim-k/v, which give one head dim for every layer).
  uint32_t layer0_k = 0, layer0_v = 0;
  bool known() const { return !k_head_dim.empty(); }
  // format/rotation_rule.h's rotates_across_heads for a section.
  bool across_heads(bool is_v, size_t section) const;
};

// How quantized -> quantized blocks are made when both ends are in one rotation domain
// (migrate/exact_requant.h). Every mode keeps float -> quantized ggml_quantize_chunk's.
enum class RequantMode {
  kAuto,       // the default: kExact from q8_0 into a linear grid, else kQuick (search_by_default in
               // migrate/exact_requant.h says why; docs/conversion.md has the figures)
  kQuick,      // a block the target holds exactly is kept; the others: the smaller error of ggml's
               // reference block, 4 nearby scales and one least-squares refinement
  kSearch,     // a block the target holds exactly is kept; the others: the smaller error of ggml's
               // reference block and a scale search over 16 nearby scales and up to 3 refinements
               // (~20-30 MB/s a thread at avx2 where blocks do not embed, docs/performance.md)
  kExact,      // kept where exact, else ggml's reference block (no search)
  kReference,  // ggml's reference requantization of every decoded block (RowConverter: fastest;
               // blocks that could be kept exactly are requantized too)
};
// "auto" | "quick" | "search" | "exact" | "reference", and back (kInvalidArgument names the words).
const char* requant_mode_name(RequantMode m);
Result<RequantMode> parse_requant_mode(const std::string& word);

struct ConvertRequest {
  std::optional<int32_t> k_type;     // nullopt: keep each layer's
  std::optional<int32_t> v_type;
  std::optional<bool> flash_attn;    // target V layout: true rows, false transposed; nullopt: keep
  RotationOverride k_rotation;       // per end; kAuto follows llama.cpp (and the file's era)
  RotationOverride v_rotation;
  // Whether the llama.cpp that wrote the input / will load the output rotates
  // quantized K/V (format/llama_era.h). nullopt: what the file's layout
  // proves; where that is unknown, a conversion that depends on it is refused.
  std::optional<bool> src_rotates;
  std::optional<bool> dst_rotates;
  // The llama.cpp build that will load an old-format (v2/v9) output, when
  // named: whether its v9 sessions hold outputs and its M-RoPE cell extra.
  std::optional<BuildLayout> target_build;
  TargetFormat format = TargetFormat::kSameKindCurrent;
  // A raw llama_state_*_get_data buffer goes back into the llama.cpp that made it, which reads its
  // own layout (v0.5.0's starts with a tag where b8121's starts with its n_stream): true keeps
  // the input's version, tag and n_stream prefix where kSameKindCurrent would upgrade them.
  // make_request sets it for raw inputs unless a format is named.
  bool keep_raw_layout = false;
  // The KV stream count of the output (a llama-server with -np N and no -kvu keeps one stream per
  // slot, a unified cache one; llama.cpp restores a sequence file only into a cache with as many):
  // the sequence's stream keeps its index when below it, else becomes stream 0, and the others are
  // written empty. nullopt: as the input. Sequence states only (a session holds every sequence).
  std::optional<uint32_t> kv_streams;
  RotationGeometry geometry;         // from --model or --head-dim-k/v
  uint32_t threads = 1;
  // Cells of a tensor the input reads best at once, 0 for no preference: a store snapshot's
  // original checks several of its chunks together (SHA-256 lanes: SnapshotReader::read_cells),
  // so blocks of that many rows (where they keep the workers even) hash in more lanes.
  uint64_t source_read_cells = 0;
  // The cells of each of the input's chunks, 0 when unknown: blocks may then be any multiple of it,
  // not only a power of two (conversion_block_rows).
  uint64_t source_chunk_cells = 0;
  // Towards transposed V (--fa off): the target's columns held at once, so a long context's layer
  // is made in several passes over its source V (tests lower it to get several).
  uint64_t column_budget_bytes = 32u << 20;
  bool report = false;               // collect per-layer error statistics
  RequantMode requant = RequantMode::kAuto;
};

// How many rows of a tensor (cells, or transposed V's columns) one of `threads` workers converts at
// a time: a power of two of at most 1 MiB of source or target rows (`row_bytes` the larger row),
// at most a worker's share; larger, up to `read_cells` (ConvertRequest::source_read_cells) and 4 MiB,
// where that leaves no worker more rows (docs/performance.md, "Multithreading"): the largest such
// power of two or, with `chunk_cells` (ConvertRequest::source_chunk_cells) dividing the first size,
// multiple of the chunks' cells.
uint64_t conversion_block_rows(uint64_t n_rows, size_t threads, uint64_t row_bytes, uint64_t read_cells,
                               uint64_t chunk_cells = 0);

// Per layer and side: how the conversion went.
struct LayerReport {
  size_t section = 0, layer = 0;
  bool is_v = false;
  std::string src_type, dst_type;
  std::string rotation;              // "none", "rotate-64", "unrotate-128"
  bool copied = false;               // bytes passed through unchanged
  uint64_t blocks_exact = 0;         // quantized -> quantized: blocks the target holds exactly
  uint64_t blocks_requantized = 0;   // ... and blocks that went through the reference quantizer
  std::string requant;               // how those were made: "quick", "search", "exact", "reference"
                                     // ("auto" resolved; the mode the layer ran, even where every block
                                     // embedded); "" unless quantized -> quantized with no rotation step
                                     // (a layer that rotates or un-rotates always takes ggml's reference
                                     // quantizer after the rotation)
  uint64_t values = 0;
  double rmse = 0, max_abs = 0, snr_db = 0;  // against the source values (snr: inf when exact)
  double signal_rms = 0;
};

struct ConvertResult {
  StateFile target;                  // what was written
  uint64_t bytes_in = 0, bytes_out = 0;
  std::vector<LayerReport> layers;   // filled when request.report
  bool identical = false;            // output bytes == input bytes (identity conversion)
};

// Builds the target description (types, row sizes, V layout, version) and
// checks that the conversion is possible, without touching tensor data.
Result<StateFile> plan_target(const StateFile& src, const ConvertRequest& req);

// Whether converting `src` into `target` (plan_target's) rotates or un-rotates the values of a
// layer: then the output differs from the input even where their headers are the same (q8_0 of
// a build before b8643 for one after it), which a header alone cannot show.
Result<bool> rotates_values(const StateFile& src, const StateFile& target, const ConvertRequest& req);

// Converts `src` (parsed from `in`) into `out`.
Result<ConvertResult> convert_state(const StateFile& src, const ReadableFile& in, const ConvertRequest& req,
                                    ByteSink& out);

}  // namespace kvsnap
