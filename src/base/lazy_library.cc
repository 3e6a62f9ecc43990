#include "base/lazy_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace kvsnap {

LazyLibrary::LazyLibrary(const char* soname, const char* fallback, const char* needed_for, const char* package,
                         std::span<const char* const> symbols)
    : soname_(soname), fallback_(fallback), needed_for_(needed_for), package_(package), names_(symbols) {
  if (names_.size() > kMaxSymbols) {
    std::fprintf(stderr, "kvsnap: internal error: %zu symbols for %s (at most %zu)\n", names_.size(), soname_,
                 kMaxSymbols);
    std::abort();
  }
}

Status LazyLibrary::open_once() {
  const std::string what =
      std::string("cannot load ") + soname_ + " (for " + needed_for_ + "; " + package_ + "): ";
  dlerror();  // clear a stale message
  void* handle = dlopen(soname_, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    const std::string reason = why ? why : "dlopen failed";
    if (fallback_ && *fallback_) handle = dlopen(fallback_, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return Status::IOError(what + reason);
  }
  void* found[kMaxSymbols] = {};
  for (size_t i = 0; i < names_.size(); ++i) {
    dlerror();
    found[i] = dlsym(handle, names_[i]);
    if (!found[i]) {
      const char* why = dlerror();
      // The handle stays open: closing a library that may have run constructors buys nothing.
      return Status::IOError(what + "it has no " + names_[i] + (why ? std::string(" (") + why + ")" : "") +
                             ": an older or different build than the one kvsnap was compiled against");
    }
  }
  for (size_t i = 0; i < names_.size(); ++i) addresses_[i] = found[i];
  return Status::OK();
}

Status LazyLibrary::load() {
  if (loaded_.load(std::memory_order_acquire)) return Status::OK();
  std::call_once(once_, [this] {
    outcome_ = open_once();
    if (outcome_.ok()) loaded_.store(true, std::memory_order_release);
  });
  return outcome_;
}

void LazyLibrary::load_or_die() {
  if (loaded_.load(std::memory_order_acquire)) return;
  Status s = load();
  if (s.ok()) return;
  std::fprintf(stderr, "kvsnap: %s\n", s.message().c_str());
  std::abort();
}

}  // namespace kvsnap
