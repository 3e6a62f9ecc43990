// What mlx-lm's flags `--kv-bits B --kv-group-size G` mean for one prompt cache: the one place
// `kvsnap convert` and `kvsnap restore` of an mlx-lm snapshot turn them into an MlxKvSetting, so
// a restore at other bits gives the bytes a convert of the restored file gives.
#pragma once

#include <string>

#include "base/status.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/mlx_requant.h"

namespace kvsnap {

// The file's own setting: its first QuantizedKVCache layer's; float when it has none.
MlxKvSetting mlx_file_setting(const MlxPromptCache& c);

// kv_bits "none" or "float": float (a group size is then refused); "": the file's bits (refused
// for a float file); else 2|3|4|5|6|8. kv_group_size 0: the file's, else 64 (mlx-lm's default).
// kInvalidArgument naming `what` (the file or snapshot) and the flag.
Result<MlxKvSetting> mlx_kv_target(const MlxPromptCache& c, const std::string& kv_bits, int kv_group_size,
                                   const std::string& what);

}  // namespace kvsnap
