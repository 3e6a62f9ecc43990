// Synthetic mlx-lm prompt caches for tests (header-only): files written by format/mlx_layout.h's
// writer, as MLX writes them. Values depend only on (tensor seed, head, position, dim), so two
// caches of different lengths agree on their common positions, as two saves of one conversation do.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "base/byte_order.h"
#include "base/io.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"

namespace kvsnap::test_mlx {

using Meta = std::vector<std::pair<std::string, std::string>>;

struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

// A [B,H,S,D] bf16 (or f16: not a real f16, the same 16 bits) tensor of a smooth signed pattern.
inline Tensor kv_tensor(const std::string& name, std::vector<int64_t> shape, int seed, const std::string& dtype = "BF16") {
  Tensor t{name, dtype, shape, {}};
  for (int64_t p = 0; p < shape[0] * shape[1]; ++p)
    for (int64_t s = 0; s < shape[2]; ++s)
      for (int64_t d = 0; d < shape[3]; ++d) {
        const float v = 3.0f * std::sin(0.37f * float(seed + 1000 * p + 13 * s + d)) + 0.25f * float(d % 5);
        uint32_t u;
        std::memcpy(&u, &v, 4);
        append_le<uint16_t>(t.bytes, uint16_t(u >> 16));
      }
  return t;
}

inline Tensor i32_scalar(const std::string& name, int32_t v) {
  Tensor t{name, "I32", {}, {}};
  append_le<int32_t>(t.bytes, v);
  return t;
}

inline MemoryFile make_file(const std::vector<Tensor>& ts, const Meta& meta, const std::string& name = "in.safetensors") {
  MlxOutFile out;
  for (const Tensor& t : ts) {
    MlxOutTensor o;
    o.t.name = t.name;
    o.t.dtype = t.dtype;
    o.t.shape = t.shape;
    o.bytes = t.bytes;
    out.tensors.push_back(std::move(o));
  }
  out.metadata = meta;
  MlxPromptCache none;
  MemoryFile empty("none", std::vector<std::byte>{});
  VectorSink sink;
  Status s = write_mlx_file(out, none, empty, sink);
  if (!s.ok()) return MemoryFile(name + " (" + s.ToString() + ")", std::vector<std::byte>{});
  return MemoryFile(name, std::move(sink.bytes));
}

// `layers` KVCache layers of [1,heads,rows,d] bf16, mlx-lm 0.28.1 .. 0.31 (meta_state) layout,
// user metadata model=`model`.
inline MemoryFile kv_file(int layers, int64_t heads, int64_t rows, int64_t d, const std::string& name = "kv.safetensors",
                          const std::string& model = "tiny") {
  std::vector<Tensor> ts;
  Meta meta;
  for (int L = 0; L < layers; ++L) {
    ts.push_back(kv_tensor(std::to_string(L) + ".0", {1, heads, rows, d}, 100 * L));
    ts.push_back(kv_tensor(std::to_string(L) + ".1", {1, heads, rows, d}, 100 * L + 50));
    meta.push_back({"0." + std::to_string(L), ""});
    meta.push_back({"2." + std::to_string(L), "KVCache"});
  }
  if (!model.empty()) meta.push_back({"1.model", model});
  return make_file(ts, meta, name);
}

}  // namespace kvsnap::test_mlx
