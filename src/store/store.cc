#include "store/store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "base/json_access.h"
#include "base/parallel.h"
#include "base/sha256_lanes.h"
#include "base/text.h"
#include "format/rotation_rule.h"
#include "format/snapshot_pipeline.h"
#include "format/state_summary.h"
#include "format/state_prefix.h"
#include "migrate/convert_state.h"
#include "store/archive.h"
#include "store/store_seal.h"
#include "store/store_identity.h"
#include "store/store_internal.h"

namespace kvsnap {

namespace store_detail {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

SnapshotLabels request_labels(const SaveRequest& req) {
  SnapshotLabels l;
  if (!req.name.empty()) l.name = req.name;
  l.tags = req.tags;
  return l;
}

SnapshotOptions save_options(const SaveRequest& req, const ReadableFile& file) {
  SnapshotOptions so;
  so.cells_per_chunk = req.cells_per_chunk;
  so.zstd_level = req.zstd_level;
  so.compress = req.compress;
  so.adaptive = req.adaptive;
  so.byte_shuffle = req.byte_shuffle;
  so.threads = req.threads ? req.threads : default_threads();
  so.source_name = req.source_name.empty() ? file.name() : req.source_name;
  return so;
}

Status prefix_error(const Status& s, const std::string& ref) {
  if (s.code() != Code::kNotSupported) return s;
  return s.Prefixed("snapshot " + ref).Appended("; restore the whole snapshot (without {--tokens})");
}

std::string temp_name(const StorePaths& p, const char* what) { return p.tmp_dir() + "/" + what + "-" + unique_suffix(); }

bool is_store_temp(const std::string& name) {
  for (const char* kind : kStoreTempKinds) {
    const std::string prefix = std::string(kind) + "-";
    if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

TempFile::~TempFile() {
  if (!path.empty()) (void)io.remove(path);
}

Status write_temp(Io& io, const std::string& path, const std::function<Status(ByteSink&)>& fill) {
  // This process's own; in an encrypted store, plaintext: owner-only from the create on.
  KV_ASSIGN_OR_RETURN(auto w, io.create_owner_only(path));
  {
    BufferedSink b(*w);
    KV_RETURN_IF_ERROR(fill(b));
    KV_RETURN_IF_ERROR(b.flush());
  }
  return w->close();
}

}  // namespace store_detail

using namespace store_detail;

// A chunk the catalog already has is not written (its row says where it is and
// that it is durable); the others go into the batch's pack. The catalog is
// asked in batches (Catalog::find_chunks: a round trip per batch on a catalog
// server), so chunks wait here until a batch is full or finish(); lookup_hold_bytes()
// bounds the memory that takes and how long the pack waits. They wait in the
// encoders' own buffers (put_buffer), or copied (put).
std::vector<std::byte> store_detail::BlobSink::take_spare() {
  std::vector<std::byte> b;
  if (!spare_.empty()) {
    b = std::move(spare_.back());
    spare_.pop_back();
  }
  return b;
}

Status store_detail::BlobSink::put(const ChunkRef& ref, std::span<const std::byte> blob) {
  if (blob.empty()) return hold({ref, {}, 0});  // a parent's known chunk: no buffer to hold
  std::vector<std::byte> copy = take_spare();
  if (copy.size() < blob.size()) copy.resize(blob.size());  // grown only: no zero-fill of a reused buffer
  std::memcpy(copy.data(), blob.data(), blob.size());
  return hold({ref, std::move(copy), blob.size()});
}

Status store_detail::BlobSink::put_buffer(const ChunkRef& ref, std::vector<std::byte>& buffer, size_t size) {
  if (size == 0) return put(ref, {});
  // The encoder's buffer is held as it is (no copy of the blob on this thread, which also
  // writes the pack while the encoders work); it gets a written chunk's buffer back.
  std::vector<std::byte> mine = take_spare();
  mine.swap(buffer);
  return hold({ref, std::move(mine), size});
}

Status store_detail::BlobSink::hold(Pending p) {
  const size_t p_size = p.size;
  held_ += p_size;
  pending_.push_back(std::move(p));
  // a blob that brings the held bytes to the catalog's limit (0: every blob) flushes; a parent's
  // known chunk (no blob) waits for a full batch
  if (pending_.size() >= Catalog::kChunkLookupBatch || (p_size > 0 && held_ >= hold_bytes_)) return flush();
  return Status::OK();
}

Status store_detail::BlobSink::flush() {
  std::vector<ChunkHash> hashes;
  hashes.reserve(pending_.size());
  for (const Pending& p : pending_) hashes.push_back(hash_of(p.ref));
  KV_ASSIGN_OR_RETURN(std::vector<std::optional<ChunkUse>> known, catalog_.find_chunks(hashes));
  for (size_t i = 0; i < pending_.size(); ++i) KV_RETURN_IF_ERROR(store(hashes[i], pending_[i], known[i]));
  // only buffers worth reusing: an empty one handed to an encoder would make it allocate afresh
  for (Pending& p : pending_)
    if (p.buffer.capacity() > 0) spare_.push_back(std::move(p.buffer));
  pending_.clear();
  held_ = 0;
  return Status::OK();
}

Status store_detail::BlobSink::store(const ChunkHash& h, const Pending& p, std::optional<ChunkUse>& known) {
  if (known) {
    uses.push_back(std::move(*known));
    return Status::OK();
  }
  if (p.size == 0 && p.ref.raw_size > 0)  // a parent's chunk (SnapshotOptions::known_chunks) must have a row
    return Status::Corruption("chunk " + h.hex() + " of the parent snapshot has no catalog row: the parent was "
                              "removed while this save ran (save again), or the catalog is damaged (kvsnap verify --all)");
  const uint64_t before = batch_.written();
  KV_ASSIGN_OR_RETURN(BlobLocation where, batch_.append(h, p.blob()));
  if (batch_.written() != before) {
    ++written;
    bytes_written += p.size;
  }
  uses.push_back({h, p.ref.raw_size, where.size, where.pack, where.offset});
  return Status::OK();
}

namespace {

class OpenedSnapshot final : public StoredSnapshot {
 public:
  OpenedSnapshot(std::unique_ptr<GcLockHold> hold, SnapshotInfo info, BlobStore& blobs)
      : hold_(std::move(hold)), info_(std::move(info)), source_(blobs) {}
  const SnapshotInfo& info() const override { return info_; }
  const SnapshotReader& reader() const override { return *reader_; }
  std::unique_ptr<GcLockHold> hold_;  // first: released after the reader is gone
  SnapshotInfo info_;
  BlobSource source_;
  std::unique_ptr<SnapshotReader> reader_;
};

bool wants_conversion(const ConversionSpec& s) {
  return !s.ctk.empty() || !s.ctv.empty() || !s.flash_attn.empty() || !s.format.empty() || !s.rotation.empty() ||
         !s.src_rotation.empty() || !s.dst_rotation.empty() || !s.target_build.empty() || s.head_dim_k || s.head_dim_v ||
         s.kv_streams;
}

// Copies the snapshot's original to `out` in order (format/snapshot_pipeline.h):
// `threads` decoders each take the next block of about 1 MiB (2 MiB with shani-x4, 4 with
// avx2-x8) as soon as a buffer of the ring is free and decode and hash-check its chunks straight
// into it (OriginalFile reads whole chunks into the caller's buffer; the
// blocks are cut at chunk boundaries, so no chunk goes through the shared
// cache or is decoded twice); this thread appends the blocks in order as they
// become ready, so writing overlaps decoding. Small blocks keep the ring in
// cache and both threads busy to the end (the last block is short work);
// the ring is not zero-filled (its pages are first touched by the decode).
// Every byte comes from a chunk whose SHA-256 was checked when decoded, and
// the manifest itself is checked by its digest, so no whole-file hash is
// needed here (verify does one).
}  // namespace

Status store_detail::copy_parallel(const SnapshotReader& reader, uint32_t threads, ByteSink& out) {
  const ReadableFile& file = reader.original();
  // ~1 MiB blocks hold about two of a slot's 512 KiB chunks, which a block's read decodes and
  // checks together (SHA-256 x2 with SHA-NI, base/sha256_lanes.h; x4 on Zen 5: ~2 MiB); eight AVX2 lanes want ~4 MiB
  // blocks (a decode's CPU -30%; a restore to a file no cheaper: writing a 4 MiB block costs more
  // than a 1 MiB one still in cache: docs/store.md, "SHA-256 kernels").
  const std::vector<uint64_t> cuts =
      reader.block_bounds(uint64_t(std::max<size_t>(2, sha256_kernel_width(sha256_kernel()))) << 19);
  uint64_t largest = 0;
  for (size_t i = 1; i < cuts.size(); ++i) largest = std::max(largest, cuts[i] - cuts[i - 1]);
  const uint32_t T = std::max(1u, threads);
  std::vector<std::unique_ptr<std::byte[]>> ring(2 * T);
  auto block = [&](uint64_t i, size_t slot) { return std::span<std::byte>(ring[slot].get(), cuts[i + 1] - cuts[i]); };
  return ordered_pipeline(
      cuts.size() - 1, T, ring.size(),
      [&](uint64_t i, size_t slot, uint32_t) {
        if (!ring[slot]) ring[slot].reset(new std::byte[largest]);  // default-initialized: not zero-filled
        return file.read_at(cuts[i], block(i, slot));
      },
      [&](uint64_t i, size_t slot) { return out.append(std::span<const std::byte>(block(i, slot))); });
}

namespace {

// "f16/f16 -> q8_0/q8_0" from INFO.lossy (a snapshot's word: any type may be there).
std::string lossy_summary(const SnapshotManifest& m) {
  const OrderedJsonRef info(m.info, "snapshot INFO");
  auto lossy = info.find("lossy");
  if (!lossy.ok() || !*lossy || !(**lossy).json().is_object()) return "lossy";
  const OrderedJsonRef& l = **lossy;
  auto type = [&](const char* key) {
    auto t = l.string_or(key, "?");
    return t.ok() ? *t : std::string("?");
  };
  return type("from_k") + "/" + type("from_v") + " -> " + type("to_k") + "/" + type("to_v");
}

// The claims about who wrote a snapshot's stored file (restore and import apply them). A lossy
// snapshot stores kvsnap's own conversion (`save --store-type`, ggsq v3), whose format decides
// its rotation: any claim it carries is the original's, recorded by kvsnap before f90f11b.
SourceClaims stored_file_claims(const SnapshotManifest& m) {
  SourceClaims w = m.provenance.writer;
  if (m.lossy) w.llama_build.clear(), w.llama_build_from.clear(), w.src_rotation.clear();
  return w;
}

// The catalog's row for a snapshot: what ls shows and find searches.
SnapshotRecord make_record(const SnapshotManifest& m, const StateFile& state, uint64_t raw_bytes,
                           const std::string& arch, const std::string& fingerprint) {
  SnapshotRecord rec;
  SnapshotInfo& info = rec.info;
  info.model_arch = arch;
  info.model_fingerprint = fingerprint;
  info.k_types = state_types(state, false);
  info.v_types = state_types(state, true);
  info.v_trans = state_v_layout(state) == "transposed";
  info.source_format = state_format_name(state);
  info.raw_bytes = raw_bytes;
  info.stored_bytes = m.stored_bytes();
  if (m.lossy) info.lossy = lossy_summary(m);
  info.content_sha256 = recorded_content_digest(m, nullptr);
  rec.manifest = m.bytes;
  rec.tokens = state.tokens.tokens;
  return rec;
}

// The type names of a catalog row's k_types or v_types ("q8_0" or "f16,q8_0"; "-" or empty: none)
// as a set: older kvsnap versions may list them in another order.
std::set<std::string> type_set(const std::string& listed) {
  std::set<std::string> names;
  for (size_t at = 0; at <= listed.size();) {
    const size_t comma = std::min(listed.find(',', at), listed.size());
    const std::string n = listed.substr(at, comma - at);
    if (!n.empty() && n != "-") names.insert(n);
    at = comma + 1;
  }
  return names;
}

// kCorruption unless the catalog's row describes what the snapshot holds: the manifest's cell
// metadata and tokens are the original's (SnapshotReader::verify_metadata), and the row's K and V
// types, V layout and size are those a save of the original records (make_record, mlx_record):
// what ls shows, find and --type filter by, and serve's slot book reads.
Status check_row_describes(const SnapshotInfo& row, const SnapshotReader& reader) {
  const SnapshotManifest& m = reader.manifest();
  SnapshotRecord saved;
  if (m.mlx) {
    KV_ASSIGN_OR_RETURN(saved, mlx_record(m, reader.original()));
  } else {
    KV_ASSIGN_OR_RETURN(StateFile parsed, reader.parse_original());
    KV_RETURN_IF_ERROR(reader.verify_metadata(parsed));
    saved = make_record(m, parsed, reader.original().size(), row.model_arch, row.model_fingerprint);
  }
  const SnapshotInfo& want = saved.info;
  std::vector<std::string> differ;
  auto compare = [&](const std::string& what, const std::string& have, const std::string& holds, bool same) {
    if (!same) differ.push_back(what + " " + have + " (the snapshot holds " + holds + ")");
  };
  compare("K types", row.k_types, want.k_types, type_set(row.k_types) == type_set(want.k_types));
  compare("V types", row.v_types, want.v_types, type_set(row.v_types) == type_set(want.v_types));
  auto layout = [](bool trans) { return std::string(trans ? "transposed" : "rows"); };
  compare("V layout", layout(row.v_trans), layout(want.v_trans), row.v_trans == want.v_trans);
  compare("size", std::to_string(row.raw_bytes), std::to_string(want.raw_bytes), row.raw_bytes == want.raw_bytes);
  if (differ.empty()) return Status::OK();
  std::string list;
  for (const std::string& d : differ) list += (list.empty() ? "" : ", ") + d;
  return Status::Corruption("the catalog's row differs from the snapshot: " + list);
}

}  // namespace

std::optional<RotationGeometry> recorded_geometry(const SnapshotManifest& m) {
  if (!m.model || m.model->kv_sections.empty() || m.model->layers.empty()) return std::nullopt;
  // llama.cpp's rule, as ModelInfo::rotation_head_dim: layer 0's head dim decides whether it rotates.
  const uint32_t k0 = m.model->layers[0].head_dim_k, v0 = m.model->layers[0].head_dim_v;
  RotationGeometry g;
  g.layer0_k = k0;
  g.layer0_v = v0;
  for (const auto& s : m.model->kv_sections) {
    g.k_head_dim.push_back(rotation_head_dim(shared_head_dim(s.head_dim_k), k0));
    g.v_head_dim.push_back(rotation_head_dim(shared_head_dim(s.head_dim_v), v0));
  }
  return g;
}

Store::Store(Io& io, StorePaths paths, std::unique_ptr<BlobStore> blobs, std::unique_ptr<Catalog> catalog)
    : io_(io), paths_(std::move(paths)), blobs_(std::move(blobs)), catalog_(std::move(catalog)) {}
Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::open(Io& io, const StorePaths& paths) {
  return open(io, directory_store(paths.root));
}

Result<std::unique_ptr<Store>> Store::open(Io& io, const StoreLocation& where) {
  KV_ASSIGN_OR_RETURN(StoreParts parts, open_store_parts(io, where));
  return open(io, std::move(parts));
}

Result<std::unique_ptr<Store>> Store::open(Io& io, StoreParts parts) {
  if (!parts.catalog || !parts.blobs) return Status::InvalidArgument("a store needs a catalog and blobs");
  StorePaths local{parts.local_dir};
  KV_RETURN_IF_ERROR(io.create_dirs(local.tmp_dir()));
  auto store = std::unique_ptr<Store>(new Store(io, std::move(local), std::move(parts.blobs), std::move(parts.catalog)));
  store->caps_ = std::move(parts.caps);
  KV_RETURN_IF_ERROR(store->open_encryption(parts));
  return store;
}

Status Store::open_encryption(StoreParts& parts) {
  name_ = parts.name.empty() ? paths_.root : parts.name;
  tenant_ = parts.tenant.empty() ? kDefaultTenant : parts.tenant;
  KV_ASSIGN_OR_RETURN(std::optional<std::string> meta, catalog_->get_meta(kMetaEncryption));
  KV_ASSIGN_OR_RETURN(std::optional<std::string> previous, catalog_->get_meta(kMetaEncryptionPrevious));
  store_key_id_ = meta.value_or("");
  rotating_from_ = previous.value_or("");
  if (parts.key) {
    const std::string given = key_id_hex(parts.key->id());
    if (meta && *meta != given && given != rotating_from_)  // during a rotation either key opens it
      return Status::Mismatch("store " + name_ + " is encrypted with key " + *meta + ", but the key given is " + given +
                              " (wrong key: pass the store's --key-file FILE or --key-command CMD)");
    KV_ASSIGN_OR_RETURN(ChunkCipher c, ChunkCipher::for_tenant(*parts.key, tenant_));
    cipher_.emplace(std::move(c));
    key_ = parts.key;
    catalog_->set_keying(prefix_keying(*cipher_));  // cipher_ lives as long as the store
  } else if (meta && !parts.keyless_ok) {
    return Status::InvalidArgument("store " + name_ + " is encrypted (key " + *meta +
                                   "): pass --key-file FILE or --key-command CMD");
  } else if (!meta && !parts.keyless_ok) {
    // Sealed rows but no setting: someone removed it, so that a command without the key would take
    // the store for a plain one (and its plain rows, whoever added them, as the store's own).
    KV_ASSIGN_OR_RETURN(std::optional<std::string> sealed, catalog_->any_sealed_key_id());
    if (sealed)
      return Status::Corruption("store " + name_ + " holds encrypted snapshots (key " + *sealed +
                                "), but its catalog's encryption setting is gone (removed by someone who can "
                                "write the catalog?): pass the key with --key-file FILE or --key-command CMD");
  }
  return Status::OK();
}

Status Store::init_encryption_meta() {
  if (!cipher_ || !store_key_id_.empty()) return Status::OK();
  // The first encrypted save marks the store; of two first saves with different keys, one fails.
  const std::string mine = key_id_hex(cipher_->master_key_id());
  KV_ASSIGN_OR_RETURN(std::string now, catalog_->init_meta(kMetaEncryption, mine));
  if (now != mine)
    return Status::Mismatch("store " + name_ + " is encrypted with key " + now + ", but the key given is " + mine +
                            " (wrong key: pass the store's --key-file FILE or --key-command CMD)");
  store_key_id_ = now;
  return Status::OK();
}

Status Store::check_save_keys(bool mark) {
  if (!store_key_id_.empty() && !cipher_)
    return Status::InvalidArgument("store " + name_ + " is encrypted (key " + store_key_id_ +
                                   "): it takes no plain snapshots; pass --key-file FILE or --key-command CMD");
  if (cipher_ && !rotating_from_.empty() && key_id_hex(cipher_->master_key_id()) == rotating_from_)
    return Status::Mismatch("store " + name_ + " is being rotated from key " + rotating_from_ + " to " + store_key_id_ +
                            " (kvsnap rekey): saves need the new key");
  return mark ? init_encryption_meta() : Status::OK();
}

Result<std::unique_ptr<BlobWriteBatch>> Store::begin_blob_write(GcLockHold* under) {
  KV_ASSIGN_OR_RETURN(auto batch, under ? blobs_->begin_write_under(*under) : blobs_->begin_write(/*wait=*/true));
  if (!blobs_bound_.load()) {
    KV_RETURN_IF_ERROR(bind_store_identity(*catalog_, *blobs_).Prefixed("store " + name_));
    blobs_bound_.store(true);
  }
  return batch;
}

Result<std::vector<std::byte>> Store::manifest_of(const SnapshotRecord& rec) const {
  return open_manifest_row(rec, cipher());
}

namespace {

// A file whose reads fail once `stop` is set: a save's reading ends soon after its witness refuses
// the file, where it would otherwise read, compress and write all of it for nothing.
class StoppableReadable final : public ReadableFile {
 public:
  StoppableReadable(const ReadableFile& f, const std::atomic<bool>& stop) : f_(f), stop_(stop) {}
  uint64_t size() const override { return f_.size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    if (stop_.load(std::memory_order_relaxed)) return Status::Interrupted(f_.name() + ": the save was refused");
    return f_.read_at(offset, dst);
  }
  const std::string& name() const override { return f_.name(); }

 private:
  const ReadableFile& f_;
  const std::atomic<bool>& stop_;
};

}  // namespace

Result<SaveResult> Store::save(const ReadableFile& file, const StateFile& parsed, const SaveRequest& req) {
  const auto t0 = Clock::now();
  KV_RETURN_IF_ERROR(check_new_labels_text(req.name.empty() ? std::nullopt : std::optional<std::string>(req.name), req.tags));
  // The first encrypted save marks the store, once the model's witness below has agreed.
  KV_RETURN_IF_ERROR(check_save_keys(/*mark=*/false));
  if (req.on_start) req.on_start(file.size());
  SnapshotOptions so = save_options(req, file);
  so.cipher = cipher();
  if (so.cipher) so.labels = request_labels(req);  // sealed with the manifest: the catalog's are checked against them
  KV_RETURN_IF_ERROR(check_writer_claims(req.writer, parsed, req.model, so.source_name));
  so.writer = req.writer;
  if (so.writer.src_rotation == "auto") so.writer.src_rotation.clear();
  if (req.model) {
    KV_ASSIGN_OR_RETURN(so.model, snapshot_model_info(req.model->profile));
  } else {
    so.model = req.recorded_model;
  }
  std::atomic<bool> refused{false};
  const StoppableReadable original(file, refused);
  const ReadableFile* src = &original;
  const StateFile* state = &parsed;
  std::unique_ptr<BlobWriteBatch> batch;  // its gc hold goes last: after the temporary and the sink
  TempFile temp{io_, ""};
  std::unique_ptr<ReadableFile> converted_file;
  StateFile converted;
  const std::string fingerprint = req.model ? req.model->profile.fingerprint : req.model_fingerprint;
  std::map<Sha256Digest, ChunkRef> parent_chunks;
  std::optional<SegmentTable> parent_grid;
  std::optional<int64_t> parent_id;
  std::optional<BlobSink> sink;
  // Reads the file (converted first with --store-type) and writes its new chunks.
  auto read_and_write = [&]() -> Result<SnapshotManifest> {
    KV_ASSIGN_OR_RETURN(batch, begin_blob_write(req.under_hold));
    if (req.store_type) {
      ConversionSpec store_spec = *req.store_type;
      apply_writer_claims(so.writer, store_spec);
      KV_ASSIGN_OR_RETURN(ConvertRequest creq, make_request(store_spec, parsed, req.model, file.name(), nullptr, &original));
      temp.path = temp_name(paths_, "store-type");
      KV_RETURN_IF_ERROR(write_temp(io_, temp.path, [&](ByteSink& out) {
        return convert_state(parsed, original, creq, out).status();
      }));
      KV_ASSIGN_OR_RETURN(converted_file, io_.open_read(temp.path));
      KV_ASSIGN_OR_RETURN(converted, parse_for_model(*converted_file, {}, req.model, HeadDimCheck::kByCaller));
      so.lossy = LossyConversion{state_types(parsed, false), state_types(parsed, true),
                                 state_types(converted, false), state_types(converted, true),
                                 "quantized on store (kvsnap save --store-type)"};
      src = converted_file.get();
      state = &converted;
      // What is stored is kvsnap's conversion (the current format, rotated where llama.cpp's rule
      // says), not the original's bytes: the claims about who wrote the original (its build, its
      // rotation) were used to read it above and must not be applied to the stored file on restore.
      // The file's own format decides it; llama-server's word stays, as a note of the original's.
      so.writer.llama_build.clear();
      so.writer.llama_build_from.clear();
      so.writer.src_rotation.clear();
    }
    // The parent first: its chunks (a conversation's shared prefix) are hashed
    // but not encoded again.
    KV_ASSIGN_OR_RETURN(parent_id, find_parent(state->tokens.tokens, fingerprint, req, parent_chunks, &parent_grid));
    if (parent_id) so.known_chunks = &parent_chunks;
    if (parent_grid) so.parent_grid = &*parent_grid;
    so.storage_waits = [&b = *batch] { return b.storage_waits(); };
    sink.emplace(*batch, *catalog_);
    KV_ASSIGN_OR_RETURN(SnapshotManifest built, build_snapshot(*state, *src, so, *sink));
    KV_RETURN_IF_ERROR(sink->finish());
    return built;
  };
  // With a model, its RoPE witness (check_model_head_dim: does the file's K have the model's head
  // dim?) runs on the original beside the reading, which it would otherwise hold up (a third of
  // an incremental save's wall); nothing is committed unless it agrees, and a refusal stops the
  // reading. Callers parse with HeadDimCheck::kByCaller (or say they checked: head_dim_checked).
  Status witness;
  std::optional<Result<SnapshotManifest>> built;  // set by worker 0 (fork_join rethrows what it threw)
  fork_join(req.model && !req.head_dim_checked ? 2 : 1, [&](size_t w) {
    if (w == 0) {
      built.emplace(read_and_write());
      return;
    }
    witness = check_model_head_dim(file, parsed, *req.model);
    if (!witness.ok()) refused.store(true, std::memory_order_relaxed);
  });
  KV_RETURN_IF_ERROR(witness);
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, std::move(*built));
  KV_RETURN_IF_ERROR(init_encryption_meta());
  if (req.source_unchanged) KV_RETURN_IF_ERROR(req.source_unchanged());
  KV_RETURN_IF_ERROR(batch->commit());
  SnapshotRecord rec = make_record(m, *state, src->size(), req.model ? req.model->arch : state->arch, fingerprint);
  // Read in full: the converted temporary goes while the batch's hold stands (a gc may delete tmp/'s
  // files once the hold is gone, and the save goes on past it: caps, eviction, compaction).
  if (!temp.path.empty()) (void)io_.remove(std::exchange(temp.path, std::string()));
  return commit_save(std::move(rec), m, *sink, batch, req, parent_id, since(t0));
}

Result<std::optional<int64_t>> Store::find_parent(const std::vector<int32_t>& tokens, const std::string& fingerprint,
                                                  const SaveRequest& req, std::map<Sha256Digest, ChunkRef>& chunks,
                                                  std::optional<SegmentTable>* grid) {
  if (!req.find_parent || tokens.empty()) return std::optional<int64_t>();
  // An empty fingerprint matches any model: the parent must at least be of the same engine (mlx-lm
  // snapshots' fingerprints start with "mlx-lm", store_mlx.cc).
  const bool mlx = fingerprint.rfind("mlx-lm", 0) == 0;
  KV_ASSIGN_OR_RETURN(auto prefixes, catalog_->find_prefix(tokens, fingerprint, 8));
  for (const SnapshotInfo& candidate : prefixes) {
    if ((candidate.model_arch == "mlx-lm") != mlx) continue;
    const int64_t id = candidate.id;
    auto parent = catalog_->get(id);
    if (!parent.ok() && parent.status().code() == Code::kNotFound) continue;  // removed meanwhile: the next
    KV_RETURN_IF_ERROR(parent.status());
    auto bytes = manifest_of(*parent);
    auto pm = bytes.ok() ? parse_manifest(*bytes, "snapshot " + std::to_string(id)) : bytes.status();
    if (pm.ok()) {  // a damaged parent only costs the shortcut
      for (const ChunkRef& c : pm->chunks) chunks.emplace(c.sha256, c);
      if (grid) *grid = std::move(pm->segments);
    }
    return std::optional<int64_t>(id);
  }
  return std::optional<int64_t>();
}

namespace {

// Caps are kept after the snapshots they protect are durable (a save's, an import's): a cap that
// could not be kept is a warning, not a failure (a caller such as serve's persister would count the
// snapshot unsaved and save it again: a review's finding). Ctrl-C during the eviction's collection
// still ends the command as interrupted.
Status caps_failure_as_warning(const Status& caps, const std::string& done, std::vector<std::string>& warnings) {
  if (caps.ok()) return caps;
  if (caps.code() == Code::kInterrupted) return caps.Prefixed(done + ", then keeping the store's caps");
  warnings.push_back("keeping the caps stopped: " + caps.ToString());
  return Status::OK();
}

}  // namespace

Result<SaveResult> Store::commit_save(SnapshotRecord rec, const SnapshotManifest& m, const BlobSink& sink,
                                      std::unique_ptr<BlobWriteBatch>& batch, const SaveRequest& req,
                                      std::optional<int64_t> parent_id, double seconds) {
  const auto t1 = Clock::now();
  SnapshotInfo& info = rec.info;
  if (!req.name.empty()) info.name = req.name;
  info.tags = req.tags;
  info.parent_id = parent_id;
  info.pinned = req.pin;
  info.created = req.created.empty() ? now_() : req.created;  // the clock eviction compares restores and expiries with
  KV_ASSIGN_OR_RETURN(info.uuid, canonical_snapshot_uuid(req.uuid));  // before anything is bound to it
  if (req.ttl_seconds) {
    KV_ASSIGN_OR_RETURN(info.expires_at, add_seconds(now_(), *req.ttl_seconds));
  }
  if (cipher_) {
    if (info.uuid.empty()) info.uuid = new_snapshot_uuid();  // the sealed rows are bound to it
    info.content_sha256 = recorded_content_digest(m, cipher());
    KV_RETURN_IF_ERROR(seal_record(*cipher_, m.bytes, rec));
  }
  KV_ASSIGN_OR_RETURN(SnapshotInfo stored, catalog_->commit_save(std::move(rec), sink.uses, batch->hold()));
  batch.reset();  // the catalog references the blobs now: gc may run again
  SaveResult r;
  r.info = std::move(stored);
  r.chunks = sink.uses.size();
  r.chunks_new = sink.written;
  r.bytes_new = sink.bytes_written;
  KV_RETURN_IF_ERROR(caps_failure_as_warning(enforce_caps(r.info, r), "saved snapshot " + std::to_string(r.info.id),
                                             r.cap_warnings));
  r.seconds = seconds + since(t1);
  return r;
}

Status Store::enforce_caps(const SnapshotInfo& info, SaveResult& r) {
  std::vector<EvictionRequest> reqs;
  if (caps_.max_bytes) reqs.push_back({caps_.max_bytes, std::nullopt, "", info.id});
  auto tenant = info.tags.find(kTenantTag);
  if (tenant != info.tags.end()) {
    auto cap = caps_.tenant_max_bytes.find(tenant->second);
    if (cap != caps_.tenant_max_bytes.end()) reqs.push_back({cap->second, tenant->second, "", info.id});
  }
  for (EvictionRequest& q : reqs) q.compact_dead_percent = compact_dead_percent();
  // The tenant's cap first: what it evicts also counts toward the store's.
  std::reverse(reqs.begin(), reqs.end());
  for (EvictionRequest& q : reqs) {
    KV_ASSIGN_OR_RETURN(EvictResult e, evict(q, /*dry_run=*/false));
    for (EvictionVictim& v : e.plan.victims) r.evicted.push_back(std::move(v));
    for (std::string& w : e.gc.warnings) r.gc_warnings.push_back(std::move(w));
    if (!e.plan.cap_met) {
      std::string scope = q.tenant ? "tenant '" + *q.tenant + "'" : "the store";
      r.cap_warnings.push_back(scope + " holds " + std::to_string(e.plan.bytes_after) + " bytes, over its cap of " +
                               std::to_string(*q.max_bytes) + ": only pinned snapshots, the one just saved and any saved after it are left");
    }
  }
  return Status::OK();
}

Result<SnapshotInfo> Store::set_pinned(const std::string& ref, bool pinned) {
  KV_ASSIGN_OR_RETURN(int64_t id, catalog_->resolve(ref));
  KV_RETURN_IF_ERROR(check_labels_of(ref, id, pinned ? "pin" : "unpin"));
  KV_RETURN_IF_ERROR(catalog_->set_pinned(id, pinned));
  return catalog_->get_info(id);
}

Result<SnapshotInfo> Store::set_expiry(const std::string& ref, std::optional<int64_t> seconds) {
  KV_ASSIGN_OR_RETURN(int64_t id, catalog_->resolve(ref));
  KV_RETURN_IF_ERROR(check_labels_of(ref, id, "expire"));
  std::optional<std::string> at;
  if (seconds) {
    KV_ASSIGN_OR_RETURN(at, add_seconds(now_(), *seconds));
  }
  KV_RETURN_IF_ERROR(catalog_->set_expiry(id, at));
  return catalog_->get_info(id);
}

// A victim kept at its removal (pinned, extended or restored since the plan) still counted as gone
// in the plan's figures: they are read again, of what the scope holds now, and of the removals made.
Status Store::recount_after_kept_victims(const EvictionRequest& req, const std::vector<EvictionVictim>& removed,
                                         EvictionPlan& plan) {
  EvictionRequest now = req;
  now.max_bytes = std::numeric_limits<uint64_t>::max();  // no cap to meet: only the scope's bytes
  now.keep.reset();
  auto held = plan_eviction(*catalog_, now);
  if (!held.ok()) return held.status();
  uint64_t freed = 0;
  for (const EvictionVictim& r : removed) freed += r.freed_bytes;
  plan.freed_bytes = freed;
  plan.bytes_after = held->bytes_before;
  plan.cap_met = !req.max_bytes || plan.bytes_after <= *req.max_bytes;
  return Status::OK();
}

Result<EvictResult> Store::evict(EvictionRequest req, bool dry_run, bool wait_gc) {
  if (req.now.empty()) req.now = now_();
  EvictResult out;
  out.dry_run = dry_run;
  KV_ASSIGN_OR_RETURN(out.plan, plan_eviction(*catalog_, req));
  // The scope's rows carry no tags (a review's finding: every evicted snapshot showed tags {}):
  // the victims' are read before they go, for what the commands list.
  for (EvictionVictim& v : out.plan.victims) {
    if (auto full = catalog_->get_info(v.info.id); full.ok()) v.info.tags = std::move(full->tags);
  }
  if (dry_run || out.plan.victims.empty()) return out;
  std::vector<EvictionVictim> removed;
  std::vector<std::string> warnings;
  bool kept_meanwhile = false;
  for (EvictionVictim& v : out.plan.victims) {
    // Checked in the removal's own transaction: pinned, given a later expiry or (chosen as least
    // recently restored) restored since the plan was read, by another process or host, is kept;
    // removed meanwhile is done.
    Catalog::RemovalCheck check;
    check.unpinned = true;
    if (v.expired) {
      check.expired_as_of = req.now;
    } else {
      check.unrestored_since_plan = true;
      check.last_restored = v.info.last_restored;
    }
    auto gone = catalog_->remove_snapshot_if(v.info.id, check);
    if (!gone.ok() && gone.status().code() == Code::kNotFound) continue;
    if (!gone.ok() && gone.status().code() == Code::kMismatch) {
      kept_meanwhile = true;
      continue;
    }
    if (!gone.ok()) {
      // The removals before it stand (each its own transaction), and so does the save that asked:
      // a warning, the rest kept, the cap perhaps not met.
      warnings.push_back("evicting stopped at " + snapshot_label(v.info) + " (" + gone.status().ToString() +
                         "): the cap may not be met until the next gc");
      // The plan's figures describe every victim: these are of the removals made (a prefix of it).
      uint64_t freed = 0;
      for (const EvictionVictim& r : removed) freed += r.freed_bytes;
      out.plan.freed_bytes = freed;
      out.plan.bytes_after = out.plan.bytes_before - std::min(freed, out.plan.bytes_before);
      out.plan.cap_met = false;
      break;
    }
    removed.push_back(std::move(v));
  }
  // (A stopped eviction's figures are already of the removals made, its cap not met.)
  if (kept_meanwhile && warnings.empty()) {
    if (Status s = recount_after_kept_victims(req, removed, out.plan); !s.ok())
      warnings.push_back("a victim was kept since the plan, and the store's size could not be read again (" +
                         s.ToString() + "): its figures count it as gone");
  }
  out.plan.victims = std::move(removed);
  GcOptions o;
  o.wait = wait_gc;
  o.scan_orphans = false;
  o.compact_dead_percent = req.compact_dead_percent;
  o.progress = req.gc_progress;
  Result<GcReport> collected = collect_garbage(*catalog_, *blobs_, o);
  // The removals are done and durable: a collection that failed leaves garbage for the next gc,
  // which is a warning (a save over its cap succeeded), not a failure. A stop asked for (Ctrl-C in
  // gc's eviction step) still stops.
  if (!collected.ok() && collected.status().code() == Code::kInterrupted) return collected.status();
  if (collected.ok()) out.gc = std::move(*collected);
  else warnings.push_back("the collection after the evictions failed (" + collected.status().ToString() +
                          "): kvsnap gc deletes what they left");
  out.gc.warnings.insert(out.gc.warnings.begin(), warnings.begin(), warnings.end());
  return out;
}

Result<std::unique_ptr<StoredSnapshot>> Store::open_snapshot(const std::string& ref) {
  // Taken before the rows are read, kept while the snapshot is open (blob_store.h, "readers").
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLockHold> hold, blobs_->hold_for_read());
  return open_snapshot_held(ref, std::move(hold));
}

namespace {
// Whether `ref` is the snapshot's whole uuid (which a sealed row is bound to), in any case.
bool names_its_uuid(const std::string& ref, const std::string& uuid) {
  return ref.size() == uuid.size() && std::equal(ref.begin(), ref.end(), uuid.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}
// `info` with the name and tags sealed in its manifest, where it records them (INFO.labels).
SnapshotInfo with_sealed_labels(SnapshotInfo info, const SnapshotManifest& m) {
  if (info.tenant && m.labels) {
    info.name = m.labels->name;
    info.tags = m.labels->tags;
  }
  return info;
}
}  // namespace

namespace {

// kNotFound naming the snapshot as the user did, for one removed between its name's lookup and
// the read of its rows (the catalog's own message names only the id).
template <class T>
Result<T> removed_is_not_found(Result<T> r, const std::string& ref) {
  if (r.ok() || r.status().code() != Code::kNotFound) return r;
  return Status::NotFound("snapshot " + quote_text(ref) + " was removed meanwhile (" + r.status().message() + ")");
}

}  // namespace

Status Store::check_labels_of(const std::string& ref, int64_t id, const std::string& change) {
  // The row's blobs are read only for a sealed row named by something else than its uuid: a plain
  // or uuid-named row whose blobs are damaged must still go by rm.
  KV_ASSIGN_OR_RETURN(SnapshotInfo info, catalog_->get_info(id));
  if (!info.tenant || names_its_uuid(ref, info.uuid)) return Status::OK();
  KV_ASSIGN_OR_RETURN(SnapshotRecord rec, catalog_->get(id));
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> manifest, manifest_of(rec));
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, parse_manifest(manifest, "snapshot " + ref));
  return check_sealed_labels(rec.info, m, ref, change);
}

Result<std::unique_ptr<StoredSnapshot>> Store::open_snapshot_held(const std::string& ref,
                                                                  std::unique_ptr<GcLockHold> hold, bool check_labels) {
  KV_ASSIGN_OR_RETURN(int64_t id, catalog_->resolve(ref));
  // One moment: an rm committed between two reads would leave the record without its chunks
  // (taken for lost blobs). Read under `hold`, the blobs outlive a removal committed after it.
  KV_ASSIGN_OR_RETURN(SnapshotRows rows, removed_is_not_found(catalog_->get_with_chunks(id), ref));
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> manifest, manifest_of(rows.record));
  auto s = std::make_unique<OpenedSnapshot>(std::move(hold), std::move(rows.record.info), *blobs_);
  s->source_.add(rows.chunks);
  SnapshotReadOptions ro;
  ro.cipher = cipher();
  auto reader = kvsnap::open_snapshot(manifest, s->source_, ro);
  if (!reader.ok())
    return reader.status().Prefixed("snapshot " + ref + " (id " + std::to_string(id) + "): its manifest");
  if (check_labels && !names_its_uuid(ref, s->info_.uuid))
    KV_RETURN_IF_ERROR(check_sealed_labels(s->info_, (*reader)->manifest(), ref));
  s->reader_ = std::move(reader).value();
  return std::unique_ptr<StoredSnapshot>(std::move(s));
}

namespace {

// --model names the model a restore writes for. A snapshot saved with another model's fingerprint
// is refused: its cache means nothing to that model, and its head dims would steer the rotation
// (a review's finding: a hd64 snapshot restored with a hd128 GGUF was garbage, exit 0).
Status check_restore_model(const std::string& ref, const SnapshotInfo& info, const ModelInfo& model) {
  if (info.model_fingerprint.empty() || model.profile.fingerprint.empty() ||
      info.model_fingerprint == model.profile.fingerprint)
    return Status::OK();
  return Status::Mismatch("snapshot " + quote_text(ref) + " was saved with model " + info.model_fingerprint +
                          (info.model_arch.empty() ? "" : " (" + info.model_arch + ")") + ", and " + model.path +
                          " is model " + model.profile.fingerprint + " (" + model.arch +
                          "): give the GGUF it was saved with, or no --model (the snapshot's recorded head dims)");
}

}  // namespace

// Damage found while restoring is named as the user named the snapshot, with the commands that
// examine and remove it: the reader's own message names only the manifest's hash.
Result<RestoreResult> Store::restore(const std::string& ref, const RestoreRequest& req, ByteSink& out) {
  auto r = restore_unlabeled(ref, req, out);
  if (r.ok() || r.status().code() != Code::kCorruption) return r;
  std::string m = "snapshot " + quote_text(ref) + " is damaged in the store: " + r.status().message();
  const std::string tail = "; run kvsnap verify";
  if (m.size() >= tail.size() && m.compare(m.size() - tail.size(), tail.size(), tail) == 0) m.resize(m.size() - tail.size());
  return Status::Corruption(m + " (kvsnap verify " + quote_text(ref) + " checks every chunk of it; kvsnap rm removes it)");
}

Result<RestoreResult> Store::restore_unlabeled(const std::string& ref, const RestoreRequest& req, ByteSink& out) {
  const auto t0 = Clock::now();
  KV_ASSIGN_OR_RETURN(auto snap, open_snapshot(ref));
  KV_RETURN_IF_ERROR(check_plain_under_key(snap->info(), cipher(), req.allow_plain));
  const SnapshotReader& reader = snap->reader();
  if (reader.manifest().mlx) return restore_mlx(*snap, ref, req, out, t0);
  if (req.mlx.given()) {
    return Status::InvalidArgument("snapshot " + quote_text(ref) + " is a llama.cpp state: " + req.mlx.flags() +
                                   " are for mlx-lm prompt caches; for llama.cpp give {--ctk}/{--ctv}");
  }
  const ReadableFile& original = reader.original();
  RestoreResult r;
  r.info = snap->info();
  if (req.model) KV_RETURN_IF_ERROR(check_restore_model(ref, r.info, *req.model));
  CountingSink count;
  TeeSink tee(out, count);
  const bool convert = wants_conversion(req.spec);
  if (!convert && !req.tokens) {
    // Byte for byte, every chunk checked as it is copied: the original is not parsed first. The
    // parser reads ahead into the first chunk of every tensor, which decoded ~8% of a slot on
    // this thread alone before the copy's threads started (and into fresh cache buffers).
    r.n_tokens = uint64_t(r.info.n_tokens);  // the catalog's, recorded from the same tokens at save
    const uint32_t threads = req.spec.threads > 0 ? uint32_t(req.spec.threads) : default_threads();
    KV_RETURN_IF_ERROR(copy_parallel(reader, threads, tee));
    return finish_restore(std::move(r), count.count, t0);
  }
  KV_ASSIGN_OR_RETURN(StateFile parsed, reader.parse_original());
  r.n_tokens = parsed.tokens.tokens.size();
  if (req.model && convert && r.info.model_fingerprint.empty()) {
    // Saved without a model: the GGUF is checked against the data as convert checks it (arch,
    // vocabulary, the RoPE witness of its head dim).
    const std::string name = "snapshot " + quote_text(ref);
    KV_RETURN_IF_ERROR(req.model->check_state(parsed, name));
    KV_RETURN_IF_ERROR(check_model_head_dim(original, parsed, *req.model).Prefixed(name));
  }
  if (!convert) {
    KV_RETURN_IF_ERROR(prefix_error(write_prefix(parsed, original, *req.tokens, tee), ref));
    r.n_tokens = *req.tokens;
  } else {
    ConversionSpec spec = req.spec;
    apply_writer_claims(stored_file_claims(reader.manifest()), spec);
    if (!req.model && !spec.geometry) spec.geometry = recorded_geometry(reader.manifest());
    if (!req.model && !spec.cell_ext_bytes && reader.manifest().model)
      spec.cell_ext_bytes = reader.manifest().model->cell_ext_bytes;
    const ReadableFile* src = &original;
    const StateFile* state = &parsed;
    TempFile temp{io_, ""};
    std::unique_ptr<ReadableFile> prefix_file;
    StateFile prefix_state;
    if (req.tokens) {
      // Cut first (reads only the prefix's chunks), then convert the cut.
      temp.path = temp_name(paths_, "restore-prefix");
      KV_RETURN_IF_ERROR(prefix_error(
          write_temp(io_, temp.path, [&](ByteSink& o) { return write_prefix(parsed, original, *req.tokens, o); }), ref));
      KV_ASSIGN_OR_RETURN(prefix_file, io_.open_read(temp.path));
      ParseOptions po = reader.parse_options();
      KV_ASSIGN_OR_RETURN(prefix_state, parse_state(*prefix_file, po));
      src = prefix_file.get();
      state = &prefix_state;
      r.n_tokens = *req.tokens;
    }
    KV_ASSIGN_OR_RETURN(ConvertRequest creq, make_request(spec, *state, req.model, "snapshot " + ref));
    if (src == &original) {  // not a prefix's temporary file
      creq.source_read_cells = reader.read_cells();
      creq.source_chunk_cells = reader.chunk_cells();
    }
    KV_RETURN_IF_ERROR(convert_state(*state, *src, creq, tee).status());
    r.converted = true;
  }
  return finish_restore(std::move(r), count.count, t0);
}

RestoreResult Store::finish_restore(RestoreResult r, uint64_t bytes_out, Clock::time_point t0) {
  r.bytes_out = bytes_out;
  r.seconds = since(t0);
  // Eviction's order (least recently restored goes first). A store that cannot record it still restored.
  const std::string at = now_();
  if (catalog_->mark_restored(r.info.id, at).ok()) r.info.last_restored = at;
  return r;
}

Result<SnapshotInfo> Store::remove(const std::string& ref, GcReport* gc) {
  KV_ASSIGN_OR_RETURN(int64_t id, catalog_->resolve(ref));
  // A sealed manifest row that does not open shows no labels to check the name against: refused
  // too (someone who can write the catalog may have swapped names and then manifest rows, which
  // swapped back would open again); its uuid removes it.
  if (Status labels = check_labels_of(ref, id, "rm"); !labels.ok()) {
    if (labels.code() != Code::kCorruption) return labels;
    KV_ASSIGN_OR_RETURN(SnapshotInfo row, catalog_->get_info(id));
    return labels.Appended("; nothing was removed: " + quote_text(ref) +
                           " cannot be checked against the name sealed in this row (damaged, or swapped with "
                           "another row's by someone who can write the catalog, and then it would open again "
                           "swapped back); if it is the snapshot you mean, kvsnap rm " + row.uuid + " removes it");
  }
  KV_ASSIGN_OR_RETURN(SnapshotInfo info, catalog_->get_info(id));
  KV_RETURN_IF_ERROR(catalog_->remove_snapshot(id).status());
  GcOptions o;
  o.wait = false;
  o.scan_orphans = false;
  o.compact_dead_percent = compact_dead_percent();
  // Best effort: the snapshot is gone either way, and `kvsnap gc` finishes what a busy store skipped.
  Result<GcReport> collected = collect_garbage(*catalog_, *blobs_, o);
  if (gc) {
    if (collected.ok()) *gc = std::move(*collected);
    else gc->warnings.push_back("the collection after the removal failed (" + collected.status().ToString() +
                                "): kvsnap gc deletes what it left");
  }
  return info;
}

Result<GcReport> Store::gc(bool wait, std::function<Status(const GcProgress&)> progress, int compact_dead_percent) {
  GcOptions o;
  o.wait = wait;
  o.compact_dead_percent = compact_dead_percent;
  o.scan_orphans = true;
  o.progress = std::move(progress);
  KV_ASSIGN_OR_RETURN(GcReport r, collect_garbage(*catalog_, *blobs_, o));
  if (r.skipped_busy) return r;
  delete_abandoned_temps(r);  // its trouble is a warning: the collection is done
  return r;
}

// This host's temporaries in <local_dir>/tmp (import entries, export's plain files, restore
// prefixes: decrypted bytes among them) that a killed process left. A directory store's blobs
// list them as their own tmp/ (collect_garbage took them already); blobs elsewhere (S3, another
// directory) do not, so they are taken here, under the exclusive lock as blob temporaries are.
void Store::delete_abandoned_temps(GcReport& r) {
  auto store_temps = [this]() -> Result<std::vector<std::string>> {
    std::vector<std::string> temps;
    auto listed = io_.list_dir(paths_.tmp_dir());
    if (!listed.ok() && listed.status().code() == Code::kNotFound) return temps;
    KV_RETURN_IF_ERROR(listed.status());
    for (const DirEntry& e : *listed)
      if (e.is_regular && is_store_temp(e.name)) temps.push_back(e.name);
    return temps;
  };
  auto warn = [&](const Status& s) { r.warnings.push_back("abandoned temporaries in " + paths_.tmp_dir() + ": " + s.ToString()); };
  Result<std::vector<std::string>> seen = store_temps();
  if (!seen.ok()) return warn(seen.status());
  if (seen->empty()) return;  // the usual case: no lock taken again
  // Not waited for even by `gc --wait`: a temporary seen above may be a live save's or restore's.
  Result<std::unique_ptr<GcLock>> lock = blobs_->lock_for_gc(/*wait=*/false);
  if (!lock.ok()) return warn(lock.status());
  if (!*lock) return;  // a save or a read holds the store: the next gc
  Result<std::vector<std::string>> temps = store_temps();  // under the lock: all abandoned
  if (!temps.ok()) return warn(temps.status());
  for (const std::string& name : *temps) {
    Status gone = io_.remove(paths_.tmp_dir() + "/" + name);
    if (gone.ok()) ++r.temporaries_deleted;
    else if (gone.code() != Code::kNotFound) warn(gone.Prefixed(name));
  }
}

CompactionPlan Store::plan_compaction(int compact_dead_percent) {
  if (compact_dead_percent <= 0) return {};
  auto packs = blobs_->list_packs();
  if (!packs.ok()) {
    CompactionPlan none;
    none.warnings.push_back("the packs could not be listed (" + packs.status().message() + ")");
    return none;
  }
  return kvsnap::plan_compaction(*catalog_, *blobs_, *packs, compact_dead_percent);
}

Result<VerifyReport> Store::verify(const std::vector<std::string>& refs) {
  VerifyReport rep;
  std::vector<int64_t> ids;
  if (refs.empty()) {
    KV_ASSIGN_OR_RETURN(auto problems, catalog_->integrity_check());
    for (auto& p : problems) rep.problems.push_back("catalog: " + p);
    KV_ASSIGN_OR_RETURN(auto all, catalog_->list());
    for (const auto& s : all) ids.push_back(s.id);
  } else {
    for (const auto& r : refs) {
      KV_ASSIGN_OR_RETURN(int64_t id, catalog_->resolve(r));
      ids.push_back(id);
    }
  }
  // A snapshot removed while verify runs (rm, expiry, caps: the read hold keeps blobs, not rows) is
  // not damage: noted, not a problem. A failure is blamed on its removal only if its row is gone.
  auto removed_meanwhile = [&](int64_t id) {
    auto now = catalog_->get_info(id);
    if (now.ok() || now.status().code() != Code::kNotFound) return false;
    rep.not_checked.push_back("snapshot " + std::to_string(id) + ": removed while verify ran");
    return true;
  };
  for (int64_t id : ids) {
    const std::string who = "snapshot " + std::to_string(id);
    // Before its rows are read (blob_store.h, "readers"); the opened snapshot keeps it.
    KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLockHold> hold, blobs_->hold_for_read());
    auto found = catalog_->get_info(id);
    if (!found.ok() && removed_meanwhile(id)) continue;
    KV_ASSIGN_OR_RETURN(SnapshotInfo row, std::move(found));
    ++rep.snapshots;
    if (row.tenant && (!cipher_ || *row.tenant != cipher_->tenant() ||
                       row.master_key_id != key_id_hex(cipher_->master_key_id()))) {
      verify_sealed(row, rep);  // not this key's to open: what needs no key
      continue;
    }
    // A label mismatch is reported below and the rest of the snapshot still checked.
    auto snap = open_snapshot_held(std::to_string(id), std::move(hold), /*check_labels=*/false);
    if (!snap.ok()) {
      if (snap.status().code() == Code::kInterrupted) return snap.status();  // stopped, not damaged
      if (removed_meanwhile(id)) {
        --rep.snapshots;
        continue;
      }
      rep.problems.push_back(who + ": " + snap.status().ToString());
      continue;
    }
    const SnapshotReader& reader = (*snap)->reader();
    const SnapshotInfo& info = (*snap)->info();
    const std::string label = info.name ? who + " (" + *info.name + ")" : who;
    if (Status l = check_sealed_labels(info, reader.manifest(), std::to_string(id)); !l.ok())
      rep.problems.push_back(label + ": " + l.message());
    auto rec = catalog_->get(id);
    if (!rec.ok() && removed_meanwhile(id)) {
      --rep.snapshots;
      continue;
    }
    auto tokens = rec.ok() ? open_tokens_row(*rec, cipher()) : rec.status();
    if (!tokens.ok())
      rep.problems.push_back(label + ": " + tokens.status().ToString());
    else if (*tokens != reader.tokens().tokens)
      rep.problems.push_back(label + ": the catalog's token list differs from the snapshot's");
    if (info.content_sha256 != recorded_content_digest(reader.manifest(), info.tenant ? cipher() : nullptr))
      rep.problems.push_back(label + ": the catalog's content hash differs from the snapshot's");
    if (Status d = check_row_describes(row, reader); !d.ok()) rep.problems.push_back(label + ": " + d.ToString());
    Status s = reader.verify_chunks();
    if (s.ok()) s = reader.verify_original();
    if (s.code() == Code::kInterrupted) return s;
    if (!s.ok()) rep.problems.push_back(label + ": " + s.ToString());
    rep.chunks += reader.chunks().size();
    rep.bytes += reader.manifest().raw_bytes();
  }
  if (rep.sealed_only > 0)
    rep.not_checked.push_back(std::to_string(rep.sealed_only) + " encrypted snapshot(s) checked without their key: "
                              "catalog rows, key ids, every blob's presence, sealed header and size; not their "
                              "contents, tokens or the original's hash (pass the tenant's key to check those)");
  return rep;
}

Status Store::check_blobs_present(int64_t id, const std::string& ref) {
  KV_ASSIGN_OR_RETURN(std::vector<ChunkUse> uses, catalog_->chunks_of(id));
  const std::string who = "snapshot " + ref + ": ";
  const std::string remedy = " (in " + blobs_->describe() + "; kvsnap verify " + ref + " lists what is damaged)";
  std::map<std::string, uint64_t> pack_end;  // each pack's furthest blob end
  for (const ChunkUse& u : uses) {
    if (u.pack.empty()) {
      KV_ASSIGN_OR_RETURN(bool there, blobs_->contains(u.sha256));
      if (!there) return Status::NotFound(who + "chunk " + u.sha256.hex() + " is missing" + remedy);
      continue;
    }
    uint64_t& end = pack_end[u.pack];
    end = std::max(end, u.pack_offset + u.stored_size);
  }
  for (const auto& [pack, end] : pack_end) {
    KV_ASSIGN_OR_RETURN(uint64_t size, blobs_->pack_size(pack));  // 0 when absent
    if (size == 0) return Status::NotFound(who + "pack " + pack + " is missing" + remedy);
    if (size < end)
      return Status::Corruption(who + "pack " + pack + " holds " + std::to_string(size) + " bytes, its blobs end at " +
                                std::to_string(end) + remedy);
  }
  return Status::OK();
}

void Store::verify_sealed(const SnapshotInfo& info, VerifyReport& rep) {
  ++rep.sealed_only;
  const std::string label = snapshot_label(info);
  auto problem = [&](const Status& s) { rep.problems.push_back(label + ": " + s.ToString()); };
  if (info.master_key_id != store_key_id_ && info.master_key_id != rotating_from_)
    problem(Status::Mismatch("sealed with key " + info.master_key_id + ", but the store's key is " + store_key_id_));
  auto rows = catalog_->get_with_chunks(info.id);
  if (!rows.ok()) return problem(rows.status());
  const SnapshotRecord* rec = &rows->record;
  Status s = check_sealed_without_key(rec->manifest, info, 0, "its manifest row");
  if (!s.ok()) problem(s);
  s = check_sealed_without_key(rec->sealed_tokens, info, uint64_t(info.n_tokens) * 4 + kSealedHeaderBytes + kSealedTagBytes, "its token row");
  if (!s.ok()) problem(s);
  std::vector<std::byte> blob;
  for (const ChunkUse& u : rows->chunks) {
    const std::string what = "chunk " + u.sha256.hex();
    s = blobs_->get_into(u.sha256, u.location(), kMaxBlobBytes, blob);
    if (s.ok()) s = check_sealed_without_key(blob, info, u.stored_size, what);
    else s = s.Prefixed(what);
    if (!s.ok()) problem(s);
  }
  rep.chunks += rows->chunks.size();
}

namespace {

constexpr const char* kExportIndex = "kvsnap-export.json";
constexpr const char* kSealedMetadata = "sealed_metadata";  // an index entry's sealed labels (hex)

// export --decrypt: the snapshot's original saved again as a plain standalone file (every chunk
// opened, decoded and encoded again under its SHA-256 id) into `out`.
Status write_plain_file(const StoredSnapshot& snap, ByteSink& out) {
  const SnapshotReader& r = snap.reader();
  SnapshotOptions so;
  so.cells_per_chunk = r.manifest().cells_per_chunk ? r.manifest().cells_per_chunk : kDefaultCellsPerChunk;
  so.zstd_level = SaveRequest{}.zstd_level;
  so.threads = default_threads();
  so.source_name = r.provenance().source;
  so.writer = r.provenance().writer;
  so.model = r.manifest().model;
  so.created = snap.info().created;
  if (r.manifest().mlx) return write_mlx_again(r, so, out);
  KV_ASSIGN_OR_RETURN(StateFile state, r.parse_original());
  return write_snapshot_file(state, r.original(), so, out).status();
}

// A file in the store's tmp/, removed when this is destroyed (after the file is closed).
class TempReadable final : public ReadableFile {
 public:
  TempReadable(Io& io, std::string path, std::unique_ptr<ReadableFile> f) : temp_{io, std::move(path)}, f_(std::move(f)) {}
  uint64_t size() const override { return f_->size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override { return f_->read_at(offset, dst); }
  const std::string& name() const override { return f_->name(); }

 private:
  TempFile temp_;                   // destroyed last
  std::unique_ptr<ReadableFile> f_;
};

// A file read under another name: an archive's entry, received into a temporary, named in
// messages by the archive and the entry (the temporary is gone by the time a user reads them).
class RenamedReadable final : public ReadableFile {
 public:
  RenamedReadable(std::unique_ptr<ReadableFile> f, std::string name) : f_(std::move(f)), name_(std::move(name)) {}
  uint64_t size() const override { return f_->size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override { return f_->read_at(offset, dst); }
  const std::string& name() const override { return name_; }

 private:
  std::unique_ptr<ReadableFile> f_;
  std::string name_;
};

std::string export_entry_name(const SnapshotInfo& s) { return "snapshots/" + s.uuid + ".kvsnap"; }

// What a plain index entry shows and a sealed one hides: name, tags, fingerprint, created.
nlohmann::json export_labels(const SnapshotInfo& s) {
  nlohmann::json j = {{"created", s.created}, {"model_fingerprint", s.model_fingerprint},
                      {"tags", nlohmann::json::object()}};
  j["name"] = s.name ? nlohmann::json(*s.name) : nlohmann::json(nullptr);
  for (const auto& [k, v] : s.tags) j["tags"][k] = v;
  return j;
}

// A snapshot's entry in the index. An encrypted one shows only what opening its sealed file
// needs; its labels travel sealed by the tenant's cipher, bound to the uuid, with the original's
// SHA-256 inside so that they cannot be moved onto another file of the archive either.
Result<nlohmann::json> index_entry(const SnapshotInfo& s, const Sha256Digest& original, const ChunkCipher* cipher) {
  nlohmann::json j = {{"uuid", s.uuid}, {"file", export_entry_name(s)}};
  if (!s.tenant) {
    j.update(export_labels(s));
    return j;
  }
  if (!cipher) return check_snapshot_key(s, cipher);  // the "no key was given" error
  nlohmann::json labels = export_labels(s);
  labels["original_sha256"] = to_hex(original);
  const std::string plain = json_text(labels);
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> sealed,
                      seal_export_metadata(*cipher, s.uuid, std::as_bytes(std::span<const char>(plain))));
  j.update({{"tenant", *s.tenant}, {"master_key_id", s.master_key_id}, {"tenant_key_id", s.tenant_key_id},
            {kSealedMetadata, to_hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(sealed.data()), sealed.size()))}});
  return j;
}

// Receives an archive: the index in memory (small), each .kvsnap into a temporary file.
// What an import leaves free on the disk of <store>/tmp beside an entry it unpacks (the catalog's
// commits and other saves share that disk).
constexpr uint64_t kImportHeadroomBytes = uint64_t{64} << 20;

class ImportVisitor final : public ArchiveVisitor {
 public:
  ImportVisitor(Io& io, const StorePaths& paths, const std::string& archive) : io_(io), paths_(paths), archive_(archive) {}
  ~ImportVisitor() override {
    out_.reset();
    for (const auto& f : files) (void)io_.remove(f.second);
  }
  Status begin_entry(const ArchiveEntryInfo& e) override {
    if (e.name == kExportIndex) {
      if (e.size > (64u << 20)) return Status::NotSupported(archive_ + ": " + kExportIndex + " is too large");
      in_index_ = true;
      return Status::OK();
    }
    entry_ = archive_ + ": entry " + std::to_string(e.index) + " '" + e.name + "'";
    if (e.name.size() < 8 || e.name.substr(e.name.size() - 7) != ".kvsnap")
      return Status::NotSupported(entry_ + " is not a .kvsnap snapshot; is this a kvsnap export?");
    // Every entry lands in tmp/ before any is checked: one that cannot fit is refused before a
    // byte is written, not once it has filled the disk the store's catalog and saves share.
    auto measured = io_.free_bytes(paths_.tmp_dir());  // an error (a FUSE mount): unknown, not checked
    const std::optional<uint64_t> free = measured.ok() ? *measured : std::nullopt;
    if (free && e.size + kImportHeadroomBytes > *free)
      return Status::IOError(entry_ + " is " + std::to_string(e.size) + " bytes, and " + paths_.tmp_dir() + " has " +
                             std::to_string(*free) + " bytes free (the import keeps " +
                             std::to_string(kImportHeadroomBytes >> 20) + " MiB beside it): free space or import it "
                             "into a store on another disk");
    head_.clear();
    const std::string tmp = temp_name(paths_, "import");
    // As write_temp's: an entry of a decrypted export is plaintext.
    KV_ASSIGN_OR_RETURN(out_, io_.create_owner_only(tmp));
    files.push_back({e.name, tmp});
    return Status::OK();
  }
  Status entry_data(std::span<const std::byte> piece) override {
    if (in_index_) {
      index_text.append(reinterpret_cast<const char*>(piece.data()), piece.size());
      return Status::OK();
    }
    if (head_.size() < kSnapshotMagicBytes) {  // a .kvsnap file's magic, before the rest is written
      const size_t n = std::min(piece.size(), kSnapshotMagicBytes - head_.size());
      head_.insert(head_.end(), piece.begin(), piece.begin() + n);
      if (head_.size() == kSnapshotMagicBytes && !starts_like_snapshot_file(head_))
        return Status::Corruption(entry_ + " does not start as a .kvsnap file does");
    }
    return out_->append(piece);
  }
  Status end_entry() override {
    if (in_index_) {
      in_index_ = false;
      return Status::OK();
    }
    if (head_.size() < kSnapshotMagicBytes) return Status::Corruption(entry_ + " is too short for a .kvsnap file");
    Status s = out_->close();
    out_.reset();
    return s;
  }
  std::string index_text;
  std::vector<std::pair<std::string, std::string>> files;  // entry name, temporary path

 private:
  Io& io_;
  const StorePaths& paths_;
  std::string archive_;
  bool in_index_ = false;
  std::string entry_;              // the entry being received, for messages
  std::vector<std::byte> head_;    // its first bytes (the magic)
  std::unique_ptr<WritableFile> out_;
};

// export_labels() read back (from the index, or from the opened sealed metadata).
Status read_labels(const JsonRef& e, ExportIndexEntry& out) {
  KV_ASSIGN_OR_RETURN(out.created, e.string_or("created", ""));
  KV_ASSIGN_OR_RETURN(out.model_fingerprint, e.string_or("model_fingerprint", ""));
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> name, e.find("name"));
  if (name) {
    KV_ASSIGN_OR_RETURN(out.name, name->string());
  }
  KV_ASSIGN_OR_RETURN(std::optional<JsonRef> tags, e.find("tags"));
  if (tags) {
    KV_ASSIGN_OR_RETURN(auto members, tags->members());
    for (const auto& [key, value] : members) {
      KV_ASSIGN_OR_RETURN(out.tags[key], value.string());
    }
  }
  return Status::OK();
}

Result<ExportIndexEntry> index_entry_of(const JsonRef& e) {
  ExportIndexEntry out;
  KV_ASSIGN_OR_RETURN(JsonRef file, e.at("file"));
  KV_ASSIGN_OR_RETURN(out.file, file.string());
  KV_ASSIGN_OR_RETURN(std::string uuid, e.string_or("uuid", ""));
  auto canonical = canonical_snapshot_uuid(uuid);
  if (!canonical.ok()) return e.error("uuid " + canonical.status().message());
  out.uuid = *canonical;
  KV_ASSIGN_OR_RETURN(out.sealed_metadata, e.string_or(kSealedMetadata, ""));
  if (!out.sealed_metadata.empty() && out.uuid.empty())  // (it would fail to open as "tampered")
    return e.error("sealed metadata without a uuid: the labels are sealed to the snapshot's uuid, which the index must give");
  KV_RETURN_IF_ERROR(read_labels(e, out));
  return out;
}

// The labels of a sealed export's entry, opened with the cipher that opened its file (`where`:
// the archive and the entry). kCorruption when changed, moved from another uuid or file.
Status open_labels(ExportIndexEntry& e, const ChunkCipher* cipher, const Sha256Digest& original,
                   const std::string& where) {
  const std::string what = where + ": its sealed metadata";
  if (!cipher)
    return Status::InvalidArgument(what + " is encrypted, and no key was given: pass {--key-file FILE} or "
                                   "{--from-key-file FILE}");
  const std::string& hex = e.sealed_metadata;
  std::vector<uint8_t> sealed(hex.size() / 2);
  if (hex.size() % 2 != 0 || !from_hex(hex, sealed)) return Status::Corruption(what + ": not hex digits");
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> plain,
                      open_export_metadata(*cipher, e.uuid, std::as_bytes(std::span<const uint8_t>(sealed)), what));
  const std::string_view text(reinterpret_cast<const char*>(plain.data()), plain.size());
  KV_ASSIGN_OR_RETURN(nlohmann::json labels, parse_json(text, what));
  const JsonRef root(labels, what);
  KV_RETURN_IF_ERROR(read_labels(root, e));
  KV_ASSIGN_OR_RETURN(std::string sha, root.string_or("original_sha256", ""));
  if (sha != to_hex(original))
    return Status::Corruption(what + ": it belongs to another snapshot (original " + sha + ", the file's " +
                              to_hex(original) + ")");
  return Status::OK();
}

}  // namespace

Result<std::vector<ExportIndexEntry>> parse_export_index(std::string_view text, const std::string& archive) {
  const std::string doc = archive + ": " + kExportIndex;
  if (text.empty()) return Status::Corruption(doc + ": missing or empty; not a kvsnap export");
  // JSON has no raw NUL (a string escapes it as \u0000), and nlohmann's lexer takes one for the end
  // of the input: an index cut there, whatever follows, was read as the part before it. (A
  // safetensors header is read as MLX reads it, by the same lexer: not refused there.)
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    return Status::Corruption(doc + ": not valid JSON: a NUL byte at offset " + std::to_string(nul));
  KV_ASSIGN_OR_RETURN(nlohmann::json index, parse_json(text, doc));
  const JsonRef root(index, doc);
  KV_ASSIGN_OR_RETURN(int64_t v, root.integer_or("kvsnap_export", 1));  // every export names it; hand-made ones may not
  if (v != 1)
    return Status::NotSupported(doc + ": export format version " + std::to_string(v) +
                                ", and this kvsnap reads version 1: import it with a newer kvsnap");
  KV_ASSIGN_OR_RETURN(JsonRef snapshots, root.at("snapshots"));
  KV_ASSIGN_OR_RETURN(std::vector<ExportIndexEntry> entries, snapshots.elements_as<ExportIndexEntry>(index_entry_of));
  // One row per file and per uuid: a second would silently replace the first's labels.
  std::set<std::string> files, uuids;
  for (ExportIndexEntry& e : entries) {
    if (!files.insert(e.file).second) return Status::Corruption(doc + ": " + e.file + " is listed twice");
    // (An entry without a uuid is imported under a new one.)
    if (!e.uuid.empty() && !uuids.insert(e.uuid).second)
      return Status::Corruption(doc + ": uuid " + e.uuid + " is listed twice");
    if (!e.created.empty()) {
      // ISO 8601 UTC as kvsnap writes it; whole seconds (an older kvsnap's, a hand-made index) get
      // ".000", so that every creation time sorts as eviction compares them.
      if (e.created.size() == 20 && e.created.back() == 'Z') e.created.insert(19, ".000");
      auto checked = add_seconds(e.created, 0);
      // A day of clock skew between the exporting host and this one is taken.
      const auto latest = add_seconds(utc_now_iso8601(), 24 * 3600);
      // Nor before 1970 (no store holds older; a year 1 or -1, which the round trip takes, would
      // put the snapshot first in line for eviction).
      if (!checked.ok() || *checked != e.created || (latest.ok() && e.created > *latest) || e.created < "1970-01-01")
        return Status::Corruption(doc + ": " + e.file + ": created '" + e.created +
                                  "' is not a past UTC time since 1970 as kvsnap writes it (eviction orders by it)");
    }
  }
  return entries;
}

Status Store::export_to(const std::vector<std::string>& refs, const std::string& path, bool decrypt,
                        bool allow_plain, size_t* exported_count) {
  if (refs.empty()) return Status::InvalidArgument("export: name at least one snapshot");
  struct Item {
    SnapshotInfo info;
    std::unique_ptr<SnapshotFileAssembler> file;
    std::unique_ptr<StoredSnapshot> opened;  // --decrypt: written again as a plain file
  };
  std::vector<Item> items;
  // One hold for every snapshot exported (blob_store.h, "readers"): the items open theirs without one.
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLockHold> hold, blobs_->hold_for_read());
  BlobSource source(*blobs_);
  nlohmann::json index = {{"kvsnap_export", 1}, {"snapshots", nlohmann::json::array()}};
  std::set<int64_t> exported;
  for (const auto& ref : refs) {
    KV_ASSIGN_OR_RETURN(int64_t id, catalog_->resolve(ref));
    if (!exported.insert(id).second) continue;  // named twice (an id and a name of one snapshot): once
    KV_ASSIGN_OR_RETURN(SnapshotRows rows, removed_is_not_found(catalog_->get_with_chunks(id), ref));
    SnapshotRecord& rec = rows.record;
    KV_RETURN_IF_ERROR(check_plain_under_key(rec.info, cipher(), allow_plain));
    // Every blob is checked before it is copied (docs/store.md: reads check each blob against its
    // SHA-256): a damaged snapshot stops the export, named, instead of going into an archive that no
    // import takes. (--decrypt's plain file is made from the chunks decoded and checked.)
    KV_ASSIGN_OR_RETURN(auto opened, open_snapshot_held(ref, nullptr));
    const bool copied = !(decrypt && rec.info.tenant);
    if (Status s = copied ? opened->reader().verify_chunks() : Status::OK(); !s.ok()) {
      if (s.code() != Code::kCorruption) return s.Prefixed("export: snapshot " + quote_text(ref));
      return Status::Corruption("snapshot " + quote_text(ref) + " is damaged in the store, nothing exported: " +
                                s.message() + " (kvsnap verify " + quote_text(ref) +
                                " checks every chunk of it; export the others without it)");
    }
    if (decrypt && rec.info.tenant) {
      SnapshotInfo plain = with_sealed_labels(rec.info, opened->reader().manifest());
      plain.tenant.reset();
      // The plain file is built again (SHA-256 chunk ids): its digest is not the keyed one; a plain
      // index entry records none.
      plain.content_sha256.clear();
      KV_ASSIGN_OR_RETURN(nlohmann::json entry, index_entry(plain, Sha256Digest{}, nullptr));
      index["snapshots"].push_back(std::move(entry));
      items.push_back({std::move(plain), nullptr, std::move(opened)});
      continue;
    }
    KV_ASSIGN_OR_RETURN(std::vector<std::byte> manifest, manifest_of(rec));
    KV_ASSIGN_OR_RETURN(SnapshotManifest m, parse_manifest(manifest, "snapshot " + ref));
    if (!names_its_uuid(ref, rec.info.uuid)) KV_RETURN_IF_ERROR(check_sealed_labels(rec.info, m, ref));
    source.add(rows.chunks);
    // An encrypted snapshot stays sealed: blobs copied as stored, the manifest sealed again.
    KV_ASSIGN_OR_RETURN(SnapshotFileAssembler a,
                        SnapshotFileAssembler::plan(m, source, m.encryption ? cipher() : nullptr));
    // By its uuid a snapshot whose catalog labels were changed is exported with the sealed ones.
    rec.info = with_sealed_labels(rec.info, m);
    KV_ASSIGN_OR_RETURN(nlohmann::json entry, index_entry(rec.info, m.content_digest, cipher()));
    index["snapshots"].push_back(std::move(entry));
    items.push_back({std::move(rec.info), std::make_unique<SnapshotFileAssembler>(std::move(a)), nullptr});
  }
  const std::string index_text = json_text(index, 2) + "\n";
  std::vector<ExportEntry> entries;
  entries.push_back(ExportEntry::FromProducer(kExportIndex, index_text.size(), [&](ByteSink& out) {
    return out.append(index_text.data(), index_text.size());
  }));
  for (const auto& it : items) {
    if (it.opened) {
      // Its size is known only once it is encoded: encoded once, into tmp/, when the archive
      // reaches it (so one plain file at a time takes disk), then copied in.
      const StoredSnapshot* snap = it.opened.get();
      entries.push_back(ExportEntry::FromMadeFile(export_entry_name(it.info), [this, snap]() -> Result<std::unique_ptr<ReadableFile>> {
        const std::string path = temp_name(paths_, "export-plain");
        TempFile written{io_, path};  // removed on failure
        KV_RETURN_IF_ERROR(write_temp(io_, path, [&](ByteSink& o) { return write_plain_file(*snap, o); }));
        KV_ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> f, io_.open_read(path));
        written.path.clear();  // the TempReadable removes it
        return std::unique_ptr<ReadableFile>(std::make_unique<TempReadable>(io_, path, std::move(f)));
      }));
      continue;
    }
    const SnapshotFileAssembler* a = it.file.get();
    entries.push_back(ExportEntry::FromProducer(export_entry_name(it.info), a->file_size(),
                                                [a, &source](ByteSink& out) { return a->write(source, out); }));
  }
  ArchiveWriteOptions written;
  // A snapshot decrypted into the archive is no more readable there than its owner's own files.
  written.owner_only = std::any_of(items.begin(), items.end(), [](const Item& it) { return it.opened != nullptr; });
  KV_RETURN_IF_ERROR(export_archive(io_, path, entries, written));
  if (exported_count) *exported_count = items.size();
  return Status::OK();
}

Result<ImportReport> Store::import_from(const std::string& path, const ImportOptions& opts) {
  std::optional<ChunkCipher> from;
  if (opts.from_key || !opts.from_tenant.empty()) {
    if (!opts.from_key && !cipher_)
      return Status::InvalidArgument("import {--from-tenant} needs a key: {--from-key-file} or the store's own");
    KV_ASSIGN_OR_RETURN(ChunkCipher c, ChunkCipher::for_tenant(opts.from_key ? *opts.from_key : *key_,
                                                               opts.from_tenant.empty() ? tenant_ : opts.from_tenant));
    from.emplace(std::move(c));
  }
  const ChunkCipher* source_cipher = from ? &*from : cipher();
  // Held from before the archive's entries land in tmp/ until the last is stored: a gc deletes
  // every temporary it finds, so one that ran meanwhile took the import's files from under it. The
  // entries' write batches borrow this hold (SaveRequest::under_hold): one hold per thread.
  // A plain import into an encrypted store, the old key mid-rotation; a keyed import into a plain
  // store marks it encrypted only once the archive passed its checks (a refused one leaves it plain).
  KV_RETURN_IF_ERROR(check_save_keys(/*mark=*/false));
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GcLockHold> hold, blobs_->hold_for_read());
  ImportVisitor v(io_, paths_, path);
  KV_RETURN_IF_ERROR(import_archive(io_, path, v));  // any error: everything received is discarded
  KV_ASSIGN_OR_RETURN(std::vector<ExportIndexEntry> index, parse_export_index(v.index_text, path));
  // Whether the store holds a snapshot of this uuid (not one a name or an id resolves to).
  auto has_uuid = [this](const std::string& uuid) {
    auto id = catalog_->resolve(uuid);
    if (!id.ok()) return false;
    auto info = catalog_->get_info(*id);
    return info.ok() && info->uuid == uuid;
  };
  // An entry of the archive, opened and checked: its index row (labels opened), its reader.
  struct Checked {
    ExportIndexEntry meta;
    std::unique_ptr<ReadableFile> file;
    std::unique_ptr<SnapshotReader> reader;
  };
  std::map<std::string, const ExportIndexEntry*> by_file;
  for (const ExportIndexEntry& e : index) by_file[e.file] = &e;
  // What the entry's reader says names the entry already (RenamedReadable); anything else is
  // prefixed with it.
  auto in_entry = [&path](const Status& st, const std::string& entry) {
    const std::string label = path + ": " + entry;
    return st.ok() || st.message().rfind(label, 0) == 0 ? st : st.Prefixed(label);
  };
  auto check_entry = [&](const std::string& entry, const std::string& tmp) -> Result<Checked> {
    auto found = by_file.find(entry);
    if (found == by_file.end()) return Status::Corruption(path + ": " + entry + " is not in the export's index");
    const ExportIndexEntry* listed = found->second;
    Checked c;
    KV_ASSIGN_OR_RETURN(auto received_file, io_.open_read(tmp));
    c.file = std::make_unique<RenamedReadable>(std::move(received_file), path + ": " + entry);
    SnapshotReadOptions ro;
    ro.cipher = source_cipher;
    auto reader = open_snapshot_file(*c.file, ro);
    if (!reader.ok()) return in_entry(reader.status(), entry);
    c.reader = std::move(*reader);
    if (cipher_ && !c.reader->manifest().encryption && !opts.allow_plain) {
      return Status::Mismatch(path + ": " + entry + " is a plain (unencrypted) snapshot, and this store is "
                              "encrypted: nothing shows who made it, and sealed on the way in it would restore like "
                              "the store's own; pass {--allow-plain} to import it (e.g. an archive you made with "
                              "`export --decrypt`)");
    }
    c.meta = *listed;
    if (c.reader->manifest().encryption) {
      // An encrypted snapshot's labels come from its sealed metadata only: the index's plain ones are
      // anyone's to write (without sealed metadata, it is imported with none, created now).
      c.meta = ExportIndexEntry{};
      c.meta.file = listed->file;
      c.meta.uuid = listed->uuid;
      c.meta.sealed_metadata = listed->sealed_metadata;
    }
    if (!c.meta.sealed_metadata.empty())
      KV_RETURN_IF_ERROR(open_labels(c.meta, source_cipher, c.reader->manifest().content_digest, path + ": " + entry));
    // The index's fingerprint picks which model's prefix lookups find it (kvsnap serve): it must be
    // the one the snapshot recorded, when it recorded one; an index without one (a sealed export's,
    // or one edited) takes the recorded one, which `ls --model` and `find --model` go by.
    const auto& model = c.reader->manifest().model;
    if (!c.meta.model_fingerprint.empty() && model && !model->gguf_fingerprint.empty() &&
        c.meta.model_fingerprint != model->gguf_fingerprint)
      return Status::Corruption(path + ": " + entry + ": the index says model " + c.meta.model_fingerprint +
                                ", and the snapshot records model " + model->gguf_fingerprint);
    if (c.meta.model_fingerprint.empty() && model && !model->gguf_fingerprint.empty() && !c.reader->manifest().mlx)
      c.meta.model_fingerprint = model->gguf_fingerprint;
    return c;
  };
  // An index entry without its file: the archive lost a snapshot it says it holds.
  std::set<std::string> received;
  for (const auto& f : v.files) received.insert(f.first);
  for (const ExportIndexEntry& e : index)
    if (!received.count(e.file))
      return Status::Corruption(path + ": its index lists " + e.file + ", which the archive does not hold");
  // What the checks below decode, the originals' bytes, is held to the archive's own bomb guard
  // (ArchiveReadOptions: 1000 times the archive, and 64 MiB whatever its size) before any is
  // decoded: a chunk blob of a few hundred bytes may claim 16 MiB, so a 1-KB archive claimed
  // terabytes (a review's finding: 26 s of CPU for 968 bytes, ~50 minutes for 6.5 KB).
  const ArchiveReadOptions guard;
  auto archive_size = io_.stamp(path);
  const double allowance = std::max(double(guard.ratio_floor_bytes),
                                    guard.max_ratio * double(archive_size.ok() ? archive_size->size : 0));
  double decoded = 0;
  // Every entry is checked before any is stored: a damaged one fails the import with nothing of
  // the archive in the store (its readers are opened again below, not kept: each holds a cache).
  for (const auto& [entry, tmp] : v.files) {
    KV_ASSIGN_OR_RETURN(Checked c, check_entry(entry, tmp));
    decoded += double(c.reader->manifest().provenance.file_size);
    if (decoded > allowance) {
      return Status::NotSupported(path + ": " + entry + ": its snapshots hold " + std::to_string(uint64_t(decoded)) +
                                  " bytes, over " + std::to_string(int(guard.max_ratio)) + " times the archive's " +
                                  std::to_string(archive_size.ok() ? archive_size->size : 0) + " (and over " +
                                  std::to_string(guard.ratio_floor_bytes >> 20) +
                                  " MiB): refusing a likely decompression bomb");
    }
    if (Status s = check_snapshot_labels(c.meta.name, c.meta.tags); !s.ok() || !(s = check_new_labels_text(c.meta.name, c.meta.tags)).ok())
      return Status::Corruption(path + ": " + entry + ": " + s.message());
    if (Status s = check_imported_fingerprint(c.meta.model_fingerprint); !s.ok())
      return Status::Corruption(path + ": " + entry + ": " + s.message());
    KV_RETURN_IF_ERROR(in_entry(c.reader->verify_chunks(), entry));
    KV_RETURN_IF_ERROR(in_entry(c.reader->verify_original(), entry));
    if (!c.reader->manifest().mlx) {
      auto parsed = c.reader->parse_original();
      if (!parsed.ok()) return in_entry(parsed.status(), entry);
      KV_RETURN_IF_ERROR(in_entry(c.reader->verify_metadata(*parsed), entry));
    }
    else KV_RETURN_IF_ERROR(in_entry(read_mlx_prompt_cache(c.reader->original()).status(), entry));
  }
  KV_RETURN_IF_ERROR(init_encryption_meta());
  ImportReport rep;
  // An error from here on (the disk, the catalog) comes after some entries were stored: it says which.
  auto stored_so_far = [&rep](Status s) {
    if (rep.imported.empty()) return s;
    std::string ids;
    for (const SnapshotInfo& i : rep.imported) ids += (ids.empty() ? "" : ", ") + std::to_string(i.id);
    return s.Appended(" (imported before it: snapshot " + ids + ")");
  };
  // Another import of the same archive (another process) stored the uuid since it was looked up,
  // and the catalog refused this one's row: skipped as a uuid already in the store is, not an
  // error. (Only after commit_save, which stores nothing when it fails; a re-save (other keys) can
  // fail after its row is in, keeping the store's caps, and reports that.)
  auto taken_meanwhile = [&](const std::string& uuid) {
    if (uuid.empty() || !has_uuid(uuid)) return false;
    rep.skipped.push_back(uuid + " (already in the store: imported meanwhile)");
    return true;
  };
  for (const auto& received : v.files) {
    const std::string &entry = received.first, &tmp = received.second;  // named: captured below
    Status s = [&]() -> Status {
      KV_ASSIGN_OR_RETURN(Checked checked, check_entry(entry, tmp));
      auto reader = &checked.reader;
      const ExportIndexEntry* meta = &checked.meta;
      const std::string& uuid = meta->uuid;
      // Said only once the snapshot is in: an import that then finds it imported meanwhile (by
      // another import of the same archive, which took the name) says that alone.
      // The entry's name when another snapshot has it; noted with the uuid it was imported under
      // (a new one for an entry without).
      std::optional<std::string> name_taken;
      auto note_name_taken = [&]() {
        if (name_taken) rep.skipped.push_back("name '" + *name_taken + "' is taken: imported " + rep.imported.back().uuid + " without it");
      };
      if (!uuid.empty() && has_uuid(uuid)) {
        rep.skipped.push_back(uuid + " (already in the store)");
        return Status::OK();
      }
      const SnapshotManifest& m = (*reader)->manifest();
      StateFile state;
      if (!m.mlx) {
        KV_ASSIGN_OR_RETURN(state, (*reader)->parse_original());
      }
      const bool same_keys = m.encryption ? cipher_ && source_cipher == cipher() : !cipher_;
      if (!same_keys) {
        // Plain into an encrypted store, or another key or tenant: the original saved again.
        SaveRequest req;
        req.uuid = uuid;
        req.created = meta->created;
        req.model_fingerprint = meta->model_fingerprint;
        req.tags = meta->tags;
        req.source_name = m.provenance.source;
        if (m.cells_per_chunk) req.cells_per_chunk = m.cells_per_chunk;  // else the default (no chunking recorded)
        req.under_hold = hold.get();
        if (meta->name && !catalog_->resolve(*meta->name).ok()) req.name = *meta->name;
        else if (meta->name) name_taken = *meta->name;
        const ReadableFile& original = (*reader)->original();
        auto saved = [&]() -> Result<SaveResult> {
          if (!m.mlx) {
            req.writer = stored_file_claims(m);
            req.recorded_model = m.model;
            return save(original, state, req);
          }
          KV_ASSIGN_OR_RETURN(const MlxPromptCache cache, read_mlx_prompt_cache(original));
          const MlxSnapshotMeta recorded = mlx_meta_of(m);  // its fingerprint comes from the model's name
          req.mlx_model = recorded.model;
          req.tokens = recorded.tokens;
          return save_mlx(original, cache, req);
        }();
        KV_RETURN_IF_ERROR(saved.status());
        rep.imported.push_back(std::move(saved->info));
        note_name_taken();
        return Status::OK();
      }
      KV_ASSIGN_OR_RETURN(auto batch, begin_blob_write(hold.get()));
      BlobSink sink(*batch, *catalog_);
      for (const ChunkRef& ref : m.chunks) {
        KV_ASSIGN_OR_RETURN(std::vector<std::byte> blob, (*reader)->blob(ref.index));
        KV_RETURN_IF_ERROR(sink.put(ref, blob));
      }
      KV_RETURN_IF_ERROR(sink.finish());
      KV_RETURN_IF_ERROR(batch->commit());
      const std::vector<ChunkUse>& uses = sink.uses;
      SnapshotRecord rec;
      if (m.mlx) {
        KV_ASSIGN_OR_RETURN(rec, mlx_record(m, (*reader)->original()));
        // A sealed export's index names no fingerprint: the one the (opened) manifest gives stays.
        if (!meta->model_fingerprint.empty()) rec.info.model_fingerprint = meta->model_fingerprint;
      } else {
        rec = make_record(m, state, m.provenance.file_size, m.arch.value_or(""), meta->model_fingerprint);
      }
      rec.info.uuid = uuid;
      rec.info.created = meta->created;
      if (meta->name) {
        const std::string& name = *meta->name;
        if (catalog_->resolve(name).ok()) name_taken = name;
        else rec.info.name = name;
      }
      rec.info.tags = meta->tags;
      if (m.encryption) {  // the same key and tenant (open_snapshot_file checked): blobs copied as they are
        if (rec.info.uuid.empty()) rec.info.uuid = new_snapshot_uuid();
        rec.info.content_sha256 = recorded_content_digest(m, cipher());
        KV_RETURN_IF_ERROR(seal_record(*cipher_, m.bytes, rec));
        KV_RETURN_IF_ERROR(init_encryption_meta());
      }
      auto stored = catalog_->commit_save(std::move(rec), uses, batch->hold());
      if (!stored.ok() && taken_meanwhile(uuid)) return Status::OK();  // its blobs: gc's
      KV_RETURN_IF_ERROR(stored.status());
      rep.imported.push_back(std::move(*stored));
      note_name_taken();
      return Status::OK();
    }();
    if (!s.ok()) return stored_so_far(s);
  }
  KV_RETURN_IF_ERROR(caps_failure_as_warning(enforce_caps_after_import(rep),
                                             "imported " + std::to_string(rep.imported.size()) + " snapshots",
                                             rep.cap_warnings));
  return rep;
}

// As a save keeps them (a review's finding: an import ignored the caps, and plain gc does not
// apply them): the imported snapshots, whose ids are the newest, are all kept, as is anything
// saved after them (EvictionRequest::keep); each tenant among them gets its cap.
Status Store::enforce_caps_after_import(ImportReport& rep) {
  if (rep.imported.empty()) return Status::OK();
  int64_t first = rep.imported.front().id;
  std::set<std::string> tenants;
  for (const SnapshotInfo& s : rep.imported) {
    first = std::min(first, s.id);
    if (auto t = s.tags.find(kTenantTag); t != s.tags.end()) tenants.insert(t->second);
  }
  // Each tenant's cap first (what it evicts counts toward the store's too), then the store's.
  std::vector<SnapshotInfo> probes;
  for (const std::string& t : tenants) probes.emplace_back().tags[kTenantTag] = t;
  probes.emplace_back();
  SaveResult caps;
  for (SnapshotInfo& probe : probes) {
    probe.id = first;
    KV_RETURN_IF_ERROR(enforce_caps(probe, caps));
  }
  rep.evicted = std::move(caps.evicted);
  for (std::string& w : caps.cap_warnings) {  // the store's cap is asked once per tenant
    if (std::find(rep.cap_warnings.begin(), rep.cap_warnings.end(), w) == rep.cap_warnings.end())
      rep.cap_warnings.push_back(std::move(w));
  }
  rep.gc_warnings = std::move(caps.gc_warnings);
  return Status::OK();
}

}  // namespace kvsnap
