#include "format/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "base/byte_order.h"
#include "base/sha256.h"
#include "base/text.h"
#include "format/cursor.h"

namespace kvsnap {
namespace {

// ---------------------------------------------------------------- helpers

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int64_t sign_extend(uint64_t v, uint32_t bytes) {
  if (bytes >= 8) return static_cast<int64_t>(v);
  const uint64_t sign = uint64_t(1) << (bytes * 8 - 1);
  return static_cast<int64_t>((v ^ sign) - sign);
}

bool is_signed(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

// Smallest encoding of one element of type t in the file (for count checks).
uint64_t min_elem_bytes(GgufType t) {
  if (t == GgufType::kString) return 8;   // u64 length
  if (t == GgufType::kArray) return 12;   // u32 type + u64 count
  return gguf_type_size(t);
}

// ---------------------------------------------------------------- parser
class Parser {
 public:
  explicit Parser(Cursor& c) : c_(c) {}

  Result<std::string> string(const std::string& what) {
    const uint64_t at = c_.offset();
    KV_ASSIGN_OR_RETURN(uint64_t n, c_.u64((what + " length").c_str()));
    if (n > kGgufMaxStringBytes) {
      return c_.corrupt(at, what + " length " + std::to_string(n) + " exceeds the limit of " +
                                std::to_string(kGgufMaxStringBytes) + " bytes");
    }
    if (n > c_.remaining()) {
      return c_.corrupt(at, "truncated: " + what + " of " + std::to_string(n) + " bytes, " +
                                std::to_string(c_.remaining()) + " remain");
    }
    std::string s(static_cast<size_t>(n), '\0');
    KV_RETURN_IF_ERROR(c_.read(s.data(), n, what.c_str()));
    return s;
  }

  Result<GgufType> type(const std::string& what) {
    const uint64_t at = c_.offset();
    KV_ASSIGN_OR_RETURN(uint32_t t, c_.u32(what.c_str()));
    if (t >= kGgufTypeCount) {
      return c_.corrupt(at, what + " " + std::to_string(t) + " is not a GGUF type (0.." +
                                std::to_string(kGgufTypeCount - 1) + ")");
    }
    return static_cast<GgufType>(t);
  }

  Status scalar(GgufType t, GgufValue& out, const std::string& what) {
    out.type = t;
    if (t == GgufType::kString) {
      KV_ASSIGN_OR_RETURN(std::string s, string(what));
      out.v = std::move(s);
      return Status::OK();
    }
    const uint32_t size = gguf_type_size(t);
    std::byte b[8];
    KV_RETURN_IF_ERROR(c_.read(b, size, what.c_str()));
    const uint64_t raw = load_le(b, size);
    switch (t) {
      case GgufType::kF32: {
        float f;
        uint32_t r32 = static_cast<uint32_t>(raw);
        std::memcpy(&f, &r32, 4);
        out.v = double(f);
        break;
      }
      case GgufType::kF64: {
        double d;
        std::memcpy(&d, &raw, 8);
        out.v = d;
        break;
      }
      case GgufType::kBool:
        out.v = uint64_t(raw != 0 ? 1 : 0);
        break;
      default:
        if (is_signed(t)) {
          out.v = sign_extend(raw, size);
        } else {
          out.v = raw;
        }
    }
    return Status::OK();
  }

  Status array(GgufArray& out, uint32_t depth, const std::string& what) {
    KV_ASSIGN_OR_RETURN(out.elem_type, type("element type of " + what));
    if (out.elem_type == GgufType::kArray && depth + 1 >= kGgufMaxNesting) {
      return c_.corrupt(c_.offset() - 4, what + ": arrays nested deeper than " + std::to_string(kGgufMaxNesting) +
                                             " levels");
    }
    const uint64_t at = c_.offset();
    KV_ASSIGN_OR_RETURN(out.count, c_.u64(("element count of " + what).c_str()));
    if (out.count > kGgufMaxArrayElems) {
      return c_.corrupt(at, what + ": array of " + std::to_string(out.count) + " elements exceeds the limit of " +
                                std::to_string(kGgufMaxArrayElems));
    }
    const uint64_t min = min_elem_bytes(out.elem_type);
    if (out.count > c_.remaining() / min) {
      return c_.corrupt(at, "truncated: " + what + ": array of " + std::to_string(out.count) + " " +
                                gguf_type_name(out.elem_type) + " needs at least " +
                                std::to_string(out.count * min) + " bytes, " + std::to_string(c_.remaining()) +
                                " remain");
    }
    if (out.elem_type == GgufType::kString) {
      out.strings.reserve(static_cast<size_t>(out.count));
      const std::string ew = "string in " + what;
      for (uint64_t i = 0; i < out.count; ++i) {
        KV_ASSIGN_OR_RETURN(std::string s, string(ew));
        out.strings.push_back(std::move(s));
      }
    } else if (out.elem_type == GgufType::kArray) {
      out.arrays.resize(static_cast<size_t>(out.count));
      for (uint64_t i = 0; i < out.count; ++i) {
        KV_RETURN_IF_ERROR(array(out.arrays[i], depth + 1, "element " + std::to_string(i) + " of " + what));
      }
    } else {
      out.data.resize(static_cast<size_t>(out.count * min));
      KV_RETURN_IF_ERROR(c_.read(out.data.data(), out.data.size(), ("elements of " + what).c_str()));
    }
    return Status::OK();
  }

 private:
  Cursor& c_;
};

Status check_ne(Cursor& c, uint64_t at, const GgufTensorInfo& t) {
  // ggml: the element count must stay below INT64_MAX
  uint64_t total = 1;
  for (int64_t d : t.ne) {
    if (d == 0) return Status::OK();
  }
  for (int64_t d : t.ne) {
    if (uint64_t(d) > uint64_t(std::numeric_limits<int64_t>::max()) / total) {
      return c.corrupt(at, "tensor " + quote_text(t.name) + ": element count of shape (" + std::to_string(t.ne[0]) + ", " +
                               std::to_string(t.ne[1]) + ", " + std::to_string(t.ne[2]) + ", " +
                               std::to_string(t.ne[3]) + ") overflows");
    }
    total *= uint64_t(d);
  }
  return Status::OK();
}

}  // namespace

// ---------------------------------------------------------------- types
std::string gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "type " + std::to_string(static_cast<uint32_t>(t));
}

uint32_t gguf_type_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool: return 1;
    case GgufType::kU16:
    case GgufType::kI16: return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32: return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64: return 8;
    case GgufType::kString:
    case GgufType::kArray: return 0;
  }
  return 0;
}

bool gguf_type_is_integer(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64: return true;
    default: return false;
  }
}

// ---------------------------------------------------------------- arrays
Result<int64_t> GgufArray::int_at(uint64_t i) const {
  if (i >= count) return Status::InvalidArgument("array index " + std::to_string(i) + " >= " + std::to_string(count));
  if (!gguf_type_is_integer(elem_type) && elem_type != GgufType::kBool) {
    return Status::Mismatch("array of " + gguf_type_name(elem_type) + " is not an integer array");
  }
  const uint32_t sz = gguf_type_size(elem_type);
  const uint64_t raw = load_le(data.data() + i * sz, sz);
  if (elem_type == GgufType::kBool) return int64_t(raw != 0);
  if (is_signed(elem_type)) return sign_extend(raw, sz);
  if (raw > uint64_t(std::numeric_limits<int64_t>::max())) return Status::Mismatch("array value does not fit in i64");
  return int64_t(raw);
}

Result<uint64_t> GgufArray::uint_at(uint64_t i) const {
  if (i >= count) return Status::InvalidArgument("array index " + std::to_string(i) + " >= " + std::to_string(count));
  if (!gguf_type_is_integer(elem_type) && elem_type != GgufType::kBool) {
    return Status::Mismatch("array of " + gguf_type_name(elem_type) + " is not an integer array");
  }
  const uint32_t sz = gguf_type_size(elem_type);
  const uint64_t raw = load_le(data.data() + i * sz, sz);
  if (elem_type == GgufType::kBool) return uint64_t(raw != 0);
  if (is_signed(elem_type) && sign_extend(raw, sz) < 0) return Status::Mismatch("negative array value");
  return raw;
}

Result<double> GgufArray::float_at(uint64_t i) const {
  if (i >= count) return Status::InvalidArgument("array index " + std::to_string(i) + " >= " + std::to_string(count));
  if (elem_type == GgufType::kF32) {
    uint32_t r = static_cast<uint32_t>(load_le(data.data() + i * 4, 4));
    float f;
    std::memcpy(&f, &r, 4);
    return double(f);
  }
  if (elem_type == GgufType::kF64) {
    uint64_t r = load_le(data.data() + i * 8, 8);
    double d;
    std::memcpy(&d, &r, 8);
    return d;
  }
  KV_ASSIGN_OR_RETURN(int64_t v, int_at(i));
  return double(v);
}

Result<bool> GgufArray::bool_at(uint64_t i) const {
  KV_ASSIGN_OR_RETURN(int64_t v, int_at(i));
  return v != 0;
}

GgufArray gguf_array_u32(const std::vector<uint32_t>& v) {
  GgufArray a;
  a.elem_type = GgufType::kU32;
  a.count = v.size();
  for (uint32_t x : v) put_u32(a.data, x);
  return a;
}

GgufArray gguf_array_i32(const std::vector<int32_t>& v) {
  GgufArray a;
  a.elem_type = GgufType::kI32;
  a.count = v.size();
  for (int32_t x : v) put_i32(a.data, x);
  return a;
}

GgufArray gguf_array_f32(const std::vector<float>& v) {
  GgufArray a;
  a.elem_type = GgufType::kF32;
  a.count = v.size();
  for (float x : v) {
    uint32_t r;
    std::memcpy(&r, &x, 4);
    put_u32(a.data, r);
  }
  return a;
}

GgufArray gguf_array_bool(const std::vector<bool>& v) {
  GgufArray a;
  a.elem_type = GgufType::kBool;
  a.count = v.size();
  for (bool x : v) a.data.push_back(std::byte(x ? 1 : 0));
  return a;
}

GgufArray gguf_array_string(std::vector<std::string> v) {
  GgufArray a;
  a.elem_type = GgufType::kString;
  a.count = v.size();
  a.strings = std::move(v);
  return a;
}

GgufArray gguf_array_of_arrays(std::vector<GgufArray> v) {
  GgufArray a;
  a.elem_type = GgufType::kArray;
  a.count = v.size();
  a.arrays = std::move(v);
  return a;
}

// ---------------------------------------------------------------- display
namespace {
std::string number_string(double d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", d);
  return buf;
}

// An element for display: its text, or what is wrong with it (never an exception).
template <class T, class Show>
std::string shown(const Result<T>& r, Show show) {
  return r.ok() ? show(*r) : "<" + r.status().ToString() + ">";
}

std::string array_display(const GgufArray& a, size_t max_items) {
  std::string out = "[";
  const uint64_t n = std::min<uint64_t>(a.count, max_items);
  for (uint64_t i = 0; i < n; ++i) {
    if (i) out += ", ";
    switch (a.elem_type) {
      case GgufType::kString: out += quote_text(a.strings[i]); break;
      case GgufType::kArray: out += array_display(a.arrays[i], max_items); break;
      case GgufType::kF32:
      case GgufType::kF64: out += shown(a.float_at(i), number_string); break;
      case GgufType::kBool: out += shown(a.bool_at(i), [](bool b) { return std::string(b ? "true" : "false"); }); break;
      default:
        if (is_signed(a.elem_type)) {
          out += shown(a.int_at(i), [](int64_t v) { return std::to_string(v); });
        } else {
          out += shown(a.uint_at(i), [](uint64_t v) { return std::to_string(v); });
        }
    }
  }
  if (a.count > n) out += ", ... (" + std::to_string(a.count) + " x " + gguf_type_name(a.elem_type) + ")";
  return out + "]";
}
}  // namespace

std::string GgufValue::to_display_string(size_t max_items) const {
  switch (type) {
    case GgufType::kString: return quote_text(std::get<std::string>(v));
    case GgufType::kArray: return array_display(std::get<GgufArray>(v), max_items);
    case GgufType::kF32:
    case GgufType::kF64: return number_string(std::get<double>(v));
    case GgufType::kBool: return std::get<uint64_t>(v) ? "true" : "false";
    default:
      if (is_signed(type)) return std::to_string(std::get<int64_t>(v));
      return std::to_string(std::get<uint64_t>(v));
  }
}

// ---------------------------------------------------------------- accessors
const GgufKv* GgufHeader::find(std::string_view key) const {
  auto it = index_.find(key);
  if (it != index_.end()) return &kvs[it->second];
  // headers assembled by hand (tests) have no index
  if (index_.empty()) {
    for (const auto& kv : kvs) {
      if (kv.key == key) return &kv;
    }
  }
  return nullptr;
}

const GgufTensorInfo* GgufHeader::find_tensor(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status GgufHeader::type_error(const GgufKv& kv, const char* expected) const {
  std::string got = gguf_type_name(kv.value.type);
  if (kv.value.type == GgufType::kArray) {
    got = "array of " + gguf_type_name(std::get<GgufArray>(kv.value.v).elem_type);
  }
  return Status::Mismatch(file + ": key " + quote_text(kv.key) + " has type " + got + ", expected " + expected);
}

namespace {
Status not_found(const std::string& file, std::string_view key) {
  return Status::NotFound(file + ": key " + quote_text(key) + " not found");
}
}  // namespace

Result<int64_t> GgufHeader::get_i64(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return not_found(file, key);
  if (!gguf_type_is_integer(kv->value.type)) return type_error(*kv, "an integer");
  if (is_signed(kv->value.type)) return std::get<int64_t>(kv->value.v);
  const uint64_t u = std::get<uint64_t>(kv->value.v);
  if (u > uint64_t(std::numeric_limits<int64_t>::max())) {
    return Status::Mismatch(file + ": key " + quote_text(key) + " value " + std::to_string(u) + " does not fit in i64");
  }
  return int64_t(u);
}

Result<uint64_t> GgufHeader::get_u64(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return not_found(file, key);
  if (!gguf_type_is_integer(kv->value.type)) return type_error(*kv, "an integer");
  if (is_signed(kv->value.type)) {
    const int64_t i = std::get<int64_t>(kv->value.v);
    if (i < 0) return Status::Mismatch(file + ": key " + quote_text(key) + " is negative (" + std::to_string(i) + ")");
    return uint64_t(i);
  }
  return std::get<uint64_t>(kv->value.v);
}

Result<uint32_t> GgufHeader::get_u32(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(uint64_t v, get_u64(key));
  if (v > std::numeric_limits<uint32_t>::max()) {
    return Status::Mismatch(file + ": key " + quote_text(key) + " value " + std::to_string(v) + " does not fit in u32");
  }
  return uint32_t(v);
}

Result<int32_t> GgufHeader::get_i32(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(int64_t v, get_i64(key));
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    return Status::Mismatch(file + ": key " + quote_text(key) + " value " + std::to_string(v) + " does not fit in i32");
  }
  return int32_t(v);
}

Result<double> GgufHeader::get_f64(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return not_found(file, key);
  if (kv->value.type != GgufType::kF32 && kv->value.type != GgufType::kF64) return type_error(*kv, "f32");
  return std::get<double>(kv->value.v);
}

Result<float> GgufHeader::get_f32(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(double d, get_f64(key));
  return float(d);
}

Result<bool> GgufHeader::get_bool(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return not_found(file, key);
  if (kv->value.type != GgufType::kBool) return type_error(*kv, "bool");
  return std::get<uint64_t>(kv->value.v) != 0;
}

Result<std::string> GgufHeader::get_string(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return not_found(file, key);
  if (kv->value.type != GgufType::kString) return type_error(*kv, "string");
  return std::get<std::string>(kv->value.v);
}

Result<const GgufArray*> GgufHeader::get_array(std::string_view key) const {
  const GgufKv* kv = find(key);
  if (!kv) return not_found(file, key);
  if (kv->value.type != GgufType::kArray) return type_error(*kv, "array");
  return &std::get<GgufArray>(kv->value.v);
}

Result<uint64_t> GgufHeader::get_array_size(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufArray* a, get_array(key));
  return a->count;
}

Result<std::vector<uint32_t>> GgufHeader::get_u32_array(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufArray* a, get_array(key));
  if (!gguf_type_is_integer(a->elem_type) && a->elem_type != GgufType::kBool) {
    return type_error(*find(key), "array of integers");
  }
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(a->count));
  for (uint64_t i = 0; i < a->count; ++i) {
    auto v = a->uint_at(i);
    if (!v.ok() || *v > std::numeric_limits<uint32_t>::max()) {
      return Status::Mismatch(file + ": key " + quote_text(key) + " element " + std::to_string(i) + " does not fit in u32");
    }
    out.push_back(uint32_t(*v));
  }
  return out;
}

Result<std::vector<float>> GgufHeader::get_f32_array(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufArray* a, get_array(key));
  if (a->elem_type != GgufType::kF32 && a->elem_type != GgufType::kF64) {
    return type_error(*find(key), "array of f32");
  }
  std::vector<float> out;
  out.reserve(static_cast<size_t>(a->count));
  for (uint64_t i = 0; i < a->count; ++i) {
    KV_ASSIGN_OR_RETURN(double v, a->float_at(i));
    out.push_back(float(v));
  }
  return out;
}

Result<const std::vector<std::string>*> GgufHeader::get_string_array(std::string_view key) const {
  KV_ASSIGN_OR_RETURN(const GgufArray* a, get_array(key));
  if (a->elem_type != GgufType::kString) return type_error(*find(key), "array of string");
  return &a->strings;
}

Result<std::vector<uint32_t>> GgufHeader::get_u32_or_array(std::string_view key, uint32_t n) const {
  const GgufKv* kv = find(key);
  if (!kv) return not_found(file, key);
  if (kv->value.type == GgufType::kArray) {
    const auto& a = std::get<GgufArray>(kv->value.v);
    if (a.count != n) {
      return Status::Mismatch(file + ": key " + quote_text(key) + " has wrong array length; expected " + std::to_string(n) +
                              ", got " + std::to_string(a.count));
    }
    return get_u32_array(key);
  }
  KV_ASSIGN_OR_RETURN(uint32_t v, get_u32(key));
  return std::vector<uint32_t>(n, v);
}

Result<uint32_t> GgufHeader::get_u32_or(std::string_view key, uint32_t dflt) const {
  if (!has(key)) return dflt;
  return get_u32(key);
}

Result<float> GgufHeader::get_f32_or(std::string_view key, float dflt) const {
  if (!has(key)) return dflt;
  return get_f32(key);
}

Result<bool> GgufHeader::get_bool_or(std::string_view key, bool dflt) const {
  if (!has(key)) return dflt;
  return get_bool(key);
}

Result<std::string> GgufHeader::get_string_or(std::string_view key, std::string dflt) const {
  if (!has(key)) return dflt;
  return get_string(key);
}

// ---------------------------------------------------------------- reading
namespace {

// A key/value pair takes at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 4 + 4 + 8:
// counts beyond what the rest of the file can hold are refused before any allocation.
constexpr uint64_t kMinKv = 14, kMinInfo = 24;

// The magic and a version this reader knows (2 or 3, little-endian).
Status read_magic_and_version(Cursor& c, const std::string& name, uint32_t& version) {
  std::byte m[4];
  KV_RETURN_IF_ERROR(c.read(m, 4, "GGUF magic"));
  if (std::memcmp(m, "GGUF", 4) != 0) {
    std::string shown;
    for (std::byte b : m) {
      const char ch = static_cast<char>(b);
      shown += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    }
    // Another kind of file, as a state file of unknown magic is: not supported (exit 4), not damage.
    return Status::NotSupported(name + ": offset 0: not a GGUF file: magic '" + shown + "', expected 'GGUF'");
  }
  KV_ASSIGN_OR_RETURN(version, c.u32("GGUF version"));
  if (version == 0) return c.corrupt(4, "bad GGUF version 0");
  if ((version & 0xFFFF) == 0) {
    return Status::NotSupported(name + ": offset 4: GGUF version " + std::to_string(version) +
                                " looks byte-swapped: big-endian GGUF files are not supported");
  }
  if (version == 1) {
    return Status::NotSupported(name + ": offset 4: GGUF v1 is not supported (llama.cpp dropped it too)");
  }
  if (version > 3) {
    return Status::NotSupported(name + ": offset 4: GGUF version " + std::to_string(version) +
                                " is newer than the supported 2 and 3");
  }
  return Status::OK();
}

// The tensor and key/value counts, each within its limit.
Status read_counts(Cursor& c, uint64_t& n_tensors, uint64_t& n_kv) {
  KV_ASSIGN_OR_RETURN(n_tensors, c.u64("tensor count"));
  if (n_tensors > kGgufMaxTensorCount) {
    return c.corrupt(8, "tensor count " + std::to_string(n_tensors) + " exceeds the limit of " +
                            std::to_string(kGgufMaxTensorCount));
  }
  KV_ASSIGN_OR_RETURN(n_kv, c.u64("key/value count"));
  if (n_kv > kGgufMaxKvCount) {
    return c.corrupt(16, "key/value count " + std::to_string(n_kv) + " exceeds the limit of " +
                             std::to_string(kGgufMaxKvCount));
  }
  if (n_kv > c.remaining() / kMinKv) {
    return c.corrupt(16, "truncated: " + std::to_string(n_kv) + " key/value pairs need at least " +
                             std::to_string(n_kv * kMinKv) + " bytes, " + std::to_string(c.remaining()) + " remain");
  }
  return Status::OK();
}

// The key/value pairs, in file order; a key may appear once.
Status read_kvs(Cursor& c, Parser& p, uint64_t n_kv, std::vector<GgufKv>& kvs,
                std::map<std::string, size_t, std::less<>>& index) {
  kvs.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKv kv;
    kv.offset = c.offset();
    const std::string kw = "key " + std::to_string(i);
    KV_ASSIGN_OR_RETURN(kv.key, p.string(kw));
    if (kv.key.empty()) return c.corrupt(kv.offset, kw + " is empty");
    if (auto it = index.find(kv.key); it != index.end()) {
      return c.corrupt(kv.offset, "duplicate key " + quote_text(kv.key) + " (first at offset " +
                                      std::to_string(kvs[it->second].offset) + ")");
    }
    const std::string what = "value of key " + quote_text(kv.key);
    KV_ASSIGN_OR_RETURN(GgufType t, p.type("type of key " + quote_text(kv.key)));
    if (t == GgufType::kArray) {
      GgufArray a;
      KV_RETURN_IF_ERROR(p.array(a, 0, what));
      kv.value.type = GgufType::kArray;
      kv.value.v = std::move(a);
    } else {
      KV_RETURN_IF_ERROR(p.scalar(t, kv.value, what));
    }
    index.emplace(kv.key, kvs.size());
    kvs.push_back(std::move(kv));
  }
  return Status::OK();
}

// general.alignment, when present: a u32 power of 2.
Status read_alignment(Cursor& c, GgufHeader& h) {
  const GgufKv* a = h.find(kGgufAlignmentKey);
  if (!a) return Status::OK();
  if (a->value.type != GgufType::kU32) {
    return c.corrupt(a->offset, std::string("key '") + kGgufAlignmentKey + "' must be u32 but is " +
                                    gguf_type_name(a->value.type));
  }
  const uint64_t al = std::get<uint64_t>(a->value.v);
  if (al == 0 || (al & (al - 1)) != 0) {
    return c.corrupt(a->offset, "alignment " + std::to_string(al) + " is not a power of 2");
  }
  h.alignment = static_cast<uint32_t>(al);
  return Status::OK();
}

// A tensor's name: not too long, not seen before.
Status read_tensor_name(Cursor& c, Parser& p, uint64_t i, const std::map<std::string, uint64_t, std::less<>>& names,
                        GgufTensorInfo& t) {
  KV_ASSIGN_OR_RETURN(t.name, p.string("name of tensor " + std::to_string(i)));
  if (t.name.size() > kGgufMaxTensorName) {
    return c.corrupt(t.info_offset, "tensor " + std::to_string(i) + " name " + quote_text(t.name) + " is too long: " +
                                        std::to_string(t.name.size()) + " >= " +
                                        std::to_string(kGgufMaxTensorName + 1));
  }
  if (auto it = names.find(t.name); it != names.end()) {
    return c.corrupt(t.info_offset, "duplicate tensor name " + quote_text(t.name) + " (first at offset " +
                                        std::to_string(it->second) + ")");
  }
  return Status::OK();
}

// A tensor's shape: at most kGgufMaxDims sizes, none negative, their product
// within int64.
Status read_tensor_shape(Cursor& c, const std::string& tw, GgufTensorInfo& t) {
  const uint64_t dims_at = c.offset();
  KV_ASSIGN_OR_RETURN(t.n_dims, c.u32(("dimension count of " + tw).c_str()));
  if (t.n_dims > kGgufMaxDims) {
    return c.corrupt(dims_at, tw + " has " + std::to_string(t.n_dims) + " dimensions, at most " +
                                  std::to_string(kGgufMaxDims) + " allowed");
  }
  for (uint32_t d = 0; d < t.n_dims; ++d) {
    const uint64_t at = c.offset();
    KV_ASSIGN_OR_RETURN(uint64_t ne, c.u64(("shape of " + tw).c_str()));
    t.ne[d] = static_cast<int64_t>(ne);
    if (t.ne[d] < 0) {
      return c.corrupt(at, tw + " dimension " + std::to_string(d) + " has a negative size " + std::to_string(t.ne[d]));
    }
  }
  return check_ne(c, t.info_offset, t);
}

// A tensor's ggml type (known to this kvsnap, whole blocks per row) and its
// size in bytes.
Status read_tensor_type(Cursor& c, const std::string& file, const std::string& tw, GgufTensorInfo& t) {
  const uint64_t type_at = c.offset();
  KV_ASSIGN_OR_RETURN(t.type, c.i32(("type of " + tw).c_str()));
  const TypeLayout* row = find_ggml_type(t.type);
  if (!row) {
    if (t.type >= kGgmlTypeCount) {
      return Status::NotSupported(file + ": offset " + std::to_string(type_at) + ": " + tw + " has ggml type " +
                                  std::to_string(t.type) + ", unknown to this kvsnap (< " +
                                  std::to_string(kGgmlTypeCount) + ")");
    }
    return c.corrupt(type_at, tw + " has invalid or removed ggml type " + std::to_string(t.type));
  }
  if (t.ne[0] % row->block_elems != 0) {
    return c.corrupt(type_at, tw + " of type " + std::string(row->name) + " has " + std::to_string(t.ne[0]) +
                                  " elements per row, not a multiple of the block size " +
                                  std::to_string(row->block_elems));
  }
  auto nb = ggml_nbytes(t.type, t.n_elements());
  if (!nb) return c.corrupt(type_at, tw + ": size in bytes overflows");
  t.n_bytes = *nb;
  return Status::OK();
}

// The tensor infos: name, shape, type and data offset of each.
Status read_tensor_infos(Cursor& c, Parser& p, const std::string& file, uint64_t n_tensors,
                         std::vector<GgufTensorInfo>& tensors) {
  if (n_tensors > c.remaining() / kMinInfo) {
    return c.corrupt("truncated: " + std::to_string(n_tensors) + " tensor infos need at least " +
                     std::to_string(n_tensors * kMinInfo) + " bytes, " + std::to_string(c.remaining()) + " remain");
  }
  tensors.reserve(static_cast<size_t>(n_tensors));
  std::map<std::string, uint64_t, std::less<>> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.info_offset = c.offset();
    KV_RETURN_IF_ERROR(read_tensor_name(c, p, i, names, t));
    const std::string tw = "tensor " + quote_text(t.name);
    KV_RETURN_IF_ERROR(read_tensor_shape(c, tw, t));
    KV_RETURN_IF_ERROR(read_tensor_type(c, file, tw, t));
    KV_ASSIGN_OR_RETURN(t.offset, c.u64(("data offset of " + tw).c_str()));
    names.emplace(t.name, t.info_offset);
    tensors.push_back(std::move(t));
  }
  return Status::OK();
}

// The data section: aligned, tensors contiguous in info order, inside the file.
Status check_data_section(Cursor& c, GgufHeader& h) {
  h.data_offset = align_up(h.infos_end, h.alignment);
  uint64_t expect = 0;
  for (const auto& t : h.tensors) {
    if (t.offset != expect) {
      return c.corrupt(t.info_offset, "tensor " + quote_text(t.name) + " has data offset " + std::to_string(t.offset) +
                                          ", expected " + std::to_string(expect));
    }
    const uint64_t padded = align_up(t.n_bytes, h.alignment);
    if (padded < t.n_bytes || expect > std::numeric_limits<uint64_t>::max() - padded) {
      return c.corrupt(t.info_offset, "tensor " + quote_text(t.name) + ": data section size overflows");
    }
    expect += padded;
  }
  h.data_size = expect;
  if (h.tensors.empty()) return Status::OK();
  const auto& last = h.tensors.back();
  const uint64_t need_end = last.offset + last.n_bytes;  // the last tensor's padding is optional
  if (h.data_offset > h.file_size || need_end > h.file_size - h.data_offset) {
    const uint64_t have = h.data_offset > h.file_size ? 0 : h.file_size - h.data_offset;
    return c.corrupt(h.data_offset, "truncated: tensor data needs " + std::to_string(need_end) + " bytes, " +
                                        std::to_string(have) + " remain");
  }
  return Status::OK();
}

}  // namespace

Result<GgufHeader> read_gguf(const ReadableFile& file) {
  Cursor c(file);
  Parser p(c);
  GgufHeader h;
  h.file = file.name();
  h.file_size = file.size();
  KV_RETURN_IF_ERROR(read_magic_and_version(c, file.name(), h.version));
  uint64_t n_tensors = 0, n_kv = 0;
  KV_RETURN_IF_ERROR(read_counts(c, n_tensors, n_kv));
  KV_RETURN_IF_ERROR(read_kvs(c, p, n_kv, h.kvs, h.index_));
  h.kv_end = c.offset();
  KV_RETURN_IF_ERROR(read_alignment(c, h));
  KV_RETURN_IF_ERROR(read_tensor_infos(c, p, file.name(), n_tensors, h.tensors));
  h.infos_end = c.offset();
  KV_RETURN_IF_ERROR(check_data_section(c, h));
  return h;
}

Result<GgufHeader> read_gguf(Io& io, const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, io.open_read(path));
  return read_gguf(*f);
}

// ---------------------------------------------------------------- fingerprint
Result<std::string> gguf_fingerprint(const ReadableFile& file, const GgufHeader& header) {
  if (header.infos_end > file.size()) {
    return Status::InvalidArgument(file.name() + ": header of " + std::to_string(header.infos_end) +
                                   " bytes does not fit the file of " + std::to_string(file.size()));
  }
  Sha256 sha;
  std::vector<std::byte> buf(64 * 1024);
  for (uint64_t off = 0; off < header.infos_end;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), header.infos_end - off);
    KV_RETURN_IF_ERROR(file.read_at(off, std::span<std::byte>(buf.data(), n)));
    sha.update(std::span<const std::byte>(buf.data(), n));
    off += n;
  }
  std::vector<std::byte> size_le;
  put_u64(size_le, file.size());
  sha.update(size_le);
  return to_hex(sha.finish());
}

Result<std::string> gguf_fingerprint(Io& io, const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, io.open_read(path));
  KV_ASSIGN_OR_RETURN(GgufHeader h, read_gguf(*f));
  return gguf_fingerprint(*f, h);
}

}  // namespace kvsnap
