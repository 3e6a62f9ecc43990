// Builds llama.cpp state files byte by byte, independently of format/'s
// writer, so tests can make every layout (streams, cell ext, iSWA, recurrent
// tails, v9 outputs, raw buffers) and then break them on purpose.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace kvsnap::testing {

struct SynthLayer {
  int32_t k_type = 1;   // f16
  uint32_t n_embd_k = 128;
  int32_t v_type = 1;
  uint32_t n_embd_v = 128;
  bool has_v = true;
};

struct SynthSpec {
  enum Kind { kSeq, kSession, kRawSeqTagged, kRawSeqBare } kind = kSeq;
  uint32_t version = 3;        // ggsq 3/2, ggsn 10/9/8
  bool stream_prefix = true;
  uint32_t ext_bytes = 0;
  uint32_t n_streams = 1;
  uint32_t cells = 7;          // per stream
  uint32_t n_seq_per_cell = 1;
  uint32_t v_trans = 0;
  std::vector<SynthLayer> layers = {SynthLayer{}, SynthLayer{}};
  int kv_sections = 1;         // 2: iSWA
  bool recurrent = false;      // hybrid tail
  std::vector<int32_t> token_words = {1, 2, 3, 4, 5};
  std::string arch = "llama";
  bool v9_outputs = true;      // v9 sessions: output ids/logits/embeddings (b8121 and older); v8 always
  std::string rng = "5489 1 2 3 624";  // v8 sessions (b3543): the sampler RNG as text
  uint32_t n_outputs = 1;      // v9
  uint64_t logits = 11;        // v9 floats
  uint64_t embd = 0;
  uint32_t seed = 1;
  // f16 K/V as real caches hold them: a random low byte, the high byte (sign, exponent) from
  // a narrow range, so a chunk's high-byte plane compresses and its low one is stored raw.
  bool f16_like = false;
};

inline uint32_t synth_block_elems(int32_t t) { return (t == 0 || t == 1 || t == 30) ? 1 : 32; }
inline uint32_t synth_block_bytes(int32_t t) {
  switch (t) {
    case 0: return 4;
    case 1: case 30: return 2;
    case 2: case 20: return 18;
    case 3: return 20;
    case 6: return 22;
    case 7: return 24;
    case 8: return 34;
  }
  return 0;
}

class ByteBuilder {
 public:
  void u32(uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(std::byte((v >> (8 * i)) & 0xff)); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void u64(uint64_t v) { u32(uint32_t(v)); u32(uint32_t(v >> 32)); }
  void str(const std::string& s) { u32(uint32_t(s.size())); for (char c : s) b.push_back(std::byte(c)); }
  void fill(uint64_t n, std::mt19937& rng) { for (uint64_t i = 0; i < n; ++i) b.push_back(std::byte(rng() & 0xff)); }
  // Tensor data of ggml type t: f16-like values (SynthSpec::f16_like) or random bytes.
  void fill_kv(uint64_t n, int32_t t, bool f16_like, std::mt19937& rng) {
    if (!f16_like || t != 1) return fill(n, rng);
    for (uint64_t i = 0; i < n; ++i) b.push_back(std::byte(i % 2 ? 0x30 + rng() % 12 : rng() & 0xff));
  }
  std::vector<std::byte> b;
};

inline void synth_kv_section(const SynthSpec& s, ByteBuilder& w, std::mt19937& rng) {
  if (s.stream_prefix) w.u32(s.n_streams);
  for (uint32_t st = 0; st < (s.stream_prefix ? s.n_streams : 1); ++st) {
    w.u32(s.cells);
    if (s.cells == 0 && s.stream_prefix) continue;  // before the prefix, an empty stream has its headers
    for (uint32_t c = 0; c < s.cells; ++c) {
      w.i32(int32_t(c));
      w.u32(s.n_seq_per_cell);
      for (uint32_t e = 0; e < s.ext_bytes / 4; ++e) w.i32(int32_t(c * 10 + e));
      for (uint32_t q = 0; q < s.n_seq_per_cell; ++q) w.i32(int32_t(q));
    }
    w.u32(s.v_trans);
    w.u32(uint32_t(s.layers.size()));
    for (const auto& L : s.layers) {
      const uint64_t row = uint64_t(L.n_embd_k) / synth_block_elems(L.k_type) * synth_block_bytes(L.k_type);
      w.i32(L.k_type);
      w.u64(row);
      w.fill_kv(row * s.cells, L.k_type, s.f16_like, rng);
    }
    for (const auto& L : s.layers) {
      if (!L.has_v) continue;
      w.i32(L.v_type);
      if (!s.v_trans) {
        const uint64_t row = uint64_t(L.n_embd_v) / synth_block_elems(L.v_type) * synth_block_bytes(L.v_type);
        w.u64(row);
        w.fill_kv(row * s.cells, L.v_type, s.f16_like, rng);
      } else {
        w.u32(synth_block_bytes(L.v_type));
        w.u32(L.n_embd_v);
        w.fill_kv(uint64_t(L.n_embd_v) * s.cells * synth_block_bytes(L.v_type), L.v_type, s.f16_like, rng);
      }
    }
  }
}

inline void synth_recurrent(ByteBuilder& w, std::mt19937& rng) {
  w.u32(1);            // cell_count
  w.i32(41);           // pos
  w.u32(0);            // n_seq_id (sequence save)
  w.u32(0);            // s_trans
  w.u32(3);            // n_layer (one recurrent layer among three)
  w.i32(0); w.u64(64); w.fill(64, rng);   // r
  w.i32(0); w.u64(96); w.fill(96, rng);   // s
}

inline std::vector<std::byte> build_state(const SynthSpec& s) {
  std::mt19937 rng(s.seed);
  ByteBuilder w;
  switch (s.kind) {
    case SynthSpec::kSeq:
      w.u32(0x67677371); w.u32(s.version);
      w.u32(uint32_t(s.token_words.size()));
      for (int32_t t : s.token_words) w.i32(t);
      break;
    case SynthSpec::kSession:
      w.u32(0x6767736e); w.u32(s.version);
      w.u32(uint32_t(s.token_words.size()));
      for (int32_t t : s.token_words) w.i32(t);
      w.str(s.arch);
      if (s.version == 8) w.str(s.rng);
      if ((s.version == 9 && s.v9_outputs) || s.version == 8) {
        w.u32(s.n_outputs);
        for (uint32_t i = 0; i < s.n_outputs; ++i) w.i32(int32_t(i));
        w.u64(s.logits); w.fill(s.logits * 4, rng);
        w.u64(s.embd); w.fill(s.embd * 4, rng);
      }
      break;
    case SynthSpec::kRawSeqTagged:
      w.u32(0xaf143cd8); w.i32(0);
      break;
    case SynthSpec::kRawSeqBare:
      break;
  }
  for (int i = 0; i < s.kv_sections; ++i) synth_kv_section(s, w, rng);
  if (s.recurrent) synth_recurrent(w, rng);
  return w.b;
}

}  // namespace kvsnap::testing
