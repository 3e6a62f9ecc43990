// migrate/convert_state.h conversion_block_rows: how many rows of a tensor one worker converts at
// a time. Powers of two (so blocks start where a snapshot's 256-cell chunks do), at most 1 MiB of
// rows and a worker's share, and larger, up to what the source reads best at once, only where no
// worker gets more rows than before.
#include "migrate/convert_state.h"

#include <gtest/gtest.h>

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
  // 6,000 cells: 512 -> 3,072 rows for the busier worker, 1,024 -> 3,072, 2,048 -> 4,048.
  EXPECT_EQ(conversion_block_rows(6000, 2, kRow, 2048), 1024u);
}

}  // namespace
}  // namespace kvsnap
