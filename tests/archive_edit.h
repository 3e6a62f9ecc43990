// Export archives opened up in tests: every entry's bytes, and the same archive written again with
// its index changed (to play an old kvsnap's export, or a tampered one).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/io.h"
#include "base/json.h"
#include "store/archive.h"

namespace kvsnap::test {

// (name, bytes) of every regular file of an archive, decompressed, in archive order.
using ArchiveEntries = std::vector<std::pair<std::string, std::string>>;

inline Result<ArchiveEntries> archive_entries(const std::string& path) {
  struct Collect final : ArchiveVisitor {
    ArchiveEntries out;
    Status begin_entry(const ArchiveEntryInfo& e) override {
      out.push_back({e.name, ""});
      return Status::OK();
    }
    Status entry_data(std::span<const std::byte> piece) override {
      out.back().second.append(reinterpret_cast<const char*>(piece.data()), piece.size());
      return Status::OK();
    }
    Status end_entry() override { return Status::OK(); }
  } c;
  KV_RETURN_IF_ERROR(import_archive(posix_io(), path, c));
  return c.out;
}

// Writes `entries` as the archive at `path` (an export edited in memory).
inline Status write_archive_entries(const std::string& path, const ArchiveEntries& entries) {
  std::vector<MemoryFile> files;
  files.reserve(entries.size());  // ExportEntry keeps pointers to them
  std::vector<ExportEntry> out;
  for (const auto& [name, bytes] : entries) {
    files.emplace_back(name, std::as_bytes(std::span<const char>(bytes)));
    out.push_back(ExportEntry::FromFile(name, files.back()));
  }
  return export_archive(posix_io(), path, out);
}

// Writes the archive at `path` again with its index (kvsnap-export.json, the first entry) changed
// by `edit`; the other entries as they were.
inline Status edit_export_index(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  KV_ASSIGN_OR_RETURN(ArchiveEntries e, archive_entries(path));
  if (e.empty() || e.front().first != "kvsnap-export.json") return Status::InvalidArgument(path + ": no index first");
  nlohmann::json index = nlohmann::json::parse(e.front().second);
  edit(index);
  e.front().second = index.dump(2);
  return write_archive_entries(path, e);
}

}  // namespace kvsnap::test
