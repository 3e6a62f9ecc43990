// Snapshots of mlx-lm prompt caches (format/mlx_prompt_cache.h): the same manifest and chunk blobs
// as a llama.cpp state (format/snapshot.h, docs/format.md), so the store keeps, deduplicates,
// verifies, exports and restores them alike, and SnapshotReader::original() is the file byte for byte.
//
// How the file is cut (docs/format.md, "mlx-lm prompt caches"):
//  - every 4-d tensor [B,H,S,D] with data (K/V, their quantized codes, scales and biases) is one
//    kTransposed segment: B*H "rows" (one per head plane) of S "cells" (sequence positions) of
//    D*itemsize bytes. A chunk is a tile: positions [j*N, j*N+n) of every plane of its band (all
//    planes when they fit 16 MiB), N = cells_per_chunk (256, mlx-lm's own buffer step). So two
//    caches whose first tokens agree share the chunks of their whole 256-position blocks, in
//    every layer, float or quantized (quantization is per position);
//  - everything else (the safetensors header, 0-d scalars of the 0.32 layout, ArraysCache state,
//    None placeholders, gaps) is frame, chunked by 1 MiB. It differs between any two caches.
//  - compression: f16/bf16 (K, V, scales, biases) byte planes, f32 4 planes, packed uint32 codes
//    and other integers plain zstd (measured in docs/mlx.md).
// The manifest has the required MLXC section first (a kvsnap without it refuses the manifest by
// that tag), INFO kind "mlx-prompt-cache" with an "mlx" summary, an empty CELL table and TOKN with
// the tokens the user gave (mlx-lm stores none).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/mlx_prompt_cache.h"
#include "format/snapshot.h"

namespace kvsnap {

// What the catalog and `kvsnap show` say about a prompt cache.
struct MlxCacheSummary {
  std::string model;       // the user's name for it, else the file's "model" metadata; "" unknown
  std::string layout;      // mlx_layout_name
  std::string written_by;  // "mlx-lm 0.32.0 .."
  int n_layers = 0;
  std::string classes;     // "KVCache x16" or "KVCache x12, RotatingKVCache x4"
  std::string k_types, v_types;  // distinct K / V settings: "bf16", "q4g64" ("-" none)
  std::optional<int64_t> offset;  // the attention layers' offset when they agree
};
MlxCacheSummary mlx_cache_summary(const MlxPromptCache& cache, const std::string& model);

struct MlxSnapshotMeta {
  std::string model;            // recorded as the model's name ("" : the file's "model" metadata)
  std::vector<int32_t> tokens;  // the prompt's tokens, when the user gave them
};

// Cuts `original` (read as `cache`) into chunks for `chunks` and returns the manifest. Ignores
// opts.model and opts.lossy (llama.cpp only).
Result<SnapshotManifest> build_mlx_snapshot(const MlxPromptCache& cache, const ReadableFile& original,
                                            const SnapshotOptions& opts, const MlxSnapshotMeta& meta,
                                            ChunkSink& chunks);

// The same as a standalone .kvsnap file (tests, fuzz seeds; the store exports with SnapshotFileAssembler).
Result<SnapshotManifest> write_mlx_snapshot_file(const MlxPromptCache& cache, const ReadableFile& original,
                                                 const SnapshotOptions& opts, const MlxSnapshotMeta& meta,
                                                 ByteSink& out);

// The "mlx" object of an mlx snapshot's INFO (MlxCacheSummary as recorded), for show.
std::optional<MlxCacheSummary> mlx_summary_of(const SnapshotManifest& m);

}  // namespace kvsnap
