#include "migrate/convert_row.h"

#include <cstring>
#include <string>

#include "migrate/simd_kernels.h"

namespace kvsnap {
namespace {

bool same_codec(const TypeTraits& a, const TypeTraits& b) { return a.id() == b.id(); }

// The fused one-pass kernel for this conversion (same bytes), or nullptr.
simd::FusedRowFn fused_for(const TypeTraits& src, const TypeTraits& dst, const RotationPlan& rot) {
  return simd::find_fused(src.id(), dst.id(), rot.step != RotationStep::kNone, rot.n_rot);
}

// The one generic path: to_f32, rotation step, from_f32 (each a SIMD kernel where the CPU
// has one; base/simd_level.h).
void convert_one(const TypeTraits& src, const TypeTraits& dst, const RotationPlan& rot, const std::byte* in,
                 std::byte* out, float* scratch, size_t n) {
  src.to_f32(in, scratch, n);
  apply_rotation(rot, scratch, n);
  dst.from_f32(scratch, out, n);
}

Status check_shape(const TypeTraits& src, const TypeTraits& dst, const RotationPlan& rot, uint64_t n) {
  if (n % src.block_elems() != 0 || n % dst.block_elems() != 0) {
    return Status::InvalidArgument(std::to_string(n) + " values are not whole blocks of " + std::string(src.name()) +
                                   " and " + std::string(dst.name()));
  }
  if (rot.step != RotationStep::kNone) {
    if (rot.n_rot < 2 || (rot.n_rot & (rot.n_rot - 1)) != 0) {
      return Status::InvalidArgument("rotation block " + std::to_string(rot.n_rot) + " is not a power of two");
    }
    if (n % rot.n_rot != 0) {
      return Status::InvalidArgument("a row of " + std::to_string(n) + " values is not whole rotation blocks of " +
                                     std::to_string(rot.n_rot));
    }
  }
  return Status::OK();
}

}  // namespace

Status convert_row(const TypeTraits& src, const TypeTraits& dst, const RotationPlan& rot,
                   std::span<const std::byte> in, std::span<std::byte> out, std::span<float> scratch) {
  const auto n = row_elems(*src.layout, in.size());
  if (!n) {
    return Status::InvalidArgument(std::to_string(in.size()) + " bytes are not whole " + std::string(src.name()) +
                                   " blocks");
  }
  KV_RETURN_IF_ERROR(check_shape(src, dst, rot, *n));
  const uint64_t want = *n / dst.block_elems() * dst.block_bytes();
  if (out.size() != want) {
    return Status::InvalidArgument("output row has " + std::to_string(out.size()) + " bytes, " + std::string(dst.name()) +
                                   " needs " + std::to_string(want));
  }
  if (same_codec(src, dst) && rot.step == RotationStep::kNone) {
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
    return Status::OK();
  }
  if (auto fused = fused_for(src, dst, rot)) {
    fused(in.data(), out.data(), *n, rot.n_rot);
    return Status::OK();
  }
  if (scratch.size() < *n) {
    return Status::InvalidArgument("scratch of " + std::to_string(scratch.size()) + " floats for a row of " +
                                   std::to_string(*n));
  }
  convert_one(src, dst, rot, in.data(), out.data(), scratch.data(), *n);
  return Status::OK();
}

Result<RowConverter> RowConverter::make(const TypeTraits& src, const TypeTraits& dst, uint64_t n_elems,
                                        const RotationPlan& rot) {
  if (n_elems == 0) return Status::InvalidArgument("a row of 0 values");
  KV_RETURN_IF_ERROR(check_shape(src, dst, rot, n_elems));
  RowConverter c;
  c.src_ = &src;
  c.dst_ = &dst;
  c.rot_ = rot;
  c.n_elems_ = n_elems;
  c.src_row_bytes_ = n_elems / src.block_elems() * src.block_bytes();
  c.dst_row_bytes_ = n_elems / dst.block_elems() * dst.block_bytes();
  c.copy_ = same_codec(src, dst) && rot.step == RotationStep::kNone;
  if (!c.copy_) c.scratch_.resize(n_elems);
  return c;
}

Status RowConverter::convert(std::span<const std::byte> in, std::span<std::byte> out) {
  if (in.size() % src_row_bytes_ != 0) {
    return Status::InvalidArgument(std::to_string(in.size()) + " bytes are not whole " + std::string(src_->name()) +
                                   " rows of " + std::to_string(src_row_bytes_));
  }
  const uint64_t rows = in.size() / src_row_bytes_;
  if (out.size() != rows * dst_row_bytes_) {
    return Status::InvalidArgument("output has " + std::to_string(out.size()) + " bytes for " + std::to_string(rows) +
                                   " rows of " + std::to_string(dst_row_bytes_));
  }
  if (copy_) {
    if (!in.empty()) std::memcpy(out.data(), in.data(), in.size());
    return Status::OK();
  }
  if (auto fused = fused_for(*src_, *dst_, rot_)) {  // rows are contiguous: one call for all of them
    if (rows) fused(in.data(), out.data(), rows * n_elems_, rot_.n_rot);
    return Status::OK();
  }
  for (uint64_t r = 0; r < rows; r++) {
    convert_one(*src_, *dst_, rot_, in.data() + r * src_row_bytes_, out.data() + r * dst_row_bytes_, scratch_.data(),
                n_elems_);
  }
  return Status::OK();
}

}  // namespace kvsnap
