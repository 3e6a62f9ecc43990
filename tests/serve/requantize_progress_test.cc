// POST /kvsnap/requantize's progress as GET /kvsnap/usage and the log show it (serve/requantize_progress.h).
#include "serve/requantize_progress.h"

#include <gtest/gtest.h>

namespace kvsnap {
namespace {

using std::chrono::milliseconds;

TEST(RequantizeProgress, NullWhenNoneRunsThenEachPhaseThenRateAndEta) {
  RequantizeProgress p;
  const auto t0 = RequantizeProgress::Clock::now();
  EXPECT_TRUE(p.json(t0).is_null());
  p.start("q4_0/q4_0 fa on", t0);
  auto j = p.json(t0 + milliseconds(100));
  EXPECT_EQ(j["phase"], "draining");
  EXPECT_EQ(j["to"], "q4_0/q4_0 fa on");
  EXPECT_TRUE(j["eta_s"].is_null());
  p.phase("saving", t0 + milliseconds(200));
  p.phase("restarting", t0 + milliseconds(300));
  EXPECT_EQ(p.json(t0 + milliseconds(400))["phase"], "restarting");
  EXPECT_DOUBLE_EQ(p.json(t0 + milliseconds(400))["phase_elapsed_s"].get<double>(), 0.1);
  const uint64_t MiB = 1 << 20;
  p.restoring(3, 40 * MiB, t0 + milliseconds(1000));
  p.slot_done(10 * MiB, t0 + milliseconds(2000));
  j = p.json(t0 + milliseconds(2000));
  EXPECT_EQ(j["phase"], "restoring");
  EXPECT_EQ(j["slots_done"], 1);
  EXPECT_EQ(j["slots_total"], 3);
  EXPECT_EQ(j["bytes_done"], 10 * MiB);
  EXPECT_EQ(j["bytes_total"], 40 * MiB);
  EXPECT_DOUBLE_EQ(j["elapsed_s"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["bytes_per_s"].get<double>(), 10.0 * MiB);  // 10 MiB in the restore phase's first second
  EXPECT_DOUBLE_EQ(j["eta_s"].get<double>(), 3.0);
  EXPECT_EQ(p.restore_line(t0 + milliseconds(2000)), "1 of 3 slots, 10.0 of 40.0 MiB (25%), 10.0 MiB/s, ETA 3 s");
  p.slot_done(30 * MiB, t0 + milliseconds(3000));
  EXPECT_EQ(p.restore_line(t0 + milliseconds(3000)), "2 of 3 slots, 40.0 of 40.0 MiB (100%), 20.0 MiB/s");
  p.finish();
  EXPECT_TRUE(p.json(t0 + milliseconds(3000)).is_null());
  // a new requantize starts from nothing
  p.start("f16/f16 fa on", t0 + milliseconds(4000));
  j = p.json(t0 + milliseconds(4000));
  EXPECT_EQ(j["slots_done"], 0);
  EXPECT_EQ(j["bytes_total"], 0);
  EXPECT_EQ(j["phase"], "draining");
}

}  // namespace
}  // namespace kvsnap
