// What settles a problem, named by the layers below the front ends without speaking for one of
// them. A message names a remedy in braces, in the command line's words because most people meet
// it there: "pass the model ({--model GGUF})", "{--src-rotation on|off}". Each front end renders
// the braces its own way before anyone sees the text: the CLI drops them (src/cli/exit_codes.h),
// the C API names its own parameter or says the setting exists on the command line only
// (src/capi/kvsnap_c.cc). Only a brace followed by "--" opens a remedy, so JSON and other text pass
// through unchanged.
#pragma once

#include <string>
#include <string_view>

namespace kvsnap {

// `text` with every "{--flag ...}" replaced by name("--flag ...").
template <class Name>
std::string render_remedies(std::string_view text, Name&& name) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find("{--", i);
    const size_t close = open == std::string_view::npos ? open : text.find('}', open);
    const size_t newline = open == std::string_view::npos ? open : text.find('\n', open);
    if (open == std::string_view::npos || close == std::string_view::npos || newline < close) {
      out.append(text.substr(i));
      break;
    }
    out.append(text.substr(i, open - i));
    out.append(name(text.substr(open + 1, close - open - 1)));
    i = close + 1;
  }
  return out;
}

// The command line's rendering: the remedy as typed ("--model GGUF").
inline std::string render_remedies_as_flags(std::string_view text) {
  return render_remedies(text, [](std::string_view r) { return std::string(r); });
}

}  // namespace kvsnap
