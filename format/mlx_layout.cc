#include "format/mlx_layout.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <optional>

#include "base/byte_order.h"
#include "base/json_access.h"

namespace kvsnap {
namespace {

// mlx-lm's KVCache/QuantizedKVCache/RotatingKVCache grow in steps of 256 rows; the meta_state of
// 0.19.1 .. 0.28.0 records it and nothing else ever changed it.
constexpr int64_t kMlxStep = 256;

struct IntField {
  const char* name;
  int64_t value;
};

// The integer state of a layer in the order the scalars layout stores it (after keys and values).
std::vector<IntField> scalar_fields(const MlxLayer& L) {
  if (L.cls == "QuantizedKVCache") return {{"offset", *L.offset}, {"group_size", *L.group_size}, {"bits", *L.bits}};
  if (L.cls == "RotatingKVCache") {
    return {{"offset", *L.offset}, {"keep", *L.keep}, {"max_size", *L.max_size}, {"_idx", *L.idx}};
  }
  if (L.cls == "ChunkedKVCache") {
    return {{"offset", *L.offset}, {"chunk_size", *L.chunk_size}, {"start_position", *L.start_position}};
  }
  return {{"offset", *L.offset}};
}

// ... and in the order of the meta layouts' meta_state strings (KVCache: none).
std::vector<IntField> meta_fields(const MlxLayer& L, bool step) {
  const int64_t s = L.step.value_or(kMlxStep);
  std::vector<IntField> f;
  if (L.cls == "QuantizedKVCache") {
    f = {{"offset", *L.offset}, {"group_size", *L.group_size}, {"bits", *L.bits}};
    if (step) f.insert(f.begin(), IntField{"step", s});
  } else if (L.cls == "RotatingKVCache") {
    f = {{"keep", *L.keep}, {"max_size", *L.max_size}, {"offset", *L.offset}, {"_idx", *L.idx}};
    if (step) f.insert(f.begin() + 2, IntField{"step", s});
  } else if (L.cls == "ChunkedKVCache") {
    f = {{"chunk_size", *L.chunk_size}, {"start_position", *L.start_position}};
  }
  return f;
}

// The K/V tensors of a layer and their names inside its state (float: 2, quantized: 6).
std::vector<std::pair<const SafetensorsTensor*, std::string>> kv_parts(const MlxLayer& L) {
  std::vector<std::pair<const SafetensorsTensor*, std::string>> out;
  int side = 0;
  for (const MlxKvSide* s : {&*L.k, &*L.v}) {
    const std::string p = "." + std::to_string(side++);
    if (s->scales) {
      out.emplace_back(s->data, p + ".0");
      out.emplace_back(s->scales, p + ".1");
      out.emplace_back(s->biases, p + ".2");
    } else {
      out.emplace_back(s->data, p);
    }
  }
  return out;
}

// Bytes of one row (axis 2) of a [B, H, S, ...] tensor.
uint64_t row_bytes_of(const SafetensorsTensor& t) {
  uint64_t n = safetensors_itemsize(t.dtype);
  for (size_t d = 3; d < t.shape.size(); ++d) n *= uint64_t(t.shape[d]);
  return n;
}

Status append_zeros(ByteSink& sink, uint64_t n) {
  static const std::vector<std::byte> kZeros(1 << 16);
  for (; n > 0;) {
    const uint64_t k = std::min<uint64_t>(n, kZeros.size());
    KV_RETURN_IF_ERROR(sink.append(kZeros.data(), k));
    n -= k;
  }
  return Status::OK();
}

// A move in progress: the output tensors (each with the input tensor whose place in the data
// order it takes, if any) and metadata.
struct Move {
  const MlxPromptCache& in;
  const MlxTarget& to;
  bool sc = false;                                     // the target is the scalars layout
  std::optional<int64_t> prefix;                       // mlx_prefix: keep the first n positions
  std::map<std::string, std::string> in_types;         // scalars input: tensor -> scalar|string|none
  std::vector<std::pair<MlxOutTensor, const SafetensorsTensor*>> tensors;
  std::vector<std::pair<std::string, std::string>> meta;     // meta layouts: "0.<L>..." meta_state
  std::vector<std::pair<std::string, std::string>> scalars;  // scalars layout: tensor name, type
};

Status refuse(const Move& m, const MlxLayer& L, const std::string& why) {
  return Status::NotSupported(m.in.st.file + ": layer " + L.prefix + " (" + L.cls + "): " + m.to.name() + " " + why);
}

// Scalars to scalars: a made tensor keeps the place of the input tensor of the same name.
const SafetensorsTensor* anchor(const Move& m, const std::string& name) {
  return m.in.layout == MlxLayout::kScalars ? m.in.st.find(name) : nullptr;
}

void carry(Move& m, const SafetensorsTensor* t, const std::string& name, int64_t rows = -1) {
  MlxOutTensor o;
  o.t = *t;
  o.t.name = name;
  o.src = t;
  o.rows = rows;
  if (rows >= 0) o.t.shape[2] = rows;
  m.tensors.emplace_back(std::move(o), t);
}

void add_made(Move& m, MlxOutTensor o, const char* type) {
  m.scalars.emplace_back(o.t.name, type);
  const SafetensorsTensor* a = anchor(m, o.t.name);
  m.tensors.emplace_back(std::move(o), a);
}

// None in the scalars layout: `mx.array([])`, F32 [0].
void add_none(Move& m, const std::string& name) {
  MlxOutTensor o;
  o.t.name = name;
  o.t.dtype = "F32";
  o.t.shape = {0};
  add_made(m, std::move(o), "none");
}

// A string in the scalars layout: its code points, I32 [n].
void add_string(Move& m, const std::string& name, const std::string& s) {
  MlxOutTensor o;
  o.t.name = name;
  o.t.dtype = "I32";
  o.t.shape = {int64_t(s.size())};
  for (char ch : s) append_le<int32_t>(o.bytes, int32_t(uint8_t(ch)));
  add_made(m, std::move(o), "string");
}

// The integer state: scalar tensors "<dst>.2", ... or meta_state strings "<meta>.0", ... ("" if none).
void put_fields(Move& m, const MlxLayer& L, const std::string& dst, const std::string& meta) {
  if (m.sc) {
    const auto f = scalar_fields(L);
    for (size_t i = 0; i < f.size(); ++i) add_made(m, mlx_scalar_tensor(dst + "." + std::to_string(2 + i), f[i].value), "scalar");
    return;
  }
  const auto f = meta_fields(L, m.to.layout == MlxLayout::kMetaStep);
  if (f.empty()) m.meta.emplace_back(meta, "");
  for (size_t i = 0; i < f.size(); ++i) m.meta.emplace_back(meta + "." + std::to_string(i), std::to_string(f[i].value));
}

Status refuse_cut(const Move& m, const MlxLayer& L, const std::string& why) {
  return Status::NotSupported(m.in.st.file + ": layer " + L.prefix + " (" + L.cls + "): cannot cut it to its first " +
                              std::to_string(*m.prefix) + " positions: " + why);
}

// mlx_prefix of one attention layer: the layer as it would be after the first n positions only,
// where the saved rows hold exactly those positions in order (mlx_layout.h says which).
Result<MlxLayer> cut_layer(const Move& m, const MlxLayer& L) {
  const int64_t n = *m.prefix;
  if (n > *L.offset) {
    return Status::InvalidArgument("{--tokens} " + std::to_string(n) + ": " + m.in.st.file + ": layer " + L.prefix +
                                   " (" + L.cls + ") holds " + std::to_string(*L.offset) + " positions; ask for 1.." +
                                   std::to_string(*L.offset));
  }
  if (L.cls == "RotatingKVCache" && (*L.offset > *L.max_size || *L.idx != *L.offset)) {
    return refuse_cut(m, L, "its ring of " + std::to_string(*L.max_size) + " positions has wrapped (offset " +
                                std::to_string(*L.offset) + ", _idx " + std::to_string(*L.idx) +
                                "): the first positions were overwritten by later ones");
  }
  if (L.cls == "ChunkedKVCache" && *L.start_position != 0) {
    return refuse_cut(m, L, "it dropped its first " + std::to_string(*L.start_position) +
                                " positions (start_position) when its chunk filled; a prefix would hold others");
  }
  if (L.k->rows < n || L.v->rows < n) {
    return Status::Corruption(m.in.st.file + ": layer " + L.prefix + " (" + L.cls + "): offset " +
                              std::to_string(*L.offset) + " but only " + std::to_string(std::min(L.k->rows, L.v->rows)) +
                              " rows saved");
  }
  MlxLayer cut = L;
  cut.offset = n;
  if (L.cls == "RotatingKVCache") cut.idx = n;  // the next write goes right after the prefix, as before the ring fills
  return cut;
}

// KVCache, QuantizedKVCache, RotatingKVCache, ChunkedKVCache.
Status move_kv(Move& m, const MlxLayer& L, const std::string& dst, const std::string& meta) {
  if (m.prefix) {
    KV_ASSIGN_OR_RETURN(const MlxLayer cut, cut_layer(m, L));
    // mlx-lm 0.32's KVCache.state is its buffer of 256-row steps (KVCache.update_and_fetch):
    // what it saves after computing the n positions in one go
    const int64_t step = 256, n = *m.prefix;
    const bool pad = m.sc && L.cls == "KVCache";
    for (const auto& [t, suffix] : kv_parts(cut)) {
      carry(m, t, dst + suffix, pad ? (n + step - 1) / step * step : n);
      if (pad) m.tensors.back().first.data_rows = n;
    }
    put_fields(m, cut, dst, meta);
    return Status::OK();
  }
  if (L.cls == "QuantizedKVCache" && !m.to.at_least(19, 3)) return refuse(m, L, "has no QuantizedKVCache (0.19.3 added it)");
  if (L.cls == "ChunkedKVCache" && !m.to.at_least(23, 0)) {
    return refuse(m, L, "cannot load a ChunkedKVCache (it lived in llama4.py: KeyError, mlx-lm #80; fixed in 0.23.0)");
  }
  // The meta loaders of KVCache and ChunkedKVCache take offset from the rows saved. QuantizedKVCache's
  // keep it in meta_state, but mlx-lm <= 0.31 saves only its first offset rows (QuantizedKVCache.state)
  // and a float conversion of the file would take the rows for the offset: cut to it too.
  int64_t rows = -1;
  if (!m.sc && (L.cls == "KVCache" || L.cls == "QuantizedKVCache") && L.k->rows > *L.offset) rows = *L.offset;
  if (!m.sc && L.cls == "ChunkedKVCache" && L.k->rows != *L.offset) {
    const int64_t valid = *L.offset - *L.start_position;
    uint64_t bytes = 0;
    if (*L.start_position < 0 || valid < 0 || valid > L.k->rows ||
        __builtin_mul_overflow(uint64_t(*L.offset), row_bytes_of(*L.k->data) + row_bytes_of(*L.v->data), &bytes) ||
        __builtin_mul_overflow(bytes, uint64_t(L.k->batch * L.k->heads), &bytes) || bytes > (uint64_t(1) << 40)) {
      return Status::Corruption(m.in.st.file + ": layer " + L.prefix + " (ChunkedKVCache): offset " +
                                std::to_string(*L.offset) + ", start_position " + std::to_string(*L.start_position) +
                                " and " + std::to_string(L.k->rows) + " rows saved do not fit together");
    }
    rows = *L.offset;
  }
  for (const auto& [t, suffix] : kv_parts(L)) carry(m, t, dst + suffix, rows);
  put_fields(m, L, dst, meta);
  return Status::OK();
}

// ArraysCache/MambaCache state as the input holds it: arrays (nullptr: None), left_padding, lengths.
struct ArraysState {
  std::vector<const SafetensorsTensor*> arrays;
  const SafetensorsTensor* left_padding = nullptr;
  const SafetensorsTensor* lengths = nullptr;
};

const SafetensorsTensor* unless_none(const Move& m, const SafetensorsTensor* t) {
  if (!t) return nullptr;
  auto it = m.in_types.find(t->name);
  return it != m.in_types.end() && it->second == "none" ? nullptr : t;
}

Result<ArraysState> arrays_state(const Move& m, const MlxLayer& L, const std::string& src) {
  ArraysState s;
  const bool sc = m.in.layout == MlxLayout::kScalars;
  const std::string list = sc ? src + ".0." : src + ".";
  size_t found = 0;
  for (size_t i = 0;; ++i) {
    const SafetensorsTensor* t = m.in.st.find(list + std::to_string(i));
    if (!t) break;
    ++found;
    s.arrays.push_back(unless_none(m, t));
  }
  if (sc) {
    const SafetensorsTensor* lp = m.in.st.find(src + ".1");
    const SafetensorsTensor* ln = m.in.st.find(src + ".2");
    found += (lp != nullptr) + (ln != nullptr);
    s.left_padding = unless_none(m, lp);
    s.lengths = unless_none(m, ln);
  }
  if (found != L.arrays.size() || s.arrays.empty()) {
    return Status::Corruption(m.in.st.file + ": layer " + L.prefix + " (" + L.cls + "): " + std::to_string(L.arrays.size()) +
                              " tensors under '" + src + ".', of which " + std::to_string(s.arrays.size()) +
                              " are the arrays '" + list + "0', '" + list + "1', ... in a row: not a state mlx-lm wrote");
  }
  return s;
}

// The class an ArraysCache/MambaCache is for the target: MambaCache is gone from 0.30.6 (#842);
// loaders before 0.28.1 call ArraysCache() without its size, so there only MambaCache (2 arrays) loads.
Result<std::string> arrays_class(const Move& m, const MlxLayer& L, size_t n) {
  if (!m.to.at_least(28, 1)) {
    if (n != 2) {
      return refuse(m, L, "cannot load an ArraysCache (its loader calls ArraysCache() without the size) and only a "
                          "MambaCache of 2 arrays stands in for one; this one holds " + std::to_string(n) +
                          ": give {--mlx-lm} 0.28.1 or later");
    }
    return std::string("MambaCache");
  }
  return m.to.at_least(30, 6) ? std::string("ArraysCache") : L.cls;
}

Status move_arrays(Move& m, const MlxLayer& L, const std::string& src, const std::string& dst, const std::string& meta,
                   std::string& cls) {
  KV_ASSIGN_OR_RETURN(ArraysState s, arrays_state(m, L, src));
  KV_ASSIGN_OR_RETURN(cls, arrays_class(m, L, s.arrays.size()));
  if (m.sc) {
    for (size_t i = 0; i < s.arrays.size(); ++i) {
      const std::string name = dst + ".0." + std::to_string(i);
      s.arrays[i] ? carry(m, s.arrays[i], name) : add_none(m, name);
    }
    s.left_padding ? carry(m, s.left_padding, dst + ".1") : add_none(m, dst + ".1");
    s.lengths ? carry(m, s.lengths, dst + ".2") : add_none(m, dst + ".2");
    return Status::OK();
  }
  // The meta layouts' state is the list of arrays only, and a None in it cannot be saved.
  const char* lost = s.left_padding ? "left_padding" : s.lengths ? "lengths" : nullptr;
  if (lost) return refuse(m, L, std::string("saves no ") + lost + " (the ArraysCache state holds it from mlx-lm 0.32 on, #1632)");
  for (size_t i = 0; i < s.arrays.size(); ++i) {
    if (!s.arrays[i]) return refuse(m, L, "cannot save array " + std::to_string(i) + ", which is None (from 0.32 on it can)");
    carry(m, s.arrays[i], dst + "." + std::to_string(i));
  }
  m.meta.emplace_back(meta, "");
  return Status::OK();
}

Status move_layer(Move& m, const MlxLayer& L, const std::string& src, const std::string& dst, const std::string& meta,
                  std::string& cls);

// CacheList: members moved by their own rules. Scalars: member i is "<L>.<i>.0.<state>" with its class
// name as the string "<L>.<i>.1"; meta layouts: "<L>.<i>.<state>", meta_state ([classes], [metas]).
Status move_list(Move& m, const MlxLayer& L, const std::string& src, const std::string& dst, const std::string& meta) {
  if (!m.to.at_least(31, 0)) {
    return refuse(m, L, "cannot load a CacheList (before 0.31.0, #886, its loader drops the members' state or fails "
                        "on it): give {--mlx-lm} 0.31.0 or later");
  }
  const bool in_sc = m.in.layout == MlxLayout::kScalars;
  for (size_t i = 0; i < L.sub.size(); ++i) {
    const std::string n = "." + std::to_string(i);
    std::string cls;
    KV_RETURN_IF_ERROR(move_layer(m, L.sub[i], src + n + (in_sc ? ".0" : ""), dst + n + (m.sc ? ".0" : ""),
                                  meta + ".1" + n, cls));
    if (m.sc) {
      add_string(m, dst + n + ".1", cls);
    } else {
      m.meta.emplace_back(meta + ".0" + n, cls);
    }
  }
  return Status::OK();
}

// One layer (or CacheList member) whose state is under `src` in the input and goes under `dst`;
// `meta` is where its meta_state goes (meta layouts). `cls` gets its class name in the target.
Status move_layer(Move& m, const MlxLayer& L, const std::string& src, const std::string& dst, const std::string& meta,
                  std::string& cls) {
  cls = L.cls;
  if (L.cls == "CacheList") return move_list(m, L, src, dst, meta);
  if (m.prefix && (L.cls == "ArraysCache" || L.cls == "MambaCache")) {
    return refuse_cut(m, L, "its state is recurrent (each array has seen every position) and cannot be rewound");
  }
  if (L.cls == "ArraysCache" || L.cls == "MambaCache") return move_arrays(m, L, src, dst, meta, cls);
  if (L.cls == "KVCache" || L.cls == "QuantizedKVCache" || L.cls == "RotatingKVCache" || L.cls == "ChunkedKVCache") {
    return move_kv(m, L, dst, meta);
  }
  if (m.prefix) {
    return refuse_cut(m, L, "its class is not supported (KVCache, QuantizedKVCache, RotatingKVCache, ChunkedKVCache "
                            "and CacheList are)");
  }
  return Status::NotSupported(m.in.st.file + ": layer " + L.prefix + " is a " + L.cls +
                              ": changing the layout of its class is not supported (KVCache, QuantizedKVCache, "
                              "RotatingKVCache, ChunkedKVCache, ArraysCache, MambaCache and CacheList are)");
}

// The input's scalars list: tensor name -> type.
std::map<std::string, std::string> scalar_types(const MlxPromptCache& in) {
  std::map<std::string, std::string> names, types, out;
  if (in.layout != MlxLayout::kScalars || !in.st.metadata) return out;
  for (const auto& [k, v] : *in.st.metadata) {
    if (k.size() < 5 || k.compare(0, 2, "2.") != 0) continue;
    const std::string j = k.substr(2, k.size() - 4);
    if (k.compare(k.size() - 2, 2, ".0") == 0) names[j] = v;
    if (k.compare(k.size() - 2, 2, ".1") == 0) types[j] = v;
  }
  for (const auto& [j, name] : names) {
    if (auto t = types.find(j); t != types.end()) out[name] = t->second;
  }
  return out;
}

// The user metadata "tokens" (the prompt's ids as a JSON list: kvsnap convert --to mlx writes it)
// cut to the first n, as the cache it describes is.
Result<std::string> cut_tokens_metadata(const std::string& file, const std::string& value, int64_t n) {
  const std::string what = file + ": metadata 'tokens'";
  KV_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json(value, what, Code::kNotSupported));
  if (!j.is_array() || !std::all_of(j.begin(), j.end(), [](const nlohmann::json& e) { return e.is_number_integer(); }))
    return Status::NotSupported(what + " is not a JSON list of token ids, so it cannot be cut to a prefix");
  if (j.size() < uint64_t(n)) {
    return Status::NotSupported(what + " holds " + std::to_string(j.size()) + " ids, fewer than the " +
                                std::to_string(n) + " positions asked for");
  }
  std::string out = "[";
  for (int64_t i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(j[size_t(i)].get<int64_t>());
  return out + "]";
}

// Every layer moved (mlx_change_layout), or cut to its first `prefix` positions (mlx_prefix).
Result<MlxOutFile> move_file(const MlxPromptCache& in, const MlxTarget& to, std::optional<int64_t> prefix) {
  Move m{in, to, to.layout == MlxLayout::kScalars, prefix, scalar_types(in), {}, {}, {}};
  std::vector<std::pair<std::string, std::string>> classes;
  for (const MlxLayer& L : in.layers) {
    std::string cls;
    KV_RETURN_IF_ERROR(move_layer(m, L, L.prefix, L.prefix, "0." + L.prefix, cls));
    classes.emplace_back((m.sc ? "1." : "2.") + L.prefix, cls);
  }
  // Data order: the input's for carried tensors (and made ones that take an input tensor's
  // place), then the new ones in the order they were made.
  std::map<const SafetensorsTensor*, size_t> pos;
  for (size_t i = 0; i < in.st.data_order.size(); ++i) pos[&in.st.tensors[in.st.data_order[i]]] = i;
  auto rank = [&](const auto& e) { return e.second ? pos.at(e.second) : SIZE_MAX; };
  std::stable_sort(m.tensors.begin(), m.tensors.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  MlxOutFile out;
  for (auto& [t, a] : m.tensors) out.tensors.push_back(std::move(t));
  for (const auto& [k, v] : in.user_metadata) {
    std::string value = v;
    if (prefix && k == "tokens") {
      KV_ASSIGN_OR_RETURN(value, cut_tokens_metadata(in.st.file, v, *prefix));
    }
    out.metadata.emplace_back((m.sc ? "0." : "1.") + k, std::move(value));
  }
  out.metadata.insert(out.metadata.end(), classes.begin(), classes.end());
  if (m.sc) {
    out.metadata.emplace_back("2.0", "");
    for (size_t j = 0; j < m.scalars.size(); ++j) {
      out.metadata.emplace_back("2." + std::to_string(j + 1) + ".0", m.scalars[j].first);
      out.metadata.emplace_back("2." + std::to_string(j + 1) + ".1", m.scalars[j].second);
    }
  } else {
    out.metadata.insert(out.metadata.end(), m.meta.begin(), m.meta.end());
  }
  return out;
}

}  // namespace

std::string MlxTarget::name() const {
  return "mlx-lm 0." + std::to_string(minor) + "." + std::to_string(patch);
}

MlxOutTensor mlx_scalar_tensor(const std::string& name, int64_t v) {
  MlxOutTensor o;
  o.t.name = name;
  o.t.dtype = "I32";
  append_le<int32_t>(o.bytes, int32_t(v));
  return o;
}

Status check_release_loads_quantized_kv(const MlxTarget& t) {
  if (t.at_least(19, 3)) return Status::OK();
  return Status::NotSupported(t.name() + " has no QuantizedKVCache (0.19.3 added it): quantized K/V "
                              "({--kv-bits}) cannot go to it; keep them float ({--kv-bits none}) or name 0.19.3 or later");
}

Result<MlxTarget> mlx_target_for(const std::string& name) {
  static const struct {
    const char* name;
    MlxLayout layout;
    int minor, patch;
  } kLayouts[] = {{"meta_state-with-step", MlxLayout::kMetaStep, 28, 0}, {"meta-step", MlxLayout::kMetaStep, 28, 0},
                  {"meta_state", MlxLayout::kMeta, 31, 3},            {"meta", MlxLayout::kMeta, 31, 3},
                  {"scalars", MlxLayout::kScalars, 32, 2}};
  for (const auto& l : kLayouts) {
    if (name == l.name) return MlxTarget{l.layout, l.minor, l.patch};
  }
  const std::string v = !name.empty() && name[0] == 'v' ? name.substr(1) : name;
  int major = -1, minor = -1, patch = 0;
  char tail = 0;
  const int n = std::sscanf(v.c_str(), "%d.%d.%d%c", &major, &minor, &patch, &tail);
  if ((n == 2 || n == 3) && major == 0 && minor >= 0 && patch >= 0) {
    MlxTarget t{MlxLayout::kScalars, minor, patch};
    if (!t.at_least(19, 1)) {
      return Status::InvalidArgument("mlx-lm " + v + ": releases before 0.19.1 saved '<i>_keys' files (mlx-lm's "
                                     "cache_prompt of 0.18.x), which kvsnap reads but does not write; give 0.19.1 or later");
    }
    t.layout = !t.at_least(28, 1) ? MlxLayout::kMetaStep : minor < 32 ? MlxLayout::kMeta : MlxLayout::kScalars;
    return t;
  }
  return Status::InvalidArgument("mlx-lm release '" + name +
                                 "': give the mlx-lm version that will load the file (e.g. 0.28.0, 0.31.3, 0.32.2; "
                                 "`python -c 'import mlx_lm; print(mlx_lm.__version__)'`) or a layout: "
                                 "meta_state-with-step, meta_state, scalars");
}

Result<MlxLayout> mlx_layout_for(const std::string& name) {
  KV_ASSIGN_OR_RETURN(MlxTarget t, mlx_target_for(name));
  return t.layout;
}

Result<MlxOutFile> mlx_change_layout(const MlxPromptCache& in, MlxLayout to) {
  KV_ASSIGN_OR_RETURN(MlxTarget t, mlx_target_for(mlx_layout_name(to)));
  return mlx_change_layout(in, t);
}

Result<MlxOutFile> mlx_change_layout(const MlxPromptCache& in, const MlxTarget& to) {
  return move_file(in, to, std::nullopt);
}

Result<MlxOutFile> mlx_prefix(const MlxPromptCache& in, int64_t n) {
  if (n < 1) return Status::InvalidArgument("{--tokens} " + std::to_string(n) + ": ask for 1 position or more");
  if (in.layout == MlxLayout::kKeysValues) {
    return Status::NotSupported(in.st.file + ": cannot cut an mlx-lm 0.18.x '<i>_keys' file to a prefix (no mlx-lm "
                                "since 0.19.1 loads it); move it to a later layout first ({--mlx-lm} VERSION)");
  }
  KV_ASSIGN_OR_RETURN(const MlxTarget own, mlx_target_for(mlx_layout_name(in.layout)));
  return move_file(in, own, n);
}

Status write_mlx_file(const MlxOutFile& out, const MlxPromptCache& in, const ReadableFile& src, ByteSink& sink) {
  Safetensors st;
  uint64_t at = 0;
  for (const MlxOutTensor& o : out.tensors) {
    SafetensorsTensor t = o.t;
    t.begin = at;
    t.end = at + t.elements() * safetensors_itemsize(t.dtype);
    at = t.end;
    st.data_order.push_back(st.tensors.size());
    st.tensors.push_back(std::move(t));
  }
  st.metadata = out.metadata;
  const std::string header = safetensors_header_text(st);
  std::vector<std::byte> len;
  append_le<uint64_t>(len, header.size());
  KV_RETURN_IF_ERROR(sink.append(len));
  KV_RETURN_IF_ERROR(sink.append(header.data(), header.size()));
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    const MlxOutTensor& o = out.tensors[i];
    if (!o.src && o.produce) {
      CountingSink counted;
      TeeSink tee(sink, counted);
      KV_RETURN_IF_ERROR(o.produce(tee));
      if (counted.count != st.tensors[i].bytes()) {
        return Status::Corruption("mlx-lm prompt cache: internal: tensor '" + o.t.name + "': " + std::to_string(counted.count) +
                                " bytes written for a tensor of " + std::to_string(st.tensors[i].bytes()));
      }
      continue;
    }
    if (!o.src) {
      KV_RETURN_IF_ERROR(sink.append(o.bytes));
      continue;
    }
    const uint64_t base = in.st.data_start() + o.src->begin;
    if (o.rows < 0) {
      KV_RETURN_IF_ERROR(copy_bytes(src, base, o.src->bytes(), sink));
      continue;
    }
    // [B, H, S, ...]: the first `rows` rows of each of the B*H row blocks, zero rows past S.
    const auto& s = o.src->shape;
    const uint64_t blocks = uint64_t(s[0]) * uint64_t(s[1]);
    const uint64_t row_bytes = row_bytes_of(*o.src);
    uint64_t have = std::min<uint64_t>(uint64_t(o.rows), uint64_t(s[2]));
    if (o.data_rows >= 0) have = std::min<uint64_t>(have, uint64_t(o.data_rows));
    for (uint64_t b = 0; b < blocks; ++b) {
      KV_RETURN_IF_ERROR(copy_bytes(src, base + b * uint64_t(s[2]) * row_bytes, have * row_bytes, sink));
      KV_RETURN_IF_ERROR(append_zeros(sink, (uint64_t(o.rows) - have) * row_bytes));
    }
  }
  return Status::OK();
}

}  // namespace kvsnap
