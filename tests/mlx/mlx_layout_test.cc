// format/mlx_layout.h on synthetic files: each move gives a file the reader parses back to the
// same layers in the target layout; KVCache rows past offset are cut for the meta layouts; classes
// not handled are refused. (Loading the moves in the real mlx-lm releases: oracle.mlx_bed.)
#include <gtest/gtest.h>

#include <bit>
#include <string>
#include <vector>

#include "base/byte_order.h"
#include "format/mlx_layout.h"

namespace kvsnap {
namespace {

MemoryFile file_of(const std::string& header, const std::vector<std::byte>& data) {
  std::vector<std::byte> b;
  append_le<uint64_t>(b, header.size());
  for (char ch : header) b.push_back(std::byte(ch));
  b.insert(b.end(), data.begin(), data.end());
  return MemoryFile("t.safetensors", std::move(b));
}

std::string tensor(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "],\"dtype\":\"" +
         dtype + "\",\"shape\":" + shape + "}";
}

Result<MlxPromptCache> moved(const MlxPromptCache& in, const ReadableFile& f, MlxLayout to, VectorSink& sink) {
  KV_ASSIGN_OR_RETURN(MlxOutFile out, mlx_change_layout(in, to));
  KV_RETURN_IF_ERROR(write_mlx_file(out, in, f, sink));
  MemoryFile again("moved.safetensors", std::span<const std::byte>(sink.bytes));
  return read_mlx_prompt_cache(again);
}

TEST(MlxLayout, ScalarsKvCacheToMetaCutsRowsAndBack) {
  // KVCache of mlx-lm 0.32: F32 [1,2,4,2] buffers (4 rows), offset 3: row r of head h holds h*10+r.
  std::vector<std::byte> data;
  for (int side = 0; side < 2; ++side) {
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 4; ++r) {
        for (int d = 0; d < 2; ++d) append_le<uint32_t>(data, uint32_t(100 * side + 10 * h + r));
      }
    }
  }
  append_le<int32_t>(data, 3);
  const std::string h = "{" + tensor("0.0", "F32", "[1,2,4,2]", 0, 64) + "," + tensor("0.1", "F32", "[1,2,4,2]", 64, 128) +
                        "," + tensor("0.2", "I32", "[]", 128, 132) +
                        ",\"__metadata__\":{\"0.model\":\"m\",\"1.0\":\"KVCache\",\"2.0\":\"\",\"2.1.0\":\"0.2\","
                        "\"2.1.1\":\"scalar\"}}";
  MemoryFile f = file_of(h, data);
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  VectorSink sink;
  auto meta = moved(*in, f, MlxLayout::kMeta, sink);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->layout, MlxLayout::kMeta);
  EXPECT_EQ(meta->layers[0].k->rows, 3);
  EXPECT_EQ(meta->layers[0].offset, 3);
  ASSERT_EQ(meta->user_metadata.size(), 1u);
  EXPECT_EQ(meta->user_metadata[0].second, "m");
  // Head 1's rows 0..2 of the values follow head 0's 0..2: row 3 is gone.
  MemoryFile mf("m", std::span<const std::byte>(sink.bytes));
  const SafetensorsTensor* v = meta->st.find("0.1");
  ASSERT_NE(v, nullptr);
  auto vb = read_tensor(meta->st, mf, *v);
  ASSERT_TRUE(vb.ok());
  std::vector<uint32_t> got;
  for (size_t i = 0; i < vb->size(); i += 8) got.push_back(uint32_t(load_le(vb->data() + i, 4)));
  EXPECT_EQ(got, (std::vector<uint32_t>{100, 101, 102, 110, 111, 112}));
  // And back to the scalars layout: offset 3 again, as a tensor.
  VectorSink sink2;
  auto back = moved(*meta, mf, MlxLayout::kScalars, sink2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->layout, MlxLayout::kScalars);
  EXPECT_EQ(back->layers[0].offset, 3);
  EXPECT_EQ(back->user_metadata, meta->user_metadata);
}

// mlx-lm 0.32 saves a QuantizedKVCache's whole buffer (rows past offset); mlx-lm <= 0.31 saves its
// first offset rows, and a later float conversion of a meta file takes the rows for the offset, so
// the move to the meta layout cuts them as it does a KVCache's (a review's finding: it kept them).
TEST(MlxLayout, ScalarsQuantizedKvCacheToMetaCutsRowsToTheOffset) {
  // 4-bit group 32, head dim 64: codes [1,1,4,8] U32 (row r of side s: bytes 16*s + r), scales and
  // biases [1,1,4,2] F16; offset 3 of the 4 rows.
  std::string h = "{";
  std::vector<std::byte> data;
  auto add = [&](const std::string& n, const std::string& d, const std::string& shape, const std::vector<std::byte>& b) {
    h += tensor(n, d, shape, data.size(), data.size() + b.size()) + ",";
    data.insert(data.end(), b.begin(), b.end());
  };
  for (int side = 0; side < 2; ++side) {
    std::vector<std::byte> codes;
    for (int r = 0; r < 4; ++r) codes.insert(codes.end(), 32, std::byte(16 * side + r));
    const std::string p = "0." + std::to_string(side);
    add(p + ".0", "U32", "[1,1,4,8]", codes);
    add(p + ".1", "F16", "[1,1,4,2]", std::vector<std::byte>(16, std::byte(0x3c)));
    add(p + ".2", "F16", "[1,1,4,2]", std::vector<std::byte>(16));
  }
  for (uint32_t v : {3u, 32u, 4u}) {
    std::vector<std::byte> b;
    append_le<uint32_t>(b, v);
    add("0." + std::to_string(v == 3u ? 2 : v == 32u ? 3 : 4), "I32", "[]", b);
  }
  h += "\"__metadata__\":{\"1.0\":\"QuantizedKVCache\",\"2.0\":\"\",\"2.1.0\":\"0.2\",\"2.1.1\":\"scalar\",\"2.2.0\":"
       "\"0.3\",\"2.2.1\":\"scalar\",\"2.3.0\":\"0.4\",\"2.3.1\":\"scalar\"}}";
  MemoryFile f = file_of(h, data);
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->layers[0].k->rows, 4);
  VectorSink sink;
  auto meta = moved(*in, f, MlxLayout::kMeta, sink);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->layers[0].cls, "QuantizedKVCache");
  EXPECT_EQ(meta->layers[0].offset, 3);
  EXPECT_EQ(meta->layers[0].k->rows, 3);
  EXPECT_EQ(meta->layers[0].v->rows, 3);
  MemoryFile mf("m", std::span<const std::byte>(sink.bytes));
  const SafetensorsTensor* vc = meta->st.find("0.1.0");
  ASSERT_NE(vc, nullptr);
  auto vb = read_tensor(meta->st, mf, *vc);
  ASSERT_TRUE(vb.ok());
  ASSERT_EQ(vb->size(), 96u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ((*vb)[32 * r], std::byte(16 + r)) << r;
}

TEST(MlxLayout, StepInsertedAndDropped) {
  // RotatingKVCache of the meta layout (0.28.1 .. 0.31): (keep, max_size, offset, _idx).
  const std::string h = "{" + tensor("0.0", "BF16", "[1,1,2,2]", 0, 8) + "," + tensor("0.1", "BF16", "[1,1,2,2]", 8, 16) +
                        ",\"__metadata__\":{\"0.0.0\":\"1\",\"0.0.1\":\"2\",\"0.0.2\":\"7\",\"0.0.3\":\"1\","
                        "\"2.0\":\"RotatingKVCache\"}}";
  MemoryFile f = file_of(h, std::vector<std::byte>(16));
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  VectorSink sink;
  auto step = moved(*in, f, MlxLayout::kMetaStep, sink);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(step->layout, MlxLayout::kMetaStep);
  EXPECT_EQ(step->layers[0].step, 256);
  EXPECT_EQ(step->layers[0].offset, 7);
  EXPECT_EQ(step->layers[0].idx, 1);
  MemoryFile sf("s", std::span<const std::byte>(sink.bytes));
  VectorSink sink2;
  auto back = moved(*step, sf, MlxLayout::kMeta, sink2);
  ASSERT_TRUE(back.ok());
  // Back where it started, byte for byte.
  ASSERT_EQ(sink2.bytes.size(), f.size());
  EXPECT_TRUE(std::equal(sink2.bytes.begin(), sink2.bytes.end(), f.bytes().begin()));
}

// Four floats per tensor, counting from `first`.
std::vector<std::byte> f32s(int n, uint32_t first) {
  std::vector<std::byte> b;
  for (int i = 0; i < n; ++i) append_le<uint32_t>(b, std::bit_cast<uint32_t>(float(first + i)));
  return b;
}

std::vector<std::byte> concat(std::initializer_list<std::vector<std::byte>> parts) {
  std::vector<std::byte> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Result<MlxPromptCache> moved_to(const MlxPromptCache& in, const ReadableFile& f, const std::string& release, VectorSink& sink) {
  KV_ASSIGN_OR_RETURN(MlxTarget to, mlx_target_for(release));
  KV_ASSIGN_OR_RETURN(MlxOutFile out, mlx_change_layout(in, to));
  KV_RETURN_IF_ERROR(write_mlx_file(out, in, f, sink));
  MemoryFile again("moved.safetensors", std::span<const std::byte>(sink.bytes));
  return read_mlx_prompt_cache(again);
}

std::string meta_of(const MlxPromptCache& c, const std::string& key) {
  for (const auto& [k, v] : *c.st.metadata) {
    if (k == key) return v;
  }
  return "<none>";
}

void expect_refused(const Result<MlxOutFile>& r, const std::string& what) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
}

// ArraysCache of mlx-lm 0.31 (two arrays "0.0", "0.1"): to 0.32's (arrays, left_padding, lengths),
// to MambaCache for 0.28.0, and back, byte for byte.
TEST(MlxLayout, ArraysCacheMovesBetweenStateLayoutsAndNames) {
  const std::string h = "{" + tensor("0.0", "F32", "[1,4]", 0, 16) + "," + tensor("0.1", "F32", "[1,2,2]", 16, 32) +
                        ",\"__metadata__\":{\"0.0\":\"\",\"1.model\":\"m\",\"2.0\":\"ArraysCache\"}}";
  MemoryFile f = file_of(h, f32s(8, 1));
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  VectorSink s32;
  auto v32 = moved_to(*in, f, "0.32.2", s32);
  ASSERT_TRUE(v32.ok()) << v32.status().ToString();
  EXPECT_EQ(v32->layout, MlxLayout::kScalars);
  ASSERT_NE(v32->st.find("0.0.1"), nullptr);
  EXPECT_EQ(v32->st.find("0.0.1")->shape, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(v32->st.find("0.2")->shape, (std::vector<int64_t>{0}));  // lengths: None
  EXPECT_EQ(meta_of(*v32, "2.1.0"), "0.1");
  EXPECT_EQ(meta_of(*v32, "2.1.1"), "none");
  MemoryFile f32("v32", std::span<const std::byte>(s32.bytes));
  VectorSink s28;
  auto v28 = moved_to(*v32, f32, "0.28.0", s28);
  ASSERT_TRUE(v28.ok()) << v28.status().ToString();
  EXPECT_EQ(v28->layers[0].cls, "MambaCache");  // 0.28.0's loader calls ArraysCache() without a size
  MemoryFile f28("v28", std::span<const std::byte>(s28.bytes));
  VectorSink s31;
  auto v31 = moved_to(*v28, f28, "0.31.3", s31);
  ASSERT_TRUE(v31.ok()) << v31.status().ToString();
  EXPECT_EQ(v31->layers[0].cls, "ArraysCache");  // no MambaCache from 0.30.6 on
  ASSERT_EQ(s31.bytes.size(), f.size());
  EXPECT_TRUE(std::equal(s31.bytes.begin(), s31.bytes.end(), f.bytes().begin()));
  VectorSink s305;
  auto v305 = moved_to(*v28, f28, "0.30.5", s305);  // both classes exist there: kept
  ASSERT_TRUE(v305.ok());
  EXPECT_EQ(v305->layers[0].cls, "MambaCache");
}

// An ArraysCache of mlx-lm 0.32: array 0 F32 [1,4], array 1 None, lengths None, and left_padding
// I32 [1] or None.
std::string arrays_032(bool left_padding) {
  const uint64_t lp = left_padding ? 4 : 0;
  std::string h = "{" + tensor("0.0.0", "F32", "[1,4]", 0, 16) + "," + tensor("0.0.1", "F32", "[0]", 16, 16) + "," +
                  tensor("0.1", left_padding ? "I32" : "F32", left_padding ? "[1]" : "[0]", 16, 16 + lp) + "," +
                  tensor("0.2", "F32", "[0]", 16 + lp, 16 + lp) +
                  ",\"__metadata__\":{\"1.0\":\"ArraysCache\",\"2.0\":\"\",\"2.1.0\":\"0.0.1\",\"2.1.1\":\"none\","
                  "\"2.2.0\":\"0.2\",\"2.2.1\":\"none\"";
  if (!left_padding) h += ",\"2.3.0\":\"0.1\",\"2.3.1\":\"none\"";
  return h + "}}";
}

TEST(MlxLayout, ArraysCacheStateAnOlderReleaseCannotHoldIsRefused) {
  // One array: no MambaCache stands in for it before 0.28.1.
  const std::string one = "{" + tensor("0.0", "F32", "[1,4]", 0, 16) + ",\"__metadata__\":{\"0.0\":\"\",\"2.0\":\"ArraysCache\"}}";
  MemoryFile f1 = file_of(one, f32s(4, 0));
  auto in1 = read_mlx_prompt_cache(f1);
  ASSERT_TRUE(in1.ok());
  expect_refused(mlx_change_layout(*in1, *mlx_target_for("0.28.0")), "layer 0 (ArraysCache): mlx-lm 0.28.0 cannot load an ArraysCache");
  EXPECT_TRUE(mlx_change_layout(*in1, *mlx_target_for("0.28.1")).ok());
  // 0.32: left_padding set, lengths None, and array 1 None.
  MemoryFile fp = file_of(arrays_032(true), f32s(5, 0));
  auto inp = read_mlx_prompt_cache(fp);
  ASSERT_TRUE(inp.ok()) << inp.status().ToString();
  expect_refused(mlx_change_layout(*inp, *mlx_target_for("0.31.3")), "layer 0 (ArraysCache): mlx-lm 0.31.3 saves no left_padding");
  EXPECT_TRUE(mlx_change_layout(*inp, *mlx_target_for("0.32.0")).ok());
  // Without left_padding the None array is what stops it.
  MemoryFile fn = file_of(arrays_032(false), f32s(4, 0));
  auto inn = read_mlx_prompt_cache(fn);
  ASSERT_TRUE(inn.ok()) << inn.status().ToString();
  expect_refused(mlx_change_layout(*inn, *mlx_target_for("0.31.3")), "cannot save array 1, which is None");
}

// A CacheList of mlx-lm 0.32 holding a KVCache (4-row buffer, offset 3): to 0.31's nested state
// with meta_state ([classes], [metas]), the member cut to its offset; refused for 0.28.0.
TEST(MlxLayout, CacheListMovesItsMembersByTheirOwnRules) {
  const std::string h = "{" + tensor("0.0.0.0", "F32", "[1,1,4,2]", 0, 32) + "," + tensor("0.0.0.1", "F32", "[1,1,4,2]", 32, 64) +
                        "," + tensor("0.0.0.2", "I32", "[]", 64, 68) + "," + tensor("0.0.1", "I32", "[7]", 68, 96) +
                        ",\"__metadata__\":{\"1.0\":\"CacheList\",\"2.0\":\"\",\"2.1.0\":\"0.0.0.2\",\"2.1.1\":\"scalar\","
                        "\"2.2.0\":\"0.0.1\",\"2.2.1\":\"string\"}}";
  std::vector<std::byte> name;
  for (char ch : std::string("KVCache")) append_le<int32_t>(name, ch);
  std::vector<std::byte> three;
  append_le<int32_t>(three, 3);
  MemoryFile f = file_of(h, concat({f32s(16, 0), three, name}));
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  VectorSink s31;
  auto v31 = moved_to(*in, f, "0.31.3", s31);
  ASSERT_TRUE(v31.ok()) << v31.status().ToString();
  ASSERT_EQ(v31->layers[0].sub.size(), 1u);
  EXPECT_EQ(v31->layers[0].sub[0].k->rows, 3);
  EXPECT_EQ(v31->st.find("0.0.0")->shape, (std::vector<int64_t>{1, 1, 3, 2}));
  EXPECT_EQ(meta_of(*v31, "0.0.0.0"), "KVCache");
  EXPECT_EQ(meta_of(*v31, "0.0.1.0"), "");
  // And back: the same tensors and scalars list; the member's buffer is now its 3 rows.
  MemoryFile f31("v31", std::span<const std::byte>(s31.bytes));
  VectorSink s32;
  auto v32 = moved_to(*v31, f31, "scalars", s32);
  ASSERT_TRUE(v32.ok()) << v32.status().ToString();
  EXPECT_EQ(v32->layers[0].sub[0].offset, 3);
  EXPECT_EQ(meta_of(*v32, "2.2.0"), "0.0.1");
  EXPECT_EQ(meta_of(*v32, "2.2.1"), "string");
  expect_refused(mlx_change_layout(*in, *mlx_target_for("0.30.7")), "layer 0 (CacheList): mlx-lm 0.30.7 cannot load a CacheList");
}

// ChunkedKVCache of 0.32 after a front trim: 2 rows saved, offset 3, start_position 1. The meta
// loaders take offset from the rows: padded with one zero row; back: offset 3 again.
TEST(MlxLayout, ChunkedKVCachePadsToOffsetForTheMetaLoaders) {
  const std::string h = "{" + tensor("0.0", "F32", "[1,1,2,2]", 0, 16) + "," + tensor("0.1", "F32", "[1,1,2,2]", 16, 32) + "," +
                        tensor("0.2", "I32", "[]", 32, 36) + "," + tensor("0.3", "I32", "[]", 36, 40) + "," +
                        tensor("0.4", "I32", "[]", 40, 44) +
                        ",\"__metadata__\":{\"1.0\":\"ChunkedKVCache\",\"2.0\":\"\",\"2.1.0\":\"0.2\",\"2.1.1\":\"scalar\","
                        "\"2.2.0\":\"0.3\",\"2.2.1\":\"scalar\",\"2.3.0\":\"0.4\",\"2.3.1\":\"scalar\"}}";
  std::vector<std::byte> ints;
  for (int v : {3, 16, 1}) append_le<int32_t>(ints, v);
  MemoryFile f = file_of(h, concat({f32s(8, 1), ints}));
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  VectorSink s;
  auto meta = moved_to(*in, f, "0.31.3", s);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->layers[0].offset, 3);
  EXPECT_EQ(meta->layers[0].start_position, 1);
  EXPECT_EQ(meta->layers[0].chunk_size, 16);
  MemoryFile mf("m", std::span<const std::byte>(s.bytes));
  auto k = read_tensor(meta->st, mf, *meta->st.find("0.0"));
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, concat({f32s(4, 1), std::vector<std::byte>(8)}));
  VectorSink s2;
  auto back = moved_to(*meta, mf, "0.32.2", s2);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->layers[0].offset, 3);
  EXPECT_EQ(back->layers[0].start_position, 1);
  expect_refused(mlx_change_layout(*in, *mlx_target_for("0.22.0")), "cannot load a ChunkedKVCache");
}

TEST(MlxLayout, TargetsAreReleasesOrLayoutNames) {
  EXPECT_EQ(mlx_target_for("0.28.0")->layout, MlxLayout::kMetaStep);
  EXPECT_EQ(mlx_target_for("0.28.1")->layout, MlxLayout::kMeta);
  EXPECT_EQ(mlx_target_for("v0.31")->layout, MlxLayout::kMeta);
  EXPECT_EQ(mlx_target_for("0.32.2")->layout, MlxLayout::kScalars);
  EXPECT_EQ(mlx_target_for("meta-step")->name(), "mlx-lm 0.28.0");
  EXPECT_EQ(mlx_target_for("meta_state")->name(), "mlx-lm 0.31.3");
  EXPECT_EQ(*mlx_layout_for("scalars"), MlxLayout::kScalars);
  for (const char* bad : {"0.19.0", "0.18.2", "1.0.0", "latest", "0.28.0x", ""}) {
    auto t = mlx_target_for(bad);
    EXPECT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_NE(mlx_target_for("0.18.2").status().message().find("'<i>_keys'"), std::string::npos);
}

TEST(MlxLayout, ClassesWithoutMovesAreRefused) {
  const std::string h = "{" + tensor("0.0", "F32", "[1,4]", 0, 16) + ",\"__metadata__\":{\"0.0\":\"\",\"2.0\":\"BatchKVCache\"}}";
  MemoryFile f = file_of(h, std::vector<std::byte>(16));
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  expect_refused(mlx_change_layout(*in, MlxLayout::kScalars), "layer 0 is a BatchKVCache");
}

// mlx-lm 0.18.x's cache_prompt: "<i>_keys"/"<i>_values", read as KVCache when that is exact.
std::string keys_values_header(int rows, const std::string& max_kv) {
  const uint64_t n = uint64_t(rows) * 8;
  const std::string shape = "[1,1," + std::to_string(rows) + ",2]";
  return "{" + tensor("0_keys", "F32", shape, 0, n) + "," + tensor("0_values", "F32", shape, n, 2 * n) +
         ",\"__metadata__\":{\"chat_template\":\"t\",\"max_kv_size\":\"" + max_kv +
         "\",\"model\":\"m\",\"tokenizer_config\":\"{}\"}}";
}

TEST(MlxLayout, KeysValuesFilesOfMlxLm018AreReadWhenExact) {
  MemoryFile f = file_of(keys_values_header(3, "None"), f32s(12, 1));
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_EQ(in->layout, MlxLayout::kKeysValues);
  ASSERT_EQ(in->layers.size(), 1u);
  EXPECT_EQ(in->layers[0].cls, "KVCache");
  EXPECT_EQ(in->layers[0].offset, 3);
  EXPECT_EQ(in->user_metadata.size(), 4u);
  VectorSink s;
  auto v = moved_to(*in, f, "0.28.0", s);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->st.find("0.1")->shape, (std::vector<int64_t>{1, 1, 3, 2}));
  EXPECT_EQ(meta_of(*v, "1.max_kv_size"), "None");
  EXPECT_EQ(meta_of(*v, "2.0"), "KVCache");
  // 256 rows whose last row is not zero: offset 256, exact either way.
  std::vector<std::byte> full = concat({std::vector<std::byte>(255 * 8), f32s(2, 1), std::vector<std::byte>(256 * 8)});
  auto in256 = read_mlx_prompt_cache(file_of(keys_values_header(256, "None"), full));
  ASSERT_TRUE(in256.ok()) << in256.status().ToString();
  EXPECT_EQ(in256->layers[0].offset, 256);
}

TEST(MlxLayout, KeysValuesFilesThatDoNotSayTheirTokensAreRefused) {
  auto ring = read_mlx_prompt_cache(file_of(keys_values_header(3, "16"), f32s(12, 1)));
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), Code::kNotSupported);
  EXPECT_NE(ring.status().message().find("max_kv_size 16"), std::string::npos) << ring.status().ToString();
  // mlx-lm 0.18.1 (#956) saved the whole 256-row buffer: zero rows past the tokens.
  std::vector<std::byte> padded = concat({f32s(20, 1), std::vector<std::byte>(256 * 8 * 2 - 80)});
  auto buf = read_mlx_prompt_cache(file_of(keys_values_header(256, "None"), padded));
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), Code::kNotSupported);
  EXPECT_NE(buf.status().message().find("whole 256-row buffer"), std::string::npos) << buf.status().ToString();
  // A tensor that is not a layer's keys or values.
  const std::string stray = "{" + tensor("0_keys", "F32", "[1,1,1,2]", 0, 8) + "," + tensor("0_values", "F32", "[1,1,1,2]", 8, 16) +
                            "," + tensor("1_bias", "F32", "[1]", 16, 20) + ",\"__metadata__\":{\"max_kv_size\":\"None\"}}";
  auto bad = read_mlx_prompt_cache(file_of(stray, f32s(5, 1)));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption);
  EXPECT_NE(bad.status().message().find("'1_bias'"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace kvsnap
