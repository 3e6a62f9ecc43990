// Internal to format/snapshot_*.cc: reading the manifest's INFO section
// (snapshot_info.cc) for the manifest parser (snapshot_manifest.cc).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "format/snapshot.h"

namespace kvsnap::snapshot_detail {

// Parses INFO (JSON) into m.info, m.provenance, m.arch, m.model,
// m.cells_per_chunk and m.lossy.
Status decode_info(std::span<const std::byte> payload, const std::string& name, SnapshotManifest& m);

}  // namespace kvsnap::snapshot_detail
