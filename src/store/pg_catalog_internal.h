// Internal to src/store/pg_catalog*.cc: the snapshot column list and its reader. Not a public header.
#pragma once

#include <array>
#include <cstring>
#include <span>

#include "store/catalog.h"
#include "store/pg_conn.h"

namespace kvsnap {

// The info columns, then the tag keys and values as two text[] in key order.
#define KV_PG_INFO_COLS                                                                                \
  "s.id, s.uuid, s.name, s.created, s.model_arch, s.model_fingerprint, s.n_tokens, s.k_types, "       \
  "s.v_types, s.v_trans, s.source_format, s.raw_bytes, s.stored_bytes, s.lossy, s.parent_id, "        \
  "s.content_sha256, s.n_chunks, "                                                                     \
  "(SELECT array_agg(t.key ORDER BY t.key) FROM tags t WHERE t.snapshot_id = s.id), "                 \
  "(SELECT array_agg(t.value ORDER BY t.key) FROM tags t WHERE t.snapshot_id = s.id), "                \
  "s.pinned, s.expires_at, s.last_restored, s.tenant, s.master_key_id, s.tenant_key_id"
inline constexpr int kPgInfoCols = 25;

template <size_t N>
std::span<const std::byte> span_of(const std::array<uint8_t, N>& a) {
  return {reinterpret_cast<const std::byte*>(a.data()), N};
}
inline std::span<const std::byte> span_of(const ChunkHash& h) { return span_of(h.bytes); }

// false when `b` is not a 32-byte hash.
inline bool hash_from(std::span<const std::byte> b, ChunkHash& h) {
  if (b.size() != h.bytes.size()) return false;
  std::memcpy(h.bytes.data(), b.data(), b.size());
  return true;
}

inline SnapshotInfo pg_info_from_row(const PgResult& q, int r) {
  SnapshotInfo i;
  i.id = q.i64(r, 0);
  i.uuid = q.text(r, 1);
  if (!q.is_null(r, 2)) i.name = q.text(r, 2);
  i.created = q.text(r, 3);
  i.model_arch = q.text(r, 4);
  i.model_fingerprint = q.text(r, 5);
  i.n_tokens = q.i64(r, 6);
  i.k_types = q.text(r, 7);
  i.v_types = q.text(r, 8);
  i.v_trans = q.boolean(r, 9);
  i.source_format = q.text(r, 10);
  i.raw_bytes = static_cast<uint64_t>(q.i64(r, 11));
  i.stored_bytes = static_cast<uint64_t>(q.i64(r, 12));
  i.lossy = q.text(r, 13);
  if (!q.is_null(r, 14)) i.parent_id = q.i64(r, 14);
  i.content_sha256 = q.text(r, 15);
  i.n_chunks = q.i64(r, 16);
  std::vector<std::string> keys = q.text_array(r, 17), values = q.text_array(r, 18);
  for (size_t k = 0; k < keys.size() && k < values.size(); ++k) i.tags.emplace(std::move(keys[k]), std::move(values[k]));
  i.pinned = q.boolean(r, 19);
  if (!q.is_null(r, 20)) i.expires_at = q.text(r, 20);
  if (!q.is_null(r, 21)) i.last_restored = q.text(r, 21);
  if (!q.is_null(r, 22)) i.tenant = q.text(r, 22);
  i.master_key_id = q.text(r, 23);
  i.tenant_key_id = q.text(r, 24);
  return i;
}

}  // namespace kvsnap
