// The CLI11 command tree as a flat list, for what is generated from it (shell
// completions, man pages): the same definitions as --help, walked one way.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace kvsnap::cli {

struct Command {
  std::string path;  // "convert", "server add"
  const CLI::App* app;
  bool group;        // has subcommands of its own ("server")
};

// Every command under `root`, depth first in the order --help lists them.
inline std::vector<Command> commands_of(const CLI::App& root) {
  std::vector<Command> out;
  auto walk = [&out](auto& self, const CLI::App* app, const std::string& path) -> void {
    for (const CLI::App* sub : app->get_subcommands({})) {
      const std::string p = path.empty() ? sub->get_name() : path + " " + sub->get_name();
      const bool group = !sub->get_subcommands({}).empty();
      out.push_back({p, sub, group});
      if (group) self(self, sub, p);
    }
  };
  walk(walk, &root, "");
  return out;
}

}  // namespace kvsnap::cli
