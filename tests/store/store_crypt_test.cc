// Encryption at rest wired into the store (docs/store.md, "Encryption at rest"): byte-identical
// round trips, dedup within a tenant and none across tenants, the errors for a missing or wrong
// key or tenant, tampering caught in blobs and in the sealed catalog rows, no plaintext in the
// packs or the catalog file, verify with and without the key, find by keyed prefix, export and
// import of encrypted snapshots.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>


#include "base/chunk_cipher.h"
#include "base/key_source.h"
#include "format/state_prefix.h"
#include "migrate/model_info.h"
#include "store/crypt_bed.h"
#include "store/fault_io.h"
#include "store/store.h"
#include "archive_edit.h"
#include "test_files.h"

namespace kvsnap {
namespace {

using namespace crypt_bed;
using test::slurp;

TEST(StoreCrypt, RoundTripIsByteIdenticalAndDedupStaysWithinATenant) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  auto alice = b.must_open(b.key_a, "alice");
  ASSERT_TRUE(alice);
  auto first = alice->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->chunks_new, first->chunks);
  EXPECT_EQ(first->info.tenant, "alice");
  EXPECT_EQ(first->info.master_key_id, b.key_id(b.key_a));
  EXPECT_EQ(alice->encryption_key_id(), b.key_id(b.key_a));
  const std::string back = restore_all(*alice, std::to_string(first->info.id));
  EXPECT_TRUE(back.size() == l.bytes.size() && std::memcmp(back.data(), l.bytes.data(), back.size()) == 0);

  auto again = alice->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->chunks_new, 0u) << "the same file again, same tenant: every chunk deduplicated";
  EXPECT_EQ(again->info.parent_id, first->info.id) << "the keyed prefix index found the parent";

  auto bob = b.must_open(b.key_a, "bob");
  auto other = bob->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->chunks_new, other->chunks) << "another tenant shares no chunk ids";
  EXPECT_FALSE(other->info.parent_id) << "another tenant's snapshot is no parent";
  EXPECT_EQ(restore_all(*bob, std::to_string(other->info.id)), back);

  // ls by tenant; find by keyed prefix sees only the key's tenant
  ListFilter f;
  f.tenant = "alice";
  auto listed = alice->catalog().list(f);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u);
  auto found = alice->catalog().find_prefix(l.state.tokens.tokens);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 2u);
  for (const auto& s : *found) EXPECT_EQ(s.tenant, "alice");
  auto found_bob = bob->catalog().find_prefix(l.state.tokens.tokens);
  ASSERT_TRUE(found_bob.ok());
  ASSERT_EQ(found_bob->size(), 1u);
  EXPECT_EQ((*found_bob)[0].id, other->info.id);

  auto v = alice->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
  EXPECT_EQ(v->sealed_only, 1u) << "bob's snapshot is checked without opening it";
}

// gc compacts an encrypted store's packs without the key: the sealed blobs are copied as they are
// (their GCM additional data is their header and id, not where they lie) and still open.
TEST(StoreCrypt, AKeylessGcCompactsSealedPacksThatStillOpen) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  VectorSink half;  // its first chunk of each layer's K and V is the whole one's, the rest not
  ASSERT_TRUE(write_prefix(l.state, *l.file, l.state.tokens.tokens.size() / 2, half).ok());
  MemoryFile qfile("half.slot", std::span<const std::byte>(half.bytes));
  auto qstate = parse_state(qfile);
  ASSERT_TRUE(qstate.ok());
  auto s = b.must_open(b.key_a);
  auto whole = s->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  auto part = s->save(qfile, *qstate, small_chunks());
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  ASSERT_GT(part->chunks, part->chunks_new);
  ASSERT_TRUE(s->catalog().remove_snapshot(whole->info.id).ok());  // the rows only: gc comes next
  s.reset();
  auto keyless = b.open({}, "", /*keyless_ok=*/true);
  ASSERT_TRUE(keyless.ok()) << keyless.status().ToString();
  auto gc = (*keyless)->gc(true);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->packs_compacted, 1u);
  EXPECT_TRUE(gc->warnings.empty()) << gc->warnings.front();
  keyless->reset();
  s = b.must_open(b.key_a);
  const std::string back = restore_all(*s, std::to_string(part->info.id));
  EXPECT_TRUE(back.size() == half.bytes.size() && std::memcmp(back.data(), half.bytes.data(), back.size()) == 0);
  auto v = s->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
}

TEST(StoreCrypt, TokenPrefixRestoreReadsTheSealedSnapshot) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  auto s = b.must_open(b.key_a);
  auto saved = s->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const std::string cut = restore_all(*s, std::to_string(saved->info.id), nullptr, 40);
  VectorSink want;
  ASSERT_TRUE(write_prefix(l.state, *l.file, 40, want).ok());
  EXPECT_EQ(cut, std::string(reinterpret_cast<const char*>(want.bytes.data()), want.bytes.size()));
}

TEST(StoreCrypt, MissingWrongKeyAndWrongTenantAreClearErrors) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  int64_t id = 0;
  {
    auto s = b.must_open(b.key_a, "alice");
    auto saved = s->save(*l.file, l.state, small_chunks());
    ASSERT_TRUE(saved.ok());
    id = saved->info.id;
  }
  const std::string a = b.key_id(b.key_a), bb = b.key_id(b.key_b);
  auto none = b.open("");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(none.status().message(),
            "store " + b.root.string() + " is encrypted (key " + a + "): pass --key-file FILE or --key-command CMD");
  auto wrong = b.open(b.key_b, "alice");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Code::kMismatch);
  EXPECT_EQ(wrong.status().message(), "store " + b.root.string() + " is encrypted with key " + a +
                                          ", but the key given is " + bb +
                                          " (wrong key: pass the store's --key-file FILE or --key-command CMD)");
  auto bob = b.must_open(b.key_a, "bob");
  Status st;
  restore_all(*bob, std::to_string(id), &st);
  EXPECT_EQ(st.code(), Code::kMismatch);
  EXPECT_EQ(st.message(), "snapshot " + std::to_string(id) + " is encrypted for tenant 'alice', not 'bob' (pass --tenant alice)");
  // keyless (verify, gc) opens, but reads nothing and saves nothing
  auto keyless = b.open("", "", /*keyless_ok=*/true);
  ASSERT_TRUE(keyless.ok()) << keyless.status().ToString();
  restore_all(**keyless, std::to_string(id), &st);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "snapshot " + std::to_string(id) + " is encrypted with key " + a +
                              " for tenant 'alice', and no key was given: pass --key-file FILE or --key-command CMD");
  auto plain = (*keyless)->save(*l.file, l.state, small_chunks());
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), Code::kInvalidArgument);
  EXPECT_NE(plain.status().message().find("takes no plain snapshots"), std::string::npos) << plain.status().ToString();
}

// A process that opened the store while it was plain goes on without a key; another encrypts it
// with its first save. The first process's next save is refused inside the catalog's transaction
// and stores nothing (a review's finding: it kept storing plaintext for the rest of its life).
TEST(StoreCrypt, AWriterThatOpenedThePlainStoreSavesNothingOnceItIsEncrypted) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  auto before = b.open("");
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_TRUE((*before)->save(*l.file, l.state, small_chunks()).ok());  // plain, while the store is
  {
    auto keyed = b.must_open(b.key_a, "alice");
    ASSERT_TRUE(keyed->save(*l.file, l.state, small_chunks()).ok());
  }
  auto late = (*before)->save(*l.file, l.state, small_chunks());
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), Code::kMismatch) << late.status().ToString();
  EXPECT_NE(late.status().message().find("is encrypted (key " + b.key_id(b.key_a) + ") and takes no plain snapshots"),
            std::string::npos)
      << late.status().ToString();
  auto listed = b.must_open(b.key_a, "alice")->catalog().list();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u) << "the plain snapshot saved before and the sealed one";
}

// With a key, a plain snapshot (saved before the store's first encrypted save, or added to the
// catalog by anyone who can write it: nothing protects a plain row) is restored or exported only
// on purpose (RestoreRequest::allow_plain, export_to's allow_plain): never taken as the key
// holder's own data. Without a key, as before.
TEST(StoreCrypt, APlainSnapshotIsReadUnderAKeyOnlyOnPurpose) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  SaveRequest named = small_chunks();
  named.name = "chat";
  {
    auto plain = b.open("");
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    ASSERT_TRUE((*plain)->save(*l.file, l.state, named).ok());
  }
  const std::string original = test::slurp_text(fixtures() / kSlot);
  auto keyed = b.must_open(b.key_a, "alice");
  ASSERT_TRUE(keyed->save(*l.file, l.state, small_chunks()).ok());  // the store is encrypted now
  for (const char* ref : {"chat", "1"}) {
    Status st;
    EXPECT_EQ(restore_all(*keyed, ref, &st), "");
    ASSERT_EQ(st.code(), Code::kMismatch) << st.ToString();
    EXPECT_NE(st.message().find("is not encrypted, and a key was given"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("allow-plain"), std::string::npos) << st.ToString();
  }
  VectorSink out;
  RestoreRequest on_purpose;
  on_purpose.allow_plain = true;
  ASSERT_TRUE(keyed->restore("chat", on_purpose, out).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.bytes.data()), out.bytes.size()), original);
  EXPECT_EQ(restore_all(*keyed, "2"), original) << "the sealed snapshot restores as always";

  const fs::path archive = b.keys / "x.tar.zst";
  Status exported = keyed->export_to({"chat"}, archive.string());
  ASSERT_EQ(exported.code(), Code::kMismatch) << exported.ToString();
  EXPECT_FALSE(fs::exists(archive));
  ASSERT_TRUE(keyed->export_to({"chat"}, archive.string(), false, /*allow_plain=*/true).ok());
  EXPECT_TRUE(fs::exists(archive));
}

// A plain archive imported into an encrypted store is saved again: the model facts its save
// recorded go with it (a review's finding: they were dropped, so an old-format original saved with
// --model could no longer be restored at other types without the model).
TEST(StoreCrypt, AnImportSavedAgainKeepsTheRecordedModel) {
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok());
  Loaded l = load(fixtures() / "b8121/hd64-f16-f16-faon.slot");
  Bed src;
  auto plain = src.open("");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  SaveRequest req = small_chunks();
  req.model = &*model;
  auto saved = (*plain)->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const std::string archive = temp_path("recorded").string() + ".tar.zst";
  ASSERT_TRUE((*plain)->export_to({saved->info.uuid}, archive).ok());
  Bed dst;
  auto keyed = dst.must_open(dst.key_a, "alice");
  ImportOptions plain_allowed;
  plain_allowed.allow_plain = true;
  auto imported = keyed->import_from(archive, plain_allowed);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  fs::remove(archive);
  auto snap = keyed->open_snapshot(saved->info.uuid);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  const auto& m = (*snap)->reader().manifest();
  ASSERT_TRUE(m.encryption.has_value()) << "sealed on the way in";
  ASSERT_TRUE(m.model.has_value());
  EXPECT_EQ(m.model->cell_ext_bytes, std::optional<uint32_t>(0));
  EXPECT_EQ(m.model->gguf_fingerprint, model->profile.fingerprint);
  RestoreRequest at_q8;
  at_q8.spec.ctk = at_q8.spec.ctv = "q8_0";
  VectorSink out;
  auto r = keyed->restore(saved->info.uuid, at_q8, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->converted);
}

// A synthetic f16 slot (ggsq v3) of `cells` tokens whose K/V values are random: zstd cannot
// shrink them, so a plain store keeps runs of them as they are (the search below can find them).
fs::path random_slot(const fs::path& dir, uint32_t n_layer, uint32_t n_embd, uint32_t cells) {
  fs::create_directories(dir);
  const fs::path p = dir / "random.slot";
  std::ofstream f(p, std::ios::binary);
  auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { f.write(reinterpret_cast<const char*>(&v), 8); };
  u32(0x67677371); u32(3); u32(cells);
  for (uint32_t c = 0; c < cells; ++c) u32(1000 + c * 7);
  u32(1); u32(cells);
  for (uint32_t c = 0; c < cells; ++c) { u32(c); u32(1); u32(0); }
  u32(0); u32(n_layer);
  std::mt19937 rng(11);
  std::vector<uint16_t> row(n_embd);
  for (int side = 0; side < 2; ++side)
    for (uint32_t l = 0; l < n_layer; ++l) {
      u32(1); u64(uint64_t(n_embd) * 2);
      for (uint32_t c = 0; c < cells; ++c) {
        for (auto& h : row) h = uint16_t(rng());
        f.write(reinterpret_cast<const char*>(row.data()), std::streamsize(row.size() * 2));
      }
    }
  return p;
}

TEST(StoreCrypt, NoPlaintextAtRestAndThePlainStoreShowsTheTestCanFail) {
  const fs::path dir = temp_path("slot");
  Loaded l = load(random_slot(dir, 2, 64, 100));
  fs::remove_all(dir);
  // Needles: the first 16 tokens (i32 LE, as a plain catalog stores them) and 64 bytes of K/V
  // data from the middle of the file.
  std::vector<std::byte> tokens(64);
  std::memcpy(tokens.data(), l.state.tokens.tokens.data(), 64);
  const size_t mid = l.bytes.size() / 2;
  std::span<const std::byte> kv(l.bytes.data() + mid, 64);
  ASSERT_GT(std::set<std::byte>(kv.begin(), kv.end()).size(), 8u) << "a run of real data, not padding";

  Bed plain_bed;
  {
    auto plain = Store::open(posix_io(), StorePaths{plain_bed.root.string()});
    ASSERT_TRUE(plain.ok());
    ASSERT_TRUE((*plain)->save(*l.file, l.state, small_chunks()).ok());
  }
  EXPECT_TRUE(file_contains(plain_bed.root / "catalog.sqlite", tokens) ||
              file_contains(plain_bed.root / "catalog.sqlite-wal", tokens));
  EXPECT_TRUE(store_contains(plain_bed.root / "packs", kv)) << "the needle would be found if it were there";

  Bed b;
  {
    auto s = b.must_open(b.key_a, "alice");
    ASSERT_TRUE(s->save(*l.file, l.state, small_chunks()).ok());
  }
  EXPECT_FALSE(store_contains(b.root, tokens)) << "token bytes in the encrypted store's files";
  EXPECT_FALSE(store_contains(b.root, kv)) << "K/V bytes in the encrypted store's files";
}

TEST(StoreCrypt, TamperingFailsTheTagNamingTheSnapshot) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  auto s = b.must_open(b.key_a, "alice");
  auto saved = s->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(saved.ok());
  const std::string id = std::to_string(saved->info.id);
  auto tampered = [&](const std::string& where) {
    Status st;
    restore_all(*s, id, &st);
    EXPECT_EQ(st.code(), Code::kCorruption) << where << ": " << st.ToString();
    EXPECT_NE(st.message().find("tampered or corrupt"), std::string::npos) << where << ": " << st.ToString();
    EXPECT_NE(st.message().find("snapshot '" + id + "'"), std::string::npos) << where << ": " << st.ToString();
    auto v = s->verify({id});
    ASSERT_TRUE(v.ok());
    EXPECT_FALSE(v->problems.empty()) << where;
  };
  // a byte of a stored pack: the ciphertext of some chunk
  const fs::path pack = fs::directory_iterator(b.root / "packs")->path();
  auto bytes = slurp(pack);
  auto uses = s->catalog().chunks_of(saved->info.id);
  ASSERT_TRUE(uses.ok());
  const ChunkUse& u = (*uses)[uses->size() / 2];
  const size_t at = u.pack_offset + kSealedHeaderBytes + 7;
  bytes[at] ^= std::byte{0x40};
  std::ofstream(pack, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
  tampered("pack");
  {
    // without the key the flip is in the ciphertext, which only the tag can tell
    auto keyless = b.open("", "", true);
    ASSERT_TRUE(keyless.ok());
    auto v = (*keyless)->verify({});
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(v->problems.empty());
    EXPECT_EQ(v->sealed_only, 1u);
    ASSERT_EQ(v->not_checked.size(), 1u);
  }
  bytes[at] ^= std::byte{0x40};
  bytes[u.pack_offset + 9] ^= std::byte{0x01};  // the master key id in its sealed header
  std::ofstream(pack, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
  {
    auto keyless = b.open("", "", true);
    auto v = (*keyless)->verify({});
    ASSERT_TRUE(v.ok());
    ASSERT_EQ(v->problems.size(), 1u) << "a sealed header is checked without the key";
    EXPECT_NE(v->problems[0].find("chunk " + u.sha256.hex()), std::string::npos) << v->problems[0];
  }
  bytes[u.pack_offset + 9] ^= std::byte{0x01};
  std::ofstream(pack, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
  ASSERT_TRUE(s->verify({id})->problems.empty());

  edit_row(b.root / "catalog.sqlite", "manifest", flip);
  tampered("manifest row");
  edit_row(b.root / "catalog.sqlite", "manifest", flip);
  ASSERT_TRUE(s->verify({id})->problems.empty());

  edit_row(b.root / "catalog.sqlite", "tokens", flip);
  auto v = s->verify({id});
  ASSERT_TRUE(v.ok());
  ASSERT_FALSE(v->problems.empty());
  EXPECT_NE(v->problems[0].find("its token row: tampered or corrupt"), std::string::npos) << v->problems[0];
  auto found = s->catalog().find_prefix(l.state.tokens.tokens);
  EXPECT_EQ(found.status().code(), Code::kCorruption) << "find opens the candidate's tokens";
}

// A whole uuid resolves to that uuid's row only: a row someone named like another snapshot's uuid
// (kvsnap never writes such a name) is not restored in its place (a review's finding: the name was
// looked up first, and serve restores by uuid).
TEST(StoreCrypt, AUuidNamesItsOwnRowEvenIfAnotherIsNamedLikeIt) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  Loaded other = load(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  auto s = b.must_open(b.key_a);
  auto mine = s->save(*l.file, l.state, small_chunks());
  auto theirs = s->save(*other.file, other.state, small_chunks());
  ASSERT_TRUE(mine.ok() && theirs.ok());
  const std::string sql = "UPDATE snapshots SET name = '" + mine->info.uuid + "' WHERE id = " + std::to_string(theirs->info.id);
  b.sql(sql);
  EXPECT_EQ(*s->catalog().resolve(mine->info.uuid), mine->info.id);
  std::string upper = mine->info.uuid;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(*s->catalog().resolve(upper), mine->info.id);
  EXPECT_EQ(restore_all(*s, mine->info.uuid), test::slurp_text(fixtures() / kSlot));
  const std::string gone = "00000000-0000-4000-8000-000000000000";
  EXPECT_EQ(s->catalog().resolve(gone).status().code(), Code::kNotFound);
}

// `l` saved as `name` with `tags` (small chunks).
Result<SaveResult> save_named(Store& s, const Loaded& l, const std::string& name,
                              std::map<std::string, std::string> tags = {}) {
  SaveRequest r = small_chunks();
  r.name = name;
  r.tags = std::move(tags);
  return s.save(*l.file, l.state, r);
}

// Names and tags are catalog columns that whoever can write the catalog changes without the key:
// swapping the names of two sealed snapshots sent a restore of "a" to b's data, exit 0. A save
// now records them in the sealed manifest (INFO.labels), and a snapshot whose catalog name or tags
// differ is refused when named by anything but its uuid (restore, export; verify reports it).
TEST(StoreCrypt, SwappedNamesOrTagsOfSealedSnapshotsAreRefused) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  Loaded other = load(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  auto s = b.must_open(b.key_a);
  auto a = save_named(*s, l, "a", {{"k", "1"}});
  auto bb = save_named(*s, other, "b", {{"k", "2"}});
  ASSERT_TRUE(a.ok() && bb.ok());
  const std::string ida = std::to_string(a->info.id), idb = std::to_string(bb->info.id);
  EXPECT_EQ(restore_all(*s, "a"), test::slurp_text(fixtures() / kSlot));
  b.sql("UPDATE snapshots SET name = 'x' WHERE id = " + ida + "; UPDATE snapshots SET name = 'a' WHERE id = " + idb +
        "; UPDATE snapshots SET name = 'b' WHERE id = " + ida);
  Status st;
  const std::string got = restore_all(*s, "a", &st);
  EXPECT_EQ(st.code(), Code::kMismatch) << st.ToString();
  EXPECT_NE(st.message().find("the catalog names it 'a', and it was saved as 'b'"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("kvsnap restore " + bb->info.uuid), std::string::npos)
      << "a read names the row's snapshot by its uuid: " << st.ToString();
  EXPECT_TRUE(got.empty()) << "bytes were written for a swapped name";
  // by its uuid, which the sealed manifest is bound to, it is what it always was
  EXPECT_EQ(restore_all(*s, bb->info.uuid), test::slurp_text(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot"));
  const std::string archive = temp_path("swapped").string() + ".tar.zst";
  EXPECT_EQ(s->export_to({"a"}, archive).code(), Code::kMismatch);
  EXPECT_EQ(s->export_to({"a"}, archive, /*decrypt=*/true).code(), Code::kMismatch);
  // verify names both and still checks the rest of each
  auto v = s->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->problems.size(), 2u) << (v->problems.empty() ? "" : v->problems[0]);
  EXPECT_EQ(v->chunks, a->chunks + bb->chunks) << "a label problem stopped the check of the chunks";
  // exported by its uuid, it travels under its sealed name
  ASSERT_TRUE(s->export_to({bb->info.uuid}, archive).ok());
  Bed into;
  auto there = into.must_open(b.key_a);
  ASSERT_TRUE(there->import_from(archive).ok());
  EXPECT_EQ(restore_all(*there, "b"), test::slurp_text(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot"));
  // names back; a tag changed is refused too, a tag removed is not (an import keeps fewer labels
  // when a name is taken)
  b.sql("UPDATE snapshots SET name = 'x' WHERE id = " + ida + "; UPDATE snapshots SET name = 'b' WHERE id = " + idb +
        "; UPDATE snapshots SET name = 'a' WHERE id = " + ida + "; UPDATE tags SET value = '9' WHERE snapshot_id = " + ida);
  restore_all(*s, "a", &st);
  EXPECT_EQ(st.code(), Code::kMismatch) << st.ToString();
  EXPECT_NE(st.message().find("the tag k=9, and it was saved with k=1"), std::string::npos) << st.ToString();
  b.sql("DELETE FROM tags WHERE snapshot_id = " + ida);
  EXPECT_EQ(restore_all(*s, "a"), test::slurp_text(fixtures() / kSlot));
  EXPECT_TRUE(s->verify({}).value().problems.empty());
  fs::remove(archive);
  // names and tags are UTF-8 text (the sealed copy is JSON): other bytes are refused at save
  SaveRequest latin1 = small_chunks();
  latin1.name = "caf\xe9";
  EXPECT_EQ(s->save(*l.file, l.state, latin1).status().code(), Code::kInvalidArgument);
  latin1.name.clear();
  latin1.tags = {{"k", "\xff"}};
  EXPECT_EQ(s->save(*l.file, l.state, latin1).status().code(), Code::kInvalidArgument);
}

// rm, pin, unpin and expire by name read no data, and acted on whatever row the catalog named so:
// with two sealed snapshots' names swapped, `rm a` deleted b's snapshot. Named by anything but its
// uuid, an encrypted snapshot whose catalog labels are not its sealed ones is now refused
// (kMismatch, nothing changed); by its uuid each still acts; another tenant's is refused by name.
TEST(StoreCrypt, RmPinAndExpireByASwappedNameChangeNothing) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  Loaded other = load(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  auto s = b.must_open(b.key_a);
  auto a = save_named(*s, l, "a");
  auto bb = save_named(*s, other, "b");
  ASSERT_TRUE(a.ok() && bb.ok());
  ASSERT_TRUE(s->set_pinned("a", true).ok()) << "labels that match: acted on as before";
  ASSERT_TRUE(s->set_pinned("a", false).ok());
  const std::string ida = std::to_string(a->info.id), idb = std::to_string(bb->info.id);
  b.sql("UPDATE snapshots SET name = 'x' WHERE id = " + ida + "; UPDATE snapshots SET name = 'a' WHERE id = " + idb +
        "; UPDATE snapshots SET name = 'b' WHERE id = " + ida);
  auto pinned = s->set_pinned("a", true);
  EXPECT_EQ(pinned.status().code(), Code::kMismatch) << pinned.status().ToString();
  EXPECT_NE(pinned.status().message().find("it was saved as 'b'"), std::string::npos) << pinned.status().ToString();
  EXPECT_NE(pinned.status().message().find("nothing was changed"), std::string::npos) << pinned.status().ToString();
  EXPECT_NE(pinned.status().message().find("name the snapshot to pin by its uuid"), std::string::npos)
      << pinned.status().ToString();
  EXPECT_NE(pinned.status().message().find("kvsnap verify --all, with this key and tenant,"), std::string::npos)
      << pinned.status().ToString();
  EXPECT_EQ(pinned.status().message().find(bb->info.uuid), std::string::npos)
      << "the row's uuid is not the snapshot meant: not in the message: " << pinned.status().ToString();
  EXPECT_EQ(pinned.status().message().find("kvsnap pin " + bb->info.uuid), std::string::npos)
      << "the row named is not the snapshot meant: no command with its uuid: " << pinned.status().ToString();
  EXPECT_EQ(s->set_pinned("b", false).status().code(), Code::kMismatch);
  EXPECT_EQ(s->set_expiry("a", 60).status().code(), Code::kMismatch);
  EXPECT_EQ(s->set_expiry("b", std::nullopt).status().code(), Code::kMismatch);
  auto gone = s->remove("a");
  EXPECT_EQ(gone.status().code(), Code::kMismatch) << gone.status().ToString();
  EXPECT_NE(gone.status().message().find("name the snapshot to rm by its uuid"), std::string::npos) << gone.status().ToString();
  EXPECT_EQ(gone.status().message().find(bb->info.uuid), std::string::npos) << gone.status().ToString();
  EXPECT_EQ(s->remove("b").status().code(), Code::kMismatch);
  EXPECT_EQ(s->remove(idb).status().code(), Code::kMismatch) << "a numeric id is checked against the labels too";
  auto info_a = s->catalog().get_info(a->info.id), info_b = s->catalog().get_info(bb->info.id);
  ASSERT_TRUE(info_a.ok() && info_b.ok()) << "a refused rm removed a snapshot";
  EXPECT_FALSE(info_a->pinned || info_b->pinned);
  EXPECT_FALSE(info_a->expires_at || info_b->expires_at);
  EXPECT_EQ(restore_all(*s, a->info.uuid), test::slurp_text(fixtures() / kSlot));
  // by its uuid, each acts on the snapshot the uuid names
  ASSERT_TRUE(s->set_pinned(bb->info.uuid, true).ok());
  EXPECT_TRUE(s->catalog().get_info(bb->info.id)->pinned);
  ASSERT_TRUE(s->set_expiry(bb->info.uuid, 60).ok());
  ASSERT_TRUE(s->remove(bb->info.uuid).ok());
  EXPECT_EQ(s->catalog().get_info(bb->info.id).status().code(), Code::kNotFound);
  EXPECT_EQ(restore_all(*s, a->info.uuid), test::slurp_text(fixtures() / kSlot));
  // another tenant's snapshot by name: its labels cannot be read, so it is refused
  b.sql("UPDATE snapshots SET name = 'a' WHERE id = " + ida);
  auto bob = b.must_open(b.key_a, "bob");
  auto theirs = bob->remove("a");
  EXPECT_EQ(theirs.status().code(), Code::kMismatch) << theirs.status().ToString();
  EXPECT_NE(theirs.status().message().find("pass --tenant default"), std::string::npos) << theirs.status().ToString();
  EXPECT_TRUE(s->catalog().get_info(a->info.id).ok());
  // a sealed manifest row that does not open shows no labels to check the name against (names
  // and then manifest rows swapped look so): refused by name, removed by its uuid
  edit_row(b.root / "catalog.sqlite", "manifest", flip);
  EXPECT_EQ(s->set_pinned("a", true).status().code(), Code::kCorruption);
  auto damaged = s->remove("a");
  EXPECT_EQ(damaged.status().code(), Code::kCorruption) << damaged.status().ToString();
  EXPECT_NE(damaged.status().message().find("nothing was removed"), std::string::npos) << damaged.status().ToString();
  EXPECT_NE(damaged.status().message().find("kvsnap rm " + a->info.uuid), std::string::npos) << damaged.status().ToString();
  ASSERT_TRUE(s->catalog().get_info(a->info.id).ok());
  ASSERT_TRUE(s->remove(a->info.uuid).ok());
  EXPECT_EQ(s->catalog().get_info(a->info.id).status().code(), Code::kNotFound);
  // a row whose sealed rows are gone altogether: its uuid still removes it (nothing of it is read)
  auto c = save_named(*s, l, "c");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  b.sql("DELETE FROM snapshot_blobs WHERE snapshot_id = " + std::to_string(c->info.id));
  EXPECT_EQ(s->remove("c").status().code(), Code::kCorruption);
  ASSERT_TRUE(s->remove(c->info.uuid).ok()) << "a uuid reads none of the row's blobs";
  EXPECT_EQ(s->catalog().get_info(c->info.id).status().code(), Code::kNotFound);
}

// A catalog whose encryption setting someone removed, its sealed rows still there: a command
// without the key does not take it for a plain store (it would restore plain rows anyone added as
// the store's own); with the key it opens; verify and gc, which run without the key, open it.
TEST(StoreCrypt, ARemovedEncryptionSettingIsNoticedWithoutTheKey) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  ASSERT_TRUE(b.must_open(b.key_a)->save(*l.file, l.state, small_chunks()).ok());
  b.sql("DELETE FROM store_meta WHERE key = 'encryption'");
  auto keyless = b.open("");
  ASSERT_EQ(keyless.status().code(), Code::kCorruption) << keyless.status().ToString();
  EXPECT_NE(keyless.status().message().find("encryption setting is gone"), std::string::npos)
      << keyless.status().ToString();
  EXPECT_NE(keyless.status().message().find(b.key_id(b.key_a)), std::string::npos) << keyless.status().ToString();
  EXPECT_TRUE(b.open("", "", /*keyless_ok=*/true).ok());
  EXPECT_TRUE(b.open(b.key_a).ok());
}

TEST(StoreCrypt, ARowCopiedOntoAnotherSnapshotFailsItsTag) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  auto s = b.must_open(b.key_a);
  auto one = s->save(*l.file, l.state, small_chunks());
  auto two = s->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(one.ok() && two.ok());
  const std::string sql = "UPDATE snapshot_blobs SET manifest = (SELECT manifest FROM snapshot_blobs WHERE snapshot_id = " +
                          std::to_string(one->info.id) + ") WHERE snapshot_id = " + std::to_string(two->info.id);
  b.sql(sql);
  Status st;
  restore_all(*s, std::to_string(two->info.id), &st);
  EXPECT_EQ(st.code(), Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("its manifest row: tampered or corrupt"), std::string::npos) << st.ToString();
}

TEST(StoreCrypt, ExportStaysSealedAndImportsIntoTheSameKeyAndTenant) {
  Bed b, into;
  Loaded l = load(fixtures() / kSlot);
  auto s = b.must_open(b.key_a, "alice");
  auto saved = s->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(saved.ok());
  const fs::path archive = temp_path("export").string() + ".tar.zst";
  ASSERT_TRUE(s->export_to({std::to_string(saved->info.id)}, archive.string()).ok());
  std::vector<std::byte> tokens(64);
  std::memcpy(tokens.data(), l.state.tokens.tokens.data(), 64);
  // the archive is zstd-compressed: its sealed bytes would not compress, plain tokens would
  auto other = into.must_open(b.key_a, "alice");
  auto imported = other->import_from(archive.string());
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  ASSERT_EQ(imported->imported.size(), 1u);
  EXPECT_EQ(imported->imported[0].uuid, saved->info.uuid);
  EXPECT_EQ(imported->imported[0].tenant, "alice");
  const std::string back = restore_all(*other, saved->info.uuid);
  EXPECT_TRUE(back.size() == l.bytes.size() && std::memcmp(back.data(), l.bytes.data(), back.size()) == 0);
  EXPECT_FALSE(store_contains(into.root, tokens));

  Bed third;
  auto wrong_tenant = third.must_open(b.key_a, "bob");
  auto refused = wrong_tenant->import_from(archive.string());
  EXPECT_EQ(refused.status().code(), Code::kMismatch) << refused.status().ToString();
  fs::remove(archive);
}

// The restore of `uuid` in `s` is the slot's bytes.
void expect_restores(Store& s, const std::string& uuid, const Loaded& l) {
  const std::string back = restore_all(s, uuid);
  EXPECT_TRUE(back.size() == l.bytes.size() && std::memcmp(back.data(), l.bytes.data(), back.size()) == 0) << uuid;
}

TEST(StoreCrypt, ImportSealsAgainForAnotherKeyOrTenantAndPlainArchives) {
  Loaded l = load(fixtures() / kSlot);
  Bed src;
  auto alice = src.must_open(src.key_a, "alice");
  SaveRequest req = small_chunks();
  req.name = "chat";
  req.tags = {{"k", "v"}};
  auto saved = alice->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok());
  const std::string sealed_archive = temp_path("sealed").string() + ".tar.zst";
  ASSERT_TRUE(alice->export_to({"chat"}, sealed_archive).ok());

  // another key and tenant: opened with --from-key-file/--from-tenant, sealed with the store's
  Bed dst;
  auto bob = dst.must_open(dst.key_b, "bob");
  auto no_from = bob->import_from(sealed_archive);
  EXPECT_EQ(no_from.status().code(), Code::kMismatch) << no_from.status().ToString();
  ImportOptions from;
  from.from_key = *load_key_file(src.key_a.string());
  from.from_tenant = "alice";
  auto resealed = bob->import_from(sealed_archive, from);
  ASSERT_TRUE(resealed.ok()) << resealed.status().ToString();
  ASSERT_EQ(resealed->imported.size(), 1u);
  EXPECT_EQ(resealed->imported[0].uuid, saved->info.uuid);
  EXPECT_EQ(resealed->imported[0].tenant, "bob");
  EXPECT_EQ(resealed->imported[0].master_key_id, dst.key_id(dst.key_b));
  expect_restores(*bob, saved->info.uuid, l);
  ASSERT_TRUE(bob->verify({})->problems.empty());

  // export --decrypt: plain .kvsnap files; imported into a plain store as they are
  const std::string plain_archive = temp_path("plain").string() + ".tar.zst";
  ASSERT_TRUE(alice->export_to({"chat"}, plain_archive, /*decrypt=*/true).ok());
  Bed plain_bed;
  {
    auto plain = Store::open(posix_io(), StorePaths{plain_bed.root.string()});
    ASSERT_TRUE(plain.ok());
    auto in = (*plain)->import_from(plain_archive);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    EXPECT_FALSE(in->imported[0].tenant);
    EXPECT_EQ(in->imported[0].name, "chat");
    // Built again with plain chunk ids: the plain rule, not the keyed digest of the source.
    EXPECT_EQ(in->imported[0].content_sha256.rfind("chunk-tree:", 0), 0u) << in->imported[0].content_sha256;
    EXPECT_TRUE((*plain)->verify({}).value().problems.empty());
    expect_restores(**plain, saved->info.uuid, l);
  }
  // a plain archive into an encrypted store: refused, nothing stored (anyone may have made it, and
  // sealed it would restore like the store's own); with allow_plain encrypted on the way in
  Bed enc_bed;
  auto enc = enc_bed.must_open(enc_bed.key_a, "carol");
  auto refused = enc->import_from(plain_archive);
  EXPECT_EQ(refused.status().code(), Code::kMismatch) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("is a plain (unencrypted) snapshot, and this store is encrypted"),
            std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("{--allow-plain}"), std::string::npos) << refused.status().ToString();
  EXPECT_TRUE(enc->catalog().list()->empty()) << "a refused import stored a snapshot";
  ImportOptions plain_allowed;
  plain_allowed.allow_plain = true;
  auto in = enc->import_from(plain_archive, plain_allowed);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->imported.size(), 1u);
  EXPECT_EQ(in->imported[0].tenant, "carol");
  EXPECT_EQ(in->imported[0].name, "chat");
  EXPECT_EQ(in->imported[0].tags, (std::map<std::string, std::string>{{"k", "v"}}));
  expect_restores(*enc, saved->info.uuid, l);
  std::vector<std::byte> tokens(64);
  std::memcpy(tokens.data(), l.state.tokens.tokens.data(), 64);
  EXPECT_FALSE(store_contains(enc_bed.root, tokens));
  fs::remove(sealed_archive);
  fs::remove(plain_archive);
}

// ---- export metadata: name, tags, fingerprint and created travel sealed -------------------------

// The archive at `p` with its index changed by `edit` (the rest as it was).
void edit_index(const fs::path& p, const std::function<void(nlohmann::json&)>& edit) {
  Status s = test::edit_export_index(p.string(), edit);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// Every entry of the archive, decompressed.
test::ArchiveEntries archive_entries(const fs::path& p) {
  auto e = test::archive_entries(p.string());
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? *e : test::ArchiveEntries{};
}

bool archive_contains(const fs::path& p, const std::string& needle) {
  for (const auto& [name, bytes] : archive_entries(p))
    if (name.find(needle) != std::string::npos || bytes.find(needle) != std::string::npos) return true;
  return false;
}

const char* const kSecretName = "chat-of-zebra-launch";
const char* const kSecretTag = "project-zebra-launch";
const char* const kSecretFingerprint = "fp-zebra-launch-model";

// Saves the slot with a name, a tag and a fingerprint that only the key should reveal.
SnapshotInfo save_labelled(Store& s, const Loaded& l) {
  SaveRequest req = small_chunks();
  req.name = kSecretName;
  req.tags = {{"project", kSecretTag}};
  req.model_fingerprint = kSecretFingerprint;
  auto saved = s.save(*l.file, l.state, req);
  EXPECT_TRUE(saved.ok()) << saved.status().ToString();
  return saved.ok() ? saved->info : SnapshotInfo{};
}

// `got` carries `want`'s uuid, name, tags, fingerprint and creation time.
void expect_same_metadata(const SnapshotInfo& got, const SnapshotInfo& want, const std::string& how) {
  EXPECT_EQ(got.uuid, want.uuid) << how;
  EXPECT_EQ(got.name, want.name) << how;
  EXPECT_EQ(got.tags, want.tags) << how;
  EXPECT_EQ(got.model_fingerprint, want.model_fingerprint) << how;
  EXPECT_EQ(got.created, want.created) << how;
}

Result<ImportReport> import_into(Store& s, const fs::path& archive, const ImportOptions& o = {}) {
  return s.import_from(archive.string(), o);
}

// An encrypted store's import of plain snapshots (export --decrypt's archives).
ImportOptions plain_allowed() {
  ImportOptions o;
  o.allow_plain = true;
  return o;
}

// Tenant alice's store holding the labelled slot, and its sealed and --decrypt exports.
struct LabelledExport {
  Loaded l = load(fixtures() / kSlot);
  Bed src;
  std::unique_ptr<Store> alice = src.must_open(src.key_a, "alice");
  SnapshotInfo saved = save_labelled(*alice, l);
  fs::path sealed = temp_path("meta-sealed").string() + ".tar.zst";
  fs::path plain = temp_path("meta-plain").string() + ".tar.zst";
  LabelledExport() {
    EXPECT_TRUE(alice->export_to({kSecretName}, sealed.string()).ok());
    EXPECT_TRUE(alice->export_to({kSecretName}, plain.string(), /*decrypt=*/true).ok());
  }
  ~LabelledExport() {
    fs::remove(sealed);
    fs::remove(plain);
  }
};

// export --decrypt encodes each plain file once (into the store's tmp/, the archive then copies it):
// it reads the snapshot's blobs from the packs as often as one restore does, not twice, and leaves
// no temporary behind.
TEST(StoreCrypt, ExportDecryptReadsEachBlobOnceAndLeavesNoTemporary) {
  Bed b;
  Loaded l = load(fixtures() / kSlot);
  FaultInjectingIo io(posix_io());
  auto alice = b.open(b.key_a, "alice", false, io);
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  auto saved = (*alice)->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const std::string id = std::to_string(saved->info.id);
  auto reads = [&](const std::function<void(Store&)>& what) {
    auto s = b.open(b.key_a, "alice", false, io);  // no pack open yet
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    io.count_reads("/packs/");
    if (s.ok()) what(**s);
    return io.bytes_read();
  };
  const uint64_t restore = reads([&](Store& s) { expect_restores(s, saved->info.uuid, l); });
  const std::string archive = temp_path("once").string() + ".tar.zst";
  const uint64_t exported = reads([&](Store& s) { ASSERT_TRUE(s.export_to({id}, archive, /*decrypt=*/true).ok()); });
  EXPECT_GT(restore, 0u);
  EXPECT_EQ(exported, restore) << "export --decrypt read the blobs " << double(exported) / double(restore) << " times";
  EXPECT_TRUE(fs::is_empty(b.root / "tmp")) << "a temporary was left in tmp/";
  Bed plain_bed;
  auto plain = Store::open(posix_io(), StorePaths{plain_bed.root.string()});
  ASSERT_TRUE(plain.ok());
  auto in = (*plain)->import_from(archive);
  fs::remove(archive);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->imported.size(), 1u);
  // The plain store's digest is the plain rule's (format v3: "chunk-tree:..."), and the bytes are the
  // original's: import re-derived the digest from the decrypted chunks and checked it.
  EXPECT_EQ(in->imported[0].content_sha256.rfind("chunk-tree:", 0), 0u) << in->imported[0].content_sha256;
  expect_restores(**plain, in->imported[0].uuid, l);
}

TEST(StoreCrypt, ASealedExportKeepsNameTagsAndFingerprintForTheKeyHolder) {
  LabelledExport x;
  const Loaded& l = x.l;
  const SnapshotInfo& saved = x.saved;
  const fs::path &sealed = x.sealed, &plain = x.plain;

  {  // the same key and tenant: blobs copied as they are
    Bed b;
    auto s = b.must_open(x.src.key_a, "alice");
    auto in = import_into(*s, sealed);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    expect_same_metadata(in->imported[0], saved, "same key");
    auto id = s->catalog().resolve(kSecretName);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    expect_same_metadata(*s->catalog().get_info(*id), saved, "same key, in the catalog");
    expect_restores(*s, kSecretName, l);
  }
  {  // sealed again for another key and tenant
    Bed b;
    auto s = b.must_open(b.key_b, "bob");
    ImportOptions from;
    from.from_key = *load_key_file(x.src.key_a.string());
    from.from_tenant = "alice";
    auto in = import_into(*s, sealed, from);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    expect_same_metadata(in->imported[0], saved, "re-sealed");
    EXPECT_EQ(in->imported[0].tenant, "bob");
    expect_restores(*s, kSecretName, l);
  }
  {  // export --decrypt into a plain store
    Bed b;
    auto s = Store::open(posix_io(), StorePaths{b.root.string()});
    ASSERT_TRUE(s.ok());
    auto in = import_into(**s, plain);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    expect_same_metadata(in->imported[0], saved, "--decrypt");
  }
  {  // a plain archive into an encrypted store
    Bed b;
    auto s = b.must_open(b.key_b, "carol");
    auto in = import_into(*s, plain, plain_allowed());
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    expect_same_metadata(in->imported[0], saved, "plain into encrypted");
    EXPECT_EQ(in->imported[0].tenant, "carol");
  }
}

TEST(StoreCrypt, ASealedExportShowsNoNamesTagsOrFingerprintsAndAPlainOneDoes) {
  LabelledExport x;
  for (const char* needle : {kSecretName, kSecretTag, kSecretFingerprint}) {
    EXPECT_TRUE(archive_contains(x.plain, needle)) << needle << ": the search would find it";
    EXPECT_FALSE(archive_contains(x.sealed, needle)) << needle << " in plaintext in a sealed export";
  }
}

TEST(StoreCrypt, TamperedSealedMetadataFailsAndOldArchivesStillImport) {
  LabelledExport x;
  const Loaded& l = x.l;
  Store* alice = x.alice.get();
  const fs::path& archive = x.sealed;
  auto fresh_export = [&] { ASSERT_TRUE(alice->export_to({kSecretName}, archive.string()).ok()); };
  auto import_fails = [&](const std::string& what, Code code, const std::string& words) {
    Bed b;
    auto s = b.must_open(x.src.key_a, "alice");
    auto in = import_into(*s, archive);
    EXPECT_EQ(in.status().code(), code) << what << ": " << in.status().ToString();
    EXPECT_NE(in.status().message().find(words), std::string::npos) << what << ": " << in.status().ToString();
    EXPECT_TRUE(s->catalog().list()->empty()) << what << ": nothing imported";
  };

  fresh_export();
  edit_index(archive, [](nlohmann::json& j) {
    std::string& hex = j["snapshots"][0]["sealed_metadata"].get_ref<std::string&>();
    hex[hex.size() / 2] = hex[hex.size() / 2] == '0' ? '1' : '0';
  });
  import_fails("a flipped bit", Code::kCorruption, "its sealed metadata: tampered or corrupt");

  // the metadata of another snapshot: bound to the uuid, so it fails the same way
  auto other = alice->save(*l.file, l.state, small_chunks());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(alice->export_to({std::to_string(other->info.id)}, archive.string()).ok());
  const std::string foreign = archive_entries(archive).front().second;
  fresh_export();
  edit_index(archive, [&](nlohmann::json& j) {
    j["snapshots"][0]["sealed_metadata"] = nlohmann::json::parse(foreign)["snapshots"][0]["sealed_metadata"];
  });
  import_fails("another snapshot's metadata", Code::kCorruption, "its sealed metadata: tampered or corrupt");

  // sealed metadata without the uuid it is bound to: said so, not "tampered"
  fresh_export();
  edit_index(archive, [](nlohmann::json& j) { j["snapshots"][0].erase("uuid"); });
  import_fails("no uuid", Code::kCorruption, "sealed metadata without a uuid");

  // no key: refused, naming the key needed
  fresh_export();
  {
    Bed b;
    auto plain = Store::open(posix_io(), StorePaths{b.root.string()});
    ASSERT_TRUE(plain.ok());
    auto in = import_into(**plain, archive);
    EXPECT_EQ(in.status().code(), Code::kInvalidArgument) << in.status().ToString();
    EXPECT_NE(in.status().message().find("no key was given"), std::string::npos) << in.status().ToString();
    EXPECT_TRUE((*plain)->catalog().list()->empty());
  }

  // an archive from before the metadata was sealed: imported by uuid, without name or tags; plain
  // labels written into its index are anyone's, and are not taken (a review's finding: they were)
  edit_index(archive, [](nlohmann::json& j) {
    nlohmann::json& e = j["snapshots"][0];
    e.erase("sealed_metadata");
    e["name"] = "attacker-chosen";
    e["tags"] = {{"pinned", "yes"}, {"team", "mallory"}};
    e["created"] = "1999-01-01T00:00:00Z";
    e["model_fingerprint"] = "gguf:deadbeef";
  });
  Bed b;
  auto s = b.must_open(x.src.key_a, "alice");
  auto in = import_into(*s, archive);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->imported.size(), 1u);
  EXPECT_EQ(in->imported[0].uuid, x.saved.uuid);
  EXPECT_FALSE(in->imported[0].name);
  EXPECT_TRUE(in->imported[0].tags.empty());
  EXPECT_NE(in->imported[0].created, "1999-01-01T00:00:00Z");
  EXPECT_NE(in->imported[0].model_fingerprint, "gguf:deadbeef");
  expect_restores(*s, x.saved.uuid, l);
}

// A review's finding: with its sealed metadata intact, a sealed entry's plain name and extra tags in
// the index were laid over the sealed ones.
TEST(StoreCrypt, ASealedEntrysPlainLabelsAreNotImported) {
  LabelledExport x;
  auto unnamed = x.alice->save(*x.l.file, x.l.state, small_chunks());
  ASSERT_TRUE(unnamed.ok()) << unnamed.status().ToString();
  ASSERT_TRUE(x.alice->export_to({std::to_string(unnamed->info.id), kSecretName}, x.sealed.string()).ok());
  edit_index(x.sealed, [](nlohmann::json& j) {
    for (nlohmann::json& e : j["snapshots"]) {
      e["name"] = "injected-name";
      e["tags"] = {{"project", "mallory"}, {"extra", "1"}};
    }
  });
  Bed b;
  auto s = b.must_open(x.src.key_a, "alice");
  auto in = import_into(*s, x.sealed);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  ASSERT_EQ(in->imported.size(), 2u);
  for (const SnapshotInfo& i : in->imported) {
    if (i.uuid == unnamed->info.uuid) {
      EXPECT_FALSE(i.name) << "the sealed metadata names it not";
      EXPECT_TRUE(i.tags.empty());
    } else {
      expect_same_metadata(i, x.saved, "the labelled one, as sealed");
    }
  }
}

// A review's finding: a uuid in upper case (macOS's uuidgen) was bound to the sealed rows as given and
// stored in lower case: the import said it had imported the snapshot, which never opened again.
TEST(StoreCrypt, AnImportedUuidInUpperCaseIsSealedAsStored) {
  LabelledExport x;
  std::string upper = x.saved.uuid;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const fs::path* archive : {&x.plain, &x.sealed}) {
    SCOPED_TRACE(archive->string());
    edit_index(*archive, [&](nlohmann::json& j) {
      j["snapshots"][0]["uuid"] = upper;
      j["snapshots"][0].erase("sealed_metadata");  // bound to the uuid as exported
    });
    Bed b;
    auto s = b.must_open(x.src.key_a, "alice");
    auto in = import_into(*s, *archive, plain_allowed());
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    ASSERT_EQ(in->imported.size(), 1u);
    EXPECT_EQ(in->imported[0].uuid, x.saved.uuid);
    expect_restores(*s, x.saved.uuid, x.l);
    EXPECT_TRUE(s->verify({})->problems.empty());
  }
  // A save given one: the same.
  Bed b;
  auto s = b.must_open(x.src.key_a, "alice");
  SaveRequest req = small_chunks();
  req.uuid = upper;
  auto saved = s->save(*x.l.file, x.l.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->info.uuid, x.saved.uuid);
  expect_restores(*s, x.saved.uuid, x.l);
  req.uuid = "not-a-uuid";
  EXPECT_EQ(s->save(*x.l.file, x.l.state, req).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kvsnap
