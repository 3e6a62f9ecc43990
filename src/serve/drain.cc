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
  taken_.assign(size_t(capacity_), 0);
  given_back_at_.assign(size_t(capacity_), 0);
  cv_.notify_all();
}

int SlotGate::slot_for(SlotWant::Kind kind, const SlotWant& want, int asked) {
  if (alone_out_) return -2;
  switch (kind) {
    case SlotWant::Kind::kAlone: return out_ == 0 ? -1 : -2;
    case SlotWant::Kind::kSlot: return taken_[size_t(asked)] ? -2 : asked;
    case SlotWant::Kind::kAny: break;
  }
  // llama-server's similarity: lcp / prompt > 0.1, the largest; the first of equals
  int best = -2;
  size_t best_holds = 0;
  for (int s = 0; s < capacity_; ++s) {
    auto it = want.holds.find(s);
    const size_t holds = it == want.holds.end() ? 0 : it->second;
    if (taken_[size_t(s)] || holds * 10 <= want.prompt_tokens || holds <= best_holds) continue;
    best = s;
    best_holds = holds;
  }
  if (best >= 0) return best;
  // its least recently used: the last of equals
  for (int s = 0; s < capacity_; ++s) {
    if (!taken_[size_t(s)] && (best < 0 || given_back_at_[size_t(s)] <= given_back_at_[size_t(best)])) best = s;
  }
  return best;
}

SlotGate::Permit SlotGate::enter(double max_wait_s, const SlotWant& want, bool* waited_out, int* slot) {
  if (waited_out) *waited_out = false;
  if (slot) *slot = -1;
  std::unique_lock<std::mutex> l(mu_);
  if (capacity_ == 0 || shut_) return nullptr;
  // llama-server's own reading of id_slot (server-context.cpp get_slot_by_id: any value but -1, as
  // a size_t, modulo the slot count); -1 pins nothing
  const int asked = want.kind == SlotWant::Kind::kSlot ? pinned_slot_of(want.id_slot, size_t(capacity_)) : -1;
  SlotWant::Kind kind = want.kind == SlotWant::Kind::kSlot && asked < 0 ? SlotWant::Kind::kAny : want.kind;
  const uint64_t me = arrivals_++;
  waiting_.push_back(me);
  int given = -2;
  const bool admitted = cv_.wait_for(l, std::chrono::duration<double>(max_wait_s), [&] {
    if (capacity_ == 0 || shut_) return true;
    if (waiting_.front() != me) return false;
    given = slot_for(kind, want, asked);
    return given != -2;
  });
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), me));
  cv_.notify_all();  // the next waiter may be at the front now
  if (!admitted) {
    if (waited_out) *waited_out = true;
    return nullptr;
  }
  if (capacity_ == 0 || shut_) return nullptr;
  ++out_;
  if (given < 0) alone_out_ = true;
  else taken_[size_t(given)] = 1;
  if (slot) *slot = given;
  return Permit(static_cast<void*>(this), [given](void* self) { static_cast<SlotGate*>(self)->leave(given); });
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
  if (slot < 0) alone_out_ = false;
  else if (size_t(slot) < taken_.size()) {  // a set_capacity since may have shrunk the slots
    taken_[size_t(slot)] = 0;
    given_back_at_[size_t(slot)] = ++give_backs_;
  }
  cv_.notify_all();
}

}  // namespace kvsnap
