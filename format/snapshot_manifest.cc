// The manifest: the binary tables CELL, TOKN, SEGS, CHNK, DIGS; encoding,
// decoding and the checks that tie the tables together, and the section frame
// around them. The INFO section (JSON) is built and read in snapshot_info.cc.
// docs/format.md has the layouts.
#include <algorithm>
#include <cstdio>

#include "base/byte_order.h"
#include "base/json_access.h"
#include "format/cursor.h"
#include "format/ggml_types.h"
#include "format/llama_state_internal.h"
#include "format/rotation_rule.h"
#include "format/snapshot.h"
#include "format/snapshot_internal.h"
#include "format/llama_era.h"
#include "format/snapshot_info_internal.h"

namespace kvsnap {

using nlohmann::ordered_json;
using namespace snapshot_detail;

std::string snapshot_fixture_dir(uint32_t format_version) {
  return "fixtures/kvsnap/v" + std::to_string(format_version);
}

const char* segment_kind_name(SegmentKind k) {
  switch (k) {
    case SegmentKind::kFrame: return "frame";
    case SegmentKind::kRows: return "rows";
    case SegmentKind::kTransposed: return "transposed";
  }
  return "?";
}

uint64_t Segment::cell_chunks() const {
  if (kind == SegmentKind::kFrame || cells_per_chunk == 0) return 0;
  const uint64_t N = cells_per_chunk;
  if (restarts_.empty()) return (uint64_t(cell_count) + N - 1) / N;
  return restart_chunk_.back() + (uint64_t(cell_count) - restarts_.back() + N - 1) / N;
}
uint64_t Segment::bands() const {
  if (kind != SegmentKind::kTransposed) return 1;
  if (rows_per_chunk == 0) return 0;
  return (uint64_t(n_rows) + rows_per_chunk - 1) / rows_per_chunk;
}
uint64_t Segment::n_chunks() const { return cell_chunks() * bands(); }

Segment::CellRun Segment::cell_chunk(uint64_t j) const {
  const uint64_t N = cells_per_chunk;
  uint64_t piece_start = 0, piece_end = cell_count, first_j = 0;
  if (!restarts_.empty()) {
    // The last piece whose first chunk is at or before j.
    const size_t p = size_t(std::upper_bound(restart_chunk_.begin(), restart_chunk_.end(), j) - restart_chunk_.begin());
    if (p > 0) piece_start = restarts_[p - 1], first_j = restart_chunk_[p - 1];
    if (p < restarts_.size()) piece_end = restarts_[p];
  }
  const uint64_t first = piece_start + (j - first_j) * N;
  return {first, std::min<uint64_t>(N, piece_end - first)};
}

uint64_t Segment::cell_chunk_of(uint64_t cell) const {
  const uint64_t N = cells_per_chunk;
  if (restarts_.empty()) return cell / N;
  const size_t p = size_t(std::upper_bound(restarts_.begin(), restarts_.end(), cell) - restarts_.begin());
  if (p == 0) return cell / N;
  return restart_chunk_[p - 1] + (cell - restarts_[p - 1]) / N;
}

void Segment::set_cell_restarts(std::vector<uint32_t> restarts) {
  restarts_ = std::move(restarts);
  restart_chunk_.clear();
  const uint64_t N = cells_per_chunk;
  uint64_t start = 0, chunks = 0;
  for (uint32_t r : restarts_) {
    chunks += (r - start + N - 1) / N;
    restart_chunk_.push_back(chunks);
    start = r;
  }
}

bool SegmentTable::has_cell_restarts() const {
  return std::any_of(segments.begin(), segments.end(), [](const Segment& s) { return !s.cell_restarts().empty(); });
}

uint64_t Segment::chunk_raw_size(uint64_t k) const {
  const uint64_t J = cell_chunks();
  if (J == 0) return 0;
  const uint64_t j = k % J, b = k / J;
  const uint64_t cells = cell_chunk(j).count;
  if (kind == SegmentKind::kRows) return cells * row_bytes;
  const uint64_t rows = std::min<uint64_t>(rows_per_chunk, n_rows - b * rows_per_chunk);
  return rows * cells * elem_bytes;
}

uint64_t SnapshotManifest::raw_bytes() const {
  uint64_t n = 0;
  for (const auto& c : chunks) n += c.raw_size;
  return n;
}
uint64_t SnapshotManifest::stored_bytes() const {
  uint64_t n = 0;
  for (const auto& c : chunks) n += c.stored_size;
  return n;
}

namespace snapshot_detail {

std::string tag_name(uint32_t tag) {
  std::string s;
  for (int i = 0; i < 4; ++i) {
    const char c = char((tag >> (8 * i)) & 0xff);
    if (c < 0x20 || c > 0x7e) {
      char b[16];
      std::snprintf(b, sizeof b, "0x%08x", tag);
      return b;
    }
    s += c;
  }
  return s;
}

std::string describe_segment(const Segment& s) {
  if (s.kind == SegmentKind::kFrame) return "frame bytes";
  return "layer " + std::to_string(s.layer) + (s.is_v ? " V" : " K") + " of KV section " + std::to_string(s.section) +
         " stream " + std::to_string(s.stream);
}

Location locate(const SegmentTable& table, const Segment& seg, uint64_t file_offset) {
  const uint64_t rel = file_offset - seg.file_offset;
  const uint64_t left_in_seg = seg.size - rel;
  Location loc;
  switch (seg.kind) {
    case SegmentKind::kFrame: {
      const uint64_t so = seg.frame_offset + rel;
      loc.chunk = so / table.frame_chunk_bytes;
      loc.offset_in_chunk = so % table.frame_chunk_bytes;
      loc.run = std::min(left_in_seg, table.frame_chunk_bytes - loc.offset_in_chunk);
      break;
    }
    case SegmentKind::kRows: {
      const uint64_t j = seg.cell_chunk_of(rel / seg.row_bytes);
      const Segment::CellRun cells = seg.cell_chunk(j);
      loc.chunk = seg.first_chunk + j;
      loc.offset_in_chunk = rel - cells.first * seg.row_bytes;
      loc.run = std::min(left_in_seg, cells.count * seg.row_bytes - loc.offset_in_chunk);
      break;
    }
    case SegmentKind::kTransposed: {
      // File: n_rows rows of cell_count elements. Chunk (b, j): for each row
      // of band b, the elements of cell chunk j's cells [c0, c0 + n_j), row after row.
      const uint64_t eb = seg.elem_bytes, R = seg.rows_per_chunk;
      const uint64_t row_len = uint64_t(seg.cell_count) * eb;
      const uint64_t r = rel / row_len, in_row = rel % row_len;
      const uint64_t j = seg.cell_chunk_of(in_row / eb), b = r / R;
      const Segment::CellRun cells = seg.cell_chunk(j);
      loc.chunk = seg.first_chunk + b * seg.cell_chunks() + j;
      loc.offset_in_chunk = (r - b * R) * cells.count * eb + (in_row - cells.first * eb);
      loc.run = (cells.first + cells.count) * eb - in_row;  // to the end of this row's piece
      break;
    }
  }
  return loc;
}

// --- Encoding -----------------------------------------------------------------------

// SEGS's payload: also what the content digest hashes (format/content_digest.h).
std::vector<std::byte> encode_segments(const SegmentTable& t) {
  std::vector<std::byte> b;
  put_u32(b, t.frame_chunk_bytes);
  put_u32(b, 0);
  put_u64(b, t.frame_bytes);
  put_u64(b, t.n_frame_chunks);
  put_u64(b, t.segments.size());
  for (const Segment& s : t.segments) {
    b.push_back(std::byte(uint8_t(s.kind)));
    b.push_back(std::byte(s.is_v ? 1 : 0));
    b.push_back(std::byte{0});
    b.push_back(std::byte{0});
    put_u32(b, s.section);
    put_u32(b, s.stream);
    put_u32(b, s.layer);
    put_u64(b, s.file_offset);
    put_u64(b, s.size);
    put_u64(b, s.kind == SegmentKind::kFrame ? s.frame_offset : s.first_chunk);
    if (s.kind == SegmentKind::kTransposed) {
      put_u32(b, s.elem_bytes);
      put_u32(b, s.n_rows);
    } else {
      put_u64(b, s.row_bytes);
    }
    put_u32(b, s.cell_count);
    put_u32(b, s.cells_per_chunk);
    put_u32(b, s.rows_per_chunk);
    put_i32(b, s.ggml_type);
  }
  return b;
}

// GRID's payload (format version 4): the tensor segments with cell restarts, in table order.
std::vector<std::byte> encode_grid(const SegmentTable& t) {
  std::vector<std::byte> b;
  const uint64_t n = uint64_t(std::count_if(t.segments.begin(), t.segments.end(),
                                            [](const Segment& s) { return !s.cell_restarts().empty(); }));
  put_u64(b, n);
  for (size_t i = 0; i < t.segments.size(); ++i) {
    const std::vector<uint32_t>& r = t.segments[i].cell_restarts();
    if (r.empty()) continue;
    put_u32(b, uint32_t(i));
    put_u32(b, uint32_t(r.size()));
    for (uint32_t c : r) put_u32(b, c);
  }
  return b;
}

namespace {

void put_section(std::vector<std::byte>& out, uint32_t tag, const std::vector<std::byte>& payload,
                 bool required = true) {
  put_u32(out, tag);
  put_u32(out, required ? kSectionRequired : 0);
  put_u64(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
}

std::vector<std::byte> encode_cells(const std::vector<CellSection>& cells) {
  std::vector<std::byte> b;
  put_u32(b, uint32_t(cells.size()));
  for (const auto& sec : cells) {
    put_u32(b, sec.ext_bytes);
    put_u32(b, uint32_t(sec.streams.size()));
    for (const auto& st : sec.streams) {
      put_u32(b, uint32_t(st.size()));
      for (const CellMeta& c : st) {
        put_i32(b, c.pos);
        put_u32(b, uint32_t(c.seq_ids.size()));
        for (uint32_t e = 0; e < sec.ext_bytes / 4; ++e) put_i32(b, c.ext[e]);
        for (int32_t id : c.seq_ids) put_i32(b, id);
      }
    }
  }
  return b;
}

std::vector<std::byte> encode_tokens(const SnapshotTokens& t) {
  std::vector<std::byte> b;
  put_u32(b, t.packed ? 1 : 0);
  put_u32(b, uint32_t(t.tokens.size()));
  for (int32_t v : t.tokens) put_i32(b, v);
  put_u32(b, uint32_t(t.words.size()));
  for (int32_t v : t.words) put_i32(b, v);
  return b;
}


std::vector<std::byte> encode_chunks(const std::vector<ChunkRef>& chunks) {
  std::vector<std::byte> b;
  put_u64(b, chunks.size());
  for (const ChunkRef& c : chunks) {
    put_bytes(b, c.sha256.data(), 32);
    put_u64(b, c.raw_size);
    put_u64(b, c.stored_size);
    b.push_back(std::byte(uint8_t(c.codec)));
    b.push_back(std::byte(uint8_t(c.filter)));
    append_le(b, c.elem_size);
    put_u32(b, 0);
  }
  return b;
}

// CHKX (optional: a reader without it loses nothing but the check): u32 algorithm (1: XXH3-128),
// then the 16 canonical bytes of every chunk's ChunkRef::xxh, in chunk order.
std::vector<std::byte> encode_chunk_xxh(const std::vector<ChunkRef>& chunks) {
  std::vector<std::byte> b;
  put_u32(b, kChkxXxh3_128);
  for (const ChunkRef& c : chunks) put_bytes(b, c.xxh->data(), c.xxh->size());
  return b;
}

// CRYP: u8 version (1), u8 algorithm (1: AES-256-GCM), u8 chunk ids (1: HMAC-SHA256), u8 0,
// master key id (8), tenant key id (8), u16 tenant name length, the name.
std::vector<std::byte> encode_encryption(const SnapshotEncryption& e) {
  std::vector<std::byte> b;
  for (uint8_t v : {uint8_t(1), kSealedAesGcm, uint8_t(1), uint8_t(0)}) b.push_back(std::byte(v));
  put_bytes(b, e.master_key_id.data(), e.master_key_id.size());
  put_bytes(b, e.tenant_key_id.data(), e.tenant_key_id.size());
  append_le(b, uint16_t(e.tenant.size()));
  put_bytes(b, e.tenant.data(), e.tenant.size());
  return b;
}

// MLXC: u32 version (1), u32 n_tensors, per tensor u16 name length, name, u16 dtype length, dtype.
std::vector<std::byte> encode_mlx(const SnapshotMlx& x) {
  std::vector<std::byte> b;
  put_u32(b, x.version);
  put_u32(b, uint32_t(x.tensors.size()));
  for (const SnapshotMlxTensor& t : x.tensors) {
    append_le(b, uint16_t(t.name.size()));
    put_bytes(b, t.name.data(), t.name.size());
    append_le(b, uint16_t(t.dtype.size()));
    put_bytes(b, t.dtype.data(), t.dtype.size());
  }
  return b;
}

}  // namespace

Status encode_manifest(SnapshotManifest& m) {
  std::vector<std::byte> b;
  put_bytes(b, kManifestMagic.data(), 4);
  // A grid with restarts needs a reader that knows GRID: version 4, else the writer's own version.
  const bool grid = m.segments.has_cell_restarts();
  if (grid) {
    m.format_version = std::max(m.format_version, kSnapshotGridVersion);
    m.min_reader_version = std::max(m.min_reader_version, kSnapshotGridVersion);
    if (m.info.is_object() && m.info.contains("format_version")) m.info["format_version"] = m.format_version;
  }
  put_u32(b, m.format_version);
  put_u32(b, m.min_reader_version);
  const bool chkx = !m.chunks.empty() && std::all_of(m.chunks.begin(), m.chunks.end(),
                                                       [](const ChunkRef& c) { return c.xxh.has_value(); });
  put_u32(b, 6 + (grid ? 1 : 0) + (m.encryption ? 1 : 0) + (chkx ? 1 : 0) + (m.mlx ? 1 : 0));  // sections
  if (m.mlx) put_section(b, kTagMlxc, encode_mlx(*m.mlx));
  const std::string info = m.info.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  if (info.size() > kMaxInfoBytes) {
    return Status::NotSupported("the snapshot's INFO would be " + std::to_string(info.size()) + " bytes, more than the " +
                                std::to_string(kMaxInfoBytes) + " a reader accepts");
  }
  put_section(b, kTagInfo, std::vector<std::byte>(reinterpret_cast<const std::byte*>(info.data()),
                                                  reinterpret_cast<const std::byte*>(info.data()) + info.size()));
  put_section(b, kTagCell, encode_cells(m.cells));
  put_section(b, kTagTokn, encode_tokens(m.tokens));
  put_section(b, kTagSegs, encode_segments(m.segments));
  if (grid) put_section(b, kTagGrid, encode_grid(m.segments));
  put_section(b, kTagChnk, encode_chunks(m.chunks));
  if (m.encryption) put_section(b, kTagCryp, encode_encryption(*m.encryption));
  if (chkx) put_section(b, kTagChkx, encode_chunk_xxh(m.chunks), /*required=*/false);
  m.sections_sha256 = sha256_of(b);
  std::vector<std::byte> digs;
  put_bytes(digs, m.content_digest.data(), 32);
  put_u64(digs, m.provenance.file_size);
  put_bytes(digs, m.sections_sha256.data(), 32);
  put_section(b, kTagDigs, digs);
  m.bytes = std::move(b);
  m.manifest_sha256 = sha256_of(m.bytes);
  return Status::OK();
}

}  // namespace snapshot_detail

// --- Decoding ------------------------------------------------------------------------

namespace {

// Cells a CELL table may hold in all: a stream's bound in a llama.cpp file (kMaxCellsPerStream, above
// any context llama.cpp runs), twice for an iSWA model's two caches. Each 8-byte cell becomes a
// CellMeta of ~36 bytes: without a bound a 1 GiB table of zeros, a 1.7 MB archive, held 9 GB
// (a review's finding); with it, at most ~1.2 GB whatever the file claims.
using llama_state_detail::kMaxCellsPerStream;
constexpr uint64_t kMaxSnapshotCells = uint64_t{2} * kMaxCellsPerStream;

Status decode_cells(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": CELL section");
  uint64_t total = 0;
  uint32_t n_sec = 0;
  KV_RETURN_IF_ERROR(r.u32(n_sec, "section count"));
  KV_RETURN_IF_ERROR(r.check_count(n_sec, 8, "KV sections"));
  m.cells.resize(n_sec);
  for (auto& sec : m.cells) {
    uint32_t n_st = 0;
    KV_RETURN_IF_ERROR(r.u32(sec.ext_bytes, "ext bytes"));
    if (sec.ext_bytes > 12 || sec.ext_bytes % 4) {
      return r.corrupt("cell ext of " + std::to_string(sec.ext_bytes) + " bytes (0, 4, 8 or 12 expected)");
    }
    KV_RETURN_IF_ERROR(r.u32(n_st, "stream count"));
    KV_RETURN_IF_ERROR(r.check_count(n_st, 4, "streams"));
    sec.streams.resize(n_st);
    for (auto& st : sec.streams) {
      uint32_t n = 0;
      KV_RETURN_IF_ERROR(r.u32(n, "cell count"));
      KV_RETURN_IF_ERROR(r.check_count(n, 8 + sec.ext_bytes, "cells"));  // a count past the bytes: damaged
      total += n;
      if (n > kMaxCellsPerStream || total > kMaxSnapshotCells) {
        return Status::NotSupported(name + ": CELL section: " + std::to_string(n) + " cells in a stream, " +
                                    std::to_string(total) + " so far: over kvsnap's limit of " +
                                    std::to_string(kMaxCellsPerStream) + " a stream and " +
                                    std::to_string(kMaxSnapshotCells) + " a snapshot");
      }
      st.resize(n);
      for (CellMeta& c : st) {
        uint32_t n_seq = 0;
        KV_RETURN_IF_ERROR(r.i32(c.pos, "cell position"));
        KV_RETURN_IF_ERROR(r.u32(n_seq, "cell seq id count"));
        for (uint32_t e = 0; e < sec.ext_bytes / 4; ++e) KV_RETURN_IF_ERROR(r.i32(c.ext[e], "cell ext"));
        KV_RETURN_IF_ERROR(r.check_count(n_seq, 4, "cell seq ids"));
        c.seq_ids.resize(n_seq);
        for (int32_t& id : c.seq_ids) KV_RETURN_IF_ERROR(r.i32(id, "cell seq id"));
      }
    }
  }
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the cells");
  return Status::OK();
}

Status decode_tokens(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": TOKN section");
  uint32_t flags = 0, n = 0;
  KV_RETURN_IF_ERROR(r.u32(flags, "flags"));
  m.tokens.packed = flags & 1;
  KV_RETURN_IF_ERROR(r.u32(n, "token count"));
  KV_RETURN_IF_ERROR(r.check_count(n, 4, "tokens"));
  m.tokens.tokens.resize(n);
  for (int32_t& t : m.tokens.tokens) KV_RETURN_IF_ERROR(r.i32(t, "token"));
  KV_RETURN_IF_ERROR(r.u32(n, "word count"));
  KV_RETURN_IF_ERROR(r.check_count(n, 4, "token payload words"));
  m.tokens.words.resize(n);
  for (int32_t& t : m.tokens.words) KV_RETURN_IF_ERROR(r.i32(t, "token payload word"));
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the tokens");
  return Status::OK();
}

Status decode_segments(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": SEGS section");
  SegmentTable& t = m.segments;
  uint32_t reserved = 0;
  uint64_t n = 0;
  KV_RETURN_IF_ERROR(r.u32(t.frame_chunk_bytes, "frame chunk size"));
  KV_RETURN_IF_ERROR(r.u32(reserved, "reserved"));
  KV_RETURN_IF_ERROR(r.u64(t.frame_bytes, "frame size"));
  KV_RETURN_IF_ERROR(r.u64(t.n_frame_chunks, "frame chunk count"));
  KV_RETURN_IF_ERROR(r.u64(n, "segment count"));
  if (n != r.remaining() / kSegmentRecordBytes || r.remaining() % kSegmentRecordBytes) {
    return r.corrupt("segment count " + std::to_string(n) + " does not match the " + std::to_string(r.remaining()) +
                     " bytes of " + std::to_string(kSegmentRecordBytes) + "-byte records");
  }
  t.segments.resize(n);
  for (Segment& s : t.segments) {
    uint8_t kind = 0, side = 0;
    uint16_t res16 = 0;
    uint64_t first = 0, aux = 0;
    KV_RETURN_IF_ERROR(r.u8(kind, "segment kind"));
    KV_RETURN_IF_ERROR(r.u8(side, "segment side"));
    KV_RETURN_IF_ERROR(r.u16(res16, "reserved"));
    if (kind > uint8_t(SegmentKind::kTransposed)) return r.corrupt("unknown segment kind " + std::to_string(kind));
    if (side > 1) return r.corrupt("segment side " + std::to_string(side) + " (0 K, 1 V)");
    s.kind = SegmentKind(kind);
    s.is_v = side == 1;
    KV_RETURN_IF_ERROR(r.u32(s.section, "section"));
    KV_RETURN_IF_ERROR(r.u32(s.stream, "stream"));
    KV_RETURN_IF_ERROR(r.u32(s.layer, "layer"));
    KV_RETURN_IF_ERROR(r.u64(s.file_offset, "file offset"));
    KV_RETURN_IF_ERROR(r.u64(s.size, "size"));
    KV_RETURN_IF_ERROR(r.u64(first, "first chunk"));
    KV_RETURN_IF_ERROR(r.u64(aux, "row geometry"));
    KV_RETURN_IF_ERROR(r.u32(s.cell_count, "cell count"));
    KV_RETURN_IF_ERROR(r.u32(s.cells_per_chunk, "cells per chunk"));
    KV_RETURN_IF_ERROR(r.u32(s.rows_per_chunk, "rows per chunk"));
    KV_RETURN_IF_ERROR(r.i32(s.ggml_type, "type"));
    if (s.kind == SegmentKind::kFrame) {
      s.frame_offset = first;
    } else {
      s.first_chunk = first;
    }
    if (s.kind == SegmentKind::kTransposed) {
      s.elem_bytes = uint32_t(aux);
      s.n_rows = uint32_t(aux >> 32);
    } else if (s.kind == SegmentKind::kRows) {
      s.row_bytes = aux;
    }
  }
  // The content digest hashes the table as encode_segments writes it (docs/format.md): a reserved or
  // unused field that is not zero would give two manifests one digest.
  const std::vector<std::byte> canonical = encode_segments(t);
  if (!std::equal(canonical.begin(), canonical.end(), payload.begin(), payload.end()))
    return r.corrupt("a reserved or unused field is not zero");
  return Status::OK();
}

// After SEGS (the restarts are checked against its segments' cells). Canonical: entries in table
// order, each a tensor segment with at least one restart, strictly increasing, inside its cells.
Status decode_grid(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": GRID section");
  std::vector<Segment>& segs = m.segments.segments;
  uint64_t n = 0;
  KV_RETURN_IF_ERROR(r.u64(n, "entry count"));
  KV_RETURN_IF_ERROR(r.check_count(n, 8, "grid entries"));
  if (n == 0) return r.corrupt("no segment has cell restarts");
  int64_t last = -1;
  for (uint64_t e = 0; e < n; ++e) {
    uint32_t index = 0, count = 0;
    KV_RETURN_IF_ERROR(r.u32(index, "segment index"));
    KV_RETURN_IF_ERROR(r.u32(count, "restart count"));
    if (int64_t(index) <= last || index >= segs.size()) {
      return r.corrupt("entry " + std::to_string(e) + ": segment " + std::to_string(index) +
                       " is out of order or past the " + std::to_string(segs.size()) + " segments");
    }
    last = index;
    Segment& s = segs[index];
    if (s.kind == SegmentKind::kFrame || s.cells_per_chunk == 0) {
      return r.corrupt("segment " + std::to_string(index) + " has no cell grid to restart");
    }
    KV_RETURN_IF_ERROR(r.check_count(count, 4, "cell restarts"));
    if (count == 0) return r.corrupt("segment " + std::to_string(index) + ": an entry without restarts");
    std::vector<uint32_t> restarts(count);
    uint32_t prev = 0;
    for (uint32_t& c : restarts) {
      KV_RETURN_IF_ERROR(r.u32(c, "restart cell"));
      if (c <= prev || c >= s.cell_count) {
        return r.corrupt("segment " + std::to_string(index) + ": restart at cell " + std::to_string(c) +
                         " is not after " + std::to_string(prev) + " and inside its " + std::to_string(s.cell_count) +
                         " cells");
      }
      prev = c;
    }
    s.set_cell_restarts(std::move(restarts));
  }
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the entries");
  return Status::OK();
}

Status decode_chunks(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": CHNK section");
  uint64_t n = 0;
  KV_RETURN_IF_ERROR(r.u64(n, "chunk count"));
  if (n != r.remaining() / kChunkRecordBytes || r.remaining() % kChunkRecordBytes) {
    return r.corrupt("chunk count " + std::to_string(n) + " does not match the " + std::to_string(r.remaining()) +
                     " bytes of " + std::to_string(kChunkRecordBytes) + "-byte records");
  }
  m.chunks.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    ChunkRef& c = m.chunks[i];
    uint8_t codec = 0, filter = 0;
    uint32_t res = 0;
    c.index = i;
    KV_RETURN_IF_ERROR(r.bytes(c.sha256.data(), 32, "chunk hash"));
    KV_RETURN_IF_ERROR(r.u64(c.raw_size, "raw size"));
    KV_RETURN_IF_ERROR(r.u64(c.stored_size, "stored size"));
    KV_RETURN_IF_ERROR(r.u8(codec, "codec"));
    KV_RETURN_IF_ERROR(r.u8(filter, "filter"));
    KV_RETURN_IF_ERROR(r.u16(c.elem_size, "element size"));
    KV_RETURN_IF_ERROR(r.u32(res, "reserved"));
    // Canonical as encode_chunks writes it (the blob header's own values): the record describes
    // the blob the writer made, so anything a blob header could not say is damage, not a variant.
    if (res != 0 || codec > uint8_t(ChunkCodec::kZstd) || filter > uint8_t(ChunkFilter::kShuffle) ||
        (filter == uint8_t(ChunkFilter::kNone) ? c.elem_size != 0
                                              : c.elem_size < 2 || c.elem_size > kMaxShuffleElem)) {
      return r.corrupt("chunk " + std::to_string(i) + ": codec " + std::to_string(codec) + ", filter " +
                       std::to_string(filter) + ", element size " + std::to_string(c.elem_size) + ", reserved " +
                       std::to_string(res) + " is not a record a writer makes");
    }
    c.codec = ChunkCodec(codec);
    c.filter = ChunkFilter(filter);
  }
  return Status::OK();
}

// After CHNK (the count comes from it). An algorithm this kvsnap does not know is skipped, like
// an unknown optional section.
Status decode_chunk_xxh(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": CHKX section");
  uint32_t algorithm = 0;
  KV_RETURN_IF_ERROR(r.u32(algorithm, "algorithm"));
  if (algorithm != kChkxXxh3_128) {
    m.skipped_sections.push_back(kTagChkx);
    return Status::OK();
  }
  if (r.remaining() != m.chunks.size() * sizeof(ChunkXxh)) {
    return r.corrupt(std::to_string(r.remaining()) + " bytes of digests for " + std::to_string(m.chunks.size()) +
                     " chunks of " + std::to_string(sizeof(ChunkXxh)) + " bytes each");
  }
  for (ChunkRef& c : m.chunks) {
    ChunkXxh d{};
    KV_RETURN_IF_ERROR(r.bytes(d.data(), d.size(), "chunk digest"));
    c.xxh = d;
  }
  return Status::OK();
}

Status decode_encryption(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": CRYP section");
  uint8_t version = 0, algorithm = 0, ids = 0, reserved = 0;
  uint16_t tenant_len = 0;
  SnapshotEncryption e;
  KV_RETURN_IF_ERROR(r.u8(version, "version"));
  KV_RETURN_IF_ERROR(r.u8(algorithm, "algorithm"));
  KV_RETURN_IF_ERROR(r.u8(ids, "chunk id scheme"));
  KV_RETURN_IF_ERROR(r.u8(reserved, "reserved"));
  if (version != 1 || algorithm != kSealedAesGcm || ids != 1 || reserved != 0) {
    return Status::NotSupported(name + ": CRYP section version " + std::to_string(version) + ", algorithm " +
                                std::to_string(algorithm) + ", chunk ids " + std::to_string(ids) +
                                ": this kvsnap reads version 1 (AES-256-GCM, HMAC-SHA256 ids)");
  }
  KV_RETURN_IF_ERROR(r.bytes(e.master_key_id.data(), e.master_key_id.size(), "master key id"));
  KV_RETURN_IF_ERROR(r.bytes(e.tenant_key_id.data(), e.tenant_key_id.size(), "tenant key id"));
  KV_RETURN_IF_ERROR(r.u16(tenant_len, "tenant name length"));
  KV_ASSIGN_OR_RETURN(std::span<const std::byte> tenant, r.take(tenant_len, "tenant name"));
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the tenant name");
  e.tenant.assign(reinterpret_cast<const char*>(tenant.data()), tenant.size());
  if (Status s = check_tenant_name(e.tenant); !s.ok()) return r.corrupt(s.message());
  m.encryption = std::move(e);
  return Status::OK();
}

Status decode_mlx(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": MLXC section");
  SnapshotMlx x;
  uint32_t n = 0;
  KV_RETURN_IF_ERROR(r.u32(x.version, "version"));
  if (x.version != 1) {
    return Status::NotSupported(name + ": MLXC section version " + std::to_string(x.version) +
                                ": this kvsnap reads version 1: upgrade kvsnap");
  }
  KV_RETURN_IF_ERROR(r.u32(n, "tensor count"));
  KV_RETURN_IF_ERROR(r.check_count(n, 4, "tensors"));
  x.tensors.resize(n);
  auto text = [&r](std::string& out, const char* what) -> Status {
    uint16_t len = 0;
    KV_RETURN_IF_ERROR(r.u16(len, what));
    KV_ASSIGN_OR_RETURN(std::span<const std::byte> bytes, r.take(len, what));
    out.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return Status::OK();
  };
  for (SnapshotMlxTensor& t : x.tensors) {
    KV_RETURN_IF_ERROR(text(t.name, "tensor name"));
    KV_RETURN_IF_ERROR(text(t.dtype, "tensor dtype"));
    if (t.name.empty()) return r.corrupt("an empty tensor name");
  }
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the tensors");
  m.mlx = std::move(x);
  return Status::OK();
}

Status decode_digests(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m,
                      uint64_t& original_size) {
  SpanReader r(payload, name + ": DIGS section");
  KV_RETURN_IF_ERROR(r.bytes(m.content_digest.data(), 32, "original SHA-256"));
  KV_RETURN_IF_ERROR(r.u64(original_size, "original size"));
  KV_RETURN_IF_ERROR(r.bytes(m.sections_sha256.data(), 32, "sections SHA-256"));
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the digests");
  return Status::OK();
}

// The tables must describe one file: segments tile [0, size), frame segments
// tile the frame stream, tensor segments number their chunks in order after
// the frame chunks, and every chunk's raw size follows from the geometry.
// Every error names the file.
class TableCheck {
 public:
  TableCheck(const std::string& name, const SnapshotManifest& m, uint64_t original_size)
      : name_(name), m_(m), t_(m.segments), original_size_(original_size) {}

  // The frame chunking, and INFO against DIGS.
  Status frame_and_digests() const {
    if (t_.frame_chunk_bytes == 0 || t_.frame_chunk_bytes > kMaxChunkRawBytes) {
      return bad("frame chunk size " + std::to_string(t_.frame_chunk_bytes) + " is out of range");
    }
    // Ceiling division that cannot wrap: frame_bytes is the file's word, up to 2^64 - 1.
    const uint64_t frame_chunks =
        t_.frame_bytes / t_.frame_chunk_bytes + (t_.frame_bytes % t_.frame_chunk_bytes != 0);
    if (t_.n_frame_chunks != frame_chunks) {
      return bad("frame chunk count " + std::to_string(t_.n_frame_chunks) + " does not fit " +
                 std::to_string(t_.frame_bytes) + " frame bytes");
    }
    if (m_.provenance.file_size != original_size_) {
      return bad("INFO says the original has " + std::to_string(m_.provenance.file_size) + " bytes, DIGS says " +
                 std::to_string(original_size_));
    }
    if (m_.provenance.content_digest != m_.content_digest) return bad("INFO and DIGS disagree on the content digest");
    if (t_.frame_bytes > original_size_ || t_.n_frame_chunks > m_.chunks.size()) {
      return bad(std::to_string(t_.frame_bytes) + " frame bytes in " + std::to_string(t_.n_frame_chunks) +
                 " chunks do not fit a " + std::to_string(original_size_) + "-byte original and " +
                 std::to_string(m_.chunks.size()) + " chunks");
    }
    return Status::OK();
  }

  // Walks the segments in file order; then they must have covered the file,
  // the frame stream and the chunk table exactly.
  Status segments() {
    // Readers size per-layer tables by the largest layer index: bound it by
    // what the table holds (every layer has at least one tensor segment).
    tensor_segments_ = uint64_t(std::count_if(t_.segments.begin(), t_.segments.end(),
                                              [](const Segment& s) { return s.kind != SegmentKind::kFrame; }));
    next_chunk_ = t_.n_frame_chunks;
    for (size_t i = 0; i < t_.segments.size(); ++i) KV_RETURN_IF_ERROR(segment(i, t_.segments[i]));
    if (at_ != original_size_) {
      return bad("segments cover " + std::to_string(at_) + " of " + std::to_string(original_size_) + " bytes");
    }
    if (frame_at_ != t_.frame_bytes) {
      return bad("frame segments hold " + std::to_string(frame_at_) + " of " + std::to_string(t_.frame_bytes) +
                 " frame bytes");
    }
    if (next_chunk_ != m_.chunks.size()) {
      return bad("the segments use " + std::to_string(next_chunk_) + " chunks, the chunk table has " +
                 std::to_string(m_.chunks.size()));
    }
    return Status::OK();
  }

  // Chunk raw sizes from the geometry.
  Status chunk_sizes() const {
    for (uint64_t k = 0; k < t_.n_frame_chunks; ++k) {
      KV_RETURN_IF_ERROR(
          chunk(k, std::min<uint64_t>(t_.frame_chunk_bytes, t_.frame_bytes - k * t_.frame_chunk_bytes)));
    }
    for (const Segment& s : t_.segments) {
      if (s.kind == SegmentKind::kFrame) continue;
      for (uint64_t k = 0; k < s.n_chunks(); ++k) KV_RETURN_IF_ERROR(chunk(s.first_chunk + k, s.chunk_raw_size(k)));
    }
    return Status::OK();
  }

 private:
  Status bad(const std::string& msg) const { return Status::Corruption(name_ + ": " + msg); }

  // Segment i: where it starts, its size, and (tensor segments) its cells and chunks.
  Status segment(size_t i, const Segment& s) {
    const std::string which = "segment " + std::to_string(i);
    if (s.kind != SegmentKind::kFrame && s.layer >= tensor_segments_) {
      return bad(which + ": layer " + std::to_string(s.layer) + " is out of range (the table has " +
                 std::to_string(tensor_segments_) + " tensor segments)");
    }
    if (s.file_offset != at_) {
      return bad(which + " starts at " + std::to_string(s.file_offset) + ", expected " + std::to_string(at_));
    }
    if (s.size == 0 || s.size > original_size_ - at_) {
      return bad(which + ": size " + std::to_string(s.size) + " is out of range");
    }
    at_ += s.size;
    if (s.kind == SegmentKind::kFrame) {
      if (s.frame_offset != frame_at_) return bad(which + ": frame offset out of order");
      frame_at_ += s.size;
      return Status::OK();
    }
    KV_RETURN_IF_ERROR(tensor_geometry(which, s));
    if (s.first_chunk != next_chunk_) {
      return bad(which + ": first chunk " + std::to_string(s.first_chunk) + ", expected " +
                 std::to_string(next_chunk_));
    }
    // next_chunk_ <= chunks.size() here, so comparing before adding cannot wrap.
    if (s.n_chunks() > m_.chunks.size() - next_chunk_) return bad(which + ": chunks past the end of the chunk table");
    next_chunk_ += s.n_chunks();
    return Status::OK();
  }

  // A tensor segment's cells agree with CELL, its bytes are whole rows (or a
  // whole transposed block), and its chunks stay within the size limit.
  Status tensor_geometry(const std::string& which, const Segment& s) const {
    const uint64_t cc = s.cell_count, N = s.cells_per_chunk;
    if (cc == 0 || N == 0) return bad(which + ": zero cells or cells per chunk");
    // An mlx-lm prompt cache has no cells: its segments' cell counts are sequence lengths (MLXC).
    if (!m_.mlx && (m_.cells.size() <= s.section || m_.cells[s.section].streams.size() <= s.stream ||
                    m_.cells[s.section].streams[s.stream].size() != cc)) {
      return bad(which + ": " + std::to_string(cc) + " cells disagree with the CELL section");
    }
    uint64_t max_chunk = 0;
    if (s.kind == SegmentKind::kRows) {
      if (s.row_bytes == 0 || s.row_bytes > kMaxChunkRawBytes || s.size / s.row_bytes != cc || s.size % s.row_bytes) {
        return bad(which + ": " + std::to_string(s.size) + " bytes are not " + std::to_string(cc) + " rows of " +
                   std::to_string(s.row_bytes));
      }
      max_chunk = std::min(N, cc) * s.row_bytes;
    } else {
      const uint64_t R = s.rows_per_chunk, eb = s.elem_bytes;
      if (eb == 0 || s.n_rows == 0 || R == 0 || R > s.n_rows || eb > kMaxChunkRawBytes ||
          s.size / eb / s.n_rows != cc || s.size % (eb * s.n_rows)) {
        return bad(which + ": transposed geometry (" + std::to_string(s.n_rows) + " rows, " + std::to_string(cc) +
                   " cells, " + std::to_string(eb) + "-byte elements, " + std::to_string(R) +
                   " rows per chunk) does not fit " + std::to_string(s.size) + " bytes");
      }
      max_chunk = std::min(N, cc) * eb;
      max_chunk = max_chunk > kMaxChunkRawBytes / R ? kMaxChunkRawBytes + 1 : max_chunk * R;
    }
    if (max_chunk > kMaxChunkRawBytes) return bad(which + ": its chunks exceed the chunk size limit");
    return Status::OK();
  }

  Status chunk(uint64_t i, uint64_t expect) const {
    const ChunkRef& c = m_.chunks[i];
    if (c.raw_size != expect) {
      return bad("chunk " + std::to_string(i) + ": raw size " + std::to_string(c.raw_size) + ", the segments say " +
                 std::to_string(expect));
    }
    if (c.stored_size < kBlobHeaderBytes || c.stored_size > c.raw_size + kMaxBlobOverhead) {
      return bad("chunk " + std::to_string(i) + ": stored size " + std::to_string(c.stored_size) + " is out of range");
    }
    return Status::OK();
  }

  const std::string& name_;
  const SnapshotManifest& m_;
  const SegmentTable& t_;
  const uint64_t original_size_;
  uint64_t tensor_segments_ = 0;
  uint64_t at_ = 0, frame_at_ = 0, next_chunk_ = 0;  // where the walk has reached
};

// An mlx-lm prompt cache's manifest: INFO says so exactly when MLXC is there, it has no cells, and
// MLXC names one tensor per tensor segment, each a kTransposed block of planes (format/snapshot_mlx.h).
Status check_mlx(const std::string& name, const SnapshotManifest& m) {
  if (m.provenance.mlx_prompt_cache != m.mlx.has_value()) {
    return Status::Corruption(name + (m.mlx ? ": an MLXC section, but INFO's provenance is not an mlx-lm prompt cache"
                                            : ": INFO says an mlx-lm prompt cache, but there is no MLXC section"));
  }
  if (!m.mlx) return Status::OK();
  if (!m.cells.empty()) return Status::Corruption(name + ": an mlx-lm prompt cache with a CELL table");
  size_t n = 0;
  for (const Segment& s : m.segments.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    if (s.kind != SegmentKind::kTransposed || s.layer != n) {
      return Status::Corruption(name + ": mlx-lm tensor segment " + std::to_string(n) + " is not the " +
                                std::to_string(n) + "th block of planes");
    }
    ++n;
  }
  if (n != m.mlx->tensors.size()) {
    return Status::Corruption(name + ": MLXC names " + std::to_string(m.mlx->tensors.size()) +
                              " tensors, the segment table has " + std::to_string(n));
  }
  return Status::OK();
}

Status check_tables(const std::string& name, const SnapshotManifest& m, uint64_t original_size) {
  KV_RETURN_IF_ERROR(check_mlx(name, m));
  TableCheck check(name, m, original_size);
  KV_RETURN_IF_ERROR(check.frame_and_digests());
  KV_RETURN_IF_ERROR(check.segments());
  return check.chunk_sizes();
}

// Magic and versions; a manifest a newer kvsnap requires is refused by name.
Status read_preamble(SpanReader& r, const std::string& name, SnapshotManifest& m) {
  std::array<uint8_t, 4> magic{};
  KV_RETURN_IF_ERROR(r.bytes(magic.data(), 4, "manifest magic"));
  if (magic != kManifestMagic) return Status::Corruption(name + ": not a kvsnap manifest (bad magic)");
  KV_RETURN_IF_ERROR(r.u32(m.format_version, "format version"));
  KV_RETURN_IF_ERROR(r.u32(m.min_reader_version, "minimum reader version"));
  if (m.format_version == 0 || m.min_reader_version == 0 || m.min_reader_version > m.format_version) {
    return Status::Corruption(name + ": format version " + std::to_string(m.format_version) +
                              " with minimum reader version " + std::to_string(m.min_reader_version) + " is invalid");
  }
  if (m.min_reader_version > kSnapshotReaderVersion) {
    return Status::NotSupported(name + ": written in kvsnap snapshot format version " +
                                std::to_string(m.format_version) + ", which needs a reader of version " +
                                std::to_string(m.min_reader_version) + " or later; this kvsnap reads version " +
                                std::to_string(kSnapshotReaderVersion) + ": upgrade kvsnap");
  }
  return Status::OK();
}

struct SectionEntry {
  uint32_t tag, flags;
  size_t header_at;
  std::span<const std::byte> payload;
};

// The section directory, with DIGS last; nothing decoded yet.
Result<std::vector<SectionEntry>> read_section_directory(SpanReader& r, const std::string& name) {
  uint32_t n_sections = 0;
  KV_RETURN_IF_ERROR(r.u32(n_sections, "section count"));
  KV_RETURN_IF_ERROR(r.check_count(n_sections, kSectionHeaderBytes, "sections"));
  std::vector<SectionEntry> secs;
  for (uint32_t i = 0; i < n_sections; ++i) {
    SectionEntry s{};
    s.header_at = r.offset();
    uint64_t len = 0;
    KV_RETURN_IF_ERROR(r.u32(s.tag, "section tag"));
    KV_RETURN_IF_ERROR(r.u32(s.flags, "section flags"));
    KV_RETURN_IF_ERROR(r.u64(len, "section length"));
    KV_ASSIGN_OR_RETURN(s.payload, r.take(len, "section payload"));
    secs.push_back(s);
  }
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the last section");
  if (secs.empty() || secs.back().tag != kTagDigs) {
    return Status::Corruption(name + ": the last section is not DIGS (the manifest is cut or damaged)");
  }
  return secs;
}

// Every section but DIGS, each at most once; unknown optional ones are
// skipped, unknown required ones refused, and the five known ones required.
Status decode_sections(const std::vector<SectionEntry>& secs, const std::string& name, SnapshotManifest& m) {
  std::vector<uint32_t> seen;
  const SectionEntry* chkx = nullptr;  // decoded once CHNK is
  const SectionEntry* grid = nullptr;  // decoded once SEGS is
  for (size_t i = 0; i + 1 < secs.size(); ++i) {
    const SectionEntry& s = secs[i];
    if (std::find(seen.begin(), seen.end(), s.tag) != seen.end() || s.tag == kTagDigs) {
      return Status::Corruption(name + ": section " + tag_name(s.tag) + " appears twice");
    }
    seen.push_back(s.tag);
    Status st;
    if (s.tag == kTagInfo) st = decode_info(s.payload, name, m);
    else if (s.tag == kTagCell) st = decode_cells(s.payload, name, m);
    else if (s.tag == kTagTokn) st = decode_tokens(s.payload, name, m);
    else if (s.tag == kTagSegs) st = decode_segments(s.payload, name, m);
    else if (s.tag == kTagChnk) st = decode_chunks(s.payload, name, m);
    else if (s.tag == kTagCryp) st = decode_encryption(s.payload, name, m);
    else if (s.tag == kTagChkx) chkx = &s;
    else if (s.tag == kTagGrid) grid = &s;
    else if (s.tag == kTagMlxc) st = decode_mlx(s.payload, name, m);
    else if (s.flags & kSectionRequired) {
      return Status::NotSupported(name + ": required section '" + tag_name(s.tag) +
                                  "' is unknown to this kvsnap (it reads snapshot format version " +
                                  std::to_string(kSnapshotReaderVersion) + "): written by a newer kvsnap?");
    } else {
      m.skipped_sections.push_back(s.tag);
    }
    KV_RETURN_IF_ERROR(st);
  }
  for (uint32_t tag : {kTagInfo, kTagCell, kTagTokn, kTagSegs, kTagChnk}) {
    if (std::find(seen.begin(), seen.end(), tag) == seen.end()) {
      return Status::Corruption(name + ": the manifest has no " + tag_name(tag) + " section");
    }
  }
  // Cell restarts need a reader that knows them (a reader of version 3 would misplace chunks).
  if (grid && m.min_reader_version < kSnapshotGridVersion) {
    return Status::Corruption(name + ": a GRID section in a manifest for readers of version " +
                              std::to_string(m.min_reader_version));
  }
  if (grid && !(grid->flags & kSectionRequired)) {
    return Status::Corruption(name + ": a GRID section not flagged required (a reader without it would misplace chunks)");
  }
  if (grid) KV_RETURN_IF_ERROR(decode_grid(grid->payload, name, m));
  return chkx ? decode_chunk_xxh(chkx->payload, name, m) : Status::OK();
}

}  // namespace

Result<SnapshotManifest> parse_manifest(std::span<const std::byte> bytes, const std::string& name) {
  SpanReader r(bytes, name);
  SnapshotManifest m;
  KV_RETURN_IF_ERROR(read_preamble(r, name, m));
  // The digest is checked before any section is decoded, so a damaged
  // manifest reads as damaged.
  KV_ASSIGN_OR_RETURN(std::vector<SectionEntry> secs, read_section_directory(r, name));
  uint64_t original_size = 0;
  KV_RETURN_IF_ERROR(decode_digests(secs.back().payload, name, m, original_size));
  if (sha256_of(bytes.first(secs.back().header_at)) != m.sections_sha256) {
    return Status::Corruption(name + ": manifest digest mismatch: the manifest is damaged");
  }
  KV_RETURN_IF_ERROR(decode_sections(secs, name, m));
  KV_RETURN_IF_ERROR(check_tables(name, m, original_size));
  m.bytes.assign(bytes.begin(), bytes.end());
  m.manifest_sha256 = sha256_of(bytes);
  return m;
}

}  // namespace kvsnap
