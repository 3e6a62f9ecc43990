// kvsnap's temporary files (base/io.h kTempInfix): whose they are, and whether their writer is gone.
// Used by what cleans them up: kvsnap migrate of a slot directory, kvsnap serve's own slot directory
// at start.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kvsnap {

// The pid in a name kvsnap gives its temporaries (`<file>.kvsnap-tmp-<pid>-<n>`, optionally
// followed by ".bin"; the last infix decides), 0 for the kept slot scratch file
// (kKeptScratchName), nullopt for any other name: a file like the others.
std::optional<long> kvsnap_temp_pid(const std::string& name);

// Whether the temporary of `pid` (0: the scratch file, always), last written at `written_ns`
// (nullopt: unknown), belongs to a process that no longer runs.
bool is_stale_temp(long pid, std::optional<int64_t> written_ns);

}  // namespace kvsnap
