// Key rotation (docs/store.md, "Key rotation"): Store::rekey seals every snapshot again under a
// new master key, keeping names, tags, pins, TTLs, restore marks, parents and the keyed prefix
// index; restores are byte-identical with the new key and the old key is refused. A rotation
// stopped at any step (the test hook fails there as a crash would) leaves every snapshot
// readable with one of the two keys, and running it again finishes; verify is clean after.
#include <gtest/gtest.h>

#include <cstring>

#include "base/key_source.h"
#include "format/state_prefix.h"
#include "store/crypt_bed.h"
#include "store/read_race_scenario.h"
#include "store/store.h"

namespace kvsnap {
namespace {

using namespace crypt_bed;

// The snapshots every test rotates (ids 1-4): a plain one; tenant alice's 40-token prefix of
// the slot (a TTL) and the whole slot (named, tagged, pinned, restored once; the prefix is its
// parent and shares its first chunks); tenant bob's whole slot.
struct Population {
  Loaded l = load(fixtures() / kSlot);
  std::vector<std::byte> half;      // the 40-token prefix file
  std::unique_ptr<MemoryFile> half_file;
  StateFile half_state;
  std::map<int64_t, std::string> want;  // id -> the bytes a restore gives

  void fill(Bed& b) {
    {
      auto plain = Store::open(posix_io(), StorePaths{b.root.string()});
      ASSERT_TRUE(plain.ok());
      save(**plain, *l.file, l.state, "plain", {});
    }
    VectorSink cut;
    ASSERT_TRUE(write_prefix(l.state, *l.file, 40, cut).ok());
    half = std::move(cut.bytes);
    half_file = std::make_unique<MemoryFile>("half.slot", std::span<const std::byte>(half));
    auto st = parse_for_model(*half_file, {}, nullptr);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    half_state = std::move(st).value();
    auto alice = b.must_open(b.key_a, "alice");
    SaveRequest ttl;
    ttl.ttl_seconds = 3600;
    save(*alice, *half_file, half_state, "half", ttl);
    SaveRequest whole;
    whole.tags = {{"user", "ana"}};
    whole.pin = true;
    const int64_t full_id = save(*alice, *l.file, l.state, "full", whole);
    {
      auto opened = alice->open_snapshot(std::to_string(full_id));
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      ASSERT_EQ((*opened)->reader().manifest().format_version, 4u)
          << "full continues half's cell grid (40 cells, 32 a chunk): rekey re-seals a version-4 manifest";
    }
    restore_all(*alice, std::to_string(full_id));  // last_restored
    auto bob = b.must_open(b.key_a, "bob");
    save(*bob, *l.file, l.state, "bobs", {});
  }
  int64_t save(Store& s, const ReadableFile& f, const StateFile& st, const std::string& name, const SaveRequest& what) {
    SaveRequest req = small_chunks();
    req.name = name;
    req.tags = what.tags;
    req.pin = what.pin;
    req.ttl_seconds = what.ttl_seconds;
    auto r = s.save(f, st, req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return 0;
    const auto& bytes = &f == l.file.get() ? l.bytes : half;
    want[r->info.id] = std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return r->info.id;
  }
};

MasterKey key_of(const fs::path& p) {
  auto k = load_key_file(p.string());
  EXPECT_TRUE(k.ok()) << k.status().ToString();
  return std::move(k).value();
}

// Every snapshot restores byte for byte with the key its row names (either during a rotation).
void expect_every_snapshot_readable(Bed& b, const Population& pop) {
  auto any = b.open("", "", /*keyless_ok=*/true);
  ASSERT_TRUE(any.ok()) << any.status().ToString();
  auto all = (*any)->catalog().list();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), pop.want.size());
  for (const SnapshotInfo& s : *all) {
    Result<std::unique_ptr<Store>> keyed = std::unique_ptr<Store>();
    if (s.tenant) keyed = b.open(s.master_key_id == b.key_id(b.key_a) ? b.key_a : b.key_b, *s.tenant);
    ASSERT_TRUE(keyed.ok()) << "snapshot " << s.id << ": " << keyed.status().ToString();
    Store& store = s.tenant ? **keyed : **any;  // a plain snapshot needs no key
    Status st;
    const std::string back = restore_all(store, std::to_string(s.id), &st);
    ASSERT_TRUE(st.ok()) << "snapshot " << s.id << ": " << st.ToString();
    EXPECT_TRUE(back == pop.want.at(s.id)) << "snapshot " << s.id << " restores other bytes";
  }
}

// The end state: only the new key opens the store, verify is clean, no chunk is left over.
void expect_rotated(Bed& b, const Population& pop, const CatalogStats& before) {
  auto old_key = b.open(b.key_a, "alice");
  ASSERT_FALSE(old_key.ok());
  EXPECT_EQ(old_key.status().code(), Code::kMismatch);
  EXPECT_EQ(old_key.status().message(), "store " + b.root.string() + " is encrypted with key " + b.key_id(b.key_b) +
                                            ", but the key given is " + b.key_id(b.key_a) +
                                            " (wrong key: pass the store's --key-file FILE or --key-command CMD)");
  expect_every_snapshot_readable(b, pop);
  for (const char* tenant : {"alice", "bob"}) {
    auto s = b.must_open(b.key_b, tenant);
    ASSERT_TRUE(s);
    auto v = s->verify({});
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_TRUE(v->problems.empty()) << v->problems[0];
    auto prev = s->catalog().get_meta(kMetaEncryptionPrevious);
    ASSERT_TRUE(prev.ok());
    EXPECT_FALSE(prev->has_value()) << "the rotation is over";
    ASSERT_TRUE(s->gc(/*wait=*/true).ok());
    auto st = s->catalog().stats();
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->chunks, before.chunks) << "dedup within the new key: as many distinct chunks as before";
    EXPECT_EQ(st->stored_bytes, before.stored_bytes);
    EXPECT_EQ(st->unreferenced_chunks, 0);
  }
}

CatalogStats stats_of(Bed& b) {
  auto s = b.must_open(b.key_a);
  auto st = s->catalog().stats();
  EXPECT_TRUE(st.ok());
  return *st;
}

TEST(StoreRekey, RotationKeepsEverythingAndRetiresTheOldKey) {
  Bed b;
  Population pop;
  pop.fill(b);
  const CatalogStats before = stats_of(b);
  auto listed = b.must_open(b.key_a)->catalog().list();
  ASSERT_TRUE(listed.ok());
  std::map<int64_t, SnapshotInfo> old;
  for (const SnapshotInfo& s : *listed) old[s.id] = s;

  auto alice = b.must_open(b.key_a, "alice");
  std::vector<RekeyProgress> seen;
  RekeyOptions ro;
  ro.progress = [&](const RekeyProgress& p) {
    seen.push_back(p);
    return Status::OK();
  };
  auto rep = alice->rekey(key_of(b.key_b), ro);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->rekeyed, 3u);
  EXPECT_EQ(rep->plain, 1u);
  EXPECT_FALSE(rep->resumed);
  EXPECT_EQ(rep->from_key_id, b.key_id(b.key_a));
  EXPECT_EQ(rep->to_key_id, b.key_id(b.key_b));
  EXPECT_GT(rep->gc.unreferenced_deleted, 0u) << "the old key's chunks went";
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().snapshots_done, 3u);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);

  auto after = b.must_open(b.key_b, "alice");
  auto now = after->catalog().list();
  ASSERT_TRUE(now.ok());
  for (const SnapshotInfo& s : *now) {
    const SnapshotInfo& was = old.at(s.id);
    EXPECT_EQ(s.uuid, was.uuid);
    EXPECT_EQ(s.name, was.name);
    EXPECT_EQ(s.tags, was.tags);
    EXPECT_EQ(s.created, was.created);
    EXPECT_EQ(s.pinned, was.pinned);
    EXPECT_EQ(s.expires_at, was.expires_at);
    EXPECT_EQ(s.last_restored, was.last_restored);
    EXPECT_EQ(s.parent_id, was.parent_id);
    EXPECT_EQ(s.tenant, was.tenant);
    if (!s.tenant) continue;
    EXPECT_EQ(s.master_key_id, b.key_id(b.key_b));
    EXPECT_NE(s.tenant_key_id, was.tenant_key_id);
    EXPECT_NE(s.content_sha256, was.content_sha256) << "the content hash is keyed";
  }
  EXPECT_TRUE(old.at(3).pinned && old.at(3).last_restored && old.at(2).expires_at && old.at(3).parent_id == 2)
      << "the population has what the test means to keep";
  // The keyed prefix index works under the new key: find and a save's parent.
  auto found = after->catalog().find_prefix(pop.l.state.tokens.tokens);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0].name, "full");
  EXPECT_EQ((*found)[1].name, "half");
  auto again = after->save(*pop.l.file, pop.l.state, small_chunks());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->chunks_new, 0u) << "dedup against the rotated chunks";
  EXPECT_EQ(again->info.parent_id, 3);
  ASSERT_TRUE(after->remove(std::to_string(again->info.id)).ok());
  expect_rotated(b, pop, before);
}

// Stopped at the k-th step of a rotation (as kill -9 there would leave it), for every k: every
// snapshot restores with one of the two keys, the old key cannot save, the same rekey again
// finishes, and the end state is the clean one.
// A review's finding: the first damaged snapshot stopped the rotation, and every snapshot after it
// stayed sealed under the old key (possibly the leaked one) until it was removed. The others are
// sealed again; the rotation does not finish while the damaged one is there, and does once it is gone.
TEST(StoreRekey, ADamagedSnapshotStopsOnlyItself) {
  Bed b;
  Population pop;
  pop.fill(b);
  int64_t first = 0;  // the damaged one
  {
    auto alice = b.must_open(b.key_a, "alice");
    auto listed = alice->catalog().list();
    ASSERT_TRUE(listed.ok());
    for (const SnapshotInfo& s : *listed) first = std::max(first, s.id);  // bob's, whose chunks no other uses
    auto uses = alice->catalog().chunks_of(first);
    ASSERT_TRUE(uses.ok() && !uses->empty());
    const ChunkUse& u = uses->back();
    ASSERT_FALSE(u.pack.empty());
    const fs::path pack = b.root / "packs" / (u.pack + ".pack");
    auto bytes = slurp(pack);
    bytes[u.pack_offset + kSealedHeaderBytes + 7] ^= std::byte{0x40};
    std::ofstream(pack, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
  }
  auto alice = b.must_open(b.key_a, "alice");
  auto rep = alice->rekey(key_of(b.key_b), {});
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), Code::kCorruption) << rep.status().ToString();
  EXPECT_NE(rep.status().message().find("1 of 3 snapshot(s) could not be sealed again"), std::string::npos)
      << rep.status().ToString();
  auto any = b.open("", "", /*keyless_ok=*/true);
  ASSERT_TRUE(any.ok());
  auto all = (*any)->catalog().list();
  ASSERT_TRUE(all.ok());
  for (const SnapshotInfo& s : *all) {
    if (!s.tenant) continue;
    EXPECT_EQ(s.master_key_id, s.id == first ? b.key_id(b.key_a) : b.key_id(b.key_b)) << "snapshot " << s.id;
  }
  auto bob = b.must_open(b.key_a, "bob");
  auto rm = bob->remove(std::to_string(first));
  ASSERT_TRUE(rm.ok()) << rm.status().ToString();
  auto again = alice->rekey(key_of(b.key_b), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->resumed);
}

TEST(StoreRekey, ACrashAtAnyStepLeavesEverySnapshotReadableAndRekeyAgainFinishes) {
  int steps = 0;
  {
    Bed b;
    Population pop;
    pop.fill(b);
    RekeyOptions ro;
    ro.test_hook = [&](std::string_view) {
      ++steps;
      return Status::OK();
    };
    ASSERT_TRUE(b.must_open(b.key_a, "alice")->rekey(key_of(b.key_b), ro).ok());
  }
  ASSERT_EQ(steps, 1 + 2 * 3 + 1) << "begun, sealed and swapped per snapshot, finished";
  // A plain archive, for an import with the old key during the rotation.
  Bed plain_bed;
  const std::string archive = (plain_bed.root / "plain.tar.zst").string();
  {
    Population p;
    auto plain = Store::open(posix_io(), StorePaths{(plain_bed.root / "store").string()});
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    auto saved = (*plain)->save(*p.l.file, p.l.state, small_chunks());
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    ASSERT_TRUE((*plain)->export_to({std::to_string(saved->info.id)}, archive).ok());
  }
  for (int k = 1; k <= steps; ++k) {
    SCOPED_TRACE("stopped at step " + std::to_string(k));
    Bed b;
    Population pop;
    pop.fill(b);
    const CatalogStats before = stats_of(b);
    int n = 0;
    std::string where;
    RekeyOptions ro;
    ro.test_hook = [&](std::string_view step) {
      if (++n < k) return Status::OK();
      where = std::string(step);
      return Status::IOError("killed at " + where);
    };
    auto first = b.must_open(b.key_a, "alice")->rekey(key_of(b.key_b), ro);
    ASSERT_FALSE(first.ok());
    expect_every_snapshot_readable(b, pop);
    auto old_key = b.open(b.key_a, "alice");
    if (where == "finished") {  // the settings name only the new key: what is left is gc's
      ASSERT_FALSE(old_key.ok());
      EXPECT_EQ(old_key.status().code(), Code::kMismatch);
    } else {
      ASSERT_TRUE(old_key.ok()) << "during a rotation the old key opens the store: " << old_key.status().ToString();
      auto refused = (*old_key)->save(*pop.l.file, pop.l.state, small_chunks());
      ASSERT_FALSE(refused.ok());
      EXPECT_EQ(refused.status().code(), Code::kMismatch);
      EXPECT_NE(refused.status().message().find("saves need the new key"), std::string::npos) << refused.status().ToString();
      // An import is a save (a review's finding: it took the old key and stored a row sealed with it).
      auto imported = (*old_key)->import_from(archive);
      ASSERT_FALSE(imported.ok());
      EXPECT_EQ(imported.status().code(), Code::kMismatch) << imported.status().ToString();
      EXPECT_NE(imported.status().message().find("saves need the new key"), std::string::npos)
          << imported.status().ToString();
      auto resumed = (*old_key)->rekey(key_of(b.key_b));
      ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
      EXPECT_TRUE(resumed->resumed);
    }
    expect_rotated(b, pop, before);
  }
}

// A writer that opened the store before the rotation began still holds the old key: during the
// rotation its row is accepted (and rotated by the next round or run); once the rotation is over
// the catalog refuses it inside the commit, so no row only the retired key opens can appear.
TEST(StoreRekey, AWriterThatMissedTheRotationIsFencedByTheCatalog) {
  Bed b;
  Population pop;
  pop.fill(b);
  auto stale = b.must_open(b.key_a, "alice");  // reads the settings now: not rotating
  RekeyOptions ro;
  ro.test_hook = [](std::string_view step) { return step == "begun" ? Status::IOError("killed") : Status::OK(); };
  ASSERT_FALSE(b.must_open(b.key_a, "alice")->rekey(key_of(b.key_b), ro).ok());
  auto during = pop.save(*stale, *pop.half_file, pop.half_state, "late", {});
  ASSERT_NE(during, 0) << "accepted during the rotation";
  auto rep = b.must_open(b.key_a, "alice")->rekey(key_of(b.key_b));
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->rekeyed, 4u) << "the late row was rotated too";
  auto after = stale->save(*pop.l.file, pop.l.state, small_chunks());
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), Code::kMismatch) << after.status().ToString();
  EXPECT_NE(after.status().message().find("is encrypted with key " + b.key_id(b.key_b)), std::string::npos)
      << after.status().ToString();
  ASSERT_TRUE(b.must_open(b.key_b)->gc(/*wait=*/true).ok()) << "the refused save's pack is garbage";
  expect_every_snapshot_readable(b, pop);
}

// Other processes' work between every two steps of a rotation (each step is where a concurrent
// save, restore or gc can fall): a save with the new key, every snapshot restored with the key
// its row names, a gc. Nothing is lost; the end state is the clean one.
TEST(StoreRekey, SavesRestoresAndGcBetweenTheStepsOfARotationAreSafe) {
  Bed b;
  Population pop;
  pop.fill(b);
  int saves = 0;
  RekeyOptions ro;
  ro.test_hook = [&](std::string_view step) -> Status {
    auto writer = b.open(b.key_b, "alice");  // the new key opens the store from "begun" on
    EXPECT_TRUE(writer.ok()) << step << ": " << writer.status().ToString();
    if (!writer.ok()) return writer.status();
    EXPECT_NE(pop.save(**writer, *pop.half_file, pop.half_state, "new-" + std::to_string(++saves), {}), 0) << step;
    expect_every_snapshot_readable(b, pop);
    auto gc = (*writer)->gc(/*wait=*/false);
    EXPECT_TRUE(gc.ok()) << step << ": " << gc.status().ToString();
    if (gc.ok() && step == "sealed") {
      EXPECT_TRUE(gc->skipped_busy) << "rekey holds the shared gc lock while it writes";
    }
    return Status::OK();
  };
  auto rep = b.must_open(b.key_a, "alice")->rekey(key_of(b.key_b), ro);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->rekeyed, 3u) << "the new key's saves need no rotation";
  expect_every_snapshot_readable(b, pop);
  auto s = b.must_open(b.key_b, "alice");
  auto v = s->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  EXPECT_EQ(b.open(b.key_a, "alice").status().code(), Code::kMismatch);
}

// A chunk shared by several snapshots of a tenant is fetched and decoded once per rotation (the
// later snapshots take its new id from the first), and the chunks go through several workers:
// the packs are read for the store's distinct chunks only, and every snapshot restores byte for byte.
TEST(StoreRekey, ASharedChunkIsReadOnceAndSeveralThreadsSealTheSameStore) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  const std::string want(reinterpret_cast<const char*>(l.bytes.data()), l.bytes.size());
  std::vector<std::string> ids;
  {
    auto alice = b.must_open(b.key_a, "alice");
    for (int i = 0; i < 3; ++i) {  // the same slot three times: every chunk shared
      auto r = alice->save(*l.file, l.state, small_chunks());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ids.push_back(std::to_string(r->info.id));
    }
  }
  auto before = b.must_open(b.key_a, "alice")->catalog().stats();
  ASSERT_TRUE(before.ok());
  FaultInjectingIo io(posix_io());
  auto rotating = b.open(b.key_a, "alice", false, io);
  ASSERT_TRUE(rotating.ok()) << rotating.status().ToString();
  io.count_reads("/packs/");
  RekeyOptions ro;
  ro.threads = 3;
  auto rep = (*rotating)->rekey(key_of(b.key_b), ro);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->rekeyed, 3u);
  EXPECT_EQ(io.bytes_read(), before->stored_bytes) << "each distinct chunk read once, not once per snapshot";
  auto after = b.must_open(b.key_b, "alice");
  for (const std::string& id : ids) EXPECT_TRUE(restore_all(*after, id) == want) << "snapshot " << id;
  auto v = after->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  auto st = after->catalog().stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->chunks, before->chunks);
  EXPECT_EQ(st->stored_bytes, before->stored_bytes);
}

// A restore that read its rows before rekey swapped them still reads their packs: rekey's final
// gc (here a gc after a rekey stopped before its own) waits for it (read_race_scenario.h).
TEST(StoreRekey, ARestoreBesideTheFinalGcKeepsThePacksItReads) {
  Bed b;
  read_race::restore_beside_rekey_and_gc(b, [&](Io& io, const fs::path& key) { return b.open(key, "alice", false, io); });
}

// The same for rm's gc: a restore that began before the rm finishes byte for byte.
TEST(StoreRekey, ARestoreBesideRmOfItsSnapshotFinishes) {
  Bed b;
  read_race::restore_beside_rm(b, [&](Io& io, const fs::path& key) { return b.open(key, "alice", false, io); });
}

// A row an older kvsnap stored with a name that is not UTF-8 (new saves refuse such names): rekey
// rewrites it as it is. The catalog's insert rule refused it, so rekey stopped at that row for good,
// the store left half rotated.
TEST(StoreRekey, ARowWithANameThatIsNotUtf8IsRotatedAsItIs) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  SaveRequest req = small_chunks();
  req.name = "cafe";
  ASSERT_TRUE(b.must_open(b.key_a, "alice")->save(*l.file, l.state, req).ok());
  b.sql("UPDATE snapshots SET name = CAST(X'636166E9' AS TEXT) WHERE name = 'cafe'");
  auto rep = b.must_open(b.key_a, "alice")->rekey(key_of(b.key_b));
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->rekeyed, 1u);
  auto after = b.must_open(b.key_b, "alice");
  auto listed = after->catalog().list();
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  EXPECT_EQ(listed->front().name, std::optional<std::string>("caf\xe9"));
}

}  // namespace
}  // namespace kvsnap
