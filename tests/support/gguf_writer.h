// Writes GGUF v3 files: key/value pairs of every type (arrays of arrays too)
// and tensors, through a ByteSink. The layout is what ggml's gguf_write_to_buf
// produces, so read_gguf() and llama.cpp read it back: header, pairs in the
// order they were first set, tensor infos, zero padding to the alignment, then
// each tensor's data padded to the alignment.
//
// The alignment is `general.alignment` when that key is set (it must be a u32
// power of two), else 32.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/gguf.h"

namespace kvsnap {

// IEEE half precision, round to nearest even (ggml's GGML_FP32_TO_FP16).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

class GgufWriter {
 public:
  GgufWriter() = default;

  // Sets `key` (replacing an earlier value in place, so the order of first
  // appearance is kept).
  void set(const std::string& key, GgufValue value);
  void set_u8(const std::string& key, uint8_t v) { set(key, GgufValue::u8(v)); }
  void set_i8(const std::string& key, int8_t v) { set(key, GgufValue::i8(v)); }
  void set_u16(const std::string& key, uint16_t v) { set(key, GgufValue::u16(v)); }
  void set_i16(const std::string& key, int16_t v) { set(key, GgufValue::i16(v)); }
  void set_u32(const std::string& key, uint32_t v) { set(key, GgufValue::u32(v)); }
  void set_i32(const std::string& key, int32_t v) { set(key, GgufValue::i32(v)); }
  void set_u64(const std::string& key, uint64_t v) { set(key, GgufValue::u64(v)); }
  void set_i64(const std::string& key, int64_t v) { set(key, GgufValue::i64(v)); }
  void set_f32(const std::string& key, float v) { set(key, GgufValue::f32(v)); }
  void set_f64(const std::string& key, double v) { set(key, GgufValue::f64(v)); }
  void set_bool(const std::string& key, bool v) { set(key, GgufValue::boolean(v)); }
  void set_string(const std::string& key, std::string v) { set(key, GgufValue::string(std::move(v))); }
  void set_array(const std::string& key, GgufArray a) { set(key, GgufValue::array(std::move(a))); }
  void set_u32_array(const std::string& key, const std::vector<uint32_t>& v) { set_array(key, gguf_array_u32(v)); }
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v) { set_array(key, gguf_array_i32(v)); }
  void set_f32_array(const std::string& key, const std::vector<float>& v) { set_array(key, gguf_array_f32(v)); }
  void set_bool_array(const std::string& key, const std::vector<bool>& v) { set_array(key, gguf_array_bool(v)); }
  void set_string_array(const std::string& key, std::vector<std::string> v) {
    set_array(key, gguf_array_string(std::move(v)));
  }
  void remove(const std::string& key);
  bool has(const std::string& key) const;

  // Adds a tensor; `ne` lists 1..4 dimensions, innermost first (ggml order).
  // `data` must hold exactly the tensor's bytes for `type`.
  Status add_tensor(const std::string& name, std::vector<int64_t> ne, int32_t type, std::vector<std::byte> data);
  Status add_tensor_f32(const std::string& name, std::vector<int64_t> ne, std::span<const float> values);
  // Stores `values` converted to f16.
  Status add_tensor_f16(const std::string& name, std::vector<int64_t> ne, std::span<const float> values);

  // The alignment write() will use (validated there).
  uint32_t alignment() const;
  size_t n_kv() const { return kvs_.size(); }
  size_t n_tensors() const { return tensors_.size(); }

  Status write(ByteSink& out) const;
  // Writes `path` atomically through `io`.
  Status write_file(Io& io, const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    int32_t type = 0;
    std::vector<std::byte> data;
  };
  std::vector<std::pair<std::string, GgufValue>> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvsnap
