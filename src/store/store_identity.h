// Which catalog a blob store belongs to. gc deletes every blob and pack its catalog does not name,
// so a catalog pointed at another catalog's blobs (a second host's SQLite catalog on a shared
// bucket, a lost catalog.sqlite recreated empty, a config's "catalog" mistyped) would delete all of
// them at its first save. A store therefore has an id, a random UUID kept both in its catalog
// (kMetaStoreId) and beside its blobs (BlobStore::read_store_id), and nothing that writes or
// deletes blobs runs until the two agree.
#pragma once

#include "base/status.h"
#include "store/blob_store.h"
#include "store/catalog.h"

namespace kvsnap {

// Checks that `blobs` belong to `catalog`, giving the store its id first where it has none: the
// catalog's id is set before the blobs' (so a crash between the two leaves a catalog whose blobs
// take its id at the next call), and the blobs' id is read back after it is written. Call it under
// a gc lock (a save's shared hold or gc's exclusive lock).
//
// kMismatch, naming both parts and the remedy, when the blobs hold another id, or hold one while
// the catalog has none (a new catalog over blobs that some catalog's rows name); kCorruption when
// the blobs' id is not one kvsnap wrote.
Status bind_store_identity(Catalog& catalog, BlobStore& blobs);

}  // namespace kvsnap
