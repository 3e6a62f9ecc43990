#include "store/catalog_rules.h"

#include "base/text.h"
#include "store/eviction.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <random>

namespace kvsnap {
namespace catalog_detail {

namespace {

std::string new_uuid_v4() {
  uint8_t b[16];
  if (RAND_bytes(b, sizeof b) != 1) {
    std::random_device rd;
    for (auto& x : b) x = static_cast<uint8_t>(rd());
  }
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kDigits[b[i] >> 4];
    s += kDigits[b[i] & 15];
  }
  return s;
}

}  // namespace

Sha256 prefix_hash_start(const PrefixKeying* keying) {
  Sha256 sha;
  if (keying) sha.update(keying->secret.data(), keying->secret.size());
  return sha;
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Status removal_allowed(int64_t id, bool pinned, const std::optional<std::string>& expires_at,
                       const std::optional<std::string>& last_restored, const Catalog::RemovalCheck& check) {
  if (check.unpinned && pinned) return Status::Mismatch("snapshot " + std::to_string(id) + " is pinned (kept)");
  if (check.expired_as_of && !expiry_passed(expires_at, *check.expired_as_of))
    return Status::Mismatch("snapshot " + std::to_string(id) + " has not expired as of " + *check.expired_as_of +
                            " (kept)");
  if (check.unrestored_since_plan && last_restored != check.last_restored)
    return Status::Mismatch("snapshot " + std::to_string(id) + " was restored since the eviction chose it (kept)");
  return Status::OK();
}

bool uuid_like(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-'; });
}

namespace {

// Hashes q[0, n) for increasing n, continuing from the hash of q[0, pos).
class PrefixWalk {
 public:
  PrefixWalk(const Sha256& at, int64_t pos, std::span<const std::byte> q) : sha_(at), pos_(pos), q_(q) {}
  Hash16 to(int64_t n) {
    sha_.update(q_.data() + pos_ * 4, static_cast<size_t>(n - pos_) * 4);
    pos_ = n;
    return prefix16(sha_);
  }

 private:
  Sha256 sha_;
  int64_t pos_;
  std::span<const std::byte> q_;
};

int64_t band_last(int64_t c, std::span<const std::byte> q) {
  return std::min<int64_t>(c + Catalog::kPrefixStride - 1, static_cast<int64_t>(q.size() / 4));
}

}  // namespace

void match_band(std::vector<BandRow> rows, const Sha256& at_c, int64_t c, std::span<const std::byte> q,
                std::vector<std::pair<int64_t, int64_t>>& out) {
  std::sort(rows.begin(), rows.end(), [](const BandRow& a, const BandRow& b) { return a.n < b.n; });
  PrefixWalk walk(at_c, c, q);
  const int64_t last = band_last(c, q);
  Hash16 h{};
  int64_t hashed = -1;
  for (const BandRow& r : rows) {
    if (r.n == 0 || r.n < c || r.n > last) continue;
    if (r.n != hashed) {
      h = walk.to(r.n);
      hashed = r.n;
    }
    if (h == r.full) out.emplace_back(r.n, r.id);
  }
}

std::vector<std::pair<int64_t, Hash16>> band_probes(const Sha256& at_c, int64_t c, std::span<const std::byte> q) {
  std::vector<std::pair<int64_t, Hash16>> out;
  PrefixWalk walk(at_c, c, q);
  for (int64_t n = std::max<int64_t>(c, 1), last = band_last(c, q); n <= last; ++n) out.emplace_back(n, walk.to(n));
  return out;
}

Result<PrefixKey> prepare_snapshot(SnapshotRecord& rec, size_t n_chunks, const PrefixKeying* keying) {
  SnapshotInfo& info = rec.info;
  KV_RETURN_IF_ERROR(check_snapshot_labels(info.name, info.tags));
  const bool sealed = info.tenant.has_value();
  KV_ASSIGN_OR_RETURN(std::string uuid, canonical_snapshot_uuid(info.uuid));
  // A sealed row's manifest and tokens are bound to the uuid as given: another spelling would
  // store a row that never opens again.
  if (sealed && uuid != info.uuid)
    return Status::InvalidArgument("a sealed snapshot's uuid must be given in lower case (" + info.uuid + ")");
  info.uuid = uuid.empty() ? new_uuid_v4() : uuid;
  if (info.created.empty()) info.created = utc_now_iso8601();
  info.n_tokens = static_cast<int64_t>(rec.tokens.size());
  info.n_chunks = static_cast<int64_t>(n_chunks);

  if (sealed && (!keying || rec.sealed_tokens.size() != rec.tokens.size() * 4 + kSealedTokensOverhead))
    return Status::InvalidArgument("an encrypted snapshot needs the tenant's keyed prefix index and its sealed tokens");
  if (!sealed) keying = nullptr;  // a plain row keeps plain hashes

  PrefixKey key;
  const std::vector<std::byte> plain = tokens_le(rec.tokens);
  key.anchor_len = info.n_tokens / Catalog::kPrefixStride * Catalog::kPrefixStride;
  Sha256 sha = prefix_hash_start(keying);
  sha.update(plain.data(), static_cast<size_t>(key.anchor_len) * 4);
  key.anchor_hash = prefix16(sha);
  sha.update(plain.data() + key.anchor_len * 4, plain.size() - static_cast<size_t>(key.anchor_len) * 4);
  key.full_hash = prefix16(sha);
  key.tokens = sealed ? rec.sealed_tokens : plain;
  return key;
}

Result<std::vector<SnapshotInfo>> sealed_prefix_matches(Catalog& catalog, const PrefixKeying& keying,
                                                        std::vector<std::pair<int64_t, int64_t>> candidates,
                                                        std::span<const int32_t> query,
                                                        const std::string& model_fingerprint, size_t limit) {
  std::sort(candidates.begin(), candidates.end(), std::greater<>());  // longest, then highest id
  std::vector<SnapshotInfo> out;
  for (const auto& [n_tokens, id] : candidates) {
    if (out.size() >= limit) break;
    auto rec = catalog.get(id);
    if (!rec.ok() && rec.status().code() == Code::kNotFound) continue;  // removed meanwhile
    KV_RETURN_IF_ERROR(rec.status());
    if (!rec->info.tenant || rec->info.n_tokens != n_tokens || n_tokens > static_cast<int64_t>(query.size())) continue;
    if (!model_fingerprint.empty() && rec->info.model_fingerprint != model_fingerprint) continue;
    // Hashes only chose the candidates; the tokens decide.
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, keying.open_tokens(*rec));
    if (tokens.size() != static_cast<size_t>(n_tokens) || !std::equal(tokens.begin(), tokens.end(), query.begin()))
      continue;
    out.push_back(std::move(rec->info));
  }
  return out;
}

Status name_taken(const std::string& name, int64_t id) {
  return Status::InvalidArgument("a snapshot named '" + name + "' already exists (id " + std::to_string(id) +
                                 "): choose another {--name}, or remove it first (kvsnap rm " + name + ")");
}

Status uuid_taken(const std::string& uuid, int64_t id) {
  return Status::InvalidArgument("a snapshot with uuid " + uuid + " already exists (id " + std::to_string(id) + ")");
}

Status no_snapshot(int64_t id) { return Status::NotFound("no snapshot with id " + std::to_string(id)); }

Status chunk_size_mismatch(const std::string& where, const ChunkHash& h, uint64_t raw_size) {
  return Status::Mismatch(where + ": chunk " + h.hex() + " is already recorded with another raw size than " +
                          std::to_string(raw_size) + ": the catalog or the chunk is damaged; kvsnap verify --all "
                          "lists what");
}

Status schema_too_new(const std::string& where, int version, int known) {
  return Status::NotSupported(where + ": the catalog has schema version " + std::to_string(version) +
                              " but this kvsnap knows versions up to " + std::to_string(known) +
                              ": it was written by a newer kvsnap; upgrade kvsnap to use this store");
}

Status plain_row_refused(const std::string& where, const std::string& key_id) {
  return Status::Mismatch(where + ": the store is encrypted (key " + key_id +
                          ") and takes no plain snapshots: this process opened it before its first encrypted save; "
                          "run it again with the store's --key-file FILE or --key-command CMD");
}

Status schema_not_upgraded(const std::string& where, int version, int known) {
  if (version == 0) return Status::NotFound(where + ": holds no kvsnap catalog yet (the first kvsnap save creates it)");
  return Status::Mismatch(where + ": the catalog has schema version " + std::to_string(version) +
                              ", older than this kvsnap's " + std::to_string(known) +
                          ": its first save, restore or gc upgrades it, after which older kvsnap builds refuse "
                          "this store");
}

Status unresolved(const std::string& ref, const std::string& where) {
  std::string p = lower(ref);
  std::string msg = "no snapshot has the name, id or uuid '" + ref + "'";
  if (uuid_like(p) && p.size() < 6) msg += " (a uuid prefix needs at least 6 characters)";
  msg += " in " + where + "; kvsnap ls lists them ({--store DIR} picks another store)";
  return Status::NotFound(msg);
}

Status ambiguous_uuid(const std::string& ref, const std::vector<std::string>& seen) {
  std::string msg = "'" + ref + "' is the start of several snapshot uuids: ";
  for (size_t i = 0; i < seen.size() && i < 5; ++i) msg += (i ? ", " : "") + seen[i];
  if (seen.size() > 5) msg += ", ...";
  return Status::Ambiguous(msg + "; give more of the uuid");
}

}  // namespace catalog_detail

std::string new_snapshot_uuid() { return catalog_detail::new_uuid_v4(); }

Result<std::string> canonical_snapshot_uuid(const std::string& uuid) {
  if (uuid.empty()) return uuid;
  bool ok = uuid.size() == 36;
  for (size_t i = 0; ok && i < uuid.size(); ++i)
    ok = (i == 8 || i == 13 || i == 18 || i == 23) ? uuid[i] == '-' : std::isxdigit(static_cast<unsigned char>(uuid[i])) != 0;
  if (!ok) return Status::InvalidArgument("'" + uuid.substr(0, 64) + "' is not a uuid (8-4-4-4-12 hex digits)");
  return catalog_detail::lower(uuid);
}

Status check_new_labels_text(const std::optional<std::string>& name, const std::map<std::string, std::string>& tags) {
  const std::string bound = " (at most " + std::to_string(kMaxLabelBytes) + " bytes)";
  if (name && !is_valid_utf8(*name))
    return Status::InvalidArgument(quote_text(*name) + " cannot be a snapshot name: it is not UTF-8 text");
  if (name && name->size() > kMaxLabelBytes)
    return Status::InvalidArgument(quote_text(*name) + " cannot be a snapshot name: too long" + bound);
  // A NUL cannot come from a command line or a header, ends the text for C APIs and is refused by
  // PostgreSQL (after the blobs are written): only an archive's index could bring one.
  const std::string nul(1, '\0');
  if (name && name->find(nul) != std::string::npos)
    return Status::InvalidArgument(quote_text(*name) + " cannot be a snapshot name: it holds a NUL");
  if (tags.size() > kMaxTags)
    return Status::InvalidArgument(std::to_string(tags.size()) + " tags: at most " + std::to_string(kMaxTags));
  for (const auto& [k, v] : tags) {
    const std::string tag = "the tag " + quote_text(k) + "=" + quote_text(v);
    if (!is_valid_utf8(k) || !is_valid_utf8(v)) return Status::InvalidArgument(tag + " is not UTF-8 text");
    if (k.size() > kMaxLabelBytes || v.size() > kMaxLabelBytes) return Status::InvalidArgument(tag + " is too long" + bound);
    if (k.find(nul) != std::string::npos || v.find(nul) != std::string::npos)
      return Status::InvalidArgument(tag + " holds a NUL");
  }
  return Status::OK();
}

Status check_imported_fingerprint(const std::string& model_fingerprint) {
  if (model_fingerprint.size() > kMaxLabelBytes || !is_valid_utf8(model_fingerprint) ||
      has_terminal_controls(model_fingerprint))
    return Status::InvalidArgument("the model fingerprint " + quote_text(model_fingerprint) +
                                   " is not a fingerprint (control characters, not UTF-8, or over " +
                                   std::to_string(kMaxLabelBytes) + " bytes)");
  return Status::OK();
}

Status check_snapshot_labels(const std::optional<std::string>& name, const std::map<std::string, std::string>& tags) {
  if (name) {
    if (name->empty()) return Status::InvalidArgument("a snapshot name cannot be empty");
    if (catalog_detail::all_digits(*name))
      return Status::InvalidArgument("'" + *name + "' cannot be a snapshot name: it would read as an id");
    // A reference that is a whole uuid names that snapshot only (kvsnap serve restores by uuid).
    if (canonical_snapshot_uuid(*name).ok())
      return Status::InvalidArgument("'" + *name + "' cannot be a snapshot name: it would read as a uuid");
  }
  for (const auto& [k, v] : tags) {
    if (k.empty()) return Status::InvalidArgument("a tag key cannot be empty");
  }
  return Status::OK();
}

}  // namespace kvsnap
