// `kvsnap info` of an mlx-lm prompt cache: one report built from the parsed file and rendered twice,
// as JSON (schema in docs/mlx.md) and as a human table, so the two never disagree.
//
// The size table is computed from the shapes alone: every attention layer's K and V at float16 /
// bfloat16 and at MLX affine bits 2,3,4,5,6,8 x group 32,64,128 (codes D*bits/32 uint32 words per
// row, one scale and one bias per group in the cache's float dtype, as mx.quantize makes them).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "format/mlx_prompt_cache.h"

namespace kvsnap {

struct MlxSizeAt {
  std::string kind;   // "f16", "bf16", "q<bits>g<group>"
  int bits = 0, group_size = 0;  // 0 for the float kinds
  std::optional<uint64_t> kv_bytes;  // nullopt: a head dim is not whole groups
  uint64_t file_bytes = 0;           // the file with the K/V at this setting
  std::string note;
};

struct MlxInfoReport {
  std::string file;
  uint64_t file_bytes = 0;
  const MlxPromptCache* cache = nullptr;
  std::optional<int64_t> tokens;  // the attention layers' offset when they agree
  uint64_t kv_bytes = 0;          // K and V tensors of every attention layer
  std::vector<MlxSizeAt> size_at;
};

MlxInfoReport mlx_info_report(const MlxPromptCache& cache, const std::string& path);
nlohmann::ordered_json mlx_info_json(const MlxInfoReport& r);
std::string mlx_info_text(const MlxInfoReport& r);

}  // namespace kvsnap
