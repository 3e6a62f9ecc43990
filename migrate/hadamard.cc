#include "migrate/fp_strict.h"  // first: no FMA contraction in this file

#include "migrate/hadamard.h"

#include <cassert>
#include <cmath>
#include <optional>
#include <string>

#include "format/rotation_rule.h"
#include "migrate/simd_kernels.h"

namespace kvsnap {
namespace {

[[maybe_unused]] bool is_pow2(uint32_t n) { return n != 0 && (n & (n - 1)) == 0; }

bool end_rotated(RotationMode mode, const TypeLayout& type, uint32_t head_dim, KvSide side) {
  switch (mode) {
    case RotationMode::kAuto: return llama_rotates(type, head_dim, side);
    case RotationMode::kOn: return true;
    case RotationMode::kOff: return false;
  }
  return false;
}

const char* side_name(KvSide side) { return side == KvSide::kK ? "K" : "V"; }

}  // namespace

std::string_view to_string(RotationStep step) {
  switch (step) {
    case RotationStep::kNone: return "none";
    case RotationStep::kRotate: return "rotate";
    case RotationStep::kUnrotate: return "unrotate";
  }
  return "?";
}

// The rule itself is format/rotation_rule.h's; `head_dim` is already the shared head dim
// (RotationGeometry), so it is passed as both the shared and layer 0's.
uint32_t rotation_block_size(KvSide side, uint32_t head_dim) {
  const std::optional<uint32_t> n =
      side == KvSide::kV ? v_rotation_block(head_dim, head_dim) : k_rotation_block(head_dim, head_dim);
  return n.value_or(0);
}

bool llama_rotates(const TypeLayout& type, uint32_t head_dim, KvSide side) {
  return type.quantized && rotation_block_size(side, head_dim) != 0;
}

Result<RotationPlan> plan_rotation(const TypeLayout& src, const TypeLayout& dst, uint32_t head_dim, KvSide side,
                                   RotationOverride ovr) {
  const uint32_t n_rot = rotation_block_size(side, head_dim);
  if ((ovr.src == RotationMode::kOn || ovr.dst == RotationMode::kOn) && n_rot == 0) {
    return Status::InvalidArgument(std::string("cannot take the ") + side_name(side) +
                                   " cache as rotated: head_dim " + std::to_string(head_dim) +
                                   " is not a multiple of 64 (llama.cpp never rotates it): use {--src-rotation auto} / "
                                   "{--dst-rotation auto}, or off");
  }
  RotationPlan plan;
  plan.src_rotated = end_rotated(ovr.src, src, head_dim, side);
  plan.dst_rotated = end_rotated(ovr.dst, dst, head_dim, side);
  if (plan.src_rotated != plan.dst_rotated) {
    plan.step = plan.dst_rotated ? RotationStep::kRotate : RotationStep::kUnrotate;
    plan.n_rot = n_rot;
  }
  return plan;
}

Result<RotationPlan> plan_rotation(const TypeLayout& src, const TypeLayout& dst, uint32_t head_dim, KvSide side,
                                   RotationMode both) {
  return plan_rotation(src, dst, head_dim, side, RotationOverride{both, both});
}

// ggml_compute_forward_fwht_impl (ggml-cpu/ops.cpp), one row of n_rot values at a time.
// Its SIMD passes compute u - v as FMA(u, v, -1) (== u - v exactly, v * -1 being exact)
// and touch each pair once, so this scalar loop yields the same bits. The SIMD kernels
// (migrate/kernels/) do the same operations on the same pairs, stage by stage, so they do too.
void hadamard_ref::rotate(float* x, size_t n, uint32_t n_rot) {
  assert(is_pow2(n_rot) && n_rot >= 2 && n % n_rot == 0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(n_rot));
  for (size_t b = 0; b < n; b += n_rot) {
    float* r = x + b;
    for (uint32_t j = 0; j < n_rot; j++) r[j] = r[j] * scale;
    for (uint32_t len = 1; len < n_rot; len <<= 1) {
      for (uint32_t i = 0; i < n_rot; i += 2 * len) {
        for (uint32_t j = 0; j < len; j++) {
          const float u = r[i + j];
          const float v = r[i + len + j];
          r[i + j] = u + v;
          r[i + len + j] = u - v;
        }
      }
    }
  }
}

void hadamard_rotate(float* x, size_t n, uint32_t n_rot) {
  assert(is_pow2(n_rot) && n_rot >= 2 && n % n_rot == 0);
  simd::find_hadamard(n_rot)(x, n, n_rot);  // the level table (simd_kernels.cc)
}

void apply_rotation(const RotationPlan& plan, float* x, size_t n) {
  if (plan.step == RotationStep::kNone) return;
  hadamard_rotate(x, n, plan.n_rot);
}

// ggml_gen_hadamard (src/llama-kv-cache.cpp)
std::vector<float> hadamard_matrix(uint32_t n) {
  assert(is_pow2(n));
  std::vector<float> data(static_cast<size_t>(n) * n);
  data[0] = static_cast<float>(1.0 / std::sqrt(static_cast<float>(n)));
  for (uint32_t s = 1; s < n; s *= 2) {
    for (uint32_t i = 0; i < s; i++) {
      for (uint32_t j = 0; j < s; j++) {
        const float val = data[i * n + j];
        data[(i + s) * n + j] = val;
        data[i * n + (j + s)] = val;
        data[(i + s) * n + (j + s)] = -val;
      }
    }
  }
  return data;
}

}  // namespace kvsnap
