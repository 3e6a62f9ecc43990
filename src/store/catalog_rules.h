// Internal to the catalog implementations (SQLite in catalog*.cc, PostgreSQL in
// pg_catalog*.cc): what every backend does the same way, so that the two agree
// on checks, defaults, hashes and messages. Not a public header.
//   - prepare_snapshot(): the checks and defaults applied to a new snapshot
//     (name not empty and not all digits, tag keys not empty, uuid generated or
//     lowercased, created = now, n_tokens and n_chunks from the lists).
//   - the prefix-index key (anchor_len, anchor_hash, full_hash) of catalog.h.
//   - the messages users see, word for word the same from every backend.
#pragma once

#include <array>
#include <bit>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/sha256.h"
#include "store/catalog.h"

namespace kvsnap {
namespace catalog_detail {

using Hash16 = std::array<uint8_t, 16>;

// The first 16 bytes of the digest of everything hashed so far.
inline Hash16 prefix16(const Sha256& sha) {
  const Sha256Digest d = sha.peek();
  Hash16 h;
  std::memcpy(h.data(), d.data(), h.size());
  return h;
}

// Tokens as stored and hashed: int32 little-endian.
inline std::vector<std::byte> tokens_le(std::span<const int32_t> tokens) {
  std::vector<std::byte> out(tokens.size() * 4);
  if constexpr (std::endian::native == std::endian::little) {
    if (!tokens.empty()) std::memcpy(out.data(), tokens.data(), out.size());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      uint32_t v = static_cast<uint32_t>(tokens[i]);
      for (int b = 0; b < 4; ++b) out[4 * i + b] = std::byte((v >> (8 * b)) & 0xff);
    }
  }
  return out;
}

inline std::vector<int32_t> tokens_from_le(std::span<const std::byte> b) {
  std::vector<int32_t> out(b.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= uint32_t(b[4 * i + k]) << (8 * k);
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool all_digits(const std::string& s);
// Whether Catalog::remove_snapshot_if may remove snapshot `id` as it is now: kMismatch naming why not.
Status removal_allowed(int64_t id, bool pinned, const std::optional<std::string>& expires_at,
                       const std::optional<std::string>& last_restored, const Catalog::RemovalCheck& check);
// Only hex digits and '-': could be (the start of) a uuid.
bool uuid_like(const std::string& s);

// A new snapshot's prefix-index key and its tokens as stored.
struct PrefixKey {
  std::vector<std::byte> tokens;  // tokens_le
  int64_t anchor_len = 0;
  Hash16 anchor_hash{};
  Hash16 full_hash{};
};

// The prefix search's per-band work (catalog.h, "Prefix search"), shared by
// the backends, which differ only in how they fetch a band's rows.
struct BandRow {
  int64_t n = 0;  // n_tokens
  Hash16 full{};  // full_hash
  int64_t id = 0;
};
// Appends to `out` the (n, id) of the rows of the band anchored at `c` whose
// full hash is that of q[0, n). `at_c` is the hash of q[0, c); q is the
// query's tokens_le. Rows of length 0 or outside the band are skipped.
void match_band(std::vector<BandRow> rows, const Sha256& at_c, int64_t c, std::span<const std::byte> q,
                std::vector<std::pair<int64_t, int64_t>>& out);
// A crowded band's probes: (n, hash of q[0, n)) for every length n >= 1 of the
// band anchored at `c`, continuing from `at_c`, the hash of q[0, c).
std::vector<std::pair<int64_t, Hash16>> band_probes(const Sha256& at_c, int64_t c, std::span<const std::byte> q);

// Checks `rec` and fills its defaults (see the top of this file); the key to store with it.
// An encrypted record (info.tenant set) needs `keying` (its prefix hashes are keyed) and
// sealed_tokens, which are what is stored.
Result<PrefixKey> prepare_snapshot(SnapshotRecord& rec, size_t n_chunks, const PrefixKeying* keying);

// Where every prefix hash starts: empty, or the keying's secret already hashed (PrefixKeying).
Sha256 prefix_hash_start(const PrefixKeying* keying);

// A sealed token list's bytes over the plain one's (base/chunk_cipher.h: header and tag).
inline constexpr int64_t kSealedTokensOverhead = 56;
// The integrity check's expected size of a snapshot_blobs.tokens value, as SQL over the
// snapshots row `s` (both backends spell CASE and length the same way but for the function).
#define KV_TOKENS_BYTES_SQL "4 * s.n_tokens + CASE WHEN s.tenant IS NULL THEN 0 ELSE 56 END"

// find_prefix with keying: the candidates (n_tokens, id), longest first, checked by opening
// each one's sealed tokens (keying.open_tokens) and comparing; at most `limit` returned.
Result<std::vector<SnapshotInfo>> sealed_prefix_matches(Catalog& catalog, const PrefixKeying& keying,
                                                        std::vector<std::pair<int64_t, int64_t>> candidates,
                                                        std::span<const int32_t> query,
                                                        const std::string& model_fingerprint, size_t limit);

Status name_taken(const std::string& name, int64_t id);
Status uuid_taken(const std::string& uuid, int64_t id);
Status no_snapshot(int64_t id);
// `where` names the catalog.
Status chunk_size_mismatch(const std::string& where, const ChunkHash& h, uint64_t raw_size);
Status schema_too_new(const std::string& where, int version, int known);
// A plain snapshot added to a catalog whose store is encrypted (key `key_id`): refused inside the
// add's transaction, so a writer that opened the store before its first encrypted save cannot go
// on storing plaintext (kMismatch).
Status plain_row_refused(const std::string& where, const std::string& key_id);
// What a catalog opened with upgrade_schema false says of a schema it would have upgraded
// (version 0: no catalog at all, kNotFound).
Status schema_not_upgraded(const std::string& where, int version, int known);
// resolve()'s answer when nothing matched; `where` says which store or catalog was searched.
Status unresolved(const std::string& ref, const std::string& where);
// Ambiguous uuid prefix: `seen` describes the candidates ("<uuid> (id N, 'name')").
Status ambiguous_uuid(const std::string& ref, const std::vector<std::string>& seen);

}  // namespace catalog_detail
}  // namespace kvsnap
