#include "migrate/model_info.h"

#include "format/memory_shape.h"
#include "format/model_profile.h"
#include "format/rotation_rule.h"
#include "migrate/rope_head_dim.h"

namespace kvsnap {

std::optional<uint32_t> ModelInfo::rotation_block(bool is_v, size_t section, size_t layer) const {
  (void)layer;
  const auto& dims = is_v ? head_dim_v : head_dim_k;
  if (section >= dims.size()) return std::nullopt;
  const uint32_t all = shared_head_dim(dims[section]);
  return is_v ? v_rotation_block(all, layer0_head_dim_v) : k_rotation_block(all, layer0_head_dim_k);
}

uint32_t ModelInfo::rotation_head_dim(bool is_v, size_t section) const {
  const auto& dims = is_v ? head_dim_v : head_dim_k;
  if (section >= dims.size()) return 0;
  return kvsnap::rotation_head_dim(shared_head_dim(dims[section]), is_v ? layer0_head_dim_v : layer0_head_dim_k);
}

Status ModelInfo::check_state(const StateFile& f, const std::string& file_name) const {
  if (!f.arch.empty() && f.arch != arch) {
    return Status::Mismatch(file_name + ": wrong model arch: '" + f.arch + "' instead of '" + arch + "' (" + path +
                            "): pass the GGUF the file was saved with ({--model GGUF})");
  }
  if (n_vocab > 0) {
    for (size_t i = 0; i < f.tokens.tokens.size(); ++i) {
      const int32_t t = f.tokens.tokens[i];
      if (t < 0 || uint32_t(t) >= n_vocab) {
        // llama-server marks media positions with -1 (LLAMA_TOKEN_NULL).
        if (t == -1 && f.tokens.packed) continue;
        return Status::Mismatch(file_name + ": token " + std::to_string(i) + " is id " + std::to_string(t) +
                                ", outside the vocabulary of " + path + " (" + std::to_string(n_vocab) +
                                " tokens): the file was not made with this model; pass the GGUF it was saved with ({--model GGUF})");
      }
    }
  }
  return Status::OK();
}

Result<ModelInfo> load_model_info(Io& io, const std::string& path) {
  KV_ASSIGN_OR_RETURN(ModelProfile p, load_model_profile(io, path));
  auto laid_out = memory_sections(p);
  if (!laid_out.ok()) return laid_out.status().Prefixed(path);
  const std::vector<MemorySectionLayout>& sections = *laid_out;
  ModelInfo m;
  m.path = path;
  m.arch = p.arch;
  m.n_vocab = p.n_vocab;
  if (!p.layers.empty()) {
    m.layer0_head_dim_k = p.layers[0].head_dim_k;
    m.layer0_head_dim_v = p.layers[0].head_dim_v;
  }
  KV_ASSIGN_OR_RETURN(m.shape, memory_shape(p, path));
  for (const auto& s : sections) {
    if (s.kind == SectionKind::kRecurrent) continue;
    std::vector<uint32_t> hk, hv;
    for (const auto& L : s.layers) {
      hk.push_back(L.head_dim_k);
      hv.push_back(L.head_dim_v);
    }
    m.head_dim_k.push_back(std::move(hk));
    m.head_dim_v.push_back(std::move(hv));
  }
  nlohmann::ordered_json j;
  j["path"] = path;
  j["arch"] = p.arch;
  j["name"] = p.name;
  j["fingerprint"] = p.fingerprint;
  j["n_layer"] = p.n_layer;
  j["n_embd"] = p.n_embd;
  j["n_head"] = p.n_head;
  j["n_head_kv"] = p.n_head_kv;
  j["n_vocab"] = p.n_vocab;
  if (auto d = p.uniform_head_dim_k()) j["head_dim_k"] = *d;
  if (auto d = p.uniform_head_dim_v()) j["head_dim_v"] = *d;
  j["rope"] = rope_kind_name(p.rope);
  j["cell_ext_bytes"] = p.cell_ext_bytes;
  j["memory"] = memory_kind_name(p.memory);
  j["swa"] = swa_kind_name(p.swa);
  j["n_swa"] = p.n_swa;
  j["inferred"] = p.inferred;
  j["notes"] = p.notes;
  m.summary = std::move(j);
  m.profile = std::move(p);
  return m;
}

Status check_model_head_dim(const ReadableFile& file, const StateFile& state, const ModelInfo& model) {
  auto claim = model_head_dim_claim(model.profile, model.path);
  if (!claim) return Status::OK();
  KV_ASSIGN_OR_RETURN(HeadDimEvidence e, check_head_dim(file, state, *claim));
  return head_dim_status(e, *claim, file.name());
}

Result<StateFile> parse_for_model(const ReadableFile& file, ParseOptions opts, const ModelInfo* model,
                                  HeadDimCheck check) {
  if (!model) return parse_state(file, opts);
  opts.shape = &model->shape;
  auto with = parse_state(file, opts);
  if (with.ok()) {
    KV_RETURN_IF_ERROR(model->check_state(*with, file.name()));
    // Same layout, same vocabulary, yet another model: its head dim is what the rotation
    // follows, so the data is asked (migrate/rope_head_dim.h).
    if (check == HeadDimCheck::kNow) KV_RETURN_IF_ERROR(check_model_head_dim(file, *with, *model));
    return with;
  }
  if (with.status().code() == Code::kMismatch) return with;
  opts.shape = nullptr;
  auto alone = parse_state(file, opts);
  if (!alone.ok()) return with.status();
  return Status::Mismatch(file.name() + " does not fit the layout of " + model->path + " (" + model->arch +
                          "): " + with.status().message() + "; read without the model it is " + alone->reading);
}

}  // namespace kvsnap
