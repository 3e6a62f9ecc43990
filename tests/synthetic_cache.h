// A synthetic llama.cpp sequence state (ggsq) whose K/V look like a trained model's (outlier
// channels) or not, stored plain or Hadamard-rotated as llama.cpp with PR #21038 stores them:
// what the rotation detector (migrate/rotation_detect.h) and `kvsnap info` are tested on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "format/llama_state.h"
#include "migrate/conversion_spec.h"
#include "migrate/convert_state.h"
#include "migrate/hadamard.h"
#include "migrate/type_traits.h"

namespace kvsnap::test {

enum class Data { kOutliers, kIid, kLowRankRandom, kZero };  // kZero: every value 0 (compresses ~1000s:1)

struct Spec {
  int32_t k_type = 8;  // q8_0
  int32_t v_type = 8;
  uint32_t head_dim = 128;
  uint32_t n_head_kv = 2;
  uint32_t n_layer = 4;
  uint32_t cells = 200;
  bool rotated = false;  // store as llama.cpp with PR #21038 does
  Data data = Data::kOutliers;
  uint32_t v_trans = 0;  // 1: V stored column-wise (float)
  uint32_t seed = 7;
  uint32_t version = 3;  // the ggsq version written
};

inline void put_u32(std::vector<std::byte>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(std::byte((v >> (8 * i)) & 0xff));
}
inline void put_u64(std::vector<std::byte>& b, uint64_t v) {
  put_u32(b, uint32_t(v));
  put_u32(b, uint32_t(v >> 32));
}

// Rows of one tensor: cells x n values, natural domain.
inline std::vector<float> natural_rows(const Spec& s, uint32_t layer, bool is_v, std::mt19937& rng) {
  const uint32_t n = s.head_dim * s.n_head_kv;
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(size_t(s.cells) * n);
  if (s.data == Data::kZero) return x;
  if (s.data == Data::kIid) {
    for (auto& v : x) v = g(rng);
    return x;
  }
  if (s.data == Data::kLowRankRandom) {
    // Like a random-weight model: x = W h, h drawn from a few "token" vectors.
    const uint32_t dim = 64, vocab = 24;
    std::vector<float> W(size_t(n) * dim), H(size_t(vocab) * dim);
    for (auto& v : W) v = g(rng);
    for (auto& v : H) v = g(rng);
    std::uniform_int_distribution<uint32_t> tok(0, vocab - 1);
    for (uint32_t c = 0; c < s.cells; ++c) {
      const float* h = H.data() + size_t(tok(rng)) * dim;
      for (uint32_t i = 0; i < n; ++i) {
        float acc = 0;
        for (uint32_t k = 0; k < dim; ++k) acc += W[size_t(i) * dim + k] * h[k];
        x[size_t(c) * n + i] = acc * 0.1f;
      }
    }
    return x;
  }
  // Outlier channels: per channel a log-normal scale, a few channels per head 8-20x
  // (K) or 4-8x (V), and a per-channel mean, like trained models' K/V projections.
  std::vector<float> scale(n), mean(n);
  std::lognormal_distribution<float> spread(0.0f, 0.5f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (uint32_t i = 0; i < n; ++i) {
    scale[i] = spread(rng);
    mean[i] = 0.2f * g(rng);
  }
  for (uint32_t h = 0; h < s.n_head_kv; ++h) {
    for (int k = 0; k < 3; ++k) {
      const uint32_t ch = h * s.head_dim + uint32_t(u(rng) * float(s.head_dim)) % s.head_dim;
      scale[ch] *= is_v ? 4.0f + 4.0f * u(rng) : 8.0f + 12.0f * u(rng);
      mean[ch] *= 5.0f;
    }
  }
  (void)layer;
  for (uint32_t c = 0; c < s.cells; ++c) {
    for (uint32_t i = 0; i < n; ++i) x[size_t(c) * n + i] = mean[i] + scale[i] * g(rng);
  }
  return x;
}

inline std::vector<std::byte> quantized_rows(const Spec& s, std::vector<float> x, int32_t type, bool is_v) {
  const uint32_t n = s.head_dim * s.n_head_kv;
  const TypeTraits* t = find_traits(type);
  if (s.rotated && t->quantized()) {
    const uint32_t n_rot = rotation_block_size(is_v ? KvSide::kV : KvSide::kK, s.head_dim);
    for (uint32_t c = 0; c < s.cells; ++c) hadamard_rotate(x.data() + size_t(c) * n, n, n_rot);
  }
  const uint64_t row = uint64_t(n) / t->block_elems() * t->block_bytes();
  std::vector<std::byte> out(row * s.cells);
  for (uint32_t c = 0; c < s.cells; ++c) t->from_f32(x.data() + size_t(c) * n, out.data() + c * row, n);
  return out;
}

// A ggsq slot file of `s.version` (3: v0.5.0; 2: b6122..b10375, whose files do not say whether
// their build rotated), one stream, no cell ext.
inline std::vector<std::byte> build(const Spec& s) {
  std::mt19937 rng(s.seed);
  const uint32_t n = s.head_dim * s.n_head_kv;
  std::vector<std::byte> b;
  put_u32(b, kMagicGgsq);
  put_u32(b, s.version);
  put_u32(b, s.cells);
  for (uint32_t c = 0; c < s.cells; ++c) put_u32(b, 10 + c % 50);
  put_u32(b, 1);  // n_stream
  put_u32(b, s.cells);
  for (uint32_t c = 0; c < s.cells; ++c) {
    put_u32(b, c);  // pos
    put_u32(b, 1);  // n_seq_id
    put_u32(b, 0);  // seq 0
  }
  put_u32(b, s.v_trans);
  put_u32(b, s.n_layer);
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const TypeTraits* t = find_traits(s.k_type);
    put_u32(b, uint32_t(s.k_type));
    put_u64(b, uint64_t(n) / t->block_elems() * t->block_bytes());
    auto rows = quantized_rows(s, natural_rows(s, il, false, rng), s.k_type, false);
    b.insert(b.end(), rows.begin(), rows.end());
  }
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const TypeTraits* t = find_traits(s.v_type);
    put_u32(b, uint32_t(s.v_type));
    if (!s.v_trans) {
      put_u64(b, uint64_t(n) / t->block_elems() * t->block_bytes());
      auto rows = quantized_rows(s, natural_rows(s, il, true, rng), s.v_type, true);
      b.insert(b.end(), rows.begin(), rows.end());
    } else {
      put_u32(b, t->block_bytes());
      put_u32(b, n);
      std::vector<float> x = natural_rows(s, il, true, rng);
      std::vector<std::byte> col(size_t(s.cells) * t->block_bytes());
      for (uint32_t i = 0; i < n; ++i) {
        std::vector<float> v(s.cells);
        for (uint32_t c = 0; c < s.cells; ++c) v[c] = x[size_t(c) * n + i];
        t->from_f32(v.data(), col.data(), s.cells);
        b.insert(b.end(), col.begin(), col.end());
      }
    }
  }
  return b;
}

// `build(s)` in memory, parsed with its shape (one KV section of s.n_layer layers, no cell ext).
struct Parsed {
  std::unique_ptr<MemoryFile> file;
  StateFile state;
};

inline Result<Parsed> parse_built(const Spec& s, const std::string& name = "synthetic.slot") {
  Parsed out;
  out.file = std::make_unique<MemoryFile>(name, build(s));
  MemoryShape shape;
  shape.ext_bytes = 0;
  shape.kv_sections_known = shape.recurrent_known = true;
  KvSectionShape ks;
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    ks.n_embd_k_gqa.push_back(s.head_dim * s.n_head_kv);
    ks.n_embd_v_gqa.push_back(s.head_dim * s.n_head_kv);
  }
  shape.kv_sections.push_back(ks);
  ParseOptions po;
  po.shape = &shape;
  KV_ASSIGN_OR_RETURN(out.state, parse_state(*out.file, po));
  return out;
}

// One layer of 4,608 cells of f16 K and V, 8 heads x 128 (2 KiB rows, 18 chunks of a store's 256
// cells each): long enough that a conversion's blocks hold several chunks (conversion_block_rows).
inline Spec long_f16() {
  Spec s;
  s.k_type = s.v_type = 1;  // f16
  s.head_dim = 128;
  s.n_head_kv = 8;
  s.n_layer = 1;
  s.cells = 4608;
  s.data = Data::kIid;
  return s;
}

// `state`, read from `file`, converted as `spec` asks (make_request without a model, then
// convert_state): the output's bytes.
inline Result<std::vector<std::byte>> converted(const StateFile& state, const ReadableFile& file,
                                               const ConversionSpec& spec) {
  KV_ASSIGN_OR_RETURN(ConvertRequest req, make_request(spec, state, nullptr, file.name()));
  VectorSink out;
  KV_RETURN_IF_ERROR(convert_state(state, file, req, out).status());
  return std::move(out.bytes);
}

}  // namespace kvsnap::test
