// ggsn v6 session files of llama.cpp b3166 (era A): llama_state_save_file_internal and
// llama_state_get_data_internal of that build. After magic and version:
//
//   struct llama_hparams (raw, 152 bytes on LP64: 3 bools + pad, 15 u32, floats, enums)
//   u32 n_token, n_token x i32
//   size_t rng length + std::mt19937 as text
//   size_t n_outputs + n_outputs x i32, size_t n_logits + f32, size_t n_embd + f32
//   size_t kv_buf_size, u32 kv_head, u32 kv_size, u32 kv_used, u32 v_trans
//   per layer: K of kv_head cells, then V (rows; transposed: n_embd_v_gqa runs of kv_head elements)
//   kv_head x {i32 pos, size_t n_seq_id, n_seq_id x i32}   (empty cells too: pos -1, no ids)
//
// No type and no row size is stored: the widths come from the model, and the K/V
// types from kv_buf_size / kv_head, which fits exactly one pair of b3166's cache
// types for f16/f16, f32/f32, q8_0/q8_0... and several for others (q4_0 and
// iq4_nl have the same size): those are refused unless the pair is declared.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/byte_order.h"
#include "format/ggml_types.h"
#include "format/llama_state_internal.h"

namespace kvsnap::llama_state_detail {
namespace {

// LLAMA_MAX_RNG_STATE of b3166.
constexpr uint64_t kMaxRngState = 64 * 1024;

// b3166's -ctk/-ctv types (common.cpp, kv_cache_type_from_str).
constexpr GgmlType kB3166CacheTypes[] = {GgmlType::kF32,  GgmlType::kF16,   GgmlType::kQ8_0, GgmlType::kQ4_0,
                                         GgmlType::kQ4_1, GgmlType::kIQ4_NL, GgmlType::kQ5_0, GgmlType::kQ5_1};

uint32_t hp_u32(const std::vector<std::byte>& h, size_t off) { return load_le<uint32_t>(h.data() + off); }

// The fields of b3166's llama_hparams that fix the cache's shape, at their
// LP64 offsets, against the model; ssm_* must be 0 (Mamba caches are not
// modelled here).
Status check_hparams(const std::string& name, const std::vector<std::byte>& h, const MemoryShape& shape) {
  const MemoryShape::Hparams& m = *shape.hparams;
  struct Field {
    const char* name;
    size_t off;
    uint32_t want;
  };
  const Field fields[] = {{"n_vocab", 4, m.n_vocab},           {"n_embd", 12, m.n_embd},
                          {"n_head", 16, m.n_head},            {"n_head_kv", 20, m.n_head_kv},
                          {"n_layer", 24, m.n_layer},          {"n_embd_head_k", 32, m.n_embd_head_k},
                          {"n_embd_head_v", 36, m.n_embd_head_v}};
  std::string diff;
  for (const Field& f : fields) {
    const uint32_t got = hp_u32(h, f.off);
    if (got != f.want) {
      diff += std::string(diff.empty() ? "" : ", ") + f.name + " " + std::to_string(got) + " in the file, " +
              std::to_string(f.want) + " in the model";
    }
  }
  if (!diff.empty()) {
    return Status::Mismatch(name + ": wrong model: the session's llama_hparams (ggsn v6, b3166) do not match " +
                            shape.source + ": " + diff + "; pass the GGUF the file was saved with ({--model GGUF})");
  }
  if (hp_u32(h, 108) || hp_u32(h, 112) || hp_u32(h, 116)) {
    return Status::NotSupported(name + ": ggsn v6 of a state-space (Mamba) model: its recurrent cache in the legacy "
                                "dump is not supported");
  }
  // b3166 sizes every layer's rows as n_embd_head x n_head_kv; a model whose layers differ
  // today (per-layer head counts) was cached otherwise then.
  const KvSectionShape& ks = shape.kv_sections[0];
  const uint32_t nk = hp_u32(h, 32) * hp_u32(h, 20), nv = hp_u32(h, 36) * hp_u32(h, 20);
  for (size_t il = 0; il < ks.n_embd_k_gqa.size(); ++il) {
    if (ks.n_embd_k_gqa[il] != nk || ks.n_embd_v_gqa[il] != nv) {
      return Status::NotSupported(name + ": ggsn v6 (b3166) rows are n_embd_head x n_head_kv (" + std::to_string(nk) +
                                  "/" + std::to_string(nv) + ") in every layer, and " + shape.source +
                                  " gives layer " + std::to_string(il) + " " + std::to_string(ks.n_embd_k_gqa[il]) +
                                  "/" + std::to_string(ks.n_embd_v_gqa[il]) + ": not supported");
    }
  }
  return Status::OK();
}

// The (K, V) type pairs whose rows of kv_head cells make kv_buf_size.
std::vector<std::pair<int32_t, int32_t>> fitting_types(const KvSectionShape& s, uint64_t per_cell, bool v_trans) {
  std::vector<std::pair<int32_t, int32_t>> out;
  for (GgmlType k : kB3166CacheTypes) {
    for (GgmlType v : kB3166CacheTypes) {
      const TypeLayout& kt = *find_type(int32_t(k));
      const TypeLayout& vt = *find_type(int32_t(v));
      if (v_trans && vt.quantized) continue;  // b3166 transposes V only without flash attention: f16/f32
      uint64_t sum = 0;
      bool ok = true;
      for (size_t il = 0; il < s.n_embd_k_gqa.size() && ok; ++il) {
        auto kr = row_bytes(kt, s.n_embd_k_gqa[il]);
        auto vr = row_bytes(vt, s.n_embd_v_gqa[il]);
        ok = kr.ok() && vr.ok();
        if (ok) sum += *kr + *vr;
      }
      if (ok && sum == per_cell) out.emplace_back(int32_t(k), int32_t(v));
    }
  }
  return out;
}

std::string pair_name(std::pair<int32_t, int32_t> p) { return type_name(p.first) + "/" + type_name(p.second); }

// The outputs block of v8/v9 with a size_t count.
Status read_outputs_v6(Cursor& c, SessionOutputs& o) {
  const uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(uint64_t n, c.u64("output count"));
  return read_output_arrays(c, at, n, o);
}

Result<std::string> read_rng_v6(Cursor& c) {
  const uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(uint64_t len, c.u64("RNG state length"));
  if (len == 0 || len > kMaxRngState) {
    return c.corrupt(at, "RNG state length " + std::to_string(len) + " is out of range (1.." +
                             std::to_string(kMaxRngState) + ")");
  }
  std::string s(len, '\0');
  KV_RETURN_IF_ERROR(c.read(s.data(), len, "RNG state"));
  for (char ch : s) {
    if (ch != ' ' && (ch < '0' || ch > '9')) return c.corrupt(at, "RNG state is not decimal words");
  }
  return s;
}

// The K/V pair: the declared one (it must fit), else the only one that fits.
Result<std::pair<int32_t, int32_t>> choose_types(const std::string& name, const KvSectionShape& s, uint64_t per_cell,
                                                 bool v_trans, const ParseOptions& opts, std::string& how) {
  const auto fits = fitting_types(s, per_cell, v_trans);
  std::string list;
  for (const auto& p : fits) list += (list.empty() ? "" : ", ") + pair_name(p);
  if (opts.legacy_kv_types) {
    for (const auto& p : fits) {
      if (p == *opts.legacy_kv_types) {
        how = "K/V types " + pair_name(p) + " as declared (the sizes fit " + list + ")";
        return p;
      }
    }
    return Status::Mismatch(name + ": the declared K/V types " + pair_name(*opts.legacy_kv_types) +
                            " do not fit this ggsn v6 session (" + std::to_string(per_cell) +
                            " bytes per cell over the model's layers fit " + (list.empty() ? "none" : list) + ")");
  }
  if (fits.size() == 1) {
    how = "K/V types " + list + " inferred from kv_buf_size (the only pair of b3166's cache types that fits)";
    return fits[0];
  }
  if (fits.empty()) {
    return Status::Mismatch(name + ": ggsn v6: " + std::to_string(per_cell) +
                            " bytes per cell (kv_buf_size / kv_head) fit no pair of b3166's cache types (f32 f16 "
                            "q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1) over the model's layers: wrong model, or not b3166");
  }
  return Status::Ambiguous(name + ": ggsn v6 (b3166) records no K/V types, and its " + std::to_string(per_cell) +
                           " bytes per cell fit " + std::to_string(fits.size()) + " pairs: " + list +
                           ". kvsnap does not guess: name the pair the session was saved with ({--src-types K/V}), or "
                           "load it in b3166 and save a sequence (ggsq v1) file, which records its types");
}

// The layers of the dump: per layer K of n cells, then V.
Status read_dump_layers(Cursor& c, const KvSectionShape& s, std::pair<int32_t, int32_t> types, KvStream& st) {
  const TypeLayout& kt = *find_type(types.first);
  const TypeLayout& vt = *find_type(types.second);
  const uint64_t n = st.cell_count;
  st.layers.resize(st.n_layer);
  for (uint32_t il = 0; il < st.n_layer; ++il) {
    KvLayer& L = st.layers[il];
    L.k_type = types.first;
    L.v_type = types.second;
    L.k_row_bytes = *row_bytes(kt, s.n_embd_k_gqa[il]);
    L.k = {c.offset(), n * L.k_row_bytes};
    KV_RETURN_IF_ERROR(c.skip(n, L.k_row_bytes, "key rows"));
    if (st.v_trans) {
      L.v_elem_bytes = vt.block_bytes;
      L.n_embd_v_gqa = s.n_embd_v_gqa[il];
      L.v = {c.offset(), n * L.n_embd_v_gqa * L.v_elem_bytes};
      KV_RETURN_IF_ERROR(c.skip(uint64_t(L.n_embd_v_gqa) * n, L.v_elem_bytes, "transposed value data"));
    } else {
      L.v_row_bytes = *row_bytes(vt, s.n_embd_v_gqa[il]);
      L.v = {c.offset(), n * L.v_row_bytes};
      KV_RETURN_IF_ERROR(c.skip(n, L.v_row_bytes, "value rows"));
    }
  }
  return Status::OK();
}

// kv_head x {i32 pos, size_t n_seq_id, ids}; cells without a sequence are counted.
Status read_dump_cells(Cursor& c, KvStream& st, uint32_t& empty) {
  if (st.cell_count > c.remaining() / 12) {
    return c.corrupt("truncated: " + std::to_string(st.cell_count) + " cells need at least 12 bytes each, " +
                     std::to_string(c.remaining()) + " remain");
  }
  st.cells.resize(st.cell_count);
  for (uint32_t i = 0; i < st.cell_count; ++i) {
    CellMeta& m = st.cells[i];
    KV_ASSIGN_OR_RETURN(m.pos, c.i32("cell position"));
    const uint64_t at = c.offset();
    KV_ASSIGN_OR_RETURN(uint64_t n_seq, c.u64("cell seq id count"));
    if (n_seq > kMaxSeqIdsPerCell) {
      return c.corrupt(at, "cell " + std::to_string(i) + ": " + std::to_string(n_seq) + " sequence ids is absurd");
    }
    if (n_seq > c.remaining() / 4) return c.corrupt(at, "truncated: cell seq ids");
    m.seq_ids.resize(n_seq);
    for (int32_t& id : m.seq_ids) {
      KV_ASSIGN_OR_RETURN(id, c.i32("cell seq id"));
    }
    if (m.seq_ids.empty()) ++empty;
  }
  return Status::OK();
}

}  // namespace

Status read_session_v6(Cursor& c, const ParseOptions& opts, StateFile& f) {
  const std::string& name = c.file().name();
  const MemoryShape* shape = opts.shape;
  f.kind = StateKind::kSessionFile;
  LegacySession& lg = f.legacy.emplace();
  lg.hparams.resize(kB3166HparamsBytes);
  KV_RETURN_IF_ERROR(c.read(lg.hparams.data(), kB3166HparamsBytes, "llama_hparams"));
  if (!shape || !shape->kv_sections_known) {
    return Status::NotSupported(name + ": ggsn v6 session (llama.cpp b3166, era A): pass its model with {--model GGUF} "
                                "(the file records neither the cache types nor the row sizes of its legacy KV dump)");
  }
  if (shape->kv_sections.size() != 1 || shape->has_recurrent) {
    return Status::NotSupported(name + ": a ggsn v6 session (b3166) holds one plain KV cache, and " + shape->source +
                                " has another memory layout");
  }
  // A snapshot's manifest gives the widths and types but not the model's hparams.
  if (shape->hparams) {
    KV_RETURN_IF_ERROR(check_hparams(name, lg.hparams, *shape));
    f.arch = shape->hparams->arch;  // not in the file; later session formats need it
  }
  const KvSectionShape& ks = shape->kv_sections[0];
  KV_RETURN_IF_ERROR(read_tokens(c, f.tokens, /*allow_packed=*/false));
  KV_ASSIGN_OR_RETURN(f.rng, read_rng_v6(c));
  KV_RETURN_IF_ERROR(read_outputs_v6(c, f.outputs.emplace()));

  const uint64_t dump_at = c.offset();
  KV_ASSIGN_OR_RETURN(uint64_t kv_buf_size, c.u64("kv_buf_size"));
  KvSection sec;
  sec.stream_prefix = false;
  sec.range.offset = dump_at;
  KvStream& st = sec.streams.emplace_back();
  KV_ASSIGN_OR_RETURN(st.cell_count, c.u32("kv_head"));
  KV_ASSIGN_OR_RETURN(lg.kv_size, c.u32("kv_size"));
  KV_ASSIGN_OR_RETURN(lg.kv_used, c.u32("kv_used"));
  uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(st.v_trans, c.u32("v_trans"));
  if (st.v_trans > 1) return c.corrupt(at, "v_trans is " + std::to_string(st.v_trans) + ", expected 0 or 1");
  if (st.cell_count > lg.kv_size) {
    return c.corrupt(dump_at + 8, "kv_head " + std::to_string(st.cell_count) + " exceeds kv_size " +
                                      std::to_string(lg.kv_size));
  }
  std::string how = "empty cache";
  if (st.cell_count == 0) {
    if (kv_buf_size != 0) return c.corrupt(dump_at, "kv_buf_size " + std::to_string(kv_buf_size) + " with kv_head 0");
  } else {
    if (kv_buf_size == 0 || kv_buf_size % st.cell_count != 0) {
      return c.corrupt(dump_at, "kv_buf_size " + std::to_string(kv_buf_size) +
                                    " is not a positive multiple of kv_head " +
                                    std::to_string(st.cell_count));
    }
    st.n_layer = uint32_t(ks.n_embd_k_gqa.size());
    KV_ASSIGN_OR_RETURN(auto types, choose_types(name, ks, kv_buf_size / st.cell_count, st.v_trans == 1, opts, how));
    KV_RETURN_IF_ERROR(read_dump_layers(c, ks, types, st));
  }
  KV_RETURN_IF_ERROR(read_dump_cells(c, st, lg.empty_cells));
  if (!c.at_end()) return c.corrupt(std::to_string(c.remaining()) + " bytes remain after the session's cell list");
  sec.range.size = c.offset() - dump_at;
  f.memory.range = sec.range;
  f.memory.kv.push_back(std::move(sec));
  f.reading = "ggsn v6 (b3166): legacy KV dump of " + std::to_string(st.cell_count) + " cells (kv_size " +
              std::to_string(lg.kv_size) + (lg.empty_cells ? ", " + std::to_string(lg.empty_cells) + " empty" : "") +
              "), " + how + ", V " + (st.v_trans ? "transposed" : "rows") + " (from " + shape->source + ")";
  return Status::OK();
}

// A v6 dump records no K/V types: b3166 reads it with its context's, and kvsnap by size (choose_types,
// or as declared, --src-types, where sizes fit several pairs as real b3166 files do). So the pair
// written must be one b3166 has, the same in every layer: bf16, which b3166 lacks, written as bytes
// read back as f16 with exit 0 before this check (a review's finding).
static Status check_v6_types(const KvStream& st) {
  if (st.layers.empty()) return Status::OK();
  const int32_t k = st.layers[0].k_type, v = st.layers[0].v_type;
  auto known = [](int32_t t) {
    return std::find(std::begin(kB3166CacheTypes), std::end(kB3166CacheTypes), GgmlType(t)) != std::end(kB3166CacheTypes);
  };
  if (!known(k) || !known(v)) {
    return Status::NotSupported("writer: llama.cpp b3166 has no " + type_name(k) + "/" + type_name(v) +
                                " cache (its types: f32 f16 q8_0 q4_0 q4_1 iq4_nl q5_0 q5_1), and a ggsn v6 session "
                                "records none: choose one of those, or another {--format}");
  }
  for (const KvLayer& L : st.layers) {
    if (L.k_type != k || L.v_type != v) return Status::NotSupported("writer: a ggsn v6 session has one K/V type pair");
  }
  return Status::OK();
}

Status write_session_v6(const StateFile& f, TensorSource& tensors, const ReadableFile& opaque_src, ByteSink& out) {
  if (!f.legacy || f.legacy->hparams.size() != kB3166HparamsBytes) {
    return Status::NotSupported("writer: a ggsn v6 session (b3166) starts with that model's raw llama_hparams, which "
                                "only an era-A session can give (convert one ggsn v6 file to another)");
  }
  if (f.memory.kv.size() != 1 || f.memory.kv[0].streams.size() != 1 || f.memory.recurrent ||
      f.memory.kv[0].ext_bytes) {
    return Status::InvalidArgument("writer: a ggsn v6 session holds one KV section of one stream, without cell extras");
  }
  const KvStream& st = f.memory.kv[0].streams[0];
  if (st.cells.size() != st.cell_count || (st.cell_count && st.layers.empty())) {
    return Status::InvalidArgument("writer: a ggsn v6 session needs its layers and cell list");
  }
  KV_RETURN_IF_ERROR(check_v6_types(st));
  const LegacySession& lg = *f.legacy;
  KV_RETURN_IF_ERROR(out.append(lg.hparams));
  KV_RETURN_IF_ERROR(write_words(f.tokens.words, out));
  KV_RETURN_IF_ERROR(write_u64(out, f.rng.size()));
  KV_RETURN_IF_ERROR(out.append(f.rng.data(), f.rng.size()));
  const SessionOutputs o = f.outputs.value_or(SessionOutputs{});
  KV_RETURN_IF_ERROR(write_u64(out, o.n_outputs));
  KV_RETURN_IF_ERROR(copy_range(opaque_src, o.output_pos, out));
  KV_RETURN_IF_ERROR(write_u64(out, o.logits_size));
  KV_RETURN_IF_ERROR(copy_range(opaque_src, o.logits, out));
  KV_RETURN_IF_ERROR(write_u64(out, o.embd_size));
  KV_RETURN_IF_ERROR(copy_range(opaque_src, o.embd, out));
  const uint64_t n = st.cell_count;
  uint64_t kv_buf_size = 0;
  for (const KvLayer& L : st.layers) {
    if (!L.has_v) return Status::InvalidArgument("writer: every layer of a ggsn v6 dump has V");
    kv_buf_size += n * L.k_row_bytes + (st.v_trans ? n * L.n_embd_v_gqa * uint64_t(L.v_elem_bytes) : n * L.v_row_bytes);
  }
  if (st.cell_count == 0) kv_buf_size = 0;
  std::vector<std::byte> meta;
  put_u64(meta, kv_buf_size);
  put_u32(meta, st.cell_count);
  put_u32(meta, std::max(lg.kv_size, st.cell_count));
  put_u32(meta, lg.kv_used);
  put_u32(meta, st.v_trans);
  KV_RETURN_IF_ERROR(out.append(meta));
  if (st.cell_count) {
    for (size_t il = 0; il < st.layers.size(); ++il) {
      const KvLayer& L = st.layers[il];
      KV_RETURN_IF_ERROR(emit_checked(f, tensors, {0, 0, il, false}, n * L.k_row_bytes, out));
      const uint64_t v = st.v_trans ? n * L.n_embd_v_gqa * uint64_t(L.v_elem_bytes) : n * L.v_row_bytes;
      KV_RETURN_IF_ERROR(emit_checked(f, tensors, {0, 0, il, true}, v, out));
    }
  }
  meta.clear();
  for (const CellMeta& m : st.cells) {
    put_i32(meta, m.pos);
    put_u64(meta, m.seq_ids.size());
    for (int32_t id : m.seq_ids) put_i32(meta, id);
    if (meta.size() >= (1 << 16)) {
      KV_RETURN_IF_ERROR(out.append(meta));
      meta.clear();
    }
  }
  return out.append(meta);
}

}  // namespace kvsnap::llama_state_detail
