// The file kvsnap hands to llama-server in its slot directory: written
// beside its final name under a temporary one and renamed into place, so the
// server never sees a partial file. Small appends are gathered into blocks that
// a thread of its own writes, so the kernel's copy into the page cache overlaps
// the conversion that produces the bytes; an append of 256 KiB or more (a
// converted block, handed on in order by a conversion worker while the others
// convert) is written by the caller itself once the queued blocks are out,
// with no copy into a block first.
//
// Not fsynced: the server reads the file at once and kvsnap removes it, or keeps
// it as the slot directory's scratch file, right after (server_flows.h), so
// durability would buy nothing and costs a flush of the whole file to disk on
// the restore's critical path. Written over the scratch file when there is one
// (its page-cache pages reused: Io::open_scratch). A crash leaves at most a
// temporary named `<name>.kvsnap-tmp-<pid>-<random>` (base/io.h kTempInfix).
//
// Errors name the file. Dropping the writer without commit() removes the
// temporary file.
#pragma once

#include <memory>
#include <string>

#include "base/io.h"
#include "base/status.h"

namespace kvsnap {

class SlotFileWriter final : public ByteSink {
 public:
  // `scratch`, when given and present, is the file an earlier transfer left
  // (server_flows.h): it becomes the temporary file and is written over in
  // place (Io::open_scratch). Absent, or taken by another writer: a new file.
  static Result<std::unique_ptr<SlotFileWriter>> create(Io& io, const std::string& path,
                                                        const std::string& scratch = "");
  ~SlotFileWriter() override;
  using ByteSink::append;
  Status append(std::span<const std::byte> data) override;
  // Waits for the writes, closes, renames to the final name.
  Status commit();
  // Whether the scratch file was there to write over.
  bool reused_scratch() const { return reused_; }

 private:
  struct Pipe;
  SlotFileWriter(Io& io, std::string path, std::string tmp, std::unique_ptr<WritableFile> f, bool reused);
  Status fail(const Status& s) const;
  Io& io_;
  std::string path_, tmp_;
  std::unique_ptr<WritableFile> file_;
  std::unique_ptr<Pipe> pipe_;
  bool reused_ = false;
  bool committed_ = false;
};

}  // namespace kvsnap
