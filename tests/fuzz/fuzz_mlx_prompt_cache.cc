// read_mlx_prompt_cache (format/mlx_prompt_cache.h): the safetensors header, the mlx-lm layer on
// top, the info report built from it, the writer over what was read, the layout moves, and the
// requantization kvsnap convert --kv-bits runs on it (migrate/mlx_requant.h).
#include <optional>

#include "format/mlx_info.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"
#include "fuzz/fuzz_input.h"
#include "migrate/mlx_requant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvsnap::MemoryFile file("fuzz.safetensors", kvsnap::fuzz::bytes(data, size));
  (void)kvsnap::looks_like_mlx_prompt_cache(file);
  auto cache = kvsnap::read_mlx_prompt_cache(file);
  if (!cache.ok()) return 0;
  const kvsnap::MlxInfoReport r = kvsnap::mlx_info_report(*cache, "fuzz.safetensors");
  (void)kvsnap::mlx_info_json(r);
  (void)kvsnap::mlx_info_text(r);
  kvsnap::CountingSink out;
  (void)kvsnap::write_safetensors(cache->st, file, out);
  for (auto to : {kvsnap::MlxLayout::kMetaStep, kvsnap::MlxLayout::kMeta, kvsnap::MlxLayout::kScalars}) {
    auto moved = kvsnap::mlx_change_layout(*cache, to);
    if (moved.ok()) (void)kvsnap::write_mlx_file(*moved, *cache, file, out);
  }
  // One requantization per input, chosen by the input's size, instead of all twelve: each run of the
  // requantizer walks every tensor, and twelve of them made this target ~30x slower than the others
  // (about 8k runs in 30 s). The corpus's sizes spread the choices over every setting, device and layout.
  static const kvsnap::MlxKvSetting kTargets[] = {kvsnap::MlxKvSetting{}, kvsnap::MlxKvSetting{4, 32},
                                                  kvsnap::MlxKvSetting{3, 128}};
  const kvsnap::MlxKvSetting to = kTargets[size % 3];
  const kvsnap::MlxDevice device = (size / 3) % 2 == 0 ? kvsnap::MlxDevice::kCpu : kvsnap::MlxDevice::kGpu;
  const std::optional<kvsnap::MlxLayout> layout =
      (size / 6) % 2 == 0 ? std::nullopt : std::optional<kvsnap::MlxLayout>(kvsnap::MlxLayout::kMetaStep);
  (void)kvsnap::mlx_requantize(*cache, file, kvsnap::MlxRequantSpec{to, to, device, layout, 1}, out);
  return 0;
}
