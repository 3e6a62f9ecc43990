// nlohmann/json, as every file of this tree includes it: the library, and its serializer (what
// dump() runs) compiled once, in json_access.cc, instead of in every file that writes JSON.
//
// Why: a Debug build keeps one copy of each inline template, the first the linker meets, so the
// -O1 files of CI's sanitized build (KVSNAP_HOT_CODE_FLAGS: format/, migrate/, json_access.cc)
// ran the serializer a test file compiled at -O0: 64% of a 44 s test writing 32 MiB of JSON
// under ASan. Declared here, every file calls json_access.cc's copy (at the build's level
// elsewhere, so a plain build does not change).
#pragma once

#include <nlohmann/json.hpp>

extern template class nlohmann::detail::serializer<nlohmann::json>;
extern template class nlohmann::detail::serializer<nlohmann::ordered_json>;
