// libcurl's functions as stubs over a LazyLibrary (store/lazy_libs.h, store/lazy_stubs.h), and
// curl_global_init() once per process, for the S3 client.
#include "store/lazy_libs.h"

#define CURL_DISABLE_TYPECHECK  // the stubs below define curl_easy_setopt and curl_easy_getinfo
#include <curl/curl.h>

#include <mutex>
#include <string>

#ifdef KVSNAP_LIBCURL_SONAME

#include <cstdarg>

#include "store/lazy_stubs.h"

// Every libcurl function kvsnap calls (src/store/s3_client.cc), the two variadic ones aside.
#define KVSNAP_LIBCURL_FUNCTIONS(X)                                                            \
  X(void, curl_easy_cleanup, (CURL * h), (h))                                                   \
  X(CURL*, curl_easy_init, (void), ())                                                          \
  X(CURLcode, curl_easy_perform, (CURL * h), (h))                                               \
  X(void, curl_easy_reset, (CURL * h), (h))                                                     \
  X(const char*, curl_easy_strerror, (CURLcode c), (c))                                         \
  X(CURLcode, curl_global_init, (long flags), (flags))                                          \
  X(curl_slist*, curl_slist_append, (curl_slist * list, const char* text), (list, text))        \
  X(void, curl_slist_free_all, (curl_slist * list), (list))

namespace {
enum : size_t { KVSNAP_LIBCURL_FUNCTIONS(KVSNAP_LAZY_INDEX) k_curl_easy_setopt, k_curl_easy_getinfo };
constexpr const char* kNames[] = {KVSNAP_LIBCURL_FUNCTIONS(KVSNAP_LAZY_NAME) "curl_easy_setopt",
                                  "curl_easy_getinfo"};
}  // namespace

#ifndef KVSNAP_LIBCURL_PATH
#define KVSNAP_LIBCURL_PATH nullptr
#endif
#define KVSNAP_LIBCURL_FOR "the S3 blob store"
#ifndef KVSNAP_LIBCURL_PACKAGE
#define KVSNAP_LIBCURL_PACKAGE "install the package that provides " KVSNAP_LIBCURL_SONAME
#endif
KVSNAP_LAZY_LIBRARY(libcurl, KVSNAP_LIBCURL)

KVSNAP_LIBCURL_FUNCTIONS(KVSNAP_LAZY_STUB)

// va_start after an enum parameter: clang warns that an enum may promote; CURLoption and CURLINFO
// are int-sized (their values fit an int, as libcurl's own definitions of these two assume).
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wvarargs"
#endif

// The option's number says its argument's type (curl.h's CURLOPTTYPE_* ranges, as libcurl's own
// setopt reads it), so the one argument is taken as that type and passed on.
extern "C" CURLcode curl_easy_setopt(CURL* h, CURLoption option, ...) {
  using Fn = CURLcode (*)(CURL*, CURLoption, ...);
  const Fn set = lazy_symbol<Fn>(k_curl_easy_setopt);
  va_list ap;
  va_start(ap, option);
  CURLcode rc;
  if (option < CURLOPTTYPE_OBJECTPOINT) {
    rc = set(h, option, va_arg(ap, long));
  } else if (option < CURLOPTTYPE_FUNCTIONPOINT) {
    rc = set(h, option, va_arg(ap, void*));
  } else if (option < CURLOPTTYPE_OFF_T) {
    rc = set(h, option, va_arg(ap, void (*)()));
  } else if (option < CURLOPTTYPE_BLOB) {
    rc = set(h, option, va_arg(ap, curl_off_t));
  } else {
    rc = set(h, option, va_arg(ap, void*));
  }
  va_end(ap);
  return rc;
}

// Every CURLINFO_* takes a pointer to where the answer goes.
extern "C" CURLcode curl_easy_getinfo(CURL* h, CURLINFO info, ...) {
  using Fn = CURLcode (*)(CURL*, CURLINFO, ...);
  va_list ap;
  va_start(ap, info);
  void* out = va_arg(ap, void*);
  va_end(ap);
  return lazy_symbol<Fn>(k_curl_easy_getinfo)(h, info, out);
}

#if defined(__clang__)
#pragma clang diagnostic pop
#endif

namespace {
kvsnap::Status open_libcurl() { return libcurl().load(); }
}  // namespace

#else  // linked at build time

namespace {
kvsnap::Status open_libcurl() { return kvsnap::Status::OK(); }
}  // namespace

#endif

namespace kvsnap {

Status load_libcurl() {
  Status opened = open_libcurl();
  if (!opened.ok()) return opened;
  static std::once_flag once;
  static CURLcode init = CURLE_OK;
  std::call_once(once, [] { init = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init != CURLE_OK) return Status::IOError(std::string("cannot initialize libcurl: ") + curl_easy_strerror(init));
  return Status::OK();
}

}  // namespace kvsnap
