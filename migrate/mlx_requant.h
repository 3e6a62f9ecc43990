// Requantizing an mlx-lm prompt cache (format/mlx_prompt_cache.h) between float K/V and MLX affine
// bits/group sizes (migrate/mlx_affine.h), written in the input's own file layout so the mlx-lm
// release that wrote it loads the result:
//   KVCache          -> QuantizedKVCache   each row quantized as KVCache.to_quantized does
//                                          (mx.quantize of the saved rows: bit-exact on the CPU)
//   QuantizedKVCache -> QuantizedKVCache   at other bits/group: dequantized as mx.dequantize does,
//                                          then quantized as mx.quantize does, so the result is
//                                          mx.quantize(mx.dequantize(x)) byte for byte; at the
//                                          same bits and group the tensors are copied (exact)
//   QuantizedKVCache -> KVCache            mx.dequantize, in the scales' float type
// Every other class is carried byte for byte with a note saying why: mlx-lm itself cannot quantize
// a RotatingKVCache (to_quantized raises NotImplementedError "RotatingKVCache Quantization NYI"),
// and skips ChunkedKVCache, ConcatenateKVCache, CacheList and ArraysCache (no to_quantized).
//
// K and V: every mlx-lm release (0.19.3 .. 0.32.2) keeps one (group_size, bits) per
// QuantizedKVCache layer for both, so a spec with different K and V settings is refused
// (kInvalidArgument); separate K/V bits (KVSplit, mlx-lm #1074 / #1067) were never merged.
//
// Promises: everything is checked before the first byte is written (bits/group, every converted
// layer's head dims against the group, K/V agreement, the output layout when the file's meta_state
// does not say whether mlx-lm <= 0.28.0 or a later one wrote it: kAmbiguous); errors name the file,
// the layer, the problem and the remedy. Memory stays bounded: rows are read, converted and written a chunk at
// a time. The per-side error report compares, over the rows a layer holds (offset), the values
// mlx-lm will compute with (dequantized in T) against the input's values (its floats, or its
// dequantized values for a quantized input).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/mlx_affine.h"

namespace kvsnap {

// bits 0: float (the cache's float type); else MLX affine bits and group size.
struct MlxKvSetting {
  int bits = 0;
  int group_size = 0;
  bool is_float() const { return bits == 0; }
  std::string name() const;  // "float", "q4g64"
  bool operator==(const MlxKvSetting&) const = default;
};

struct MlxRequantSpec {
  MlxKvSetting k, v;
  MlxDevice device = MlxDevice::kCpu;
  // The layout of the mlx-lm that will load the output (format/mlx_layout.h, mlx_layout_for). Needed
  // only when the file does not tell (MlxPromptCache::step_unknown: float layers of mlx-lm 0.19.1 ..
  // 0.31.x going to quantized, whose meta_state has `step` up to 0.28.0); otherwise it must agree
  // with the file's layout: the output keeps the input's.
  std::optional<MlxLayout> layout;
  unsigned threads = 0;  // rows converted on this many threads; 0: one per core. The bytes and the
                         // report do not depend on it.
};

struct MlxRequantSide {
  std::string layer;         // the layer's tensor prefix ("3")
  bool is_v = false;
  std::string cls_from, cls_to;
  std::string from, to;      // "BF16", "q4g64 BF16"
  bool copied = false;       // carried unchanged (exact)
  uint64_t values = 0;       // values compared: rows < offset
  double rmse = 0, max_abs = 0, snr_db = 0, signal_rms = 0;  // snr: inf when exact
};

struct MlxRequantResult {
  std::vector<MlxRequantSide> sides;  // the attention layers' K and V, in layer order
  std::vector<std::string> notes;     // layers carried unchanged, and why
  uint64_t bytes_in = 0, bytes_out = 0;
  int layers_converted = 0;
};

// Refused (kInvalidArgument) when K and V differ, or a setting is not one MLX has.
Status mlx_requant_check_spec(const MlxRequantSpec& spec);

// Writes the requantized cache to `out` (callers give an atomic writer: on error nothing is
// committed). kNotSupported when no layer is one mlx-lm can (de)quantize.
Result<MlxRequantResult> mlx_requantize(const MlxPromptCache& in, const ReadableFile& src, const MlxRequantSpec& spec,
                                        ByteSink& out);

}  // namespace kvsnap
