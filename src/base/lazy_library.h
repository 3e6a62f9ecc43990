// A shared library opened on its first use instead of at process start.
//
// Why: libpq, libcurl and libarchive bring 33 of the 49 shared objects the dynamic loader maps and
// relocates before main() (about half of a `kvsnap --version`'s 16 ms on the developers' VM), yet
// only the PostgreSQL catalog, the S3 client and export/import call them.
// src/store/lazy_lib*.cc define those libraries' functions as stubs that call through the
// pointers a LazyLibrary fills; the program does not link the libraries themselves.
//
// Promises:
// - load() opens the library (by SONAME, else by the build's path; RTLD_NOW | RTLD_LOCAL) and
//   resolves every symbol it was given in that library (dlsym on its handle: never the
//   program's own stubs), once per process, thread-safe; later calls return the first outcome.
// - A failure names the library, what needs it, the package that has it, and dlerror()'s reason;
//   no symbol pointer is set then.
// - symbol(i) is only valid after a successful load().
//
// Failure policy: Status for a missing library or symbol; std::bad_alloc only from its strings.
#pragma once

#include <atomic>
#include <mutex>
#include <span>
#include <string>

#include "base/status.h"

namespace kvsnap {

class LazyLibrary {
 public:
  // `soname`: what dlopen() opens ("libpq.so.5"); `fallback`: a path tried when that fails, or
  // nullptr (the build's copy in a directory the loader does not search, which a linked program
  // found through its RPATH); `needed_for`: "the PostgreSQL catalog"; `package`: how a user gets
  // it ("install package libpq5"); `symbols`: the names it must resolve. An error reads
  // "cannot load SONAME (for NEEDED_FOR; PACKAGE): dlerror's reason for SONAME".
  // The strings and the span must outlive the object (static tables).
  LazyLibrary(const char* soname, const char* fallback, const char* needed_for, const char* package,
              std::span<const char* const> symbols);
  LazyLibrary(const LazyLibrary&) = delete;
  LazyLibrary& operator=(const LazyLibrary&) = delete;

  Status load();
  // For a stub reached before its module called load(): loads, or prints the error to stderr and
  // aborts (a module edge calls load() first and returns its Status, so this is a bug).
  void load_or_die();

  // The address of symbols[i] after a successful load().
  void* symbol(size_t i) const { return addresses_[i]; }

  static constexpr size_t kMaxSymbols = 64;

 private:
  Status open_once();

  const char* soname_;
  const char* fallback_;
  const char* needed_for_;
  const char* package_;
  std::span<const char* const> names_;
  void* addresses_[kMaxSymbols] = {};
  std::once_flag once_;
  std::atomic<bool> loaded_{false};
  Status outcome_;
};

}  // namespace kvsnap
