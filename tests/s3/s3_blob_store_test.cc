// S3BlobStore against a real Swift + s3api on loopback: the behaviours
// tests/store/blob_store_test.cc checks of the directory store, plus packs by
// range GET, the read-through cache and a whole Store saving into the bucket.
#include "store/s3_blob_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "s3/s3_bed.h"
#include "store/store_location.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;
using s3test::pattern;

std::vector<std::byte> bytes_of(const std::string& s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

class S3BlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = s3test::bed_config();
    if (!cfg_) GTEST_SKIP() << "no S3 bed: run through tests/beds/swift-s3.sh run DIR auto CMD (ctest -L s3)";
    std::string tmpl = (fs::temp_directory_path() / "kvsnap-s3blob-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    local_ = tmpl;
    ASSERT_TRUE(S3Client(*cfg_).create_bucket().ok());
  }
  void TearDown() override {
    if (!local_.empty()) fs::remove_all(local_);
  }
  std::unique_ptr<S3BlobStore> open(uint64_t cache_bytes = 1 << 20, std::string prefix = "team-a") {
    S3Location where;
    where.config = *cfg_;
    where.prefix = std::move(prefix);
    where.redacted = "s3://" + cfg_->bucket + "/" + where.prefix;
    S3BlobStoreOptions opt;
    opt.staging_dir = local_ + "/staging";
    opt.cache_dir = cache_bytes ? local_ + "/cache" : "";
    opt.cache_bytes = cache_bytes;
    auto s = S3BlobStore::open(posix_io(), std::move(where), std::move(opt));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  std::optional<S3Config> cfg_;
  std::string local_;
};

// A killed save's multipart upload (started, never completed) is invisible to
// listings; gc aborts the ones older than the bound, under packs/ only.
TEST_F(S3BlobStoreTest, GcAbortsStaleMultipartUploads) {
  auto store = open();
  ASSERT_TRUE(store);
  S3Client s3(*cfg_);
  auto old_id = s3.start_upload("team-a/packs/00000000000000aa.pack");
  auto foreign = s3.start_upload("team-a/elsewhere/x");
  ASSERT_TRUE(old_id.ok() && foreign.ok()) << old_id.status().ToString() << foreign.status().ToString();
  // Initiated has whole seconds, rounded up by Swift: 3 s apart, a 1 s bound tells the two apart.
  std::this_thread::sleep_for(std::chrono::milliseconds(3100));
  auto new_id = s3.start_upload("team-a/packs/00000000000000bb.pack");
  ASSERT_TRUE(new_id.ok());
  auto listed = s3.list_uploads("team-a/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 3u) << "ListMultipartUploads shows all three";
  for (const S3Upload& u : *listed) EXPECT_GE(u.initiated.size(), 19u) << u.initiated;
  auto packs_only = s3.list_uploads("team-a/packs/");
  ASSERT_TRUE(packs_only.ok()) << packs_only.status().ToString();
  EXPECT_EQ(packs_only->size(), 2u) << "the prefix is honoured";

  S3BlobStoreOptions opt;
  opt.staging_dir = local_ + "/staging";
  opt.upload_max_age_s = 1;
  S3Location where;
  where.config = *cfg_;
  where.prefix = "team-a";
  where.redacted = "s3://" + cfg_->bucket + "/team-a";
  auto aging = S3BlobStore::open(posix_io(), std::move(where), std::move(opt));
  ASSERT_TRUE(aging.ok()) << aging.status().ToString();
  auto lock = (*aging)->lock_for_gc(true);
  ASSERT_TRUE(lock.ok() && *lock);
  auto aborted = (*aging)->abort_stale_uploads(**lock);
  ASSERT_TRUE(aborted.ok()) << aborted.status().ToString();
  EXPECT_EQ(*aborted, 1u);
  auto left = s3.list_uploads("team-a/");
  ASSERT_TRUE(left.ok());
  std::vector<std::string> ids;
  for (const S3Upload& u : *left) ids.push_back(u.upload_id);
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> want = {*foreign, *new_id};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ids, want) << "the recent one and the one outside packs/ stay";
  lock->reset();
  // The store's default bound (24 h) aborts neither; gc reports what it aborted.
  auto gc_lock = store->lock_for_gc(true);
  EXPECT_EQ(*store->abort_stale_uploads(**gc_lock), 0u);
  EXPECT_TRUE(s3.abort_upload("team-a/packs/00000000000000bb.pack", *new_id).ok());
  EXPECT_TRUE(s3.abort_upload("team-a/elsewhere/x", *foreign).ok());
  EXPECT_TRUE(s3.abort_upload("team-a/elsewhere/x", *foreign).ok()) << "aborting twice is fine";
  EXPECT_TRUE(s3.list_uploads("team-a/")->empty());
}

TEST_F(S3BlobStoreTest, PutGetRoundTripInShardLayout) {
  auto store = open();
  ASSERT_TRUE(store);
  const auto data = bytes_of("compressed chunk bytes");
  const ChunkHash h = ChunkHash::of(bytes_of("raw chunk"));
  auto batch = std::move(store->begin_write()).value();
  ASSERT_TRUE(batch);
  auto put = batch->put(h, data);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(*put, PutOutcome::kWritten);
  ASSERT_TRUE(batch->commit().ok());
  const std::string hex = h.hex();
  EXPECT_EQ(store->blob_key(h), "team-a/chunks/" + hex.substr(0, 2) + "/" + hex);
  EXPECT_EQ(*store->client().get(store->blob_key(h), 100), data) << "the key a directory store's path has";
  auto got = store->get(h, 1 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, data);
  EXPECT_TRUE(*store->contains(h));
  EXPECT_EQ(*store->blob_size(h), data.size());
  EXPECT_EQ(store->list_tmp()->size(), 0u);
}

// The store id is written only where none is (If-None-Match: *, answered 412 when one is there).
TEST_F(S3BlobStoreTest, TheStoreIdIsCreatedOnce) {
  auto store = open();
  ASSERT_TRUE(store);
  auto none = store->read_store_id();
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(store->create_store_id("first").ok());
  auto second = store->create_store_id("second");
  ASSERT_TRUE(second.ok()) << second.ToString();
  auto id = store->read_store_id();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(id->value_or(""), "first") << "the second create replaced the first's id";
}

TEST_F(S3BlobStoreTest, SecondPutOfSameHashWritesNothing) {
  auto store = open();
  ASSERT_TRUE(store);
  const ChunkHash h = ChunkHash::of(bytes_of("raw"));
  auto batch = std::move(store->begin_write()).value();
  EXPECT_EQ(*batch->put(h, bytes_of("first")), PutOutcome::kWritten);
  EXPECT_EQ(*batch->put(h, bytes_of("second, different")), PutOutcome::kExisted);
  EXPECT_EQ(batch->written(), 1u);
  EXPECT_EQ(*store->get(h, 100), bytes_of("first"));
}

TEST_F(S3BlobStoreTest, GetMissingAndOversized) {
  auto store = open();
  ASSERT_TRUE(store);
  const ChunkHash h = ChunkHash::of(bytes_of("nobody"));
  const auto missing = store->get(h, 100);
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find(h.hex()), std::string::npos) << missing.status().message();
  EXPECT_FALSE(*store->contains(h));
  EXPECT_EQ(*store->blob_size(h), 0u);
  auto batch = std::move(store->begin_write()).value();
  ASSERT_TRUE(batch->put(h, bytes_of(std::string(1000, 'x'))).ok());
  EXPECT_EQ(store->get(h, 999).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(store->get(h, 1000).ok());
  EXPECT_EQ(store->get(h, BlobLocation{"0123456789abcdef", 0, 10}, 100).status().code(), Code::kNotFound)
      << "a missing pack";
}

TEST_F(S3BlobStoreTest, ListFindsEveryBlobAndIgnoresForeignObjects) {
  auto store = open();
  ASSERT_TRUE(store);
  std::vector<ChunkHash> want;
  {
    auto batch = std::move(store->begin_write()).value();
    for (int i = 0; i < 30; ++i) {
      ChunkHash h = ChunkHash::of(bytes_of("chunk " + std::to_string(i)));
      ASSERT_TRUE(batch->put(h, bytes_of("x")).ok());
      want.push_back(h);
    }
  }
  std::sort(want.begin(), want.end());
  // Foreign objects: not 64 hex digits, the wrong shard, another prefix, a foreign pack name.
  S3Client& c = store->client();
  const std::string misplaced = want[0].hex();
  ASSERT_TRUE(c.put("team-a/chunks/README", bytes_of("hi")).ok());
  ASSERT_TRUE(c.put("team-a/chunks/zz/notes.txt", bytes_of("hi")).ok());
  ASSERT_TRUE(c.put("team-a/chunks/" + std::string(misplaced.substr(0, 2) == "00" ? "01" : "00") + "/" + misplaced,
                    bytes_of("misplaced")).ok());
  ASSERT_TRUE(c.put("team-b/chunks/" + misplaced.substr(0, 2) + "/" + misplaced, bytes_of("other prefix")).ok());
  ASSERT_TRUE(c.put("team-a/packs/notes.pack", bytes_of("x")).ok());
  auto listed = store->list();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(*listed, want);
  EXPECT_TRUE(store->list_packs()->empty());
}

TEST_F(S3BlobStoreTest, PackIsInvisibleUntilCommitThenRangeRead) {
  auto store = open(/*cache_bytes=*/0);
  ASSERT_TRUE(store);
  auto batch = std::move(store->begin_write()).value();
  std::vector<std::pair<ChunkHash, BlobLocation>> blobs;
  for (int i = 0; i < 20; ++i) {
    const auto data = pattern(size_t(1000 + 37 * i), uint32_t(i));
    const ChunkHash h = ChunkHash::of(data);
    auto where = batch->append(h, data);
    ASSERT_TRUE(where.ok()) << where.status().ToString();
    blobs.emplace_back(h, *where);
  }
  EXPECT_EQ(batch->append(blobs[3].first, pattern(1000 + 37 * 3, 3))->offset, blobs[3].second.offset)
      << "a hash appended before is not written again";
  EXPECT_TRUE(store->list_packs()->empty()) << "nothing listed before commit";
  EXPECT_EQ(store->list_tmp()->size(), 0u) << "nothing is staged on this host";
  ASSERT_TRUE(batch->commit().ok());
  const std::string pack = blobs[0].second.pack;
  EXPECT_EQ(*store->list_packs(), std::vector<std::string>{pack});
  EXPECT_GT(*store->pack_size(pack), 20000u);
  for (int i = 19; i >= 0; --i) {
    auto got = store->get(blobs[size_t(i)].first, blobs[size_t(i)].second, 1 << 20);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, pattern(size_t(1000 + 37 * i), uint32_t(i)));
  }
  BlobLocation past = blobs[19].second;
  past.offset += 10;
  EXPECT_EQ(store->get(blobs[19].first, past, 1 << 20).status().code(), Code::kCorruption)
      << "a pack shorter than the location says";
  EXPECT_EQ(store->get(blobs[0].first, blobs[0].second, 10).status().code(), Code::kInvalidArgument);
  // Appends after a commit start a new pack.
  auto next = batch->append(ChunkHash::of(bytes_of("later")), bytes_of("later"));
  ASSERT_TRUE(next.ok());
  EXPECT_NE(next->pack, pack);
  ASSERT_TRUE(batch->commit().ok());
  EXPECT_EQ(store->list_packs()->size(), 2u);
}

TEST_F(S3BlobStoreTest, BigPackGoesUpInParts) {
  cfg_->multipart_threshold = 5 << 20;
  cfg_->part_size = 5 << 20;
  auto store = open(0);
  ASSERT_TRUE(store);
  auto batch = std::move(store->begin_write()).value();
  std::vector<std::pair<ChunkHash, BlobLocation>> blobs;
  const uint64_t before = store->client().attempts();
  for (int i = 0; i < 12; ++i) {  // 12 x 1 MiB: two full parts go up while appending, the last at commit
    const auto data = pattern(1 << 20, uint32_t(100 + i));
    blobs.emplace_back(ChunkHash::of(data), *batch->append(ChunkHash::of(data), data));
  }
  EXPECT_EQ(store->client().attempts() - before, 3u) << "create and two parts before the commit";
  // The stage is in the bucket, where any host's gc sees it, and no listing shows it.
  auto staged = store->client().list_uploads("team-a/packs/");
  ASSERT_TRUE(staged.ok()) << staged.status().ToString();
  ASSERT_EQ(staged->size(), 1u);
  EXPECT_EQ((*staged)[0].key, store->pack_key(blobs[0].second.pack));
  EXPECT_TRUE(store->list_packs()->empty());
  EXPECT_EQ(store->list_tmp()->size(), 0u) << "nothing is staged on this host";
  const uint64_t listed = store->client().attempts();
  ASSERT_TRUE(batch->commit().ok());
  EXPECT_EQ(store->client().attempts() - listed, 2u) << "the last part, complete";
  EXPECT_TRUE(store->client().list_uploads("team-a/packs/")->empty());
  EXPECT_EQ(*store->pack_size(blobs[0].second.pack), 12u << 20);
  for (int i : {0, 4, 5, 11})  // across part boundaries
    EXPECT_EQ(*store->get(blobs[size_t(i)].first, blobs[size_t(i)].second, 2 << 20), pattern(1 << 20, uint32_t(100 + i)));
}

TEST_F(S3BlobStoreTest, DroppedBatchLeavesNoPackNoTemporaryAndNoUpload) {
  cfg_->part_size = 5 << 20;
  auto store = open();
  ASSERT_TRUE(store);
  {
    auto batch = std::move(store->begin_write()).value();
    ASSERT_TRUE(batch->append(ChunkHash::of(bytes_of("a")), bytes_of("a")).ok());
  }
  {  // a part went up: the batch aborts its upload
    auto batch = std::move(store->begin_write()).value();
    const auto data = pattern(6 << 20, 7);
    ASSERT_TRUE(batch->append(ChunkHash::of(data), data).ok());
    ASSERT_EQ(store->client().list_uploads("team-a/packs/")->size(), 1u);
  }
  EXPECT_TRUE(store->list_packs()->empty());
  EXPECT_EQ(store->list_tmp()->size(), 0u);
  EXPECT_TRUE(store->client().list_uploads("team-a/packs/")->empty());
}

TEST_F(S3BlobStoreTest, FailedCommitKeepsThePackForARetry) {
  cfg_->retry = {.max_attempts = 2, .base_delay_ms = 10, .max_delay_ms = 10, .max_total_ms = 10000};
  auto store = open();
  ASSERT_TRUE(store);
  auto batch = std::move(store->begin_write()).value();
  const auto data = pattern(5000, 9);
  auto where = batch->append(ChunkHash::of(data), data);
  ASSERT_TRUE(where.ok());
  ASSERT_EQ(s3test::bed_control("pause"), 0);
  const Status failed = batch->commit();
  const int resumed = s3test::bed_control("resume");
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find(store->pack_key(where->pack)), std::string::npos) << failed.message();
  ASSERT_EQ(resumed, 0);
  EXPECT_TRUE(store->list_packs()->empty());
  const Status retried = batch->commit();
  ASSERT_TRUE(retried.ok()) << retried.ToString();
  EXPECT_EQ(*store->get(ChunkHash::of(data), *where, 1 << 20), data);
}

TEST_F(S3BlobStoreTest, ReadThroughCacheServesWhileTheServerIsAway) {
  auto store = open(/*cache_bytes=*/1 << 20);
  ASSERT_TRUE(store);
  auto batch = std::move(store->begin_write()).value();
  const auto loose = pattern(3000, 1), packed = pattern(4000, 2);
  ASSERT_TRUE(batch->put(ChunkHash::of(loose), loose).ok());
  const BlobLocation where = *batch->append(ChunkHash::of(packed), packed);
  ASSERT_TRUE(batch->commit().ok());
  ASSERT_EQ(*store->get(ChunkHash::of(loose), 1 << 20), loose);
  ASSERT_EQ(*store->get(ChunkHash::of(packed), where, 1 << 20), packed);
  EXPECT_EQ(store->cache()->entries(), 2u);
  ASSERT_EQ(s3test::bed_control("pause"), 0);
  const uint64_t before = store->client().attempts();
  auto a = store->get(ChunkHash::of(loose), 1 << 20);
  auto b = store->get(ChunkHash::of(packed), where, 1 << 20);
  const uint64_t requests = store->client().attempts() - before;
  ASSERT_EQ(s3test::bed_control("resume"), 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*a, loose);
  EXPECT_EQ(*b, packed);
  EXPECT_EQ(requests, 0u) << "both from the cache";

  // A damaged cache file is a miss: fetched again, and replaced.
  const std::string cached = local_ + "/cache/" + ChunkHash::of(loose).hex();
  ASSERT_TRUE(fs::exists(cached));
  { std::ofstream(cached, std::ios::binary | std::ios::in | std::ios::out).write("XX", 2); }
  EXPECT_EQ(*store->get(ChunkHash::of(loose), 1 << 20), loose);
  EXPECT_GT(store->client().attempts(), before + requests);
}

TEST_F(S3BlobStoreTest, CacheStaysWithinItsBound) {
  auto store = open(/*cache_bytes=*/64 << 10);
  ASSERT_TRUE(store);
  auto batch = std::move(store->begin_write()).value();
  std::vector<ChunkHash> hashes;
  for (int i = 0; i < 20; ++i) {
    const auto data = pattern(10000, uint32_t(200 + i));
    hashes.push_back(ChunkHash::of(data));
    ASSERT_TRUE(batch->put(hashes.back(), data).ok());
  }
  for (int i = 0; i < 20; ++i) ASSERT_EQ(*store->get(hashes[size_t(i)], 1 << 20), pattern(10000, uint32_t(200 + i)));
  EXPECT_LE(store->cache()->bytes(), 64u << 10);
  EXPECT_GE(store->cache()->entries(), 5u);
  uint64_t on_disk = 0;
  for (auto& e : fs::directory_iterator(local_ + "/cache")) on_disk += e.file_size();
  EXPECT_EQ(on_disk, store->cache()->bytes());
  // A store opened again counts what the cache holds.
  store.reset();
  auto again = open(64 << 10);
  EXPECT_EQ(again->cache()->bytes(), on_disk);
}

TEST_F(S3BlobStoreTest, GcLockExcludesSavesAndRemoveDeletes) {
  auto store = open();
  ASSERT_TRUE(store);
  const ChunkHash h = ChunkHash::of(bytes_of("doomed"));
  std::string pack;
  {
    auto batch = std::move(store->begin_write()).value();
    ASSERT_TRUE(batch->put(h, bytes_of("doomed")).ok());
    pack = batch->append(ChunkHash::of(bytes_of("p")), bytes_of("p"))->pack;
    ASSERT_TRUE(batch->commit().ok());
    EXPECT_EQ(*store->lock_for_gc(false), nullptr) << "no gc while a save holds the lock";
  }
  ASSERT_TRUE(store->get(h, 100).ok());  // cached now
  auto gc = std::move(store->lock_for_gc(false)).value();
  ASSERT_NE(gc, nullptr);
  EXPECT_EQ(*store->begin_write(false), nullptr) << "no save while gc holds the lock";
  ASSERT_TRUE(store->remove(*gc, h).ok());
  ASSERT_TRUE(store->remove(*gc, h).ok()) << "absent is fine";
  ASSERT_TRUE(store->remove_pack(*gc, pack).ok());
  EXPECT_EQ(store->get(h, 100).status().code(), Code::kNotFound) << "removed from the cache too";
  EXPECT_TRUE(store->list()->empty());
  EXPECT_TRUE(store->list_packs()->empty());
  // A temporary of a save an older kvsnap (which staged packs here) left: listed, sized, cleared.
  std::ofstream(local_ + "/staging/0123456789abcdef.pack.kvsnap-tmp-1-2") << "leftover";
  EXPECT_EQ(store->list_tmp()->size(), 1u);
  EXPECT_EQ(*store->tmp_size("0123456789abcdef.pack.kvsnap-tmp-1-2"), 8u);
  EXPECT_EQ(*store->clear_tmp(*gc), 1u);
  EXPECT_EQ(store->list_tmp()->size(), 0u);
}

TEST_F(S3BlobStoreTest, ConcurrentPutsOfOverlappingChunks) {
  auto store = open();
  ASSERT_TRUE(store);
  std::vector<std::future<void>> writers;
  for (int w = 0; w < 4; ++w) {
    writers.push_back(std::async(std::launch::async, [&, w] {
      auto batch = std::move(store->begin_write()).value();
      for (int i = 0; i < 12; ++i) {
        const int k = (i + 3 * w) % 16;  // writers overlap on most keys
        const auto data = pattern(2000, uint32_t(k));
        EXPECT_TRUE(batch->put(ChunkHash::of(data), data).ok());
      }
      EXPECT_TRUE(batch->commit().ok());
    }));
  }
  for (auto& f : writers) f.get();
  auto listed = store->list();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 16u);
  for (int k = 0; k < 16; ++k) EXPECT_EQ(*store->get(ChunkHash::of(pattern(2000, uint32_t(k))), 1 << 20), pattern(2000, uint32_t(k)));
}

TEST_F(S3BlobStoreTest, OpenFailsClearlyOnAMissingBucketOrWrongSecret) {
  S3Location where;
  where.config = *cfg_;
  where.config.bucket += "-nope";
  where.redacted = "s3://" + where.config.bucket;
  S3BlobStoreOptions opt;
  opt.staging_dir = local_ + "/staging";
  auto missing = S3BlobStore::open(posix_io(), where, opt);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("NoSuchBucket"), std::string::npos) << missing.status().message();
  where.config.bucket = cfg_->bucket;
  where.config.secret_key = "wrong";
  auto denied = S3BlobStore::open(posix_io(), where, opt);
  ASSERT_FALSE(denied.ok());
  EXPECT_NE(denied.status().message().find("HTTP 403"), std::string::npos) << denied.status().message();
}

}  // namespace
}  // namespace kvsnap
