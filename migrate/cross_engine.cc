#include "migrate/fp_strict.h"  // first: float conversions as the engines do them, no FMA
#include "migrate/cross_engine.h"

#include <algorithm>

#include "base/byte_order.h"
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

// The one stream holding cells, and its cells ordered by position (order[t] = cell index);
// kNotSupported for anything but one sequence at positions 0..T-1.
Result<std::pair<size_t, std::vector<uint32_t>>> cell_order(const StateFile& f, const std::string& name) {
  if (f.memory.recurrent) {
    return Status::NotSupported(name + ": holds recurrent state (a hybrid or recurrent model): mlx-lm's KV caches cannot hold it");
  }
  if (f.memory.kv.size() != 1) {
    return Status::NotSupported(name + ": " + std::to_string(f.memory.kv.size()) +
                                " KV sections (an iSWA model's base + sliding window): not supported across engines");
  }
  const KvSection& sec = f.memory.kv[0];
  std::optional<size_t> stream;
  for (size_t s = 0; s < sec.streams.size(); ++s) {
    if (sec.streams[s].cell_count == 0) continue;
    if (stream) return Status::NotSupported(name + ": cells in more than one stream: save one sequence (a slot file)");
    stream = s;
  }
  if (!stream) return Status::NotSupported(name + ": holds no cells: nothing to move");
  const KvStream& st = sec.streams[*stream];
  std::vector<uint32_t> order(st.cell_count, UINT32_MAX);
  std::optional<int32_t> seq;
  for (uint32_t c = 0; c < st.cell_count; ++c) {
    const CellMeta& m = st.cells[c];
    if (m.seq_ids.size() > 1 || (!m.seq_ids.empty() && seq && *seq != m.seq_ids[0])) {
      return Status::NotSupported(name + ": cells of more than one sequence: save one sequence (a slot file)");
    }
    if (!m.seq_ids.empty()) seq = m.seq_ids[0];
    if (m.pos < 0 || uint32_t(m.pos) >= st.cell_count || order[uint32_t(m.pos)] != UINT32_MAX) {
      return Status::NotSupported(name + ": cell positions are not 0.." + std::to_string(st.cell_count - 1) +
                                  " (cell " + std::to_string(c) + " at " + std::to_string(m.pos) +
                                  "): mlx-lm's KVCache holds positions 0..offset-1 only");
    }
    order[uint32_t(m.pos)] = c;
  }
  return std::make_pair(*stream, std::move(order));
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

// The KVCache file (meta_state layout) of the f32 state `f` (parsed from `mem`).
Result<MlxOutFile> mlx_file_of(const StateFile& f, const ReadableFile& mem, size_t stream,
                               const std::vector<uint32_t>& order, const std::vector<const LayerProfile*>& layers,
                               bool permute, const std::string& dtype) {
  const KvStream& st = f.memory.kv[0].streams[stream];
  const uint64_t T = order.size();
  const uint64_t item = safetensors_itemsize(dtype);
  MlxOutFile out;
  for (size_t il = 0; il < st.layers.size(); ++il) {
    const KvLayer& L = st.layers[il];
    const LayerProfile& lp = *layers[il];
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
        KV_RETURN_IF_ERROR(read_f32_rows(mem, is_v ? L.v : L.k, uint64_t(order[tt]) * width, width, row));
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
  if (p.is_iswa()) return Status::NotSupported(who + ": sliding-window attention (iSWA): not supported across engines yet");
  if (p.is_hybrid() || p.is_recurrent_only()) {
    return Status::NotSupported(who + ": recurrent state (hybrid or recurrent model): mlx-lm's KV caches cannot hold it");
  }
  if (p.is_mla) return Status::NotSupported(who + ": MLA (latent K, no V rows): not supported across engines");
  if (p.has_cell_ext) return Status::NotSupported(who + ": M-RoPE (positions per cell): not supported across engines");
  KV_ASSIGN_OR_RETURN(const CrossEngineArch* a, cross_engine_arch_for(p, who));
  const std::string rope = std::string(rope_kind_name(a->rope)) + " rope";
  if (a->map == KMap::kPermute) {
    return KOrder{true, p.arch + ": " + rope + ", converter permuted Q/K, mlx-lm " + a->mlx_module +
                            " rotate-half: K pairs (2j, 2j+1) <-> (j, j+D/2)"};
  }
  return KOrder{false, p.arch + ": " + rope + ", converter kept Q/K, mlx-lm " + a->mlx_module +
                           (a->mlx_traditional ? " traditional" : " rotate-half") + " rope: K in the same order"};
}

Result<CrossEngineResult> llama_to_mlx(const StateFile& src, const ReadableFile& file, const ModelInfo& model,
                                       const LlamaToMlxSpec& spec, ByteSink& out) {
  const std::string name = file.name();
  CrossEngineResult res;
  KV_ASSIGN_OR_RETURN(res.k_order, cross_engine_k_order(model));
  KV_RETURN_IF_ERROR(model.check_state(src, name));
  KV_ASSIGN_OR_RETURN(auto where, cell_order(src, name));
  const std::vector<const LayerProfile*> layers = kv_layers(model);
  if (layers.size() != src.memory.kv[0].streams[where.first].layers.size()) {
    return Status::Mismatch(name + ": " + std::to_string(src.memory.kv[0].streams[where.first].layers.size()) +
                            " KV layers, the model " + std::to_string(layers.size()));
  }
  if (spec.quant.bits) KV_RETURN_IF_ERROR(mlx_affine_check(spec.quant.bits, spec.quant.group_size).Prefixed(name));

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

  const KvLayer& l0 = src.memory.kv[0].streams[where.first].layers[0];
  const std::string dtype = spec.dtype.empty() ? mlx_dtype_of(l0.k_type) : spec.dtype;
  if (dtype != "F16" && dtype != "BF16" && dtype != "F32") {
    return Status::InvalidArgument(name + ": mlx dtype '" + dtype + "': give F16, BF16 or F32");
  }
  KV_ASSIGN_OR_RETURN(MlxOutFile mf, mlx_file_of(f32, f32_file, where.first, where.second, layers,
                                                 res.k_order.permuted, dtype));
  for (size_t il = 0; il < layers.size(); ++il) {
    mf.metadata.emplace_back("0." + std::to_string(il), "");
    mf.metadata.emplace_back("2." + std::to_string(il), "KVCache");
  }
  mf.metadata.emplace_back("1.model", spec.model_name.empty() ? model.profile.name : spec.model_name);
  mf.metadata.emplace_back("1.tokens", tokens_json(src.tokens.tokens));
  std::sort(mf.metadata.begin(), mf.metadata.end());
  res.n_tokens = uint32_t(where.second.size());
  res.n_layers = uint32_t(layers.size());
  if (src.tokens.tokens.size() != where.second.size()) {
    res.notes.push_back("the file holds " + std::to_string(src.tokens.tokens.size()) + " tokens for " +
                        std::to_string(where.second.size()) + " cells; its token list is carried as it is");
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
    KV_RETURN_IF_ERROR(mlx_requantize(cur.cache, *cur.file, rq, tee).status());
    res.bytes_out = counted.count;
  }
  res.from = state_format_name(src) + ", K " + state_types(src, false) + ", V " + state_types(src, true) + " (" +
             state_v_layout(src) + ")";
  res.to = std::string("mlx-lm ") + (spec.quant.is_float() ? "KVCache " + dtype : "QuantizedKVCache " + spec.quant.name()) +
           " (" + mlx_layout_name(spec.layout) + ")";
  return res;
}

namespace {

// The f32 K/V rows of a float mlx-lm cache, in llama.cpp's order, for write_state.
class MlxRowSource final : public TensorSource {
 public:
  MlxRowSource(const MlxPromptCache& c, const ReadableFile& f, uint32_t T, bool permute)
      : c_(c), f_(f), T_(T), permute_(permute) {}
  Status emit(const StateFile&, const TensorRef& ref, ByteSink& out) override {
    const MlxKvSide& s = ref.is_v ? *c_.layers[ref.layer].v : *c_.layers[ref.layer].k;
    KV_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, read_tensor(c_.st, f_, *s.data));
    const uint64_t H = uint64_t(s.heads), D = uint64_t(s.head_dim), R = uint64_t(s.rows);
    const uint64_t item = safetensors_itemsize(s.dtype);
    std::vector<float> head(D), row(H * D);
    std::vector<std::byte> rb(H * D * 4);
    for (uint64_t t = 0; t < T_; ++t) {
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
  uint32_t T_;
  bool permute_;
};

// Checks the float cache's layers against the model; returns the shared offset.
Result<uint32_t> check_against_model(const MlxPromptCache& c, const std::string& name,
                                     const std::vector<const LayerProfile*>& layers, const std::string& model) {
  if (c.layers.size() != layers.size()) {
    return Status::Mismatch(name + ": " + std::to_string(c.layers.size()) + " layers, but " + model + " has " +
                            std::to_string(layers.size()) + " KV layers");
  }
  std::optional<int64_t> offset;
  for (size_t il = 0; il < layers.size(); ++il) {
    const MlxLayer& L = c.layers[il];
    const std::string where = name + ": layer " + std::to_string(il) + " (" + L.cls + ")";
    const bool ring = L.cls == "RotatingKVCache";
    if ((L.cls != "KVCache" && !ring) || !L.k || !L.v || !L.offset) {
      return Status::NotSupported(where + ": only KVCache, QuantizedKVCache and (before its ring wraps) "
                                          "RotatingKVCache layers move to llama.cpp");
    }
    // A ring (mlx-lm --max-kv-size) that never wrapped holds positions 0..offset-1 in rows 0..offset-1,
    // each computed with every earlier position in its window: an ordinary prefix. Once offset passes
    // max_size the first positions are overwritten and later ones saw only a window, which llama.cpp's
    // full-attention cache cannot represent.
    if (ring && (!L.max_size || !L.idx || *L.offset > *L.max_size || *L.idx != *L.offset)) {
      return Status::NotSupported(
          where + ": its ring of " + (L.max_size ? std::to_string(*L.max_size) : "?") + " positions has wrapped (offset " +
          std::to_string(*L.offset) + ", _idx " + (L.idx ? std::to_string(*L.idx) : "?") +
          "): its first positions were overwritten and later ones attended to a window only; llama.cpp's "
          "full-attention cache cannot hold that (save the session before it passes --max-kv-size)");
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
    if (offset && *offset != *L.offset) {
      return Status::NotSupported(where + ": offset " + std::to_string(*L.offset) + ", layer 0's " +
                                  std::to_string(*offset) + ": the layers must hold the same tokens");
    }
    if (*L.offset > L.k->rows || *L.offset > L.v->rows) return Status::Corruption(where + ": offset past its rows");
    offset = *L.offset;
  }
  if (!offset || *offset <= 0) return Status::NotSupported(name + ": holds no tokens: nothing to move");
  return uint32_t(*offset);
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
    if (k == "tokens") return parse_token_list(v, name + ": metadata 'tokens'");
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
  KV_ASSIGN_OR_RETURN(const uint32_t T, check_against_model(*cache, name, layers, model.path));
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
  KvSection sec;
  KvStream st;
  st.cell_count = T;
  for (uint32_t t = 0; t < T; ++t) st.cells.push_back(CellMeta{int32_t(t), {0}, {}});
  st.n_layer = uint32_t(layers.size());
  for (const LayerProfile* lp : layers) {
    KvLayer L;
    L.k_type = L.v_type = int32_t(GgmlType::kF32);
    L.k_row_bytes = uint64_t(lp->n_embd_k_gqa) * 4;
    L.v_row_bytes = uint64_t(lp->n_embd_v_gqa) * 4;
    st.layers.push_back(L);
  }
  sec.streams.push_back(std::move(st));
  f.memory.kv.push_back(std::move(sec));
  VectorSink f32_bytes;
  MlxRowSource rows(*cache, *data, T, res.k_order.permuted);
  const MemoryFile none("(none)", std::vector<std::byte>{});
  KV_RETURN_IF_ERROR(write_state(f, rows, none, f32_bytes));
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
  res.to = state_format_name(conv.target) + ", K " + state_types(conv.target, false) + ", V " +
           state_types(conv.target, true) + " (" + state_v_layout(conv.target) + ")";
  return res;
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
      while (e < n && !sep(text[e]) && e - i < 20) ++e;
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

}  // namespace kvsnap
