// Internal to format/llama_state*.cc and format/kv_section.cc: the bounds on
// header fields, one way of reading the memory section (Reading), and the KV
// section reader that llama_state.cc drives. Not a public header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/cursor.h"
#include "format/llama_state.h"

namespace kvsnap::llama_state_detail {

// Bounds on header fields. Anything larger is not a KV cache llama.cpp can
// make; refusing it early keeps hostile files from steering allocations.
inline constexpr uint32_t kMaxLayers = 4096;
inline constexpr uint32_t kMaxStreams = 4096;
inline constexpr uint32_t kMaxSeqIdsPerCell = 4096;
inline constexpr uint64_t kMaxRowBytes = uint64_t(1) << 30;
inline constexpr uint32_t kMaxEmbd = 1u << 22;
// Tokens in a file, cells in a stream: 16,777,216, above any context llama.cpp runs (the largest
// models' are 10M tokens). A count below it still has to fit in the bytes that remain; the bound
// keeps the memory a hostile count steers (a few copies of the list) under a gigabyte or so.
inline constexpr uint32_t kMaxTokens = 1u << 24;
inline constexpr uint32_t kMaxCellsPerStream = 1u << 24;

// One way of reading the memory section.
struct Reading {
  bool stream_prefix = true;
  uint32_t ext_bytes = 0;
  int n_kv = 1;
  bool recurrent = false;

  std::string describe() const {
    std::string s = std::to_string(n_kv) + " KV section" + (n_kv == 1 ? "" : "s");
    if (n_kv == 2) s += " (iSWA)";
    if (recurrent) s += std::string(n_kv ? " + " : "") + "recurrent state";
    s += stream_prefix ? ", n_stream prefix" : ", no n_stream prefix (b5640 layout)";
    s += ", cell ext " + std::to_string(ext_bytes) + " bytes";
    return s;
  }
};

// "KV section 1, stream 0, layer 3" (the section only when there are several).
std::string where(size_t section, size_t n_sections, size_t stream, size_t layer);

// cell_count x {i32 pos, u32 n_seq, ext_bytes of extras, n_seq x i32 seq id}.
Status parse_cells(Cursor& c, uint32_t cell_count, uint32_t ext_bytes, std::vector<CellMeta>& cells);

// A type id at the cursor, checked (`side`: "key" | "value").
// Every layer's header before its rows, in every era: i32 type, then u64 row size, or for a
// transposed V u32 element size + u32 n_embd_v_gqa (Cursor::header_before_bulk).
constexpr uint64_t kLayerHeaderBytes = 12;
Result<int32_t> read_type(Cursor& c, const std::string& ctx, const char* side);

// st.n_layer x {i32 k_type, u64 k_row_bytes, st.cell_count rows}: the same in every layout.
Status read_k_layers(Cursor& c, const KvSectionShape* shape, size_t si, size_t n_sections, size_t stream_index,
                     KvStream& st);

// One KV section (section si of n_sections) read as `r` says, checked against
// `shape` where given.
Status parse_kv_section(Cursor& c, const Reading& r, const KvSectionShape* shape, size_t si, size_t n_sections,
                        KvSection& sec);

// u32 n + n x i32 token words (`allow_packed`: the llama-server payload may be packed).
Status read_tokens(Cursor& c, TokenPayload& tp, bool allow_packed);

// After a session's output count (at `at`): n_outputs x i32 output ids, u64 + f32 logits,
// u64 + f32 embeddings.
Status read_output_arrays(Cursor& c, uint64_t at, uint64_t n_outputs, SessionOutputs& o);

// u32 n + n x i32.
Status write_words(const std::vector<int32_t>& words, ByteSink& out);

// Lets `tensors` write one tensor and checks that it wrote `expect` bytes.
Status emit_checked(const StateFile& file, TensorSource& tensors, const TensorRef& ref, uint64_t expect,
                    ByteSink& out);

// ggsn v6 (b3166) after magic and version: needs opts.shape (the model), see llama_state_v6.cc.
Status read_session_v6(Cursor& c, const ParseOptions& opts, StateFile& f);
// The body of a ggsn v6 session after magic and version, from an era-A StateFile.
Status write_session_v6(const StateFile& f, TensorSource& tensors, const ReadableFile& opaque_src, ByteSink& out);

}  // namespace kvsnap::llama_state_detail
