#include "migrate/mlx_convert.h"

#include <cstdlib>
#include <memory>

#include "migrate/mlx_kv_target.h"

namespace kvsnap {
namespace {

// Does any layer (or CacheList member) satisfy `pred`?
template <class Pred>
bool any_layer(const std::vector<MlxLayer>& layers, const Pred& pred) {
  for (const MlxLayer& L : layers) {
    if (pred(L) || any_layer(L.sub, pred)) return true;
  }
  return false;
}

// Whether requantizing in place (the output keeps the input's layout, the one thing the target may
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

// The scratch file of a move, removed when it goes out of scope.
struct Scratch {
  Io& io;
  std::string path;
  ~Scratch() {
    if (!path.empty()) (void)io.remove(path);
  }
};

}  // namespace

Result<MlxConvertResult> mlx_convert(Io& io, const MlxPromptCache& in, const ReadableFile& file,
                                     const MlxConvertRequest& req, ByteSink& out) {
  MlxConvertResult r;
  r.layout_from = in.layout;
  if (!req.requantizes()) {
    if (!req.target) {
      return Status::InvalidArgument(req.what + ": an mlx-lm prompt cache: nothing to do; give {--kv-bits} B, "
                                     "{--kv-group-size} G and/or {--mlx-lm} VERSION");
    }
    KV_ASSIGN_OR_RETURN(const MlxOutFile plan, mlx_change_layout(in, *req.target));
    KV_ASSIGN_OR_RETURN(r.bytes_out, write_moved(plan, in, file, out));
    r.layout_out = req.target->layout;
    r.classes_out = moved_classes(plan, req.target->layout, in.layers.size());
    return r;
  }
  // Before anything is written: a release without QuantizedKVCache cannot load quantized K/V (the
  // move refuses a quantized layer of the input for it; the requantizer would make new ones).
  if (req.target && !req.target->at_least(19, 3)) {
    KV_ASSIGN_OR_RETURN(const MlxKvSetting wanted, mlx_kv_target(in, req.kv_bits, req.kv_group_size, req.what));
    if (!wanted.is_float()) KV_RETURN_IF_ERROR(check_release_loads_quantized_kv(*req.target).Prefixed(req.what));
  }
  // Every refusal of the move first; then, when requantizing in place is not enough, the moved
  // file goes to the scratch file and is requantized from there.
  const MlxPromptCache* cache = &in;
  const ReadableFile* src = &file;
  Scratch scratch{io, ""};
  std::unique_ptr<ReadableFile> moved_file;
  std::optional<MlxPromptCache> moved;
  if (req.target) {
    KV_ASSIGN_OR_RETURN(const MlxOutFile plan, mlx_change_layout(in, *req.target));
    if (!requant_alone_fits(in, *req.target)) {
      if (req.scratch_path.empty()) return Status::InvalidArgument(req.what + ": moving the file needs a scratch path");
      scratch.path = req.scratch_path;
      {
        KV_ASSIGN_OR_RETURN(auto w, io.open_write(scratch.path, true));
        KV_RETURN_IF_ERROR(write_moved(plan, in, file, *w).status());
        KV_RETURN_IF_ERROR(w->close());
      }
      KV_ASSIGN_OR_RETURN(moved_file, io.open_read(scratch.path));
      KV_ASSIGN_OR_RETURN(moved, read_mlx_prompt_cache(*moved_file));
      cache = &*moved;
      src = moved_file.get();
    }
  }
  KV_ASSIGN_OR_RETURN(const MlxKvSetting to, mlx_kv_target(*cache, req.kv_bits, req.kv_group_size, req.what));
  MlxRequantSpec spec{to, to, req.device, std::nullopt, req.threads};
  if (req.target) spec.layout = req.target->layout;
  KV_ASSIGN_OR_RETURN(MlxRequantResult res, mlx_requantize(*cache, *src, spec, out));
  r.layout_out = spec.layout.value_or(cache->layout);  // what mlx_requantize wrote, not what it read
  r.to = to;
  r.bytes_out = res.bytes_out;
  r.requant = std::move(res);
  return r;
}

}  // namespace kvsnap
