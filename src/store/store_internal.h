// Internals shared by store.cc (llama.cpp states) and store_mlx.cc (mlx-lm prompt caches). Not
// part of the API.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/snapshot.h"
#include "store/blob_store.h"
#include "store/catalog.h"
#include "store/store.h"

namespace kvsnap::store_detail {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0);

// The chunking, compression and threads a save asks for, and the name it records.
SnapshotOptions save_options(const SaveRequest& req, const ReadableFile& file);

// Hands the snapshot writer's blobs to the blob store and remembers the chunk
// list. A chunk the catalog already has is not written (its row says where it
// is and that it is durable); the others go into the batch's pack.
class BlobSink final : public ChunkSink {
 public:
  BlobSink(BlobWriteBatch& batch, Catalog& catalog) : batch_(batch), catalog_(catalog) {}
  Status put(const ChunkRef& ref, std::span<const std::byte> blob) override;
  std::vector<ChunkUse> uses;
  uint64_t written = 0, bytes_written = 0;

 private:
  BlobWriteBatch& batch_;
  Catalog& catalog_;
};

// Copies `file` (a snapshot's original) to `out` in order, `threads` decoders ahead of the writer.
Status copy_parallel(const ReadableFile& file, uint32_t threads, ByteSink& out);

// The catalog row of an mlx-lm snapshot (its manifest, and the original it describes, which is
// read as a prompt cache: the header only).
Result<SnapshotRecord> mlx_record(const SnapshotManifest& m, const ReadableFile& original);

}  // namespace kvsnap::store_detail
