#include "migrate/conversion_spec.h"

#include <algorithm>

#include "base/parallel.h"
#include "format/ggml_types.h"
#include "migrate/rope_head_dim.h"

namespace kvsnap {

namespace {

Result<RotationMode> parse_mode(const std::string& s, const char* flag) {
  if (s.empty() || s == "auto") return RotationMode::kAuto;
  if (s == "on") return RotationMode::kOn;
  if (s == "off") return RotationMode::kOff;
  return Status::InvalidArgument(std::string(flag) + " must be auto, on or off, not '" + s + "'");
}

Result<std::optional<int32_t>> optional_type(const std::string& s, const char* flag) {
  if (s.empty()) return std::optional<int32_t>();
  KV_ASSIGN_OR_RETURN(int32_t id, parse_kv_type(s, flag));
  return std::optional<int32_t>(id);
}

// --head-dim-k/--head-dim-v stand for a model's head dims: both, each positive and dividing every
// row of its side (a head dim left out read as 0, which llama.cpp never rotates, and one that
// cannot be the model's chose the rotation as silently: quantized rows written unrotated).
Status check_head_dims(const ConversionSpec& spec, const StateFile& src) {
  if (spec.head_dim_k < 0 || spec.head_dim_v < 0 || (spec.head_dim_k > 0) != (spec.head_dim_v > 0)) {
    return Status::InvalidArgument("{--head-dim-k} " + std::to_string(spec.head_dim_k) + " and {--head-dim-v} " +
                                   std::to_string(spec.head_dim_v) + ": give both, each the model's head dim (> 0); "
                                   "the rotation llama.cpp applies depends on each");
  }
  for (const KvSection& sec : src.memory.kv)
    for (const KvStream& st : sec.streams)
      for (const KvLayer& L : st.layers) {
        const std::optional<uint64_t> k = layer_n_embd_k(L);
        const std::optional<uint64_t> v = L.has_v ? layer_n_embd_v(L, st.v_trans) : std::nullopt;
        if ((k && *k % uint64_t(spec.head_dim_k) != 0) || (v && *v % uint64_t(spec.head_dim_v) != 0)) {
          return Status::InvalidArgument("{--head-dim-k} " + std::to_string(spec.head_dim_k) + " / {--head-dim-v} " +
                                         std::to_string(spec.head_dim_v) + " cannot be this file's: a layer's K row holds " +
                                         (k ? std::to_string(*k) : "?") + " values and its V row " +
                                         (v ? std::to_string(*v) : "?") + " (whole heads each); pass {--model GGUF}");
        }
      }
  return Status::OK();
}

Status set_geometry(const ConversionSpec& spec, const StateFile& src, const ModelInfo* model, ConvertRequest& req) {
  if (model) req.geometry = model_rotation_geometry(*model);
  if (spec.head_dim_k != 0 || spec.head_dim_v != 0) {
    if (model) return Status::InvalidArgument("{--head-dim-k}/{--head-dim-v} and {--model} both given; the model decides");
    KV_RETURN_IF_ERROR(check_head_dims(spec, src));
    req.geometry.k_head_dim.assign(src.memory.kv.size(), uint32_t(std::max(0, spec.head_dim_k)));
    req.geometry.v_head_dim.assign(src.memory.kv.size(), uint32_t(std::max(0, spec.head_dim_v)));
  } else if (!model && spec.geometry) {
    req.geometry = *spec.geometry;
  }
  return Status::OK();
}

// --head-dim-k stands for a model: the data is asked whether it fits, as parse_for_model asks it
// of a model's (migrate/rope_head_dim.h). Its layer 0 is the file's first K layer only when the
// file has one KV section and no recurrent state (no iSWA, no hybrid).
Status check_claimed_head_dim(const ConversionSpec& spec, const StateFile& src, const ModelInfo* model,
                              const ReadableFile* file) {
  if (model || !file || spec.head_dim_k <= 0 || src.memory.kv.size() != 1 || src.memory.recurrent) return Status::OK();
  const HeadDimClaim claim{uint32_t(spec.head_dim_k), 0, 0, "{--head-dim-k}"};
  KV_ASSIGN_OR_RETURN(HeadDimEvidence e, check_head_dim(*file, src, claim));
  return head_dim_status(e, claim, file->name());
}

// The kTargetFormats name of `src`'s own format: what keeps an old file's layout (ggsq-v2 of
// b6122.., ggsq-v2-b5640, ggsq-v2-b3543, ggsn-v9, ...).
std::string own_format_name(const StateFile& src) {
  const bool prefix = src.memory.kv.empty() || src.memory.kv[0].stream_prefix;
  std::optional<bool> ids;  // sequence files: whether the cells carry their seq id
  for (const KvSection& sec : src.memory.kv)
    for (const KvStream& st : sec.streams)
      if (!ids && !st.cells.empty()) ids = !st.cells[0].seq_ids.empty();
  auto fits = [](Tri row, std::optional<bool> file) {
    return row == Tri::kUnknown || !file || (row == Tri::kYes) == *file;
  };
  for (const TargetFormatRow& r : kTargetFormats) {
    if (r.kind == src.kind && r.version == src.version && fits(r.stream_prefix, prefix) &&
        (src.kind != StateKind::kSeqFile || fits(r.seq_cell_ids, ids)))
      return std::string(r.name);
  }
  return src.kind == StateKind::kSeqFile ? "ggsq-v2" : "ggsn-v9";
}

// An old file upgraded to the v0.5.0 format, or written for a build of b8352..b10375
// (--target-build): both keep a cell extra for M-RoPE models that a file of b8189 or older lacks,
// and an old file without one may be such a file. Whether the model is M-RoPE: from the model,
// else from what a snapshot recorded of it (`recorded_ext`), else nobody knows.
Status check_upgrade(const StateFile& src, const ModelInfo* model, std::optional<uint32_t> recorded_ext,
                     const ConvertRequest& req, const std::string& src_name, std::string* warnings) {
  const bool src_old = (src.kind == StateKind::kSeqFile && src.version < 3) ||
                       (src.kind == StateKind::kSessionFile && src.version < 10);
  if (!src_old) return Status::OK();
  const bool to_current = req.format == TargetFormat::kSameKindCurrent || req.format == TargetFormat::kGgsqV3 ||
                          req.format == TargetFormat::kGgsnV10;
  const bool target_keeps_ext =
      to_current || (req.target_build && req.target_build->mrope_ext_bytes.value_or(0) != 0);
  const bool src_has_ext = std::any_of(src.memory.kv.begin(), src.memory.kv.end(),
                                      [](const KvSection& k) { return k.ext_bytes != 0; });
  if (!target_keeps_ext || src_has_ext) return Status::OK();
  const std::string target = to_current ? "the v0.5.0 format" : "the format of b8352..b10375 ({--target-build})";
  const std::string keep = "{--format " + own_format_name(src) + "}";
  const std::optional<uint32_t> ext = model ? std::optional<uint32_t>(model->shape.ext_bytes.value_or(0)) : recorded_ext;
  if (ext && *ext != 0) {
    const std::string who = model ? model->arch : std::string("its model (as the snapshot recorded it)");
    return Status::NotSupported(src_name + ": " + who + " stores an M-RoPE cell extra in " + target +
                                " that this file lacks (written by b8189 or older); kvsnap "
                                "cannot rebuild it: the file can only keep its old format (or " + keep + ")");
  }
  if (ext) return Status::OK();
  // Nothing says whether the model is an M-RoPE one. A caller that shows notes (`kvsnap convert`,
  // which keeps the original) gets the assumption as one; the others (the C API, a store's restore
  // or --store-type, migrate) have nobody to tell, so the output is refused.
  if (!warnings) {
    return Status::Ambiguous(src_name + ": writing it in " + target + " needs the model: such files of an "
                             "M-RoPE model (Qwen2-VL, Qwen2.5-VL, ...) hold a cell extra this file lacks, and kvsnap "
                             "cannot tell from the file whether the model is one: pass {--model GGUF}, or keep "
                             "its format (or " + keep + ")");
  }
  *warnings += "note: writing " + src_name + " in " + target +
               " assumes the model has no M-RoPE cell extra (true for text-only models); "
               "pass {--model GGUF} to check\n";
  return Status::OK();
}

// --target-build: the build that will load the output decides the format
// version, the n_stream prefix, v9 outputs, the M-RoPE extra and whether
// quantized caches are written rotated.
Status set_target_build(const ConversionSpec& spec, const StateFile& src, ConvertRequest& req) {
  if (spec.target_build.empty()) return Status::OK();
  auto parsed = parse_llama_build(spec.target_build);
  if (!parsed.ok()) return parsed.status().Prefixed("{--target-build}");
  const LlamaBuild& b = *parsed;
  auto layout = layout_of_build(b);
  if (!layout.ok()) return layout.status().Prefixed("{--target-build}");
  const BuildLayout& L = *layout;
  const std::string who = "{--target-build} " + spec.target_build + " (era " + L.era + ")";
  auto unknown = [&](const char* what) {
    return Status::Ambiguous(who + ": that build falls between two known ones that differ in " + std::string(what) +
                             "; name a build kvsnap knows (docs/llama-formats.md, \"Eras\") or use {--format}");
  };
  const bool session = src.kind == StateKind::kSessionFile;
  if (src.kind != StateKind::kSeqFile && !session) {
    return Status::InvalidArgument(who + ": applies to slot (ggsq) and session (ggsn) files, the input is a " +
                                   kind_name(src.kind));
  }
  const std::optional<uint32_t> version = session ? L.ggsn_version : L.ggsq_version;
  if (!version) return unknown("file version");
  if (session && *version < 8 && !src.legacy) {
    return Status::NotSupported(who + ": its ggsn v" + std::to_string(*version) +
                                " sessions (the legacy KV dump) start with that build's raw llama_hparams, which "
                                "kvsnap takes only from a ggsn v6 input (a b3166 session); convert a sequence (ggsq) "
                                "file instead");
  }
  const bool old = *version < (session ? 10u : 3u);
  if (old && L.stream_prefix == Tri::kUnknown) return unknown("the n_stream prefix");
  if (old && session && L.session_outputs == Tri::kUnknown) return unknown("session outputs");
  if (old && !session && L.stream_prefix == Tri::kNo && L.seq_cell_ids == Tri::kUnknown) {
    return unknown("whether slot cells carry their seq id");
  }
  // The row of kTargetFormats (convert_state.h) the build writes: its kind and version (a newer
  // version than kvsnap writes: the current one), the n_stream prefix and the cells' seq ids.
  const StateKind kind = session ? StateKind::kSessionFile : StateKind::kSeqFile;
  const uint32_t v = old ? *version : session ? 10u : 3u;
  auto fits = [](Tri row, Tri build) { return row == Tri::kUnknown || row == build; };
  const TargetFormatRow* row = nullptr;
  for (const TargetFormatRow& r : kTargetFormats) {
    if (r.kind == kind && r.version == v && fits(r.stream_prefix, L.stream_prefix) &&
        fits(r.seq_cell_ids, L.seq_cell_ids)) {
      row = &r;
      break;
    }
  }
  if (!row) return unknown("the file format");
  const TargetFormat fmt = row->format;
  if (!spec.format.empty() && req.format != fmt) {
    return Status::InvalidArgument("{--format} " + spec.format + " is not what " + who + " reads; give one of them");
  }
  req.format = fmt;
  req.target_build = L;
  if (!req.dst_rotates && L.rotates != Tri::kUnknown) req.dst_rotates = L.rotates == Tri::kYes;
  return Status::OK();
}

}  // namespace

RotationGeometry model_rotation_geometry(const ModelInfo& model) {
  RotationGeometry g;
  for (size_t s = 0; s < model.head_dim_k.size(); ++s) {
    g.k_head_dim.push_back(model.rotation_head_dim(false, s));
    g.v_head_dim.push_back(model.rotation_head_dim(true, s));
  }
  g.rope_dims = model.profile.n_rot;
  g.layer0_k = model.layer0_head_dim_k;
  g.layer0_v = model.layer0_head_dim_v;
  return g;
}

Result<int32_t> parse_kv_type(const std::string& name, const std::string& flag) {
  const TypeLayout* t = find_type(name);
  if (!t) {
    return Status::InvalidArgument(flag + " '" + name + "' is not a KV cache type (" + kv_cache_type_names() + ")");
  }
  return int32_t(t->id);
}

namespace {

// --kv-streams: 0 (keep) or a count a llama.cpp cache can have (1..LLAMA_MAX_SEQ, 256).
Status check_kv_streams(int n) {
  if (n < 0 || n > 256)
    return Status::InvalidArgument("{--kv-streams} " + std::to_string(n) +
                                   " is out of range: a llama.cpp cache has 1 to 256 streams (one per slot with "
                                   "-np N and no -kvu, one with -kvu or no -np)");
  return Status::OK();
}

}  // namespace

Status check_spec_words(const ConversionSpec& spec) {
  KV_RETURN_IF_ERROR(optional_type(spec.ctk, "{--ctk}").status());
  KV_RETURN_IF_ERROR(optional_type(spec.ctv, "{--ctv}").status());
  if (!spec.flash_attn.empty() && spec.flash_attn != "on" && spec.flash_attn != "off")
    return Status::InvalidArgument("{--flash-attn} must be on or off, not '" + spec.flash_attn + "'");
  KV_RETURN_IF_ERROR(parse_mode(spec.rotation, "{--rotation}").status());
  KV_RETURN_IF_ERROR(parse_mode(spec.src_rotation, "{--src-rotation}").status());
  KV_RETURN_IF_ERROR(parse_mode(spec.dst_rotation, "{--dst-rotation}").status());
  if (Result<TargetFormat> f = parse_target_format(spec.format); !f.ok()) return f.status();
  if (spec.threads < 0 || spec.threads > 256)
    return Status::InvalidArgument("{--threads} " + std::to_string(spec.threads) + " is out of range (0 = every core, 1..256)");
  if (!spec.requant.empty()) KV_RETURN_IF_ERROR(parse_requant_mode(spec.requant).status());
  KV_RETURN_IF_ERROR(check_kv_streams(spec.kv_streams));
  for (const auto& [build, flag] : {std::pair{&spec.source_build, "{--source-build}"},
                                    std::pair{&spec.target_build, "{--target-build}"}}) {
    if (build->empty()) continue;
    if (Result<LlamaBuild> b = parse_llama_build(*build); !b.ok()) return b.status().Prefixed(flag);
  }
  return Status::OK();
}

namespace {

// llama.cpp does not start a context whose quantized K (or V) type's block does not divide a
// layer's head dim, with flash attention (llama_init_from_model: "K cache type q8_0 with block size
// 32 does not divide n_embd_head_k=80", 3.22.1 llama-context.cpp): a file of that type could never
// be restored (a review's finding: convert said success, the whole row being whole blocks).
Status check_blocks_divide_head_dims(const ModelInfo& model, const StateFile& src, const ConvertRequest& req) {
  bool fa_on = false;
  if (req.flash_attn) {
    fa_on = *req.flash_attn;
  } else {
    for (const KvSection& sec : src.memory.kv)
      for (const KvStream& st : sec.streams)
        if (!st.layers.empty()) fa_on = st.v_trans == 0;
  }
  if (!fa_on) return Status::OK();
  for (const bool is_v : {false, true}) {
    const std::optional<int32_t>& want = is_v ? req.v_type : req.k_type;
    const TypeLayout* t = want ? find_type(*want) : nullptr;
    if (!t || !t->quantized || t->block_elems == 0) continue;
    for (size_t il = 0; il < model.profile.layers.size(); ++il) {
      const LayerProfile& l = model.profile.layers[il];
      const uint32_t head = is_v ? l.head_dim_v : l.head_dim_k;
      if (!l.has_kv || (is_v && !l.has_v) || head == 0 || head % t->block_elems == 0) continue;
      return Status::NotSupported(std::string(is_v ? "V" : "K") + " cache type " + std::string(t->name) +
                                  " with block size " + std::to_string(t->block_elems) + " does not divide layer " +
                                  std::to_string(il) + "'s head dim " + std::to_string(head) + " of " + model.path +
                                  ": llama.cpp refuses that cache with flash attention, so no server could load the "
                                  "file; choose another type (f16, bf16, f32)");
    }
  }
  return Status::OK();
}

}  // namespace

Result<ConvertRequest> make_request(const ConversionSpec& spec, const StateFile& src, const ModelInfo* model,
                                    const std::string& src_name, std::string* warnings, const ReadableFile* file,
                                    SourceRotation* decision) {
  ConvertRequest req;
  KV_ASSIGN_OR_RETURN(req.k_type, optional_type(spec.ctk, "{--ctk}"));
  KV_ASSIGN_OR_RETURN(req.v_type, optional_type(spec.ctv, "{--ctv}"));
  if (!spec.flash_attn.empty()) {
    if (spec.flash_attn != "on" && spec.flash_attn != "off")
      return Status::InvalidArgument("{--flash-attn} must be on or off, not '" + spec.flash_attn + "'");
    req.flash_attn = spec.flash_attn == "on";
  }
  // "on" at an end: the llama.cpp there rotates quantized K/V by its rule;
  // "off": it does not (LLAMA_ATTN_ROT_DISABLE=1, or a build before b8643).
  KV_RETURN_IF_ERROR(parse_mode(spec.rotation, "{--rotation}").status());
  const std::string src_word = spec.src_rotation.empty() ? spec.rotation : spec.src_rotation;
  const std::string dst_word = spec.dst_rotation.empty() ? spec.rotation : spec.dst_rotation;
  KV_ASSIGN_OR_RETURN(RotationMode src_mode, parse_mode(src_word, "{--src-rotation}"));
  KV_ASSIGN_OR_RETURN(RotationMode dst_mode, parse_mode(dst_word, "{--dst-rotation}"));
  if (dst_mode != RotationMode::kAuto) req.dst_rotates = dst_mode == RotationMode::kOn;
  req.k_rotation = req.v_rotation = RotationOverride{src_mode == RotationMode::kOff ? src_mode : RotationMode::kAuto,
                                                     dst_mode == RotationMode::kOff ? dst_mode : RotationMode::kAuto};
  KV_ASSIGN_OR_RETURN(req.format, parse_target_format(spec.format));
  req.keep_raw_layout = spec.format.empty() && (src.kind == StateKind::kRawSeq || src.kind == StateKind::kRawContext);
  // Each thread gets a converter and buffers: a count no machine has is a mistake, not a request.
  if (spec.threads < 0 || spec.threads > 256)
    return Status::InvalidArgument("{--threads} " + std::to_string(spec.threads) + " is out of range (0 = every core, 1..256)");
  req.threads = spec.threads > 0 ? uint32_t(spec.threads) : default_threads();
  KV_RETURN_IF_ERROR(check_kv_streams(spec.kv_streams));
  if (spec.kv_streams > 0) req.kv_streams = uint32_t(spec.kv_streams);
  req.report = spec.report;
  if (!spec.requant.empty()) {
    KV_ASSIGN_OR_RETURN(req.requant, parse_requant_mode(spec.requant));
  }
  KV_RETURN_IF_ERROR(set_geometry(spec, src, model, req));
  if (model) KV_RETURN_IF_ERROR(check_blocks_divide_head_dims(*model, src, req));
  KV_RETURN_IF_ERROR(check_claimed_head_dim(spec, src, model, file));
  KV_RETURN_IF_ERROR(set_target_build(spec, src, req));
  KV_RETURN_IF_ERROR(check_upgrade(src, model, spec.cell_ext_bytes, req, src_name, warnings));

  RotationClaims claims;
  claims.src_rotation = src_word;
  claims.source_build = spec.source_build;
  claims.server_build = spec.server_build;
  std::optional<bool> mrope;
  if (model) mrope = model->profile.has_cell_ext;
  KV_ASSIGN_OR_RETURN(SourceRotation d, decide_source_rotation(file, src, req.geometry, mrope, claims));
  apply_source_rotation(d, req);
  if (decision) *decision = std::move(d);
  return req;
}

void apply_writer_claims(const SourceClaims& writer, ConversionSpec& spec) {
  if (spec.source_build.empty() && spec.server_build.empty() && !writer.llama_build.empty()) {
    (writer.llama_build_from == "llama-server" ? spec.server_build : spec.source_build) = writer.llama_build;
  }
  if ((spec.src_rotation.empty() || spec.src_rotation == "auto") && !writer.src_rotation.empty()) {
    spec.src_rotation = writer.src_rotation;
  }
}

Status check_writer_claims(const SourceClaims& writer, const StateFile& src, const ModelInfo* model,
                           const std::string& src_name) {
  if (!writer.src_rotation.empty() && writer.src_rotation != "on" && writer.src_rotation != "off" &&
      writer.src_rotation != "auto") {
    return Status::InvalidArgument("the source rotation must be auto, on or off, not '" + writer.src_rotation + "'");
  }
  if (writer.llama_build.empty()) return Status::OK();
  const std::string from = writer.llama_build_from == "llama-server" ? "llama-server's /props build_info"
                                                                       : "{--source-build}";
  auto build = parse_llama_build(writer.llama_build);
  if (!build.ok()) return build.status().Prefixed(src_name + ": " + from);
  std::optional<bool> mrope;
  if (model) mrope = model->profile.has_cell_ext;
  return check_build_wrote(src, *build, mrope)
      .Prefixed(src_name + ": llama.cpp " + writer.llama_build + " (" + writer.llama_build_from + ")")
      .Appended("; correct or drop " + from);
}

}  // namespace kvsnap
