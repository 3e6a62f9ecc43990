// One-line descriptions of a parsed state, the same wherever kvsnap shows or
// records them (convert's summary, migrate's plan, the store's catalog).
#pragma once

#include <string>

#include "format/llama_state.h"

namespace kvsnap {

// The distinct K (or V) type names in layer order: "f16", or "q8_0,f16" for mixed caches; "-" when none.
std::string state_types(const StateFile& f, bool v);
// "rows" (V stored per cell: flash attention), "transposed", or "-" (no cells).
std::string state_v_layout(const StateFile& f);
// "ggsq v3", "ggsn v10", "raw-seq v3"; " (b5640 layout)" for v2/v9 files without the n_stream prefix.
std::string state_format_name(const StateFile& f);
// "ggsq v3, K q8_0, V q8_0 (rows)".
std::string describe_state(const StateFile& f);  // ..., ", N KV streams" when more than one

}  // namespace kvsnap
