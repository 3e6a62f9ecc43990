// Moving an mlx-lm prompt cache between mlx-lm's file layouts (format/mlx_prompt_cache.h), so a
// file saved by one release loads in another:
//   kMetaStep (<= 0.28.0)  <->  kMeta (0.28.1 .. 0.31.x): `step` ("256") inserted or dropped from the
//                                meta_state of QuantizedKVCache and RotatingKVCache (mlx-lm #487)
//   kMeta / kMetaStep       <->  kScalars (0.32.0 ..): meta_state strings become 0-d I32 tensors in
//                                each layer's state and back; the metadata becomes
//                                [user, classes, scalars] and back; a KVCache buffer longer than
//                                its offset is cut to `offset` rows going to the meta layouts
//                                (their loader takes offset from the rows)
// Classes converted: KVCache, QuantizedKVCache, RotatingKVCache. Others (CacheList, ArraysCache,
// ChunkedKVCache, unknown) are refused with kNotSupported naming the layer: their state differs
// between releases in ways not yet checked against the real loaders.
//
// Tensor data is never changed, only carried (by range; cut rows are whole rows). The output keeps
// the input's data order for the tensors it keeps; new scalar tensors follow.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/mlx_prompt_cache.h"

namespace kvsnap {

// One output tensor: bytes from the input (`src`, all of it or its first `rows` rows along axis 2
// of [B,H,S,...]), inline bytes, or bytes made while writing (`produce`, e.g. requantized rows:
// migrate/mlx_requant.h). write_mlx_file checks that a producer writes exactly the tensor's size.
struct MlxOutTensor {
  SafetensorsTensor t;                     // name, dtype, shape of the output
  const SafetensorsTensor* src = nullptr;  // nullptr: `produce`, else `bytes`
  int64_t rows = -1;                       // >= 0: keep the first `rows` rows of src
  std::vector<std::byte> bytes;
  std::function<Status(ByteSink&)> produce;
};

struct MlxOutFile {
  std::vector<MlxOutTensor> tensors;       // in data order
  std::vector<std::pair<std::string, std::string>> metadata;
};

// A 0-d I32 tensor: the integer state (offset, bits, ...) of the scalars layout.
MlxOutTensor mlx_scalar_tensor(const std::string& name, int64_t v);

// "meta_state-with-step", "meta_state", "scalars" (mlx_layout_name) or an mlx-lm version
// ("0.28.0", "0.31.3", "0.32.2"): the layout that release writes.
Result<MlxLayout> mlx_layout_for(const std::string& name);

Result<MlxOutFile> mlx_change_layout(const MlxPromptCache& in, MlxLayout to);

// Writes `out` as MLX would (header via safetensors_header_text), tensor data copied from `src`.
Status write_mlx_file(const MlxOutFile& out, const MlxPromptCache& in, const ReadableFile& src, ByteSink& sink);

}  // namespace kvsnap
