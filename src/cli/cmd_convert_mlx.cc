// kvsnap convert on an mlx-lm prompt cache: requantize its K/V (migrate/mlx_requant.h) with
// mlx-lm's own flag names, --kv-bits and --kv-group-size; the llama.cpp options are refused.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "base/json_access.h"
#include "cli/commands.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"
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
  note(!o.source_build.empty() || !o.target_build.empty(), "--source-build/--target-build");
  note(o.head_dim_k || o.head_dim_v, "--head-dim-k/--head-dim-v");
  note(!o.input_format.empty(), "--input-format");
  note(!o.src_types.empty(), "--src-types");
  return given;
}

double finite_or(double v, double alt) { return std::isfinite(v) ? v : alt; }

std::string report_text(const MlxRequantResult& r) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-5s %-4s %-24s %12s %12s %9s\n", "layer", "side", "from->to", "rmse", "max|err|",
                "snr dB");
  out += buf;
  for (const MlxRequantSide& s : r.sides) {
    const std::string types = s.from + "->" + s.to;
    if (s.copied) {
      std::snprintf(buf, sizeof buf, "  %-5s %-4s %-24s %12s %12s %9s\n", s.layer.c_str(), s.is_v ? "V" : "K",
                    types.c_str(), "exact", "0", "inf");
    } else {
      std::snprintf(buf, sizeof buf, "  %-5s %-4s %-24s %12.3e %12.3e %9.2f\n", s.layer.c_str(), s.is_v ? "V" : "K",
                    types.c_str(), s.rmse, s.max_abs, finite_or(s.snr_db, 999.0));
    }
    out += buf;
  }
  return out;
}

}  // namespace

Status run_convert_mlx(const ConvertOptions& o, const ReadableFile& file, std::string& out) {
  if (const std::string given = llama_only_options(o); !given.empty()) {
    return Status::InvalidArgument(o.in + ": an mlx-lm prompt cache, but llama.cpp options were given (" + given +
                                   "); for mlx-lm give --kv-bits B [--kv-group-size G]");
  }
  if (o.kv_bits.empty() && !o.kv_group_size) {
    return Status::InvalidArgument(o.in + ": an mlx-lm prompt cache: nothing to do; give --kv-bits 2|3|4|5|6|8 "
                                   "[--kv-group-size 32|64|128] to quantize its K/V, or --kv-bits none to dequantize");
  }
  KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(file));
  KV_ASSIGN_OR_RETURN(const MlxKvSetting to, mlx_kv_target(cache, o.kv_bits, o.kv_group_size, o.in));
  KV_ASSIGN_OR_RETURN(const MlxDevice device, mlx_device_of(o.mlx_device));
  MlxRequantSpec spec{to, to, device, std::nullopt, unsigned(std::max(o.threads, 0))};
  if (!o.mlx_lm.empty()) {
    KV_ASSIGN_OR_RETURN(spec.layout, mlx_layout_for(o.mlx_lm));
  }
  const auto t0 = std::chrono::steady_clock::now();
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(cli_io(), o.out));
  Result<MlxRequantResult> requantized = [&] {
    ProgressDisplay shown("convert " + o.in, Counted::kRead, file.size(), o.progress.mode(o.json));
    return mlx_requantize(cache, file, spec, *writer);
  }();
  KV_ASSIGN_OR_RETURN(const MlxRequantResult res, std::move(requantized));
  KV_RETURN_IF_ERROR(writer->commit());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (o.json) {
    json j;
    j["input"] = o.in;
    j["output"] = o.out;
    j["engine"] = "mlx-lm";
    j["layout"] = mlx_layout_name(cache.layout);
    j["bytes_in"] = res.bytes_in;
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
                        {"snr_db", finite_or(s.snr_db, 999.0)}, {"signal_rms", s.signal_rms}});
    }
    j["layers"] = layers;
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s: mlx-lm prompt cache (%s), %zu layers, %llu bytes\n  -> %s: K/V %s (%s), "
                "%d layers converted, %llu bytes, %.3f s\n",
                o.in.c_str(), mlx_layout_name(cache.layout), cache.layers.size(), (unsigned long long)res.bytes_in,
                o.out.c_str(), to.name().c_str(),
                to.is_float() ? "mx.dequantize" : device == MlxDevice::kCpu ? "mx.quantize, CPU" : "mx.quantize, GPU",
                res.layers_converted, (unsigned long long)res.bytes_out, secs);
  out = buf;
  for (const std::string& n : res.notes) out += "  note: " + n + "\n";
  if (o.report) out += report_text(res);
  return Status::OK();
}

}  // namespace kvsnap::cli
