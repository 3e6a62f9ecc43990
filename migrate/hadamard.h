// The Walsh-Hadamard rotation llama.cpp applies to quantized K/V caches (PR #21038),
// and the rule that says when a conversion must rotate or un-rotate.
//
// What llama.cpp does (src/llama-kv-cache.cpp, src/llama-impl.h, llama.cpp v0.5.0):
//   - K is stored rotated when k_type is quantized, all layers share head_dim_k and
//     head_dim_k % 64 == 0; block n_rot_k = largest power of two >= 64 dividing head_dim_k.
//   - V likewise on head_dim_v, with n_rot_v = 64 always.
//   - Each row (one cell) is cut into consecutive blocks of n_rot values and each block x
//     becomes H.x, H = Sylvester Hadamard / sqrt(n_rot) (symmetric, H.H = I).
//   - The graph writes ggml_mul_mat(H, x) with GGML_HINT_SRC0_IS_HADAMARD; the CPU backend
//     runs that as a fast Walsh-Hadamard transform (ggml_compute_forward_fwht: scale every
//     value by 1.0f/sqrtf(n) first, then butterflies u+v / u-v with len = 1, 2, 4, ...).
//     hadamard_rotate() is that transform; its floats equal the CPU backend's bit for bit
//     (tests/migrate/oracle_test.cc). Other backends (CUDA, Metal, the CPU's use_ref
//     matmul) sum in another order and differ by a few ulp; see docs/conversion.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "format/ggml_types.h"

namespace kvsnap {

enum class KvSide { kK, kV };

// Whether an endpoint's data is taken as rotated:
//   kAuto  llama.cpp's rule (quantized type and head_dim % 64 == 0)
//   kOn    rotated (e.g. a quantized file of a model whose rule kvsnap cannot see); requires
//          head_dim % 64 == 0
//   kOff   not rotated (llama.cpp before PR #21038, or run with LLAMA_ATTN_ROT_DISABLE=1)
enum class RotationMode { kAuto, kOn, kOff };

struct RotationOverride {
  RotationMode src = RotationMode::kAuto;
  RotationMode dst = RotationMode::kAuto;
};

enum class RotationStep {
  kNone,      // both ends in the same domain (float->float, quantized->quantized, or disabled)
  kRotate,    // unrotated source, rotated destination: rotate after to_f32, before from_f32
  kUnrotate,  // rotated source, unrotated destination: un-rotate after to_f32
};

struct RotationPlan {
  RotationStep step = RotationStep::kNone;
  uint32_t n_rot = 0;        // block size; 0 when step == kNone
  bool src_rotated = false;  // what the plan assumed of each end (for messages, --dry-run)
  bool dst_rotated = false;
};

std::string_view to_string(RotationStep step);

// llama.cpp's block size for `side`, 0 when it never rotates that side (head_dim 0, or not
// a multiple of 64). K: largest power of two >= 64 dividing head_dim (64->64, 128->128,
// 192->64, 256->256); V: 64.
uint32_t rotation_block_size(KvSide side, uint32_t head_dim);

// Whether llama.cpp stores a `side` cache of `type` rotated (the kAuto rule).
bool llama_rotates(const TypeLayout& type, uint32_t head_dim, KvSide side);

// The rotation step converting a `side` row from `src` to `dst`. head_dim: that side's
// head size, equal for every layer (GGUF <arch>.attention.key_length / value_length);
// pass 0 when layers differ, in which case llama.cpp rotates nothing. The result:
// float->quantized rotates, quantized->float un-rotates, quantized->quantized and
// float->float do nothing, unless `ovr` says otherwise for an end.
// InvalidArgument when an end is forced kOn and head_dim is not a multiple of 64.
Result<RotationPlan> plan_rotation(const TypeLayout& src, const TypeLayout& dst, uint32_t head_dim, KvSide side,
                                   RotationOverride ovr = {});
Result<RotationPlan> plan_rotation(const TypeLayout& src, const TypeLayout& dst, uint32_t head_dim, KvSide side,
                                   RotationMode both);

// In place, x -> H.x for each of the n / n_rot consecutive blocks of x. n_rot: a power of
// two >= 2; n: a multiple of n_rot. H is its own inverse, so un-rotating is the same call;
// in floats H(H(x)) equals x to within the rounding of the sums (a few ulp of the block's
// largest value).
void hadamard_rotate(float* x, size_t n, uint32_t n_rot);
inline void hadamard_unrotate(float* x, size_t n, uint32_t n_rot) { hadamard_rotate(x, n, n_rot); }

// Applies the plan's step to one row of floats (nothing for kNone).
void apply_rotation(const RotationPlan& plan, float* x, size_t n);

// The n x n matrix llama.cpp builds (ggml_gen_hadamard, row-major): entries +-(1.0/sqrtf(n)).
// For tests and for comparing with a matmul; conversion never builds it.
std::vector<float> hadamard_matrix(uint32_t n);

}  // namespace kvsnap
