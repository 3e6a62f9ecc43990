// reseal_snapshot (format/snapshot_reseal.h): an encrypted snapshot's chunks and manifest under another
// key, for the store's key rotation.
#include "format/snapshot_reseal.h"

#include "base/parallel.h"
#include "format/content_digest.h"
#include "format/snapshot_internal.h"

namespace kvsnap {

using namespace snapshot_detail;

namespace {

Status check_sealed_for(const SnapshotManifest& m, const ChunkCipher& from) {
  if (!m.encryption) return Status::InvalidArgument("the snapshot is not encrypted: there is no key to rotate");
  SealedHeader recorded;
  recorded.master_key_id = m.encryption->master_key_id;
  recorded.tenant_key_id = m.encryption->tenant_key_id;
  return check_sealed_key_ids(recorded, from.master_key_id(), from.tenant_key_id(), "snapshot");
}

// One worker's buffers, reused from chunk to chunk.
struct Worker {
  ChunkDecoder decoder;
  std::vector<std::byte> blob, opened, raw;
};

// Chunk `ref` sealed again: its new id and size in `ref`, the new blob in `sealed`.
Status reseal_chunk(ChunkRef& ref, ChunkSource& blobs, const ChunkCipher& from, const ChunkCipher& to, Worker& w,
                    std::vector<std::byte>& sealed) {
  const std::string what = "chunk " + std::to_string(ref.index);
  KV_RETURN_IF_ERROR(blobs.get_into(ref, w.blob).Prefixed(what));
  KV_RETURN_IF_ERROR(from.open_into(ref.sha256, w.blob, w.opened, what));
  // The keyed id covers the raw bytes: decoding is the only way to the new id. The old id is
  // checked too, so a rotation never carries damage over under a fresh tag.
  KV_RETURN_IF_ERROR(w.decoder.decode(w.opened, ref.raw_size, w.raw).Prefixed(what));
  if (from.chunk_id(w.raw) != ref.sha256)
    return Status::Corruption(what + ": damaged: its decoded bytes do not match their keyed id " + to_hex(ref.sha256));
  ref.sha256 = to.chunk_id(w.raw);
  KV_ASSIGN_OR_RETURN(const size_t n, to.seal_into(ref.sha256, w.opened, sealed));
  sealed.resize(n);
  ref.stored_size = n;
  return Status::OK();
}

}  // namespace

Result<SnapshotManifest> reseal_snapshot(const SnapshotManifest& m, ChunkSource& blobs, const ChunkCipher& from,
                                         const ChunkCipher& to, ChunkSink& sink, const ResealOptions& opts) {
  KV_RETURN_IF_ERROR(check_sealed_for(m, from));
  if (to.tenant() != m.encryption->tenant)
    return Status::InvalidArgument("a key rotation keeps the tenant: the snapshot is tenant '" + m.encryption->tenant +
                                   "', the new cipher '" + to.tenant() + "'");
  SnapshotManifest out = m;
  const size_t threads = std::max<uint32_t>(1, opts.threads);
  std::vector<Worker> workers(threads);
  const size_t window = 4 * threads;
  std::vector<std::vector<std::byte>> sealed(window);
  std::vector<Status> status(window);
  for (size_t first = 0; first < out.chunks.size(); first += window) {
    const size_t n = std::min(window, out.chunks.size() - first);
    parallel_for(n, threads, [&](size_t i, size_t w) {
      ChunkRef& ref = out.chunks[first + i];
      sealed[i].clear();
      auto known = opts.known ? opts.known->find(ref.sha256) : ResealedChunks::const_iterator();
      if (opts.known && known != opts.known->end()) {
        ref.sha256 = known->second.id;
        ref.stored_size = known->second.stored_size;
        status[i] = Status::OK();
        return;
      }
      status[i] = reseal_chunk(ref, blobs, from, to, workers[w], sealed[i]);
    });
    for (size_t i = 0; i < n; ++i) {
      KV_RETURN_IF_ERROR(status[i]);
      KV_RETURN_IF_ERROR(sink.put(out.chunks[first + i], sealed[i]));
    }
  }
  out.encryption = SnapshotEncryption{to.tenant(), to.master_key_id(), to.tenant_key_id()};
  if (out.rule() == ContentDigestRule::kChunkTree) {
    // Version 3's digest is over the keyed ids, which the new key changed (each from bytes checked
    // against the old id above). Version 1's is the plain SHA-256 of the original: it stays.
    out.content_digest = content_digest_of_table(out.segments, out.provenance.file_size, out.chunks, true);
    out.provenance.content_digest = out.content_digest;
    out.info["provenance"][kContentDigestKey] = to_hex(out.content_digest);
  }
  KV_RETURN_IF_ERROR(encode_manifest(out));
  return out;
}

}  // namespace kvsnap
