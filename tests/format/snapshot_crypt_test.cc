// Encrypted snapshots (SnapshotOptions::cipher, SnapshotReadOptions::cipher): the original comes
// back byte for byte through both forms (manifest + chunk store, standalone file); chunk ids are
// keyed per tenant; without the key, with the wrong key or another tenant's, every read is a
// clear error and verify_sealed_chunks checks what needs no key; a damaged blob fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "base/byte_order.h"
#include "format/snapshot.h"
#include "format/snapshot_internal.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;
const fs::path kSlot = fs::path(KVSNAP_SOURCE_DIR) / "fixtures/v0.5.0/hd64-f16-f16-faon.slot";

MasterKey key_of(uint8_t fill) {
  std::vector<uint8_t> k(32, fill);
  return MasterKey::from_bytes(k).value();
}

using Blobs = MemoryChunkStore;

struct Saved {
  std::vector<std::byte> original;
  SnapshotManifest m;
};

Saved save(const ChunkCipher* cipher, Blobs& blobs, uint32_t cells_per_chunk = 8) {
  Saved s;
  s.original = test::slurp(kSlot);
  MemoryFile f(kSlot.string(), std::span<const std::byte>(s.original));
  StateFile parsed = parse_state(f).value();
  SnapshotOptions o;
  o.cipher = cipher;
  o.cells_per_chunk = cells_per_chunk;
  o.created = "2026-01-01T00:00:00Z";
  Result<SnapshotManifest> m = build_snapshot(parsed, f, o, blobs);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  s.m = std::move(m).value();
  return s;
}

std::vector<std::byte> read_all_of(const ReadableFile& f, Status* status) {
  std::vector<std::byte> out(f.size());
  *status = f.read_at(0, out);
  return out;
}

TEST(SnapshotCrypt, RoundTripThroughTheStoreForm) {
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  Blobs blobs;
  const Saved s = save(&c, blobs);
  ASSERT_TRUE(s.m.encryption.has_value());
  EXPECT_EQ(s.m.encryption->tenant, "alice");
  EXPECT_EQ(s.m.encryption->master_key_id, c.master_key_id());
  ASSERT_GT(s.m.chunks.size(), 4u);
  for (const ChunkRef& r : s.m.chunks) {
    EXPECT_TRUE(looks_sealed(blobs.blobs.at(r.sha256))) << r.index;
    EXPECT_EQ(r.stored_size, blobs.blobs.at(r.sha256).size());
  }
  // The manifest round-trips with its CRYP section.
  Result<SnapshotManifest> parsed = parse_manifest(s.m.bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(parsed->encryption.has_value());
  EXPECT_EQ(parsed->encryption->tenant_key_id, c.tenant_key_id());

  SnapshotReadOptions ro;
  ro.cipher = &c;
  auto reader = open_snapshot(s.m.bytes, blobs, ro);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Status st;
  EXPECT_EQ(read_all_of((*reader)->original(), &st), s.original);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE((*reader)->verify_chunks().ok());
  EXPECT_TRUE((*reader)->verify_original().ok());
  EXPECT_TRUE((*reader)->verify_sealed_chunks().ok());
}

bool contains(std::span<const std::byte> hay, std::string_view needle) {
  const auto* b = reinterpret_cast<const char*>(hay.data());
  return std::string_view(b, hay.size()).find(needle) != std::string_view::npos;
}

TEST(SnapshotCrypt, RoundTripThroughAStandaloneFile) {
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  const std::vector<std::byte> original = test::slurp(kSlot);
  MemoryFile f(kSlot.string(), std::span<const std::byte>(original));
  StateFile parsed = parse_state(f).value();
  SnapshotOptions o;
  o.cipher = &c;
  o.cells_per_chunk = 8;
  VectorSink out;
  ASSERT_TRUE(write_snapshot_file(parsed, f, o, out).ok());
  // Version 2 in preamble and trailer (an older kvsnap says "upgrade kvsnap"); the manifest is
  // sealed: no section tag, no INFO key, no source name shows.
  EXPECT_EQ(load_le<uint32_t>(out.bytes.data() + 8), 2u);
  EXPECT_EQ(load_le<uint32_t>(out.bytes.data() + 12), 2u);
  EXPECT_EQ(load_le<uint32_t>(out.bytes.data() + out.bytes.size() - 16), 2u);
  for (std::string_view plain : {"KVSM", "TOKN", "CRYP", "provenance", "hd64-f16-f16-faon"}) {
    EXPECT_FALSE(contains(out.bytes, plain)) << plain;
  }
  MemoryFile file("x.kvsnap", std::move(out.bytes));
  SnapshotReadOptions ro;
  ro.cipher = &c;
  auto reader = open_snapshot_file(file, ro);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->encrypted());
  Status st;
  EXPECT_EQ(read_all_of((*reader)->original(), &st), original);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE((*reader)->verify_sealed_chunks().ok());
  // Without the key: the structure and digest are checked, then the key it needs is named.
  auto keyless = open_snapshot_file(file);
  ASSERT_FALSE(keyless.ok());
  EXPECT_EQ(keyless.status().code(), Code::kInvalidArgument);
  EXPECT_NE(keyless.status().message().find("x.kvsnap: an encrypted snapshot file (key " + key_id_hex(c.master_key_id()) +
                                            ", tenant key " + key_id_hex(c.tenant_key_id()) + ")"),
            std::string::npos)
      << keyless.status().message();
  const ChunkCipher wrong = ChunkCipher::for_tenant(key_of(2), "alice").value();
  ro.cipher = &wrong;
  EXPECT_EQ(open_snapshot_file(file, ro).status().code(), Code::kMismatch);
  const ChunkCipher bob = ChunkCipher::for_tenant(key_of(1), "bob").value();
  ro.cipher = &bob;
  EXPECT_EQ(open_snapshot_file(file, ro).status().code(), Code::kMismatch);
}

TEST(SnapshotCrypt, ExportAssemblyKeepsBlobsSealedAndSealsTheManifest) {
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  Blobs blobs;
  const Saved s = save(&c, blobs);
  Result<SnapshotFileAssembler> keyless = SnapshotFileAssembler::plan(s.m, blobs);
  ASSERT_FALSE(keyless.ok());
  EXPECT_EQ(keyless.status().code(), Code::kInvalidArgument);
  const ChunkCipher bob = ChunkCipher::for_tenant(key_of(1), "bob").value();
  EXPECT_EQ(SnapshotFileAssembler::plan(s.m, blobs, &bob).status().code(), Code::kMismatch);
  Result<SnapshotFileAssembler> a = SnapshotFileAssembler::plan(s.m, blobs, &c);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  VectorSink out;
  ASSERT_TRUE(a->write(blobs, out).ok());
  EXPECT_EQ(out.bytes.size(), a->file_size());
  for (const ChunkRef& r : s.m.chunks) {
    const std::vector<std::byte>& b = blobs.blobs.at(r.sha256);
    EXPECT_TRUE(std::search(out.bytes.begin(), out.bytes.end(), b.begin(), b.end()) != out.bytes.end())
        << "chunk " << r.index << " copied as stored";
  }
  EXPECT_FALSE(contains(out.bytes, "TOKN"));
  MemoryFile file("export.kvsnap", std::move(out.bytes));
  SnapshotReadOptions ro;
  ro.cipher = &c;
  auto reader = open_snapshot_file(file, ro);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Status st;
  EXPECT_EQ(read_all_of((*reader)->original(), &st), s.original);
  EXPECT_TRUE((*reader)->verify_original().ok());
}

TEST(SnapshotCrypt, KeyedIdsDedupWithinATenantOnly) {
  const MasterKey k = key_of(1);
  const ChunkCipher a = ChunkCipher::for_tenant(k, "alice").value(), b = ChunkCipher::for_tenant(k, "bob").value();
  Blobs ba, ba2, bb, plain;
  const Saved sa = save(&a, ba), sa2 = save(&a, ba2), sb = save(&b, bb), sp = save(nullptr, plain);
  ASSERT_EQ(sa.m.chunks.size(), sb.m.chunks.size());
  for (size_t i = 0; i < sa.m.chunks.size(); ++i) {
    EXPECT_EQ(sa.m.chunks[i].sha256, sa2.m.chunks[i].sha256) << i << ": same tenant, same id";
    EXPECT_NE(sa.m.chunks[i].sha256, sb.m.chunks[i].sha256) << i << ": another tenant, another id";
    EXPECT_NE(sa.m.chunks[i].sha256, sp.m.chunks[i].sha256) << i << ": not the plain SHA-256";
  }
  // Identical chunks inside one snapshot (the slot has some) still share one blob.
  EXPECT_EQ(ba.blobs.size(), plain.blobs.size());
  // A second save against the first's chunks (a store's parent) encodes nothing again.
  std::map<Sha256Digest, ChunkRef> known;
  for (const ChunkRef& r : sa.m.chunks) known.emplace(r.sha256, r);
  const std::vector<std::byte> original = test::slurp(kSlot);
  MemoryFile f(kSlot.string(), std::span<const std::byte>(original));
  SnapshotOptions o;
  o.cipher = &a;
  o.cells_per_chunk = 8;
  o.known_chunks = &known;
  Blobs fresh;
  ASSERT_TRUE(build_snapshot(parse_state(f).value(), f, o, fresh).ok());
  EXPECT_TRUE(fresh.blobs.empty());
}

TEST(SnapshotCrypt, WrongKeyAndOtherTenantAreToldAtOpen) {
  const ChunkCipher a = ChunkCipher::for_tenant(key_of(1), "alice").value();
  Blobs blobs;
  const Saved s = save(&a, blobs);
  const ChunkCipher wrong = ChunkCipher::for_tenant(key_of(2), "alice").value();
  SnapshotReadOptions ro;
  ro.cipher = &wrong;
  auto r = open_snapshot(s.m.bytes, blobs, ro);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kMismatch);
  EXPECT_NE(r.status().message().find("encrypted with key " + key_id_hex(a.master_key_id()) +
                                      ", but the key given is " + key_id_hex(wrong.master_key_id())),
            std::string::npos)
      << r.status().message();
  const ChunkCipher bob = ChunkCipher::for_tenant(key_of(1), "bob").value();
  ro.cipher = &bob;
  r = open_snapshot(s.m.bytes, blobs, ro);
  EXPECT_EQ(r.status().code(), Code::kMismatch);
  EXPECT_NE(r.status().message().find("another tenant"), std::string::npos) << r.status().message();
}

TEST(SnapshotCrypt, DamagedOrSwappedBlobsFail) {
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  Blobs blobs;
  const Saved s = save(&c, blobs);
  SnapshotReadOptions ro;
  ro.cipher = &c;
  const Sha256Digest first = s.m.chunks[0].sha256, second = s.m.chunks.back().sha256;
  ASSERT_NE(first, second);
  {  // one ciphertext bit: the keyless check cannot see it, the key can
    Blobs bad = blobs;
    bad.blobs[first][kSealedHeaderBytes + 3] ^= std::byte{0x10};
    auto r = open_snapshot(s.m.bytes, bad, ro);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE((*r)->verify_sealed_chunks().ok());
    const Status st = (*r)->verify_chunks();
    EXPECT_EQ(st.code(), Code::kCorruption);
    EXPECT_NE(st.message().find("tampered or corrupt"), std::string::npos) << st.message();
  }
  {  // another chunk's blob under this id: the id is in the tag's data
    Blobs bad = blobs;
    bad.blobs[first] = blobs.blobs[second];
    auto r = open_snapshot(s.m.bytes, bad, ro);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)->verify_chunks().code(), Code::kCorruption);
  }
  {  // a truncated blob: both checks see it
    Blobs bad = blobs;
    bad.blobs[first].resize(bad.blobs[first].size() - 1);
    auto r = open_snapshot(s.m.bytes, bad, ro);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)->verify_sealed_chunks().code(), Code::kCorruption);
    EXPECT_EQ((*r)->verify_chunks().code(), Code::kCorruption);
  }
  {  // a blob sealed by another key under the recorded id: the keyless check names the key
    const ChunkCipher other = ChunkCipher::for_tenant(key_of(2), "alice").value();
    Blobs bad = blobs;
    std::vector<std::byte> plain_blob;
    ASSERT_TRUE(c.open_into(first, blobs.blobs[first], plain_blob).ok());
    std::vector<std::byte> resealed;
    resealed.resize(other.seal_into(first, plain_blob, resealed).value());
    bad.blobs[first] = resealed;
    auto keyless = open_snapshot(s.m.bytes, bad);
    ASSERT_TRUE(keyless.ok());
    EXPECT_EQ((*keyless)->verify_sealed_chunks().code(), Code::kMismatch);
  }
}

TEST(SnapshotCrypt, PlainSnapshotsStayPlain) {
  Blobs blobs;
  const Saved s = save(nullptr, blobs);
  EXPECT_FALSE(s.m.encryption.has_value());
  auto r = open_snapshot(s.m.bytes, blobs);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->encrypted());
  EXPECT_EQ((*r)->verify_sealed_chunks().code(), Code::kInvalidArgument);
  // A sealed blob under a plain snapshot's SHA-256 id is refused, not decrypted.
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  const Sha256Digest first = s.m.chunks[0].sha256;
  std::vector<std::byte> sealed;
  sealed.resize(c.seal_into(first, blobs.blobs[first], sealed).value());
  blobs.blobs[first] = sealed;
  r = open_snapshot(s.m.bytes, blobs);
  ASSERT_TRUE(r.ok());
  const Status st = (*r)->verify_chunks();
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("an encrypted blob in a snapshot whose manifest records no encryption"),
            std::string::npos)
      << st.message();
}

// CRYP is a required section: a reader that does not know it refuses the manifest. Shown by
// renaming it to another unknown tag, which is what CRYP is to kvsnap before this change.
TEST(SnapshotCrypt, CrypIsRequiredSoOldReadersRefuse) {
  const ChunkCipher c = ChunkCipher::for_tenant(key_of(1), "alice").value();
  Blobs blobs;
  Saved s = save(&c, blobs);
  std::vector<std::byte> man = s.m.bytes;
  bool renamed = false;
  for (size_t at = 0; at + 4 <= man.size(); ++at) {
    if (std::memcmp(man.data() + at, "CRYP", 4) == 0) {
      std::memcpy(man.data() + at, "CRYX", 4);
      renamed = true;
      break;
    }
  }
  ASSERT_TRUE(renamed);
  // Reseal the digest as a writer would, so the section check is what fails.
  const size_t digs = man.size() - (snapshot_detail::kSectionHeaderBytes + 72);
  const Sha256Digest h = sha256_of(std::span<const std::byte>(man).first(digs));
  std::memcpy(man.data() + digs + snapshot_detail::kSectionHeaderBytes + 40, h.data(), 32);
  Result<SnapshotManifest> m = parse_manifest(man);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNotSupported);
  EXPECT_NE(m.status().message().find("required section 'CRYX' is unknown"), std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace kvsnap
