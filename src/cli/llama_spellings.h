// llama-server's spellings of the options kvsnap shares with it, so that a user can paste them
// from the server's command line: -ctk, -ctv and -fa (one dash, several letters, which CLI11
// would read as bundled one-letter flags that kvsnap does not have) and --cache-type-k,
// --cache-type-v. Each becomes kvsnap's own spelling before CLI11 parses the command line.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kvsnap::cli {

// Whether a word of the command line is an option that takes the next word as its value
// (called for each word with_kvsnap_spellings does not rename, in order, so it may follow
// the subcommands; main.cc asks CLI11).
using TakesValue = std::function<bool(const std::string& word)>;

// args with every llama.cpp spelling of an option (alone, or as NAME=VALUE) replaced by
// kvsnap's (--ctk, --ctv, --fa). A bare -fa, llama-server's older flag, means --fa on (the
// word after it is not on, off or auto). Nothing after a "--" (the end of options) is touched,
// nor an option's value: the word after a renamed option, or after one takes_value names.
std::vector<std::string> with_kvsnap_spellings(const std::vector<std::string>& args,
                                               const TakesValue& takes_value = {});

// llama-server's spellings of kvsnap's option `name` ("--ctk" -> {"-ctk", "--cache-type-k"}),
// for --help; empty for an option llama-server does not share.
std::vector<std::string> llama_spellings_of(const std::string& name);

}  // namespace kvsnap::cli
