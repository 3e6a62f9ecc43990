// base/json_access.h: outside JSON read without exceptions; every error names
// the document, the key path and the type that was found.
#include "base/json_access.h"

#include "base/text.h"

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

// The builder is checked against nlohmann's own DOM parser (the reference) on documents of every
// kind of value; key order is the document's for ordered_json.
template <class Json>
void expect_same_as_nlohmann(const std::string& text) {
  SCOPED_TRACE(text);
  auto ours = parse_json<Json>(text, "t");
  ASSERT_TRUE(ours.ok()) << ours.status().ToString();
  const Json reference = Json::parse(text);
  EXPECT_EQ(*ours, reference);
  EXPECT_EQ(json_text(*ours), json_text(reference));
}

TEST(JsonAccess, ParsedDocumentsEqualNlohmannsOwnParse) {
  for (const std::string text : {
           R"(null)", R"(true)", R"(-12)", R"(18446744073709551615)", R"(1.5e-7)", R"("s\u00e9")", R"([])", R"({})",
           R"({"z": 1, "a": [1, {"y": null, "b": [[], {}]}, "x"], "m": {"k": false, "c": 2.25}})",
           R"([[[{"a": [{"b": {"c": [1, 2, 3]}}]}]], {"d": -0.0}, 9223372036854775807, -9223372036854775808])",
       }) {
    expect_same_as_nlohmann<nlohmann::json>(text);
    expect_same_as_nlohmann<nlohmann::ordered_json>(text);
  }
}

// nlohmann's parser searched every earlier key of an ordered_json object for each new one: this
// document took minutes. Its keys stay in order.
TEST(JsonAccess, AnObjectOfManyKeysParsesInOrder) {
  constexpr int kKeys = 200000;
  std::string text = "{";
  for (int i = 0; i < kKeys; ++i) text += (i ? ",\"k" : "\"k") + std::to_string(kKeys - i) + "\":" + std::to_string(i);
  text += "}";
  auto j = parse_json<nlohmann::ordered_json>(text, "t");
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  ASSERT_EQ(j->size(), size_t(kKeys));
  int i = 0;
  for (const auto& [k, v] : j->items()) {
    ASSERT_EQ(k, "k" + std::to_string(kKeys - i));
    ASSERT_EQ(v, i);
    ++i;
  }
  EXPECT_EQ((*j)["k1"], kKeys - 1);
}

// nlohmann keeps the last of two equal keys; two readers of one document could then disagree.
TEST(JsonAccess, ARepeatedKeyIsRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"a": 1, "a": 2})", "a"},
      {R"({"x": {"b": 1, "c": 2, "b": 3}})", "b"},
      {R"([{"a": 1}, {"a": {"a": 1, "a": 1}}])", "a"},
  };
  for (const auto& [text, key] : cases) {
    const std::string message = std::string("t: not valid JSON: key '") + key + "' appears twice in one object";
    expect_error(parse_json<nlohmann::json>(text, "t").status(), message);
    expect_error(parse_json<nlohmann::ordered_json>(text, "t").status(), message);
  }
  EXPECT_TRUE(parse_json(R"([{"a": 1}, {"a": 2}, {"b": {"a": 3}}])", "t").ok());  // one key in many objects
}

// As operator[] would build it (order of first appearance, last value), in linear time: an mlx-lm
// file's metadata of many keys went through operator[], n^2 / 2 key comparisons.
TEST(JsonAccess, OrderedObjectOfPairsIsOperatorBracketsInLinearTime) {
  const std::vector<std::pair<std::string, std::string>> few = {{"z", "1"}, {"a", "2"}, {"z", "3"}, {"m", "4"}};
  nlohmann::ordered_json by_brackets;
  for (const auto& [k, v] : few) by_brackets[k] = v;
  EXPECT_EQ(json_text(ordered_object_of(few)), json_text(by_brackets));
  EXPECT_EQ(json_text(ordered_object_of({})), "{}");
  std::vector<std::pair<std::string, std::string>> many;
  for (int i = 0; i < 200000; ++i) many.emplace_back("key" + std::to_string(199999 - i), std::to_string(i));
  const nlohmann::ordered_json j = ordered_object_of(many);
  ASSERT_EQ(j.size(), many.size());
  EXPECT_EQ(j.begin().key(), "key199999");
  EXPECT_EQ((--j.end()).key(), "key0");
}

TEST(JsonAccess, NestingIsBounded) {
  auto nested = [](size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  EXPECT_TRUE(parse_json(nested(kMaxJsonDepth), "t").ok());
  EXPECT_TRUE(parse_json<nlohmann::ordered_json>("{\"a\":" + nested(kMaxJsonDepth - 1) + "}", "t").ok());
  for (size_t depth : {kMaxJsonDepth + 1, size_t(1) << 20}) {
    expect_error(parse_json(nested(depth), "reply").status(),
                 "reply: not valid JSON: nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
}

// The text rules of labels (base/text.h): well-formed UTF-8 only, and a path of another encoding
// escaped byte by byte into one (migrate --backup-store's migrated-from tag).
TEST(Text, Utf8IsCheckedAndOtherBytesEscaped) {
  for (const char* good : {"", "chat-42", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"})
    EXPECT_TRUE(is_valid_utf8(good)) << good;
  for (const char* bad : {"caf\xe9", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc3",
                          "\xe2\x82", "\xff", "\x80"})
    EXPECT_FALSE(is_valid_utf8(bad)) << bad;
  EXPECT_EQ(utf8_escaped("/slots/caf\xe9/a.bin"), "/slots/caf\\xe9/a.bin");
  EXPECT_EQ(utf8_escaped("caf\xc3\xa9 \xe2\x82"), "caf\xc3\xa9 \\xe2\\x82");
  EXPECT_TRUE(is_valid_utf8(utf8_escaped("\xff\xfe\xc3")));
}

// What may not be in a label an import brings: C0 controls but tab, DEL, C1 (CSI U+009B), the
// bidirectional embeddings, overrides and isolates; letters near them in the encoding (U+00A0,
// U+00E9, U+2010, U+2030, U+2065, U+206A, U+0620) and the marks of right-to-left text (U+200E,
// U+200F, U+061C) are text.
TEST(Text, TerminalControlsAreFound) {
  for (const char* good : {"", "chat 42", "tab\tok", "caf\xc3\xa9", "\xc2\xa0", "\xe2\x80\x90", "\xe2\x80\xb0",
                           "\xe2\x81\xa5", "\xe2\x81\xaa", "\xd8\xa0", "\xf0\x9f\x98\x80",
                           "\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d\xe2\x80\x8f" "1", "lrm\xe2\x80\x8e", "alm\xd8\x9c"})
    EXPECT_FALSE(has_terminal_controls(good)) << good;
  for (const char* bad : {"a\x1b[2J", "cr\r", "nl\n", "del\x7f", "c1\xc2\x9b", "c1\xc2\x80", "rlo\xe2\x80\xae", "lre\xe2\x80\xaa", "lri\xe2\x81\xa6", "pdi\xe2\x81\xa9"})
    EXPECT_TRUE(has_terminal_controls(bad)) << bad;
}

// What a listing shows of a label: every control character, C1 control and bidirectional
// control escaped, text of any script as it is, a byte that is not UTF-8 as \xNN; quote_text
// shows the same between quotes and cuts at a character's start.
TEST(Text, ShownTextEscapesWhatMovesTheTerminal) {
  EXPECT_EQ(shown_text("chat 42"), "chat 42");
  EXPECT_EQ(shown_text("caf\xc3\xa9 \xd7\xa9\xe2\x80\x8f \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xd7\xa9\xe2\x80\x8f \xf0\x9f\x98\x80");
  EXPECT_EQ(shown_text("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(shown_text("two\nlines\tand\rcr\x7f"), "two\\x0alines\\x09and\\x0dcr\\x7f");
  EXPECT_EQ(shown_text("c1\xc2\x9b" "2J"), "c1\\u009b2J");
  EXPECT_EQ(shown_text("evil\xe2\x80\xaetxt.exe"), "evil\\u202etxt.exe");
  EXPECT_EQ(shown_text("lri\xe2\x81\xa6x\xe2\x81\xa9"), "lri\\u2066x\\u2069");
  EXPECT_EQ(shown_text("bad\xff\xc3"), "bad\\xff\\xc3");
  EXPECT_EQ(shown_text(std::string("nul\0x", 5)), "nul\\x00x");
  for (const char* s : {"a\x1b[2J", "nl\n", "c1\xc2\x9b", "rlo\xe2\x80\xae", "pdi\xe2\x81\xa9", "\xff\xfe"}) {
    EXPECT_FALSE(has_terminal_controls(shown_text(s))) << s;
    EXPECT_TRUE(is_valid_utf8(shown_text(s))) << s;
  }
  EXPECT_EQ(quote_text("evil\xe2\x80\xae"), "'evil\\u202e'");
  EXPECT_EQ(quote_text("ab\xc3\xa9", 3), "'ab...'") << "cut before the character, not inside it";
  EXPECT_EQ(quote_text("abc", 3), "'abc'");
}

}  // namespace
}  // namespace kvsnap
