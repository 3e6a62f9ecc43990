// llama-server's config.ini files ("system-level config": /etc/llama.cpp/config.ini, then the
// user's), read as llama.cpp 3.22.1 reads them (common/preset.cpp parse_ini_from_file and
// load_from_ini, common/arg.cpp common_params_apply_system_config), so that kvsnap serve knows
// the cache types, context, slots and model a setting there gives its child.
//
// Promises:
//   - the text is accepted exactly where llama.cpp's grammar accepts it: lines ended by \r\n, \n
//     or \r; "[name]" headers (the name any characters but ']', at least one); "key = value"
//     lines (key [a-zA-Z_][a-zA-Z0-9_.-]* in decoded characters, so an overlong UTF-8 form of
//     one counts, as in llama.cpp's grammar, and the key keeps its bytes; no white space before
//     it; the value runs to the line's
//     end or to a ';' or '#' comment, white space around it dropped); comment and blank lines;
//     every byte outside a key valid UTF-8 (lead bytes and continuation bytes, as llama.cpp's
//     decoder checks them). Anything else is kInvalidArgument naming the line (llama-server
//     refuses to start: "failed to parse server config file");
//   - what llama-server applies from a file: the "[*]" section's settings, then the default
//     section's (lines before any header, and "[default]"); other sections are ignored. Within
//     a section a later line for a key replaces an earlier one, and a header met again starts its
//     section afresh, as llama.cpp's map does.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvsnap {

struct LlamaConfigIni {
  // key -> value, in key order (the order llama.cpp walks them in).
  std::map<std::string, std::string> global;    // "[*]"
  std::map<std::string, std::string> defaults;  // before any header, and "[default]"
};

Result<LlamaConfigIni> parse_llama_config_ini(std::string_view text);

}  // namespace kvsnap
