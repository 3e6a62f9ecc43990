// The store's mlx-lm side: saving a prompt cache as a snapshot (format/snapshot_mlx.h), its
// catalog row, and restoring it byte for byte or requantized as `kvsnap convert` would.
#include <algorithm>
#include <climits>

#include "base/parallel.h"
#include "base/text.h"
#include "format/mlx_layout.h"
#include "format/snapshot_mlx.h"
#include "migrate/mlx_convert.h"
#include "migrate/mlx_kv_target.h"
#include "migrate/mlx_requant.h"
#include "store/store.h"
#include "store/store_internal.h"
#include "store/store_seal.h"

namespace kvsnap {

using namespace store_detail;

namespace {

constexpr const char* kMlxEngine = "mlx-lm";

// The catalog's model fingerprint of an mlx-lm snapshot: "mlx-lm:NAME", or "mlx-lm" when the model
// is not known. Never empty, so parents and `find` stay among mlx-lm caches of the same model.
std::string mlx_fingerprint(const std::string& model) {
  return model.empty() ? std::string(kMlxEngine) : std::string(kMlxEngine) + ":" + model;
}

void note(std::string& given, bool set, const char* flag) {
  if (set) given += (given.empty() ? "" : ", ") + std::string(flag);
}

// What a save request holds that only a llama.cpp state can use.
std::string llama_save_fields(const SaveRequest& req) {
  std::string given;
  note(given, req.model != nullptr, "{--model} GGUF");
  note(given, req.store_type.has_value(), "{--store-type}/{--store-ctk}/{--store-ctv}");
  note(given, !req.writer.llama_build.empty() || !req.writer.reported_build.empty(), "{--source-build}");
  note(given, !req.writer.src_rotation.empty() && req.writer.src_rotation != "auto", "{--src-rotation}");
  return given;
}

// What a restore request holds that only a llama.cpp state can use.
std::string llama_restore_fields(const RestoreRequest& req) {
  const ConversionSpec& s = req.spec;
  std::string given;
  note(given, !s.ctk.empty() || !s.ctv.empty(), "{--ctk}/{--ctv}");
  note(given, !s.flash_attn.empty(), "{--flash-attn}");
  note(given, !s.format.empty(), "{--format}");
  note(given, !s.requant.empty(), "{--requant}");
  note(given, !s.rotation.empty() || !s.src_rotation.empty() || !s.dst_rotation.empty(), "{--rotation}");
  note(given, !s.source_build.empty() || !s.target_build.empty(), "{--source-build}/{--target-build}");
  note(given, s.head_dim_k || s.head_dim_v, "head dims");
  note(given, s.kv_streams != 0, "{--kv-streams}");
  note(given, req.model != nullptr, "{--model}");
  return given;
}

// --tokens N of an mlx-lm snapshot: within the tokens recorded at save, when there are any (the
// prefix's tokens are then their first N).
Status check_mlx_prefix(const SnapshotReader& reader, uint64_t n, const std::string& what) {
  const size_t recorded = reader.tokens().tokens.size();
  if (recorded == 0 || n <= recorded) return Status::OK();
  return Status::InvalidArgument("{--tokens} " + std::to_string(n) + ": " + what + " recorded " +
                                 std::to_string(recorded) + " tokens at save; ask for 1.." + std::to_string(recorded));
}

}  // namespace

std::string MlxRestoreSpec::flags() const {
  std::string given;
  note(given, !kv_bits.empty(), "{--kv-bits}");
  note(given, kv_group_size != 0, "{--kv-group-size}");
  note(given, !device.empty(), "{--mlx-device}");
  note(given, !mlx_lm.empty(), "{--mlx-lm}");
  return given;
}

Result<SnapshotRecord> store_detail::mlx_record(const SnapshotManifest& m, const ReadableFile& original) {
  KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(original));
  const std::optional<MlxCacheSummary> recorded = mlx_summary_of(m);
  const MlxCacheSummary s = mlx_cache_summary(cache, recorded ? recorded->model : "");
  SnapshotRecord rec;
  SnapshotInfo& info = rec.info;
  info.model_arch = kMlxEngine;
  info.model_fingerprint = mlx_fingerprint(s.model);
  info.k_types = s.k_types;
  info.v_types = s.v_types;
  info.source_format = "mlx-lm prompt cache, " + s.layout + " layout (" + s.written_by + "), " +
                       std::to_string(s.n_layers) + " layers: " + s.classes;
  info.raw_bytes = m.provenance.file_size;
  info.stored_bytes = m.stored_bytes();
  info.content_sha256 = recorded_content_digest(m, nullptr);
  rec.manifest = m.bytes;
  rec.tokens = m.tokens.tokens;
  return rec;
}

MlxSnapshotMeta store_detail::mlx_meta_of(const SnapshotManifest& m) {
  const std::optional<MlxCacheSummary> recorded = mlx_summary_of(m);
  return MlxSnapshotMeta{recorded ? recorded->model : "", m.tokens.tokens};
}

Status store_detail::write_mlx_again(const SnapshotReader& r, const SnapshotOptions& so, ByteSink& out) {
  KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(r.original()));
  return write_mlx_snapshot_file(cache, r.original(), so, mlx_meta_of(r.manifest()), out).status();
}

Result<SaveResult> Store::save_mlx(const ReadableFile& file, const MlxPromptCache& cache, const SaveRequest& req) {
  const auto t0 = Clock::now();
  if (const std::string given = llama_save_fields(req); !given.empty()) {
    return Status::InvalidArgument(file.name() + ": an mlx-lm prompt cache, but llama.cpp options were given (" +
                                   given + "); for mlx-lm give {--model NAME}, {--tokens FILE} and tags");
  }
  KV_RETURN_IF_ERROR(check_new_labels_text(req.name.empty() ? std::nullopt : std::optional<std::string>(req.name), req.tags));
  KV_RETURN_IF_ERROR(check_save_keys());
  if (req.on_start) req.on_start(file.size());
  KV_ASSIGN_OR_RETURN(auto batch, begin_blob_write(req.under_hold));
  SnapshotOptions so = save_options(req, file);
  so.cipher = cipher();
  if (so.cipher) so.labels = request_labels(req);
  const MlxSnapshotMeta meta{req.mlx_model, req.tokens};
  std::map<Sha256Digest, ChunkRef> parent_chunks;
  const std::string fingerprint = mlx_fingerprint(mlx_cache_summary(cache, req.mlx_model).model);
  KV_ASSIGN_OR_RETURN(std::optional<int64_t> parent_id, find_parent(req.tokens, fingerprint, req, parent_chunks));
  if (parent_id) so.known_chunks = &parent_chunks;
  so.storage_waits = [&b = *batch] { return b.storage_waits(); };
  BlobSink sink(*batch, *catalog_);
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, build_mlx_snapshot(cache, file, so, meta, sink));
  KV_RETURN_IF_ERROR(sink.finish());
  if (req.source_unchanged) KV_RETURN_IF_ERROR(req.source_unchanged());
  KV_RETURN_IF_ERROR(batch->commit());
  KV_ASSIGN_OR_RETURN(SnapshotRecord rec, mlx_record(m, file));
  return commit_save(std::move(rec), m, sink, batch, req, parent_id, since(t0));
}

Result<RestoreResult> Store::restore_mlx(const StoredSnapshot& snap, const std::string& ref, const RestoreRequest& req,
                                         ByteSink& out, Clock::time_point t0) {
  const std::string what = "snapshot " + quote_text(ref);
  if (const std::string given = llama_restore_fields(req); !given.empty()) {
    return Status::InvalidArgument(what + " is an mlx-lm prompt cache, but llama.cpp options were given (" + given +
                                   "); for mlx-lm give {--kv-bits B} [{--kv-group-size G}], or nothing for the "
                                   "saved file");
  }
  const MlxRestoreSpec& x = req.mlx;
  if (x.given() && x.kv_bits.empty() && !x.kv_group_size && x.mlx_lm.empty()) {
    return Status::InvalidArgument(what + ": " + x.flags() + " without {--kv-bits}: give --kv-bits 2|3|4|5|6|8 "
                                   "[--kv-group-size 32|64|128], --kv-bits none to dequantize, or --mlx-lm VERSION "
                                   "to move it to that release's file layout");
  }
  const ReadableFile& original = snap.reader().original();
  const uint32_t threads = req.spec.threads > 0 ? uint32_t(req.spec.threads) : default_threads();
  RestoreResult r;
  r.info = snap.info();
  r.n_tokens = uint64_t(std::max<int64_t>(0, r.info.n_tokens));
  CountingSink count;
  TeeSink tee(out, count);
  // --tokens N: the prefix (format/mlx_layout.h mlx_prefix), written out or into a temporary that
  // is requantized; only the chunks it reads are fetched.
  const ReadableFile* src = &original;
  TempFile temp{io_, ""};
  std::unique_ptr<ReadableFile> cut_file;
  if (req.tokens) {
    KV_RETURN_IF_ERROR(check_mlx_prefix(snap.reader(), *req.tokens, what));
    KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(original));
    auto cut = mlx_prefix(cache, int64_t(std::min<uint64_t>(*req.tokens, INT64_MAX)));
    if (!cut.ok()) return prefix_error(cut.status(), ref);
    r.n_tokens = *req.tokens;
    auto write_cut = [&](ByteSink& o) { return write_mlx_file(*cut, cache, original, o); };
    if (!x.given()) {
      KV_RETURN_IF_ERROR(write_cut(tee));
      return finish_restore(std::move(r), count.count, t0);
    }
    temp.path = temp_name(paths_, "restore-prefix");
    KV_RETURN_IF_ERROR(write_temp(io_, temp.path, write_cut));
    KV_ASSIGN_OR_RETURN(cut_file, io_.open_read(temp.path));
    src = cut_file.get();
  }
  if (!x.given()) {
    KV_RETURN_IF_ERROR(copy_parallel(snap.reader(), threads, tee));
  } else {
    // As `kvsnap convert` does it (migrate/mlx_convert.h): requantized and/or moved to the
    // layout and class names of the release named, through a scratch file when needed.
    KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(*src));
    MlxConvertRequest conv;
    conv.kv_bits = x.kv_bits;
    conv.kv_group_size = x.kv_group_size;
    if (!x.mlx_lm.empty()) {
      KV_ASSIGN_OR_RETURN(conv.target, mlx_target_for(x.mlx_lm));
    }
    KV_ASSIGN_OR_RETURN(conv.device, mlx_device_of(x.device.empty() ? "cpu" : x.device));
    conv.threads = threads;
    conv.what = what;
    conv.scratch_path = temp_name(paths_, "restore-move");
    KV_RETURN_IF_ERROR(mlx_convert(io_, cache, *src, conv, tee).status());
    r.converted = true;
  }
  return finish_restore(std::move(r), count.count, t0);
}

}  // namespace kvsnap
