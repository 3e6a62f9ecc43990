#include "store/local_blob_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "store/fault_io.h"
#include "temp_dir.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

std::string file_text(const std::string& path) { return test::slurp_text(path); }

class BlobStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<LocalBlobStore> open(Io& io) {
    auto s = LocalBlobStore::open(io, root_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }
  // Every file under chunks/: its name must be the hash of one of `payloads`
  // and its content complete.
  void expect_only_complete_blobs(const std::map<std::string, std::string>& payloads) {
    for (auto& e : fs::recursive_directory_iterator(root_ + "/chunks")) {
      if (!e.is_regular_file()) continue;
      std::string name = e.path().filename().string();
      auto it = payloads.find(name);
      ASSERT_NE(it, payloads.end()) << "unexpected file " << e.path();
      EXPECT_EQ(file_text(e.path().string()), it->second) << "incomplete blob " << e.path();
    }
  }
  size_t tmp_files() {
    return static_cast<size_t>(std::distance(fs::directory_iterator(root_ + "/tmp"), fs::directory_iterator()));
  }

  const test::TempDir dir_{"kvsnap-blob"};
  const std::string root_ = dir_.path();
};

// A listing's names are this store's only under its prefix: an object store (or a proxy) that
// ignores prefix= lists the whole bucket (a review's finding: a key shorter than the prefix threw
// std::out_of_range out of list(), exit 70; another prefix's uploads were aborted).
TEST(BlobNames, NamesUnderAPrefixOnly) {
  EXPECT_EQ(name_under("team-a/packs/0123456789abcdef.pack", "team-a/packs/"), std::optional<std::string_view>("0123456789abcdef.pack"));
  EXPECT_EQ(name_under("team-a/packs/", "team-a/packs/"), std::optional<std::string_view>(""));
  EXPECT_EQ(name_under("x", "team-a/packs/"), std::nullopt);
  EXPECT_EQ(name_under("team-b/packs/0123456789abcdef.pack", "team-a/packs/"), std::nullopt);
  EXPECT_EQ(name_under("team-a/pack", "team-a/packs/"), std::nullopt);
}

TEST(ChunkHashTest, HexRoundTripAndKnownDigest) {
  ChunkHash h = ChunkHash::of(bytes_of("abc"));
  EXPECT_EQ(h.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto back = ChunkHash::from_hex(h.hex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, h);
  auto upper = ChunkHash::from_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD");
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(*upper, h);
  EXPECT_EQ(ChunkHash::from_hex("abc").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ChunkHash::from_hex(std::string(63, 'a') + "g").status().code(), Code::kInvalidArgument);
}

TEST_F(BlobStoreTest, PutGetRoundTripInShardLayout) {
  auto store = open(posix_io());
  auto data = bytes_of("compressed chunk bytes");
  ChunkHash h = ChunkHash::of(bytes_of("raw chunk"));
  auto batch = store->begin_write();
  ASSERT_TRUE(batch.ok() && *batch);
  auto put = (*batch)->put(h, data);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(*put, PutOutcome::kWritten);
  ASSERT_TRUE((*batch)->commit().ok());

  std::string hex = h.hex();
  EXPECT_EQ(store->blob_path(h), root_ + "/chunks/" + hex.substr(0, 2) + "/" + hex);
  EXPECT_TRUE(fs::exists(store->blob_path(h)));
  auto got = store->get(h, 1 << 20);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, data);
  EXPECT_TRUE(*store->contains(h));
  EXPECT_EQ(tmp_files(), 0u);
}

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Reads from many packs keep a bounded number of them open (kvsnap serve's one store read every
// pack it ever restored from, and ran out of descriptors past ~1,000), and each blob still reads
// back; a pack name from the catalog that is not a pack's is refused without opening anything (a
// review's findings).
TEST_F(BlobStoreTest, PackReadsKeepFewFilesOpenAndPackNamesAreChecked) {
  auto store = open(posix_io());
  struct Stored {
    ChunkHash h;
    BlobLocation at;
    std::vector<std::byte> bytes;
  };
  std::vector<Stored> stored;
  const size_t kPacks = LocalBlobStore::kMaxOpenPacks + 40;
  for (size_t i = 0; i < kPacks; ++i) {
    auto batch = std::move(store->begin_write()).value();
    Stored s{ChunkHash::of(bytes_of("raw " + std::to_string(i))), {}, bytes_of("blob " + std::to_string(i))};
    auto at = batch->append(s.h, s.bytes);
    ASSERT_TRUE(at.ok()) << at.status().ToString();
    ASSERT_TRUE(batch->commit().ok());
    s.at = *at;
    stored.push_back(std::move(s));
  }
  const size_t before = open_fds();
  for (int round = 0; round < 2; ++round) {
    for (const Stored& s : stored) {
      std::vector<std::byte> out;
      ASSERT_TRUE(store->get_into(s.h, s.at, 1 << 20, out).ok());
      EXPECT_EQ(out, s.bytes);
    }
  }
  EXPECT_LE(open_fds(), before + LocalBlobStore::kMaxOpenPacks) << "every pack read stayed open";
  BlobLocation evil = stored[0].at;
  evil.pack = "../../etc/passwd";
  std::vector<std::byte> out;
  Status s = store->get_into(stored[0].h, evil, 1 << 20, out);
  EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
  EXPECT_EQ(s.message(), "'../../etc/passwd' is not a pack name");
}

// A pack another process deleted (a gc's compaction) is not kept open by a store that read it:
// its descriptor would keep the file's space for as long as the store lives (kvsnap serve).
TEST_F(BlobStoreTest, APackDeletedElsewhereIsClosedAtTheNextOpen) {
  auto store = open(posix_io());
  std::vector<std::pair<ChunkHash, BlobLocation>> at;
  for (const char* raw : {"first", "second"}) {
    auto batch = std::move(store->begin_write()).value();
    const ChunkHash h = ChunkHash::of(bytes_of(raw));
    auto where = batch->append(h, bytes_of(std::string("blob of ") + raw));
    ASSERT_TRUE(where.ok()) << where.status().ToString();
    ASSERT_TRUE(batch->commit().ok());
    at.emplace_back(h, *where);
  }
  auto deleted_fds = [] {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = fs::read_symlink(e.path(), ec).string();
      if (!ec && target.find(".pack (deleted)") != std::string::npos) ++n;
    }
    return n;
  };
  std::vector<std::byte> out;
  ASSERT_TRUE(store->get_into(at[0].first, at[0].second, 1 << 20, out).ok());
  fs::remove(fs::path(root_) / "packs" / (at[0].second.pack + ".pack"));  // another process's gc
  EXPECT_EQ(deleted_fds(), 1u) << "the store holds the deleted pack open";
  ASSERT_TRUE(store->get_into(at[1].first, at[1].second, 1 << 20, out).ok());
  EXPECT_EQ(out, bytes_of("blob of second"));
  EXPECT_EQ(deleted_fds(), 0u) << "opening the next pack closed the deleted one";
}

// The store id is written only where none is (of two catalogs binding new blobs at once, the second
// reads the first's back); an empty one (a crash between its create and its write) is replaced.
TEST_F(BlobStoreTest, TheStoreIdIsCreatedOnceAndAnEmptyOneIsReplaced) {
  auto s = open(posix_io());
  EXPECT_FALSE(s->read_store_id()->has_value());
  ASSERT_TRUE(s->create_store_id("first").ok());
  ASSERT_TRUE(s->create_store_id("second").ok());
  EXPECT_EQ(s->read_store_id()->value_or(""), "first");
  std::ofstream(root_ + "/" + kStoreIdName, std::ios::trunc).close();
  EXPECT_FALSE(s->read_store_id()->has_value()) << "an empty id file is no id";
  ASSERT_TRUE(s->create_store_id("third").ok());
  EXPECT_EQ(s->read_store_id()->value_or(""), "third");
  std::ofstream(root_ + "/" + kStoreIdName, std::ios::trunc) << std::string(5000, 'x');
  EXPECT_EQ(s->read_store_id().status().code(), Code::kCorruption);
}

TEST_F(BlobStoreTest, SecondPutOfSameHashWritesNothing) {
  auto store = open(posix_io());
  ChunkHash h = ChunkHash::of(bytes_of("raw"));
  auto batch = std::move(store->begin_write()).value();
  EXPECT_EQ(*batch->put(h, bytes_of("first")), PutOutcome::kWritten);
  EXPECT_EQ(*batch->put(h, bytes_of("second, different")), PutOutcome::kExisted);
  EXPECT_EQ(batch->written(), 1u);
  EXPECT_EQ(file_text(store->blob_path(h)), "first");
}

TEST_F(BlobStoreTest, GetMissingAndOversized) {
  auto store = open(posix_io());
  ChunkHash h = ChunkHash::of(bytes_of("nobody"));
  EXPECT_EQ(store->get(h, 100).status().code(), Code::kNotFound);
  auto batch = std::move(store->begin_write()).value();
  ASSERT_TRUE(batch->put(h, bytes_of(std::string(1000, 'x'))).ok());
  EXPECT_EQ(store->get(h, 999).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(store->get(h, 1000).ok());
}

TEST_F(BlobStoreTest, ListFindsEveryBlobAndIgnoresForeignFiles) {
  auto store = open(posix_io());
  std::vector<ChunkHash> want;
  {
    auto batch = std::move(store->begin_write()).value();
    for (int i = 0; i < 100; ++i) {
      ChunkHash h = ChunkHash::of(bytes_of("chunk " + std::to_string(i)));
      ASSERT_TRUE(batch->put(h, bytes_of("x")).ok());
      want.push_back(h);
    }
  }
  std::sort(want.begin(), want.end());
  // Foreign files: not 64 hex digits, wrong shard, a stray directory.
  std::ofstream(root_ + "/chunks/README") << "hi";
  fs::create_directories(root_ + "/chunks/zz");
  std::ofstream(root_ + "/chunks/zz/notes.txt") << "hi";
  std::string wrong_shard = want[0].hex();
  std::string other = wrong_shard.substr(0, 2) == "00" ? "01" : "00";
  fs::create_directories(root_ + "/chunks/" + other);
  std::ofstream(root_ + "/chunks/" + other + "/" + wrong_shard) << "misplaced";

  auto listed = store->list();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(*listed, want);
}

TEST_F(BlobStoreTest, PutsDoNotSyncDirectoriesUntilCommit) {
  FaultInjectingIo io(posix_io());
  auto store = open(io);
  auto batch = std::move(store->begin_write()).value();
  std::set<std::string> shards;
  for (int i = 0; i < 100; ++i) {
    ChunkHash h = ChunkHash::of(bytes_of("c" + std::to_string(i)));
    shards.insert(h.hex().substr(0, 2));
    ASSERT_TRUE(batch->put(h, bytes_of("x")).ok());
  }
  EXPECT_EQ(io.count(FaultOp::kSyncDir), 0);
  EXPECT_EQ(io.count(FaultOp::kSync), 100);  // every blob's data is fsynced before its rename
  ASSERT_TRUE(batch->commit().ok());
  EXPECT_EQ(io.count(FaultOp::kSyncDir), static_cast<int>(shards.size()) + 1);  // + chunks/
  ASSERT_TRUE(batch->commit().ok());  // nothing new: nothing to do
  EXPECT_EQ(io.count(FaultOp::kSyncDir), static_cast<int>(shards.size()) + 1);
}

// A save's batch passes on what its packs' files say of the disk's waits (a save's adaptive level
// reads it, format/snapshot.h SnapshotOptions::storage_waits): the count across packs, or nullopt
// once a pack's file cannot tell (the level then falls back to the thread's own count).
TEST_F(BlobStoreTest, ABatchPassesOnItsPacksDiskWaits) {
  for (const auto mode : {FaultInjectingIo::DiskWaits::kEveryAppend, FaultInjectingIo::DiskWaits::kUnknown}) {
    const bool counted = mode == FaultInjectingIo::DiskWaits::kEveryAppend;
    FaultInjectingIo io(posix_io());
    io.set_disk_waits(mode);
    auto store = open(io);
    auto batch = std::move(store->begin_write()).value();
    EXPECT_EQ(batch->storage_waits(), std::optional<uint64_t>(0)) << "no pack yet: nothing waited";
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(batch->append(ChunkHash::of(bytes_of("a" + std::to_string(i))), bytes_of("x")).ok());
    EXPECT_EQ(batch->storage_waits(), counted ? std::optional<uint64_t>(3) : std::nullopt);
    ASSERT_TRUE(batch->commit().ok());
    ASSERT_TRUE(batch->append(ChunkHash::of(bytes_of("b")), bytes_of("y")).ok());  // a second pack
    EXPECT_EQ(batch->storage_waits(), counted ? std::optional<uint64_t>(4) : std::nullopt) << "across packs";
    ASSERT_TRUE(batch->commit().ok());
  }
}

// A blob found present may have been renamed in by another save that has not
// synced its directory yet: commit() must cover it too.
TEST_F(BlobStoreTest, CommitCoversBlobsFoundPresent) {
  FaultInjectingIo io(posix_io());
  auto store = open(io);
  ChunkHash h = ChunkHash::of(bytes_of("shared"));
  {
    auto other = std::move(store->begin_write()).value();
    ASSERT_TRUE(other->put(h, bytes_of("x")).ok());  // and never syncs
  }
  auto batch = std::move(store->begin_write()).value();
  EXPECT_EQ(*batch->put(h, bytes_of("x")), PutOutcome::kExisted);
  io.fail_matching(FaultOp::kSyncDir, "/chunks/" + h.hex().substr(0, 2));
  EXPECT_FALSE(batch->commit().ok());
  io.clear();
  EXPECT_TRUE(batch->commit().ok()) << "a failed commit keeps its directories for the retry";
  EXPECT_EQ(io.count(FaultOp::kSyncDir), 2);
}

struct FaultCase {
  const char* name;
  FaultOp op;
  bool short_write;
};

class BlobFaultTest : public BlobStoreTest, public ::testing::WithParamInterface<FaultCase> {};

// A put that fails anywhere leaves no blob under chunks/ (not even a partial
// one) and no temporary in tmp/; earlier blobs are untouched.
TEST_P(BlobFaultTest, FailedPutLeavesNoBlobAndNoTemporary) {
  const FaultCase& fc = GetParam();
  FaultInjectingIo io(posix_io());
  auto store = open(io);
  auto batch = std::move(store->begin_write()).value();
  std::map<std::string, std::string> payloads;
  ChunkHash good = ChunkHash::of(bytes_of("good"));
  ASSERT_TRUE(batch->put(good, bytes_of("good blob")).ok());
  payloads[good.hex()] = "good blob";

  if (fc.short_write) {
    io.short_write_nth(1, 10);
  } else {
    io.fail_nth(fc.op, 1, fc.op == FaultOp::kSync ? EIO : ENOSPC);
  }
  ChunkHash bad = ChunkHash::of(bytes_of("bad"));
  auto put = batch->put(bad, bytes_of(std::string(4096, 'b')));
  ASSERT_FALSE(put.ok()) << fc.name;
  EXPECT_EQ(put.status().code(), Code::kIOError);
  EXPECT_NE(put.status().message().find("(injected)"), std::string::npos) << put.status().message();
  EXPECT_EQ(io.injected(), 1);
  EXPECT_FALSE(fs::exists(store->blob_path(bad)));
  EXPECT_EQ(tmp_files(), 0u);
  expect_only_complete_blobs(payloads);

  // The store is still usable: the same put succeeds once the fault is gone.
  auto again = batch->put(bad, bytes_of(std::string(4096, 'b')));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  payloads[bad.hex()] = std::string(4096, 'b');
  expect_only_complete_blobs(payloads);
}

INSTANTIATE_TEST_SUITE_P(Faults, BlobFaultTest,
                         ::testing::Values(FaultCase{"open", FaultOp::kOpenWrite, false},
                                           FaultCase{"write_enospc", FaultOp::kAppend, false},
                                           FaultCase{"short_write", FaultOp::kAppend, true},
                                           FaultCase{"fsync_eio", FaultOp::kSync, false},
                                           FaultCase{"close", FaultOp::kClose, false},
                                           FaultCase{"rename", FaultOp::kRename, false},
                                           FaultCase{"mkdir", FaultOp::kCreateDirs, false}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(BlobStoreTest, GcLockExcludesSavesAndSavesShareIt) {
  auto store = open(posix_io());
  auto a = std::move(store->begin_write(false)).value();
  auto b = std::move(store->begin_write(false)).value();
  ASSERT_TRUE(a && b) << "saves share the lock";
  auto gc = store->lock_for_gc(false);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(*gc, nullptr) << "gc must not run while a save is between blob write and commit";
  a.reset();
  EXPECT_EQ(*store->lock_for_gc(false), nullptr);
  b.reset();
  auto held = std::move(store->lock_for_gc(false)).value();
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(*store->begin_write(false), nullptr) << "no save starts while gc runs";
  EXPECT_EQ(*store->lock_for_gc(false), nullptr);
  held.reset();
  EXPECT_NE(*store->begin_write(false), nullptr);
}

TEST_F(BlobStoreTest, WaitingGcProceedsWhenTheSaveEnds) {
  auto store = open(posix_io());
  auto save = std::move(store->begin_write()).value();
  auto gc = std::async(std::launch::async, [&] { return std::move(store->lock_for_gc(/*wait=*/true)).value(); });
  EXPECT_EQ(gc.wait_for(std::chrono::milliseconds(150)), std::future_status::timeout);
  save.reset();
  EXPECT_NE(gc.get(), nullptr);
}

TEST_F(BlobStoreTest, ClearTmpRemovesLeftoversAndRemoveDeletesBlobs) {
  auto store = open(posix_io());
  std::ofstream(root_ + "/tmp/deadbeef.kvsnap-tmp-1-2") << "crashed save";
  std::ofstream(root_ + "/tmp/other") << "x";
  ChunkHash h = ChunkHash::of(bytes_of("r"));
  {
    auto batch = std::move(store->begin_write()).value();
    ASSERT_TRUE(batch->put(h, bytes_of("x")).ok());
  }
  auto gc = std::move(store->lock_for_gc(false)).value();
  ASSERT_NE(gc, nullptr);
  auto n = store->clear_tmp(*gc);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(tmp_files(), 0u);
  ASSERT_TRUE(store->remove(*gc, h).ok());
  EXPECT_FALSE(*store->contains(h));
  EXPECT_TRUE(store->remove(*gc, h).ok()) << "removing an absent blob is fine";
}

// Many threads putting overlapping chunks at once: every put succeeds, every
// blob is complete, no temporaries remain.
TEST_F(BlobStoreTest, ConcurrentPutsOfOverlappingChunks) {
  auto store = open(posix_io());
  std::map<std::string, std::string> payloads;
  std::vector<std::pair<ChunkHash, std::string>> chunks;
  for (int i = 0; i < 40; ++i) {
    std::string p = "payload " + std::to_string(i) + std::string(static_cast<size_t>(i) * 100, 'p');
    ChunkHash h = ChunkHash::of(bytes_of("raw " + std::to_string(i)));
    chunks.emplace_back(h, p);
    payloads[h.hex()] = p;
  }
  auto batch = std::move(store->begin_write()).value();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < chunks.size(); ++k) {
        auto& [h, p] = chunks[(k + static_cast<size_t>(t) * 7) % chunks.size()];
        if (!batch->put(h, bytes_of(p)).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(batch->commit().ok());
  EXPECT_EQ(tmp_files(), 0u);
  expect_only_complete_blobs(payloads);
  EXPECT_EQ(store->list()->size(), chunks.size());
}

}  // namespace
}  // namespace kvsnap
