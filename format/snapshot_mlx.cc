// Snapshots of mlx-lm prompt caches: the segment plan (4-d tensors as blocks of head planes cut by
// sequence position, the rest frame), INFO's "mlx" summary, and the summary read back.
#include "format/snapshot_mlx.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "base/io.h"
#include "base/json_access.h"
#include "base/text.h"
#include "format/ggml_types.h"
#include "format/mlx_info.h"
#include "format/snapshot_internal.h"

namespace kvsnap {

using nlohmann::ordered_json;
using namespace snapshot_detail;

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "bf16", or "q4g64" for a quantized side.
std::string side_setting(const MlxLayer& L, const MlxKvSide& s) {
  if (L.bits && L.group_size && s.scales) return "q" + std::to_string(*L.bits) + "g" + std::to_string(*L.group_size);
  return lower(s.dtype);
}

template <class F>
void for_each_layer(const std::vector<MlxLayer>& layers, const F& f) {
  for (const MlxLayer& L : layers) {
    f(L);
    for_each_layer(L.sub, f);
  }
}

std::string joined(const std::set<std::string>& s) {
  std::string out;
  for (const auto& v : s) out += (out.empty() ? "" : ",") + v;
  return out.empty() ? "-" : out;
}

// The ggml type whose byte planes suit this dtype (the filter: chunk_codec.h filter_for_type);
// -1 (no filter) for packed codes and integers, which have no per-byte structure to split.
int32_t filter_type_of(const std::string& dtype) {
  if (dtype == "F16") return int32_t(GgmlType::kF16);
  if (dtype == "BF16") return int32_t(GgmlType::kBF16);
  if (dtype == "F32") return int32_t(GgmlType::kF32);
  return -1;
}

// A [B,H,S,D] tensor whose planes and rows fit the segment fields; anything else is frame.
bool planes_of(const SafetensorsTensor& t, uint64_t& planes, uint64_t& cells, uint64_t& row_bytes) {
  const uint64_t item = safetensors_itemsize(t.dtype);
  if (t.shape.size() != 4 || item == 0 || t.bytes() == 0) return false;
  for (int64_t d : t.shape)
    if (d <= 0) return false;
  planes = uint64_t(t.shape[0]) * uint64_t(t.shape[1]);
  cells = uint64_t(t.shape[2]);
  row_bytes = uint64_t(t.shape[3]) * item;
  return planes <= UINT32_MAX && cells <= UINT32_MAX && row_bytes <= kMaxChunkRawBytes &&
         planes * cells * row_bytes == t.bytes();
}

Result<SegmentTable> plan_mlx_segments(const Safetensors& st, uint32_t cells_per_chunk, SnapshotMlx& mlx) {
  SegmentTable t;
  t.frame_chunk_bytes = kFrameChunkBytes;
  uint64_t at = 0;
  for (size_t i : st.data_order) {
    const SafetensorsTensor& x = st.tensors[i];
    uint64_t planes = 0, cells = 0, row_bytes = 0;
    if (!planes_of(x, planes, cells, row_bytes)) continue;  // stays in the frame
    const uint64_t begin = st.data_start() + x.begin;
    if (begin < at) return Status::InvalidArgument(st.file + ": tensor " + x.name + " overlaps the one before it");
    add_frame_segment(t, at, begin);
    Segment s;
    s.kind = SegmentKind::kTransposed;
    s.layer = uint32_t(mlx.tensors.size());
    s.ggml_type = filter_type_of(x.dtype);
    s.file_offset = begin;
    s.size = x.bytes();
    s.n_rows = uint32_t(planes);
    s.cell_count = uint32_t(cells);
    s.elem_bytes = uint32_t(row_bytes);
    s.cells_per_chunk = uint32_t(std::min<uint64_t>(cells_per_chunk, kMaxChunkRawBytes / row_bytes));
    s.rows_per_chunk = rows_per_chunk(planes, cells, row_bytes, s.cells_per_chunk);
    t.segments.push_back(s);
    mlx.tensors.push_back({x.name, x.dtype});
    at = begin + s.size;
  }
  add_frame_segment(t, at, st.file_size);
  number_chunks(t);
  return t;
}

ordered_json summary_json(const MlxCacheSummary& s, const MlxPromptCache& cache) {
  ordered_json j;
  j["engine"] = "mlx-lm";
  j["model"] = s.model.empty() ? ordered_json(nullptr) : ordered_json(s.model);
  j["layout"] = s.layout;
  j["written_by"] = s.written_by;
  j["n_layers"] = s.n_layers;
  j["classes"] = s.classes;
  j["k_types"] = s.k_types;
  j["v_types"] = s.v_types;
  j["offset"] = s.offset ? ordered_json(*s.offset) : ordered_json(nullptr);
  j["user_metadata"] = ordered_object_of(cache.user_metadata);
  return j;
}

ordered_json mlx_info(const MlxPromptCache& cache, const MlxCacheSummary& sum, const SnapshotOptions& o,
                      const std::string& source, uint64_t file_size, const Sha256Digest& sha, size_t n_tokens) {
  ordered_json j;
  j["format"] = "kvsnap snapshot";
  j["format_version"] = kSnapshotFormatVersion;
  j["kvsnap_version"] = o.kvsnap_version;
  j["created"] = o.created.empty() ? utc_now("%Y-%m-%dT%H:%M:%SZ") : o.created;
  j["provenance"] = {{"source", file_name_of(source)},
                     {"kind", kMlxPromptCacheKind},
                     {"magic", "00000000"},
                     {"version", 0},
                     {"file_size", file_size},
                     {kContentDigestKey, to_hex(sha)}};
  j["arch"] = nullptr;
  j["mlx"] = summary_json(sum, cache);
  j["tokens"] = {{"n_tokens", n_tokens}, {"n_words", 0}, {"packed", false}};
  j["lossy"] = nullptr;
  j["chunking"] = chunking_json(o);
  if (o.labels) j["labels"] = labels_json(*o.labels);
  return j;
}

}  // namespace

MlxCacheSummary mlx_cache_summary(const MlxPromptCache& cache, const std::string& model) {
  MlxCacheSummary s;
  s.model = model;
  if (s.model.empty()) {
    for (const auto& [k, v] : cache.user_metadata)
      if (k == "model") s.model = v;
  }
  s.layout = mlx_layout_name(cache.layout);
  s.written_by = cache.version_guess;
  s.n_layers = int(cache.layers.size());
  std::map<std::string, int> classes;  // sorted by name: the summary does not depend on layer order
  for (const MlxLayer& L : cache.layers) ++classes[L.cls];
  for (const auto& [c, n] : classes) s.classes += (s.classes.empty() ? "" : ", ") + c + " x" + std::to_string(n);
  std::set<std::string> k, v;
  for_each_layer(cache.layers, [&](const MlxLayer& L) {
    if (L.k) k.insert(side_setting(L, *L.k));
    if (L.v) v.insert(side_setting(L, *L.v));
  });
  s.k_types = joined(k);
  s.v_types = joined(v);
  s.offset = mlx_info_report(cache, cache.st.file).tokens;
  return s;
}

Result<SnapshotManifest> build_mlx_snapshot(const MlxPromptCache& cache, const ReadableFile& original,
                                            const SnapshotOptions& opts, const MlxSnapshotMeta& meta,
                                            ChunkSink& chunks) {
  const std::string& name = original.name();
  if (cache.st.file_size != original.size()) {
    return Status::InvalidArgument(name + ": the parsed prompt cache describes " + std::to_string(cache.st.file_size) +
                                   " bytes, the file has " + std::to_string(original.size()));
  }
  SnapshotManifest m;
  m.mlx.emplace();
  KV_ASSIGN_OR_RETURN(m.segments, plan_mlx_segments(cache.st, opts.cells_per_chunk, *m.mlx));
  KV_RETURN_IF_ERROR(encode_snapshot_chunks(original, opts, chunks, m));
  const std::string source = opts.source_name.empty() ? name : opts.source_name;
  const MlxCacheSummary sum = mlx_cache_summary(cache, meta.model);
  m.info = mlx_info(cache, sum, opts, source, original.size(), m.content_digest, meta.tokens.size());
  m.provenance.source = m.info["provenance"]["source"].get<std::string>();
  m.provenance.mlx_prompt_cache = true;
  m.provenance.file_size = original.size();
  m.provenance.content_digest = m.content_digest;
  m.cells_per_chunk = opts.cells_per_chunk;
  m.tokens.tokens = meta.tokens;
  if (opts.cipher) {
    m.encryption = SnapshotEncryption{opts.cipher->tenant(), opts.cipher->master_key_id(), opts.cipher->tenant_key_id()};
  }
  KV_RETURN_IF_ERROR(encode_manifest(m));
  return m;
}

Result<SnapshotManifest> write_mlx_snapshot_file(const MlxPromptCache& cache, const ReadableFile& original,
                                                 const SnapshotOptions& opts, const MlxSnapshotMeta& meta,
                                                 ByteSink& out) {
  MemoryChunkStore blobs;
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, build_mlx_snapshot(cache, original, opts, meta, blobs));
  KV_ASSIGN_OR_RETURN(SnapshotFileAssembler file, SnapshotFileAssembler::plan(m, blobs, opts.cipher));
  KV_RETURN_IF_ERROR(file.write(blobs, out));
  return file.manifest();
}

std::optional<MlxCacheSummary> mlx_summary_of(const SnapshotManifest& m) {
  if (!m.mlx) return std::nullopt;
  const OrderedJsonRef info(m.info, "snapshot INFO");
  auto x = info.find("mlx");
  if (!x.ok() || !*x) return std::nullopt;
  const OrderedJsonRef& j = **x;
  MlxCacheSummary s;
  auto text = [&](const char* key) {
    auto v = j.string_or(key, "");
    return v.ok() ? *v : std::string();
  };
  s.model = text("model");
  s.layout = text("layout");
  s.written_by = text("written_by");
  s.classes = text("classes");
  s.k_types = text("k_types");
  s.v_types = text("v_types");
  auto n = j.unsigned_or("n_layers", 0, INT32_MAX);
  s.n_layers = n.ok() ? int(*n) : 0;
  const auto& raw = j.json();
  if (raw.contains("offset") && raw["offset"].is_number_integer()) s.offset = raw["offset"].get<int64_t>();
  return s;
}

}  // namespace kvsnap
