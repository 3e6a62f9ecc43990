// What a llama.cpp state file's layout depends on, read from the model's GGUF
// metadata the way llama.cpp v0.5.0 reads it (llama_model_base::load_hparams,
// the per-arch load_arch_hparams in src/models/, llama_model::create_memory,
// llama_kv_cache / _iswa / llama_memory_hybrid / _recurrent). A state file
// names none of this: per-layer K/V widths, which layers have a KV cache, SWA
// layers (a second KV section), recurrent layers (a recurrent section) and the
// cell "ext" record all come from here. See docs/model-profile.md.
//
// Archs whose memory layout is modelled from their load_arch_hparams give
// inferred == false. Any other arch falls back to the generic keys
// (<arch>.block_count, .attention.head_count[_kv], .attention.key_length, ...)
// with inferred == true and a note saying what was assumed.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/gguf.h"

namespace kvsnap {

// llama_rope_type. kMrope/kImrope use 4 positions per embedding and so a cell ext.
enum class RopeKind { kUnknown, kNone, kNorm, kNeox, kMrope, kImrope };
const char* rope_kind_name(RopeKind k);

// llama_swa_type.
enum class SwaKind { kNone, kStandard, kChunked, kSymmetric };
const char* swa_kind_name(SwaKind k);

// Which llama_memory_i implementation llama.cpp v0.5.0 creates for the model,
// which fixes the order of sections in the state.
enum class MemoryKind {
  kNone,        // no memory (embedding / diffusion models): no KV state at all
  kKv,          // llama_kv_cache: one KV section
  kKvIswa,      // llama_kv_cache_iswa: KV section of the non-SWA layers, then of the SWA layers
  kRecurrent,   // llama_memory_recurrent: one recurrent section
  kHybrid,      // llama_memory_hybrid: KV section (attention layers), then recurrent section
  kHybridIswa,  // llama_memory_hybrid_iswa: KV base, KV SWA, then recurrent
  kSpecial,     // a cache kvsnap does not model (DSA/MSA indexer caches, DeepSeek-V4, shared caches)
};
const char* memory_kind_name(MemoryKind k);

struct LayerProfile {
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim_k = 0;     // n_embd_head_k(il): key_length(_swa), else n_embd / n_head
  uint32_t head_dim_v = 0;
  uint32_t n_embd_k_gqa = 0;   // values per K row of a cell: n_head_kv * head_dim_k
  uint32_t n_embd_v_gqa = 0;
  bool is_swa = false;
  bool is_recurrent = false;   // recurrent (SSM / RWKV / conv) layer: state, no KV
  bool has_kv = false;         // has rows in a KV section of the main context
  bool has_v = false;          // writes V rows (false for MLA, where V is derived from K)
  bool in_recurrent = false;   // has rows in the recurrent section
};

struct ModelProfile {
  std::string arch;            // general.architecture
  std::string name;            // general.name ("" if absent)
  std::string fingerprint;     // gguf_fingerprint(); set by load_model_profile
  uint32_t n_layer = 0;        // block_count (n_layer_all, MTP/NextN layers included)
  uint32_t n_layer_nextn = 0;  // trailing MTP layers, not in the main context's memory
  uint32_t n_embd = 0;
  uint32_t n_head = 0;         // layer 0
  uint32_t n_head_kv = 0;      // layer 0
  uint32_t n_vocab = 0;        // tokenizer.ggml.tokens length (else <arch>.vocab_size)
  uint32_t n_ctx_train = 0;
  std::vector<LayerProfile> layers;  // n_layer entries

  RopeKind rope = RopeKind::kUnknown;
  uint32_t n_rot = 0;
  // Tensors rope_factors_long/rope_factors_short (LongRoPE, Phi-3 128k and later): llama.cpp ropes
  // with the short factors while a sequence's context is within the original one, the long beyond.
  bool rope_long_short_factors = false;
  std::array<int32_t, 4> rope_sections{};  // M-RoPE sections
  // llama_kv_cache::has_cell_ext(): n_pos_per_embd() > 1 || ple_n_heads > 0.
  bool has_cell_ext = false;
  // Bytes of that ext per cell in a v0.5.0 state: llama_kv_cell_ext {x, y, tok} = 12.
  // (b8121 and older write none.)
  uint32_t cell_ext_bytes = 0;

  SwaKind swa = SwaKind::kNone;
  uint32_t n_swa = 0;
  bool is_mla = false;         // K only (key_length_mla / value_length_mla)
  MemoryKind memory = MemoryKind::kKv;

  // Recurrent state row widths (llama_hparams::n_embd_r / n_embd_s), f32 values.
  uint32_t n_embd_r = 0;
  uint32_t n_embd_s = 0;

  bool inferred = false;       // arch not modelled: generic keys assumed
  std::vector<std::string> notes;  // what was assumed, and other caveats

  bool is_iswa() const { return memory == MemoryKind::kKvIswa || memory == MemoryKind::kHybridIswa; }
  bool is_hybrid() const { return memory == MemoryKind::kHybrid || memory == MemoryKind::kHybridIswa; }
  bool is_recurrent_only() const { return memory == MemoryKind::kRecurrent; }
  // head_dim_k (head_dim_v) when every KV layer has the same one: the condition
  // for llama.cpp's Hadamard rotation of quantized K (V) caches.
  std::optional<uint32_t> uniform_head_dim_k() const;
  std::optional<uint32_t> uniform_head_dim_v() const;
};

// One layer of a section, in the order the section writes it.
struct SectionLayer {
  uint32_t il = 0;             // model layer index
  uint32_t n_embd_k_gqa = 0;   // KV: values per K row
  uint32_t n_embd_v_gqa = 0;   // KV: values per V row (transposed V: rows of the V column block)
  uint32_t head_dim_k = 0;
  uint32_t head_dim_v = 0;
  bool has_v = true;           // KV: false means no V record for this layer
  uint32_t n_embd_r = 0;       // recurrent: values per r row
  uint32_t n_embd_s = 0;       // recurrent: values per s row
};

enum class SectionKind { kKv, kRecurrent };

// One section of the memory part of a state, in write order.
struct MemorySectionLayout {
  SectionKind kind = SectionKind::kKv;
  std::string name;            // "kv", "kv_base", "kv_swa", "recurrent"
  bool swa = false;            // the SWA cache of an iSWA pair
  // The u32 n_layer the section writes: the KV layer count, or for a
  // recurrent section hparams.n_layer() (every non-MTP layer, though only
  // `layers` carry rows).
  uint32_t n_layer_field = 0;
  uint32_t cell_ext_bytes = 0; // KV: ext bytes after pos and n_seq_id of each cell
  // Omitted when the state was saved with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
  // (iSWA base section, hybrid attention section).
  bool omitted_if_partial = false;
  std::vector<SectionLayer> layers;
};

// The sections of ModelProfile::memory, in the order llama.cpp writes them:
//   kKv: kv | kKvIswa: kv_base, kv_swa | kRecurrent: recurrent |
//   kHybrid: kv, recurrent | kHybridIswa: kv_base, kv_swa, recurrent |
//   kNone: none | kSpecial: kNotSupported.
Result<std::vector<MemorySectionLayout>> memory_sections(const ModelProfile& p);

// Builds the profile from parsed metadata. kCorruption/kMismatch when a key
// llama.cpp requires is missing or malformed (named with the file).
Result<ModelProfile> profile_from_gguf(const GgufHeader& h);

// read_gguf + profile_from_gguf + fingerprint.
Result<ModelProfile> load_model_profile(Io& io, const std::string& path);

// Multi-line human summary (for `kvsnap info --model`).
std::string describe(const ModelProfile& p);

}  // namespace kvsnap
