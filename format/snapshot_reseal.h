// Key rotation of an encrypted snapshot: its chunks and manifest under another key, for the
// store's kvsnap rekey (docs/store.md, "Key rotation").
#pragma once

#include "base/chunk_cipher.h"
#include "base/status.h"
#include "format/snapshot.h"

namespace kvsnap {

// Every chunk of `m` is fetched from `blobs`, opened with `from` (m's tenant and keys:
// kMismatch otherwise), decoded and checked against its keyed id, then sealed again with `to`
// under its keyed id for `to`; the compressed bytes are not encoded again. `sink` receives each new blob, in chunk order.
// Returns the manifest with the new ids, blob sizes and CRYP, encoded (the original, its
// digest, the segments and INFO are unchanged). One chunk in memory at a time.
Result<SnapshotManifest> reseal_snapshot(const SnapshotManifest& m, ChunkSource& blobs, const ChunkCipher& from,
                                         const ChunkCipher& to, ChunkSink& sink);

}  // namespace kvsnap
