#include "migrate/fp_strict.h"  // first: float conversions as the engines do them, no FMA
#include "migrate/cross_engine.h"

#include <algorithm>
#include <set>

#include "base/byte_order.h"
#include "base/json_access.h"
#include "format/ggml_types.h"
#include "format/mlx_layout.h"
#include "format/state_summary.h"
#include "migrate/convert_state.h"
#include "migrate/cross_engine_archs.h"
#include "migrate/half.h"

namespace kvsnap {
namespace {

using half::bf16_to_f32;
using half::f32_from_bits;
using half::f32_to_bf16;
using half::f32_to_bits;
using half::f32_to_fp16;
using half::fp16_to_f32;
using half::load_u16;
using half::store_u16;

// The model's layers that have rows in the KV section, in section order.
std::vector<const LayerProfile*> kv_layers(const ModelInfo& model) {
  std::vector<const LayerProfile*> out;
  for (const LayerProfile& l : model.profile.layers) {
    if (l.has_kv) out.push_back(&l);
  }
  return out;
}

float load_float(const std::byte* p, const std::string& dtype) {
  if (dtype == "F16") return fp16_to_f32(load_u16(p));
  if (dtype == "BF16") return bf16_to_f32(load_u16(p));
  return f32_from_bits(load_le<uint32_t>(p));
}

void store_float(std::byte* p, float v, const std::string& dtype) {
  if (dtype == "F16") return store_u16(p, f32_to_fp16(v));
  if (dtype == "BF16") return store_u16(p, f32_to_bf16(v));
  store_le(p, f32_to_bits(v), 4);
}

std::string mlx_dtype_of(int32_t ggml_type) {
  switch (ggml_type) {
    case int32_t(GgmlType::kF32): return "F32";
    case int32_t(GgmlType::kBF16): return "BF16";
    default: return "F16";  // f16, and what a dequantized cache is given by default
  }
}

// The dtype every layer's K and V fit in without loss of range or precision: the one they share,
// else F32 (f16 beside f32 or bf16 holds neither's values). Layer 0's K alone rounded an f32 V to f16
// (a review's finding).
std::string widest_mlx_dtype(const StateFile& src) {
  std::set<std::string> seen;
  for (const KvSection& sec : src.memory.kv)
    for (const KvStream& st : sec.streams)
      for (const KvLayer& L : st.layers) {
        seen.insert(mlx_dtype_of(L.k_type));
        if (L.has_v) seen.insert(mlx_dtype_of(L.v_type));
      }
  return seen.size() == 1 ? *seen.begin() : "F32";
}

// Where a model KV layer's rows are in a llama.cpp state: section 0 (base, or the only one) or 1
// (SWA), and the layer's index there (llama.cpp's iSWA sections keep the model's layer order).
struct Place {
  size_t section = 0, index = 0;
};
std::vector<Place> places_of(const std::vector<const LayerProfile*>& layers, bool iswa) {
  std::vector<Place> out;
  size_t n[2] = {0, 0};
  for (const LayerProfile* l : layers) {
    const size_t s = iswa && l->is_swa ? 1 : 0;
    out.push_back({s, n[s]++});
  }
  return out;
}

// One KV section's cells: the stream holding them, its cells by position (order[i] is the cell at
// position first + i).
struct SectionCells {
  size_t stream = 0;
  int32_t first = 0;
  std::vector<uint32_t> order;
};

// kNotSupported for anything but one sequence at consecutive positions.
Result<SectionCells> section_cells(const KvSection& sec, const std::string& name, const std::string& what) {
  std::optional<size_t> stream;
  for (size_t s = 0; s < sec.streams.size(); ++s) {
    if (sec.streams[s].cell_count == 0) continue;
    if (stream) return Status::NotSupported(name + ": cells in more than one stream: save one sequence (a slot file)");
    stream = s;
  }
  if (!stream) return Status::NotSupported(name + ": the " + what + " section holds no cells: nothing to move");
  const KvStream& st = sec.streams[*stream];
  int32_t first = INT32_MAX;
  for (const CellMeta& m : st.cells) first = std::min(first, m.pos);
  std::vector<uint32_t> order(st.cell_count, UINT32_MAX);
  std::optional<int32_t> seq;
  for (uint32_t c = 0; c < st.cell_count; ++c) {
    const CellMeta& m = st.cells[c];
    if (m.seq_ids.size() > 1 || (!m.seq_ids.empty() && seq && *seq != m.seq_ids[0])) {
      return Status::NotSupported(name + ": cells of more than one sequence: save one sequence (a slot file)");
    }
    if (!m.seq_ids.empty()) seq = m.seq_ids[0];
    const int64_t i = int64_t(m.pos) - first;
    if (first < 0 || i >= int64_t(st.cell_count) || order[size_t(i)] != UINT32_MAX) {
      return Status::NotSupported(name + ": " + what + " cell positions are not " + std::to_string(first) + ".." +
                                  std::to_string(int64_t(first) + st.cell_count - 1) + " (cell " + std::to_string(c) +
                                  " at " + std::to_string(m.pos) + "): mlx-lm's caches hold consecutive positions");
    }
    order[size_t(i)] = c;
  }
  return SectionCells{*stream, first, std::move(order)};
}

// The cells of every KV section (base first, then SWA for an iSWA model of window n_swa): base
// positions 0..T-1, SWA cut to the last swa_rows(T, n_swa) positions.
Result<std::vector<SectionCells>> cells_of(const StateFile& f, const std::string& name, uint32_t n_swa) {
  if (f.memory.recurrent) {
    return Status::NotSupported(name + ": holds recurrent state (a hybrid or recurrent model): mlx-lm's KV caches cannot hold it");
  }
  const size_t want = n_swa ? 2 : 1;
  if (f.memory.kv.size() != want) {
    return Status::NotSupported(name + ": " + std::to_string(f.memory.kv.size()) + " KV sections, the model's state has " +
                                std::to_string(want) + (n_swa ? " (base + sliding window)" : ""));
  }
  std::vector<SectionCells> out;
  KV_ASSIGN_OR_RETURN(SectionCells base, section_cells(f.memory.kv[0], name, n_swa ? "base" : "KV"));
  if (base.first != 0) {
    return Status::NotSupported(name + ": cell positions start at " + std::to_string(base.first) +
                                ": mlx-lm's KVCache holds positions 0..offset-1 only");
  }
  const uint32_t T = uint32_t(base.order.size());
  out.push_back(std::move(base));
  if (!n_swa) return out;
  KV_ASSIGN_OR_RETURN(SectionCells swa, section_cells(f.memory.kv[1], name, "SWA"));
  const uint32_t n = swa_rows(T, n_swa);
  const int64_t last = int64_t(swa.first) + int64_t(swa.order.size()) - 1;
  if (last != int64_t(T) - 1 || swa.order.size() < n) {
    return Status::NotSupported(name + ": the SWA section holds positions " + std::to_string(swa.first) + ".." +
                                std::to_string(last) + ", but the window of " + std::to_string(n_swa) + " after " +
                                std::to_string(T) + " tokens needs " + std::to_string(T - n) + ".." +
                                std::to_string(T - 1));
  }
  swa.order.erase(swa.order.begin(), swa.order.end() - n);  // older cells: no position attends to them again
  swa.first = int32_t(T - n);
  out.push_back(std::move(swa));
  return out;
}

// Reads one float32 tensor row range of the f32 intermediate state.
Status read_f32_rows(const ReadableFile& f, ByteRange r, uint64_t first, uint64_t n_floats, std::vector<float>& out) {
  out.resize(n_floats);
  std::vector<std::byte> bytes(n_floats * 4);
  if (first * 4 + bytes.size() > r.size) return Status::Corruption(f.name() + ": internal: row outside its tensor");
  KV_RETURN_IF_ERROR(f.read_at(r.offset + first * 4, bytes));
  for (uint64_t i = 0; i < n_floats; ++i) out[i] = f32_from_bits(load_le<uint32_t>(bytes.data() + i * 4));
  return Status::OK();
}

// gemma2: mlx-lm attends to every position, llama.cpp's SWA layers to the last n_swa; their caches
// are the same only up to the window.
Status check_window(const KOrder& k, uint32_t T, const std::string& name) {
  if (!k.n_swa || k.mlx_window || T <= k.n_swa) return Status::OK();
  return Status::NotSupported(name + ": " + std::to_string(T) + " tokens, past the sliding window of " +
                              std::to_string(k.n_swa) + ": llama.cpp's SWA layers attend to the last " +
                              std::to_string(k.n_swa) + " positions, mlx-lm's gemma2 to every one, so the two "
                              "engines' caches differ from there on");
}

// The prompt-cache tensors (meta_state layout) of the f32 state `f` (parsed from `mem`).
Result<MlxOutFile> mlx_file_of(const StateFile& f, const ReadableFile& mem, const std::vector<SectionCells>& cells,
                               const std::vector<const LayerProfile*>& layers, const std::vector<Place>& places,
                               bool permute, const std::string& dtype) {
  const uint64_t item = safetensors_itemsize(dtype);
  MlxOutFile out;
  for (size_t il = 0; il < layers.size(); ++il) {
    const SectionCells& sc = cells[places[il].section];
    const KvLayer& L = f.memory.kv[places[il].section].streams[sc.stream].layers[places[il].index];
    const LayerProfile& lp = *layers[il];
    const uint64_t T = sc.order.size();
    const std::string p = std::to_string(il);
    for (bool is_v : {false, true}) {
      const uint64_t H = lp.n_head_kv, D = is_v ? lp.head_dim_v : lp.head_dim_k;
      const uint64_t width = H * D;
      MlxOutTensor t;
      t.t.name = p + (is_v ? ".1" : ".0");
      t.t.dtype = dtype;
      t.t.shape = {1, int64_t(H), int64_t(T), int64_t(D)};
      t.bytes.resize(H * T * D * item);
      std::vector<float> row, head(D);
      for (uint64_t tt = 0; tt < T; ++tt) {
        KV_RETURN_IF_ERROR(read_f32_rows(mem, is_v ? L.v : L.k, uint64_t(sc.order[tt]) * width, width, row));
        for (uint64_t h = 0; h < H; ++h) {
          const float* src = row.data() + h * D;
          if (!is_v && permute) {
            k_row_to_mlx(src, head.data(), uint32_t(D));
            src = head.data();
          }
          std::byte* dst = t.bytes.data() + ((h * T + tt) * D) * item;
          for (uint64_t d = 0; d < D; ++d) store_float(dst + d * item, src[d], dtype);
        }
      }
      out.tensors.push_back(std::move(t));
    }
  }
  return out;
}

std::string tokens_json(const std::vector<int32_t>& tokens) {
  std::string s = "[";
  for (size_t i = 0; i < tokens.size(); ++i) s += (i ? "," : "") + std::to_string(tokens[i]);
  return s + "]";
}

// Runs `write` into memory and reads the result back as a prompt cache.
struct MemCache {
  std::unique_ptr<MemoryFile> file;
  MlxPromptCache cache;
};
Result<MemCache> reread(std::string name, std::vector<std::byte> bytes) {
  MemCache m;
  m.file = std::make_unique<MemoryFile>(std::move(name), std::move(bytes));
  KV_ASSIGN_OR_RETURN(m.cache, read_mlx_prompt_cache(*m.file));
  return m;
}

}  // namespace

void k_row_to_mlx(const float* llama, float* mlx, uint32_t head_dim) {
  const uint32_t half = head_dim / 2;
  for (uint32_t j = 0; j < half; ++j) {
    mlx[j] = llama[2 * j];
    mlx[half + j] = llama[2 * j + 1];
  }
}

void k_row_to_llama(const float* mlx, float* llama, uint32_t head_dim) {
  const uint32_t half = head_dim / 2;
  for (uint32_t j = 0; j < half; ++j) {
    llama[2 * j] = mlx[j];
    llama[2 * j + 1] = mlx[half + j];
  }
}

Result<KOrder> cross_engine_k_order(const ModelInfo& model) {
  const ModelProfile& p = model.profile;
  const std::string who = model.path + " (" + p.arch + ")";
  uint32_t n_swa = 0;
  if (p.is_iswa()) {
    // gemma3: llama.cpp's LLAMA_SWA_TYPE_STANDARD window and mlx-lm's gemma3_text RotatingKVCache
    // mask alike (position p attends to p-n_swa+1..p); mlx-lm's gemma2 has no window (check_window).
    if ((p.arch != "gemma3" && p.arch != "gemma2") || p.swa != SwaKind::kStandard || p.is_hybrid() || p.n_swa == 0) {
      return Status::NotSupported(who + ": sliding-window attention (iSWA): across engines only for gemma3 and gemma2");
    }
    n_swa = p.n_swa;
  }
  if (p.is_hybrid() || p.is_recurrent_only()) {
    return Status::NotSupported(who + ": recurrent state (hybrid or recurrent model): mlx-lm's KV caches cannot hold it");
  }
  if (p.is_mla) return Status::NotSupported(who + ": MLA (latent K, no V rows): not supported across engines");
  if (p.has_cell_ext) return Status::NotSupported(who + ": M-RoPE (positions per cell): not supported across engines");
  KV_ASSIGN_OR_RETURN(const CrossEngineArch* a, cross_engine_arch_for(p, who));
  const std::string rope = std::string(rope_kind_name(a->rope)) + " rope";
  if (a->map == KMap::kPermute) {
    if (n_swa) return Status::NotSupported(who + ": sliding window with a permuted K: not supported across engines");
    return KOrder{true, p.arch + ": " + rope + ", converter permuted Q/K, mlx-lm " + a->mlx_module +
                            " rotate-half: K pairs (2j, 2j+1) <-> (j, j+D/2)"};
  }
  const bool mlx_window = p.arch != "gemma2";  // mlx-lm's gemma2 has no window
  std::string why = p.arch + ": " + rope + ", converter kept Q/K, mlx-lm " + a->mlx_module +
                    (a->mlx_traditional ? " traditional" : " rotate-half") + " rope: K in the same order";
  if (n_swa && mlx_window) why += "; sliding window " + std::to_string(n_swa) + " (RotatingKVCache)";
  if (n_swa && !mlx_window) why += "; sliding window " + std::to_string(n_swa) + " in llama.cpp only: sessions up to it";
  return KOrder{false, why, n_swa, mlx_window};
}

Result<CrossEngineResult> llama_to_mlx(const StateFile& src, const ReadableFile& file, const ModelInfo& model,
                                       const LlamaToMlxSpec& spec, ByteSink& out) {
  const std::string name = file.name();
  CrossEngineResult res;
  KV_ASSIGN_OR_RETURN(res.k_order, cross_engine_k_order(model));
  KV_RETURN_IF_ERROR(model.check_state(src, name));
  const uint32_t n_swa = res.k_order.n_swa;
  KV_ASSIGN_OR_RETURN(const std::vector<SectionCells> cells, cells_of(src, name, n_swa));
  KV_RETURN_IF_ERROR(check_window(res.k_order, uint32_t(cells[0].order.size()), name));
  const std::vector<const LayerProfile*> layers = kv_layers(model);
  const std::vector<Place> places = places_of(layers, n_swa > 0);
  for (size_t s = 0; s < cells.size(); ++s) {
    const size_t have = src.memory.kv[s].streams[cells[s].stream].layers.size();
    const size_t want = size_t(std::count_if(places.begin(), places.end(), [&](const Place& p) { return p.section == s; }));
    if (have != want) {
      return Status::Mismatch(name + ": " + std::to_string(have) + " KV layers in section " + std::to_string(s) +
                              ", the model " + std::to_string(want));
    }
  }
  if (spec.quant.bits) KV_RETURN_IF_ERROR(mlx_affine_check(spec.quant.bits, spec.quant.group_size).Prefixed(name));
  if (spec.quant.bits && model.profile.arch == "gemma2") {  // mlx_lm/models/gemma2.py: mx.expand_dims(keys, 2)
    return Status::NotSupported(name + ": gemma2: mlx-lm's gemma2 attention cannot run a QuantizedKVCache "
                                "(it takes float keys only): move without {--kv-bits}");
  }

  // Everything the two engines agree on (types, rotation, V layout) is kvsnap convert's job: the
  // state at f32, flash-attention rows, unrotated.
  ConversionSpec c = spec.claims;
  c.ctk = c.ctv = "f32";
  c.flash_attn = "on";
  c.dst_rotation = "off";
  c.format.clear();
  c.target_build.clear();
  c.report = false;
  std::string warnings;
  KV_ASSIGN_OR_RETURN(ConvertRequest req, make_request(c, src, &model, name, &warnings, &file, &res.rotation));
  if (!warnings.empty()) res.notes.push_back(warnings);
  VectorSink f32_bytes;
  KV_RETURN_IF_ERROR(convert_state(src, file, req, f32_bytes).status());
  const MemoryFile f32_file(name + " (f32)", std::move(f32_bytes.bytes));
  ParseOptions po;
  po.shape = &model.shape;
  KV_ASSIGN_OR_RETURN(const StateFile f32, parse_state(f32_file, po));

  const std::string dtype = spec.dtype.empty() ? widest_mlx_dtype(src) : spec.dtype;
  if (dtype != "F16" && dtype != "BF16" && dtype != "F32") {
    return Status::InvalidArgument(name + ": mlx dtype '" + dtype + "': give F16, BF16 or F32");
  }
  KV_ASSIGN_OR_RETURN(MlxOutFile mf,
                      mlx_file_of(f32, f32_file, cells, layers, places, res.k_order.permuted, dtype));
  const uint32_t T = uint32_t(cells[0].order.size());
  for (size_t il = 0; il < layers.size(); ++il) {
    const std::string p = std::to_string(il);
    if (places[il].section == 0 || !res.k_order.mlx_window) {
      mf.metadata.emplace_back("0." + p, "");
      mf.metadata.emplace_back("2." + p, "KVCache");
      continue;
    }
    // meta_state (keep, max_size, offset, _idx): the rows in temporal order, the next write after them
    const std::string ring[4] = {"0", std::to_string(n_swa), std::to_string(T), std::to_string(cells[1].order.size())};
    for (int i = 0; i < 4; ++i) mf.metadata.emplace_back("0." + p + "." + std::to_string(i), ring[i]);
    mf.metadata.emplace_back("2." + p, "RotatingKVCache");
  }
  mf.metadata.emplace_back("1.model", spec.model_name.empty() ? model.profile.name : spec.model_name);
  mf.metadata.emplace_back("1.tokens", tokens_json(src.tokens.tokens));
  std::sort(mf.metadata.begin(), mf.metadata.end());
  res.n_tokens = T;
  res.n_layers = uint32_t(layers.size());
  if (src.tokens.tokens.size() != T) {
    res.notes.push_back("the file holds " + std::to_string(src.tokens.tokens.size()) + " tokens for " +
                        std::to_string(T) + " cells; its token list is carried as it is");
  }
  if (n_swa && res.k_order.mlx_window) {
    res.notes.push_back("sliding-window layers: the last " + std::to_string(cells[1].order.size()) + " of " +
                        std::to_string(T) + " positions, as RotatingKVCache(max_size " + std::to_string(n_swa) + ")");
  }

  // meta_state layout first, then mlx-lm's other layouts and quantization as the mlx tools do them.
  VectorSink meta;
  KV_RETURN_IF_ERROR(write_mlx_file(mf, MlxPromptCache{}, f32_file, meta));
  KV_ASSIGN_OR_RETURN(MemCache cur, reread(name + " (mlx)", std::move(meta.bytes)));
  const bool last_is_layout = spec.quant.is_float();
  if (spec.layout != MlxLayout::kMeta) {
    KV_ASSIGN_OR_RETURN(MlxOutFile moved, mlx_change_layout(cur.cache, spec.layout));
    VectorSink vs;
    KV_RETURN_IF_ERROR(write_mlx_file(moved, cur.cache, *cur.file, vs));
    KV_ASSIGN_OR_RETURN(cur, reread(name + " (mlx)", std::move(vs.bytes)));
  }
  if (last_is_layout) {
    KV_RETURN_IF_ERROR(out.append(cur.file->bytes()));
    res.bytes_out = cur.file->size();
  } else {
    MlxRequantSpec rq{spec.quant, spec.quant, MlxDevice::kCpu, spec.layout, 0};
    CountingSink counted;
    TeeSink tee(out, counted);
    KV_ASSIGN_OR_RETURN(MlxRequantResult requantized, mlx_requantize(cur.cache, *cur.file, rq, tee));
    // Layers carried as they are (a ring mlx-lm cannot quantize stays float): said, as convert says it.
    res.notes.insert(res.notes.end(), requantized.notes.begin(), requantized.notes.end());
    res.bytes_out = counted.count;
  }
  res.from = state_format_name(src) + ", K " + state_types(src, false) + ", V " + state_types(src, true) + " (" +
             state_v_layout(src) + ")";
  res.to = std::string("mlx-lm ") + (spec.quant.is_float() ? "KVCache " + dtype : "QuantizedKVCache " + spec.quant.name()) +
           (n_swa && res.k_order.mlx_window ? " + RotatingKVCache" : "") + " (" + mlx_layout_name(spec.layout) + ")";
  return res;
}

namespace {

// The buffer rows of one mlx-lm layer that move, oldest first; the first is at position `first`.
struct MlxRows {
  uint32_t first = 0;
  std::vector<uint32_t> rows;
};

// The f32 K/V rows of a float mlx-lm cache, in llama.cpp's order, for write_state; `layer_of`
// maps (section, layer there) to the cache's layer.
class MlxRowSource final : public TensorSource {
 public:
  MlxRowSource(const MlxPromptCache& c, const ReadableFile& f, const std::vector<MlxRows>& rows,
               std::vector<std::vector<size_t>> layer_of, bool permute)
      : c_(c), f_(f), rows_(rows), layer_of_(std::move(layer_of)), permute_(permute) {}
  Status emit(const StateFile&, const TensorRef& ref, ByteSink& out) override {
    const size_t il = layer_of_[ref.section][ref.layer];
    const MlxKvSide& s = ref.is_v ? *c_.layers[il].v : *c_.layers[il].k;
    KV_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, read_tensor(c_.st, f_, *s.data));
    const uint64_t H = uint64_t(s.heads), D = uint64_t(s.head_dim), R = uint64_t(s.rows);
    const uint64_t item = safetensors_itemsize(s.dtype);
    std::vector<float> head(D), row(H * D);
    std::vector<std::byte> rb(H * D * 4);
    for (const uint32_t t : rows_[il].rows) {
      for (uint64_t h = 0; h < H; ++h) {
        const std::byte* p = bytes.data() + ((h * R + t) * D) * item;
        for (uint64_t d = 0; d < D; ++d) head[d] = load_float(p + d * item, s.dtype);
        float* dst = row.data() + h * D;
        if (!ref.is_v && permute_) {
          k_row_to_llama(head.data(), dst, uint32_t(D));
        } else {
          std::copy(head.begin(), head.end(), dst);
        }
      }
      for (uint64_t i = 0; i < H * D; ++i) store_le(rb.data() + i * 4, f32_to_bits(row[i]), 4);
      KV_RETURN_IF_ERROR(out.append(rb));
    }
    return Status::OK();
  }

 private:
  const MlxPromptCache& c_;
  const ReadableFile& f_;
  const std::vector<MlxRows>& rows_;
  std::vector<std::vector<size_t>> layer_of_;
  bool permute_;
};

// The rows of one layer that hold tokens, oldest first, and its offset: KVCache rows 0..offset-1;
// a RotatingKVCache (an SWA layer's window, n_swa > 0) through its ring's temporal order.
Result<std::pair<int64_t, MlxRows>> layer_rows(const MlxLayer& L, const LayerProfile& lp, uint32_t n_swa,
                                               const std::string& where) {
  if (L.cls == "RotatingKVCache" && (!n_swa || !lp.is_swa)) {
    // A ring on a full-attention layer (mlx-lm --max-kv-size) that never wrapped holds positions
    // 0..offset-1 in rows 0..offset-1, each computed with every earlier position: an ordinary
    // prefix. Once offset passes max_size the first positions are overwritten and later ones saw
    // only a window, which llama.cpp's full-attention cache cannot represent.
    if (!L.max_size || !L.idx || *L.offset > *L.max_size || *L.idx != *L.offset) {
      return Status::NotSupported(
          where + ": its ring of " + (L.max_size ? std::to_string(*L.max_size) : "?") + " positions has wrapped (offset " +
          std::to_string(*L.offset) + ", _idx " + (L.idx ? std::to_string(*L.idx) : "?") +
          "): its first positions were overwritten and later ones attended to a window only; llama.cpp's "
          "full-attention cache cannot hold that (save the session before it passes mlx-lm's max_kv_size)");
    }
    if (*L.offset > L.k->rows || *L.offset > L.v->rows) return Status::Corruption(where + ": offset past its rows");
    MlxRows r;
    for (int64_t t = 0; t < *L.offset; ++t) r.rows.push_back(uint32_t(t));
    return std::make_pair(*L.offset, std::move(r));
  }
  if (L.cls == "RotatingKVCache") {
    if (!L.keep || !L.max_size || !L.idx) return Status::Corruption(where + ": meta_state incomplete");
    if (*L.keep != 0) {
      return Status::NotSupported(where + ": keep " + std::to_string(*L.keep) +
                                  ": attention-sink rows have no place in llama.cpp's sliding window");
    }
    if (*L.max_size != int64_t(n_swa)) {
      return Status::NotSupported(where + ": a ring of " + std::to_string(*L.max_size) + " positions, but the model's " +
                                  "sliding window is " + std::to_string(n_swa));
    }
    if (L.k->rows != L.v->rows) return Status::Corruption(where + ": K and V buffers of different lengths");
    KV_ASSIGN_OR_RETURN(std::vector<uint32_t> rows, mlx_ring_rows(L.k->rows, *L.keep, *L.offset, *L.idx, where));
    const uint32_t first = uint32_t(*L.offset - int64_t(rows.size()));
    return std::make_pair(*L.offset, MlxRows{first, std::move(rows)});
  }
  if (L.cls != "KVCache") {
    return Status::NotSupported(where + ": only KVCache, QuantizedKVCache and RotatingKVCache layers (on "
                                "sliding-window layers, or before the ring wraps) move to llama.cpp");
  }
  if (*L.offset > L.k->rows || *L.offset > L.v->rows) return Status::Corruption(where + ": offset past its rows");
  MlxRows r;
  for (int64_t t = 0; t < *L.offset; ++t) r.rows.push_back(uint32_t(t));
  return std::make_pair(*L.offset, std::move(r));
}

// Checks the float cache's layers against the model; returns the shared offset and each layer's
// rows to move (an SWA layer's: the last swa_rows(offset, n_swa)).
// `ring_window`: the window of the model's RotatingKVCache layers (0: mlx-lm has none).
Result<std::pair<uint32_t, std::vector<MlxRows>>> check_against_model(const MlxPromptCache& c, const std::string& name,
                                                                      const std::vector<const LayerProfile*>& layers,
                                                                      const std::string& model, uint32_t ring_window,
                                                                      uint32_t n_swa) {
  if (c.layers.size() != layers.size()) {
    return Status::Mismatch(name + ": " + std::to_string(c.layers.size()) + " layers, but " + model + " has " +
                            std::to_string(layers.size()) + " KV layers");
  }
  std::optional<int64_t> offset;
  std::vector<MlxRows> rows;
  for (size_t il = 0; il < layers.size(); ++il) {
    const MlxLayer& L = c.layers[il];
    const std::string where = name + ": layer " + std::to_string(il) + " (" + L.cls + ")";
    if (!L.k || !L.v || !L.offset) {
      return Status::NotSupported(where + ": only KVCache, QuantizedKVCache and RotatingKVCache layers (on "
                                  "sliding-window layers, or before the ring wraps) move to llama.cpp");
    }
    const LayerProfile& lp = *layers[il];
    if (L.k->batch != 1) return Status::NotSupported(where + ": batch " + std::to_string(L.k->batch) + ": one sequence only");
    if (L.k->heads != lp.n_head_kv || L.k->head_dim != lp.head_dim_k || L.v->heads != lp.n_head_kv ||
        L.v->head_dim != lp.head_dim_v) {
      return Status::Mismatch(where + ": K [" + std::to_string(L.k->heads) + " heads x " + std::to_string(L.k->head_dim) +
                              "], V [" + std::to_string(L.v->heads) + " x " + std::to_string(L.v->head_dim) + "], but " +
                              model + " has " + std::to_string(lp.n_head_kv) + " KV heads of " +
                              std::to_string(lp.head_dim_k) + "/" + std::to_string(lp.head_dim_v));
    }
    KV_ASSIGN_OR_RETURN(auto got, layer_rows(L, lp, ring_window, where));
    if (offset && *offset != got.first) {
      return Status::NotSupported(where + ": offset " + std::to_string(got.first) + ", layer 0's " +
                                  std::to_string(*offset) + ": the layers must hold the same tokens");
    }
    offset = got.first;
    rows.push_back(std::move(got.second));
  }
  if (!offset || *offset <= 0) return Status::NotSupported(name + ": holds no tokens: nothing to move");
  if (*offset > INT32_MAX) {  // llama.cpp positions are i32
    return Status::Corruption(name + ": offset " + std::to_string(*offset) + ": more tokens than llama.cpp positions");
  }
  const uint32_t T = uint32_t(*offset);
  if (!n_swa) return std::make_pair(T, std::move(rows));
  // The SWA cells: the window's min(T, n_swa) positions, and one older when every SWA layer still
  // holds it: llama-server reuses a restored slot only with SWA cells down to T-n_swa-1 (its
  // pos_min < pos_next - n_swa), one more than llama.cpp's own slot save keeps; llama.cpp masks
  // that cell for every later position.
  uint32_t n = swa_server_rows(T, n_swa);
  for (size_t il = 0; il < layers.size(); ++il) {
    if (!layers[il]->is_swa) continue;
    const MlxRows& r = rows[il];
    if (r.rows.size() < swa_rows(T, n_swa)) {
      return Status::NotSupported(name + ": layer " + std::to_string(il) + " holds positions " + std::to_string(r.first) +
                                  ".." + std::to_string(T - 1) + ", but the window of " + std::to_string(n_swa) +
                                  " needs " + std::to_string(T - swa_rows(T, n_swa)) + "..");
    }
    n = std::min(n, uint32_t(r.rows.size()));
  }
  for (size_t il = 0; il < layers.size(); ++il) {
    if (!layers[il]->is_swa) continue;
    MlxRows& r = rows[il];
    r.rows.erase(r.rows.begin(), r.rows.end() - n);  // older rows: no position attends to them again
    r.first = T - n;
  }
  return std::make_pair(T, std::move(rows));
}

// The header of the llama.cpp file to write, in v0.5.0's version of its kind; a session names the
// model's architecture as llama_state_save_file does (llama_state_load_file refuses another).
Status set_llama_kind(StateKind kind, const ModelInfo& model, const std::string& name, StateFile& f) {
  f.kind = kind;
  if (kind == StateKind::kSeqFile) {
    f.magic = kMagicGgsq;
    f.version = kGgsqVersionCurrent;
    return Status::OK();
  }
  if (kind != StateKind::kSessionFile) {
    return Status::InvalidArgument(name + ": a prompt cache moves to a llama.cpp slot or session file, not a " +
                                   kind_name(kind));
  }
  if (model.profile.arch.empty()) return Status::InvalidArgument(model.path + ": names no architecture for the session file");
  f.magic = kMagicGgsn;
  f.version = kGgsnVersionCurrent;
  f.arch = model.profile.arch;
  return Status::OK();
}

Result<std::vector<int32_t>> file_tokens(const MlxPromptCache& c, const std::string& name) {
  for (const auto& [k, v] : c.user_metadata) {
    if (k == "tokens") {
      // The file's own word, not the user's: a list that does not parse is a corrupt file (exit 3)
      auto t = parse_token_list(v, name + ": metadata 'tokens'");
      if (!t.ok() && t.status().code() == Code::kInvalidArgument) return Status::Corruption(t.status().message());
      return t;
    }
  }
  return Status::InvalidArgument(name + ": mlx-lm stores no token ids: give {--tokens} FILE with the prompt's token ids "
                                 "(a JSON list or whitespace-separated integers)");
}

}  // namespace

Result<CrossEngineResult> mlx_to_llama(const MlxPromptCache& src, const ReadableFile& file, const ModelInfo& model,
                                       const MlxToLlamaSpec& spec, ByteSink& out) {
  const std::string name = file.name();
  CrossEngineResult res;
  KV_ASSIGN_OR_RETURN(res.k_order, cross_engine_k_order(model));
  const std::vector<const LayerProfile*> layers = kv_layers(model);

  // A quantized cache is dequantized as mx.dequantize does, first.
  const MlxPromptCache* cache = &src;
  const ReadableFile* data = &file;
  MemCache deq;
  bool quantized = false;
  for (const MlxLayer& L : src.layers) quantized = quantized || L.cls == "QuantizedKVCache";
  if (quantized) {
    MlxRequantSpec rq{{}, {}, MlxDevice::kCpu, std::nullopt, 0};
    VectorSink vs;
    KV_RETURN_IF_ERROR(mlx_requantize(src, file, rq, vs).status());
    KV_ASSIGN_OR_RETURN(deq, reread(name + " (dequantized)", std::move(vs.bytes)));
    cache = &deq.cache;
    data = deq.file.get();
  }
  const uint32_t n_swa = res.k_order.n_swa;
  KV_ASSIGN_OR_RETURN(const auto checked, check_against_model(*cache, name, layers, model.path,
                                                            res.k_order.mlx_window ? n_swa : 0, n_swa));
  const uint32_t T = checked.first;
  KV_RETURN_IF_ERROR(check_window(res.k_order, T, name));
  const std::vector<MlxRows>& rows = checked.second;
  std::vector<int32_t> tokens;
  if (spec.tokens) {
    tokens = *spec.tokens;
  } else {
    KV_ASSIGN_OR_RETURN(tokens, file_tokens(src, name));
  }
  if (tokens.size() != T) {
    return Status::Mismatch(name + ": holds " + std::to_string(T) + " tokens (offset), but " +
                            std::to_string(tokens.size()) + " token ids were given");
  }

  // The state at f32 (flash-attention rows, unrotated), then kvsnap convert's way to the target,
  // which keeps the kind (slot or session) of its input.
  StateFile f;
  KV_RETURN_IF_ERROR(set_llama_kind(spec.file_kind, model, name, f));
  f.tokens.words = tokens;
  f.tokens.tokens = tokens;
  // The ids (--tokens or the file's metadata) must be the model's, or the slot written is one every
  // later kvsnap command refuses as another model's (a review's finding: written with exit 0).
  KV_RETURN_IF_ERROR(model.check_state(f, name));
  // One section (base), or base + SWA: each the cells of its layers' rows, positions first.. .
  const std::vector<Place> places = places_of(layers, n_swa > 0);
  std::vector<std::vector<size_t>> layer_of(n_swa ? 2 : 1);
  for (size_t il = 0; il < layers.size(); ++il) layer_of[places[il].section].push_back(il);
  for (const std::vector<size_t>& in_section : layer_of) {
    if (in_section.empty()) return Status::NotSupported(model.path + ": an iSWA model without layers of both kinds");
    const MlxRows& r0 = rows[in_section[0]];
    KvSection sec;
    KvStream st;
    st.cell_count = uint32_t(r0.rows.size());
    for (uint32_t t = 0; t < st.cell_count; ++t) st.cells.push_back(CellMeta{int32_t(r0.first + t), {0}, {}});
    st.n_layer = uint32_t(in_section.size());
    for (const size_t il : in_section) {
      KvLayer L;
      L.k_type = L.v_type = int32_t(GgmlType::kF32);
      L.k_row_bytes = uint64_t(layers[il]->n_embd_k_gqa) * 4;
      L.v_row_bytes = uint64_t(layers[il]->n_embd_v_gqa) * 4;
      st.layers.push_back(L);
    }
    sec.streams.push_back(std::move(st));
    f.memory.kv.push_back(std::move(sec));
  }
  VectorSink f32_bytes;
  MlxRowSource source(*cache, *data, rows, layer_of, res.k_order.permuted);
  const MemoryFile none("(none)", std::vector<std::byte>{});
  KV_RETURN_IF_ERROR(write_state(f, source, none, f32_bytes));
  const MemoryFile f32_file(name + " (as llama.cpp f32)", std::move(f32_bytes.bytes));
  ParseOptions po;
  po.shape = &model.shape;
  KV_ASSIGN_OR_RETURN(const StateFile f32, parse_state(f32_file, po));

  ConversionSpec c = spec.target;
  if (c.ctk.empty()) c.ctk = "f16";
  if (c.ctv.empty()) c.ctv = "f16";
  if (c.flash_attn.empty()) c.flash_attn = "on";
  // The f32 rows are unrotated whatever is claimed about a source build; the ggsq v3 file they are in
  // is what a rotating llama.cpp writes, so a quantized target is rotated unless the target says
  // otherwise (--target-build, --dst-rotation).
  c.src_rotation.clear();
  c.source_build.clear();
  c.server_build.clear();
  c.report = false;
  std::string warnings;
  KV_ASSIGN_OR_RETURN(ConvertRequest req, make_request(c, f32, &model, name, &warnings, nullptr, &res.rotation));
  if (!warnings.empty()) res.notes.push_back(warnings);
  KV_RETURN_IF_ERROR(plan_target(f32, req).status().Prefixed(name));
  KV_ASSIGN_OR_RETURN(ConvertResult conv, convert_state(f32, f32_file, req, out));
  res.n_tokens = T;
  res.n_layers = uint32_t(layers.size());
  res.bytes_out = conv.bytes_out;
  const MlxLayer& l0 = src.layers[0];
  res.from = "mlx-lm " + l0.cls + " " +
             (l0.bits ? "q" + std::to_string(*l0.bits) + "g" + std::to_string(*l0.group_size) + " " : std::string()) +
             l0.k->dtype + " (" + mlx_layout_name(src.layout) + ")";
  res.to = describe_state(conv.target);
  return res;
}

Result<std::vector<uint32_t>> mlx_ring_rows(int64_t rows, int64_t keep, int64_t offset, int64_t idx,
                                            const std::string& where) {
  if (rows < 0 || keep < 0 || offset < 0 || idx < 0 || idx > rows || keep > rows) {
    return Status::Corruption(where + ": ring meta_state keep " + std::to_string(keep) + ", offset " +
                              std::to_string(offset) + ", _idx " + std::to_string(idx) + " for " + std::to_string(rows) +
                              " rows");
  }
  std::vector<uint32_t> out;
  auto take = [&](int64_t from, int64_t to) {
    for (int64_t r = from; r < to; ++r) out.push_back(uint32_t(r));
  };
  if (idx == rows) {  // the buffer in order (after a multi-token update, or exactly full)
    take(0, rows);
  } else if (idx < offset) {  // wrapped: the sink rows, then the oldest (from _idx), then the newest
    if (idx < keep) return Status::Corruption(where + ": ring _idx " + std::to_string(idx) + " inside keep " + std::to_string(keep));
    take(0, keep);
    take(idx, rows);
    take(keep, idx);
  } else {  // not full yet: rows past _idx were never written
    take(0, idx);
  }
  if (int64_t(out.size()) > offset) {
    return Status::Corruption(where + ": a ring of " + std::to_string(out.size()) + " rows after " +
                              std::to_string(offset) + " tokens");
  }
  return out;
}

Result<std::vector<int32_t>> parse_token_list(const std::string& text, const std::string& what) {
  std::vector<int32_t> out;
  size_t i = 0;
  const size_t n = text.size();
  auto sep = [](char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == ','; };
  while (i < n && sep(text[i])) ++i;
  const bool bracket = i < n && text[i] == '[';
  if (bracket) ++i;
  bool closed = false;
  while (i < n) {
    if (sep(text[i])) {
      ++i;
      continue;
    }
    if (bracket && text[i] == ']') {
      closed = true;
      ++i;
      break;
    }
    size_t j = i;
    if (text[j] == '-') ++j;
    while (j < n && text[j] >= '0' && text[j] <= '9') ++j;
    const std::string word = text.substr(i, j - i);
    if (j == i || word == "-" || (j < n && !sep(text[j]) && text[j] != ']') || word.size() > 11) {
      size_t e = i;
      while (e < n && !sep(text[e]) && !(text[e] == ']' && e > i) && e - i < 20) ++e;
      return Status::InvalidArgument(what + ": '" + text.substr(i, e - i) + "' is not a token id");
    }
    const long long v = std::stoll(word);
    if (v < INT32_MIN || v > INT32_MAX) return Status::InvalidArgument(what + ": " + word + " is not a token id");
    out.push_back(int32_t(v));
    i = j;
  }
  if (bracket && !closed) return Status::InvalidArgument(what + ": the JSON list has no closing ']'");
  while (i < n && sep(text[i])) ++i;
  if (i < n) return Status::InvalidArgument(what + ": text after the list");
  return out;
}

Result<std::vector<int32_t>> parse_token_file_text(const std::string& text, const std::string& what) {
  auto parsed = parse_json(text, what, Code::kInvalidArgument);
  if (parsed.ok() && parsed->is_array()) {
    return JsonRef(*parsed, what, Code::kInvalidArgument).elements_as<int32_t>([](const JsonRef& t) -> Result<int32_t> {
      KV_ASSIGN_OR_RETURN(int64_t id, t.integer(INT32_MIN, INT32_MAX));
      return int32_t(id);
    });
  }
  return parse_token_list(text, what);
}

}  // namespace kvsnap
