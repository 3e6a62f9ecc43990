#include "cli/llama_spellings.h"

#include <array>
#include <string_view>
#include <utility>

namespace kvsnap::cli {

namespace {

// llama-server's name -> kvsnap's (every one takes a value in both).
constexpr std::array<std::pair<std::string_view, std::string_view>, 5> kSpellings{{
    {"-ctk", "--ctk"},
    {"-ctv", "--ctv"},
    {"-fa", "--fa"},
    {"--cache-type-k", "--ctk"},
    {"--cache-type-v", "--ctv"},
}};

bool is_fa_value(const std::string& w) { return w == "on" || w == "off" || w == "auto"; }

}  // namespace

std::vector<std::string> with_kvsnap_spellings(const std::vector<std::string>& args, const TakesValue& takes_value) {
  std::vector<std::string> out;
  out.reserve(args.size() + 1);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {  // the rest as it is
      out.insert(out.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    bool renamed = false;
    for (const auto& [llama, ours] : kSpellings) {
      if (a == llama) {
        out.emplace_back(ours);
        if (llama == "-fa" && (i + 1 == args.size() || !is_fa_value(args[i + 1]))) {
          out.emplace_back("on");  // the older bare flag
        } else if (i + 1 < args.size()) {
          out.push_back(args[++i]);  // its value, untouched
        }
        renamed = true;
        break;
      }
      if (a.size() > llama.size() && a.compare(0, llama.size(), llama) == 0 && a[llama.size()] == '=') {
        out.push_back(std::string(ours) + a.substr(llama.size()));
        renamed = true;
        break;
      }
    }
    if (renamed) continue;
    out.push_back(a);
    if (takes_value && takes_value(a) && i + 1 < args.size()) out.push_back(args[++i]);  // a value
  }
  return out;
}

std::vector<std::string> llama_spellings_of(const std::string& name) {
  std::vector<std::string> out;
  for (const auto& [llama, ours] : kSpellings)
    if (ours == name) out.emplace_back(llama);
  return out;
}

}  // namespace kvsnap::cli
