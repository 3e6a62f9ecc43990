#include "serve/requantize_progress.h"

#include <cstdio>

namespace kvsnap {

namespace {

double secs(RequantizeProgress::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string mib(uint64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", double(b) / (1 << 20));
  return s;
}

}  // namespace

void RequantizeProgress::start(const std::string& to, Clock::time_point now) {
  std::lock_guard<std::mutex> l(mu_);
  running_ = true;
  to_ = to;
  phase_ = "draining";
  t0_ = phase_t0_ = now;
  slots_done_ = slots_total_ = 0;
  bytes_done_ = bytes_total_ = 0;
}

void RequantizeProgress::phase(const std::string& name, Clock::time_point now) {
  std::lock_guard<std::mutex> l(mu_);
  phase_ = name;
  phase_t0_ = now;
}

void RequantizeProgress::restoring(size_t slots, uint64_t bytes, Clock::time_point now) {
  std::lock_guard<std::mutex> l(mu_);
  phase_ = "restoring";
  phase_t0_ = now;
  slots_total_ = slots;
  bytes_total_ = bytes;
}

void RequantizeProgress::slot_done(uint64_t bytes, Clock::time_point) {
  std::lock_guard<std::mutex> l(mu_);
  ++slots_done_;
  bytes_done_ += bytes;
}

void RequantizeProgress::finish() {
  std::lock_guard<std::mutex> l(mu_);
  running_ = false;
}

double RequantizeProgress::rate(Clock::time_point now) const {
  const double s = secs(now - phase_t0_);
  return phase_ == "restoring" && s > 0 ? double(bytes_done_) / s : 0;
}

nlohmann::ordered_json RequantizeProgress::json(Clock::time_point now) const {
  std::lock_guard<std::mutex> l(mu_);
  if (!running_) return nullptr;
  const double r = rate(now);
  nlohmann::ordered_json eta = nullptr;
  if (r > 0) eta = double(bytes_total_ - bytes_done_) / r;
  return {{"to", to_},
          {"phase", phase_},
          {"elapsed_s", secs(now - t0_)},
          {"phase_elapsed_s", secs(now - phase_t0_)},
          {"slots_done", slots_done_},
          {"slots_total", slots_total_},
          {"bytes_done", bytes_done_},
          {"bytes_total", bytes_total_},
          {"bytes_per_s", r},
          {"eta_s", eta}};
}

std::string RequantizeProgress::restore_line(Clock::time_point now) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string s = std::to_string(slots_done_) + " of " + std::to_string(slots_total_) + " slots, " + mib(bytes_done_) +
                  " of " + mib(bytes_total_) + " MiB";
  if (bytes_total_) s += " (" + std::to_string(bytes_done_ * 100 / bytes_total_) + "%)";
  const double r = rate(now);
  char b[64];
  std::snprintf(b, sizeof b, ", %.1f MiB/s", r / (1 << 20));
  s += b;
  if (r > 0 && bytes_done_ < bytes_total_) {
    std::snprintf(b, sizeof b, ", ETA %.0f s", double(bytes_total_ - bytes_done_) / r);
    s += b;
  }
  return s;
}

}  // namespace kvsnap
