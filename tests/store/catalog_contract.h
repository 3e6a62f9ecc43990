// The catalog's behaviour, as every implementation must show it: typed tests
// over a backend (tests/store/catalog_test.cc instantiates them for SQLite,
// tests/postgres/pg_catalog_test.cc for PostgreSQL on a real server).
//
// A backend B provides:
//   using Cat = ...;  static constexpr int kSchemaVersion;
//   std::string set_up();          // "" or why the backend cannot run here (the test is skipped)
//   void tear_down();
//   Result<std::unique_ptr<Cat>> open(const CatalogOptions& = {});  // a new connection to this test's catalog
//   void sql(const std::string&);  // raw SQL on the catalog, bypassing Cat (to set up odd states)
//   std::map<std::string, int64_t> refcounts();  // lowercase hex hash -> refcount, read directly
//   void set_schema_version(int);
//   std::string bytes_literal(const std::string& hex);  // a blob literal in the backend's SQL
//   std::string blob_root();       // a directory for this test's LocalBlobStore
//   std::unique_ptr<GcLocks> gc_locks();  // the locks a store with this catalog uses (nullptr: the file lock)
//   std::string explain_expired();  // the plan of Cat::kExpiredSql on this test's catalog (the index named when used)
// Included by one test source per executable (it defines tests and helpers).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <thread>

#include <fstream>

#include "base/io.h"
#include "store/catalog.h"
#include "store/eviction.h"
#include "store/local_blob_store.h"

// Filters and options below are written with designated initializers.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace kvsnap {
namespace {

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

ChunkHash chunk(const std::string& tag) { return ChunkHash::of(bytes_of(tag)); }
ChunkUse use(const std::string& tag, uint64_t raw = 1000, uint64_t stored = 400) {
  return ChunkUse{chunk(tag), raw, stored};
}

std::vector<int32_t> iota_tokens(int n, int start = 1) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = start + i;
  return t;
}

SnapshotRecord record(std::optional<std::string> name, std::vector<int32_t> tokens = {1, 2, 3}) {
  SnapshotRecord r;
  r.info.name = std::move(name);
  r.info.model_arch = "llama";
  r.info.model_fingerprint = "fp-a";
  r.info.k_types = "f16";
  r.info.v_types = "f16";
  r.info.source_format = "ggsq3";
  r.info.raw_bytes = 5000;
  r.info.stored_bytes = 2000;
  r.manifest = bytes_of("manifest of " + r.info.name.value_or("?"));
  r.tokens = std::move(tokens);
  return r;
}

std::vector<int64_t> ids_of(const Result<std::vector<SnapshotInfo>>& r) {
  std::vector<int64_t> v;
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok())
    for (const auto& i : *r) v.push_back(i.id);
  return v;
}

// Runs body(p) in n forked processes at once (p = 0..n-1); each exits with
// what body returns, and every exit must be 0.
template <class F>
void run_in_processes(int n, F body) {
  std::vector<pid_t> kids;
  for (int p = 0; p < n; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(body(p));
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ASSERT_EQ(waitpid(k, &st, 0), k);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  }
}

template <class B>
class CatalogContract : public ::testing::Test {
 protected:
  using Cat = typename B::Cat;
  void SetUp() override {
    std::string why = b_.set_up();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override { b_.tear_down(); }

  std::unique_ptr<Cat> open(const CatalogOptions& o = {}) {
    auto c = b_.open(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  int64_t add(Cat& c, SnapshotRecord r, std::vector<ChunkUse> chunks = {}) {
    auto info = c.add_snapshot(std::move(r), chunks);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? info->id : -1;
  }
  std::map<std::string, int64_t> refcounts() { return b_.refcounts(); }
  void sql(const std::string& s) { b_.sql(s); }
  void expect_consistent(Cat& c) {
    auto problems = c.integrity_check();
    ASSERT_TRUE(problems.ok()) << problems.status().ToString();
    EXPECT_TRUE(problems->empty()) << problems->front();
  }

  B b_;
};

TYPED_TEST_SUITE_P(CatalogContract);

// ---------------------------------------------------------------- schema

TYPED_TEST_P(CatalogContract, NewerSchemaIsRefusedWithAClearMessage) {
  { ASSERT_TRUE(this->open()); }
  this->b_.set_schema_version(7);
  auto c = this->b_.open();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kNotSupported);
  EXPECT_NE(c.status().message().find("schema version 7"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("upgrade kvsnap"), std::string::npos) << c.status().message();
}

TYPED_TEST_P(CatalogContract, ConcurrentFirstOpensMigrateOnce) {
  std::vector<std::future<bool>> opens;
  for (int i = 0; i < 6; ++i) {
    opens.push_back(std::async(std::launch::async, [&] {
      auto c = this->b_.open();
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      return c.ok() && *(*c)->schema_version() == TypeParam::kSchemaVersion;
    }));
  }
  for (auto& f : opens) EXPECT_TRUE(f.get());
}

// ---------------------------------------------------------------- add / get / remove

TYPED_TEST_P(CatalogContract, AddThenGetRoundTripsEveryField) {
  auto c = this->open();
  SnapshotRecord r = record("first", iota_tokens(300));
  r.info.tags = {{"user", "ana"}, {"topic", "rust"}};
  r.info.lossy = "f16->q8_0";
  r.info.v_trans = true;
  r.info.content_sha256 = std::string(64, 'e');
  r.manifest = bytes_of(std::string("\0binary\xff manifest", 17));
  std::vector<ChunkUse> chunks = {use("a", 100, 40), use("b", 200, 50), use("a", 100, 40)};
  auto added = c->add_snapshot(r, chunks);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_EQ(added->uuid.size(), 36u);
  EXPECT_EQ(added->uuid[14], '4');
  EXPECT_FALSE(added->created.empty());

  auto got = c->get(added->id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->info.uuid, added->uuid);
  EXPECT_EQ(got->info.name, "first");
  EXPECT_EQ(got->info.created, added->created);
  EXPECT_EQ(got->info.model_arch, "llama");
  EXPECT_EQ(got->info.model_fingerprint, "fp-a");
  EXPECT_EQ(got->info.n_tokens, 300);
  EXPECT_EQ(got->info.n_chunks, 3);
  EXPECT_TRUE(got->info.v_trans);
  EXPECT_EQ(got->info.lossy, "f16->q8_0");
  EXPECT_EQ(got->info.content_sha256, std::string(64, 'e'));
  EXPECT_EQ(got->info.raw_bytes, 5000u);
  EXPECT_EQ(got->info.stored_bytes, 2000u);
  EXPECT_FALSE(got->info.parent_id);
  EXPECT_EQ(got->info.tags, r.info.tags);
  EXPECT_EQ(got->manifest, r.manifest);
  EXPECT_EQ(got->tokens, r.tokens);

  auto cs = c->chunks_of(added->id);
  ASSERT_TRUE(cs.ok());
  ASSERT_EQ(cs->size(), 3u);
  EXPECT_EQ((*cs)[0].sha256, chunk("a"));
  EXPECT_EQ((*cs)[1].sha256, chunk("b"));
  EXPECT_EQ((*cs)[2].sha256, chunk("a"));
  EXPECT_EQ((*cs)[1].raw_size, 200u);
  EXPECT_EQ((*cs)[1].stored_size, 50u);
  EXPECT_EQ(this->refcounts()[chunk("a").hex()], 2) << "a chunk used twice counts twice";
  EXPECT_EQ(c->get(999).status().code(), Code::kNotFound);
  this->expect_consistent(*c);
}

TYPED_TEST_P(CatalogContract, EmptyManifestAndNoTokensAreFine) {
  auto c = this->open();
  SnapshotRecord r = record(std::nullopt, {});
  r.manifest.clear();
  int64_t id = this->add(*c, r);
  auto got = c->get(id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->manifest.empty());
  EXPECT_TRUE(got->tokens.empty());
  EXPECT_FALSE(got->info.name);
}

// An id is never given twice: after the newest snapshot is removed (rm, an eviction), the next save
// gets a new id, so that an id a script kept cannot name another conversation. Across reopening.
TYPED_TEST_P(CatalogContract, IdsAreNeverGivenTwice) {
  int64_t a = 0, b = 0, c = 0;
  {
    auto cat = this->open();
    ASSERT_TRUE(cat);
    a = this->add(*cat, record("a"), {use("x")});
    b = this->add(*cat, record("b"), {use("y")});
    ASSERT_GT(b, a);
    ASSERT_TRUE(cat->remove_snapshot(b).ok());
    c = this->add(*cat, record("c"), {use("z")});
    EXPECT_GT(c, b) << "the id of a removed snapshot was given again";
    ASSERT_TRUE(cat->remove_snapshot(c).ok());
  }
  auto cat = this->open();
  ASSERT_TRUE(cat);
  const int64_t d = this->add(*cat, record("d"), {use("w")});
  EXPECT_GT(d, c) << "given again after reopening";
  EXPECT_TRUE(cat->resolve(std::to_string(b)).status().code() == Code::kNotFound);
  this->expect_consistent(*cat);
}

TYPED_TEST_P(CatalogContract, TakenNameIsRefusedAndChangesNothing) {
  auto c = this->open();
  int64_t id = this->add(*c, record("chat"), {use("a")});
  auto before = this->refcounts();
  auto dup = c->add_snapshot(record("chat"), {use("a"), use("b")});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(dup.status().message(), "a snapshot named 'chat' already exists (id " + std::to_string(id) +
                                        "): choose another {--name}, or remove it first (kvsnap rm chat)");
  EXPECT_EQ(this->refcounts(), before) << "a refused add leaves no refcount behind";
  EXPECT_EQ(c->list()->size(), 1u);
  // Unnamed snapshots do not collide.
  this->add(*c, record(std::nullopt));
  this->add(*c, record(std::nullopt));
  EXPECT_EQ(c->list()->size(), 3u);
}

TYPED_TEST_P(CatalogContract, BadNamesParentsAndUuids) {
  auto c = this->open();
  EXPECT_EQ(c->add_snapshot(record("12345"), {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->add_snapshot(record(""), {}).status().code(), Code::kInvalidArgument);
  // A parent removed between a save's lookup and its commit (a review's finding: the save failed,
  // its work lost) is recorded as none, as one removed after the commit is.
  SnapshotRecord orphan = record("orphan");
  orphan.info.parent_id = 77;
  auto r = c->add_snapshot(orphan, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->parent_id);
  EXPECT_FALSE(c->get_info(r->id)->parent_id);
  SnapshotRecord u = record("u");
  u.info.uuid = "11111111-2222-4333-8444-555555555555";
  this->add(*c, u);
  SnapshotRecord u2 = record("u2");
  u2.info.uuid = "11111111-2222-4333-8444-555555555555";
  EXPECT_EQ(c->add_snapshot(u2, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->add_snapshot(record("t"), {use("a", 10)}).status().code(), Code::kOk);
  auto mismatch = c->add_snapshot(record("t2"), {use("b"), use("a", 11)});
  EXPECT_EQ(mismatch.status().code(), Code::kMismatch) << mismatch.status().ToString();
  EXPECT_EQ(this->refcounts().count(chunk("b").hex()), 0u) << "the whole add rolled back";
  this->expect_consistent(*c);
}

TYPED_TEST_P(CatalogContract, ParentBecomesNullWhenParentIsRemoved) {
  auto c = this->open();
  int64_t p = this->add(*c, record("parent"));
  SnapshotRecord child = record("child");
  child.info.parent_id = p;
  int64_t ch = this->add(*c, child);
  EXPECT_EQ(c->get_info(ch)->parent_id, p);
  ASSERT_TRUE(c->remove_snapshot(p).ok());
  EXPECT_FALSE(c->get_info(ch)->parent_id);
}

TYPED_TEST_P(CatalogContract, RefcountsFollowAddsAndRemovesOfSharingSnapshots) {
  auto c = this->open();
  int64_t a = this->add(*c, record("A"), {use("c1"), use("c2"), use("c3")});
  int64_t b = this->add(*c, record("B"), {use("c2"), use("c3"), use("c4")});
  int64_t cc = this->add(*c, record("C"), {use("c3"), use("c3")});
  auto rc = this->refcounts();
  EXPECT_EQ(rc[chunk("c1").hex()], 1);
  EXPECT_EQ(rc[chunk("c2").hex()], 2);
  EXPECT_EQ(rc[chunk("c3").hex()], 4);
  EXPECT_EQ(rc[chunk("c4").hex()], 1);
  this->expect_consistent(*c);

  auto stats = c->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->snapshots, 3);
  EXPECT_EQ(stats->chunks, 4);
  EXPECT_EQ(stats->chunk_raw_bytes, 8u * 1000);
  EXPECT_EQ(stats->stored_bytes, 4u * 400);
  EXPECT_DOUBLE_EQ(stats->dedup_ratio, 8000.0 / 1600.0);

  auto freed = c->remove_snapshot(b);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, std::vector<ChunkHash>{chunk("c4")});
  this->expect_consistent(*c);
  freed = c->remove_snapshot(a);
  ASSERT_TRUE(freed.ok());
  std::vector<ChunkHash> want = {chunk("c1"), chunk("c2")};
  std::sort(want.begin(), want.end());
  std::sort(freed->begin(), freed->end());
  EXPECT_EQ(*freed, want);
  freed = c->remove_snapshot(cc);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, std::vector<ChunkHash>{chunk("c3")});
  EXPECT_EQ(c->remove_snapshot(cc).status().code(), Code::kNotFound);

  stats = c->stats();
  EXPECT_EQ(stats->snapshots, 0);
  EXPECT_EQ(stats->chunks, 0);
  EXPECT_EQ(stats->unreferenced_chunks, 4);
  auto gone = c->forget_unreferenced({chunk("c1"), chunk("c2"), chunk("c3"), chunk("c4"), chunk("never")});
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->size(), 4u);
  EXPECT_TRUE(this->refcounts().empty());
  this->expect_consistent(*c);
}

// The batched lookup answers as find_chunk() would, hash by hash, in order:
// across statement-sized groups, with repeats, misses, refcount-0 rows and packed rows.
TYPED_TEST_P(CatalogContract, FindChunksAnswersAsFindChunkInOrder) {
  auto c = this->open();
  std::vector<ChunkUse> uses;
  for (int i = 0; i < 300; ++i) {
    ChunkUse u = use("b" + std::to_string(i), 1000 + i, 400 + i);
    if (i % 3 == 0) u.pack = "0123456789abcdef.pack", u.pack_offset = 7 * i;
    uses.push_back(u);
  }
  int64_t gone = this->add(*c, record("gone"), {use("zero")});
  this->add(*c, record("kept"), uses);
  ASSERT_TRUE(c->remove_snapshot(gone).ok());  // "zero" stays, at refcount 0
  std::vector<ChunkHash> ask;
  for (int i = 299; i >= 0; --i) {
    ask.push_back(chunk("b" + std::to_string(i)));
    if (i % 50 == 0) ask.push_back(chunk("missing" + std::to_string(i)));
  }
  ask.push_back(chunk("zero"));
  ask.push_back(chunk("b7"));  // asked twice
  auto got = c->find_chunks(ask);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), ask.size());
  for (size_t i = 0; i < ask.size(); ++i) {
    auto one = c->find_chunk(ask[i]);
    ASSERT_TRUE(one.ok());
    ASSERT_EQ((*got)[i].has_value(), one->has_value()) << i;
    if (!one->has_value()) continue;
    const ChunkUse &a = *(*got)[i], &b = **one;
    EXPECT_EQ(a.sha256, ask[i]);
    EXPECT_EQ(std::tie(a.sha256, a.raw_size, a.stored_size, a.pack, a.pack_offset),
              std::tie(b.sha256, b.raw_size, b.stored_size, b.pack, b.pack_offset)) << i;
  }
  EXPECT_TRUE((*got)[ask.size() - 2].has_value()) << "a refcount-0 row is still found";
  EXPECT_EQ((*got)[1].has_value(), true);
  EXPECT_FALSE((*got)[ask.size() - 3].has_value()) << "a missing hash";
  auto none = c->find_chunks({});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TYPED_TEST_P(CatalogContract, IntegrityCheckReportsBrokenRefcounts) {
  auto c = this->open();
  this->add(*c, record("A"), {use("c1")});
  this->sql("UPDATE chunks SET refcount = 5");
  auto problems = c->integrity_check();
  ASSERT_TRUE(problems.ok());
  ASSERT_EQ(problems->size(), 1u);
  EXPECT_NE(problems->front().find("refcount 5 but 1 uses"), std::string::npos) << problems->front();
}

// ---------------------------------------------------------------- resolve

TYPED_TEST_P(CatalogContract, ResolveByNameIdUuidAndPrefix) {
  auto c = this->open();
  SnapshotRecord a = record("alpha");
  a.info.uuid = "abcdef01-0000-4000-8000-000000000001";
  SnapshotRecord b = record("beta");
  b.info.uuid = "abcdef02-0000-4000-8000-000000000002";
  SnapshotRecord d = record("abcdef");  // a name that looks like a uuid prefix
  d.info.uuid = "99999999-0000-4000-8000-000000000003";
  int64_t ia = this->add(*c, a), ib = this->add(*c, b), id = this->add(*c, d);

  EXPECT_EQ(*c->resolve("alpha"), ia);
  EXPECT_EQ(*c->resolve(std::to_string(ib)), ib);
  EXPECT_EQ(*c->resolve("abcdef02-0000-4000-8000-000000000002"), ib);
  EXPECT_EQ(*c->resolve("ABCDEF01-0000-4000-8000-000000000001"), ia) << "uuids are case-insensitive";
  EXPECT_EQ(*c->resolve("abcdef01"), ia);
  EXPECT_EQ(*c->resolve("999999"), id) << "not an id, so a uuid prefix";
  EXPECT_EQ(*c->resolve("abcdef"), id) << "an exact name wins over a uuid prefix";

  auto amb = c->resolve("abcdef0");
  EXPECT_EQ(amb.status().code(), Code::kAmbiguous);
  EXPECT_NE(amb.status().message().find("abcdef01-0000-4000-8000-000000000001 (id " + std::to_string(ia) + ", 'alpha')"),
            std::string::npos)
      << amb.status().message();
  EXPECT_NE(amb.status().message().find("abcdef02"), std::string::npos);

  auto short_prefix = c->resolve("abcde");
  EXPECT_EQ(short_prefix.status().code(), Code::kNotFound);
  EXPECT_NE(short_prefix.status().message().find("at least 6"), std::string::npos) << short_prefix.status().message();
  EXPECT_EQ(c->resolve("nobody").status().code(), Code::kNotFound);
  EXPECT_EQ(c->resolve("4242").status().code(), Code::kNotFound);
  EXPECT_EQ(c->resolve("").status().code(), Code::kInvalidArgument);

  // A whole uuid names its own row only: a name that is a uuid (no save writes one; someone who
  // wrote the catalog did, to have their row restored in its place) does not win over it, and a
  // whole uuid that no row has is not found whatever the names say.
  this->sql("UPDATE snapshots SET name = 'abcdef01-0000-4000-8000-000000000001' WHERE id = " + std::to_string(ib));
  EXPECT_EQ(*c->resolve("abcdef01-0000-4000-8000-000000000001"), ia);
  this->sql("UPDATE snapshots SET name = '12345678-0000-4000-8000-000000000009' WHERE id = " + std::to_string(ib));
  EXPECT_EQ(c->resolve("12345678-0000-4000-8000-000000000009").status().code(), Code::kNotFound);
}

// ---------------------------------------------------------------- list

TYPED_TEST_P(CatalogContract, ListFiltersAndOrdersNewestFirst) {
  auto c = this->open();
  auto mk = [&](const char* name, const char* created, const char* fp, const char* arch, const char* kt, const char* vt,
                std::map<std::string, std::string> tags) {
    SnapshotRecord r = record(name);
    r.info.created = created;
    r.info.model_fingerprint = fp;
    r.info.model_arch = arch;
    r.info.k_types = kt;
    r.info.v_types = vt;
    r.info.tags = std::move(tags);
    return this->add(*c, r);
  };
  int64_t s1 = mk("chat-1", "2025-01-01T00:00:00.000Z", "fp-a", "llama", "f16", "f16", {{"user", "ana"}, {"app", "x"}});
  int64_t s2 = mk("chat-2", "2025-03-01T00:00:00.000Z", "fp-a", "llama", "q8_0", "q8_0", {{"user", "bob"}});
  int64_t s3 = mk("code-1", "2025-02-01T00:00:00.000Z", "fp-b", "qwen2", "f16,q8_0", "q4_0", {{"user", "ana"}, {"app", "y"}});

  auto ids = [](const Result<std::vector<SnapshotInfo>>& r) {
    std::vector<int64_t> v;
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok())
      for (const auto& i : *r) v.push_back(i.id);
    return v;
  };
  EXPECT_EQ(ids(c->list()), (std::vector<int64_t>{s2, s3, s1}));
  EXPECT_EQ(ids(c->list({.model_fingerprint = "fp-a"})), (std::vector<int64_t>{s2, s1}));
  EXPECT_EQ(ids(c->list({.model_arch = "qwen2"})), (std::vector<int64_t>{s3}));
  EXPECT_EQ(ids(c->list({.tags = {{"user", "ana"}}})), (std::vector<int64_t>{s3, s1}));
  EXPECT_EQ(ids(c->list({.tags = {{"user", "ana"}, {"app", "x"}}})), (std::vector<int64_t>{s1}));
  EXPECT_EQ(ids(c->list({.tags = {{"user", "ana"}, {"app", "z"}}})), (std::vector<int64_t>{}));
  EXPECT_EQ(ids(c->list({.name_glob = "chat-*"})), (std::vector<int64_t>{s2, s1}));
  // A literal '[' is the set "[[]" (ls --help says so): the same in SQLite's GLOB and PostgreSQL's regex.
  int64_t s4 = mk("a[1]", "2025-04-01T00:00:00.000Z", "fp-c", "llama", "f16", "f16", {});
  EXPECT_EQ(ids(c->list({.name_glob = "a[[]1]"})), (std::vector<int64_t>{s4}));
  EXPECT_EQ(ids(c->list({.name_glob = "a[[]*"})), (std::vector<int64_t>{s4}));
  EXPECT_EQ(ids(c->list({.name_glob = "a[1]"})), (std::vector<int64_t>{})) << "[1] is a set: matches a1 only";
  ASSERT_TRUE(c->remove_snapshot(s4).ok());
  EXPECT_EQ(ids(c->list({.type = "q8_0"})), (std::vector<int64_t>{s2, s3}));
  EXPECT_EQ(ids(c->list({.type = "q4_0"})), (std::vector<int64_t>{s3}));
  EXPECT_EQ(ids(c->list({.type = "q8"})), (std::vector<int64_t>{})) << "whole type names only";
  EXPECT_EQ(ids(c->list({.limit = 1})), (std::vector<int64_t>{s2}));
  auto all = c->list();
  EXPECT_EQ(all->back().tags.at("app"), "x");
  EXPECT_EQ(all->back().n_chunks, 0);
}

// ---------------------------------------------------------------- find_prefix

TYPED_TEST_P(CatalogContract, FindPrefixIsExact) {
  auto c = this->open();
  std::vector<int32_t> base = iota_tokens(200);
  auto first = [&](int n) { return std::vector<int32_t>(base.begin(), base.begin() + n); };
  int64_t s100 = this->add(*c, record("s100", first(100)));
  int64_t s50 = this->add(*c, record("s50", first(50)));
  std::vector<int32_t> differs = first(100);
  differs[80] = -1;  // same anchor (first 64 tokens) as s100, differs later
  this->add(*c, record("differs", differs));
  int64_t s200 = this->add(*c, record("s200", base));
  int64_t s64 = this->add(*c, record("s64", first(64)));
  int64_t s1 = this->add(*c, record("s1", first(1)));
  this->add(*c, record("empty", {}));

  EXPECT_EQ(ids_of(c->find_prefix(first(150))), (std::vector<int64_t>{s100, s64, s50, s1}));
  EXPECT_EQ(ids_of(c->find_prefix(first(60))), (std::vector<int64_t>{s50, s1})) << "query shorter than a snapshot";
  EXPECT_EQ(ids_of(c->find_prefix(first(100))), (std::vector<int64_t>{s100, s64, s50, s1})) << "identical tokens";
  EXPECT_EQ(ids_of(c->find_prefix(base)), (std::vector<int64_t>{s200, s100, s64, s50, s1}));
  EXPECT_EQ(ids_of(c->find_prefix(first(64))), (std::vector<int64_t>{s64, s50, s1}));
  EXPECT_EQ(ids_of(c->find_prefix(first(63))), (std::vector<int64_t>{s50, s1}));
  EXPECT_EQ(ids_of(c->find_prefix({})), (std::vector<int64_t>{})) << "empty query";
  EXPECT_EQ(ids_of(c->find_prefix(std::vector<int32_t>{7, 8, 9})), (std::vector<int64_t>{})) << "miss";
  EXPECT_EQ(ids_of(c->find_prefix(first(150), "fp-other")), (std::vector<int64_t>{}));
  EXPECT_EQ(ids_of(c->find_prefix(first(150), "fp-a")).size(), 4u);
  EXPECT_EQ(ids_of(c->find_prefix(first(150), "", 1)), (std::vector<int64_t>{s100})) << "limit 1: the longest";
  EXPECT_EQ(ids_of(c->find_prefix(first(150), "", 2)), (std::vector<int64_t>{s100, s64}));
  SnapshotRecord other_model = record("other-model", first(120));
  other_model.info.model_fingerprint = "fp-b";
  int64_t s120 = this->add(*c, other_model);
  EXPECT_EQ(ids_of(c->find_prefix(first(150), "fp-b")), (std::vector<int64_t>{s120}));
  EXPECT_EQ(ids_of(c->find_prefix(first(150), "fp-a", 1)), (std::vector<int64_t>{s100}))
      << "a filtered-out candidate does not use up the limit";
}

// The hashes only pick candidates: a snapshot whose hashes match but whose
// stored tokens differ (what a hash collision would look like) is not returned.
TYPED_TEST_P(CatalogContract, FindPrefixVerifiesTokensNotJustHashes) {
  auto c = this->open();
  int64_t id = this->add(*c, record("s", iota_tokens(100)));
  ASSERT_EQ(ids_of(c->find_prefix(iota_tokens(120))), (std::vector<int64_t>{id}));
  std::vector<int32_t> other = iota_tokens(100);
  other[99] = 5;
  this->sql("UPDATE snapshot_blobs SET tokens = " + this->b_.bytes_literal([&] {
    std::string hex;
    char buf[3];
    for (int32_t t : other)
      for (int b = 0; b < 4; ++b) {
        std::snprintf(buf, sizeof buf, "%02x", (static_cast<uint32_t>(t) >> (8 * b)) & 0xff);
        hex += buf;
      }
    return hex;
  }()));
  EXPECT_EQ(ids_of(c->find_prefix(iota_tokens(120))), (std::vector<int64_t>{}));
}

// Against brute force, on a population built to hit both the sparse and the
// crowded (many snapshots sharing a system prompt) paths of the index.
TYPED_TEST_P(CatalogContract, FindPrefixMatchesBruteForce) {
  auto c = this->open();
  std::mt19937 rng(42);
  std::vector<int32_t> system_prompt = iota_tokens(90, 1000);
  std::vector<std::vector<int32_t>> convs;  // a few long conversations to branch from
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> t = system_prompt;
    for (int k = 0; k < 400; ++k) t.push_back(static_cast<int32_t>(rng() % 50));
    convs.push_back(t);
  }
  std::vector<std::pair<int64_t, std::vector<int32_t>>> all;
  ASSERT_TRUE(c->add_snapshot(record("warm"), {}).ok());
  for (int i = 0; i < 400; ++i) {
    const auto& conv = convs[rng() % convs.size()];
    size_t n = 1 + rng() % conv.size();
    std::vector<int32_t> t(conv.begin(), conv.begin() + static_cast<long>(n));
    if (rng() % 3 == 0 && n > 95) t[90 + rng() % (n - 90)] = -7;  // diverge somewhere after the prompt
    if (i % 50 == 0) t = system_prompt;  // duplicates of exactly the prompt
    SnapshotRecord r = record(std::nullopt, t);
    auto info = c->add_snapshot(r, {});
    ASSERT_TRUE(info.ok());
    all.emplace_back(info->id, t);
  }
  for (int q = 0; q < 60; ++q) {
    std::vector<int32_t> query = convs[rng() % convs.size()];
    query.resize(1 + rng() % query.size());
    if (q % 7 == 0) query.push_back(3);
    std::vector<std::pair<int64_t, int64_t>> want;  // (-n, -id) sorts longest, newest first
    for (const auto& [id, t] : all) {
      if (!t.empty() && t.size() <= query.size() && std::equal(t.begin(), t.end(), query.begin())) {
        want.emplace_back(-static_cast<int64_t>(t.size()), -id);
      }
    }
    std::sort(want.begin(), want.end());
    std::vector<int64_t> want_ids;
    for (auto& w : want) want_ids.push_back(-w.second);
    EXPECT_EQ(ids_of(c->find_prefix(query)), want_ids) << "query of " << query.size() << " tokens";
  }
}

// ---------------------------------------------------------------- concurrency

// N processes each add M snapshots that share chunks, at once: nothing is lost.
TYPED_TEST_P(CatalogContract, ConcurrentWriterProcessesLoseNothing) {
  { ASSERT_TRUE(this->open()); }
  constexpr int kProcs = 4, kEach = 25;
  run_in_processes(kProcs, [&](int p) {
    auto c = this->b_.open();
    if (!c.ok()) return 2;
    for (int i = 0; i < kEach; ++i) {
      SnapshotRecord r = record("p" + std::to_string(p) + "-" + std::to_string(i), iota_tokens(50 + i));
      std::vector<ChunkUse> chunks = {use("common"), use("ring" + std::to_string(i % 5)),
                                      use("own" + std::to_string(p) + "-" + std::to_string(i))};
      if (!(*c)->add_snapshot(r, chunks).ok()) return 3;
    }
    return 0;
  });
  auto c = this->open();
  EXPECT_EQ(c->list()->size(), static_cast<size_t>(kProcs * kEach));
  auto rc = this->refcounts();
  EXPECT_EQ(rc[chunk("common").hex()], kProcs * kEach);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(rc[chunk("ring" + std::to_string(r)).hex()], kProcs * kEach / 5);
  EXPECT_EQ(rc.size(), 1u + 5u + kProcs * kEach);
  this->expect_consistent(*c);
}

// Threads with their own connections add and remove at once; the final
// refcounts are exactly those of the survivors.
TYPED_TEST_P(CatalogContract, ConcurrentAddsAndRemovesKeepRefcountsExact) {
  { ASSERT_TRUE(this->open()); }
  constexpr int kThreads = 4, kEach = 30;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&] {
      auto c = this->b_.open();
      if (!c.ok()) {
        ++failures;
        return;
      }
      for (int i = 0; i < kEach; ++i) {
        auto info = (*c)->add_snapshot(record(std::nullopt, iota_tokens(10 + i)),
                                       {use("common"), use("ring" + std::to_string(i % 3))});
        if (!info.ok()) ++failures;
        if (info.ok() && i % 2 == 1 && !(*c)->remove_snapshot(info->id).ok()) ++failures;
      }
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
  auto c = this->open();
  size_t survivors = c->list()->size();
  EXPECT_EQ(survivors, static_cast<size_t>(kThreads * kEach / 2));
  EXPECT_EQ(this->refcounts()[chunk("common").hex()], static_cast<int64_t>(survivors));
  this->expect_consistent(*c);
}


// ---------------------------------------------------------------- eviction marks and victims

// A snapshot created at second `sec` of a fixed day, with its own chunk `own` (400 bytes stored) and `shared` ones.
SnapshotRecord aged(const std::string& name, int sec) {
  SnapshotRecord r = record(name);
  char buf[40];
  std::snprintf(buf, sizeof buf, "2026-01-01T00:00:%02d.000Z", sec);
  r.info.created = buf;
  return r;
}

std::vector<std::string> victim_names(const EvictionPlan& p) {
  std::vector<std::string> v;
  for (const auto& x : p.victims) v.push_back(x.info.name.value_or("?"));
  return v;
}

template <class Cat>
EvictionPlan plan(Cat& c, std::optional<uint64_t> cap, std::optional<std::string> tenant = {},
                  std::string now = "2026-01-02T00:00:00.000Z") {
  auto p = plan_eviction(c, EvictionRequest{cap, std::move(tenant), std::move(now), std::nullopt});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : EvictionPlan{};
}

TYPED_TEST_P(CatalogContract, ACatalogBeforeCapsGainsTheEvictionColumns) {
  int64_t id = 0;
  {
    auto c = this->open();
    id = this->add(*c, record("before-caps"), {use("x")});
  }
  // Make it what kvsnap before caps wrote: no eviction (nor encryption) columns, that version.
  this->sql("DROP INDEX snapshots_expires; "
            "ALTER TABLE snapshots DROP COLUMN pinned; ALTER TABLE snapshots DROP COLUMN expires_at; "
            "ALTER TABLE snapshots DROP COLUMN last_restored; ALTER TABLE snapshots DROP COLUMN tenant; "
            "ALTER TABLE snapshots DROP COLUMN master_key_id; ALTER TABLE snapshots DROP COLUMN tenant_key_id;");
  this->b_.set_schema_version(TypeParam::kSchemaVersion - 3);
  auto c = this->open();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->schema_version(), TypeParam::kSchemaVersion);
  auto i = c->get_info(id);
  ASSERT_TRUE(i.ok()) << i.status().ToString();
  EXPECT_FALSE(i->pinned);
  EXPECT_FALSE(i->expires_at);
  EXPECT_FALSE(i->last_restored);
  EXPECT_TRUE(c->set_pinned(id, true).ok());
  this->expect_consistent(*c);
}

TYPED_TEST_P(CatalogContract, ACatalogBeforeEncryptionGainsItsColumns) {
  int64_t id = 0;
  {
    auto c = this->open();
    id = this->add(*c, record("before-encryption"), {use("x")});
  }
  this->sql("DROP INDEX snapshots_expires; "
            "ALTER TABLE snapshots DROP COLUMN tenant; ALTER TABLE snapshots DROP COLUMN master_key_id; "
            "ALTER TABLE snapshots DROP COLUMN tenant_key_id;");
  this->b_.set_schema_version(TypeParam::kSchemaVersion - 2);
  auto c = this->open();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->schema_version(), TypeParam::kSchemaVersion);
  auto i = c->get_info(id);
  ASSERT_TRUE(i.ok()) << i.status().ToString();
  EXPECT_FALSE(i->tenant);
  EXPECT_EQ(*c->get_meta("encryption"), std::nullopt);
  this->expect_consistent(*c);
}

// gc's expiry query walks the snapshots_expires index in its order: no scan of every snapshot
// row, no sort (the plan's words for a sort: SQLite "TEMP B-TREE", PostgreSQL "Sort").
void expect_indexed_expiry(const std::string& plan) {
  EXPECT_NE(plan.find("snapshots_expires"), std::string::npos) << plan;
  EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos) << plan;
  EXPECT_EQ(plan.find("Sort"), std::string::npos) << plan;
}

TYPED_TEST_P(CatalogContract, ExpiredSnapshotsAreFoundThroughTheExpiryIndex) {
  auto c = this->open();
  ASSERT_TRUE(c);
  for (int i = 0; i < 20; ++i) this->add(*c, record("never-" + std::to_string(i)));
  expect_indexed_expiry(this->b_.explain_expired());
}

TYPED_TEST_P(CatalogContract, ACatalogBeforeTheExpiryIndexGainsIt) {
  int64_t id = 0;
  {
    auto c = this->open();
    id = this->add(*c, record("expires"), {use("x")});
    ASSERT_TRUE(c->set_expiry(id, "2026-01-01T00:00:00.000Z").ok());
  }
  this->sql("DROP INDEX snapshots_expires");
  this->b_.set_schema_version(TypeParam::kSchemaVersion - 1);
  const std::string before = this->b_.explain_expired();
  EXPECT_EQ(before.find("snapshots_expires"), std::string::npos) << "the plan check can fail: " << before;
  auto c = this->open();
  ASSERT_TRUE(c);
  EXPECT_EQ(*c->schema_version(), TypeParam::kSchemaVersion);
  expect_indexed_expiry(this->b_.explain_expired());
  auto expired = c->expired_snapshots("2026-01-02T00:00:00.000Z");
  ASSERT_TRUE(expired.ok()) << expired.status().ToString();
  EXPECT_EQ(*expired, std::vector<int64_t>{id});
  this->expect_consistent(*c);
}

// An expiry past 9999 (a 5-digit year compares below every 4-digit one as text), as kvsnap wrote it
// before add_seconds refused one, never expires: not in the expiry query, not a victim of an
// eviction, not removable as expired. An expiry of the usual form still is.
TYPED_TEST_P(CatalogContract, AnExpiryPastTheYear9999NeverExpires) {
  auto c = this->open();
  ASSERT_TRUE(c);
  const int64_t far = this->add(*c, record("far"), {use("x")});
  const int64_t soon = this->add(*c, record("soon"), {use("y")});
  ASSERT_TRUE(c->set_expiry(far, "10240-08-24T00:00:00.000Z").ok());
  ASSERT_TRUE(c->set_expiry(soon, "2026-01-01T00:00:00.000Z").ok());
  const std::string now = "2026-01-02T00:00:00.000Z";
  auto expired = c->expired_snapshots(now);
  ASSERT_TRUE(expired.ok()) << expired.status().ToString();
  EXPECT_EQ(*expired, std::vector<int64_t>{soon});
  EvictionRequest req;
  req.now = now;
  auto plan = plan_eviction(*c, req);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->victims.size(), 1u);
  EXPECT_EQ(plan->victims[0].info.id, soon);
  Catalog::RemovalCheck check;
  check.expired_as_of = now;
  EXPECT_EQ(c->remove_snapshot_if(far, check).status().code(), Code::kMismatch);
  EXPECT_TRUE(c->remove_snapshot_if(soon, check).ok());
  this->expect_consistent(*c);
}

// A stand-in for the store's sealing (store_seal.h): 40 header bytes, the tokens, a 16-byte tag.
std::vector<std::byte> fake_seal(const std::vector<int32_t>& tokens) {
  std::vector<std::byte> out(40 + tokens.size() * 4 + 16, std::byte{0x5a});
  if (!tokens.empty()) std::memcpy(out.data() + 40, tokens.data(), tokens.size() * 4);
  return out;
}

std::shared_ptr<const PrefixKeying> fake_keying(uint8_t secret) {
  auto k = std::make_shared<PrefixKeying>();
  k->secret.fill(secret);
  k->open_tokens = [](const SnapshotRecord& r) -> Result<std::vector<int32_t>> {
    std::vector<int32_t> t((r.sealed_tokens.size() - 56) / 4);
    if (!t.empty()) std::memcpy(t.data(), r.sealed_tokens.data() + 40, t.size() * 4);
    return t;
  };
  return k;
}

SnapshotRecord sealed_record(const std::string& name, const std::string& tenant, std::vector<int32_t> tokens) {
  SnapshotRecord r = record(name, tokens);
  r.info.tenant = tenant;
  r.info.master_key_id = "00112233445566aa";
  r.info.tenant_key_id = "ffeeddccbbaa9988";
  r.sealed_tokens = fake_seal(tokens);
  return r;
}

TYPED_TEST_P(CatalogContract, EncryptedRowsKeepTheirKeyIdsAndAKeyedPrefixIndex) {
  auto c = this->open();
  ASSERT_TRUE(c);
  const std::vector<int32_t> toks = iota_tokens(150);
  const int64_t plain = this->add(*c, record("plain", toks));
  EXPECT_EQ(*c->any_sealed_key_id(), std::nullopt) << "plain rows only";
  c->set_keying(fake_keying(1));
  const int64_t sealed = this->add(*c, sealed_record("sealed", "t1", toks), {use("s")});
  EXPECT_EQ(*c->any_sealed_key_id(), std::optional<std::string>("00112233445566aa"));
  c->set_keying(nullptr);
  auto unkeyed = c->add_snapshot(sealed_record("no-keying", "t1", toks), {});
  EXPECT_EQ(unkeyed.status().code(), Code::kInvalidArgument) << "an encrypted row needs its keyed index";

  auto rec = c->get(sealed);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->info.tenant, "t1");
  EXPECT_EQ(rec->info.master_key_id, "00112233445566aa");
  EXPECT_EQ(rec->info.tenant_key_id, "ffeeddccbbaa9988");
  EXPECT_EQ(rec->info.n_tokens, 150);
  EXPECT_TRUE(rec->tokens.empty()) << "an encrypted row's tokens are only sealed";
  EXPECT_EQ(rec->sealed_tokens, fake_seal(toks));
  EXPECT_FALSE(c->get_info(plain)->tenant);

  // the keyed index finds only the key's rows; plain hashes only plain rows
  EXPECT_EQ(ids_of(c->find_prefix(toks)), (std::vector<int64_t>{plain}));
  c->set_keying(fake_keying(1));
  EXPECT_EQ(ids_of(c->find_prefix(toks)), (std::vector<int64_t>{sealed}));
  EXPECT_EQ(ids_of(c->find_prefix(iota_tokens(149))), (std::vector<int64_t>{}));
  EXPECT_EQ(ids_of(c->find_prefix(toks, "fp-other")), (std::vector<int64_t>{}));
  c->set_keying(fake_keying(2));
  EXPECT_EQ(ids_of(c->find_prefix(toks)), (std::vector<int64_t>{})) << "another secret: another tenant";
  c->set_keying(nullptr);

  EXPECT_EQ(ids_of(c->list({.tenant = "t1"})), (std::vector<int64_t>{sealed, plain}));
  EXPECT_EQ(ids_of(c->list({.tenant = "t2"})), (std::vector<int64_t>{plain}));
  this->expect_consistent(*c);

  EXPECT_EQ(*c->get_meta("encryption"), std::nullopt);
  EXPECT_EQ(*c->init_meta("encryption", "00112233445566aa"), "00112233445566aa");
  EXPECT_EQ(*c->init_meta("encryption", "9999999999999999"), "00112233445566aa") << "the first writer's value stays";
  auto other = this->open();
  EXPECT_EQ(*other->get_meta("encryption"), std::optional<std::string>("00112233445566aa"));
}

TYPED_TEST_P(CatalogContract, EvictionMarksRoundTrip) {
  auto c = this->open();
  SnapshotRecord r = aged("marked", 1);
  r.info.pinned = true;
  r.info.expires_at = "2026-02-01T00:00:00.000Z";
  int64_t id = this->add(*c, r, {use("m")});
  auto i = c->get_info(id);
  ASSERT_TRUE(i.ok()) << i.status().ToString();
  EXPECT_TRUE(i->pinned);
  EXPECT_EQ(i->expires_at, "2026-02-01T00:00:00.000Z");
  EXPECT_FALSE(i->last_restored);

  ASSERT_TRUE(c->mark_restored(id, "2026-01-05T00:00:00.000Z").ok());
  ASSERT_TRUE(c->set_pinned(id, false).ok());
  ASSERT_TRUE(c->set_expiry(id, std::nullopt).ok());
  auto l = c->list({});
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_FALSE((*l)[0].pinned);
  EXPECT_FALSE((*l)[0].expires_at);
  EXPECT_EQ((*l)[0].last_restored, "2026-01-05T00:00:00.000Z");

  EXPECT_EQ(c->set_pinned(id + 100, true).code(), Code::kNotFound);
  EXPECT_EQ(c->mark_restored(id + 100, "2026-01-05T00:00:00.000Z").code(), Code::kNotFound);
  EXPECT_EQ(c->set_expiry(id + 100, std::nullopt).code(), Code::kNotFound);
}

TYPED_TEST_P(CatalogContract, EvictionKeepsPinsWhateverTheCap) {
  auto c = this->open();
  SnapshotRecord pinned = aged("pinned", 1);
  pinned.info.pinned = true;
  this->add(*c, pinned, {use("p")});
  this->add(*c, aged("old", 2), {use("o")});
  this->add(*c, aged("new", 3), {use("n")});
  EvictionPlan p = plan(*c, 0);
  EXPECT_EQ(victim_names(p), (std::vector<std::string>{"old", "new"}));
  EXPECT_EQ(p.bytes_before, 1200u);
  EXPECT_EQ(p.bytes_after, 400u);
  EXPECT_EQ(p.freed_bytes, 800u);
  EXPECT_FALSE(p.cap_met);
  EXPECT_TRUE(plan(*c, 400).cap_met);
  EXPECT_EQ(victim_names(plan(*c, 400)), (std::vector<std::string>{"old", "new"}));
  EXPECT_TRUE(plan(*c, 1200).victims.empty());
}

// A review's finding: Store::evict read the victim's pin, then removed it in another transaction,
// so a pin (or a later expiry) another host committed in between was not seen: a pinned snapshot was
// evicted. The removal checks them in its own transaction.
TYPED_TEST_P(CatalogContract, AnEvictionsRemovalKeepsAVictimPinnedOrExtendedSinceThePlan) {
  auto c = this->open();
  const int64_t a = this->add(*c, aged("a", 1), {use("a")});
  const int64_t b = this->add(*c, aged("b", 2), {use("b")});
  Catalog::RemovalCheck unpinned;
  unpinned.unpinned = true;
  ASSERT_TRUE(c->set_pinned(a, true).ok());  // after the plan chose it
  auto kept = c->remove_snapshot_if(a, unpinned);
  EXPECT_EQ(kept.status().code(), Code::kMismatch) << kept.status().ToString();
  EXPECT_TRUE(c->get_info(a).ok()) << "a pinned victim was removed";
  this->expect_consistent(*c);
  // Chosen as expired at `now`, its expiry since moved past it: kept; still expired: removed.
  const std::string now = "2026-06-01T00:00:00Z";
  Catalog::RemovalCheck expired = unpinned;
  expired.expired_as_of = now;
  ASSERT_TRUE(c->set_expiry(b, std::string("2026-07-01T00:00:00Z")).ok());
  EXPECT_EQ(c->remove_snapshot_if(b, expired).status().code(), Code::kMismatch);
  ASSERT_TRUE(c->set_expiry(b, std::nullopt).ok());
  EXPECT_EQ(c->remove_snapshot_if(b, expired).status().code(), Code::kMismatch);
  ASSERT_TRUE(c->set_expiry(b, std::string("2026-05-01T00:00:00Z")).ok());
  auto gone = c->remove_snapshot_if(b, expired);
  ASSERT_TRUE(gone.ok()) << gone.status().ToString();
  EXPECT_EQ(*gone, std::vector<ChunkHash>{chunk("b")});
  EXPECT_EQ(c->remove_snapshot_if(b, expired).status().code(), Code::kNotFound);
  ASSERT_TRUE(c->set_pinned(a, false).ok());
  EXPECT_TRUE(c->remove_snapshot_if(a, unpinned).ok());
  this->expect_consistent(*c);
}

// A review's finding: a snapshot chosen as least recently restored, then restored (by another
// process or host) before its removal, was still evicted, though it was then the most recently
// used. The removal checks its last restore in its own transaction.
TYPED_TEST_P(CatalogContract, AnEvictionsRemovalKeepsAVictimRestoredSinceThePlan) {
  auto c = this->open();
  const int64_t never = this->add(*c, aged("never", 1), {use("n")});
  const int64_t once = this->add(*c, aged("once", 2), {use("o")});
  ASSERT_TRUE(c->mark_restored(once, "2026-01-03T00:00:00.000Z").ok());
  auto plan = plan_eviction(*c, EvictionRequest{0, std::nullopt, "2026-01-04T00:00:00.000Z", std::nullopt});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(victim_names(*plan), (std::vector<std::string>{"never", "once"}));
  auto check_of = [](const EvictionVictim& v) {
    Catalog::RemovalCheck check;
    check.unpinned = true;
    check.unrestored_since_plan = true;
    check.last_restored = v.info.last_restored;
    return check;
  };
  ASSERT_TRUE(c->mark_restored(never, "2026-01-04T00:00:01.000Z").ok());  // after the plan read it
  ASSERT_TRUE(c->mark_restored(once, "2026-01-04T00:00:02.000Z").ok());
  for (const EvictionVictim& v : plan->victims) {
    auto kept = c->remove_snapshot_if(v.info.id, check_of(v));
    EXPECT_EQ(kept.status().code(), Code::kMismatch) << v.info.id << ": " << kept.status().ToString();
    EXPECT_TRUE(c->get_info(v.info.id).ok()) << "a victim restored since the plan was removed: " << v.info.id;
  }
  // Not restored again since a new plan: removed.
  auto again = plan_eviction(*c, EvictionRequest{0, std::nullopt, "2026-01-05T00:00:00.000Z", std::nullopt});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->victims.size(), 2u);
  for (const EvictionVictim& v : again->victims) EXPECT_TRUE(c->remove_snapshot_if(v.info.id, check_of(v)).ok());
  this->expect_consistent(*c);
}

// A review's finding: two saves under a cap, committed at once, each evicted the other's new
// snapshot (each plan protected only its own): both exited 0 and the store was empty. A save's plan
// leaves the snapshots saved after its own, unless expired.
TYPED_TEST_P(CatalogContract, ASavesEvictionLeavesTheSnapshotsSavedAfterIt) {
  auto c = this->open();
  const int64_t old = this->add(*c, aged("old", 1), {use("o")});
  const int64_t first = this->add(*c, aged("first", 2), {use("f")});
  const int64_t second = this->add(*c, aged("second", 3), {use("s")});
  auto planned = [&](int64_t keep) {
    auto p = plan_eviction(*c, EvictionRequest{0, std::nullopt, "2026-01-02T00:00:00.000Z", keep});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : EvictionPlan{};
  };
  EvictionPlan p = planned(first);  // the first save's plan, read after the second committed
  EXPECT_EQ(victim_names(p), (std::vector<std::string>{"old"}));
  EXPECT_FALSE(p.cap_met);
  EXPECT_EQ(victim_names(planned(second)), (std::vector<std::string>{"old", "first"}));
  // An expired later snapshot still goes.
  ASSERT_TRUE(c->set_expiry(second, std::string("2026-01-01T12:00:00.000Z")).ok());
  EXPECT_EQ(victim_names(planned(first)), (std::vector<std::string>{"second", "old"}));
  (void)old;
}

TYPED_TEST_P(CatalogContract, EvictionIsLeastRecentlyRestoredFirst) {
  auto c = this->open();
  int64_t a = this->add(*c, aged("a", 1), {use("a")});
  this->add(*c, aged("b", 2), {use("b")});
  this->add(*c, aged("c", 3), {use("c")});
  // One must go: never restored, the oldest created.
  EXPECT_EQ(victim_names(plan(*c, 800)), (std::vector<std::string>{"a"}));
  // A restore makes "a" the most recently used.
  ASSERT_TRUE(c->mark_restored(a, "2026-01-01T00:00:09.000Z").ok());
  EXPECT_EQ(victim_names(plan(*c, 800)), (std::vector<std::string>{"b"}));
  EXPECT_EQ(victim_names(plan(*c, 400)), (std::vector<std::string>{"b", "c"}));
}

// What an eviction without a cap asks first: expired, unpinned, oldest expiry first;
// with none, the plan is empty and its bytes are the store's.
TYPED_TEST_P(CatalogContract, ExpiredSnapshotsAreFoundFromTheSnapshotRows) {
  auto c = this->open();
  SnapshotRecord a = aged("a", 1), b = aged("b", 2), p = aged("p", 3);
  a.info.expires_at = "2026-01-02T00:00:00.000Z";
  b.info.expires_at = "2026-01-01T00:00:00.000Z";
  p.info.expires_at = "2026-01-01T00:00:00.000Z";
  p.info.pinned = true;
  int64_t ia = this->add(*c, a, {use("a")});
  int64_t ib = this->add(*c, b, {use("b"), use("shared")});
  this->add(*c, p, {use("p"), use("shared")});
  this->add(*c, aged("never", 4), {use("n")});
  auto e = c->expired_snapshots("2026-01-02T00:00:00.000Z");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(*e, (std::vector<int64_t>{ib, ia})) << "at the instant of expiry counts; pinned never";
  EXPECT_EQ(*c->expired_snapshots("2026-01-01T12:00:00.000Z"), std::vector<int64_t>{ib});
  EXPECT_TRUE(c->expired_snapshots("2025-12-31T00:00:00.000Z")->empty());
  EvictionPlan none = plan(*c, std::nullopt, {}, "2025-12-31T00:00:00.000Z");
  EXPECT_TRUE(none.victims.empty());
  EXPECT_EQ(none.bytes_before, 5u * 400);
  EXPECT_EQ(none.bytes_after, 5u * 400);
  EXPECT_TRUE(none.cap_met);
  // Kept (a save's new snapshot) counts as not expired.
  auto kept = plan_eviction(*c, EvictionRequest{std::nullopt, std::nullopt, "2026-01-01T12:00:00.000Z", ib});
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->victims.empty());
  EXPECT_EQ(victim_names(plan(*c, std::nullopt)), (std::vector<std::string>{"b", "a"}));
}

TYPED_TEST_P(CatalogContract, ExpiredSnapshotsGoFirstEvenUnderTheCap) {
  auto c = this->open();
  SnapshotRecord soon = aged("soon", 5), later = aged("later", 6), pinned = aged("pinned-expired", 7);
  soon.info.expires_at = "2026-01-01T12:00:00.000Z";
  later.info.expires_at = "2026-01-03T00:00:00.000Z";
  pinned.info.expires_at = "2026-01-01T00:00:00.000Z";
  pinned.info.pinned = true;
  this->add(*c, aged("oldest", 1), {use("o")});
  this->add(*c, soon, {use("s")});
  this->add(*c, later, {use("l")});
  this->add(*c, pinned, {use("p")});
  // No cap: only the expired one (pinned wins over expiry).
  EXPECT_EQ(victim_names(plan(*c, std::nullopt)), (std::vector<std::string>{"soon"}));
  // A cap: the expired one first, then the least recently used.
  EXPECT_EQ(victim_names(plan(*c, 800)), (std::vector<std::string>{"soon", "oldest"}));
  EXPECT_TRUE(plan(*c, 800).victims[0].expired);
  EXPECT_FALSE(plan(*c, 800).victims[1].expired);
  // A day later "later" has expired too (the clock is the caller's).
  EXPECT_EQ(victim_names(plan(*c, std::nullopt, {}, "2026-01-04T00:00:00.000Z")),
            (std::vector<std::string>{"soon", "later"}));
}

TYPED_TEST_P(CatalogContract, EvictionCountsSharedChunksOnce) {
  auto c = this->open();
  // "base" (1000 stored) is shared by the two oldest; each has a 400-byte chunk of its own.
  this->add(*c, aged("one", 1), {use("base", 5000, 1000), use("own1")});
  this->add(*c, aged("two", 2), {use("base", 5000, 1000), use("own2")});
  this->add(*c, aged("three", 3), {use("own3")});
  // 1000 + 3 * 400 after dedup.
  EvictionPlan p = plan(*c, 1800);
  EXPECT_EQ(p.bytes_before, 2200u);
  // "one" frees only its own 400 (base is still used by "two"): that is enough.
  EXPECT_EQ(victim_names(p), (std::vector<std::string>{"one"}));
  EXPECT_EQ(p.victims[0].freed_bytes, 400u);
  EXPECT_EQ(p.bytes_after, 1800u);
  // Under 1800 "two" must go as well, and then base is freed with it.
  p = plan(*c, 1799);
  EXPECT_EQ(victim_names(p), (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(p.victims[1].freed_bytes, 1400u);
  EXPECT_EQ(p.bytes_after, 400u);
  EXPECT_EQ(p.freed_bytes, 1800u);
  // Removing the first victim keeps the shared chunk.
  ASSERT_TRUE(c->remove_snapshot(p.victims[0].info.id).ok());
  EXPECT_EQ(this->refcounts()[chunk("base").hex()], 1);
  this->expect_consistent(*c);
}

TYPED_TEST_P(CatalogContract, TenantCapEvictsOnlyThatTenant) {
  auto c = this->open();
  auto tenant = [](const std::string& name, int sec, const std::string& t) {
    SnapshotRecord r = aged(name, sec);
    r.info.tags[kTenantTag] = t;
    return r;
  };
  this->add(*c, tenant("ana-1", 1, "ana"), {use("shared", 1000, 1000), use("a1")});
  this->add(*c, tenant("bob-1", 2, "bob"), {use("shared", 1000, 1000), use("b1")});
  this->add(*c, tenant("ana-2", 3, "ana"), {use("a2")});
  this->add(*c, aged("untagged", 0), {use("u")});
  EvictionPlan p = plan(*c, 0, "ana");
  EXPECT_EQ(victim_names(p), (std::vector<std::string>{"ana-1", "ana-2"}));
  // Ana is charged the shared chunk; evicting her snapshots frees only her own (bob still uses it).
  EXPECT_EQ(p.bytes_before, 1800u);
  EXPECT_EQ(p.bytes_after, 0u);
  EXPECT_EQ(p.freed_bytes, 800u);
  EXPECT_EQ(victim_names(plan(*c, 0, "bob")), (std::vector<std::string>{"bob-1"}));
  EXPECT_TRUE(plan(*c, 0, "nobody").victims.empty());
}

REGISTER_TYPED_TEST_SUITE_P(CatalogContract, FindChunksAnswersAsFindChunkInOrder, ACatalogBeforeCapsGainsTheEvictionColumns, EvictionMarksRoundTrip, EvictionKeepsPinsWhateverTheCap, AnEvictionsRemovalKeepsAVictimPinnedOrExtendedSinceThePlan, AnEvictionsRemovalKeepsAVictimRestoredSinceThePlan, ASavesEvictionLeavesTheSnapshotsSavedAfterIt, EvictionIsLeastRecentlyRestoredFirst, ExpiredSnapshotsGoFirstEvenUnderTheCap, ExpiredSnapshotsAreFoundFromTheSnapshotRows, EvictionCountsSharedChunksOnce, TenantCapEvictsOnlyThatTenant, NewerSchemaIsRefusedWithAClearMessage, ConcurrentFirstOpensMigrateOnce, AddThenGetRoundTripsEveryField, EmptyManifestAndNoTokensAreFine, TakenNameIsRefusedAndChangesNothing, BadNamesParentsAndUuids, ParentBecomesNullWhenParentIsRemoved, RefcountsFollowAddsAndRemovesOfSharingSnapshots, IntegrityCheckReportsBrokenRefcounts, ResolveByNameIdUuidAndPrefix, ListFiltersAndOrdersNewestFirst, FindPrefixIsExact, FindPrefixVerifiesTokensNotJustHashes, FindPrefixMatchesBruteForce, ConcurrentWriterProcessesLoseNothing, ConcurrentAddsAndRemovesKeepRefcountsExact, ACatalogBeforeEncryptionGainsItsColumns, EncryptedRowsKeepTheirKeyIdsAndAKeyedPrefixIndex, ExpiredSnapshotsAreFoundThroughTheExpiryIndex, ACatalogBeforeTheExpiryIndexGainsIt, AnExpiryPastTheYear9999NeverExpires, IdsAreNeverGivenTwice);

// What a save does (format/ will own the real one): blobs first, synced, then
// the catalog row; the gc lock is held throughout.
Status save(BlobStore& blobs, Catalog& cat, SnapshotRecord rec, const std::vector<std::string>& raw_chunks) {
  KV_ASSIGN_OR_RETURN(auto batch, blobs.begin_write());
  std::vector<ChunkUse> uses;
  for (const std::string& raw : raw_chunks) {
    ChunkHash h = chunk(raw);
    std::string stored = "z:" + raw;
    KV_ASSIGN_OR_RETURN(PutOutcome o, batch->put(h, bytes_of(stored)));
    (void)o;
    uses.push_back(ChunkUse{h, raw.size(), stored.size()});
  }
  KV_RETURN_IF_ERROR(batch->commit());
  return cat.add_snapshot(std::move(rec), uses).status();
}

// ---------------------------------------------------------------- gc

// collect_garbage over the backend's catalog, local blobs and the backend's gc locks.
template <class B>
class CatalogGc : public CatalogContract<B> {
 protected:
  void SetUp() override {
    CatalogContract<B>::SetUp();
    if (this->IsSkipped()) return;
    auto blobs = LocalBlobStore::open(posix_io(), this->b_.blob_root(), this->b_.gc_locks());
    ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
    blobs_ = std::move(blobs).value();
    cat_ = this->open();
  }
  std::string root() const { return this->b_.blob_root(); }
  // One pack holding a blob "z:RAW" for each of `raws`, committed; the uses a snapshot of them records.
  Result<std::vector<ChunkUse>> write_pack(std::initializer_list<const char*> raws) {
    KV_ASSIGN_OR_RETURN(auto batch, blobs_->begin_write());
    std::vector<ChunkUse> uses;
    for (const char* raw : raws) {
      const std::string stored = std::string("z:") + raw;
      KV_ASSIGN_OR_RETURN(auto at, batch->append(chunk(raw), bytes_of(stored)));
      uses.push_back(ChunkUse{chunk(raw), 2, stored.size(), at.pack, at.offset});
    }
    KV_RETURN_IF_ERROR(batch->commit());
    return uses;
  }
  std::unique_ptr<BlobStore> blobs_;
  std::unique_ptr<typename B::Cat> cat_;
};

TYPED_TEST_SUITE_P(CatalogGc);

TYPED_TEST_P(CatalogGc, OrphansOfACrashedSaveAreCollected) {
  ASSERT_TRUE(save(*this->blobs_, *this->cat_, record("kept"), {"k1", "k2"}).ok());
  {
    // A save that dies between its blobs and its catalog commit.
    auto batch = std::move(this->blobs_->begin_write()).value();
    ASSERT_TRUE(batch->put(chunk("o1"), bytes_of("z:o1")).ok());
    ASSERT_TRUE(batch->put(chunk("k1"), bytes_of("z:k1")).ok());
  }
  std::ofstream(this->root() + "/tmp/half.kvsnap-tmp-1-1") << "half";
  auto cand = this->cat_->gc_candidates(*this->blobs_->list());
  ASSERT_TRUE(cand.ok());
  EXPECT_EQ(cand->orphans, std::vector<ChunkHash>{chunk("o1")});
  auto gc = collect_garbage(*this->cat_, *this->blobs_);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_FALSE(gc->skipped_busy);
  EXPECT_EQ(gc->orphans_deleted, 1u);
  EXPECT_EQ(gc->temporaries_deleted, 1u);
  EXPECT_FALSE(*this->blobs_->contains(chunk("o1")));
  EXPECT_TRUE(*this->blobs_->contains(chunk("k1")));
  EXPECT_TRUE(*this->blobs_->contains(chunk("k2")));
}

// The race the gc lock exists for: a save has written blobs (new ones, and one
// that was unreferenced) but not committed yet. gc must not take them.
TYPED_TEST_P(CatalogGc, GcNeverDeletesBlobsOfASaveInProgress) {
  ASSERT_TRUE(save(*this->blobs_, *this->cat_, record("old"), {"revived"}).ok());
  ASSERT_TRUE(this->cat_->remove_snapshot(*this->cat_->resolve("old")).ok());  // "revived": refcount 0, blob still there

  auto batch = std::move(this->blobs_->begin_write()).value();
  ASSERT_TRUE(batch->put(chunk("fresh"), bytes_of("z:fresh")).ok());
  EXPECT_EQ(*batch->put(chunk("revived"), bytes_of("z:revived")), PutOutcome::kExisted);
  ASSERT_TRUE(batch->commit().ok());

  auto gc = collect_garbage(*this->cat_, *this->blobs_);
  ASSERT_TRUE(gc.ok());
  EXPECT_TRUE(gc->skipped_busy);
  EXPECT_TRUE(*this->blobs_->contains(chunk("fresh")));
  EXPECT_TRUE(*this->blobs_->contains(chunk("revived")));

  // A gc that waits runs as soon as the save has committed and let go.
  auto waiting = std::async(std::launch::async, [&] {
    auto c2 = this->b_.open();
    return collect_garbage(**c2, *this->blobs_, GcOptions{.wait = true});
  });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(150)), std::future_status::timeout);
  ASSERT_TRUE(this->cat_->add_snapshot(record("new"), {ChunkUse{chunk("fresh"), 5, 7}, ChunkUse{chunk("revived"), 7, 9}}).ok());
  batch.reset();
  auto done = waiting.get();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_FALSE(done->skipped_busy);
  EXPECT_EQ(done->orphans_deleted, 0u);
  EXPECT_EQ(done->unreferenced_deleted, 0u);
  EXPECT_TRUE(*this->blobs_->contains(chunk("fresh")));
  EXPECT_TRUE(*this->blobs_->contains(chunk("revived")));
  this->expect_consistent(*this->cat_);
}

TYPED_TEST_P(CatalogGc, RemovedSnapshotsChunksGoOnTheCheapPass) {
  ASSERT_TRUE(save(*this->blobs_, *this->cat_, record("a"), {"s", "only-a"}).ok());
  ASSERT_TRUE(save(*this->blobs_, *this->cat_, record("b"), {"s", "only-b"}).ok());
  auto freed = this->cat_->remove_snapshot(*this->cat_->resolve("a"));
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, std::vector<ChunkHash>{chunk("only-a")});
  auto gc = collect_garbage(*this->cat_, *this->blobs_, GcOptions{.scan_orphans = false});
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->unreferenced_deleted, 1u);
  EXPECT_FALSE(*this->blobs_->contains(chunk("only-a")));
  EXPECT_TRUE(*this->blobs_->contains(chunk("s")));
  EXPECT_EQ(this->cat_->stats()->unreferenced_chunks, 0);
  this->expect_consistent(*this->cat_);
}

// A packed chunk's blob goes with its pack: gc deletes the pack, never a loose
// blob per chunk (one wasted request each in an object store).
TYPED_TEST_P(CatalogGc, PackedChunksGoWithTheirPackAlone) {
  auto written = this->write_pack({"p1", "p2", "p3"});
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  const std::vector<ChunkUse> uses = *written;
  ASSERT_TRUE(this->cat_->add_snapshot(record("packed"), uses).ok());
  ASSERT_EQ(*this->blobs_->list_packs(), std::vector<std::string>{uses[0].pack});
  ASSERT_TRUE(this->cat_->remove_snapshot(*this->cat_->resolve("packed")).ok());
  uint64_t planned = 0;
  auto gc = collect_garbage(*this->cat_, *this->blobs_, GcOptions{.scan_orphans = false, .progress = [&](const GcProgress& p) {
                              planned = p.files_total;
                              return Status::OK();
                            }});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->unreferenced_deleted, 3u);
  EXPECT_EQ(gc->packs_deleted, 1u);
  EXPECT_EQ(planned, 1u);  // the pack, nothing per chunk
  EXPECT_TRUE(this->blobs_->list_packs()->empty());
  EXPECT_EQ(this->cat_->stats()->unreferenced_chunks, 0);
  this->expect_consistent(*this->cat_);
}

// A pack live rows name that storage lost (deleted by hand, a bucket's lifecycle rule) is damage,
// not garbage: a full gc names it and how many chunks are in it; the cheap pass does not list packs
// against rows. The rows stay (verify names the snapshots hurt).
TYPED_TEST_P(CatalogGc, APackLiveRowsNameThatStorageLostIsReported) {
  auto written = this->write_pack({"m1", "m2"});
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  const std::vector<ChunkUse> uses = *written;
  ASSERT_TRUE(this->cat_->add_snapshot(record("lost"), uses).ok());
  auto live = this->cat_->live_packs();
  ASSERT_TRUE(live.ok()) << live.status().ToString();
  EXPECT_EQ(*live, (std::map<std::string, uint64_t>{{uses[0].pack, 2}}));
  auto whole = collect_garbage(*this->cat_, *this->blobs_);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(whole->warnings.empty()) << whole->warnings.front();
  {
    auto lock = this->blobs_->lock_for_gc(true);
    ASSERT_TRUE(lock.ok() && *lock);
    ASSERT_TRUE(this->blobs_->remove_pack(**lock, uses[0].pack).ok());
  }
  auto cheap = collect_garbage(*this->cat_, *this->blobs_, GcOptions{.scan_orphans = false});
  ASSERT_TRUE(cheap.ok()) << cheap.status().ToString();
  EXPECT_TRUE(cheap->warnings.empty());
  auto gc = collect_garbage(*this->cat_, *this->blobs_);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  ASSERT_EQ(gc->warnings.size(), 1u);
  EXPECT_NE(gc->warnings[0].find("pack " + uses[0].pack + " is missing from storage, and 2 chunks"), std::string::npos)
      << gc->warnings[0];
  EXPECT_EQ(this->cat_->stats()->chunks, 2) << "the rows stay";
  EXPECT_TRUE(this->cat_->resolve("lost").ok());
}

// A pack that a removal left mostly dead: its live blobs are copied into a new pack, their rows
// moved there, the old pack deleted; a move whose row is no longer where it says changes nothing.
TYPED_TEST_P(CatalogGc, PartlyDeadPacksAreCompactedAndTheirRowsMoved) {
  auto written = this->write_pack({"p1", "p2", "p3", "p4"});
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  const std::vector<ChunkUse> uses = *written;
  ASSERT_TRUE(this->cat_->add_snapshot(record("long"), uses).ok());
  ASSERT_TRUE(this->cat_->add_snapshot(record("short"), {uses[1]}).ok());  // shares p2 only
  const std::string old_pack = uses[0].pack;
  auto rows = this->cat_->chunks_in_pack(old_pack);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ((*rows)[i].sha256, uses[i].sha256) << "by offset";
  ASSERT_TRUE(this->cat_->remove_snapshot(*this->cat_->resolve("long")).ok());
  auto cand = this->cat_->gc_candidates({});
  ASSERT_TRUE(cand.ok());
  EXPECT_EQ(cand->packs_losing_chunks, std::vector<std::string>{old_pack});

  // 0: never compacts; the rows of p1, p3, p4 go, the pack stays for p2.
  auto kept = collect_garbage(*this->cat_, *this->blobs_, GcOptions{.scan_orphans = false, .compact_dead_percent = 0});
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->packs_compacted, 0u);
  EXPECT_EQ(*this->blobs_->list_packs(), std::vector<std::string>{old_pack});
  EXPECT_TRUE(this->cat_->gc_candidates({})->packs_losing_chunks.empty());

  // A gc that looks at every pack finds it 75% dead.
  auto gc = collect_garbage(*this->cat_, *this->blobs_);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->packs_compacted, 1u);
  EXPECT_EQ(gc->compacted_bytes_moved, 4u);
  EXPECT_EQ(gc->compacted_bytes_freed, 12u);
  EXPECT_EQ(gc->packs_deleted, 0u) << "compaction deletes the old pack itself";
  EXPECT_TRUE(gc->warnings.empty());
  auto packs = this->blobs_->list_packs();
  ASSERT_TRUE(packs.ok());
  ASSERT_EQ(packs->size(), 1u);
  EXPECT_NE(packs->front(), old_pack);
  auto moved = this->cat_->find_chunk(chunk("p2"));
  ASSERT_TRUE(moved.ok() && moved->has_value());
  EXPECT_EQ((*moved)->pack, packs->front());
  EXPECT_EQ((*moved)->pack_offset, 0u);
  EXPECT_EQ(*this->blobs_->get(chunk("p2"), (*moved)->location(), 100), bytes_of("z:p2"));
  this->expect_consistent(*this->cat_);

  auto use = this->cat_->pack_usage({packs->front(), old_pack});
  ASSERT_TRUE(use.ok()) << use.status().ToString();
  ASSERT_EQ(use->size(), 2u);
  EXPECT_EQ((*use)[0].rows, 1u);
  EXPECT_EQ((*use)[0].live_bytes, 4u);
  EXPECT_EQ((*use)[0].end, 4u);
  EXPECT_EQ((*use)[1].rows, 0u) << "no row names the old pack";

  // Two moves of which the second is from where its row no longer is: refused whole, the first
  // row stays where it was too.
  ASSERT_TRUE(this->cat_->add_snapshot(record("other"), {uses[0]}).ok());  // p1's row again, in the old pack
  auto lock = this->blobs_->lock_for_gc(true);
  ASSERT_TRUE(lock.ok() && *lock);
  std::vector<ChunkMove> half_stale = {
      {chunk("p1"), uses[0].location(), BlobLocation{"00000000000000fe", 0, uses[0].stored_size}},
      {chunk("p2"), uses[1].location(), BlobLocation{"00000000000000ff", 0, uses[1].stored_size}}};
  Status s = this->cat_->move_chunks(half_stale, (*lock)->hold());
  EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
  EXPECT_EQ((*this->cat_->find_chunk(chunk("p1")))->pack, old_pack);
  EXPECT_EQ((*this->cat_->find_chunk(chunk("p2")))->pack, packs->front());
}

REGISTER_TYPED_TEST_SUITE_P(CatalogGc, OrphansOfACrashedSaveAreCollected, GcNeverDeletesBlobsOfASaveInProgress, RemovedSnapshotsChunksGoOnTheCheapPass, PackedChunksGoWithTheirPackAlone,
                           APackLiveRowsNameThatStorageLostIsReported, PartlyDeadPacksAreCompactedAndTheirRowsMoved);

}  // namespace
}  // namespace kvsnap
