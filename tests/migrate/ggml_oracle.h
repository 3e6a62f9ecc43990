// Calls into the real ggml of llama.cpp v0.5.0 (the prebuilt libraries of node-llama-cpp
// 3.22.1 under $KVSNAP_ORACLE_DIR/3.22.1/lib) for the oracle test and the golden
// generator. Nothing in kvsnap itself links ggml.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvsnap::testing {

class GgmlOracle {
 public:
  // Loads the CPU backend (the best libggml-cpu-*.so variant for this machine) from libdir.
  // nullptr and *err set when that fails.
  static std::unique_ptr<GgmlOracle> open(const std::string& libdir, std::string* err);
  ~GgmlOracle();

  // ggml_quantize_chunk(type, x, dst, 0, rows, n, NULL): rows x n floats.
  std::vector<std::byte> quantize(int type, const float* x, size_t rows, size_t n) const;
  // ggml_get_type_traits(type)->to_float over n_values (f32: memcpy, ggml has no to_float).
  std::vector<float> to_float(int type, const std::byte* src, size_t n_values) const;
  // ggml_get_type_traits(type)->from_float_ref over n_values.
  std::vector<std::byte> from_float_ref(int type, const float* x, size_t n_values) const;

  // What llama.cpp's graph does to K/V before storing a quantized cache:
  // ggml_mul_mat(H, x) with GGML_HINT_SRC0_IS_HADAMARD on the CPU backend (x cut into
  // columns of n_rot values). use_ref: ggml_backend_cpu_set_use_ref(true), i.e. the plain
  // f32 matmul with the matrix instead of the fast transform.
  std::vector<float> hadamard(const float* x, size_t n_values, uint32_t n_rot, bool use_ref) const;

  // The CPU backend's store into a cache of `type` (ggml_set_rows, i.e. type_traits_cpu
  // from_float, SIMD where the backend has it): rows x n floats.
  std::vector<std::byte> set_rows(int type, const float* x, size_t rows, size_t n) const;

  // "CPU: AVX512 AVX2 ..." (the variant's features), for the test log.
  std::string describe() const;

 private:
  GgmlOracle() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvsnap::testing
