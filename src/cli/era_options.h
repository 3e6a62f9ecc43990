// The flags that say which llama.cpp wrote a file and which will load it, one
// wording for every command that reads or converts llama.cpp files (info,
// convert, migrate, restore; docs/cli.md). What they decide: migrate/source_rotation.h.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace kvsnap::cli {

// --src-rotation auto|on|off and --source-build B; `what` names the files ("the input", "the files").
void add_source_options(CLI::App* sub, std::string& src_rotation, std::string& source_build, const std::string& what);
// --target-build B; `what` names the output ("the output", "them").
void add_target_build_option(CLI::App* sub, std::string& target_build, const std::string& what);

}  // namespace kvsnap::cli
