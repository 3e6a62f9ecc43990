// SqliteCatalog: the token-prefix index. Finds the snapshots whose tokens are a prefix
// of a query by hashing the query at each kPrefixStride anchor and probing the
// (anchor_len, anchor_hash) and (n_tokens, full_hash) indexes.
#include <algorithm>
#include <string>
#include <vector>

#include "store/sqlite_catalog_internal.h"

namespace kvsnap {

using namespace catalog_detail;

// ---------------------------------------------------------------- prefix search

// Tokens are not compared here.
Result<std::vector<std::pair<int64_t, int64_t>>> SqliteCatalog::prefix_candidates(std::span<const int32_t> query) {
  const int64_t m = static_cast<int64_t>(query.size());
  std::vector<std::byte> q = tokens_le(query);
  std::vector<std::pair<int64_t, int64_t>> ids;
  KV_ASSIGN_OR_RETURN(Stmt band, stmt("SELECT n_tokens, full_hash, id FROM snapshots "
                                      "WHERE anchor_len = ?1 AND anchor_hash = ?2 AND n_tokens <= ?3 LIMIT ?4"));
  KV_ASSIGN_OR_RETURN(Stmt probe, stmt("SELECT id FROM snapshots WHERE n_tokens = ?1 AND full_hash = ?2"));
  std::vector<BandRow> rows;
  Sha256 run = prefix_hash_start(keying());  // the hash of q[0, c)
  for (int64_t c = 0; c <= m; c += kPrefixStride) {
    rows.clear();
    band.i64(1, c).blob(2, prefix16(run)).i64(3, m).i64(4, kPrefixStride + 1);
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, band.step());
      if (!row) break;
      BandRow r{band.col_i64(0), {}, band.col_i64(2)};
      auto h = band.col_blob(1);
      if (h.size() == r.full.size()) std::memcpy(r.full.data(), h.data(), h.size());
      rows.push_back(r);
    }
    band.reset();
    if (rows.size() <= static_cast<size_t>(kPrefixStride)) {
      match_band(rows, run, c, q, ids);
    } else {
      // Crowded band (a shared system prompt): probe each length instead of
      // comparing every snapshot anchored here.
      for (const auto& [n, h] : band_probes(run, c, q)) {
        probe.i64(1, n).blob(2, h);
        for (;;) {
          KV_ASSIGN_OR_RETURN(bool row, probe.step());
          if (!row) break;
          ids.emplace_back(n, probe.col_i64(0));
        }
        probe.reset();
      }
    }
    const int64_t next = std::min(c + kPrefixStride, m);
    run.update(q.data() + c * 4, static_cast<size_t>(next - c) * 4);
  }
  return ids;
}

Result<std::vector<SnapshotInfo>> SqliteCatalog::find_prefix(std::span<const int32_t> query,
                                                       const std::string& model_fingerprint, size_t limit) {
  std::vector<SnapshotInfo> out;
  if (query.empty() || limit == 0) return out;
  if (const PrefixKeying* k = keying()) {
    KV_ASSIGN_OR_RETURN(auto candidates, prefix_candidates(query));
    return sealed_prefix_matches(*this, *k, std::move(candidates), query, model_fingerprint, limit);
  }
  KV_RETURN_IF_ERROR(exec("BEGIN"));  // one consistent view for the probes and the checks
  Status s = [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto candidates, prefix_candidates(query));
    std::sort(candidates.begin(), candidates.end(), std::greater<>());  // longest, then highest id
    std::vector<std::byte> q = tokens_le(query);
    for (const auto& [n_tokens, id] : candidates) {
      if (out.size() >= limit) break;
      // Hashes only chose the candidates; the tokens decide.
      {
        KV_ASSIGN_OR_RETURN(Stmt t, stmt("SELECT b.tokens, s.model_fingerprint FROM snapshot_blobs b "
                                         "JOIN snapshots s ON s.id = b.snapshot_id WHERE b.snapshot_id = ?1"));
        t.i64(1, id);
        KV_ASSIGN_OR_RETURN(bool found, t.step());
        if (!found) continue;
        if (!model_fingerprint.empty() && t.col_text(1) != model_fingerprint) continue;
        auto stored = t.col_blob(0);
        size_t n = static_cast<size_t>(n_tokens) * 4;
        if (stored.size() != n || n > q.size() || std::memcmp(stored.data(), q.data(), n) != 0) continue;
      }
      KV_ASSIGN_OR_RETURN(SnapshotInfo info, get_info(id));
      out.push_back(std::move(info));
    }
    return Status::OK();
  }();
  rollback();
  if (!s.ok()) return s;
  return out;
}

}  // namespace kvsnap
