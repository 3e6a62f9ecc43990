// The pattern src/store/lazy_lib*.cc define their stubs with (base/lazy_library.h says why).
//
// A library's functions are one X-macro list of X(return type, name, (parameters), (arguments)).
// The compiler checks each stub against the library's own header: a signature that differs from
// the declaration is a "conflicting declaration" error, not a silent mismatch. A file
// expands, outside any namespace:
//   enum : size_t { LIST(KVSNAP_LAZY_INDEX) };              k_<name>, in list order
//   constexpr const char* kNames[] = { LIST(KVSNAP_LAZY_NAME) };
//   KVSNAP_LAZY_LIBRARY(libfoo, KVSNAP_LIBFOO)            KVSNAP_LIBFOO_SONAME, _PATH, _FOR, _PACKAGE
//                                                           libfoo() and lazy_symbol<F>(k_<name>)
//   LIST(KVSNAP_LAZY_STUB)                                  the extern "C" definitions
// Variadic functions (curl_easy_setopt, archive_set_error) are written by hand: their arguments
// cannot be forwarded by a macro.
#pragma once

#include <cstddef>
#include <iterator>

#include "base/lazy_library.h"

#define KVSNAP_LAZY_INDEX(ret, name, params, args) k_##name,
#define KVSNAP_LAZY_NAME(ret, name, params, args) #name,
#define KVSNAP_LAZY_STUB(ret, name, params, args) \
  extern "C" ret name params { return lazy_symbol<decltype(&::name)>(k_##name) args; }

// The library (a function-local static over kNames) and lazy_symbol<F>(index): the library loaded,
// or the process aborted with its message (LazyLibrary::load_or_die), then symbol `index` as F.
// PREFIX_SONAME and PREFIX_PATH come from CMake (kvsnap_store_uses; PATH may be nullptr),
// PREFIX_FOR and PREFIX_PACKAGE from CMake or the file.
#define KVSNAP_LAZY_LIBRARY(accessor, PREFIX)                                                          \
  static_assert(std::size(kNames) <= kvsnap::LazyLibrary::kMaxSymbols, "raise LazyLibrary::kMaxSymbols"); \
  namespace {                                                                                          \
  kvsnap::LazyLibrary& accessor() {                                                                    \
    static kvsnap::LazyLibrary library(PREFIX##_SONAME, PREFIX##_PATH, PREFIX##_FOR, PREFIX##_PACKAGE, kNames); \
    return library;                                                                                    \
  }                                                                                                    \
  template <typename F>                                                             \
  F lazy_symbol(size_t i) {                                                         \
    accessor().load_or_die();                                                       \
    return reinterpret_cast<F>(accessor().symbol(i));                               \
  }                                                                                 \
  }
