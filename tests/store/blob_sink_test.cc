// BlobSink (store_internal.h): how a save hands its encoded chunks to the catalog and the pack.
#include <gtest/gtest.h>

#include "store/local_blob_store.h"
#include "store/sqlite_catalog.h"
#include "store/store_internal.h"
#include "temp_dir.h"

namespace kvsnap {
namespace {

// A local store's blobs and catalog in a scratch directory.
class BlobSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto blobs = LocalBlobStore::open(posix_io(), dir_.path());
    ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
    blobs_ = std::move(blobs).value();
    auto catalog = SqliteCatalog::open(dir_.path() + "/catalog.sqlite");
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    catalog_ = std::move(catalog).value();
  }
  const test::TempDir dir_{"kvsnap-sink"};
  std::unique_ptr<LocalBlobStore> blobs_;
  std::unique_ptr<SqliteCatalog> catalog_;
};

// A chunk whose blob is `n` bytes of `fill` (the sink does not decode blobs).
ChunkRef ref_of(uint8_t fill, size_t n, uint64_t index) {
  std::vector<std::byte> raw(n, std::byte{fill});
  ChunkRef r;
  r.sha256 = ChunkHash::of(raw).bytes;
  r.raw_size = n;
  r.stored_size = n;
  r.index = index;
  return r;
}

// On a local (SQLite) catalog nothing is held for a batched lookup: each new blob is looked up
// and appended to the pack as it comes, and the encoder gets that chunk's buffer back, so a
// save touches no fresh buffer after its first chunk.
TEST_F(BlobSinkTest, ALocalCatalogWritesEachNewBlobAsItComes) {
  EXPECT_EQ(catalog_->lookup_hold_bytes(), 0u);
  auto batch = blobs_->begin_write();
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  store_detail::BlobSink sink(**batch, *catalog_);
  constexpr size_t kBlob = 64 << 10;
  std::vector<std::byte> encoder;  // the encoder's buffer, as put_buffer swaps it
  const std::byte* first = nullptr;
  for (uint8_t i = 0; i < 4; ++i) {
    encoder.assign(kBlob, std::byte{i});
    if (i == 0) first = encoder.data();
    ASSERT_TRUE(sink.put_buffer(ref_of(i, kBlob, i), encoder, kBlob).ok());
    EXPECT_EQ((*batch)->written(), i + 1u) << "blob " << int(i) << " is in the pack before the next one comes";
    EXPECT_EQ(sink.written, i + 1u);
    if (i == 0) {
      EXPECT_EQ(encoder.data(), nullptr) << "no spare yet: the first blob's buffer went with it";
    } else {
      EXPECT_GE(encoder.capacity(), kBlob) << "the encoder gets a written chunk's buffer back";
    }
    if (i == 1) {
      EXPECT_EQ(encoder.data(), first) << "the first blob's buffer, written, came back at once";
    }
  }
  ASSERT_TRUE(sink.finish().ok());
  EXPECT_EQ(sink.uses.size(), 4u);
  EXPECT_EQ(sink.bytes_written, 4 * kBlob);
}

// A parent's known chunk (put with no blob) holds no buffer: the spare that a written blob left
// goes to the next new chunk's encoder, not into the known chunk's empty slot, in an extension's
// save, where the new last chunk of each layer comes right after the layer's known chunks.
TEST_F(BlobSinkTest, AParentsKnownChunkTakesNoSpareBuffer) {
  constexpr size_t kBlob = 64 << 10;
  const ChunkRef known = ref_of(0xee, kBlob, 0);
  SnapshotRecord parent;
  parent.info.name = "parent";
  parent.info.model_arch = "llama";
  parent.info.k_types = parent.info.v_types = "f16";
  parent.info.source_format = "ggsq3";
  ChunkUse row;  // a loose blob's row: what a committed parent leaves for its chunk
  row.sha256 = store_detail::hash_of(known);
  row.raw_size = row.stored_size = kBlob;
  ASSERT_TRUE(catalog_->add_snapshot(parent, {row}).ok());
  auto batch = blobs_->begin_write();
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  store_detail::BlobSink sink(**batch, *catalog_);
  std::vector<std::byte> encoder(kBlob, std::byte{1});
  ASSERT_TRUE(sink.put_buffer(ref_of(1, kBlob, 1), encoder, kBlob).ok());  // written; its buffer is spare
  ASSERT_TRUE(sink.put(known, {}).ok());
  encoder.assign(kBlob, std::byte{2});
  ASSERT_TRUE(sink.put_buffer(ref_of(2, kBlob, 2), encoder, kBlob).ok());
  EXPECT_GE(encoder.capacity(), kBlob) << "the first blob's buffer, not an empty one, came back";
  ASSERT_TRUE(sink.finish().ok());
  ASSERT_EQ(sink.uses.size(), 3u);
  EXPECT_EQ(sink.uses[1].sha256, store_detail::hash_of(known)) << "the known chunk keeps its place";
  EXPECT_EQ(sink.written, 2u);
}

}  // namespace
}  // namespace kvsnap
