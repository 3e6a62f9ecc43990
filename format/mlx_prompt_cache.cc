#include "format/mlx_prompt_cache.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>

#include "base/byte_order.h"

namespace kvsnap {
namespace {

using Meta = std::map<std::string, std::string, std::less<>>;

struct Ctx {
  const ReadableFile& f;
  const Safetensors& st;
  MlxLayout layout;
  Meta meta;
};

// The layer being parsed and where its state and meta_state live.
struct Where {
  std::string tensors;  // "3" -> tensors "3.0", "3.1", ...
  std::string meta;     // meta layouts: "0.3" -> meta_state strings "0.3.0", ...
};

Status layer_error(const Ctx& c, const MlxLayer& L, const std::string& problem) {
  return Status::Corruption(c.st.file + ": mlx-lm prompt cache: layer " + L.prefix + " (" + L.cls + "): " + problem);
}

bool is_float(const std::string& d) { return d == "F32" || d == "F16" || d == "BF16"; }

std::string shape_text(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "]";
}

Result<const SafetensorsTensor*> need(const Ctx& c, const MlxLayer& L, const Where& w, const std::string& rel,
                                      const char* what) {
  const std::string name = w.tensors + "." + rel;
  const SafetensorsTensor* t = c.st.find(name);
  if (!t) return layer_error(c, L, "tensor '" + name + "' (" + what + ") is missing");
  return t;
}

std::optional<int64_t> to_int(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// meta_state strings "<w.meta>.0", "<w.meta>.1", ... (none: the single "" value of stateless classes).
std::vector<std::string> meta_list(const Ctx& c, const std::string& prefix) {
  std::vector<std::string> out;
  for (size_t i = 0;; ++i) {
    auto it = c.meta.find(prefix + "." + std::to_string(i));
    if (it == c.meta.end()) return out;
    out.push_back(it->second);
  }
}

// The integer state is written back as mlx-lm writes it, 32-bit (mx.array of a Python int):
// a value outside that range would come out cut, another number, so the file is refused.
Status check_int32(const Ctx& c, const MlxLayer& L, const std::string& what, int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) return Status::OK();
  return layer_error(c, L, what + " = " + std::to_string(v) + " is outside the 32-bit range of mlx-lm's cache state");
}

// A 0-d integer tensor of the scalars layout (offset, bits, ...).
Result<int64_t> scalar_int(const Ctx& c, const MlxLayer& L, const Where& w, const std::string& rel, const char* what) {
  KV_ASSIGN_OR_RETURN(const SafetensorsTensor* t, need(c, L, w, rel, what));
  const uint64_t size = safetensors_itemsize(t->dtype);
  const bool integer = t->dtype[0] == 'I' || t->dtype[0] == 'U' || t->dtype == "BOOL";
  if (!t->shape.empty() || !integer || size > 8) {
    return layer_error(c, L, "tensor '" + t->name + "' (" + what + ") is " + t->dtype + " " + shape_text(t->shape) +
                                 ", not an integer scalar");
  }
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> b, read_tensor(c.st, c.f, *t));
  uint64_t u = load_le(b.data(), size);
  if (t->dtype[0] == 'I' && size < 8 && (u >> (8 * size - 1))) u |= ~uint64_t(0) << (8 * size);  // sign
  if (t->dtype[0] == 'U' && size == 8 && u > uint64_t(INT64_MAX)) u = uint64_t(INT64_MAX);  // refused below
  KV_RETURN_IF_ERROR(check_int32(c, L, "tensor '" + t->name + "' (" + what + ")", int64_t(u)));
  return int64_t(u);
}

// A string saved by the scalars layout: I32 code points (class names: printable ASCII).
Result<std::string> scalar_string(const Ctx& c, const MlxLayer& L, const Where& w, const std::string& rel) {
  KV_ASSIGN_OR_RETURN(const SafetensorsTensor* t, need(c, L, w, rel, "class name"));
  if (t->dtype != "I32" || t->shape.size() != 1 || t->shape[0] > 256) {
    return layer_error(c, L, "tensor '" + t->name + "' (class name) is " + t->dtype + " " + shape_text(t->shape) +
                                 ", not a string of at most 256 code points");
  }
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> b, read_tensor(c.st, c.f, *t));
  std::string s;
  for (size_t i = 0; i + 4 <= b.size(); i += 4) {
    const uint32_t ch = uint32_t(load_le(b.data() + i, 4));
    if (ch < 0x20 || ch > 0x7e) return layer_error(c, L, "tensor '" + t->name + "': class name is not ASCII");
    s.push_back(char(ch));
  }
  return s;
}

// The meta_state integers of a meta layout, exactly `n` of them.
Result<std::vector<int64_t>> meta_ints(const Ctx& c, const MlxLayer& L, const Where& w, size_t n, const char* names) {
  const std::vector<std::string> m = meta_list(c, w.meta);
  if (m.size() != n) {
    return layer_error(c, L, "meta_state has " + std::to_string(m.size()) + " strings under '" + w.meta +
                                 "', expected " + std::to_string(n) + " (" + names + ")");
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < n; ++i) {
    auto v = to_int(m[i]);
    if (!v) return layer_error(c, L, "meta_state '" + w.meta + "." + std::to_string(i) + "' = \"" + m[i] + "\" is not an integer");
    KV_RETURN_IF_ERROR(check_int32(c, L, "meta_state '" + w.meta + "." + std::to_string(i) + "'", *v));
    out.push_back(*v);
  }
  return out;
}

Result<MlxKvSide> float_tensor_side(const Ctx& c, const MlxLayer& L, const SafetensorsTensor* t, const char* what) {
  if (!is_float(t->dtype) || t->shape.size() != 4) {
    return layer_error(c, L, "tensor '" + t->name + "' (" + what + ") is " + t->dtype + " " + shape_text(t->shape) +
                                 ", expected a float [batch, heads, rows, head_dim]");
  }
  MlxKvSide s;
  s.data = t;
  s.batch = t->shape[0], s.heads = t->shape[1], s.rows = t->shape[2], s.head_dim = t->shape[3];
  s.dtype = t->dtype;
  return s;
}

Result<MlxKvSide> float_side(const Ctx& c, const MlxLayer& L, const Where& w, const std::string& rel, const char* what) {
  KV_ASSIGN_OR_RETURN(const SafetensorsTensor* t, need(c, L, w, rel, what));
  return float_tensor_side(c, L, t, what);
}

Result<MlxKvSide> quant_side(const Ctx& c, const MlxLayer& L, const Where& w, const std::string& rel, const char* what,
                             int64_t bits, int64_t gs) {
  MlxKvSide s;
  KV_ASSIGN_OR_RETURN(s.data, need(c, L, w, rel + ".0", what));
  KV_ASSIGN_OR_RETURN(s.scales, need(c, L, w, rel + ".1", "scales"));
  KV_ASSIGN_OR_RETURN(s.biases, need(c, L, w, rel + ".2", "biases"));
  const auto& ds = s.data->shape;
  const auto& ss = s.scales->shape;
  if (s.data->dtype != "U32" || ds.size() != 4) {
    return layer_error(c, L, "tensor '" + s.data->name + "' (" + what + ") is " + s.data->dtype + " " + shape_text(ds) +
                                 ", expected U32 [batch, heads, rows, head_dim*bits/32]");
  }
  if (!is_float(s.scales->dtype) || s.biases->dtype != s.scales->dtype || ss != s.biases->shape || ss.size() != 4 ||
      !std::equal(ds.begin(), ds.begin() + 3, ss.begin())) {
    return layer_error(c, L, "scales '" + s.scales->name + "' " + s.scales->dtype + " " + shape_text(ss) + " and biases " +
                                 s.biases->dtype + " " + shape_text(s.biases->shape) + " do not fit codes " + shape_text(ds));
  }
  s.batch = ds[0], s.heads = ds[1], s.rows = ds[2], s.head_dim = ss[3] * gs;
  s.dtype = s.scales->dtype;
  if (ds[3] * 32 != s.head_dim * bits) {
    return layer_error(c, L, "codes '" + s.data->name + "' have " + std::to_string(ds[3]) + " words per row; " +
                                 std::to_string(ss[3]) + " groups of " + std::to_string(gs) + " at " +
                                 std::to_string(bits) + " bits need " + std::to_string(s.head_dim * bits / 32));
  }
  return s;
}

// K and V must describe the same cells.
Status check_pair(const Ctx& c, MlxLayer& L) {
  const MlxKvSide& k = *L.k;
  const MlxKvSide& v = *L.v;
  // The file's size bounds batch x heads x rows x head_dim only when no factor is 0: a row of no
  // values (head_dim 0), or no rows, under 2^40 heads is a tensor of 0 bytes whose blocks every
  // writer would walk for ever (a review's finding: convert --mlx-lm of a 288-byte file never ended).
  // No mlx-lm cache has a row without values, nor a million heads.
  constexpr int64_t kMaxBatchHeads = int64_t(1) << 20;
  for (const MlxKvSide* s : {&k, &v}) {
    int64_t blocks = 0;
    if (s->head_dim <= 0 || s->batch < 0 || s->heads < 0 || s->rows < 0 ||
        __builtin_mul_overflow(s->batch, s->heads, &blocks) || blocks > kMaxBatchHeads) {
      return layer_error(c, L, std::string(s == &k ? "keys" : "values") + " have batch " + std::to_string(s->batch) +
                                   ", heads " + std::to_string(s->heads) + ", head_dim " + std::to_string(s->head_dim) +
                                   ": not a KV cache (a row needs values, and batch x heads at most " +
                                   std::to_string(kMaxBatchHeads) + ")");
    }
  }
  if (k.batch != v.batch || k.heads != v.heads || k.rows != v.rows || k.dtype != v.dtype) {
    return layer_error(c, L, "keys (" + k.dtype + " batch " + std::to_string(k.batch) + ", heads " +
                                 std::to_string(k.heads) + ", rows " + std::to_string(k.rows) + ") and values (" +
                                 v.dtype + " batch " + std::to_string(v.batch) + ", heads " + std::to_string(v.heads) +
                                 ", rows " + std::to_string(v.rows) + ") disagree");
  }
  return Status::OK();
}

struct Field {
  const char* name;
  std::optional<int64_t>* slot;
};

// A class's integer state: in the scalars layout the 0-d tensors "<L>.2", "<L>.3", ... in
// `scalars` order (after keys "0" and values "1"); in the meta layouts the meta_state strings in
// `meta` order.
Status read_fields(const Ctx& c, MlxLayer& L, const Where& w, const std::vector<Field>& scalars,
                   const std::vector<Field>& meta) {
  if (c.layout == MlxLayout::kScalars) {
    for (size_t i = 0; i < scalars.size(); ++i) {
      KV_ASSIGN_OR_RETURN(*scalars[i].slot, scalar_int(c, L, w, std::to_string(2 + i), scalars[i].name));
    }
    return Status::OK();
  }
  std::string names;
  for (const Field& f : meta) names += (names.empty() ? "" : ", ") + std::string(f.name);
  KV_ASSIGN_OR_RETURN(auto m, meta_ints(c, L, w, meta.size(), names.c_str()));
  for (size_t i = 0; i < meta.size(); ++i) *meta[i].slot = m[i];
  return Status::OK();
}

// `step` is in the meta_state of mlx-lm 0.19.1 .. 0.28.0 only, always at `at`.
std::vector<Field> with_step(const Ctx& c, MlxLayer& L, std::vector<Field> f, size_t at) {
  if (c.layout == MlxLayout::kMetaStep) f.insert(f.begin() + at, Field{"step", &L.step});
  return f;
}

// KVCache and QuantizedKVCache save the rows up to their offset (mlx-lm's `state` cuts the
// buffer there): an offset outside 0..rows is a damaged file, whose tokens count would be wrong.
Status check_offset_in_rows(const Ctx& c, const MlxLayer& L) {
  if (*L.offset < 0) return layer_error(c, L, "offset " + std::to_string(*L.offset) + " is negative");
  if (*L.offset > L.k->rows) {
    return layer_error(c, L, "offset " + std::to_string(*L.offset) + " is past the " + std::to_string(L.k->rows) +
                                 " saved rows");
  }
  return Status::OK();
}

Status parse_quantized(const Ctx& c, const Where& w, MlxLayer& L) {
  const std::vector<Field> f{{"offset", &L.offset}, {"group_size", &L.group_size}, {"bits", &L.bits}};
  KV_RETURN_IF_ERROR(read_fields(c, L, w, f, with_step(c, L, f, 0)));
  const int64_t b = *L.bits, g = *L.group_size;
  const bool group_ok = g == 32 || g == 64 || g == 128;
  if (b == 1 && group_ok) {
    // mlx 0.32 quantizes at 1 bit too, with another formula (scale = max - min, bias = min):
    // a well-formed file that kvsnap does not read, not a damaged one.
    return Status::NotSupported(c.st.file + ": mlx-lm prompt cache: layer " + L.prefix + " (" + L.cls +
                                "): bits 1 (MLX's 1-bit affine form, mlx >= 0.32) is not supported; kvsnap reads "
                                "bits 2, 3, 4, 5, 6 and 8");
  }
  if (!(b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8) || !group_ok) {
    return layer_error(c, L, "bits " + std::to_string(b) + " / group size " + std::to_string(g) +
                                 " (MLX quantizes at bits 1,2,3,4,5,6,8 and groups of 32, 64, 128)");
  }
  KV_ASSIGN_OR_RETURN(L.k, quant_side(c, L, w, "0", "keys", b, g));
  KV_ASSIGN_OR_RETURN(L.v, quant_side(c, L, w, "1", "values", b, g));
  KV_RETURN_IF_ERROR(check_pair(c, L));
  return check_offset_in_rows(c, L);
}

// KVCache, ConcatenateKVCache, RotatingKVCache, ChunkedKVCache: float keys "0", values "1".
Status parse_float_kv(const Ctx& c, const Where& w, MlxLayer& L) {
  KV_ASSIGN_OR_RETURN(L.k, float_side(c, L, w, "0", "keys"));
  KV_ASSIGN_OR_RETURN(L.v, float_side(c, L, w, "1", "values"));
  KV_RETURN_IF_ERROR(check_pair(c, L));
  L.offset = L.k->rows;  // KVCache and ChunkedKVCache of the meta layouts: the rows saved
  const Field offset{"offset", &L.offset};
  if (L.cls == "KVCache") {
    KV_RETURN_IF_ERROR(read_fields(c, L, w, {offset}, {}));
  } else if (L.cls == "RotatingKVCache") {
    const Field keep{"keep", &L.keep}, max_size{"max_size", &L.max_size}, idx{"_idx", &L.idx};
    KV_RETURN_IF_ERROR(read_fields(c, L, w, {offset, keep, max_size, idx},
                                   with_step(c, L, {keep, max_size, offset, idx}, 2)));
  } else if (L.cls == "ChunkedKVCache") {
    const Field chunk{"chunk_size", &L.chunk_size}, start{"start_position", &L.start_position};
    KV_RETURN_IF_ERROR(read_fields(c, L, w, {offset, chunk, start}, {chunk, start}));
  }
  if (*L.offset < 0) return layer_error(c, L, "offset " + std::to_string(*L.offset) + " is negative");
  return L.cls == "KVCache" ? check_offset_in_rows(c, L) : Status::OK();
}

// Every tensor under "<prefix>." (ArraysCache state, or a class not understood): a range of
// the tensors, which are sorted by name. (A scan of them all per layer made a file of many
// empty layers cost layers x tensors.)
std::vector<const SafetensorsTensor*> tensors_under(const Ctx& c, const std::string& prefix) {
  std::vector<const SafetensorsTensor*> out;
  const std::string p = prefix + ".";
  const auto& all = c.st.tensors;
  auto it = std::lower_bound(all.begin(), all.end(), p,
                             [](const SafetensorsTensor& t, const std::string& n) { return t.name < n; });
  for (; it != all.end() && it->name.compare(0, p.size(), p) == 0; ++it) out.push_back(&*it);
  return out;
}

Status parse_layer(const Ctx& c, const Where& w, MlxLayer& L, int depth);

Status parse_cache_list(const Ctx& c, const Where& w, MlxLayer& L, int depth) {
  if (depth > 4) return layer_error(c, L, "CacheList nested more than 4 deep");
  std::vector<std::string> names;
  if (c.layout != MlxLayout::kScalars) names = meta_list(c, w.meta + ".0");
  for (size_t i = 0;; ++i) {
    const std::string sub = w.tensors + "." + std::to_string(i);
    if (c.layout == MlxLayout::kScalars ? !c.st.find(sub + ".1") : i >= names.size()) break;
    MlxLayer S;
    S.prefix = sub;
    Where sw{c.layout == MlxLayout::kScalars ? sub + ".0" : sub, w.meta + ".1." + std::to_string(i)};
    if (c.layout == MlxLayout::kScalars) {
      KV_ASSIGN_OR_RETURN(S.cls, scalar_string(c, L, w, std::to_string(i) + ".1"));
    } else {
      S.cls = names[i];
    }
    KV_RETURN_IF_ERROR(parse_layer(c, sw, S, depth + 1));
    L.bytes += S.bytes;
    L.sub.push_back(std::move(S));
  }
  if (L.sub.empty()) return layer_error(c, L, "CacheList holds no caches");
  return Status::OK();
}

Status parse_layer(const Ctx& c, const Where& w, MlxLayer& L, int depth) {
  const std::string& k = L.cls;
  if (k == "CacheList") return parse_cache_list(c, w, L, depth);
  if (k == "QuantizedKVCache") {
    KV_RETURN_IF_ERROR(parse_quantized(c, w, L));
  } else if (k == "KVCache" || k == "ConcatenateKVCache" || k == "RotatingKVCache" || k == "ChunkedKVCache") {
    KV_RETURN_IF_ERROR(parse_float_kv(c, w, L));
  } else {
    L.understood = k == "ArraysCache" || k == "MambaCache";
  }
  L.arrays = tensors_under(c, w.tensors);
  for (const SafetensorsTensor* t : L.arrays) L.bytes += t->bytes();
  if (L.understood && L.k) L.arrays.clear();  // K/V classes: the arrays are the sides and scalars
  return Status::OK();
}

// Which of mlx-lm's three metadata layouts, and the evidence.
Status detect_layout(MlxPromptCache& out, const Meta& meta) {
  auto c0 = meta.find("2.0");
  if (c0 == meta.end() && out.st.find("0_keys")) {
    out.layout = MlxLayout::kKeysValues;
    out.version_guess = "mlx-lm 0.18.x .. 0.19.0";
    out.evidence.push_back("tensors '<i>_keys'/'<i>_values' and no class list: cache_prompt before mlx-lm 0.19.1 "
                           "(mlx-examples #956/#979)");
    return Status::OK();
  }
  if (c0 == meta.end()) {
    return Status::NotSupported(out.st.file + ": a safetensors file but not an mlx-lm prompt cache: its __metadata__ "
                                "has no class list ('2.0') and no '0_keys' tensor (mlx-lm before 0.19.1)");
  }
  if (c0->second.empty()) {
    out.layout = MlxLayout::kScalars;
    out.version_guess = "mlx-lm 0.32.0 or later";
    out.evidence.push_back("__metadata__ is [user metadata, classes, scalars]: '2.0' is \"\", classes under '1.*' "
                           "(save_prompt_cache of mlx-lm 0.32)");
    return Status::OK();
  }
  out.layout = MlxLayout::kMeta;
  out.version_guess = "mlx-lm 0.19.1 .. 0.31.x";
  out.evidence.push_back("__metadata__ is [meta_state, user metadata, classes]: classes under '2.*' (mlx-lm 0.19.1 "
                         "to 0.31.x)");
  for (size_t i = 0;; ++i) {
    auto cls = meta.find("2." + std::to_string(i));
    if (cls == meta.end()) break;
    const bool q = cls->second == "QuantizedKVCache", r = cls->second == "RotatingKVCache";
    if (!q && !r) continue;
    size_t n = 0;
    while (meta.count("0." + std::to_string(i) + "." + std::to_string(n))) ++n;
    const bool step = n == (q ? 4u : 5u);
    out.layout = step ? MlxLayout::kMetaStep : MlxLayout::kMeta;
    out.version_guess = step ? (q ? "mlx-lm 0.19.3 .. 0.28.0" : "mlx-lm 0.19.1 .. 0.28.0") : "mlx-lm 0.28.1 .. 0.31.x";
    out.evidence.push_back("layer " + std::to_string(i) + " " + cls->second + " has " + std::to_string(n) +
                           " meta_state strings: " + (step ? "with" : "without") + " 'step' (dropped in 0.28.1)");
    return Status::OK();
  }
  out.step_unknown = true;
  out.evidence.push_back("no QuantizedKVCache or RotatingKVCache layer, whose meta_state would tell 0.28.1 apart");
  return Status::OK();
}

// Class names "<prefix>0", "<prefix>1", ... (at least one).
std::vector<std::string> class_list(const Meta& meta, const std::string& prefix) {
  std::vector<std::string> out;
  for (size_t i = 0;; ++i) {
    auto it = meta.find(prefix + std::to_string(i));
    if (it == meta.end()) return out;
    out.push_back(it->second);
  }
}

// Is the last row of every (batch, head) block of `t` zero? (#956's buffers: rows past offset.)
Result<bool> last_rows_zero(const Ctx& c, const SafetensorsTensor& t) {
  const auto& s = t.shape;
  const uint64_t row = uint64_t(s[3]) * safetensors_itemsize(t.dtype);
  std::vector<std::byte> b(row);
  for (uint64_t i = 0; i < uint64_t(s[0]) * uint64_t(s[1]); ++i) {
    const uint64_t at = c.st.data_start() + t.begin + ((i + 1) * uint64_t(s[2]) - 1) * row;
    KV_RETURN_IF_ERROR(c.f.read_at(at, b));
    for (std::byte x : b) {
      if (x != std::byte{0}) return false;
    }
  }
  return true;
}

// mlx-lm before 0.19.1: "<i>_keys"/"<i>_values" of a KVCache per layer, when that reading is exact.
Status read_keys_values(const Ctx& c, MlxPromptCache& out) {
  const std::string& file = out.st.file;
  for (const auto& [k, v] : *out.st.metadata) out.user_metadata.emplace_back(k, v);
  auto max_kv = c.meta.find("max_kv_size");
  if (max_kv != c.meta.end() && max_kv->second != "None") {
    return Status::NotSupported(file + ": an mlx-lm 0.18 prompt cache ('<i>_keys') saved with max_kv_size " +
                                max_kv->second + ": its layers were RotatingKVCache rings, and the file lacks the ring "
                                "position (_idx) and the tokens seen (offset), so kvsnap cannot read it exactly");
  }
  for (size_t i = 0;; ++i) {
    const SafetensorsTensor* k = out.st.find(std::to_string(i) + "_keys");
    if (!k) break;
    MlxLayer L;
    L.prefix = std::to_string(i);
    L.cls = "KVCache";
    const SafetensorsTensor* v = out.st.find(L.prefix + "_values");
    if (!v) return layer_error(c, L, "tensor '" + L.prefix + "_values' is missing");
    KV_ASSIGN_OR_RETURN(L.k, float_tensor_side(c, L, k, "keys"));
    KV_ASSIGN_OR_RETURN(L.v, float_tensor_side(c, L, v, "values"));
    KV_RETURN_IF_ERROR(check_pair(c, L));
    L.offset = L.k->rows;
    if (L.k->rows > 0 && L.k->rows % 256 == 0) {
      KV_ASSIGN_OR_RETURN(bool zero, last_rows_zero(c, *k));
      if (zero) {
        return Status::NotSupported(file + ": an mlx-lm 0.18 prompt cache ('<i>_keys') whose layer " + L.prefix +
                                    " holds " + std::to_string(L.k->rows) + " rows, the last of them zero: mlx-lm 0.18.1 "
                                    "(mlx-examples #956) saved its whole 256-row buffer, so the tokens it holds are "
                                    "not in the file");
      }
    }
    L.bytes = k->bytes() + v->bytes();
    out.layers.push_back(std::move(L));
  }
  for (const auto& t : out.st.tensors) {
    const size_t u = t.name.find('_');
    const auto layer = to_int(std::string_view(t.name).substr(0, u));
    const std::string kind = u == std::string::npos ? "" : t.name.substr(u + 1);
    if (!layer || *layer < 0 || size_t(*layer) >= out.layers.size() || (kind != "keys" && kind != "values")) {
      return Status::Corruption(file + ": mlx-lm 0.18 prompt cache: tensor '" + t.name + "' is not '<i>_keys' or "
                                "'<i>_values' of layers 0.." + std::to_string(out.layers.size() - 1));
    }
  }
  return Status::OK();
}

}  // namespace

const char* mlx_layout_name(MlxLayout l) {
  switch (l) {
    case MlxLayout::kMetaStep: return "meta_state-with-step";
    case MlxLayout::kMeta: return "meta_state";
    case MlxLayout::kScalars: return "scalars";
    case MlxLayout::kKeysValues: return "keys-values";
  }
  return "?";
}

uint64_t MlxKvSide::bytes() const {
  return data->bytes() + (scales ? scales->bytes() : 0) + (biases ? biases->bytes() : 0);
}

bool looks_like_mlx_prompt_cache(const ReadableFile& f) { return looks_like_safetensors(f); }

Result<MlxPromptCache> read_mlx_prompt_cache(const ReadableFile& f) {
  MlxPromptCache out;
  KV_ASSIGN_OR_RETURN(out.st, read_safetensors(f));
  if (!out.st.metadata) {
    return Status::NotSupported(out.st.file + ": a safetensors file without __metadata__: not an mlx-lm prompt cache");
  }
  Ctx c{f, out.st, MlxLayout::kMeta, {}};
  for (const auto& [k, v] : *out.st.metadata) c.meta.emplace(k, v);
  KV_RETURN_IF_ERROR(detect_layout(out, c.meta));
  c.layout = out.layout;
  if (c.layout == MlxLayout::kKeysValues) {
    KV_RETURN_IF_ERROR(read_keys_values(c, out));
    return out;
  }
  const bool sc = c.layout == MlxLayout::kScalars;
  const std::string user = sc ? "0." : "1.";
  for (const auto& [k, v] : *out.st.metadata) {
    if (k.compare(0, 2, user) == 0) out.user_metadata.emplace_back(k.substr(2), v);
  }
  const std::vector<std::string> classes = class_list(c.meta, sc ? "1." : "2.");
  if (classes.empty()) return Status::Corruption(out.st.file + ": mlx-lm prompt cache: no class list");
  for (size_t i = 0; i < classes.size(); ++i) {
    MlxLayer L;
    L.prefix = std::to_string(i);
    L.cls = classes[i];
    if (L.cls == "MambaCache") out.evidence.push_back("class MambaCache: written by mlx-lm 0.30.5 or earlier");
    KV_RETURN_IF_ERROR(parse_layer(c, Where{L.prefix, "0." + L.prefix}, L, 0));
    out.layers.push_back(std::move(L));
  }
  // Every tensor belongs to a layer.
  for (const auto& t : out.st.tensors) {
    auto layer = to_int(std::string_view(t.name).substr(0, t.name.find('.')));
    if (!layer || *layer < 0 || size_t(*layer) >= classes.size()) {
      return Status::Corruption(out.st.file + ": mlx-lm prompt cache: tensor '" + t.name + "' belongs to no layer (" +
                                std::to_string(classes.size()) + " layers)");
    }
  }
  return out;
}

}  // namespace kvsnap
