// The kvsnap subcommands. Each has an options struct, a setup function that
// binds it to CLI11, and a run function that does the work and returns a
// Status, so tests can call run_* without the binary.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"

namespace CLI {
class App;
}

namespace kvsnap::cli {

struct InfoOptions {
  std::string file;
  std::string model;        // GGUF, optional
  std::string input_format; // "", "raw-seq", "raw-context"
  bool json = false;
  bool tokens = false;
};
void setup_info(CLI::App& app, int& exit_status);
Status run_info(const InfoOptions& opts, std::string& out);

}  // namespace kvsnap::cli
