// kvsnap info: what a llama.cpp state file holds, and what it would weigh at
// every other cache type. The JSON document is the model; the human table is
// rendered from it, so the two never disagree. Schema: docs/info-json.md.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cstdio>
#include <map>
#include <set>

#include "cli/progress.h"
#include "cli/commands.h"
#include "cli/era_options.h"
#include "cli/exit_codes.h"
#include "cli/open_state.h"
#include "format/llama_era.h"
#include "migrate/conversion_spec.h"
#include "migrate/source_rotation.h"
#include "format/ggml_types.h"
#include "format/llama_state.h"

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
  };
  return m;
}

// One tensor's rotation word, from the file-level decision and the model's
// head dims (migrate/source_rotation.h).
std::string rotation_state(const SourceRotation& d, int32_t type, const ModelInfo* model, bool is_v, size_t section,
                           size_t layer) {
  const TypeLayout* t = find_type(type);
  if (!t || !t->quantized) return "none";
  if (d.rotated == Tri::kNo) {
    if (d.decided_by == "declared") return "none-declared";
    return d.decided_by == "data" ? "none-by-data" : "none-pre-rotation";
  }
  if (d.rotated == Tri::kUnknown) return "unknown-era";
  if (!model) return "unknown";
  auto n_rot = model->rotation_block(is_v, section, layer);
  if (!n_rot) return "none-head-dim";
  return "hadamard-" + std::to_string(*n_rot);
}

json layer_json(const SourceRotation& rot, const KvStream& st, const KvLayer& L, const ModelInfo* model, size_t si,
                size_t il) {
  json j;
  j["layer"] = il;
  j["k_type"] = type_name(L.k_type);
  j["k_type_id"] = L.k_type;
  j["k_row_bytes"] = L.k_row_bytes;
  if (auto n = layer_n_embd_k(L)) j["n_embd_k_gqa"] = *n;
  j["k_rotation"] = rotation_state(rot, L.k_type, model, false, si, il);
  j["k_bytes"] = L.k.size;
  j["has_v"] = L.has_v;
  if (L.has_v) {
    j["v_type"] = type_name(L.v_type);
    j["v_type_id"] = L.v_type;
    if (st.v_trans) {
      j["v_elem_bytes"] = L.v_elem_bytes;
    } else {
      j["v_row_bytes"] = L.v_row_bytes;
    }
    if (auto n = layer_n_embd_v(L, st.v_trans)) j["n_embd_v_gqa"] = *n;
    j["v_rotation"] = rotation_state(rot, L.v_type, model, true, si, il);
    j["v_bytes"] = L.v.size;
  }
  return j;
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

json build_info(const StateFile& f, const std::string& path, const ModelInfo* model, const SourceRotation& rot,
               bool with_tokens) {
  json j;
  j["kvsnap_info_version"] = 1;
  j["file"] = path;
  j["file_bytes"] = f.file_size;
  j["format"] = format_tag(f);
  j["version"] = f.version;
  j["kind"] = kind_name(f.kind);
  const FileEra era = era_of_file(f, model ? std::optional<bool>(model->profile.has_cell_ext) : std::nullopt);
  j["written_by"] = "llama.cpp " + era.builds;
  j["era"] = {{"eras", era.eras}, {"builds", era.builds}, {"rotates", tri_name(era.rotates)}, {"why", era.why}};
  j["source_rotation"] = source_rotation_json(rot);
  json layout;
  layout["reading"] = f.reading;
  layout["from_model"] = model != nullptr;
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
    if (with_tokens) t["tokens"] = f.tokens.tokens;
    j["tokens"] = t;
  }
  if (!f.arch.empty()) j["arch"] = f.arch;
  if (!f.rng.empty()) j["rng_state_bytes"] = f.rng.size();  // ggsn v8 (b3543)
  if (f.kind == StateKind::kRawSeq) {
    j["raw_seq_tagged"] = f.raw_seq_tagged;
    if (f.raw_seq_tagged) j["raw_seq_id"] = f.raw_seq_id;
  }
  j["model"] = model ? model->to_json() : json(nullptr);

  json sections = json::array();
  for (size_t si = 0; si < f.memory.kv.size(); ++si) {
    const KvSection& sec = f.memory.kv[si];
    json s;
    s["index"] = si;
    s["role"] = f.memory.kv.size() == 2 ? (si == 0 ? "base" : "swa") : "attention";
    s["bytes"] = sec.range.size;
    json streams = json::array();
    for (size_t k = 0; k < sec.streams.size(); ++k) {
      const KvStream& st = sec.streams[k];
      json js;
      js["index"] = k;
      js["cell_count"] = st.cell_count;
      if (st.cell_count) {
        int32_t lo = st.cells[0].pos, hi = st.cells[0].pos;
        std::set<int32_t> seqs;
        for (const auto& c : st.cells) {
          lo = std::min(lo, c.pos);
          hi = std::max(hi, c.pos);
          seqs.insert(c.seq_ids.begin(), c.seq_ids.end());
        }
        js["pos_min"] = lo;
        js["pos_max"] = hi;
        js["seq_ids"] = seqs;
        js["v_trans"] = st.v_trans;
        js["v_layout"] = st.v_trans ? "transposed" : "rows";
        js["n_layer"] = st.n_layer;
        json layers = json::array();
        for (size_t il = 0; il < st.layers.size(); ++il) layers.push_back(layer_json(rot, st, st.layers[il], model, si, il));
        js["layers"] = layers;
      }
      streams.push_back(js);
    }
    s["streams"] = streams;
    sections.push_back(s);
  }
  j["kv_sections"] = sections;
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

  const KvTotals tot = kv_totals(f);
  const uint64_t kv = tot.k_bytes + tot.v_bytes;
  json sz;
  sz["cells"] = tot.n_cells;
  sz["k_bytes"] = tot.k_bytes;
  sz["v_bytes"] = tot.v_bytes;
  sz["kv_bytes"] = kv;
  sz["bytes_per_cell"] = tot.n_cells ? kv / tot.n_cells : 0;
  sz["recurrent_bytes"] = f.memory.recurrent ? f.memory.recurrent->range.size : 0;
  sz["other_bytes"] = f.file_size - kv;
  j["sizes"] = sz;

  // The "how much would I free by quantizing" table (llama.cpp PR #24134).
  json dry = json::array();
  bool any_trans = false;
  for (const auto& sec : f.memory.kv)
    for (const auto& st : sec.streams) any_trans = any_trans || (st.cell_count && st.v_trans);
  for (const TypeLayout& kt : kv_cache_types()) {
    for (const TypeLayout& vt : kv_cache_types()) {
      json d;
      d["ctk"] = kt.name;
      d["ctv"] = vt.name;
      auto b = kv_bytes_at(f, kt, vt);
      if (!b) {
        d["valid"] = false;
        d["note"] = "a row is not a whole number of blocks of this type";
      } else {
        d["valid"] = true;
        d["kv_bytes"] = *b;
        d["file_bytes"] = f.file_size - kv + *b;
        d["ratio"] = kv ? double(*b) / double(kv) : 1.0;
        if (vt.quantized && any_trans) d["note"] = "quantized V needs flash attention: V becomes rows";
      }
      dry.push_back(d);
    }
  }
  j["dry_run"] = dry;
  return j;
}

// Consecutive layers that look the same are shown as one line.
std::string layer_line_key(const json& L) {
  json c = L;
  c.erase("layer");
  return c.dump();
}

std::string render_human(const json& j) {
  std::string o;
  char buf[512];
  auto line = [&](const char* k, const std::string& v) {
    std::snprintf(buf, sizeof buf, "%-10s %s\n", k, v.c_str());
    o += buf;
  };
  line("file", j["file"].get<std::string>() + " (" + std::to_string(j["file_bytes"].get<uint64_t>()) + " bytes)");
  line("format", j["format"].get<std::string>() + " v" + std::to_string(j["version"].get<uint32_t>()) + ", " +
                     j["kind"].get<std::string>() +
                     (j["written_by"].get<std::string>().empty() ? "" : "; " + j["written_by"].get<std::string>()));
  line("layout", j["layout"]["reading"].get<std::string>() +
                     (j["layout"]["from_model"].get<bool>() ? "" : " (inferred from the file's structure)"));
  line("era", j["era"]["eras"].get<std::string>() + ": " + j["era"]["why"].get<std::string>());
  {
    const auto& r = j["source_rotation"];
    std::string v = r["rotated"].is_null() ? (r["needed"].get<bool>() ? "UNKNOWN" : "not needed")
                                           : (r["rotated"].get<bool>() ? "stored rotated" : "stored unrotated");
    if (!r["rotated"].is_null()) v += " (decided by " + r["decided_by"].get<std::string>() + ")";
    if (r["rotated"].is_null() && r["needed"].get<bool>()) {
      v += ": conversions that depend on it are refused; --source-build or --src-rotation settles it";
    }
    line("rotation", v);
    for (const auto& e : r["evidence"]) line("", e.get<std::string>());
  }
  if (j.contains("tokens")) {
    const auto& t = j["tokens"];
    std::string s = std::to_string(t["count"].get<size_t>());
    s += t["payload"] == "server-packed"
             ? " (llama-server packed payload v" + std::to_string(t["payload_version"].get<uint32_t>()) + ", " +
                   std::to_string(t["media_chunks"].get<size_t>()) + " media chunks)"
             : " (plain token list)";
    line("tokens", s);
    if (t.contains("tokens")) {
      std::string list;
      for (const auto& tok : t["tokens"]) list += (list.empty() ? "" : " ") + std::to_string(tok.get<int32_t>());
      line("", list);
    }
  }
  if (j.contains("arch")) line("arch", j["arch"].get<std::string>());
  if (j.contains("rng_state_bytes"))
    line("rng state",
         std::to_string(j["rng_state_bytes"].get<uint64_t>()) + " bytes of text (ggsn v8 of b3543, v6 of b3166)");
  if (!j["model"].is_null()) {
    const auto& m = j["model"];
    line("model", m.value("path", "") + " (" + m.value("arch", "") + ", " + std::to_string(m.value("n_layer", 0)) +
                      " layers, fingerprint " + m.value("fingerprint", "").substr(0, 16) + ")");
  }
  for (const auto& s : j["kv_sections"]) {
    o += "\nKV section " + std::to_string(s["index"].get<size_t>()) + " (" + s["role"].get<std::string>() + "), " +
         std::to_string(s["streams"].size()) + " stream(s), " + human_bytes(s["bytes"].get<uint64_t>()) + "\n";
    for (const auto& st : s["streams"]) {
      if (st["cell_count"].get<uint32_t>() == 0) {
        o += "  stream " + std::to_string(st["index"].get<size_t>()) + ": empty\n";
        continue;
      }
      std::string seqs;
      for (const auto& q : st["seq_ids"]) seqs += (seqs.empty() ? "" : ",") + std::to_string(q.get<int32_t>());
      std::snprintf(buf, sizeof buf, "  stream %zu: %u cells, positions %d..%d, seq ids {%s}, V %s, %u layers\n",
                    st["index"].get<size_t>(), st["cell_count"].get<uint32_t>(), st["pos_min"].get<int32_t>(),
                    st["pos_max"].get<int32_t>(), seqs.c_str(),
                    st["v_trans"].get<uint32_t>() ? "transposed (flash attention off)" : "rows (flash attention on)",
                    st["n_layer"].get<uint32_t>());
      o += buf;
      std::snprintf(buf, sizeof buf, "    %-7s %-6s %8s %7s  %-6s %8s %7s  %s\n", "layer", "K", "row B", "n_embd",
                    "V", "row B", "n_embd", "rotation K / V");
      o += buf;
      const auto& layers = st["layers"];
      for (size_t i = 0; i < layers.size();) {
        size_t k = i + 1;
        while (k < layers.size() && layer_line_key(layers[k]) == layer_line_key(layers[i])) ++k;
        const auto& L = layers[i];
        std::string range = k - i > 1 ? std::to_string(i) + "-" + std::to_string(k - 1) : std::to_string(i);
        std::string vrow = !L["has_v"].get<bool>() ? "-"
                           : L.contains("v_row_bytes") ? std::to_string(L["v_row_bytes"].get<uint64_t>())
                                                       : std::to_string(L["v_elem_bytes"].get<uint32_t>()) + "/el";
        auto rot = [](const json& r) { return r.get<std::string>(); };
        std::snprintf(buf, sizeof buf, "    %-7s %-6s %8" PRIu64 " %7s  %-6s %8s %7s  %s / %s\n", range.c_str(),
                      L["k_type"].get<std::string>().c_str(), L["k_row_bytes"].get<uint64_t>(),
                      L.contains("n_embd_k_gqa") ? std::to_string(L["n_embd_k_gqa"].get<uint64_t>()).c_str() : "?",
                      L.value("v_type", std::string("-")).c_str(), vrow.c_str(),
                      L.contains("n_embd_v_gqa") ? std::to_string(L["n_embd_v_gqa"].get<uint64_t>()).c_str() : "-",
                      rot(L["k_rotation"]).c_str(), L.contains("v_rotation") ? rot(L["v_rotation"]).c_str() : "-");
        o += buf;
        i = k;
      }
      // Explain the rotation words once.
      std::set<std::string> notes;
      for (const auto& L : layers) {
        notes.insert(L["k_rotation"].get<std::string>());
        if (L.contains("v_rotation")) notes.insert(L["v_rotation"].get<std::string>());
      }
      for (const auto& n : notes) {
        auto it = rotation_notes().find(n);
        if (it != rotation_notes().end()) o += "    " + n + ": " + it->second + "\n";
      }
    }
  }
  if (!j["recurrent"].is_null()) {
    const auto& r = j["recurrent"];
    o += "\nrecurrent state: " + human_bytes(r["bytes"].get<uint64_t>()) + ", carried byte-exact" +
         (r["understood"].get<bool>()
              ? " (" + std::to_string(r["cell_count"].get<uint32_t>()) + " cells, " +
                    std::to_string(r["tensors"].get<uint32_t>()) + " tensors)\n"
              : " (inner layout not understood)\n");
  }
  if (j.contains("outputs")) {
    const auto& ou = j["outputs"];
    o += "\noutputs (v6/v8/v9): " + std::to_string(ou["n_outputs"].get<uint32_t>()) + " outputs, " +
         std::to_string(ou["logits_floats"].get<uint64_t>()) + " logits, " +
         std::to_string(ou["embd_floats"].get<uint64_t>()) + " embedding floats\n";
  }
  const auto& sz = j["sizes"];
  const uint64_t kv = sz["kv_bytes"].get<uint64_t>();
  o += "\nmemory    K " + human_bytes(sz["k_bytes"].get<uint64_t>()) + " + V " +
       human_bytes(sz["v_bytes"].get<uint64_t>()) + " = " + human_bytes(kv) + " for " +
       std::to_string(sz["cells"].get<uint64_t>()) + " cells (" + std::to_string(sz["bytes_per_cell"].get<uint64_t>()) +
       " bytes per cell); other " + human_bytes(sz["other_bytes"].get<uint64_t>()) + "\n";

  // Dry-run matrix: ratio of KV bytes at (ctk row, ctv column) to now.
  o += "\nKV size at other types (ratio to now; rows ctk, columns ctv):\n";
  std::snprintf(buf, sizeof buf, "  %-7s", "");
  o += buf;
  for (const TypeLayout& vt : kv_cache_types()) {
    std::snprintf(buf, sizeof buf, " %6s", std::string(vt.name).c_str());
    o += buf;
  }
  o += "\n";
  size_t idx = 0;
  for (const TypeLayout& kt : kv_cache_types()) {
    std::snprintf(buf, sizeof buf, "  %-7s", std::string(kt.name).c_str());
    o += buf;
    for (size_t c = 0; c < kv_cache_types().size(); ++c, ++idx) {
      const auto& d = j["dry_run"][idx];
      if (d["valid"].get<bool>()) {
        std::snprintf(buf, sizeof buf, " %6.3f", d["ratio"].get<double>());
      } else {
        std::snprintf(buf, sizeof buf, " %6s", "n/a");
      }
      o += buf;
    }
    o += "\n";
  }
  // The most useful few in bytes.
  for (const auto& d : j["dry_run"]) {
    if (!d["valid"].get<bool>()) continue;
    const std::string k = d["ctk"], v = d["ctv"];
    if ((k == v && (k == "f16" || k == "q8_0" || k == "q4_0")) || (k == "q8_0" && v == "q4_0")) {
      const uint64_t b = d["kv_bytes"].get<uint64_t>();
      std::snprintf(buf, sizeof buf, "  at %s/%s: %s (%s %s)\n", k.c_str(), v.c_str(), human_bytes(b).c_str(),
                    b <= kv ? "frees" : "adds", human_bytes(b <= kv ? kv - b : b - kv).c_str());
      o += buf;
    }
  }
  return o;
}

}  // namespace

Status run_info(const InfoOptions& opts, std::string& out) {
  KV_ASSIGN_OR_RETURN(OpenedState in, open_state(cli_io(), opts.file, opts.model, opts.input_format, opts.src_types));
  const ModelInfo* model = in.model_ptr();
  RotationClaims claims;
  claims.src_rotation = opts.src_rotation;
  claims.source_build = opts.source_build;
  KV_ASSIGN_OR_RETURN(SourceRotation rot,
                      decide_source_rotation(in.file.get(), in.state,
                                             model ? model_rotation_geometry(*model) : RotationGeometry{},
                                             model ? std::optional<bool>(model->profile.has_cell_ext) : std::nullopt,
                                             claims));
  json j = build_info(in.state, opts.file, model, rot, opts.tokens);
  out = opts.json ? j.dump(2) + "\n" : render_human(j);
  return Status::OK();
}

void setup_info(CLI::App& app, int& exit_status) {
  auto opts = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info", "Describe a llama.cpp KV state file: format, tokens, cells, per-layer "
                                         "types and row sizes, V layout, rotation, and its size at every ctk/ctv");
  sub->add_option("file", opts->file, "slot file (ggsq), session file (ggsn) or raw state buffer")->required();
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

}  // namespace kvsnap::cli
