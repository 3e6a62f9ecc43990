// The kvsnap snapshot reader (format/snapshot.h): a standalone .kvsnap file,
// or, when the input starts with the manifest magic "KVSM", a store's manifest
// (its chunks come from nowhere: every chunk read fails). Then everything a
// consumer reads: the chunks, original() (the first 8 MiB), its parse (as a
// llama.cpp state, or as an mlx-lm prompt cache for an MLXC manifest), the
// prefix chunk list and every chunk's description.
//
// A mutated input almost never matches its own SHA-256s (the DIGS digest of
// the manifest, the trailer's hash of it), which would stop every run at the
// first check. So the harness first writes the right digests into the input
// (when the layout lets it find them), as a hostile writer would, and the
// parsers behind the checks get fuzzed too.
#include <cstring>
#include <vector>

#include "format/chunk_codec.h"

#include "format/mlx_prompt_cache.h"
#include "format/snapshot.h"
#include "fuzz/fuzz_input.h"

namespace {

class NoChunks final : public kvsnap::ChunkSource {
 public:
  kvsnap::Result<std::vector<std::byte>> get(const kvsnap::ChunkRef&) override {
    return kvsnap::Status::NotFound("fuzz: no chunk store");
  }
};

uint64_t load_u64(const std::byte* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);  // little-endian host, as the fuzz build is
  return v;
}

// Writes SHA-256(manifest before DIGS) into DIGS, if the section walk reaches
// a last section of at least 72 bytes (docs/format.md: header 16 bytes,
// sections of tag, flags, u64 length; DIGS: sha, u64, sha).
void reseal_manifest(std::span<std::byte> man) {
  size_t at = 16, last = 0;
  while (at + 16 <= man.size()) {
    last = at;
    const uint64_t len = load_u64(man.data() + at + 8);
    if (len > man.size() - at - 16) return;
    at += 16 + len;
  }
  if (last == 0 || at != man.size() || man.size() - last < 16 + 72) return;
  const kvsnap::Sha256Digest h = kvsnap::sha256_of(man.first(last));
  std::memcpy(man.data() + last + 16 + 40, h.data(), 32);
}

// A standalone file: reseal its manifest, then the trailer's hash of it.
void reseal_file(std::span<std::byte> file) {
  if (file.size() < 96) return;
  std::byte* trailer = file.data() + file.size() - 80;
  const uint64_t off = load_u64(trailer + 16), len = load_u64(trailer + 24);
  if (off > file.size() - 80 || len > file.size() - 80 - off) return;
  std::span<std::byte> man = file.subspan(off, len);
  reseal_manifest(man);
  const kvsnap::Sha256Digest h = kvsnap::sha256_of(man);
  std::memcpy(trailer + 32, h.data(), 32);
}

void read_everything(const kvsnap::SnapshotReader& r) {
  (void)r.verify_chunks();
  kvsnap::fuzz::read_some(r.original(), uint64_t(8) << 20);
  (void)r.parse_original();
  // An mlx-lm prompt cache's snapshot (MLXC): its original is read as restore reads it.
  if (r.manifest().mlx) (void)kvsnap::read_mlx_prompt_cache(r.original());
  (void)r.chunks_for_cell_prefix(1);
  for (uint64_t i = 0; i < r.chunks().size() && i < 4096; ++i) (void)r.describe_chunk(i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvsnap::SnapshotReadOptions opts;
  opts.cache_bytes = 4 << 20;
  std::vector<std::byte> input(kvsnap::fuzz::bytes(data, size).begin(), kvsnap::fuzz::bytes(data, size).end());
  if (size >= 4 && std::memcmp(data, "KVSM", 4) == 0) {
    reseal_manifest(input);
    NoChunks none;
    auto r = kvsnap::open_snapshot(input, none, opts);
    if (r.ok()) read_everything(**r);
    return 0;
  }
  reseal_file(input);
  kvsnap::MemoryFile file("fuzz.kvsnap", std::span<const std::byte>(input));
  auto r = kvsnap::open_snapshot_file(file, opts);
  if (r.ok()) read_everything(**r);
  return 0;
}
