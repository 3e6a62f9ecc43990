// What a restore holds while it reads (blob_store.h, "the gc rule"): a restore stopped between
// reading its snapshot's rows and looking at its first pack, while the snapshot's rows change
// under it (rekey swaps them, rm drops them) and a gc runs. The restore's shared gc hold keeps
// the packs it is about to read, so it finishes byte for byte and the gc is skipped; a gc after
// it deletes them. Shared by the SQLite (store_rekey_test.cc) and PostgreSQL (pg_store_test.cc)
// beds: `open(io, key)` opens the store under test, tenant alice, through `io`.
#pragma once

#include <gtest/gtest.h>

#include <thread>

#include "store/crypt_bed.h"
#include "store/fault_io.h"

namespace kvsnap::read_race {

using std::filesystem::path;
using OpenWith = std::function<Result<std::unique_ptr<Store>>(Io& io, const path& key)>;

struct Race {
  crypt_bed::Loaded l = crypt_bed::load(crypt_bed::fixtures() / crypt_bed::kSlot);
  std::string want{reinterpret_cast<const char*>(l.bytes.data()), l.bytes.size()};
  FaultInjectingIo io{posix_io()};
  std::unique_ptr<Store> writer, reader;
  std::string back;
  Status restored;
  std::thread t;

  ~Race() {  // a failed assertion returned before finish()
    if (!t.joinable()) return;
    io.resume();
    t.join();
  }
  static std::unique_ptr<Store> must(Result<std::unique_ptr<Store>> s) {
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  // Saves the slot with `writer` (opened with `key`) and starts restoring it through the paused
  // Io; returns its id ("" on failure).
  std::string start(const OpenWith& open, const path& key) {
    writer = must(open(posix_io(), key));
    if (!writer) return "";
    auto saved = writer->save(*l.file, l.state, crypt_bed::small_chunks());
    EXPECT_TRUE(saved.ok()) << saved.status().ToString();
    if (!saved.ok()) return "";
    const std::string id = std::to_string(saved->info.id);
    reader = must(open(io, key));
    if (!reader) return "";
    io.pause_reading("/packs/");
    t = std::thread([this, id] { back = crypt_bed::restore_all(*reader, id, &restored); });
    io.wait_paused();  // the rows are read; no pack is open yet
    return id;
  }
  // Lets the restore go on: it must give the original bytes.
  void finish() {
    io.resume();
    t.join();
    EXPECT_TRUE(restored.ok()) << restored.ToString();
    EXPECT_TRUE(back == want) << "the restore gave other bytes";
  }
};

// rekey stopped after its last swap, before its own gc (the old key's chunks at refcount 0),
// then a gc: skipped while the restore of the old rows holds its packs.
inline void restore_beside_rekey_and_gc(const crypt_bed::Bed& keys, const OpenWith& open) {
  Race race;
  const std::string id = race.start(open, keys.key_a);
  ASSERT_FALSE(id.empty());
  auto to = load_key_file(keys.key_b.string());
  ASSERT_TRUE(to.ok());
  RekeyOptions stop;
  stop.test_hook = [](std::string_view step) { return step == "finished" ? Status::IOError("stopped") : Status::OK(); };
  auto r = race.writer->rekey(*to, stop);
  EXPECT_EQ(r.status().message(), "stopped");
  auto rotated = Race::must(open(posix_io(), keys.key_b));
  ASSERT_TRUE(rotated);
  auto gc = rotated->gc(/*wait=*/false);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_TRUE(gc->skipped_busy) << "gc ran beside a restore and deleted " << gc->packs_deleted << " pack(s)";
  race.finish();
  auto after = rotated->gc(/*wait=*/true);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_GE(after->packs_deleted, 1u) << "the old key's pack goes once the restore is over";
  EXPECT_TRUE(crypt_bed::restore_all(*rotated, id) == race.want);
}

// rm of the snapshot being restored: its gc is skipped, the restore that began before finishes.
inline void restore_beside_rm(const crypt_bed::Bed& keys, const OpenWith& open) {
  Race race;
  const std::string id = race.start(open, keys.key_a);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(race.writer->remove(id).ok());
  race.finish();
  auto after = race.writer->gc(/*wait=*/true);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_GE(after->packs_deleted, 1u) << "the removed snapshot's pack goes once the restore is over";
}

}  // namespace kvsnap::read_race
