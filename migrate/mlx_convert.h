// One conversion of an mlx-lm prompt cache, the way `kvsnap convert` and `kvsnap restore` both do
// it (a restore's output is byte for byte `kvsnap convert` of the restored file with the same
// flags, docs/mlx.md): its K/V requantized (mlx-lm's --kv-bits / --kv-group-size,
// migrate/mlx_requant.h) and/or the file moved to the layout of the mlx-lm release that will load
// it (--mlx-lm, format/mlx_layout.h), classes renamed as that release names them.
//
// Promises: every refusal comes before a byte reaches `out` (a release without QuantizedKVCache
// and quantized K/V, a move the target cannot take, the requantizer's own checks); when
// requantizing the file in its own layout would not give a file the target loads, the moved file
// goes to `scratch_path` first and is requantized from there, and is removed before mlx_convert
// returns. Errors name `what` (the input) and the problem.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/mlx_affine.h"
#include "migrate/mlx_requant.h"

namespace kvsnap {

struct MlxConvertRequest {
  std::string kv_bits;              // "": the file's; "none": float; "2".."8"
  int kv_group_size = 0;            // 0: the file's, else 64
  std::optional<MlxTarget> target;  // the mlx-lm release that will load it; nullopt: the file's own
  MlxDevice device = MlxDevice::kCpu;
  unsigned threads = 0;             // 0: one per core; the bytes do not depend on it
  std::string what;                 // names the input in messages
  std::string scratch_path;         // for the moved file, when one is needed (Io::open_write, exclusive)

  bool requantizes() const { return !kv_bits.empty() || kv_group_size != 0; }
};

struct MlxConvertResult {
  MlxLayout layout_from = MlxLayout::kScalars;  // the input's
  MlxLayout layout_out = MlxLayout::kScalars;   // the output's
  // Without requantization (a move only): each layer's class in the output, in layer order.
  std::vector<std::string> classes_out;
  // With requantization: the setting written and the requantizer's report.
  std::optional<MlxKvSetting> to;
  std::optional<MlxRequantResult> requant;
  uint64_t bytes_out = 0;
};

// kInvalidArgument when the request asks for nothing (no kv_bits, group size or target).
Result<MlxConvertResult> mlx_convert(Io& io, const MlxPromptCache& in, const ReadableFile& file,
                                     const MlxConvertRequest& req, ByteSink& out);

}  // namespace kvsnap
