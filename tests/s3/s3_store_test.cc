// A whole store whose blobs are in the bucket (a store config file naming
// s3://BUCKET/PREFIX): saves and restores byte for byte, verify, remove + gc
// leave the bucket empty.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "base/key_source.h"
#include "format/state_prefix.h"
#include "migrate/model_info.h"
#include "s3/s3_bed.h"
#include "store/s3_blob_store.h"
#include "store/s3_sigv4.h"
#include "store/store.h"
#include "store/store_location.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

TEST(S3Store, SaveRestoreVerifyRemoveGc) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  ASSERT_TRUE(S3Client(*cfg).create_bucket().ok());
  std::string tmpl = (fs::temp_directory_path() / "kvsnap-s3store-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  // Credentials as a user gives them: the environment, not the config file.
  setenv("AWS_ACCESS_KEY_ID", cfg->access_key.c_str(), 1);
  setenv("AWS_SECRET_ACCESS_KEY", cfg->secret_key.c_str(), 1);
  std::ofstream(dir + "/store.json") << R"({"blobs": "s3://)" << cfg->bucket << "/team-a?endpoint="
                                     << uri_encode(cfg->endpoint, false) << R"("})";
  auto where = resolve_store_location(posix_io(), dir);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  auto store = Store::open(posix_io(), *where);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_NE((*store)->blobs().describe().find("s3://" + cfg->bucket + "/team-a"), std::string::npos);

  const fs::path fixtures = fs::path(KVSNAP_SOURCE_DIR) / "fixtures";
  std::vector<std::pair<std::vector<std::byte>, int64_t>> saved;
  for (const char* f : {"v0.5.0/hd64-f16-f16-faon.slot", "v0.5.0/hd64-q4_0-q8_0-faon.slot", "b5640/hd64-f16-f16-faoff.slot"}) {
    std::vector<std::byte> bytes = test::slurp(fixtures / f);
    MemoryFile file(f, std::span<const std::byte>(bytes));
    auto parsed = parse_for_model(file, {}, nullptr);
    ASSERT_TRUE(parsed.ok()) << f << ": " << parsed.status().ToString();
    SaveRequest req;
    req.cells_per_chunk = 16;  // several chunks per layer: many blobs in the pack
    auto r = (*store)->save(file, *parsed, req);
    ASSERT_TRUE(r.ok()) << f << ": " << r.status().ToString();
    saved.emplace_back(std::move(bytes), r->info.id);
  }
  auto& blobs = static_cast<S3BlobStore&>((*store)->blobs());
  EXPECT_GE(blobs.list_packs()->size(), 1u) << "the saves' packs are in the bucket";
  EXPECT_TRUE(blobs.list_tmp()->empty());
  {
    // A second catalog (this host's SQLite, new) over the same prefix: its gc would take every pack.
    std::string other = dir + "-other";
    fs::create_directories(other);
    std::ofstream(other + "/store.json") << R"({"blobs": "s3://)" << cfg->bucket << "/team-a?endpoint="
                                         << uri_encode(cfg->endpoint, false) << R"("})";
    auto wrong = Store::open(posix_io(), *resolve_store_location(posix_io(), other));
    ASSERT_TRUE(wrong.ok()) << wrong.status().ToString();
    const size_t packs = blobs.list_packs()->size();
    auto gc = (*wrong)->gc(true);
    ASSERT_EQ(gc.status().code(), Code::kMismatch) << (gc.ok() ? "gc ran" : gc.status().ToString());
    EXPECT_EQ(blobs.list_packs()->size(), packs) << "the other catalog's gc deleted packs";
    wrong->reset();
    fs::remove_all(other);
  }
  for (const auto& [bytes, id] : saved) {
    VectorSink out;
    auto r = (*store)->restore(std::to_string(id), {}, out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(out.bytes, bytes);
  }
  auto v = (*store)->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  {
    // Compaction in the bucket: the first session's first quarter saved on its own, then the
    // session removed; the live blobs of its pack (three quarters dead) are read by range GETs
    // past the read cache into a new pack (one upload: it is under a part's size), the old pack
    // is deleted, and the quarter restores byte for byte.
    MemoryFile whole("first", std::span<const std::byte>(saved[0].first));
    auto parsed = parse_for_model(whole, {}, nullptr);
    ASSERT_TRUE(parsed.ok());
    VectorSink quarter;
    ASSERT_TRUE(write_prefix(*parsed, whole, parsed->tokens.tokens.size() / 4, quarter).ok());
    MemoryFile qfile("quarter", std::span<const std::byte>(quarter.bytes));
    auto qparsed = parse_state(qfile);
    ASSERT_TRUE(qparsed.ok());
    SaveRequest req;
    req.cells_per_chunk = 16;
    auto q = (*store)->save(qfile, *qparsed, req);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    const std::vector<std::string> packs_before = *blobs.list_packs();
    ASSERT_TRUE((*store)->remove(std::to_string(saved[0].second)).ok());
    saved.erase(saved.begin());
    const std::vector<std::string> packs_after = *blobs.list_packs();
    EXPECT_EQ(packs_after.size(), packs_before.size()) << "one pack compacted into a new one";
    EXPECT_NE(packs_after, packs_before);
    VectorSink out;
    ASSERT_TRUE((*store)->restore(std::to_string(q->info.id), {}, out).ok());
    EXPECT_EQ(out.bytes, quarter.bytes);
    auto v2 = (*store)->verify({});
    ASSERT_TRUE(v2.ok()) << v2.status().ToString();
    EXPECT_TRUE(v2->problems.empty()) << v2->problems[0];
    saved.emplace_back(std::vector<std::byte>(quarter.bytes), q->info.id);
  }

  for (const auto& [bytes, id] : saved) ASSERT_TRUE((*store)->remove(std::to_string(id)).ok());
  auto gc = (*store)->gc(true);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_TRUE(blobs.list()->empty());
  EXPECT_TRUE(blobs.list_packs()->empty()) << "gc deleted the packs from the bucket";
  store->reset();
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  fs::remove_all(dir);
}

// store.json's cache_max_bytes: restores through a store whose cache holds
// 32 KiB keep it at most that (least recently used dropped), and 0 keeps none.
TEST(S3Store, TheCacheSizeComesFromTheStoreConfig) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  ASSERT_TRUE(S3Client(*cfg).create_bucket().ok());
  std::string tmpl = (fs::temp_directory_path() / "kvsnap-s3cache-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  setenv("AWS_ACCESS_KEY_ID", cfg->access_key.c_str(), 1);
  setenv("AWS_SECRET_ACCESS_KEY", cfg->secret_key.c_str(), 1);
  auto open = [&](const std::string& host, const std::string& cache) {
    fs::create_directories(dir + "/" + host);
    std::ofstream(dir + "/" + host + "/store.json")
        << R"({"catalog": ")" << dir << R"(/catalog.sqlite", "blobs": "s3://)" << cfg->bucket
        << "/cache-test?endpoint=" << uri_encode(cfg->endpoint, false) << R"(", "cache_max_bytes": )" << cache << "}";
    auto where = resolve_store_location(posix_io(), dir + "/" + host);
    EXPECT_TRUE(where.ok()) << where.status().ToString();
    auto store = Store::open(posix_io(), *where);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  };
  auto cache_bytes = [&](const std::string& host) {
    uint64_t n = 0;
    if (fs::exists(dir + "/" + host + "/s3-cache"))
      for (auto& e : fs::directory_iterator(dir + "/" + host + "/s3-cache")) n += e.file_size();
    return n;
  };
  std::vector<std::byte> bytes = test::slurp(fs::path(KVSNAP_SOURCE_DIR) / "fixtures/b8121/hd128-f16-f16-faoff.slot");
  int64_t id = 0;
  {
    auto writer = open("writer", "0");
    ASSERT_TRUE(writer);
    MemoryFile file("a.slot", std::span<const std::byte>(bytes));
    auto parsed = parse_for_model(file, {}, nullptr);
    ASSERT_TRUE(parsed.ok());
    SaveRequest req;
    req.cells_per_chunk = 4;  // small blobs: many fit in the cache
    auto r = writer->save(file, *parsed, req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    id = r->info.id;
    ASSERT_GT(r->bytes_new, 2u * (32u << 10)) << "the snapshot is larger than the cache";
  }
  for (const char* host : {"small", "none"}) {
    auto reader = open(host, std::string(host) == "small" ? "\"32K\"" : "0");
    ASSERT_TRUE(reader);
    for (int round = 0; round < 2; ++round) {
      VectorSink out;
      auto r = reader->restore(std::to_string(id), {}, out);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(out.bytes, bytes);
    }
  }
  EXPECT_GT(cache_bytes("small"), 0u) << "the small cache is used";
  EXPECT_LE(cache_bytes("small"), 32u << 10) << "and stays under its size";
  EXPECT_FALSE(fs::exists(dir + "/none/s3-cache")) << "0: no cache at all";
  EXPECT_EQ(cache_bytes("writer"), 0u);
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  fs::remove_all(dir);
}

// Encryption at rest on S3 (docs/store.md, "Encryption at rest"): the objects in the bucket,
// read raw, hold none of the slot's token bytes or K/V bytes, and a restore needs the key.
TEST(S3Store, EncryptedObjectsHoldNoPlaintextAndRestoreNeedsTheKey) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  S3Client raw(*cfg);
  ASSERT_TRUE(raw.create_bucket().ok());
  std::string tmpl = (fs::temp_directory_path() / "kvsnap-s3crypt-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  setenv("AWS_ACCESS_KEY_ID", cfg->access_key.c_str(), 1);
  setenv("AWS_SECRET_ACCESS_KEY", cfg->secret_key.c_str(), 1);
  std::ofstream(dir + "/k.key") << std::string(64, 'e') << "\n";
  fs::permissions(dir + "/k.key", fs::perms::owner_read | fs::perms::owner_write);
  std::ofstream(dir + "/store.json") << R"({"blobs": "s3://)" << cfg->bucket << "/sealed?endpoint="
                                     << uri_encode(cfg->endpoint, false) << R"(", "tenant": "alice"})";
  auto where = resolve_store_location(posix_io(), dir);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  StoreLocation keyed = *where;
  keyed.keys.key_file = dir + "/k.key";
  auto store = Store::open(posix_io(), keyed);
  ASSERT_TRUE(store.ok()) << store.status().ToString();

  const fs::path slot = fs::path(KVSNAP_SOURCE_DIR) / "fixtures/v0.5.0/hd64-f16-f16-faon.slot";
  std::vector<std::byte> bytes = test::slurp(slot);
  MemoryFile file("slot", std::span<const std::byte>(bytes));
  auto parsed = parse_for_model(file, {}, nullptr);
  ASSERT_TRUE(parsed.ok());
  SaveRequest req;
  req.cells_per_chunk = 32;
  req.byte_shuffle = false;  // K/V bytes kept in runs: a plain store would show them
  auto saved = (*store)->save(file, *parsed, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();

  std::vector<std::byte> tokens(64), kv(bytes.begin() + bytes.size() / 2, bytes.begin() + bytes.size() / 2 + 64);
  std::memcpy(tokens.data(), parsed->tokens.tokens.data(), 64);
  auto objects = raw.list("sealed/");
  ASSERT_TRUE(objects.ok()) << objects.status().ToString();
  ASSERT_FALSE(objects->empty());
  for (const S3Object& o : *objects) {
    auto body = raw.get(o.key, 1u << 30);
    ASSERT_TRUE(body.ok()) << o.key << ": " << body.status().ToString();
    for (const auto* needle : {&tokens, &kv})
      EXPECT_EQ(std::search(body->begin(), body->end(), needle->begin(), needle->end()), body->end())
          << o.key << " holds plaintext";
  }
  VectorSink out;
  ASSERT_TRUE((*store)->restore(std::to_string(saved->info.id), {}, out).ok());
  EXPECT_EQ(out.bytes, bytes);

  store->reset();
  auto keyless = Store::open(posix_io(), *where);
  ASSERT_FALSE(keyless.ok());
  EXPECT_EQ(keyless.status().code(), Code::kInvalidArgument);
  EXPECT_NE(keyless.status().message().find("is encrypted (key "), std::string::npos) << keyless.status().ToString();
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  fs::remove_all(dir);
}

// kvsnap rekey over S3 blobs (docs/store.md, "Key rotation"): after the rotation and its gc the
// bucket holds only blobs sealed under the new key, and the snapshots restore with it.
TEST(S3Store, RekeyLeavesOnlyTheNewKeysObjects) {
  KVSNAP_S3_BED_OR_SKIP(cfg);
  S3Client raw(*cfg);
  ASSERT_TRUE(raw.create_bucket().ok());
  std::string tmpl = (fs::temp_directory_path() / "kvsnap-s3rekey-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string dir = tmpl;
  setenv("AWS_ACCESS_KEY_ID", cfg->access_key.c_str(), 1);
  setenv("AWS_SECRET_ACCESS_KEY", cfg->secret_key.c_str(), 1);
  for (const char* k : {"old", "new"}) {
    std::ofstream(dir + "/" + k + ".key") << std::string(64, k[0] == 'o' ? 'a' : 'b') << "\n";
    fs::permissions(dir + "/" + k + ".key", fs::perms::owner_read | fs::perms::owner_write);
  }
  std::ofstream(dir + "/store.json") << R"({"blobs": "s3://)" << cfg->bucket << "/rekey?endpoint="
                                     << uri_encode(cfg->endpoint, false) << R"(", "tenant": "alice"})";
  auto where = resolve_store_location(posix_io(), dir);
  ASSERT_TRUE(where.ok()) << where.status().ToString();
  auto open = [&](const char* key) {
    StoreLocation keyed = *where;
    keyed.keys.key_file = dir + "/" + key + ".key";
    return Store::open(posix_io(), keyed);
  };
  const fs::path slot = fs::path(KVSNAP_SOURCE_DIR) / "fixtures/v0.5.0/hd64-f16-f16-faon.slot";
  std::vector<std::byte> bytes = test::slurp(slot);
  MemoryFile file("slot", std::span<const std::byte>(bytes));
  auto parsed = parse_for_model(file, {}, nullptr);
  ASSERT_TRUE(parsed.ok());
  std::vector<int64_t> ids;
  {
    auto store = open("old");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    for (uint32_t cells : {32u, 64u}) {  // two snapshots of different chunks
      SaveRequest req;
      req.cells_per_chunk = cells;
      auto saved = (*store)->save(file, *parsed, req);
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
      ids.push_back(saved->info.id);
    }
  }
  auto old_store = open("old");
  ASSERT_TRUE(old_store.ok());
  auto next = load_key_file(dir + "/new.key");
  ASSERT_TRUE(next.ok());
  auto rep = (*old_store)->rekey(*next);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->rekeyed, 2u);
  EXPECT_GT(rep->gc.packs_deleted, 0u);
  auto objects = raw.list("rekey/");
  ASSERT_TRUE(objects.ok()) << objects.status().ToString();
  ASSERT_FALSE(objects->empty());
  for (const S3Object& o : *objects) {  // packs: sealed blobs back to back, the first at 0
    if (o.key == std::string("rekey/") + kStoreIdName) continue;  // which catalog the blobs are (a UUID)
    auto body = raw.get(o.key, 1u << 30);
    ASSERT_TRUE(body.ok()) << o.key << ": " << body.status().ToString();
    ASSERT_GE(body->size(), kSealedHeaderBytes) << o.key;
    ASSERT_TRUE(looks_sealed(*body)) << o.key;
    KeyId master{};  // the header's master key id (base/chunk_cipher.h: bytes 8..15)
    std::memcpy(master.data(), body->data() + 8, 8);
    EXPECT_EQ(key_id_hex(master), rep->to_key_id) << o.key << " is sealed under another key";
  }
  auto store = open("new");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  for (int64_t id : ids) {
    VectorSink out;
    ASSERT_TRUE((*store)->restore(std::to_string(id), {}, out).ok());
    EXPECT_EQ(out.bytes, bytes);
  }
  auto v = (*store)->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  EXPECT_EQ(open("old").status().code(), Code::kMismatch);
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvsnap
