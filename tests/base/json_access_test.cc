// base/json_access.h: outside JSON read without exceptions; every error names
// the document, the key path and the type that was found.
#include "base/json_access.h"

#include <gtest/gtest.h>

namespace kvsnap {
namespace {

nlohmann::json doc(const char* text) {
  auto j = parse_json(text, "t");
  EXPECT_TRUE(j.ok()) << j.status().ToString();
  return j.ok() ? *j : nlohmann::json();
}

void expect_error(const Status& s, const std::string& message) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_EQ(s.message(), message);
}

TEST(JsonAccess, ParseNeverThrows) {
  for (const char* bad : {"", "{", "[1,", "nul", "\"\\u12\"", "{\"a\":}", "1 2"}) {
    auto j = parse_json(bad, "reply");
    ASSERT_FALSE(j.ok()) << bad;
    EXPECT_EQ(j.status().message(), "reply: not valid JSON");
  }
  EXPECT_EQ(parse_json("x", "reply", Code::kMismatch).status().code(), Code::kMismatch);
}

TEST(JsonAccess, ErrorsNameDocumentPathAndType) {
  const nlohmann::json j = doc(R"({"snapshots": [{"uuid": "a"}, {"uuid": 12345}], "n": -1, "big": 99999999999})");
  const JsonRef root(j, "export index");
  auto snaps = root.at("snapshots");
  ASSERT_TRUE(snaps.ok());
  auto elems = snaps->elements();
  ASSERT_TRUE(elems.ok());
  ASSERT_EQ(elems->size(), 2u);
  auto a = (*elems)[0].at("uuid");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a->string(), "a");
  expect_error((*elems)[1].at("uuid")->string().status(), "export index: snapshots[1].uuid: expected a string, got number");
  expect_error((*elems)[1].at("file").status(), "export index: snapshots[1]: no \"file\"");
  expect_error(snaps->at("x").status(), "export index: snapshots: expected an object, got array");
  expect_error(root.elements().status(), "export index: expected an array, got object");
  expect_error(root.at("n")->unsigned_integer().status(), "export index: n: expected a non-negative integer, got number");
  expect_error(root.integer_or("big", 0, 0, INT32_MAX).status(),
               "export index: big: 99999999999 is out of range (expected in 0..2147483647)");
  EXPECT_EQ(*root.integer_or("n", 0), -1);
}

// nlohmann stores 0 and every positive literal as unsigned: the lower bound must hold for them too.
TEST(JsonAccess, IntegerLowerBoundHoldsForNonNegativeLiterals) {
  const nlohmann::json j = doc(R"({"zero": 0, "three": 3, "minus": -2})");
  const JsonRef root(j, "body");
  expect_error(root.integer_or("zero", 7, 1, 10).status(), "body: zero: 0 is out of range (expected in 1..10)");
  expect_error(root.integer_or("three", 7, 4, 10).status(), "body: three: 3 is out of range (expected in 4..10)");
  expect_error(root.integer_or("minus", 7, -1, 10).status(), "body: minus: -2 is out of range (expected in -1..10)");
  EXPECT_EQ(*root.integer_or("three", 7, 3, 3), 3);
  EXPECT_EQ(*root.integer_or("zero", 7, 0, 10), 0);
  EXPECT_EQ(*root.integer_or("absent", 7, 1, 10), 7);
}

TEST(JsonAccess, OptionalMembersTakeTheirDefaultOnlyWhenAbsentOrNull) {
  const nlohmann::json j = doc(R"({"s": "x", "z": null, "b": true, "d": 1.5, "wrong": [1]})");
  const JsonRef r(j, "servers.json");
  EXPECT_EQ(*r.string_or("s", "?"), "x");
  EXPECT_EQ(*r.string_or("z", "?"), "?");
  EXPECT_EQ(*r.string_or("absent", "?"), "?");
  EXPECT_TRUE(*r.boolean_or("b", false));
  EXPECT_EQ(*r.number_or("d", 0), 1.5);
  EXPECT_EQ(*r.unsigned_or("absent", 7), 7u);
  expect_error(r.string_or("wrong", "").status(), "servers.json: wrong: expected a string, got array");
  expect_error(r.boolean_or("s", false).status(), "servers.json: s: expected a boolean, got string");
  expect_error(r.integer_or("d", 0).status(),
               "servers.json: d: expected an integer in -9223372036854775808..9223372036854775807, got number");
  auto members = r.members();
  ASSERT_TRUE(members.ok());
  EXPECT_EQ(members->size(), 5u);
}

TEST(JsonAccess, OrderedDocumentsToo) {
  const nlohmann::ordered_json j = {{"lossy", {{"from_k", 3}}}};
  const OrderedJsonRef r(j, "snapshot INFO");
  auto lossy = r.find("lossy");
  ASSERT_TRUE(lossy.ok() && lossy->has_value());
  expect_error((**lossy).string_or("from_k", "?").status(), "snapshot INFO: lossy.from_k: expected a string, got number");
}

}  // namespace
}  // namespace kvsnap
