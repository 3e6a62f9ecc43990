// A store's eviction against what other processes do between its steps, and a save whose caps
// cannot be kept: through a catalog that forwards to a real SQLite one with hooks
// (forwarding_catalog.h).
#include <gtest/gtest.h>

#include <memory>

#include "base/io.h"
#include "store/catalog.h"
#include "store/local_blob_store.h"
#include "store/store.h"
#include "store/forwarding_catalog.h"
#include "store/store_caps_scenario.h"
#include "temp_dir.h"

namespace kvsnap {
namespace {

using test::ForwardingCatalog;

struct HookedStore {
  std::unique_ptr<Store> store;
  ForwardingCatalog* catalog = nullptr;  // owned by the store
};

HookedStore open_hooked(const std::string& dir, StoreCaps caps = {}) {
  HookedStore h;
  auto inner = Catalog::open(dir + "/catalog.sqlite");
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  if (!inner.ok()) return h;
  auto forwarding = std::make_unique<ForwardingCatalog>(std::move(inner).value());
  h.catalog = forwarding.get();
  StoreParts parts;
  auto blobs = LocalBlobStore::open(posix_io(), dir);
  EXPECT_TRUE(blobs.ok()) << blobs.status().ToString();
  if (!blobs.ok()) return h;
  parts.blobs = std::move(blobs).value();
  parts.catalog = std::move(forwarding);
  parts.local_dir = dir;
  parts.caps = std::move(caps);
  auto opened = Store::open(posix_io(), std::move(parts));
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  if (opened.ok()) h.store = std::move(opened).value();
  return h;
}

// Two snapshots of different fixtures (few shared chunks), "older" saved and restored first.
struct TwoSaved {
  int64_t older = 0, newer = 0;
};

TwoSaved save_two(Store& store, std::string& now) {
  TwoSaved t;
  test::LoadedState a = test::load_state(test::cap_fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  test::LoadedState b = test::load_state(test::cap_fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto first = store.save(*a.file, a.state, req);
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  now = "2026-01-01T00:00:01.000Z";
  auto second = store.save(*b.file, b.state, req);
  EXPECT_TRUE(second.ok()) << second.status().ToString();
  if (first.ok()) t.older = first->info.id;
  if (second.ok()) t.newer = second->info.id;
  return t;
}

// A review's finding: a snapshot the plan chose as least recently restored, restored by another
// process before its removal, was evicted anyway (then the most recently used), and the eviction's
// figures counted every planned victim as gone, a victim kept meanwhile included, so that a cap
// still exceeded read as met. The restored victim is kept, and the figures are of what is there.
TEST(StoreEvictionRace, AVictimRestoredSinceThePlanIsKeptAndTheFiguresSaySo) {
  test::TempDir dir("kvsnap-evict-race");
  HookedStore h = open_hooked(dir.path());
  ASSERT_TRUE(h.store);
  std::string now = "2026-01-01T00:00:00.000Z";
  h.store->set_clock([&] { return now; });
  TwoSaved two = save_two(*h.store, now);
  ASSERT_NE(two.older, 0);
  auto before = h.catalog->stats();
  ASSERT_TRUE(before.ok());

  int removals = 0;
  h.catalog->before_remove = [&](int64_t id) {
    if (removals++ == 0) return h.catalog->inner().mark_restored(id, "2026-01-01T00:00:05.000Z");
    return Status::OK();
  };
  now = "2026-01-01T00:00:04.000Z";
  auto e = h.store->evict({before->stored_bytes - 1, std::nullopt, "", std::nullopt}, /*dry_run=*/false);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(removals, 1) << "the plan had one victim";
  EXPECT_TRUE(h.catalog->get_info(two.older).ok()) << "the victim restored since the plan was evicted";
  EXPECT_TRUE(e->plan.victims.empty()) << "a kept victim is listed as evicted";
  EXPECT_FALSE(e->plan.cap_met) << "nothing was removed: the cap is not met";
  EXPECT_EQ(e->plan.bytes_after, before->stored_bytes);
  EXPECT_EQ(e->plan.freed_bytes, 0u);

  // Restored no more since a new plan: it goes (the newer one was restored later).
  h.catalog->before_remove = nullptr;
  ASSERT_TRUE(h.catalog->mark_restored(two.newer, "2026-01-01T00:00:06.000Z").ok());
  auto again = h.store->evict({before->stored_bytes - 1, std::nullopt, "", std::nullopt}, /*dry_run=*/false);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->plan.victims.size(), 1u);
  EXPECT_EQ(again->plan.victims[0].info.id, two.older);
  EXPECT_TRUE(again->plan.cap_met);
  EXPECT_FALSE(h.catalog->get_info(two.older).ok());
}

// A save's snapshot is durable before its caps are kept; a catalog that then fails the eviction's
// read makes the save a success with a warning, not a failure (serve's persister would count the
// snapshot unsaved and save it again).
TEST(StoreEvictionRace, ASaveWhoseCapsCannotBeKeptSucceedsWithAWarning) {
  test::TempDir dir("kvsnap-evict-race");
  StoreCaps caps;
  caps.max_bytes = 1;
  HookedStore h = open_hooked(dir.path(), caps);
  ASSERT_TRUE(h.store);
  h.catalog->before_eviction_scope = [] { return Status::IOError("the catalog's disk is gone"); };
  test::LoadedState a = test::load_state(test::cap_fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  auto saved = h.store->save(*a.file, a.state, {});
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_TRUE(h.catalog->get_info(saved->info.id).ok());
  ASSERT_EQ(saved->cap_warnings.size(), 1u);
  EXPECT_NE(saved->cap_warnings[0].find("keeping the caps stopped"), std::string::npos) << saved->cap_warnings[0];
  EXPECT_NE(saved->cap_warnings[0].find("the catalog's disk is gone"), std::string::npos) << saved->cap_warnings[0];
  // An interruption still ends the save as interrupted (the snapshot stays).
  h.catalog->before_eviction_scope = [] { return Status::Interrupted("stopped by a signal"); };
  auto stopped = h.store->save(*a.file, a.state, {});
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), Code::kInterrupted) << stopped.status().ToString();
}

}  // namespace
}  // namespace kvsnap
