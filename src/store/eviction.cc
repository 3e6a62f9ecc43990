#include "store/eviction.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <unordered_map>

namespace kvsnap {

namespace {

struct HashLess {
  bool operator()(const ChunkHash& a, const ChunkHash& b) const { return a.bytes < b.bytes; }
};

// A chunk as the plan sees it while victims are taken.
struct ChunkCount {
  uint64_t stored_size = 0;
  int64_t in_scope = 0;  // uses by snapshots of the scope still present
  int64_t refcount = 0;  // uses by any snapshot still present
};

// The order victims are taken in: expired first (by expiry), then by last use.
std::vector<const SnapshotInfo*> eviction_order(const std::vector<SnapshotInfo>& snaps, const EvictionRequest& req) {
  std::vector<const SnapshotInfo*> expired, rest;
  for (const SnapshotInfo& s : snaps) {
    if (s.pinned || (req.keep && *req.keep == s.id)) continue;
    const bool passed = expiry_passed(s.expires_at, req.now);
    // A save's plan leaves the snapshots saved after its own (a concurrent save's, which left
    // this one alone for the same reason), so two saves never evict each other's.
    if (req.keep && s.id > *req.keep && !passed) continue;
    (passed ? expired : rest).push_back(&s);
  }
  std::sort(expired.begin(), expired.end(), [](const SnapshotInfo* a, const SnapshotInfo* b) {
    return std::tie(*a->expires_at, a->id) < std::tie(*b->expires_at, b->id);
  });
  auto last_use = [](const SnapshotInfo* s) -> const std::string& { return s->last_restored ? *s->last_restored : s->created; };
  std::sort(rest.begin(), rest.end(), [&](const SnapshotInfo* a, const SnapshotInfo* b) {
    return std::tie(last_use(a), a->id) < std::tie(last_use(b), b->id);
  });
  expired.insert(expired.end(), rest.begin(), rest.end());
  return expired;
}

}  // namespace

Result<EvictionPlan> plan_eviction(Catalog& catalog, const EvictionRequest& req) {
  if (!req.max_bytes && !req.tenant) {
    // Without a cap only expired snapshots go, and most gc runs find none:
    // then the snapshot rows and the chunk table's sums are all there is to
    // read, not every chunk use (a store-wide scope's bytes are the stored
    // sizes of the chunks in use).
    KV_ASSIGN_OR_RETURN(std::vector<int64_t> expired, catalog.expired_snapshots(req.now));
    if (req.keep) std::erase(expired, *req.keep);
    if (expired.empty()) {
      KV_ASSIGN_OR_RETURN(CatalogStats st, catalog.stats());
      EvictionPlan plan;
      plan.bytes_before = plan.bytes_after = st.stored_bytes;
      return plan;
    }
  }
  KV_ASSIGN_OR_RETURN(EvictionScope scope, catalog.eviction_scope(req.tenant));
  std::map<ChunkHash, ChunkCount, HashLess> chunks;
  std::unordered_map<int64_t, std::vector<const EvictionUse*>> uses_of;
  for (const EvictionUse& u : scope.uses) {
    ChunkCount& c = chunks[u.sha256];
    c.stored_size = u.stored_size;
    c.refcount = u.refcount;
    c.in_scope += u.uses;
    uses_of[u.snapshot_id].push_back(&u);
  }
  EvictionPlan plan;
  for (const auto& [h, c] : chunks) plan.bytes_before += c.stored_size;
  plan.bytes_after = plan.bytes_before;

  for (const SnapshotInfo* s : eviction_order(scope.snapshots, req)) {
    bool expired = expiry_passed(s->expires_at, req.now);
    if (!expired && (!req.max_bytes || plan.bytes_after <= *req.max_bytes)) break;
    EvictionVictim v{*s, expired, 0};
    // Recomputed per victim: a chunk stops counting only when its last user goes.
    for (const EvictionUse* u : uses_of[s->id]) {
      ChunkCount& c = chunks[u->sha256];
      c.in_scope -= u->uses;
      c.refcount -= u->uses;
      if (c.in_scope == 0) plan.bytes_after -= c.stored_size;
      if (c.refcount == 0) v.freed_bytes += c.stored_size;
    }
    plan.freed_bytes += v.freed_bytes;
    plan.victims.push_back(std::move(v));
  }
  plan.cap_met = !req.max_bytes || plan.bytes_after <= *req.max_bytes;
  return plan;
}

std::string utc_iso8601(int64_t unix_ms) {
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[80];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(unix_ms % 1000));
  return buf;
}

std::string utc_now_iso8601() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return utc_iso8601(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
}

Result<std::string> add_seconds(const std::string& iso, int64_t seconds) {
  std::tm tm{};
  int ms = 0;
  char z = 0;
  if (std::sscanf(iso.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &ms, &z) != 8 || z != 'Z') {
    return Status::InvalidArgument("'" + iso + "' is not an ISO 8601 UTC time like 2026-01-02T03:04:05.678Z");
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const int64_t t = static_cast<int64_t>(timegm(&tm));
  constexpr int64_t kLastSecond = 253402300799;  // 9999-12-31T23:59:59Z
  if (seconds > kLastSecond - t || seconds < -t) {
    return Status::InvalidArgument(iso + " plus " + std::to_string(seconds) + " s is not a time between 1970 and the end of 9999");
  }
  return utc_iso8601((t + seconds) * 1000 + ms);
}

bool expiry_passed(const std::optional<std::string>& expires_at, const std::string& now) {
  return expires_at && expires_at->size() == now.size() && *expires_at <= now;
}

namespace {

// "<digits><unit>" with a unit of `units`: the number times the unit's factor (shift: a power of two).
template <class Apply>
Result<uint64_t> number_with_unit(const std::string& text, const std::map<std::string, uint64_t>& units, Apply apply,
                                  const std::string& usage) {
  size_t n = 0;
  while (n < text.size() && text[n] >= '0' && text[n] <= '9') ++n;
  auto it = units.find(text.substr(n));
  if (n == 0 || n > 12 || it == units.end()) return Status::InvalidArgument("'" + text + "' is not " + usage);
  return apply(std::stoull(text.substr(0, n)), it->second);
}

}  // namespace

Result<int64_t> parse_duration(const std::string& text) {
  static const std::map<std::string, uint64_t> kUnits = {{"", 1}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}, {"w", 604800}};
  const std::string usage = "a duration: use a number and a unit, s, m, h, d or w (e.g. 12h, 7d)";
  KV_ASSIGN_OR_RETURN(uint64_t v, number_with_unit(text, kUnits, [](uint64_t n, uint64_t f) { return n * f; }, usage));
  if (v == 0) return Status::InvalidArgument("'" + text + "' is not " + usage);
  if (v > uint64_t(kMaxDurationSeconds)) {
    return Status::InvalidArgument("'" + text + "' is more than 1000 years; to keep a snapshot whatever the caps "
                                   "and expiries, pin it (kvsnap pin)");
  }
  return static_cast<int64_t>(v);
}

Result<uint64_t> parse_byte_size(const std::string& text) {
  static const std::map<std::string, uint64_t> kShift = {
      {"", 0},   {"B", 0},    {"K", 10},   {"M", 20},  {"G", 30},  {"T", 40},  {"KB", 10}, {"MB", 20},
      {"GB", 30}, {"TB", 40}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
  const std::string usage = "a size: use bytes or a number with K, M, G or T (e.g. 500M, 20G)";
  // Saturates instead of wrapping, then refuses: a cap of more than 2^63 bytes is a typo.
  KV_ASSIGN_OR_RETURN(uint64_t v, number_with_unit(text, kShift, [](uint64_t n, uint64_t shift) {
    return n > (UINT64_MAX >> (shift + 1)) ? UINT64_MAX : n << shift;
  }, usage));
  if (v == UINT64_MAX) return Status::InvalidArgument("'" + text + "' is more bytes than any store holds");
  return v;
}

}  // namespace kvsnap
