// Encrypted chunk blobs (base/chunk_cipher.h) on hostile input: the header parser, the key-id
// checks and AES-GCM's open under a fixed key (bytes 0..31), plus the key material parser.
//
// Input: byte 0 picks the tenant (low 2 bits) or, with bit 7 set, feeds the rest to
// parse_master_key; then the 32-byte chunk id; then the blob. The seeds (make_corpus.py) are
// blobs sealed by Python's `cryptography` for those ids, so mutations start past the tag check's
// inputs: a mutated blob must fail cleanly, an unmutated one opens.
#include <array>
#include <cstring>
#include <string_view>
#include <vector>

#include "base/chunk_cipher.h"
#include "fuzz/fuzz_input.h"

namespace {

const kvsnap::MasterKey& fuzz_key() {
  static const kvsnap::MasterKey k = [] {
    std::array<uint8_t, 32> b{};
    for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(i);
    return kvsnap::MasterKey::from_bytes(b).value();
  }();
  return k;
}

constexpr std::array<std::string_view, 3> kTenants = {"alice", "bob", "acme-prod_1.eu@x"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvsnap;
  const std::span<const std::byte> in = fuzz::bytes(data, size);
  if (size < 1) return 0;
  if (data[0] & 0x80) {
    (void)parse_master_key(in.subspan(1), "fuzz key");
    return 0;
  }
  (void)parse_sealed_header(in.subspan(1), "fuzz blob");
  if (size < 33) return 0;
  static const std::array<ChunkCipher, 3> ciphers = {ChunkCipher::for_tenant(fuzz_key(), kTenants[0]).value(),
                                                     ChunkCipher::for_tenant(fuzz_key(), kTenants[1]).value(),
                                                     ChunkCipher::for_tenant(fuzz_key(), kTenants[2]).value()};
  const ChunkCipher& c = ciphers[(data[0] & 3) % 3];
  ChunkId id{};
  std::memcpy(id.data(), data + 1, id.size());
  const std::span<const std::byte> blob = in.subspan(33);
  (void)c.check_without_decrypting(blob, "fuzz blob");
  std::vector<std::byte> plain;
  const Status s = c.open_into(id, blob, plain);
  // Plaintext only ever comes out of a blob that passed its tag; it then has its header's size.
  if (!s.ok() && !plain.empty()) __builtin_trap();
  if (s.ok() && plain.size() + kSealedHeaderBytes + kSealedTagBytes != blob.size()) __builtin_trap();
  return 0;
}
