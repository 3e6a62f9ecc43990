// Key rotation of an encrypted snapshot: its chunks and manifest under another key, for the
// store's kvsnap rekey (docs/store.md, "Key rotation").
#pragma once

#include <map>

#include "base/chunk_cipher.h"
#include "base/status.h"
#include "format/snapshot.h"

namespace kvsnap {

// A chunk already sealed under the new key (by an earlier snapshot's rotation): its new id and
// blob size, by its old id.
struct ResealedChunk {
  Sha256Digest id{};
  uint64_t stored_size = 0;
};
using ResealedChunks = std::map<Sha256Digest, ResealedChunk>;

struct ResealOptions {
  uint32_t threads = 1;  // chunks fetched, opened, decoded and sealed at once
  // Chunks whose new blob the store already holds: not fetched nor decoded again; `sink` gets
  // their new ref with an empty blob (the store's row is the blob). nullptr: none.
  const ResealedChunks* known = nullptr;
};

// Every chunk of `m` is fetched from `blobs`, opened with `from` (m's tenant and keys:
// kMismatch otherwise), decoded and checked against its keyed id, then sealed again with `to`
// under its keyed id for `to`; the compressed bytes are not encoded again. `sink` receives each
// new blob, in chunk order, from the calling thread. Returns the manifest with the new ids, blob
// sizes and CRYP, encoded (the original, its digest, the segments and INFO are unchanged).
// `opts.threads` workers take the chunks of a window of a few per worker, so memory holds about
// 4 blobs per worker. `blobs` and the ciphers are used from the workers at once.
Result<SnapshotManifest> reseal_snapshot(const SnapshotManifest& m, ChunkSource& blobs, const ChunkCipher& from,
                                         const ChunkCipher& to, ChunkSink& sink, const ResealOptions& opts = {});

}  // namespace kvsnap
