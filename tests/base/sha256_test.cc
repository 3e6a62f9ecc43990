// base/sha256.h against the FIPS 180-2 test vectors.
#include "base/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace kvsnap {
namespace {

std::span<const std::byte> bytes(const std::string& s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }

TEST(Sha256, KnownVectorsIncrementalPeekAndCopy) {
  EXPECT_EQ(to_hex(sha256_of({})), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256_of(bytes("abc"))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 h;
  h.update(bytes("a"));
  Sha256 copy(h);
  EXPECT_EQ(h.peek(), sha256_of(bytes("a")));
  h.update(bytes("bc"));
  copy.update(bytes("bc"));
  EXPECT_EQ(h.peek(), copy.finish());
  EXPECT_EQ(h.finish(), sha256_of(bytes("abc")));
  EXPECT_EQ(h.finish(), sha256_of({})) << "finish starts over";
}

TEST(Sha256, HexRoundTripAndRejects) {
  Sha256Digest d = sha256_of(bytes("abc")), back{};
  ASSERT_TRUE(from_hex(to_hex(d), back));
  EXPECT_EQ(back, d);
  std::string upper = to_hex(d);
  for (char& c : upper) c = char(std::toupper(c));
  ASSERT_TRUE(from_hex(upper, back));
  EXPECT_EQ(back, d);
  EXPECT_FALSE(from_hex(to_hex(d).substr(1), back));
  EXPECT_FALSE(from_hex(std::string(64, 'g'), back));
  EXPECT_EQ(to_hex(std::span<const uint8_t>()), "");
}

}  // namespace
}  // namespace kvsnap
