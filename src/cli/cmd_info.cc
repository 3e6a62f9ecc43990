// kvsnap info: what a llama.cpp state file holds, and what it would weigh at
// every other cache type. One report is built and rendered twice, as the JSON
// document and as the human table, so the two never disagree. Schema:
// docs/info-json.md.
#include <CLI/CLI.hpp>

#include <cinttypes>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "base/json.h"
#include "base/json_access.h"
#include "base/printf_text.h"
#include "cli/progress.h"
#include "cli/commands.h"
#include "cli/era_options.h"
#include "cli/exit_codes.h"
#include "cli/open_state.h"
#include "cli/store_common.h"
#include "store/store_seal.h"
#include "format/content_digest.h"
#include "format/llama_era.h"
#include "migrate/conversion_spec.h"
#include "migrate/source_rotation.h"
#include "format/ggml_types.h"
#include "format/llama_state.h"
#include "format/mlx_info.h"

namespace kvsnap::cli {
namespace {

using json = nlohmann::ordered_json;

std::string human_bytes(uint64_t b) {
  char buf[64];
  if (b < 1024) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", b);
  } else if (b < 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  } else if (b < 1024ull * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
  }
  return buf;
}

std::string format_tag(const StateFile& f) {
  switch (f.kind) {
    case StateKind::kSeqFile: return "ggsq";
    case StateKind::kSessionFile: return "ggsn";
    case StateKind::kRawSeq: return "raw-seq";
    case StateKind::kRawContext: return "raw-context";
  }
  return "?";
}

// A rotation only the values show: what it rests on is the data test, not the file or a build.
constexpr const char* kByData =
    "Walsh-Hadamard rotated in blocks of that size as the data shows: neither the file's format nor a named "
    "build says so (--source-build or --src-rotation settles it)";

// What each rotation word means, printed under the layer table.
const std::map<std::string, std::string>& rotation_notes() {
  static const std::map<std::string, std::string> m = {
      {"unknown", "quantized and written by a rotating llama.cpp: rotated when the head dim is a multiple of 64; "
                  "give --model to know"},
      {"unknown-era", "quantized, and the file does not tell whether the llama.cpp that wrote it rotated (b8643 and "
                      "later do): pass --source-build or --src-rotation; conversions that depend on it are refused"},
      {"none-pre-rotation", "quantized, written by a llama.cpp that did not rotate quantized caches: not rotated"},
      {"none-declared", "quantized, declared unrotated (--src-rotation off)"},
      {"none-by-data", "quantized, and the data shows it stored unrotated"},
      {"none-head-dim", "quantized but not rotated: the head dim is not a multiple of 64"},
      {"hadamard-64", "Walsh-Hadamard rotated in blocks of 64 (llama.cpp default; LLAMA_ATTN_ROT_DISABLE=1 on the "
                      "saving server turns it off)"},
      {"hadamard-128", "Walsh-Hadamard rotated in blocks of 128 (llama.cpp default; LLAMA_ATTN_ROT_DISABLE=1 on the "
                       "saving server turns it off)"},
      {"hadamard-256", "Walsh-Hadamard rotated in blocks of 256 (llama.cpp default; LLAMA_ATTN_ROT_DISABLE=1 on the "
                       "saving server turns it off)"},
      {"hadamard-64-by-data", kByData}, {"hadamard-128-by-data", kByData}, {"hadamard-256-by-data", kByData},
  };
  return m;
}

// Decided by the values: layer 0's RoPE or the channel energy (migrate/source_rotation.h).
bool by_data(const SourceRotation& d) { return d.decided_by == "data" || d.decided_by == "rope"; }

// One tensor's rotation word, from the file-level decision and the model's
// head dims (migrate/source_rotation.h).
std::string rotation_state(const SourceRotation& d, int32_t type, const ModelInfo* model, bool is_v, size_t section,
                           size_t layer) {
  const TypeLayout* t = find_type(type);
  if (!t || !t->quantized) return "none";
  if (d.rotated == Tri::kNo) {
    if (d.decided_by == "declared") return "none-declared";
    return by_data(d) ? "none-by-data" : "none-pre-rotation";
  }
  // A head dim llama.cpp never rotates settles it, whatever the era.
  const std::optional<uint32_t> n_rot = model ? model->rotation_block(is_v, section, layer) : std::nullopt;
  if (model && !n_rot) return "none-head-dim";
  if (d.rotated == Tri::kUnknown) return "unknown-era";
  if (!model) return "unknown";
  return "hadamard-" + std::to_string(*n_rot) + (by_data(d) ? "-by-data" : "");
}

// ---------------------------------------------------------------- the report
// What info says about a file, built once from the parsed state and rendered
// twice: as the JSON document (docs/info-json.md) and as the human table. The
// fields mirror the JSON keys; optional ones are absent from the JSON when unset.

struct LayerReport {
  size_t layer = 0;
  std::string k_type;
  int32_t k_type_id = 0;
  uint64_t k_row_bytes = 0;
  std::optional<uint64_t> n_embd_k_gqa;
  std::string k_rotation;
  uint64_t k_bytes = 0;
  bool has_v = false;
  // the V fields are set only when has_v
  std::string v_type;
  int32_t v_type_id = 0;
  std::optional<uint32_t> v_elem_bytes;  // transposed V
  std::optional<uint64_t> v_row_bytes;   // V rows
  std::optional<uint64_t> n_embd_v_gqa;
  std::string v_rotation;
  uint64_t v_bytes = 0;

  // Everything but the layer index: consecutive layers that look the same are
  // shown as one line.
  bool looks_like(const LayerReport& o) const {
    auto shape = [](const LayerReport& l) {
      return std::tie(l.k_type, l.k_type_id, l.k_row_bytes, l.n_embd_k_gqa, l.k_rotation, l.k_bytes, l.has_v,
                      l.v_type, l.v_type_id, l.v_elem_bytes, l.v_row_bytes, l.n_embd_v_gqa, l.v_rotation, l.v_bytes);
    };
    return shape(*this) == shape(o);
  }
};

struct StreamReport {
  size_t index = 0;
  uint32_t cell_count = 0;
  // the rest only when cell_count > 0
  int32_t pos_min = 0, pos_max = 0;
  std::set<int32_t> seq_ids;
  uint32_t v_trans = 0;
  uint32_t n_layer = 0;
  std::vector<LayerReport> layers;
};

struct SectionReport {
  size_t index = 0;
  std::string role;  // "attention", or "base" / "swa" of an iSWA cache
  uint64_t bytes = 0;
  std::vector<StreamReport> streams;
};

struct DryRunCell {
  std::string ctk, ctv;
  std::optional<uint64_t> kv_bytes;  // nullopt: a row is not whole blocks of the type
  uint64_t file_bytes = 0;
  double ratio = 0;
  std::string note;
};

struct InfoReport {
  std::string file;
  uint64_t file_bytes = 0;
  std::string format;
  uint32_t version = 0;
  std::string kind;
  FileEra era;
  SourceRotation rotation;
  const StateFile* state = nullptr;  // the layout, tokens, arch, recurrent and outputs fields, as parsed
  const ModelInfo* model = nullptr;
  bool with_tokens = false;
  std::vector<SectionReport> sections;
  KvTotals totals;
  uint64_t kv_bytes = 0;
  std::vector<DryRunCell> dry_run;  // kv_cache_types() squared, ctk-major
};

LayerReport layer_report(const SourceRotation& rot, const KvStream& st, const KvLayer& L, const ModelInfo* model,
                         size_t si, size_t il) {
  LayerReport r;
  r.layer = il;
  r.k_type = type_name(L.k_type);
  r.k_type_id = L.k_type;
  r.k_row_bytes = L.k_row_bytes;
  r.n_embd_k_gqa = layer_n_embd_k(L);
  r.k_rotation = rotation_state(rot, L.k_type, model, false, si, il);
  r.k_bytes = L.k.size;
  r.has_v = L.has_v;
  if (!L.has_v) return r;
  r.v_type = type_name(L.v_type);
  r.v_type_id = L.v_type;
  if (st.v_trans) {
    r.v_elem_bytes = L.v_elem_bytes;
  } else {
    r.v_row_bytes = L.v_row_bytes;
  }
  r.n_embd_v_gqa = layer_n_embd_v(L, st.v_trans);
  r.v_rotation = rotation_state(rot, L.v_type, model, true, si, il);
  r.v_bytes = L.v.size;
  return r;
}

StreamReport stream_report(const SourceRotation& rot, const KvStream& st, const ModelInfo* model, size_t si,
                           size_t k) {
  StreamReport r;
  r.index = k;
  r.cell_count = st.cell_count;
  if (!st.cell_count) return r;
  r.pos_min = r.pos_max = st.cells[0].pos;
  for (const auto& c : st.cells) {
    r.pos_min = std::min(r.pos_min, c.pos);
    r.pos_max = std::max(r.pos_max, c.pos);
    r.seq_ids.insert(c.seq_ids.begin(), c.seq_ids.end());
  }
  r.v_trans = st.v_trans;
  r.n_layer = st.n_layer;
  for (size_t il = 0; il < st.layers.size(); ++il) r.layers.push_back(layer_report(rot, st, st.layers[il], model, si, il));
  return r;
}

std::vector<SectionReport> section_reports(const StateFile& f, const SourceRotation& rot, const ModelInfo* model) {
  std::vector<SectionReport> out;
  for (size_t si = 0; si < f.memory.kv.size(); ++si) {
    const KvSection& sec = f.memory.kv[si];
    SectionReport s;
    s.index = si;
    s.role = f.memory.kv.size() == 2 ? (si == 0 ? "base" : "swa") : "attention";
    s.bytes = sec.range.size;
    for (size_t k = 0; k < sec.streams.size(); ++k) s.streams.push_back(stream_report(rot, sec.streams[k], model, si, k));
    out.push_back(std::move(s));
  }
  return out;
}

// KV bytes if every layer were stored at (ctk, ctv); nullopt when a row is
// not a whole number of blocks of that type.
std::optional<uint64_t> kv_bytes_at(const StateFile& f, const TypeLayout& kt, const TypeLayout& vt) {
  uint64_t total = 0;
  for (const auto& sec : f.memory.kv) {
    for (const auto& st : sec.streams) {
      for (const auto& L : st.layers) {
        auto nk = layer_n_embd_k(L);
        if (!nk) return std::nullopt;
        auto rk = row_bytes(kt, *nk);
        if (!rk.ok()) return std::nullopt;
        total += *rk * st.cell_count;
        if (L.has_v) {
          auto nv = layer_n_embd_v(L, st.v_trans);
          if (!nv) return std::nullopt;
          auto rv = row_bytes(vt, *nv);
          if (!rv.ok()) return std::nullopt;
          total += *rv * st.cell_count;
        }
      }
    }
  }
  return total;
}

// The "how much would I free by quantizing" table (llama.cpp PR #24134).
std::vector<DryRunCell> dry_run(const StateFile& f, uint64_t kv) {
  bool any_trans = false;
  for (const auto& sec : f.memory.kv)
    for (const auto& st : sec.streams) any_trans = any_trans || (st.cell_count && st.v_trans);
  std::vector<DryRunCell> out;
  for (const TypeLayout& kt : kv_cache_types()) {
    for (const TypeLayout& vt : kv_cache_types()) {
      DryRunCell d;
      d.ctk = kt.name;
      d.ctv = vt.name;
      d.kv_bytes = kv_bytes_at(f, kt, vt);
      if (!d.kv_bytes) {
        d.note = "a row is not a whole number of blocks of this type";
      } else {
        d.file_bytes = f.file_size - kv + *d.kv_bytes;
        d.ratio = kv ? double(*d.kv_bytes) / double(kv) : 1.0;
        if (vt.quantized && any_trans) d.note = "quantized V needs flash attention: V becomes rows";
      }
      out.push_back(std::move(d));
    }
  }
  return out;
}

InfoReport build_report(const StateFile& f, const std::string& path, const ModelInfo* model,
                        const SourceRotation& rot, bool with_tokens) {
  InfoReport r;
  r.file = path;
  r.file_bytes = f.file_size;
  r.format = format_tag(f);
  r.version = f.version;
  r.kind = kind_name(f.kind);
  r.era = era_of_file(f, model ? std::optional<bool>(model->profile.has_cell_ext) : std::nullopt);
  r.rotation = rot;
  r.state = &f;
  r.model = model;
  r.with_tokens = with_tokens;
  r.sections = section_reports(f, rot, model);
  r.totals = kv_totals(f);
  r.kv_bytes = r.totals.k_bytes + r.totals.v_bytes;
  r.dry_run = dry_run(f, r.kv_bytes);
  return r;
}

// ---------------------------------------------------------------- JSON
// Key order and presence are the schema of docs/info-json.md.

json layer_json(const LayerReport& l) {
  json j;
  j["layer"] = l.layer;
  j["k_type"] = l.k_type;
  j["k_type_id"] = l.k_type_id;
  j["k_row_bytes"] = l.k_row_bytes;
  if (l.n_embd_k_gqa) j["n_embd_k_gqa"] = *l.n_embd_k_gqa;
  j["k_rotation"] = l.k_rotation;
  j["k_bytes"] = l.k_bytes;
  j["has_v"] = l.has_v;
  if (l.has_v) {
    j["v_type"] = l.v_type;
    j["v_type_id"] = l.v_type_id;
    if (l.v_elem_bytes) j["v_elem_bytes"] = *l.v_elem_bytes;
    if (l.v_row_bytes) j["v_row_bytes"] = *l.v_row_bytes;
    if (l.n_embd_v_gqa) j["n_embd_v_gqa"] = *l.n_embd_v_gqa;
    j["v_rotation"] = l.v_rotation;
    j["v_bytes"] = l.v_bytes;
  }
  return j;
}

json sections_json(const std::vector<SectionReport>& sections) {
  json out = json::array();
  for (const SectionReport& sec : sections) {
    json s;
    s["index"] = sec.index;
    s["role"] = sec.role;
    s["bytes"] = sec.bytes;
    json streams = json::array();
    for (const StreamReport& st : sec.streams) {
      json js;
      js["index"] = st.index;
      js["cell_count"] = st.cell_count;
      if (st.cell_count) {
        js["pos_min"] = st.pos_min;
        js["pos_max"] = st.pos_max;
        js["seq_ids"] = st.seq_ids;
        js["v_trans"] = st.v_trans;
        js["v_layout"] = st.v_trans ? "transposed" : "rows";
        js["n_layer"] = st.n_layer;
        json layers = json::array();
        for (const LayerReport& l : st.layers) layers.push_back(layer_json(l));
        js["layers"] = layers;
      }
      streams.push_back(js);
    }
    s["streams"] = streams;
    out.push_back(s);
  }
  return out;
}

// The file as read: which layout, and the token payload of seq/session files.
void file_json(const InfoReport& r, json& j) {
  const StateFile& f = *r.state;
  json layout;
  layout["reading"] = f.reading;
  layout["from_model"] = r.model != nullptr;
  layout["stream_prefix"] = f.memory.kv.empty() ? true : f.memory.kv[0].stream_prefix;
  layout["cell_ext_bytes"] = f.memory.kv.empty() ? 0 : f.memory.kv[0].ext_bytes;
  layout["kv_sections"] = f.memory.kv.size();
  layout["recurrent"] = f.memory.recurrent.has_value();
  j["layout"] = layout;
  if (f.kind == StateKind::kSeqFile || f.kind == StateKind::kSessionFile) {
    json t;
    t["count"] = f.tokens.tokens.size();
    t["payload"] = f.tokens.packed ? "server-packed" : "plain";
    t["payload_words"] = f.tokens.words.size();
    if (f.tokens.packed) {
      t["payload_version"] = f.tokens.packed_version;
      t["media_chunks"] = f.tokens.media_chunks.size();
    }
    if (r.with_tokens) t["tokens"] = f.tokens.tokens;
    j["tokens"] = t;
  }
  if (!f.arch.empty()) j["arch"] = f.arch;
  if (!f.rng.empty()) j["rng_state_bytes"] = f.rng.size();  // ggsn v8 (b3543)
  if (f.kind == StateKind::kRawSeq) {
    j["raw_seq_tagged"] = f.raw_seq_tagged;
    if (f.raw_seq_tagged) j["raw_seq_id"] = f.raw_seq_id;
  }
}

// What follows the KV sections: recurrent state and session outputs.
void tail_sections_json(const StateFile& f, json& j) {
  if (f.memory.recurrent) {
    const auto& r = *f.memory.recurrent;
    json jr;
    jr["bytes"] = r.range.size;
    jr["understood"] = r.understood;
    jr["cell_count"] = r.cell_count;
    jr["n_layer"] = r.n_layer;
    jr["tensors"] = r.n_entries;
    j["recurrent"] = jr;
  } else {
    j["recurrent"] = nullptr;
  }
  if (f.outputs) {
    json o;
    o["n_outputs"] = f.outputs->n_outputs;
    o["logits_floats"] = f.outputs->logits_size;
    o["embd_floats"] = f.outputs->embd_size;
    j["outputs"] = o;
  }
}

json sizes_json(const InfoReport& r) {
  const StateFile& f = *r.state;
  json sz;
  sz["cells"] = r.totals.n_cells;
  sz["k_bytes"] = r.totals.k_bytes;
  sz["v_bytes"] = r.totals.v_bytes;
  sz["kv_bytes"] = r.kv_bytes;
  sz["bytes_per_cell"] = r.totals.n_cells ? r.kv_bytes / r.totals.n_cells : 0;
  sz["recurrent_bytes"] = f.memory.recurrent ? f.memory.recurrent->range.size : 0;
  sz["other_bytes"] = f.file_size - r.kv_bytes;
  return sz;
}

json dry_run_json(const std::vector<DryRunCell>& cells) {
  json dry = json::array();
  for (const DryRunCell& c : cells) {
    json d;
    d["ctk"] = c.ctk;
    d["ctv"] = c.ctv;
    if (!c.kv_bytes) {
      d["valid"] = false;
      d["note"] = c.note;
    } else {
      d["valid"] = true;
      d["kv_bytes"] = *c.kv_bytes;
      d["file_bytes"] = c.file_bytes;
      d["ratio"] = c.ratio;
      if (!c.note.empty()) d["note"] = c.note;
    }
    dry.push_back(d);
  }
  return dry;
}

json report_json(const InfoReport& r) {
  json j;
  j["kvsnap_info_version"] = 1;
  j["file"] = r.file;
  j["file_bytes"] = r.file_bytes;
  j["format"] = r.format;
  j["version"] = r.version;
  j["kind"] = r.kind;
  j["written_by"] = "llama.cpp " + r.era.builds;
  j["era"] = {{"eras", r.era.eras}, {"builds", r.era.builds}, {"rotates", tri_name(r.era.rotates)}, {"why", r.era.why}};
  j["source_rotation"] = source_rotation_json(r.rotation);
  file_json(r, j);
  j["model"] = r.model ? r.model->to_json() : json(nullptr);
  j["kv_sections"] = sections_json(r.sections);
  tail_sections_json(*r.state, j);
  j["sizes"] = sizes_json(r);
  j["dry_run"] = dry_run_json(r.dry_run);
  return j;
}

// ---------------------------------------------------------------- human
// The same report as a table; every figure comes from the report, as in the JSON.

class HumanText {
 public:
  // "key        value"
  void line(const char* k, const std::string& v) { add("%-10s %s\n", k, v.c_str()); }
  template <class... A>
  void add(const char* fmt, A... args) {
    out_ += printf_text(fmt, args...);  // as long as it is: --tokens lists every token on one line
  }
  void add_text(const std::string& s) { out_ += s; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// file, format, layout, era and rotation lines.
void render_header(const InfoReport& r, HumanText& o) {
  const std::string written_by = "llama.cpp " + r.era.builds;
  o.line("file", r.file + " (" + std::to_string(r.file_bytes) + " bytes)");
  o.line("format", r.format + " v" + std::to_string(r.version) + ", " + r.kind + "; " + written_by);
  o.line("layout", r.state->reading + (r.model ? "" : " (inferred from the file's structure)"));
  o.line("era", r.era.eras + ": " + r.era.why);
  const SourceRotation& d = r.rotation;
  const bool known = d.rotated != Tri::kUnknown;
  std::string v = !known ? (d.matters ? "UNKNOWN" : "not needed")
                         : (d.rotated == Tri::kYes ? "stored rotated" : "stored unrotated");
  if (known) v += " (decided by " + d.decided_by + ")";
  if (!known && d.matters) v += ": conversions that depend on it are refused; --source-build or --src-rotation settles it";
  o.line("rotation", v);
  for (const auto& e : d.evidence) o.line("", e);
}

// tokens, arch, RNG state and model lines.
void render_file_facts(const InfoReport& r, HumanText& o) {
  const StateFile& f = *r.state;
  if (f.kind == StateKind::kSeqFile || f.kind == StateKind::kSessionFile) {
    std::string s = std::to_string(f.tokens.tokens.size());
    s += f.tokens.packed ? " (llama-server packed payload v" + std::to_string(f.tokens.packed_version) + ", " +
                               std::to_string(f.tokens.media_chunks.size()) + " media chunks)"
                         : " (plain token list)";
    o.line("tokens", s);
    if (r.with_tokens) {
      std::string list;
      for (int32_t tok : f.tokens.tokens) list += (list.empty() ? "" : " ") + std::to_string(tok);
      o.line("", list);
    }
  }
  if (!f.arch.empty()) o.line("arch", f.arch);
  if (!f.rng.empty()) {
    o.line("rng state", std::to_string(f.rng.size()) + " bytes of text (ggsn v8 of b3543, v6 of b3166)");
  }
  if (r.model) {
    const ModelProfile& p = r.model->profile;
    o.line("model", r.model->path + " (" + p.arch + ", " + std::to_string(p.n_layer) + " layers, fingerprint " +
                        p.fingerprint.substr(0, 16) + ")");
  }
}

// The layer table of a stream, equal neighbours on one line, then what its
// rotation words mean.
void render_layers(const std::vector<LayerReport>& layers, HumanText& o) {
  o.add("    %-7s %-6s %8s %7s  %-6s %8s %7s  %s\n", "layer", "K", "row B", "n_embd", "V", "row B", "n_embd",
        "rotation K / V");
  for (size_t i = 0; i < layers.size();) {
    size_t k = i + 1;
    while (k < layers.size() && layers[k].looks_like(layers[i])) ++k;
    const LayerReport& L = layers[i];
    const std::string range = k - i > 1 ? std::to_string(i) + "-" + std::to_string(k - 1) : std::to_string(i);
    const std::string vrow = !L.has_v          ? "-"
                             : L.v_row_bytes ? std::to_string(*L.v_row_bytes)
                                             : std::to_string(L.v_elem_bytes.value_or(0)) + "/el";
    const std::string nk = L.n_embd_k_gqa ? std::to_string(*L.n_embd_k_gqa) : "?";
    const std::string nv = L.n_embd_v_gqa ? std::to_string(*L.n_embd_v_gqa) : "-";
    o.add("    %-7s %-6s %8" PRIu64 " %7s  %-6s %8s %7s  %s / %s\n", range.c_str(), L.k_type.c_str(), L.k_row_bytes,
          nk.c_str(), L.has_v ? L.v_type.c_str() : "-", vrow.c_str(), nv.c_str(), L.k_rotation.c_str(),
          L.has_v ? L.v_rotation.c_str() : "-");
    i = k;
  }
  // Explain the rotation words once.
  std::set<std::string> notes;
  for (const LayerReport& L : layers) {
    notes.insert(L.k_rotation);
    if (L.has_v) notes.insert(L.v_rotation);
  }
  for (const auto& n : notes) {
    auto it = rotation_notes().find(n);
    if (it != rotation_notes().end()) o.add_text("    " + n + ": " + it->second + "\n");
  }
}

void render_sections(const std::vector<SectionReport>& sections, HumanText& o) {
  for (const SectionReport& s : sections) {
    o.add_text("\nKV section " + std::to_string(s.index) + " (" + s.role + "), " + std::to_string(s.streams.size()) +
               " stream(s), " + human_bytes(s.bytes) + "\n");
    for (const StreamReport& st : s.streams) {
      if (st.cell_count == 0) {
        o.add_text("  stream " + std::to_string(st.index) + ": empty\n");
        continue;
      }
      std::string seqs;
      for (int32_t q : st.seq_ids) seqs += (seqs.empty() ? "" : ",") + std::to_string(q);
      o.add("  stream %zu: %u cells, positions %d..%d, seq ids {%s}, V %s, %u layers\n", st.index, st.cell_count,
            st.pos_min, st.pos_max, seqs.c_str(),
            st.v_trans ? "transposed (flash attention off)" : "rows (flash attention on)", st.n_layer);
      render_layers(st.layers, o);
    }
  }
}

// Recurrent state, session outputs and the memory totals.
void render_totals(const InfoReport& r, HumanText& o) {
  const StateFile& f = *r.state;
  if (f.memory.recurrent) {
    const auto& rec = *f.memory.recurrent;
    o.add_text("\nrecurrent state: " + human_bytes(rec.range.size) + ", carried byte-exact" +
               (rec.understood ? " (" + std::to_string(rec.cell_count) + " cells, " + std::to_string(rec.n_entries) +
                                     " tensors)\n"
                               : " (inner layout not understood)\n"));
  }
  if (f.outputs) {
    o.add_text("\noutputs (v6/v8/v9): " + std::to_string(f.outputs->n_outputs) + " outputs, " +
               std::to_string(f.outputs->logits_size) + " logits, " + std::to_string(f.outputs->embd_size) +
               " embedding floats\n");
  }
  const KvTotals& t = r.totals;
  o.add_text("\nmemory    K " + human_bytes(t.k_bytes) + " + V " + human_bytes(t.v_bytes) + " = " +
             human_bytes(r.kv_bytes) + " for " + std::to_string(t.n_cells) + " cells (" +
             std::to_string(t.n_cells ? r.kv_bytes / t.n_cells : 0) + " bytes per cell); other " +
             human_bytes(f.file_size - r.kv_bytes) + "\n");
}

// Dry-run matrix: ratio of KV bytes at (ctk row, ctv column) to now; then the
// most useful few in bytes.
void render_dry_run(const InfoReport& r, HumanText& o) {
  o.add_text("\nKV size at other types (ratio to now; rows ctk, columns ctv):\n");
  o.add("  %-7s", "");
  for (const TypeLayout& vt : kv_cache_types()) o.add(" %6s", std::string(vt.name).c_str());
  o.add_text("\n");
  size_t idx = 0;
  for (const TypeLayout& kt : kv_cache_types()) {
    o.add("  %-7s", std::string(kt.name).c_str());
    for (size_t c = 0; c < kv_cache_types().size(); ++c, ++idx) {
      const DryRunCell& d = r.dry_run[idx];
      if (d.kv_bytes) {
        o.add(" %6.3f", d.ratio);
      } else {
        o.add(" %6s", "n/a");
      }
    }
    o.add_text("\n");
  }
  const uint64_t kv = r.kv_bytes;
  for (const DryRunCell& d : r.dry_run) {
    if (!d.kv_bytes) continue;
    const std::string& k = d.ctk;
    const std::string& v = d.ctv;
    if ((k == v && (k == "f16" || k == "q8_0" || k == "q4_0")) || (k == "q8_0" && v == "q4_0")) {
      const uint64_t b = *d.kv_bytes;
      o.add("  at %s/%s: %s (%s %s)\n", k.c_str(), v.c_str(), human_bytes(b).c_str(), b <= kv ? "frees" : "adds",
            human_bytes(b <= kv ? kv - b : b - kv).c_str());
    }
  }
}

std::string render_human(const InfoReport& r) {
  HumanText o;
  render_header(r, o);
  render_file_facts(r, o);
  render_sections(r.sections, o);
  render_totals(r, o);
  render_dry_run(r, o);
  return o.take();
}

}  // namespace

// An mlx-lm prompt cache (safetensors, told by content): its own report (format/mlx_info.h).
// nullopt: not one, the llama.cpp path goes on.
std::optional<Status> run_mlx_info(const InfoOptions& opts, std::string& out) {
  if (!opts.input_format.empty()) return std::nullopt;
  auto f = cli_io().open_read(opts.file);
  if (!f.ok() || !looks_like_mlx_prompt_cache(**f)) return std::nullopt;
  auto cache = read_mlx_prompt_cache(**f);
  if (!cache.ok()) return cache.status();
  const MlxInfoReport report = mlx_info_report(*cache, opts.file);
  out = opts.json ? json_text(mlx_info_json(report), 2) + "\n" : mlx_info_text(report);
  return Status::OK();
}

Status run_info(const InfoOptions& opts, std::string& out) {
  if (auto mlx = run_mlx_info(opts, out)) return *mlx;
  KV_ASSIGN_OR_RETURN(OpenedState in, open_state(cli_io(), opts.file, opts.model, opts.input_format, opts.src_types, opts.source_build));
  const ModelInfo* model = in.model_ptr();
  RotationClaims claims;
  claims.src_rotation = opts.src_rotation;
  claims.source_build = opts.source_build;
  KV_ASSIGN_OR_RETURN(SourceRotation rot,
                      decide_source_rotation(in.file.get(), in.state,
                                             model ? model_rotation_geometry(*model) : RotationGeometry{},
                                             model ? std::optional<bool>(model->profile.has_cell_ext) : std::nullopt,
                                             claims));
  const InfoReport report = build_report(in.state, opts.file, model, rot, opts.tokens);
  out = opts.json ? json_text(report_json(report), 2) + "\n" : render_human(report);
  return Status::OK();
}

void setup_info(CLI::App& app, int& exit_status) {
  auto opts = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info", "Describe a llama.cpp KV state file: format, tokens, cells, per-layer "
                                         "types and row sizes, V layout, rotation, and its size at every ctk/ctv; "
                                         "or an mlx-lm prompt cache (.safetensors, told by content)");
  sub->add_option("file", opts->file, "slot file (ggsq), session file (ggsn), raw state buffer or mlx-lm prompt cache")->required();
  sub->add_option("--model,-m", opts->model,
                  "the model's GGUF: makes the layout exact (head dims, M-RoPE cell ext, iSWA, hybrid) and checks "
                  "that the file belongs to it");
  sub->add_option("--input-format", opts->input_format,
                  "raw-seq for a llama_state_seq_get_data buffer, raw-context for llama_state_get_data")
      ->check(CLI::IsMember({"", "raw-seq", "raw-context"}));
  add_source_options(sub, opts->src_rotation, opts->source_build, "the file");
  sub->add_option("--src-types", opts->src_types,
                  "K/V: the cache types of a ggsn v6 (b3166) session, which records none, when its sizes fit several "
                  "pairs (q4_0/q8_0 vs iq4_nl/q8_0)");
  sub->add_flag("--json", opts->json, "machine-readable output (schema: docs/info-json.md)");
  sub->add_flag("--tokens", opts->tokens, "also list the tokens");
  sub->footer(
      "\nExamples:\n"
      "  kvsnap info slot0.bin\n"
      "  kvsnap info slot0.bin --model model.gguf --json | jq '.dry_run[] | select(.ctk==\"q8_0\")'\n");
  sub->callback([opts, &exit_status]() {
    std::string out;
    Status s = run_info(*opts, out);
    exit_status = report("info", s, out);
  });
}

namespace {

// --as SNAPSHOT: the stored snapshot's manifest and what its digest is compared with.
struct DigestTarget {
  std::unique_ptr<Store> store;
  std::unique_ptr<StoredSnapshot> snap;
};

Result<DigestTarget> open_digest_target(const DigestOptions& opts) {
  DigestTarget t;
  KV_ASSIGN_OR_RETURN(t.store, open_store(opts.store));
  KV_ASSIGN_OR_RETURN(t.snap, t.store->open_snapshot(opts.as));
  if (t.snap->reader().manifest().mlx) {
    return Status::InvalidArgument("snapshot " + opts.as + " is an mlx-lm prompt cache: kvsnap digest reads "
                                   "llama.cpp state files (kvsnap verify checks a stored snapshot)");
  }
  return t;
}

// The flags that only --as reads, refused without it rather than ignored.
Status check_digest_flags(const DigestOptions& opts) {
  if (!opts.as.empty()) return Status::OK();
  const StoreKeyConfig& keys = store_key_flags();
  if (!opts.store.empty() || !keys.key_file.empty() || !keys.key_command.empty() || !keys.tenant.empty()) {
    return Status::InvalidArgument(
        "--store, --key-file, --key-command and --tenant choose the store of --as SNAPSHOT; without --as, kvsnap "
        "digest reads FILE alone");
  }
  return Status::OK();
}

}  // namespace

Status run_digest(const DigestOptions& opts, std::string& out) {
  KV_RETURN_IF_ERROR(check_digest_flags(opts));
  std::optional<DigestTarget> target;
  if (!opts.as.empty()) {
    KV_ASSIGN_OR_RETURN(DigestTarget t, open_digest_target(opts));
    target = std::move(t);
  }
  const SnapshotManifest* m = target ? &target->snap->reader().manifest() : nullptr;
  if (m && opts.cells_per_chunk && *opts.cells_per_chunk != m->cells_per_chunk) {
    return Status::InvalidArgument("--cells-per-chunk " + std::to_string(*opts.cells_per_chunk) + ": snapshot " +
                                   label(target->snap->info()) + " was saved with " +
                                   std::to_string(m->cells_per_chunk) +
                                   ", and with --as the digest is computed on the snapshot's grid (drop "
                                   "--cells-per-chunk)");
  }
  const ChunkCipher* cipher = target && m->encryption ? target->store->cipher() : nullptr;
  const uint32_t cells_per_chunk = m ? m->cells_per_chunk : opts.cells_per_chunk.value_or(kDefaultCellsPerChunk);
  OpenedState in;
  if (m && opts.model.empty() && opts.input_format.empty() && opts.src_types.empty()) {
    // As the save parsed it (its layout, raw kind, a b3166 session's types, a v9 body's outputs),
    // so a file the snapshot was restored to needs none of the flags the save had.
    KV_ASSIGN_OR_RETURN(in.file, cli_io().open_read(opts.file));
    KV_ASSIGN_OR_RETURN(in.state, parse_state(*in.file, target->snap->reader().parse_options()));
  } else {
    if (auto f = cli_io().open_read(opts.file); f.ok() && looks_like_mlx_prompt_cache(**f)) {
      return Status::InvalidArgument(opts.file + " is an mlx-lm prompt cache: kvsnap digest reads llama.cpp state "
                                     "files (kvsnap info describes it; kvsnap verify checks a stored snapshot)");
    }
    KV_ASSIGN_OR_RETURN(in, open_state(cli_io(), opts.file, opts.model, opts.input_format, opts.src_types));
  }
  KV_ASSIGN_OR_RETURN(const StateDigests d,
                      state_digests(in.state, *in.file, cells_per_chunk, m ? &m->segments : nullptr, cipher));
  // As `show` prints it: an encrypted snapshot's catalog keeps the keyed digest's HMAC.
  const ContentDigestRule rule = m ? m->rule() : ContentDigestRule::kChunkTree;
  const bool whole = rule == ContentDigestRule::kWholeSha256;  // version 1: the file's SHA-256
  const ContentDigestText mine =
      split_content_digest(recorded_content_digest(whole ? d.sha256 : d.content_digest, rule, cipher), cipher);
  nlohmann::json j{{"file", opts.file}, {"content_digest", mine.hex}, {"content_digest_rule", mine.rule},
                   {"cells_per_chunk", cells_per_chunk}, {"sha256", to_hex(d.sha256)}};
  const std::string how = whole ? "the whole file's, as version 1 recorded it"
                                 : std::to_string(cells_per_chunk) + " cells per chunk" +
                                       (m ? std::string(", on the snapshot's grid") : std::string());
  out = "content_digest  " + mine.hex + " (" + mine.rule + ", " + how + ")\nsha256          " + to_hex(d.sha256) + "\n";
  Status verdict = Status::OK();
  if (m) {
    const ContentDigestText recorded = split_content_digest(recorded_content_digest(*m, cipher), cipher);
    const bool same = mine.hex == recorded.hex;
    const std::string name = label(target->snap->info());
    j["as"] = {{"snapshot", name}, {"content_digest", recorded.hex}, {"content_digest_rule", recorded.rule},
               {"matches", same}};
    out += std::string("snapshot        ") + name + ": " + (same ? "the same content" : "DIFFERENT content") + "\n";
    if (!same) {
      verdict = Status::Mismatch(opts.file + " is not the content of snapshot " + name + " (digest " + mine.hex +
                                 ", the snapshot's " + recorded.hex + ")");
    }
  }
  if (opts.json) out = json_text(j, 2) + "\n";
  return verdict;
}

void setup_digest(CLI::App& app, int& exit_status) {
  auto opts = std::make_shared<DigestOptions>();
  auto* sub = app.add_subcommand("digest", "The content digest a save of a llama.cpp KV state file records (what "
                                           "`kvsnap show` prints), and the file's plain SHA-256; with --as SNAPSHOT, "
                                           "whether the file is that snapshot's content");
  sub->add_option("file", opts->file, "slot file (ggsq), session file (ggsn) or raw state buffer")->required();
  sub->add_option("--model,-m", opts->model, "the model's GGUF, as given to save (it can change the layout)");
  sub->add_option("--input-format", opts->input_format, "raw-seq or raw-context, as given to save")
      ->check(CLI::IsMember({"", "raw-seq", "raw-context"}));
  sub->add_option("--src-types", opts->src_types, "K/V of a ggsn v6 (b3166) session, as given to save");
  sub->add_option("--cells-per-chunk", opts->cells_per_chunk,
                  "as given to save (default 256); with --as the snapshot's is used, and another value is refused");
  sub->add_option("--as", opts->as,
                  "a stored snapshot (name, id or uuid): compute the digest on its cell grid (and with its key, "
                  "if encrypted) and compare: exit 0 when FILE is its content, 5 when not");
  sub->add_flag("--json", opts->json, "machine-readable output");
  sub->footer(
      "\nA save records the digest on the snapshot's own chunk grid: a snapshot saved on its parent's grid\n"
      "(format version 4) or in an encrypted store (keyed: its chunk ids are the tenant's) records one that\n"
      "only --as SNAPSHOT reproduces; without --as this command computes the plain version-3 one. Examples:\n"
      "  kvsnap digest slot0.bin\n"
      "  kvsnap restore chat-42 -o /tmp/s.bin && kvsnap digest /tmp/s.bin --as chat-42\n");
  bind(sub, opts, run_digest, "digest", exit_status);
}

}  // namespace kvsnap::cli
