#include "format/mlx_layout.h"

#include <cstdio>
#include <map>

#include "base/byte_order.h"

namespace kvsnap {
namespace {

// mlx-lm's KVCache/QuantizedKVCache/RotatingKVCache grow in steps of 256 rows; the meta_state of
// 0.19.1 .. 0.28.0 records it and nothing else ever changed it.
constexpr int64_t kMlxStep = 256;

struct IntField {
  const char* name;
  int64_t value;
};

// The integer state of a layer in the order each layout stores it.
std::vector<IntField> scalar_fields(const MlxLayer& L) {
  if (L.cls == "QuantizedKVCache") return {{"offset", *L.offset}, {"group_size", *L.group_size}, {"bits", *L.bits}};
  if (L.cls == "RotatingKVCache") {
    return {{"offset", *L.offset}, {"keep", *L.keep}, {"max_size", *L.max_size}, {"_idx", *L.idx}};
  }
  return {{"offset", *L.offset}};
}

std::vector<IntField> meta_fields(const MlxLayer& L, bool step) {
  const int64_t s = L.step.value_or(kMlxStep);
  std::vector<IntField> f;
  if (L.cls == "QuantizedKVCache") {
    f = {{"offset", *L.offset}, {"group_size", *L.group_size}, {"bits", *L.bits}};
    if (step) f.insert(f.begin(), IntField{"step", s});
  } else if (L.cls == "RotatingKVCache") {
    f = {{"keep", *L.keep}, {"max_size", *L.max_size}, {"offset", *L.offset}, {"_idx", *L.idx}};
    if (step) f.insert(f.begin() + 2, IntField{"step", s});
  }
  return f;
}

// The K/V tensors of a layer (float: 2, quantized: 6).
std::vector<const SafetensorsTensor*> kv_tensors(const MlxLayer& L) {
  std::vector<const SafetensorsTensor*> out;
  for (const MlxKvSide* s : {&*L.k, &*L.v}) {
    out.push_back(s->data);
    if (s->scales) out.push_back(s->scales), out.push_back(s->biases);
  }
  return out;
}

Status check_convertible(const MlxPromptCache& in) {
  for (const MlxLayer& L : in.layers) {
    if (L.cls != "KVCache" && L.cls != "QuantizedKVCache" && L.cls != "RotatingKVCache") {
      return Status::NotSupported(in.st.file + ": layer " + L.prefix + " is a " + L.cls +
                                  ": changing the layout of its class is not supported yet (KVCache, "
                                  "QuantizedKVCache and RotatingKVCache are)");
    }
  }
  return Status::OK();
}

// The metadata of the target layout around `scalars` (names of the scalar tensors, scalars layout).
std::vector<std::pair<std::string, std::string>> metadata_for(const MlxPromptCache& in, MlxLayout to,
                                                              const std::vector<std::string>& scalars) {
  std::vector<std::pair<std::string, std::string>> m;
  const bool sc = to == MlxLayout::kScalars;
  for (const auto& [k, v] : in.user_metadata) m.emplace_back((sc ? "0." : "1.") + k, v);
  for (const MlxLayer& L : in.layers) {
    m.emplace_back((sc ? "1." : "2.") + L.prefix, L.cls);
    if (sc) continue;
    const auto f = meta_fields(L, to == MlxLayout::kMetaStep);
    if (f.empty()) m.emplace_back("0." + L.prefix, "");
    for (size_t i = 0; i < f.size(); ++i) m.emplace_back("0." + L.prefix + "." + std::to_string(i), std::to_string(f[i].value));
  }
  if (sc) {
    m.emplace_back("2.0", "");
    for (size_t j = 0; j < scalars.size(); ++j) {
      m.emplace_back("2." + std::to_string(j + 1) + ".0", scalars[j]);
      m.emplace_back("2." + std::to_string(j + 1) + ".1", "scalar");
    }
  }
  return m;
}

}  // namespace

MlxOutTensor mlx_scalar_tensor(const std::string& name, int64_t v) {
  MlxOutTensor o;
  o.t.name = name;
  o.t.dtype = "I32";
  append_le<int32_t>(o.bytes, int32_t(v));
  return o;
}

Result<MlxLayout> mlx_layout_for(const std::string& name) {
  for (MlxLayout l : {MlxLayout::kMetaStep, MlxLayout::kMeta, MlxLayout::kScalars}) {
    if (name == mlx_layout_name(l)) return l;
  }
  int major = 0, minor = 0, patch = 0;
  if (std::sscanf(name.c_str(), "%d.%d.%d", &major, &minor, &patch) >= 2 && major == 0 && minor >= 19) {
    if (minor < 28 || (minor == 28 && patch == 0)) return MlxLayout::kMetaStep;
    return minor < 32 ? MlxLayout::kMeta : MlxLayout::kScalars;
  }
  return Status::InvalidArgument("mlx-lm layout '" + name +
                                 "': give meta_state-with-step, meta_state, scalars or an mlx-lm version from 0.19 on");
}

Result<MlxOutFile> mlx_change_layout(const MlxPromptCache& in, MlxLayout to) {
  KV_RETURN_IF_ERROR(check_convertible(in));
  const bool sc = to == MlxLayout::kScalars;
  // Which input tensors go on, and how many rows of each.
  std::map<const SafetensorsTensor*, int64_t> keep;
  for (const MlxLayer& L : in.layers) {
    const bool cut = !sc && L.cls == "KVCache" && L.k->rows > *L.offset;  // the meta loaders take offset from rows
    for (const SafetensorsTensor* t : kv_tensors(L)) keep[t] = cut ? *L.offset : -1;
  }
  MlxOutFile out;
  for (size_t i : in.st.data_order) {
    const SafetensorsTensor* t = &in.st.tensors[i];
    auto it = keep.find(t);
    if (it == keep.end()) continue;  // the scalar tensors of the scalars layout
    MlxOutTensor o;
    o.t = *t;
    o.src = t;
    o.rows = it->second;
    if (o.rows >= 0) o.t.shape[2] = o.rows;
    out.tensors.push_back(std::move(o));
  }
  std::vector<std::string> scalars;
  if (sc) {
    for (const MlxLayer& L : in.layers) {
      const auto f = scalar_fields(L);
      for (size_t i = 0; i < f.size(); ++i) {
        scalars.push_back(L.prefix + "." + std::to_string(2 + i));
        out.tensors.push_back(mlx_scalar_tensor(scalars.back(), f[i].value));
      }
    }
  }
  out.metadata = metadata_for(in, to, scalars);
  return out;
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
    // [B, H, S, ...]: the first `rows` rows of each of the B*H row blocks.
    const auto& s = o.src->shape;
    const uint64_t blocks = uint64_t(s[0]) * uint64_t(s[1]);
    if (blocks == 0 || o.rows == 0) continue;
    const uint64_t row_bytes = o.src->bytes() / (blocks * uint64_t(s[2]));
    for (uint64_t b = 0; b < blocks; ++b) {
      KV_RETURN_IF_ERROR(copy_bytes(src, base + b * uint64_t(s[2]) * row_bytes, uint64_t(o.rows) * row_bytes, sink));
    }
  }
  return Status::OK();
}

}  // namespace kvsnap
