// The store-level cap scenario, over any store (a directory store in
// store_test.cc, a PostgreSQL catalog in tests/postgres/pg_store_test.cc):
// TTLs, pins, LRU by last restore, a cap no store meets, then a whole store.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "format/state_prefix.h"
#include "store/store.h"
#include "test_files.h"

namespace kvsnap::test {

inline std::filesystem::path cap_fixtures() { return std::filesystem::path(KVSNAP_SOURCE_DIR) / "fixtures"; }

// A state file read into memory and parsed (no model): the bytes, the file over them, its layout.
struct LoadedState {
  std::vector<std::byte> bytes;
  std::unique_ptr<MemoryFile> file;
  StateFile state;
};

inline LoadedState load_state(const std::filesystem::path& p) {
  LoadedState l;
  l.bytes = slurp(p);
  l.file = std::make_unique<MemoryFile>(p.filename().string(), std::span<const std::byte>(l.bytes));
  auto st = parse_for_model(*l.file, {}, nullptr);
  EXPECT_TRUE(st.ok()) << p << ": " << st.status().ToString();
  if (st.ok()) l.state = std::move(st).value();
  return l;
}

inline void cap_enforced_with_pins_kept(Store& store) {
  std::string now = "2026-01-01T00:00:00.000Z";
  store.set_clock([&] { return now; });
  auto tick = [&](int sec) { now = *add_seconds(now, sec); };
  LoadedState big = load_state(cap_fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  VectorSink cut;
  ASSERT_TRUE(write_prefix(big.state, *big.file, 64, cut).ok());
  MemoryFile cut_file("cut.slot", std::span<const std::byte>(cut.bytes));
  auto cut_state = parse_state(cut_file);
  ASSERT_TRUE(cut_state.ok());
  LoadedState other = load_state(cap_fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  LoadedState third = load_state(cap_fixtures() / "v0.5.0/hd64-bf16-bf16-faoff.slot");

  SaveRequest req;
  req.cells_per_chunk = 16;
  SaveRequest pin = req;
  pin.pin = true;
  auto prefix = store.save(cut_file, *cut_state, pin);  // pinned; its chunks are shared with "full"
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  tick(1);
  auto full = store.save(*big.file, big.state, req);
  ASSERT_TRUE(full.ok());
  tick(1);
  SaveRequest ttl = req;
  ttl.ttl_seconds = 60;
  auto brief = store.save(*other.file, other.state, ttl);
  ASSERT_TRUE(brief.ok());
  EXPECT_EQ(brief->info.expires_at, "2026-01-01T00:01:02.000Z");
  tick(1);
  // A restore makes "full" the most recently used.
  VectorSink sink;
  ASSERT_TRUE(store.restore(std::to_string(full->info.id), {}, sink).ok());
  EXPECT_EQ(store.catalog().get_info(full->info.id)->last_restored, now);

  // Before expiry, a dry run under a cap that one eviction meets takes the least recently used: "brief".
  auto stats = store.catalog().stats();
  ASSERT_TRUE(stats.ok());
  auto dry = store.evict({stats->stored_bytes - 1, std::nullopt, "", std::nullopt}, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  ASSERT_EQ(dry->plan.victims.size(), 1u);
  EXPECT_EQ(dry->plan.victims[0].info.id, brief->info.id);
  EXPECT_EQ(store.catalog().list()->size(), 3u) << "a dry run removes nothing";

  // After expiry, with no cap, gc's eviction takes the expired one only.
  tick(120);
  auto expired = store.evict({}, /*dry_run=*/false);
  ASSERT_TRUE(expired.ok());
  ASSERT_EQ(expired->plan.victims.size(), 1u);
  EXPECT_TRUE(expired->plan.victims[0].expired);

  // A cap no store meets: saving "third" evicts "full" but keeps the pinned prefix and itself.
  store.set_caps({uint64_t{1}, {}});
  auto last = store.save(*third.file, third.state, req);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_EQ(last->evicted.size(), 1u);
  EXPECT_EQ(last->evicted[0].info.id, full->info.id);
  ASSERT_EQ(last->cap_warnings.size(), 1u);
  EXPECT_NE(last->cap_warnings[0].find("over its cap of 1"), std::string::npos) << last->cap_warnings[0];

  // What is left is whole: verify is clean and every snapshot restores byte for byte.
  auto v = store.verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
  EXPECT_EQ(v->snapshots, 2u);
  VectorSink a, b;
  ASSERT_TRUE(store.restore(std::to_string(prefix->info.id), {}, a).ok());
  EXPECT_EQ(a.bytes, cut.bytes);
  ASSERT_TRUE(store.restore(std::to_string(last->info.id), {}, b).ok());
  EXPECT_EQ(b.bytes, third.bytes);
  auto gc = store.gc(true);
  ASSERT_TRUE(gc.ok());
  auto again = store.verify({});
  EXPECT_TRUE(again.ok() && again->problems.empty());
}

}  // namespace kvsnap::test
