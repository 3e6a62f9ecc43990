// PgCatalog: the token-prefix index (find_prefix), gc's questions, statistics
// and the integrity check.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "store/catalog_rules.h"
#include "store/pg_catalog.h"
#include "store/pg_catalog_internal.h"
#include "store/pg_conn.h"

namespace kvsnap {

using namespace catalog_detail;
using Iso = PgConn::Isolation;

namespace {

// Arrays sent as one parameter are cut into slices of this many elements.
constexpr size_t kSlice = 10000;




}  // namespace

// ---------------------------------------------------------------- prefix search

// The plan of catalog.h, batched: one statement asks every band at once (at
// most kPrefixStride + 1 rows per band, LATERAL), a second probes every length
// of the crowded bands. Tokens are not compared here.
Result<std::vector<std::pair<int64_t, int64_t>>> PgCatalog::prefix_candidates(std::span<const int32_t> query,
                                                                               bool begin) {
  constexpr int64_t kStride = Catalog::kPrefixStride;
  const int64_t m = static_cast<int64_t>(query.size());
  std::vector<std::byte> q = tokens_le(query);
  std::vector<int64_t> anchors;
  std::vector<Hash16> anchor_hashes;
  std::vector<Sha256> states;  // the hash of q[0, c) for each anchor c
  states.reserve(static_cast<size_t>(m / kStride + 1));
  Sha256 run = prefix_hash_start(keying());
  for (int64_t c = 0; c <= m; c += kStride) {
    anchors.push_back(c);
    anchor_hashes.push_back(prefix16(run));
    states.emplace_back(run);
    const int64_t next = std::min(c + kStride, m);
    run.update(q.data() + c * 4, static_cast<size_t>(next - c) * 4);
  }
  std::vector<std::span<const std::byte>> hash_spans;
  for (const Hash16& h : anchor_hashes) hash_spans.push_back(span_of(h));
  static const char* const kBands =
      "SELECT b.c, s.n_tokens, s.full_hash, s.id FROM unnest($1, $2) AS b(c, h) "
      "CROSS JOIN LATERAL (SELECT n_tokens, full_hash, id FROM snapshots "
      "WHERE anchor_len = b.c AND anchor_hash = b.h AND n_tokens <= $3 LIMIT $4) s";
  PgParams band_params;
  band_params.i64_array(anchors).bytes_array(hash_spans).i64(m).i64(kStride + 1);
  PgResult bands(nullptr);
  if (begin) {
    // BEGIN travels with the band query: one round trip for both.
    const PgConn::Command cmds[] = {{kBeginSnapshot, nullptr}, {kBands, &band_params}};
    KV_ASSIGN_OR_RETURN(std::vector<PgResult> r, conn_->pipeline(cmds));
    conn_->set_in_transaction(true);
    if (r.size() != 2) return Status::IOError(where_ + ": the band query returned no result");
    bands = std::move(r[1]);
  } else {
    KV_ASSIGN_OR_RETURN(bands, conn_->exec(kBands, band_params));
  }
  std::map<int64_t, std::vector<BandRow>> by_band;
  for (int r = 0; r < bands.rows(); ++r) {
    BandRow row{bands.i64(r, 1), {}, bands.i64(r, 3)};
    auto h = bands.bytes(r, 2);
    if (h.size() == row.full.size()) std::memcpy(row.full.data(), h.data(), h.size());
    by_band[bands.i64(r, 0)].push_back(row);
  }
  std::vector<std::pair<int64_t, int64_t>> ids;
  std::vector<int64_t> probe_n;
  std::vector<Hash16> probe_h;
  for (auto& [c, rows] : by_band) {
    if (c < 0 || c > m || c % kStride != 0) continue;  // not an anchor we asked for
    const Sha256& at_c = states[static_cast<size_t>(c / kStride)];
    if (rows.size() <= static_cast<size_t>(kStride)) {
      match_band(std::move(rows), at_c, c, q, ids);
    } else {
      // Crowded band (a shared system prompt): probe each length instead.
      for (const auto& [n, h] : band_probes(at_c, c, q)) {
        probe_n.push_back(n);
        probe_h.push_back(h);
      }
    }
  }
  if (!probe_n.empty()) {
    std::vector<std::span<const std::byte>> spans;
    for (const Hash16& h : probe_h) spans.push_back(span_of(h));
    KV_ASSIGN_OR_RETURN(PgResult probes,
                        conn_->exec("SELECT s.n_tokens, s.id FROM unnest($1, $2) AS p(n, h) "
                                    "JOIN snapshots s ON s.n_tokens = p.n AND s.full_hash = p.h",
                                    PgParams().i64_array(probe_n).bytes_array(spans)));
    for (int r = 0; r < probes.rows(); ++r) ids.emplace_back(probes.i64(r, 0), probes.i64(r, 1));
  }
  return ids;
}

// Hashes only chose the candidates; the tokens decide, compared by the server
// (an 8,000-token snapshot's tokens are 32 KB not worth sending).
static const char* const kVerify =
    "SELECT " KV_PG_INFO_COLS " FROM snapshots s JOIN snapshot_blobs b ON b.snapshot_id = s.id "
    "WHERE s.id = ANY($1) AND ($2 = '' OR s.model_fingerprint = $2) "
    "AND s.n_tokens > 0 AND octet_length(b.tokens) = 4 * s.n_tokens "
    "AND b.tokens = substring($3 FROM 1 FOR octet_length(b.tokens))";

namespace {

// Appends the verified rows of `rows` to `out` in the order of `ids`, up to `limit`.
void take_verified(const PgResult& rows, const std::vector<int64_t>& ids, size_t n_query, size_t limit,
                   std::vector<SnapshotInfo>& out) {
  std::map<int64_t, int> row_of;
  for (int r = 0; r < rows.rows(); ++r) row_of[rows.i64(r, 0)] = r;
  for (int64_t id : ids) {
    auto it = row_of.find(id);
    if (it == row_of.end() || out.size() >= limit) continue;
    SnapshotInfo info = pg_info_from_row(rows, it->second);
    if (info.n_tokens > static_cast<int64_t>(n_query)) continue;
    out.push_back(std::move(info));
  }
}

}  // namespace

// One REPEATABLE READ READ ONLY transaction, so the probes and the token checks
// see one moment. Usually every candidate verifies, so the first token check
// asks for as many as are wanted and carries the COMMIT: with BEGIN sent with
// the band query, a query is 2 or 3 round trips. When that check leaves the
// answer short (candidates of another model, a hash collision) and more
// candidates remain, the query runs again the slow way (one statement per
// round trip, as many token checks as needed).
Result<std::vector<SnapshotInfo>> PgCatalog::find_prefix(std::span<const int32_t> query,
                                                         const std::string& model_fingerprint, size_t limit) {
  std::vector<SnapshotInfo> out;
  if (query.empty() || limit == 0) return out;
  if (const PrefixKeying* k = keying()) {
    KV_ASSIGN_OR_RETURN(auto candidates, prefix_candidates(query, /*begin=*/false));
    return sealed_prefix_matches(*this, *k, std::move(candidates), query, model_fingerprint, limit);
  }
  std::vector<std::byte> q = tokens_le(query);
  auto batch_ids = [&](const std::vector<std::pair<int64_t, int64_t>>& candidates, size_t next) {
    size_t batch = std::min(candidates.size() - next, limit - out.size());
    std::vector<int64_t> ids;
    for (size_t i = next; i < next + batch; ++i) ids.push_back(candidates[i].second);
    return ids;
  };
  bool complete = false;
  Status fast = [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto candidates, prefix_candidates(query, /*begin=*/true));
    std::sort(candidates.begin(), candidates.end(), std::greater<>());  // longest, then highest id
    std::vector<int64_t> ids = batch_ids(candidates, 0);
    PgParams p;
    p.i64_array(ids).text(model_fingerprint).bytes(q);
    const PgConn::Command cmds[] = {{kVerify, &p}, {"COMMIT", nullptr}};
    KV_ASSIGN_OR_RETURN(std::vector<PgResult> r, conn_->pipeline(cmds));
    conn_->set_in_transaction(false);
    if (r.empty()) return Status::IOError(where_ + ": the token check returned no result");
    take_verified(r[0], ids, query.size(), limit, out);
    complete = out.size() >= limit || ids.size() == candidates.size();
    return Status::OK();
  }();
  if (!fast.ok()) {
    conn_->abandon_transaction();
    return fast;
  }
  if (complete) return out;
  Status s = conn_->transaction(Iso::kRepeatableReadOnly, [&]() -> Status {
    out.clear();
    KV_ASSIGN_OR_RETURN(auto candidates, prefix_candidates(query, /*begin=*/false));
    std::sort(candidates.begin(), candidates.end(), std::greater<>());
    for (size_t next = 0; next < candidates.size() && out.size() < limit;) {
      std::vector<int64_t> ids = batch_ids(candidates, next);
      next += ids.size();
      KV_ASSIGN_OR_RETURN(PgResult rows, conn_->exec(kVerify, PgParams().i64_array(ids).text(model_fingerprint).bytes(q)));
      take_verified(rows, ids, query.size(), limit, out);
    }
    return Status::OK();
  });
  if (!s.ok()) return s;
  return out;
}

// ---------------------------------------------------------------- gc, stats, checks

Result<GcCandidates> PgCatalog::gc_candidates(const std::vector<ChunkHash>& on_disk) {
  GcCandidates out;
  Status s = conn_->transaction(Iso::kRepeatableReadOnly, [&]() -> Status {
    out = {};
    {
      KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT sha256, pack IS NOT NULL FROM chunks WHERE refcount = 0"));
      for (int r = 0; r < q.rows(); ++r) {
        ChunkHash h;
        if (!hash_from(q.bytes(r, 0), h)) continue;
        out.unreferenced.push_back(h);
        if (q.boolean(r, 1)) out.unreferenced_packed.push_back(h);
      }
    }
    {
      KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT DISTINCT pack FROM chunks WHERE refcount = 0 AND pack IS NOT NULL"));
      for (int r = 0; r < q.rows(); ++r) out.packs_losing_chunks.push_back(q.text(r, 0));
    }
    for (size_t i = 0; i < on_disk.size(); i += kSlice) {
      std::vector<std::span<const std::byte>> slice;
      for (size_t k = i; k < std::min(on_disk.size(), i + kSlice); ++k) slice.push_back(span_of(on_disk[k]));
      KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT u.h FROM unnest($1) WITH ORDINALITY AS u(h, i) "
                                                  "WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.sha256 = u.h) "
                                                  "ORDER BY u.i",
                                                  PgParams().bytes_array(slice)));
      for (int r = 0; r < q.rows(); ++r) {
        ChunkHash h;
        if (hash_from(q.bytes(r, 0), h)) out.orphans.push_back(h);
      }
    }
    return Status::OK();
  });
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<ChunkHash>> PgCatalog::forget_unreferenced(const std::vector<ChunkHash>& hashes) {
  std::set<ChunkHash> deleted;
  Status s = conn_->transaction(Iso::kReadCommitted, [&]() -> Status {
    deleted.clear();
    for (size_t i = 0; i < hashes.size(); i += kSlice) {
      std::vector<std::span<const std::byte>> slice;
      for (size_t k = i; k < std::min(hashes.size(), i + kSlice); ++k) slice.push_back(span_of(hashes[k]));
      KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("DELETE FROM chunks WHERE sha256 = ANY($1) AND refcount = 0 "
                                                  "RETURNING sha256",
                                                  PgParams().bytes_array(slice)));
      for (int r = 0; r < q.rows(); ++r) {
        ChunkHash h;
        if (hash_from(q.bytes(r, 0), h)) deleted.insert(h);
      }
    }
    return Status::OK();
  });
  if (!s.ok()) return s;
  std::vector<ChunkHash> gone;
  for (const ChunkHash& h : hashes) {
    if (deleted.erase(h)) gone.push_back(h);
  }
  return gone;
}

Result<std::vector<std::string>> PgCatalog::unused_packs(const std::vector<std::string>& packs) {
  std::vector<std::string> out;
  for (size_t i = 0; i < packs.size(); i += kSlice) {
    std::vector<std::optional<std::string>> slice(packs.begin() + i, packs.begin() + std::min(packs.size(), i + kSlice));
    KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT u.p FROM unnest($1) WITH ORDINALITY AS u(p, i) "
                                                "WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.pack = u.p) "
                                                "ORDER BY u.i",
                                                PgParams().text_array(slice)));
    for (int r = 0; r < q.rows(); ++r) out.push_back(q.text(r, 0));
  }
  return out;
}

Result<std::map<std::string, uint64_t>> PgCatalog::live_packs() {
  KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT pack, COUNT(*) FROM chunks WHERE refcount > 0 AND pack IS NOT NULL "
                                              "GROUP BY pack"));
  std::map<std::string, uint64_t> out;
  for (int r = 0; r < q.rows(); ++r) out[q.text(r, 0)] = static_cast<uint64_t>(q.i64(r, 1));
  return out;
}

Result<std::vector<PackUsage>> PgCatalog::pack_usage(const std::vector<std::string>& packs) {
  std::vector<PackUsage> out;
  for (size_t i = 0; i < packs.size(); i += kSlice) {
    std::vector<std::optional<std::string>> slice(packs.begin() + i, packs.begin() + std::min(packs.size(), i + kSlice));
    KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec("SELECT COUNT(c.pack), COALESCE(SUM(c.stored_size), 0)::bigint, "
                                                "COALESCE(MAX(c.pack_offset + c.stored_size), 0)::bigint "
                                                "FROM unnest($1) WITH ORDINALITY AS u(p, i) "
                                                "LEFT JOIN chunks c ON c.pack = u.p AND c.refcount > 0 GROUP BY u.i ORDER BY u.i",
                                                PgParams().text_array(slice)));
    if (static_cast<size_t>(q.rows()) != slice.size())
      return Status::Corruption(where_ + ": the pack usage query answered " + std::to_string(q.rows()) + " rows for " +
                                std::to_string(slice.size()) + " packs");
    for (int r = 0; r < q.rows(); ++r)
      out.push_back({static_cast<uint64_t>(q.i64(r, 0)), static_cast<uint64_t>(q.i64(r, 1)), static_cast<uint64_t>(q.i64(r, 2))});
  }
  return out;
}

Result<CatalogStats> PgCatalog::stats() {
  // One statement: one consistent view.
  KV_ASSIGN_OR_RETURN(
      PgResult q,
      conn_->exec("SELECT (SELECT COUNT(*) FROM snapshots), (SELECT COALESCE(SUM(raw_bytes), 0)::bigint FROM snapshots), "
                  "COUNT(*) FILTER (WHERE refcount > 0), COUNT(*) FILTER (WHERE refcount = 0), "
                  "COALESCE(SUM(raw_size * refcount), 0)::bigint, "
                  "COALESCE(SUM(stored_size) FILTER (WHERE refcount > 0), 0)::bigint, "
                  "(SELECT COALESCE(SUM(octet_length(manifest)), 0)::bigint FROM snapshot_blobs) FROM chunks"));
  CatalogStats st;
  if (q.rows() == 1) {
    st.snapshots = q.i64(0, 0);
    st.raw_bytes = static_cast<uint64_t>(q.i64(0, 1));
    st.chunks = q.i64(0, 2);
    st.unreferenced_chunks = q.i64(0, 3);
    st.chunk_raw_bytes = static_cast<uint64_t>(q.i64(0, 4));
    st.stored_bytes = static_cast<uint64_t>(q.i64(0, 5));
    st.manifest_bytes = static_cast<uint64_t>(q.i64(0, 6));
  }
  st.dedup_ratio = st.stored_bytes ? double(st.chunk_raw_bytes) / double(st.stored_bytes) : 0.0;
  return st;
}

Result<std::vector<std::string>> PgCatalog::integrity_check() {
  std::vector<std::string> problems;
  auto collect = [&](const char* sql, auto describe) -> Status {
    KV_ASSIGN_OR_RETURN(PgResult q, conn_->exec(sql));
    for (int r = 0; r < q.rows(); ++r) problems.push_back(describe(q, r));
    return Status::OK();
  };
  Status s = conn_->transaction(Iso::kRepeatableReadOnly, [&]() -> Status {
    problems.clear();
    KV_RETURN_IF_ERROR(collect(
        "SELECT encode(c.sha256, 'hex'), c.refcount, COUNT(sc.sha256) FROM chunks c "
        "LEFT JOIN snapshot_chunks sc ON sc.sha256 = c.sha256 GROUP BY c.sha256 HAVING c.refcount <> COUNT(sc.sha256)",
        [](const PgResult& q, int r) {
          return "chunk " + q.text(r, 0) + " has refcount " + std::to_string(q.i64(r, 1)) + " but " +
                 std::to_string(q.i64(r, 2)) + " uses";
        }));
    KV_RETURN_IF_ERROR(collect(
        "SELECT s.id, s.n_chunks, (SELECT COUNT(*) FROM snapshot_chunks sc WHERE sc.snapshot_id = s.id) AS n "
        "FROM snapshots s WHERE s.n_chunks <> (SELECT COUNT(*) FROM snapshot_chunks sc WHERE sc.snapshot_id = s.id)",
        [](const PgResult& q, int r) {
          return "snapshot " + std::to_string(q.i64(r, 0)) + " says " + std::to_string(q.i64(r, 1)) +
                 " chunks but lists " + std::to_string(q.i64(r, 2));
        }));
    return collect(
        "SELECT s.id FROM snapshots s LEFT JOIN snapshot_blobs b ON b.snapshot_id = s.id "
        "WHERE b.snapshot_id IS NULL OR octet_length(b.tokens) <> " KV_TOKENS_BYTES_SQL,
        [](const PgResult& q, int r) { return "snapshot " + std::to_string(q.i64(r, 0)) + " has no or wrong-sized tokens"; });
  });
  if (!s.ok()) return s;
  return problems;
}

}  // namespace kvsnap
