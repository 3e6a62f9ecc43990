#include "migrate/source_rotation.h"

#include <algorithm>
#include <cstdio>

#include "format/ggml_types.h"
#include "migrate/hadamard.h"
#include "migrate/rope_head_dim.h"

namespace kvsnap {
namespace {

// Whether a tensor of this type at this section may be stored rotated by a
// rotating build: quantized, and a head dim the rule rotates (or unknown).
bool may_rotate(int32_t type, const std::vector<uint32_t>& dims, size_t si, KvSide side) {
  const TypeLayout* t = find_type(type);
  if (!t || !t->quantized) return false;
  if (si >= dims.size()) return true;
  return rotation_block_size(side, dims[si]) != 0;
}

bool holds_rotatable(const StateFile& f, const RotationGeometry& g) {
  for (size_t si = 0; si < f.memory.kv.size(); ++si) {
    for (const KvStream& st : f.memory.kv[si].streams) {
      if (st.cell_count == 0) continue;
      for (const KvLayer& L : st.layers) {
        if (may_rotate(L.k_type, g.k_head_dim, si, KvSide::kK)) return true;
        if (L.has_v && !st.v_trans && may_rotate(L.v_type, g.v_head_dim, si, KvSide::kV)) return true;
      }
    }
  }
  return false;
}

Tri tri_of(bool b) { return b ? Tri::kYes : Tri::kNo; }

const char* stored(Tri t) {
  switch (t) {
    case Tri::kYes: return "stored rotated";
    case Tri::kNo: return "stored unrotated";
    case Tri::kUnknown: break;
  }
  return "unknown";
}

// A build named by the user or by the server: checked against the file, then
// its default rotation.
Status consider_build(const std::string& text, const char* label, const StateFile& f,
                      std::optional<bool> model_has_cell_ext, SourceRotation& d) {
  const std::string from = std::string(label) == "server-build" ? "llama-server's /props build_info"
                                                                 : "{--" + std::string(label) + "}";
  auto build = parse_llama_build(text);
  if (!build.ok()) return build.status().Prefixed(from);
  KV_RETURN_IF_ERROR(check_build_wrote(f, *build, model_has_cell_ext)
                         .Prefixed(from + " " + text)
                         .Appended("; correct or drop " + from));
  KV_ASSIGN_OR_RETURN(BuildLayout L, layout_of_build(*build));
  std::string line = std::string(label) + ": llama.cpp " + text + " (era " + L.era + ")";
  if (L.rotates == Tri::kUnknown) {
    line += " falls between b8390 (does not rotate) and b8643 (rotates): its rotation is unknown";
  } else {
    line += L.rotates == Tri::kYes ? " rotates quantized K/V by default" : " does not rotate";
  }
  d.evidence.push_back(line);
  if (L.rotates != Tri::kUnknown && d.rotated == Tri::kUnknown) {
    d.rotated = L.rotates;
    d.decided_by = label;
    d.confidence = 1;
  }
  return Status::OK();
}

// The RoPE witness (migrate/rope_head_dim.h) of each KV section's first layer at the
// geometry's K head dim: how quantized K was stored, for any model's weights. A section whose
// first layer is not the model's layer 0 (the base cache of an iSWA pair, the attention cache of
// a hybrid) has no witness and says nothing.
struct RopeWitness {
  Tri says = Tri::kUnknown;
  double agreement = 0;
  std::string line;
};

Result<RopeWitness> rope_witness(const ReadableFile& file, const StateFile& f, const RotationGeometry& g) {
  RopeWitness w;
  bool yes = false, no = false;
  for (size_t s = 0; s < f.memory.kv.size() && s < g.k_head_dim.size(); ++s) {
    if (g.k_head_dim[s] == 0) continue;
    const HeadDimClaim claim{g.k_head_dim[s], s, 0, "the head dims given", g.rope_dims};
    KV_ASSIGN_OR_RETURN(HeadDimEvidence e, check_head_dim(file, f, claim));
    // A claim the data contradicts (head dims from --head-dim-k or a snapshot on a file of
    // several sections, which nothing checked before) stops here; only a confirmed one tells.
    KV_RETURN_IF_ERROR(head_dim_status(e, claim, file.name()));
    if (e.verdict != HeadDimEvidence::Verdict::kConfirmed) e.stored_rotated = Tri::kUnknown;
    if (e.stored_rotated == Tri::kUnknown) {
      if (w.line.empty()) w.line = e.summary;
      continue;
    }
    (e.stored_rotated == Tri::kYes ? yes : no) = true;
    w.agreement = std::max(w.agreement, e.agreement);
    w.line = std::string(e.stored_rotated == Tri::kYes ? "stored rotated" : "stored unrotated") + ": " + e.summary;
  }
  if (yes != no) w.says = tri_of(yes);
  if (yes && no) w.line = "the KV sections disagree; " + w.line;
  return w;
}

// One reading of the data, `says` (`reading` in words: "the data looks unrotated"), weighed
// against the decision so far: it decides an unknown rotation (decided_by `label`). Against a
// build's or layout's "rotated" it stops: a rotating build run with LLAMA_ATTN_ROT_DISABLE=1 writes
// unrotated caches in the same layout, so the data is the better witness, but deciding against
// the build is the user's call. Against "unrotated" it is a note: no build before b8643 rotates,
// the layout or build is proof, the data a hint.
Status weigh_data(Tri says, const char* label, const std::string& reading, double confidence, const std::string& file_name,
                  SourceRotation& d) {
  if (says == Tri::kUnknown) return Status::OK();
  if (d.rotated == Tri::kUnknown) {
    d.rotated = says;
    d.decided_by = label;
    d.confidence = confidence;
  } else if (says != d.rotated && d.rotated == Tri::kYes) {
    return Status::Ambiguous(file_name + ": the " + d.decided_by + " says the quantized caches are stored rotated, but " +
                             reading + "; was it saved with LLAMA_ATTN_ROT_DISABLE=1? Pass {--src-rotation} off if so, "
                             "{--src-rotation} on to keep the build's default");
  } else if (says != d.rotated && std::string(label) == "rope" &&
             (d.decided_by == "source-build" || d.decided_by == "server-build")) {
    // Layer 0's RoPE, confirmed, shows rotated K: a build that does not rotate cannot have written
    // it. Taken at its word, the file was read as unrotated and rotated again (exit 0).
    return Status::Mismatch(file_name + ": layer 0's RoPE shows K stored rotated, which the " + d.decided_by +
                            " cannot have written (it does not rotate): is that the build that wrote this file? Pass "
                            "the right one, or {--src-rotation} off to read it as unrotated all the same");
  } else if (says != d.rotated) {
    d.evidence.push_back(std::string("note: the ") + (std::string(label) == "rope" ? "RoPE" : "data") +
                         " disagrees with the " + d.decided_by + ", which proves no rotation");
  }
  return Status::OK();
}

std::string percent(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", x * 100);
  return b;
}

}  // namespace

Result<SourceRotation> decide_source_rotation(const ReadableFile* file, const StateFile& f,
                                              const RotationGeometry& geometry, std::optional<bool> model_has_cell_ext,
                                              const RotationClaims& claims) {
  SourceRotation d;
  d.matters = holds_rotatable(f, geometry);
  const FileEra era = era_of_file(f, model_has_cell_ext);
  d.evidence.push_back("layout: era " + era.eras + " (llama.cpp " + era.builds + "): " + era.why);

  const bool declared = claims.src_rotation == "on" || claims.src_rotation == "off";
  if (declared) {
    d.rotated = tri_of(claims.src_rotation == "on");
    d.decided_by = "declared";
    d.confidence = 1;
    d.evidence.push_back("declared: {--src-rotation} " + claims.src_rotation);
    // "off" against a rotating build's layout is LLAMA_ATTN_ROT_DISABLE=1 and wins; "on" against
    // a layout no rotating build writes (eras before b8643's rotation) cannot be true: taken at
    // its word, unrotated K was un-rotated (exit 0, wrong values), where a --source-build as wrong
    // is refused.
    if (d.matters && d.rotated == Tri::kYes && era.rotates == Tri::kNo) {
      return Status::Mismatch((file ? file->name() : std::string("the input")) + ": {--src-rotation} on, but its layout is era " +
                              era.eras + " (llama.cpp " + era.builds + "): " + era.why +
                              "; no build that writes it rotates K. Is it the file you meant? Pass {--src-rotation} "
                              "auto (or off) to read it as stored");
    }
    if (era.rotates != Tri::kUnknown && era.rotates != d.rotated) {
      d.evidence.push_back(std::string("note: the layout says ") + stored(era.rotates) + "; the declaration wins");
    }
  } else if (!claims.src_rotation.empty() && claims.src_rotation != "auto") {
    return Status::InvalidArgument("{--src-rotation} must be auto, on or off, not '" + claims.src_rotation + "'");
  }
  // A build named beside a declaration is still checked against the file and reported (it
  // was ignored: a build that cannot have written the file passed unseen); the declaration
  // keeps the rotation.
  const std::string file_name = file ? file->name() : std::string("the input");
  if (!claims.source_build.empty()) {
    KV_RETURN_IF_ERROR(consider_build(claims.source_build, "source-build", f, model_has_cell_ext, d).Prefixed(file_name));
  }
  if (!claims.server_build.empty()) {
    KV_RETURN_IF_ERROR(consider_build(claims.server_build, "server-build", f, model_has_cell_ext, d).Prefixed(file_name));
  }
  if (declared) return d;
  if (d.rotated == Tri::kUnknown && era.rotates != Tri::kUnknown) {
    d.rotated = era.rotates;
    d.decided_by = "file-format";
    d.confidence = 1;
  }

  bool by_rope = false;
  if (d.matters && file && geometry.known()) {
    KV_ASSIGN_OR_RETURN(RopeWitness rope, rope_witness(*file, f, geometry));
    d.evidence.push_back("data (RoPE of layer 0): " + (rope.line.empty() ? std::string("no quantized K") : rope.line));
    by_rope = rope.says != Tri::kUnknown && d.rotated == Tri::kUnknown;
    KV_RETURN_IF_ERROR(weigh_data(rope.says, "rope", "layer 0's RoPE fits only unrotated K (" + rope.line + ")",
                                  rope.agreement, file->name(), d));
  }

  if (d.matters && file && geometry.known()) {
    KV_ASSIGN_OR_RETURN(RotationEvidence ev, detect_rotation(*file, f, geometry));
    d.data = ev;
    d.evidence.push_back(std::string("data: ") + verdict_name(ev.verdict) + " (confidence " +
                         percent(ev.confidence) + "): " + ev.summary);
    const Tri says = ev.verdict == RotationEvidence::Verdict::kUnsure   ? Tri::kUnknown
                     : ev.verdict == RotationEvidence::Verdict::kRotated ? Tri::kYes
                                                                         : Tri::kNo;
    if (by_rope && says != Tri::kUnknown && says != d.rotated) {
      // Two readings of the data disagree: neither is taken.
      return Status::Ambiguous(file->name() + ": layer 0's RoPE says the quantized caches are " + stored(d.rotated) +
                               ", their channel energy says " + stored(says) + " (" + ev.summary +
                               "); pass {--src-rotation} on|off or {--source-build} bNNNN to settle it");
    }
    KV_RETURN_IF_ERROR(weigh_data(says, "data", "the data looks unrotated (" + ev.summary + ")", ev.confidence,
                                  file->name(), d));
  } else if (d.matters && file && d.rotated == Tri::kUnknown) {
    d.evidence.push_back("data: not examined (the head dims come from the model: pass {--model GGUF})");
  }
  if (!d.matters && d.rotated == Tri::kUnknown) d.decided_by = "not-needed";
  return d;
}

void apply_source_rotation(const SourceRotation& d, ConvertRequest& req) {
  if (d.rotated != Tri::kUnknown) req.src_rotates = d.rotated == Tri::kYes;
}

nlohmann::ordered_json source_rotation_json(const SourceRotation& d) {
  nlohmann::ordered_json j;
  j["needed"] = d.matters;
  j["rotated"] = d.rotated == Tri::kUnknown ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(d.rotated == Tri::kYes);
  j["decided_by"] = d.decided_by;
  j["confidence"] = d.confidence;
  j["evidence"] = d.evidence;
  if (d.data) {
    j["data"] = {{"verdict", verdict_name(d.data->verdict)}, {"score", d.data->score},
                 {"confidence", d.data->confidence}, {"tensors", d.data->tensors},
                 {"for_rotated", d.data->for_rotated}, {"for_plain", d.data->for_plain}};
  } else {
    j["data"] = nullptr;
  }
  return j;
}

std::string source_rotation_text(const SourceRotation& d) {
  std::string s = "  rotation of quantized K/V: ";
  if (!d.matters && d.rotated == Tri::kUnknown) {
    s += "not needed (no quantized K/V that llama.cpp rotates)\n";
  } else if (d.rotated == Tri::kUnknown) {
    s += "UNKNOWN (conversions that depend on it are refused: {--source-build} or {--src-rotation} settles it)\n";
  } else {
    s += std::string(stored(d.rotated)) + " (decided by " + d.decided_by + ")\n";
  }
  for (const auto& e : d.evidence) s += "    " + e + "\n";
  return s;
}

}  // namespace kvsnap
