// libarchive's functions as stubs over a LazyLibrary (store/lazy_libs.h, store/lazy_stubs.h).
#include "store/lazy_libs.h"

#ifdef KVSNAP_LIBARCHIVE_SONAME

#include <archive.h>
#include <archive_entry.h>

#include <cstdarg>
#include <string>

#include "base/printf_text.h"
#include "store/lazy_stubs.h"

// Every libarchive function kvsnap calls (src/store/archive.cc), archive_set_error aside (variadic).
#define KVSNAP_LIBARCHIVE_FUNCTIONS(X)                                                                   \
  X(void, archive_entry_copy_pathname, (archive_entry * e, const char* p), (e, p))                        \
  X(mode_t, archive_entry_filetype, (archive_entry * e), (e))                                             \
  X(void, archive_entry_free, (archive_entry * e), (e))                                                   \
  X(const char*, archive_entry_hardlink, (archive_entry * e), (e))                                        \
  X(archive_entry*, archive_entry_new, (void), ())                                                        \
  X(const char*, archive_entry_pathname, (archive_entry * e), (e))                                        \
  X(const char*, archive_entry_pathname_utf8, (archive_entry * e), (e))                                   \
  X(void, archive_entry_set_filetype, (archive_entry * e, unsigned int t), (e, t))                        \
  X(void, archive_entry_set_gid, (archive_entry * e, la_int64_t v), (e, v))                               \
  X(void, archive_entry_set_mtime, (archive_entry * e, time_t s, long ns), (e, s, ns))                    \
  X(void, archive_entry_set_perm, (archive_entry * e, mode_t m), (e, m))                                  \
  X(void, archive_entry_set_size, (archive_entry * e, la_int64_t v), (e, v))                              \
  X(void, archive_entry_set_uid, (archive_entry * e, la_int64_t v), (e, v))                               \
  X(la_int64_t, archive_entry_size, (archive_entry * e), (e))                                             \
  X(int, archive_entry_size_is_set, (archive_entry * e), (e))                                             \
  X(int, archive_entry_sparse_count, (archive_entry * e), (e))                                            \
  X(const char*, archive_entry_symlink, (archive_entry * e), (e))                                         \
  X(const char*, archive_error_string, (archive * a), (a))                                                \
  X(la_int64_t, archive_filter_bytes, (archive * a, int i), (a, i))                                       \
  X(int, archive_filter_count, (archive * a), (a))                                                        \
  X(const char*, archive_filter_name, (archive * a, int i), (a, i))                                       \
  X(la_ssize_t, archive_read_data, (archive * a, void* buf, size_t n), (a, buf, n))                       \
  X(int, archive_read_free, (archive * a), (a))                                                           \
  X(archive*, archive_read_new, (void), ())                                                               \
  X(int, archive_read_next_header, (archive * a, archive_entry * *e), (a, e))                             \
  X(int, archive_read_open,                                                                               \
    (archive * a, void* data, archive_open_callback* open, archive_read_callback* read,                   \
     archive_close_callback* close),                                                                      \
    (a, data, open, read, close))                                                                         \
  X(int, archive_read_support_filter_gzip, (archive * a), (a))                                            \
  X(int, archive_read_support_filter_xz, (archive * a), (a))                                              \
  X(int, archive_read_support_filter_zstd, (archive * a), (a))                                            \
  X(int, archive_read_support_format_tar, (archive * a), (a))                                             \
  X(int, archive_write_add_filter_zstd, (archive * a), (a))                                               \
  X(int, archive_write_close, (archive * a), (a))                                                         \
  X(la_ssize_t, archive_write_data, (archive * a, const void* buf, size_t n), (a, buf, n))                \
  X(int, archive_write_fail, (archive * a), (a))                                                          \
  X(int, archive_write_finish_entry, (archive * a), (a))                                                  \
  X(int, archive_write_free, (archive * a), (a))                                                          \
  X(int, archive_write_header, (archive * a, archive_entry * e), (a, e))                                  \
  X(archive*, archive_write_new, (void), ())                                                              \
  X(int, archive_write_open,                                                                              \
    (archive * a, void* data, archive_open_callback* open, archive_write_callback* write,                 \
     archive_close_callback* close),                                                                      \
    (a, data, open, write, close))                                                                        \
  X(int, archive_write_set_bytes_in_last_block, (archive * a, int n), (a, n))                             \
  X(int, archive_write_set_filter_option, (archive * a, const char* m, const char* o, const char* v),     \
    (a, m, o, v))                                                                                         \
  X(int, archive_write_set_format_pax_restricted, (archive * a), (a))

namespace {
enum : size_t { KVSNAP_LIBARCHIVE_FUNCTIONS(KVSNAP_LAZY_INDEX) k_archive_set_error };
constexpr const char* kNames[] = {KVSNAP_LIBARCHIVE_FUNCTIONS(KVSNAP_LAZY_NAME) "archive_set_error"};
}  // namespace

#ifndef KVSNAP_LIBARCHIVE_PATH
#define KVSNAP_LIBARCHIVE_PATH nullptr
#endif
#define KVSNAP_LIBARCHIVE_FOR "kvsnap export and import"
#ifndef KVSNAP_LIBARCHIVE_PACKAGE
#define KVSNAP_LIBARCHIVE_PACKAGE "install the package that provides " KVSNAP_LIBARCHIVE_SONAME
#endif
KVSNAP_LAZY_LIBRARY(libarchive, KVSNAP_LIBARCHIVE)

KVSNAP_LIBARCHIVE_FUNCTIONS(KVSNAP_LAZY_STUB)

// Formats here and hands libarchive the finished text, which it copies; a null format clears
// the message (libarchive's own use), so it is passed on as null.
extern "C" void archive_set_error(archive* a, int err, const char* fmt, ...) {
  using Fn = void (*)(archive*, int, const char*, ...);
  if (fmt == nullptr) return lazy_symbol<Fn>(k_archive_set_error)(a, err, nullptr);
  va_list args;
  va_start(args, fmt);
  const std::string text = kvsnap::vprintf_text(fmt, args);
  va_end(args);
  lazy_symbol<Fn>(k_archive_set_error)(a, err, "%s", text.c_str());
}

namespace kvsnap {
Status load_libarchive() { return libarchive().load(); }
}  // namespace kvsnap

#else  // linked at build time

namespace kvsnap {
Status load_libarchive() { return Status::OK(); }
}  // namespace kvsnap

#endif
