#include "store/store_seal.h"

#include <cstring>

#include "format/content_digest.h"
#include "store/catalog_rules.h"

namespace kvsnap {

namespace {

// HMAC(id key, label ‖ 0 ‖ bytes): the id a sealed row is bound to.
ChunkId labelled_id(const ChunkCipher& c, std::string_view label, std::span<const std::byte> bytes) {
  std::vector<std::byte> msg(label.size() + 1 + bytes.size());
  std::memcpy(msg.data(), label.data(), label.size());
  msg[label.size()] = std::byte{0};
  if (!bytes.empty()) std::memcpy(msg.data() + label.size() + 1, bytes.data(), bytes.size());
  return c.chunk_id(msg);
}

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span<const char>(s)); }

ChunkId manifest_id(const ChunkCipher& c, const std::string& uuid) {
  return labelled_id(c, "kvsnap manifest v1", bytes_of(uuid));
}
ChunkId tokens_id(const ChunkCipher& c, const std::string& uuid) { return labelled_id(c, "kvsnap tokens v1", bytes_of(uuid)); }
ChunkId export_metadata_id(const ChunkCipher& c, const std::string& uuid) {
  return labelled_id(c, "kvsnap export metadata v1", bytes_of(uuid));
}

Result<std::vector<std::byte>> seal(const ChunkCipher& c, const ChunkId& id, std::span<const std::byte> plain) {
  std::vector<std::byte> out;
  KV_ASSIGN_OR_RETURN(size_t n, c.seal_into(id, plain, out));
  out.resize(n);
  return out;
}

}  // namespace

std::string snapshot_label(const SnapshotInfo& info) {
  std::string s = "snapshot " + std::to_string(info.id);
  if (info.name) s += " ('" + *info.name + "')";
  return s;
}

Status seal_record(const ChunkCipher& cipher, std::span<const std::byte> manifest, SnapshotRecord& rec) {
  SnapshotInfo& info = rec.info;
  info.tenant = cipher.tenant();
  info.master_key_id = key_id_hex(cipher.master_key_id());
  info.tenant_key_id = key_id_hex(cipher.tenant_key_id());
  KV_ASSIGN_OR_RETURN(rec.manifest, seal(cipher, manifest_id(cipher, info.uuid), manifest));
  const std::vector<std::byte> tokens = catalog_detail::tokens_le(rec.tokens);
  KV_ASSIGN_OR_RETURN(rec.sealed_tokens, seal(cipher, tokens_id(cipher, info.uuid), tokens));
  return Status::OK();
}

Status check_snapshot_key(const SnapshotInfo& info, const ChunkCipher* cipher) {
  if (!info.tenant) return Status::OK();
  const std::string who = snapshot_label(info);
  if (!cipher)
    return Status::InvalidArgument(who + " is encrypted with key " + info.master_key_id + " for tenant '" + *info.tenant +
                                   "', and no key was given: pass --key-file FILE or --key-command CMD");
  const std::string master = key_id_hex(cipher->master_key_id());
  if (info.master_key_id != master)
    return Status::Mismatch(who + " is encrypted with key " + info.master_key_id + ", but the key given is " + master +
                            " (wrong key: pass the store's --key-file FILE or --key-command CMD)");
  if (*info.tenant != cipher->tenant())
    return Status::Mismatch(who + " is encrypted for tenant '" + *info.tenant + "', not '" + cipher->tenant() +
                            "' (pass --tenant " + *info.tenant + ")");
  if (info.tenant_key_id != key_id_hex(cipher->tenant_key_id()))
    return Status::Mismatch(who + " is encrypted for another tenant key (" + info.tenant_key_id + ", expected " +
                            key_id_hex(cipher->tenant_key_id()) + ")");
  return Status::OK();
}

Status check_sealed_labels(const SnapshotInfo& row, const SnapshotManifest& m, const std::string& ref,
                           const std::string& change) {
  if (!row.tenant || !m.labels) return Status::OK();
  const SnapshotLabels& sealed = *m.labels;
  std::string wrong;
  if (row.name && row.name != sealed.name)
    wrong = "the catalog names it '" + *row.name + "', and it was saved " +
            (sealed.name ? "as '" + *sealed.name + "'" : std::string("without a name"));
  for (const auto& [k, v] : row.tags) {
    if (!wrong.empty()) break;
    auto it = sealed.tags.find(k);
    if (it == sealed.tags.end()) wrong = "the catalog gives it the tag " + k + "=" + v + ", which it was not saved with";
    else if (it->second != v) wrong = "the catalog gives it the tag " + k + "=" + v + ", and it was saved with " + k + "=" + it->second;
  }
  if (wrong.empty()) return Status::OK();
  // kMismatch, not kCorruption: the snapshot is whole (restore's "damaged ... kvsnap rm removes it"
  // would have the user delete a good snapshot); the catalog's label does not belong to it.
  const std::string what = ": " + wrong +
                           ": its name and tags in the catalog were changed by someone without the key (they are "
                           "sealed in its manifest)";
  if (change.empty())
    return Status::Mismatch("snapshot " + ref + " (uuid " + row.uuid + ")" + what +
                            "; its uuid, which the sealed manifest is bound to, still names it: kvsnap restore " +
                            row.uuid + " ...");
  // No uuid here: this row is not the snapshot the user meant to change, and ls and show print the
  // catalog's (swapped) names; verify, with the key, names each row's sealed name beside its uuid.
  return Status::Mismatch("snapshot " + ref + what +
                          "; nothing was changed: the row this reaches is not the snapshot saved so. kvsnap verify "
                          "--all, with this key and tenant, lists every snapshot whose catalog name or tags differ "
                          "from the sealed ones, with its uuid and what it was saved as (it checks every chunk: "
                          "slow on a large store); name the snapshot to " + change + " by its uuid");
}

Status check_plain_under_key(const SnapshotInfo& info, const ChunkCipher* cipher, bool allow_plain) {
  if (!cipher || info.tenant || allow_plain) return Status::OK();
  return Status::Mismatch(snapshot_label(info) +
                          " is not encrypted, and a key was given: a plain snapshot carries no protection against "
                          "whoever can write the store's catalog (saved before the store's first encrypted save, or "
                          "added since by someone else); pass {--allow-plain} to read it anyway");
}

Result<std::vector<std::byte>> open_manifest_row(const SnapshotRecord& rec, const ChunkCipher* cipher) {
  if (!rec.info.tenant) return rec.manifest;
  KV_RETURN_IF_ERROR(check_snapshot_key(rec.info, cipher));
  std::vector<std::byte> plain;
  KV_RETURN_IF_ERROR(cipher->open_into(manifest_id(*cipher, rec.info.uuid), rec.manifest, plain,
                                       snapshot_label(rec.info) + ": its manifest row"));
  return plain;
}

Result<std::vector<int32_t>> open_tokens_row(const SnapshotRecord& rec, const ChunkCipher* cipher) {
  if (!rec.info.tenant) return rec.tokens;
  KV_RETURN_IF_ERROR(check_snapshot_key(rec.info, cipher));
  std::vector<std::byte> plain;
  KV_RETURN_IF_ERROR(cipher->open_into(tokens_id(*cipher, rec.info.uuid), rec.sealed_tokens, plain,
                                       snapshot_label(rec.info) + ": its token row"));
  if (plain.size() != static_cast<size_t>(rec.info.n_tokens) * 4)
    return Status::Corruption(snapshot_label(rec.info) + ": its token row holds " + std::to_string(plain.size()) +
                              " bytes for " + std::to_string(rec.info.n_tokens) + " tokens");
  return catalog_detail::tokens_from_le(plain);
}

Result<std::vector<std::byte>> seal_export_metadata(const ChunkCipher& cipher, const std::string& uuid,
                                                    std::span<const std::byte> plain) {
  return seal(cipher, export_metadata_id(cipher, uuid), plain);
}

Result<std::vector<std::byte>> open_export_metadata(const ChunkCipher& cipher, const std::string& uuid,
                                                    std::span<const std::byte> sealed, const std::string& what) {
  std::vector<std::byte> plain;
  KV_RETURN_IF_ERROR(cipher.open_into(export_metadata_id(cipher, uuid), sealed, plain, what));
  return plain;
}

std::string recorded_content_digest(const SnapshotManifest& m, const ChunkCipher* cipher) {
  return recorded_content_digest(m.content_digest, m.rule(), cipher);
}

std::string recorded_content_digest(const Sha256Digest& d, ContentDigestRule rule, const ChunkCipher* cipher) {
  const std::string hex =
      cipher ? to_hex(labelled_id(*cipher, "kvsnap content v1", std::as_bytes(std::span<const uint8_t>(d)))) : to_hex(d);
  if (rule == ContentDigestRule::kWholeSha256) return hex;
  return std::string(content_digest_rule_name(rule, cipher != nullptr)) + ":" + hex;
}

ContentDigestText split_content_digest(const std::string& recorded, bool encrypted) {
  const size_t colon = recorded.find(':');
  if (colon == std::string::npos) return {encrypted ? "hmac-sha256" : "sha256", recorded};
  return {recorded.substr(0, colon), recorded.substr(colon + 1)};
}

std::shared_ptr<const PrefixKeying> prefix_keying(const ChunkCipher& cipher) {
  auto k = std::make_shared<PrefixKeying>();
  k->secret = labelled_id(cipher, "kvsnap prefix index v1", {});
  k->open_tokens = [&cipher](const SnapshotRecord& rec) { return open_tokens_row(rec, &cipher); };
  return k;
}

Status check_sealed_without_key(std::span<const std::byte> blob, const SnapshotInfo& info, uint64_t expected_size,
                                const std::string& what) {
  KV_ASSIGN_OR_RETURN(SealedHeader h, parse_sealed_header(blob, what));
  if (key_id_hex(h.master_key_id) != info.master_key_id || key_id_hex(h.tenant_key_id) != info.tenant_key_id)
    return Status::Mismatch(what + ": sealed with key " + key_id_hex(h.master_key_id) + " (tenant key " +
                            key_id_hex(h.tenant_key_id) + "), but the catalog records " + info.master_key_id + " (" +
                            info.tenant_key_id + ")");
  if (expected_size && blob.size() != expected_size)
    return Status::Corruption(what + ": " + std::to_string(blob.size()) + " bytes, the catalog records " +
                              std::to_string(expected_size));
  return Status::OK();
}

}  // namespace kvsnap
