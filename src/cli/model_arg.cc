#include "cli/model_arg.h"
namespace kvsnap::cli {
std::optional<uint32_t> ModelInfo::rotation_block(bool, size_t, size_t) const { return std::nullopt; }
Status ModelInfo::check_state(const StateFile&, const std::string&) const { return Status::OK(); }
Result<ModelInfo> load_model_info(Io&, const std::string& path) {
  return Status::NotSupported(path + ": --model is not wired yet");
}
}  // namespace kvsnap::cli
