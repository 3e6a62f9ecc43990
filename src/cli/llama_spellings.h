// llama-server's spellings of the options kvsnap shares with it, so that a user can paste them
// from the server's command line: -ctk, -ctv and -fa (one dash, several letters, which CLI11
// would read as bundled one-letter flags that kvsnap does not have) and --cache-type-k,
// --cache-type-v. Each becomes kvsnap's own spelling before CLI11 parses the command line.
#pragma once

#include <string>
#include <vector>

namespace kvsnap::cli {

// args with every llama.cpp spelling of an option (alone, or as NAME=VALUE) replaced by
// kvsnap's (--ctk, --ctv, --fa). Nothing after a "--" (the end of options) is touched, nor the
// word after a renamed option (its value). CLI11 never takes a word that looks like an option
// as another option's value, so a renamed word was an error before, never a value.
std::vector<std::string> with_kvsnap_spellings(std::vector<std::string> args);

}  // namespace kvsnap::cli
