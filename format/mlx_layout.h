// Moving an mlx-lm prompt cache (format/mlx_prompt_cache.h) between the file layouts of mlx-lm
// releases, so a file saved by one release loads in another:
//   kMetaStep (0.19.1 .. 0.28.0)  <->  kMeta (0.28.1 .. 0.31.x): `step` ("256") inserted or dropped
//                                  from the meta_state of QuantizedKVCache and RotatingKVCache (#487)
//   kMeta / kMetaStep  <->  kScalars (0.32.0 ..): meta_state strings become 0-d I32 tensors in each
//                                  layer's state and back; the metadata becomes [user, classes,
//                                  scalars] and back
//   kKeysValues (0.18.x, "<i>_keys") ->  any of them (read only: no mlx-lm since 0.19.1 loads it)
// Per class (the target is a release, MlxTarget, because classes came and went between releases):
//   KVCache           0.32 saves its whole 256-row buffer: cut to `offset` rows for the meta
//                     layouts, whose loader takes offset from the rows
//   QuantizedKVCache  from mlx-lm 0.19.3; RotatingKVCache: fields moved, tensors carried
//   ChunkedKVCache    from 0.23.0 (#81; before, loaders raise KeyError). The meta loaders take
//                     offset from the rows, so going there the buffer is cut, or padded with zero
//                     rows (start_position > 0: the valid rows are offset - start_position), to
//                     exactly `offset` rows; the padding lies past the valid rows, never read
//   ArraysCache / MambaCache
//                     the state is [arrays] up to 0.31.x ("<L>.<i>") and (arrays, left_padding,
//                     lengths) from 0.32 (#1632: "<L>.0.<i>", None saved as F32[0]). MambaCache
//                     (2 arrays) is gone from 0.30.6 (#842): renamed ArraysCache for those
//                     readers; readers before 0.28.1 construct ArraysCache() without its size, so
//                     for them ArraysCache of 2 arrays is renamed MambaCache and others refused.
//                     A None array, left_padding or lengths cannot go to a meta layout: refused
//   CacheList         from 0.31.0 (#886; before, loaders drop or fail on its state); members moved
//                     recursively by their own rules
// Refused with kNotSupported naming the layer and class: a class the target release cannot load
// (above), ConcatenateKVCache, Batch*, classes not understood, and targets before 0.19.1.
//
// Tensor data is never changed, only carried (by range; cut rows are whole rows) or padded with
// zero rows as said above. The output keeps the input's data order for the tensors it keeps; new
// scalar tensors follow.
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
  int64_t rows = -1;                       // >= 0: the first `rows` rows of src; more rows than
                                           // src has: zero rows after them
  int64_t data_rows = -1;                  // >= 0 (with rows): only this many rows come from src,
                                           // zero rows after them up to `rows`
  std::vector<std::byte> bytes;
  std::function<Status(ByteSink&)> produce;
};

struct MlxOutFile {
  std::vector<MlxOutTensor> tensors;       // in data order
  std::vector<std::pair<std::string, std::string>> metadata;
};

// A 0-d I32 tensor: the integer state (offset, bits, ...) of the scalars layout.
MlxOutTensor mlx_scalar_tensor(const std::string& name, int64_t v);

// The mlx-lm release a moved file is for: its layout and which classes its loader knows.
struct MlxTarget {
  MlxLayout layout = MlxLayout::kScalars;
  int minor = 32, patch = 2;  // mlx-lm 0.<minor>.<patch>
  std::string name() const;   // "mlx-lm 0.28.0"
  bool at_least(int mi, int pa) const { return minor > mi || (minor == mi && patch >= pa); }
};

// An mlx-lm version ("0.28.0", "v0.31", "0.32.2") from 0.19.1 on, or a layout name
// (mlx_layout_name, or meta-step / meta): a layout stands for the newest release of it kvsnap was
// checked with (meta_state-with-step 0.28.0, meta_state 0.31.3, scalars 0.32.2).
Result<MlxTarget> mlx_target_for(const std::string& name);
// kNotSupported when release `t` cannot load a QuantizedKVCache (0.19.3 added it), naming it.
Status check_release_loads_quantized_kv(const MlxTarget& t);
Result<MlxLayout> mlx_layout_for(const std::string& name);  // mlx_target_for(name).layout

Result<MlxOutFile> mlx_change_layout(const MlxPromptCache& in, const MlxTarget& to);
Result<MlxOutFile> mlx_change_layout(const MlxPromptCache& in, MlxLayout to);  // the layout's release

// The first `n` positions of every layer, in the file's own layout (`kvsnap restore --tokens N` of
// an mlx-lm snapshot): the cache as mlx-lm would hold it had it seen only those positions, where
// the saved rows are exactly them, in order:
//   KVCache, QuantizedKVCache   the first n rows of every K/V tensor (quantization groups run
//                               along head_dim, so a position's codes, scales and biases are its
//                               own row), offset n
//                               In mlx-lm 0.32's scalars layout a KVCache saves its whole
//                               buffer, grown in steps of 256 rows with zeros: a KVCache cut to n
//                               is written as mlx-lm 0.32 saves a cache that computed n positions
//                               in one go: ceil(n/256)*256 rows, zero after the first n (the same
//                               bytes). QuantizedKVCache keeps n rows: mlx-lm's padding there
//                               depends on how it was quantized (docs/mlx.md).
//   ChunkedKVCache              the same, when it dropped nothing (start_position 0)
//   RotatingKVCache             the same with _idx n, when its ring has not wrapped (offset <=
//                               max_size and _idx = offset): n is then within its window
//   CacheList                   its members by these rules
// The user metadata "tokens" (a JSON list of ids, as kvsnap convert --to mlx writes) keeps its first n.
// Refused with kNotSupported naming the layer and why: ArraysCache/MambaCache (a recurrent state
// has seen every position), a wrapped ring, a ChunkedKVCache past its first chunk, any other
// class, and the 0.18.x "<i>_keys" layout; n < 1 or above a layer's offset: kInvalidArgument.
Result<MlxOutFile> mlx_prefix(const MlxPromptCache& in, int64_t n);

// Writes `out` as MLX would (header via safetensors_header_text), tensor data copied from `src`.
Status write_mlx_file(const MlxOutFile& out, const MlxPromptCache& in, const ReadableFile& src, ByteSink& sink);

}  // namespace kvsnap
