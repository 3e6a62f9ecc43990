// GGUF reader and writer: round trips, the errors of every hostile-input path,
// and the model fingerprint.
#include "format/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "format/cursor.h"
#include "support/gguf_writer.h"
#include "format/model_profile.h"
#include "test_files.h"
#include "tools/model_builder.h"

namespace kvsnap {
namespace {

std::vector<std::byte> to_bytes(const GgufWriter& w) {
  VectorSink sink;
  Status s = w.write(sink);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return sink.bytes;
}

Result<GgufHeader> parse(std::vector<std::byte> bytes, const std::string& name = "model.gguf") {
  MemoryFile f(name, std::move(bytes));
  return read_gguf(f);
}

// The same over bytes the caller keeps (a sweep's exact-size prefix, an edited copy).
Result<GgufHeader> parse_view(std::span<const std::byte> bytes) {
  MemoryFile f("model.gguf", bytes);
  return read_gguf(f);
}

// A small loadable-shaped model: metadata like kvsnap-mkmodel's, tiny tensors.
testing::ModelSpec small_spec() {
  testing::ModelSpec s;
  s.n_layer = 2;
  s.n_embd = 32;
  s.n_head = 2;
  s.n_head_kv = 1;
  s.head_dim = 16;
  s.n_ff = 32;
  s.vocab_words = 4;
  return s;
}

std::vector<std::byte> small_model_bytes(uint64_t seed = 1) {
  GgufWriter w;
  auto spec = small_spec();
  spec.seed = seed;
  Status s = testing::build_model(spec, w);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return to_bytes(w);
}

// Little-endian helpers for hand-made headers.
struct Bytes {
  std::vector<std::byte> b;
  Bytes& raw(const char* s) {
    for (const char* p = s; *p; ++p) b.push_back(std::byte(*p));
    return *this;
  }
  Bytes& u32(uint32_t v) {
    put_u32(b, v);
    return *this;
  }
  Bytes& u64(uint64_t v) {
    put_u64(b, v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put_u64(b, s.size());
    for (char c : s) b.push_back(std::byte(c));
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) { return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv); }
};

void expect_corrupt(const Result<GgufHeader>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  EXPECT_EQ(r.status().message().rfind("model.gguf: offset ", 0), 0u) << r.status().ToString();
}

// ------------------------------------------------------------------ round trip
TEST(Gguf, RoundTripEveryValueType) {
  GgufWriter w;
  w.set_u8("t.u8", 200);
  w.set_i8("t.i8", -100);
  w.set_u16("t.u16", 60000);
  w.set_i16("t.i16", -30000);
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_f32("t.f32", 1.5f);
  w.set_bool("t.bool", true);
  w.set_string("t.string", "héllo");
  w.set_string("t.empty", "");
  w.set_u64("t.u64", 0xFEDCBA9876543210ull);
  w.set_i64("t.i64", std::numeric_limits<int64_t>::min());
  w.set_f64("t.f64", -2.25e100);
  w.set_u32_array("a.u32", {1, 2, 3});
  w.set_i32_array("a.i32", {-1, 0, 7});
  w.set_f32_array("a.f32", {0.5f, -1.0f});
  w.set_bool_array("a.bool", {true, false, true});
  w.set_string_array("a.str", {"x", "", "yz"});
  w.set_u32_array("a.empty", {});
  w.set_array("a.nested", gguf_array_of_arrays({gguf_array_u32({1, 2}), gguf_array_string({"a"}),
                                                gguf_array_of_arrays({gguf_array_f32({3.0f})})}));
  w.set_u32("t.u32", 7);  // replaced in place
  auto h = parse(to_bytes(w));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->version, 3u);
  ASSERT_EQ(h->kvs.size(), 20u);
  EXPECT_EQ(h->kvs[4].key, "t.u32");  // kept its first position
  EXPECT_EQ(*h->get_u32("t.u8"), 200u);
  EXPECT_EQ(*h->get_i32("t.i8"), -100);
  EXPECT_EQ(*h->get_u32("t.u16"), 60000u);
  EXPECT_EQ(*h->get_i32("t.i16"), -30000);
  EXPECT_EQ(*h->get_u32("t.u32"), 7u);
  EXPECT_EQ(*h->get_i32("t.i32"), -2000000000);
  EXPECT_EQ(*h->get_f32("t.f32"), 1.5f);
  EXPECT_TRUE(*h->get_bool("t.bool"));
  EXPECT_EQ(*h->get_string("t.string"), "héllo");
  EXPECT_EQ(*h->get_string("t.empty"), "");
  EXPECT_EQ(*h->get_u64("t.u64"), 0xFEDCBA9876543210ull);
  EXPECT_EQ(*h->get_i64("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*h->get_f64("t.f64"), -2.25e100);
  EXPECT_EQ(*h->get_u32_array("a.u32"), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ((*h->get_array("a.i32"))->int_at(0).value(), -1);
  EXPECT_EQ(*h->get_f32_array("a.f32"), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(*h->get_u32_array("a.bool"), (std::vector<uint32_t>{1, 0, 1}));
  EXPECT_EQ(**h->get_string_array("a.str"), (std::vector<std::string>{"x", "", "yz"}));
  EXPECT_EQ(*h->get_array_size("a.empty"), 0u);
  const GgufArray* nested = *h->get_array("a.nested");
  ASSERT_EQ(nested->elem_type, GgufType::kArray);
  ASSERT_EQ(nested->arrays.size(), 3u);
  EXPECT_EQ(nested->arrays[0].uint_at(1).value(), 2u);
  EXPECT_EQ(nested->arrays[1].strings[0], "a");
  EXPECT_EQ(nested->arrays[2].arrays[0].float_at(0).value(), 3.0);
  EXPECT_EQ(h->find("a.nested")->value.to_display_string(), "[[1, 2], ['a'], [[3]]]");
  EXPECT_TRUE(h->tensors.empty());
  EXPECT_EQ(h->infos_end, h->file_size);
}

TEST(Gguf, RoundTripTensorsAndAlignment) {
  for (uint32_t align : {0u, 64u, 1u}) {
    GgufWriter w;
    if (align) w.set_u32("general.alignment", align);
    w.set_string("general.architecture", "test");
    std::vector<float> a = {1, 2, 3, 4, 5, 6};
    ASSERT_TRUE(w.add_tensor_f32("a", {3, 2}, a).ok());
    ASSERT_TRUE(w.add_tensor_f16("b", {5}, std::vector<float>{0.5f, -1, 2, 65504, 0}).ok());
    std::vector<std::byte> q8(34 * 2, std::byte{0x11});  // two q8_0 blocks
    ASSERT_TRUE(w.add_tensor("c", {32, 2}, 8, q8).ok());
    auto bytes = to_bytes(w);
    MemoryFile f("model.gguf", bytes);
    auto h = read_gguf(f);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    const uint32_t eff = align ? align : 32;
    EXPECT_EQ(h->alignment, eff);
    EXPECT_EQ(h->data_offset % eff, 0u);
    ASSERT_EQ(h->tensors.size(), 3u);
    const auto& ta = h->tensors[0];
    EXPECT_EQ(ta.name, "a");
    EXPECT_EQ(ta.n_dims, 2u);
    EXPECT_EQ(ta.ne, (std::array<int64_t, 4>{3, 2, 1, 1}));
    EXPECT_EQ(ta.type, 0);
    EXPECT_EQ(ta.n_bytes, 24u);
    EXPECT_EQ(h->tensors[1].n_bytes, 10u);
    EXPECT_EQ(h->tensors[2].n_bytes, 68u);
    for (const auto& t : h->tensors) EXPECT_EQ(t.offset % eff, 0u) << t.name;
    // the data is where the infos say
    float got[6];
    ASSERT_TRUE(f.read_at(h->data_offset + ta.offset, std::as_writable_bytes(std::span<float>(got))).ok());
    EXPECT_EQ(std::vector<float>(got, got + 6), a);
    uint16_t half[5];
    ASSERT_TRUE(
        f.read_at(h->data_offset + h->tensors[1].offset, std::as_writable_bytes(std::span<uint16_t>(half))).ok());
    EXPECT_EQ(half[0], 0x3800);
    EXPECT_EQ(half[1], 0xbc00);
    EXPECT_EQ(half[3], 0x7bff);
    EXPECT_EQ(h->find_tensor("c")->type, 8);
    EXPECT_EQ(h->data_offset + h->data_size, bytes.size());
  }
}

TEST(Gguf, WriterRejectsWhatLlamaCppWould) {
  {
    GgufWriter w;
    w.set_u32("general.alignment", 48);
    VectorSink s;
    EXPECT_EQ(w.write(s).code(), Code::kInvalidArgument);
  }
  {
    GgufWriter w;
    w.set_u64("general.alignment", 64);
    VectorSink s;
    EXPECT_EQ(w.write(s).code(), Code::kInvalidArgument);
  }
  GgufWriter w;
  EXPECT_EQ(w.add_tensor("q", {31}, 8, std::vector<std::byte>(34)).code(), Code::kInvalidArgument);  // not whole blocks
  EXPECT_EQ(w.add_tensor("f", {4}, 0, std::vector<std::byte>(15)).code(), Code::kInvalidArgument);   // wrong size
  EXPECT_EQ(w.add_tensor("x", {4}, 4, std::vector<std::byte>(16)).code(), Code::kInvalidArgument);   // removed type
  EXPECT_EQ(w.add_tensor(std::string(64, 'n'), {1}, 0, std::vector<std::byte>(4)).code(), Code::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("five", {1, 1, 1, 1, 1}, 0, std::vector<std::byte>(4)).code(), Code::kInvalidArgument);
  ASSERT_TRUE(w.add_tensor("t", {1}, 0, std::vector<std::byte>(4)).ok());
  EXPECT_EQ(w.add_tensor("t", {1}, 0, std::vector<std::byte>(4)).code(), Code::kInvalidArgument);
}

TEST(Gguf, WriteFileThroughIo) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "kvsnap_gguf_io";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "m.gguf").string();
  GgufWriter w;
  ASSERT_TRUE(testing::build_model(small_spec(), w).ok());
  ASSERT_TRUE(w.write_file(posix_io(), path).ok());
  auto h = read_gguf(posix_io(), path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->file, path);
  EXPECT_EQ(*h->architecture(), "llama");
  EXPECT_EQ(h->tensors.size(), 3u + 2u * 9u);
  auto fp = gguf_fingerprint(posix_io(), path);
  ASSERT_TRUE(fp.ok());
  MemoryFile mem("other-name.gguf", to_bytes(w));
  auto h2 = read_gguf(mem);
  ASSERT_TRUE(h2.ok());
  EXPECT_EQ(*fp, *gguf_fingerprint(mem, *h2));  // the name does not matter
  std::filesystem::remove_all(dir);
}

TEST(Gguf, MkmodelTokenizerShape) {
  auto h = parse(small_model_bytes());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const auto& tokens = **h->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 3u + 256u + 4u + 26u + 3u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[258], "<0xFF>");
  EXPECT_EQ(tokens[259], "\xE2\x96\x81the");
  EXPECT_EQ(*h->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*h->get_array_size("tokenizer.ggml.scores"), tokens.size());
  const GgufArray* types = *h->get_array("tokenizer.ggml.token_type");
  EXPECT_EQ(types->elem_type, GgufType::kI32);
  EXPECT_EQ(types->int_at(3).value(), 6);
  EXPECT_EQ(*h->get_u32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*h->get_u32("llama.attention.key_length"), 16u);
  EXPECT_EQ(*h->get_u32("llama.vocab_size"), tokens.size());
  // deterministic from the seed
  EXPECT_EQ(small_model_bytes(7), small_model_bytes(7));
  EXPECT_NE(small_model_bytes(7), small_model_bytes(8));
}

// ------------------------------------------------------------------ accessors
TEST(Gguf, TypedAccessorErrors) {
  GgufWriter w;
  w.set_string("s", "x");
  w.set_u8("small", 5);
  w.set_i64("neg", -1);
  w.set_u64("big", 1ull << 40);
  w.set_u32_array("arr", {1, 2});
  auto h = parse(to_bytes(w));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->get_u32("missing").status().code(), Code::kNotFound);
  EXPECT_EQ(h->get_u32("s").status().code(), Code::kMismatch);
  EXPECT_NE(h->get_u32("s").status().message().find("has type string, expected an integer"), std::string::npos);
  EXPECT_EQ(*h->get_u32("small"), 5u);  // any integer type that fits
  EXPECT_EQ(h->get_u32("neg").status().code(), Code::kMismatch);
  EXPECT_EQ(h->get_u32("big").status().code(), Code::kMismatch);
  EXPECT_EQ(*h->get_u64("big"), 1ull << 40);
  EXPECT_EQ(h->get_string("small").status().code(), Code::kMismatch);
  EXPECT_EQ(h->get_f32("s").status().code(), Code::kMismatch);
  EXPECT_EQ(h->get_array("s").status().code(), Code::kMismatch);
  EXPECT_EQ(h->get_string_array("arr").status().code(), Code::kMismatch);
  EXPECT_EQ(*h->get_u32_or_array("small", 3), (std::vector<uint32_t>{5, 5, 5}));
  EXPECT_EQ(*h->get_u32_or_array("arr", 2), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(h->get_u32_or_array("arr", 3).status().code(), Code::kMismatch);
  EXPECT_EQ(*h->get_u32_or("missing", 9), 9u);
  EXPECT_EQ(h->get_u32_or("s", 9).status().code(), Code::kMismatch);
  EXPECT_EQ((*h->get_array("arr"))->int_at(2).status().code(), Code::kInvalidArgument);
}

// ------------------------------------------------------------------ hostile input
TEST(Gguf, EveryStrictPrefixFailsCleanly) {
  const auto full = small_model_bytes();
  auto whole = parse(full);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  const uint64_t infos_end = whole->infos_end;
  ASSERT_GT(infos_end, 1000u);
  // every prefix of the header and metadata, then a sample of the data section
  std::vector<uint64_t> lengths;
  for (uint64_t n = 0; n < infos_end + 64; ++n) lengths.push_back(n);
  for (uint64_t n = infos_end + 64; n < full.size(); n += 97) lengths.push_back(n);
  lengths.push_back(full.size() - 1);
  for (uint64_t n : lengths) {
    const test::ExactPrefix prefix(full, n);
    auto r = parse_view(prefix.span());
    ASSERT_FALSE(r.ok()) << "prefix " << n << " parsed";
    ASSERT_EQ(r.status().code(), Code::kCorruption) << "prefix " << n << ": " << r.status().ToString();
    ASSERT_EQ(r.status().message().rfind("model.gguf: offset ", 0), 0u) << r.status().ToString();
    ASSERT_NE(r.status().message().find("truncated"), std::string::npos) << "prefix " << n << ": "
                                                                         << r.status().ToString();
  }
}

TEST(Gguf, PrefixErrorsNameTheField) {
  const auto full = small_model_bytes();
  auto cut = [&](size_t n) { return parse(std::vector<std::byte>(full.begin(), full.begin() + n)); };
  EXPECT_NE(cut(2).status().message().find("GGUF magic"), std::string::npos);
  EXPECT_NE(cut(6).status().message().find("GGUF version"), std::string::npos);
  EXPECT_NE(cut(20).status().message().find("key/value count"), std::string::npos);
  // counts are checked against the bytes left before anything is read
  EXPECT_NE(cut(60).status().message().find("23 key/value pairs need at least 322 bytes"), std::string::npos)
      << cut(60).status().ToString();
  // a value cut short: "general.architecture" = "ll|ama"
  auto r = parse(Bytes().header(0, 1).str("general.architecture").u32(8).u64(5).raw("ll").b);
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("value of key 'general.architecture' of 5 bytes, 2 remain"), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("model.gguf: offset 56: truncated", 0), 0u) << msg;  // where the string (its length) starts
}

TEST(Gguf, AbsurdCountsAreRejectedBeforeAllocating) {
  // tensor and key counts above the caps
  expect_corrupt(parse(Bytes().header(1ull << 62, 0).b), "tensor count");
  expect_corrupt(parse(Bytes().header(0, 1ull << 62).b), "key/value count");
  // within the caps but more than the bytes that remain
  expect_corrupt(parse(Bytes().header(0, 1000).b), "truncated: 1000 key/value pairs");
  expect_corrupt(parse(Bytes().header(1000, 0).b), "truncated: 1000 tensor infos");
  // a string length of 2^62
  expect_corrupt(parse(Bytes().header(0, 1).u64(1ull << 62).u32(0).u32(0).b), "exceeds the limit");
  // a string length within the cap but past the end
  expect_corrupt(parse(Bytes().header(0, 1).u64(1 << 20).raw("abcdefgh").b), "truncated: key 0 of 1048576 bytes");
  // an array of 2^62 elements, and one of 10^6 u64 in a tiny file
  expect_corrupt(parse(Bytes().header(0, 1).str("k").u32(9).u32(10).u64(1ull << 62).b), "exceeds the limit");
  expect_corrupt(parse(Bytes().header(0, 1).str("k").u32(9).u32(10).u64(1000000).u64(0).b),
                 "needs at least 8000000 bytes");
  // a string array claiming a million strings
  expect_corrupt(parse(Bytes().header(0, 1).str("k").u32(9).u32(8).u64(1000000).u64(0).b), "needs at least");
  // arrays nested too deep
  Bytes deep;
  deep.header(0, 1).str("k").u32(9);
  for (int i = 0; i < 6; ++i) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  expect_corrupt(parse(deep.b), "nested deeper");
  // huge tensor shapes
  Bytes shape;
  shape.header(1, 0).str("t").u32(4).u64(1ull << 40).u64(1ull << 40).u64(1).u64(1).u32(0).u64(0);
  expect_corrupt(parse(shape.b), "overflows");
}

TEST(Gguf, RandomCorruptionsFailCleanly) {
  // Deterministic byte flips and overwrites in the metadata; every outcome is
  // a value or a Status (ASan/UBSan builds check there is nothing worse), and
  // whatever parses also goes through profile_from_gguf.
  const auto full = small_model_bytes();
  const uint64_t infos_end = parse(full)->infos_end;
  uint64_t state = 12345;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int failed = 0;
  // One copy, edited in place and each iteration's edits undone after it (a copy of the model per
  // iteration was most of this test's time in the sanitized -O0 build).
  auto bytes = full;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::pair<uint64_t, std::byte>> undo;
    const int edits = 1 + int(next() % 4);
    for (int e = 0; e < edits; ++e) {
      const uint64_t at = next() % infos_end;
      undo.emplace_back(at, bytes[at]);
      if (next() % 2) {
        bytes[at] ^= std::byte(1u << (next() % 8));
      } else {
        bytes[at] = std::byte(next() % 2 ? 0xff : 0x00);
      }
    }
    auto r = parse_view(bytes);
    if (!r.ok()) {
      ++failed;
      ASSERT_EQ(r.status().message().rfind("model.gguf: ", 0), 0u) << r.status().ToString();
    } else {
      auto p = profile_from_gguf(*r);
      if (p.ok()) (void)memory_sections(*p);
    }
    for (auto u = undo.rbegin(); u != undo.rend(); ++u) bytes[u->first] = u->second;
  }
  ASSERT_TRUE(bytes == full);
  EXPECT_GT(failed, 100);
}

TEST(Gguf, MalformedHeaders) {
  auto r = parse(Bytes().raw("GGML").u32(3).u64(0).u64(0).b);
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << "another kind of file, as a state's unknown magic is";
  EXPECT_NE(r.status().message().find("not a GGUF file: magic 'GGML'"), std::string::npos) << r.status().ToString();
  r = parse(Bytes().header(0, 0, 1).b);
  EXPECT_EQ(r.status().code(), Code::kNotSupported);
  EXPECT_NE(r.status().message().find("v1"), std::string::npos);
  EXPECT_EQ(parse(Bytes().header(0, 0, 4).b).status().code(), Code::kNotSupported);
  EXPECT_EQ(parse(Bytes().header(0, 0, 0x03000000).b).status().code(), Code::kNotSupported);
  expect_corrupt(parse(Bytes().header(0, 0, 0).b), "bad GGUF version 0");
  EXPECT_TRUE(parse(Bytes().header(0, 0, 2).b).ok());  // v2: same layout
  expect_corrupt(parse(Bytes().header(0, 1).str("").u32(4).u32(1).b), "key 0 is empty");
  expect_corrupt(parse(Bytes().header(0, 2).str("a").u32(4).u32(1).str("a").u32(4).u32(2).b),
                 "duplicate key 'a' (first at offset 24)");
  expect_corrupt(parse(Bytes().header(0, 1).str("a").u32(13).u32(1).b), "type of key 'a' 13 is not a GGUF type");
  expect_corrupt(parse(Bytes().header(0, 1).str("general.alignment").u32(10).u64(64).b), "must be u32");
  expect_corrupt(parse(Bytes().header(0, 1).str("general.alignment").u32(4).u32(24).b), "not a power of 2");
  auto tensor = [](Bytes& b, const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t off) {
    b.str(name).u32(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) b.u64(d);
    b.u32(type).u64(off);
  };
  {
    Bytes b;
    b.header(2, 0);
    tensor(b, "t", {4}, 0, 0);
    tensor(b, "t", {4}, 0, 32);
    expect_corrupt(parse(b.b), "duplicate tensor name 't'");
  }
  {
    Bytes b;
    b.header(1, 0);
    tensor(b, "t", {1, 1, 1, 1, 1}, 0, 0);
    expect_corrupt(parse(b.b), "5 dimensions");
  }
  {
    Bytes b;
    b.header(1, 0);
    tensor(b, "t", {uint64_t(-5)}, 0, 0);
    expect_corrupt(parse(b.b), "negative size");
  }
  {
    Bytes b;
    b.header(1, 0);
    tensor(b, "t", {4}, 5, 0);
    expect_corrupt(parse(b.b), "invalid or removed ggml type 5");
  }
  {
    Bytes b;
    b.header(1, 0);
    tensor(b, "t", {4}, 99, 0);
    EXPECT_EQ(parse(b.b).status().code(), Code::kNotSupported);
  }
  {
    Bytes b;
    b.header(1, 0);
    tensor(b, "t", {33}, 8, 0);
    expect_corrupt(parse(b.b), "not a multiple of the block size 32");
  }
  {
    Bytes b;
    b.header(1, 0);
    tensor(b, std::string(64, 'x'), {4}, 0, 0);
    expect_corrupt(parse(b.b), "is too long");
  }
  {
    Bytes b;
    b.header(2, 0);
    tensor(b, "a", {4}, 0, 0);
    tensor(b, "b", {4}, 0, 16);  // expected 32 (aligned)
    b.b.resize(256);
    expect_corrupt(parse(b.b), "tensor 'b' has data offset 16, expected 32");
  }
}

// ------------------------------------------------------------------ fingerprint
TEST(Gguf, FingerprintStableAndSensitive) {
  auto fp_of = [](const std::vector<std::byte>& bytes) {
    MemoryFile f("model.gguf", bytes);
    auto h = read_gguf(f);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    auto fp = gguf_fingerprint(f, *h);
    EXPECT_TRUE(fp.ok());
    return *fp;
  };
  const auto base = small_model_bytes();
  const std::string fp = fp_of(base);
  EXPECT_EQ(fp.size(), 64u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(fp, fp_of(small_model_bytes()));  // same build, same identity

  // a metadata change changes it
  GgufWriter w;
  auto spec = small_spec();
  spec.name = "kvsnap-mkmodel2";
  ASSERT_TRUE(testing::build_model(spec, w).ok());
  EXPECT_NE(fp, fp_of(to_bytes(w)));
  GgufWriter w2;
  ASSERT_TRUE(testing::build_model(small_spec(), w2).ok());
  w2.set_u32("llama.context_length", 8192);
  EXPECT_NE(fp, fp_of(to_bytes(w2)));

  // the weights are not hashed (only the header and the size)...
  auto flipped = base;
  flipped.back() ^= std::byte{0xff};
  EXPECT_EQ(fp, fp_of(flipped));
  // ...but the file size is
  auto longer = base;
  longer.resize(base.size() + 32);
  EXPECT_NE(fp, fp_of(longer));
  // different weights of the same shape: same header, same fingerprint
  EXPECT_EQ(fp, fp_of(small_model_bytes(2)));
}

// ------------------------------------------------------------------ f16
TEST(Gguf, HalfPrecisionConversion) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(f32_to_f16(1e-8f), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);          // tie to even
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);          // tie to even
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(NAN) & 0x7c00, 0x7c00);
  EXPECT_NE(f32_to_f16(NAN) & 0x3ff, 0);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
}

TEST(Gguf, GgmlTypeSizes) {
  EXPECT_EQ(*ggml_nbytes(0, 10), 40u);
  EXPECT_EQ(*ggml_nbytes(8, 64), 68u);
  EXPECT_EQ(*ggml_nbytes(12, 256), 144u);  // q4_K
  EXPECT_FALSE(ggml_nbytes(8, 33));
  EXPECT_FALSE(ggml_nbytes(4, 32));
  EXPECT_FALSE(ggml_nbytes(-1, 1));
  EXPECT_FALSE(ggml_nbytes(43, 1));
  EXPECT_EQ(ggml_type_name_any(30), "bf16");
  EXPECT_EQ(ggml_type_name_any(31), "type 31");
}

}  // namespace
}  // namespace kvsnap
