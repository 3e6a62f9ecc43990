#include "migrate/conversion_spec.h"

#include <algorithm>
#include <thread>

#include "format/ggml_types.h"

namespace kvsnap {

namespace {

Result<RotationMode> parse_mode(const std::string& s, const char* flag) {
  if (s.empty() || s == "auto") return RotationMode::kAuto;
  if (s == "on") return RotationMode::kOn;
  if (s == "off") return RotationMode::kOff;
  return Status::InvalidArgument(std::string(flag) + " must be auto, on or off, not '" + s + "'");
}

Result<std::optional<int32_t>> optional_type(const std::string& s, const char* flag) {
  if (s.empty()) return std::optional<int32_t>();
  KV_ASSIGN_OR_RETURN(int32_t id, parse_kv_type(s, flag));
  return std::optional<int32_t>(id);
}

Status set_geometry(const ConversionSpec& spec, const StateFile& src, const ModelInfo* model, ConvertRequest& req) {
  if (model) {
    for (size_t s = 0; s < model->head_dim_k.size(); ++s) {
      req.geometry.k_head_dim.push_back(model->rotation_head_dim(false, s));
      req.geometry.v_head_dim.push_back(model->rotation_head_dim(true, s));
    }
  }
  if (spec.head_dim_k > 0 || spec.head_dim_v > 0) {
    if (model) return Status::InvalidArgument("--head-dim-k/--head-dim-v and --model both given; the model decides");
    req.geometry.k_head_dim.assign(src.memory.kv.size(), uint32_t(std::max(0, spec.head_dim_k)));
    req.geometry.v_head_dim.assign(src.memory.kv.size(), uint32_t(std::max(0, spec.head_dim_v)));
  } else if (!model && spec.geometry) {
    req.geometry = *spec.geometry;
  }
  return Status::OK();
}

// An old file upgraded to the v0.5.0 format: v3 adds a cell extra for M-RoPE
// models that the old file does not have.
Status check_upgrade(const StateFile& src, const ModelInfo* model, const ConvertRequest& req,
                     const std::string& src_name, std::string* warnings) {
  const bool src_old = (src.kind == StateKind::kSeqFile && src.version < 3) ||
                       (src.kind == StateKind::kSessionFile && src.version < 10);
  if (!src_old) return Status::OK();
  if (model && model->shape.ext_bytes.value_or(0) != 0) {
    return Status::NotSupported(src_name + ": " + model->arch +
                                " stores an M-RoPE cell extra in v0.5.0 files that older files lack; kvsnap "
                                "cannot rebuild it: keep the old format (--format ggsq-v2)");
  }
  if (!model && req.format == TargetFormat::kSameKindCurrent && warnings) {
    *warnings += "note: upgrading " + src_name +
                 " to the v0.5.0 format assumes the model has no M-RoPE cell extra (true for text-only models); "
                 "pass --model GGUF to check\n";
  }
  return Status::OK();
}

}  // namespace

Result<int32_t> parse_kv_type(const std::string& name, const std::string& flag) {
  const TypeLayout* t = find_type(name);
  if (!t) {
    std::string names;
    for (const auto& x : kv_cache_types()) names += (names.empty() ? "" : " ") + std::string(x.name);
    return Status::InvalidArgument(flag + " '" + name + "' is not a KV cache type (" + names + ")");
  }
  return int32_t(t->id);
}

Result<ConvertRequest> make_request(const ConversionSpec& spec, const StateFile& src, const ModelInfo* model,
                                    const std::string& src_name, std::string* warnings) {
  ConvertRequest req;
  KV_ASSIGN_OR_RETURN(req.k_type, optional_type(spec.ctk, "--ctk"));
  KV_ASSIGN_OR_RETURN(req.v_type, optional_type(spec.ctv, "--ctv"));
  if (!spec.flash_attn.empty()) {
    if (spec.flash_attn != "on" && spec.flash_attn != "off")
      return Status::InvalidArgument("--flash-attn must be on or off, not '" + spec.flash_attn + "'");
    req.flash_attn = spec.flash_attn == "on";
  }
  KV_RETURN_IF_ERROR(parse_mode(spec.rotation, "--rotation").status());
  KV_ASSIGN_OR_RETURN(RotationMode src_mode,
                      parse_mode(spec.src_rotation.empty() ? spec.rotation : spec.src_rotation, "--src-rotation"));
  KV_ASSIGN_OR_RETURN(RotationMode dst_mode,
                      parse_mode(spec.dst_rotation.empty() ? spec.rotation : spec.dst_rotation, "--dst-rotation"));
  req.k_rotation = req.v_rotation = RotationOverride{src_mode, dst_mode};
  KV_ASSIGN_OR_RETURN(req.format, parse_target_format(spec.format));
  req.threads = spec.threads > 0 ? uint32_t(spec.threads) : std::max(1u, std::thread::hardware_concurrency());
  req.report = spec.report;
  KV_RETURN_IF_ERROR(set_geometry(spec, src, model, req));
  KV_RETURN_IF_ERROR(check_upgrade(src, model, req, src_name, warnings));
  return req;
}

}  // namespace kvsnap
