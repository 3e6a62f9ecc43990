// What an encrypted store keeps in its catalog rows (docs/store.md, "Encryption at rest"),
// and the checks that tell a missing key, a wrong key or tenant and tampering apart.
//
//   manifest row   the snapshot's manifest sealed by the tenant's cipher under the id
//                  HMAC(id key, "kvsnap manifest v1\0" uuid)
//   tokens row     its prompt tokens (i32 LE) sealed under HMAC(id key, "kvsnap tokens v1\0" uuid)
//   content digest "keyed-chunk-tree:" hex HMAC(id key, "kvsnap content v1\0" the manifest's content
//                  digest) (format version 3); version 1: hex HMAC(.., SHA-256 of the original)
//   prefix index   keyed by the secret HMAC(id key, "kvsnap prefix index v1") (catalog.h PrefixKeying)
//   export labels  a sealed export's name, tags, fingerprint and creation time per snapshot,
//                  sealed under HMAC(id key, "kvsnap export metadata v1\0" uuid)
//
// The ids bind each sealed row to its snapshot's uuid: a row copied onto another snapshot fails
// its tag like a flipped byte does ("tampered or corrupt", kCorruption, naming the snapshot).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/chunk_cipher.h"
#include "base/status.h"
#include "format/snapshot.h"
#include "store/catalog.h"

namespace kvsnap {

// "snapshot 3 ('chat')": how the store names a snapshot in these messages.
std::string snapshot_label(const SnapshotInfo& info);

// Sets the row's tenant and key ids and seals `manifest` and `rec.tokens` into it (rec.info.uuid
// must be set: the ids are bound to it).
Status seal_record(const ChunkCipher& cipher, std::span<const std::byte> manifest, SnapshotRecord& rec);

// Whether `cipher` may read the snapshot: kInvalidArgument without a key, kMismatch for another
// master key or tenant (naming both key ids, or both tenants). OK for a plain snapshot.
Status check_snapshot_key(const SnapshotInfo& info, const ChunkCipher* cipher);

// A plain (unencrypted) snapshot read by a command that was given a key: kMismatch unless
// `allow_plain`. Nothing protects a plain row from whoever can write the catalog (it may have been
// added under a name the key holder restores), so a key holder takes its data only on purpose
// (restore, export: docs/store.md, threat model).
Status check_plain_under_key(const SnapshotInfo& info, const ChunkCipher* cipher, bool allow_plain);

// The manifest bytes of a row: as stored when plain, opened (check_snapshot_key first) when sealed.
Result<std::vector<std::byte>> open_manifest_row(const SnapshotRecord& rec, const ChunkCipher* cipher);
// The tokens of a row: rec.tokens when plain, the sealed list opened when encrypted.
Result<std::vector<int32_t>> open_tokens_row(const SnapshotRecord& rec, const ChunkCipher* cipher);

// An encrypted snapshot's catalog name and tags against the labels sealed in its manifest
// (INFO.labels, recorded by saves since labels exist): a name other than the sealed one, or a tag
// the labels do not hold with that value, is kMismatch naming both (someone who can write the
// catalog but has no key renamed it or swapped the names of two snapshots). A name or tag the row
// lacks is not (an import that found the name taken saves it without). `ref` is how the caller
// named it; a manifest without labels (an older save) is not checked. `change`: empty for a read
// (the message says how to restore the row by its uuid), else the command that would have changed
// it ("rm", "pin"), which the message tells to name its snapshot by uuid (the row named is not the
// snapshot the user meant).
Status check_sealed_labels(const SnapshotInfo& row, const SnapshotManifest& m, const std::string& ref,
                           const std::string& change = "");

// A sealed export's metadata of the snapshot `uuid` (what its index would show in plaintext),
// sealed by the tenant's cipher and bound to the uuid; opened back with the same binding, so a
// changed byte or metadata moved onto another uuid is kCorruption "<what>: tampered or corrupt".
Result<std::vector<std::byte>> seal_export_metadata(const ChunkCipher& cipher, const std::string& uuid,
                                                    std::span<const std::byte> plain);
Result<std::vector<std::byte>> open_export_metadata(const ChunkCipher& cipher, const std::string& uuid,
                                                    std::span<const std::byte> sealed, const std::string& what);

// The catalog's content digest of a snapshot (its `content_sha256` column, named before version 3):
// "RULE:hex" for a version-3 manifest (RULE "chunk-tree", or "keyed-chunk-tree" with a cipher:
// the HMAC of the digest), bare hex for version 1 (the original's SHA-256, or its HMAC).
std::string recorded_content_digest(const SnapshotManifest& m, const ChunkCipher* cipher);
// The same for a digest `d` computed by `rule` (kvsnap digest --as: what show prints for it).
std::string recorded_content_digest(const Sha256Digest& d, ContentDigestRule rule, const ChunkCipher* cipher);

// A catalog content digest split into its rule (format/content_digest.h content_digest_rule_name)
// and hex; bare hex is version 1's: "sha256", or "hmac-sha256" for an encrypted snapshot.
struct ContentDigestText {
  std::string rule, hex;
  bool whole_file_sha256() const { return rule == "sha256"; }  // = sha256sum of the restored file
};
ContentDigestText split_content_digest(const std::string& recorded, bool encrypted);

// The keyed prefix index of the cipher's tenant, for Catalog::set_keying. `cipher` must outlive it.
std::shared_ptr<const PrefixKeying> prefix_keying(const ChunkCipher& cipher);

// What a verify without the key checks of a sealed row or blob: its header (base/chunk_cipher.h
// parse_sealed_header), that the snapshot's recorded key ids sealed it, and its size. `what`
// names it in the problem.
Status check_sealed_without_key(std::span<const std::byte> blob, const SnapshotInfo& info, uint64_t expected_size,
                                const std::string& what);

}  // namespace kvsnap
