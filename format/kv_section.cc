// Reads one KV section of a llama.cpp state file: the n_stream prefix (when the
// era has it), then per stream the cell list, v_trans and, per layer, the K and
// V rows, each checked against the type table and the model's shape.
// llama_state.cc decides which layout (Reading) to try.
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "format/llama_state_internal.h"

namespace kvsnap::llama_state_detail {
namespace {

Status check_type(Cursor& c, uint64_t at, int32_t id, const std::string& ctx, const char* side) {
  if (!find_type(id)) {
    return c.corrupt(at, ctx + ": unknown " + side + " type id " + std::to_string(id) +
                             " (not one of " + kv_cache_type_names() + ")");
  }
  return Status::OK();
}

Status check_row_bytes(Cursor& c, uint64_t at, int32_t type, uint64_t bytes, const std::string& ctx,
                       const char* side, const std::vector<uint32_t>* n_embd, size_t il) {
  const TypeLayout& t = *find_type(type);
  if (bytes == 0 || bytes > kMaxRowBytes) {
    return c.corrupt(at, ctx + ": " + side + " row size " + std::to_string(bytes) + " is out of range");
  }
  if (bytes % t.block_bytes != 0) {
    return c.corrupt(at, ctx + ": " + side + " row size " + std::to_string(bytes) + " is not a multiple of " +
                             std::to_string(t.block_bytes) + " (" + std::string(t.name) + " block)");
  }
  if (n_embd && il < n_embd->size()) {
    auto expect = row_bytes(t, (*n_embd)[il]);
    if (!expect.ok() || *expect != bytes) {
      return Status::Mismatch(c.file().name() + ": offset " + std::to_string(at) + ": " + ctx + ": mismatched " +
                              side + " row size (" + std::to_string(bytes) + " != " +
                              (expect.ok() ? std::to_string(*expect) : std::string("n/a")) + " for " +
                              std::to_string((*n_embd)[il]) + " " + std::string(t.name) + " values from the model): pass the GGUF the file was saved with ({--model GGUF})");
    }
  }
  return Status::OK();
}

// u64 row bytes (checked against the type and the model) and n_cells rows.
Status read_rows(Cursor& c, int32_t type, const std::string& ctx, const char* side, const std::vector<uint32_t>* n_embd,
                 size_t il, uint64_t n_cells, uint64_t& row, ByteRange& range) {
  const bool k = side[0] == 'k';
  const uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(row, c.u64(k ? "key row size" : "value row size"));
  KV_RETURN_IF_ERROR(check_row_bytes(c, at, type, row, ctx, side, n_embd, il));
  range.offset = c.offset();
  KV_RETURN_IF_ERROR(c.skip(n_cells, row, k ? "key rows" : "value rows"));
  range.size = n_cells * row;
  return Status::OK();
}

// Per layer with V: i32 v_type, then either {u64 v_row_bytes, rows} or, when
// transposed, {u32 element size, u32 n_embd_v_gqa, n_embd_v_gqa x cells elements}.
Status read_v_layers(Cursor& c, const KvSectionShape* shape, size_t si, size_t n_sections, size_t stream_index,
                     KvStream& st) {
  const uint64_t n_cells = st.cell_count;
  for (uint32_t il = 0; il < st.n_layer; ++il) {
    KvLayer& L = st.layers[il];
    if (shape && il < shape->has_v.size() && !shape->has_v[il]) {
      L.has_v = false;
      continue;
    }
    const std::string ctx = where(si, n_sections, stream_index, il);
    c.header_before_bulk(kLayerHeaderBytes);
    KV_ASSIGN_OR_RETURN(L.v_type, read_type(c, ctx, "value"));
    const TypeLayout& vt = *find_type(L.v_type);
    if (!st.v_trans) {
      KV_RETURN_IF_ERROR(read_rows(c, L.v_type, ctx, "value", shape ? &shape->n_embd_v_gqa : nullptr, il, n_cells,
                                   L.v_row_bytes, L.v));
    } else {
      uint64_t at = c.offset();
      KV_ASSIGN_OR_RETURN(L.v_elem_bytes, c.u32("value element size"));
      if (vt.block_elems != 1 || L.v_elem_bytes != vt.block_bytes) {
        return c.corrupt(at, ctx + ": transposed V element size " + std::to_string(L.v_elem_bytes) +
                                 " does not fit type " + std::string(vt.name) +
                                 (vt.quantized ? " (a quantized V cache requires flash attention, so V is never "
                                                 "transposed)"
                                               : ""));
      }
      at = c.offset();
      KV_ASSIGN_OR_RETURN(L.n_embd_v_gqa, c.u32("value embedding size"));
      if (L.n_embd_v_gqa == 0 || L.n_embd_v_gqa > kMaxEmbd) {
        return c.corrupt(at, ctx + ": n_embd_v_gqa " + std::to_string(L.n_embd_v_gqa) + " is out of range");
      }
      if (shape && il < shape->n_embd_v_gqa.size() && shape->n_embd_v_gqa[il] != L.n_embd_v_gqa) {
        return Status::Mismatch(c.file().name() + ": offset " + std::to_string(at) + ": " + ctx +
                                ": mismatched value embedding size (" + std::to_string(L.n_embd_v_gqa) +
                                " != " + std::to_string(shape->n_embd_v_gqa[il]) + " from the model): pass the GGUF the file was saved with ({--model GGUF})");
      }
      L.v.offset = c.offset();
      KV_RETURN_IF_ERROR(c.skip(uint64_t(L.n_embd_v_gqa) * n_cells, L.v_elem_bytes, "transposed value data"));
      L.v.size = uint64_t(L.n_embd_v_gqa) * n_cells * L.v_elem_bytes;
    }
  }
  return Status::OK();
}

Status parse_kv_stream(Cursor& c, const Reading& r, const KvSectionShape* shape, size_t si, size_t n_sections,
                       size_t stream_index, KvStream& st) {
  KV_ASSIGN_OR_RETURN(st.cell_count, c.u32("stream cell count"));
  // From b6122 (the n_stream prefix) an empty stream is its count alone. Before it, llama.cpp
  // (b3543's write_kv_cache, b5640's state_write) wrote v_trans, the layer count and every layer's
  // header after no cells, and read them back (a review's finding: such files were refused; kvsnap's
  // own writer wrote the count alone, which those builds cannot load).
  if (st.cell_count == 0 && r.stream_prefix) return Status::OK();
  KV_RETURN_IF_ERROR(parse_cells(c, st.cell_count, r.ext_bytes, st.cells));

  uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(st.v_trans, c.u32("v_trans"));
  if (st.v_trans > 1) return c.corrupt(at, "v_trans is " + std::to_string(st.v_trans) + ", expected 0 or 1");
  at = c.offset();
  KV_ASSIGN_OR_RETURN(st.n_layer, c.u32("layer count"));
  if (st.n_layer == 0 || st.n_layer > kMaxLayers) {
    return c.corrupt(at, "layer count " + std::to_string(st.n_layer) + " is out of range (1.." +
                             std::to_string(kMaxLayers) + ")");
  }
  if (shape && !shape->n_embd_k_gqa.empty() && shape->n_embd_k_gqa.size() != st.n_layer) {
    return Status::Mismatch(c.file().name() + ": offset " + std::to_string(at) + ": mismatched layer count (" +
                            std::to_string(st.n_layer) + " in the file, " +
                            std::to_string(shape->n_embd_k_gqa.size()) + " in the model): pass the GGUF the file was saved with ({--model GGUF})");
  }
  KV_RETURN_IF_ERROR(read_k_layers(c, shape, si, n_sections, stream_index, st));
  return read_v_layers(c, shape, si, n_sections, stream_index, st);
}

}  // namespace

std::string where(size_t section, size_t n_sections, size_t stream, size_t layer) {
  std::string s;
  if (n_sections > 1) s += "KV section " + std::to_string(section) + ", ";
  s += "stream " + std::to_string(stream) + ", layer " + std::to_string(layer);
  return s;
}

Status parse_cells(Cursor& c, uint32_t cell_count, uint32_t ext_bytes, std::vector<CellMeta>& cells) {
  const uint64_t min_cell = 8 + ext_bytes;
  if (cell_count > c.remaining() / min_cell) {
    return c.corrupt("truncated: " + std::to_string(cell_count) + " cells need at least " +
                     std::to_string(min_cell) + " bytes each, " + std::to_string(c.remaining()) + " remain");
  }
  if (cell_count > kMaxCellsPerStream) {
    return c.corrupt(std::to_string(cell_count) + " cells in a stream is above any llama.cpp context (kvsnap reads up to " +
                     std::to_string(kMaxCellsPerStream) + ")");
  }
  cells.resize(cell_count);
  for (uint32_t i = 0; i < cell_count; ++i) {
    CellMeta& m = cells[i];
    KV_ASSIGN_OR_RETURN(m.pos, c.i32("cell position"));
    const uint64_t at = c.offset();
    KV_ASSIGN_OR_RETURN(uint32_t n_seq, c.u32("cell seq id count"));
    if (n_seq > kMaxSeqIdsPerCell) {
      return c.corrupt(at, "cell " + std::to_string(i) + ": " + std::to_string(n_seq) + " sequence ids is absurd");
    }
    for (uint32_t e = 0; e < ext_bytes / 4; ++e) {
      KV_ASSIGN_OR_RETURN(m.ext[e], c.i32("cell ext"));
    }
    if (n_seq > c.remaining() / 4) return c.corrupt("truncated: cell seq ids");
    m.seq_ids.resize(n_seq);
    for (uint32_t s = 0; s < n_seq; ++s) {
      KV_ASSIGN_OR_RETURN(m.seq_ids[s], c.i32("cell seq id"));
    }
  }
  return Status::OK();
}

// A type id at the cursor, checked (`side`: "key" | "value").
Result<int32_t> read_type(Cursor& c, const std::string& ctx, const char* side) {
  const uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(int32_t t, c.i32(side[0] == 'k' ? "key type" : "value type"));
  KV_RETURN_IF_ERROR(check_type(c, at, t, ctx, side));
  return t;
}

// st.n_layer x {i32 k_type, u64 k_row_bytes, st.cell_count rows}: the same in every layout.
Status read_k_layers(Cursor& c, const KvSectionShape* shape, size_t si, size_t n_sections, size_t stream_index,
                     KvStream& st) {
  const uint64_t n_cells = st.cell_count;
  st.layers.resize(st.n_layer);
  for (uint32_t il = 0; il < st.n_layer; ++il) {
    KvLayer& L = st.layers[il];
    const std::string ctx = where(si, n_sections, stream_index, il);
    c.header_before_bulk(kLayerHeaderBytes);
    KV_ASSIGN_OR_RETURN(L.k_type, read_type(c, ctx, "key"));
    KV_RETURN_IF_ERROR(read_rows(c, L.k_type, ctx, "key", shape ? &shape->n_embd_k_gqa : nullptr, il, n_cells,
                                 L.k_row_bytes, L.k));
  }
  return Status::OK();
}

Status parse_kv_section(Cursor& c, const Reading& r, const KvSectionShape* shape, size_t si, size_t n_sections,
                        KvSection& sec) {
  sec.range.offset = c.offset();
  sec.stream_prefix = r.stream_prefix;
  sec.ext_bytes = r.ext_bytes;
  uint32_t n_stream = 1;
  if (r.stream_prefix) {
    const uint64_t at = c.offset();
    KV_ASSIGN_OR_RETURN(n_stream, c.u32("stream count"));
    if (n_stream == 0 || n_stream > kMaxStreams) {
      return c.corrupt(at, "stream count " + std::to_string(n_stream) + " is out of range (1.." +
                               std::to_string(kMaxStreams) + ")");
    }
    if (n_stream > c.remaining() / 4) return c.corrupt(at, "truncated: " + std::to_string(n_stream) + " streams");
  }
  sec.streams.resize(n_stream);
  for (uint32_t s = 0; s < n_stream; ++s) {
    KV_RETURN_IF_ERROR(parse_kv_stream(c, r, shape, si, n_sections, s, sec.streams[s]));
  }
  sec.range.size = c.offset() - sec.range.offset;
  return Status::OK();
}

}  // namespace kvsnap::llama_state_detail
