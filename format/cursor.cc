#include "format/cursor.h"

#include <algorithm>
#include <cstring>

#include "base/byte_order.h"

namespace kvsnap {
namespace {
// Small on purpose: after skipping tensor rows only a header is read, and
// cell metadata is read sequentially, so a page is all a fill needs.
constexpr uint64_t kWindowBytes = 4 * 1024;
}

Cursor::Cursor(const ReadableFile& file, uint64_t begin, uint64_t end)
    : file_(file), begin_(begin), pos_(begin), end_(std::min(end, file.size())) {
  if (pos_ > end_) pos_ = end_;
}

Status Cursor::corrupt(uint64_t at, const std::string& message) const {
  return Status::Corruption(file_.name() + ": offset " + std::to_string(at) + ": " + message);
}

Status Cursor::need(uint64_t n, const char* what) const {
  if (n > remaining()) {
    return corrupt("truncated: " + std::string(what) + " needs " + std::to_string(n) + " bytes, " +
                   std::to_string(remaining()) + " remain");
  }
  return Status::OK();
}

Status Cursor::fill(uint64_t n) {
  // Ensure [pos_, pos_ + n) is inside the window; n <= kWindowBytes.
  if (pos_ >= win_off_ && pos_ + n <= win_off_ + win_len_) return Status::OK();
  uint64_t len = std::min<uint64_t>(std::max<uint64_t>(n, kWindowBytes), end_ - pos_);
  if (pos_ < fence_) len = std::min<uint64_t>(len, std::max<uint64_t>(n, fence_ - pos_));
  // One buffer of the window's size for the cursor's life: a refill of another length neither
  // zero-fills nor frees (a parse refills after every skipped tensor, and a truncated file's parse
  // is all refills: 35% of a truncation sweep's time under the sanitizers was vector::resize).
  if (!window_) window_.reset(new std::byte[kWindowBytes]);  // not value-initialized: no zero-fill
  win_off_ = pos_;
  win_len_ = 0;
  KV_RETURN_IF_ERROR(file_.read_at(pos_, std::span<std::byte>(window_.get(), len)));
  win_len_ = len;
  return Status::OK();
}

Status Cursor::read(void* dst, uint64_t n, const char* what) {
  KV_RETURN_IF_ERROR(need(n, what));
  if (n <= kWindowBytes) {
    KV_RETURN_IF_ERROR(fill(n));
    if (n) std::memcpy(dst, window_.get() + (pos_ - win_off_), n);
  } else {
    KV_RETURN_IF_ERROR(file_.read_at(pos_, std::span<std::byte>(static_cast<std::byte*>(dst), n)));
  }
  pos_ += n;
  return Status::OK();
}

Result<uint32_t> Cursor::u32(const char* what) {
  uint8_t b[4];
  KV_RETURN_IF_ERROR(read(b, 4, what));
  return load_le<uint32_t>(b);
}

Result<int32_t> Cursor::i32(const char* what) {
  KV_ASSIGN_OR_RETURN(uint32_t v, u32(what));
  return static_cast<int32_t>(v);
}

Result<uint64_t> Cursor::u64(const char* what) {
  KV_ASSIGN_OR_RETURN(uint32_t lo, u32(what));
  KV_ASSIGN_OR_RETURN(uint32_t hi, u32(what));
  return uint64_t(lo) | uint64_t(hi) << 32;
}

Status Cursor::skip(uint64_t count, uint64_t size, const char* what) {
  if (size != 0 && count > remaining() / size) {
    return corrupt("truncated: " + std::string(what) + " needs " + std::to_string(count) + " x " +
                   std::to_string(size) + " bytes, " + std::to_string(remaining()) + " remain");
  }
  pos_ += count * size;
  return Status::OK();
}

Status Cursor::seek(uint64_t offset) {
  if (offset < begin_ || offset > end_) return corrupt(offset, "seek outside the readable range");
  pos_ = offset;
  return Status::OK();
}

void put_u32(std::vector<std::byte>& out, uint32_t v) { append_le(out, v); }
void put_i32(std::vector<std::byte>& out, int32_t v) { append_le(out, v); }
void put_u64(std::vector<std::byte>& out, uint64_t v) { append_le(out, v); }
Status write_u32(ByteSink& sink, uint32_t v) {
  std::vector<std::byte> b;
  put_u32(b, v);
  return sink.append(b);
}
Status write_i32(ByteSink& sink, int32_t v) { return write_u32(sink, static_cast<uint32_t>(v)); }
Status write_u64(ByteSink& sink, uint64_t v) {
  std::vector<std::byte> b;
  put_u64(b, v);
  return sink.append(b);
}

}  // namespace kvsnap
