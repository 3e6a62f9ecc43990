// base/chunk_cipher.h: HKDF against RFC 5869, keyed ids, sealed blobs under every kind of
// damage (each flipped bit, truncation, another id, key or tenant), key material parsing.
#include "base/chunk_cipher.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "test_files.h"

namespace kvsnap {
namespace {

std::span<const std::byte> bytes(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

std::vector<uint8_t> unhex(std::string_view h) {
  std::vector<uint8_t> out(h.size() / 2);
  EXPECT_TRUE(from_hex(h, std::span<uint8_t>(out)));
  return out;
}

MasterKey key_of(uint8_t fill) {
  std::vector<uint8_t> k(32);
  for (size_t i = 0; i < k.size(); ++i) k[i] = uint8_t(fill + i);
  return MasterKey::from_bytes(k).value();
}

ChunkCipher cipher(const MasterKey& k, std::string_view tenant) { return ChunkCipher::for_tenant(k, tenant).value(); }

std::vector<std::byte> seal(const ChunkCipher& c, const ChunkId& id, std::span<const std::byte> plain) {
  std::vector<std::byte> blob;
  Result<size_t> n = c.seal_into(id, plain, blob);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  blob.resize(n.ok() ? *n : 0);
  return blob;
}

// fuzz_chunk_cipher's tenants (tests/fuzz/fuzz_chunk_cipher.cc), picked by a seed's first byte.
constexpr std::array<std::string_view, 3> kFuzzTenants = {"alice", "bob", "acme-prod_1.eu@x"};

std::vector<std::byte> some_bytes(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131 + 7) & 0xff);
  return v;
}

// A chunk of n bytes sealed by a tenant's cipher: what most tests start from.
struct Sealed {
  ChunkCipher c;
  std::vector<std::byte> raw;
  ChunkId id;
  std::vector<std::byte> blob;
};
Sealed sealed(const MasterKey& k, std::string_view tenant, size_t n) {
  ChunkCipher c = cipher(k, tenant);
  std::vector<std::byte> raw = some_bytes(n);
  const ChunkId id = c.chunk_id(raw);
  std::vector<std::byte> blob = seal(c, id, raw);
  return Sealed{std::move(c), std::move(raw), id, std::move(blob)};
}

// RFC 5869 appendix A: test case 1 (salt and info) and 3 (neither), through hkdf_sha256.
TEST(ChunkCipher, HkdfMatchesRfc5869) {
  const std::vector<uint8_t> ikm(22, 0x0b);
  const std::vector<uint8_t> salt = unhex("000102030405060708090a0b0c");
  const std::vector<uint8_t> info = unhex("f0f1f2f3f4f5f6f7f8f9");
  std::vector<uint8_t> okm(42);
  ASSERT_TRUE(hkdf_sha256(ikm, salt, info, okm).ok());
  EXPECT_EQ(to_hex(okm), "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  ASSERT_TRUE(hkdf_sha256(ikm, {}, {}, okm).ok());
  EXPECT_EQ(to_hex(okm), "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
  std::vector<uint8_t> none;
  EXPECT_EQ(hkdf_sha256(ikm, salt, info, none).code(), Code::kInvalidArgument);
  std::vector<uint8_t> too_long(255 * 32 + 1);
  EXPECT_EQ(hkdf_sha256(ikm, salt, info, too_long).code(), Code::kInvalidArgument);
}

TEST(ChunkCipher, RoundTripAtEverySize) {
  const MasterKey k = key_of(1);
  const ChunkCipher c = cipher(k, "alice");
  std::vector<std::byte> plain;
  for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(4096), size_t(3) << 20}) {
    const std::vector<std::byte> raw = some_bytes(n);
    const ChunkId id = c.chunk_id(raw);
    const std::vector<std::byte> blob = seal(c, id, raw);
    ASSERT_EQ(blob.size(), n + kSealedHeaderBytes + kSealedTagBytes);
    Status s = c.open_into(id, blob, plain);
    ASSERT_TRUE(s.ok()) << n << ": " << s.ToString();
    EXPECT_EQ(plain, raw) << n;
    EXPECT_TRUE(c.check_without_decrypting(blob, "blob").ok());
  }
}

TEST(ChunkCipher, SealIntoReusesALargerBufferAndNoncesDiffer) {
  const ChunkCipher c = cipher(key_of(1), "alice");
  const std::vector<std::byte> raw = some_bytes(100);
  const ChunkId id = c.chunk_id(raw);
  std::vector<std::byte> buf(10000, std::byte{0x55});
  Result<size_t> n = c.seal_into(id, raw, buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 156u);
  EXPECT_EQ(buf.size(), 10000u) << "never shrunk";
  const std::vector<std::byte> a(buf.begin(), buf.begin() + 156);
  const std::vector<std::byte> b = seal(c, id, raw);
  EXPECT_NE(a, b) << "a fresh random nonce per seal";
  std::vector<std::byte> plain;
  EXPECT_TRUE(c.open_into(id, a, plain).ok());
  EXPECT_TRUE(c.open_into(id, b, plain).ok());
}

TEST(ChunkCipher, KeyedIdsDedupWithinATenantOnly) {
  const MasterKey k = key_of(1);
  const ChunkCipher a = cipher(k, "alice"), a2 = cipher(k, "alice"), b = cipher(k, "bob");
  const ChunkCipher other_master = cipher(key_of(2), "alice");
  const std::vector<std::byte> raw = some_bytes(4096);
  EXPECT_EQ(a.chunk_id(raw), a2.chunk_id(raw)) << "same plaintext, same tenant: same id (dedup)";
  EXPECT_NE(a.chunk_id(raw), b.chunk_id(raw)) << "another tenant: another id";
  EXPECT_NE(a.chunk_id(raw), other_master.chunk_id(raw));
  EXPECT_NE(a.chunk_id(raw), sha256_of(raw)) << "not the plain SHA-256 anyone could compute";
  EXPECT_NE(a.chunk_id(raw), a.chunk_id(some_bytes(4095)));
  EXPECT_EQ(a.master_key_id(), b.master_key_id());
  EXPECT_NE(a.tenant_key_id(), b.tenant_key_id());
  EXPECT_EQ(a.master_key_id(), k.id());
  EXPECT_NE(k.id(), key_of(2).id());
}

// Every bit of a sealed blob (header, nonce, size, ciphertext, tag) flipped on its own: each
// fails, with the code of what the flip hit, and no plaintext comes out.
TEST(ChunkCipher, EveryFlippedBitFails) {
  const auto [c, raw, id, blob] = sealed(key_of(1), "alice", 64);
  std::vector<std::byte> plain;
  for (size_t at = 0; at < blob.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<std::byte> bad = blob;
      bad[at] ^= std::byte(1 << bit);
      const Status s = c.open_into(id, bad, plain);
      ASSERT_FALSE(s.ok()) << "byte " << at << " bit " << bit;
      EXPECT_TRUE(plain.empty()) << "byte " << at;
      Code want = Code::kCorruption;  // magic, reserved, size, nonce, ciphertext, tag
      if (at == 4 || at == 5) want = Code::kNotSupported;  // version, algorithm
      if (at >= 8 && at < 24) want = Code::kMismatch;       // the key ids: "wrong key / tenant"
      EXPECT_EQ(s.code(), want) << "byte " << at << " bit " << bit << ": " << s.ToString();
      if ((at >= 24 && at < 36) || at >= kSealedHeaderBytes) {
        EXPECT_NE(s.message().find("tampered or corrupt"), std::string::npos) << s.message();
      }
    }
  }
}

TEST(ChunkCipher, TruncatedOrExtendedBlobsFail) {
  const auto [c, raw, id, blob] = sealed(key_of(1), "alice", 64);
  std::vector<std::byte> plain;
  for (size_t n = 0; n < blob.size(); ++n) {
    const Status s = c.open_into(id, std::span<const std::byte>(blob).first(n), plain);
    EXPECT_EQ(s.code(), Code::kCorruption) << n;
    EXPECT_EQ(c.check_without_decrypting(std::span<const std::byte>(blob).first(n), "b").code(), Code::kCorruption);
  }
  std::vector<std::byte> longer = blob;
  longer.push_back(std::byte{0});
  EXPECT_EQ(c.open_into(id, longer, plain).code(), Code::kCorruption);
}

TEST(ChunkCipher, WrongKeyIsAClearMismatchNamingBothKeyIds) {
  const MasterKey right = key_of(1), wrong = key_of(2);
  const auto [c, raw, id, blob] = sealed(right, "alice", 64);
  std::vector<std::byte> plain;
  const Status s = cipher(wrong, "alice").open_into(id, blob, plain);
  EXPECT_EQ(s.code(), Code::kMismatch);
  EXPECT_NE(s.message().find("encrypted with key " + key_id_hex(right.id())), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("the key given is " + key_id_hex(wrong.id())), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("chunk " + to_hex(id)), std::string::npos) << s.message();
  EXPECT_EQ(cipher(wrong, "alice").check_without_decrypting(blob, "b").code(), Code::kMismatch);
}

TEST(ChunkCipher, AnotherTenantsChunkFails) {
  const MasterKey k = key_of(1);
  auto [a, raw, id, blob] = sealed(k, "alice", 64);
  const ChunkCipher b = cipher(k, "bob");
  std::vector<std::byte> plain;
  Status s = b.open_into(id, blob, plain);
  EXPECT_EQ(s.code(), Code::kMismatch);
  EXPECT_NE(s.message().find("another tenant"), std::string::npos) << s.message();
  // Relabelled as bob's (the tenant key id rewritten): bob's key cannot authenticate it.
  std::copy(b.tenant_key_id().begin(), b.tenant_key_id().end(), reinterpret_cast<uint8_t*>(blob.data()) + 16);
  s = b.open_into(id, blob, plain);
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_NE(s.message().find("tampered or corrupt"), std::string::npos) << s.message();
  EXPECT_TRUE(plain.empty());
}

TEST(ChunkCipher, ABlobMovedToAnotherIdFails) {
  const ChunkCipher c = cipher(key_of(1), "alice");
  const std::vector<std::byte> raw = some_bytes(64), other = some_bytes(65);
  const std::vector<std::byte> blob = seal(c, c.chunk_id(raw), raw);
  std::vector<std::byte> plain;
  const Status s = c.open_into(c.chunk_id(other), blob, plain, "chunk 7");
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_EQ(s.message().rfind("chunk 7: tampered or corrupt", 0), 0u) << s.message();
}

TEST(ChunkCipher, HeaderWithoutTheKey) {
  const auto [c, raw, id, blob] = sealed(key_of(1), "alice", 10);
  ASSERT_TRUE(looks_sealed(blob));
  EXPECT_FALSE(looks_sealed(bytes("KVCB....")));
  Result<SealedHeader> h = parse_sealed_header(blob, "b");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->payload_size, 10u);
  EXPECT_EQ(h->master_key_id, c.master_key_id());
  EXPECT_EQ(h->tenant_key_id, c.tenant_key_id());
  EXPECT_TRUE(check_sealed_key_ids(*h, c.master_key_id(), c.tenant_key_id(), "b").ok());
  EXPECT_EQ(check_sealed_key_ids(*h, KeyId{}, c.tenant_key_id(), "b").code(), Code::kMismatch);
  // A payload size past the bound is refused before anything is sized by it.
  std::vector<std::byte> huge = blob;
  huge[36] = huge[37] = huge[38] = huge[39] = std::byte{0xff};
  EXPECT_EQ(parse_sealed_header(huge, "b").status().code(), Code::kCorruption);
}

TEST(ChunkCipher, TenantNames) {
  EXPECT_TRUE(check_tenant_name("acme-prod_1.eu@x").ok());
  EXPECT_EQ(check_tenant_name("").code(), Code::kInvalidArgument);
  EXPECT_EQ(check_tenant_name(std::string(129, 'a')).code(), Code::kInvalidArgument);
  EXPECT_EQ(check_tenant_name("a b").code(), Code::kInvalidArgument);
  EXPECT_EQ(check_tenant_name(std::string("a\0b", 3)).code(), Code::kInvalidArgument);
  EXPECT_FALSE(ChunkCipher::for_tenant(key_of(1), "a\nb").ok());
}

// --- Key material ------------------------------------------------------------------------------

const std::string kHex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

TEST(ChunkCipher, KeyMaterialHexAndRaw) {
  const MasterKey want = key_of(0);
  for (std::string text : {kHex, kHex + "\n", kHex + "\r\n"}) {
    Result<MasterKey> k = parse_master_key(bytes(text), "key file k");
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_EQ(k->id(), want.id());
  }
  std::string upper = kHex;
  for (char& ch : upper) ch = char(std::toupper(ch));
  ASSERT_TRUE(parse_master_key(bytes(upper), "k").ok());
  EXPECT_EQ(parse_master_key(bytes(upper), "k")->id(), want.id());
  const std::vector<uint8_t> raw = unhex(kHex);
  Result<MasterKey> r = parse_master_key({reinterpret_cast<const std::byte*>(raw.data()), raw.size()}, "k");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->id(), want.id());
  // A raw key may hold any byte, a newline at the end included.
  std::vector<uint8_t> raw_nl = raw;
  raw_nl.back() = '\n';
  EXPECT_TRUE(parse_master_key({reinterpret_cast<const std::byte*>(raw_nl.data()), raw_nl.size()}, "k").ok());
}

TEST(ChunkCipher, KeyMaterialRefusals) {
  auto refused = [](const std::string& text) {
    Result<MasterKey> k = parse_master_key(bytes(text), "key file /k");
    EXPECT_FALSE(k.ok()) << text.size();
    if (k.ok()) return std::string();
    EXPECT_EQ(k.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(k.status().message().rfind("key file /k: ", 0), 0u) << k.status().message();
    return k.status().message();
  };
  EXPECT_NE(refused(kHex.substr(2)).find("62 hex digits"), std::string::npos);
  EXPECT_NE(refused(kHex + "00").find("66 hex digits"), std::string::npos);
  EXPECT_NE(refused(kHex + "\n\n").find("66 bytes"), std::string::npos);
  EXPECT_NE(refused(std::string(31, 'x')).find("31 bytes"), std::string::npos);
  EXPECT_NE(refused(std::string(33, 'x')).find("33 bytes"), std::string::npos);
  EXPECT_NE(refused("").find("0 bytes"), std::string::npos);
  // A hex key cut to 31 digits and a newline is 32 bytes: refused, not taken as a raw key.
  EXPECT_NE(refused(kHex.substr(0, 31) + "\n").find("31 hex digits"), std::string::npos);
  EXPECT_NE(refused(kHex.substr(0, 32)).find("32 hex digits"), std::string::npos);
  std::string bad = kHex;
  bad[17] = 'g';
  const std::string m = refused(bad);
  EXPECT_NE(m.find("byte 17 is not a hex digit"), std::string::npos) << m;
  EXPECT_EQ(m.find(kHex.substr(0, 16)), std::string::npos) << "the key never appears in a message";
  bad = kHex;
  bad[63] = ' ';
  EXPECT_NE(refused(bad).find("byte 63"), std::string::npos);
  EXPECT_FALSE(MasterKey::from_bytes(std::vector<uint8_t>(31)).ok());
}

// Blobs sealed by an independent implementation (Python's `cryptography`, tests/fuzz/make_corpus.py):
// the fuzz seeds of fuzz_chunk_cipher, under its key (bytes 0..31). A seed is one byte picking the
// tenant, the 32-byte chunk id, the blob; the plaintext is bytes (i * 131 + 7) & 0xff. They open
// here, so the documented format, HKDF labels, keyed ids and key ids are what the code does.
TEST(ChunkCipher, OpensBlobsSealedByAnIndependentImplementation) {
  const std::filesystem::path dir = std::filesystem::path(KVSNAP_SOURCE_DIR) / "tests/fuzz/corpus/chunk_cipher";
  const MasterKey k = key_of(0);
  int opened = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::vector<std::byte> seed = test::slurp(e.path());
    ASSERT_GE(seed.size(), 1u) << e.path();
    if (seed[0] == std::byte{0x80}) continue;  // key material, not a blob
    ASSERT_GT(seed.size(), 33u) << e.path();
    const ChunkCipher c = cipher(k, kFuzzTenants[size_t(seed[0]) % kFuzzTenants.size()]);
    ChunkId id{};
    std::memcpy(id.data(), seed.data() + 1, id.size());
    std::vector<std::byte> plain;
    const Status s = c.open_into(id, std::span<const std::byte>(seed).subspan(33), plain);
    ASSERT_TRUE(s.ok()) << e.path() << ": " << s.ToString();
    EXPECT_EQ(plain, some_bytes(plain.size())) << e.path();
    EXPECT_EQ(c.chunk_id(plain), id) << e.path() << ": the keyed id of the plaintext";
    ++opened;
  }
  EXPECT_GE(opened, 3);
}

}  // namespace
}  // namespace kvsnap
