// Moving a session between llama.cpp and mlx-lm for a model both engines run (issue 15 part 4):
//
//   llama.cpp slot/session file  ->  mlx-lm prompt cache (KVCache, or QuantizedKVCache at
//                                    --kv-bits/--kv-group-size), in any of mlx-lm's three layouts
//   mlx-lm prompt cache          ->  llama.cpp slot file (ggsq, llama_state_seq_load_file, llama-server
//                                    slots) or session file (ggsn, llama_state_load_file) at any
//                                    -ctk/-ctv, flash attention on or off, rotated or not, for the
//                                    llama.cpp build named
//
// What differs between the two caches, and what is done about it:
//   - K rows in RoPE pair order. llama.cpp's converter permutes the Q/K projection rows of
//     llama-family models so its NORM rope (pairs 2j, 2j+1) matches HF's rotate-half rope (pairs
//     j, j+D/2) that mlx-lm runs; the cached, post-RoPE K therefore holds, per head,
//         llama.cpp k[2j + t]  ==  mlx-lm k[t*D/2 + j]        (j < D/2, t in {0,1})
//     and is mapped back and forth. Which archs move, and which map each takes, is the audited
//     table of migrate/cross_engine_archs.h; an arch not in it is refused (kNotSupported, naming it).
//   - llama.cpp's Hadamard rotation of quantized K/V (migrate/hadamard.h): undone on the way to
//     mlx-lm as `kvsnap convert` undoes it (the writer's rotation decided from the evidence of
//     migrate/source_rotation.h; undecided -> refused, never guessed), applied on the way back by
//     llama.cpp's rule for the target build.
//   - ggml block types are dequantized; a transposed V (flash attention off) is read as rows.
//   - mlx-lm's shapes: [1, n_kv_heads, T, head_dim] per layer, in the layer's float type.
//   - Tokens: mlx-lm stores none. The llama.cpp side's tokens go into the prompt cache's user
//     metadata as "tokens" (a JSON list; mlx-lm ignores it), and the way back takes them from there
//     or from the caller (`--tokens`); their count must be the cache's offset.
//   - Sliding-window attention (iSWA; gemma3, whose K is NEOX-roped and unpermuted in both):
//     llama.cpp keeps the global layers in the state's base KV section and the SWA layers in a
//     second section (a slot file: the last n_swa cells, positions T-n_swa..T-1; a session or
//     --swa-full context: every cell still held); mlx-lm keeps them as KVCache and
//     RotatingKVCache(max_size = sliding_window, keep 0). Both attend, from position p, to the
//     positions p-n_swa+1..p of an SWA layer. Moving, each SWA layer holds the last min(T, n_swa)
//     positions: written to mlx-lm in temporal order with offset T, _idx min(T, n_swa) (the state
//     mlx-lm's own multi-token update leaves, from which it continues alike); read from mlx-lm
//     through the ring's temporal order (mlx_ring_rows), whatever its _idx, one position more
//     (T-n_swa-1) when every ring still holds it, for llama-server's reuse rule. Older positions
//     of an SWA layer are not moved: neither engine attends to them again.
//   - gemma2: llama.cpp windows its SWA layers, mlx-lm's gemma2 does not (every layer a KVCache
//     attending to every position): the two compute the same cache only for T <= n_swa (real
//     models: 4096), where llama.cpp's SWA section holds every position; such sessions move, every
//     mlx-lm layer a KVCache; longer ones are refused, and so is --kv-bits (mlx-lm's gemma2
//     attention takes no QuantizedKVCache).
// Refused (kNotSupported, naming the file and the reason): other iSWA models (named by arch),
// gemma2 sessions past the window, hybrid and recurrent memories, MLA, M-RoPE
// cell extras, more than one sequence or stream, base positions that are not 0..T-1, SWA cells
// that are not the last min(T, n_swa) positions or more, a ring with attention-sink rows (keep)
// or another max_size than the model's window, mlx-lm classes other than KVCache/QuantizedKVCache
// and RotatingKVCache (on SWA layers; elsewhere only before its ring wraps: offset <= max_size and
// _idx == offset, an ordinary prefix); kMismatch when the cache does not fit the model (layer
// count, KV heads, head dims checked against the GGUF).
//
// Both directions go through float32 in memory (the cache at f32: 4 bytes per value, plus the
// output), so memory grows with the session; nothing is written to `out` before every check passed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/llama_state.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/conversion_spec.h"
#include "migrate/cross_engine_archs.h"
#include "migrate/mlx_requant.h"
#include "migrate/model_info.h"

namespace kvsnap {

// How a model's K rows differ between the engines.
struct KOrder {
  bool permuted = false;  // llama.cpp interleaved pairs vs mlx-lm split halves
  std::string why;        // "llama: NORM rope, converter permuted Q/K" for reports
  uint32_t n_swa = 0;     // > 0: iSWA, the SWA layers' window (see above)
  // mlx-lm's model windows its SWA layers too (gemma3: RotatingKVCache). false (gemma2): mlx-lm
  // attends to every position, so the engines' caches are the same function only while T <= n_swa,
  // and sessions move only then, as KVCache in every layer.
  bool mlx_window = true;
};
// kNotSupported for models the move cannot handle (the reasons listed above).
Result<KOrder> cross_engine_k_order(const ModelInfo& model);

// One head row of D values: llama.cpp order -> mlx-lm order (permuted), or the inverse.
void k_row_to_mlx(const float* llama, float* mlx, uint32_t head_dim);
void k_row_to_llama(const float* mlx, float* llama, uint32_t head_dim);

// mlx-lm's RotatingKVCache._temporal_order as buffer row indices, oldest first: the rows of a
// saved buffer of `rows` rows (meta_state keep, offset, _idx) that hold tokens. kCorruption naming
// `where` for a meta_state mlx-lm does not write (_idx past the buffer, more rows than tokens).
Result<std::vector<uint32_t>> mlx_ring_rows(int64_t rows, int64_t keep, int64_t offset, int64_t idx,
                                            const std::string& where);

// The positions an SWA layer holds once moved, after T tokens: the last swa_rows(T, n_swa); to
// llama.cpp up to swa_server_rows(T, n_swa) when the mlx-lm cache still has them (llama-server
// reuses a restored slot only with SWA cells down to T-n_swa-1).
inline uint32_t swa_rows(uint32_t T, uint32_t n_swa) { return T < n_swa ? T : n_swa; }
inline uint32_t swa_server_rows(uint32_t T, uint32_t n_swa) { return T < n_swa + 1 ? T : n_swa + 1; }

struct LlamaToMlxSpec {
  // Rotation claims about the input (--src-rotation, --source-build, a server's build), as for
  // `kvsnap convert`; the rest of the ConversionSpec is ignored.
  ConversionSpec claims;
  // The float type of the KVCache tensors: "F16", "BF16", "F32"; "" = the one the file's K and V
  // types share (F16 for quantized ones), F32 when they differ.
  std::string dtype;
  MlxKvSetting quant;                      // bits 0: KVCache; else QuantizedKVCache
  MlxLayout layout = MlxLayout::kScalars;  // the mlx-lm release that will load it (mlx_layout_for)
  std::string model_name;                  // user metadata "model"
};

struct MlxToLlamaSpec {
  // The target: ctk/ctv (default f16), flash_attn (default on), dst_rotation/rotation,
  // target_build, format; as for `kvsnap convert`. `format` must name a format of `file_kind`.
  ConversionSpec target;
  // kSeqFile: a slot file (sequence 0); kSessionFile: a session file (one stream, sequence 0, the
  // model's architecture name), which llama.cpp loads into a context of one stream (n_seq_max 1
  // or a unified KV cache).
  StateKind file_kind = StateKind::kSeqFile;
  std::optional<std::vector<int32_t>> tokens;  // else the file's "tokens" metadata
};

struct CrossEngineResult {
  uint32_t n_tokens = 0;
  uint32_t n_layers = 0;
  KOrder k_order;
  std::string from, to;                // "ggsq v3 slot, K q8_0, V q8_0" / "mlx-lm KVCache F16 (scalars)"
  SourceRotation rotation;             // llama -> mlx: how the input's rotation was decided
  std::vector<std::string> notes;
  uint64_t bytes_out = 0;
};

Result<CrossEngineResult> llama_to_mlx(const StateFile& src, const ReadableFile& file, const ModelInfo& model,
                                       const LlamaToMlxSpec& spec, ByteSink& out);
Result<CrossEngineResult> mlx_to_llama(const MlxPromptCache& src, const ReadableFile& file, const ModelInfo& model,
                                       const MlxToLlamaSpec& spec, ByteSink& out);

// Token ids from text: a JSON list ("[1, 2, 3]") or integers separated by spaces, commas or
// newlines. kInvalidArgument naming `what` and the first bad word.
Result<std::vector<int32_t>> parse_token_list(const std::string& text, const std::string& what);
// A token file's text (--tokens FILE): a JSON array is read as JSON (its messages name the element:
// "[2]: 99999999999 is out of range"), any other text by parse_token_list. An id outside int32 is
// refused, never cut to another token.
Result<std::vector<int32_t>> parse_token_file_text(const std::string& text, const std::string& what);

}  // namespace kvsnap
