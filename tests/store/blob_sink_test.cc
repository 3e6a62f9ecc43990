// BlobSink (store_internal.h): how a save hands its encoded chunks to the catalog and the pack.
#include <gtest/gtest.h>

#include "store/local_blob_store.h"
#include "store/sqlite_catalog.h"
#include "store/store_internal.h"
#include "temp_dir.h"

namespace kvsnap {
namespace {

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
TEST(BlobSink, ALocalCatalogWritesEachNewBlobAsItComes) {
  const test::TempDir dir("kvsnap-sink");
  auto blobs = LocalBlobStore::open(posix_io(), dir.path());
  ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
  auto catalog = SqliteCatalog::open(dir.path() + "/catalog.sqlite");
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
  EXPECT_EQ((*catalog)->lookup_hold_bytes(), 0u);
  auto batch = (*blobs)->begin_write();
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  store_detail::BlobSink sink(**batch, **catalog);
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

}  // namespace
}  // namespace kvsnap
