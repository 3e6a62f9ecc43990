// SmallVector<T, N>: a vector of trivially copyable values that keeps up to N of them inside
// itself and moves to the heap only beyond that. A KV cell's sequence ids are nearly always one
// id; as a std::vector each parsed cell cost a 4-byte heap allocation (a million for a 1M-cell
// cache, and most of a truncation sweep's time under the sanitizers).
//
// Only what its users need: size, element access, iteration, resize (new elements are zero),
// clear, assignment from a brace list, equality. The elements are contiguous either way.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvsnap {

template <typename T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVector copies its elements as bytes");
  static_assert(N > 0);

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVector() = default;
  SmallVector(std::initializer_list<T> values) { *this = values; }
  SmallVector(const SmallVector&) = default;
  SmallVector& operator=(const SmallVector&) = default;
  // A moved-from SmallVector is empty (the defaults would leave its size with no heap behind it).
  SmallVector(SmallVector&& o) noexcept : local_(o.local_), size_(o.size_), heap_(std::move(o.heap_)) { o.forget(); }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      local_ = o.local_;
      size_ = o.size_;
      heap_ = std::move(o.heap_);
      o.forget();
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> values) {
    resize(values.size());
    std::copy(values.begin(), values.end(), data());
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return size_ <= N ? local_.data() : heap_.data(); }
  const T* data() const { return size_ <= N ? local_.data() : heap_.data(); }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

  void clear() { resize(0); }

  // Keeps the first min(size(), n) elements; the rest are T{}.
  void resize(size_t n) {
    if (n <= N) {
      if (size_ > N) std::copy_n(heap_.data(), n, local_.data());
      std::fill(local_.begin() + std::min(size_, n), local_.begin() + n, T{});
      heap_.clear();
    } else {
      if (size_ <= N) heap_.assign(local_.begin(), local_.begin() + size_);
      heap_.resize(n);  // value-initialized: zero
    }
    size_ = n;
  }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void forget() {
    size_ = 0;
    heap_.clear();
  }

  std::array<T, N> local_{};
  size_t size_ = 0;
  std::vector<T> heap_;  // all the elements when there are more than N, else empty
};

}  // namespace kvsnap
