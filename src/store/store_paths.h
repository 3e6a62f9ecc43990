// The store's local directory (store_location.h says where a store is).
//
//   $KVSNAP_HOME, else ${XDG_DATA_HOME:-~/.local/share}/kvsnap; `--store DIR`
//   overrides both. For a directory store it holds everything
//   (local_blob_store.h, sqlite_catalog.h); for a configured one
//   (store.json), this host's part: temporaries, server profiles.
#pragma once

#include <string>

#include "base/status.h"

namespace kvsnap {

struct StorePaths {
  std::string root;
  std::string catalog() const { return root + "/catalog.sqlite"; }  // a directory store's catalog
  std::string chunks_dir() const { return root + "/chunks"; }
  std::string tmp_dir() const { return root + "/tmp"; }
};

// The local directory of the store `explicit_dir` (from --store) names when
// non-empty, else of the environment's choice (resolve_store_location).
// kInvalidArgument when neither KVSNAP_HOME, XDG_DATA_HOME nor HOME is set.
Result<StorePaths> resolve_store_paths(const std::string& explicit_dir);

}  // namespace kvsnap
