// llama.cpp's Hadamard rotation rule (llama_kv_cache's constructor, v0.5.0),
// as far as the model's head dims decide it. One place, used by the model
// info (migrate/model_info.h), the snapshot's recorded facts
// (format/snapshot.h) and the store's restore without a model.
//
//   K rotates when the cache's layers share one head dim and layer 0's head
//   dim is a multiple of 64; the block is the largest power of two (>= 64)
//   dividing that shared head dim. V rotates under the same condition on its
//   own head dims, always in blocks of 64.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kvsnap {

// The head dim every layer has, or 0 when they differ (or there are none).
uint32_t shared_head_dim(const std::vector<uint32_t>& per_layer);

// The K and V rotation blocks, or nullopt when llama.cpp does not rotate.
std::optional<uint32_t> k_rotation_block(uint32_t shared, uint32_t layer0_head_dim);
std::optional<uint32_t> v_rotation_block(uint32_t shared, uint32_t layer0_head_dim);

// What migrate's RotationGeometry wants: the shared head dim when layer 0's is
// a multiple of 64, else 0 (never rotates).
uint32_t rotation_head_dim(uint32_t shared, uint32_t layer0_head_dim);

// Whether llama.cpp rotates a section whose rotation block does not divide its
// head dim: the layers share a head dim that is not a multiple of 64 (96) while
// layer 0's is (128). build_input_k_rot then cuts each cell's row into blocks of
// 64 that straddle heads, which does not keep a head's dot products: such a
// cache is not what the model computes, and a later build may rotate it
// otherwise. No known model has it; conversions refuse it (migrate/convert_state.cc).
bool rotates_across_heads(uint32_t shared, uint32_t layer0_head_dim);

}  // namespace kvsnap
