// A bounds-checked little-endian reader over a ReadableFile.
//
// Every read checks the bytes remaining before it touches anything, so a count
// read from a hostile file can never size an allocation or a copy on its own.
// Errors name the file and the offset where the problem starts. Reads go
// through a small window buffer, so parsing a multi-GiB state file touches only
// its headers and cell metadata; tensor rows are skipped by offset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"

namespace kvsnap {

class Cursor {
 public:
  // Reads [begin, end) of `file`.
  Cursor(const ReadableFile& file, uint64_t begin, uint64_t end);
  explicit Cursor(const ReadableFile& file) : Cursor(file, 0, file.size()) {}
  Cursor(Cursor&&) = delete;  // a moved-from one would keep win_len_ without its buffer

  uint64_t offset() const { return pos_; }
  uint64_t end() const { return end_; }
  uint64_t remaining() const { return end_ - pos_; }
  bool at_end() const { return pos_ == end_; }
  const ReadableFile& file() const { return file_; }

  Result<uint32_t> u32(const char* what);
  Result<int32_t> i32(const char* what);
  Result<uint64_t> u64(const char* what);
  // Copies n bytes out; n is checked against remaining() first.
  Status read(void* dst, uint64_t n, const char* what);
  // Skips `count` records of `size` bytes, overflow-safe.
  Status skip(uint64_t count, uint64_t size, const char* what);
  // Moves to an absolute offset within [begin, end].
  Status seek(uint64_t offset);
  // The next `n` bytes are a header followed by bulk data (tensor rows) that
  // will be skipped: reads stop at the header's end instead of filling a whole
  // window with the data. Read from a store's snapshot, a window reaching into a
  // tensor decodes and hash-checks its first chunk only for it to be skipped.
  void header_before_bulk(uint64_t n) { fence_ = pos_ + n; }

  // "<file>: offset <off>: <message>" as a kCorruption status.
  Status corrupt(uint64_t at, const std::string& message) const;
  Status corrupt(const std::string& message) const { return corrupt(pos_, message); }

 private:
  Status need(uint64_t n, const char* what) const;
  Status fill(uint64_t n);

  const ReadableFile& file_;
  uint64_t begin_;
  uint64_t pos_;
  uint64_t end_;
  // window_ holds file bytes [win_off_, win_off_ + win_len_) (allocated at the first fill).
  std::unique_ptr<std::byte[]> window_;
  uint64_t win_off_ = 0;
  uint64_t win_len_ = 0;
  uint64_t fence_ = 0;  // header_before_bulk: no fill reads past it while pos_ < fence_
};

// Little-endian encoding helpers for writers.
void put_u32(std::vector<std::byte>& out, uint32_t v);
void put_i32(std::vector<std::byte>& out, int32_t v);
void put_u64(std::vector<std::byte>& out, uint64_t v);
Status write_u32(ByteSink& sink, uint32_t v);
Status write_i32(ByteSink& sink, int32_t v);
Status write_u64(ByteSink& sink, uint64_t v);

}  // namespace kvsnap
