// Every failure of the Io seam (tests/store/fault_io.h) at every point of what kvsnap-store-bench
// does with a store (save, restore into memory and into a file, a second save, a save sharing a
// prefix, verify, rm, gc, a gc that compacts) is an error the caller can read, never an exception or a crash: a Result
// that failed holds a failed Status (one built from an OK Status would pass as neither value nor
// error and crash the caller that reads its value), and one that holds a value can be read; and
// whatever failed, every snapshot the store then lists verifies.
#include <gtest/gtest.h>

#include <filesystem>

#include "format/state_prefix.h"
#include "store/fault_io.h"
#include "store/store.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

// "name: ok" or "name: <error>", after checking that r is a value or an error.
template <class T>
std::string outcome(const char* name, const Result<T>& r) {
  EXPECT_EQ(r.ok(), r.status().ok()) << name << ": a Result that is neither a value nor an error";
  if (r.ok()) (void)r.value();
  else EXPECT_FALSE(r.status().message().empty()) << name << ": an error without a message";
  return std::string(name) + ": " + r.status().ToString() + "; ";
}

struct Session {
  std::vector<std::byte> bytes;
  std::unique_ptr<MemoryFile> file;
  StateFile state;
  VectorSink cut_bytes;  // its first 90% of tokens
  std::unique_ptr<MemoryFile> cut;
  StateFile cut_state;
};

std::string run_sequence(Io& io, const fs::path& root, const Session& s) {
  std::string log;
  auto opened = Store::open(io, StorePaths{root.string()});
  log += outcome("open", opened);
  if (!opened.ok()) return log;
  Store& store = **opened;
  SaveRequest req;
  req.threads = 2;
  req.name = "a";
  req.cells_per_chunk = 16;
  log += outcome("save", store.save(*s.file, s.state, req));
  {
    VectorSink out;
    log += outcome("restore", store.restore("a", {}, out));
  }
  auto w = AtomicFileWriter::create(io, root.string() + "-restored.bin");
  log += outcome("create", w);
  if (w.ok()) {
    auto r = store.restore("a", {}, **w);
    log += outcome("restore to a file", r);
    if (r.ok()) log += "commit: " + (*w)->commit().ToString() + "; ";
  }
  req.name = "again";
  log += outcome("save again", store.save(*s.file, s.state, req));
  req.name.clear();
  log += outcome("save a prefix", store.save(*s.cut, s.cut_state, req));
  log += outcome("verify", store.verify({}));
  log += outcome("rm", store.remove("a"));
  log += outcome("gc", store.gc(true));
  // The prefix alone keeps a's pack: ~10% of it dead, which a gc compacting at 1% copies.
  log += outcome("rm again", store.remove("again"));
  auto compacting = store.gc(true, {}, 1);
  log += outcome("gc compacting", compacting);
  if (compacting.ok()) log += "compacted " + std::to_string(compacting->packs_compacted) + "; ";
  return log;
}

TEST(StoreFaultSweep, EveryIoFailureIsAnErrorNeverAnException) {
  Session s;
  s.bytes = test::slurp(fs::path(KVSNAP_SOURCE_DIR) / "fixtures/v0.5.0/hd64-f16-f16-faon.slot");
  s.file = std::make_unique<MemoryFile>("session.slot", std::span<const std::byte>(s.bytes));
  s.state = parse_state(*s.file).value();
  ASSERT_TRUE(write_prefix(s.state, *s.file, s.state.tokens.tokens.size() * 9 / 10, s.cut_bytes).ok());
  s.cut = std::make_unique<MemoryFile>("cut.slot", std::span<const std::byte>(s.cut_bytes.bytes));
  s.cut_state = parse_state(*s.cut).value();
  const fs::path root = fs::temp_directory_path() / ("kvsnap-fault-sweep-" + std::to_string(::getpid()));
  int injected = 0;
  for (FaultOp op : {FaultOp::kOpenWrite, FaultOp::kAppend, FaultOp::kSync, FaultOp::kClose, FaultOp::kRename,
                     FaultOp::kRemove, FaultOp::kSyncDir, FaultOp::kCreateDirs, FaultOp::kLock}) {
    for (int nth = 1;; ++nth) {
      FaultInjectingIo io(posix_io());
      io.fail_nth(op, nth, nth % 2 ? ENOSPC : EIO);
      fs::remove_all(root);
      std::string log;
      try {
        log = run_sequence(io, root, s);
      } catch (const std::exception& e) {
        ADD_FAILURE() << fault_op_name(op) << " #" << nth << " threw " << e.what() << " after " << log;
      }
      if (io.injected() == 0) {
        EXPECT_NE(log.find("compacted 1;"), std::string::npos) << "the run without a fault compacts: " << log;
      } else if (fs::exists(root / "catalog.sqlite")) {
        // Whatever failed, what the store lists is whole: every snapshot verifies.
        auto after = Store::open(posix_io(), StorePaths{root.string()});
        ASSERT_TRUE(after.ok()) << fault_op_name(op) << " #" << nth << ": " << after.status().ToString();
        auto v = (*after)->verify({});
        ASSERT_TRUE(v.ok()) << fault_op_name(op) << " #" << nth << ": " << v.status().ToString();
        EXPECT_TRUE(v->problems.empty()) << fault_op_name(op) << " #" << nth << " after " << log << ": "
                                         << v->problems.front();
      }
      fs::remove_all(root);
      fs::remove(root.string() + "-restored.bin");
      if (io.injected() == 0) break;  // past the last such operation
      ++injected;
    }
  }
  EXPECT_GT(injected, 20);
}

}  // namespace
}  // namespace kvsnap
