// Store::rekey (store.h): replacing an encrypted store's master key, snapshot by snapshot, on a
// live store. Design: docs/store.md, "Key rotation".
#include <algorithm>
#include <map>

#include "base/parallel.h"
#include "format/snapshot_reseal.h"
#include "store/store.h"
#include "store/store_internal.h"
#include "store/store_seal.h"

namespace kvsnap {

using namespace store_detail;

namespace {

// Rounds of "rotate what names the old key, then try to finish": a save that read the settings
// before the rotation began may still add a row under the old key, which the next round takes.
constexpr int kMaxRounds = 8;

Status step(const RekeyOptions& o, std::string_view what) { return o.test_hook ? o.test_hook(what) : Status::OK(); }

}  // namespace

// The chunks of `m` that an earlier snapshot's rotation sealed under the new key and whose rows
// the catalog still has. Asked under the caller's shared gc lock, so those rows and blobs stay
// until its swap (a row can have gone since: its snapshot removed, then a gc).
Result<ResealedChunks> Store::still_stored(const SnapshotManifest& m, const ResealedChunks& resealed) {
  ResealedChunks known;
  std::vector<ChunkHash> ids;
  std::vector<const ResealedChunks::value_type*> of;
  for (const ChunkRef& ref : m.chunks) {
    auto it = resealed.find(ref.sha256);
    if (it == resealed.end()) continue;
    ChunkHash h;
    h.bytes = it->second.id;
    ids.push_back(h);
    of.push_back(&*it);
  }
  for (size_t first = 0; first < ids.size(); first += Catalog::kChunkLookupBatch) {
    const size_t n = std::min(Catalog::kChunkLookupBatch, ids.size() - first);
    KV_ASSIGN_OR_RETURN(auto rows, catalog_->find_chunks(std::span<const ChunkHash>(ids).subspan(first, n)));
    for (size_t i = 0; i < n; ++i)
      if (rows[i]) known.insert(*of[first + i]);
  }
  return known;
}

namespace {

}  // namespace

Result<RekeyReport> Store::rekey(const MasterKey& to, const RekeyOptions& opts) {
  RekeyReport rep;
  rep.to_key_id = key_id_hex(to.id());
  if (!key_) return Status::InvalidArgument("kvsnap rekey needs the store's key: pass --key-file FILE or --key-command CMD");
  rep.from_key_id = key_id_hex(key_->id());
  if (store_key_id_.empty())
    return Status::InvalidArgument("store " + name_ + " is not encrypted: there is no key to rotate");
  if (rep.from_key_id == rep.to_key_id)
    return Status::InvalidArgument("store " + name_ + ": the new key is the key given (" + rep.to_key_id + ")");
  rep.resumed = rotating_from_ == rep.from_key_id && store_key_id_ == rep.to_key_id;
  KV_RETURN_IF_ERROR(catalog_->begin_key_rotation(rep.from_key_id, rep.to_key_id).Prefixed("store " + name_));
  store_key_id_ = rep.to_key_id;
  rotating_from_ = rep.from_key_id;
  KV_RETURN_IF_ERROR(step(opts, "begun"));

  std::map<std::string, std::pair<ChunkCipher, ChunkCipher>> ciphers;  // by tenant: (old, new)
  std::map<std::string, ResealedChunks> resealed;                      // by tenant
  auto ciphers_of = [&](const std::string& tenant) -> Result<const std::pair<ChunkCipher, ChunkCipher>*> {
    auto it = ciphers.find(tenant);
    if (it == ciphers.end()) {
      KV_ASSIGN_OR_RETURN(ChunkCipher from, ChunkCipher::for_tenant(*key_, tenant));
      KV_ASSIGN_OR_RETURN(ChunkCipher next, ChunkCipher::for_tenant(to, tenant));
      it = ciphers.emplace(tenant, std::make_pair(std::move(from), std::move(next))).first;
    }
    return &it->second;
  };
  for (int round = 0;; ++round) {
    KV_ASSIGN_OR_RETURN(std::vector<SnapshotInfo> all, catalog_->list());
    std::vector<SnapshotInfo> todo;
    RekeyProgress p;
    rep.plain = 0;
    for (SnapshotInfo& s : all) {
      if (!s.tenant) ++rep.plain;
      if (!s.tenant || s.master_key_id != rep.from_key_id) continue;
      p.bytes_total += s.stored_bytes;
      todo.push_back(std::move(s));
    }
    p.snapshots_total = todo.size();
    if (opts.progress) KV_RETURN_IF_ERROR(opts.progress(p));
    // A damaged snapshot stops only itself: the others are sealed again (the old key may be the
    // leaked one), and the rotation does not finish while it is there (a review's finding: the first
    // damaged one stopped the rotation of every snapshot after it).
    std::vector<std::string> damaged;
    for (const SnapshotInfo& s : todo) {
      KV_ASSIGN_OR_RETURN(auto c, ciphers_of(*s.tenant));
      const Status one = rekey_snapshot(s, c->first, c->second, opts, resealed[*s.tenant], rep).status();
      if (one.code() == Code::kCorruption) {
        damaged.push_back(one.message());
        continue;
      }
      KV_RETURN_IF_ERROR(one);
      ++p.snapshots_done;
      p.bytes_done += s.stored_bytes;
      if (opts.progress) KV_RETURN_IF_ERROR(opts.progress(p));
    }
    if (!damaged.empty()) {
      std::string list;
      for (const std::string& d : damaged) list += (list.empty() ? "" : "; ") + d;
      return Status::Corruption("store " + name_ + ": " + std::to_string(damaged.size()) + " of " +
                                std::to_string(todo.size()) + " snapshot(s) could not be sealed again (" + list +
                                "); the others were. The store stays mid-rotation (either key opens it): remove "
                                "the damaged ones (kvsnap rm), then run kvsnap rekey again");
    }
    KV_ASSIGN_OR_RETURN(int64_t left, catalog_->finish_key_rotation(rep.from_key_id, rep.to_key_id));
    if (left == 0) break;
    if (round + 1 == kMaxRounds)
      return Status::Mismatch("store " + name_ + ": " + std::to_string(left) + " snapshot(s) sealed with the old key " +
                             rep.from_key_id + " keep arriving: switch every writer to the new key " + rep.to_key_id +
                             ", then run kvsnap rekey again");
  }
  rotating_from_.clear();
  KV_RETURN_IF_ERROR(step(opts, "finished"));
  // The old key's chunks: refcount 0 since their snapshots were swapped. Waits for running saves.
  GcOptions o;
  o.wait = true;
  o.scan_orphans = false;
  o.compact_dead_percent = compact_dead_percent();
  KV_ASSIGN_OR_RETURN(rep.gc, collect_garbage(*catalog_, *blobs_, o));
  return rep;
}

Result<bool> Store::rekey_snapshot(const SnapshotInfo& info, const ChunkCipher& from, const ChunkCipher& to,
                                   const RekeyOptions& opts, ResealedChunks& resealed, RekeyReport& rep) {
  const std::string who = snapshot_label(info);
  // The shared gc lock from before the first new blob until the swap, as a save holds it.
  KV_ASSIGN_OR_RETURN(auto batch, begin_blob_write(nullptr));
  auto rows = catalog_->get_with_chunks(info.id);
  if (!rows.ok() && rows.status().code() == Code::kNotFound) return false;  // removed meanwhile
  KV_RETURN_IF_ERROR(rows.status());
  const SnapshotRecord* rec = &rows->record;
  if (rec->info.master_key_id != key_id_hex(from.master_key_id())) return false;  // rotated meanwhile
  KV_ASSIGN_OR_RETURN(std::vector<std::byte> manifest, open_manifest_row(*rec, &from));
  KV_ASSIGN_OR_RETURN(SnapshotManifest m, parse_manifest(manifest, who));
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, open_tokens_row(*rec, &from));
  BlobSource source(*blobs_);
  source.add(rows->chunks);
  BlobSink sink(*batch, *catalog_);
  ResealOptions ro;
  ro.threads = opts.threads ? opts.threads : default_threads();
  KV_ASSIGN_OR_RETURN(ResealedChunks known, still_stored(m, resealed));
  ro.known = &known;
  auto sealed = reseal_snapshot(m, source, from, to, sink, ro);
  if (!sealed.ok()) return sealed.status().Prefixed(who);
  KV_RETURN_IF_ERROR(sink.finish());
  KV_RETURN_IF_ERROR(batch->commit());
  KV_RETURN_IF_ERROR(step(opts, "sealed"));

  SnapshotRecord next;
  next.info = rec->info;
  next.tokens = std::move(tokens);
  next.info.content_sha256 = recorded_content_digest(*sealed, &to);
  KV_RETURN_IF_ERROR(seal_record(to, sealed->bytes, next));
  const std::shared_ptr<const PrefixKeying> keying = prefix_keying(to);
  const std::string from_id = key_id_hex(from.master_key_id());
  Status s = catalog_->replace_sealed(info.id, std::move(next), sink.uses, from_id, *keying, batch->hold());
  // Removed, or rotated by another kvsnap rekey, meanwhile: the new blobs are gc's.
  if (s.code() == Code::kNotFound) return false;
  if (s.code() == Code::kMismatch) {
    auto now = catalog_->get_info(info.id);
    if (now.ok() && now->master_key_id != from_id) return false;
  }
  KV_RETURN_IF_ERROR(s.Prefixed(who));
  batch.reset();
  for (size_t i = 0; i < m.chunks.size(); ++i)
    resealed[m.chunks[i].sha256] = {sealed->chunks[i].sha256, sealed->chunks[i].stored_size};
  ++rep.rekeyed;
  rep.chunks += sink.uses.size();
  for (const ChunkUse& u : sink.uses) rep.bytes += u.stored_size;
  KV_RETURN_IF_ERROR(step(opts, "swapped"));
  return true;
}

}  // namespace kvsnap
