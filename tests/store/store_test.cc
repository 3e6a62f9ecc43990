// The store end to end (src/store/store.h): every fixture saves and restores
// byte for byte, restores at other types equal `convert`, a flipped stored
// byte is caught, failed writes leave no snapshot, prefixes share chunks.
#include "store/store.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "base/os.h"
#include "base/sha256_lanes.h"
#include "format/state_builder.h"
#include "format/state_prefix.h"
#include "migrate/convert_state.h"
#include "store/archive.h"
#include "store/fault_io.h"
#include "store/store_caps_scenario.h"
#include "archive_edit.h"
#include "synthetic_cache.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

using test::slurp;

fs::path fixtures() { return fs::path(KVSNAP_SOURCE_DIR) / "fixtures"; }

struct TempStore {
  fs::path root;
  std::unique_ptr<Store> store;
  explicit TempStore(Io& io = posix_io()) {
    root = fs::temp_directory_path() / ("kvsnap-store-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(std::random_device{}()));
    auto s = Store::open(io, StorePaths{root.string()});
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) store = std::move(s).value();
  }
  ~TempStore() {
    store.reset();
    fs::remove_all(root);
  }
};

struct Loaded {
  std::vector<std::byte> bytes;
  std::unique_ptr<MemoryFile> file;
  StateFile state;
};

Loaded load(const fs::path& p, const ModelInfo* model = nullptr) {
  Loaded l;
  l.bytes = slurp(p);
  l.file = std::make_unique<MemoryFile>(p.filename().string(), std::span<const std::byte>(l.bytes));
  auto st = parse_for_model(*l.file, {}, model);
  EXPECT_TRUE(st.ok()) << p << ": " << st.status().ToString();
  if (st.ok()) l.state = std::move(st).value();
  return l;
}

// A session's first n tokens, as the file llama-server would have saved then.
struct Cut {
  VectorSink bytes;
  std::unique_ptr<MemoryFile> file;
  StateFile state;
};
std::unique_ptr<Cut> cut_to(const Loaded& l, uint64_t n) {
  auto c = std::make_unique<Cut>();
  EXPECT_TRUE(write_prefix(l.state, *l.file, n, c->bytes).ok());
  c->file = std::make_unique<MemoryFile>("cut.slot", std::span<const std::byte>(c->bytes.bytes));
  auto st = parse_state(*c->file);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  if (st.ok()) c->state = std::move(st).value();
  return c;
}

std::vector<fs::path> state_fixtures() {
  std::vector<fs::path> out;
  for (const char* dir : {"v0.5.0", "b8121", "b5640"})
    for (const auto& e : fs::directory_iterator(fixtures() / dir)) {
      const auto ext = e.path().extension();
      if (ext == ".slot" || ext == ".session" || ext == ".raw") out.push_back(e.path());
    }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Store, EveryFixtureRestoresByteForByte) {
  TempStore t;
  size_t n = 0;
  for (const auto& p : state_fixtures()) {
    if (p.extension() == ".raw") continue;  // raw buffers need --input-format; covered by the CLI tests
    Loaded l = load(p);
    SaveRequest req;
    // several chunks per layer, and transposed-V tiles that cross chunk borders, on some files;
    // the default elsewhere (each chunk is a file with its own fsync: keep the test quick)
    req.cells_per_chunk = (n % 4 == 0) ? 16 : kDefaultCellsPerChunk;
    auto saved = t.store->save(*l.file, l.state, req);
    ASSERT_TRUE(saved.ok()) << p << ": " << saved.status().ToString();
    VectorSink out;
    auto r = t.store->restore(std::to_string(saved->info.id), {}, out);
    ASSERT_TRUE(r.ok()) << p << ": " << r.status().ToString();
    EXPECT_EQ(out.bytes, l.bytes) << p;
    ++n;
  }
  EXPECT_GT(n, 40u);
  auto v = t.store->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems[0];
}

// The bytes a restore of snapshot `id` writes (none, and a test failure, when it fails).
std::vector<std::byte> restored(Store& s, int64_t id) {
  VectorSink out;
  Status st = s.restore(std::to_string(id), {}, out).status();
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out.bytes;
}

// A save's adaptive level hears its pack's disk (BlobWriteBatch::storage_waits, from the file the
// store's Io wrote: WritableFile::disk_waits): a disk that makes every append wait keeps every
// chunk compressed past the first bytes. A store, batch or file wrapper that dropped the count
// would leave the save to its thread's own count, by which this CPU-bound save, whose sink waits
// for the encoders, stores most chunks raw.
TEST(Store, TheAdaptiveLevelHearsThePacksDisk) {
  testing::SynthSpec spec;
  spec.cells = 3072;  // 2 layers of K and V, 4096 f16 values a cell each: 96 MiB, 2 MiB chunks
  spec.layers = {{1, 4096, 1, 4096}, {1, 4096, 1, 4096}};
  spec.f16_like = true;
  const std::vector<std::byte> bytes = testing::build_state(spec);
  MemoryFile file("big.slot", std::span<const std::byte>(bytes));
  auto state = parse_state(file);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  FaultInjectingIo io(posix_io());
  io.set_disk_waits(FaultInjectingIo::DiskWaits::kEveryAppend);
  TempStore t(io);
  SaveRequest req;  // the default level, auto
  req.threads = 2;
  auto saved = t.store->save(file, *state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto snap = t.store->open_snapshot(saved->info.uuid);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  size_t big = 0, raw = 0;
  for (const ChunkRef& c : (*snap)->reader().chunks()) {
    if (c.raw_size < (uint64_t(1) << 20)) continue;
    ++big;
    raw += c.codec != ChunkCodec::kZstd;
  }
  EXPECT_GT(big, 40u);
  EXPECT_EQ(raw, 0u) << "the pack's disk waited at every append: every chunk should be compressed";
}

// gc deletes every blob and pack its catalog does not name: a catalog pointed at another store's
// blobs (a new catalog.sqlite, a second host's SQLite catalog on the same bucket) must not save or
// collect there, or its first save's gc deletes every pack of the real store.
TEST(Store, ACatalogOverAnotherStoresBlobsSavesAndDeletesNothing) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  auto saved = t.store->save(*l.file, l.state, {});
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const fs::path id_file = t.root / kStoreIdName;
  ASSERT_TRUE(fs::exists(id_file)) << "the first save gives the blobs their store id";
  auto packs = [&] {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(t.root / "packs")) n += e.path().extension() == ".pack";
    return n;
  };
  ASSERT_EQ(packs(), 1u);

  const fs::path other = t.root.string() + "-other";
  StoreLocation wrong = directory_store(other.string());
  wrong.blobs = t.root.string();  // a new catalog over the first store's blobs
  auto s = Store::open(posix_io(), wrong);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto refused = (*s)->save(*l.file, l.state, {});
  ASSERT_EQ(refused.status().code(), Code::kMismatch) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("a new catalog"), std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(kStoreIdName), std::string::npos) << "names what to remove";
  auto gc = (*s)->gc(/*wait=*/true);
  ASSERT_EQ(gc.status().code(), Code::kMismatch) << (gc.ok() ? "gc ran" : gc.status().ToString());
  EXPECT_EQ(packs(), 1u) << "the other catalog's gc deleted the store's pack";

  // A catalog with an id of its own over them: refused the same way, naming both ids.
  s->reset();
  fs::remove_all(other);
  {
    TempStore elsewhere;
    ASSERT_TRUE(elsewhere.store->save(*l.file, l.state, {}).ok());
    elsewhere.store.reset();
    StoreLocation mixed = directory_store(elsewhere.root.string());
    mixed.blobs = t.root.string();
    auto m = Store::open(posix_io(), mixed);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    auto g = (*m)->gc(/*wait=*/true);
    ASSERT_EQ(g.status().code(), Code::kMismatch);
    EXPECT_NE(g.status().message().find(" has id "), std::string::npos) << g.status().ToString();
  }
  EXPECT_EQ(packs(), 1u);
  EXPECT_EQ(restored(*t.store, saved->info.id), l.bytes);
  fs::remove_all(other);
}

// A store from before store ids (or one whose id file a crash lost after the catalog took its id)
// gets the catalog's id beside its blobs at its next save; a damaged id file is refused by name.
TEST(Store, TheBlobsTakeTheCatalogsIdAndADamagedIdIsRefused) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  ASSERT_TRUE(t.store->save(*l.file, l.state, {}).ok());
  const fs::path id_file = t.root / kStoreIdName;
  const std::vector<std::byte> id = slurp(id_file);
  ASSERT_EQ(id.size(), 36u);
  fs::remove(id_file);
  t.store.reset();
  t.store = std::move(Store::open(posix_io(), StorePaths{t.root.string()})).value();
  auto gc = t.store->gc(/*wait=*/true);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(slurp(id_file), id) << "the catalog's id, written again";

  // A hand-written copy (capitals, a newline) is the same id.
  std::string upper(reinterpret_cast<const char*>(id.data()), id.size());
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  std::ofstream(id_file, std::ios::trunc) << upper << "\n";
  ASSERT_TRUE(t.store->gc(/*wait=*/true).ok());

  // Blobs from before store ids under a new, empty catalog: refused, not given its id.
  fs::remove(id_file);
  {
    const fs::path other = t.root.string() + "-empty";
    StoreLocation fresh = directory_store(other.string());
    fresh.blobs = t.root.string();
    auto s = Store::open(posix_io(), fresh);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto gc2 = (*s)->gc(/*wait=*/true);
    ASSERT_EQ(gc2.status().code(), Code::kMismatch) << (gc2.ok() ? "gc ran" : gc2.status().ToString());
    EXPECT_NE(gc2.status().message().find("names none of them"), std::string::npos) << gc2.status().ToString();
    EXPECT_FALSE(fs::exists(id_file)) << "the new catalog's id was given to the blobs";
    s->reset();
    fs::remove_all(other);
  }
  ASSERT_TRUE(t.store->gc(/*wait=*/true).ok()) << "the store's own catalog names them";
  EXPECT_EQ(slurp(id_file), id);

  std::ofstream(id_file, std::ios::trunc) << "not an id";
  t.store.reset();
  t.store = std::move(Store::open(posix_io(), StorePaths{t.root.string()})).value();
  auto refused = t.store->save(*l.file, l.state, {});
  ASSERT_EQ(refused.status().code(), Code::kCorruption) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(id_file.string()), std::string::npos) << refused.status().ToString();
}

TEST(Store, RestoreAtOtherTypesEqualsConvert) {
  TempStore t;
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok());
  for (const char* name : {"v0.5.0/hd64-f16-f16-faon.slot", "v0.5.0/hd64-f16-f16-faoff.slot",
                           "b8121/hd64-q8_0-q8_0-faon.slot"}) {
    Loaded l = load(fixtures() / name, &*model);
    SaveRequest sreq;
    sreq.model = &*model;
    auto saved = t.store->save(*l.file, l.state, sreq);
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    for (const char* types : {"q8_0", "q4_0", "f16"}) {
      ConversionSpec spec;
      spec.ctk = spec.ctv = types;
      spec.flash_attn = "on";
      const bool old_quantized = std::string(name).starts_with("b8121/hd64-q8_0");
      if (old_quantized && std::string(types) != "q8_0") {
        // A ggsq v2 file does not say whether its build rotated: never guessed.
        RestoreRequest unsure;
        unsure.spec = spec;
        VectorSink none;
        auto r = t.store->restore(std::to_string(saved->info.id), unsure, none);
        ASSERT_FALSE(r.ok()) << name << " " << types;
        EXPECT_EQ(r.status().code(), Code::kAmbiguous) << r.status().ToString();
      }
      if (old_quantized) spec.source_build = "b8121";
      // what `kvsnap convert --model` writes
      auto req = make_request(spec, l.state, &*model, name);
      ASSERT_TRUE(req.ok()) << req.status().ToString();
      VectorSink want;
      ASSERT_TRUE(convert_state(l.state, *l.file, *req, want).ok());
      // restore without --model uses the head dims recorded at save
      RestoreRequest rreq;
      rreq.spec = spec;
      VectorSink got;
      auto r = t.store->restore(std::to_string(saved->info.id), rreq, got);
      ASSERT_TRUE(r.ok()) << name << " " << types << ": " << r.status().ToString();
      EXPECT_EQ(got.bytes, want.bytes) << name << " -> " << types;
      EXPECT_TRUE(r->converted);
    }
  }
}

// An old-format original restored at other types is upgraded to the v0.5.0 format, whose files of
// an M-RoPE model hold a cell extra the old file lacks. Whether the model is one: from --model,
// else from what the save recorded of the model (cell_ext_bytes), else the restore is refused.
TEST(Store, AnOldFormatRestoreAtOtherTypesNeedsTheModelOrWhatTheSaveRecorded) {
  TempStore t;
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok());
  Loaded l = load(fixtures() / "b8121/hd64-f16-f16-faon.slot", &*model);
  RestoreRequest rreq;
  rreq.spec.ctk = rreq.spec.ctv = "q8_0";

  auto bare = t.store->save(*l.file, l.state, {});
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  auto snap = t.store->open_snapshot(bare->info.uuid);
  ASSERT_TRUE(snap.ok());
  EXPECT_FALSE((*snap)->reader().manifest().model.has_value());
  VectorSink none;
  auto refused = t.store->restore(bare->info.uuid, rreq, none);
  ASSERT_EQ(refused.status().code(), Code::kAmbiguous) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("needs the model"), std::string::npos) << refused.status().ToString();
  EXPECT_TRUE(none.bytes.empty());
  RestoreRequest with_model = rreq;
  with_model.model = &*model;
  VectorSink given;
  ASSERT_TRUE(t.store->restore(bare->info.uuid, with_model, given).ok());

  SaveRequest sreq;
  sreq.model = &*model;
  auto recorded = t.store->save(*l.file, l.state, sreq);
  ASSERT_TRUE(recorded.ok()) << recorded.status().ToString();
  snap = t.store->open_snapshot(recorded->info.uuid);
  ASSERT_TRUE(snap.ok());
  ASSERT_TRUE((*snap)->reader().manifest().model.has_value());
  EXPECT_EQ((*snap)->reader().manifest().model->cell_ext_bytes, std::optional<uint32_t>(0));
  VectorSink got;
  auto r = t.store->restore(recorded->info.uuid, rreq, got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(got.bytes, given.bytes) << "the recorded model decides as the model does";

  // A recorded M-RoPE extra: the upgrade cannot rebuild it (what --model of such a model says).
  ConversionSpec spec = rreq.spec;
  spec.cell_ext_bytes = 12;
  auto mrope = make_request(spec, l.state, nullptr, "old.slot");
  ASSERT_EQ(mrope.status().code(), Code::kNotSupported) << mrope.status().ToString();
  EXPECT_NE(mrope.status().message().find("M-RoPE cell extra"), std::string::npos) << mrope.status().ToString();
  spec.format = "ggsq-v2";
  EXPECT_TRUE(make_request(spec, l.state, nullptr, "old.slot").ok()) << "its own format needs no extra";
}

// A build reported by llama-server at save is recorded as such and decides the rotation of a
// restore that converts, as the same build named at convert time would.
TEST(Store, AServerReportedBuildIsRecordedAndUsedByRestores) {
  TempStore t;
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok());
  Loaded l = load(fixtures() / "b10361/hd64-q8_0-q8_0-faon.slot", &*model);
  SaveRequest sreq;
  sreq.model = &*model;
  sreq.writer.llama_build = "b10361";
  sreq.writer.llama_build_from = "llama-server";
  sreq.writer.reported_build = "b10361-4f0a0c2";
  auto saved = t.store->save(*l.file, l.state, sreq);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto snap = t.store->open_snapshot(saved->info.uuid);
  ASSERT_TRUE(snap.ok());
  const SourceClaims& w = (*snap)->reader().manifest().provenance.writer;
  EXPECT_EQ(w.llama_build, "b10361");
  EXPECT_EQ(w.llama_build_from, "llama-server");
  EXPECT_EQ(w.reported_build, "b10361-4f0a0c2");

  ConversionSpec spec;
  spec.ctk = spec.ctv = "f16";
  spec.server_build = "b10361";
  auto req = make_request(spec, l.state, &*model, "b10361 slot");
  ASSERT_TRUE(req.ok()) << req.status().ToString();
  VectorSink want;
  ASSERT_TRUE(convert_state(l.state, *l.file, *req, want).ok());
  RestoreRequest rreq;
  rreq.spec.ctk = rreq.spec.ctv = "f16";
  VectorSink got;
  auto r = t.store->restore(saved->info.uuid, rreq, got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(got.bytes == want.bytes);

  // A claim the file contradicts is refused before anything is stored.
  sreq.writer.llama_build = "v0.5.0";
  auto wrong = t.store->save(*l.file, l.state, sreq);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Code::kMismatch) << wrong.status().ToString();
}

TEST(Store, TokenPrefixRestoreAndSharedChunks) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto a = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(a.ok());
  // a second session that shares the first 64 tokens
  VectorSink cut;
  ASSERT_TRUE(write_prefix(l.state, *l.file, 64, cut).ok());
  MemoryFile cut_file("cut.slot", std::span<const std::byte>(cut.bytes));
  auto cut_state = parse_state(cut_file);
  ASSERT_TRUE(cut_state.ok());
  auto b = t.store->save(cut_file, *cut_state, req);
  ASSERT_TRUE(b.ok());
  EXPECT_LT(b->chunks_new, b->chunks) << "the shared prefix's chunks are stored once";
  EXPECT_EQ(b->info.parent_id.value_or(-1), -1) << "a shorter session has no stored prefix";
  // --tokens 64 of the long one == the short one
  RestoreRequest rr;
  rr.tokens = 64;
  VectorSink got;
  ASSERT_TRUE(t.store->restore(std::to_string(a->info.id), rr, got).ok());
  EXPECT_EQ(got.bytes, cut.bytes);
  // and find(): the short one is a prefix of the long one's tokens
  auto found = t.store->catalog().find_prefix(l.state.tokens.tokens);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0].id, a->info.id);
  EXPECT_EQ((*found)[1].id, b->info.id);
}

// A session saved after its own prefix (a conversation that went on): the prefix is its parent,
// only the new chunks are written, and it restores and verifies byte for byte, in one go and in
// blocks cut at chunk boundaries on several threads.
TEST(Store, AnExtensionOfAStoredSessionWritesOnlyItsNewChunks) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  auto cut = cut_to(l, 64);
  SaveRequest req;
  req.cells_per_chunk = 16;
  req.threads = 2;
  auto base = t.store->save(*cut->file, cut->state, req);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  auto ext = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(ext.ok()) << ext.status().ToString();
  EXPECT_EQ(ext->info.parent_id.value_or(-1), base->info.id);
  EXPECT_LT(ext->chunks_new, ext->chunks / 2) << "the parent's chunks are not written again";
  for (int threads : {1, 2, 3}) {
    RestoreRequest rr;
    rr.spec.threads = threads;
    VectorSink got;
    ASSERT_TRUE(t.store->restore(std::to_string(ext->info.id), rr, got).ok());
    EXPECT_TRUE(got.bytes == l.bytes) << threads << " threads";
  }
  auto v = t.store->verify({});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
}

// The extension goes on from a cell count that is not a multiple of the chunk's (70 of 16 cells:
// every layer's last chunk of the parent is partial). It continues the parent's cell grid (format
// version 4), so its new chunks hold its new cells only, one frame chunk aside; a second save of
// the same file on that grid writes nothing new, both restore and verify, and an export of it
// imports into another store.
TEST(Store, AnExtensionStoresOnlyItsNewCells) {
  for (const char* fixture : {"v0.5.0/hd64-f16-f16-faoff.slot", "v0.5.0/hd64-f16-f16-faon.slot"}) {
    SCOPED_TRACE(fixture);
    TempStore t;
    Loaded l = load(fixtures() / fixture);
    const uint64_t cells = l.state.memory.kv.at(0).streams.at(0).cell_count;
    ASSERT_GT(cells, 70u + 16u);
    auto cut = cut_to(l, 70);
    SaveRequest req;
    req.cells_per_chunk = 16;
    auto base = t.store->save(*cut->file, cut->state, req);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    auto ext = t.store->save(*l.file, l.state, req);
    ASSERT_TRUE(ext.ok()) << ext.status().ToString();
    EXPECT_EQ(ext->info.parent_id.value_or(-1), base->info.id);
    auto sr = t.store->open_snapshot(std::to_string(ext->info.id));
    ASSERT_TRUE(sr.ok()) << sr.status().ToString();
    const SnapshotManifest& m = (*sr)->reader().manifest();
    EXPECT_EQ(m.format_version, 4u);
    uint64_t tensor_segments = 0;
    for (const Segment& s : m.segments.segments) tensor_segments += s.kind != SegmentKind::kFrame;
    EXPECT_EQ(ext->chunks_new, m.segments.n_frame_chunks + tensor_segments * ((cells - 70 + 15) / 16))
        << "the new cells' chunks and the frame";
    auto again = t.store->save(*l.file, l.state, req);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->chunks_new, 0u);
    for (int64_t id : {ext->info.id, again->info.id}) {
      VectorSink got;
      ASSERT_TRUE(t.store->restore(std::to_string(id), {}, got).ok());
      EXPECT_TRUE(got.bytes == l.bytes);
    }
    auto v = t.store->verify({});
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_TRUE(v->problems.empty()) << v->problems.front();
    // An export carries the version-4 manifest (a version-4 .kvsnap file), and another store
    // imports and restores it.
    const std::string archive = (t.root / "out.tar.zst").string();
    ASSERT_TRUE(t.store->export_to({std::to_string(ext->info.id)}, archive).ok());
    TempStore other;
    auto imported = other.store->import_from(archive);
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    ASSERT_EQ(imported->imported.size(), 1u);
    VectorSink got;
    ASSERT_TRUE(other.store->restore(imported->imported[0].uuid, {}, got).ok());
    EXPECT_TRUE(got.bytes == l.bytes);
    auto reopened = other.store->open_snapshot(imported->imported[0].uuid);
    ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
    EXPECT_EQ((*reopened)->reader().manifest().format_version, 4u);
  }
}

// Caps (eviction.h): a store cap enforced after a save evicts the least recently restored and expired
// snapshots, never a pinned one nor the one just saved, never a chunk a remaining snapshot uses.
// The store-level cap (run for PostgreSQL too: tests/postgres/pg_store_test.cc).
TEST(Store, CapEnforcedWithPinsKept) {
  TempStore t;
  test::cap_enforced_with_pins_kept(*t.store);
}

// Every stored byte matters: flip one in each blob in turn, then in the manifest.
TEST(Store, FlippedStoredBytesAreCaught) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  SaveRequest req;
  req.cells_per_chunk = 32;
  auto saved = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok());
  const std::string id = std::to_string(saved->info.id);
  // Every stored blob: a byte range of a pack (where the catalog says) or a loose file.
  struct Blob {
    fs::path file;
    uint64_t offset, size;
  };
  std::vector<Blob> blobs;
  auto uses = t.store->catalog().chunks_of(saved->info.id);
  ASSERT_TRUE(uses.ok());
  std::set<std::string> seen;
  for (const ChunkUse& u : *uses) {
    if (!seen.insert(u.sha256.hex()).second) continue;
    if (u.pack.empty()) blobs.push_back({t.root / "chunks" / u.sha256.hex().substr(0, 2) / u.sha256.hex(), 0, u.stored_size});
    else blobs.push_back({t.root / "packs" / (u.pack + ".pack"), u.pack_offset, u.stored_size});
  }
  ASSERT_GT(blobs.size(), 3u);
  std::mt19937 rng(3);
  for (const auto& blob : blobs) {
    auto bytes = slurp(blob.file);
    ASSERT_LE(blob.offset + blob.size, bytes.size()) << blob.file;
    const size_t at = blob.offset + rng() % blob.size;
    bytes[at] ^= std::byte{0x10};
    std::ofstream(blob.file, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
    auto v = t.store->verify({id});
    ASSERT_TRUE(v.ok());
    EXPECT_FALSE(v->problems.empty()) << blob.file << " byte " << at;
    VectorSink out;
    EXPECT_FALSE(t.store->restore(id, {}, out).ok()) << blob.file << " byte " << at;
    // Nor exported (a review's finding: the blobs were copied unchecked, exit 0, into an archive
    // that no import took).
    const fs::path archive = t.root.string() + "-export.tar";
    const Status exported = t.store->export_to({id}, archive.string(), false, false);
    EXPECT_EQ(exported.code(), Code::kCorruption) << blob.file << " byte " << at << ": " << exported.ToString();
    EXPECT_NE(exported.message().find("is damaged in the store, nothing exported"), std::string::npos) << exported.ToString();
    EXPECT_FALSE(fs::exists(archive));
    bytes[at] ^= std::byte{0x10};
    std::ofstream(blob.file, std::ios::binary | std::ios::trunc).write(reinterpret_cast<char*>(bytes.data()), bytes.size());
  }
  auto clean = t.store->verify({id});
  ASSERT_TRUE(clean.ok());
  EXPECT_TRUE(clean->problems.empty());
  // the manifest, inside the catalog
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((t.root / "catalog.sqlite").c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT manifest FROM snapshot_blobs", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  std::vector<unsigned char> m(static_cast<const unsigned char*>(sqlite3_column_blob(st, 0)),
                               static_cast<const unsigned char*>(sqlite3_column_blob(st, 0)) + sqlite3_column_bytes(st, 0));
  sqlite3_finalize(st);
  m[m.size() / 2] ^= 0x01;
  ASSERT_EQ(sqlite3_prepare_v2(db, "UPDATE snapshot_blobs SET manifest = ?", -1, &st, nullptr), SQLITE_OK);
  sqlite3_bind_blob(st, 1, m.data(), int(m.size()), SQLITE_TRANSIENT);
  ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  sqlite3_close(db);
  auto v = t.store->verify({id});
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->problems.empty());
  VectorSink out;
  EXPECT_FALSE(t.store->restore(id, {}, out).ok());
}

size_t files_under(const fs::path& p) {
  size_t n = 0;
  if (fs::exists(p))
    for (const auto& e : fs::recursive_directory_iterator(p)) n += e.is_regular_file();
  return n;
}

// A failed write or fsync anywhere in a save: an error, no snapshot, and gc
// cleans up whatever blobs were written.
TEST(Store, FailedSaveLeavesNoSnapshot) {
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  for (FaultOp op : {FaultOp::kAppend, FaultOp::kSync, FaultOp::kRename, FaultOp::kSyncDir}) {
    for (int nth : {1, 5}) {
      FaultInjectingIo io(posix_io());
      TempStore t(io);
      io.fail_nth(op, nth, ENOSPC);
      SaveRequest req;
      req.cells_per_chunk = 16;
      auto saved = t.store->save(*l.file, l.state, req);
      if (io.injected() == 0) continue;  // the fault was past the last such operation
      EXPECT_FALSE(saved.ok()) << fault_op_name(op) << " #" << nth;
      auto all = t.store->catalog().list();
      ASSERT_TRUE(all.ok());
      EXPECT_TRUE(all->empty()) << fault_op_name(op) << " #" << nth << ": a snapshot is visible after a failed save";
      io.clear();
      auto gc = t.store->gc(true);
      ASSERT_TRUE(gc.ok()) << gc.status().ToString();
      const size_t left = files_under(t.root / "chunks") + files_under(t.root / "packs") + files_under(t.root / "tmp");
      EXPECT_EQ(left, 0u) << fault_op_name(op) << " #" << nth << ": gc left blobs or packs";
      // and the store still works
      auto again = t.store->save(*l.file, l.state, req);
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      EXPECT_EQ(restored(*t.store, again->info.id), l.bytes);
    }
  }
}


// A save writes one pack; a pack goes when no chunk row names it any more,
// not before (a second snapshot sharing its chunks keeps it).
TEST(Store, APackLivesAsLongAsAChunkInItIsUsed) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto a = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(files_under(t.root / "packs"), 1u);
  EXPECT_EQ(files_under(t.root / "chunks"), 0u);
  EXPECT_EQ(files_under(t.root / "tmp"), 0u);
  auto b = t.store->save(*l.file, l.state, req);  // every chunk known: nothing written, no pack
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->chunks_new, 0u);
  EXPECT_EQ(files_under(t.root / "packs"), 1u);
  ASSERT_TRUE(t.store->remove(std::to_string(a->info.id)).ok());
  ASSERT_TRUE(t.store->gc(true).ok());
  EXPECT_EQ(files_under(t.root / "packs"), 1u) << "b still uses the pack a wrote";
  EXPECT_EQ(restored(*t.store, b->info.id), l.bytes);
  ASSERT_TRUE(t.store->remove(std::to_string(b->info.id)).ok());
  auto gc = t.store->gc(true);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(files_under(t.root / "packs"), 0u);
  auto v = t.store->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
}

uint64_t pack_bytes(const fs::path& root) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(root / "packs")) n += fs::file_size(e.path());
  return n;
}

// A long session and a short one sharing its first tokens (two sessions after one system prompt):
// removing the long one leaves its pack mostly dead, and the removal's gc compacts it, so that the
// packs hold exactly the stored bytes the catalog counts (what a cap is measured in).
TEST(Store, RemovingASnapshotCompactsThePackItLeftMostlyDead) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  auto shorter = cut_to(l, l.state.tokens.tokens.size() / 4);
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto a = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = t.store->save(*shorter->file, shorter->state, req);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_GT(b->chunks, b->chunks_new) << "b shares a's first chunks";
  const uint64_t before = pack_bytes(t.root);
  ASSERT_TRUE(t.store->remove(std::to_string(a->info.id)).ok());
  auto stats = t.store->catalog().stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(pack_bytes(t.root), stats->stored_bytes) << "no dead bytes left";
  EXPECT_LT(pack_bytes(t.root) * 2, before);
  EXPECT_EQ(files_under(t.root / "packs"), 2u) << "b's own pack and the compacted one";
  EXPECT_EQ(files_under(t.root / "tmp"), 0u);
  EXPECT_EQ(restored(*t.store, b->info.id), shorter->bytes.bytes);
  auto v = t.store->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
  ASSERT_TRUE(t.store->remove(std::to_string(b->info.id)).ok());
  EXPECT_EQ(files_under(t.root / "packs"), 0u);
}

// A save over its cap whose eviction's collection fails (the evicted snapshot's pack cannot be
// deleted): the save and the eviction are durable, so the save succeeds and says what was left
// (gc_warnings) rather than failing; the next gc deletes the pack.
TEST(Store, ASaveWhoseEvictionsCollectionFailsSucceedsWithAWarning) {
  FaultInjectingIo io(posix_io());
  TempStore t(io);
  Loaded a = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot"), b = load(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  auto first = t.store->save(*a.file, a.state, {});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string pack = t.store->catalog().chunks_of(first->info.id)->front().pack;
  t.store->set_caps({uint64_t{1}, {}, std::nullopt});
  io.fail_matching(FaultOp::kRemove, pack + ".pack", EIO);
  auto second = t.store->save(*b.file, b.state, {});
  ASSERT_TRUE(second.ok()) << "a failed collection failed the save: " << second.status().ToString();
  ASSERT_EQ(second->evicted.size(), 1u);
  ASSERT_EQ(second->gc_warnings.size(), 1u);
  EXPECT_NE(second->gc_warnings[0].find("the collection after the evictions failed"), std::string::npos)
      << second->gc_warnings[0];
  EXPECT_TRUE(fs::exists(t.root / "packs" / (pack + ".pack")));
  io.clear();
  ASSERT_TRUE(t.store->gc(true).ok());
  EXPECT_FALSE(fs::exists(t.root / "packs" / (pack + ".pack")));
  EXPECT_EQ(restored(*t.store, second->info.id), b.bytes);
}

// A `kvsnap rm` while gc compacts (its own gc skipped: busy): the snapshot it removes has chunks in
// the pack being copied. Its rows (refcount 0 now) still name where they were, so the move goes
// through; the next gc deletes them, and the kept snapshot restores byte for byte throughout.
TEST(Store, ARemovalDuringCompactionLeavesTheNextGcItsChunks) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  auto quarter = cut_to(l, l.state.tokens.tokens.size() / 4), half = cut_to(l, l.state.tokens.tokens.size() / 2);
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto whole = t.store->save(*l.file, l.state, req);
  auto q = t.store->save(*quarter->file, quarter->state, req);
  auto h = t.store->save(*half->file, half->state, req);
  ASSERT_TRUE(whole.ok() && q.ok() && h.ok());
  ASSERT_TRUE(t.store->catalog().remove_snapshot(whole->info.id).ok());  // half of whole's pack dead
  bool removed = false;
  auto gc = t.store->gc(
      true,
      [&](const GcProgress& p) {
        if (p.compacting && !removed) {  // between two blobs of the copy
          removed = true;
          GcReport skipped;
          EXPECT_TRUE(t.store->remove(std::to_string(h->info.id), &skipped).ok());
          EXPECT_TRUE(skipped.skipped_busy) << "rm's own gc ran beside the compaction";
        }
        return Status::OK();
      },
      25);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  ASSERT_TRUE(removed);
  EXPECT_EQ(gc->packs_compacted, 1u);
  EXPECT_TRUE(gc->warnings.empty()) << gc->warnings.front();
  auto v = t.store->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
  EXPECT_EQ(restored(*t.store, q->info.id), quarter->bytes.bytes);
  ASSERT_GT(pack_bytes(t.root), t.store->catalog().stats()->stored_bytes) << "the removed half was copied too";
  auto next = t.store->gc(true, {}, 1);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(pack_bytes(t.root), t.store->catalog().stats()->stored_bytes) << "the next gc left no dead bytes";
  EXPECT_EQ(restored(*t.store, q->info.id), quarter->bytes.bytes);
}

// Compaction takes packs at least --compact-dead percent dead (0: none); stopped before its move
// (Ctrl-C) it leaves the store as it was; a pack it cannot read is left and named, and gc goes on.
TEST(Store, GcCompactsPacksDeadEnoughStopsCleanlyAndLeavesAnUnreadablePack) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  auto most = cut_to(l, l.state.tokens.tokens.size() * 9 / 10);
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto a = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = t.store->save(*most->file, most->state, req);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const fs::path a_pack = t.root / "packs" / (t.store->catalog().chunks_of(a->info.id)->front().pack + ".pack");
  ASSERT_TRUE(t.store->remove(std::to_string(a->info.id)).ok());  // ~10% dead: under the default 25
  ASSERT_TRUE(fs::exists(a_pack));
  const uint64_t dead = pack_bytes(t.root) - t.store->catalog().stats()->stored_bytes;
  ASSERT_GT(dead, 0u);
  ASSERT_LT(dead * 4, fs::file_size(a_pack));

  auto none = t.store->gc(true, {}, 0);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->packs_compacted, 0u);
  EXPECT_TRUE(fs::exists(a_pack));

  int copies = 0;
  auto stopped = t.store->gc(
      true,
      [&](const GcProgress& p) {
        if (!p.compacting) return Status::OK();
        return ++copies == 3 ? Status::Interrupted("told to stop") : Status::OK();
      },
      1);
  EXPECT_EQ(stopped.status().code(), Code::kInterrupted);
  EXPECT_EQ(copies, 3) << "stopped in the middle of the pack's copy";
  EXPECT_TRUE(fs::exists(a_pack));
  EXPECT_EQ(files_under(t.root / "packs"), 2u) << "no compacted pack appeared";
  EXPECT_EQ(files_under(t.root / "tmp"), 0u) << "its temporary went with it";

  const fs::path whole = t.root.string() + "-whole.pack";
  fs::copy_file(a_pack, whole);
  // Shorter by half its dead bytes: still more than the live bytes, so it is dead enough, but b's
  // last chunk (dead bytes are a's tails, one per layer's K and V) is cut off.
  fs::resize_file(a_pack, fs::file_size(a_pack) - dead / 2);
  auto hurt = t.store->gc(true, {}, 1);
  ASSERT_TRUE(hurt.ok()) << hurt.status().ToString();
  EXPECT_EQ(hurt->packs_compacted, 0u);
  ASSERT_EQ(hurt->warnings.size(), 1u);
  EXPECT_NE(hurt->warnings[0].find(a_pack.stem().string()), std::string::npos) << hurt->warnings[0];
  EXPECT_TRUE(fs::exists(a_pack));
  EXPECT_EQ(files_under(t.root / "packs"), 2u) << "no compacted copy of it appeared";
  fs::rename(whole, a_pack);
  t.store.reset();  // a store keeps its packs open: the repaired one is another file
  t.store = std::move(Store::open(posix_io(), StorePaths{t.root.string()})).value();

  auto gc = t.store->gc(true, {}, 1);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->packs_compacted, 1u);
  EXPECT_EQ(gc->compacted_bytes_freed, dead);
  EXPECT_FALSE(fs::exists(a_pack));
  EXPECT_EQ(pack_bytes(t.root), t.store->catalog().stats()->stored_bytes);
  EXPECT_EQ(restored(*t.store, b->info.id), most->bytes.bytes);
  auto v = t.store->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
}

// Two packs three quarters dead (two sessions, each removed while its first quarter stays): 0 never
// compacts them; a pack whose reads fail (EIO) is left and named while the other is compacted, and
// the next gc takes it once it reads.
TEST(Store, AReadErrorLeavesThatPackAndTheNextIsCompacted) {
  FaultInjectingIo io(posix_io());
  TempStore t(io);
  SaveRequest req;
  req.cells_per_chunk = 16;
  std::vector<std::string> packs;
  std::vector<std::pair<int64_t, std::vector<std::byte>>> kept;
  std::vector<Loaded> sessions;
  for (const char* f : {"v0.5.0/hd64-f16-f16-faon.slot", "v0.5.0/hd64-q8_0-q8_0-faon.slot"}) {
    sessions.push_back(load(fixtures() / f));
    const Loaded& l = sessions.back();
    auto quarter = cut_to(l, l.state.tokens.tokens.size() / 4);
    auto whole = t.store->save(*l.file, l.state, req);
    ASSERT_TRUE(whole.ok()) << f << ": " << whole.status().ToString();
    auto part = t.store->save(*quarter->file, quarter->state, req);
    ASSERT_TRUE(part.ok()) << f << ": " << part.status().ToString();
    ASSERT_GT(part->chunks, part->chunks_new) << f;
    packs.push_back(t.store->catalog().chunks_of(whole->info.id)->front().pack);
    ASSERT_TRUE(t.store->catalog().remove_snapshot(whole->info.id).ok());  // rows only: no gc yet
    kept.emplace_back(part->info.id, quarter->bytes.bytes);
  }
  // The preview counts the rows removed but not yet forgotten (no gc ran) as gone already.
  const CompactionPlan plan = t.store->plan_compaction(GcOptions::kDefaultCompactDeadPercent);
  EXPECT_EQ(plan.packs.size(), 2u);
  EXPECT_TRUE(plan.warnings.empty());
  EXPECT_TRUE(t.store->plan_compaction(0).packs.empty());
  auto none = t.store->gc(true, {}, 0);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->packs_compacted, 0u) << "0: never, however dead";
  ASSERT_GT(pack_bytes(t.root), t.store->catalog().stats()->stored_bytes * 2);

  io.fail_matching(FaultOp::kRead, packs[0] + ".pack", EIO);
  auto hurt = t.store->gc(true);
  ASSERT_TRUE(hurt.ok()) << hurt.status().ToString();
  EXPECT_EQ(hurt->packs_compacted, 1u) << "the other pack";
  ASSERT_EQ(hurt->warnings.size(), 1u);
  EXPECT_NE(hurt->warnings[0].find("pack " + packs[0] + " not compacted"), std::string::npos) << hurt->warnings[0];
  EXPECT_TRUE(fs::exists(t.root / "packs" / (packs[0] + ".pack")));
  EXPECT_FALSE(fs::exists(t.root / "packs" / (packs[1] + ".pack")));
  EXPECT_EQ(files_under(t.root / "packs"), 4u) << "two of the quarters', the other's compacted copy, the hurt one";
  EXPECT_EQ(files_under(t.root / "tmp"), 0u);

  io.clear();
  auto gc = t.store->gc(true);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->packs_compacted, 1u);
  EXPECT_TRUE(gc->warnings.empty());
  EXPECT_EQ(pack_bytes(t.root), t.store->catalog().stats()->stored_bytes);
  for (const auto& [id, bytes] : kept) {
    EXPECT_EQ(restored(*t.store, id), bytes);
  }
}

// gc reports its plan (files and bytes) and each deletion; an error from the callback stops it before
// its next deletion, the store stays whole, and the next gc deletes the rest.
TEST(Store, GcReportsProgressAndStopsWhenToldTo) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  SaveRequest req;
  req.cells_per_chunk = 16;
  auto kept = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  // garbage as crashed saves leave it: packs no row names, temporaries
  const fs::path pack = fs::directory_iterator(t.root / "packs")->path();
  uint64_t garbage = 0;
  for (const char* name : {"00000000000000a1", "00000000000000a2", "00000000000000a3"}) {
    fs::copy_file(pack, t.root / "packs" / (std::string(name) + ".pack"));
    garbage += fs::file_size(pack);
  }
  std::ofstream(t.root / "tmp" / "save-crashed", std::ios::binary) << std::string(1000, 'x');
  garbage += 1000;
  std::vector<GcProgress> seen;
  auto stopped = t.store->gc(true, [&](const GcProgress& p) {
    seen.push_back(p);
    return p.files_done == 2 ? Status::Interrupted("told to stop") : Status::OK();
  });
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), Code::kInterrupted);
  ASSERT_EQ(seen.size(), 3u);  // the plan, then one call per deletion until the stop
  EXPECT_EQ(seen[0].files_total, 4u);
  EXPECT_EQ(seen[0].bytes_total, garbage);
  EXPECT_EQ(seen[0].files_done, 0u);
  EXPECT_EQ(seen[0].bytes_done, 0u);
  EXPECT_GT(seen[2].bytes_done, seen[1].bytes_done);
  EXPECT_EQ(files_under(t.root / "packs") + files_under(t.root / "tmp"), 1u + 2u) << "two deletions, then the stop";
  auto v = t.store->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
  seen.clear();
  auto rest = t.store->gc(true, [&](const GcProgress& p) {
    seen.push_back(p);
    return Status::OK();
  });
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ(rest->packs_deleted + rest->temporaries_deleted, 2u);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().files_done, seen.back().files_total);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_EQ(files_under(t.root / "packs"), 1u);
  EXPECT_EQ(files_under(t.root / "tmp"), 0u);
  EXPECT_EQ(restored(*t.store, kept->info.id), l.bytes);
}

// Stores written before packs keep one loose file per chunk (chunk rows with
// no pack): they still restore, verify, and survive gc.
TEST(Store, LooseBlobsOfEarlierStoresStillRead) {
  TempStore t;
  Loaded l = load(fixtures() / "v0.5.0/hd64-q8_0-q8_0-faon.slot");
  SaveRequest req;
  req.cells_per_chunk = 32;
  auto saved = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto uses = t.store->catalog().chunks_of(saved->info.id);
  ASSERT_TRUE(uses.ok());
  ASSERT_GT(uses->size(), 3u);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((t.root / "catalog.sqlite").c_str(), &db), SQLITE_OK);
  for (const ChunkUse& u : *uses) {
    ASSERT_FALSE(u.pack.empty());
    auto pack = slurp(t.root / "packs" / (u.pack + ".pack"));
    const fs::path loose = t.root / "chunks" / u.sha256.hex().substr(0, 2) / u.sha256.hex();
    fs::create_directories(loose.parent_path());
    std::ofstream(loose, std::ios::binary).write(reinterpret_cast<char*>(pack.data() + u.pack_offset), u.stored_size);
    ASSERT_EQ(sqlite3_exec(db, ("UPDATE chunks SET pack = NULL, pack_offset = NULL WHERE hex(sha256) = upper('" +
                                u.sha256.hex() + "')").c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  }
  sqlite3_close(db);
  for (const auto& e : fs::directory_iterator(t.root / "packs")) fs::remove(e.path());
  auto s = Store::open(posix_io(), StorePaths{t.root.string()});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->gc(true).ok());
  EXPECT_GT(files_under(t.root / "chunks"), 3u) << "gc kept the loose blobs";
  VectorSink out;
  auto r = (*s)->restore(std::to_string(saved->info.id), {}, out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(out.bytes, l.bytes);
  auto v = (*s)->verify({});
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->problems.empty()) << v->problems.front();
}

// A review's finding: `verify --all` reported a snapshot removed while it ran as damaged ("not found:
// no snapshot with id N", exit 3) or stopped at it. Both snapshots are removed while verify waits at
// its first pack: the one being checked (its rows read, its packs held) is checked to the end, the
// one not reached yet is noted, and neither is a problem.
TEST(Store, VerifyAllNotesSnapshotsRemovedWhileItRuns) {
  TempStore t;
  Loaded a = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  Loaded b = load(fixtures() / "b8121/hd64-f16-f16-faon.slot");
  auto sa = t.store->save(*a.file, a.state, SaveRequest{});
  auto sb = t.store->save(*b.file, b.state, SaveRequest{});
  ASSERT_TRUE(sa.ok() && sb.ok());
  FaultInjectingIo io{posix_io()};
  auto verifier = Store::open(io, StorePaths{t.root.string()});
  ASSERT_TRUE(verifier.ok()) << verifier.status().ToString();
  io.pause_reading("/packs/");
  Result<VerifyReport> rep = Status::IOError("not run");
  std::thread th([&] { rep = (*verifier)->verify({}); });
  io.wait_paused();
  EXPECT_TRUE(t.store->remove(std::to_string(sa->info.id)).ok());
  EXPECT_TRUE(t.store->remove(std::to_string(sb->info.id)).ok());
  io.resume();
  th.join();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(rep->problems.empty()) << rep->problems.front();
  EXPECT_EQ(rep->snapshots, 1u);
  ASSERT_EQ(rep->not_checked.size(), 1u);
  EXPECT_NE(rep->not_checked[0].find("removed while verify ran"), std::string::npos) << rep->not_checked[0];
}

// A review's finding: an import unpacks its archive into tmp/ and checks every entry before storing
// any, without a gc hold, and a gc deletes every temporary it finds: `gc` beside `import` failed it
// ("tmp/import-...: cannot open", exit 8). The import now holds the gc lock from unpacking to its
// last entry; a gc meanwhile is skipped as busy and the import completes.
TEST(Store, AGcBesideAnImportLeavesItsFiles) {
  TempStore a;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  auto saved = a.store->save(*l.file, l.state, SaveRequest{});
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const fs::path ex = a.root.parent_path() / ("gc-import-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_TRUE(a.store->export_to({std::to_string(saved->info.id)}, ex.string()).ok());
  FaultInjectingIo io{posix_io()};
  TempStore b(io);
  io.pause_reading("/tmp/import-");  // the check of the first unpacked entry
  Result<ImportReport> imported = Status::IOError("not run");
  std::thread th([&] { imported = b.store->import_from(ex.string()); });
  io.wait_paused();
  auto other = Store::open(posix_io(), StorePaths{b.root.string()});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto gc = (*other)->gc(/*wait=*/false);
  io.resume();
  th.join();
  fs::remove(ex);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_TRUE(gc->skipped_busy) << "a gc ran beside the import";
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  ASSERT_EQ(imported->imported.size(), 1u);
  VectorSink out;
  ASSERT_TRUE(b.store->restore(std::to_string(imported->imported[0].id), {}, out).ok());
  EXPECT_EQ(out.bytes, l.bytes);
}

// Two imports of one archive at once (two processes): the one whose catalog row comes second says
// only that the snapshot was imported meanwhile. It also said it had imported the snapshot without
// its name (the name the other import had just taken), which it had not.
TEST(Store, AnImportThatLosesTheRaceToAnotherSaysOnlyThatItWasImportedMeanwhile) {
  TempStore a;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  SaveRequest req;
  req.name = "chat";
  auto saved = a.store->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const fs::path ex = a.root.parent_path() / ("race-import-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_TRUE(a.store->export_to({"chat"}, ex.string()).ok());
  FaultInjectingIo io{posix_io()};
  TempStore b(io);
  io.pause_renaming("/packs/");  // its pack in place, its catalog row not yet
  Result<ImportReport> first = Status::IOError("not run");
  std::thread th([&] { first = b.store->import_from(ex.string()); });
  io.wait_paused();
  auto other = Store::open(posix_io(), StorePaths{b.root.string()});
  Result<ImportReport> second = other.ok() ? (*other)->import_from(ex.string()) : other.status();
  io.resume();
  th.join();
  fs::remove(ex);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(second->imported.size(), 1u);
  EXPECT_EQ(second->imported[0].name, std::optional<std::string>("chat"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->imported.empty());
  ASSERT_EQ(first->skipped.size(), 1u) << first->skipped[0] << " | " << first->skipped.back();
  EXPECT_EQ(first->skipped[0], saved->info.uuid + " (already in the store: imported meanwhile)");
  auto listed = b.store->catalog().list();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 1u);
}

// A long tensor restores in blocks of as many chunks as the snapshot's reader checks together
// (SnapshotReader::read_cells, conversion_block_rows): 4,608 cells of 2 KiB rows on 2 threads take
// 1,024-row blocks with shani-x4 and 2,048 with avx2-x8 (ctest runs it under each kernel:
// store.sha256_kernel.*), the last block short; 3,212 cells take multiples of the 256-cell chunk
// that are no power of two (768, 1,536). The bytes are those of `convert` of the file, with V in
// rows and in columns (--fa off). That convert_state reads such blocks is
// ConversionBlockRows.ConvertStateReadsTheBlocksItsSourceAsksFor's; that the restore hands it
// read_cells is not observed here (only its speed would show).
TEST(Store, ALongTensorRestoresInLargerBlocksAsConvert) {
  const size_t width = sha256_kernel_width(sha256_kernel());
  const uint64_t rows = conversion_block_rows(4608, 2, 2048, 256 * width);
  SCOPED_TRACE(std::string(sha256_kernel_name(sha256_kernel())) + ": blocks of " + std::to_string(rows) + " rows");
  if (width >= 4) {
    EXPECT_EQ(rows, 256 * width);
    EXPECT_EQ(conversion_block_rows(3212, 2, 2048, 256 * width, 256), width == 4 ? 768u : 1536u);
  }
  for (const uint32_t cells : {4608u, 3212u}) {
    TempStore t;
    test::Spec sp = test::long_f16();
    sp.cells = cells;
    const std::vector<std::byte> bytes = test::build(sp);
    MemoryFile file("long.slot", std::span<const std::byte>(bytes));
    auto state = parse_state(file);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    auto saved = t.store->save(file, *state, SaveRequest{});
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    for (const auto& [ctk, ctv, fa] : {std::tuple{"q8_0", "q8_0", "on"}, std::tuple{"q4_0", "q4_0", "on"},
                                       std::tuple{"q8_0", "f16", "off"}}) {
      SCOPED_TRACE(std::to_string(cells) + " cells, " + ctk + "/" + ctv + " fa " + fa);
      ConversionSpec spec;
      spec.ctk = ctk;
      spec.ctv = ctv;
      spec.flash_attn = fa;
      spec.head_dim_k = spec.head_dim_v = 128;
      spec.threads = 2;
      auto want = test::converted(*state, file, spec);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      RestoreRequest rreq;
      rreq.spec = spec;
      VectorSink got;
      auto r = t.store->restore(std::to_string(saved->info.id), rreq, got);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->converted);
      EXPECT_TRUE(got.bytes == *want);
    }
  }
}

TEST(Store, LossyStoreTypeIsRecordedAndRestoresAsConvert) {
  TempStore t;
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok());
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot", &*model);
  SaveRequest req;
  req.model = &*model;
  ConversionSpec q8;
  q8.ctk = q8.ctv = "q8_0";
  req.store_type = q8;
  auto saved = t.store->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->info.k_types, "q8_0");
  EXPECT_FALSE(saved->info.lossy.empty());
  auto creq = make_request(q8, l.state, &*model, "x");
  ASSERT_TRUE(creq.ok());
  VectorSink want, got;
  ASSERT_TRUE(convert_state(l.state, *l.file, *creq, want).ok());
  ASSERT_TRUE(t.store->restore(std::to_string(saved->info.id), {}, got).ok());
  EXPECT_EQ(got.bytes, want.bytes);
}


// An export archive at `p` holding `m` (the manifest of `reader`'s snapshot, edited by the caller)
// as snapshots/a.kvsnap, its blobs `reader`'s, and `index` as kvsnap-export.json.
void export_edited_manifest(const SnapshotManifest& m, const SnapshotReader& reader, const std::string& index,
                            const fs::path& p) {
  struct FromReader final : ChunkSource {
    const SnapshotReader* r;
    Result<std::vector<std::byte>> get(const ChunkRef& ref) override { return r->blob(ref.index); }
  } source;
  source.r = &reader;
  auto plan = SnapshotFileAssembler::plan(m, source);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  VectorSink file;
  ASSERT_TRUE(plan->write(source, file).ok());
  MemoryFile index_file("index", std::span<const std::byte>(reinterpret_cast<const std::byte*>(index.data()), index.size()));
  MemoryFile snap_file("snap", std::span<const std::byte>(file.bytes));
  const std::vector<ExportEntry> entries = {ExportEntry::FromFile("kvsnap-export.json", index_file),
                                            ExportEntry::FromFile("snapshots/a.kvsnap", snap_file)};
  ASSERT_TRUE(export_archive(posix_io(), p.string(), entries).ok());
}

// Before f90f11b, `save --store-type` recorded the original's writer claims (here --src-rotation
// off) beside its conversion (ggsq v3, rotated by llama.cpp's rule). Such a snapshot, imported,
// must restore as its stored file converted: the claims are the original's, not the stored file's.
TEST(Store, ALossySnapshotsRecordedClaimsAreNotAppliedToItsStoredFile) {
  TempStore a;
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok());
  Loaded l = load(fixtures() / "b8121/hd64-f16-f16-faon.slot", &*model);
  SaveRequest req;
  req.model = &*model;
  req.writer.src_rotation = "off";
  ConversionSpec q8;
  q8.ctk = q8.ctv = "q8_0";
  req.store_type = q8;
  auto saved = a.store->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  auto snap = a.store->open_snapshot(std::to_string(saved->info.id));
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  const SnapshotReader& reader = (*snap)->reader();
  EXPECT_TRUE(reader.manifest().provenance.writer.src_rotation.empty());
  // the row the old code wrote: the same snapshot with the original's claim in INFO.provenance
  SnapshotManifest m = reader.manifest();
  m.info["provenance"]["src_rotation"] = "off";
  TempStore b;
  const fs::path p = b.root.parent_path() / ("old-claims-" + std::to_string(::getpid()) + ".tar.zst");
  export_edited_manifest(m, reader, R"({"snapshots": [{"file": "snapshots/a.kvsnap", "name": "old"}]})", p);
  ASSERT_FALSE(HasFatalFailure());
  auto imported = b.store->import_from(p.string());
  fs::remove(p);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  auto old = b.store->open_snapshot("old");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  ASSERT_EQ((*old)->reader().manifest().provenance.writer.src_rotation, "off") << "the test needs the old row";

  ConversionSpec f16;
  f16.ctk = f16.ctv = "f16";
  VectorSink stored, got, want;
  ASSERT_TRUE(b.store->restore("old", {}, stored).ok());
  MemoryFile stored_file("stored", std::span<const std::byte>(stored.bytes));
  auto stored_state = parse_for_model(stored_file, {}, &*model);
  ASSERT_TRUE(stored_state.ok()) << stored_state.status().ToString();
  auto creq = make_request(f16, *stored_state, &*model, "stored");
  ASSERT_TRUE(creq.ok()) << creq.status().ToString();
  ASSERT_TRUE(convert_state(*stored_state, stored_file, *creq, want).ok());
  RestoreRequest rr;
  rr.spec = f16;
  rr.model = &*model;
  auto r = b.store->restore("old", rr, got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(got.bytes == want.bytes) << "the recorded claim was applied to the stored file";
}

// An archive with `index` as kvsnap-export.json and one released .kvsnap fixture as snapshots/a.kvsnap.
fs::path export_with_index(const fs::path& dir, const std::string& index) {
  const auto snap = slurp(fixtures() / "kvsnap/v1/b8121-hybrid-f16-f16-faon.kvsnap");
  MemoryFile index_file("index", std::span<const std::byte>(reinterpret_cast<const std::byte*>(index.data()),
                                                           index.size()));
  MemoryFile snap_file("snap", std::span<const std::byte>(snap));
  const std::vector<ExportEntry> entries = {ExportEntry::FromFile("kvsnap-export.json", index_file),
                                            ExportEntry::FromFile("snapshots/a.kvsnap", snap_file)};
  const fs::path p = dir / ("index-" + std::to_string(::getpid()) + ".tar.zst");
  EXPECT_TRUE(export_archive(posix_io(), p.string(), entries).ok());
  return p;
}

// Fuzz finding: the index was read with operator[] on keys that may be
// missing (undefined behaviour) and .value() that throws on a wrong type
// ("uuid": 12345 aborted the process).
TEST(Store, ImportTypeChecksTheExportIndex) {
  TempStore s;
  const fs::path bad = export_with_index(s.root.parent_path(), R"({"snapshots": [{"file": "snapshots/a.kvsnap", "uuid": 12345}]})");
  auto r = s.store->import_from(bad.string());
  fs::remove(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_NE(r.status().message().find("kvsnap-export.json: snapshots[0].uuid: expected a string, got number"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(files_under(s.root / "tmp"), 0u);

  // Only "file" is required: no name, tags, uuid or created imports without them.
  const fs::path bare = export_with_index(s.root.parent_path(), R"({"snapshots": [{"file": "snapshots/a.kvsnap"}]})");
  auto ok = s.store->import_from(bare.string());
  fs::remove(bare);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_EQ(ok->imported.size(), 1u);
  EXPECT_FALSE(ok->imported[0].name.has_value());
  EXPECT_TRUE(ok->imported[0].tags.empty());
}

// Found by the audit for the fuzz findings: a snapshot whose INFO.lossy has
// a non-string type name made import's catalog row (.value() on it) throw.
TEST(Store, ImportOfAMistypedLossyNoteDoesNotThrow) {
  const auto bytes = slurp(fixtures() / "kvsnap/v1/b8121-hybrid-f16-f16-faon.kvsnap");
  MemoryFile f("fixture.kvsnap", std::span<const std::byte>(bytes));
  auto reader = open_snapshot_file(f);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  SnapshotManifest m = (*reader)->manifest();
  m.info["lossy"] = {{"from_k", 3}, {"to_v", nullptr}};
  TempStore s;
  const fs::path p = s.root.parent_path() / ("lossy-" + std::to_string(::getpid()) + ".tar.zst");
  export_edited_manifest(m, **reader, R"({"snapshots": [{"file": "snapshots/a.kvsnap"}]})", p);
  ASSERT_FALSE(HasFatalFailure());
  auto r = s.store->import_from(p.string());
  fs::remove(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->imported.size(), 1u);
  EXPECT_EQ(r->imported[0].lossy, "?/? -> ?/?");
}

TEST(Store, ExportIndexErrorsNameTheKeyAndType) {
  struct Case {
    const char* text;
    const char* message;
  } cases[] = {
      {"", "a.tar: kvsnap-export.json: missing or empty"},
      {"{not json", "a.tar: kvsnap-export.json: not valid JSON"},
      {"[]", "a.tar: kvsnap-export.json: expected an object, got array"},
      {"{}", "a.tar: kvsnap-export.json: no \"snapshots\""},
      {R"({"snapshots": {}})", "kvsnap-export.json: snapshots: expected an array, got object"},
      {R"({"snapshots": [7]})", "kvsnap-export.json: snapshots[0]: expected an object, got number"},
      {R"({"snapshots": [{"uuid": "u"}]})", "kvsnap-export.json: snapshots[0]: no \"file\""},
      {R"({"snapshots": [{"file": "a", "name": ["x"]}]})", "snapshots[0].name: expected a string, got array"},
      {R"({"snapshots": [{"file": "a", "tags": {"k": 1}}]})", "snapshots[0].tags.k: expected a string, got number"},
      {R"({"snapshots": [{"file": "a", "tags": []}]})", "snapshots[0].tags: expected an object, got array"},
      // A review's finding: any string was taken as a uuid ("../x", or a name in the store, which the
      // duplicate check then resolved).
      {R"({"snapshots": [{"file": "a", "uuid": "../../etc/x Y"}]})", "snapshots[0]: uuid '../../etc/x Y' is not a uuid"},
      {R"({"snapshots": [{"file": "a", "uuid": "victim"}]})", "is not a uuid"},
  };
  for (const Case& c : cases) {
    auto r = parse_export_index(c.text, "a.tar");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), Code::kCorruption) << c.text;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << c.text << " -> " << r.status().ToString();
  }
  // A raw NUL ends the input for nlohmann's lexer: an index cut there (the rest anything) was read
  // as the part before it. JSON writes a NUL in a string as \u0000, which is text.
  for (std::string_view bad : {std::string_view("{\"snapshots\": []}\0{\"b\"", 22),
                               std::string_view("{\"snapshots\": [{\"file\": \"a\0b\"}]}", 32), std::string_view("\0", 1)}) {
    auto r = parse_export_index(bad, "a.tar");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find("a.tar: kvsnap-export.json: not valid JSON: a NUL byte at offset"),
              std::string::npos)
        << r.status().message();
  }
  auto ok = parse_export_index(
      R"({"snapshots": [{"file": "f", "name": null, "tags": {"a": "b"}, "uuid": "0F0A3C5E-1B2D-4E6F-8A9B-0C1D2E3F4A5B"}]})",
      "a.tar");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_EQ(ok->size(), 1u);
  EXPECT_EQ((*ok)[0].file, "f");
  EXPECT_EQ((*ok)[0].uuid, "0f0a3c5e-1b2d-4e6f-8a9b-0c1d2e3f4a5b") << "in lower case, as the catalog keeps it";
  EXPECT_FALSE((*ok)[0].name.has_value());
  EXPECT_EQ((*ok)[0].tags.at("a"), "b");
}

TEST(Store, ExportImportRoundTripAndHostileExports) {
  TempStore a, b;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  SaveRequest req;
  req.name = "chat";
  req.tags = {{"user", "ana"}};
  req.cells_per_chunk = 32;
  auto saved = a.store->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok());
  const fs::path ex = a.root.parent_path() / ("export-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_TRUE(a.store->export_to({"chat"}, ex.string()).ok());
  auto imp = b.store->import_from(ex.string());
  ASSERT_TRUE(imp.ok()) << imp.status().ToString();
  ASSERT_EQ(imp->imported.size(), 1u);
  EXPECT_EQ(imp->imported[0].uuid, saved->info.uuid);
  EXPECT_EQ(imp->imported[0].tags.at("user"), "ana");
  VectorSink out;
  ASSERT_TRUE(b.store->restore("chat", {}, out).ok());
  EXPECT_EQ(out.bytes, l.bytes);
  auto again = b.store->import_from(ex.string());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->imported.empty()) << "the same uuid twice";

  // Tampered and truncated exports: refused, nothing imported, no temporaries left.
  auto bytes = slurp(ex);
  std::mt19937 rng(5);
  for (int i = 0; i < 12; ++i) {
    TempStore c;
    auto bad = bytes;
    if (i < 6) bad.resize(rng() % bad.size());            // truncated
    else bad[rng() % bad.size()] ^= std::byte(1u << (rng() % 8));  // one flipped bit
    const fs::path badp = c.root.parent_path() / ("bad-" + std::to_string(::getpid()) + ".tar.zst");
    std::ofstream(badp, std::ios::binary).write(reinterpret_cast<const char*>(bad.data()), bad.size());
    auto r = c.store->import_from(badp.string());
    fs::remove(badp);
    if (r.ok()) {
      // a flip the format cannot see (zstd padding, tar header fields it ignores) must still give the same bytes
      VectorSink o;
      ASSERT_TRUE(c.store->restore("chat", {}, o).ok()) << "case " << i;
      EXPECT_EQ(o.bytes, l.bytes) << "case " << i;
      continue;
    }
    auto all = c.store->catalog().list();
    ASSERT_TRUE(all.ok());
    EXPECT_TRUE(all->empty()) << "case " << i << ": " << r.status().ToString();
    EXPECT_EQ(files_under(c.root / "tmp"), 0u) << "case " << i;
  }
  fs::remove(ex);
}

// Saves two slots into `a` as "first" and "second" and exports them to `ex`, in that order.
// Imports `archive` into `t`, which must refuse it with `code` and a message holding `says`, and keep
// nothing of it: no snapshot, no temporary. `what` names the case in failures.
void expect_import_refused(TempStore& t, const fs::path& archive, Code code, const std::string& says,
                           const std::string& what = "") {
  auto r = t.store->import_from(archive.string());
  ASSERT_FALSE(r.ok()) << what << ": imported";
  EXPECT_EQ(r.status().code(), code) << what << ": " << r.status().ToString();
  EXPECT_NE(r.status().message().find(says), std::string::npos) << what << ": " << r.status().ToString();
  EXPECT_TRUE(t.store->catalog().list()->empty()) << what << ": a failed import stored some of its entries";
  EXPECT_TRUE(!fs::exists(t.root / "tmp") || fs::is_empty(t.root / "tmp")) << what << ": a temporary was left";
}

void export_first_and_second(TempStore& a, const fs::path& ex) {
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  Loaded l2 = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  SaveRequest req;
  req.name = "first";
  ASSERT_TRUE(a.store->save(*l.file, l.state, req).ok());
  req.name = "second";
  ASSERT_TRUE(a.store->save(*l2.file, l2.state, req).ok());
  ASSERT_TRUE(a.store->export_to({"first", "second"}, ex.string()).ok());
}

// An archive whose second snapshot is damaged (a well-formed archive: the damage is inside the
// entry's bytes, past the archive's own checks) imports nothing: every entry is checked before the
// first is stored. The first was stored, and the import failed without saying so.
TEST(Store, ImportOfAnArchiveWithOneDamagedEntryStoresNone) {
  TempStore a, b;
  const fs::path ex = a.root.parent_path() / ("export2-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_NO_FATAL_FAILURE(export_first_and_second(a, ex));
  auto entries = test::archive_entries(ex.string());
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 3u);  // the index, then the two snapshots in the order asked
  std::string& second = (*entries)[2].second;
  second[second.size() / 2] ^= 0x40;  // inside a chunk's blob
  ASSERT_TRUE(test::write_archive_entries(ex.string(), *entries).ok());
  auto r = b.store->import_from(ex.string());
  fs::remove(ex);
  ASSERT_FALSE(r.ok()) << "a damaged entry imported";
  EXPECT_NE(r.status().message().find((*entries)[2].first), std::string::npos) << r.status().ToString();
  auto all = b.store->catalog().list();
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty()) << all->size() << " snapshot(s) of a failed import stored";
  EXPECT_EQ(files_under(b.root / "tmp"), 0u);
}

// A review's finding: an entry's label no snapshot may have (an all-digit name) was refused only when
// its turn came to be stored, after the entries before it were.
TEST(Store, ImportOfAnArchiveWithOneBadLabelStoresNone) {
  TempStore a, b;
  const fs::path ex = a.root.parent_path() / ("export3-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_NO_FATAL_FAILURE(export_first_and_second(a, ex));
  Status edited = test::edit_export_index(ex.string(), [](nlohmann::json& j) { j["snapshots"][1]["name"] = "12345"; });
  ASSERT_TRUE(edited.ok()) << edited.ToString();
  expect_import_refused(b, ex, Code::kCorruption, "'12345' cannot be a snapshot name");
  fs::remove(ex);
}

// A review's finding: an index entry whose file the archive did not hold was passed over in silence.
TEST(Store, ImportOfAnArchiveMissingAListedFileStoresNone) {
  TempStore a, b;
  const fs::path ex = a.root.parent_path() / ("export4-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_NO_FATAL_FAILURE(export_first_and_second(a, ex));
  Status edited = test::edit_export_index(ex.string(), [](nlohmann::json& j) {
    nlohmann::json lost = j["snapshots"][1];
    lost["file"] = "snapshots/lost.kvsnap";
    lost["uuid"] = new_snapshot_uuid();
    j["snapshots"].push_back(lost);
  });
  ASSERT_TRUE(edited.ok()) << edited.ToString();
  expect_import_refused(b, ex, Code::kCorruption, "snapshots/lost.kvsnap, which the archive does not hold");
  fs::remove(ex);
}

// A review's findings: an index that lists a file or uuid twice (the last row's labels won), gives
// a creation time in the future (eviction orders by it: never evicted), a fingerprint other than
// the one the snapshot recorded, or a newer export version; each is refused by name and nothing is
// stored.
TEST(Store, ImportRefusesAnIndexThatContradictsItself) {
  TempStore a;
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok());
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot", &*model);
  SaveRequest req;
  req.name = "first";
  req.model = &*model;
  ASSERT_TRUE(a.store->save(*l.file, l.state, req).ok());
  const fs::path ex = a.root.parent_path() / ("export5-" + std::to_string(::getpid()) + ".tar.zst");
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    Code code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"twice", [](nlohmann::json& j) { j["snapshots"].push_back(j["snapshots"][0]); }, Code::kCorruption,
       "is listed twice"},
      {"future", [](nlohmann::json& j) { j["snapshots"][0]["created"] = "9999-12-31T00:00:00.000Z"; },
       Code::kCorruption, "is not a past UTC time"},
      {"not a time", [](nlohmann::json& j) { j["snapshots"][0]["created"] = "~"; }, Code::kCorruption,
       "is not a past UTC time"},
      {"year 1", [](nlohmann::json& j) { j["snapshots"][0]["created"] = "0001-01-01T00:00:00.000Z"; },
       Code::kCorruption, "is not a past UTC time since 1970"},
      {"year -1", [](nlohmann::json& j) { j["snapshots"][0]["created"] = "-001-01-01T00:00:00.000Z"; },
       Code::kCorruption, "is not a past UTC time since 1970"},
      {"1969", [](nlohmann::json& j) { j["snapshots"][0]["created"] = "1969-12-31T23:59:59.999Z"; },
       Code::kCorruption, "is not a past UTC time since 1970"},
      {"nul in a name", [](nlohmann::json& j) { j["snapshots"][0]["name"] = std::string("a\0b", 3); },
       Code::kCorruption, "holds a NUL"},
      {"nul in a tag", [](nlohmann::json& j) { j["snapshots"][0]["tags"]["k"] = std::string("v\0", 2); },
       Code::kCorruption, "holds a NUL"},
      {"fingerprint", [](nlohmann::json& j) { j["snapshots"][0]["model_fingerprint"] = "sha256:0123"; },
       Code::kCorruption, "the snapshot records model"},
      {"version", [](nlohmann::json& j) { j["kvsnap_export"] = 2; }, Code::kNotSupported, "version 2"},
      // A second review's: labels no listing should carry.
      {"long name", [](nlohmann::json& j) { j["snapshots"][0]["name"] = std::string(70000, 'n'); }, Code::kCorruption,
       "too long (at most 65536 bytes)"},
      {"many tags",
       [](nlohmann::json& j) {
         for (int i = 0; i < 5000; ++i) j["snapshots"][0]["tags"]["k" + std::to_string(i)] = "v";
       },
       Code::kCorruption, "5000 tags: at most 4096"},
  };
  for (const Case& c : cases) {
    size_t exported = 0;
    ASSERT_TRUE(a.store->export_to({"first", "1"}, ex.string(), false, false, &exported).ok());
    EXPECT_EQ(exported, 1u) << "one snapshot named twice is exported once";
    ASSERT_TRUE(test::edit_export_index(ex.string(), c.edit).ok()) << c.what;
    TempStore b;
    expect_import_refused(b, ex, c.code, c.says, c.what);
  }
  fs::remove(ex);
}

// Labels a save takes (kvsnap serve's session names come from its clients) come back from an
// export whole, control characters, C1 and bidirectional controls included: listings escape them
// (shown_text), the store keeps them as they were. An import refused these, so a store whose
// snapshots carried them exported archives it could not import.
TEST(Store, AnExportOfLabelsWithControlCharactersImportsBackWhole) {
  TempStore a;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  const std::vector<std::string> names = {"a\x1b[2Jb", "c1\xc2\x9b" "2J", "evil\xe2\x80\xaetxt.exe", "two\nlines"};
  for (const std::string& n : names) {
    SaveRequest req;
    req.name = n;
    req.tags = {{"note\x1b]0;t\x07", "v\xe2\x81\xa6" "x"}};
    ASSERT_TRUE(a.store->save(*l.file, l.state, req).ok()) << n;
  }
  const fs::path ex = a.root.parent_path() / ("export8-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_TRUE(a.store->export_to({"1", "2", "3", "4"}, ex.string()).ok());
  TempStore b;
  auto r = b.store->import_from(ex.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->imported.size(), names.size());
  auto before = a.store->catalog().list(), after = b.store->catalog().list();
  ASSERT_TRUE(before.ok() && after.ok());
  ASSERT_EQ(after->size(), before->size());
  for (size_t i = 0; i < before->size(); ++i) {
    EXPECT_EQ((*after)[i].uuid, (*before)[i].uuid);
    EXPECT_EQ((*after)[i].name, (*before)[i].name);
    EXPECT_EQ((*after)[i].tags, (*before)[i].tags);
  }
  fs::remove(ex);
}

// The index's fingerprint, where the snapshot recorded none, is printed by show and ls: no
// terminal controls in it (it came in as given: "zz\x1b[31m" coloured the listing).
TEST(Store, ImportRefusesAFingerprintWithControlCharacters) {
  TempStore a;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  SaveRequest req;
  req.name = "plain";
  ASSERT_TRUE(a.store->save(*l.file, l.state, req).ok());
  const fs::path ex = a.root.parent_path() / ("export7-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_TRUE(a.store->export_to({"plain"}, ex.string()).ok());
  {
    TempStore ok;  // a printable fingerprint is taken
    ASSERT_TRUE(test::edit_export_index(ex.string(), [](nlohmann::json& j) {
                  j["snapshots"][0]["model_fingerprint"] = "sha256:0123";
                }).ok());
    auto r = ok.store->import_from(ex.string());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  ASSERT_TRUE(test::edit_export_index(ex.string(), [](nlohmann::json& j) {
                j["snapshots"][0]["model_fingerprint"] = "zz\x1b[31m";
              }).ok());
  TempStore b;
  expect_import_refused(b, ex, Code::kCorruption, "the model fingerprint 'zz\\x1b[31m' is not a fingerprint",
                        "fingerprint with ESC");
  fs::remove(ex);
}

// An index entry without a fingerprint (edited out, or "") takes the one the snapshot recorded:
// imported without it, `ls --model` and `find --model` (and serve's prefix lookups) no longer
// found the snapshot, and nothing said so.
TEST(Store, AnIndexWithoutTheFingerprintTakesTheRecordedOne) {
  TempStore a;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  auto model = load_model_info(posix_io(), (fixtures() / "models/tiny-hd64.gguf").string());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  SaveRequest req;
  req.name = "m64";
  req.model = &*model;
  auto saved = a.store->save(*l.file, l.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_FALSE(saved->info.model_fingerprint.empty());
  const fs::path ex = a.root.parent_path() / ("export9-" + std::to_string(::getpid()) + ".tar.zst");
  for (const bool erase : {true, false}) {
    ASSERT_TRUE(a.store->export_to({"m64"}, ex.string()).ok());
    ASSERT_TRUE(test::edit_export_index(ex.string(), [erase](nlohmann::json& j) {
                  if (erase) j["snapshots"][0].erase("model_fingerprint");
                  else j["snapshots"][0]["model_fingerprint"] = "";
                }).ok());
    TempStore b;
    auto r = b.store->import_from(ex.string());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->imported.size(), 1u);
    EXPECT_EQ(r->imported[0].model_fingerprint, saved->info.model_fingerprint) << (erase ? "erased" : "empty");
    fs::remove(ex);
  }
}

// An entry without a uuid whose name the store has: imported under a new uuid, without the name,
// and the note names that uuid (a review's finding: "imported  without it", the uuid left out).
TEST(Store, AnEntryWithoutAUuidWhoseNameIsTakenIsNotedWithItsNewUuid) {
  TempStore a;
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faon.slot");
  SaveRequest req;
  req.name = "n";
  ASSERT_TRUE(a.store->save(*l.file, l.state, req).ok());
  const fs::path ex = a.root.parent_path() / ("export10-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_TRUE(a.store->export_to({"n"}, ex.string()).ok());
  ASSERT_TRUE(test::edit_export_index(ex.string(), [](nlohmann::json& j) { j["snapshots"][0].erase("uuid"); }).ok());
  auto r = a.store->import_from(ex.string());
  fs::remove(ex);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->imported.size(), 1u);
  const std::string uuid = r->imported[0].uuid;
  ASSERT_FALSE(uuid.empty());
  EXPECT_FALSE(r->imported[0].name.has_value());
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_EQ(r->skipped[0], "name 'n' is taken: imported " + uuid + " without it");
}

// What an import decodes is held to the archive's bomb guard (1000 times its size, 64 MiB whatever
// its size) before any chunk is decoded: a chunk blob of a few hundred bytes may claim 16 MiB (a
// review's finding: 968 bytes of archive took 26 s of CPU, 6.5 KB would have taken ~50 minutes).
// Here a real snapshot of 96 MiB of zeros, exported into a few hundred KB: refused, nothing stored.
TEST(Store, AnImportDecodesAtMostTheArchivesBombAllowance) {
  TempStore a;
  test::Spec zeros;
  zeros.k_type = zeros.v_type = 1;  // f16
  zeros.head_dim = 128;
  zeros.n_head_kv = 8;
  zeros.n_layer = 4;
  zeros.cells = 6144;  // 16 KiB a cell: 96 MiB
  zeros.data = test::Data::kZero;
  auto p = test::parse_built(zeros, "zeros.slot");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  SaveRequest req;
  req.name = "zeros";
  ASSERT_TRUE(a.store->save(*p->file, p->state, req).ok());
  const fs::path ex = a.root.parent_path() / ("export11-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_TRUE(a.store->export_to({"zeros"}, ex.string()).ok());
  const uint64_t archive = fs::file_size(ex);
  ASSERT_LT(archive * 1000, p->file->size()) << "the test needs an archive past the ratio";
  TempStore b;
  auto r = b.store->import_from(ex.string());
  fs::remove(ex);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotSupported) << r.status().ToString();
  EXPECT_NE(r.status().message().find("refusing a likely decompression bomb"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(b.store->catalog().list()->empty());
}

// On a full disk `rm` and `gc` need room for the catalog's WAL frames: the catalog keeps a room
// reserve beside it (CatalogOptions::room_reserve_bytes, 16 MiB), made when the store opens with
// room for it and given up before a write when the disk is nearly full. (The same on a real full
// tmpfs, where `kvsnap rm` failed with "database or disk is full" before: cli.full_disk.)
TEST(Store, TheCatalogsRoomReserveIsGivenUpWhenTheDiskIsNearlyFull) {
  const fs::path probe = fs::temp_directory_path() / ("kvsnap-allocate-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  const int err = allocate_space(fd, 4096);
  ::close(fd);
  fs::remove(probe);
  if (err != 0) GTEST_SKIP() << fs::temp_directory_path() << " cannot allocate without writing (" << std::strerror(err) << "): no reserve there";

  FaultInjectingIo io(posix_io());
  TempStore t(io);
  const fs::path reserve = t.root / "catalog.sqlite-reserve";
  ASSERT_TRUE(fs::exists(reserve)) << "made when the store opened with room";
  EXPECT_EQ(fs::file_size(reserve), uint64_t{16} << 20);
  Loaded l = load(fixtures() / "v0.5.0/hd64-f16-f16-faoff.slot");
  ASSERT_TRUE(t.store->save(*l.file, l.state, {}).ok());
  EXPECT_TRUE(fs::exists(reserve)) << "kept while the disk has room";

  io.report_free_bytes(uint64_t{31} << 20);  // under twice the reserve
  SaveRequest again;
  again.name = "again";
  auto saved = t.store->save(*l.file, l.state, again);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_FALSE(fs::exists(reserve)) << "given up before the save's catalog write";
  auto s = Store::open(io, StorePaths{t.root.string()});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(fs::exists(reserve)) << "not made again on a disk this full";
  s->reset();
  io.report_free_bytes(uint64_t{64} << 20);  // four times the reserve: room for it again
  s = Store::open(io, StorePaths{t.root.string()});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(fs::exists(reserve)) << "made again once there is room";
  EXPECT_EQ(fs::file_size(reserve), uint64_t{16} << 20);
}

// An entry is refused before it fills the disk: one larger than the free space of <store>/tmp (less
// 64 MiB), and one that does not start as a .kvsnap file, at its first bytes.
TEST(Store, ImportRefusesAnEntryThatCannotFitOrIsNoSnapshot) {
  TempStore a;
  const fs::path ex = a.root.parent_path() / ("export6-" + std::to_string(::getpid()) + ".tar.zst");
  ASSERT_NO_FATAL_FAILURE(export_first_and_second(a, ex));
  FaultInjectingIo io(posix_io());
  io.report_free_bytes(uint64_t{64} << 20);
  {
    TempStore b(io);
    expect_import_refused(b, ex, Code::kIOError, "bytes free", "too large for the disk");
  }
  auto entries = test::archive_entries(ex.string());
  ASSERT_TRUE(entries.ok());
  (*entries)[1].second.assign(1 << 20, '\0');  // a megabyte of zeros where a snapshot was
  ASSERT_TRUE(test::write_archive_entries(ex.string(), *entries).ok());
  TempStore c;
  expect_import_refused(c, ex, Code::kCorruption, "does not start as a .kvsnap file does", "zeros for a snapshot");
  fs::remove(ex);
}

}  // namespace
}  // namespace kvsnap
