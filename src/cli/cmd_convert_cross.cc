// kvsnap convert --to mlx|llama: a session moved between llama.cpp and mlx-lm
// (migrate/cross_engine.h). Each direction takes the options of its target engine and refuses the
// others, naming them.

#include <chrono>
#include <cstdio>

#include "base/json.h"
#include "base/json_access.h"
#include "base/remedy.h"
#include "cli/commands.h"
#include "cli/open_state.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/convert_state.h"
#include "migrate/cross_engine.h"
#include "migrate/source_rotation.h"

namespace kvsnap::cli {
namespace {

using json = nlohmann::ordered_json;

constexpr uint64_t kMaxTokenFile = 64ull << 20;

// Flags given that the chosen direction has no use for.
std::string unused_options(const ConvertOptions& o, bool to_mlx) {
  std::string given;
  auto note = [&](bool set, const char* flag) {
    if (set) given += (given.empty() ? "" : ", ") + std::string(flag);
  };
  if (to_mlx) {
    note(!o.ctk.empty() || !o.ctv.empty(), "--ctk/--ctv");
    note(!o.flash_attn.empty(), "--flash-attn");
    note(!o.dst_rotation.empty(), "--dst-rotation");
    note(!o.target_build.empty(), "--target-build");
    note(!o.format.empty(), "--format");
    note(!o.tokens.empty(), "--tokens");
    note(!o.llama_file.empty(), "--llama-file");
    note(!o.requant.empty(), "--requant");
    note(o.mlx_device != "cpu", "--mlx-device gpu (the move quantizes as mlx-lm's CPU does)");
  } else {
    note(!o.kv_bits.empty() || o.kv_group_size, "--kv-bits/--kv-group-size");
    note(!o.mlx_lm.empty(), "--mlx-lm");
    note(!o.mlx_dtype.empty(), "--mlx-dtype");
    note(!o.src_rotation.empty() || !o.source_build.empty(), "--src-rotation/--source-build");
    note(!o.input_format.empty() || !o.src_types.empty(), "--input-format/--src-types");
    note(!o.requant.empty(), "--requant");
    note(o.mlx_device != "cpu", "--mlx-device");
  }
  note(o.head_dim_k || o.head_dim_v, "--head-dim-k/--head-dim-v (the model gives them)");
  note(to_mlx && o.kv_streams, "--kv-streams");
  return given;
}

Result<MlxKvSetting> mlx_setting_of(const ConvertOptions& o) {
  MlxKvSetting s;
  if (o.kv_bits.empty() || o.kv_bits == "none" || o.kv_bits == "float") {
    if (o.kv_group_size) return Status::InvalidArgument("--kv-group-size needs --kv-bits 2|3|4|5|6|8");
    return s;
  }
  try {
    size_t used = 0;
    s.bits = std::stoi(o.kv_bits, &used);
    if (used != o.kv_bits.size()) throw std::invalid_argument("");
  } catch (...) {
    return Status::InvalidArgument("--kv-bits '" + o.kv_bits + "': give 2, 3, 4, 5, 6, 8, or none (float)");
  }
  s.group_size = o.kv_group_size ? o.kv_group_size : 64;
  KV_RETURN_IF_ERROR(mlx_affine_check(s.bits, s.group_size));
  return s;
}

Result<std::string> mlx_dtype_of(const std::string& word) {
  if (word.empty()) return std::string();
  if (word == "f16" || word == "float16") return std::string("F16");
  if (word == "bf16" || word == "bfloat16") return std::string("BF16");
  if (word == "f32" || word == "float32") return std::string("F32");
  return Status::InvalidArgument("--mlx-dtype '" + word + "': give f16, bf16 or f32");
}

// --llama-file slot|session, else the kind of the format --format names, else a slot file.
Result<StateKind> llama_file_of(const ConvertOptions& o) {
  std::optional<StateKind> by_format;
  if (!o.format.empty()) {
    KV_ASSIGN_OR_RETURN(const TargetFormat f, parse_target_format(o.format));
    by_format = target_format_row(f).kind;
  }
  if (o.llama_file.empty()) return by_format.value_or(StateKind::kSeqFile);
  StateKind kind;
  if (o.llama_file == "slot") {
    kind = StateKind::kSeqFile;
  } else if (o.llama_file == "session") {
    kind = StateKind::kSessionFile;
  } else {
    return Status::InvalidArgument("--llama-file '" + o.llama_file +
                                   "': give slot (llama_state_seq_load_file, llama-server slots) or session "
                                   "(llama_state_load_file)");
  }
  if (by_format && *by_format != kind) {
    return Status::InvalidArgument("--format " + o.format + " is a " + kind_name(*by_format) + ", not a " +
                                   o.llama_file + " file: give one of them");
  }
  return kind;
}

Status render(const ConvertOptions& o, const CrossEngineResult& r, double secs, std::string& out) {
  if (o.json) {
    json j;
    j["input"] = o.in;
    j["output"] = o.out;
    j["from"] = r.from;
    j["to"] = r.to;
    j["tokens"] = r.n_tokens;
    j["layers"] = r.n_layers;
    j["k_permuted"] = r.k_order.permuted;
    j["k_order"] = r.k_order.why;
    j["bytes_out"] = r.bytes_out;
    j["seconds"] = secs;
    j["source_rotation"] = source_rotation_json(r.rotation);
    json notes = json::array();
    for (const std::string& n : r.notes) notes.push_back(render_remedies_as_flags(n));
    j["notes"] = notes;
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%u tokens, %u layers, %llu bytes, %.3f s\n", r.n_tokens, r.n_layers,
                (unsigned long long)r.bytes_out, secs);
  out = o.in + ": " + r.from + "\n  -> " + o.out + ": " + r.to + "\n  " + buf + "  K order: " + r.k_order.why + "\n";
  if (o.report && r.rotation.matters) out += source_rotation_text(r.rotation);
  for (const std::string& n : r.notes) out += "  note: " + render_remedies_as_flags(n) + "\n";
  return Status::OK();
}

}  // namespace

Status run_convert_cross(const ConvertOptions& o, std::string& out) {
  Io& io = cli_io();
  const bool to_mlx = o.to == "mlx" || o.to == "mlx-lm";
  if (!to_mlx && o.to != "llama" && o.to != "llama.cpp") {
    return Status::InvalidArgument("--to '" + o.to + "': give mlx (an mlx-lm prompt cache) or llama (a llama.cpp slot or "
                                   "session file)");
  }
  if (o.model.empty()) {
    return Status::InvalidArgument(o.in + ": --to " + o.to + " needs --model M.gguf: the model both engines run "
                                   "(its layers, heads and rope decide the move)");
  }
  if (const std::string given = unused_options(o, to_mlx); !given.empty()) {
    return Status::InvalidArgument(o.in + ": --to " + o.to + " does not take " + given);
  }
  KV_ASSIGN_OR_RETURN(auto in_file, io.open_read(o.in));
  const bool in_is_mlx = looks_like_mlx_prompt_cache(*in_file);
  if (to_mlx == in_is_mlx) {
    return Status::InvalidArgument(o.in + ": already " + (in_is_mlx ? "an mlx-lm prompt cache" : "a llama.cpp state file") +
                                   "; --to " + o.to + " moves the other engine's files");
  }
  const auto t0 = std::chrono::steady_clock::now();
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(io, o.out));
  CrossEngineResult res;
  if (to_mlx) {
    KV_ASSIGN_OR_RETURN(OpenedState opened, open_state(io, o.in, o.model, o.input_format, o.src_types, o.source_build));
    LlamaToMlxSpec spec;
    spec.claims.rotation = o.rotation;
    spec.claims.src_rotation = o.src_rotation;
    spec.claims.source_build = o.source_build;
    spec.claims.threads = o.threads;
    KV_ASSIGN_OR_RETURN(spec.quant, mlx_setting_of(o));
    KV_ASSIGN_OR_RETURN(spec.dtype, mlx_dtype_of(o.mlx_dtype));
    if (!o.mlx_lm.empty()) {
      KV_ASSIGN_OR_RETURN(const MlxTarget target, mlx_target_for(o.mlx_lm));
      if (!spec.quant.is_float()) KV_RETURN_IF_ERROR(check_release_loads_quantized_kv(target).Prefixed(o.in));
      spec.layout = target.layout;
    }
    KV_ASSIGN_OR_RETURN(res, llama_to_mlx(opened.state, *opened.file, *opened.model, spec, *writer));
  } else {
    KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(*in_file));
    KV_ASSIGN_OR_RETURN(const ModelInfo model, load_model_info(io, o.model));
    MlxToLlamaSpec spec;
    spec.target.ctk = o.ctk;
    spec.target.ctv = o.ctv;
    spec.target.flash_attn = o.flash_attn;
    spec.target.rotation = o.rotation;
    spec.target.dst_rotation = o.dst_rotation;
    spec.target.target_build = o.target_build;
    spec.target.format = o.format;
    spec.target.threads = o.threads;
    spec.target.kv_streams = o.kv_streams;
    KV_ASSIGN_OR_RETURN(spec.file_kind, llama_file_of(o));
    if (!o.tokens.empty()) {
      KV_ASSIGN_OR_RETURN(const std::vector<std::byte> bytes, read_all(io, o.tokens, kMaxTokenFile));
      const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      KV_ASSIGN_OR_RETURN(spec.tokens, parse_token_list(text, o.tokens));
    }
    KV_ASSIGN_OR_RETURN(res, mlx_to_llama(cache, *in_file, model, spec, *writer));
  }
  KV_RETURN_IF_ERROR(writer->commit());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return render(o, res, secs, out);
}

}  // namespace kvsnap::cli
