// The llama-server command line kvsnap serve is given after `--`: what kvsnap
// needs to know from it (model, context, slots, cache types, flash attention,
// API key: read from the arguments, never probed), and the command line of
// the child it actually starts.
//
// Promises:
//   - both "--flag value" and "--flag=value" spellings are understood, short
//     and long names alike (-c / --ctx-size, ...);
//   - ARGS that set --host, --port or --slot-save-path are refused with a
//     kInvalidArgument naming the flag: kvsnap owns them (the child listens on
//     a private loopback port, its slot files go to a kvsnap-owned directory);
//     so is --no-slots (kvsnap saves and restores through /slots);
//   - child_argv() is ARGS unchanged, followed by kvsnap's own --host, --port
//     and --slot-save-path.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace kvsnap {

struct LlamaArgs {
  std::vector<std::string> argv;  // as given: argv[0] is the llama-server program
  std::string model;              // -m / --model; empty when not given
  int ctx_size = 0;               // -c / --ctx-size; 0: the server's default
  int parallel = 0;               // -np / --parallel; 0: the server's default
  std::string ctk = "f16", ctv = "f16";  // -ctk / -ctv (llama-server's defaults)
  std::string flash_attn = "auto";       // -fa [on|off|auto]; a bare -fa is "on"
  std::string api_key;            // --api-key (the first one when several are given)
};

// Parses ARGS (argv[0] the program). kInvalidArgument for an empty command
// line, a flag kvsnap owns, a value flag without its value, or a number that is not one.
Result<LlamaArgs> parse_llama_args(const std::vector<std::string>& argv);

// ARGS followed by --host 127.0.0.1 --port PORT --slot-save-path SLOT_DIR/.
std::vector<std::string> child_argv(const LlamaArgs& a, int port, const std::string& slot_dir);

}  // namespace kvsnap
