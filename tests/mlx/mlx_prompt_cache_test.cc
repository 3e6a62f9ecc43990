// format/mlx_safetensors.h and format/mlx_prompt_cache.h on synthetic files: every error path
// gives a clear error naming the file and the problem; valid files of the three mlx-lm layouts
// parse to the right layers and rewrite byte for byte. (Real mlx-lm files: oracle.mlx_bed.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/byte_order.h"
#include "format/mlx_info.h"
#include "format/mlx_prompt_cache.h"

namespace kvsnap {
namespace {

// u64 length + header + `data_bytes` bytes of data (value i & 0xff at i).
MemoryFile file_of(const std::string& header, size_t data_bytes, const std::string& name = "t.safetensors") {
  std::vector<std::byte> b;
  append_le<uint64_t>(b, header.size());
  for (char ch : header) b.push_back(std::byte(ch));
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(std::byte(i & 0xff));
  return MemoryFile(name, std::move(b));
}

std::string tensor(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "],\"dtype\":\"" +
         dtype + "\",\"shape\":" + shape + "}";
}

// A two-layer KVCache file of the meta_state layout (mlx-lm 0.28.1..0.31), bf16 [1,2,5,4]:
// 80 bytes per tensor, data in the order 1.1, 0.0, 1.0, 0.1 as MLX's hash map might give it.
std::string kv_meta_header() {
  return "{" + tensor("0.0", "BF16", "[1,2,5,4]", 80, 160) + "," + tensor("0.1", "BF16", "[1,2,5,4]", 240, 320) + "," +
         tensor("1.0", "BF16", "[1,2,5,4]", 160, 240) + "," + tensor("1.1", "BF16", "[1,2,5,4]", 0, 80) +
         ",\"__metadata__\":{\"0.0\":\"\",\"0.1\":\"\",\"1.model\":\"m\",\"2.0\":\"KVCache\",\"2.1\":\"KVCache\"}}";
}

Status read_error(const std::string& header, size_t data) {
  MemoryFile f = file_of(header, data);
  auto r = read_mlx_prompt_cache(f);
  return r.ok() ? Status::OK() : r.status();
}

void expect_error(const std::string& header, size_t data, const std::string& words, Code code = Code::kCorruption) {
  Status s = read_error(header, data);
  ASSERT_FALSE(s.ok()) << header;
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find("t.safetensors"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(words), std::string::npos) << s.ToString();
}

TEST(MlxPromptCache, MetaLayoutKvCacheReadsAndRewritesByteForByte) {
  MemoryFile f = file_of(kv_meta_header(), 320);
  auto c = read_mlx_prompt_cache(f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layout, MlxLayout::kMeta);
  ASSERT_EQ(c->layers.size(), 2u);
  EXPECT_EQ(c->layers[1].cls, "KVCache");
  EXPECT_EQ(c->layers[1].offset, 5);
  EXPECT_EQ(c->layers[1].k->head_dim, 4);
  EXPECT_EQ(c->layers[1].k->heads, 2);
  ASSERT_EQ(c->user_metadata.size(), 1u);
  EXPECT_EQ(c->user_metadata[0].first, "model");
  EXPECT_TRUE(c->st.mlx_compact);
  // The data order is the file's, not the names'.
  EXPECT_EQ(c->st.tensors[c->st.data_order[0]].name, "1.1");
  VectorSink out;
  ASSERT_TRUE(write_safetensors(c->st, f, out).ok());
  ASSERT_EQ(out.bytes.size(), f.size());
  EXPECT_EQ(std::memcmp(out.bytes.data(), f.bytes().data(), f.size()), 0);
}

TEST(MlxPromptCache, GapsAreReadButNotCompact) {
  // A 16-byte gap before the first tensor: MLX never writes one, its loader accepts it.
  const std::string h = "{" + tensor("0.0", "F32", "[1,1,1,4]", 16, 32) + "," + tensor("0.1", "F32", "[1,1,1,4]", 32, 48) +
                        ",\"__metadata__\":{\"0\":\"\",\"2.0\":\"KVCache\"}}";
  MemoryFile f = file_of(h, 48);
  auto c = read_mlx_prompt_cache(f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->st.mlx_compact);
  VectorSink out;
  ASSERT_TRUE(write_safetensors(c->st, f, out).ok());
  MemoryFile again("again", std::span<const std::byte>(out.bytes));
  auto c2 = read_mlx_prompt_cache(again);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_TRUE(c2->st.mlx_compact);
  EXPECT_EQ(out.bytes.size(), f.size() - 16 + (c2->st.header_len - c->st.header_len));
}

TEST(MlxPromptCache, ScalarsLayoutQuantized) {
  // mlx-lm 0.32: [user, classes, scalars]; offset/group/bits are I32 0-d tensors "0.2".."0.4".
  // K/V 4-bit group 32, head dim 64: codes [1,1,3,8] U32 (96 B), scales/biases [1,1,3,2] F16 (12 B).
  std::string h = "{";
  uint64_t at = 0;
  auto add = [&](const std::string& n, const std::string& d, const std::string& s, uint64_t bytes) {
    h += tensor(n, d, s, at, at + bytes) + ",";
    at += bytes;
  };
  for (const char* side : {"0.0", "0.1"}) {
    add(std::string(side) + ".0", "U32", "[1,1,3,8]", 96);
    add(std::string(side) + ".1", "F16", "[1,1,3,2]", 12);
    add(std::string(side) + ".2", "F16", "[1,1,3,2]", 12);
  }
  add("0.2", "I32", "[]", 4);
  add("0.3", "I32", "[]", 4);
  add("0.4", "I32", "[]", 4);
  h += "\"__metadata__\":{\"1.0\":\"QuantizedKVCache\",\"2.0\":\"\",\"2.1.0\":\"0.2\",\"2.1.1\":\"scalar\"}}";
  std::vector<std::byte> b;
  append_le<uint64_t>(b, h.size());
  for (char ch : h) b.push_back(std::byte(ch));
  b.resize(b.size() + at - 12);
  for (uint32_t v : {3u, 32u, 4u}) append_le<uint32_t>(b, v);
  MemoryFile f("t.safetensors", std::move(b));
  auto c = read_mlx_prompt_cache(f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layout, MlxLayout::kScalars);
  const MlxLayer& L = c->layers[0];
  EXPECT_EQ(L.offset, 3);
  EXPECT_EQ(L.group_size, 32);
  EXPECT_EQ(L.bits, 4);
  EXPECT_EQ(L.k->head_dim, 64);
  EXPECT_EQ(L.k->dtype, "F16");
  // Size table: at 8 bits group 64 each side is 3 rows x (64 B codes + 2 x 1 x 2 B).
  const MlxInfoReport r = mlx_info_report(*c, "t.safetensors");
  EXPECT_EQ(r.kv_bytes, 2u * 120u);
  for (const MlxSizeAt& a : r.size_at) {
    if (a.kind == "q8g64") { EXPECT_EQ(a.kv_bytes, 2u * 3u * (64u + 4u)); }
    if (a.kind == "bf16") { EXPECT_EQ(a.kv_bytes, 2u * 3u * 128u); }
  }
  // The wrong bits for the codes' width.
  std::vector<std::byte> bad(f.bytes().begin(), f.bytes().end());
  store_le(bad.data() + bad.size() - 4, 3, 4);
  MemoryFile g("t.safetensors", std::move(bad));
  auto e = read_mlx_prompt_cache(g);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("words per row"), std::string::npos) << e.status().ToString();
}

TEST(MlxSafetensors, ContainerErrors) {
  MemoryFile tiny("t.safetensors", std::vector<std::byte>(5));
  auto r = read_safetensors(tiny);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);

  std::vector<std::byte> zero(16);
  MemoryFile z("t.safetensors", zero);
  EXPECT_NE(read_safetensors(z).status().message().find("header length 0"), std::string::npos);

  std::vector<std::byte> big;
  append_le<uint64_t>(big, 1000);
  big.resize(100);
  MemoryFile bg("t.safetensors", big);
  EXPECT_NE(read_safetensors(bg).status().message().find("runs past the end"), std::string::npos);

  std::vector<std::byte> huge;
  append_le<uint64_t>(huge, kSafetensorsMaxHeader);
  huge.resize(100);
  MemoryFile hg("t.safetensors", huge);
  EXPECT_NE(read_safetensors(hg).status().message().find("MLX accepts"), std::string::npos);
}

TEST(MlxSafetensors, HeaderErrors) {
  const std::string meta = ",\"__metadata__\":{\"0.0\":\"\",\"2.0\":\"KVCache\"}}";
  expect_error("{not json", 0, "not valid JSON");
  expect_error("[1,2]", 0, "not a JSON object");
  expect_error("{\"0.0\":3" + meta, 0, "tensor '0.0' is not an object");
  expect_error("{\"0.0\":{\"dtype\":\"F32\",\"shape\":[1]}" + meta, 4, "lacks dtype, shape or data_offsets");
  expect_error("{" + tensor("0.0", "Q4", "[1]", 0, 4) + meta, 4, "unknown dtype 'Q4'", Code::kNotSupported);
  expect_error("{\"0.0\":{\"data_offsets\":[0,4],\"dtype\":3,\"shape\":[1]}" + meta, 4, "dtype is not a string");
  expect_error("{" + tensor("0.0", "F32", "7", 0, 4) + meta, 4, "shape is not an array");
  expect_error("{" + tensor("0.0", "F32", "[-1]", 0, 4) + meta, 4, "not a non-negative integer");
  expect_error("{" + tensor("0.0", "F32", "[1.5]", 0, 4) + meta, 4, "not a non-negative integer");
  expect_error("{" + tensor("0.0", "F32", "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", 0, 4) +
                   meta, 4, "33 dimensions");
  expect_error("{" + tensor("0.0", "F32", "[1000000000000000]", 0, 4) + meta, 4, "absurd");
  expect_error("{" + tensor("0.0", "F32", "[16777216,16777216,16777216,16777216]", 0, 4) + meta, 4,
               "more than 2^64");
  expect_error("{\"0.0\":{\"data_offsets\":[0],\"dtype\":\"F32\",\"shape\":[1]}" + meta, 4, "not two non-negative");
  expect_error("{" + tensor("0.0", "F32", "[1]", 4, 0) + meta, 4, "outside the 4 data bytes");
  expect_error("{" + tensor("0.0", "F32", "[2]", 0, 8) + meta, 4, "outside the 4 data bytes of the file (truncated?)");
  expect_error("{" + tensor("0.0", "F32", "[2]", 0, 4) + meta, 4, "needs 8 bytes, data_offsets give 4");
  expect_error("{" + tensor("0.0", "F32", "[2]", 0, 8) + "," + tensor("0.1", "F32", "[2]", 4, 12) + meta, 12,
               "tensors '0.0' and '0.1' overlap");
  expect_error("{" + tensor("0.0", "F32", "[1]", 0, 4) + ",\"__metadata__\":{\"2.0\":5}}", 4, "is not a string");
  expect_error("{" + tensor("0.0", "F32", "[1]", 0, 4) + ",\"__metadata__\":[1]}", 4, "__metadata__ is not an object");
}

TEST(MlxPromptCache, LayerErrors) {
  const auto kv = [](const std::string& k, const std::string& v, const std::string& meta) {
    return "{" + k + "," + v + ",\"__metadata__\":{" + meta + "}}";
  };
  const std::string k4 = tensor("0.0", "BF16", "[1,1,2,4]", 0, 16);
  const std::string v4 = tensor("0.1", "BF16", "[1,1,2,4]", 16, 32);
  expect_error("{" + k4 + ",\"__metadata__\":{}}", 16, "no class list", Code::kNotSupported);
  expect_error("{" + k4 + "}", 16, "without __metadata__", Code::kNotSupported);
  expect_error("{" + k4 + ",\"__metadata__\":{\"2.0\":\"KVCache\"}}", 16, "tensor '0.1' (values) is missing");
  expect_error(kv(k4, tensor("0.1", "BF16", "[1,2,1,4]", 16, 32), "\"2.0\":\"KVCache\""), 32,
               "keys (BF16 batch 1, heads 1, rows 2) and values (BF16 batch 1, heads 2, rows 1) disagree");
  expect_error(kv(k4, tensor("0.1", "U8", "[1,1,2,16]", 16, 48), "\"2.0\":\"KVCache\""), 48,
               "expected a float [batch, heads, rows, head_dim]");
  expect_error(kv(k4, v4, "\"2.0\":\"KVCache\"") .insert(1, tensor("1.0", "F32", "[1]", 32, 36) + ","), 36,
               "tensor '1.0' belongs to no layer (1 layers)");
  expect_error(kv(k4, v4, "\"0.0.0\":\"4\",\"2.0\":\"RotatingKVCache\""), 32,
               "meta_state has 1 strings under '0.0', expected 4 (keep, max_size, offset, _idx)");
  expect_error(kv(k4, v4, "\"0.0.0\":\"x\",\"0.0.1\":\"8\",\"0.0.2\":\"2\",\"0.0.3\":\"2\",\"2.0\":\"RotatingKVCache\""),
               32, "'0.0.0' = \"x\" is not an integer");
  // Rows without values or 2^40 heads of no bytes (a review's finding: convert --mlx-lm looped for ever).
  expect_error(kv(tensor("0.0", "BF16", "[1,1099511627776,2,0]", 0, 0), tensor("0.1", "BF16", "[1,1099511627776,2,0]", 0, 0),
                  "\"2.0\":\"KVCache\""),
               0, "not a KV cache (a row needs values");
  expect_error(kv(tensor("0.0", "BF16", "[1,1099511627776,0,4]", 0, 0), tensor("0.1", "BF16", "[1,1099511627776,0,4]", 0, 0),
                  "\"2.0\":\"KVCache\""),
               0, "batch x heads at most");
  // Quantized with bits MLX does not have.
  expect_error(kv(tensor("0.0.0", "U32", "[1,1,2,1]", 0, 8), v4,
                  "\"0.0.0\":\"2\",\"0.0.1\":\"32\",\"0.0.2\":\"7\",\"2.0\":\"QuantizedKVCache\""),
               32, "bits 7 / group size 32");
  // mlx 0.32's 1-bit form: a well-formed file kvsnap does not read (a review's finding: "corrupt").
  expect_error(kv(tensor("0.0.0", "U32", "[1,1,2,1]", 0, 8), v4,
                  "\"0.0.0\":\"2\",\"0.0.1\":\"64\",\"0.0.2\":\"1\",\"2.0\":\"QuantizedKVCache\""),
               32, "bits 1 (MLX's 1-bit affine form, mlx >= 0.32) is not supported", Code::kNotSupported);
  expect_error(kv(tensor("0.0.0", "U32", "[1,1,2,1]", 0, 8), v4,
                  "\"0.0.0\":\"2\",\"0.0.1\":\"32\",\"0.0.2\":\"4\",\"2.0\":\"QuantizedKVCache\""),
               32, "tensor '0.0.1' (scales) is missing");
  // Scalars layout: offset past the saved rows, a float offset, a class name that is not text.
  const std::string sc = "\"1.0\":\"KVCache\",\"2.0\":\"\"";
  std::vector<std::byte> b;
  const std::string h = "{" + k4 + "," + v4 + "," + tensor("0.2", "I32", "[]", 32, 36) + ",\"__metadata__\":{" + sc + "}}";
  append_le<uint64_t>(b, h.size());
  for (char ch : h) b.push_back(std::byte(ch));
  b.resize(b.size() + 32);
  append_le<uint32_t>(b, 3);
  MemoryFile f("t.safetensors", b);
  auto r = read_mlx_prompt_cache(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer 0 (KVCache): offset 3 is past the 2 saved rows"), std::string::npos)
      << r.status().ToString();
  expect_error("{" + k4 + "," + v4 + "," + tensor("0.2", "F32", "[]", 32, 36) + ",\"__metadata__\":{" + sc + "}}", 36,
               "tensor '0.2' (offset) is F32 [], not an integer scalar");
  expect_error("{" + tensor("0.0.1", "I32", "[2]", 0, 8) + ",\"__metadata__\":{\"1.0\":\"CacheList\",\"2.0\":\"\"}}", 8,
               "class name is not ASCII");
  expect_error("{" + k4 + ",\"__metadata__\":{\"1.0\":\"CacheList\",\"2.0\":\"\"}}", 16, "CacheList holds no caches");
}

// A quantized layer's offset outside its saved rows, and integer state beyond 32 bits (a review's
// findings: info reported 999 tokens; a max_size of 2^32 + 4 went to the scalars layout as 4).
TEST(MlxPromptCache, StateOutsideWhatMlxLmSavesIsRefused) {
  const std::string q = tensor("0.0.0", "U32", "[1,1,2,4]", 0, 32) + "," + tensor("0.0.1", "BF16", "[1,1,2,1]", 32, 36) +
                        "," + tensor("0.0.2", "BF16", "[1,1,2,1]", 36, 40) + "," +
                        tensor("0.1.0", "U32", "[1,1,2,4]", 40, 72) + "," + tensor("0.1.1", "BF16", "[1,1,2,1]", 72, 76) +
                        "," + tensor("0.1.2", "BF16", "[1,1,2,1]", 76, 80);
  const auto quantized = [&](const std::string& offset) {
    return "{" + q + ",\"__metadata__\":{\"0.0.0\":\"" + offset +
           "\",\"0.0.1\":\"32\",\"0.0.2\":\"4\",\"2.0\":\"QuantizedKVCache\"}}";
  };
  for (const char* offset : {"0", "2"}) {
    MemoryFile f = file_of(quantized(offset), 80);
    auto c = read_mlx_prompt_cache(f);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->layers[0].offset, std::stoll(offset));
  }
  expect_error(quantized("999"), 80, "layer 0 (QuantizedKVCache): offset 999 is past the 2 saved rows");
  expect_error(quantized("-5"), 80, "layer 0 (QuantizedKVCache): offset -5 is negative");

  const std::string k4 = tensor("0.0", "BF16", "[1,1,2,4]", 0, 16), v4 = tensor("0.1", "BF16", "[1,1,2,4]", 16, 32);
  expect_error("{" + k4 + "," + v4 +
                   ",\"__metadata__\":{\"0.0.0\":\"0\",\"0.0.1\":\"4294967300\",\"0.0.2\":\"2\",\"0.0.3\":\"2\","
                   "\"2.0\":\"RotatingKVCache\"}}",
               32, "meta_state '0.0.1' = 4294967300 is outside the 32-bit range");
  // The scalars layout's I64 offset of 2^32 + 1 (its low 32 bits, 1, would pass the row check).
  std::vector<std::byte> b;
  const std::string h = "{" + k4 + "," + v4 + "," + tensor("0.2", "I64", "[]", 32, 40) +
                        ",\"__metadata__\":{\"1.0\":\"KVCache\",\"2.0\":\"\"}}";
  append_le<uint64_t>(b, h.size());
  for (char ch : h) b.push_back(std::byte(ch));
  b.resize(b.size() + 32);
  append_le<uint64_t>(b, (uint64_t(1) << 32) + 1);
  MemoryFile f("t.safetensors", b);
  auto r = read_mlx_prompt_cache(f);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor '0.2' (offset) = 4294967297 is outside the 32-bit range"), std::string::npos)
      << r.status().ToString();
}

TEST(MlxPromptCache, UnknownClassIsCarried) {
  MemoryFile f = file_of("{" + tensor("0.0", "I32", "[3]", 0, 12) + ",\"__metadata__\":{\"0.0\":\"\",\"2.0\":\"FutureCache\"}}", 12);
  auto c = read_mlx_prompt_cache(f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->layers[0].understood);
  EXPECT_EQ(c->layers[0].arrays.size(), 1u);
  EXPECT_EQ(c->layers[0].bytes, 12u);
}

TEST(MlxPromptCache, ContentDetection) {
  EXPECT_TRUE(looks_like_mlx_prompt_cache(file_of(kv_meta_header(), 320)));
  std::vector<std::byte> ggsq = {std::byte('q'), std::byte('s'), std::byte('g'), std::byte('g')};
  ggsq.resize(64);
  EXPECT_FALSE(looks_like_mlx_prompt_cache(MemoryFile("slot.bin", ggsq)));
}

}  // namespace
}  // namespace kvsnap
