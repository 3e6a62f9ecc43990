// The scalar row codecs behind migrate/type_traits.h, one pair per KV cache type, each a
// transcription of ggml's reference (llama.cpp v0.5.0, ggml/src/ggml-quants.c and
// ggml.c). Internal: callers go through the TypeTraits table, which picks these or a SIMD
// kernel giving the same bytes. `n` is a value count, a whole number of blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"

namespace kvsnap::quants {

// Block sizes: the rows of format/ggml_types.h (ggml-common.h's QK4_0 ... and block structs).
inline constexpr size_t kQK = ggml_layout(GgmlType::kQ8_0).block_elems;
inline constexpr size_t kQ4_0Bytes = ggml_layout(GgmlType::kQ4_0).block_bytes;
inline constexpr size_t kQ4_1Bytes = ggml_layout(GgmlType::kQ4_1).block_bytes;
inline constexpr size_t kQ5_0Bytes = ggml_layout(GgmlType::kQ5_0).block_bytes;
inline constexpr size_t kQ5_1Bytes = ggml_layout(GgmlType::kQ5_1).block_bytes;
inline constexpr size_t kQ8_0Bytes = ggml_layout(GgmlType::kQ8_0).block_bytes;
inline constexpr size_t kIQ4_NLBytes = ggml_layout(GgmlType::kIQ4_NL).block_bytes;
static_assert(kQK == 32 && ggml_layout(GgmlType::kQ4_0).block_elems == kQK && ggml_layout(GgmlType::kQ4_1).block_elems == kQK &&
                  ggml_layout(GgmlType::kQ5_0).block_elems == kQK && ggml_layout(GgmlType::kQ5_1).block_elems == kQK &&
                  ggml_layout(GgmlType::kIQ4_NL).block_elems == kQK,
              "the kernels here take every quantized KV type in blocks of 32 values");

// kvalues_iq4nl (ggml-common.h)
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// The scalar kernels: literal transcriptions of ggml's reference code. They define the bytes;
// every SIMD kernel (migrate/simd_kernels.h) must agree with them exactly. migrate/type_traits.cc
// puts them in the scalar column of the codec table.
namespace ref {

void f32_to_f32(const std::byte* src, float* dst, size_t n);    // memcpy
void f32_from_f32(const float* src, std::byte* dst, size_t n);  // memcpy
void f16_to_f32(const std::byte* src, float* dst, size_t n);    // ggml_fp16_to_fp32_row
void f16_from_f32(const float* src, std::byte* dst, size_t n);  // ggml_fp32_to_fp16_row
void bf16_to_f32(const std::byte* src, float* dst, size_t n);   // ggml_bf16_to_fp32_row
void bf16_from_f32(const float* src, std::byte* dst, size_t n); // ggml_fp32_to_bf16_row_ref

void q4_0_to_f32(const std::byte* src, float* dst, size_t n);  // dequantize_row_*
void q4_0_from_f32(const float* src, std::byte* dst, size_t n);  // quantize_row_*_ref
void q4_1_to_f32(const std::byte* src, float* dst, size_t n);
void q4_1_from_f32(const float* src, std::byte* dst, size_t n);
void q5_0_to_f32(const std::byte* src, float* dst, size_t n);
void q5_0_from_f32(const float* src, std::byte* dst, size_t n);
void q5_1_to_f32(const std::byte* src, float* dst, size_t n);
void q5_1_from_f32(const float* src, std::byte* dst, size_t n);
void q8_0_to_f32(const std::byte* src, float* dst, size_t n);
void q8_0_from_f32(const float* src, std::byte* dst, size_t n);
void iq4_nl_to_f32(const std::byte* src, float* dst, size_t n);
// ggml_quantize_chunk's iq4_nl: quantize_iq4_nl(), i.e. quantize_row_iq4_nl_impl with
// ntry = 7 (a search over 15 scales per block) and no importance weights.
void iq4_nl_from_f32(const float* src, std::byte* dst, size_t n);

// ggml's best_index_int8(16, kvalues_iq4nl, x): the binary search of the reference.
int iq4_nl_best_index(float x);

}  // namespace ref

}  // namespace kvsnap::quants
