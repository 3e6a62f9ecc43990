#include "migrate/fp_strict.h"  // first: the error statistics dequantize as MLX does, no FMA

#include "migrate/mlx_requant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "base/byte_order.h"
#include "base/parallel.h"
#include "format/mlx_layout.h"

namespace kvsnap {
namespace {

// mlx-lm's caches grow in 256-row steps; the meta_state of mlx-lm 0.19.3 .. 0.28.0 records it.
constexpr int64_t kMlxStep = 256;
constexpr uint64_t kChunkBytes = 4 << 20;
constexpr uint64_t kBlockRows = 64;  // rows per parallel work item

enum class Part { kValues, kCodes, kScales, kBiases };

struct Stats {
  uint64_t n = 0;
  double sq_err = 0, sq_sig = 0, max_abs = 0;
  void add(const float* ref, const float* got, int64_t d) {
    for (int64_t i = 0; i < d; ++i) {
      const double e = double(got[i]) - double(ref[i]);
      sq_err += e * e;
      sq_sig += double(ref[i]) * double(ref[i]);
      max_abs = std::max(max_abs, std::fabs(e));
    }
    n += uint64_t(d);
  }
  void merge(const Stats& o) {
    n += o.n;
    sq_err += o.sq_err;
    sq_sig += o.sq_sig;
    max_abs = std::max(max_abs, o.max_abs);
  }
  void finish(MlxRequantSide& r) const {
    r.values = n;
    r.rmse = n ? std::sqrt(sq_err / double(n)) : 0;
    r.signal_rms = n ? std::sqrt(sq_sig / double(n)) : 0;
    r.max_abs = max_abs;
    r.snr_db = sq_err > 0 ? 10.0 * std::log10(sq_sig / sq_err) : std::numeric_limits<double>::infinity();
  }
};

// One side (K or V) of one layer to convert, and where its report goes.
struct SideJob {
  const Safetensors* st = nullptr;
  const ReadableFile* f = nullptr;
  const MlxKvSide* in = nullptr;
  MlxKvSetting from, to;
  MlxFloat t = MlxFloat::kBF16;
  MlxDevice device = MlxDevice::kCpu;
  int64_t offset = 0;               // rows per sequence the statistics count
  MlxRequantSide* report = nullptr;
  size_t threads = 1;
};

Status read_rows(const SideJob& j, const SafetensorsTensor& t, uint64_t row_bytes, uint64_t r0, uint64_t n,
                 std::vector<std::byte>& buf) {
  buf.resize(n * row_bytes);
  return j.f->read_at(j.st->data_start() + t.begin + r0 * row_bytes, buf);
}

void load_floats(MlxFloat t, const std::byte* p, int64_t n, float* out) { mlx_load_floats(t, p, size_t(n), out); }

// One worker's row buffers.
struct Scratch {
  std::vector<float> x, y, fs, fb, qs, qb;
  std::vector<std::byte> codes;
};

// Converts one row: its input (float, or codes + scales + biases) into the output part `o`, and
// adds it to `acc` when it counts.
void convert_row(const SideJob& j, Part part, const std::byte* in, const std::byte* sc, const std::byte* bi,
                 std::byte* o, bool counted, Scratch& w, Stats& acc) {
  const int64_t d = j.in->head_dim;
  if (j.from.is_float()) {
    load_floats(j.t, in, d, w.x.data());
  } else {
    load_floats(j.t, sc, int64_t(w.fs.size()), w.fs.data());
    load_floats(j.t, bi, int64_t(w.fb.size()), w.fb.data());
    mlx_affine_dequantize_row(in, w.fs.data(), w.fb.data(), d, j.from.bits, j.from.group_size, j.t, w.x.data());
  }
  if (part == Part::kValues) {
    mlx_store_floats(j.t, w.x.data(), size_t(d), o);
    if (counted) acc.add(w.x.data(), w.x.data(), d);  // the stored values are the dequantized ones
    return;
  }
  mlx_affine_quantize_row(w.x.data(), d, j.to.bits, j.to.group_size, j.device, w.codes.data(), w.qs.data(),
                          w.qb.data());
  const size_t groups = w.qs.size();
  if (part == Part::kCodes) std::memcpy(o, w.codes.data(), w.codes.size());
  if (part == Part::kScales || part == Part::kBiases) {
    const std::vector<float>& sb = part == Part::kScales ? w.qs : w.qb;
    mlx_store_floats(j.t, sb.data(), groups, o);
  }
  if (counted) {  // what mlx-lm computes with: the codes and the scales/biases rounded to T
    for (size_t g = 0; g < groups; ++g) w.qs[g] = mlx_round_to(j.t, w.qs[g]);
    for (size_t g = 0; g < groups; ++g) w.qb[g] = mlx_round_to(j.t, w.qb[g]);
    mlx_affine_dequantize_row(w.codes.data(), w.qs.data(), w.qb.data(), d, j.to.bits, j.to.group_size, j.t,
                              w.y.data());
    acc.add(w.x.data(), w.y.data(), d);
  }
}

// Writes one part of the converted side: its float values (to float), or its codes, scales or
// biases (to quantized), a chunk of rows at a time, the rows of a chunk on `threads` workers in
// blocks whose statistics are summed in block order (the report does not depend on the threads).
// The values/codes pass fills the report.
Status run_side(const SideJob& j, Part part, ByteSink& out) {
  const MlxKvSide& s = *j.in;
  const int64_t d = s.head_dim;
  const uint64_t rows = uint64_t(s.batch) * uint64_t(s.heads) * uint64_t(s.rows);
  if (rows == 0 || d == 0) return Status::OK();
  const size_t ts = mlx_float_size(j.t);
  const size_t g_in = j.from.is_float() ? 0 : size_t(d / j.from.group_size);
  const size_t g_out = j.to.is_float() ? 0 : size_t(d / j.to.group_size);
  const uint64_t in_row = j.from.is_float() ? uint64_t(d) * ts : mlx_affine_row_bytes(d, j.from.bits);
  const uint64_t sb_row = g_in * ts;
  const uint64_t out_row = part == Part::kValues  ? uint64_t(d) * ts
                           : part == Part::kCodes ? mlx_affine_row_bytes(d, j.to.bits)
                                                  : g_out * ts;
  const uint64_t chunk = std::max<uint64_t>(1, kChunkBytes / std::max(in_row, out_row));
  const bool stats = j.report && (part == Part::kValues || part == Part::kCodes);
  const size_t workers = std::max<size_t>(1, j.threads);
  std::vector<Scratch> scratch(workers);
  for (Scratch& w : scratch) {
    w.x.resize(size_t(d)), w.y.resize(size_t(d)), w.fs.resize(g_in), w.fb.resize(g_in);
    w.qs.resize(g_out), w.qb.resize(g_out);
    w.codes.resize(j.to.is_float() ? 0 : mlx_affine_row_bytes(d, j.to.bits));
  }
  std::vector<std::byte> data, sc, bi, obuf;
  Stats acc;
  for (uint64_t r0 = 0; r0 < rows; r0 += chunk) {
    const uint64_t n = std::min(chunk, rows - r0);
    KV_RETURN_IF_ERROR(read_rows(j, *s.data, in_row, r0, n, data));
    if (!j.from.is_float()) {
      KV_RETURN_IF_ERROR(read_rows(j, *s.scales, sb_row, r0, n, sc));
      KV_RETURN_IF_ERROR(read_rows(j, *s.biases, sb_row, r0, n, bi));
    }
    obuf.resize(n * out_row);
    const uint64_t blocks = (n + kBlockRows - 1) / kBlockRows;
    std::vector<Stats> block_stats(blocks);
    parallel_for(blocks, workers, [&](size_t b, size_t w) {
      for (uint64_t i = b * kBlockRows; i < std::min<uint64_t>(n, (b + 1) * kBlockRows); ++i) {
        const bool counted = stats && int64_t((r0 + i) % uint64_t(s.rows)) < j.offset;
        convert_row(j, part, data.data() + i * in_row, sc.data() + i * sb_row, bi.data() + i * sb_row,
                    obuf.data() + i * out_row, counted, scratch[w], block_stats[b]);
      }
    });
    for (const Stats& b : block_stats) acc.merge(b);
    KV_RETURN_IF_ERROR(out.append(obuf));
  }
  if (stats) acc.finish(*j.report);
  return Status::OK();
}

MlxKvSetting setting_of(const MlxLayer& L) {
  if (L.cls != "QuantizedKVCache") return {};
  return {int(*L.bits), int(*L.group_size)};
}

std::string side_name(const MlxKvSetting& s, const std::string& dtype) {
  return s.is_float() ? dtype : s.name() + " " + dtype;
}

// Why a layer is carried unchanged.
std::string carry_note(const MlxLayer& L) {
  const std::string head = "layer " + L.prefix + " (" + L.cls + ") kept unchanged: ";
  if (L.cls == "RotatingKVCache") {
    return head + "mlx-lm cannot quantize a rotating cache (RotatingKVCache.to_quantized raises NotImplementedError "
                  "\"RotatingKVCache Quantization NYI\"; mlx_lm.generate stops on it the same way when it quantizes)";
  }
  if (L.cls == "ArraysCache" || L.cls == "MambaCache") {
    return head + "recurrent state, no K/V; mlx-lm never quantizes it (no to_quantized)";
  }
  if (L.cls == "ChunkedKVCache" || L.cls == "ConcatenateKVCache" || L.cls == "CacheList") {
    return head + "mlx-lm has no to_quantized for " + L.cls + " (maybe_quantize_kv_cache skips it)";
  }
  if (!L.understood) return head + "a class kvsnap does not know";
  return head + "mlx-lm does not quantize this class";
}

Status dim_error(const MlxPromptCache& in, const MlxLayer& L, const char* side, int64_t dim, int group) {
  std::string fits;
  for (int g : {32, 64, 128}) {
    if (dim % g == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(g);
  }
  return Status::InvalidArgument(
      in.st.file + ": layer " + L.prefix + " (" + L.cls + "): " + side + " head dim " + std::to_string(dim) +
      " is not a whole number of groups of " + std::to_string(group) + " (mx.quantize needs it): " +
      (fits.empty() ? std::string("no MLX group size (32, 64, 128) divides it, so mlx-lm cannot quantize this cache")
                    : "use {--kv-group-size " + fits + "}"));
}

struct Conv {
  const MlxLayer* L = nullptr;
  MlxKvSetting from;
};

// The metadata of the output: class names, meta_state (meta layouts) or the scalars list
// (scalars layout) of the converted layers changed, everything else as it was.
std::vector<std::pair<std::string, std::string>> out_metadata(const MlxPromptCache& in, MlxLayout layout,
                                                              const std::vector<Conv>& convs, const MlxKvSetting& to) {
  std::map<std::string, std::string> m;
  if (in.st.metadata) m.insert(in.st.metadata->begin(), in.st.metadata->end());
  const bool sc = in.layout == MlxLayout::kScalars;
  const std::string cls_to = to.is_float() ? "KVCache" : "QuantizedKVCache";
  std::map<std::string, const Conv*> by_scalar;  // "<p>.2" .. "<p>.4" -> the layer's conversion
  for (const Conv& c : convs) {
    const std::string& p = c.L->prefix;
    m[(sc ? "1." : "2.") + p] = cls_to;
    if (sc) {
      for (const char* k : {".2", ".3", ".4"}) by_scalar[p + k] = &c;
      continue;
    }
    m.erase("0." + p);
    for (int i = 0; m.erase("0." + p + "." + std::to_string(i)); ++i) {
    }
    if (to.is_float()) {
      m["0." + p] = "";
      continue;
    }
    std::vector<int64_t> f{*c.L->offset, to.group_size, to.bits};
    if (layout == MlxLayout::kMetaStep) f.insert(f.begin(), c.L->step.value_or(kMlxStep));
    for (size_t i = 0; i < f.size(); ++i) m["0." + p + "." + std::to_string(i)] = std::to_string(f[i]);
  }
  if (sc) {
    std::vector<std::pair<std::string, std::string>> list;  // (tensor name, scalar|string|none), in order
    for (int j = 1; m.count("2." + std::to_string(j) + ".0"); ++j) {
      const std::string a = "2." + std::to_string(j) + ".0", b = "2." + std::to_string(j) + ".1";
      const std::string name = m[a], type = m.count(b) ? m[b] : "scalar";
      m.erase(a);
      m.erase(b);
      auto it = by_scalar.find(name);
      const bool q_state = it != by_scalar.end() && name != it->second->L->prefix + ".2";
      if (!q_state) list.emplace_back(name, type);  // group_size/bits: re-added after the offset
      if (it != by_scalar.end() && !q_state && !to.is_float()) {
        list.emplace_back(it->second->L->prefix + ".3", "scalar");
        list.emplace_back(it->second->L->prefix + ".4", "scalar");
      }
    }
    for (size_t j = 0; j < list.size(); ++j) {
      m["2." + std::to_string(j + 1) + ".0"] = list[j].first;
      m["2." + std::to_string(j + 1) + ".1"] = list[j].second;
    }
  }
  return {m.begin(), m.end()};
}

// The tensors of a converted side, their parts produced while writing.
void add_side(MlxOutFile& out, const SideJob& job, const std::string& base) {
  const MlxKvSide& s = *job.in;
  auto tensor = [&](const std::string& name, const std::string& dtype, int64_t last, Part part) {
    MlxOutTensor o;
    o.t.name = name;
    o.t.dtype = dtype;
    o.t.shape = {s.batch, s.heads, s.rows, last};
    o.produce = [job, part](ByteSink& sink) { return run_side(job, part, sink); };
    out.tensors.push_back(std::move(o));
  };
  const std::string t = mlx_float_name(job.t);
  if (job.to.is_float()) return tensor(base, t, s.head_dim, Part::kValues);
  tensor(base + ".0", "U32", s.head_dim * job.to.bits / 32, Part::kCodes);
  tensor(base + ".1", t, s.head_dim / job.to.group_size, Part::kScales);
  tensor(base + ".2", t, s.head_dim / job.to.group_size, Part::kBiases);
}

}  // namespace

std::string MlxKvSetting::name() const {
  return is_float() ? "float" : "q" + std::to_string(bits) + "g" + std::to_string(group_size);
}

Status mlx_requant_check_spec(const MlxRequantSpec& spec) {
  if (!(spec.k == spec.v)) {
    return Status::InvalidArgument(
        "K " + spec.k.name() + " and V " + spec.v.name() +
        ": no mlx-lm release (0.19.3 .. 0.32.2) loads different K and V settings: a QuantizedKVCache layer has one "
        "group_size and bits for both, and a layer is either all float (KVCache) or all quantized (separate K/V bits, "
        "mlx-lm #1067 / #1074, were never merged); give one setting for both ({--kv-bits B} {--kv-group-size G})");
  }
  if (!spec.k.is_float()) KV_RETURN_IF_ERROR(mlx_affine_check(spec.k.bits, spec.k.group_size));
  return Status::OK();
}

Result<MlxRequantResult> mlx_requantize(const MlxPromptCache& in, const ReadableFile& src, const MlxRequantSpec& spec,
                                        ByteSink& sink) {
  KV_RETURN_IF_ERROR(mlx_requant_check_spec(spec));
  const MlxKvSetting to = spec.k;
  if (in.layout == MlxLayout::kKeysValues) {
    return Status::NotSupported(in.st.file + ": an mlx-lm 0.18 prompt cache ('<i>_keys'): requantize it in a newer "
                                "layout (kvsnap convert with {--mlx-lm VERSION})");
  }
  MlxRequantResult res;
  res.bytes_in = in.st.file_size;
  std::vector<Conv> convs;
  size_t n_sides = 0;
  for (const MlxLayer& L : in.layers) {
    const bool kv = L.cls == "KVCache" || L.cls == "QuantizedKVCache";
    if (!kv || !L.k || !L.v) {
      res.notes.push_back(carry_note(L));
      continue;
    }
    n_sides += 2;
    const MlxKvSetting from = setting_of(L);
    if (from == to) continue;  // copied
    if (!to.is_float()) {
      if (L.k->head_dim % to.group_size) return dim_error(in, L, "K", L.k->head_dim, to.group_size);
      if (L.v->head_dim % to.group_size) return dim_error(in, L, "V", L.v->head_dim, to.group_size);
    }
    // A float layer of the meta layouts gives mlx-lm its offset by its row count: rows saved past the
    // offset (a QuantizedKVCache moved there by a kvsnap before the cut in format/mlx_layout.cc kept them)
    // would make it continue at the wrong position.
    if (to.is_float() && in.layout != MlxLayout::kScalars && L.offset && L.k->rows != *L.offset) {
      return Status::NotSupported(in.st.file + ": layer " + L.prefix + " (" + L.cls + ") holds " +
                                  std::to_string(L.k->rows) + " rows for its offset " + std::to_string(*L.offset) +
                                  ", and a float KVCache of the " + mlx_layout_name(in.layout) +
                                  " layout takes its offset from its rows: move it to that layout first (kvsnap "
                                  "convert {--mlx-lm VERSION}), which keeps the offset's rows");
    }
    convs.push_back({&L, from});
  }
  // The layout of the output: the input's, with `step` decided when the file does not say.
  MlxLayout layout = in.layout;
  const bool meta = in.layout != MlxLayout::kScalars;
  if (spec.layout && !(*spec.layout == in.layout || (in.step_unknown && meta && *spec.layout != MlxLayout::kScalars))) {
    return Status::InvalidArgument(in.st.file + ": written in mlx-lm's " + mlx_layout_name(in.layout) + " layout (" +
                                   in.version_guess + "); the output keeps it, and {--mlx-lm} names the " +
                                   mlx_layout_name(*spec.layout) + " layout (move it there first: "
                                   "format/mlx_layout.h, kvsnap convert {--mlx-lm})");
  }
  if (spec.layout) layout = *spec.layout;
  if (in.step_unknown && meta && !spec.layout && !to.is_float() && !convs.empty()) {
    return Status::Ambiguous(in.st.file + ": float K/V in the meta_state layout of mlx-lm 0.19.1 .. 0.31.x, and "
                             "nothing in the file tells which: a QuantizedKVCache's meta_state has 'step' up to mlx-lm "
                             "0.28.0 and not from 0.28.1, so the output depends on the release that will load it; "
                             "give {--mlx-lm VERSION} (e.g. 0.28.0 or 0.31.3)");
  }
  if (n_sides == 0) {
    std::string why;
    for (const std::string& n : res.notes) why += "\n  " + n;
    return Status::NotSupported(in.st.file + ": no KVCache or QuantizedKVCache layer, nothing mlx-lm can (de)quantize:" +
                                why);
  }
  // The report, one line per side of every attention layer (stable addresses for the producers).
  res.sides.reserve(n_sides);
  std::map<const SafetensorsTensor*, std::pair<const Conv*, bool>> side_of;  // first tensor of a side -> (layer, V)
  std::map<const SafetensorsTensor*, const Conv*> skip, after;              // dropped; new scalars follow
  std::vector<SideJob> jobs;
  jobs.reserve(n_sides);
  std::map<const Conv*, std::pair<size_t, size_t>> job_of;  // a layer's K and V job
  std::map<const MlxLayer*, const Conv*> conv_of;             // the layers converted
  for (const Conv& c : convs) conv_of[c.L] = &c;
  for (const MlxLayer& L : in.layers) {
    if (!(L.cls == "KVCache" || L.cls == "QuantizedKVCache") || !L.k || !L.v) continue;
    const MlxKvSetting from = setting_of(L);
    const auto converted = conv_of.find(&L);
    const Conv* conv = converted == conv_of.end() ? nullptr : converted->second;
    for (const bool is_v : {false, true}) {
      const MlxKvSide& s = is_v ? *L.v : *L.k;
      MlxRequantSide r;
      r.layer = L.prefix;
      r.is_v = is_v;
      r.cls_from = L.cls;
      r.cls_to = conv ? (to.is_float() ? "KVCache" : "QuantizedKVCache") : L.cls;
      r.from = side_name(from, s.dtype);
      r.to = side_name(conv ? to : from, s.dtype);
      r.copied = !conv;
      if (r.copied) r.snr_db = std::numeric_limits<double>::infinity();
      res.sides.push_back(r);
      if (!conv) continue;
      KV_ASSIGN_OR_RETURN(const MlxFloat t, mlx_float_of(s.dtype));
      (is_v ? job_of[conv].second : job_of[conv].first) = jobs.size();
      jobs.push_back({&in.st, &src, &s, from, to, t, spec.device, std::min(*L.offset, s.rows), &res.sides.back(),
                      spec.threads ? spec.threads : default_threads()});
      std::vector<const SafetensorsTensor*> ts{s.data};
      if (s.scales) ts.insert(ts.end(), {s.scales, s.biases});
      const SafetensorsTensor* first = *std::min_element(ts.begin(), ts.end(), [](auto* a, auto* b) {
        return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
      });
      for (auto* t : ts) skip[t] = conv;
      side_of[first] = {conv, is_v};
    }
    if (conv && in.layout == MlxLayout::kScalars) {
      for (const char* k : {".3", ".4"}) {
        if (const SafetensorsTensor* t = in.st.find(L.prefix + k); t && !from.is_float()) skip[t] = conv;
      }
      if (const SafetensorsTensor* t = in.st.find(L.prefix + ".2")) after[t] = conv;
    }
    if (conv) ++res.layers_converted;
  }
  // The output tensors in the input's data order; a converted side where its first tensor was.
  MlxOutFile out;
  for (size_t i : in.st.data_order) {
    const SafetensorsTensor* t = &in.st.tensors[i];
    if (auto s = side_of.find(t); s != side_of.end()) {
      const auto [conv, is_v] = s->second;
      const SideJob& jb = jobs[is_v ? job_of[conv].second : job_of[conv].first];
      add_side(out, jb, conv->L->prefix + (is_v ? ".1" : ".0"));
      continue;
    }
    if (skip.count(t)) continue;
    MlxOutTensor o;
    o.t = *t;
    o.src = t;
    out.tensors.push_back(std::move(o));
    if (auto a = after.find(t); a != after.end() && !to.is_float()) {
      out.tensors.push_back(mlx_scalar_tensor(a->second->L->prefix + ".3", to.group_size));
      out.tensors.push_back(mlx_scalar_tensor(a->second->L->prefix + ".4", to.bits));
    }
  }
  out.metadata = out_metadata(in, layout, convs, to);
  CountingSink counted;
  TeeSink counter(sink, counted);
  KV_RETURN_IF_ERROR(write_mlx_file(out, in, src, counter));
  res.bytes_out = counted.count;
  return res;
}

}  // namespace kvsnap
