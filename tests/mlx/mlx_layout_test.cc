// format/mlx_layout.h on synthetic files: each move gives a file the reader parses back to the
// same layers in the target layout; KVCache rows past offset are cut for the meta layouts; classes
// not handled are refused. (Loading the moves in the real mlx-lm releases: oracle.mlx_bed.)
#include <gtest/gtest.h>

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

TEST(MlxLayout, OtherClassesAreRefused) {
  const std::string h = "{" + tensor("0.0", "F32", "[1,4]", 0, 16) + ",\"__metadata__\":{\"0.0\":\"\",\"2.0\":\"ArraysCache\"}}";
  MemoryFile f = file_of(h, std::vector<std::byte>(16));
  auto in = read_mlx_prompt_cache(f);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  auto out = mlx_change_layout(*in, MlxLayout::kScalars);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kNotSupported);
  EXPECT_NE(out.status().message().find("layer 0 is a ArraysCache"), std::string::npos) << out.status().ToString();
  EXPECT_FALSE(mlx_layout_for("0.18.0").ok());
  EXPECT_EQ(*mlx_layout_for("0.28.0"), MlxLayout::kMetaStep);
  EXPECT_EQ(*mlx_layout_for("0.28.1"), MlxLayout::kMeta);
  EXPECT_EQ(*mlx_layout_for("0.32.2"), MlxLayout::kScalars);
}

}  // namespace
}  // namespace kvsnap
