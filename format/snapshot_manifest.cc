// The manifest: INFO (JSON), CELL, TOKN, SEGS, CHNK, DIGS; encoding, decoding
// and the checks that tie the tables together. docs/format.md has the layouts.
#include <algorithm>
#include <cstdio>

#include "base/json_access.h"
#include "format/cursor.h"
#include "format/ggml_types.h"
#include "format/rotation_rule.h"
#include "format/snapshot.h"
#include "format/snapshot_internal.h"
#include "format/llama_era.h"

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
  return (uint64_t(cell_count) + cells_per_chunk - 1) / cells_per_chunk;
}
uint64_t Segment::bands() const {
  if (kind != SegmentKind::kTransposed) return 1;
  if (rows_per_chunk == 0) return 0;
  return (uint64_t(n_rows) + rows_per_chunk - 1) / rows_per_chunk;
}
uint64_t Segment::n_chunks() const { return cell_chunks() * bands(); }

uint64_t Segment::chunk_raw_size(uint64_t k) const {
  const uint64_t J = cell_chunks();
  if (J == 0) return 0;
  const uint64_t j = k % J, b = k / J;
  const uint64_t cells = std::min<uint64_t>(cells_per_chunk, cell_count - j * cells_per_chunk);
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
      const uint64_t chunk_bytes = uint64_t(seg.cells_per_chunk) * seg.row_bytes;
      const uint64_t j = rel / chunk_bytes;
      loc.chunk = seg.first_chunk + j;
      loc.offset_in_chunk = rel - j * chunk_bytes;
      loc.run = std::min(left_in_seg, chunk_bytes - loc.offset_in_chunk);
      break;
    }
    case SegmentKind::kTransposed: {
      // File: n_rows rows of cell_count elements. Chunk (b, j): for each row
      // of band b, the elements of cells [j*N, j*N + n_j), row after row.
      const uint64_t eb = seg.elem_bytes, N = seg.cells_per_chunk, R = seg.rows_per_chunk;
      const uint64_t row_len = uint64_t(seg.cell_count) * eb;
      const uint64_t r = rel / row_len, in_row = rel % row_len;
      const uint64_t cell = in_row / eb;
      const uint64_t j = cell / N, b = r / R;
      const uint64_t n_j = std::min<uint64_t>(N, seg.cell_count - j * N);
      loc.chunk = seg.first_chunk + b * seg.cell_chunks() + j;
      loc.offset_in_chunk = (r - b * R) * n_j * eb + (in_row - j * N * eb);
      loc.run = (j * N + n_j) * eb - in_row;  // to the end of this row's piece
      break;
    }
  }
  return loc;
}

// --- INFO -------------------------------------------------------------------------

namespace {

std::string basename_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

const char* kind_tag(StateKind k) {
  switch (k) {
    case StateKind::kSeqFile: return "seq";
    case StateKind::kSessionFile: return "session";
    case StateKind::kRawSeq: return "raw-seq";
    case StateKind::kRawContext: return "raw-context";
  }
  return "?";
}

std::optional<StateKind> kind_from_tag(const std::string& s) {
  for (StateKind k : {StateKind::kSeqFile, StateKind::kSessionFile, StateKind::kRawSeq, StateKind::kRawContext}) {
    if (s == kind_tag(k)) return k;
  }
  return std::nullopt;
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

// llama.cpp's rotation (docs/llama-formats.md): quantized caches of builds
// that rotate, when the model's head dims allow; the file does not record it,
// and for ggsq v2 / ggsn v9 files its layout may not tell (format/llama_era.h).
// What the saver's claims say when the layout does not: a declared rotation,
// else the default of a named build.
Tri claimed_rotation(const SourceClaims& c) {
  if (c.src_rotation == "on") return Tri::kYes;
  if (c.src_rotation == "off") return Tri::kNo;
  if (c.llama_build.empty()) return Tri::kUnknown;
  auto build = parse_llama_build(c.llama_build);
  if (!build.ok()) return Tri::kUnknown;
  auto layout = layout_of_build(*build);
  return layout.ok() ? layout->rotates : Tri::kUnknown;
}

ordered_json rotation_json(const StateFile& f, int32_t type, const SnapshotOptions& o, size_t si, bool is_v) {
  ordered_json j;
  const TypeLayout* t = find_type(type);
  std::optional<uint32_t> block;
  std::string rotated;
  Tri era_rotates = era_of_file(f, std::nullopt).rotates;
  if (era_rotates == Tri::kUnknown) era_rotates = claimed_rotation(o.writer);
  if (!t || !t->quantized || era_rotates == Tri::kNo) {
    rotated = "no";
  } else if (era_rotates == Tri::kUnknown) {
    rotated = "unknown-era";
  } else if (!o.model || si >= o.model->kv_sections.size()) {
    rotated = "unknown";
  } else {
    block = is_v ? o.model->kv_sections[si].v_rotation_block : o.model->kv_sections[si].k_rotation_block;
    rotated = block ? "yes" : "no";
  }
  j["rotated"] = rotated;
  j["block"] = block ? ordered_json(*block) : ordered_json(nullptr);
  return j;
}

uint32_t model_dim(const SnapshotOptions& o, size_t si, size_t il, bool is_v) {
  if (!o.model || si >= o.model->kv_sections.size()) return 0;
  const auto& v = is_v ? o.model->kv_sections[si].head_dim_v : o.model->kv_sections[si].head_dim_k;
  return il < v.size() ? v[il] : 0;
}

ordered_json layer_json(const StateFile& f, const KvStream& st, const KvLayer& L, const SnapshotOptions& o, size_t si,
                        size_t il) {
  ordered_json j;
  j["layer"] = il;
  j["k_type"] = type_name(L.k_type);
  j["k_row_bytes"] = L.k_row_bytes;
  if (auto n = layer_n_embd_k(L)) j["n_embd_k"] = *n;
  if (uint32_t d = model_dim(o, si, il, false)) j["head_dim_k"] = d;
  j["k_rotation"] = rotation_json(f, L.k_type, o, si, false);
  j["has_v"] = L.has_v;
  if (L.has_v) {
    j["v_type"] = type_name(L.v_type);
    if (st.v_trans) {
      j["v_elem_bytes"] = L.v_elem_bytes;
    } else {
      j["v_row_bytes"] = L.v_row_bytes;
    }
    if (auto n = layer_n_embd_v(L, st.v_trans)) j["n_embd_v"] = *n;
    if (uint32_t d = model_dim(o, si, il, true)) j["head_dim_v"] = d;
    j["v_rotation"] = rotation_json(f, L.v_type, o, si, true);
  }
  return j;
}

ordered_json model_json(const SnapshotModelInfo& m) {
  ordered_json j;
  j["arch"] = m.arch;
  j["gguf_fingerprint"] = m.gguf_fingerprint;
  j["n_layer"] = m.n_layer;
  j["n_head_kv"] = m.n_head_kv;
  ordered_json layers = ordered_json::array();
  for (const auto& L : m.layers) {
    layers.push_back({{"head_dim_k", L.head_dim_k}, {"head_dim_v", L.head_dim_v}, {"n_head_kv", L.n_head_kv}});
  }
  j["layers"] = std::move(layers);
  ordered_json secs = ordered_json::array();
  for (const auto& s : m.kv_sections) {
    ordered_json sj;
    sj["head_dim_k"] = s.head_dim_k;
    sj["head_dim_v"] = s.head_dim_v;
    sj["k_rotation_block"] = s.k_rotation_block ? ordered_json(*s.k_rotation_block) : ordered_json(nullptr);
    sj["v_rotation_block"] = s.v_rotation_block ? ordered_json(*s.v_rotation_block) : ordered_json(nullptr);
    secs.push_back(std::move(sj));
  }
  j["kv_sections"] = std::move(secs);
  return j;
}

}  // namespace

ordered_json build_info(const StateFile& f, const SnapshotOptions& o, const Sha256Digest& original_sha,
                        const std::string& created) {
  ordered_json j;
  j["format"] = "kvsnap snapshot";
  j["format_version"] = kSnapshotFormatVersion;
  j["kvsnap_version"] = o.kvsnap_version;
  j["created"] = created;
  ordered_json prov;
  prov["source"] = basename_of(o.source_name);
  prov["kind"] = kind_tag(f.kind);
  prov["magic"] = hex32(f.magic);
  prov["version"] = f.version;
  prov["file_size"] = f.file_size;
  prov["sha256"] = to_hex(original_sha);
  // Written only when known, so snapshots of unknown origin stay as before.
  const SourceClaims& w = o.writer;
  if (!w.llama_build.empty()) {
    prov["llama_build"] = w.llama_build;
    prov["llama_build_from"] = w.llama_build_from;
  }
  if (!w.reported_build.empty()) prov["reported_build"] = w.reported_build;
  if (w.src_rotation == "on" || w.src_rotation == "off") prov["src_rotation"] = w.src_rotation;
  j["provenance"] = std::move(prov);
  std::string arch = !f.arch.empty() ? f.arch : (o.model ? o.model->arch : "");
  j["arch"] = arch.empty() ? ordered_json(nullptr) : ordered_json(arch);
  j["model"] = o.model ? model_json(*o.model) : ordered_json(nullptr);

  ordered_json layout;
  layout["reading"] = f.reading;
  layout["raw_seq_tagged"] = f.raw_seq_tagged;
  layout["raw_seq_id"] = f.raw_seq_id;
  if (f.outputs) {
    layout["outputs"] = {{"n_outputs", f.outputs->n_outputs},
                         {"logits", f.outputs->logits_size},
                         {"embd", f.outputs->embd_size}};
  } else {
    layout["outputs"] = nullptr;
  }
  j["layout"] = std::move(layout);

  ordered_json mem;
  ordered_json secs = ordered_json::array();
  for (size_t si = 0; si < f.memory.kv.size(); ++si) {
    const KvSection& sec = f.memory.kv[si];
    ordered_json sj;
    sj["stream_prefix"] = sec.stream_prefix;
    sj["ext_bytes"] = sec.ext_bytes;
    sj["n_stream"] = sec.streams.size();
    ordered_json streams = ordered_json::array();
    for (const KvStream& st : sec.streams) {
      ordered_json stj;
      stj["cell_count"] = st.cell_count;
      if (st.cell_count) {
        stj["v_layout"] = st.v_trans ? "transposed" : "rows";
        ordered_json layers = ordered_json::array();
        for (size_t il = 0; il < st.layers.size(); ++il) layers.push_back(layer_json(f, st, st.layers[il], o, si, il));
        stj["layers"] = std::move(layers);
      }
      streams.push_back(std::move(stj));
    }
    sj["streams"] = std::move(streams);
    secs.push_back(std::move(sj));
  }
  mem["kv_sections"] = std::move(secs);
  if (f.memory.recurrent) {
    const RecurrentSection& r = *f.memory.recurrent;
    mem["recurrent"] = {{"bytes", r.range.size},
                        {"understood", r.understood},
                        {"cell_count", r.cell_count},
                        {"n_layer", r.n_layer}};
  } else {
    mem["recurrent"] = nullptr;
  }
  j["memory"] = std::move(mem);
  j["tokens"] = {{"n_tokens", f.tokens.tokens.size()}, {"n_words", f.tokens.words.size()}, {"packed", f.tokens.packed}};
  if (o.lossy) {
    j["lossy"] = {{"from_k", o.lossy->from_k}, {"from_v", o.lossy->from_v}, {"to_k", o.lossy->to_k},
                  {"to_v", o.lossy->to_v}, {"note", o.lossy->note}};
  } else {
    j["lossy"] = nullptr;
  }
  j["chunking"] = {{"cells_per_chunk", o.cells_per_chunk}, {"frame_chunk_bytes", kFrameChunkBytes},
                   {"zstd_level", o.zstd_level}};
  return j;
}

// --- Encoding -----------------------------------------------------------------------

namespace {

void put_section(std::vector<std::byte>& out, uint32_t tag, const std::vector<std::byte>& payload) {
  put_u32(out, tag);
  put_u32(out, kSectionRequired);
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

std::vector<std::byte> encode_chunks(const std::vector<ChunkRef>& chunks) {
  std::vector<std::byte> b;
  put_u64(b, chunks.size());
  for (const ChunkRef& c : chunks) {
    put_bytes(b, c.sha256.data(), 32);
    put_u64(b, c.raw_size);
    put_u64(b, c.stored_size);
    b.push_back(std::byte(uint8_t(c.codec)));
    b.push_back(std::byte(uint8_t(c.filter)));
    b.push_back(std::byte(c.elem_size & 0xff));
    b.push_back(std::byte(c.elem_size >> 8));
    put_u32(b, 0);
  }
  return b;
}

}  // namespace

void encode_manifest(SnapshotManifest& m) {
  std::vector<std::byte> b;
  put_bytes(b, kManifestMagic.data(), 4);
  put_u32(b, m.format_version);
  put_u32(b, m.min_reader_version);
  put_u32(b, 6);  // sections
  const std::string info = m.info.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  put_section(b, kTagInfo, std::vector<std::byte>(reinterpret_cast<const std::byte*>(info.data()),
                                                  reinterpret_cast<const std::byte*>(info.data()) + info.size()));
  put_section(b, kTagCell, encode_cells(m.cells));
  put_section(b, kTagTokn, encode_tokens(m.tokens));
  put_section(b, kTagSegs, encode_segments(m.segments));
  put_section(b, kTagChnk, encode_chunks(m.chunks));
  m.sections_sha256 = sha256_of(b);
  std::vector<std::byte> digs;
  put_bytes(digs, m.original_sha256.data(), 32);
  put_u64(digs, m.provenance.file_size);
  put_bytes(digs, m.sections_sha256.data(), 32);
  put_section(b, kTagDigs, digs);
  m.bytes = std::move(b);
  m.manifest_sha256 = sha256_of(m.bytes);
}

}  // namespace snapshot_detail

// --- Model info ----------------------------------------------------------------------

// The rotation blocks follow llama.cpp's rule (format/rotation_rule.h).
Result<SnapshotModelInfo> snapshot_model_info(const ModelProfile& p) {
  SnapshotModelInfo m;
  m.arch = p.arch;
  m.gguf_fingerprint = p.fingerprint;
  m.n_layer = p.n_layer;
  m.n_head_kv = p.n_head_kv;
  for (const auto& L : p.layers) m.layers.push_back({L.head_dim_k, L.head_dim_v, L.n_head_kv});
  KV_ASSIGN_OR_RETURN(auto sections, memory_sections(p));
  const uint32_t l0k = p.layers.empty() ? 0 : p.layers[0].head_dim_k;
  const uint32_t l0v = p.layers.empty() ? 0 : p.layers[0].head_dim_v;
  for (const auto& s : sections) {
    if (s.kind != SectionKind::kKv) continue;
    SnapshotModelInfo::Section out;
    for (const auto& L : s.layers) {
      out.head_dim_k.push_back(L.head_dim_k);
      out.head_dim_v.push_back(L.head_dim_v);
    }
    out.k_rotation_block = k_rotation_block(shared_head_dim(out.head_dim_k), l0k);
    out.v_rotation_block = v_rotation_block(shared_head_dim(out.head_dim_v), l0v);
    m.kv_sections.push_back(std::move(out));
  }
  return m;
}

// --- Decoding ------------------------------------------------------------------------

namespace {

Result<uint32_t> u32_or0(const OrderedJsonRef& j, const char* key) {
  KV_ASSIGN_OR_RETURN(uint64_t v, j.unsigned_or(key, 0, UINT32_MAX));
  return uint32_t(v);
}
Result<uint32_t> as_u32(const OrderedJsonRef& j) {
  KV_ASSIGN_OR_RETURN(uint64_t v, j.unsigned_integer(UINT32_MAX));
  return uint32_t(v);
}
// An optional array of u32 (absent: empty).
Result<std::vector<uint32_t>> u32_list(const OrderedJsonRef& j, const char* key) {
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> list, j.find(key));
  if (!list) return std::vector<uint32_t>();
  return list->elements_as<uint32_t>(as_u32);
}
Result<std::optional<uint32_t>> opt_u32(const OrderedJsonRef& j, const char* key) {
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> v, j.find(key));
  if (!v) return std::optional<uint32_t>();
  KV_ASSIGN_OR_RETURN(uint32_t u, as_u32(*v));
  return std::optional<uint32_t>(u);
}

Result<SnapshotModelInfo::Layer> model_layer(const OrderedJsonRef& L) {
  SnapshotModelInfo::Layer out;
  KV_ASSIGN_OR_RETURN(out.head_dim_k, u32_or0(L, "head_dim_k"));
  KV_ASSIGN_OR_RETURN(out.head_dim_v, u32_or0(L, "head_dim_v"));
  KV_ASSIGN_OR_RETURN(out.n_head_kv, u32_or0(L, "n_head_kv"));
  return out;
}

Result<SnapshotModelInfo::Section> model_section(const OrderedJsonRef& s) {
  SnapshotModelInfo::Section sec;
  KV_ASSIGN_OR_RETURN(sec.head_dim_k, u32_list(s, "head_dim_k"));
  KV_ASSIGN_OR_RETURN(sec.head_dim_v, u32_list(s, "head_dim_v"));
  KV_ASSIGN_OR_RETURN(sec.k_rotation_block, opt_u32(s, "k_rotation_block"));
  KV_ASSIGN_OR_RETURN(sec.v_rotation_block, opt_u32(s, "v_rotation_block"));
  return sec;
}

// INFO.model (written when a GGUF was given; every field optional).
Result<SnapshotModelInfo> model_info(const OrderedJsonRef& mo) {
  SnapshotModelInfo mi;
  KV_ASSIGN_OR_RETURN(mi.arch, mo.string_or("arch", ""));
  KV_ASSIGN_OR_RETURN(mi.gguf_fingerprint, mo.string_or("gguf_fingerprint", ""));
  KV_ASSIGN_OR_RETURN(mi.n_layer, u32_or0(mo, "n_layer"));
  KV_ASSIGN_OR_RETURN(mi.n_head_kv, u32_or0(mo, "n_head_kv"));
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> layers, mo.find("layers"));
  if (layers) {
    KV_ASSIGN_OR_RETURN(mi.layers, layers->elements_as<SnapshotModelInfo::Layer>(model_layer));
  }
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> sections, mo.find("kv_sections"));
  if (sections) {
    KV_ASSIGN_OR_RETURN(mi.kv_sections, sections->elements_as<SnapshotModelInfo::Section>(model_section));
  }
  return mi;
}

Status decode_provenance(const OrderedJsonRef& prov, SnapshotProvenance& pv) {
  KV_ASSIGN_OR_RETURN(pv.source, prov.string_at("source"));
  KV_ASSIGN_OR_RETURN(const std::string kind, prov.string_at("kind"));
  KV_ASSIGN_OR_RETURN(const std::string magic, prov.string_at("magic"));
  KV_ASSIGN_OR_RETURN(const uint64_t version, prov.unsigned_at("version", UINT32_MAX));
  KV_ASSIGN_OR_RETURN(pv.file_size, prov.unsigned_at("file_size"));
  KV_ASSIGN_OR_RETURN(const std::string sha, prov.string_at("sha256"));
  auto k = kind_from_tag(kind);
  if (!k) return prov.error("kind '" + kind + "' is unknown");
  pv.kind = *k;
  if (magic.size() != 8 || magic.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return prov.error("magic '" + magic + "' is not 8 hex digits");
  }
  pv.magic = uint32_t(std::stoul(magic, nullptr, 16));
  pv.version = uint32_t(version);
  if (!from_hex(sha, pv.sha256)) return prov.error("sha256 is not 64 hex digits");
  KV_ASSIGN_OR_RETURN(pv.writer.llama_build, prov.string_or("llama_build", ""));
  KV_ASSIGN_OR_RETURN(pv.writer.llama_build_from, prov.string_or("llama_build_from", ""));
  KV_ASSIGN_OR_RETURN(pv.writer.reported_build, prov.string_or("reported_build", ""));
  KV_ASSIGN_OR_RETURN(pv.writer.src_rotation, prov.string_or("src_rotation", ""));
  if (!pv.writer.llama_build.empty() && !parse_llama_build(pv.writer.llama_build).ok())
    return prov.error("llama_build '" + pv.writer.llama_build + "' is not a llama.cpp build");
  if (!pv.writer.src_rotation.empty() && pv.writer.src_rotation != "on" && pv.writer.src_rotation != "off")
    return prov.error("src_rotation must be on or off, not '" + pv.writer.src_rotation + "'");
  return Status::OK();
}

Status decode_info(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  const std::string doc = name + ": INFO";
  const std::string_view text(reinterpret_cast<const char*>(payload.data()), payload.size());
  // INFO is kept in file order (ordered_json): `kvsnap show` prints it as written.
  auto parsed = parse_json<ordered_json>(text, doc);
  if (!parsed.ok() || !parsed->is_object()) return Status::Corruption(name + ": INFO section is not a JSON object");
  ordered_json j = std::move(parsed).value();
  const OrderedJsonRef info(j, doc);
  KV_ASSIGN_OR_RETURN(OrderedJsonRef prov, info.at("provenance"));
  KV_RETURN_IF_ERROR(decode_provenance(prov, m.provenance));
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> arch, info.find("arch"));
  if (arch) {
    KV_ASSIGN_OR_RETURN(m.arch, arch->string());
  }
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> model, info.find("model"));
  if (model) {
    KV_ASSIGN_OR_RETURN(m.model, model_info(*model));
  }
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> chunking, info.find("chunking"));
  if (chunking) {
    KV_ASSIGN_OR_RETURN(m.cells_per_chunk, u32_or0(*chunking, "cells_per_chunk"));
  }
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> lossy, info.find("lossy"));
  m.lossy = lossy.has_value();
  m.info = std::move(j);
  return Status::OK();
}

Status decode_cells(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  SpanReader r(payload, name + ": CELL section");
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
      KV_RETURN_IF_ERROR(r.check_count(n, 8 + sec.ext_bytes, "cells"));
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
    c.codec = ChunkCodec(codec);
    c.filter = ChunkFilter(filter);
  }
  return Status::OK();
}

Status decode_digests(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m,
                      uint64_t& original_size) {
  SpanReader r(payload, name + ": DIGS section");
  KV_RETURN_IF_ERROR(r.bytes(m.original_sha256.data(), 32, "original SHA-256"));
  KV_RETURN_IF_ERROR(r.u64(original_size, "original size"));
  KV_RETURN_IF_ERROR(r.bytes(m.sections_sha256.data(), 32, "sections SHA-256"));
  if (!r.at_end()) return r.corrupt(std::to_string(r.remaining()) + " bytes after the digests");
  return Status::OK();
}

// The tables must describe one file: segments tile [0, size), frame segments
// tile the frame stream, tensor segments number their chunks in order after
// the frame chunks, and every chunk's raw size follows from the geometry.
Status check_tables(const std::string& name, const SnapshotManifest& m, uint64_t original_size) {
  auto bad = [&](const std::string& msg) { return Status::Corruption(name + ": " + msg); };
  const SegmentTable& t = m.segments;
  if (t.frame_chunk_bytes == 0 || t.frame_chunk_bytes > kMaxChunkRawBytes) {
    return bad("frame chunk size " + std::to_string(t.frame_chunk_bytes) + " is out of range");
  }
  // Ceiling division that cannot wrap: frame_bytes is the file's word, up to 2^64 - 1.
  const uint64_t frame_chunks = t.frame_bytes / t.frame_chunk_bytes + (t.frame_bytes % t.frame_chunk_bytes != 0);
  if (t.n_frame_chunks != frame_chunks) {
    return bad("frame chunk count " + std::to_string(t.n_frame_chunks) + " does not fit " +
               std::to_string(t.frame_bytes) + " frame bytes");
  }
  if (m.provenance.file_size != original_size) {
    return bad("INFO says the original has " + std::to_string(m.provenance.file_size) + " bytes, DIGS says " +
               std::to_string(original_size));
  }
  if (m.provenance.sha256 != m.original_sha256) return bad("INFO and DIGS disagree on the original's SHA-256");
  if (t.frame_bytes > original_size || t.n_frame_chunks > m.chunks.size()) {
    return bad(std::to_string(t.frame_bytes) + " frame bytes in " + std::to_string(t.n_frame_chunks) +
               " chunks do not fit a " + std::to_string(original_size) + "-byte original and " +
               std::to_string(m.chunks.size()) + " chunks");
  }
  // Readers size per-layer tables by the largest layer index: bound it by
  // what the table holds (every layer has at least one tensor segment).
  const uint64_t tensor_segments = uint64_t(std::count_if(
      t.segments.begin(), t.segments.end(), [](const Segment& s) { return s.kind != SegmentKind::kFrame; }));
  uint64_t at = 0, frame_at = 0, next_chunk = t.n_frame_chunks;
  for (size_t i = 0; i < t.segments.size(); ++i) {
    const Segment& s = t.segments[i];
    const std::string which = "segment " + std::to_string(i);
    if (s.kind != SegmentKind::kFrame && s.layer >= tensor_segments) {
      return bad(which + ": layer " + std::to_string(s.layer) + " is out of range (the table has " +
                 std::to_string(tensor_segments) + " tensor segments)");
    }
    if (s.file_offset != at) {
      return bad(which + " starts at " + std::to_string(s.file_offset) + ", expected " + std::to_string(at));
    }
    if (s.size == 0 || s.size > original_size - at) return bad(which + ": size " + std::to_string(s.size) + " is out of range");
    at += s.size;
    if (s.kind == SegmentKind::kFrame) {
      if (s.frame_offset != frame_at) return bad(which + ": frame offset out of order");
      frame_at += s.size;
      continue;
    }
    const uint64_t cc = s.cell_count, N = s.cells_per_chunk;
    if (cc == 0 || N == 0) return bad(which + ": zero cells or cells per chunk");
    if (m.cells.size() <= s.section || m.cells[s.section].streams.size() <= s.stream ||
        m.cells[s.section].streams[s.stream].size() != cc) {
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
    if (s.first_chunk != next_chunk) {
      return bad(which + ": first chunk " + std::to_string(s.first_chunk) + ", expected " + std::to_string(next_chunk));
    }
    // next_chunk <= chunks.size() here, so comparing before adding cannot wrap.
    if (s.n_chunks() > m.chunks.size() - next_chunk) return bad(which + ": chunks past the end of the chunk table");
    next_chunk += s.n_chunks();
  }
  if (at != original_size) return bad("segments cover " + std::to_string(at) + " of " + std::to_string(original_size) + " bytes");
  if (frame_at != t.frame_bytes) return bad("frame segments hold " + std::to_string(frame_at) + " of " + std::to_string(t.frame_bytes) + " frame bytes");
  if (next_chunk != m.chunks.size()) {
    return bad("the segments use " + std::to_string(next_chunk) + " chunks, the chunk table has " +
               std::to_string(m.chunks.size()));
  }
  // Chunk raw sizes from the geometry.
  auto check_chunk = [&](uint64_t i, uint64_t expect) -> Status {
    const ChunkRef& c = m.chunks[i];
    if (c.raw_size != expect) {
      return bad("chunk " + std::to_string(i) + ": raw size " + std::to_string(c.raw_size) + ", the segments say " +
                 std::to_string(expect));
    }
    if (c.stored_size < kBlobHeaderBytes || c.stored_size > c.raw_size + kMaxBlobOverhead) {
      return bad("chunk " + std::to_string(i) + ": stored size " + std::to_string(c.stored_size) + " is out of range");
    }
    return Status::OK();
  };
  for (uint64_t k = 0; k < t.n_frame_chunks; ++k) {
    KV_RETURN_IF_ERROR(check_chunk(k, std::min<uint64_t>(t.frame_chunk_bytes, t.frame_bytes - k * t.frame_chunk_bytes)));
  }
  for (const Segment& s : t.segments) {
    if (s.kind == SegmentKind::kFrame) continue;
    for (uint64_t k = 0; k < s.n_chunks(); ++k) KV_RETURN_IF_ERROR(check_chunk(s.first_chunk + k, s.chunk_raw_size(k)));
  }
  return Status::OK();
}

}  // namespace

Result<SnapshotManifest> parse_manifest(std::span<const std::byte> bytes, const std::string& name) {
  SpanReader r(bytes, name);
  std::array<uint8_t, 4> magic{};
  SnapshotManifest m;
  KV_RETURN_IF_ERROR(r.bytes(magic.data(), 4, "manifest magic"));
  if (magic != kManifestMagic) return Status::Corruption(name + ": not a kvsnap manifest (bad magic)");
  uint32_t n_sections = 0;
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
  KV_RETURN_IF_ERROR(r.u32(n_sections, "section count"));
  KV_RETURN_IF_ERROR(r.check_count(n_sections, kSectionHeaderBytes, "sections"));

  // First pass: the section directory; the digest is checked before any
  // section is decoded, so a damaged manifest reads as damaged.
  struct Sec {
    uint32_t tag, flags;
    size_t header_at;
    std::span<const std::byte> payload;
  };
  std::vector<Sec> secs;
  for (uint32_t i = 0; i < n_sections; ++i) {
    Sec s{};
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
  uint64_t original_size = 0;
  KV_RETURN_IF_ERROR(decode_digests(secs.back().payload, name, m, original_size));
  if (sha256_of(bytes.first(secs.back().header_at)) != m.sections_sha256) {
    return Status::Corruption(name + ": manifest digest mismatch: the manifest is damaged");
  }
  std::vector<uint32_t> seen;
  for (size_t i = 0; i + 1 < secs.size(); ++i) {
    const Sec& s = secs[i];
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
  KV_RETURN_IF_ERROR(check_tables(name, m, original_size));
  m.bytes.assign(bytes.begin(), bytes.end());
  m.manifest_sha256 = sha256_of(bytes);
  return m;
}

}  // namespace kvsnap
