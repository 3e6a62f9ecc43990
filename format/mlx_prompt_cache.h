// mlx-lm prompt-cache files (mlx_lm.cache_prompt, save_prompt_cache): the safetensors container
// (format/mlx_safetensors.h) read as mlx-lm's list of per-layer cache objects.
//
// mlx-lm has written four layouts; the reader tells them apart by content and says why:
//   kKeysValues  mlx-lm 0.18.x .. 0.19.0   cache_prompt's plain mx.save_safetensors (mlx-examples
//                #956, #979): "<i>_keys"/"<i>_values" per layer, metadata model, chat_template,
//                tokenizer_config, max_kv_size (all kept as user metadata). Read as KVCache layers
//                (offset = rows) only when that is exact: max_kv_size "None" (no ring, whose
//                position the file lacks) and the rows are the tokens (#956 saved the whole
//                256-row buffer: rows a multiple of 256 whose last row is zero in every head are
//                refused); anything else is refused with kNotSupported saying why
//   kMetaStep    mlx-lm 0.19.1 .. 0.28.0   metadata [meta_state, user, classes]:
//                "0.<L>.<i>" meta_state strings (QuantizedKVCache (step,offset,gs,bits),
//                RotatingKVCache (keep,max_size,step,offset,_idx)), "1.<k>" user, "2.<L>" class
//   kMeta        mlx-lm 0.28.1 .. 0.31.x   the same without `step` (mlx-lm #487)
//   kScalars     mlx-lm 0.32.0 ..          metadata [user, classes, scalars]: "0.<k>" user,
//                "1.<L>" class, "2.0" = "" then "2.<i>.0" tensor name / "2.<i>.1" scalar|string|none;
//                offset, bits, ... are then 0-d I32 tensors inside each layer's state, strings are
//                I32 code points, None is F32[0]; KVCache saves its whole buffer (256-row steps)
// Classes understood: KVCache, ConcatenateKVCache, QuantizedKVCache, RotatingKVCache,
// ChunkedKVCache, ArraysCache/MambaCache, CacheList (nested). Any other class is kept (its tensors
// are carried byte-exact) and reported as not understood.
//
// Promises: every tensor a class needs is checked for presence, dtype and shape agreement (K and V
// batch/heads/rows, packed width = D*bits/32, scales/biases = D/group_size); errors name the file,
// the layer, the class and the tensor. Tensor data is never read except the few bytes of scalar
// state. A prompt cache rewrites byte-exact through write_safetensors(cache.st, ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/mlx_safetensors.h"

namespace kvsnap {

enum class MlxLayout { kMetaStep, kMeta, kScalars, kKeysValues };
const char* mlx_layout_name(MlxLayout l);

// One side (K or V) of an attention cache: a float tensor, or the quantized triple.
struct MlxKvSide {
  const SafetensorsTensor* data = nullptr;    // float keys/values, or the packed uint32 codes
  const SafetensorsTensor* scales = nullptr;  // quantized only
  const SafetensorsTensor* biases = nullptr;
  int64_t batch = 0, heads = 0, rows = 0, head_dim = 0;
  std::string dtype;  // the float dtype (of scales/biases when quantized)
  uint64_t bytes() const;
};

struct MlxLayer {
  std::string prefix;     // tensor name prefix, "3" or "0.1.0" inside a CacheList
  std::string cls;        // class name as the file says it
  bool understood = true;
  std::optional<MlxKvSide> k, v;
  std::optional<int64_t> offset;  // tokens seen (KVCache: rows; others from state)
  std::optional<int64_t> bits, group_size, keep, max_size, idx, step, chunk_size, start_position;
  std::vector<const SafetensorsTensor*> arrays;  // ArraysCache, and the tensors of a class not understood
  std::vector<MlxLayer> sub;                     // CacheList
  uint64_t bytes = 0;                            // every tensor of this layer
};

struct MlxPromptCache {
  Safetensors st;
  MlxLayout layout = MlxLayout::kMeta;
  // A meta layout with no QuantizedKVCache or RotatingKVCache layer: nothing tells kMetaStep
  // (mlx-lm <= 0.28.0) from kMeta (0.28.1 .. 0.31.x); `layout` then says kMeta.
  bool step_unknown = false;
  std::string version_guess;  // "mlx-lm 0.28.1 .. 0.31.x"
  std::vector<std::string> evidence;
  std::vector<std::pair<std::string, std::string>> user_metadata;
  std::vector<MlxLayer> layers;
};

// Content test: a safetensors header whose metadata has mlx-lm's class list.
bool looks_like_mlx_prompt_cache(const ReadableFile& f);

Result<MlxPromptCache> read_mlx_prompt_cache(const ReadableFile& f);

}  // namespace kvsnap
