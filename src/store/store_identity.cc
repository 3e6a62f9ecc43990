#include "store/store_identity.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>

namespace kvsnap {

namespace {

// A UUID as new_snapshot_uuid() writes it; a hand-written one may carry a newline or capitals.
std::optional<std::string> as_store_id(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  const bool ok = s.size() == 36 && std::all_of(s.begin(), s.end(), [](char c) {
                    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-';
                  });
  return ok ? std::optional<std::string>(s) : std::nullopt;
}

Result<std::optional<std::string>> parse_blobs_id(const std::string& blobs_name, const std::optional<std::string>& raw) {
  if (!raw) return raw;
  std::optional<std::string> id = as_store_id(*raw);
  if (!id)
    return Status::Corruption(blobs_name + "/" + kStoreIdName + " is not a kvsnap store id (a UUID, " +
                              std::to_string(raw->size()) + " bytes read)");
  return id;
}

Result<std::optional<std::string>> blobs_id(BlobStore& blobs) {
  KV_ASSIGN_OR_RETURN(std::optional<std::string> raw, blobs.read_store_id());
  return parse_blobs_id(blobs.describe(), raw);
}

Status another_catalogs(const std::string& catalog_name, const std::string& blobs_name, const std::string& theirs,
                        const std::optional<std::string>& mine) {
  return Status::Mismatch(
      "the blobs at " + blobs_name + " belong to the store with id " + theirs + ", and the catalog " + catalog_name +
      (mine ? " has id " + *mine : " is a new catalog") +
      ": a save or gc here would delete that store's blobs as garbage. Point the store config's \"catalog\" at the "
      "catalog that holds them; if that catalog is lost for good, remove " + std::string(kStoreIdName) + " from " +
      blobs_name + " (gc then deletes every blob this catalog does not name)");
}
Status another_catalogs(const Catalog& catalog, const BlobStore& blobs, const std::string& theirs,
                        const std::optional<std::string>& mine) {
  return another_catalogs(catalog.describe(), blobs.describe(), theirs, mine);
}

// A store from before store ids whose catalog names no chunk while its blobs hold some: a lost
// catalog recreated empty, or another store's blobs. Giving them this catalog's id would let its
// first gc delete them all.
Status refuse_unnamed_blobs(Catalog& catalog, BlobStore& blobs) {
  KV_ASSIGN_OR_RETURN(CatalogStats stats, catalog.stats());
  if (stats.chunks > 0 || stats.unreferenced_chunks > 0) return Status::OK();
  KV_ASSIGN_OR_RETURN(std::vector<std::string> packs, blobs.list_packs());
  size_t loose = 0;
  if (packs.empty()) {
    KV_ASSIGN_OR_RETURN(std::vector<ChunkHash> listed, blobs.list());
    loose = listed.size();
  }
  return compare_unnamed_blobs(catalog.describe(), stats, blobs.describe(), packs.size(), loose);
}

}  // namespace

Status compare_store_ids(const std::string& catalog_name, const std::optional<std::string>& catalog_id,
                         const std::string& blobs_name, const std::optional<std::string>& blobs_raw) {
  KV_ASSIGN_OR_RETURN(std::optional<std::string> theirs, parse_blobs_id(blobs_name, blobs_raw));
  if (!theirs || (catalog_id && *catalog_id == *theirs)) return Status::OK();
  return another_catalogs(catalog_name, blobs_name, *theirs, catalog_id);
}

Status compare_unnamed_blobs(const std::string& catalog_name, const CatalogStats& stats,
                             const std::string& blobs_name, size_t packs, size_t loose) {
  if (stats.chunks > 0 || stats.unreferenced_chunks > 0) return Status::OK();
  const size_t held = packs > 0 ? packs : loose;
  if (held == 0) return Status::OK();
  return Status::Mismatch(
      "the blobs at " + blobs_name + " hold " + std::to_string(held) + (packs > 0 ? " pack(s)" : " blob(s)") +
      " and no store id, and the catalog " + catalog_name +
      " names none of them: a save or gc here would delete them as garbage. Point the store config's \"catalog\" "
      "at the catalog that holds them; if that catalog is lost for good, move packs/ and chunks/ out of " +
      blobs_name);
}

Status bind_store_identity(Catalog& catalog, BlobStore& blobs) {
  // The blobs' id first: the catalog's is set before it, so a first binding in another process
  // between the two reads is seen whole (an id beside the blobs implies one in their catalog).
  KV_ASSIGN_OR_RETURN(std::optional<std::string> theirs, blobs_id(blobs));
  KV_ASSIGN_OR_RETURN(std::optional<std::string> mine, catalog.get_meta(kMetaStoreId));
  if (theirs) {
    if (mine && *mine == *theirs) return Status::OK();
    return another_catalogs(catalog, blobs, *theirs, mine);
  }
  if (!mine) {
    KV_RETURN_IF_ERROR(refuse_unnamed_blobs(catalog, blobs));
    KV_ASSIGN_OR_RETURN(std::string now, catalog.init_meta(kMetaStoreId, new_snapshot_uuid()));
    mine = now;
  }
  // Written only where none is: of two catalogs binding the same new blobs at once, one reads the
  // other's id back and is refused.
  KV_RETURN_IF_ERROR(blobs.create_store_id(*mine).Prefixed("writing the store id beside " + blobs.describe()));
  KV_ASSIGN_OR_RETURN(theirs, blobs_id(blobs));
  if (!theirs) return Status::IOError("the store id written beside " + blobs.describe() + " is not there");
  if (*theirs != *mine) return another_catalogs(catalog, blobs, *theirs, mine);
  return Status::OK();
}

}  // namespace kvsnap
