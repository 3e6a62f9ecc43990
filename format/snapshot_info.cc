// The manifest's INFO section (JSON): built from a parsed state file and the
// saver's options (provenance, per-layer types and rotation, model info), and
// read back into a SnapshotManifest. The binary tables are in
// snapshot_manifest.cc.
#include <algorithm>
#include <cstdio>

#include "base/io.h"
#include "base/json_access.h"
#include "base/text.h"
#include "format/ggml_types.h"
#include "format/llama_era.h"
#include "format/rotation_rule.h"
#include "format/snapshot.h"
#include "format/snapshot_info_internal.h"
#include "format/snapshot_internal.h"

namespace kvsnap {

using nlohmann::ordered_json;

namespace snapshot_detail {

// --- INFO -------------------------------------------------------------------------

namespace {

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
  // As decide_source_rotation decides: a declaration wins, then the layout, then a named build;
  // a head dim llama.cpp never rotates is "no" whatever the era.
  const bool declared = o.writer.src_rotation == "on" || o.writer.src_rotation == "off";
  Tri rotates = declared ? claimed_rotation(o.writer) : era_of_file(f, std::nullopt).rotates;
  if (rotates == Tri::kUnknown) rotates = claimed_rotation(o.writer);
  const bool dims_known = o.model && si < o.model->kv_sections.size();
  const std::optional<uint32_t> model_block =
      !dims_known ? std::nullopt
      : is_v      ? o.model->kv_sections[si].v_rotation_block
                  : o.model->kv_sections[si].k_rotation_block;
  ordered_json block = nullptr;  // the block when rotated
  std::string rotated;
  if (!t || !t->quantized || rotates == Tri::kNo || (dims_known && !model_block)) {
    rotated = "no";
  } else if (rotates == Tri::kUnknown) {
    rotated = "unknown-era";
  } else if (!dims_known) {
    rotated = "unknown";
  } else {
    rotated = "yes";
    block = model_block.value();
  }
  j["rotated"] = rotated;
  j["block"] = std::move(block);
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

}  // namespace

ordered_json labels_json(const SnapshotLabels& labels) {
  ordered_json tags = ordered_json::object();
  for (const auto& [k, v] : labels.tags) tags[k] = v;
  return {{"name", labels.name ? ordered_json(*labels.name) : ordered_json(nullptr)}, {"tags", std::move(tags)}};
}

ordered_json chunking_json(const SnapshotOptions& o) {
  ordered_json j = {{"cells_per_chunk", o.cells_per_chunk}, {"frame_chunk_bytes", kFrameChunkBytes}};
  if (o.compress) {
    j["zstd_level"] = o.zstd_level;
    // Each chunk says its codec; this says the save compressed only while the disk was behind.
    if (o.adaptive) j["compression"] = "adaptive";
  } else {
    j["compression"] = "none";
  }
  return j;
}

namespace {

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
  if (m.cell_ext_bytes) j["cell_ext_bytes"] = *m.cell_ext_bytes;
  return j;
}

// Where the snapshot came from: the original file, and what its writer was
// told about it (written only when known, so snapshots of unknown origin stay
// as before).
ordered_json provenance_json(const StateFile& f, const SnapshotOptions& o, const Sha256Digest& original_sha) {
  ordered_json prov;
  prov["source"] = file_name_of(o.source_name);
  prov["kind"] = kind_tag(f.kind);
  prov["magic"] = hex32(f.magic);
  prov["version"] = f.version;
  prov["file_size"] = f.file_size;
  prov[kContentDigestKey] = to_hex(original_sha);
  const SourceClaims& w = o.writer;
  if (!w.llama_build.empty()) {
    prov["llama_build"] = w.llama_build;
    prov["llama_build_from"] = w.llama_build_from;
  }
  if (!w.reported_build.empty()) prov["reported_build"] = w.reported_build;
  if (w.src_rotation == "on" || w.src_rotation == "off") prov["src_rotation"] = w.src_rotation;
  return prov;
}

// The memory section: per KV section its streams and layers, then the
// recurrent state.
ordered_json memory_json(const StateFile& f, const SnapshotOptions& o) {
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
  return mem;
}

}  // namespace

ordered_json build_info(const StateFile& f, const SnapshotOptions& o, const Sha256Digest& original_sha,
                        const std::string& created) {
  ordered_json j;
  j["format"] = "kvsnap snapshot";
  j["format_version"] = kSnapshotFormatVersion;
  j["kvsnap_version"] = o.kvsnap_version;
  j["created"] = created;
  j["provenance"] = provenance_json(f, o, original_sha);
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
  j["memory"] = memory_json(f, o);
  j["tokens"] = {{"n_tokens", f.tokens.tokens.size()}, {"n_words", f.tokens.words.size()}, {"packed", f.tokens.packed}};
  if (o.lossy) {
    j["lossy"] = {{"from_k", o.lossy->from_k}, {"from_v", o.lossy->from_v}, {"to_k", o.lossy->to_k},
                  {"to_v", o.lossy->to_v}, {"note", o.lossy->note}};
  } else {
    j["lossy"] = nullptr;
  }
  j["chunking"] = chunking_json(o);
  if (o.labels) j["labels"] = labels_json(*o.labels);
  return j;
}

// --- Reading INFO -------------------------------------------------------------------

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
  KV_ASSIGN_OR_RETURN(mi.cell_ext_bytes, opt_u32(mo, "cell_ext_bytes"));
  return mi;
}

// `digest_key`: "sha256" in a version-1 manifest, "content_digest" from version 3 on.
Status decode_provenance(const OrderedJsonRef& prov, const char* digest_key, SnapshotProvenance& pv) {
  KV_ASSIGN_OR_RETURN(pv.source, prov.string_at("source"));
  KV_ASSIGN_OR_RETURN(const std::string kind, prov.string_at("kind"));
  KV_ASSIGN_OR_RETURN(const std::string magic, prov.string_at("magic"));
  KV_ASSIGN_OR_RETURN(const uint64_t version, prov.unsigned_at("version", UINT32_MAX));
  KV_ASSIGN_OR_RETURN(pv.file_size, prov.unsigned_at("file_size"));
  KV_ASSIGN_OR_RETURN(const std::string sha, prov.string_at(digest_key));
  auto k = kind_from_tag(kind);
  pv.mlx_prompt_cache = kind == kMlxPromptCacheKind;
  if (!k && !pv.mlx_prompt_cache) return prov.error("kind '" + kind + "' is unknown");
  pv.kind = k.value_or(StateKind::kSeqFile);
  if (magic.size() != 8 || magic.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return prov.error("magic '" + magic + "' is not 8 hex digits");
  }
  pv.magic = uint32_t(std::stoul(magic, nullptr, 16));
  pv.version = uint32_t(version);
  if (!from_hex(sha, pv.content_digest)) return prov.error(std::string(digest_key) + " is not 64 hex digits");
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

}  // namespace

Status decode_info(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m) {
  const std::string doc = name + ": INFO";
  const std::string_view text(reinterpret_cast<const char*>(payload.data()), payload.size());
  if (payload.size() > kMaxInfoBytes) {
    return Status::Corruption(name + ": the INFO section is " + std::to_string(payload.size()) +
                              " bytes, more than the " + std::to_string(kMaxInfoBytes) + " kvsnap writes or reads");
  }
  // INFO is kept in file order (ordered_json): `kvsnap show` prints it as written.
  auto parsed = parse_json<ordered_json>(text, doc);
  if (!parsed.ok() || !parsed->is_object()) return Status::Corruption(name + ": INFO section is not a JSON object");
  ordered_json j = std::move(parsed).value();
  const OrderedJsonRef info(j, doc);
  KV_ASSIGN_OR_RETURN(OrderedJsonRef prov, info.at("provenance"));
  KV_RETURN_IF_ERROR(
      decode_provenance(prov, m.rule() == ContentDigestRule::kWholeSha256 ? "sha256" : kContentDigestKey, m.provenance));
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
    // What a save takes (check_options): a re-save of the original (an import under other keys,
    // export --decrypt) uses it, and must not fail halfway through an import on it.
    if (m.cells_per_chunk == 0 || m.cells_per_chunk > (1u << 24)) {
      return Status::Corruption(name + ": INFO's chunking.cells_per_chunk " + std::to_string(m.cells_per_chunk) +
                                " is out of range (1..16777216)");
    }
  }
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> lossy, info.find("lossy"));
  m.lossy = lossy.has_value();
  KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> labels, info.find("labels"));
  if (labels) {
    SnapshotLabels l;
    KV_ASSIGN_OR_RETURN(std::optional<OrderedJsonRef> name, labels->find("name"));
    if (name) {
      KV_ASSIGN_OR_RETURN(l.name, name->string());
    }
    KV_ASSIGN_OR_RETURN(OrderedJsonRef tags, labels->at("tags"));
    KV_ASSIGN_OR_RETURN(auto members, tags.members());
    for (const auto& [k, v] : members) {
      KV_ASSIGN_OR_RETURN(std::string value, v.string());
      l.tags[k] = std::move(value);
    }
    m.labels = std::move(l);
  }
  m.info = std::move(j);
  return Status::OK();
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
  m.cell_ext_bytes = p.cell_ext_bytes;
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

}  // namespace kvsnap
