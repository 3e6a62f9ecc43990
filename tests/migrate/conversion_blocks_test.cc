// migrate/convert_state.h conversion_block_rows: how many rows of a tensor one worker converts at
// a time. Powers of two (so blocks start where a snapshot's 256-cell chunks do), at most 1 MiB of
// rows and a worker's share, and larger, up to what the source reads best at once, only where no
// worker gets more rows than before: powers of two, or multiples of the source's chunk cells.
#include "migrate/convert_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/io.h"
#include "migrate/conversion_spec.h"
#include "synthetic_cache.h"

namespace kvsnap {
namespace {

constexpr uint64_t kRow = 2048;  // an f16 K row of 8 heads x 128

TEST(ConversionBlockRows, AtMostOneMiBAndAWorkersShare) {
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 0), 512u);   // 1 MiB of rows
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 0), 512u);
  EXPECT_EQ(conversion_block_rows(3212, 2, 256, 0), 1024u);    // a worker's share (1,606 rows)
  EXPECT_EQ(conversion_block_rows(100, 4, 256, 0), 16u);
  EXPECT_EQ(conversion_block_rows(1, 2, kRow, 0), 1u);
  EXPECT_EQ(conversion_block_rows(5000, 1, kRow, 0), 512u);
}

TEST(ConversionBlockRows, ALongTensorTakesWhatTheSourceReadsAtOnce) {
  // 16,050 cells on 2 workers: 512-row blocks give the busier worker 8,192 rows, and so do 1,024-,
  // 2,048- and 4,096-row blocks.
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 1024), 1024u);  // four chunks read together
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 2048), 2048u);  // eight
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 4096), 2048u);  // 4 MiB at most
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 256), 512u);    // never smaller than without
  // Never more than 4 MiB of rows, nor a worker's share.
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 16384), 2048u);
  EXPECT_EQ(conversion_block_rows(16050, 2, 512, 16384), 4096u);  // the share is 8,025
  EXPECT_EQ(conversion_block_rows(4096, 4, kRow, 2048), 1024u);  // one block each
}

TEST(ConversionBlockRows, NotWhereAWorkerWouldGetMoreRows) {
  // 3,212 cells on 2 workers: 512-row blocks leave the busier one 1,676 rows, 1,024-row ones
  // 2,048, so a source that reads 1,024 or 2,048 cells at once still gets 512.
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 1024), 512u);
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 2048), 512u);
  // 6,000 cells: 512 -> 3,072 rows for the busier worker, 1,024 -> 3,072, 2,048 -> 3,952.
  EXPECT_EQ(conversion_block_rows(6000, 2, kRow, 2048), 1024u);
}

TEST(ConversionBlockRows, MultiplesOfTheChunksBetweenThePowersOfTwo) {
  // 3,212 cells of 256-cell chunks on 2 workers: 512-row blocks leave the busier one 1,676 rows, and
  // so do 768 (three chunks: shani-x4's lanes) and 1,536 (six: avx2-x8's), where 1,024 would not.
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 1024, 256), 768u);
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 2048, 256), 1536u);
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 512, 256), 512u);    // two lanes: nothing between
  EXPECT_EQ(conversion_block_rows(6000, 2, kRow, 2048, 256), 1536u);  // not 1,024: six lanes, not four
  // A power of two where it is allowed; never past read_cells, nor without the chunks' cells, nor
  // where they do not divide the first size (blocks would cut chunks).
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 1024, 256), 1024u);
  EXPECT_EQ(conversion_block_rows(16050, 2, kRow, 2048, 256), 2048u);
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 1024, 0), 512u);
  EXPECT_EQ(conversion_block_rows(3212, 2, kRow, 2048, 3), 512u);
  EXPECT_EQ(conversion_block_rows(100, 4, 256, 1024, 256), 16u);
}

// A file that remembers its largest read (reads come from several workers at once).
class LargestReadFile final : public ReadableFile {
 public:
  explicit LargestReadFile(std::span<const std::byte> bytes) : file_("long.slot", bytes) {}
  uint64_t size() const override { return file_.size(); }
  const std::string& name() const override { return file_.name(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    uint64_t seen = largest_.load();
    while (dst.size() > seen && !largest_.compare_exchange_weak(seen, dst.size())) {
    }
    return file_.read_at(offset, dst);
  }
  uint64_t largest() const { return largest_.load(); }

 private:
  MemoryFile file_;
  mutable std::atomic<uint64_t> largest_{0};
};

// convert_state takes ConvertRequest::source_read_cells: 4,608 cells of 2 KiB f16 rows on 2
// threads are read 512 rows at a time without it and 2,048 with 2,048, into the same bytes.
TEST(ConversionBlockRows, ConvertStateReadsTheBlocksItsSourceAsksFor) {
  const std::vector<std::byte> bytes = test::build(test::long_f16());
  ConversionSpec spec;
  spec.ctk = spec.ctv = "q8_0";
  spec.flash_attn = "on";
  spec.head_dim_k = spec.head_dim_v = 128;
  spec.threads = 2;
  std::vector<std::byte> first;
  for (const uint64_t read_cells : {uint64_t(0), uint64_t(2048)}) {
    LargestReadFile file(bytes);
    auto state = parse_state(file);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    auto req = make_request(spec, *state, nullptr, "long.slot");
    ASSERT_TRUE(req.ok()) << req.status().ToString();
    req->source_read_cells = read_cells;
    VectorSink out;
    ASSERT_TRUE(convert_state(*state, file, *req, out).ok());
    EXPECT_EQ(file.largest(), (read_cells ? 2048 : 512) * kRow) << "source_read_cells " << read_cells;
    if (first.empty()) {
      first = out.bytes;
    } else {
      EXPECT_TRUE(out.bytes == first) << "the bytes differ with source_read_cells " << read_cells;
    }
  }
}

// FA on <-> off moves V between rows of cells and columns (ColumnBlock, tiles of 64 bytes of a
// row, blocks placed by the workers that convert them): checked here value by value against the
// layout itself, at a row width that is no multiple of the tile (2 heads of 20: 40 values), over
// blocks of several sizes on 2 threads, for 2- and 4-byte values, with the columns made in one
// pass or in several (a small column budget: column blocks that start past 0), f16 into f32 too;
// and back to the same bytes.
TEST(ConversionBlockRows, TransposedVIsEveryValueOfEveryCell) {
  struct Case {
    int32_t from;
    const char* to;
    uint64_t budget;
  };
  for (const Case& k : {Case{1, "f16", 32u << 20}, Case{0, "f32", 32u << 20}, Case{1, "f16", 1500 * 2 * 7},
                        Case{1, "f32", 1500 * 4 * 3}}) {
    SCOPED_TRACE(std::string(k.from == 1 ? "f16" : "f32") + " -> " + k.to + ", column budget " +
                 std::to_string(k.budget));
    test::Spec sp;
    sp.k_type = sp.v_type = k.from;
    sp.head_dim = 20;
    sp.n_head_kv = 2;
    sp.n_layer = 2;
    sp.cells = 1500;
    sp.data = test::Data::kIid;
    const std::vector<std::byte> bytes = test::build(sp);
    const MemoryFile file("rows.slot", bytes);
    auto state = parse_state(file);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    ConversionSpec spec;
    spec.ctk = spec.ctv = k.to;
    spec.flash_attn = "off";
    spec.head_dim_k = spec.head_dim_v = 20;
    spec.threads = 2;
    auto req = make_request(spec, *state, nullptr, "rows.slot");
    ASSERT_TRUE(req.ok()) << req.status().ToString();
    req->column_budget_bytes = k.budget;
    VectorSink out;
    ASSERT_TRUE(convert_state(*state, file, *req, out).ok());
    const std::vector<std::byte>& cols = out.bytes;
    const MemoryFile cols_file("cols.slot", cols);
    auto t = parse_state(cols_file);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const TypeTraits& src = *find_traits(k.from);
    const uint64_t e = k.from == 1 ? 2 : 4, to_e = std::string(k.to) == "f16" ? 2 : 4, n_embd = 40,
                   n_cells = sp.cells;
    ASSERT_EQ(t->memory.kv[0].streams[0].v_trans, 1u);
    for (size_t l = 0; l < sp.n_layer; ++l) {
      const KvLayer& a = state->memory.kv[0].streams[0].layers[l];
      const KvLayer& b = t->memory.kv[0].streams[0].layers[l];
      ASSERT_EQ(b.v.size, n_embd * n_cells * to_e);
      uint64_t wrong = 0;
      for (uint64_t c = 0; c < n_cells; ++c) {
        for (uint64_t j = 0; j < n_embd; ++j) {
          float want = 0;
          src.to_f32(bytes.data() + a.v.offset + (c * n_embd + j) * e, &want, 1);
          const std::byte* got = cols.data() + b.v.offset + (j * n_cells + c) * to_e;
          if (to_e == 4) {
            float g = 0;
            std::memcpy(&g, got, 4);
            wrong += std::memcmp(&g, &want, 4) != 0;
          } else {
            wrong += std::memcmp(got, bytes.data() + a.v.offset + (c * n_embd + j) * e, 2) != 0;
          }
        }
      }
      EXPECT_EQ(wrong, 0u) << "layer " << l;
    }
    if (std::string(k.to) != (k.from == 1 ? "f16" : "f32")) continue;  // f16 -> f32 does not come back
    spec.flash_attn = "on";
    auto back = test::converted(*t, cols_file, spec);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == bytes) << "rows -> columns -> rows";
  }
}

}  // namespace
}  // namespace kvsnap
