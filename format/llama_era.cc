#include "format/llama_era.h"

#include <charconv>
#include <vector>

namespace kvsnap {
namespace {

// A change llama.cpp made without bumping the file version: the last build
// seen without it and the first seen with it (../docs/llama-formats.md, "Eras").
struct Change {
  uint32_t last_without;
  uint32_t first_with;
};
constexpr Change kStreamPrefix{5869, 6122};     // #14363: u32 n_stream before each KV section
constexpr Change kNoOutputs{8121, 8179};        // #18862: v9 sessions lose output ids, logits, embeddings
constexpr Change kCellExt8{8189, 8352};         // #20132: {x, y} per cell for M-RoPE models
constexpr Change kRotation{8390, 8643};         // #21038 (744c0c73, 2026-04-01): Hadamard-rotated quantized K/V
constexpr Change kVersion3{10375, 10645};       // #27762: ggsq 3 / ggsn 10, 12-byte cell ext
// llama_state_seq_get_data puts 0xaf143cd8 + seq id first. b8740 (llama.rn 0.12.0-rc.7, e34f042)
// rotates and has no tag: every tagged buffer comes from a rotating build.
constexpr Change kRawTag{8740, 9842};
constexpr Change kSessionV9{3543, 3889};       // ggsn 8 (RNG text after the arch name) -> 9 (no RNG)
constexpr Change kSeqCellIds{4980, 5640};      // ggsq cells: n_seq_id 0 -> 1 + the seq id
// #26640: llama-server's packed token payload. Absent in b10361; merged about 2026-08-15, so
// first_with is an estimate (no build in the window b1040x..b1063x ships llama-server to test).
constexpr Change kServerPackedTokens{10361, 10400};
constexpr uint32_t kEraA = 3166;               // ggsn 6 (legacy KV dump) / ggsq 1: own layouts
constexpr uint32_t kFirstReadable = 3543;      // era B: ggsn 8 / ggsq 2

Tri side_of(uint32_t n, Change c) {
  if (n <= c.last_without) return Tri::kNo;
  if (n >= c.first_with) return Tri::kYes;
  return Tri::kUnknown;
}

std::string b(uint32_t n) { return "b" + std::to_string(n); }

// Era letters of a build number, with "X|Y" inside a gap.
std::string era_letters(uint32_t n) {
  struct Span {
    uint32_t first, last;
    const char* name;
  };
  static const Span spans[] = {{kFirstReadable, kSessionV9.last_without, "B"},
                               {kSessionV9.first_with, kStreamPrefix.last_without, "C"},
                               {kStreamPrefix.first_with, kNoOutputs.last_without, "D"},
                               {kNoOutputs.first_with, kCellExt8.last_without, "E"},
                               {kCellExt8.first_with, kRotation.last_without, "F"},
                               {kRotation.first_with, kVersion3.last_without, "G"},
                               {kVersion3.first_with, UINT32_MAX, "H"}};
  for (size_t i = 0; i < std::size(spans); ++i) {
    if (n >= spans[i].first && n <= spans[i].last) return spans[i].name;
    if (i + 1 < std::size(spans) && n > spans[i].last && n < spans[i + 1].first) {
      return std::string(spans[i].name) + "|" + spans[i + 1].name;
    }
  }
  return "?";
}

std::optional<uint32_t> version_for(Tri v3, uint32_t old_v, uint32_t new_v) {
  if (v3 == Tri::kUnknown) return std::nullopt;
  return v3 == Tri::kYes ? new_v : old_v;
}

bool parse_uint(std::string_view s, uint32_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool is_old_format(const StateFile& f) {
  switch (f.kind) {
    case StateKind::kSeqFile: return f.version < 3;
    case StateKind::kSessionFile: return f.version < 10;
    case StateKind::kRawSeq: return !f.raw_seq_tagged && f.version < 3;
    case StateKind::kRawContext: return f.version < 3;
  }
  return false;
}

bool has_stream_prefix(const StateFile& f) {
  return f.memory.kv.empty() || f.memory.kv[0].stream_prefix;
}

// The cell ext of the KV sections that hold cells, or nullopt when none do.
std::optional<uint32_t> cell_ext(const StateFile& f) {
  for (const auto& sec : f.memory.kv) {
    for (const auto& st : sec.streams) {
      if (st.cell_count) return sec.ext_bytes;
    }
  }
  return std::nullopt;
}

// Whether the cells of a sequence file carry their seq id: yes (b5640 on), no
// (b4980 and older), nullopt when there are no cells or it is not a ggsq file.
std::optional<bool> seq_cell_ids(const StateFile& f) {
  if (f.kind != StateKind::kSeqFile) return std::nullopt;
  for (const auto& sec : f.memory.kv) {
    for (const auto& st : sec.streams) {
      if (!st.cells.empty()) return !st.cells[0].seq_ids.empty();
    }
  }
  return std::nullopt;
}

bool has_outputs_field(const StateFile& f) {
  return f.kind == StateKind::kSessionFile || f.kind == StateKind::kRawContext;
}

std::string file_words(const StateFile& f) {
  switch (f.kind) {
    case StateKind::kSeqFile: return "ggsq v" + std::to_string(f.version);
    case StateKind::kSessionFile: return "ggsn v" + std::to_string(f.version);
    case StateKind::kRawSeq: return f.raw_seq_tagged ? "a tagged raw sequence buffer" : "an untagged raw sequence buffer";
    case StateKind::kRawContext: return "a raw context buffer";
  }
  return "?";
}

}  // namespace

const char* tri_name(Tri t) {
  switch (t) {
    case Tri::kNo: return "no";
    case Tri::kYes: return "yes";
    case Tri::kUnknown: return "unknown";
  }
  return "unknown";
}

Result<LlamaBuild> parse_llama_build(std::string_view s) {
  LlamaBuild out;
  out.text = std::string(s);
  auto bad = [&] {
    return Status::InvalidArgument("'" + out.text + "' is not a llama.cpp build: give a build number (b8121) or a "
                                   "release tag (v0.5.0), as llama-server --version or /props build_info shows it");
  };
  std::string_view t = s;
  if (t.empty()) return bad();
  if (t.front() == 'v' || t.front() == 'V') {
    t.remove_prefix(1);
    uint32_t parts[3] = {0, 0, 0};
    int n = 0;
    while (!t.empty() && n < 3) {
      const size_t dot = t.find_first_of(".-+");
      std::string_view num = t.substr(0, dot);
      if (!parse_uint(num, parts[n++])) return bad();
      if (dot == std::string_view::npos || t[dot] != '.') break;
      t.remove_prefix(dot + 1);
    }
    if (n < 2 || parts[0] > 1000 || parts[1] > 1000 || parts[2] > 1000) return bad();
    out.major = int(parts[0]);
    out.minor = int(parts[1]);
    out.patch = int(parts[2]);
    return out;
  }
  if (t.front() == 'b' || t.front() == 'B') t.remove_prefix(1);
  const size_t dash = t.find('-');  // llama-server's build_info: "b8121-abc1234"
  if (!parse_uint(t.substr(0, dash), out.number) || out.number == 0) return bad();
  return out;
}

Result<BuildLayout> layout_of_build(const LlamaBuild& build) {
  BuildLayout L;
  if (build.is_tag()) {
    // Release tags started after about b10335. v0.4.0 and v0.5.0 are era H
    // (read from their binaries); earlier tags rotate but may be G or H.
    const bool h = build.major > 0 || build.minor >= 4;
    L.era = h ? "H" : "G|H";
    L.stream_prefix = Tri::kYes;
    L.session_outputs = Tri::kNo;
    L.rotates = Tri::kYes;
    L.seq_cell_ids = Tri::kYes;
    const Tri v3 = h ? Tri::kYes : Tri::kUnknown;
    L.ggsq_version = version_for(v3, 2, 3);
    L.ggsn_version = version_for(v3, 9, 10);
    if (h) L.mrope_ext_bytes = 12;
    return L;
  }
  const uint32_t n = build.number;
  if (n == kEraA) {
    // ggsq v1 read and written; ggsn v6 (the legacy dump) read with the model, written from an era-A session
    L.era = "A";
    L.ggsq_version = 1;
    L.ggsn_version = 6;
    L.stream_prefix = Tri::kNo;
    L.session_outputs = Tri::kYes;
    L.seq_cell_ids = Tri::kNo;
    L.mrope_ext_bytes = 0;
    L.rotates = Tri::kNo;
    return L;
  }
  if (n < kFirstReadable) {
    return Status::NotSupported("llama.cpp " + build.text +
                                (n < kEraA ? " (before b3166, era A)" : " (between b3166, era A, and b3543, era B)") +
                                " writes state files whose layout kvsnap does not know: not supported (b3166 sequence "
                                "files and everything from b3543 on are)");
  }
  L.era = era_letters(n);
  const Tri v3 = side_of(n, kVersion3);
  const Tri v9 = side_of(n, kSessionV9);
  L.ggsq_version = version_for(v3, 2, 3);
  L.ggsn_version = v9 == Tri::kNo ? std::optional<uint32_t>(8) : v9 == Tri::kYes ? version_for(v3, 9, 10) : std::nullopt;
  L.seq_cell_ids = side_of(n, kSeqCellIds);
  L.stream_prefix = side_of(n, kStreamPrefix);
  const Tri no_outputs = side_of(n, kNoOutputs);
  L.session_outputs = no_outputs == Tri::kUnknown ? Tri::kUnknown : (no_outputs == Tri::kYes ? Tri::kNo : Tri::kYes);
  L.rotates = side_of(n, kRotation);
  const Tri ext8 = side_of(n, kCellExt8);
  if (v3 == Tri::kYes) {
    L.mrope_ext_bytes = 12;
  } else if (v3 == Tri::kNo && ext8 != Tri::kUnknown) {
    L.mrope_ext_bytes = ext8 == Tri::kYes ? 8 : 0;
  }
  return L;
}

std::optional<bool> v9_outputs_of_build(const std::string& text) {
  if (text.empty()) return std::nullopt;
  auto build = parse_llama_build(text);
  if (!build.ok()) return std::nullopt;
  auto layout = layout_of_build(*build);
  if (!layout.ok() || layout->session_outputs == Tri::kUnknown) return std::nullopt;
  return layout->session_outputs == Tri::kYes;
}

FileEra era_of_file(const StateFile& f, std::optional<bool> model_has_cell_ext) {
  const std::string what = file_words(f);
  if (f.kind == StateKind::kRawSeq && f.raw_seq_tagged) {
    const bool ext8 = cell_ext(f) == 8u;
    return FileEra{ext8 ? "G" : "G|H", b(kRawTag.first_with) + ".." + (ext8 ? b(kVersion3.last_without) : ""),
                   Tri::kYes, what + " is written only by llama.cpp " + b(kRawTag.first_with) + " and later, which rotate"};
  }
  if (f.kind == StateKind::kRawContext && !is_old_format(f) && cell_ext(f) != 12u) {
    // A raw context buffer carries no version or tag: its "v3" is the layout it parsed with, which
    // llama.cpp writes from b8179 on (an M-RoPE model's cell extras aside), before and after rotation.
    const std::optional<uint32_t> ext = cell_ext(f);
    if (ext == 8u) {
      return FileEra{"F|G", b(kCellExt8.first_with) + ".." + b(kVersion3.last_without), Tri::kUnknown,
                     "a raw context buffer with 8-byte cell extras: llama.cpp " + b(kCellExt8.first_with) + ".." +
                         b(kVersion3.last_without) + "; builds from " + b(kRotation.first_with) + " on rotate, older ones do not"};
    }
    if (ext == 0u && model_has_cell_ext == true) {
      return FileEra{"E", b(kNoOutputs.first_with) + ".." + b(kCellExt8.last_without), Tri::kNo,
                     "a raw context buffer of an M-RoPE model without cell extras: written by llama.cpp " +
                         b(kCellExt8.last_without) + " or older, before any build rotated"};
    }
    return FileEra{"E..H", b(kNoOutputs.first_with) + "..", Tri::kUnknown,
                   "a raw context buffer carries no version or tag: llama.cpp " + b(kNoOutputs.first_with) +
                       " and later write this layout; builds from " + b(kRotation.first_with) +
                       " on rotate quantized caches, older ones do not"};
  }
  if (!is_old_format(f)) {
    return FileEra{"H", b(kVersion3.first_with) + ".. (v0.4.0, v0.5.0)", Tri::kYes,
                   what + " is written only by llama.cpp " + b(kVersion3.first_with) + " and later, which rotate"};
  }
  if (f.kind == StateKind::kSeqFile && f.version == 1) {
    return FileEra{"A", b(kEraA), Tri::kNo,
                   "ggsq v1 is written by llama.cpp " + b(kEraA) + " (and maybe a little later), before any build rotated"};
  }
  if (f.kind == StateKind::kSessionFile && f.version == 6) {
    return FileEra{"A", b(kEraA), Tri::kNo,
                   "ggsn v6 (b3166's llama_hparams and legacy KV dump) is written by llama.cpp " + b(kEraA) +
                       " (and builds near it), before any build rotated"};
  }
  if (f.kind == StateKind::kSessionFile && f.version == 8) {
    return FileEra{"B", b(kSessionV9.last_without) + " (" + b(kEraA + 1) + ".." + b(kSessionV9.first_with - 1) + ")",
                   Tri::kNo, "ggsn v8 (RNG state after the arch name) is written by llama.cpp " +
                                 b(kSessionV9.last_without) + ", before any build rotated"};
  }
  if (!has_stream_prefix(f)) {
    const std::string none = " before any build rotated";
    const std::optional<bool> ids = seq_cell_ids(f);
    if (ids == false) {
      return FileEra{"B..C", b(kFirstReadable) + ".." + b(kSeqCellIds.last_without), Tri::kNo,
                     "no n_stream prefix and cells without seq ids: written by llama.cpp " +
                         b(kSeqCellIds.last_without) + " or older," + none};
    }
    if (ids == true) {
      return FileEra{"C", b(kSeqCellIds.first_with) + ".." + b(kStreamPrefix.last_without), Tri::kNo,
                     "no n_stream prefix, cells with their seq id: written by llama.cpp " + b(kSeqCellIds.first_with) +
                         ".." + b(kStreamPrefix.last_without) + "," + none};
    }
    const bool v9 = f.kind == StateKind::kSessionFile;
    const uint32_t first = v9 ? kSessionV9.first_with : kFirstReadable;
    return FileEra{v9 ? "C" : "B..C", b(first) + ".." + b(kStreamPrefix.last_without), Tri::kNo,
                   "no n_stream prefix: written by llama.cpp " + b(kStreamPrefix.last_without) + " or older," + none};
  }
  if (has_outputs_field(f) && f.outputs) {
    return FileEra{"D", b(kStreamPrefix.first_with) + ".." + b(kNoOutputs.last_without), Tri::kNo,
                   "the session holds output logits: written by llama.cpp " + b(kNoOutputs.last_without) +
                       " or older, before any build rotated"};
  }
  const std::optional<uint32_t> ext = cell_ext(f);
  if (ext == 8u) {
    return FileEra{"F|G", b(kCellExt8.first_with) + ".." + b(kVersion3.last_without), Tri::kUnknown,
                   "8-byte cell extras: llama.cpp " + b(kCellExt8.first_with) + ".." + b(kVersion3.last_without) +
                       "; builds from " + b(kRotation.first_with) + " on rotate, older ones do not"};
  }
  if (ext == 0u && model_has_cell_ext == true) {
    return FileEra{"D|E", b(kStreamPrefix.first_with) + ".." + b(kCellExt8.last_without), Tri::kNo,
                   "an M-RoPE model's cells without extras: written by llama.cpp " + b(kCellExt8.last_without) +
                       " or older, before any build rotated"};
  }
  if (f.kind == StateKind::kSeqFile && f.tokens.packed) {
    // The packed payload came after the last ggsq v2 build seen (b10375) and before the first v3 one:
    // the file's builds end before kVersion3.first_with, not at its last_without.
    const std::string first = "about " + b(kServerPackedTokens.first_with);
    return FileEra{"G", first + ".." + b(kVersion3.first_with - 1), Tri::kYes,
                   "ggsq v2 with llama-server's packed token payload (added " + first + ", after rotation)"};
  }
  const bool no_outputs = has_outputs_field(f) && !f.outputs;
  const uint32_t first = no_outputs ? kNoOutputs.first_with : kStreamPrefix.first_with;
  const std::string builds = b(first) + ".." + b(kVersion3.last_without);
  return FileEra{no_outputs ? "E..G" : "D..G", builds, Tri::kUnknown,
                 what + (no_outputs ? " without output logits" : "") + " is written by llama.cpp " + builds +
                     "; builds from " + b(kRotation.first_with) + " on rotate quantized caches, older ones do not"};
}

Status check_build_wrote(const StateFile& f, const LlamaBuild& build, std::optional<bool> model_has_cell_ext) {
  KV_ASSIGN_OR_RETURN(BuildLayout L, layout_of_build(build));
  const std::string who = "llama.cpp " + build.text + " (era " + L.era + ")";
  auto mismatch = [&](const std::string& fact) { return Status::Mismatch(who + " cannot have written this file: " + fact); };
  const std::optional<uint32_t> version =
      f.kind == StateKind::kSeqFile ? L.ggsq_version : f.kind == StateKind::kSessionFile ? L.ggsn_version : std::nullopt;
  if (version && *version != f.version && (f.kind == StateKind::kSeqFile || f.kind == StateKind::kSessionFile)) {
    return mismatch("it writes " + std::string(f.kind == StateKind::kSeqFile ? "ggsq v" : "ggsn v") +
                    std::to_string(*version) + ", the file is " + file_words(f));
  }
  const Tri tagged = build.is_tag() ? Tri::kYes : side_of(build.number, kRawTag);
  if (f.kind == StateKind::kRawSeq && tagged != Tri::kUnknown && (tagged == Tri::kYes) != f.raw_seq_tagged) {
    return mismatch(std::string("its raw sequence buffers are ") + (tagged == Tri::kYes ? "" : "not ") +
                    "tagged with 0xaf143cd8, this one is " + (f.raw_seq_tagged ? "" : "not"));
  }
  if (L.stream_prefix != Tri::kUnknown && (L.stream_prefix == Tri::kYes) != has_stream_prefix(f)) {
    return mismatch(std::string("it writes ") + (L.stream_prefix == Tri::kYes ? "an" : "no") +
                    " n_stream prefix, the file has " + (has_stream_prefix(f) ? "one" : "none"));
  }
  if (has_outputs_field(f) && is_old_format(f) && L.session_outputs != Tri::kUnknown &&
      (L.session_outputs == Tri::kYes) != f.outputs.has_value()) {
    return mismatch(std::string("its v9 sessions ") + (L.session_outputs == Tri::kYes ? "hold" : "have no") +
                    " output logits, the file's " + (f.outputs ? "does" : "does not"));
  }
  const std::optional<bool> ids = seq_cell_ids(f);
  if (ids && L.seq_cell_ids != Tri::kUnknown && (L.seq_cell_ids == Tri::kYes) != *ids) {
    return mismatch(std::string("its sequence files store cells ") + (L.seq_cell_ids == Tri::kYes ? "with" : "without") +
                    " their seq id, the file's are " + (*ids ? "with" : "without"));
  }
  // Cell extras: with the model, its M-RoPE decides; without it, extras in the file prove an M-RoPE
  // model (only those have them), so their size must be the build's.
  const std::optional<uint32_t> ext = cell_ext(f);
  const bool mrope = model_has_cell_ext == true || (ext && *ext > 0);
  if (mrope && L.mrope_ext_bytes && ext && *ext != *L.mrope_ext_bytes) {
    const auto size = [](uint32_t n) { return n == 0 ? std::string("no cell extras") : std::to_string(n) + "-byte cell extras"; };
    return mismatch("for an M-RoPE model it writes " + size(*L.mrope_ext_bytes) + ", the file has " + size(*ext));
  }
  // llama-server's packed token payload: no build before it writes one.
  const Tri packs = build.is_tag() ? Tri::kYes : side_of(build.number, kServerPackedTokens);
  if (f.tokens.packed && packs == Tri::kNo) {
    return mismatch("the file's tokens are llama-server's packed payload, which builds before about " +
                    b(kServerPackedTokens.first_with) + " do not write");
  }
  return Status::OK();
}

}  // namespace kvsnap
