// parse_state (format/llama_state.h) on any bytes. The first byte chooses how:
//   mode % 8 = 0: no options (the reader infers the kind and layout),
//   1..4: a raw llama_state_seq_get_data / llama_state_get_data buffer, era 3 or 2,
//   5..7: with the MemoryShape of one of fixtures/models/*.gguf (mode / 8 picks it); a file that
//         parses is then asked for that model's head dim (migrate/rope_head_dim.h).
// The rest of the input is the file.
#include <algorithm>
#include <filesystem>
#include <optional>

#include "format/llama_state.h"
#include "format/memory_shape.h"
#include "format/model_profile.h"
#include "fuzz/fuzz_input.h"
#include "migrate/rope_head_dim.h"

namespace {

struct Model {
  kvsnap::MemoryShape shape;
  std::optional<kvsnap::HeadDimClaim> claim;
};
std::vector<Model>& known_models() {
  static std::vector<Model> m;
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  std::vector<fs::path> models;
  for (const auto& e : fs::directory_iterator(fs::path(KVSNAP_SOURCE_DIR) / "fixtures/models")) models.push_back(e.path());
  std::sort(models.begin(), models.end());  // mode / 8 names the same model on every machine
  for (const auto& p : models) {
    auto profile = kvsnap::load_model_profile(kvsnap::posix_io(), p.string());
    if (!profile.ok()) continue;
    auto shape = kvsnap::memory_shape(*profile, p.filename().string());
    if (shape.ok()) known_models().push_back({std::move(shape).value(), kvsnap::model_head_dim_claim(*profile, p.string())});
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  kvsnap::MemoryFile file("fuzz.state", kvsnap::fuzz::bytes(data + 1, size - 1));
  kvsnap::ParseOptions o;
  const Model* model = nullptr;
  switch (mode % 8) {
    case 0: break;
    case 1: case 2:
      o.kind = kvsnap::StateKind::kRawSeq;
      o.raw_version = mode % 8 == 1 ? 3 : 2;
      break;
    case 3: case 4:
      o.kind = kvsnap::StateKind::kRawContext;
      o.raw_version = mode % 8 == 3 ? 3 : 2;
      break;
    default:
      if (!known_models().empty()) {
        model = &known_models()[(mode / 8) % known_models().size()];
        o.shape = &model->shape;
      }
  }
  auto state = kvsnap::parse_state(file, o);
  if (state.ok() && model && model->claim) (void)kvsnap::check_head_dim(file, *state, *model->claim);
  return 0;
}
