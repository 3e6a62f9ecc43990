// Where a running POST /kvsnap/requantize stands. kvsnap serve has no terminal of its own: its
// progress is what GET /kvsnap/usage answers under "requantize" while one runs (null otherwise)
// and the log's restore lines ("2 of 3 slots, 1.2 of 3.4 MiB (35%), 12.0 MiB/s, ETA 1 s").
// The phases are those of serve/control.h: draining, saving, restarting, restoring; bytes count in
// the restore phase (each slot's state as stored, the work a restore converts). Thread-safe: the
// requantize writes, usage reads. The clock is passed in, so tests need no sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "base/json.h"

namespace kvsnap {

class RequantizeProgress {
 public:
  using Clock = std::chrono::steady_clock;
  void start(const std::string& to, Clock::time_point now);  // phase "draining"
  void phase(const std::string& name, Clock::time_point now);
  void restoring(size_t slots, uint64_t bytes, Clock::time_point now);  // phase "restoring"
  void slot_done(uint64_t bytes, Clock::time_point now);
  void finish();  // no requantize runs any more
  // {to, phase, elapsed_s, phase_elapsed_s, slots_done, slots_total, bytes_done, bytes_total,
  //  bytes_per_s, eta_s (null until a restore rate is known)}, or null when none runs.
  nlohmann::ordered_json json(Clock::time_point now) const;
  std::string restore_line(Clock::time_point now) const;

 private:
  double rate(Clock::time_point now) const;  // restored bytes per second (mu_ held)

  mutable std::mutex mu_;
  bool running_ = false;
  std::string to_, phase_;
  Clock::time_point t0_, phase_t0_;
  size_t slots_done_ = 0, slots_total_ = 0;
  uint64_t bytes_done_ = 0, bytes_total_ = 0;
};

}  // namespace kvsnap
