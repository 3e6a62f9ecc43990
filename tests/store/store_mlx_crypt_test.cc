// mlx-lm prompt caches in an encrypted store (docs/store.md, "Encryption at rest"; docs/mlx.md,
// "The snapshot store"): the same promises as llama.cpp states. Byte-identical round trips, keyed
// chunk ids (dedup within a tenant and its parent found through the keyed prefix index, none
// across tenants), the sealed manifest (MLXC, INFO with the file's metadata, tokens), the errors
// for a missing or wrong key or tenant, tampering caught, verify with and without the key, rm and
// gc, export (sealed or --decrypt) and import (as is, or sealed again), and no tensor byte or
// metadata string at rest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "format/snapshot_mlx.h"
#include "mlx/mlx_test_files.h"
#include "store/crypt_bed.h"
#include "store/store.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;
using namespace test_mlx;
using test::slurp;
using namespace crypt_bed;

Result<SaveResult> save(Store& store, const MemoryFile& f, SaveRequest req = {}) {
  KV_ASSIGN_OR_RETURN(MlxPromptCache c, read_mlx_prompt_cache(f));
  req.threads = 2;
  return store.save_mlx(f, c, req);
}

SaveRequest with(const std::string& name, std::vector<int32_t> tokens = {}) {
  SaveRequest r;
  r.name = name;
  r.tokens = std::move(tokens);
  return r;
}

std::vector<int32_t> tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t(i * 7 % 5000);
  return t;
}

Result<std::vector<std::byte>> restore(Store& store, const std::string& ref, RestoreRequest req = {}) {
  VectorSink out;
  KV_ASSIGN_OR_RETURN(RestoreResult r, store.restore(ref, req, out));
  return std::move(out.bytes);
}

void expect_restores(Store& store, const std::string& ref, const MemoryFile& f) {
  auto back = restore(store, ref);
  ASSERT_TRUE(back.ok()) << ref << ": " << back.status().ToString();
  EXPECT_TRUE(back->size() == f.size() && std::memcmp(back->data(), f.bytes().data(), f.size()) == 0) << ref;
}

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(StoreMlxCrypt, RoundTripDedupFindVerifyRmAndGcWithinATenant) {
  Bed b;
  MemoryFile short_f = kv_file(2, 4, 600, 64, "a.safetensors", "mlx-community/tiny");
  MemoryFile long_f = kv_file(2, 4, 900, 64, "b.safetensors", "mlx-community/tiny");
  auto alice = b.must_open(b.key_a, "alice");
  ASSERT_TRUE(alice);
  auto first = save(*alice, short_f, with("short", tokens(600)));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->info.tenant, "alice");
  EXPECT_EQ(first->info.master_key_id, b.key_id(b.key_a));
  EXPECT_EQ(first->info.model_arch, "mlx-lm");
  EXPECT_EQ(first->info.model_fingerprint, "mlx-lm:mlx-community/tiny");
  EXPECT_EQ(first->info.n_tokens, 600);
  EXPECT_NE(first->info.content_sha256, to_hex(sha256_of(short_f.bytes()))) << "the content hash is keyed";
  EXPECT_EQ(alice->encryption_key_id(), b.key_id(b.key_a));
  expect_restores(*alice, "short", short_f);

  // The longer conversation: its parent found through the keyed prefix index, the shared
  // 256-position blocks (2 per tensor, 4 tensors) not written again.
  auto second = save(*alice, long_f, with("long", tokens(900)));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->info.parent_id, first->info.id);
  EXPECT_EQ(second->chunks - second->chunks_new, 8u);
  expect_restores(*alice, "long", long_f);
  RestoreRequest prefix;  // restore --tokens reads the sealed snapshot's prefix: the shorter cache
  prefix.tokens = 600;
  auto cut = restore(*alice, "long", prefix);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_TRUE(cut->size() == short_f.size() && std::memcmp(cut->data(), short_f.bytes().data(), cut->size()) == 0);

  // Another tenant of the same key: no parent, no shared chunk id.
  auto bob = b.must_open(b.key_a, "bob");
  auto other = save(*bob, long_f, with("bob-long", tokens(900)));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(other->info.parent_id);
  EXPECT_EQ(other->chunks_new, other->chunks);
  expect_restores(*bob, "bob-long", long_f);

  // ls by tenant and fingerprint; find sees only the key's tenant; show's summary is sealed but opens.
  ListFilter lf;
  lf.tenant = "alice";
  lf.model_fingerprint = "mlx-lm:mlx-community/tiny";
  auto listed = alice->catalog().list(lf);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u);
  const std::vector<int32_t> query = tokens(1000);
  auto found = alice->catalog().find_prefix(query, "mlx-lm:mlx-community/tiny", 10);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0].id, second->info.id) << "longest first";
  {  // closed before the gc below, which waits for open snapshots (Store::open_snapshot)
    auto opened = alice->open_snapshot("long");
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    auto summary = mlx_summary_of((*opened)->reader().manifest());
    ASSERT_TRUE(summary);
    EXPECT_EQ(summary->classes, "KVCache x2");
    EXPECT_EQ((*opened)->reader().tokens().tokens, tokens(900));
  }

  auto v = alice->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  EXPECT_EQ(v->sealed_only, 1u) << "bob's snapshot is checked without opening it";
  {
    auto keyless = b.open("", "", /*keyless_ok=*/true);
    ASSERT_TRUE(keyless.ok()) << keyless.status().ToString();
    auto kv = (*keyless)->verify({});
    ASSERT_TRUE(kv.ok());
    EXPECT_TRUE(kv->problems.empty()) << kv->problems[0];
    EXPECT_EQ(kv->sealed_only, 3u);
    ASSERT_EQ(kv->not_checked.size(), 1u);
    EXPECT_NE(kv->not_checked[0].find("not their contents"), std::string::npos) << kv->not_checked[0];
  }

  // rm of the parent keeps the child's shared chunks; gc frees only what nobody uses.
  ASSERT_TRUE(alice->remove("short").ok());
  ASSERT_TRUE(alice->gc(true).ok());
  expect_restores(*alice, "long", long_f);
  v = alice->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
}

TEST(StoreMlxCrypt, MissingWrongKeyTenantAndTamperingAreClearErrors) {
  Bed b;
  MemoryFile f = kv_file(2, 2, 300, 64, "chat.safetensors", "tiny");
  int64_t id = 0;
  {
    auto s = b.must_open(b.key_a, "alice");
    auto saved = save(*s, f, with("chat", {1, 2, 3}));
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    id = saved->info.id;
  }
  const std::string a = b.key_id(b.key_a);
  auto none = b.open("");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);  // exit 2
  EXPECT_NE(none.status().message().find("is encrypted (key " + a + ")"), std::string::npos) << none.status().ToString();
  auto wrong = b.open(b.key_b, "alice");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Code::kMismatch);  // exit 5
  auto bob = b.must_open(b.key_a, "bob");
  auto r = restore(*bob, "chat");
  EXPECT_EQ(r.status().code(), Code::kMismatch) << r.status().ToString();
  EXPECT_NE(r.status().message().find("snapshot " + std::to_string(id) + " ('chat') is encrypted for tenant 'alice', "
                                      "not 'bob' (pass --tenant alice)"), std::string::npos) << r.status().ToString();
  {
    auto keyless = b.open("", "", /*keyless_ok=*/true);
    ASSERT_TRUE(keyless.ok());
    auto k = restore(**keyless, "chat");
    EXPECT_EQ(k.status().code(), Code::kInvalidArgument) << k.status().ToString();
    auto plain = save(**keyless, f);
    ASSERT_FALSE(plain.ok());
    EXPECT_EQ(plain.status().code(), Code::kInvalidArgument);
    EXPECT_NE(plain.status().message().find("takes no plain snapshots"), std::string::npos) << plain.status().ToString();
  }

  // A flipped byte of a sealed chunk (exit 3): restore and verify fail naming the snapshot.
  auto s = b.must_open(b.key_a, "alice");
  auto uses = s->catalog().chunks_of(id);
  ASSERT_TRUE(uses.ok());
  const ChunkUse& u = (*uses)[uses->size() / 2];
  const fs::path pack = fs::directory_iterator(b.root / "packs")->path();
  auto bytes = slurp(pack);
  bytes[u.pack_offset + kSealedHeaderBytes + 5] ^= std::byte{0x10};
  std::ofstream(pack, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
  auto t = restore(*s, "chat");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kCorruption) << t.status().ToString();
  EXPECT_NE(t.status().message().find("tampered or corrupt"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("snapshot 'chat'"), std::string::npos) << t.status().ToString();
  auto v = s->verify({"chat"});
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->problems.empty());
  bytes[u.pack_offset + kSealedHeaderBytes + 5] ^= std::byte{0x10};
  std::ofstream(pack, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
  expect_restores(*s, "chat", f);

  // A flipped byte of the sealed manifest row (MLXC, INFO and tokens are inside it).
  edit_row(b.root / "catalog.sqlite", "manifest", flip);
  auto m = restore(*s, "chat");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kCorruption) << m.status().ToString();
  EXPECT_NE(m.status().message().find("tampered or corrupt"), std::string::npos) << m.status().ToString();
}

// A KVCache file whose K/V values are random (zstd cannot shrink them, so a plain store keeps runs
// of them as they are) and whose metadata holds `secret`.
MemoryFile random_cache(int64_t rows, const std::string& secret) {
  std::mt19937 rng(5);
  std::vector<Tensor> ts;
  Meta meta;
  for (int L = 0; L < 2; ++L) {
    for (int side = 0; side < 2; ++side) {
      Tensor t{std::to_string(L) + "." + std::to_string(side), "BF16", {1, 2, rows, 64}, {}};
      t.bytes.resize(size_t(2 * rows * 64 * 2));
      for (auto& x : t.bytes) x = std::byte(rng());
      ts.push_back(std::move(t));
    }
    meta.push_back({"0." + std::to_string(L), ""});
    meta.push_back({"2." + std::to_string(L), "KVCache"});
  }
  meta.push_back({"1.model", "tiny"});
  meta.push_back({"1.chat_template", secret});
  return make_file(ts, meta, "secret.safetensors");
}

TEST(StoreMlxCrypt, NoTensorBytesMetadataOrTokensAtRestAndThePlainStoreShowsTheTestCanFail) {
  const std::string secret = "{% for m in messages %}zq-template-7f3a91c{% endfor %}";
  MemoryFile f = random_cache(300, secret);
  ASSERT_GT(f.size(), 0u) << f.name();
  std::span<const std::byte> kv(f.bytes().data() + f.size() / 2, 64);  // K/V bytes from the middle
  ASSERT_GT(std::set<std::byte>(kv.begin(), kv.end()).size(), 8u);
  const std::vector<int32_t> toks = {912345, 912346, 912347, 912348, 912349, 912350, 912351, 912352};
  std::span<const std::byte> tok_bytes = std::as_bytes(std::span(toks));
  SaveRequest req = with("s", toks);
  req.byte_shuffle = false;  // K/V bytes stay in runs, so the plain store holds them as they are

  Bed plain_bed;
  {
    auto plain = Store::open(posix_io(), StorePaths{plain_bed.root.string()});
    ASSERT_TRUE(plain.ok());
    ASSERT_TRUE(save(**plain, f, req).ok());
  }
  EXPECT_TRUE(store_contains(plain_bed.root / "packs", kv)) << "the needle would be found if it were there";
  EXPECT_TRUE(store_contains(plain_bed.root, bytes_of(secret))) << "the plain manifest's INFO holds the metadata";
  EXPECT_TRUE(store_contains(plain_bed.root, tok_bytes));

  Bed b;
  {
    auto s = b.must_open(b.key_a, "alice");
    auto saved = save(*s, f, req);
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    expect_restores(*s, "s", f);
  }
  EXPECT_FALSE(store_contains(b.root, kv)) << "tensor bytes in the encrypted store's files";
  EXPECT_FALSE(store_contains(b.root, bytes_of("zq-template-7f3a91c"))) << "a metadata string in the encrypted store";
  EXPECT_FALSE(store_contains(b.root, tok_bytes)) << "token bytes in the encrypted store's files";
}

TEST(StoreMlxCrypt, ExportAndImportSealedDecryptedAndSealedAgain) {
  MemoryFile f = kv_file(2, 2, 300, 64, "x.safetensors", "tiny");
  Bed src;
  auto alice = src.must_open(src.key_a, "alice");
  SaveRequest req = with("x", {4, 5, 6, 7});
  req.tags = {{"k", "v"}};
  auto saved = save(*alice, f, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const std::string uuid = saved->info.uuid;
  const std::string sealed = temp_path("sealed").string() + ".tar.zst";
  const std::string plain = temp_path("plain").string() + ".tar.zst";
  ASSERT_TRUE(alice->export_to({"x"}, sealed).ok());
  auto dec = alice->export_to({"x"}, plain, /*decrypt=*/true);
  ASSERT_TRUE(dec.ok()) << dec.ToString();

  auto expect_same = [&](Store& s, const SnapshotInfo& got, const std::optional<std::string>& tenant) {
    EXPECT_EQ(got.uuid, uuid);
    EXPECT_EQ(got.tenant, tenant);
    EXPECT_EQ(got.model_arch, "mlx-lm");
    EXPECT_EQ(got.model_fingerprint, "mlx-lm:tiny");
    EXPECT_EQ(got.n_tokens, 4);
    expect_restores(s, uuid, f);
    auto v = s.verify({});
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  };
  {  // the same key and tenant: copied sealed as it is
    Bed into;
    auto s = into.must_open(src.key_a, "alice");
    auto in = s->import_from(sealed);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    expect_same(*s, in->imported[0], "alice");
    auto wrong_tenant = into.must_open(src.key_a, "bob")->import_from(sealed);
    EXPECT_EQ(wrong_tenant.status().code(), Code::kMismatch) << wrong_tenant.status().ToString();
  }
  {  // another key and tenant: opened with the archive's, sealed again with the store's
    Bed into;
    auto s = into.must_open(into.key_b, "bob");
    ImportOptions from;
    from.from_key = *load_key_file(src.key_a.string());
    from.from_tenant = "alice";
    auto in = s->import_from(sealed, from);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    EXPECT_EQ(in->imported[0].master_key_id, into.key_id(into.key_b));
    expect_same(*s, in->imported[0], "bob");
  }
  {  // export --decrypt: plain .kvsnap files a plain store imports as they are
    Bed into;
    auto s = Store::open(posix_io(), StorePaths{into.root.string()});
    ASSERT_TRUE(s.ok());
    auto in = (*s)->import_from(plain);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    EXPECT_EQ(in->imported[0].name, "x");
    // Built again with plain chunk ids: the plain rule, not the keyed digest of the source.
    EXPECT_EQ(in->imported[0].content_sha256.rfind("chunk-tree:", 0), 0u) << in->imported[0].content_sha256;
    EXPECT_TRUE((*s)->verify({}).value().problems.empty());
    expect_same(**s, in->imported[0], std::nullopt);
  }
  {  // a plain archive into an encrypted store: sealed on the way in, name and tags kept
    Bed into;
    auto s = into.must_open(into.key_a, "carol");
    ImportOptions plain_allowed;
    plain_allowed.allow_plain = true;
    auto in = s->import_from(plain, plain_allowed);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    EXPECT_EQ(in->imported[0].name, "x");
    EXPECT_EQ(in->imported[0].tags, (std::map<std::string, std::string>{{"k", "v"}}));
    expect_same(*s, in->imported[0], "carol");
  }
  fs::remove(sealed);
  fs::remove(plain);
}

// kvsnap rekey (docs/store.md, "Key rotation") over a store that holds prompt caches beside a
// llama.cpp state: each is sealed again under the new key, restores byte for byte with it (and
// its token prefix is still found), verify is clean, and the old key is refused.
TEST(StoreMlxCrypt, RekeySealsPromptCachesAgainUnderTheNewKey) {
  Bed b;
  MemoryFile short_f = kv_file(2, 4, 600, 64, "a.safetensors", "mlx-community/tiny");
  MemoryFile long_f = kv_file(2, 4, 900, 64, "b.safetensors", "mlx-community/tiny");
  Loaded slot = load(fixtures() / kSlot);
  {
    auto alice = b.must_open(b.key_a, "alice");
    ASSERT_TRUE(alice);
    ASSERT_TRUE(save(*alice, short_f, with("short", tokens(600))).ok());
    ASSERT_TRUE(save(*alice, long_f, with("long", tokens(900))).ok());
    auto s = alice->save(*slot.file, slot.state, small_chunks());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto k = load_key_file(b.key_b.string());
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    auto rep = alice->rekey(*k);
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    EXPECT_EQ(rep->rekeyed, 3u);
  }
  auto alice = b.must_open(b.key_b, "alice");
  ASSERT_TRUE(alice);
  expect_restores(*alice, "short", short_f);
  expect_restores(*alice, "long", long_f);
  auto found = alice->catalog().find_prefix(tokens(1000), "mlx-lm:mlx-community/tiny", 10);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->size(), 2u) << "the keyed prefix index, rebuilt under the new key";
  auto v = alice->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
  auto old_key = b.open(b.key_a, "alice");
  ASSERT_FALSE(old_key.ok());
  EXPECT_EQ(old_key.status().code(), Code::kMismatch);
}

}  // namespace
}  // namespace kvsnap
