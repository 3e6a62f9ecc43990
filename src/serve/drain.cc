#include "serve/drain.h"

#include <algorithm>
#include <chrono>

#include "serve/requests.h"

namespace kvsnap {

Drain::Ticket Drain::issue() {
  ++out_;
  return Ticket(static_cast<void*>(this), [](void* self) { static_cast<Drain*>(self)->leave(); });
}

Drain::Ticket Drain::enter(double max_wait_s) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, std::chrono::duration<double>(max_wait_s), [this] { return !closed_ || shut_; }) || shut_)
    return nullptr;
  return issue();
}

Drain::Ticket Drain::enter_slotless() {
  std::lock_guard<std::mutex> l(mu_);
  return issue();
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

bool SlotGate::may_enter(int slot) {
  if (out_ >= capacity_) return false;
  if (slot < 0) return out_ == unpinned_out_;  // no pinned one out
  auto it = pinned_out_.find(slot);
  return unpinned_out_ == 0 && (it == pinned_out_.end() || it->second == 0);
}

SlotGate::Permit SlotGate::enter(double max_wait_s, bool* waited_out, int slot) {
  if (waited_out) *waited_out = false;
  std::unique_lock<std::mutex> l(mu_);
  if (capacity_ == 0 || shut_) return nullptr;
  // llama-server's own reading of id_slot (server-context.cpp get_slot_by_id: any value but -1, as
  // a size_t, modulo the slot count)
  slot = pinned_slot_of(slot, capacity_);
  const uint64_t me = arrivals_++;
  waiting_.push_back(me);
  const bool admitted = cv_.wait_for(l, std::chrono::duration<double>(max_wait_s), [&] {
    return capacity_ == 0 || shut_ || (waiting_.front() == me && may_enter(slot));
  });
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), me));
  cv_.notify_all();  // the next waiter may be at the front now
  if (!admitted) {
    if (waited_out) *waited_out = true;
    return nullptr;
  }
  if (capacity_ == 0 || shut_) return nullptr;
  ++out_;
  if (slot < 0) ++unpinned_out_;
  else ++pinned_out_[slot];
  return Permit(static_cast<void*>(this), [slot](void* self) { static_cast<SlotGate*>(self)->leave(slot); });
}

int SlotGate::out() {
  std::lock_guard<std::mutex> l(mu_);
  return out_;
}

int SlotGate::waiting() {
  std::lock_guard<std::mutex> l(mu_);
  return int(waiting_.size());
}

void SlotGate::shut() {
  std::lock_guard<std::mutex> l(mu_);
  shut_ = true;
  cv_.notify_all();
}

bool SlotGate::shut_down() {
  std::lock_guard<std::mutex> l(mu_);
  return shut_;
}

void SlotGate::leave(int slot) {
  std::lock_guard<std::mutex> l(mu_);
  --out_;
  if (slot < 0) --unpinned_out_;
  else if (--pinned_out_[slot] == 0) pinned_out_.erase(slot);
  cv_.notify_all();
}

}  // namespace kvsnap
