// reseal_snapshot (format/snapshot_reseal.h): an encrypted snapshot's chunks and manifest under another
// key, for the store's key rotation.
#include "format/snapshot_reseal.h"
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

}  // namespace

Result<SnapshotManifest> reseal_snapshot(const SnapshotManifest& m, ChunkSource& blobs, const ChunkCipher& from,
                                         const ChunkCipher& to, ChunkSink& sink) {
  KV_RETURN_IF_ERROR(check_sealed_for(m, from));
  if (to.tenant() != m.encryption->tenant)
    return Status::InvalidArgument("a key rotation keeps the tenant: the snapshot is tenant '" + m.encryption->tenant +
                                   "', the new cipher '" + to.tenant() + "'");
  SnapshotManifest out = m;
  ChunkDecoder decoder;
  std::vector<std::byte> blob, opened, raw, sealed;
  for (ChunkRef& ref : out.chunks) {
    const std::string what = "chunk " + std::to_string(ref.index);
    KV_RETURN_IF_ERROR(blobs.get_into(ref, blob).Prefixed(what));
    KV_RETURN_IF_ERROR(from.open_into(ref.sha256, blob, opened, what));
    // The keyed id covers the raw bytes: decoding is the only way to the new id. The old id is
    // checked too, so a rotation never carries damage over under a fresh tag.
    KV_RETURN_IF_ERROR(decoder.decode(opened, ref.raw_size, raw).Prefixed(what));
    if (from.chunk_id(raw) != ref.sha256)
      return Status::Corruption(what + ": damaged: its decoded bytes do not match their keyed id " + to_hex(ref.sha256));
    ref.sha256 = to.chunk_id(raw);
    KV_ASSIGN_OR_RETURN(const size_t n, to.seal_into(ref.sha256, opened, sealed));
    ref.stored_size = n;
    KV_RETURN_IF_ERROR(sink.put(ref, std::span<const std::byte>(sealed.data(), n)));
  }
  out.encryption = SnapshotEncryption{to.tenant(), to.master_key_id(), to.tenant_key_id()};
  if (out.rule() == ContentDigestRule::kChunkTree) {
    // Version 3's digest is over the keyed ids, which the new key changed (each from bytes checked
    // against the old id above). Version 1's is the plain SHA-256 of the original: it stays.
    out.content_digest = content_digest_of_table(out.segments, out.provenance.file_size, out.chunks, true);
    out.provenance.content_digest = out.content_digest;
    out.info["provenance"][kContentDigestKey] = to_hex(out.content_digest);
  }
  encode_manifest(out);
  return out;
}

}  // namespace kvsnap
