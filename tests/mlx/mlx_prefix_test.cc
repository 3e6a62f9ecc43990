// format/mlx_layout.h mlx_prefix on synthetic prompt caches: the prefix of a long cache is, byte
// for byte, the cache of the short prompt (the test files' values depend only on the position, as
// two saves of one conversation do), float and quantized, in the meta and scalars layouts; a
// RotatingKVCache is cut only before its ring wraps; recurrent state and wrapped rings are refused
// naming the layer. (In the real mlx-lm: oracle.mlx_store.)
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "format/mlx_layout.h"
#include "migrate/mlx_requant.h"
#include "mlx/mlx_test_files.h"

namespace kvsnap {
namespace {

using namespace test_mlx;

// mlx_prefix(file, n), written.
Result<std::vector<std::byte>> prefix_of(const MemoryFile& f, int64_t n) {
  KV_ASSIGN_OR_RETURN(MlxPromptCache c, read_mlx_prompt_cache(f));
  KV_ASSIGN_OR_RETURN(MlxOutFile out, mlx_prefix(c, n));
  VectorSink sink;
  KV_RETURN_IF_ERROR(write_mlx_file(out, c, f, sink));
  return std::move(sink.bytes);
}

void expect_same(const Result<std::vector<std::byte>>& got, const MemoryFile& want) {
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), want.size()) << want.name();
  EXPECT_TRUE(std::equal(got->begin(), got->end(), want.bytes().begin())) << want.name();
}

MemoryFile written(const std::string& name, const Result<MlxOutFile>& out, const MemoryFile& from) {
  auto c = read_mlx_prompt_cache(from);
  EXPECT_TRUE(c.ok() && out.ok());
  VectorSink sink;
  EXPECT_TRUE(write_mlx_file(*out, *c, from, sink).ok());
  return MemoryFile(name, std::move(sink.bytes));
}

MemoryFile quantized(const MemoryFile& in, MlxKvSetting to, MlxLayout layout) {
  auto c = read_mlx_prompt_cache(in);
  EXPECT_TRUE(c.ok());
  VectorSink sink;
  auto r = mlx_requantize(*c, in, MlxRequantSpec{to, to, MlxDevice::kCpu, layout}, sink);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return MemoryFile("q-" + in.name(), std::move(sink.bytes));
}

void expect_refused(const Result<std::vector<std::byte>>& r, Code code, const std::string& what) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
}

TEST(MlxPrefix, KvCacheFloatAndQuantizedAreTheShortPromptsCache) {
  const MemoryFile long_f = kv_file(2, 4, 300, 64), short_f = kv_file(2, 4, 100, 64);
  expect_same(prefix_of(long_f, 100), short_f);
  expect_same(prefix_of(long_f, 300), long_f);  // all of it: the file itself
  // Quantized (meta layout, QuantizedKVCache offset in meta_state): groups run along head_dim.
  for (MlxKvSetting q : {MlxKvSetting{4, 64}, MlxKvSetting{3, 32}, MlxKvSetting{8, 32}}) {
    const MemoryFile ql = quantized(long_f, q, MlxLayout::kMeta), qs = quantized(short_f, q, MlxLayout::kMeta);
    expect_same(prefix_of(ql, 100), qs);
    auto c = read_mlx_prompt_cache(qs);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->layers[0].cls, "QuantizedKVCache");
    EXPECT_EQ(c->layers[1].offset, 100);
  }
  // The scalars layout of mlx-lm 0.32 (offset a 0-d tensor), float and quantized.
  const MemoryFile sl = written("sl", mlx_change_layout(*read_mlx_prompt_cache(long_f), MlxLayout::kScalars), long_f);
  const MemoryFile ss = written("ss", mlx_change_layout(*read_mlx_prompt_cache(short_f), MlxLayout::kScalars), short_f);
  // A KVCache there is saved as mlx-lm 0.32 saves one that computed the n positions: its buffer of
  // 256-row steps, the short prompt's rows first, zero rows after them.
  auto long_c = read_mlx_prompt_cache(sl);
  ASSERT_TRUE(long_c.ok());
  for (int64_t n : {100, 37, 256}) {
    auto cut = prefix_of(sl, n);
    ASSERT_TRUE(cut.ok()) << cut.status().ToString();
    MemoryFile cf("cut", std::move(*cut));
    auto c = read_mlx_prompt_cache(cf);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->layout, MlxLayout::kScalars);
    for (size_t il = 0; il < 2; ++il) {
      EXPECT_EQ(c->layers[il].offset, n);
      for (bool v : {false, true}) {
        const MlxKvSide& a = v ? *long_c->layers[il].v : *long_c->layers[il].k;
        const MlxKvSide& b = v ? *c->layers[il].v : *c->layers[il].k;
        ASSERT_EQ(b.rows, 256);
        auto x = read_tensor(long_c->st, sl, *a.data);
        auto y = read_tensor(c->st, cf, *b.data);
        ASSERT_TRUE(x.ok() && y.ok());
        const size_t row = size_t(b.head_dim) * safetensors_itemsize(b.dtype);
        for (int64_t h = 0; h < b.heads; ++h) {
          for (int64_t t = 0; t < 256; ++t) {
            const std::byte* got = y->data() + (size_t(h) * 256 + size_t(t)) * row;
            if (t < n) {
              EXPECT_TRUE(std::equal(got, got + row, x->data() + (size_t(h) * a.rows + size_t(t)) * row)) << t;
            } else {
              EXPECT_TRUE(std::all_of(got, got + row, [](std::byte z) { return z == std::byte{0}; })) << t;
            }
          }
        }
      }
    }
  }
  // QuantizedKVCache keeps n rows (mlx-lm's padding there depends on how it was quantized).
  expect_same(prefix_of(quantized(sl, {4, 64}, MlxLayout::kScalars), 100), quantized(ss, {4, 64}, MlxLayout::kScalars));
}

// A KVCache file whose user metadata holds the prompt's ids (kvsnap convert --to mlx writes them).
MemoryFile with_tokens(int64_t rows, int64_t n_ids) {
  std::string ids = "[";
  for (int64_t i = 0; i < n_ids; ++i) ids += (i ? "," : "") + std::to_string(1000 + i);
  return make_file({kv_tensor("0.0", {1, 2, rows, 64}, 1), kv_tensor("0.1", {1, 2, rows, 64}, 2)},
                   {{"0.0", ""}, {"1.model", "m"}, {"1.tokens", ids + "]"}, {"2.0", "KVCache"}}, "tok.safetensors");
}

TEST(MlxPrefix, TheTokensMetadataIsCutToo) {
  expect_same(prefix_of(with_tokens(30, 30), 12), with_tokens(12, 12));
  expect_refused(prefix_of(with_tokens(30, 8), 12), Code::kNotSupported, "metadata 'tokens' holds 8 ids, fewer than the 12");
}

TEST(MlxPrefix, OutOfRangeAndOldLayoutsAreRefused) {
  const MemoryFile f = kv_file(1, 2, 50, 64);
  expect_refused(prefix_of(f, 51), Code::kInvalidArgument, "layer 0 (KVCache) holds 50 positions; ask for 1..50");
  expect_refused(prefix_of(f, 0), Code::kInvalidArgument, "ask for 1 position or more");
}

// A RotatingKVCache of the meta layout (0.28.1 .. 0.31): rows, (keep, max_size, offset, _idx).
MemoryFile rotating(int64_t rows, int64_t max_size, int64_t offset, int64_t idx) {
  return make_file({kv_tensor("0.0", {1, 2, rows, 64}, 1), kv_tensor("0.1", {1, 2, rows, 64}, 2)},
                   {{"0.0.0", "0"}, {"0.0.1", std::to_string(max_size)}, {"0.0.2", std::to_string(offset)},
                    {"0.0.3", std::to_string(idx)}, {"2.0", "RotatingKVCache"}},
                   "rot.safetensors");
}

TEST(MlxPrefix, RotatingKVCacheIsCutOnlyBeforeItsRingWraps) {
  // Not wrapped (offset within the window, _idx right after it): the first rows, offset and _idx n.
  expect_same(prefix_of(rotating(40, 64, 40, 40), 10), rotating(10, 64, 10, 10));
  expect_same(prefix_of(rotating(64, 64, 64, 64), 64), rotating(64, 64, 64, 64));
  // Wrapped: offset past the window, or _idx turned back.
  expect_refused(prefix_of(rotating(64, 64, 100, 36), 10), Code::kNotSupported,
                 "layer 0 (RotatingKVCache): cannot cut it to its first 10 positions: its ring of 64 positions has "
                 "wrapped (offset 100, _idx 36)");
  expect_refused(prefix_of(rotating(64, 64, 64, 3), 10), Code::kNotSupported, "has wrapped");
}

TEST(MlxPrefix, RecurrentStateIsRefusedAndCacheListMembersAreCut) {
  // A hybrid model: KVCache layer 0, ArraysCache layer 1 (its conv and SSM state).
  Tensor conv{"1.0", "F32", {1, 3, 8}, std::vector<std::byte>(96)};
  Tensor ssm{"1.1", "F32", {1, 2, 4}, std::vector<std::byte>(32)};
  const MemoryFile hybrid = make_file({kv_tensor("0.0", {1, 2, 20, 64}, 1), kv_tensor("0.1", {1, 2, 20, 64}, 2), conv, ssm},
                                      {{"0.0", ""}, {"0.1", ""}, {"2.0", "KVCache"}, {"2.1", "ArraysCache"}});
  expect_refused(prefix_of(hybrid, 5), Code::kNotSupported,
                 "layer 1 (ArraysCache): cannot cut it to its first 5 positions: its state is recurrent");
  // CacheList (0.31 meta layout): member 0 KVCache, member 1 KVCache; both cut.
  auto list = [](int64_t rows) {
    return make_file({kv_tensor("0.0.0", {1, 1, rows, 64}, 1), kv_tensor("0.0.1", {1, 1, rows, 64}, 2),
                      kv_tensor("0.1.0", {1, 1, rows, 64}, 3), kv_tensor("0.1.1", {1, 1, rows, 64}, 4)},
                     {{"0.0.0.0", "KVCache"}, {"0.0.0.1", "KVCache"}, {"0.0.1.0", ""}, {"0.0.1.1", ""}, {"2.0", "CacheList"}},
                     "list.safetensors");
  };
  const MemoryFile l30 = list(30);
  auto c = read_mlx_prompt_cache(l30);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->layers[0].sub.size(), 2u);
  expect_same(prefix_of(l30, 12), list(12));
}

}  // namespace
}  // namespace kvsnap
