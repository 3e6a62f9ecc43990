#include "format/state_summary.h"

#include <set>

#include "format/ggml_types.h"

namespace kvsnap {

std::string state_types(const StateFile& f, bool v) {
  std::set<std::string> seen;
  std::string out;
  for (const auto& sec : f.memory.kv)
    for (const auto& st : sec.streams)
      for (const auto& L : st.layers) {
        if (v && !L.has_v) continue;
        std::string n = type_name(v ? L.v_type : L.k_type);
        if (seen.insert(n).second) out += (out.empty() ? "" : ",") + n;
      }
  return out.empty() ? "-" : out;
}

std::string state_v_layout(const StateFile& f) {
  for (const auto& sec : f.memory.kv)
    for (const auto& st : sec.streams)
      if (st.cell_count) return st.v_trans ? "transposed" : "rows";
  return "-";
}

std::string state_format_name(const StateFile& f) {
  std::string k = f.kind == StateKind::kSeqFile       ? "ggsq"
                  : f.kind == StateKind::kSessionFile ? "ggsn"
                  : f.kind == StateKind::kRawSeq      ? "raw-seq"
                                                      : "raw-context";
  return k + " v" + std::to_string(f.version) +
         ((f.version == 2 || f.version == 9) && !f.memory.kv.empty() && !f.memory.kv[0].stream_prefix ? " (b5640 layout)"
                                                                                                  : "");
}

std::string describe_state(const StateFile& f) {
  const size_t streams = f.memory.kv.empty() ? 1 : f.memory.kv[0].streams.size();
  return state_format_name(f) + ", K " + state_types(f, false) + ", V " + state_types(f, true) + " (" +
         state_v_layout(f) + ")" + (streams > 1 ? ", " + std::to_string(streams) + " KV streams" : "");
}

}  // namespace kvsnap
