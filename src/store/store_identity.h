// Which catalog a blob store belongs to. gc deletes every blob and pack its catalog does not name,
// so a catalog pointed at another catalog's blobs (a second host's SQLite catalog on a shared
// bucket, a lost catalog.sqlite recreated empty, a config's "catalog" mistyped) would delete all of
// them at its first save. A store therefore has an id, a random UUID kept both in its catalog
// (kMetaStoreId) and beside its blobs (BlobStore::read_store_id), and nothing that writes or
// deletes blobs runs until the two agree.
#pragma once

#include <optional>
#include <string>

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

// The comparison bind_store_identity makes, for a reader that writes nothing (kvsnap doctor):
// `catalog_id` the catalog's store_id setting, `blobs_raw` the blobs' store-id as read (nullopt:
// none). OK when they agree, or when the next save can give the blobs the catalog's id; otherwise
// the refusal bind_store_identity would give. The parts are named by `catalog_name`, `blobs_name`.
Status compare_store_ids(const std::string& catalog_name, const std::optional<std::string>& catalog_id,
                         const std::string& blobs_name, const std::optional<std::string>& blobs_raw);

// The refusal bind_store_identity gives where neither part has an id yet (a store from before store
// ids): kMismatch when the catalog names no chunk (`stats`) and the blobs hold `packs` packs or,
// without packs, `loose` blobs. For a reader that writes nothing (kvsnap doctor), which counts them.
Status compare_unnamed_blobs(const std::string& catalog_name, const CatalogStats& stats,
                             const std::string& blobs_name, size_t packs, size_t loose);

}  // namespace kvsnap
