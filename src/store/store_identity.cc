#include "store/store_identity.h"

#include <algorithm>
#include <optional>
#include <string>

namespace kvsnap {

namespace {

bool id_like(const std::string& s) {
  return s.size() == 36 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-';
         });
}

Status another_catalogs(const Catalog& catalog, const BlobStore& blobs, const std::string& theirs,
                        const std::optional<std::string>& mine) {
  return Status::Mismatch(
      "the blobs at " + blobs.describe() + " belong to store " + theirs + ", and the catalog " + catalog.describe() +
      (mine ? " is store " + *mine : " is a new catalog") +
      ": a save or gc here would delete that store's blobs as garbage. Point the store config's \"catalog\" at the "
      "catalog that holds them; if that catalog is lost for good, remove " + std::string(kStoreIdName) + " from " +
      blobs.describe() + " (gc then deletes every blob this catalog does not name)");
}

}  // namespace

Status bind_store_identity(Catalog& catalog, BlobStore& blobs) {
  // The blobs' id first: the catalog's is set before it, so a first binding in another process
  // between the two reads is seen whole (id beside the blobs implies id in their catalog).
  KV_ASSIGN_OR_RETURN(std::optional<std::string> theirs, blobs.read_store_id());
  KV_ASSIGN_OR_RETURN(std::optional<std::string> mine, catalog.get_meta(kMetaStoreId));
  if (theirs && !id_like(*theirs))
    return Status::Corruption(blobs.describe() + "/" + kStoreIdName + " is not a kvsnap store id (36 characters, " +
                              std::to_string(theirs->size()) + " read)");
  if (theirs) {
    if (mine && *mine == *theirs) return Status::OK();
    return another_catalogs(catalog, blobs, *theirs, mine);
  }
  if (!mine) {
    KV_ASSIGN_OR_RETURN(std::string now, catalog.init_meta(kMetaStoreId, new_snapshot_uuid()));
    mine = now;
  }
  KV_RETURN_IF_ERROR(blobs.write_store_id(*mine).Prefixed("writing the store id beside " + blobs.describe()));
  KV_ASSIGN_OR_RETURN(theirs, blobs.read_store_id());
  if (!theirs) return Status::IOError("the store id written beside " + blobs.describe() + " is not there");
  if (*theirs != *mine) return another_catalogs(catalog, blobs, *theirs, mine);
  return Status::OK();
}

}  // namespace kvsnap
