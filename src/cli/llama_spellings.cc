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

}  // namespace

std::vector<std::string> with_kvsnap_spellings(std::vector<std::string> args) {
  bool value_next = false;  // the previous word was a renamed option: this one is its value
  for (std::string& a : args) {
    if (a == "--") break;
    if (value_next) {
      value_next = false;
      continue;
    }
    for (const auto& [llama, ours] : kSpellings) {
      if (a == llama) {
        a = std::string(ours);
        value_next = true;
        break;
      }
      if (a.size() > llama.size() && a.compare(0, llama.size(), llama) == 0 && a[llama.size()] == '=') {
        a = std::string(ours) + a.substr(llama.size());
        break;
      }
    }
  }
  return args;
}

}  // namespace kvsnap::cli
