#include "migrate/convert_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <thread>
#include <type_traits>

#include "base/worker_pool.h"
#include "format/ggml_types.h"
#include "format/llama_era.h"
#include "format/rotation_rule.h"
#include "migrate/convert_row.h"
#include "migrate/exact_requant.h"
#include "migrate/type_traits.h"

namespace kvsnap {
namespace {

// Bytes of source or target rows one worker converts at a time: small enough
// that the last blocks of a tensor keep every worker busy and stay in cache.
constexpr uint64_t kBlockBytes = 1u << 20;
// ... and at most, for a source that reads more at once (eight 512 KiB chunks).
constexpr uint64_t kReadBlockBytes = 4u << 20;

// The most rows any of T workers converts when blocks of `per_block` rows go round-robin
// (worker w takes blocks w, w + T, ...): what the tensor's wall time follows.
uint64_t busiest_worker_rows(uint64_t n_rows, size_t T, uint64_t per_block) {
  uint64_t most = 0;
  for (size_t w = 0; w < T; ++w) {
    uint64_t rows = 0;
    for (uint64_t first = w * per_block; first < n_rows; first += T * per_block)
      rows += std::min(per_block, n_rows - first);
    most = std::max(most, rows);
  }
  return most;
}

bool era3(const StateFile& f) {
  switch (f.kind) {
    case StateKind::kSeqFile: return f.version >= 3;
    case StateKind::kSessionFile: return f.version >= 10;
    default: return f.version >= 3;
  }
}

std::string layer_ctx(size_t section, size_t n_sections, size_t layer, bool is_v) {
  std::string s;
  if (n_sections > 1) s += "KV section " + std::to_string(section) + ", ";
  return s + "layer " + std::to_string(layer) + " " + (is_v ? "V" : "K");
}

// Rewrites the M-RoPE cell extra of `sec` to `to` bytes: {x, y, token} (12),
// {x, y} (8) or none (0). llama.cpp fills the token from the batch and sets
// x = y = pos for text, so a text-only cache (every cell x == y == pos) loses
// nothing either way; the token comes from the file's token list by position.
// Cells of an image (other x, y) keep their 2-D positions only in 8 or 12 bytes.
Status recode_cell_ext(const std::vector<int32_t>& tokens, uint32_t to, KvSection& sec) {
  const uint32_t from = sec.ext_bytes;
  if (from == to) return Status::OK();
  // The token list is one sequence's: a cell of another sequence would get a token that is not its
  // own (a review's finding: a session with cells of seq 0 and 1 upgraded with made-up tokens).
  std::optional<int32_t> seq;
  for (KvStream& st : sec.streams) {
    for (CellMeta& c : st.cells) {
      if (to == 12 && from < 12 && c.seq_ids.size() == 1) {
        if (!seq) seq = c.seq_ids[0];
        if (c.seq_ids[0] != *seq) {
          return Status::NotSupported("v0.5.0 files keep each cell's token; kvsnap takes it from the token list, which "
                                      "is one sequence's, and these cells belong to sequences " + std::to_string(*seq) +
                                      " and " + std::to_string(c.seq_ids[0]) +
                                      ": keep the old format ({--format ggsq-v2} or {--target-build})");
        }
      }
      const bool text = c.ext[0] == c.pos && c.ext[1] == c.pos;
      if (to == 0 && !text) {
        return Status::NotSupported("a cell at position " + std::to_string(c.pos) + " holds an image's 2-D position (" +
                                    std::to_string(c.ext[0]) + ", " + std::to_string(c.ext[1]) +
                                    "), which llama.cpp b8189 and older cannot store: target b8352 or newer ({--target-build}) "
                                    "or keep the current format");
      }
      if (to == 12 && from < 12) {
        if (tokens.empty()) {
          return Status::NotSupported("v0.5.0's cells keep their token, which kvsnap takes from the input's token list, "
                                      "and this input has none (a raw buffer): keep its own layout (no {--format}), "
                                      "which the llama.cpp that made it reads");
        }
        if (!text || c.pos < 0 || size_t(c.pos) >= tokens.size() || c.seq_ids.size() != 1) {
          return Status::NotSupported("v0.5.0 files keep each cell's token; kvsnap takes it from the token list for "
                                      "text cells of one sequence, and the cell at position " +
                                      std::to_string(c.pos) + " is not one: keep the old format ({--format ggsq-v2} or "
                                      "{--target-build})");
        }
        c.ext[2] = tokens[size_t(c.pos)];
      }
    }
  }
  sec.ext_bytes = to;
  return Status::OK();
}

// Sets t.version for the format asked for, which must fit the input's kind;
// returns whether the format has the n_stream prefix (b5869 and older do not).
Result<bool> set_target_version(const StateFile& src, TargetFormat fmt, bool keep_raw_layout, StateFile& t) {
  auto want_kind = [&](StateKind k, const char* name) -> Status {
    if (src.kind != k) {
      return Status::InvalidArgument(std::string("{--format} ") + name + " needs a " + kind_name(k) + ", the input is a " +
                                     kind_name(src.kind));
    }
    return Status::OK();
  };
  bool prefix = true;
  const bool raw = src.kind == StateKind::kRawSeq || src.kind == StateKind::kRawContext;
  if (raw && keep_raw_layout && fmt == TargetFormat::kSameKindCurrent) {
    t.version = src.version;
    t.raw_seq_tagged = src.raw_seq_tagged;
    return src.memory.kv.empty() || src.memory.kv.front().stream_prefix;
  }
  switch (fmt) {
    case TargetFormat::kSameKindCurrent:
      if (src.kind == StateKind::kSeqFile) t.version = kGgsqVersionCurrent;
      if (src.kind == StateKind::kSessionFile) t.version = kGgsnVersionCurrent;
      if (src.kind == StateKind::kRawSeq) {
        t.version = 3;
        t.raw_seq_tagged = true;
      }
      if (src.kind == StateKind::kRawContext) t.version = 3;
      break;
    case TargetFormat::kGgsqV3: KV_RETURN_IF_ERROR(want_kind(StateKind::kSeqFile, "ggsq-v3")); t.version = 3; break;
    case TargetFormat::kGgsqV2: KV_RETURN_IF_ERROR(want_kind(StateKind::kSeqFile, "ggsq-v2")); t.version = 2; break;
    case TargetFormat::kGgsqV2NoStream:
      KV_RETURN_IF_ERROR(want_kind(StateKind::kSeqFile, "ggsq-v2-b5640"));
      t.version = 2;
      prefix = false;
      break;
    case TargetFormat::kGgsqV2NoSeqIds:
      KV_RETURN_IF_ERROR(want_kind(StateKind::kSeqFile, "ggsq-v2-b3543"));
      t.version = 2;
      prefix = false;
      break;
    case TargetFormat::kGgsqV1:
      KV_RETURN_IF_ERROR(want_kind(StateKind::kSeqFile, "ggsq-v1-b3166"));
      t.version = 1;
      prefix = false;
      break;
    case TargetFormat::kGgsnV8:
      KV_RETURN_IF_ERROR(want_kind(StateKind::kSessionFile, "ggsn-v8-b3543"));
      t.version = 8;
      prefix = false;
      break;
    case TargetFormat::kGgsnV6:
      KV_RETURN_IF_ERROR(want_kind(StateKind::kSessionFile, "ggsn-v6-b3166"));
      if (!src.legacy) {
        return Status::NotSupported("a ggsn v6 session (b3166) starts with that build's raw llama_hparams of the "
                                    "model, which kvsnap takes only from a ggsn v6 input; this input is " +
                                    std::string("ggsn v") + std::to_string(src.version));
      }
      t.version = 6;
      prefix = false;
      break;
    case TargetFormat::kGgsnV10: KV_RETURN_IF_ERROR(want_kind(StateKind::kSessionFile, "ggsn-v10")); t.version = 10; break;
    case TargetFormat::kGgsnV9: KV_RETURN_IF_ERROR(want_kind(StateKind::kSessionFile, "ggsn-v9")); t.version = 9; break;
    case TargetFormat::kGgsnV9NoStream:
      KV_RETURN_IF_ERROR(want_kind(StateKind::kSessionFile, "ggsn-v9-b5640"));
      t.version = 9;
      prefix = false;
      break;
  }
  return prefix;
}

// A ggsn v6 input (b3166's legacy dump) converts to a later format only
// without holes and with a known architecture.
Status drop_legacy(const StateFile& src, StateFile& t) {
  if (t.version == 6 && t.kind == StateKind::kSessionFile) return Status::OK();
  t.legacy.reset();
  // The legacy dump lists kv_head cells, empty ones (pos -1, no sequence) with their rows;
  // every later format lists live cells only, and the converter keeps rows and cells 1:1.
  if (src.legacy && src.legacy->empty_cells) {
    return Status::NotSupported(std::to_string(src.legacy->empty_cells) +
                                " of the session's cells are empty (pos -1, no sequence: a hole left by a removed "
                                "sequence in b3166's cache); kvsnap converts ggsn v6 sessions without holes only. "
                                "Load it in b3166, save a sequence (ggsq v1) file and convert that");
  }
  if (src.legacy && t.arch.empty()) {
    return Status::NotSupported("a ggsn v6 session does not name its model's architecture, which later session "
                                "formats store: read it with {--model GGUF}");
  }
  return Status::OK();
}

// Session outputs and RNG text as the target session version holds them.
void set_session_extras(const StateFile& src, const std::optional<BuildLayout>& target, StateFile& t) {
  // v9 sessions carry outputs up to b8121 and none from b8179; v10 none.
  // Going down, an empty outputs block is valid for the older builds.
  if (t.version == 10 || (target && target->session_outputs == Tri::kNo)) t.outputs.reset();
  const bool want = target ? target->session_outputs == Tri::kYes : src.version != 9;
  if (t.version == 9 && !t.outputs && want) {
    t.outputs = SessionOutputs{};
  }
  // v8 (b3543) always holds outputs and the sampler's RNG as text, which b3543 parses
  // with `>> std::mt19937` and otherwise ignores for the cache: a fresh engine's state serves.
  if (t.version == 8 || t.version == 6) {
    if (!t.outputs) t.outputs = SessionOutputs{};
    if (t.rng.empty()) {
      std::ostringstream rng;
      rng << std::mt19937();
      t.rng = rng.str();
    }
  } else {
    t.rng.clear();
  }
}

// ggsq cells: no seq id up to b4980 (the reader there refuses one), the saved
// sequence's (always 0 in a file) from b5640 on (the reader refuses none).
void set_cell_seq_ids(TargetFormat fmt, StateFile& t) {
  const bool ids = fmt != TargetFormat::kGgsqV2NoSeqIds && fmt != TargetFormat::kGgsqV1;
  for (auto& sec : t.memory.kv) {
    for (auto& st : sec.streams) {
      for (auto& c : st.cells) {
        if (!ids) {
          c.seq_ids.clear();
        } else if (c.seq_ids.empty()) {
          c.seq_ids = {0};
        }
      }
    }
  }
}

// Older llama-server wrote plain token lists and cannot read the packed payload.
Status unpack_tokens_for_old_builds(StateFile& t) {
  if (era3(t) || t.kind != StateKind::kSeqFile || !t.tokens.packed) return Status::OK();
  if (!t.tokens.media_chunks.empty()) {
    return Status::NotSupported("the slot holds media chunks, which only the packed v0.5.0 payload can carry: keep the "
                                "current format (no {--format} or {--target-build} before v0.5.0)");
  }
  t.tokens.words = t.tokens.tokens;
  t.tokens.packed = false;
  return Status::OK();
}

Status set_stream_prefix(bool prefix, StateFile& t) {
  for (auto& sec : t.memory.kv) {
    if (!prefix && sec.streams.size() != 1) {
      return Status::NotSupported("the format chosen (llama.cpp b5869 and older: no n_stream prefix) holds one KV stream; "
                                  "this state has " + std::to_string(sec.streams.size()) +
                                  " (a llama-server with -np " + std::to_string(sec.streams.size()) +
                                  " and no -kvu keeps one per slot), which only a format with the n_stream prefix "
                                  "holds (current, or {--format} ggsq-v2 for a slot file, ggsn-v9 for a session); "
                                  "a slot file's can be rewritten to 1 with {--kv-streams} 1 (a server with -np 1 or -kvu)");
    }
    sec.stream_prefix = prefix;
  }
  return Status::OK();
}

// The cell ext of M-RoPE models: {x, y, token} in v0.5.0-era files, {x, y}
// in v2/v9 files of b8352..b10375 (old_ext: what the target build wants), none before.
Status recode_cell_exts(const StateFile& src, std::optional<uint32_t> old_ext, StateFile& t) {
  const bool raw = src.kind == StateKind::kRawSeq || src.kind == StateKind::kRawContext;
  const bool dst3 = era3(t);
  for (size_t i = 0; i < t.memory.kv.size(); ++i) {
    const uint32_t ext = src.memory.kv[i].ext_bytes;
    // A raw buffer's version is the layout it parsed with: a tagged one of b9842..b10375 reads as v3
    // yet holds v2-era cells, whose 8-byte extras say so (a review's finding: --format current kept
    // them, which v0.5.0 misreads).
    const bool src3 = era3(src) && !(raw && ext == 8);
    if (ext == 0) continue;  // none to recode (a target that wants one: check_upgrade, conversion_spec.cc)
    const std::optional<uint32_t> want = dst3 ? std::optional<uint32_t>(12) : old_ext;
    // The same era and no build named: the extra as it is. A build named within the old era still
    // decides: b10361's 8 bytes are not b8121's none (a review's finding: kept, b8121 misreads them).
    if (src3 == dst3 && (dst3 || !want)) continue;
    if (!want) {
      return Status::NotSupported("the cells carry a " + std::to_string(ext) +
                                  "-byte M-RoPE/token extra; older builds store 8 bytes (b8352..b10375) or none "
                                  "(b8189 and older): name the build that will load the file with {--target-build}");
    }
    KV_RETURN_IF_ERROR(recode_cell_ext(src.tokens.tokens, *want, t.memory.kv[i]));
  }
  return Status::OK();
}

Status apply_format(const StateFile& src, const ConvertRequest& req, StateFile& t) {
  const TargetFormat fmt = req.format;
  const std::optional<BuildLayout>& target = req.target_build;
  KV_ASSIGN_OR_RETURN(const bool prefix, set_target_version(src, fmt, req.keep_raw_layout, t));
  KV_RETURN_IF_ERROR(drop_legacy(src, t));
  if (t.kind == StateKind::kSessionFile) set_session_extras(src, target, t);
  if (t.kind == StateKind::kSeqFile) set_cell_seq_ids(fmt, t);
  if (t.kind == StateKind::kRawContext && t.version >= 3) t.outputs.reset();
  KV_RETURN_IF_ERROR(unpack_tokens_for_old_builds(t));
  KV_RETURN_IF_ERROR(set_stream_prefix(prefix, t));
  const bool raw = src.kind == StateKind::kRawSeq || src.kind == StateKind::kRawContext;
  if (raw && req.keep_raw_layout && fmt == TargetFormat::kSameKindCurrent) return Status::OK();  // its own layout
  return recode_cell_exts(src, target ? target->mrope_ext_bytes : std::nullopt, t);
}

struct SidePlan {
  const TypeTraits* src = nullptr;
  const TypeTraits* dst = nullptr;
  RotationPlan rot;
  uint64_t n_elems = 0;
};

// Whether the build that wrote (or will read) `f` rotates quantized K/V: the
// request's word when it has one, else what the file's layout proves.
Tri build_rotates(const std::optional<bool>& declared, const StateFile& f) {
  if (declared) return *declared ? Tri::kYes : Tri::kNo;
  return era_of_file(f, std::nullopt).rotates;
}

// The rotation modes an end can be in: kAuto at an end whose build does not
// rotate means "off"; where that is unknown, both are possible.
std::vector<RotationMode> possible_modes(RotationMode user, Tri rotates) {
  if (user != RotationMode::kAuto) return {user};
  switch (rotates) {
    case Tri::kYes: return {RotationMode::kAuto};
    case Tri::kNo: return {RotationMode::kOff};
    case Tri::kUnknown: break;
  }
  return {RotationMode::kAuto, RotationMode::kOff};
}

Status unknown_rotation(const std::string& ctx, const TypeTraits& a, const TypeTraits& b, const StateFile& src,
                        bool src_unknown) {
  const FileEra era = era_of_file(src, std::nullopt);
  if (src_unknown) {
    return Status::Ambiguous(
        ctx + ": converting " + std::string(a.name()) + " to " + std::string(b.name()) +
        " depends on whether the input is stored Hadamard-rotated, which the file does not record: " + era.why +
        ". Say which build wrote it ({--source-build bNNNN|vX.Y.Z}) or how it is stored ({--src-rotation on|off})");
  }
  return Status::Ambiguous(
      ctx + ": writing " + std::string(b.name()) +
      " in this format depends on whether the llama.cpp that loads it rotates quantized caches (builds from b8643 "
      "do, older ones do not): name it with {--target-build bNNNN|vX.Y.Z}, or say {--dst-rotation on|off}");
}

Result<SidePlan> plan_side(const StateFile& src, const StateFile& dst, const ConvertRequest& req, size_t si,
                           size_t il, bool is_v, int32_t src_type, int32_t dst_type, uint64_t n_elems) {
  SidePlan p;
  p.src = find_traits(src_type);
  p.dst = find_traits(dst_type);
  p.n_elems = n_elems;
  const std::string ctx = layer_ctx(si, src.memory.kv.size(), il, is_v);
  if (!p.src || !p.dst) return Status::NotSupported(ctx + ": no codec for " + type_name(src_type));
  const KvSide side = is_v ? KvSide::kV : KvSide::kK;
  const RotationOverride user = is_v ? req.v_rotation : req.k_rotation;
  // The same format version and no target named: the output is for the
  // build that wrote the input, whichever that is.
  const bool same_build = !req.dst_rotates && !req.target_build && src.kind == dst.kind && src.version == dst.version;
  const Tri src_tri = build_rotates(req.src_rotates, src);
  const Tri dst_tri = same_build ? src_tri : build_rotates(req.dst_rotates, dst);
  std::vector<std::pair<RotationMode, RotationMode>> ends;
  for (RotationMode s : possible_modes(user.src, src_tri)) {
    for (RotationMode d : possible_modes(user.dst, dst_tri)) {
      if (same_build && src_tri == Tri::kUnknown && user.src == user.dst && s != d) continue;
      ends.emplace_back(s, d);
    }
  }
  // Plans for every rotation state the ends may be in and, without the head
  // dim, for a rotating and a non-rotating one. They must all agree: what the
  // file does not record is never guessed.
  auto plan_for = [&](uint32_t hd, RotationMode s, RotationMode d) {
    return plan_rotation(*p.src->layout, *p.dst->layout, hd, side, RotationOverride{s, d});
  };
  const auto& dims = is_v ? req.geometry.v_head_dim : req.geometry.k_head_dim;
  const bool dim_known = si < dims.size();
  if (dim_known && req.geometry.across_heads(is_v, si)) {
    const uint32_t layer0 = is_v ? req.geometry.layer0_v : req.geometry.layer0_k;
    auto rotated = [](RotationMode m, const TypeLayout& t) {
      return m == RotationMode::kOn || (m == RotationMode::kAuto && t.quantized);
    };
    for (auto [s, d] : ends) {
      if (!rotated(s, *p.src->layout) && !rotated(d, *p.dst->layout)) continue;
      return Status::NotSupported(
          ctx + ": " + (rotated(s, *p.src->layout) ? "reading " + std::string(p.src->name()) : "writing " + std::string(p.dst->name())) +
          " here may cross a llama.cpp Hadamard rotation in blocks of 64 values that straddle heads (this section's "
          "layers share head dim " + std::to_string(dims[si]) + ", not a multiple of 64, while layer 0's is " +
          std::to_string(layer0) + "): such a cache is not what the model computes, and kvsnap does not convert it. "
          "Keep that end f16/bf16/f32, or use a cache written without the rotation (LLAMA_ATTN_ROT_DISABLE=1) and say "
          "{--src-rotation off} / {--dst-rotation off}");
    }
  }
  const std::vector<uint32_t> head_dims = dim_known ? std::vector<uint32_t>{dims[si]} : std::vector<uint32_t>{0, 128};
  std::optional<RotationPlan> first;
  for (uint32_t hd : head_dims) {
    for (auto [s, d] : ends) {
      {
        auto r = plan_for(hd, s, d);
        if (!r.ok()) {
          if (!dim_known && hd != 0) {
            return Status::InvalidArgument(
                ctx + ": converting " + std::string(p.src->name()) + " to " + std::string(p.dst->name()) +
                " may cross llama.cpp's Hadamard rotation, whose block depends on the head dim, which the state "
                "file does not record: pass the model with {--model GGUF} (or {--head-dim-k}/{--head-dim-v})");
          }
          return r.status().Prefixed(ctx);
        }
        if (!first) {
          first = *r;
          continue;
        }
        if (r->step == first->step && r->n_rot == first->n_rot) continue;
        if (hd != head_dims.front()) {
          return Status::InvalidArgument(
              ctx + ": converting " + std::string(p.src->name()) + " to " + std::string(p.dst->name()) +
              " crosses llama.cpp's Hadamard rotation, whose block depends on the head dim, which the state file "
              "does not record: pass the model with {--model GGUF} (or {--head-dim-k}/{--head-dim-v})");
        }
        return unknown_rotation(ctx, *p.src, *p.dst, src, s != ends.front().first);
      }
    }
  }
  p.rot = *first;
  return p;
}

// The plan of every layer side that holds cells (K, then V, per stream and layer), or the first
// that cannot be made.
Result<std::vector<SidePlan>> side_plans(const StateFile& src, const StateFile& t, const ConvertRequest& req) {
  std::vector<SidePlan> plans;
  for (size_t si = 0; si < t.memory.kv.size(); ++si) {
    const auto& ss = src.memory.kv[si].streams;
    const auto& ts = t.memory.kv[si].streams;
    for (size_t s = 0; s < ss.size(); ++s) {
      if (ss[s].cell_count == 0) continue;
      for (size_t il = 0; il < ss[s].layers.size(); ++il) {
        const KvLayer& a = ss[s].layers[il];
        const KvLayer& b = ts[s].layers[il];
        KV_ASSIGN_OR_RETURN(SidePlan k, plan_side(src, t, req, si, il, false, a.k_type, b.k_type, *layer_n_embd_k(a)));
        plans.push_back(k);
        if (a.has_v) {
          KV_ASSIGN_OR_RETURN(SidePlan v,
                              plan_side(src, t, req, si, il, true, a.v_type, b.v_type, *layer_n_embd_v(a, ss[s].v_trans)));
          plans.push_back(v);
        }
      }
    }
  }
  return plans;
}

// Accumulates the error of converted values against the source values.
struct ErrStats {
  uint64_t n = 0;
  double sq_err = 0, sq_sig = 0, max_abs = 0;
  void merge(const ErrStats& o) {
    n += o.n;
    sq_err += o.sq_err;
    sq_sig += o.sq_sig;
    max_abs = std::max(max_abs, o.max_abs);
  }
};

// A buffer that only grows and is never zero-filled: the rows it holds are
// always written before they are read.
class RowBuffer {
 public:
  std::span<std::byte> take(size_t n) {
    if (n > cap_) {
      buf_.reset(new std::byte[n]);  // default-initialized: no memset of pages about to be overwritten
      cap_ = n;
    }
    size_ = n;
    return {buf_.get(), n};
  }
  std::span<const std::byte> view() const { return {buf_.get(), size_}; }

 private:
  std::unique_ptr<std::byte[]> buf_;
  size_t cap_ = 0, size_ = 0;
};

// What every tensor of one conversion shares: the worker threads and their
// source and target blocks, made once. New threads and buffers per tensor
// would touch fresh stack, heap and thread-local decoder pages each time
// (docs/performance.md, "End to end").
struct RowWorkspace {
  explicit RowWorkspace(uint32_t threads) : pool(std::max(1u, threads)), in(pool.size()), out(pool.size()) {}
  WorkerPool pool;
  std::vector<RowBuffer> in, out;
};

// What ExactRequantizer runs under a --requant mode (auto resolved for the pair; kReference runs
// none), and the mode that names a search: the two directions of one mapping.
ExactRequantizer::Search search_for(RequantMode m, const TypeTraits& src, const TypeTraits& dst) {
  switch (m) {
    case RequantMode::kAuto: return search_by_default(src, dst);
    case RequantMode::kQuick: return ExactRequantizer::Search::kQuick;
    case RequantMode::kSearch: return ExactRequantizer::Search::kFull;
    case RequantMode::kExact:
    case RequantMode::kReference: break;
  }
  return ExactRequantizer::Search::kNone;
}

RequantMode mode_of(ExactRequantizer::Search s) {
  switch (s) {
    case ExactRequantizer::Search::kQuick: return RequantMode::kQuick;
    case ExactRequantizer::Search::kFull: return RequantMode::kSearch;
    case ExactRequantizer::Search::kNone: break;
  }
  return RequantMode::kExact;
}

// Columns j0 .. j0 + w - 1 of a transposed V tensor (column j: the value j of every one of n_cells
// cells, at j * n_cells), and the rows of cells they are made from or into. place() fills them from
// rows, take() fills rows from them; both go by tiles of 64 bytes of each row (32 f16 columns), so
// that a row's cache line is written or read once per tile, and copy a value with a typed copy
// where it is 2 or 4 bytes (a memcpy call a value was most of a restore into or out of FA-off V).
struct ColumnBlock {
  std::byte* cols;
  uint64_t n_cells, elem, j0, w;

  static uint64_t tile_columns(uint64_t elem) { return std::max<uint64_t>(1, 64 / std::max<uint64_t>(1, elem)); }

  // n rows of `row_bytes` (cells first .. first + n - 1) -> the columns.
  void place(const std::byte* rows, uint64_t n, uint64_t row_bytes, uint64_t first) const {
    by_size(rows, n, row_bytes, first);
  }
  // The columns' cells first .. first + n - 1 -> n rows of `row_bytes`.
  void take(std::byte* rows, uint64_t n, uint64_t row_bytes, uint64_t first) const { by_size(rows, n, row_bytes, first); }

 private:
  // Row: const std::byte* (rows -> columns) or std::byte* (columns -> rows).
  template <class Row>
  void by_size(Row rows, uint64_t n, uint64_t row_bytes, uint64_t first) const {
    if (elem == 2) return tiles<2>(rows, n, row_bytes, first);
    if (elem == 4) return tiles<4>(rows, n, row_bytes, first);
    tiles<0>(rows, n, row_bytes, first);
  }
  // kSize: the value's bytes, 0 for `elem` (a memcpy call).
  template <size_t kSize, class Row>
  void tiles(Row rows, uint64_t n, uint64_t row_bytes, uint64_t first) const {
    constexpr bool kToColumns = std::is_const_v<std::remove_pointer_t<Row>>;
    const uint64_t e = kSize ? kSize : elem, tile = tile_columns(e);
    for (uint64_t jt = 0; jt < w; jt += tile) {
      const uint64_t je = std::min(w, jt + tile);
      for (uint64_t c = 0; c < n; ++c) {
        Row row = rows + c * row_bytes + (j0 + jt) * e;
        for (uint64_t j = jt; j < je; ++j) {
          std::byte* col = cols + (j * n_cells + first + c) * e;
          if constexpr (kToColumns) std::memcpy(col, row + (j - jt) * e, kSize ? kSize : e);
          else std::memcpy(row + (j - jt) * e, col, kSize ? kSize : e);
        }
      }
    }
  }
};

// Converts rows with one RowConverter per worker and optional error stats.
class RowPipeline {
 public:
  // read_cells, chunk_cells: rows of one cell each that the source reads best at once, and the cells
  // of each of its chunks (conversion_block_rows); 0 for rows of another kind (transposed V's columns).
  static Result<RowPipeline> make(const SidePlan& p, uint32_t threads, bool report, RequantMode requant,
                                  uint64_t read_cells = 0, uint64_t chunk_cells = 0) {
    RowPipeline rp;
    rp.plan_ = p;
    rp.report_ = report;
    rp.read_cells_ = read_cells;
    rp.chunk_cells_ = chunk_cells;
    // Between two quantized types in the same rotation domain, keep every
    // block that the target can hold exactly (migrate/exact_requant.h), unless
    // the request asks for the reference requantization; auto searches where
    // search_by_default says the search pays.
    const bool same_domain = p.rot.step == RotationStep::kNone && exact_requant_applies(*p.src, *p.dst);
    const bool exact = same_domain && requant != RequantMode::kReference;
    const ExactRequantizer::Search search = search_for(requant, *p.src, *p.dst);
    if (same_domain) rp.requant_ = exact ? mode_of(search) : RequantMode::kReference;  // what runs, auto resolved
    for (uint32_t i = 0; i < std::max(1u, threads); ++i) {
      KV_ASSIGN_OR_RETURN(RowConverter c, RowConverter::make(*p.src, *p.dst, p.n_elems, p.rot));
      rp.workers_.push_back(std::move(c));
      if (exact) {
        KV_ASSIGN_OR_RETURN(ExactRequantizer e, ExactRequantizer::make(*p.src, *p.dst, p.n_elems, search));
        rp.exact_.push_back(std::move(e));
      }
    }
    rp.stats_.resize(rp.workers_.size());
    return rp;
  }
  uint64_t src_row() const { return workers_[0].src_row_bytes(); }
  uint64_t dst_row() const { return workers_[0].dst_row_bytes(); }
  bool is_copy() const { return workers_[0].is_copy(); }
  // How quantized -> quantized blocks were made (auto resolved); nullopt: not such a pair.
  std::optional<RequantMode> requant() const { return requant_; }
  uint64_t blocks_exact() const {
    uint64_t n = 0;
    for (const auto& e : exact_) n += e.blocks_exact();
    return n;
  }
  uint64_t blocks_requantized() const {
    uint64_t n = 0;
    for (const auto& e : exact_) n += e.blocks_requantized();
    return n;
  }

  // Converts n_rows rows on `ws`'s workers. `fetch(first_row, n, dst)` fills n source rows;
  // `deliver(bytes)` receives converted rows in order. Worker w converts blocks w, w + T, ...
  // and delivers each itself as soon as the block before it is delivered (OrderedHandOff): while
  // one worker delivers (a copy into the sink), the others convert, with no round for all to wait on.
  template <class Fetch, class Deliver>
  Status run(RowWorkspace& ws, uint64_t n_rows, Fetch fetch, Deliver deliver) {
    return run_placed(ws, n_rows, fetch, [](uint64_t, std::span<const std::byte>) { return Status::OK(); }, deliver);
  }

  // As run, with `place(first_row, bytes)` called on the worker that converted each block before it
  // is handed on: concurrently and in no order, for blocks that go to disjoint places (transposed
  // V's columns), where doing it in `deliver` would do it on one worker at a time.
  template <class Fetch, class Place, class Deliver>
  Status run_placed(RowWorkspace& ws, uint64_t n_rows, Fetch fetch, Place place, Deliver deliver) {
    if (n_rows == 0) return Status::OK();
    const size_t T = std::min(workers_.size(), ws.pool.size());
    const uint64_t per_block =
        conversion_block_rows(n_rows, T, std::max(src_row(), dst_row()), read_cells_, chunk_cells_);
    const uint64_t n_blocks = (n_rows + per_block - 1) / per_block;
    const bool copy = is_copy();  // bytes pass through: the fetched block is delivered as it is
    OrderedHandOff order;
    ws.pool.run(size_t(std::min<uint64_t>(T, n_blocks)), [&](size_t w) {
      try {
        for (uint64_t b = w; b < n_blocks; b += T) {
          const uint64_t first = b * per_block;
          const uint64_t n = std::min(per_block, n_rows - first);
          std::span<std::byte> in = ws.in[w].take(n * src_row());
          std::span<std::byte> out = copy ? in : ws.out[w].take(n * dst_row());
          Status s = fetch(first, n, in);
          if (s.ok() && !copy) s = exact_.empty() ? workers_[w].convert(in, out) : exact_[w].convert(in, out);
          if (s.ok() && report_ && !copy) measure(w, in, out, n);
          if (s.ok()) s = place(first, std::span<const std::byte>(out));
          if (!order.hand_on(b, s, [&] { return deliver(std::span<const std::byte>(out)); })) return;
        }
      } catch (...) {
        order.abandon();
        throw;
      }
    });
    return order.status();
  }

  ErrStats stats() const {
    ErrStats s;
    for (const auto& x : stats_) s.merge(x);
    return s;
  }

 private:
  void measure(size_t w, std::span<const std::byte> in, std::span<const std::byte> out, uint64_t n_rows) {
    const uint64_t n = plan_.n_elems;
    std::vector<float> a(n), b(n);
    ErrStats& s = stats_[w];
    for (uint64_t r = 0; r < n_rows; ++r) {
      plan_.src->to_f32(in.data() + r * src_row(), a.data(), n);
      apply_rotation(plan_.rot, a.data(), n);
      plan_.dst->to_f32(out.data() + r * dst_row(), b.data(), n);
      for (uint64_t i = 0; i < n; ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
        const double e = double(b[i]) - double(a[i]);
        s.sq_err += e * e;
        s.sq_sig += double(a[i]) * double(a[i]);
        s.max_abs = std::max(s.max_abs, std::fabs(e));
        ++s.n;
      }
    }
  }

  SidePlan plan_;
  bool report_ = false;
  uint64_t read_cells_ = 0, chunk_cells_ = 0;
  std::vector<RowConverter> workers_;
  std::vector<ExactRequantizer> exact_;  // used instead of workers_ when not empty
  std::optional<RequantMode> requant_;
  std::vector<ErrStats> stats_;
};

class ConvertingSource final : public TensorSource {
 public:
  ConvertingSource(const StateFile& src, const ReadableFile& in, const ConvertRequest& req)
      : src_(src), in_(in), req_(req), ws_(req.threads) {}

  Status emit(const StateFile& target, const TensorRef& ref, ByteSink& out) override {
    const KvStream& ss = src_.memory.kv[ref.section].streams[ref.stream];
    const KvStream& ts = target.memory.kv[ref.section].streams[ref.stream];
    const KvLayer& sl = ss.layers[ref.layer];
    const KvLayer& tl = ts.layers[ref.layer];
    const uint64_t n_cells = ss.cell_count;
    SidePlan plan;
    if (!ref.is_v) {
      KV_ASSIGN_OR_RETURN(plan, plan_side(src_, target, req_, ref.section, ref.layer, false, sl.k_type, tl.k_type,
                                          *layer_n_embd_k(sl)));
      KV_ASSIGN_OR_RETURN(RowPipeline rp,
                          RowPipeline::make(plan, req_.threads, req_.report, req_.requant,
                                                         req_.source_read_cells, req_.source_chunk_cells));
      KV_RETURN_IF_ERROR(rows_to_rows(rp, sl.k, n_cells, out));
      record(ref, false, plan, rp);
      return Status::OK();
    }
    const uint64_t n_embd = *layer_n_embd_v(sl, ss.v_trans);
    KV_ASSIGN_OR_RETURN(plan, plan_side(src_, target, req_, ref.section, ref.layer, true, sl.v_type, tl.v_type, n_embd));
    if (!ss.v_trans && !ts.v_trans) {
      KV_ASSIGN_OR_RETURN(RowPipeline rp,
                          RowPipeline::make(plan, req_.threads, req_.report, req_.requant,
                                                         req_.source_read_cells, req_.source_chunk_cells));
      KV_RETURN_IF_ERROR(rows_to_rows(rp, sl.v, n_cells, out));
      record(ref, true, plan, rp);
    } else if (ss.v_trans && ts.v_trans) {
      // Both column-wise and both float: the conversion is per value, so the
      // columns convert as rows of n_cells values, in file order.
      if (plan.rot.step != RotationStep::kNone) {
        return Status::InvalidArgument("transposed V cannot be rotated (it is always a float type)");
      }
      SidePlan cols = plan;
      cols.n_elems = n_cells;
      KV_ASSIGN_OR_RETURN(RowPipeline rp, RowPipeline::make(cols, req_.threads, req_.report, req_.requant));
      KV_RETURN_IF_ERROR(rows_to_rows(rp, sl.v, n_embd, out));
      record(ref, true, plan, rp);
    } else if (ss.v_trans && !ts.v_trans) {
      KV_ASSIGN_OR_RETURN(RowPipeline rp, RowPipeline::make(plan, req_.threads, req_.report, req_.requant));
      KV_RETURN_IF_ERROR(columns_to_rows(rp, sl, n_cells, n_embd, out));
      record(ref, true, plan, rp);
    } else {  // its source rows are cells, as K's: the same blocks
      KV_ASSIGN_OR_RETURN(RowPipeline rp, RowPipeline::make(plan, req_.threads, req_.report, req_.requant,
                                                            req_.source_read_cells, req_.source_chunk_cells));
      KV_RETURN_IF_ERROR(rows_to_columns(rp, sl, tl, n_cells, n_embd, out));
      record(ref, true, plan, rp);
    }
    return Status::OK();
  }

  std::vector<LayerReport> reports;

 private:
  // A copy (same type, no rotation step) goes through the workers too: reading a stored snapshot
  // decodes and checks its chunks, which one thread alone did at half the pipeline's speed.
  Status rows_to_rows(RowPipeline& rp, ByteRange range, uint64_t n_rows, ByteSink& out) {
    const uint64_t row = rp.src_row();
    return rp.run(
        ws_, n_rows,
        [&](uint64_t first, uint64_t n, std::span<std::byte> dst) {
          return in_.read_at(range.offset + first * row, dst.first(n * row));
        },
        [&](std::span<const std::byte> b) { return out.append(b); });
  }

  // Source V stored column-wise (element j of every cell, then j+1...):
  // gather a block of cells into rows, then convert the rows.
  Status columns_to_rows(RowPipeline& rp, const KvLayer& sl, uint64_t n_cells, uint64_t n_embd, ByteSink& out) {
    const uint64_t e = sl.v_elem_bytes;
    return rp.run(
        ws_, n_cells,
        [&, e](uint64_t c0, uint64_t n, std::span<std::byte> dst) -> Status {
          // A tile of columns' pieces at a time, then each cell's run of them written together.
          const uint64_t tile = std::min(ColumnBlock::tile_columns(e), n_embd);
          std::vector<std::byte> pieces(tile * n * e);
          for (uint64_t jt = 0; jt < n_embd; jt += tile) {
            const uint64_t w = std::min(tile, n_embd - jt);
            for (uint64_t j = 0; j < w; ++j) {
              KV_RETURN_IF_ERROR(in_.read_at(sl.v.offset + ((jt + j) * n_cells + c0) * e,
                                             std::span<std::byte>(pieces).subspan(j * n * e, n * e)));
            }
            const ColumnBlock from{pieces.data(), n, e, 0, w};
            from.take(dst.data() + jt * e, n, n_embd * e, 0);
          }
          return Status::OK();
        },
        [&](std::span<const std::byte> b) { return out.append(b); });
  }

  // Target V column-wise: for each block of columns, convert every cell's row
  // and keep that block's columns; one pass over the source V per block.
  Status rows_to_columns(RowPipeline& rp, const KvLayer& sl, const KvLayer& tl, uint64_t n_cells, uint64_t n_embd,
                         ByteSink& out) {
    const uint64_t e = tl.v_elem_bytes;
    const uint64_t dst_row = rp.dst_row();
    const uint64_t width =
        std::clamp<uint64_t>(req_.column_budget_bytes / std::max<uint64_t>(1, n_cells * e), 1, n_embd);
    std::vector<std::byte> cols;
    for (uint64_t j0 = 0; j0 < n_embd; j0 += width) {
      const uint64_t w = std::min(width, n_embd - j0);
      cols.assign(w * n_cells * e, std::byte{0});
      const uint64_t row = rp.src_row();
      KV_RETURN_IF_ERROR(rp.run_placed(
          ws_, n_cells,
          [&](uint64_t first, uint64_t n, std::span<std::byte> dst) {
            return in_.read_at(sl.v.offset + first * row, dst.first(n * row));
          },
          [&](uint64_t first, std::span<const std::byte> b) {
            const ColumnBlock to{cols.data(), n_cells, e, j0, w};
            to.place(b.data(), b.size() / dst_row, dst_row, first);
            return Status::OK();
          },
          [](std::span<const std::byte>) { return Status::OK(); }));
      KV_RETURN_IF_ERROR(out.append(cols));
    }
    return Status::OK();
  }

  void record(const TensorRef& ref, bool is_v, const SidePlan& plan, const RowPipeline& rp) {
    if (!req_.report) return;
    LayerReport r;
    r.section = ref.section;
    r.layer = ref.layer;
    r.is_v = is_v;
    r.src_type = std::string(plan.src->name());
    r.dst_type = std::string(plan.dst->name());
    r.rotation = plan.rot.step == RotationStep::kNone
                     ? "none"
                     : std::string(to_string(plan.rot.step)) + "-" + std::to_string(plan.rot.n_rot);
    r.copied = rp.is_copy();
    r.blocks_exact = rp.blocks_exact();
    r.blocks_requantized = rp.blocks_requantized();
    if (rp.requant()) r.requant = requant_mode_name(*rp.requant());
    const ErrStats s = rp.stats();
    r.values = s.n;
    if (r.copied) {
      r.rmse = r.max_abs = 0;
      r.snr_db = std::numeric_limits<double>::infinity();
    } else if (s.n) {
      r.rmse = std::sqrt(s.sq_err / double(s.n));
      r.max_abs = s.max_abs;
      r.signal_rms = std::sqrt(s.sq_sig / double(s.n));
      r.snr_db = s.sq_err > 0 ? 10.0 * std::log10(s.sq_sig / s.sq_err) : std::numeric_limits<double>::infinity();
    }
    // Several streams: keep one line per (section, layer, side) with the merged numbers.
    reports.push_back(r);
  }

  const StateFile& src_;
  const ReadableFile& in_;
  const ConvertRequest& req_;
  RowWorkspace ws_;
};

// Every TargetFormat has one row of kTargetFormats (kGgsnV6 is the last enumerator).
constexpr bool every_format_has_one_row() {
  for (int f = 0; f <= int(TargetFormat::kGgsnV6); ++f) {
    int n = 0;
    for (const TargetFormatRow& r : kTargetFormats) n += r.format == TargetFormat(f) ? 1 : 0;
    if (n != 1) return false;
  }
  return std::size(kTargetFormats) == size_t(TargetFormat::kGgsnV6) + 1;
}
static_assert(every_format_has_one_row(), "kTargetFormats: one row per TargetFormat");

}  // namespace

// Rows one worker converts at a time (convert_state.h): at most kBlockBytes of source or target,
// no more than a T-th of the tensor (small tensors still use every worker), and a power of two, so
// blocks start where the store's chunks do (they hold 256 cells of a tensor: format/snapshot.h)
// and a restore decodes each chunk once, straight into a block, never twice through its shared
// cache. (Not where a block is under 256 rows, nor after an extension's cell restart, whose chunks
// start at its parent's cell count: the chunks a block cuts then go through that cache, slower
// and the same bytes.) A source that reads `read_cells` rows best at once (ConvertRequest::source_read_cells: a
// snapshot's original checks several chunks together) gets blocks of up to that many rows (at most
// kReadBlockBytes) where they leave no worker more rows than the blocks above do: a power of two,
// or, where the source's chunks hold `chunk_cells` cells each and the first size is a multiple of
// it, any multiple of it (2 KiB rows of 256-cell chunks, 2 workers: 3,212 cells take 768-row blocks
// with reads of 4 chunks and 1,536 with reads of 8; 16,050 take 1,024 and 2,048).
uint64_t conversion_block_rows(uint64_t n_rows, size_t T, uint64_t row_bytes, uint64_t read_cells,
                               uint64_t chunk_cells) {
  const uint64_t share = (n_rows + T - 1) / T;
  uint64_t n = 1;
  while (n * 2 * row_bytes <= kBlockBytes && n * 2 <= share) n *= 2;
  const uint64_t busiest = busiest_worker_rows(n_rows, T, n);
  auto allowed = [&](uint64_t m) { return m <= read_cells && m <= share && m * row_bytes <= kReadBlockBytes; };
  uint64_t best = n;
  for (uint64_t m = 2 * n; allowed(m); m *= 2) {
    if (busiest_worker_rows(n_rows, T, m) <= busiest) best = m;
  }
  // Multiples of the chunks' cells between the powers of two: 3,212 cells on 2 workers keep 512-row
  // blocks (1,024 would give one worker 2,048 rows), but 768 (three chunks, three SHA-256 lanes) and
  // 1,536 (six of avx2-x8's eight) leave the busier one 1,676 rows as 512 does.
  if (chunk_cells && n % chunk_cells == 0) {
    for (uint64_t m = n + chunk_cells; allowed(m); m += chunk_cells) {
      if (m > best && busiest_worker_rows(n_rows, T, m) <= busiest) best = m;
    }
  }
  return best;
}

Result<TargetFormat> parse_target_format(const std::string& s) {
  if (s.empty()) return TargetFormat::kSameKindCurrent;
  for (const TargetFormatRow& r : kTargetFormats) {
    if (r.name == s) return r.format;
  }
  return Status::InvalidArgument("unknown format '" + s + "' (one of " + target_format_names() + ")");
}

std::string target_format_names() {
  std::string names;
  for (const TargetFormatRow& r : kTargetFormats) names += (names.empty() ? "" : ", ") + std::string(r.name);
  return names;
}

const TargetFormatRow& target_format_row(TargetFormat f) {
  for (const TargetFormatRow& r : kTargetFormats) {
    if (r.format == f) return r;
  }
  return kTargetFormats[0];  // unreachable: every enumerator has its row (static_assert above)
}

// llama.cpp's LLAMA_MAX_SEQ (src/llama-cparams.h): no cache has more streams.
constexpr uint32_t kMaxKvStreams = 256;

// `src` as it reads with req.kv_streams streams: the one stream that holds the sequence's cells moved
// (or kept) and empty ones around it. Both ends of a conversion use it, so a target stream's tensors
// are read from the source stream at the same index. llama.cpp (llama_kv_cache::state_read) puts a
// sequence's cells into its own stream whichever stream of the file holds them; empty streams are a
// cell count of 0.
Result<StateFile> restreamed(const StateFile& src, const ConvertRequest& req) {
  StateFile s = src;
  if (!req.kv_streams) return s;
  const uint32_t n = *req.kv_streams;
  if (n == 0 || n > kMaxKvStreams)
    return Status::InvalidArgument("{--kv-streams} " + std::to_string(n) + ": llama.cpp's caches have 1 to " +
                                   std::to_string(kMaxKvStreams) + " streams");
  if (s.kind != StateKind::kSeqFile && s.kind != StateKind::kRawSeq) {
    bool same = true;
    for (const KvSection& sec : s.memory.kv) same = same && sec.streams.size() == n;
    if (same) return s;
    return Status::NotSupported(std::string("{--kv-streams} rewrites a sequence's state (a slot file); this is a ") +
                                kind_name(s.kind) + ", which holds every sequence, each in its own stream when "
                                "there are several: kvsnap does not move sequences between streams");
  }
  // A tagged raw buffer of sequence -1 is the whole cache, read back stream by stream at the file's own
  // index (state_read: strm = s when seq_id == -1): a sequence moved to another stream would not be
  // where its cells say (a review's finding).
  if (s.kind == StateKind::kRawSeq && s.raw_seq_tagged && s.raw_seq_id < 0)
    return Status::NotSupported("{--kv-streams}: this raw buffer is tagged with sequence " +
                                std::to_string(s.raw_seq_id) + " (every sequence), which llama.cpp reads back "
                                "stream by stream where the file has them: kvsnap does not move it");
  for (size_t si = 0; si < s.memory.kv.size(); ++si) {
    KvSection& sec = s.memory.kv[si];
    std::optional<size_t> held;
    for (size_t i = 0; i < sec.streams.size(); ++i) {
      if (sec.streams[i].cell_count == 0) continue;
      if (held)
        return Status::NotSupported("KV section " + std::to_string(si) + " holds cells in streams " +
                                    std::to_string(*held) + " and " + std::to_string(i) +
                                    ": a sequence's state has them in one, and kvsnap does not merge streams");
      held = i;
    }
    std::vector<KvStream> out(n);
    if (held) out[*held < n ? *held : 0] = std::move(sec.streams[*held]);
    sec.streams = std::move(out);
  }
  return s;
}

Result<StateFile> plan_target(const StateFile& given, const ConvertRequest& req) {
  KV_ASSIGN_OR_RETURN(const StateFile src, restreamed(given, req));
  StateFile t = src;
  KV_RETURN_IF_ERROR(apply_format(src, req, t));
  const TypeLayout* kt = req.k_type ? find_type(*req.k_type) : nullptr;
  const TypeLayout* vt = req.v_type ? find_type(*req.v_type) : nullptr;
  if (req.k_type && !kt) return Status::InvalidArgument("unknown K type " + type_name(*req.k_type));
  if (req.v_type && !vt) return Status::InvalidArgument("unknown V type " + type_name(*req.v_type));
  for (size_t si = 0; si < t.memory.kv.size(); ++si) {
    for (auto& st : t.memory.kv[si].streams) {
      // An empty stream has layers only in the layouts before b6122 (their headers): typed like the rest.
      if (st.cell_count == 0 && st.layers.empty()) continue;
      const uint32_t src_trans = st.v_trans;
      if (req.flash_attn) st.v_trans = *req.flash_attn ? 0 : 1;
      for (size_t il = 0; il < st.layers.size(); ++il) {
        KvLayer& L = st.layers[il];
        const std::string ctx = layer_ctx(si, t.memory.kv.size(), il, false);
        const uint64_t nk = *layer_n_embd_k(L);
        if (kt) L.k_type = int32_t(kt->id);
        const TypeLayout& k = *find_type(L.k_type);
        auto kr = row_bytes(k, nk);
        if (!kr.ok()) return kr.status().Prefixed(ctx + ": cannot store K as " + std::string(k.name));
        L.k_row_bytes = *kr;
        L.k = {0, *kr * st.cell_count};
        if (!L.has_v) continue;
        const std::string vctx = layer_ctx(si, t.memory.kv.size(), il, true);
        const uint64_t nv = *layer_n_embd_v(L, src_trans);
        if (vt) L.v_type = int32_t(vt->id);
        const TypeLayout& v = *find_type(L.v_type);
        if (st.v_trans) {
          if (v.quantized) {
            return Status::InvalidArgument(
                vctx + ": quantized V cache requires flash_attn to be enabled (llama.cpp): a " + std::string(v.name) +
                " V cannot be stored transposed; use {--flash-attn on} (the target server must run with -fa on)");
          }
          L.v_elem_bytes = v.block_bytes;
          L.n_embd_v_gqa = uint32_t(nv);
          L.v_row_bytes = 0;
          L.v = {0, nv * v.block_bytes * st.cell_count};
        } else {
          auto vr = row_bytes(v, nv);
          if (!vr.ok()) return vr.status().Prefixed(vctx + ": cannot store V as " + std::string(v.name));
          L.v_row_bytes = *vr;
          L.v_elem_bytes = 0;
          L.n_embd_v_gqa = 0;
          L.v = {0, *vr * st.cell_count};
        }
      }
    }
  }
  // Check every rotation plan now, so nothing is written when one is impossible.
  KV_RETURN_IF_ERROR(side_plans(src, t, req).status());
  // And what the target layout cannot hold (ggsq v1 of an iSWA model, ...).
  KV_RETURN_IF_ERROR(check_writable(t));
  return t;
}

Result<bool> rotates_values(const StateFile& given, const StateFile& target, const ConvertRequest& req) {
  KV_ASSIGN_OR_RETURN(const StateFile src, restreamed(given, req));
  KV_ASSIGN_OR_RETURN(std::vector<SidePlan> plans, side_plans(src, target, req));
  return std::any_of(plans.begin(), plans.end(), [](const SidePlan& p) { return p.rot.step != RotationStep::kNone; });
}

Result<ConvertResult> convert_state(const StateFile& given, const ReadableFile& in, const ConvertRequest& req,
                                    ByteSink& out) {
  ConvertResult res;
  auto source = restreamed(given, req);
  if (!source.ok()) return source.status().Prefixed(in.name());
  const StateFile& src = *source;
  auto target = plan_target(src, req);  // restreamed again: the same streams
  if (!target.ok()) return target.status().Prefixed(in.name());
  res.target = std::move(*target);
  ConvertingSource tensors(src, in, req);
  CountingSink count;
  struct Tee final : ByteSink {
    ByteSink& a;
    CountingSink& b;
    Tee(ByteSink& x, CountingSink& y) : a(x), b(y) {}
    using ByteSink::append;
    Status append(std::span<const std::byte> d) override {
      KV_RETURN_IF_ERROR(a.append(d));
      return b.append(d);
    }
  } tee(out, count);
  KV_RETURN_IF_ERROR(write_state(res.target, tensors, in, tee));
  res.bytes_in = in.size();
  res.bytes_out = count.count;
  res.layers = std::move(tensors.reports);
  return res;
}

const char* requant_mode_name(RequantMode m) {
  switch (m) {
    case RequantMode::kAuto: return "auto";
    case RequantMode::kQuick: return "quick";
    case RequantMode::kSearch: return "search";
    case RequantMode::kExact: return "exact";
    case RequantMode::kReference: return "reference";
  }
  return "?";
}

Result<RequantMode> parse_requant_mode(const std::string& word) {
  for (RequantMode m : {RequantMode::kAuto, RequantMode::kQuick, RequantMode::kSearch, RequantMode::kExact,
                        RequantMode::kReference})
    if (word == requant_mode_name(m)) return m;
  return Status::InvalidArgument("{--requant} must be auto, quick, search, exact or reference, not '" + word + "'");
}

bool RotationGeometry::across_heads(bool is_v, size_t section) const {
  const auto& dims = is_v ? v_head_dim : k_head_dim;
  return section < dims.size() && rotates_across_heads(dims[section], is_v ? layer0_v : layer0_k);
}

}  // namespace kvsnap
