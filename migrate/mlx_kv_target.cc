#include "migrate/mlx_kv_target.h"

#include <charconv>

#include "migrate/mlx_affine.h"

namespace kvsnap {

MlxKvSetting mlx_file_setting(const MlxPromptCache& c) {
  for (const MlxLayer& L : c.layers) {
    if (L.cls == "QuantizedKVCache" && L.bits && L.group_size) return {int(*L.bits), int(*L.group_size)};
  }
  return {};
}

Result<MlxKvSetting> mlx_kv_target(const MlxPromptCache& c, const std::string& kv_bits, int kv_group_size,
                                   const std::string& what) {
  const MlxKvSetting have = mlx_file_setting(c);
  MlxKvSetting to;
  if (kv_bits == "none" || kv_bits == "float") {
    if (kv_group_size) {
      return Status::InvalidArgument(what + ": {--kv-group-size} " + std::to_string(kv_group_size) + " with {--kv-bits} " +
                                     kv_bits + ": a float cache has no groups; drop one");
    }
    return to;
  }
  if (kv_bits.empty()) {
    if (have.is_float()) {
      return Status::InvalidArgument(what + ": its K/V are float: give {--kv-bits} 2|3|4|5|6|8 to quantize them");
    }
    to.bits = have.bits;
  } else {
    const char* end = kv_bits.data() + kv_bits.size();
    const auto [p, ec] = std::from_chars(kv_bits.data(), end, to.bits);
    if (ec != std::errc() || p != end) {
      return Status::InvalidArgument(what + ": {--kv-bits} '" + kv_bits + "': give 2, 3, 4, 5, 6, 8, or none (float)");
    }
  }
  to.group_size = kv_group_size ? kv_group_size : have.is_float() ? 64 : have.group_size;
  if (Status s = mlx_affine_check(to.bits, to.group_size); !s.ok()) return Status::InvalidArgument(what + ": " + s.message());
  return to;
}

}  // namespace kvsnap
