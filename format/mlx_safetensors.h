// The safetensors container exactly as MLX (mx.save_safetensors) writes it: what mlx-lm prompt
// caches are stored in.
//
// Layout (all little-endian):
//   u64 N, N bytes of JSON header, tensor data.
//   header: {"<name>":{"data_offsets":[b,e],"dtype":"BF16","shape":[...]},...,"__metadata__":{...}}
//   data_offsets are relative to byte 8+N.
//
// Promises:
// - read_safetensors reads the header only (tensor data is read later by range, never whole), and
//   checks everything before anything is trusted: N against the file size and MLX's own limit,
//   the JSON, each dtype (MLX's set), shape (rank, no negative dims, no overflow), that
//   data_offsets cover exactly prod(shape) x itemsize bytes inside the file, that no two ranges
//   overlap, and that __metadata__ holds only strings. Errors are kCorruption (kNotSupported for an
//   unknown dtype) and read "<file>: safetensors header: <problem>"; never a crash.
// - Data ranges may come in any order relative to the sorted names (MLX writes them in its hash
//   map's order); `data_order` keeps the file's order.
// - write_safetensors writes the header the way MLX does (nlohmann::json: keys sorted bytewise,
//   compact, the same escaping) and the tensors in `data_order`, back to back. For a file MLX
//   wrote (`mlx_compact`) the output is the input byte for byte.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/io.h"
#include "base/status.h"

namespace kvsnap {

// MLX's header size limit (mlx/io/safetensors.cpp): larger N is refused by MLX too.
inline constexpr uint64_t kSafetensorsMaxHeader = 100000000;
inline constexpr size_t kSafetensorsMaxRank = 32;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;             // "BF16", "U32", ... as in the file
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;   // data_offsets, relative to data_start()
  uint64_t elements() const;
  uint64_t bytes() const { return end - begin; }
};

struct Safetensors {
  std::string file;              // for messages
  uint64_t file_size = 0;
  uint64_t header_len = 0;       // N
  std::vector<SafetensorsTensor> tensors;               // sorted by name (the header's order)
  std::vector<size_t> data_order;                       // indexes into tensors, by data_offsets
  std::optional<std::vector<std::pair<std::string, std::string>>> metadata;  // nullopt: null/absent
  // The file is what MLX writes: compact header equal to our serialization, data back to back from
  // 0 with no gap and no trailing bytes. Only then is a rewrite byte-identical.
  bool mlx_compact = false;

  uint64_t data_start() const { return 8 + header_len; }
  const SafetensorsTensor* find(std::string_view name) const;
};

// Bytes of one element of a safetensors dtype; 0 for a dtype MLX does not know.
uint64_t safetensors_itemsize(std::string_view dtype);

// Cheap content test (a few bytes, no JSON parse): could `f` be a safetensors file?
bool looks_like_safetensors(const ReadableFile& f);

Result<Safetensors> read_safetensors(const ReadableFile& f);

// The header JSON as MLX writes it for these tensors (offsets laid out back to back in data_order).
std::string safetensors_header_text(const Safetensors& st);

// Writes `st` with the tensor bytes copied by range from `data` (the file st was read from, or
// one with the same layout), in st.data_order.
Status write_safetensors(const Safetensors& st, const ReadableFile& data, ByteSink& out);

// Appends bytes [at, at+n) of `f` to `out`, a piece at a time (bounded memory).
Status copy_bytes(const ReadableFile& f, uint64_t at, uint64_t n, ByteSink& out);

// One tensor's bytes (bounded by the tensor's size; callers check the size first).
Result<std::vector<std::byte>> read_tensor(const Safetensors& st, const ReadableFile& f, const SafetensorsTensor& t);

}  // namespace kvsnap
