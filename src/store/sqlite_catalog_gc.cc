// SqliteCatalog: garbage collection, statistics and the integrity check. Lists
// the unreferenced and orphaned chunks and forgets them; collect_garbage()
// (catalog_gc.cc) deletes their blobs.
#include <algorithm>
#include <string>
#include <vector>

#include "store/sqlite_catalog_internal.h"

namespace kvsnap {

using namespace catalog_detail;

// ---------------------------------------------------------------- gc, stats, checks

static bool hash_from_blob(std::span<const std::byte> b, ChunkHash& h) {
  if (b.size() != h.bytes.size()) return false;
  std::memcpy(h.bytes.data(), b.data(), b.size());
  return true;
}

Result<GcCandidates> SqliteCatalog::gc_candidates(const std::vector<ChunkHash>& on_disk) {
  GcCandidates out;
  KV_RETURN_IF_ERROR(exec("BEGIN"));
  Status s = [&]() -> Status {
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT sha256, pack IS NOT NULL FROM chunks WHERE refcount = 0"));
      for (;;) {
        KV_ASSIGN_OR_RETURN(bool row, q.step());
        if (!row) break;
        ChunkHash h;
        if (!hash_from_blob(q.col_blob(0), h)) continue;
        out.unreferenced.push_back(h);
        if (q.col_i64(1)) out.unreferenced_packed.push_back(h);
      }
    }
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT DISTINCT pack FROM chunks WHERE refcount = 0 AND pack IS NOT NULL"));
      for (;;) {
        KV_ASSIGN_OR_RETURN(bool row, q.step());
        if (!row) break;
        out.packs_losing_chunks.push_back(q.col_text(0));
      }
    }
    KV_ASSIGN_OR_RETURN(Stmt probe, stmt("SELECT 1 FROM chunks WHERE sha256 = ?1"));
    for (const ChunkHash& h : on_disk) {
      probe.blob(1, h.bytes);
      KV_ASSIGN_OR_RETURN(bool known, probe.step());
      probe.reset();
      if (!known) out.orphans.push_back(h);
    }
    return Status::OK();
  }();
  rollback();
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<ChunkHash>> SqliteCatalog::forget_unreferenced(const std::vector<ChunkHash>& hashes) {
  std::vector<ChunkHash> gone;
  Status s = write_txn([&]() -> Status {
    gone.clear();
    KV_ASSIGN_OR_RETURN(Stmt del, stmt("DELETE FROM chunks WHERE sha256 = ?1 AND refcount = 0"));
    for (const ChunkHash& h : hashes) {
      del.blob(1, h.bytes);
      KV_RETURN_IF_ERROR(del.run());
      del.reset();
      if (sqlite3_changes(db_) == 1) gone.push_back(h);
    }
    return Status::OK();
  });
  if (!s.ok()) return s;
  return gone;
}

Result<std::vector<std::string>> SqliteCatalog::unused_packs(const std::vector<std::string>& packs) {
  std::vector<std::string> out;
  KV_ASSIGN_OR_RETURN(Stmt probe, stmt("SELECT 1 FROM chunks WHERE pack = ?1 LIMIT 1"));
  for (const std::string& p : packs) {
    probe.text(1, p);
    KV_ASSIGN_OR_RETURN(bool used, probe.step());
    probe.reset();
    if (!used) out.push_back(p);
  }
  return out;
}

Result<std::map<std::string, uint64_t>> SqliteCatalog::live_packs() {
  std::map<std::string, uint64_t> out;
  KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT pack, COUNT(*) FROM chunks WHERE refcount > 0 AND pack IS NOT NULL "
                                   "GROUP BY pack"));
  for (;;) {
    KV_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) break;
    out[q.col_text(0)] = static_cast<uint64_t>(q.col_i64(1));
  }
  return out;
}

Result<std::vector<PackUsage>> SqliteCatalog::pack_usage(const std::vector<std::string>& packs) {
  std::vector<PackUsage> out;
  KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT COUNT(*), COALESCE(SUM(stored_size), 0), "
                                   "COALESCE(MAX(pack_offset + stored_size), 0) FROM chunks "
                                   "WHERE pack = ?1 AND refcount > 0"));
  for (const std::string& p : packs) {
    q.text(1, p);
    KV_ASSIGN_OR_RETURN(bool row, q.step());
    PackUsage u;
    if (row) {
      u.rows = static_cast<uint64_t>(q.col_i64(0));
      u.live_bytes = static_cast<uint64_t>(q.col_i64(1));
      u.end = static_cast<uint64_t>(q.col_i64(2));
    }
    q.reset();
    out.push_back(u);
  }
  return out;
}

Result<std::vector<ChunkUse>> SqliteCatalog::chunks_in_pack(const std::string& pack) {
  KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT sha256, raw_size, stored_size, pack, pack_offset FROM chunks "
                                   "WHERE pack = ?1 ORDER BY pack_offset"));
  q.text(1, pack);
  std::vector<ChunkUse> out;
  for (;;) {
    KV_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) break;
    ChunkUse u;
    if (!read_chunk_row(q, u)) return Status::Corruption(path_ + ": malformed chunk hash in pack " + pack + "'s rows");
    out.push_back(std::move(u));
  }
  return out;
}

Status SqliteCatalog::move_chunks(const std::vector<ChunkMove>& moves, GcLockHold& hold) {
  KV_RETURN_IF_ERROR(hold.still_held().Prefixed(describe() + ": not moving chunks to their new pack"));
  // gc deletes the old packs once this commits: the commit must survive a power loss even in a
  // catalog opened for a bulk load (durable_commits = false).
  if (!options_.durable_commits) {
    KV_RETURN_IF_ERROR(exec("PRAGMA synchronous=FULL"));
    KV_RETURN_IF_ERROR(exec("PRAGMA fullfsync=ON"));
  }
  Status s = write_txn([&]() -> Status {
    KV_ASSIGN_OR_RETURN(Stmt up, stmt("UPDATE chunks SET pack = ?2, pack_offset = ?3 "
                                      "WHERE sha256 = ?1 AND pack = ?4 AND pack_offset = ?5 AND stored_size = ?6"));
    for (const ChunkMove& m : moves) {
      up.blob(1, m.sha256.bytes).text(2, m.to.pack).i64(3, static_cast<int64_t>(m.to.offset));
      up.text(4, m.from.pack).i64(5, static_cast<int64_t>(m.from.offset)).i64(6, static_cast<int64_t>(m.from.size));
      KV_RETURN_IF_ERROR(up.run());
      up.reset();
      if (m.to.size != m.from.size)
        return Status::InvalidArgument(path_ + ": a move of chunk " + m.sha256.hex() + " changes its size");
      if (sqlite3_changes(db_) != 1)
        return Status::Mismatch(path_ + ": chunk " + m.sha256.hex() + " is no longer at offset " +
                                std::to_string(m.from.offset) + " of pack " + m.from.pack +
                                " (changed meanwhile); no chunk was moved");
    }
    return Status::OK();
  });
  if (!options_.durable_commits) {  // back to the bulk load's settings; the move stands either way
    (void)exec("PRAGMA synchronous=NORMAL");
    (void)exec("PRAGMA fullfsync=OFF");
  }
  return s;
}

Result<CatalogStats> SqliteCatalog::stats() {
  CatalogStats st;
  KV_RETURN_IF_ERROR(exec("BEGIN"));
  Status s = [&]() -> Status {
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT COUNT(*), COALESCE(SUM(raw_bytes), 0) FROM snapshots"));
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      if (row) {
        st.snapshots = q.col_i64(0);
        st.raw_bytes = static_cast<uint64_t>(q.col_i64(1));
      }
    }
    {
      KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT COALESCE(SUM(refcount > 0), 0), COALESCE(SUM(refcount = 0), 0), "
                                       "COALESCE(SUM(raw_size * refcount), 0), "
                                       "COALESCE(SUM(CASE WHEN refcount > 0 THEN stored_size ELSE 0 END), 0) FROM chunks"));
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      if (row) {
        st.chunks = q.col_i64(0);
        st.unreferenced_chunks = q.col_i64(1);
        st.chunk_raw_bytes = static_cast<uint64_t>(q.col_i64(2));
        st.stored_bytes = static_cast<uint64_t>(q.col_i64(3));
      }
    }
    KV_ASSIGN_OR_RETURN(Stmt q, stmt("SELECT COALESCE(SUM(length(manifest)), 0) FROM snapshot_blobs"));
    KV_ASSIGN_OR_RETURN(bool row, q.step());
    if (row) st.manifest_bytes = static_cast<uint64_t>(q.col_i64(0));
    return Status::OK();
  }();
  rollback();
  if (!s.ok()) return s;
  st.dedup_ratio = st.stored_bytes ? double(st.chunk_raw_bytes) / double(st.stored_bytes) : 0.0;
  return st;
}

Result<std::vector<std::string>> SqliteCatalog::integrity_check() {
  std::vector<std::string> problems;
  auto collect = [&](const char* sql, auto describe) -> Status {
    KV_ASSIGN_OR_RETURN(Stmt q, stmt_once(sql));
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) return Status::OK();
      std::string p = describe(q);
      if (!p.empty()) problems.push_back(std::move(p));
    }
  };
  KV_RETURN_IF_ERROR(exec("BEGIN"));
  Status s = [&]() -> Status {
    KV_RETURN_IF_ERROR(collect("PRAGMA quick_check", [](const Stmt& q) {
      std::string r = q.col_text(0);
      return r == "ok" ? std::string() : "sqlite: " + r;
    }));
    KV_RETURN_IF_ERROR(collect("PRAGMA foreign_key_check", [](const Stmt& q) {
      return "foreign key: a row of " + q.col_text(0) + " (rowid " + q.col_text(1) + ") names a missing " +
             q.col_text(2) + " row";
    }));
    KV_RETURN_IF_ERROR(collect(
        "SELECT hex(c.sha256), c.refcount, COUNT(sc.sha256) FROM chunks c "
        "LEFT JOIN snapshot_chunks sc ON sc.sha256 = c.sha256 GROUP BY c.sha256 HAVING c.refcount != COUNT(sc.sha256)",
        [](const Stmt& q) {
          return "chunk " + lower(q.col_text(0)) + " has refcount " + std::to_string(q.col_i64(1)) + " but " +
                 std::to_string(q.col_i64(2)) + " uses";
        }));
    KV_RETURN_IF_ERROR(collect(
        "SELECT s.id, s.n_chunks, (SELECT COUNT(*) FROM snapshot_chunks sc WHERE sc.snapshot_id = s.id) AS n "
        "FROM snapshots s WHERE s.n_chunks != n",
        [](const Stmt& q) {
          return "snapshot " + std::to_string(q.col_i64(0)) + " says " + std::to_string(q.col_i64(1)) +
                 " chunks but lists " + std::to_string(q.col_i64(2));
        }));
    return collect(
        "SELECT s.id FROM snapshots s LEFT JOIN snapshot_blobs b ON b.snapshot_id = s.id "
        "WHERE b.snapshot_id IS NULL OR length(b.tokens) != " KV_TOKENS_BYTES_SQL,
        [](const Stmt& q) { return "snapshot " + std::to_string(q.col_i64(0)) + " has no or wrong-sized tokens"; });
  }();
  rollback();
  if (!s.ok()) return s;
  return problems;
}

}  // namespace kvsnap
