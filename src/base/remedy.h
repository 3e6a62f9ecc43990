// What settles a problem, named by the layers below the front ends without speaking for one of
// them. A message names a remedy in braces, in the command line's words because most people meet
// it there: "pass the model ({--model GGUF})", "{--src-rotation on|off}". Each front end renders
// the braces its own way before anyone sees the text: the CLI drops them (src/cli/exit_codes.h),
// the C API names its own parameter or says the setting exists on the command line only
// (src/capi/kvsnap_c.cc). Only a brace followed by "--" opens a remedy, so JSON and other text pass
// through unchanged.
#pragma once

#include <algorithm>
#include <initializer_list>
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

// `text` without each aside " (or {--a}/{--b})" that offers only remedies whose flag is in
// `lacking`: for a front end without those options (migrate takes no --head-dim-k, the model
// gives it), which must not suggest them. Anything else, the remedies before such an aside
// included, is left for the renderers above.
inline std::string drop_remedy_asides(std::string_view text, std::initializer_list<std::string_view> lacking) {
  constexpr std::string_view kAside = " (or {--";
  auto lacks = [&](std::string_view remedy) {
    const std::string_view flag = remedy.substr(0, remedy.find(' '));
    return std::find(lacking.begin(), lacking.end(), flag) != lacking.end();
  };
  // Whether `aside` ("{--a}/{--b}") is only remedies `lacking` names, with '/' between them.
  auto only_lacking = [&](std::string_view aside) {
    for (size_t at = 0; at < aside.size();) {
      if (aside[at] == '/') {
        ++at;
        continue;
      }
      const size_t end = aside.find('}', at);
      if (aside[at] != '{' || end == std::string_view::npos || !lacks(aside.substr(at + 1, end - at - 1))) return false;
      at = end + 1;
    }
    return true;
  };
  std::string out;
  size_t i = 0;
  for (size_t open; (open = text.find(kAside, i)) != std::string_view::npos;) {
    const size_t close = text.find(')', open);
    if (close == std::string_view::npos) break;
    const bool drop = only_lacking(text.substr(open + 5, close - open - 5));  // after " (or "
    out.append(text.substr(i, (drop ? open : close + 1) - i));
    i = close + 1;
  }
  out.append(text.substr(i));
  return out;
}

}  // namespace kvsnap
