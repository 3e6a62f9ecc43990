// The llama-server command line kvsnap serve is given after `--`: what kvsnap
// needs to know from it (model, context, slots, cache types, flash attention,
// API key: read from llama-server's config.ini files, the LLAMA_ARG_*
// environment and the arguments, never probed), and the command line of
// the child it actually starts.
//
// Promises:
//   - both "--flag value" and "--flag=value" spellings are understood, short
//     and long names alike (-c / --ctx-size, ...);
//   - ARGS that set --host, --port or --slot-save-path are refused with a
//     kInvalidArgument naming the flag: kvsnap owns them (the child listens on
//     a private loopback port, its slot files go to a kvsnap-owned directory);
//     so is --no-slots (kvsnap saves and restores through /slots);
//   - child_argv() is ARGS unchanged, followed by config_pins (the settings a
//     config file alone made) and kvsnap's own --host, --port and --slot-save-path;
//   - a cache type llama-server does not take (from a config file, the
//     environment or ARGS) is kInvalidArgument naming where it was set;
//   - llama-server 3.22.1's config files come first (common/arg.cpp
//     common_params_apply_system_config): /etc/llama.cpp/config.ini, then
//     ${XDG_CONFIG_HOME:-$HOME/.config}/llama.cpp/config.ini, each read as it reads
//     them (serve/llama_config.h: "[*]", then the default section), a key being
//     any spelling of the flag without its dashes or the flag's variable
//     (LLAMA_ARG_*); a "no-slots" key is the negative of "slots". A file llama-server
//     would refuse (not parsed, not readable, a value it rejects) is
//     kInvalidArgument naming the file;
//   - the environment is read as llama-server 3.22.1 reads it, after the config
//     files and before ARGS, which win (common/arg.cpp): LLAMA_ARG_MODEL, _CTX_SIZE, _N_PARALLEL,
//     _CACHE_TYPE_K, _CACHE_TYPE_V, _FLASH_ATTN, _CACHE_IDLE_SLOTS (a word that is not
//     a boolean is refused, as llama-server refuses it); LLAMA_ARG_ENDPOINT_SLOTS false
//     or LLAMA_ARG_NO_ENDPOINT_SLOTS set is refused as --no-slots is (unless
//     ARGS has --slots). The child inherits the same environment;
//   - the API keys are read as llama-server 3.22.1 reads them (common/arg.cpp):
//     the environment first (LLAMA_API_KEY, a comma-separated list;
//     LLAMA_ARG_API_KEY_FILE), then --api-key and --api-key-file in command-line
//     order, every key kept (a key file: one per line, empty lines and lines
//     starting with '#' skipped); an unreadable key file is kInvalidArgument
//     naming it (llama-server would refuse to start);
//   - the settings that change what a cache holds for the same model and tokens
//     (cache_settings) are collected from all three; LLAMA_ATTN_ROT_DISABLE as libllama reads it;
//   - with_cache() rebuilds ARGS for other cache types (and flash attention,
//     context size): those flags removed wherever they were, the new ones appended.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvsnap {

struct LlamaArgs {
  std::vector<std::string> argv;  // as given: argv[0] is the llama-server program
  // -m / --model (or LLAMA_ARG_MODEL); empty when not given, or when llama-server downloads the
  // model it loads (-hf, -dr, -mu or their variables) and the path is not that model's.
  std::string model;
  int ctx_size = 0;               // -c / --ctx-size; 0: the server's default
  int parallel = 0;               // -np / --parallel; 0: the server's default
  std::string ctk = "f16", ctv = "f16";  // -ctk / -ctv (llama-server's defaults)
  std::string flash_attn = "auto";       // -fa [on|off|auto]; a bare -fa is "on"
  std::vector<std::string> api_keys;  // every key the child accepts, in llama-server's order
  std::string api_key;            // the first of them: what kvsnap's own calls send
  // The config.ini files llama-server 3.22.1 applies before the environment (/etc/llama.cpp/,
  // then $XDG_CONFIG_HOME or ~/.config /llama.cpp/) that exist, in that order, and the settings
  // kvsnap took from them ("FILE: key = value", for serve's log; an API key's value not shown).
  std::vector<std::string> config_files;
  std::vector<std::string> config_settings;
  // The model, -c, -np, -ctk, -ctv and -fa a config file alone set (neither the environment nor
  // ARGS), as flags that child_argv() puts after ARGS: the child reads its config files again at
  // each restart, and a file edited while serve runs must not change what kvsnap converts for.
  std::vector<std::string> config_pins;
  // llama-server's --cache-idle-slots as the user chose it (a config file, LLAMA_ARG_CACHE_IDLE_SLOTS
  // or LLAMA_ARG_NO_CACHE_IDLE_SLOTS, ARGS: the last that sets it), and where ("ARGS
  // --no-cache-idle-slots", "environment variable ...", "FILE: key = value"); nullopt: not chosen.
  std::optional<bool> cache_idle_slots;
  std::string cache_idle_slots_from;
  // llama-server's --cache-ram (-cram) MiB as the user set it (a config file, LLAMA_ARG_CACHE_RAM,
  // ARGS: the last that sets it) and where; "": not set (3.22.1's default keeps a RAM prompt cache).
  std::string cache_ram, cache_ram_from;
  // --embeddings or --rerank (a config file, LLAMA_ARG_EMBEDDINGS or LLAMA_ARG_RERANKING set to a true
  // word, ARGS, the embd-gemma-default preset): the child runs embedding tasks in its slots, which
  // serve's slot gate does not hold (llama-server refuses them otherwise).
  bool embeddings = false;
  // The settings that change what a slot's cache holds for the same model and tokens (RoPE and YaRN
  // frequencies, LoRA adapters, control vectors, --override-kv), wherever set, in the order
  // llama-server applies them; empty: the model's own.
  struct Setting {
    std::string flag, value;  // "--rope-freq-base", "5000" (two values: "0 3")
    std::string from;         // "ARGS", "environment variable LLAMA_ARG_ROPE_FREQ_BASE", "FILE: key"
  };
  std::vector<Setting> cache_settings;
  // Where LLAMA_ATTN_ROT_DISABLE (read by the child's libllama, atoi != 0) turns the rotation of
  // quantized caches off; "": the build's default.
  std::string rotation_disabled_by;
};

// What serve tags each snapshot with and requires of a stored prefix (tag serve.cache): "" when
// `cache_settings` is empty, else the first 16 hex digits of SHA-256 over them (each by its value
// alone, wherever it was set). A snapshot of another RoPE base or adapter is never restored.
std::string cache_settings_tag(const LlamaArgs& a);

// True when the child keeps no RAM prompt cache: --cache-ram 0 (llama-server 3.22.1 keeps one by
// default and for any other value).
bool ram_cache_off(const LlamaArgs& a);

// Where parse_llama_args() reads the environment and key files (tests give their own).
struct ArgsEnvironment {
  std::function<std::optional<std::string>(const std::string& name)> getenv;
  std::function<std::optional<std::string>(const std::string& path)> read_file;  // nullopt: cannot be read
  // Whether a path exists (std::filesystem::exists, as llama.cpp looks for its config files);
  // when not set, whether read_file reads it.
  std::function<bool(const std::string& path)> exists;
  // The home directory of this process's user (getpwuid), which llama.cpp falls back on when
  // neither XDG_CONFIG_HOME nor HOME is set; nullopt: none.
  std::function<std::optional<std::string>()> passwd_home;
};
// This process's environment and files.
ArgsEnvironment process_environment();

// Parses ARGS (argv[0] the program), the config files and the environment.
// kInvalidArgument for a config file llama-server would refuse, an empty
// command line, a flag kvsnap owns (or --api-prefix), a value flag
// without its value, a number that is not one (ARGS: the whole value; a
// variable: as llama-server's std::stoi reads it), -np 0, a flash-attention or
// /slots word llama-server refuses, /slots turned off, LLAMA_ARG_API_PREFIX or
// AIP_MODE=PREDICTION (the child would not answer on kvsnap's port), or an API
// key file that cannot be read.
Result<LlamaArgs> parse_llama_args(const std::vector<std::string>& argv,
                                   const ArgsEnvironment& env = process_environment());

// ARGS with -ctk/-ctv (and -fa when `flash_attn` is not empty, -c when
// `ctx_size` > 0) replaced, parsed again.
Result<LlamaArgs> with_cache(const LlamaArgs& a, const std::string& ctk, const std::string& ctv,
                             const std::string& flash_attn, int ctx_size,
                             const ArgsEnvironment& env = process_environment());

// ARGS followed by config_pins and --host 127.0.0.1 --port PORT --slot-save-path SLOT_DIR/.
std::vector<std::string> child_argv(const LlamaArgs& a, int port, const std::string& slot_dir);

}  // namespace kvsnap
