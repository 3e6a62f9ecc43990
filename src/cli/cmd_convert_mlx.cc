// kvsnap convert on an mlx-lm prompt cache: requantize its K/V (migrate/mlx_requant.h) with
// mlx-lm's own flag names, --kv-bits and --kv-group-size, and/or move it to the file layout of the
// mlx-lm release named by --mlx-lm (format/mlx_layout.h); the llama.cpp options are refused.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "base/json.h"
#include "base/json_access.h"
#include "base/printf_text.h"
#include "cli/commands.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/mlx_convert.h"
#include "migrate/mlx_kv_target.h"
#include "migrate/mlx_requant.h"

namespace kvsnap::cli {
namespace {

using json = nlohmann::ordered_json;

// Options of the llama.cpp path the mlx-lm path has no use for.
std::string llama_only_options(const ConvertOptions& o) {
  std::string given;
  auto note = [&](bool set, const char* flag) {
    if (set) given += (given.empty() ? "" : ", ") + std::string(flag);
  };
  note(!o.ctk.empty(), "--ctk");
  note(!o.ctv.empty(), "--ctv");
  note(!o.model.empty(), "--model");
  note(!o.flash_attn.empty(), "--flash-attn");
  note(!o.rotation.empty() || !o.src_rotation.empty() || !o.dst_rotation.empty(), "--rotation/--src-rotation/--dst-rotation");
  note(!o.format.empty(), "--format");
  note(!o.requant.empty(), "--requant");
  note(!o.source_build.empty() || !o.target_build.empty(), "--source-build/--target-build");
  note(o.head_dim_k || o.head_dim_v, "--head-dim-k/--head-dim-v");
  note(o.kv_streams, "--kv-streams");
  note(!o.input_format.empty(), "--input-format");
  note(!o.src_types.empty(), "--src-types");
  return given;
}

std::string report_text(const MlxRequantResult& r) {
  std::string out;
  std::string buf;
  buf = printf_text("  %-5s %-4s %-24s %12s %12s %9s\n", "layer", "side", "from->to", "rmse", "max|err|",
                "snr dB");
  out += buf;
  for (const MlxRequantSide& s : r.sides) {
    const std::string types = s.from + "->" + s.to;
    if (s.copied) {
      buf = printf_text("  %-5s %-4s %-24s %12s %12s %9s\n", s.layer.c_str(), s.is_v ? "V" : "K",
                    types.c_str(), "exact", "0", "inf");
    } else {
      buf = printf_text("  %-5s %-4s %-24s %12.3e %12.3e %9.2f\n", s.layer.c_str(), s.is_v ? "V" : "K",
                    types.c_str(), s.rmse, s.max_abs, shown_snr_db(s.snr_db));
    }
    out += buf;
  }
  return out;
}

// The start of convert's --json on an mlx-lm file.
json json_head(const ConvertOptions& o) {
  json j;
  j["input"] = o.in;
  j["output"] = o.out;
  j["engine"] = "mlx-lm";
  return j;
}

// --mlx-lm without --kv-bits: the file moved to that release's layout, tensors carried.
void render_move(const ConvertOptions& o, const MlxPromptCache& cache, const MlxTarget& to, const MlxConvertResult& r,
                 double secs, std::string& out) {
  const std::vector<std::string>& classes = r.classes_out;
  if (o.json) {
    json j = json_head(o);
    j["layout_from"] = mlx_layout_name(cache.layout);
    j["written_by"] = cache.version_guess;
    j["layout_to"] = mlx_layout_name(to.layout);
    j["target"] = to.name();
    j["bytes_in"] = cache.st.file_size;
    j["bytes_out"] = r.bytes_out;
    j["seconds"] = secs;
    json layers = json::array();
    for (size_t i = 0; i < classes.size(); ++i) {
      layers.push_back({{"layer", cache.layers[i].prefix}, {"class_from", cache.layers[i].cls}, {"class_to", classes[i]}});
    }
    j["layers"] = layers;
    out = json_text(j, 2) + "\n";
    return;
  }
  out = printf_text("%s: mlx-lm prompt cache (%s layout, %s), %zu layers, %llu bytes\n  -> %s: %s layout "
                    "for %s, %llu bytes, tensors carried, %.3f s\n",
                    o.in.c_str(), mlx_layout_name(cache.layout), cache.version_guess.c_str(), cache.layers.size(),
                    (unsigned long long)cache.st.file_size, o.out.c_str(), mlx_layout_name(to.layout),
                    to.name().c_str(), (unsigned long long)r.bytes_out, secs);
  for (size_t i = 0; i < classes.size(); ++i) {
    if (classes[i] != cache.layers[i].cls) out += "  layer " + cache.layers[i].prefix + ": " + cache.layers[i].cls + " -> " + classes[i] + "\n";
  }
}

}  // namespace

Status run_convert_mlx(const ConvertOptions& o, const ReadableFile& file, std::string& out) {
  if (const std::string given = llama_only_options(o); !given.empty()) {
    return Status::InvalidArgument(o.in + ": an mlx-lm prompt cache, but llama.cpp options were given (" + given +
                                   "); for mlx-lm give --kv-bits B [--kv-group-size G] and/or --mlx-lm VERSION");
  }
  const bool requant = !o.kv_bits.empty() || o.kv_group_size;
  if (!requant && o.mlx_lm.empty()) {
    return Status::InvalidArgument(o.in + ": an mlx-lm prompt cache: nothing to do; give --kv-bits 2|3|4|5|6|8 "
                                   "[--kv-group-size 32|64|128] to quantize its K/V, --kv-bits none to dequantize, or "
                                   "--mlx-lm VERSION to move it to the file layout of that mlx-lm release");
  }
  std::optional<MlxTarget> target;
  if (!o.mlx_lm.empty()) {
    KV_ASSIGN_OR_RETURN(target, mlx_target_for(o.mlx_lm));
  }
  KV_ASSIGN_OR_RETURN(const MlxPromptCache read, read_mlx_prompt_cache(file));
  MlxConvertRequest req;
  req.kv_bits = o.kv_bits;
  req.kv_group_size = o.kv_group_size;
  req.target = target;
  KV_ASSIGN_OR_RETURN(req.device, mlx_device_of(o.mlx_device));
  req.threads = unsigned(std::max(o.threads, 0));
  req.what = o.in;
  // A move the requantizer cannot do in place goes to a temporary next to the output.
  req.scratch_path = temp_path_beside(o.out);
  const auto t0 = std::chrono::steady_clock::now();
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(cli_io(), o.out));
  Result<MlxConvertResult> converted = [&] {
    ProgressDisplay shown("convert " + o.in, Counted::kRead, file.size(), o.progress.mode(o.json));
    return shown.finish(mlx_convert(cli_io(), read, file, req, *writer));
  }();
  KV_ASSIGN_OR_RETURN(const MlxConvertResult conv, std::move(converted));
  KV_RETURN_IF_ERROR(writer->commit());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!conv.requant) {
    render_move(o, read, *target, conv, secs, out);
    return Status::OK();
  }
  const MlxRequantResult& res = *conv.requant;
  const MlxKvSetting& to = *conv.to;
  const MlxDevice device = req.device;
  if (o.json) {
    json j = json_head(o);
    j["layout"] = mlx_layout_name(conv.layout_out);
    j["layout_from"] = mlx_layout_name(read.layout);
    if (target) j["target_release"] = target->name();
    j["bytes_in"] = read.st.file_size;
    j["bytes_out"] = res.bytes_out;
    j["seconds"] = secs;
    j["target"] = {{"kv_bits", to.bits ? json(to.bits) : json(nullptr)},
                   {"kv_group_size", to.bits ? json(to.group_size) : json(nullptr)},
                   {"device", mlx_device_name(device)}};
    j["layers_converted"] = res.layers_converted;
    j["notes"] = res.notes;
    json layers = json::array();
    for (const MlxRequantSide& s : res.sides) {
      layers.push_back({{"layer", s.layer}, {"side", s.is_v ? "V" : "K"}, {"class_from", s.cls_from},
                        {"class_to", s.cls_to}, {"from", s.from}, {"to", s.to}, {"copied", s.copied},
                        {"values", s.values}, {"rmse", s.rmse}, {"max_abs", s.max_abs},
                        {"snr_db", shown_snr_db(s.snr_db)}, {"signal_rms", s.signal_rms}});
    }
    j["layers"] = layers;
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  std::string buf;
  const std::string dest =
      target ? std::string(", ") + mlx_layout_name(conv.layout_out) + " layout for " + target->name() : std::string();
  buf = printf_text("%s: mlx-lm prompt cache (%s), %zu layers, %llu bytes\n  -> %s: K/V %s (%s)%s, "
                "%d layers converted, %llu bytes, %.3f s\n",
                o.in.c_str(), mlx_layout_name(read.layout), read.layers.size(), (unsigned long long)read.st.file_size,
                o.out.c_str(), to.name().c_str(),
                to.is_float() ? "mx.dequantize" : device == MlxDevice::kCpu ? "mx.quantize, CPU" : "mx.quantize, GPU",
                dest.c_str(), res.layers_converted, (unsigned long long)res.bytes_out, secs);
  out = buf;
  for (const std::string& n : res.notes) out += "  note: " + n + "\n";
  if (o.report) out += report_text(res);
  return Status::OK();
}

}  // namespace kvsnap::cli
