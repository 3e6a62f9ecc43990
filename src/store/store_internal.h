// Internals shared by store.cc (llama.cpp states) and store_mlx.cc (mlx-lm prompt caches). Not
// part of the API.
#pragma once

#include <chrono>
#include <map>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/io.h"
#include "base/status.h"
#include "format/snapshot.h"
#include "format/snapshot_mlx.h"
#include "store/blob_store.h"
#include "store/catalog.h"
#include "store/store.h"

namespace kvsnap::store_detail {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0);

// The chunking, compression and threads a save asks for, and the name it records.
SnapshotOptions save_options(const SaveRequest& req, const ReadableFile& file);
// The name and tags a save gives its row, as an encrypted snapshot's manifest records them.
SnapshotLabels request_labels(const SaveRequest& req);

// Blobs are small (a chunk of 256 cells of one layer); anything larger than this is not ours.
inline constexpr uint64_t kMaxBlobBytes = uint64_t(1) << 31;

inline ChunkHash hash_of(const ChunkRef& r) {
  ChunkHash h;
  h.bytes = r.sha256;
  return h;
}

// Blobs by hash, from where the catalog says they are (add() the chunk lists
// of the snapshots read); a hash it was not told about is read as a loose blob.
class BlobSource final : public ChunkSource {
 public:
  explicit BlobSource(BlobStore& blobs) : blobs_(blobs) {}
  void add(const std::vector<ChunkUse>& uses) {
    for (const ChunkUse& u : uses) where_.emplace(u.sha256, u.location());
  }
  Result<std::vector<std::byte>> get(const ChunkRef& ref) override {
    std::vector<std::byte> out;
    KV_RETURN_IF_ERROR(get_into(ref, out));
    return out;
  }
  Status get_into(const ChunkRef& ref, std::vector<std::byte>& out) override {
    const ChunkHash h = hash_of(ref);
    auto it = where_.find(h);
    static const BlobLocation kLoose;
    Status s = blobs_.get_into(h, it == where_.end() ? kLoose : it->second, kMaxBlobBytes, out);
    if (s.code() == Code::kNotFound)
      return Status::Corruption("the store lost chunk " + to_hex(ref.sha256) + " (" + s.message() + "); run kvsnap verify");
    return s;
  }

 private:
  BlobStore& blobs_;
  std::map<ChunkHash, BlobLocation> where_;  // read-only once reading starts (readers may be threads)
};

// A token prefix that cannot be cut (kNotSupported: state_prefix.h, mlx_layout.h mlx_prefix say
// why) names the snapshot `ref` and the way out; other errors pass unchanged.
Status prefix_error(const Status& s, const std::string& ref);

// A fresh path under the store's tmp/ ("<what>-<unique>", `what` one of kStoreTempKinds), and the
// file there removed when the TempFile goes out of scope (path "" : none yet). Each is made and
// used under a gc hold (a save's batch, a reader's hold, an import's), so one that a gc under the
// exclusive lock finds was left by a process that died: Store::gc deletes it.
inline constexpr const char* kStoreTempKinds[] = {"store-type", "restore-prefix", "restore-move", "import",
                                                  "export-plain"};
std::string temp_name(const StorePaths& p, const char* what);
bool is_store_temp(const std::string& file_name);  // "<one of kStoreTempKinds>-..."
struct TempFile {
  Io& io;
  std::string path;
  ~TempFile();
};

// Writes a new file at `path` through `fill`, buffered, and closes it.
Status write_temp(Io& io, const std::string& path, const std::function<Status(ByteSink&)>& fill);

// Hands the snapshot writer's blobs to the blob store and remembers the chunk
// list. A chunk the catalog already has is not written; the others go into the
// batch's pack. Chunks are looked up in batches (Catalog::find_chunks), so call
// finish() before committing the batch.
class BlobSink final : public ChunkSink {
 public:
  BlobSink(BlobWriteBatch& batch, Catalog& catalog)
      : batch_(batch), catalog_(catalog), hold_bytes_(catalog.lookup_hold_bytes()) {}
  Status put(const ChunkRef& ref, std::span<const std::byte> blob) override;
  // Takes the buffer (its blob is not copied) and leaves a spare one in its place.
  Status put_buffer(const ChunkRef& ref, std::vector<std::byte>& buffer, size_t size) override;
  // The chunks still waiting; call before committing the batch.
  Status finish() { return flush(); }
  std::vector<ChunkUse> uses;
  uint64_t written = 0, bytes_written = 0;

 private:
  // Held chunks are looked up and written once they hold the catalog's lookup_hold_bytes() of
  // new blobs (8 MiB on a catalog server, each new chunk at once on SQLite), or kChunkLookupBatch
  // chunks (a parent's known chunks take no bytes): the pack is written while the encoders
  // work, not in bursts that stall them, and only the last few MiB wait for the end of the encode
  // (measured: docs/store.md "Speed and space").
  struct Pending {
    ChunkRef ref;
    std::vector<std::byte> buffer;  // the blob is its first `size` bytes
    size_t size = 0;
    std::span<const std::byte> blob() const { return {buffer.data(), size}; }
  };
  // Buffers of written chunks, reused by the next ones (and swapped into the encoders' slots by
  // put_buffer): a fresh buffer per chunk cost a page fault per 4 KiB (~10% of a save's CPU).
  std::vector<std::vector<std::byte>> spare_;
  std::vector<std::byte> take_spare();
  Status hold(Pending p);
  Status flush();
  Status store(const ChunkHash& h, const Pending& p, std::optional<ChunkUse>& known);
  BlobWriteBatch& batch_;
  Catalog& catalog_;
  std::vector<Pending> pending_;
  uint64_t held_ = 0;
  const uint64_t hold_bytes_;  // catalog_.lookup_hold_bytes()
};

// Copies the snapshot's original to `out` in order, `threads` decoders ahead of the writer
// (blocks cut between chunks: SnapshotReader::block_bounds).
Status copy_parallel(const SnapshotReader& reader, uint32_t threads, ByteSink& out);

// The catalog row of an mlx-lm snapshot (its manifest, and the original it describes, which is
// read as a prompt cache: the header only).
Result<SnapshotRecord> mlx_record(const SnapshotManifest& m, const ReadableFile& original);

// What an mlx-lm snapshot recorded of its save (the model's name, the tokens given): a save of its
// original again (import into other keys, export --decrypt) records the same.
MlxSnapshotMeta mlx_meta_of(const SnapshotManifest& m);

// An mlx-lm snapshot's original written again as a standalone .kvsnap file with `so` (export
// --decrypt: plain chunk ids).
Status write_mlx_again(const SnapshotReader& r, const SnapshotOptions& so, ByteSink& out);

}  // namespace kvsnap::store_detail
