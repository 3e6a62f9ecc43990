// llama.cpp KV state files: what they hold, how to read them, how to write them.
//
// Covers slot/sequence files (`ggsq` v3 and v2, with or without the n_stream
// prefix, and b3166's v1 layout), session files (`ggsn` v10, v9 and v8 (llama.cpp b3543: an RNG
// string after the arch name), and v6 (b3166: its legacy KV dump, read with the model's shape)),
// and raw buffers from
// llama_state_seq_get_data / llama_state_get_data. See docs/llama-formats.md
// for the byte layouts and which llama.cpp release wrote which.
//
// Parsing never loads tensor rows: a StateFile records where they are
// (ByteRange into the source), so a multi-GiB file is described by its headers
// and cell metadata alone. Writing takes a StateFile and a TensorSource that
// produces each K/V tensor's bytes, so the same writer reproduces a file byte
// for byte (CopyTensorSource) or emits a converted one (migrate/).
//
// llama.cpp files are not self-describing: the cell "ext" record, iSWA (two KV
// sections) and hybrid (KV then recurrent) layouts are decided by the model.
// With a MemoryShape from the model's GGUF the parse is exact; without one the
// reader tries every layout the file's magic and version allow, and stops with
// kAmbiguous (naming --model) when more than one reading fits.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/io.h"
#include "base/small_vector.h"
#include "base/status.h"

namespace kvsnap {

inline constexpr uint32_t kMagicGgsq = 0x67677371;  // 'ggsq': sequence/slot state
inline constexpr uint32_t kMagicGgsn = 0x6767736e;  // 'ggsn': whole-context session
inline constexpr uint32_t kRawSeqMagic = 0xaf143cd8;  // llama_state_seq_get_data prefix (v0.5.0+)
inline constexpr uint32_t kGgsqVersionCurrent = 3;
inline constexpr uint32_t kGgsnVersionCurrent = 10;

enum class StateKind {
  kSeqFile,     // ggsq: llama_state_seq_save_file, llama-server slot save
  kSessionFile, // ggsn: llama_state_save_file
  kRawSeq,      // llama_state_seq_get_data buffer (memory section, maybe magic+seq_id first)
  kRawContext,  // llama_state_get_data buffer (arch string [+ v9 outputs] + memory)
};
const char* kind_name(StateKind k);

struct ByteRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};

// The n_token words after a file header. llama-server (v0.5.0+) packs
// -1, u32 version, u32 n + n tokens, u32 m + m media positions, m media chunks
// (u32 len + bytes), zero-padded to whole words; anything else is a plain list.
struct TokenPayload {
  std::vector<int32_t> words;   // exactly as stored
  bool packed = false;
  uint32_t packed_version = 0;
  std::vector<int32_t> tokens;  // the prompt's tokens (== words when plain)
  std::vector<uint32_t> media_positions;
  std::vector<std::vector<std::byte>> media_chunks;
};
// kCorruption when words[0] == -1 but the packed payload does not parse.
Result<TokenPayload> parse_token_payload(std::vector<int32_t> words);
// Packs like llama-server's server_tokens::serialize (version 1).
std::vector<int32_t> pack_server_tokens(const std::vector<int32_t>& tokens,
                                        const std::vector<uint32_t>& media_positions,
                                        const std::vector<std::vector<std::byte>>& media_chunks);

struct CellMeta {
  int32_t pos = 0;
  // Sequence files of llama.cpp b4980 and older store no ids (n_seq_id 0);
  // later ones store the one saved sequence (a whole-state file's cell may hold several).
  SmallVector<int32_t, 2> seq_ids;
  std::array<int32_t, 3> ext{};  // M-RoPE x, y and the token (v0.5.0); only ext_bytes/4 are stored
};

// One layer of one stream: K rows, then V rows or V columns.
struct KvLayer {
  int32_t k_type = 0;
  uint64_t k_row_bytes = 0;
  ByteRange k;                 // cell_count rows of k_row_bytes
  bool has_v = true;           // false for layers llama.cpp writes no V for
  int32_t v_type = 0;
  uint64_t v_row_bytes = 0;    // v_trans == 0: bytes of one cell's V row
  uint32_t v_elem_bytes = 0;   // v_trans == 1: bytes of one element
  uint32_t n_embd_v_gqa = 0;   // v_trans == 1: rows of the transposed V
  ByteRange v;
};

struct KvStream {
  uint32_t cell_count = 0;     // 0: nothing else follows for this stream
  std::vector<CellMeta> cells;
  uint32_t v_trans = 0;
  uint32_t n_layer = 0;
  std::vector<KvLayer> layers;
};

struct KvSection {
  bool stream_prefix = true;   // u32 n_stream first (every llama.cpp since b6xxx); b5640: single stream, no prefix
  uint32_t ext_bytes = 0;      // bytes of cell ext per cell: 0, 8 or 12
  std::vector<KvStream> streams;
  ByteRange range;
};

// Recurrent state (Mamba-style layers of hybrid models): carried byte-exact.
// The summary is filled when its structure parses; the bytes are what count.
struct RecurrentSection {
  ByteRange range;
  bool understood = false;
  uint32_t cell_count = 0;
  uint32_t s_trans = 0;
  uint32_t n_layer = 0;
  uint32_t n_entries = 0;      // r and s tensors found
};

struct MemorySection {
  std::vector<KvSection> kv;   // 1, or 2 for iSWA (base then SWA), 0 for recurrent-only
  std::optional<RecurrentSection> recurrent;
  ByteRange range;
};

// Session v9 (and raw context v9): outputs before the memory section.
struct SessionOutputs {
  uint32_t n_outputs = 0;
  ByteRange output_pos;        // n_outputs x i32
  uint64_t logits_size = 0;    // floats
  ByteRange logits;
  uint64_t embd_size = 0;      // floats
  ByteRange embd;
};

// ggsn v6 (llama.cpp b3166): what its legacy dump holds besides the cache
// rows, cells, tokens, RNG and outputs, kept so the file is written back byte
// for byte (format/llama_state_v6.cc).
struct LegacySession {
  std::vector<std::byte> hparams;  // b3166's raw `struct llama_hparams` (152 bytes, padding included)
  uint32_t kv_size = 0;            // the saving context's cache size
  uint32_t kv_used = 0;            // its count of used cells
  // Cells inside kv_head that hold no sequence (pos -1, no seq id): their rows
  // are in the dump too. Formats that list only live cells cannot take them.
  uint32_t empty_cells = 0;
};
inline constexpr uint64_t kB3166HparamsBytes = 152;  // sizeof(llama_hparams) of b3166 on LP64

struct StateFile {
  StateKind kind = StateKind::kSeqFile;
  uint32_t magic = 0;
  uint32_t version = 0;        // file version; for raw buffers the layout era (3 or 2)
  TokenPayload tokens;         // seq and session files
  std::string arch;            // session files and raw context buffers (ggsn v6: from the model)
  std::string rng;             // ggsn v8 (b3543): the sampler's std::mt19937 as text, after the arch name
  std::optional<SessionOutputs> outputs;
  std::optional<LegacySession> legacy;  // ggsn v6 only
  bool raw_seq_tagged = false; // raw seq buffer starts with kRawSeqMagic + seq id
  int32_t raw_seq_id = 0;
  MemorySection memory;
  uint64_t file_size = 0;
  std::string reading;         // how the layout was decided, for `info`
};

// What the model (GGUF) says about the memory section's layout. Every field
// is optional: unknown fields are inferred from the file's structure.
struct KvSectionShape {
  std::vector<uint32_t> n_embd_k_gqa;  // per layer of this section
  std::vector<uint32_t> n_embd_v_gqa;
  std::vector<bool> has_v;             // empty: every layer has V
};
struct MemoryShape {
  std::optional<uint32_t> ext_bytes;
  std::vector<KvSectionShape> kv_sections;  // empty: unknown
  bool kv_sections_known = false;
  bool recurrent_known = false;
  bool has_recurrent = false;
  // The model's recurrent state has parts kvsnap does not parse (extra p
  // rows): carry it without checking its structure.
  bool recurrent_opaque_ok = false;
  // When known: the recurrent section's u32 n_layer field, and the values per
  // row of each tensor it writes, in order (every r, then every s).
  std::optional<uint32_t> recurrent_n_layer;
  std::vector<uint64_t> recurrent_row_elems;
  std::string source;                       // "model.gguf (llama)"
  // What b3166's llama_hparams must hold for this model (ggsn v6 headers are
  // checked against it); set from the GGUF.
  struct Hparams {
    uint32_t n_vocab = 0, n_embd = 0, n_head = 0, n_head_kv = 0, n_layer = 0;
    uint32_t n_embd_head_k = 0, n_embd_head_v = 0;
    std::string arch;  // general.architecture: later session formats store it, v6 does not
  };
  std::optional<Hparams> hparams;
};

struct ParseOptions {
  const MemoryShape* shape = nullptr;
  // Force the input kind (raw buffers have no header to tell).
  std::optional<StateKind> kind;
  // For raw buffers: the layout era (3 = v0.5.0 style, 2 = older).
  std::optional<uint32_t> raw_version;
  // ggsn v6 records no K/V types: the pair the user declares when the sizes
  // fit several (ggml type ids).
  std::optional<std::pair<int32_t, int32_t>> legacy_kv_types;
  // A version-9 body that reads both ways: true as llama.cpp b8121 and older wrote it (outputs
  // before the memory), false as b8179 and later did (the session_outputs of the build the user
  // names, format/llama_era.h). Unset: such a file is refused (kAmbiguous).
  std::optional<bool> v9_outputs;
};

Result<StateFile> parse_state(const ReadableFile& file, const ParseOptions& opts = {});

// Produces the bytes of one K or V tensor for the writer.
struct TensorRef {
  size_t section = 0;
  size_t stream = 0;
  size_t layer = 0;
  bool is_v = false;
};
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Appends exactly the tensor's bytes as `target` (the StateFile being
  // written) describes them.
  virtual Status emit(const StateFile& target, const TensorRef& ref, ByteSink& out) = 0;
};

// Copies the ranges a parsed StateFile points at from its source file.
class CopyTensorSource final : public TensorSource {
 public:
  explicit CopyTensorSource(const ReadableFile& src) : src_(src) {}
  Status emit(const StateFile& target, const TensorRef& ref, ByteSink& out) override;

 private:
  const ReadableFile& src_;
};

// Copies `range` of `src` to `out` in bounded pieces.
Status copy_range(const ReadableFile& src, ByteRange range, ByteSink& out);

// What write_state would refuse about `file`'s shape (a ggsq v1 file of an iSWA,
// recurrent or hybrid model, or with V widths that differ by layer), checked
// before any byte is written: write_state calls it first, and planners (convert,
// migrate, restore) call it before they open an output.
Status check_writable(const StateFile& file);

// Writes `file` as llama.cpp would: headers from `file`, tensors from
// `tensors`, opaque parts (v9 outputs, recurrent state) from `opaque_src`.
Status write_state(const StateFile& file, TensorSource& tensors, const ReadableFile& opaque_src, ByteSink& out);

// Totals used by `info` and the size table.
struct KvTotals {
  uint64_t n_cells = 0;        // over streams and sections
  uint64_t k_bytes = 0;
  uint64_t v_bytes = 0;
  int32_t pos_min = 0;
  int32_t pos_max = -1;
};
KvTotals kv_totals(const StateFile& f);

// Element counts of a layer's rows, derived from its row bytes and type.
std::optional<uint64_t> layer_n_embd_k(const KvLayer& l);
std::optional<uint64_t> layer_n_embd_v(const KvLayer& l, uint32_t v_trans);

}  // namespace kvsnap
