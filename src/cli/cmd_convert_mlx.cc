// kvsnap convert on an mlx-lm prompt cache: requantize its K/V (migrate/mlx_requant.h) with
// mlx-lm's own flag names, --kv-bits and --kv-group-size, and/or move it to the file layout of the
// mlx-lm release named by --mlx-lm (format/mlx_layout.h); the llama.cpp options are refused.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "base/json_access.h"
#include "base/printf_text.h"
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
  note(!o.requant.empty(), "--requant");
  note(!o.source_build.empty() || !o.target_build.empty(), "--source-build/--target-build");
  note(o.head_dim_k || o.head_dim_v, "--head-dim-k/--head-dim-v");
  note(!o.input_format.empty(), "--input-format");
  note(!o.src_types.empty(), "--src-types");
  return given;
}

double finite_or(double v, double alt) { return std::isfinite(v) ? v : alt; }

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
                    types.c_str(), s.rmse, s.max_abs, finite_or(s.snr_db, 999.0));
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

// Does any layer (or CacheList member) satisfy `pred`?
template <class Pred>
bool any_layer(const std::vector<MlxLayer>& layers, const Pred& pred) {
  for (const MlxLayer& L : layers) {
    if (pred(L) || any_layer(L.sub, pred)) return true;
  }
  return false;
}

// Whether requantizing in place (the output keeps the input's layout, the one thing --mlx-lm may
// decide being `step` for a meta file that does not say) already gives a file `to` loads.
bool requant_alone_fits(const MlxPromptCache& c, const MlxTarget& to) {
  const bool meta_in = c.layout == MlxLayout::kMeta || c.layout == MlxLayout::kMetaStep;
  const bool same = to.layout == c.layout || (c.step_unknown && meta_in && to.layout != MlxLayout::kScalars);
  const bool renamed = any_layer(c.layers, [&](const MlxLayer& L) {
    return (L.cls == "MambaCache" && to.at_least(30, 6)) || (L.cls == "ArraysCache" && !to.at_least(28, 1));
  });
  return same && !renamed;
}

// Writes the moved file through `sink`; its size.
Result<uint64_t> write_moved(const MlxOutFile& plan, const MlxPromptCache& c, const ReadableFile& f, ByteSink& sink) {
  CountingSink counted;
  TeeSink tee(sink, counted);
  KV_RETURN_IF_ERROR(write_mlx_file(plan, c, f, tee));
  return counted.count;
}

// The layer classes of a moved file's metadata, in layer order.
std::vector<std::string> moved_classes(const MlxOutFile& plan, MlxLayout to, size_t n) {
  std::vector<std::string> out(n);
  const std::string p = to == MlxLayout::kScalars ? "1." : "2.";
  for (const auto& [k, v] : plan.metadata) {
    if (k.compare(0, 2, p) != 0) continue;
    char* end = nullptr;
    const unsigned long i = std::strtoul(k.c_str() + 2, &end, 10);
    if (*end == 0 && i < n) out[i] = v;
  }
  return out;
}

// --mlx-lm without --kv-bits: the file moved to that release's layout, tensors carried.
Status run_move_mlx(const ConvertOptions& o, const ReadableFile& file, const MlxPromptCache& cache, const MlxTarget& to,
                    std::string& out) {
  const auto t0 = std::chrono::steady_clock::now();
  KV_ASSIGN_OR_RETURN(const MlxOutFile plan, mlx_change_layout(cache, to));
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(cli_io(), o.out));
  KV_ASSIGN_OR_RETURN(const uint64_t bytes_out, write_moved(plan, cache, file, *writer));
  KV_RETURN_IF_ERROR(writer->commit());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<std::string> classes = moved_classes(plan, to.layout, cache.layers.size());
  if (o.json) {
    json j = json_head(o);
    j["layout_from"] = mlx_layout_name(cache.layout);
    j["written_by"] = cache.version_guess;
    j["layout_to"] = mlx_layout_name(to.layout);
    j["target"] = to.name();
    j["bytes_in"] = cache.st.file_size;
    j["bytes_out"] = bytes_out;
    j["seconds"] = secs;
    json layers = json::array();
    for (size_t i = 0; i < classes.size(); ++i) {
      layers.push_back({{"layer", cache.layers[i].prefix}, {"class_from", cache.layers[i].cls}, {"class_to", classes[i]}});
    }
    j["layers"] = layers;
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  std::string buf;
  buf = printf_text("%s: mlx-lm prompt cache (%s layout, %s), %zu layers, %llu bytes\n  -> %s: %s layout "
                "for %s, %llu bytes, tensors carried, %.3f s\n",
                o.in.c_str(), mlx_layout_name(cache.layout), cache.version_guess.c_str(), cache.layers.size(),
                (unsigned long long)cache.st.file_size, o.out.c_str(), mlx_layout_name(to.layout), to.name().c_str(),
                (unsigned long long)bytes_out, secs);
  out = buf;
  for (size_t i = 0; i < classes.size(); ++i) {
    if (classes[i] != cache.layers[i].cls) out += "  layer " + cache.layers[i].prefix + ": " + cache.layers[i].cls + " -> " + classes[i] + "\n";
  }
  return Status::OK();
}

// Deletes a temporary file when it goes out of scope.
struct RemoveOnExit {
  std::string path;
  ~RemoveOnExit() {
    if (!path.empty()) (void)cli_io().remove(path);
  }
};

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
  if (!requant) return run_move_mlx(o, file, read, *target, out);
  // Before anything is written: a release without QuantizedKVCache cannot load quantized K/V (the
  // move refuses a quantized layer of the input for it; the requantizer would make new ones).
  if (target && !target->at_least(19, 3)) {
    KV_ASSIGN_OR_RETURN(const MlxKvSetting wanted, mlx_kv_target(read, o.kv_bits, o.kv_group_size, o.in));
    if (!wanted.is_float()) KV_RETURN_IF_ERROR(check_release_loads_quantized_kv(*target).Prefixed(o.in));
  }
  // Requantize and move: every refusal of the move first, then (when requantizing in place is not
  // enough) the moved file goes to a temporary next to the output and is requantized from there.
  const MlxPromptCache* cache_ptr = &read;
  const ReadableFile* file_ptr = &file;
  RemoveOnExit tmp;
  std::unique_ptr<ReadableFile> moved_file;
  std::optional<MlxPromptCache> moved;
  if (target) {
    KV_ASSIGN_OR_RETURN(const MlxOutFile plan, mlx_change_layout(read, *target));
    if (!requant_alone_fits(read, *target)) {
      tmp.path = o.out + std::string(kTempInfix) + unique_suffix();
      {
        KV_ASSIGN_OR_RETURN(auto w, cli_io().open_write(tmp.path, true));
        KV_RETURN_IF_ERROR(write_moved(plan, read, file, *w).status());
        KV_RETURN_IF_ERROR(w->close());
      }
      KV_ASSIGN_OR_RETURN(moved_file, cli_io().open_read(tmp.path));
      KV_ASSIGN_OR_RETURN(moved, read_mlx_prompt_cache(*moved_file));
      cache_ptr = &*moved;
      file_ptr = moved_file.get();
    }
  }
  const MlxPromptCache& cache = *cache_ptr;
  KV_ASSIGN_OR_RETURN(const MlxKvSetting to, mlx_kv_target(cache, o.kv_bits, o.kv_group_size, o.in));
  KV_ASSIGN_OR_RETURN(const MlxDevice device, mlx_device_of(o.mlx_device));
  MlxRequantSpec spec{to, to, device, std::nullopt, unsigned(std::max(o.threads, 0))};
  if (target) spec.layout = target->layout;
  const auto t0 = std::chrono::steady_clock::now();
  KV_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(cli_io(), o.out));
  Result<MlxRequantResult> requantized = [&] {
    ProgressDisplay shown("convert " + o.in, Counted::kRead, file_ptr->size(), o.progress.mode(o.json));
    return mlx_requantize(cache, *file_ptr, spec, *writer);
  }();
  KV_ASSIGN_OR_RETURN(const MlxRequantResult res, std::move(requantized));
  KV_RETURN_IF_ERROR(writer->commit());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  if (o.json) {
    json j = json_head(o);
    j["layout"] = mlx_layout_name(cache.layout);
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
                        {"snr_db", finite_or(s.snr_db, 999.0)}, {"signal_rms", s.signal_rms}});
    }
    j["layers"] = layers;
    out = json_text(j, 2) + "\n";
    return Status::OK();
  }
  std::string buf;
  const std::string dest =
      target ? std::string(", ") + mlx_layout_name(cache.layout) + " layout for " + target->name() : std::string();
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
