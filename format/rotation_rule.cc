#include "format/rotation_rule.h"

namespace kvsnap {

uint32_t shared_head_dim(const std::vector<uint32_t>& d) {
  if (d.empty()) return 0;
  for (uint32_t x : d)
    if (x != d[0]) return 0;
  return d[0];
}

std::optional<uint32_t> k_rotation_block(uint32_t shared, uint32_t layer0) {
  if (shared == 0 || layer0 % 64 != 0) return std::nullopt;
  // 64-bit: a head dim of 2^31 (a hostile GGUF) would make a 32-bit n wrap to 0 and divide by it
  uint64_t n = 64;
  do {
    n *= 2;
  } while (shared % n == 0);
  return static_cast<uint32_t>(n / 2);
}

std::optional<uint32_t> v_rotation_block(uint32_t shared, uint32_t layer0) {
  if (shared == 0 || layer0 % 64 != 0) return std::nullopt;
  return 64;
}

uint32_t rotation_head_dim(uint32_t shared, uint32_t layer0) { return layer0 % 64 == 0 ? shared : 0; }

bool rotates_across_heads(uint32_t shared, uint32_t layer0) {
  return shared != 0 && shared % 64 != 0 && layer0 != 0 && layer0 % 64 == 0;
}

}  // namespace kvsnap
