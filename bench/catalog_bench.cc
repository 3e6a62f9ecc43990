// kvsnap-catalog-bench: how fast the catalog answers with a realistic population.
// Prints figures; asserts nothing about time. See docs/store.md, "Catalog".
//
//   kvsnap-catalog-bench [--snapshots N] [--queries Q] [--dir DIR] [--keep] [--reuse]
//                        [--catalog postgresql://...]
//
// --reuse: with --dir, skip the fill when DIR already holds a catalog of N
// snapshots from an earlier --keep run (the population is deterministic).
// --catalog URL: after the SQLite catalog, the same population and queries
// against a PostgreSQL catalog (PgCatalog) in that database, which must be
// empty or (with --reuse) hold the N snapshots of an earlier run.
// tests/beds/postgres.sh start DIR PORT gives a throwaway server.
//
// Population (deterministic): N snapshots (default 100,000) cut from 3,000
// conversations of up to 8,000 tokens. 3 of 4 conversations start with one of
// three system prompts (100, 300, 480 tokens), so tens of thousands of
// snapshots share their first 100+ tokens; snapshots of one conversation are
// prefixes of each other (long shared prefixes), and 30% diverge from their
// conversation somewhere in their second half. Lengths are log-uniform in
// [500, 8000]. Each snapshot has one chunk per 256 tokens (shared where the
// tokens are), 3 model fingerprints, tags user=u0..u99 and app=chat|code.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "store/catalog.h"
#include "store/pg_catalog.h"
#include "store/pg_conn.h"

using namespace kvsnap;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
int32_t token(uint64_t stream, uint64_t pos) { return static_cast<int32_t>(mix(stream * 1000003ull + pos) % 32000); }

constexpr int kConversations = 3000;
constexpr int kMaxTokens = 8000;
const int kPromptLen[4] = {0, 100, 300, 480};

struct Spec {
  uint32_t conv;
  uint32_t n;
  uint32_t diverge;  // == n: follows its conversation throughout
  uint32_t seed;
};

// Token `pos` of a conversation (its system prompt first).
int32_t conv_token(uint32_t conv, uint32_t pos) {
  int sp = static_cast<int>(conv % 4);
  if (pos < static_cast<uint32_t>(kPromptLen[sp])) return token(1 + static_cast<uint64_t>(sp), pos);
  return token(100 + conv, pos);
}

std::vector<int32_t> tokens_of(const Spec& s, uint32_t extra = 0) {
  std::vector<int32_t> t(s.n + extra);
  for (uint32_t i = 0; i < t.size(); ++i) {
    t[i] = i < s.diverge ? conv_token(s.conv, i) : token(1000000 + static_cast<uint64_t>(s.seed), i);
  }
  return t;
}

ChunkHash chunk_hash(const Spec& s, uint32_t idx) {
  // A chunk covers tokens [256 idx, 256 (idx + 1)): shared with the
  // conversation when the snapshot has not diverged by its end.
  uint32_t end = std::min(256 * (idx + 1), s.n);
  std::string id = end <= s.diverge && end == 256 * (idx + 1)
                       ? "conv " + std::to_string(s.conv) + " chunk " + std::to_string(idx)
                       : "own " + std::to_string(s.seed) + " chunk " + std::to_string(idx);
  std::vector<std::byte> b(id.size());
  std::memcpy(b.data(), id.data(), id.size());
  return ChunkHash::of(b);
}

Spec make_spec(std::mt19937_64& rng, uint32_t seed) {
  Spec s;
  s.conv = static_cast<uint32_t>(rng() % kConversations);
  double u = std::uniform_real_distribution<double>(0, 1)(rng);
  s.n = static_cast<uint32_t>(std::lround(500.0 * std::pow(kMaxTokens / 500.0, u)));
  s.diverge = s.n;
  if (rng() % 10 < 3) s.diverge = s.n / 2 + static_cast<uint32_t>(rng() % (s.n / 2));
  s.seed = seed;
  return s;
}

SnapshotRecord record_of(const Spec& s, uint32_t i) {
  SnapshotRecord r;
  if (i % 10 == 0) r.info.name = "snap-" + std::to_string(i);
  r.info.model_arch = i % 3 == 2 ? "qwen2" : "llama";
  r.info.model_fingerprint = "fp-" + std::to_string(i % 3);
  r.info.k_types = i % 2 ? "q8_0" : "f16";
  r.info.v_types = r.info.k_types;
  r.info.source_format = "ggsq3";
  r.info.raw_bytes = uint64_t(s.n) * 131072;
  r.info.stored_bytes = r.info.raw_bytes / 2;
  r.info.tags = {{"user", "u" + std::to_string(i % 100)}, {"app", i % 4 ? "chat" : "code"}};
  r.manifest.assign(300, std::byte{0x5a});
  r.tokens = tokens_of(s);
  return r;
}

std::vector<ChunkUse> chunks_of(const Spec& s) {
  std::vector<ChunkUse> out;
  for (uint32_t idx = 0; 256 * idx < s.n; ++idx) {
    out.push_back(ChunkUse{chunk_hash(s, idx), 256u * 131072, 256u * 65536, "", 0});
  }
  return out;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Summary {
  double median, p99, max;
};
Summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back()};
}

void die(const Status& s) {
  std::fprintf(stderr, "kvsnap-catalog-bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

// Adds the population; prints the rate.
template <class Cat>
void fill(Cat& cat, const std::vector<Spec>& specs, const char* how) {
  const uint32_t n_snapshots = static_cast<uint32_t>(specs.size());
  auto t0 = Clock::now();
  uint64_t total_tokens = 0;
  for (uint32_t i = 0; i < n_snapshots; ++i) {
    auto r = cat.add_snapshot(record_of(specs[i], i), chunks_of(specs[i]));
    if (!r.ok()) die(r.status());
    total_tokens += specs[i].n;
    if ((i + 1) % 20000 == 0) std::fprintf(stderr, "  %u snapshots, %.1f s\n", i + 1, ms_since(t0) / 1000);
  }
  double ms = ms_since(t0);
  std::printf("fill: %u snapshots, %.0f tokens average, %.1f s: add_snapshot %.0f/s (%s)\n", n_snapshots,
              double(total_tokens) / n_snapshots, ms / 1000, n_snapshots / (ms / 1000), how);
}

// find_prefix, ls, resolve, durable adds and removes, integrity_check.
template <class Cat>
void measure(Cat& cat, const std::vector<Spec>& specs, int n_queries, const char* durable) {
  const uint32_t n_snapshots = static_cast<uint32_t>(specs.size());
  // find_prefix.
  auto run_queries = [&](const char* label, size_t limit, auto make_query) {
    std::vector<double> lat;
    size_t hits = 0, results = 0;
    std::mt19937_64 qrng(7);
    for (int q = 0; q < n_queries; ++q) {
      std::vector<int32_t> query = make_query(qrng);
      auto t0 = Clock::now();
      auto r = cat.find_prefix(query, "", limit);
      lat.push_back(ms_since(t0));
      if (!r.ok()) die(r.status());
      hits += !r->empty();
      results += r->size();
    }
    Summary s = summarize(lat);
    std::printf("find_prefix %-44s %-8s median %.3f ms  p99 %.3f ms  max %.3f ms  (%zu/%d found, %.1f results avg)\n",
                label, limit == 1 ? "limit 1" : "all", s.median, s.p99, s.max, hits, n_queries,
                double(results) / n_queries);
  };
  auto hit = [&](std::mt19937_64& r) {
    const Spec& s = specs[r() % specs.size()];
    return tokens_of(s, static_cast<uint32_t>(r() % 301));
  };
  run_queries("hit (a stored snapshot + 0..300 tokens)", SIZE_MAX, hit);
  run_queries("hit (a stored snapshot + 0..300 tokens)", 1, hit);
  run_queries("miss, shares a system prompt only", SIZE_MAX, [&](std::mt19937_64& r) {
    Spec s{static_cast<uint32_t>(1 + 4 * (r() % 700)), 0, 0, 0};  // a conversation with a prompt...
    s.n = 500 + static_cast<uint32_t>(r() % 7500);
    s.diverge = static_cast<uint32_t>(kPromptLen[s.conv % 4]);  // ...left right after it
    s.seed = 50000000u + static_cast<uint32_t>(r() % 1000000);
    return tokens_of(s);
  });
  run_queries("miss, unrelated tokens", SIZE_MAX, [&](std::mt19937_64& r) {
    Spec s{0, 500 + static_cast<uint32_t>(r() % 7500), 0, 60000000u + static_cast<uint32_t>(r() % 1000000)};
    return tokens_of(s);
  });
  auto whole_conv = [&](std::mt19937_64& r) {
    Spec s{static_cast<uint32_t>(r() % kConversations), kMaxTokens, kMaxTokens, 0};
    return tokens_of(s);
  };
  run_queries("a whole conversation (8000 tokens)", SIZE_MAX, whole_conv);
  run_queries("a whole conversation (8000 tokens)", 1, whole_conv);

  // ls.
  auto time_ls = [&](const char* label, const ListFilter& f, int reps) {
    std::vector<double> lat;
    size_t rows = 0;
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      auto r = cat.list(f);
      lat.push_back(ms_since(t0));
      if (!r.ok()) die(r.status());
      rows = r->size();
    }
    Summary s = summarize(lat);
    std::printf("ls %-40s median %8.2f ms  (%zu rows)\n", label, s.median, rows);
  };
  ListFilter all;
  time_ls("(everything)", all, 3);
  ListFilter newest;
  newest.limit = 20;
  time_ls("--limit 20", newest, 50);
  ListFilter by_tag;
  by_tag.tags = {{"user", "u42"}, {"app", "chat"}};
  time_ls("--tag user=u42 --tag app=chat", by_tag, 10);
  ListFilter by_model;
  by_model.model_fingerprint = "fp-1";
  by_model.limit = 100;
  time_ls("--model fp-1 --limit 100", by_model, 20);
  ListFilter by_name;
  by_name.name_glob = "snap-4242*";
  time_ls("'snap-4242*'", by_name, 20);

  // resolve.
  {
    std::vector<double> lat;
    for (int i = 0; i < 200; ++i) {
      std::string ref = "snap-" + std::to_string(10 * (i * 37 % (n_snapshots / 10)));
      auto t0 = Clock::now();
      auto r = cat.resolve(ref);
      lat.push_back(ms_since(t0));
      if (!r.ok()) die(r.status());
    }
    std::printf("resolve by name: median %.3f ms\n", summarize(lat).median);
  }

  // Durable adds and removes (synchronous=FULL: one fsync per commit).
  {
    const uint32_t n = std::min<uint32_t>(500, n_snapshots);
    std::vector<int64_t> ids;
    auto t0 = Clock::now();
    for (uint32_t i = 0; i < n; ++i) {
      Spec s = specs[i];
      s.seed = 90000000u + i;
      SnapshotRecord r = record_of(s, n_snapshots + i);
      r.info.name.reset();
      auto info = cat.add_snapshot(std::move(r), chunks_of(s));
      if (!info.ok()) die(info.status());
      ids.push_back(info->id);
    }
    double add_ms = ms_since(t0);
    t0 = Clock::now();
    for (int64_t id : ids) {
      auto r = cat.remove_snapshot(id);
      if (!r.ok()) die(r.status());
    }
    double rm_ms = ms_since(t0);
    std::printf("add_snapshot (%s, %u): %.0f/s (%.2f ms each); remove_snapshot %.0f/s\n", durable, n,
                n / (add_ms / 1000), add_ms / n, n / (rm_ms / 1000));
  }
  {
    auto t0 = Clock::now();
    auto problems = cat.integrity_check();
    if (!problems.ok()) die(problems.status());
    std::printf("integrity_check: %.0f ms, %zu problems\n", ms_since(t0), problems->size());
  }
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t n_snapshots = 100000;
  int n_queries = 1000;
  std::string dir, pg_url;
  bool keep = false, reuse = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--snapshots" && i + 1 < argc) n_snapshots = static_cast<uint32_t>(std::stoul(argv[++i]));
    else if (a == "--queries" && i + 1 < argc) n_queries = std::stoi(argv[++i]);
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--keep") keep = true;
    else if (a == "--reuse") reuse = keep = true;
    else if (a == "--catalog" && i + 1 < argc) pg_url = argv[++i];
    else {
      std::fprintf(stderr, "usage: kvsnap-catalog-bench [--snapshots N] [--queries Q] [--dir DIR] [--keep] [--reuse] [--catalog postgresql://...]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "kvsnap-catalog-bench-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) return 1;
    dir = tmpl;
  }
  fs::create_directories(dir);
  std::string db = dir + "/catalog.sqlite";
  std::printf("catalog: %s\n", db.c_str());

  std::mt19937_64 rng(20250101);
  std::vector<Spec> specs;
  specs.reserve(n_snapshots);
  for (uint32_t i = 0; i < n_snapshots; ++i) specs.push_back(make_spec(rng, i));

  // Fill, without fsync per commit (the durable rate is measured below).
  if (reuse && fs::exists(db)) {
    std::printf("fill: reusing %s\n", db.c_str());
  } else {
    CatalogOptions fast;
    fast.durable_commits = false;
    auto cat = Catalog::open(db, fast);
    if (!cat.ok()) die(cat.status());
    fill(**cat, specs, "synchronous=NORMAL");
  }

  auto opened = Catalog::open(db);
  if (!opened.ok()) die(opened.status());
  Catalog& cat = **opened;
  auto stats = cat.stats();
  if (!stats.ok()) die(stats.status());
  std::printf("store: %lld snapshots, %lld chunks, dedup %.2fx, catalog file %.0f MiB\n",
              static_cast<long long>(stats->snapshots), static_cast<long long>(stats->chunks), stats->dedup_ratio,
              double(fs::file_size(db)) / (1 << 20));
  measure(cat, specs, n_queries, "synchronous=FULL");
  opened.value().reset();  // close before removing the files
  if (!keep) fs::remove_all(dir);

  if (!pg_url.empty()) {
    std::printf("\n== PostgreSQL catalog: %s ==\n", redact_pg_url(pg_url).c_str());
    CatalogOptions fast;
    fast.durable_commits = false;
    auto loader = PgCatalog::open(pg_url, fast);
    if (!loader.ok()) die(loader.status());
    auto before = (*loader)->stats();
    if (!before.ok()) die(before.status());
    if (reuse && before->snapshots == static_cast<int64_t>(n_snapshots)) {
      std::printf("fill: reusing the %u snapshots in the database\n", n_snapshots);
    } else if (before->snapshots != 0) {
      die(Status::InvalidArgument("the PostgreSQL catalog holds " + std::to_string(before->snapshots) +
                                  " snapshots: give an empty database (or --reuse with --snapshots " +
                                  std::to_string(before->snapshots) + ")"));
    } else {
      fill(**loader, specs, "synchronous_commit=off");
    }
    loader.value().reset();
    auto pg = PgCatalog::open(pg_url);
    if (!pg.ok()) die(pg.status());
    auto pst = (*pg)->stats();
    if (!pst.ok()) die(pst.status());
    std::printf("store: %lld snapshots, %lld chunks, dedup %.2fx\n", static_cast<long long>(pst->snapshots),
                static_cast<long long>(pst->chunks), pst->dedup_ratio);
    measure(**pg, specs, n_queries, "synchronous_commit=on");
  }
  return 0;
}
