#include "serve/drain.h"

#include <chrono>

namespace kvsnap {

Drain::Ticket Drain::enter(double max_wait_s) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, std::chrono::duration<double>(max_wait_s), [this] { return !closed_ || shut_; }) || shut_)
    return nullptr;
  ++out_;
  return Ticket(static_cast<void*>(this), [](void* self) { static_cast<Drain*>(self)->leave(); });
}

void Drain::leave() {
  std::lock_guard<std::mutex> l(mu_);
  --out_;
  cv_.notify_all();
}

uint64_t Drain::close() {
  std::unique_lock<std::mutex> l(mu_);
  closed_ = true;
  const uint64_t n = out_;
  cv_.wait(l, [this] { return out_ == 0; });
  return n;
}

void Drain::open() {
  std::lock_guard<std::mutex> l(mu_);
  closed_ = false;
  cv_.notify_all();
}

uint64_t Drain::shut() {
  std::lock_guard<std::mutex> l(mu_);
  shut_ = true;
  cv_.notify_all();
  return out_;
}

bool Drain::shut_down() {
  std::lock_guard<std::mutex> l(mu_);
  return shut_;
}

bool Drain::wait_idle(double max_wait_s) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, std::chrono::duration<double>(max_wait_s), [this] { return out_ == 0; });
}

void SlotGate::set_capacity(int slots) {
  std::lock_guard<std::mutex> l(mu_);
  capacity_ = slots > 0 ? slots : 0;
  cv_.notify_all();
}

SlotGate::Permit SlotGate::enter(double max_wait_s, bool* waited_out) {
  if (waited_out) *waited_out = false;
  std::unique_lock<std::mutex> l(mu_);
  if (capacity_ == 0) return nullptr;
  if (!cv_.wait_for(l, std::chrono::duration<double>(max_wait_s), [this] { return capacity_ == 0 || out_ < capacity_; })) {
    if (waited_out) *waited_out = true;
    return nullptr;
  }
  if (capacity_ == 0) return nullptr;
  ++out_;
  return Permit(static_cast<void*>(this), [](void* self) { static_cast<SlotGate*>(self)->leave(); });
}

int SlotGate::out() {
  std::lock_guard<std::mutex> l(mu_);
  return out_;
}

void SlotGate::leave() {
  std::lock_guard<std::mutex> l(mu_);
  --out_;
  cv_.notify_all();
}

}  // namespace kvsnap
