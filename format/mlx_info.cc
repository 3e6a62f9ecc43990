#include "format/mlx_info.h"

#include <cinttypes>
#include <cstdio>
#include <functional>

#include "base/json_access.h"

namespace kvsnap {
namespace {

using json = nlohmann::ordered_json;

// Every layer with K and V, CacheList members included.
void for_each_kv(const std::vector<MlxLayer>& layers, const std::function<void(const MlxLayer&)>& fn) {
  for (const MlxLayer& L : layers) {
    if (L.k && L.v) fn(L);
    for_each_kv(L.sub, fn);
  }
}

uint64_t side_bytes_at(const MlxKvSide& s, int bits, int gs, uint64_t float_size) {
  const uint64_t rows = uint64_t(s.batch) * uint64_t(s.heads) * uint64_t(s.rows);
  const uint64_t d = uint64_t(s.head_dim);
  if (!bits) return rows * d * float_size;
  return rows * (d * bits / 32 * 4 + 2 * (d / gs) * float_size);
}

MlxSizeAt size_at(const MlxInfoReport& r, const std::string& kind, int bits, int gs, uint64_t float_size) {
  MlxSizeAt a;
  a.kind = kind, a.bits = bits, a.group_size = gs;
  uint64_t total = 0;
  bool ok = true, rotating = false;
  for_each_kv(r.cache->layers, [&](const MlxLayer& L) {
    // Scales and biases keep the cache's float dtype (f32 caches: 4 bytes).
    const uint64_t fs = bits ? safetensors_itemsize(L.k->dtype) : float_size;
    for (const MlxKvSide* s : {&*L.k, &*L.v}) {
      if (bits && s->head_dim % gs) ok = false;
      total += side_bytes_at(*s, bits, gs, fs);
    }
    rotating = rotating || L.cls == "RotatingKVCache";
  });
  if (!ok) {
    a.note = "a head dim is not a whole number of groups";
    return a;
  }
  a.kv_bytes = total;
  a.file_bytes = r.file_bytes - r.kv_bytes + total;
  if (bits && rotating) a.note = "mlx-lm cannot quantize RotatingKVCache layers (NotImplementedError)";
  return a;
}

json tensor_json(const SafetensorsTensor* t) { return {{"name", t->name}, {"dtype", t->dtype}, {"shape", t->shape}}; }

json side_json(const MlxKvSide& s) {
  if (!s.scales) return tensor_json(s.data);
  return json::array({tensor_json(s.data), tensor_json(s.scales), tensor_json(s.biases)});
}

json layer_json(const MlxLayer& L, size_t index) {
  json j;
  j["layer"] = index;
  j["class"] = L.cls;
  j["understood"] = L.understood;
  if (L.offset) j["offset"] = *L.offset;
  const std::pair<const char*, const std::optional<int64_t>*> ints[] = {
      {"bits", &L.bits},         {"group_size", &L.group_size},   {"keep", &L.keep},
      {"max_size", &L.max_size}, {"_idx", &L.idx},                 {"step", &L.step},
      {"chunk_size", &L.chunk_size}, {"start_position", &L.start_position}};
  for (const auto& [name, v] : ints) {
    if (*v) j[name] = **v;
  }
  if (L.k) {
    j["kv_dtype"] = L.k->dtype;
    j["batch"] = L.k->batch;
    j["n_kv_heads"] = L.k->heads;
    j["rows"] = L.k->rows;
    j["k_head_dim"] = L.k->head_dim;
    j["v_head_dim"] = L.v->head_dim;
    j["keys"] = side_json(*L.k);
    j["values"] = side_json(*L.v);
  }
  if (!L.arrays.empty()) {
    json a = json::array();
    for (const SafetensorsTensor* t : L.arrays) a.push_back(tensor_json(t));
    j["arrays"] = a;
  }
  if (!L.sub.empty()) {
    json s = json::array();
    for (size_t i = 0; i < L.sub.size(); ++i) s.push_back(layer_json(L.sub[i], i));
    j["caches"] = s;
  }
  j["bytes"] = L.bytes;
  return j;
}

// Sizes of prompt caches are KiB to a few GiB: one unit keeps the table's columns comparable.
std::string human_bytes(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  return buf;
}

std::string layer_line(const MlxLayer& L, const std::string& index) {
  std::string s = "  " + index + "  " + L.cls;
  if (L.offset) s += "  offset " + std::to_string(*L.offset);
  if (L.k) {
    s += "  K/V " + (L.bits ? std::to_string(*L.bits) + "-bit g" + std::to_string(*L.group_size) + " (" + L.k->dtype + ")"
                            : L.k->dtype);
    s += "  heads " + std::to_string(L.k->heads) + "  head dim " + std::to_string(L.k->head_dim) + "/" +
         std::to_string(L.v->head_dim) + "  rows " + std::to_string(L.k->rows);
  }
  if (L.keep) s += "  keep " + std::to_string(*L.keep) + " max " + std::to_string(*L.max_size) + " _idx " + std::to_string(*L.idx);
  if (!L.arrays.empty()) s += "  " + std::to_string(L.arrays.size()) + " arrays";
  if (!L.understood) s += "  (class not understood: carried byte-exact)";
  return s + "  " + human_bytes(L.bytes) + "\n";
}

void render_layers(const std::vector<MlxLayer>& layers, const std::string& prefix, std::string& o) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string index = prefix + std::to_string(i);
    o += layer_line(layers[i], index);
    render_layers(layers[i].sub, index + ".", o);
  }
}

}  // namespace

MlxInfoReport mlx_info_report(const MlxPromptCache& cache, const std::string& path) {
  MlxInfoReport r;
  r.file = path;
  r.file_bytes = cache.st.file_size;
  r.cache = &cache;
  bool agree = true;
  for_each_kv(cache.layers, [&](const MlxLayer& L) {
    r.kv_bytes += L.k->bytes() + L.v->bytes();
    if (!r.tokens) r.tokens = L.offset;
    agree = agree && L.offset == r.tokens;
  });
  if (!agree) r.tokens.reset();
  r.size_at.push_back(size_at(r, "f16", 0, 0, 2));
  r.size_at.push_back(size_at(r, "bf16", 0, 0, 2));
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int gs : {32, 64, 128}) r.size_at.push_back(size_at(r, "q" + std::to_string(bits) + "g" + std::to_string(gs), bits, gs, 0));
  }
  return r;
}

json mlx_info_json(const MlxInfoReport& r) {
  const MlxPromptCache& c = *r.cache;
  json j;
  j["kvsnap_info_version"] = 1;
  j["file"] = r.file;
  j["file_bytes"] = r.file_bytes;
  j["format"] = "mlx-prompt-cache";
  j["engine"] = "mlx-lm";
  j["layout"] = mlx_layout_name(c.layout);
  j["written_by"] = c.version_guess;
  j["evidence"] = c.evidence;
  j["byte_exact_rewrite"] = c.st.mlx_compact;
  j["user_metadata"] = ordered_object_of(c.user_metadata);
  j["tokens"] = r.tokens ? json(*r.tokens) : json(nullptr);
  j["n_layers"] = c.layers.size();
  json layers = json::array();
  for (size_t i = 0; i < c.layers.size(); ++i) layers.push_back(layer_json(c.layers[i], i));
  j["layers"] = layers;
  j["sizes"] = {{"kv_bytes", r.kv_bytes}, {"other_bytes", r.file_bytes - r.kv_bytes}};
  json at = json::array();
  for (const MlxSizeAt& a : r.size_at) {
    json e;
    e["kind"] = a.kind;
    if (a.bits) e["bits"] = a.bits, e["group_size"] = a.group_size;
    e["valid"] = a.kv_bytes.has_value();
    if (a.kv_bytes) e["kv_bytes"] = *a.kv_bytes, e["file_bytes"] = a.file_bytes;
    if (a.kv_bytes && r.kv_bytes) e["ratio"] = double(*a.kv_bytes) / double(r.kv_bytes);
    if (!a.note.empty()) e["note"] = a.note;
    at.push_back(e);
  }
  j["size_at"] = at;
  return j;
}

std::string mlx_info_text(const MlxInfoReport& r) {
  const MlxPromptCache& c = *r.cache;
  std::string o;
  o += "file       " + r.file + " (" + std::to_string(r.file_bytes) + " bytes)\n";
  o += "format     mlx-lm prompt cache (safetensors), layout " + std::string(mlx_layout_name(c.layout)) + "; " +
       c.version_guess + "\n";
  for (const std::string& e : c.evidence) o += "           " + e + "\n";
  o += "tokens     " + (r.tokens ? std::to_string(*r.tokens) : std::string("differ by layer (see offsets)")) +
       " (mlx-lm stores no token ids)\n";
  for (const auto& [k, v] : c.user_metadata) o += "metadata   " + k + " = " + v + "\n";
  o += "\n" + std::to_string(c.layers.size()) + " layers:\n";
  render_layers(c.layers, "", o);
  o += "\nmemory     K+V " + human_bytes(r.kv_bytes) + "; other " + human_bytes(r.file_bytes - r.kv_bytes) + "\n";
  o += "\nK+V size at other settings (ratio to now):\n";
  std::string last_note;
  for (const MlxSizeAt& a : r.size_at) {
    char buf[160];
    if (a.kv_bytes) {
      std::snprintf(buf, sizeof buf, "  %-8s %12s  %6.3f", a.kind.c_str(), human_bytes(*a.kv_bytes).c_str(),
                    r.kv_bytes ? double(*a.kv_bytes) / double(r.kv_bytes) : 1.0);
    } else {
      std::snprintf(buf, sizeof buf, "  %-8s %12s", a.kind.c_str(), "n/a");
    }
    o += buf;
    o += a.note.empty() || a.note == last_note ? "\n" : "  " + a.note + "\n";
    last_note = a.note;
  }
  return o;
}

}  // namespace kvsnap
