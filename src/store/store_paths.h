// Where the store lives on disk.
//
//   $KVSNAP_HOME, else ${XDG_DATA_HOME:-~/.local/share}/kvsnap; `--store DIR`
//   overrides both. Inside it:
//     catalog.sqlite     the SQLite catalog (WAL mode)
//     chunks/ab/<sha256> content-addressed chunk blobs (ab = first two hex digits)
//     tmp/               temporary files of writes in progress (gc empties it)
#pragma once

#include <string>

#include "base/status.h"

namespace kvsnap {

struct StorePaths {
  std::string root;
  std::string catalog() const { return root + "/catalog.sqlite"; }
  std::string chunks_dir() const { return root + "/chunks"; }
  std::string tmp_dir() const { return root + "/tmp"; }
};

// `explicit_dir` (from --store) when non-empty, else the environment's choice.
// kInvalidArgument when neither KVSNAP_HOME, XDG_DATA_HOME nor HOME is set.
Result<StorePaths> resolve_store_paths(const std::string& explicit_dir);

}  // namespace kvsnap
