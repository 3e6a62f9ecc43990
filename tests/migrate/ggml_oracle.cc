#include "ggml_oracle.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

namespace kvsnap::testing {

struct GgmlOracle::Impl {
  ggml_backend_t backend = nullptr;
  ggml_backend_reg_t reg = nullptr;
  void (*set_use_ref)(ggml_backend_t, bool) = nullptr;
  ~Impl() {
    if (backend) ggml_backend_free(backend);
  }

  // Builds a graph with `build` over tensors made by `make_inputs`, allocates it on the CPU
  // backend, uploads, computes, downloads the result.
  template <class MakeFn, class UploadFn>
  std::vector<std::byte> run(MakeFn make, UploadFn upload, bool use_ref) const {
    ggml_init_params params = {/*.mem_size =*/16 * ggml_tensor_overhead() + ggml_graph_overhead(),
                               /*.mem_buffer =*/nullptr, /*.no_alloc =*/true};
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* out = make(ctx);
    ggml_cgraph* gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) throw std::runtime_error("ggml_backend_alloc_ctx_tensors failed");
    upload();
    if (set_use_ref) set_use_ref(backend, use_ref);
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) throw std::runtime_error("graph compute failed");
    if (set_use_ref) set_use_ref(backend, false);
    std::vector<std::byte> res(ggml_nbytes(out));
    ggml_backend_tensor_get(out, res.data(), 0, res.size());
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return res;
  }
};

std::unique_ptr<GgmlOracle> GgmlOracle::open(const std::string& libdir, std::string* err) {
  ggml_backend_load_all_from_path(libdir.c_str());
  auto impl = std::make_unique<Impl>();
  impl->backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
  if (!impl->backend) {
    *err = "no CPU backend loaded from " + libdir;
    return nullptr;
  }
  impl->reg = ggml_backend_dev_backend_reg(ggml_backend_get_device(impl->backend));
  impl->set_use_ref = reinterpret_cast<void (*)(ggml_backend_t, bool)>(
      ggml_backend_reg_get_proc_address(impl->reg, "ggml_backend_cpu_set_use_ref"));
  if (auto set_threads = reinterpret_cast<ggml_backend_set_n_threads_t>(
          ggml_backend_reg_get_proc_address(impl->reg, "ggml_backend_set_n_threads"))) {
    set_threads(impl->backend, 2);
  }
  std::unique_ptr<GgmlOracle> o(new GgmlOracle());
  o->impl_ = std::move(impl);
  return o;
}

GgmlOracle::~GgmlOracle() = default;

std::vector<std::byte> GgmlOracle::quantize(int type, const float* x, size_t rows, size_t n) const {
  const auto t = static_cast<ggml_type>(type);
  std::vector<std::byte> out(ggml_row_size(t, static_cast<int64_t>(n)) * rows);
  const size_t got = ggml_quantize_chunk(t, x, out.data(), 0, static_cast<int64_t>(rows), static_cast<int64_t>(n), nullptr);
  if (got != out.size()) throw std::runtime_error("ggml_quantize_chunk size");
  return out;
}

std::vector<float> GgmlOracle::to_float(int type, const std::byte* src, size_t n_values) const {
  std::vector<float> out(n_values);
  if (type == GGML_TYPE_F32) {
    std::memcpy(out.data(), src, n_values * sizeof(float));
    return out;
  }
  ggml_get_type_traits(static_cast<ggml_type>(type))->to_float(src, out.data(), static_cast<int64_t>(n_values));
  return out;
}

std::vector<std::byte> GgmlOracle::from_float_ref(int type, const float* x, size_t n_values) const {
  const auto t = static_cast<ggml_type>(type);
  std::vector<std::byte> out(ggml_row_size(t, static_cast<int64_t>(n_values)));
  ggml_get_type_traits(t)->from_float_ref(x, out.data(), static_cast<int64_t>(n_values));
  return out;
}

std::vector<float> GgmlOracle::hadamard(const float* x, size_t n_values, uint32_t n_rot, bool use_ref) const {
  const std::vector<float> h = [&] {  // ggml_gen_hadamard (src/llama-kv-cache.cpp)
    std::vector<float> d(static_cast<size_t>(n_rot) * n_rot);
    d[0] = 1.0 / sqrtf(static_cast<float>(n_rot));
    for (uint32_t s = 1; s < n_rot; s *= 2)
      for (uint32_t i = 0; i < s; i++)
        for (uint32_t j = 0; j < s; j++) {
          const float val = d[i * n_rot + j];
          d[(i + s) * n_rot + j] = val;
          d[i * n_rot + (j + s)] = val;
          d[(i + s) * n_rot + (j + s)] = -val;
        }
    return d;
  }();
  ggml_tensor *rot = nullptr, *xt = nullptr;
  auto bytes = impl_->run(
      [&](ggml_context* ctx) {
        rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_rot, n_rot);
        xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_rot, static_cast<int64_t>(n_values / n_rot));
        ggml_tensor* res = ggml_mul_mat(ctx, rot, xt);  // llama_mul_mat_hadamard
        ggml_mul_mat_set_hint(res, GGML_HINT_SRC0_IS_HADAMARD);
        return res;
      },
      [&] {
        ggml_backend_tensor_set(rot, h.data(), 0, h.size() * sizeof(float));
        ggml_backend_tensor_set(xt, x, 0, n_values * sizeof(float));
      },
      use_ref);
  std::vector<float> out(n_values);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<std::byte> GgmlOracle::set_rows(int type, const float* x, size_t rows, size_t n) const {
  ggml_tensor *dst = nullptr, *src = nullptr, *idx = nullptr;
  std::vector<int64_t> ids(rows);
  for (size_t i = 0; i < rows; i++) ids[i] = static_cast<int64_t>(i);
  return impl_->run(
      [&](ggml_context* ctx) {
        dst = ggml_new_tensor_2d(ctx, static_cast<ggml_type>(type), static_cast<int64_t>(n), static_cast<int64_t>(rows));
        src = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, static_cast<int64_t>(n), static_cast<int64_t>(rows));
        idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, static_cast<int64_t>(rows));
        return ggml_set_rows(ctx, dst, src, idx);
      },
      [&] {
        ggml_backend_tensor_set(src, x, 0, rows * n * sizeof(float));
        ggml_backend_tensor_set(idx, ids.data(), 0, rows * sizeof(int64_t));
      },
      false);
}

std::string GgmlOracle::describe() const {
  std::string s = ggml_backend_dev_description(ggml_backend_get_device(impl_->backend));
  if (auto get = reinterpret_cast<ggml_backend_get_features_t>(
          ggml_backend_reg_get_proc_address(impl_->reg, "ggml_backend_get_features"))) {
    s += " [";
    for (const ggml_backend_feature* f = get(impl_->reg); f && f->name; f++) {
      s += std::string(f->name) + (std::strcmp(f->value, "1") == 0 ? "" : "=" + std::string(f->value)) + " ";
    }
    s += "]";
  }
  return s;
}

}  // namespace kvsnap::testing
