// The test bed of the encrypted store's tests (store_crypt_test.cc, store_rekey_test.cc): a
// directory store with key files beside it, the fixture slot, and small helpers.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/key_source.h"
#include "store/store.h"
#include "store/store_caps_scenario.h"
#include "test_files.h"

namespace kvsnap::crypt_bed {

namespace fs = std::filesystem;
using test::slurp;

inline fs::path fixtures() { return fs::path(KVSNAP_SOURCE_DIR) / "fixtures"; }

inline fs::path temp_path(const char* what) {
  return fs::temp_directory_path() /
         (std::string("kvsnap-crypt-") + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
}

// A key file of 64 hex digits, mode 0600 (load_key_file refuses anything more open).
inline fs::path write_key(const fs::path& dir, const char* name, char digit) {
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p) << std::string(64, digit) << "\n";
  ::chmod(p.c_str(), 0600);
  return p;
}

using Loaded = test::LoadedState;
inline Loaded load(const fs::path& p) { return test::load_state(p); }

// A directory store and key files beside it; open() with any key and tenant.
struct Bed {
  fs::path root = temp_path("store"), keys = temp_path("keys");
  fs::path key_a = write_key(keys, "a.key", 'a'), key_b = write_key(keys, "b.key", 'b');
  ~Bed() {
    fs::remove_all(root);
    fs::remove_all(keys);
  }
  Result<std::unique_ptr<Store>> open(const fs::path& key, const std::string& tenant = "", bool keyless_ok = false,
                                       Io& io = posix_io()) {
    StoreLocation where = directory_store(root.string());
    where.keys.key_file = key.string();
    where.keys.tenant = tenant;
    where.keys.keyless_ok = keyless_ok;
    return Store::open(io, where);
  }
  std::unique_ptr<Store> must_open(const fs::path& key, const std::string& tenant = "") {
    auto s = open(key, tenant);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  // Raw SQL on the store's catalog, bypassing kvsnap: what someone who can write the file does.
  void sql(const std::string& statement) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((root / "catalog.sqlite").c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, statement.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << statement;
    sqlite3_close(db);
  }
  std::string key_id(const fs::path& key) {
    auto k = load_key_file(key.string());
    return k.ok() ? key_id_hex(k->id()) : "";
  }
};

const char* const kSlot = "v0.5.0/hd64-f16-f16-faon.slot";

inline SaveRequest small_chunks() {
  SaveRequest r;
  r.cells_per_chunk = 32;
  r.byte_shuffle = false;  // K/V bytes stay in runs, so the plaintext search below can find them
  return r;
}

inline std::string restore_all(Store& s, const std::string& ref, Status* status = nullptr, std::optional<uint64_t> tokens = {}) {
  VectorSink out;
  RestoreRequest req;
  req.tokens = tokens;
  auto r = s.restore(ref, req, out);
  if (status) *status = r.status();
  EXPECT_TRUE(status || r.ok()) << r.status().ToString();
  return std::string(reinterpret_cast<const char*>(out.bytes.data()), out.bytes.size());
}

inline bool file_contains(const fs::path& p, std::span<const std::byte> needle) {
  auto hay = slurp(p);
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

// Whether any file under `root` (packs, catalog, its WAL) holds `needle`.
inline bool store_contains(const fs::path& root, std::span<const std::byte> needle) {
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file() && file_contains(e.path(), needle)) return true;
  return false;
}

// The bytes of one column of the only snapshot_blobs row, changed by `edit`.
inline void edit_row(const fs::path& catalog, const char* column,
                     const std::function<void(std::vector<unsigned char>&)>& edit) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(catalog.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  const std::string get = std::string("SELECT ") + column + " FROM snapshot_blobs";
  ASSERT_EQ(sqlite3_prepare_v2(db, get.c_str(), -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  auto* p = static_cast<const unsigned char*>(sqlite3_column_blob(st, 0));
  std::vector<unsigned char> m(p, p + sqlite3_column_bytes(st, 0));
  sqlite3_finalize(st);
  edit(m);
  const std::string put = std::string("UPDATE snapshot_blobs SET ") + column + " = ?";
  ASSERT_EQ(sqlite3_prepare_v2(db, put.c_str(), -1, &st, nullptr), SQLITE_OK);
  sqlite3_bind_blob(st, 1, m.data(), int(m.size()), SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

inline void flip(std::vector<unsigned char>& m) { m[m.size() / 2] ^= 0x01; }


}  // namespace kvsnap::crypt_bed
