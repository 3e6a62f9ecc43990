// Caps and eviction: which snapshots go when a store (or one tenant) holds
// more bytes than its cap, and the times and sizes the commands parse.
//
// Promises of plan_eviction():
//   - Pinned snapshots and `keep` (the snapshot a save just added) are never
//     victims, whatever the cap; nor, unless expired, those with a higher id
//     than `keep` (saved after it: two saves committed at once never evict
//     each other's, and the later one's survives).
//   - Expired snapshots (expiry_passed: expires_at <= now) are always victims (oldest expiry
//     first), cap or no cap; then, while the bytes in scope exceed the cap,
//     the least recently restored (never restored: by created; ties by id).
//   - Accounting is exact after dedup. The bytes in scope are the stored sizes
//     of the distinct chunks its snapshots use (a chunk counted once however
//     many snapshots use it). Victims are chosen one at a time and the
//     chunks' use counts are recomputed after each, so a snapshot whose chunks
//     are all shared lowers the bytes by nothing and the next one is taken.
//     For the whole store that equals what removing them frees (chunks whose
//     refcount reaches 0). A tenant (the kTenantTag tag) is charged for every
//     chunk its snapshots use, shared with other tenants or not; evicting its
//     snapshots lowers its charge when none of its remaining snapshots uses a
//     chunk, and frees storage only when no snapshot at all does (freed_bytes).
//   - Only snapshots in scope are victims: a tenant's cap never evicts another
//     tenant's (or an untagged) snapshot.
//   - The plan is computed from one consistent read (Catalog::eviction_scope);
//     Store::evict removes the victims with Catalog::remove_snapshot_if (which
//     keeps every chunk another snapshot still uses), and keeps one pinned, or
//     an expired one given a later expiry, since the plan was read: checked in
//     the removal's own transaction, so a pin another host commits is never
//     lost to a removal already planned.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "store/catalog.h"

namespace kvsnap {

struct EvictionRequest {
  std::optional<uint64_t> max_bytes;  // unset: only expired snapshots go
  std::optional<std::string> tenant;  // unset: the whole store
  std::string now;                    // ISO 8601 UTC (utc_iso8601); tests pass their own
  std::optional<int64_t> keep;        // never a victim (a save's new snapshot), nor any later one unexpired
  // The collection after the removals (Store::evict): GcOptions::compact_dead_percent and
  // GcOptions::progress (an error stops it, Ctrl-C).
  int compact_dead_percent = GcOptions::kDefaultCompactDeadPercent;
  std::function<Status(const GcProgress&)> gc_progress = nullptr;
};

struct EvictionVictim {
  SnapshotInfo info;
  bool expired = false;      // else chosen as least recently restored
  uint64_t freed_bytes = 0;  // storage its removal frees, after the victims before it
};

struct EvictionPlan {
  uint64_t bytes_before = 0;  // in scope, after dedup
  uint64_t bytes_after = 0;   // once the victims are gone
  uint64_t freed_bytes = 0;   // storage freed in all (== before - after for the whole store)
  bool cap_met = true;        // false: pinned (and keep, and later) snapshots alone exceed the cap
  std::vector<EvictionVictim> victims;
};

Result<EvictionPlan> plan_eviction(Catalog& catalog, const EvictionRequest& req);

// ISO 8601 UTC with milliseconds ("2026-01-02T03:04:05.678Z"), the form of
// SnapshotInfo's times, which compare as strings.
std::string utc_iso8601(int64_t unix_ms);
std::string utc_now_iso8601();
// Adds `seconds` to such a time; kInvalidArgument when `iso` is not one, or when the sum is past
// 9999-12-31T23:59:59.999Z (a later time would not fit the form, and a 5-digit year compares
// below every 4-digit one).
Result<std::string> add_seconds(const std::string& iso, int64_t seconds);
// Whether an expiry has passed at `now` (both in the form above). An expiry not in that form (a
// year past 9999 that kvsnap wrote before add_seconds refused it) has not: it never expires.
bool expiry_passed(const std::optional<std::string>& expires_at, const std::string& now);
// "90s", "45m", "12h", "7d", "2w" (a bare number is seconds) -> seconds in [1, kMaxDurationSeconds].
inline constexpr int64_t kMaxDurationSeconds = int64_t(1000) * 36525 * 864;  // 1,000 years of 365.25 days
Result<int64_t> parse_duration(const std::string& text);
// "1048576", "512K", "100M", "2G", "1T" (binary multiples, optional "iB"/"B") -> bytes.
Result<uint64_t> parse_byte_size(const std::string& text);

}  // namespace kvsnap
