// A write batch's pack as append() keeps account of it, the same for every
// backend (local_blob_store.cc, s3_blob_store.cc): the pack's name, its size so
// far and where each blob appended to it is. The file the bytes go to is the
// backend's. Not thread-safe: the batch's mutex guards it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "store/blob_store.h"

namespace kvsnap {

class PackTally {
 public:
  // Where `h` is when this batch appended it already (append() writes a blob once).
  const BlobLocation* find(const ChunkHash& h) const {
    auto it = blobs_.find(h);
    return it == blobs_.end() ? nullptr : &it->second;
  }
  // A new pack, named by new_pack_name(), empty so far. Blobs of an earlier,
  // committed pack keep their locations.
  void start() {
    name_ = new_pack_name();
    size_ = 0;
  }
  // `size` bytes of `h` were appended at the end of the pack: where they are.
  BlobLocation add(const ChunkHash& h, uint64_t size) {
    BlobLocation where{name_, size_, size};
    size_ += size;
    blobs_.emplace(h, where);
    return where;
  }
  // Forgets the pack and every location handed out (they will never exist, or
  // the next appends must not lean on them).
  void clear() {
    name_.clear();
    size_ = 0;
    blobs_.clear();
  }
  const std::string& name() const { return name_; }
  uint64_t size() const { return size_; }

 private:
  std::string name_;
  uint64_t size_ = 0;
  std::map<ChunkHash, BlobLocation> blobs_;
};

}  // namespace kvsnap
