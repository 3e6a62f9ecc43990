// Reads llama.cpp state files of every era: the header of each kind (ggsq,
// ggsn, raw seq / context buffers), the token words, and the memory section
// (its KV sections, read by kv_section.cc, and the recurrent state), trying each
// plausible layout of an era and keeping the one that spans the file. The writer
// is in llama_state_write.cc, the packed server token payload in token_payload.cc.
#include "format/llama_state.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "base/text.h"
#include "format/cursor.h"
#include "format/ggml_types.h"
#include "format/llama_state_internal.h"

namespace kvsnap {

using namespace llama_state_detail;

namespace {

// Bounds on header fields (the KV section's are in llama_state_internal.h).
constexpr uint32_t kMaxArchName = 256;
// std::mt19937 as text: 624 state words and the index, about 7 KB.
constexpr uint32_t kMaxRngText = 1u << 16;

// The recurrent section is always last, so its extent is known; its inside is
// parsed only to describe it. Layout (llama_memory_recurrent::state_write):
// u32 cell_count, cells {i32 pos, u32 n_seq, n_seq x i32}, u32 s_trans,
// u32 n_layer, then per recurrent layer {i32 type, u64 row, rows} for r, then
// the same for s (s_trans 0). Some archs add p rows: then it stays opaque.
Status parse_recurrent(Cursor& c, RecurrentSection& rec, const MemoryShape* shape) {
  rec.range = {c.offset(), c.remaining()};
  KV_ASSIGN_OR_RETURN(rec.cell_count, c.u32("recurrent cell count"));
  // A section cut after its count (kvsnap's writers' old habit): only where the model says the
  // memory has a recurrent part. Without it, four zero bytes after a plain state are trailing bytes,
  // not an empty recurrent state (a review's finding: read as one, exit 0).
  if (rec.cell_count == 0 && c.at_end() && shape && shape->recurrent_known && shape->has_recurrent) {
    rec.understood = true;
    return Status::OK();
  }
  // An empty state is written whole: llama.cpp (every release, llama_memory_recurrent::state_write)
  // writes s_trans, the layer count and each tensor's type and row size after no cells, with no rows.
  // (An empty hybrid slot, as llama-server 3.22.1 saves it: RecurrentState.AnEmptyOneIsWrittenWholeAndReads,
  // and oracle.server_flows on the real one.)
  std::vector<CellMeta> cells;
  KV_RETURN_IF_ERROR(parse_cells(c, rec.cell_count, 0, cells));
  uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(rec.s_trans, c.u32("recurrent s_trans"));
  if (rec.s_trans > 1) return c.corrupt(at, "recurrent s_trans is " + std::to_string(rec.s_trans));
  at = c.offset();
  KV_ASSIGN_OR_RETURN(rec.n_layer, c.u32("recurrent layer count"));
  if (rec.n_layer == 0 || rec.n_layer > kMaxLayers) {
    return c.corrupt(at, "recurrent layer count " + std::to_string(rec.n_layer) + " is out of range");
  }
  const uint64_t after_header = c.offset();
  // Walk {type, row, rows} entries to the end; an even count that lands
  // exactly on the end is understood. Anything else is carried opaque.
  uint32_t entries = 0;
  while (!c.at_end() && rec.s_trans == 0) {
    if (c.remaining() < 12) break;
    auto type = c.i32("recurrent type");
    if (!type.ok() || !find_type(*type)) break;
    auto row = c.u64("recurrent row size");
    if (!row.ok() || *row > kMaxRowBytes) break;  // 0 is valid: lfm2 has no s state
    if (!c.skip(rec.cell_count, *row, "recurrent rows").ok()) break;
    ++entries;
  }
  rec.n_entries = entries;
  rec.understood = c.at_end() && entries > 0 && entries % 2 == 0 && entries / 2 <= rec.n_layer;
  if (shape && !shape->recurrent_row_elems.empty()) {
    // The model knows: exactly its tensors, in its order, with its widths.
    if (shape->recurrent_n_layer && *shape->recurrent_n_layer != rec.n_layer) {
      return Status::Mismatch(c.file().name() + ": recurrent state: mismatched layer count (" +
                              std::to_string(rec.n_layer) + " != " + std::to_string(*shape->recurrent_n_layer) +
                              " from the model): pass the GGUF the file was saved with ({--model GGUF})");
    }
    Cursor w(c.file(), rec.range.offset, rec.range.offset + rec.range.size);
    KV_RETURN_IF_ERROR(w.seek(after_header));
    for (size_t i = 0; i < shape->recurrent_row_elems.size(); ++i) {
      const uint64_t at = w.offset();
      KV_ASSIGN_OR_RETURN(int32_t type, w.i32("recurrent type"));
      KV_ASSIGN_OR_RETURN(uint64_t row, w.u64("recurrent row size"));
      const TypeLayout* t = find_type(type);
      auto expect = t ? row_bytes(*t, shape->recurrent_row_elems[i]) : Result<uint64_t>(Status::Mismatch("type"));
      if (!expect.ok() || *expect != row) {
        return w.corrupt(at, "recurrent tensor " + std::to_string(i) + ": row size " + std::to_string(row) +
                                 " does not match the model (" + std::to_string(shape->recurrent_row_elems[i]) +
                                 " values of " + type_name(type) + ")");
      }
      KV_RETURN_IF_ERROR(w.skip(rec.cell_count, row, "recurrent rows"));
    }
    if (!w.at_end()) return w.corrupt(std::to_string(w.remaining()) + " bytes remain after the recurrent state");
    rec.understood = true;
  }
  return Status::OK();
}

// Parses the sections after the first KV section (which `mem` already holds,
// unless r.n_kv == 0) and checks that nothing is left over.
// `from`: the KV sections before it are parsed already (the first, shared by readings: FirstKv).
Status parse_memory_rest(Cursor& c, const Reading& r, const MemoryShape* shape, int from, MemorySection& mem) {
  for (int si = from; si < r.n_kv; ++si) {
    const KvSectionShape* ss = nullptr;
    if (shape && shape->kv_sections_known && size_t(si) < shape->kv_sections.size()) ss = &shape->kv_sections[si];
    KvSection sec;
    KV_RETURN_IF_ERROR(parse_kv_section(c, r, ss, si, r.n_kv, sec));
    mem.kv.push_back(std::move(sec));
  }
  if (r.recurrent) {
    RecurrentSection rec;
    KV_RETURN_IF_ERROR(parse_recurrent(c, rec, shape));
    // Without the model, accept the tail as recurrent state only when its
    // structure parsed; with a model that says "hybrid", carry it regardless.
    const bool opaque_ok = shape && shape->recurrent_known && shape->has_recurrent && shape->recurrent_opaque_ok;
    if (!rec.understood && !opaque_ok) {
      return c.corrupt(rec.range.offset, "the bytes after the KV section do not parse as recurrent state");
    }
    KV_RETURN_IF_ERROR(c.seek(c.end()));
    mem.recurrent = rec;
  }
  if (!c.at_end()) {
    std::string hint = r.n_kv == 1 && !r.recurrent ? " (a second KV section (iSWA) or recurrent state? {--model} tells)" : "";
    return c.corrupt(std::to_string(c.remaining()) + " bytes remain after the memory section" + hint);
  }
  mem.range.size = c.offset() - mem.range.offset;
  return Status::OK();
}

// `tagged_raw`: a llama_state_seq_get_data buffer with the io magic, which
// b9842..b10375 already write before a v2 memory section (8-byte cell ext).
std::vector<Reading> candidate_readings(uint32_t era, const MemoryShape* shape, bool tagged_raw) {
  std::vector<bool> prefixes = era >= 3 ? std::vector<bool>{true} : std::vector<bool>{true, false};
  std::vector<uint32_t> exts;
  if (era < 3) {
    // ggsq v2 / ggsn v9: no cell ext up to b8189; {x, y} (8 bytes) for M-RoPE
    // models from b8352 (docs/llama-formats.md, "Eras"). A model without the
    // ext never has one; the structure decides between 0 and 8 otherwise.
    exts = shape && shape->ext_bytes == 0u ? std::vector<uint32_t>{0} : std::vector<uint32_t>{0, 8};
  } else if (shape && shape->ext_bytes) {
    exts = {*shape->ext_bytes};
    if (tagged_raw && *shape->ext_bytes == 12) exts.push_back(8);
  } else if (era >= 3) {
    // ggsq v3 / ggsn v10 (b10645 on) carry {x, y, tok} or nothing; 8 bytes only in a tagged raw
    // buffer (a review's finding: a v3 file of 8-byte cells read as era H, which no build loads).
    exts = tagged_raw ? std::vector<uint32_t>{0, 12, 8} : std::vector<uint32_t>{0, 12};
  }
  std::vector<std::pair<int, bool>> layouts;
  if (shape && shape->kv_sections_known && shape->recurrent_known) {
    layouts = {{int(shape->kv_sections.size()), shape->has_recurrent}};
  } else {
    // Without the model: plain, iSWA, and hybrid (KV then recurrent). A
    // recurrent-only memory is byte-for-byte the shape of a KV section without
    // the n_stream prefix, so it is only read as such when the model says so.
    layouts = {{1, false}, {2, false}, {1, true}, {2, true}};
  }
  std::vector<Reading> out;
  for (bool p : prefixes) {
    for (uint32_t e : exts) {
      if (!p && e != 0) continue;  // b5640 wrote no cell ext
      for (auto [n, rec] : layouts) {
        // b5640 had no hybrid memory; its second KV section has no prefix and
        // would read as recurrent state.
        if (!p && rec && !(shape && shape->recurrent_known)) continue;
        out.push_back(Reading{p, e, n, rec});
      }
    }
  }
  return out;
}

struct Attempt {
  Reading reading;
  Status status;
  uint64_t reached = 0;
  MemorySection mem;
  bool past_first_kv = false;  // its first KV section parsed (there was one)
};

// The first KV section reads the same for every layout that shares the
// stream prefix and cell ext: it is parsed once per such pair.
struct FirstKv {
  bool prefix;
  uint32_t ext;
  Status status;
  uint64_t reached;
  KvSection sec;
};

FirstKv& first_kv_section(const ReadableFile& file, uint64_t begin, const Reading& r, const MemoryShape* shape,
                          std::vector<FirstKv>& firsts) {
  auto it = std::find_if(firsts.begin(), firsts.end(),
                         [&](const FirstKv& f) { return f.prefix == r.stream_prefix && f.ext == r.ext_bytes; });
  if (it != firsts.end()) return *it;
  Cursor c(file, begin, file.size());
  FirstKv f{r.stream_prefix, r.ext_bytes, Status::OK(), 0, {}};
  const KvSectionShape* ss = nullptr;
  if (shape && shape->kv_sections_known && !shape->kv_sections.empty()) ss = &shape->kv_sections[0];
  f.status = parse_kv_section(c, r, ss, 0, r.n_kv, f.sec);
  f.reached = c.offset();
  firsts.push_back(std::move(f));
  return firsts.back();
}

// Reads the memory section at `begin` the way reading r says. The first KV section, parsed once for
// every reading of its (prefix, ext) pair, joins the attempt only if the rest reads: moved when no
// later reading shares the pair (`last_of_pair`; candidate_readings lists them together), else
// copied. A hostile file of millions of cells held one copy of its cell list per reading (a
// review's finding: 21 times the file's size in memory).
Attempt attempt_reading(const ReadableFile& file, uint64_t begin, const Reading& r, const MemoryShape* shape,
                        std::vector<FirstKv>& firsts, bool last_of_pair) {
  Attempt a{r, Status::OK(), 0, {}};
  a.mem.range.offset = begin;
  uint64_t resume = begin;
  FirstKv* first = nullptr;
  if (r.n_kv > 0) {
    first = &first_kv_section(file, begin, r, shape, firsts);
    if (!first->status.ok()) {
      a.status = first->status;
      a.reached = first->reached;
      return a;
    }
    a.past_first_kv = true;
    resume = first->reached;
  }
  Cursor c(file, begin, file.size());
  a.status = c.seek(resume);
  if (a.status.ok()) a.status = parse_memory_rest(c, r, shape, first ? 1 : 0, a.mem);
  a.reached = c.offset();
  if (a.status.ok() && first)
    a.mem.kv.insert(a.mem.kv.begin(), last_of_pair ? std::move(first->sec) : first->sec);
  return a;
}

// Readings that differ only in the cell ext of sections without cells are
// the same reading.
bool same_reading(const Attempt& a, const Attempt& o) {
  if (o.mem.kv.size() != a.mem.kv.size() || o.reading.recurrent != a.reading.recurrent ||
      o.reading.stream_prefix != a.reading.stream_prefix)
    return false;
  for (size_t i = 0; i < a.mem.kv.size(); ++i) {
    if (o.mem.kv[i].range.size != a.mem.kv[i].range.size) return false;
    for (const auto& st : a.mem.kv[i].streams)
      if (st.cell_count && o.mem.kv[i].ext_bytes != a.mem.kv[i].ext_bytes) return false;
  }
  return true;
}

// The error worth showing: the furthest among readings whose first KV
// section parsed; when none did, the most common layout's (readings are in
// order of likelihood), not a wrong reading that wandered further in garbage.
class FailurePicker {
 public:
  void consider(Attempt a) {
    if (!a.past_first_kv) {
      if (!primary_) primary_ = std::move(a);
      return;
    }
    if (!best_ || a.reached > best_->reached ||
        (a.status.code() == Code::kMismatch && best_->status.code() != Code::kMismatch)) {
      best_ = std::move(a);
    }
  }
  const Status& status() const { return best_ ? best_->status : primary_->status; }

 private:
  std::optional<Attempt> best_, primary_;
};

// The outcome of trying every reading: the one that fits, else why none or
// several do.
Status settle_reading(const ReadableFile& file, const MemoryShape* shape, size_t n_readings, std::vector<Attempt>& ok,
                      const FailurePicker& failures, StateFile& out) {
  if (ok.size() == 1) {
    out.memory = std::move(ok[0].mem);
    out.reading = ok[0].reading.describe();
    if (shape) out.reading += " (from " + shape->source + ")";
    return Status::OK();
  }
  if (ok.size() > 1) {
    std::string list;
    for (const auto& a : ok) list += "\n  - " + a.reading.describe();
    return Status::Ambiguous(file.name() + ": the memory section fits " + std::to_string(ok.size()) +
                             " layouts:" + list +
                             "\nllama.cpp state files do not say which; pass the model with {--model GGUF}");
  }
  Status s = failures.status();
  if (!shape && n_readings > 1) {
    return s.Prefixed("cannot read the memory section (tried " + std::to_string(n_readings) +
                      " layouts; {--model GGUF} makes the layout exact)");
  }
  return s;
}

Status read_memory(const ReadableFile& file, uint64_t begin, uint32_t era, const MemoryShape* shape,
                   StateFile& out) {
  const std::vector<Reading> readings =
      candidate_readings(era, shape, out.kind == StateKind::kRawSeq && out.raw_seq_tagged);
  std::vector<Attempt> ok;
  FailurePicker failures;
  std::vector<FirstKv> firsts;
  for (size_t i = 0; i < readings.size(); ++i) {
    const Reading& r = readings[i];
    const bool last_of_pair = i + 1 == readings.size() || readings[i + 1].stream_prefix != r.stream_prefix ||
                              readings[i + 1].ext_bytes != r.ext_bytes;
    Attempt a = attempt_reading(file, begin, r, shape, firsts, last_of_pair);
    if (last_of_pair) {
      std::erase_if(firsts, [&](const FirstKv& f) { return f.prefix == r.stream_prefix && f.ext == r.ext_bytes; });
    }
    if (!a.status.ok()) {
      a.mem = {};  // only its status and how far it read are shown (its later sections)
      failures.consider(std::move(a));
    } else if (std::none_of(ok.begin(), ok.end(), [&](const Attempt& o) { return same_reading(a, o); })) {
      ok.push_back(std::move(a));
    }
  }
  return settle_reading(file, shape, readings.size(), ok, failures, out);
}

// ggsq v1 (llama.cpp b3166, llama_state_seq_get_data_internal), after the
// tokens: u32 sizeof(size_t) (8), u32 cell_count, u32 n_layer, u32 n_embd_v_gqa,
// cell_count x i32 pos (no seq ids), per layer {i32 k_type, u64 k_row, rows},
// then per layer V rows {i32 type, u64 row, rows} or, with transposed V (no
// flag: the u64 is the element size then), {i32 type, u64 element size,
// n_embd_v_gqa x cell_count elements}. Layers are written even without cells.
Status read_seq_v1(Cursor& c, const MemoryShape* shape, StateFile& f) {
  KvSection sec;
  sec.stream_prefix = false;
  sec.range.offset = c.offset();
  KvStream& st = sec.streams.emplace_back();
  uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(uint32_t size_t_size, c.u32("size_t width"));
  if (size_t_size != 8) {
    return c.corrupt(at, "size_t width " + std::to_string(size_t_size) + " (a 64-bit llama.cpp b3166 writes 8)");
  }
  KV_ASSIGN_OR_RETURN(st.cell_count, c.u32("cell count"));
  at = c.offset();
  KV_ASSIGN_OR_RETURN(st.n_layer, c.u32("layer count"));
  if (st.n_layer == 0 || st.n_layer > kMaxLayers) {
    return c.corrupt(at, "layer count " + std::to_string(st.n_layer) + " is out of range (1.." +
                             std::to_string(kMaxLayers) + ")");
  }
  at = c.offset();
  KV_ASSIGN_OR_RETURN(uint32_t n_embd_v, c.u32("value embedding size"));
  if (n_embd_v == 0 || n_embd_v > kMaxEmbd) {
    return c.corrupt(at, "n_embd_v_gqa " + std::to_string(n_embd_v) + " is out of range");
  }
  const KvSectionShape* ss = shape && shape->kv_sections_known && !shape->kv_sections.empty() ? &shape->kv_sections[0]
                                                                                               : nullptr;
  if (ss && !ss->n_embd_k_gqa.empty() && ss->n_embd_k_gqa.size() != st.n_layer) {
    return Status::Mismatch(c.file().name() + ": mismatched layer count (" + std::to_string(st.n_layer) +
                            " in the file, " + std::to_string(ss->n_embd_k_gqa.size()) +
                            " in the model): pass the GGUF the file was saved with ({--model GGUF})");
  }
  for (uint32_t v : ss ? ss->n_embd_v_gqa : std::vector<uint32_t>{}) {
    if (v != n_embd_v) {
      return Status::Mismatch(c.file().name() + ": offset " + std::to_string(at) + ": mismatched value embedding size (" +
                              std::to_string(n_embd_v) + " != " + std::to_string(v) + " from the model): pass the GGUF the file was saved with ({--model GGUF})");
    }
  }
  if (st.cell_count > c.remaining() / 4) return c.corrupt("truncated: " + std::to_string(st.cell_count) + " cells");
  st.cells.resize(st.cell_count);
  for (CellMeta& m : st.cells) {
    KV_ASSIGN_OR_RETURN(m.pos, c.i32("cell position"));
  }
  const uint64_t n_cells = st.cell_count;
  KV_RETURN_IF_ERROR(read_k_layers(c, ss, 0, 1, 0, st));
  for (uint32_t il = 0; il < st.n_layer; ++il) {
    KvLayer& L = st.layers[il];
    const std::string ctx = where(0, 1, 0, il);
    c.header_before_bulk(kLayerHeaderBytes);
    KV_ASSIGN_OR_RETURN(L.v_type, read_type(c, ctx, "value"));
    const TypeLayout& vt = *find_type(L.v_type);
    at = c.offset();
    KV_ASSIGN_OR_RETURN(uint64_t x, c.u64("value row or element size"));
    auto row = row_bytes(vt, n_embd_v);
    // rows: x = the row of n_embd_v_gqa values; transposed: x = one element
    // (the same number only when n_embd_v_gqa is 1, where both layouts agree)
    const bool trans = x != (row.ok() ? *row : 0) && vt.block_elems == 1 && x == vt.block_bytes;
    if (il == 0) st.v_trans = trans ? 1 : 0;
    if (trans != (st.v_trans == 1) || (!trans && (!row.ok() || x != *row))) {
      return c.corrupt(at, ctx + ": value size " + std::to_string(x) + " is neither the row of " +
                               std::to_string(n_embd_v) + " " + std::string(vt.name) + " values nor, with " +
                               (st.v_trans ? "" : "un") + "transposed V, one element");
    }
    L.v.offset = c.offset();
    if (trans) {
      L.v_elem_bytes = uint32_t(x);
      L.n_embd_v_gqa = n_embd_v;
      KV_RETURN_IF_ERROR(c.skip(uint64_t(n_embd_v) * n_cells, x, "transposed value data"));
      L.v.size = uint64_t(n_embd_v) * n_cells * x;
    } else {
      L.v_row_bytes = x;
      KV_RETURN_IF_ERROR(c.skip(n_cells, x, "value rows"));
      L.v.size = n_cells * x;
    }
  }
  if (!c.at_end()) return c.corrupt(std::to_string(c.remaining()) + " bytes remain after the sequence state");
  sec.range.size = c.offset() - sec.range.offset;
  f.memory.range = sec.range;
  f.memory.kv.push_back(std::move(sec));
  f.reading = "ggsq v1 (b3166): 1 KV section, cells without seq ids, V " + std::string(st.v_trans ? "transposed" : "rows") +
              (shape ? " (from " + shape->source + ")" : "");
  return Status::OK();
}

Status read_outputs(Cursor& c, SessionOutputs& o) {
  const uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(uint32_t n, c.u32("output count"));
  return read_output_arrays(c, at, n, o);
}

// After the arch name, a version-9 context holds output ids, logits and
// embeddings before the memory section up to b8121, and nothing from b8179 on
// (llama.cpp #18862 kept the version). Both readings are tried; the structure
// decides, and a file that fits both is refused rather than guessed.
Status read_v9_context(const ReadableFile& file, Cursor& c, const ParseOptions& opts, StateFile& f) {
  const MemoryShape* shape = opts.shape;
  const uint64_t at = c.offset();
  StateFile with = f;
  SessionOutputs o;
  Status outputs_status = read_outputs(c, o);
  Status with_status = outputs_status;
  if (outputs_status.ok()) {
    with.outputs = o;
    with_status = read_memory(file, c.offset(), 2, shape, with);
  }
  StateFile without = f;
  Status without_status = read_memory(file, at, 2, shape, without);
  if (with_status.ok() && without_status.ok() && opts.v9_outputs) {  // the writer's build says which
    f = std::move(*opts.v9_outputs ? with : without);
    f.reading += *opts.v9_outputs ? "; outputs before the memory (b8121 and older, as the build given says)"
                                  : "; no outputs (b8179 and later, as the build given says)";
    return Status::OK();
  }
  if (with_status.ok() && without_status.ok()) {
    return Status::Ambiguous(file.name() + ": the version-9 body reads both with output logits (llama.cpp b8121 and "
                             "older) and without (b8179 and later); pass {--source-build bNNNN} to say which");
  }
  if (with_status.ok()) {
    f = std::move(with);
    f.reading += "; outputs before the memory (b8121 and older)";
    return Status::OK();
  }
  if (without_status.ok() && !f.tokens.tokens.empty() && kv_totals(without).n_cells == 0) {
    // A b8121 session cut short after its first output words reads as an
    // empty b8179 one; a saved session with tokens has cells.
    return Status::Corruption(file.name() + ": the version-9 body reads only as an empty cache (b8179 and later) "
                              "although the file lists " + std::to_string(f.tokens.tokens.size()) +
                              " tokens, and not with output logits (b8121 and older): " + with_status.message() +
                              " (truncated?)");
  }
  if (without_status.ok()) {
    f = std::move(without);
    f.reading += "; no outputs (b8179 and later)";
    return Status::OK();
  }
  // Neither fits: show the reading that got past its first hurdle.
  if (outputs_status.ok()) {
    return with_status.Prefixed("read with output logits (b8121 and older)")
        .Appended("; read without them (b8179 and later): " + without_status.message());
  }
  return without_status.Prefixed("read without output logits (b8179 and later)")
      .Appended("; read with them (b8121 and older): " + outputs_status.message());
}

// A u32 length + text field of 1..max bytes, each accepted by `ok`
// (`what`: "arch name", "RNG state"; `kind`: what the bytes must be).
template <typename Pred>
Result<std::string> read_text_field(Cursor& c, const std::string& what, uint32_t max, const char* kind, Pred ok) {
  const uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(uint32_t len, c.u32((what + " length").c_str()));
  if (len == 0 || len > max) {
    return c.corrupt(at, what + " length " + std::to_string(len) + " is out of range (1.." + std::to_string(max) + ")");
  }
  std::string s(len, '\0');
  KV_RETURN_IF_ERROR(c.read(s.data(), len, what.c_str()));
  for (char ch : s) {
    if (!ok(static_cast<unsigned char>(ch))) return c.corrupt(at, what + " is not " + kind);
  }
  return s;
}

// ggsn v8 (llama.cpp b3543): after the arch name the sampler's RNG as text
// (u32 length + `std::mt19937 << ` output: decimal words separated by spaces).
Result<std::string> read_rng(Cursor& c) {
  return read_text_field(c, "RNG state", kMaxRngText, "decimal words",
                         [](unsigned char ch) { return ch == ' ' || (ch >= '0' && ch <= '9'); });
}

Result<std::string> read_arch(Cursor& c) {
  return read_text_field(c, "arch name", kMaxArchName, "printable text",
                         [](unsigned char ch) { return ch >= 0x20 && ch <= 0x7e; });
}

}  // namespace

Status llama_state_detail::read_output_arrays(Cursor& c, uint64_t at, uint64_t n_outputs, SessionOutputs& o) {
  if (n_outputs > c.remaining() / 4 || n_outputs > UINT32_MAX) {
    return c.corrupt(at, "truncated: " + std::to_string(n_outputs) + " output ids");
  }
  o.n_outputs = uint32_t(n_outputs);
  o.output_pos = {c.offset(), n_outputs * 4};
  KV_RETURN_IF_ERROR(c.skip(n_outputs, 4, "output ids"));
  KV_ASSIGN_OR_RETURN(o.logits_size, c.u64("logits size"));
  o.logits.offset = c.offset();
  KV_RETURN_IF_ERROR(c.skip(o.logits_size, 4, "logits"));
  o.logits.size = o.logits_size * 4;
  KV_ASSIGN_OR_RETURN(o.embd_size, c.u64("embeddings size"));
  o.embd.offset = c.offset();
  KV_RETURN_IF_ERROR(c.skip(o.embd_size, 4, "embeddings"));
  o.embd.size = o.embd_size * 4;
  return Status::OK();
}

Status llama_state_detail::read_tokens(Cursor& c, TokenPayload& tp, bool allow_packed) {
  const uint64_t at = c.offset();
  KV_ASSIGN_OR_RETURN(uint32_t n, c.u32("token count"));
  if (n > c.remaining() / 4) {
    return c.corrupt(at, "token count " + std::to_string(n) + " needs " + std::to_string(uint64_t(n) * 4) +
                             " bytes, " + std::to_string(c.remaining()) + " remain");
  }
  if (n > kMaxTokens) {
    return c.corrupt(at, "token count " + std::to_string(n) + " is above any llama.cpp context (kvsnap reads up to " +
                             std::to_string(kMaxTokens) + ")");
  }
  std::vector<int32_t> words(n);
  for (uint32_t i = 0; i < n; ++i) {
    KV_ASSIGN_OR_RETURN(words[i], c.i32("token"));
  }
  if (!allow_packed) {
    tp.words = words;
    tp.tokens = std::move(words);
    return Status::OK();
  }
  auto parsed = parse_token_payload(std::move(words));
  if (!parsed.ok()) return parsed.status().Prefixed(c.file().name() + ": offset " + std::to_string(at + 4));
  tp = std::move(parsed).value();
  return Status::OK();
}

const char* kind_name(StateKind k) {
  switch (k) {
    case StateKind::kSeqFile: return "sequence state file (ggsq)";
    case StateKind::kSessionFile: return "session file (ggsn)";
    case StateKind::kRawSeq: return "raw sequence state buffer";
    case StateKind::kRawContext: return "raw context state buffer";
  }
  return "?";
}

namespace {

// Each header reader below reads what precedes the memory section and sets
// `era` for it; it returns true when it has read the whole file itself (the
// layouts whose memory is not a plain memory section).

// A raw llama_state_*_get_data buffer: no magic, except the io magic and
// sequence id that newer builds tag a sequence buffer with.
Result<bool> read_raw_header(const ReadableFile& file, Cursor& c, const ParseOptions& opts, StateFile& f,
                             uint32_t& era) {
  f.kind = *opts.kind;
  era = opts.raw_version.value_or(3);
  if (f.kind == StateKind::kRawSeq && c.remaining() >= 4) {
    KV_ASSIGN_OR_RETURN(uint32_t first, c.u32("magic"));
    if (first == kRawSeqMagic) {
      f.raw_seq_tagged = true;
      f.magic = first;
      KV_ASSIGN_OR_RETURN(f.raw_seq_id, c.i32("sequence id"));
    } else {
      KV_RETURN_IF_ERROR(c.seek(0));
      if (!opts.raw_version) era = 2;  // untagged buffers come from before v0.5.0, or are ambiguous
    }
  }
  if (f.kind == StateKind::kRawContext) {
    KV_ASSIGN_OR_RETURN(f.arch, read_arch(c));
    if (era < 3) {
      f.version = era;
      KV_RETURN_IF_ERROR(read_v9_context(file, c, opts, f));
      return true;
    }
  }
  f.version = era;
  return false;
}

// ggsn v8 (b3543): RNG text, then outputs as in v9 of b8121 and older, then an
// L0 memory section.
Status read_session_v8(const ReadableFile& file, Cursor& c, uint32_t era, const MemoryShape* shape, StateFile& f) {
  KV_ASSIGN_OR_RETURN(f.rng, read_rng(c));
  SessionOutputs o;
  KV_RETURN_IF_ERROR(read_outputs(c, o));
  f.outputs = o;
  KV_RETURN_IF_ERROR(read_memory(file, c.offset(), era, shape, f));
  for (const KvSection& sec : f.memory.kv) {
    if (sec.stream_prefix || sec.ext_bytes) {
      return Status::Corruption(file.name() + ": a ggsn v8 session (llama.cpp b3543) has no n_stream prefix and "
                                "no cell extras, and this one reads only with them");
    }
  }
  f.reading += "; RNG state and outputs before the memory (ggsn v8, b3543)";
  return Status::OK();
}

// ggsn v8, v9 and v10 session files, after magic and version.
Result<bool> read_session_header(const ReadableFile& file, Cursor& c, const ParseOptions& opts, StateFile& f,
                                 uint32_t& era) {
  f.kind = StateKind::kSessionFile;
  if (f.version != 10 && f.version != 9 && f.version != 8) {
    return Status::NotSupported(file.name() + ": unknown (magic, version) for session file: " + hex32(f.magic) +
                                ", " + hex32(f.version) + " (kvsnap reads ggsn v8, v9 and v10)");
  }
  era = f.version == 10 ? 3 : 2;
  KV_RETURN_IF_ERROR(read_tokens(c, f.tokens, /*allow_packed=*/false));
  KV_ASSIGN_OR_RETURN(f.arch, read_arch(c));
  if (f.version == 9) {
    KV_RETURN_IF_ERROR(read_v9_context(file, c, opts, f));
    return true;
  }
  if (f.version == 8) {
    KV_RETURN_IF_ERROR(read_session_v8(file, c, era, opts.shape, f));
    return true;
  }
  return false;
}

// A state file with a magic of its own: ggsq, ggsn, or a tagged raw sequence
// buffer saved as a file.
Result<bool> read_file_header(const ReadableFile& file, Cursor& c, const ParseOptions& opts, StateFile& f,
                              uint32_t& era) {
  if (file.size() < 8) {
    return Status::Corruption(file.name() + ": " + std::to_string(file.size()) +
                              " bytes is too short for a llama.cpp state file (magic and version need 8)");
  }
  KV_ASSIGN_OR_RETURN(f.magic, c.u32("magic"));
  KV_ASSIGN_OR_RETURN(f.version, c.u32("version"));
  if (f.magic == kMagicGgsn && f.version == 6) {
    KV_RETURN_IF_ERROR(read_session_v6(c, opts, f));
    return true;
  }
  if (f.magic == kMagicGgsn && f.version == 7) {
    return Status::NotSupported(
        file.name() + ": ggsn v7 session files (llama.cpp between b3166 and b3543) are not supported: their layout "
        "is not known to kvsnap. Load the session in the llama.cpp that wrote it and save it again with b3543 or "
        "newer, or save a sequence file");
  }
  if (f.magic == kMagicGgsq && f.version == 1) {
    f.kind = StateKind::kSeqFile;
    KV_RETURN_IF_ERROR(read_tokens(c, f.tokens, /*allow_packed=*/false));
    KV_RETURN_IF_ERROR(read_seq_v1(c, opts.shape, f));
    return true;
  }
  if (f.magic == kMagicGgsq) {
    f.kind = StateKind::kSeqFile;
    if (f.version != 3 && f.version != 2) {
      return Status::NotSupported(file.name() + ": unknown (magic, version) for sequence state file: " +
                                  hex32(f.magic) + ", " + hex32(f.version) + " (kvsnap reads ggsq v1, v2 and v3)");
    }
    era = f.version;
    KV_RETURN_IF_ERROR(read_tokens(c, f.tokens, /*allow_packed=*/true));
    return false;
  }
  if (f.magic == kMagicGgsn) return read_session_header(file, c, opts, f, era);
  if (f.magic == kRawSeqMagic) {
    f.kind = StateKind::kRawSeq;
    f.raw_seq_tagged = true;
    KV_RETURN_IF_ERROR(c.seek(4));
    KV_ASSIGN_OR_RETURN(f.raw_seq_id, c.i32("sequence id"));
    f.version = 3;
    return false;
  }
  return Status::NotSupported(file.name() + ": not a llama.cpp state file: unknown magic " + hex32(f.magic) +
                              " (expected ggsq " + hex32(kMagicGgsq) + " or ggsn " + hex32(kMagicGgsn) +
                              "; for a raw llama_state_seq_get_data buffer pass {--input-format raw-seq})");
}

// A sequence file's cells each hold the sequence's id (b5640 on) or none (before): llama.cpp refuses
// to load one whose cells differ from that (llama_kv_cache::state_read_meta: "invalid seq_id-agnostic
// kv cell"), so a file that mixes them, or holds a cell of several ids, is no file it wrote.
Status check_seq_cells(const ReadableFile& file, const StateFile& f) {
  if (f.kind != StateKind::kSeqFile && f.kind != StateKind::kRawSeq) return Status::OK();
  std::optional<size_t> first;
  for (size_t si = 0; si < f.memory.kv.size(); ++si) {
    const auto& streams = f.memory.kv[si].streams;
    for (size_t sj = 0; sj < streams.size(); ++sj) {
      for (size_t i = 0; i < streams[sj].cells.size(); ++i) {
        const size_t n = streams[sj].cells[i].seq_ids.size();
        if (!first) first = n;
        if (n <= 1 && n == *first) continue;
        return Status::Corruption(file.name() + ": KV section " + std::to_string(si) + ", stream " +
                                  std::to_string(sj) + ", cell " + std::to_string(i) + " holds " + std::to_string(n) +
                                  " sequence ids where the first cell holds " + std::to_string(*first) +
                                  ": every cell of a sequence file holds its one id (none before llama.cpp b5640), "
                                  "and llama.cpp refuses to load this one");
      }
    }
  }
  return Status::OK();
}

}  // namespace

Result<StateFile> parse_state(const ReadableFile& file, const ParseOptions& opts) {
  StateFile f;
  f.file_size = file.size();
  Cursor c(file);
  uint32_t era = 3;
  const bool raw = opts.kind == StateKind::kRawSeq || opts.kind == StateKind::kRawContext;
  KV_ASSIGN_OR_RETURN(bool complete,
                      raw ? read_raw_header(file, c, opts, f, era) : read_file_header(file, c, opts, f, era));
  if (!complete) KV_RETURN_IF_ERROR(read_memory(file, c.offset(), era, opts.shape, f));
  KV_RETURN_IF_ERROR(check_seq_cells(file, f));
  return f;
}

KvTotals kv_totals(const StateFile& f) {
  KvTotals t;
  bool any = false;
  for (const auto& sec : f.memory.kv) {
    for (const auto& st : sec.streams) {
      t.n_cells += st.cell_count;
      for (const auto& c : st.cells) {
        if (!any || c.pos < t.pos_min) t.pos_min = c.pos;
        if (!any || c.pos > t.pos_max) t.pos_max = c.pos;
        any = true;
      }
      for (const auto& L : st.layers) {
        t.k_bytes += L.k.size;
        t.v_bytes += L.v.size;
      }
    }
  }
  return t;
}

std::optional<uint64_t> layer_n_embd_k(const KvLayer& l) {
  const TypeLayout* t = find_type(l.k_type);
  if (!t) return std::nullopt;
  return row_elems(*t, l.k_row_bytes);
}

std::optional<uint64_t> layer_n_embd_v(const KvLayer& l, uint32_t v_trans) {
  if (!l.has_v) return std::nullopt;
  if (v_trans) return l.n_embd_v_gqa;
  const TypeLayout* t = find_type(l.v_type);
  if (!t) return std::nullopt;
  return row_elems(*t, l.v_row_bytes);
}

}  // namespace kvsnap
