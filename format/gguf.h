// GGUF metadata: the header, every key/value pair and the tensor infos of a
// model file, read through a bounds-checked Cursor. Tensor data is never read.
//
// Layout (ggml/include/gguf.h, versions 2 and 3; all little-endian):
//   "GGUF", u32 version, u64 n_tensors, u64 n_kv,
//   n_kv x { string key, u32 type, value },
//   n_tensors x { string name, u32 n_dims, n_dims x i64 ne, i32 ggml_type, u64 offset },
//   zero padding to `general.alignment` (default 32), tensor data.
// A string is u64 length + bytes (no terminator); an array is u32 element
// type, u64 count, elements. Arrays of arrays are allowed by the format (and
// read here, up to kMaxNesting levels) although llama.cpp itself rejects them.
//
// The file is hostile until proven otherwise: every count is checked against
// the bytes that remain before it sizes a container, and fixed caps bound
// strings, arrays, key and tensor counts and nesting. Errors read
// "model.gguf: offset 1234: truncated: ..." (kCorruption), or kNotSupported for
// GGUF v1 and unknown versions.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/ggml_types.h"  // ggml_nbytes, ggml_type_name_any: tensor sizes and names

namespace kvsnap {

// enum gguf_type. Numbers never change.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
inline constexpr uint32_t kGgufTypeCount = 13;

// "u32", "string", ... ("type 99" for unknown ids).
std::string gguf_type_name(GgufType t);
// Bytes of one fixed-size value; 0 for string and array.
uint32_t gguf_type_size(GgufType t);
bool gguf_type_is_integer(GgufType t);

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr const char* kGgufAlignmentKey = "general.alignment";

// Hard limits on what a file may claim. Each is also checked against the bytes
// remaining, so a small file cannot claim a large count either.
inline constexpr uint64_t kGgufMaxStringBytes = 64ull << 20;   // one key, value or name
inline constexpr uint64_t kGgufMaxArrayElems = 1ull << 26;     // elements of one array
inline constexpr uint64_t kGgufMaxKvCount = 1ull << 20;
inline constexpr uint64_t kGgufMaxTensorCount = 1ull << 20;
inline constexpr uint32_t kGgufMaxNesting = 4;                 // arrays of arrays of ...
inline constexpr uint32_t kGgufMaxDims = 4;                    // GGML_MAX_DIMS
inline constexpr uint32_t kGgufMaxTensorName = 63;             // GGML_MAX_NAME - 1

// One array value. Numeric and bool elements are kept as their little-endian
// bytes (compact for 250k-entry vocabularies); strings and nested arrays in
// their own vectors. Exactly one of data / strings / arrays is used.
struct GgufArray {
  GgufType elem_type = GgufType::kU8;
  uint64_t count = 0;
  std::vector<std::byte> data;        // count * gguf_type_size(elem_type) bytes
  std::vector<std::string> strings;   // elem_type == kString
  std::vector<GgufArray> arrays;      // elem_type == kArray

  // Element i as a number; kMismatch for strings/arrays or a value that does
  // not fit, kInvalidArgument for i >= count.
  Result<int64_t> int_at(uint64_t i) const;
  Result<uint64_t> uint_at(uint64_t i) const;
  Result<double> float_at(uint64_t i) const;   // f32, f64 and integers
  Result<bool> bool_at(uint64_t i) const;      // bool and integers (!= 0)
};

// One scalar or array value.
struct GgufValue {
  GgufType type = GgufType::kU32;
  // kU8..kU64, kI8..kI64, kBool (0/1), kF32/kF64, kString, kArray
  std::variant<uint64_t, int64_t, double, std::string, GgufArray> v;

  static GgufValue u8(uint8_t x) { return {GgufType::kU8, uint64_t(x)}; }
  static GgufValue i8(int8_t x) { return {GgufType::kI8, int64_t(x)}; }
  static GgufValue u16(uint16_t x) { return {GgufType::kU16, uint64_t(x)}; }
  static GgufValue i16(int16_t x) { return {GgufType::kI16, int64_t(x)}; }
  static GgufValue u32(uint32_t x) { return {GgufType::kU32, uint64_t(x)}; }
  static GgufValue i32(int32_t x) { return {GgufType::kI32, int64_t(x)}; }
  static GgufValue u64(uint64_t x) { return {GgufType::kU64, x}; }
  static GgufValue i64(int64_t x) { return {GgufType::kI64, x}; }
  static GgufValue f32(float x) { return {GgufType::kF32, double(x)}; }
  static GgufValue f64(double x) { return {GgufType::kF64, x}; }
  static GgufValue boolean(bool x) { return {GgufType::kBool, uint64_t(x ? 1 : 0)}; }
  static GgufValue string(std::string s) { return {GgufType::kString, std::move(s)}; }
  static GgufValue array(GgufArray a) { return {GgufType::kArray, std::move(a)}; }

  // Short human form: 42, 1e-05, "llama", [302 x string], for `kvsnap info`.
  std::string to_display_string(size_t max_items = 8) const;
};

// Array builders (for the writer and tests).
GgufArray gguf_array_u32(const std::vector<uint32_t>& v);
GgufArray gguf_array_i32(const std::vector<int32_t>& v);
GgufArray gguf_array_f32(const std::vector<float>& v);
GgufArray gguf_array_bool(const std::vector<bool>& v);
GgufArray gguf_array_string(std::vector<std::string> v);
GgufArray gguf_array_of_arrays(std::vector<GgufArray> v);  // each inner array keeps its own type

struct GgufKv {
  std::string key;
  GgufValue value;
  uint64_t offset = 0;  // where the key starts in the file
};

struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // unused dimensions are 1
  int32_t type = 0;                        // enum ggml_type
  uint64_t offset = 0;                     // relative to the data section
  uint64_t n_bytes = 0;                    // of the data, from shape and type
  uint64_t info_offset = 0;                // where the info starts in the file
  uint64_t n_elements() const { return uint64_t(ne[0]) * uint64_t(ne[1]) * uint64_t(ne[2]) * uint64_t(ne[3]); }
};

struct GgufHeader {
  std::string file;            // name used in messages
  uint64_t file_size = 0;
  uint32_t version = 0;
  std::vector<GgufKv> kvs;     // in file order
  std::vector<GgufTensorInfo> tensors;
  uint32_t alignment = kGgufDefaultAlignment;
  uint64_t kv_end = 0;         // offset after the last key/value pair
  uint64_t infos_end = 0;      // offset after the last tensor info (the fingerprinted prefix)
  uint64_t data_offset = 0;    // start of the (aligned) tensor data section
  uint64_t data_size = 0;      // sum of aligned tensor sizes

  const GgufKv* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Typed accessors. kNotFound when the key is absent; kMismatch when it has
  // another type or its value does not fit. Integer getters accept any integer
  // type whose value fits (llama.cpp itself insists on the exact type).
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int32_t> get_i32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;   // f32 or f64
  Result<double> get_f64(std::string_view key) const;  // f32 or f64
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<const GgufArray*> get_array(std::string_view key) const;
  Result<std::vector<uint32_t>> get_u32_array(std::string_view key) const;  // integer/bool arrays
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  Result<const std::vector<std::string>*> get_string_array(std::string_view key) const;
  // Element count of an array value.
  Result<uint64_t> get_array_size(std::string_view key) const;

  // llama.cpp's get_key_or_arr: a scalar repeated n times, or an array of
  // exactly n integers. kMismatch for an array of another length.
  Result<std::vector<uint32_t>> get_u32_or_array(std::string_view key, uint32_t n) const;

  // Same accessors with a default when the key is absent (other errors stay).
  Result<uint32_t> get_u32_or(std::string_view key, uint32_t dflt) const;
  Result<float> get_f32_or(std::string_view key, float dflt) const;
  Result<bool> get_bool_or(std::string_view key, bool dflt) const;
  Result<std::string> get_string_or(std::string_view key, std::string dflt) const;

  // "general.architecture", or kNotFound.
  Result<std::string> architecture() const { return get_string("general.architecture"); }

 private:
  friend Result<GgufHeader> read_gguf(const ReadableFile& file);
  std::map<std::string, size_t, std::less<>> index_;  // key -> kvs index
  Status type_error(const GgufKv& kv, const char* expected) const;
};

// Parses header, key/value pairs and tensor infos of `file`. Also checks what
// llama.cpp checks before it trusts a file: no duplicate keys or tensor names,
// `general.alignment` a u32 power of two, tensor shapes and types valid,
// offsets contiguous and aligned, and the data section inside the file.
Result<GgufHeader> read_gguf(const ReadableFile& file);
Result<GgufHeader> read_gguf(Io& io, const std::string& path);

// Identity of a model: hex SHA-256 over the file's bytes [0, infos_end)
// (header, metadata, tensor infos) followed by the file size as a
// little-endian u64. Any metadata or tensor layout change alters it; the weights
// are not read, so it costs one small read even for a 100 GB model.
Result<std::string> gguf_fingerprint(const ReadableFile& file, const GgufHeader& header);
Result<std::string> gguf_fingerprint(Io& io, const std::string& path);

}  // namespace kvsnap
