// The content digest of a version-3 snapshot (docs/format.md, "The content digest"): one SHA-256
// over the segment table (which places every chunk's bytes in the original file: offsets, sizes,
// row and band geometry) and every chunk's id and raw size, in chunk order.
//
// What it promises:
//  - It identifies the original exactly as the whole-file SHA-256 did: the segment table maps the
//    chunks one to one onto the file's bytes (parse_manifest checks that they tile the file), and
//    each chunk id is the SHA-256 of the chunk's raw bytes (collision-resistant), so two files with
//    the same digest under the same table are the same bytes.
//  - A save computes it from what it already has (every chunk's id), so saving costs no second pass
//    over the file, and an extension hashes only its new chunks.
//  - A verifier recomputes it from the rebuilt original (content_digest_of_original): every chunk
//    is read back from the place the table gives it, not taken from the decoded chunk, so a piece
//    swapped or shifted while reassembling the file fails even when every chunk decodes right.
//  - Keyed for an encrypted snapshot: its chunk ids are the tenant's HMAC-SHA256 ids, so the digest
//    is a function of the plaintext only under the tenant's key (the catalog then records an HMAC
//    of it, as it did of the whole-file SHA-256: src/store/store_seal.h).
#pragma once

#include <cstdint>

#include "base/chunk_cipher.h"
#include "base/io.h"
#include "base/sha256.h"
#include "base/sha256_lanes.h"
#include "base/status.h"
#include "format/llama_state.h"
#include "format/snapshot.h"

namespace kvsnap {

// What `show` calls a rule: "sha256" (version 1), "hmac-sha256" (version 1 encrypted: the store's
// HMAC of it), "chunk-tree" (version 3), "keyed-chunk-tree" (version 3 encrypted).
const char* content_digest_rule_name(ContentDigestRule rule, bool keyed);

// Fed in chunk order; finish() once.
class ContentDigester {
 public:
  // `keyed`: the chunk ids are a tenant's keyed ids (recorded in the digest's input, so a keyed
  // and a plain digest never compare equal).
  ContentDigester(const SegmentTable& t, uint64_t file_size, uint64_t n_chunks, bool keyed);
  void add(uint64_t raw_size, const Sha256Digest& id);
  Sha256Digest finish();

 private:
  Sha256 sha_;
};

// The digest of a manifest's chunk table as recorded (no file read): what a save records.
Sha256Digest content_digest_of_table(const SegmentTable& t, uint64_t file_size, const std::vector<ChunkRef>& chunks,
                                     bool keyed);

// Recomputed from `original`'s bytes: every chunk read back at its place in the file and hashed
// (cipher: its keyed id), as many at a time as `kernel` hashes together (base/sha256_lanes.h: 2
// or 4 with SHA-NI, 8 in AVX2 lanes; the digest is the same whatever the kernel). `original` must have
// the table's size.
Result<Sha256Digest> content_digest_of_original(const SegmentTable& t, const ReadableFile& original,
                                                const ChunkCipher* cipher, Sha256Kernel kernel = sha256_kernel());

// The SHA-256 of a whole file, read front to back in 1 MiB pieces: version 1's content digest.
Result<Sha256Digest> whole_file_sha256(const ReadableFile& f);

// `kvsnap digest FILE`: the content digest a save of this parsed state would record with
// `cells_per_chunk` (plain chunk ids), and the file's SHA-256. With `grid_of` (a snapshot's
// segment table), on that snapshot's cell grid (format version 4: adopt_cell_grids), so a file
// restored from it gets its recorded digest back; with `cipher`, the keyed digest (its chunk ids
// are the tenant's HMACs, as an encrypted store records).
struct StateDigests {
  Sha256Digest content_digest{};
  Sha256Digest sha256{};
};
Result<StateDigests> state_digests(const StateFile& parsed, const ReadableFile& original, uint32_t cells_per_chunk,
                                   const SegmentTable* grid_of = nullptr, const ChunkCipher* cipher = nullptr);

}  // namespace kvsnap
