// libpq's functions as stubs over a LazyLibrary (store/lazy_libs.h, store/lazy_stubs.h).
#include "store/lazy_libs.h"

#ifdef KVSNAP_LIBPQ_SONAME

#include <libpq-fe.h>

#include "store/lazy_stubs.h"

// Every libpq function kvsnap calls (src/store/pg_conn.cc).
#define KVSNAP_LIBPQ_FUNCTIONS(X)                                                                         \
  X(int, PQbackendPID, (const PGconn* c), (c))                                                             \
  X(void, PQclear, (PGresult* r), (r))                                                                     \
  X(char*, PQcmdTuples, (PGresult* r), (r))                                                                \
  X(PGconn*, PQconnectdbParams, (const char* const* keys, const char* const* values, int expand),          \
    (keys, values, expand))                                                                                \
  X(int, PQenterPipelineMode, (PGconn* c), (c))                                                            \
  X(char*, PQerrorMessage, (const PGconn* c), (c))                                                         \
  X(PGresult*, PQexec, (PGconn* c, const char* query), (c, query))                                         \
  X(PGresult*, PQexecParams,                                                                               \
    (PGconn* c, const char* command, int n, const Oid* types, const char* const* values, const int* lengths, \
     const int* formats, int result_format),                                                               \
    (c, command, n, types, values, lengths, formats, result_format))                                       \
  X(PGresult*, PQexecPrepared,                                                                             \
    (PGconn* c, const char* name, int n, const char* const* values, const int* lengths, const int* formats, \
     int result_format),                                                                                   \
    (c, name, n, values, lengths, formats, result_format))                                                 \
  X(int, PQexitPipelineMode, (PGconn* c), (c))                                                             \
  X(void, PQfinish, (PGconn* c), (c))                                                                      \
  X(PGresult*, PQgetResult, (PGconn* c), (c))                                                              \
  X(int, PQgetisnull, (const PGresult* r, int row, int field), (r, row, field))                            \
  X(int, PQgetlength, (const PGresult* r, int row, int field), (r, row, field))                            \
  X(char*, PQgetvalue, (const PGresult* r, int row, int field), (r, row, field))                           \
  X(int, PQnfields, (const PGresult* r), (r))                                                              \
  X(int, PQntuples, (const PGresult* r), (r))                                                              \
  X(int, PQpipelineSync, (PGconn* c), (c))                                                                 \
  X(PGresult*, PQprepare, (PGconn* c, const char* name, const char* query, int n, const Oid* types),       \
    (c, name, query, n, types))                                                                            \
  X(void, PQreset, (PGconn* c), (c))                                                                       \
  X(char*, PQresultErrorField, (const PGresult* r, int field), (r, field))                                 \
  X(ExecStatusType, PQresultStatus, (const PGresult* r), (r))                                              \
  X(int, PQsendPrepare, (PGconn* c, const char* name, const char* query, int n, const Oid* types),         \
    (c, name, query, n, types))                                                                            \
  X(int, PQsendQueryParams,                                                                                \
    (PGconn* c, const char* command, int n, const Oid* types, const char* const* values, const int* lengths, \
     const int* formats, int result_format),                                                               \
    (c, command, n, types, values, lengths, formats, result_format))                                       \
  X(int, PQsendQueryPrepared,                                                                              \
    (PGconn* c, const char* name, int n, const char* const* values, const int* lengths, const int* formats, \
     int result_format),                                                                                   \
    (c, name, n, values, lengths, formats, result_format))                                                 \
  X(ConnStatusType, PQstatus, (const PGconn* c), (c))

namespace {
enum : size_t { KVSNAP_LIBPQ_FUNCTIONS(KVSNAP_LAZY_INDEX) };
constexpr const char* kNames[] = {KVSNAP_LIBPQ_FUNCTIONS(KVSNAP_LAZY_NAME)};
}  // namespace

#ifndef KVSNAP_LIBPQ_PATH
#define KVSNAP_LIBPQ_PATH nullptr
#endif
#define KVSNAP_LIBPQ_FOR "the PostgreSQL catalog"
#ifndef KVSNAP_LIBPQ_PACKAGE
#define KVSNAP_LIBPQ_PACKAGE "install the package that provides " KVSNAP_LIBPQ_SONAME
#endif
KVSNAP_LAZY_LIBRARY(libpq, KVSNAP_LIBPQ)

KVSNAP_LIBPQ_FUNCTIONS(KVSNAP_LAZY_STUB)

namespace kvsnap {
Status load_libpq() { return libpq().load(); }
}  // namespace kvsnap

#else  // linked at build time

namespace kvsnap {
Status load_libpq() { return Status::OK(); }
}  // namespace kvsnap

#endif
