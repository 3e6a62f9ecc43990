#include "server/slot_file_writer.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace kvsnap {

namespace {
// Blocks handed to the writing thread: large enough that a write(2) costs
// nothing per call, few and small enough that the memory they take, touched
// for the first time in every process (slow on some VMs: docs/performance.md,
// "End to end"), stays small (kInFlight + 2 blocks).
constexpr size_t kBlock = 1u << 20;
constexpr size_t kInFlight = 4;
// An append at least this large, with nothing buffered before it, is written by the calling
// thread itself once the thread's queue is empty: a copy into a block would cost as much as the
// write(2) it saves the caller (docs/performance.md, "End to end").
constexpr size_t kDirect = 256u << 10;
}  // namespace

// A bounded queue of filled blocks and the thread that writes them in order.
struct SlotFileWriter::Pipe {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<std::byte>> full;
  std::vector<std::vector<std::byte>> spare;
  std::vector<std::byte> filling;
  Status error;  // the first failed write; later blocks are dropped
  bool closing = false;
  bool writing = false;  // the thread is writing a block it took off `full`
  std::thread thread;

  void run(WritableFile& f) {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      cv.wait(l, [&] { return closing || !full.empty(); });
      if (full.empty()) return;
      std::vector<std::byte> b = std::move(full.front());
      full.pop_front();
      writing = true;
      l.unlock();
      Status s = error.ok() ? f.append(b) : Status::OK();
      b.clear();
      l.lock();
      writing = false;
      if (!s.ok() && error.ok()) error = s;
      spare.push_back(std::move(b));
      cv.notify_all();
    }
  }

  // Queues `filling` (waiting while kInFlight blocks are queued) and takes a spare to fill next.
  Status hand_over() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return full.size() < kInFlight; });
    if (!error.ok()) return error;
    full.push_back(std::move(filling));
    filling = std::vector<std::byte>();
    if (!spare.empty()) {
      filling = std::move(spare.back());
      spare.pop_back();
    }
    filling.reserve(kBlock);
    cv.notify_all();
    return Status::OK();
  }

  // Writes `data` on the calling thread after every queued block (`filling` must be empty).
  Status write_now(WritableFile& f, std::span<const std::byte> data) {
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return full.empty() && !writing; });
      if (!error.ok()) return error;
    }
    // The thread waits for `full`, which only this (the appending) thread fills: `f` is ours.
    Status s = f.append(data);
    if (!s.ok()) {
      std::lock_guard<std::mutex> l(mu);
      if (error.ok()) error = s;
    }
    return s;
  }

  Status finish() {
    Status s = filling.empty() ? Status::OK() : hand_over();
    {
      std::lock_guard<std::mutex> l(mu);
      closing = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
    return s.ok() ? error : s;
  }
};

Result<std::unique_ptr<SlotFileWriter>> SlotFileWriter::create(Io& io, const std::string& path,
                                                               const std::string& scratch) {
  std::string tmp = temp_path_beside(path);
  // Claimed by a rename: of two writers, one gets it and the other makes a new file. One kvsnap may
  // not write in place (another user's: the server's file kept by a save; a link someone planted)
  // is removed, and a new file made.
  if (!scratch.empty() && io.rename(scratch, tmp).ok()) {
    auto f = io.open_scratch(tmp);
    if (f.ok()) return std::unique_ptr<SlotFileWriter>(new SlotFileWriter(io, path, tmp, std::move(*f), true));
    (void)io.remove(tmp);
    tmp = temp_path_beside(path);
  }
  KV_ASSIGN_OR_RETURN(auto f, io.open_write(tmp, /*exclusive=*/true));
  return std::unique_ptr<SlotFileWriter>(new SlotFileWriter(io, path, std::move(tmp), std::move(f), false));
}

SlotFileWriter::SlotFileWriter(Io& io, std::string path, std::string tmp, std::unique_ptr<WritableFile> f, bool reused)
    : io_(io), path_(std::move(path)), tmp_(std::move(tmp)), file_(std::move(f)), pipe_(std::make_unique<Pipe>()),
      reused_(reused) {
  pipe_->filling.reserve(kBlock);
  pipe_->thread = std::thread([this] { pipe_->run(*file_); });
}

SlotFileWriter::~SlotFileWriter() {
  if (committed_) return;
  (void)pipe_->finish();
  (void)file_->close();
  (void)io_.remove(tmp_);
}

Status SlotFileWriter::fail(const Status& s) const {
  return s.Prefixed("writing " + path_ + " (as " + tmp_ + ")");
}

Status SlotFileWriter::append(std::span<const std::byte> data) {
  if (committed_) return Status::InvalidArgument(path_ + ": append after commit");
  if (data.size() >= kDirect) {
    // What is buffered goes first (queued as it is), then these bytes straight from the caller.
    Status s = pipe_->filling.empty() ? Status::OK() : pipe_->hand_over();
    if (s.ok()) s = pipe_->write_now(*file_, data);
    return s.ok() ? s : fail(s);
  }
  while (!data.empty()) {
    auto& b = pipe_->filling;
    const size_t n = std::min(data.size(), kBlock - b.size());
    b.insert(b.end(), data.begin(), data.begin() + n);
    data = data.subspan(n);
    if (b.size() == kBlock) {
      Status s = pipe_->hand_over();
      if (!s.ok()) return fail(s);
    }
  }
  return Status::OK();
}

Status SlotFileWriter::commit() {
  if (committed_) return Status::OK();
  Status s = pipe_->finish();
  if (!s.ok()) return fail(s);
  s = file_->close();
  if (!s.ok()) return fail(s);
  s = io_.rename(tmp_, path_);
  if (!s.ok()) return fail(s);
  committed_ = true;
  return Status::OK();
}

}  // namespace kvsnap
