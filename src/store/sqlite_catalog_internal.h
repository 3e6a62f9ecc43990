// Internal to src/store/sqlite_catalog*.cc (SqliteCatalog): the prepared-statement
// wrapper over SQLite, the write-transaction helper and the snapshot column
// list the catalog files share (the token hashing helpers are in
// catalog_rules.h, shared with the PostgreSQL catalog). Not a public header.
#pragma once

#include <sqlite3.h>

#include <array>
#include <bit>
#include <cctype>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/sha256.h"
#include "store/catalog_rules.h"
#include "store/sqlite_catalog.h"

namespace kvsnap {

#define KV_INFO_COLS                                                                                   \
  "s.id, s.uuid, s.name, s.created, s.model_arch, s.model_fingerprint, s.n_tokens, s.k_types, "       \
  "s.v_types, s.v_trans, s.source_format, s.raw_bytes, s.stored_bytes, s.lossy, s.parent_id, "        \
  "s.content_sha256, s.n_chunks, s.pinned, s.expires_at, s.last_restored, s.tenant, s.master_key_id, "      \
  "s.tenant_key_id"


// A prepared statement in use: cached ones are reset (not finalized) when it
// goes out of scope, so no statement is left mid-step across a COMMIT.
class SqliteCatalog::Stmt {
 public:
  // `in_use`: the cache's flag for this statement, cleared when done.
  Stmt(SqliteCatalog& c, sqlite3_stmt* s, bool* in_use) : c_(&c), s_(s), in_use_(in_use) {}
  Stmt(Stmt&& o) noexcept : c_(o.c_), s_(o.s_), in_use_(o.in_use_) { o.s_ = nullptr; }
  Stmt& operator=(Stmt&&) = delete;
  void reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  ~Stmt() {
    if (!s_) return;
    if (!in_use_) {
      sqlite3_finalize(s_);
    } else {
      sqlite3_reset(s_);
      sqlite3_clear_bindings(s_);
      *in_use_ = false;
    }
  }
  Stmt& i64(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& text(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& opt_text(int i, const std::optional<std::string>& v) {
    if (v) return text(i, *v);
    sqlite3_bind_null(s_, i);
    return *this;
  }
  // An empty blob is bound as a zero-length blob, not NULL.
  Stmt& blob(int i, const void* p, size_t n) {
    if (n == 0) {
      sqlite3_bind_zeroblob(s_, i, 0);
    } else {
      sqlite3_bind_blob(s_, i, p, static_cast<int>(n), SQLITE_TRANSIENT);
    }
    return *this;
  }
  template <class C>
  Stmt& blob(int i, const C& c) {
    return blob(i, c.data(), c.size() * sizeof(c[0]));
  }
  // true: a row is ready; false: done.
  Result<bool> step() {
    int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return c_->sqlite_error(rc, sqlite3_sql(s_));
  }
  // Steps to the end, ignoring rows.
  Status run() {
    for (;;) {
      KV_ASSIGN_OR_RETURN(bool row, step());
      if (!row) return Status::OK();
    }
  }
  int64_t col_i64(int i) const { return sqlite3_column_int64(s_, i); }
  bool is_null(int i) const { return sqlite3_column_type(s_, i) == SQLITE_NULL; }
  std::string col_text(int i) const {
    const unsigned char* p = sqlite3_column_text(s_, i);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(s_, i)) : std::string();
  }
  std::span<const std::byte> col_blob(int i) const {
    const void* p = sqlite3_column_blob(s_, i);
    int n = sqlite3_column_bytes(s_, i);
    return p ? std::span<const std::byte>(static_cast<const std::byte*>(p), static_cast<size_t>(n))
             : std::span<const std::byte>();
  }

 private:
  SqliteCatalog* c_;
  sqlite3_stmt* s_;
  bool* in_use_;  // nullptr: a one-off statement, finalized when done
};

// A row of SELECT sha256, raw_size, stored_size, pack, pack_offset; false when the hash is malformed.
inline constexpr auto read_chunk_row = [](const auto& q, ChunkUse& u) {
  auto b = q.col_blob(0);
  if (b.size() != 32) return false;
  std::memcpy(u.sha256.bytes.data(), b.data(), 32);
  u.raw_size = static_cast<uint64_t>(q.col_i64(1));
  u.stored_size = static_cast<uint64_t>(q.col_i64(2));
  u.pack = q.col_text(3);
  u.pack_offset = static_cast<uint64_t>(q.col_i64(4));
  return true;
};

template <class F>
Status SqliteCatalog::write_txn(F&& body) {
  release_room_reserve_if_short();
  KV_RETURN_IF_ERROR(begin_immediate());
  Status s = body();
  if (!s.ok()) {
    rollback();
    return s;
  }
  return commit();
}

template <class F>
Status SqliteCatalog::read_txn(F&& body) {
  if (!sqlite3_get_autocommit(db_)) return body();  // inside a transaction already
  KV_RETURN_IF_ERROR(exec("BEGIN"));
  Status s = body();
  rollback();
  return s;
}

}  // namespace kvsnap
