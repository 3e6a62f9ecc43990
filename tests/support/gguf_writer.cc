#include "support/gguf_writer.h"

#include <cstring>

#include "format/cursor.h"

namespace kvsnap {

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t mant = x & 0x7fffff;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 | (mant >> 13) : 0));  // inf, nan
  const int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00);  // too large: inf
  if (e <= 0) {                                                  // half subnormal or zero
    if (e < -10) return sign;
    mant |= 0x800000;
    const uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // a carry into the exponent is correct rounding
  return static_cast<uint16_t>(sign | half);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    int32_t e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {

void put_string(std::vector<std::byte>& out, const std::string& s) {
  put_u64(out, s.size());
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

void put_array(std::vector<std::byte>& out, const GgufArray& a);

void put_scalar(std::vector<std::byte>& out, const GgufValue& v) {
  const uint32_t size = gguf_type_size(v.type);
  switch (v.type) {
    case GgufType::kString: put_string(out, std::get<std::string>(v.v)); return;
    case GgufType::kArray: put_array(out, std::get<GgufArray>(v.v)); return;
    case GgufType::kF32: {
      const float f = static_cast<float>(std::get<double>(v.v));
      uint32_t r;
      std::memcpy(&r, &f, 4);
      put_u32(out, r);
      return;
    }
    case GgufType::kF64: {
      const double d = std::get<double>(v.v);
      uint64_t r;
      std::memcpy(&r, &d, 8);
      put_u64(out, r);
      return;
    }
    default: break;
  }
  uint64_t raw = std::holds_alternative<int64_t>(v.v) ? static_cast<uint64_t>(std::get<int64_t>(v.v))
                                                        : std::get<uint64_t>(v.v);
  for (uint32_t i = 0; i < size; ++i) out.push_back(std::byte((raw >> (8 * i)) & 0xff));
}

void put_array(std::vector<std::byte>& out, const GgufArray& a) {
  put_u32(out, static_cast<uint32_t>(a.elem_type));
  put_u64(out, a.count);
  if (a.elem_type == GgufType::kString) {
    for (const auto& s : a.strings) put_string(out, s);
  } else if (a.elem_type == GgufType::kArray) {
    for (const auto& sub : a.arrays) put_array(out, sub);
  } else {
    out.insert(out.end(), a.data.begin(), a.data.end());
  }
}

Status check_array(const std::string& key, const GgufArray& a, uint32_t depth) {
  if (static_cast<uint32_t>(a.elem_type) >= kGgufTypeCount) {
    return Status::InvalidArgument("gguf: key '" + key + "': array element type is not a GGUF type");
  }
  if (depth >= kGgufMaxNesting) {
    return Status::InvalidArgument("gguf: key '" + key + "': arrays nested deeper than " +
                                   std::to_string(kGgufMaxNesting));
  }
  uint64_t have = 0;
  if (a.elem_type == GgufType::kString) {
    have = a.strings.size();
  } else if (a.elem_type == GgufType::kArray) {
    have = a.arrays.size();
    for (const auto& sub : a.arrays) KV_RETURN_IF_ERROR(check_array(key, sub, depth + 1));
  } else {
    if (a.data.size() != a.count * gguf_type_size(a.elem_type)) {
      return Status::InvalidArgument("gguf: key '" + key + "': array data holds " + std::to_string(a.data.size()) +
                                     " bytes, not " + std::to_string(a.count) + " x " + gguf_type_name(a.elem_type));
    }
    have = a.count;
  }
  if (have != a.count) {
    return Status::InvalidArgument("gguf: key '" + key + "': array count " + std::to_string(a.count) +
                                   " but " + std::to_string(have) + " elements");
  }
  return Status::OK();
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (auto& kv : kvs_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kvs_.emplace_back(key, std::move(value));
}

void GgufWriter::remove(const std::string& key) {
  for (auto it = kvs_.begin(); it != kvs_.end(); ++it) {
    if (it->first == key) {
      kvs_.erase(it);
      return;
    }
  }
}

bool GgufWriter::has(const std::string& key) const {
  for (const auto& kv : kvs_) {
    if (kv.first == key) return true;
  }
  return false;
}

uint32_t GgufWriter::alignment() const {
  for (const auto& kv : kvs_) {
    if (kv.first == kGgufAlignmentKey && kv.second.type == GgufType::kU32) {
      return static_cast<uint32_t>(std::get<uint64_t>(kv.second.v));
    }
  }
  return kGgufDefaultAlignment;
}

Status GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> ne, int32_t type,
                              std::vector<std::byte> data) {
  if (name.size() > kGgufMaxTensorName) {
    return Status::InvalidArgument("gguf: tensor name '" + name + "' is longer than " +
                                   std::to_string(kGgufMaxTensorName) + " bytes");
  }
  for (const auto& t : tensors_) {
    if (t.name == name) return Status::InvalidArgument("gguf: duplicate tensor '" + name + "'");
  }
  if (ne.empty() || ne.size() > kGgufMaxDims) {
    return Status::InvalidArgument("gguf: tensor '" + name + "' needs 1 to 4 dimensions");
  }
  uint64_t n = 1;
  for (int64_t d : ne) {
    if (d < 0) return Status::InvalidArgument("gguf: tensor '" + name + "' has a negative dimension");
    n *= uint64_t(d);
  }
  auto nb = ggml_nbytes(type, n);
  if (!nb || !ggml_nbytes(type, uint64_t(ne[0]))) {
    return Status::InvalidArgument("gguf: tensor '" + name + "': rows of " + std::to_string(ne[0]) +
                                   " values are not whole blocks of " + ggml_type_name_any(type) +
                                   " (or the type is unknown)");
  }
  if (data.size() != *nb) {
    return Status::InvalidArgument("gguf: tensor '" + name + "' data has " + std::to_string(data.size()) +
                                   " bytes, shape and type need " + std::to_string(*nb));
  }
  tensors_.push_back(Tensor{name, std::move(ne), type, std::move(data)});
  return Status::OK();
}

Status GgufWriter::add_tensor_f32(const std::string& name, std::vector<int64_t> ne, std::span<const float> values) {
  std::vector<std::byte> data(values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t r;
    std::memcpy(&r, &values[i], 4);
    for (int b = 0; b < 4; ++b) data[i * 4 + b] = std::byte((r >> (8 * b)) & 0xff);
  }
  return add_tensor(name, std::move(ne), 0, std::move(data));
}

Status GgufWriter::add_tensor_f16(const std::string& name, std::vector<int64_t> ne, std::span<const float> values) {
  std::vector<std::byte> data(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t h = f32_to_f16(values[i]);
    data[i * 2] = std::byte(h & 0xff);
    data[i * 2 + 1] = std::byte(h >> 8);
  }
  return add_tensor(name, std::move(ne), 1, std::move(data));
}

Status GgufWriter::write(ByteSink& out) const {
  // validate what llama.cpp would refuse
  for (const auto& [key, v] : kvs_) {
    if (key.empty()) return Status::InvalidArgument("gguf: empty key");
    if (key == kGgufAlignmentKey) {
      if (v.type != GgufType::kU32) {
        return Status::InvalidArgument(std::string("gguf: ") + kGgufAlignmentKey + " must be a u32");
      }
      const uint64_t a = std::get<uint64_t>(v.v);
      if (a == 0 || (a & (a - 1)) != 0) {
        return Status::InvalidArgument(std::string("gguf: ") + kGgufAlignmentKey + " " + std::to_string(a) +
                                       " is not a power of 2");
      }
    }
    if (v.type == GgufType::kArray) KV_RETURN_IF_ERROR(check_array(key, std::get<GgufArray>(v.v), 0));
  }
  const uint64_t align = alignment();

  std::vector<std::byte> head;
  head.insert(head.end(), {std::byte('G'), std::byte('G'), std::byte('U'), std::byte('F')});
  put_u32(head, 3);
  put_u64(head, tensors_.size());
  put_u64(head, kvs_.size());
  for (const auto& [key, v] : kvs_) {
    put_string(head, key);
    put_u32(head, static_cast<uint32_t>(v.type));
    put_scalar(head, v);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(head, t.name);
    put_u32(head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put_u64(head, static_cast<uint64_t>(d));
    put_i32(head, t.type);
    put_u64(head, offset);
    offset += align_up(t.data.size(), align);
  }
  if (!tensors_.empty()) head.resize(align_up(head.size(), align), std::byte{0});
  KV_RETURN_IF_ERROR(out.append(head));

  const std::vector<std::byte> zeros(align, std::byte{0});
  for (const auto& t : tensors_) {
    KV_RETURN_IF_ERROR(out.append(t.data));
    const uint64_t pad = align_up(t.data.size(), align) - t.data.size();
    if (pad) KV_RETURN_IF_ERROR(out.append(zeros.data(), pad));
  }
  return Status::OK();
}

Status GgufWriter::write_file(Io& io, const std::string& path) const {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::create(io, path));
  KV_RETURN_IF_ERROR(write(*w));
  return w->commit();
}

}  // namespace kvsnap
