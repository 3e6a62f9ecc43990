#include "format/mlx_safetensors.h"

#include <algorithm>
#include <array>

#include "base/byte_order.h"
#include "base/json.h"
#include "base/json_access.h"

namespace kvsnap {
namespace {

struct DtypeSize {
  std::string_view name;
  uint64_t bytes;
};
// mlx/io/safetensors.cpp: what MLX writes, plus the two 8-bit floats it reads (as uint8).
constexpr std::array<DtypeSize, 15> kDtypes{{{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8},
                                              {"I32", 4}, {"I16", 2}, {"I8", 1}, {"U64", 8}, {"U32", 4},
                                              {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"C64", 8}, {"F8_E4M3", 1}}};

Status header_error(const std::string& file, const std::string& problem) {
  return Status::Corruption(file + ": safetensors header: " + problem);
}

// prod(shape) x itemsize, or nullopt on overflow.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, uint64_t itemsize) {
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return std::nullopt;
  }
  return n;
}

Result<std::vector<int64_t>> parse_shape(const nlohmann::json& j, const std::string& file, const std::string& name) {
  if (!j.is_array()) return header_error(file, "tensor '" + name + "': shape is not an array");
  if (j.size() > kSafetensorsMaxRank) {
    return header_error(file, "tensor '" + name + "': shape has " + std::to_string(j.size()) + " dimensions (at most " +
                                  std::to_string(kSafetensorsMaxRank) + ")");
  }
  std::vector<int64_t> shape;
  for (const auto& d : j) {
    if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0)) {
      return header_error(file, "tensor '" + name + "': shape " + d.dump() + " is not a non-negative integer");
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > (uint64_t(1) << 48)) return header_error(file, "tensor '" + name + "': dimension " + d.dump() + " is absurd");
    shape.push_back(int64_t(v));
  }
  return shape;
}

Result<SafetensorsTensor> parse_tensor(const std::string& name, const nlohmann::json& j, const Safetensors& st) {
  const std::string& file = st.file;
  if (!j.is_object()) return header_error(file, "tensor '" + name + "' is not an object");
  auto dt = j.find("dtype");
  auto sh = j.find("shape");
  auto off = j.find("data_offsets");
  if (dt == j.end() || sh == j.end() || off == j.end()) {
    return header_error(file, "tensor '" + name + "' lacks dtype, shape or data_offsets");
  }
  SafetensorsTensor t;
  t.name = name;
  if (!dt->is_string()) return header_error(file, "tensor '" + name + "': dtype is not a string");
  t.dtype = dt->get<std::string>();
  const uint64_t itemsize = safetensors_itemsize(t.dtype);
  if (!itemsize) {
    return Status::NotSupported(file + ": safetensors header: tensor '" + name + "': unknown dtype '" + t.dtype + "'");
  }
  KV_ASSIGN_OR_RETURN(t.shape, parse_shape(*sh, file, name));
  if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
    return header_error(file, "tensor '" + name + "': data_offsets is not two non-negative integers");
  }
  t.begin = (*off)[0].get<uint64_t>();
  t.end = (*off)[1].get<uint64_t>();
  const uint64_t data_bytes = st.file_size - st.data_start();
  if (t.begin > t.end || t.end > data_bytes) {
    return header_error(file, "tensor '" + name + "': data_offsets [" + std::to_string(t.begin) + "," +
                                  std::to_string(t.end) + "] outside the " + std::to_string(data_bytes) +
                                  " data bytes of the file (truncated?)");
  }
  const auto want = byte_size(t.shape, itemsize);
  if (!want || *want != t.bytes()) {
    return header_error(file, "tensor '" + name + "': " + t.dtype + " shape " + sh->dump() + " needs " +
                                  (want ? std::to_string(*want) : std::string("more than 2^64")) +
                                  " bytes, data_offsets give " + std::to_string(t.bytes()));
  }
  return t;
}

Status parse_metadata(const nlohmann::json& j, Safetensors& st) {
  if (j.is_null()) return Status::OK();
  if (!j.is_object()) return header_error(st.file, "__metadata__ is not an object");
  std::vector<std::pair<std::string, std::string>> meta;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) return header_error(st.file, "__metadata__ '" + k + "' is not a string (MLX writes only strings)");
    meta.emplace_back(k, v.get<std::string>());
  }
  st.metadata = std::move(meta);
  return Status::OK();
}

// data_order by data_offsets; overlapping ranges are refused; notes whether the data is MLX-compact.
Status order_data(Safetensors& st, bool& tiled) {
  st.data_order.resize(st.tensors.size());
  for (size_t i = 0; i < st.tensors.size(); ++i) st.data_order[i] = i;
  std::stable_sort(st.data_order.begin(), st.data_order.end(), [&](size_t a, size_t b) {
    const auto& x = st.tensors[a];
    const auto& y = st.tensors[b];
    return std::pair(x.begin, x.end) < std::pair(y.begin, y.end);
  });
  uint64_t cur = 0;
  const SafetensorsTensor* prev = nullptr;
  tiled = true;
  for (size_t i : st.data_order) {
    const SafetensorsTensor& t = st.tensors[i];
    if (t.bytes() == 0) {
      tiled = tiled && t.begin == cur;
      continue;
    }
    if (prev && t.begin < prev->end) {
      return header_error(st.file, "tensors '" + prev->name + "' and '" + t.name + "' overlap (data_offsets [" +
                                       std::to_string(prev->begin) + "," + std::to_string(prev->end) + "] and [" +
                                       std::to_string(t.begin) + "," + std::to_string(t.end) + "])");
    }
    tiled = tiled && t.begin == cur;
    cur = t.end;
    prev = &t;
  }
  tiled = tiled && st.data_start() + cur == st.file_size;
  return Status::OK();
}

}  // namespace

uint64_t SafetensorsTensor::elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

const SafetensorsTensor* Safetensors::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

uint64_t safetensors_itemsize(std::string_view dtype) {
  for (const auto& d : kDtypes) {
    if (d.name == dtype) return d.bytes;
  }
  return dtype == "F8_E8M0" ? 1 : 0;
}

bool looks_like_safetensors(const ReadableFile& f) {
  std::array<std::byte, 9> head;
  if (f.size() < 10 || !f.read_at(0, head).ok()) return false;
  const uint64_t n = load_le(head.data(), 8);
  return n >= 2 && n < kSafetensorsMaxHeader && 8 + n <= f.size() && head[8] == std::byte('{');
}

Result<Safetensors> read_safetensors(const ReadableFile& f) {
  Safetensors st;
  st.file = f.name();
  st.file_size = f.size();
  if (st.file_size < 8) return header_error(st.file, "file of " + std::to_string(st.file_size) + " bytes (truncated)");
  std::array<std::byte, 8> len;
  KV_RETURN_IF_ERROR(f.read_at(0, len));
  st.header_len = load_le(len.data(), 8);
  if (st.header_len == 0 || st.header_len >= kSafetensorsMaxHeader) {
    return header_error(st.file, "header length " + std::to_string(st.header_len) + " (MLX accepts 1.." +
                                     std::to_string(kSafetensorsMaxHeader - 1) + ")");
  }
  if (st.header_len > st.file_size - 8) {
    return header_error(st.file, "header length " + std::to_string(st.header_len) + " runs past the end of the " +
                                     std::to_string(st.file_size) + "-byte file (truncated?)");
  }
  std::string text(st.header_len, '\0');
  KV_RETURN_IF_ERROR(f.read_at(8, std::span(reinterpret_cast<std::byte*>(text.data()), text.size())));
  auto parsed = parse_json(text, st.file + ": safetensors header");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return header_error(st.file, "not a JSON object");
  bool has_meta = false;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      has_meta = true;
      KV_RETURN_IF_ERROR(parse_metadata(v, st));
      continue;
    }
    KV_ASSIGN_OR_RETURN(SafetensorsTensor t, parse_tensor(name, v, st));
    st.tensors.push_back(std::move(t));
  }
  bool tiled = false;
  KV_RETURN_IF_ERROR(order_data(st, tiled));
  st.mlx_compact = has_meta && tiled && safetensors_header_text(st) == text;
  return st;
}

std::string safetensors_header_text(const Safetensors& st) {
  nlohmann::json parent = nlohmann::json::object();
  uint64_t at = 0;
  for (size_t i : st.data_order) {
    const SafetensorsTensor& t = st.tensors[i];
    nlohmann::json child;
    child["dtype"] = t.dtype;
    child["shape"] = t.shape;
    child["data_offsets"] = std::vector<uint64_t>{at, at + t.bytes()};
    parent[t.name] = std::move(child);
    at += t.bytes();
  }
  nlohmann::json meta;  // null when there is none, as MLX writes it
  if (st.metadata && !st.metadata->empty()) {
    for (const auto& [k, v] : *st.metadata) meta[k] = v;
  }
  parent["__metadata__"] = std::move(meta);
  return json_text(parent);
}

Status write_safetensors(const Safetensors& st, const ReadableFile& data, ByteSink& out) {
  const std::string header = safetensors_header_text(st);
  std::vector<std::byte> len;
  append_le<uint64_t>(len, header.size());
  KV_RETURN_IF_ERROR(out.append(len));
  KV_RETURN_IF_ERROR(out.append(header.data(), header.size()));
  for (size_t i : st.data_order) {
    const SafetensorsTensor& t = st.tensors[i];
    KV_RETURN_IF_ERROR(copy_bytes(data, st.data_start() + t.begin, t.bytes(), out));
  }
  return Status::OK();
}

Status copy_bytes(const ReadableFile& f, uint64_t at, uint64_t n, ByteSink& out) {
  std::vector<std::byte> buf(std::min<uint64_t>(n, 1 << 20));
  for (const uint64_t end = at + n; at < end;) {
    std::span<std::byte> piece(buf.data(), std::min<uint64_t>(buf.size(), end - at));
    KV_RETURN_IF_ERROR(f.read_at(at, piece));
    KV_RETURN_IF_ERROR(out.append(piece));
    at += piece.size();
  }
  return Status::OK();
}

Result<std::vector<std::byte>> read_tensor(const Safetensors& st, const ReadableFile& f, const SafetensorsTensor& t) {
  std::vector<std::byte> bytes(t.bytes());
  KV_RETURN_IF_ERROR(f.read_at(st.data_start() + t.begin, bytes));
  return bytes;
}

}  // namespace kvsnap
