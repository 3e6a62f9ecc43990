// Export archives (src/store/archive.h): the tar/zstd/gzip/xz walk with its
// limits, then the export index (kvsnap-export.json) when the archive has one.
#include "fuzz/fuzz_input.h"
#include "store/archive.h"
#include "store/store.h"

namespace {

// Keeps the index; counts the rest (a real import writes them to files).
class Collect final : public kvsnap::ArchiveVisitor {
 public:
  kvsnap::Status begin_entry(const kvsnap::ArchiveEntryInfo& e) override {
    in_index_ = e.name == "kvsnap-export.json";
    return kvsnap::Status::OK();
  }
  kvsnap::Status entry_data(std::span<const std::byte> piece) override {
    if (in_index_ && index.size() < (1u << 20)) index.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    return kvsnap::Status::OK();
  }
  kvsnap::Status end_entry() override { return kvsnap::Status::OK(); }
  std::string index;

 private:
  bool in_index_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvsnap::MemoryFile file("fuzz.tar", kvsnap::fuzz::bytes(data, size));
  kvsnap::ArchiveReadOptions o;
  o.ratio_floor_bytes = 16 << 20;  // the bomb guard trips sooner than the 2 GB RSS limit
  Collect v;
  if (!kvsnap::read_archive(file, v, o).ok()) return 0;
  (void)kvsnap::parse_export_index(v.index, "fuzz.tar");
  return 0;
}
