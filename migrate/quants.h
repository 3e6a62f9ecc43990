// The row codecs behind migrate/type_traits.h, one pair per KV cache type, each a
// transcription of ggml's reference (llama.cpp v0.5.0, ggml/src/ggml-quants.c and
// ggml.c). Internal: callers go through the TypeTraits table. `n` is a value count,
// a whole number of blocks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsnap::quants {

// Block sizes (ggml-common.h). format/ggml_types.cc pins the same numbers.
inline constexpr size_t kQK = 32;
inline constexpr size_t kQ4_0Bytes = 18, kQ4_1Bytes = 20, kQ5_0Bytes = 22, kQ5_1Bytes = 24;
inline constexpr size_t kQ8_0Bytes = 34, kIQ4_NLBytes = 18;

// kvalues_iq4nl (ggml-common.h)
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

void f32_to_f32(const std::byte* src, float* dst, size_t n);
void f32_from_f32(const float* src, std::byte* dst, size_t n);
void f16_to_f32(const std::byte* src, float* dst, size_t n);
void f16_from_f32(const float* src, std::byte* dst, size_t n);
void bf16_to_f32(const std::byte* src, float* dst, size_t n);
void bf16_from_f32(const float* src, std::byte* dst, size_t n);

void q4_0_to_f32(const std::byte* src, float* dst, size_t n);
void q4_0_from_f32(const float* src, std::byte* dst, size_t n);
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

}  // namespace kvsnap::quants
