// migrate/mlx_requant.h on synthetic prompt caches of the three mlx-lm layouts: the classes, meta
// state / scalars and tensors of the output (read back with kvsnap's reader), the rows against the
// codec, the report, the carried classes and every refusal. The bytes against the real mlx:
// tests/mlx/requant_test.py (oracle.mlx_requant).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/byte_order.h"
#include "format/mlx_layout.h"
#include "format/mlx_prompt_cache.h"
#include "migrate/mlx_requant.h"
#include "mlx/mlx_test_files.h"

namespace kvsnap {
namespace {

using test_mlx::make_file;
using test_mlx::Meta;
using In = test_mlx::Tensor;

// bf16 values of a smooth, signed pattern; `seed` shifts it.
In bf16_tensor(const std::string& name, std::vector<int64_t> shape, int seed, int64_t zero_from_row = -1) {
  In t{name, "BF16", shape, {}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = (i / shape[3]) % shape[2];
    const float v = zero_from_row >= 0 && row >= zero_from_row ? 0.0f : 3.0f * std::sin(0.37f * float(i + seed)) + 0.5f;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    append_le<uint16_t>(t.bytes, uint16_t(u >> 16));
  }
  return t;
}

using test_mlx::i32_scalar;

// Two KVCache layers, bf16 [1,2,5,D], mlx-lm 0.28.1 .. 0.31 (meta_state) layout.
MemoryFile kv_meta_file(int64_t d = 64) {
  return make_file({bf16_tensor("0.0", {1, 2, 5, d}, 0), bf16_tensor("0.1", {1, 2, 5, d}, 1000),
                    bf16_tensor("1.0", {1, 2, 5, d}, 2000), bf16_tensor("1.1", {1, 2, 5, d}, 3000)},
                   {{"0.0", ""}, {"0.1", ""}, {"1.model", "m"}, {"2.0", "KVCache"}, {"2.1", "KVCache"}});
}

struct Converted {
  MemoryFile file;
  MlxRequantResult res;
};

// kv_meta_file's KVCache layers do not tell mlx-lm <= 0.28.0 from 0.28.1 .. 0.31: say 0.31.
Result<Converted> convert(const ReadableFile& f, MlxKvSetting to, std::optional<MlxLayout> layout = MlxLayout::kMeta) {
  KV_ASSIGN_OR_RETURN(MlxPromptCache c, read_mlx_prompt_cache(f));
  if (c.layout != MlxLayout::kMeta) layout.reset();
  VectorSink sink;
  KV_ASSIGN_OR_RETURN(MlxRequantResult r, mlx_requantize(c, f, MlxRequantSpec{to, to, MlxDevice::kCpu, layout}, sink));
  EXPECT_EQ(r.bytes_out, sink.bytes.size());
  return Converted{MemoryFile("out.safetensors", std::move(sink.bytes)), std::move(r)};
}

std::vector<std::byte> tensor_bytes(const MlxPromptCache& c, const ReadableFile& f, const std::string& name) {
  const SafetensorsTensor* t = c.st.find(name);
  EXPECT_TRUE(t) << name;
  if (!t) return {};
  return *read_tensor(c.st, f, *t);
}

std::vector<float> bf16_values(const std::vector<std::byte>& b) {
  std::vector<float> v;
  for (size_t i = 0; i + 2 <= b.size(); i += 2) v.push_back(mlx_load_float(MlxFloat::kBF16, b.data() + i));
  return v;
}

std::map<std::string, std::string> meta_of(const MlxPromptCache& c) { return {c.st.metadata->begin(), c.st.metadata->end()}; }

TEST(MlxRequant, KvCacheToQuantizedRowsAreTheCodecsAndTheFileReadsBack) {
  MemoryFile in = kv_meta_file();
  auto out = convert(in, {4, 64});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto c = read_mlx_prompt_cache(out->file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layout, MlxLayout::kMeta);
  ASSERT_EQ(c->layers.size(), 2u);
  for (const MlxLayer& L : c->layers) {
    EXPECT_EQ(L.cls, "QuantizedKVCache");
    EXPECT_EQ(L.bits, 4);
    EXPECT_EQ(L.group_size, 64);
    EXPECT_EQ(L.offset, 5);
    EXPECT_EQ(L.k->head_dim, 64);
    EXPECT_EQ(L.k->dtype, "BF16");
  }
  EXPECT_EQ(meta_of(*c).at("1.model"), "m");
  // Layer 1's values, row by row, are what the codec makes of the input row.
  auto src = read_mlx_prompt_cache(in);
  const std::vector<float> x = bf16_values(tensor_bytes(*src, in, "1.1"));
  const auto codes = tensor_bytes(*c, out->file, "1.1.0");
  const std::vector<float> scales = bf16_values(tensor_bytes(*c, out->file, "1.1.1"));
  const std::vector<float> biases = bf16_values(tensor_bytes(*c, out->file, "1.1.2"));
  ASSERT_EQ(codes.size(), 10u * 32u);
  for (size_t r = 0; r < 10; ++r) {
    std::vector<std::byte> want(32);
    float s, b;
    mlx_affine_quantize_row(x.data() + r * 64, 64, 4, 64, MlxDevice::kCpu, want.data(), &s, &b);
    EXPECT_EQ(std::memcmp(want.data(), codes.data() + r * 32, 32), 0) << r;
    EXPECT_EQ(scales[r], mlx_round_to(MlxFloat::kBF16, s));
    EXPECT_EQ(biases[r], mlx_round_to(MlxFloat::kBF16, b));
  }
  // The report: every side converted, over 2 heads x 5 rows x 64 values, a real but small error.
  ASSERT_EQ(out->res.sides.size(), 4u);
  EXPECT_EQ(out->res.layers_converted, 2);
  for (const MlxRequantSide& s : out->res.sides) {
    EXPECT_FALSE(s.copied);
    EXPECT_EQ(s.from, "BF16");
    EXPECT_EQ(s.to, "q4g64 BF16");
    EXPECT_EQ(s.values, 640u);
    EXPECT_GT(s.rmse, 0.0);
    EXPECT_LT(s.rmse, 0.3);  // 4 bits over a range of ~6: step 0.4, rms error ~ step/sqrt(12)
    EXPECT_LE(s.max_abs, 0.21 + 0.05);
    EXPECT_GT(s.snr_db, 15.0);
  }
}

// A float KVCache of the meta layouts tells mlx-lm its offset by its rows: a QuantizedKVCache holding
// rows past its offset (what a kvsnap before the cut in format/mlx_layout.cc made of mlx-lm 0.32's
// 256-row buffer) dequantized as it stood loaded at offset 256 instead of 37, exit 0 (a review's
// finding). Such a layer is refused, naming the rows and the offset.
TEST(MlxRequant, AFloatMetaLayerMustHoldExactlyItsOffsetsRows) {
  const std::vector<std::byte> codes(1 * 2 * 5 * 8 * 4), scales(1 * 2 * 5 * 1 * 2);
  MemoryFile f = make_file({In{"0.0.0", "U32", {1, 2, 5, 8}, codes}, In{"0.0.1", "BF16", {1, 2, 5, 1}, scales},
                            In{"0.0.2", "BF16", {1, 2, 5, 1}, scales}, In{"0.1.0", "U32", {1, 2, 5, 8}, codes},
                            In{"0.1.1", "BF16", {1, 2, 5, 1}, scales}, In{"0.1.2", "BF16", {1, 2, 5, 1}, scales}},
                           {{"0.0.0", "3"}, {"0.0.1", "64"}, {"0.0.2", "4"}, {"2.0", "QuantizedKVCache"}});
  auto r = convert(f, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported);
  EXPECT_NE(r.status().message().find("holds 5 rows for its offset 3"), std::string::npos) << r.status().message();
  // To another quantized setting the offset stays in meta_state: converted.
  EXPECT_TRUE(convert(f, {8, 64}).ok());
}

TEST(MlxRequant, SameSettingCopiesByteForByteAndFloatDequantizes) {
  MemoryFile in = kv_meta_file();
  auto q = convert(in, {4, 64});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  auto again = convert(q->file, {4, 64});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->file.size(), q->file.size());
  EXPECT_EQ(std::memcmp(again->file.bytes().data(), q->file.bytes().data(), q->file.size()), 0);
  for (const auto& s : again->res.sides) EXPECT_TRUE(s.copied);
  EXPECT_EQ(again->res.layers_converted, 0);

  auto f = convert(q->file, {});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto c = read_mlx_prompt_cache(f->file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layers[0].cls, "KVCache");
  EXPECT_EQ(meta_of(*c).at("0.0"), "");
  EXPECT_EQ(meta_of(*c).count("0.0.0"), 0u);
  // The float values are the dequantized ones: T(T(code*scale)+bias).
  auto qc = read_mlx_prompt_cache(q->file);
  const auto codes = tensor_bytes(*qc, q->file, "0.0.0");
  const auto scales = bf16_values(tensor_bytes(*qc, q->file, "0.0.1"));
  const auto biases = bf16_values(tensor_bytes(*qc, q->file, "0.0.2"));
  const auto got = bf16_values(tensor_bytes(*c, f->file, "0.0"));
  ASSERT_EQ(got.size(), 640u);
  for (size_t r = 0; r < 10; ++r) {
    std::vector<float> want(64);
    mlx_affine_dequantize_row(codes.data() + r * 32, &scales[r], &biases[r], 64, 4, 64, MlxFloat::kBF16, want.data());
    for (size_t i = 0; i < 64; ++i) ASSERT_EQ(got[r * 64 + i], want[i]) << r << " " << i;
  }
  for (const auto& s : f->res.sides) EXPECT_EQ(s.rmse, 0.0);
}

TEST(MlxRequant, QuantizedToOtherBitsIsQuantizeOfDequantizeAndNoWorse) {
  MemoryFile in = kv_meta_file(128);
  auto q8 = convert(in, {8, 32});
  ASSERT_TRUE(q8.ok()) << q8.status().ToString();
  auto deq = convert(q8->file, {});
  ASSERT_TRUE(deq.ok());
  auto via_float = convert(deq->file, {3, 128});  // quantize the dequantized values
  auto direct = convert(q8->file, {3, 128});
  ASSERT_TRUE(via_float.ok() && direct.ok()) << direct.status().ToString();
  ASSERT_EQ(direct->file.size(), via_float->file.size());
  EXPECT_EQ(std::memcmp(direct->file.bytes().data(), via_float->file.bytes().data(), direct->file.size()), 0);
  for (size_t i = 0; i < direct->res.sides.size(); ++i) {
    EXPECT_EQ(direct->res.sides[i].from, "q8g32 BF16");
    EXPECT_EQ(direct->res.sides[i].rmse, via_float->res.sides[i].rmse);
    EXPECT_GT(direct->res.sides[i].rmse, 0.0);
  }
}

// mlx-lm 0.32 (scalars layout): KVCache "0.0","0.1" with an 8-row buffer, offset 5 in "0.2"; a
// RotatingKVCache second layer with its four scalars.
MemoryFile kv_scalars_file() {
  return make_file({bf16_tensor("0.0", {1, 2, 8, 64}, 0, 5), bf16_tensor("0.1", {1, 2, 8, 64}, 7, 5),
                    i32_scalar("0.2", 5), bf16_tensor("1.0", {1, 2, 4, 64}, 9), bf16_tensor("1.1", {1, 2, 4, 64}, 11),
                    i32_scalar("1.2", 6), i32_scalar("1.3", 0), i32_scalar("1.4", 4), i32_scalar("1.5", 2)},
                   {{"0.model", "m"}, {"1.0", "KVCache"}, {"1.1", "RotatingKVCache"}, {"2.0", ""},
                    {"2.1.0", "0.2"}, {"2.1.1", "scalar"}, {"2.2.0", "1.2"}, {"2.2.1", "scalar"},
                    {"2.3.0", "1.3"}, {"2.3.1", "scalar"}, {"2.4.0", "1.4"}, {"2.4.1", "scalar"},
                    {"2.5.0", "1.5"}, {"2.5.1", "scalar"}});
}

TEST(MlxRequant, ScalarsLayoutGainsAndLosesGroupSizeAndBitsScalars) {
  MemoryFile in = kv_scalars_file();
  auto q = convert(in, {5, 32});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  auto c = read_mlx_prompt_cache(q->file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layout, MlxLayout::kScalars);
  EXPECT_EQ(c->layers[0].cls, "QuantizedKVCache");
  EXPECT_EQ(c->layers[0].bits, 5);
  EXPECT_EQ(c->layers[0].group_size, 32);
  EXPECT_EQ(c->layers[0].offset, 5);
  EXPECT_EQ(c->layers[0].k->rows, 8);  // the whole buffer, as to_quantized quantizes it
  EXPECT_EQ(c->layers[1].cls, "RotatingKVCache");
  const auto m = meta_of(*c);
  // The scalars list in state order: 0.2 0.3 0.4 then the ring's.
  EXPECT_EQ(m.at("2.1.0"), "0.2");
  EXPECT_EQ(m.at("2.2.0"), "0.3");
  EXPECT_EQ(m.at("2.3.0"), "0.4");
  EXPECT_EQ(m.at("2.4.0"), "1.2");
  EXPECT_EQ(m.at("2.7.0"), "1.5");
  EXPECT_EQ(m.count("2.8.0"), 0u);
  // The report counts only the offset rows: 2 heads x 5 rows x 64.
  EXPECT_EQ(q->res.sides[0].values, 640u);
  ASSERT_EQ(q->res.notes.size(), 1u);
  EXPECT_NE(q->res.notes[0].find("RotatingKVCache Quantization NYI"), std::string::npos) << q->res.notes[0];
  EXPECT_EQ(q->res.sides.size(), 2u);  // the ring has no report line, only its note

  auto back = convert(q->file, {});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto b = read_mlx_prompt_cache(back->file);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto orig = read_mlx_prompt_cache(in);
  EXPECT_EQ(meta_of(*b), meta_of(*orig));  // the metadata of the float file again
  EXPECT_EQ(b->layers[0].cls, "KVCache");
  EXPECT_EQ(b->layers[0].offset, 5);
  EXPECT_FALSE(b->st.find("0.3"));
  EXPECT_EQ(b->st.tensors.size(), orig->st.tensors.size());
}

TEST(MlxRequant, MetaStepLayoutWritesStepFirstAndCarriesTheRing) {
  // mlx-lm 0.19.3 .. 0.28.0: a RotatingKVCache meta_state (keep, max_size, step, offset, _idx).
  MemoryFile in = make_file({bf16_tensor("0.0", {1, 1, 4, 32}, 0), bf16_tensor("0.1", {1, 1, 4, 32}, 1),
                             bf16_tensor("1.0", {1, 1, 3, 32}, 2), bf16_tensor("1.1", {1, 1, 3, 32}, 3)},
                            {{"0.0.0", "0"}, {"0.0.1", "4"}, {"0.0.2", "256"}, {"0.0.3", "6"}, {"0.0.4", "2"},
                             {"0.1", ""}, {"2.0", "RotatingKVCache"}, {"2.1", "KVCache"}});
  auto q = convert(in, {2, 32});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  auto c = read_mlx_prompt_cache(q->file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->layout, MlxLayout::kMetaStep);
  const auto m = meta_of(*c);
  EXPECT_EQ(m.at("0.1.0"), "256");
  EXPECT_EQ(m.at("0.1.1"), "3");
  EXPECT_EQ(m.at("0.1.2"), "32");
  EXPECT_EQ(m.at("0.1.3"), "2");
  EXPECT_EQ(m.count("0.1"), 0u);
  EXPECT_EQ(c->layers[0].cls, "RotatingKVCache");
  EXPECT_EQ(c->layers[1].cls, "QuantizedKVCache");
  EXPECT_EQ(c->layers[1].step, 256);
}

TEST(MlxRequant, ThreadsChangeNeitherTheBytesNorTheReport) {
  // 2 x 2 heads x 300 rows: several 64-row blocks per side, spread over 1, 3 and 8 workers.
  MemoryFile in = make_file({bf16_tensor("0.0", {2, 2, 300, 128}, 0), bf16_tensor("0.1", {2, 2, 300, 128}, 5)},
                            {{"0.0", ""}, {"2.0", "KVCache"}});
  auto c = read_mlx_prompt_cache(in);
  ASSERT_TRUE(c.ok());
  std::vector<std::vector<std::byte>> files;
  std::vector<MlxRequantResult> reports;
  for (unsigned threads : {1u, 3u, 8u}) {
    VectorSink sink;
    auto r = mlx_requantize(*c, in, MlxRequantSpec{{5, 32}, {5, 32}, MlxDevice::kCpu, MlxLayout::kMeta, threads}, sink);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    files.push_back(std::move(sink.bytes));
    reports.push_back(*r);
  }
  for (size_t i = 1; i < files.size(); ++i) {
    EXPECT_EQ(files[i], files[0]);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_EQ(reports[i].sides[s].rmse, reports[0].sides[s].rmse);
      EXPECT_EQ(reports[i].sides[s].snr_db, reports[0].sides[s].snr_db);
      EXPECT_EQ(reports[i].sides[s].max_abs, reports[0].sides[s].max_abs);
    }
  }
  EXPECT_EQ(reports[0].sides[0].values, 2u * 2u * 300u * 128u);
}

TEST(MlxRequant, FloatMetaFilesNeedTheReadersReleaseToQuantize) {
  // KVCache layers only: the file does not say whether QuantizedKVCache's meta_state needs `step`.
  MemoryFile in = kv_meta_file();
  auto c = read_mlx_prompt_cache(in);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->step_unknown);
  VectorSink sink;
  auto r = mlx_requantize(*c, in, MlxRequantSpec{{4, 64}, {4, 64}, MlxDevice::kCpu, std::nullopt}, sink);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAmbiguous);
  EXPECT_NE(r.status().message().find("give {--mlx-lm VERSION}"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(sink.bytes.empty());
  auto scalars = mlx_requantize(*c, in, MlxRequantSpec{{4, 64}, {4, 64}, MlxDevice::kCpu, MlxLayout::kScalars}, sink);
  EXPECT_EQ(scalars.status().code(), Code::kInvalidArgument) << scalars.status().ToString();
  auto old = convert(in, {4, 64}, MlxLayout::kMetaStep);  // for mlx-lm 0.28.0
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  auto q = read_mlx_prompt_cache(old->file);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->layout, MlxLayout::kMetaStep);
  EXPECT_EQ(q->layers[0].step, 256);
  EXPECT_EQ(meta_of(*q).at("0.0.1"), "5");
}

TEST(MlxRequant, RefusalsNameTheFileLayerAndRemedy) {
  MemoryFile in = kv_meta_file(96);
  auto c = read_mlx_prompt_cache(in);
  ASSERT_TRUE(c.ok());
  VectorSink sink;
  // Different K and V: no mlx-lm loads that.
  auto kv = mlx_requantize(*c, in, MlxRequantSpec{{4, 32}, {8, 32}, MlxDevice::kCpu, MlxLayout::kMeta}, sink);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), Code::kInvalidArgument);
  EXPECT_NE(kv.status().message().find("no mlx-lm release"), std::string::npos) << kv.status().ToString();
  auto mixed = mlx_requantize(*c, in, MlxRequantSpec{{}, {8, 32}, MlxDevice::kCpu, MlxLayout::kMeta}, sink);
  EXPECT_FALSE(mixed.ok());
  // Bits MLX does not have.
  auto b7 = mlx_requantize(*c, in, MlxRequantSpec{{7, 32}, {7, 32}, MlxDevice::kCpu, MlxLayout::kMeta}, sink);
  ASSERT_FALSE(b7.ok());
  EXPECT_NE(b7.status().message().find("bits 7"), std::string::npos);
  // Head dim 96 in groups of 64: the file, the layer, the side and the group that fits.
  auto g64 = mlx_requantize(*c, in, MlxRequantSpec{{4, 64}, {4, 64}, MlxDevice::kCpu, MlxLayout::kMeta}, sink);
  ASSERT_FALSE(g64.ok());
  const std::string msg = g64.status().message();
  EXPECT_NE(msg.find("in.safetensors: layer 0 (KVCache): K head dim 96"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use {--kv-group-size 32}"), std::string::npos) << msg;
  EXPECT_TRUE(sink.bytes.empty());  // nothing written before the checks
  MemoryFile odd = kv_meta_file(80);
  auto co = read_mlx_prompt_cache(odd);
  auto g32 = mlx_requantize(*co, odd, MlxRequantSpec{{4, 32}, {4, 32}, MlxDevice::kCpu, MlxLayout::kMeta}, sink);
  ASSERT_FALSE(g32.ok());
  EXPECT_NE(g32.status().message().find("no MLX group size"), std::string::npos) << g32.status().ToString();
  // Nothing mlx-lm can quantize: a file of rotating caches only.
  MemoryFile rot = make_file({bf16_tensor("0.0", {1, 1, 4, 32}, 0), bf16_tensor("0.1", {1, 1, 4, 32}, 1)},
                             {{"0.0.0", "0"}, {"0.0.1", "4"}, {"0.0.2", "6"}, {"0.0.3", "2"}, {"2.0", "RotatingKVCache"}},
                             "rot.safetensors");
  auto rc = read_mlx_prompt_cache(rot);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  auto none = mlx_requantize(*rc, rot, MlxRequantSpec{{4, 32}, {4, 32}, MlxDevice::kCpu, std::nullopt}, sink);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kNotSupported);
  EXPECT_NE(none.status().message().find("rot.safetensors"), std::string::npos);
  EXPECT_NE(none.status().message().find("NotImplementedError"), std::string::npos) << none.status().ToString();
  EXPECT_TRUE(sink.bytes.empty());
}

}  // namespace
}  // namespace kvsnap
