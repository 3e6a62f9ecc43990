#include "serve/llama_args.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>

#include <pwd.h>
#include <unistd.h>

#include "base/sha256.h"
#include "serve/llama_config.h"

namespace kvsnap {

namespace {

bool is_one_of(const std::string& flag, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (flag == n) return true;
  return false;
}

Result<int> to_int(const std::string& flag, const std::string& v) {
  int n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size())
    return Status::InvalidArgument("llama-server argument " + flag + " '" + v + "' is not a number");
  return n;
}

// A number as llama-server reads an environment variable's (std::stoi): leading white space, a
// sign, digits, and whatever follows ignored ("8k" is 8); nullopt where stoi throws (no digits,
// out of range).
std::optional<int> stoi_like(const std::string& v) {
  size_t i = 0;
  while (i < v.size() && std::isspace(static_cast<unsigned char>(v[i]))) ++i;
  const bool negative = i < v.size() && v[i] == '-';
  if (i < v.size() && (v[i] == '+' || v[i] == '-')) ++i;
  long long n = 0;
  size_t digits = 0;
  for (; i < v.size() && v[i] >= '0' && v[i] <= '9'; ++i, ++digits) {
    n = n * 10 + (v[i] - '0');
    if (n > (long long)INT_MAX + 1) return std::nullopt;
  }
  if (digits == 0) return std::nullopt;
  if (negative) n = -n;
  if (n > INT_MAX || n < INT_MIN) return std::nullopt;
  return int(n);
}

// llama-server 3.22.1's settings that change what a slot's cache holds for the same model and
// tokens (common/arg.cpp): the RoPE's frequencies (K is stored after it), the adapters and control
// vectors (every layer's input), metadata overrides. Each with its LLAMA_ARG_* variable ("" for
// none) and how many values it takes.
struct CacheSetting {
  const char* flag;
  const char* env;
  int values;
};
constexpr CacheSetting kCacheSettings[] = {
    {"--rope-scaling", "LLAMA_ARG_ROPE_SCALING_TYPE", 1},  {"--rope-scale", "LLAMA_ARG_ROPE_SCALE", 1},
    {"--rope-freq-base", "LLAMA_ARG_ROPE_FREQ_BASE", 1},   {"--rope-freq-scale", "LLAMA_ARG_ROPE_FREQ_SCALE", 1},
    {"--yarn-orig-ctx", "LLAMA_ARG_YARN_ORIG_CTX", 1},     {"--yarn-ext-factor", "LLAMA_ARG_YARN_EXT_FACTOR", 1},
    {"--yarn-attn-factor", "LLAMA_ARG_YARN_ATTN_FACTOR", 1}, {"--yarn-beta-slow", "LLAMA_ARG_YARN_BETA_SLOW", 1},
    {"--yarn-beta-fast", "LLAMA_ARG_YARN_BETA_FAST", 1},   {"--override-kv", "", 1},
    {"--lora", "", 1},                                     {"--lora-scaled", "", 1},
    {"--lora-init-without-apply", "", 0},                  {"--control-vector", "", 1},
    {"--control-vector-scaled", "", 1},                    {"--control-vector-layer-range", "", 2},
};
const CacheSetting* cache_setting(std::string_view flag) {
  for (const CacheSetting& c : kCacheSettings)
    if (flag == c.flag) return &c;
  return nullptr;
}

// How many values a flag kvsnap reads takes (-fa's is optional: handled apart); 0 for the others.
int value_count(const std::string& flag) {
  if (const CacheSetting* c = cache_setting(flag)) return c->values;
  return is_one_of(flag, {"-m", "--model", "-c", "--ctx-size", "-np", "--parallel", "-ctk", "--cache-type-k", "-ctv",
                          "--cache-type-v", "--api-key", "--api-key-file", "-hf", "-hfr", "--hf-repo", "-dr",
                          "--docker-repo", "-mu", "--model-url", "--api-prefix", "--sleep-idle-seconds", "-cram",
                          "--cache-ram"})
             ? 1
             : 0;
}

// llama-server 3.22.1's model presets (common/arg.cpp, "--gpt-oss-20b-default" ...): a flag, or a
// config key with any value, that downloads a model and may set the context and the slot count.
struct ModelPreset {
  const char* name;  // the flag without its dashes
  int ctx, parallel;  // -1: left as it was
  bool embeddings = false;  // turns --embeddings on
};
constexpr ModelPreset kModelPresets[] = {
    {"embd-gemma-default", 2048 * 32, 32, true},  {"fim-qwen-1.5b-default", 0, -1},
    {"fim-qwen-3b-default", 0, -1},               {"fim-qwen-7b-default", 0, -1},
    {"fim-qwen-7b-spec", 0, -1},                  {"fim-qwen-14b-spec", 0, -1},
    {"fim-qwen-30b-default", 0, -1},              {"gpt-oss-20b-default", 131072 * 2, 2},
    {"gpt-oss-120b-default", 131072 * 2, 2},      {"vision-gemma-4b-default", 0, -1},
    {"vision-gemma-12b-default", 0, -1},
};
const ModelPreset* model_preset(std::string_view name) {
  for (const ModelPreset& p : kModelPresets)
    if (name == p.name) return &p;
  return nullptr;
}

// The cache types llama-server 3.22.1 takes (common/arg.cpp kv_cache_types); any other stops it.
Status check_cache_type(const std::string& type, const std::string& where) {
  for (const char* t : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})
    if (type == t) return Status::OK();
  return Status::InvalidArgument(where + " '" + type +
                                 "' is not a cache type llama-server takes (f32, f16, bf16, q8_0, q4_0, q4_1, "
                                 "iq4_nl, q5_0, q5_1); it would not start");
}

// Where the settings kvsnap reads came from, as far as what follows the parse needs it.
struct Origins {
  // Set by a config file and by neither the environment nor ARGS: pinned on the child's command
  // line (LlamaArgs::config_pins), since the child reads the file again at each restart.
  bool ctk = false, ctv = false, fa = false, ctx = false, np = false, model = false;
  std::optional<bool> slots;  // a config file's /slots setting, and where
  std::string slots_from;
  std::string api_prefix, api_prefix_from;  // a config file's
  std::string sleep_idle, sleep_idle_from;  // a config file's sleep-idle-seconds
  // The model downloads' values as last set (config, environment, ARGS; a preset sets hf): any
  // not empty, and the model the child loads is a download, not the given path.
  std::string hf, dr, mu;
};

// One flag of ARGS with its value: argv[first..last].
struct ArgItem {
  std::string flag, value;
  size_t first = 0, last = 0;
};

// -fa's value as llama-server reads it (common_arg_utils::is_truthy / is_falsey / is_autoy):
// "on", "off" or "auto", or nullptr when it is none of its spellings.
const char* flash_attn_word(const std::string& v) {
  if (is_one_of(v, {"on", "enabled", "true", "1"})) return "on";
  if (is_one_of(v, {"off", "disabled", "false", "0"})) return "off";
  if (is_one_of(v, {"auto", "-1"})) return "auto";
  return nullptr;
}

// ARGS as flags with their values. Long flags are spelled as llama-server reads them ('_' -> '-').
Result<std::vector<ArgItem>> split_args(const std::vector<std::string>& argv) {
  std::vector<ArgItem> out;
  for (size_t i = 1; i < argv.size(); ++i) {
    ArgItem it;
    it.first = it.last = i;
    it.flag = argv[i];
    bool inline_value = false;
    if (it.flag.rfind("--", 0) == 0) {
      if (auto eq = it.flag.find('='); eq != std::string::npos) {
        it.value = it.flag.substr(eq + 1);
        it.flag.resize(eq);
        inline_value = true;
      }
      for (auto& c : it.flag) c = c == '_' ? '-' : c;
    }
    if (is_one_of(it.flag, {"-fa", "--flash-attn"})) {
      // -fa takes a value in any of llama-server's spellings (flash_attn_word); a bare -fa (older
      // servers) means on.
      if (!inline_value) {
        if (i + 1 < argv.size() && flash_attn_word(argv[i + 1])) it.value = argv[it.last = ++i];
        else it.value = "on";
      }
    } else if (const int n = value_count(it.flag); n > 0 && !inline_value) {
      if (i + size_t(n) >= argv.size())
        return Status::InvalidArgument("llama-server argument " + it.flag + (n == 1 ? " needs a value" : " needs " +
                                       std::to_string(n) + " values"));
      for (int v = 0; v < n; ++v) it.value += (v ? " " : "") + argv[it.last = ++i];
    }
    out.push_back(std::move(it));
  }
  return out;
}

// llama-server's parse_csv_row: commas split, a field may be quoted ("" is a quote inside one).
std::vector<std::string> csv_fields(const std::string& s) {
  std::vector<std::string> fields;
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      if (!quoted) {
        if (field.empty()) quoted = true;
        else field += '"';
      } else if (i + 1 < s.size() && s[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
    } else if (c == ',' && !quoted) {
      fields.push_back(std::move(field));
      field.clear();
    } else {
      field += c;
    }
  }
  fields.push_back(std::move(field));
  return fields;
}

// The LLAMA_ARG_* variables of the flags kvsnap reads, as llama-server 3.22.1 reads them
// (common_arg::get_value_from_env): a set variable is the flag's value; a boolean option's
// LLAMA_ARG_NO_* variable, set to anything, is its negative. Host and port need nothing: kvsnap's
// --host and --port on the child's command line override them.
Status apply_environment(const ArgsEnvironment& env, LlamaArgs& a, Origins& o) {
  auto number = [&](const char* var, int& out) -> Status {
    auto v = env.getenv(var);
    if (!v) return Status::OK();
    auto n = stoi_like(*v);
    if (!n) return Status::InvalidArgument(std::string("environment variable ") + var + " '" + *v + "' is not a number");
    out = *n;
    return Status::OK();
  };
  if (auto v = env.getenv("LLAMA_ARG_MODEL")) a.model = *v, o.model = false;
  if (env.getenv("LLAMA_ARG_CTX_SIZE")) o.ctx = false;
  if (env.getenv("LLAMA_ARG_N_PARALLEL")) o.np = false;
  KV_RETURN_IF_ERROR(number("LLAMA_ARG_CTX_SIZE", a.ctx_size));
  KV_RETURN_IF_ERROR(number("LLAMA_ARG_N_PARALLEL", a.parallel));
  if (env.getenv("LLAMA_ARG_N_PARALLEL") && a.parallel == 0)
    return Status::InvalidArgument("environment variable LLAMA_ARG_N_PARALLEL is 0, which llama-server refuses");
  if (auto v = env.getenv("LLAMA_ARG_CACHE_TYPE_K")) {
    KV_RETURN_IF_ERROR(check_cache_type(*v, "environment variable LLAMA_ARG_CACHE_TYPE_K"));
    a.ctk = *v, o.ctk = false;
  }
  if (auto v = env.getenv("LLAMA_ARG_CACHE_TYPE_V")) {
    KV_RETURN_IF_ERROR(check_cache_type(*v, "environment variable LLAMA_ARG_CACHE_TYPE_V"));
    a.ctv = *v, o.ctv = false;
  }
  if (auto v = env.getenv("LLAMA_ARG_FLASH_ATTN")) {
    const char* word = flash_attn_word(*v);
    if (!word)
      return Status::InvalidArgument("environment variable LLAMA_ARG_FLASH_ATTN '" + *v +
                                     "' must be on, off or auto (or enabled, true, 1; disabled, false, 0; -1)");
    a.flash_attn = word, o.fa = false;
  }
  // Routes under a prefix, or (AIP_MODE=PREDICTION, as Vertex AI sets it) a port of its own: kvsnap
  // could no longer reach the child's /health and /slots on the port it gave it.
  if (auto v = env.getenv("LLAMA_ARG_API_PREFIX"); v && !v->empty())
    return Status::InvalidArgument("environment variable LLAMA_ARG_API_PREFIX moves llama-server's routes under '" + *v +
                                   "', where kvsnap serve does not look for /health and /slots: unset it");
  if (auto v = env.getenv("AIP_MODE"); v && *v == "PREDICTION")
    return Status::InvalidArgument("environment variable AIP_MODE=PREDICTION makes llama-server listen on AIP_HTTP_PORT "
                                   "instead of the private port kvsnap serve gives it: unset it");
  // A boolean option's LLAMA_ARG_NO_* variable comes first (common_arg::get_value_from_env): set to
  // anything, it is off; the positive one must be a boolean word (parse_bool_value).
  if (env.getenv("LLAMA_ARG_NO_CACHE_IDLE_SLOTS")) {
    a.cache_idle_slots = false;
    a.cache_idle_slots_from = "environment variable LLAMA_ARG_NO_CACHE_IDLE_SLOTS";
  } else if (auto v = env.getenv("LLAMA_ARG_CACHE_IDLE_SLOTS")) {
    const char* word = flash_attn_word(*v);  // the same true/false spellings (is_truthy, is_falsey)
    if (!word || std::string_view(word) == "auto")
      return Status::InvalidArgument("environment variable LLAMA_ARG_CACHE_IDLE_SLOTS '" + *v +
                                     "' is not a boolean (on, enabled, true, 1; off, disabled, false, 0): "
                                     "llama-server refuses to start with it");
    a.cache_idle_slots = std::string_view(word) == "on";
    a.cache_idle_slots_from = "environment variable LLAMA_ARG_CACHE_IDLE_SLOTS=" + *v;
  }
  if (auto v = env.getenv("LLAMA_ARG_CACHE_RAM")) {
    a.cache_ram = *v;
    a.cache_ram_from = "environment variable LLAMA_ARG_CACHE_RAM=" + *v;
  }
  // Flag options without a negative: on when their variable is a true word (common/arg.cpp handler_void).
  for (const char* var : {"LLAMA_ARG_EMBEDDINGS", "LLAMA_ARG_RERANKING"})
    if (auto v = env.getenv(var); v && is_one_of(*v, {"on", "enabled", "true", "1"})) a.embeddings = true;
  for (const CacheSetting& c : kCacheSettings)
    if (auto v = *c.env ? env.getenv(c.env) : std::nullopt)
      a.cache_settings.push_back({c.flag, *v, std::string("environment variable ") + c.env});
  // Rotated quantized caches are the build's default; libllama reads this variable (atoi != 0:
  // src/llama-kv-cache.cpp) in the child, which inherits kvsnap's environment.
  if (auto v = env.getenv("LLAMA_ATTN_ROT_DISABLE"); v && std::atoi(v->c_str()) != 0)
    a.rotation_disabled_by = "environment variable LLAMA_ATTN_ROT_DISABLE=" + *v;
  // The model downloads (Origins::hf, dr, mu): the child's model is then not the given path.
  if (auto v = env.getenv("LLAMA_ARG_HF_REPO")) o.hf = *v;
  if (auto v = env.getenv("LLAMA_ARG_DOCKER_REPO")) o.dr = *v;
  if (auto v = env.getenv("LLAMA_ARG_MODEL_URL")) o.mu = *v;
  return Status::OK();
}

// The variable that turns llama-server's /slots endpoint off (a --slots in ARGS turns it on again),
// or "" when none does.
std::string slots_off_by(const ArgsEnvironment& env) {
  if (env.getenv("LLAMA_ARG_NO_ENDPOINT_SLOTS")) return "LLAMA_ARG_NO_ENDPOINT_SLOTS";
  if (auto v = env.getenv("LLAMA_ARG_ENDPOINT_SLOTS")) {
    const char* word = flash_attn_word(*v);  // the same true/false spellings (common_arg's is_falsey)
    if (word && std::string_view(word) == "off") return "LLAMA_ARG_ENDPOINT_SLOTS";
  }
  return "";
}

// LLAMA_ARG_ENDPOINT_SLOTS set to a word that is neither true nor false: llama-server refuses to start.
Status check_slots_word(const ArgsEnvironment& env) {
  auto v = env.getenv("LLAMA_ARG_ENDPOINT_SLOTS");
  if (!v || env.getenv("LLAMA_ARG_NO_ENDPOINT_SLOTS")) return Status::OK();
  const char* word = flash_attn_word(*v);
  if (word && std::string_view(word) != "auto") return Status::OK();
  return Status::InvalidArgument("environment variable LLAMA_ARG_ENDPOINT_SLOTS '" + *v +
                                 "' is not a boolean (on, enabled, true, 1; off, disabled, false, 0): llama-server "
                                 "refuses to start with it");
}

void add_key_list(const std::string& value, std::vector<std::string>& keys) {
  for (auto& k : csv_fields(value))
    if (!k.empty()) keys.push_back(std::move(k));
}

Status add_key_file(const std::string& path, const std::string& from, const ArgsEnvironment& env,
                    std::vector<std::string>& keys) {
  auto text = env.read_file(path);
  if (!text)
    return Status::InvalidArgument("API key file '" + path + "' (" + from +
                                   ") cannot be read; llama-server would refuse to start");
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);)  // as llama-server: no trimming
    if (!line.empty() && line[0] != '#') keys.push_back(line);
  return Status::OK();
}

// The options kvsnap reads, in the order llama-server 3.22.1 applies a config section's settings
// (its std::map<common_arg, value>: by the option's first flag, strcmp: "--api-key" <
// "--api-key-file" < ... < "-np"; only the API keys' order shows).
enum class ConfigOpt { kApiKey, kApiKeyFile, kApiPrefix, kCacheIdleSlots, kCacheRam, kEmbeddings, kPreset, kSlots, kCtx,
                       kCtk, kCtv, kDockerRepo, kFlashAttn, kHfRepo, kModel, kModelUrl, kParallel, kSleepIdle, kCount };

// Every key a config file names them by (common/preset.cpp get_map_key_opt: each flag without its
// dashes, the variable, and a boolean option's LLAMA_ARG_NO_* variable, which in a config file
// is not a negative: only the negative flag's key is, load_from_ini's parse_bool_arg).
struct ConfigKey {
  const char* key;
  ConfigOpt opt;
  bool negative = false;
};
constexpr ConfigKey kConfigKeys[] = {
    {"api-key", ConfigOpt::kApiKey},          {"LLAMA_API_KEY", ConfigOpt::kApiKey},
    {"api-key-file", ConfigOpt::kApiKeyFile}, {"LLAMA_ARG_API_KEY_FILE", ConfigOpt::kApiKeyFile},
    {"api-prefix", ConfigOpt::kApiPrefix},    {"LLAMA_ARG_API_PREFIX", ConfigOpt::kApiPrefix},
    {"cache-idle-slots", ConfigOpt::kCacheIdleSlots}, {"no-cache-idle-slots", ConfigOpt::kCacheIdleSlots, true},
    {"LLAMA_ARG_CACHE_IDLE_SLOTS", ConfigOpt::kCacheIdleSlots},
    {"LLAMA_ARG_NO_CACHE_IDLE_SLOTS", ConfigOpt::kCacheIdleSlots},
    {"cram", ConfigOpt::kCacheRam},           {"cache-ram", ConfigOpt::kCacheRam},
    {"LLAMA_ARG_CACHE_RAM", ConfigOpt::kCacheRam},
    {"embedding", ConfigOpt::kEmbeddings},    {"embeddings", ConfigOpt::kEmbeddings},
    {"LLAMA_ARG_EMBEDDINGS", ConfigOpt::kEmbeddings}, {"rerank", ConfigOpt::kEmbeddings},
    {"reranking", ConfigOpt::kEmbeddings},    {"LLAMA_ARG_RERANKING", ConfigOpt::kEmbeddings},
    {"slots", ConfigOpt::kSlots},             {"no-slots", ConfigOpt::kSlots, true},
    {"LLAMA_ARG_ENDPOINT_SLOTS", ConfigOpt::kSlots}, {"LLAMA_ARG_NO_ENDPOINT_SLOTS", ConfigOpt::kSlots},
    {"c", ConfigOpt::kCtx},                   {"ctx-size", ConfigOpt::kCtx},
    {"LLAMA_ARG_CTX_SIZE", ConfigOpt::kCtx},  {"ctk", ConfigOpt::kCtk},
    {"cache-type-k", ConfigOpt::kCtk},        {"LLAMA_ARG_CACHE_TYPE_K", ConfigOpt::kCtk},
    {"ctv", ConfigOpt::kCtv},                 {"cache-type-v", ConfigOpt::kCtv},
    {"LLAMA_ARG_CACHE_TYPE_V", ConfigOpt::kCtv}, {"dr", ConfigOpt::kDockerRepo},
    {"docker-repo", ConfigOpt::kDockerRepo},  {"LLAMA_ARG_DOCKER_REPO", ConfigOpt::kDockerRepo},
    {"fa", ConfigOpt::kFlashAttn},            {"flash-attn", ConfigOpt::kFlashAttn},
    {"LLAMA_ARG_FLASH_ATTN", ConfigOpt::kFlashAttn}, {"hf", ConfigOpt::kHfRepo},
    {"hfr", ConfigOpt::kHfRepo},              {"hf-repo", ConfigOpt::kHfRepo},
    {"LLAMA_ARG_HF_REPO", ConfigOpt::kHfRepo}, {"m", ConfigOpt::kModel},
    {"model", ConfigOpt::kModel},             {"LLAMA_ARG_MODEL", ConfigOpt::kModel},
    {"mu", ConfigOpt::kModelUrl},             {"model-url", ConfigOpt::kModelUrl},
    {"LLAMA_ARG_MODEL_URL", ConfigOpt::kModelUrl}, {"np", ConfigOpt::kParallel},
    {"parallel", ConfigOpt::kParallel},       {"LLAMA_ARG_N_PARALLEL", ConfigOpt::kParallel},
    {"sleep-idle-seconds", ConfigOpt::kSleepIdle},  // no variable in 3.22.1 (common/arg.cpp sets none)
};

// llama-server's common_arg_utils::is_truthy.
bool is_truthy(const std::string& v) { return is_one_of(v, {"on", "enabled", "true", "1"}); }

// One section's settings ("[*]" or the default one) applied as llama-server applies them.
Status apply_config_section(const std::map<std::string, std::string>& section, const std::string& file,
                            const ArgsEnvironment& env, LlamaArgs& a, Origins& out) {
  // A later key naming the same option replaces an earlier one (the section's keys in key order).
  struct Setting {
    std::string key, value;
  };
  std::optional<Setting> set[size_t(ConfigOpt::kCount)];
  std::vector<const ModelPreset*> presets;  // each its own option: all applied, in key order
  for (const auto& [key, value] : section) {
    if (const ModelPreset* p = model_preset(key)) presets.push_back(p);
    for (const CacheSetting& c : kCacheSettings)
      if (key == c.flag + 2 || (*c.env && key == c.env)) a.cache_settings.push_back({c.flag, value, file + ": " + key});
    for (const ConfigKey& k : kConfigKeys) {
      if (key != k.key) continue;
      set[size_t(k.opt)] = Setting{key, k.negative ? (is_truthy(value) ? "false" : "true") : value};
      break;
    }
  }
  if (!presets.empty()) set[size_t(ConfigOpt::kPreset)] = Setting{presets.front()->name, ""};
  for (size_t i = 0; i < size_t(ConfigOpt::kCount); ++i) {
    if (!set[i]) continue;
    const std::string& key = set[i]->key;
    const std::string& v = set[i]->value;
    const std::string where = "llama-server's config file " + file + ": " + key + " = '" + v + "'";
    const ConfigOpt opt = ConfigOpt(i);
    const bool secret = opt == ConfigOpt::kApiKey;
    a.config_settings.push_back(file + ": " + key + " = " + (secret ? std::string("(hidden)") : v));
    switch (opt) {
      case ConfigOpt::kApiKey: add_key_list(v, a.api_keys); break;
      case ConfigOpt::kApiKeyFile: KV_RETURN_IF_ERROR(add_key_file(v, key + " in " + file, env, a.api_keys)); break;
      case ConfigOpt::kApiPrefix:
        out.api_prefix = v;
        out.api_prefix_from = where;
        break;
      case ConfigOpt::kEmbeddings: a.embeddings = true; break;  // a flag option, as kPreset
      case ConfigOpt::kPreset:
        // a flag option: applied whatever its value (common/preset.cpp apply_to_params)
        for (const ModelPreset* p : presets) {
          a.embeddings = a.embeddings || p->embeddings;
          out.hf = p->name;
          if (p->ctx >= 0) a.ctx_size = p->ctx, out.ctx = true;
          if (p->parallel >= 0) a.parallel = p->parallel, out.np = true;
        }
        break;
      case ConfigOpt::kSlots:
        out.slots = is_truthy(v);  // apply_to_params: anything else is false
        out.slots_from = where;
        break;
      case ConfigOpt::kCacheIdleSlots:
        a.cache_idle_slots = is_truthy(v);  // as kSlots
        a.cache_idle_slots_from = "llama-server's config file " + file + ": " + key + " (" +
                                  (*a.cache_idle_slots ? "on" : "off") + ")";
        break;
      case ConfigOpt::kCacheRam:
        a.cache_ram = v;
        a.cache_ram_from = where;
        break;
      case ConfigOpt::kCtx:
      case ConfigOpt::kParallel: {
        auto n = stoi_like(v);
        if (!n) return Status::InvalidArgument(where + " is not a number; llama-server refuses to start with it");
        if (opt == ConfigOpt::kParallel && *n == 0)
          return Status::InvalidArgument(where + ": llama-server refuses 0 slots");
        (opt == ConfigOpt::kCtx ? a.ctx_size : a.parallel) = *n;
        (opt == ConfigOpt::kCtx ? out.ctx : out.np) = true;
        break;
      }
      case ConfigOpt::kCtk:
      case ConfigOpt::kCtv:
        KV_RETURN_IF_ERROR(check_cache_type(v, "llama-server's config file " + file + ": " + key));
        (opt == ConfigOpt::kCtk ? a.ctk : a.ctv) = v;
        (opt == ConfigOpt::kCtk ? out.ctk : out.ctv) = true;
        break;
      case ConfigOpt::kFlashAttn: {
        const char* word = flash_attn_word(v);
        if (!word)
          return Status::InvalidArgument(where + " must be on, off or auto (or enabled, true, 1; disabled, false, 0; "
                                                 "-1); llama-server refuses to start with it");
        a.flash_attn = word;
        out.fa = true;
        break;
      }
      case ConfigOpt::kSleepIdle:
        out.sleep_idle = v;
        out.sleep_idle_from = where;
        break;
      case ConfigOpt::kDockerRepo: out.dr = v; break;
      case ConfigOpt::kHfRepo: out.hf = v; break;
      case ConfigOpt::kModelUrl: out.mu = v; break;
      case ConfigOpt::kModel:
        a.model = v;
        out.model = true;
        break;
      case ConfigOpt::kCount: break;
    }
  }
  return Status::OK();
}

// llama-server 3.22.1's config files (common_params_apply_system_config): the system's, then the
// user's (fs_get_config_directory: $XDG_CONFIG_HOME, else $HOME/.config, else the passwd entry's).
std::vector<std::string> config_paths(const ArgsEnvironment& env) {
  std::vector<std::string> paths = {"/etc/llama.cpp/config.ini"};
  std::string dir;
  if (auto x = env.getenv("XDG_CONFIG_HOME"); x && !x->empty()) dir = *x;
  else if (auto h = env.getenv("HOME"); h && !h->empty()) dir = *h + "/.config/";
  else if (auto pw = env.passwd_home ? env.passwd_home() : std::nullopt) dir = *pw + "/.config/";  // "" too
  if (!dir.empty()) paths.push_back(dir + (dir.back() == '/' ? "" : "/") + "llama.cpp/config.ini");
  return paths;
}

// Each config file that exists, "[*]" then the default section, as llama-server applies them
// before its environment.
Status apply_config_files(const ArgsEnvironment& env, LlamaArgs& a, Origins& out) {
  for (const std::string& path : config_paths(env)) {
    if (env.exists ? !env.exists(path) : !env.read_file(path)) continue;
    auto text = env.read_file(path);
    if (!text)
      return Status::InvalidArgument("llama-server's config file " + path +
                                     " exists but cannot be read (or is a directory); llama-server refuses to start "
                                     "with it");
    auto ini = parse_llama_config_ini(*text);
    if (!ini.ok()) return Status::InvalidArgument("llama-server's config file " + path + ", " + ini.status().message());
    a.config_files.push_back(path);
    KV_RETURN_IF_ERROR(apply_config_section(ini->global, path, env, a, out));
    KV_RETURN_IF_ERROR(apply_config_section(ini->defaults, path, env, a, out));
  }
  return Status::OK();
}

}  // namespace

ArgsEnvironment process_environment() {
  ArgsEnvironment e;
  e.getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  e.read_file = [](const std::string& path) -> std::optional<std::string> {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) return std::nullopt;  // opens, but cannot be read
    std::ifstream f(path, std::ios::binary);
    if (!f) return std::nullopt;
    std::ostringstream s;
    s << f.rdbuf();
    if (f.bad()) return std::nullopt;
    return s.str();
  };
  e.exists = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::exists(path, ec);
  };
  e.passwd_home = []() -> std::optional<std::string> {
    const passwd* pw = getpwuid(getuid());
    return pw && pw->pw_dir ? std::optional<std::string>(pw->pw_dir) : std::nullopt;
  };
  return e;
}

Result<LlamaArgs> parse_llama_args(const std::vector<std::string>& argv, const ArgsEnvironment& env) {
  if (argv.empty() || argv[0].empty())
    return Status::InvalidArgument("no llama-server command after '--' (kvsnap serve -- llama-server -m MODEL ...)");
  LlamaArgs a;
  a.argv = argv;
  KV_ASSIGN_OR_RETURN(auto items, split_args(argv));
  // llama-server applies its config files first, then the environment, then the command line
  // (common/arg.cpp: every option's LLAMA_ARG_* variable, then ARGS, which win), --api-key's
  // variable before --api-key-file's.
  Origins config;
  KV_RETURN_IF_ERROR(apply_config_files(env, a, config));
  KV_RETURN_IF_ERROR(apply_environment(env, a, config));
  KV_RETURN_IF_ERROR(check_slots_word(env));
  if (auto v = env.getenv("LLAMA_API_KEY")) add_key_list(*v, a.api_keys);
  if (auto v = env.getenv("LLAMA_ARG_API_KEY_FILE"))
    KV_RETURN_IF_ERROR(add_key_file(*v, "LLAMA_ARG_API_KEY_FILE", env, a.api_keys));
  std::optional<std::string> args_sleep_idle;
  for (const ArgItem& it : items) {
    const std::string& flag = it.flag;
    const std::string& value = it.value;
    if (is_one_of(flag, {"--host", "--port", "--slot-save-path"}))
      return Status::InvalidArgument("llama-server argument " + flag +
                                     " is kvsnap serve's own: the child listens on a private loopback port with a "
                                     "kvsnap-owned slot directory; set the address clients use with serve's "
                                     "{--listen HOST:PORT}");
    if (flag == "--api-prefix")
      return Status::InvalidArgument("llama-server argument --api-prefix moves its routes where kvsnap serve does not "
                                     "look for /health and /slots; serve the prefix in front of kvsnap instead");
    if (flag == "--no-slots")
      return Status::InvalidArgument("llama-server argument --no-slots: kvsnap serve saves and restores slots "
                                     "through the /slots endpoint it disables");
    if (is_one_of(flag, {"-fa", "--flash-attn"})) {
      const char* word = flash_attn_word(value);
      if (!word)
        return Status::InvalidArgument("llama-server argument " + flag + " '" + value +
                                       "' must be on, off or auto (or enabled, true, 1; disabled, false, 0; -1)");
      a.flash_attn = word;
      config.fa = false;
    } else if (is_one_of(flag, {"-m", "--model"})) {
      a.model = value;
      config.model = false;
    } else if (is_one_of(flag, {"-c", "--ctx-size"})) {
      KV_ASSIGN_OR_RETURN(a.ctx_size, to_int(flag, value));
      config.ctx = false;
    } else if (is_one_of(flag, {"-np", "--parallel"})) {
      KV_ASSIGN_OR_RETURN(a.parallel, to_int(flag, value));
      if (a.parallel == 0) return Status::InvalidArgument("llama-server argument " + flag + " 0: llama-server refuses it");
      config.np = false;
    } else if (is_one_of(flag, {"-ctk", "--cache-type-k", "-ctv", "--cache-type-v"})) {
      KV_RETURN_IF_ERROR(check_cache_type(value, "llama-server argument " + flag));
      const bool k = is_one_of(flag, {"-ctk", "--cache-type-k"});
      (k ? a.ctk : a.ctv) = value;
      (k ? config.ctk : config.ctv) = false;
    } else if (is_one_of(flag, {"-hf", "-hfr", "--hf-repo"})) {
      config.hf = value;
    } else if (is_one_of(flag, {"-dr", "--docker-repo"})) {
      config.dr = value;
    } else if (is_one_of(flag, {"-mu", "--model-url"})) {
      config.mu = value;
    } else if (const ModelPreset* p = flag.rfind("--", 0) == 0 ? model_preset(flag.substr(2)) : nullptr) {
      config.hf = p->name;
      a.embeddings = a.embeddings || p->embeddings;
      if (p->ctx >= 0) a.ctx_size = p->ctx, config.ctx = false;
      if (p->parallel >= 0) a.parallel = p->parallel, config.np = false;
    } else if (is_one_of(flag, {"--embedding", "--embeddings", "--rerank", "--reranking"})) {
      a.embeddings = true;
    } else if (is_one_of(flag, {"--cache-idle-slots", "--no-cache-idle-slots"})) {
      a.cache_idle_slots = flag == "--cache-idle-slots";
      a.cache_idle_slots_from = "ARGS " + flag;
    } else if (is_one_of(flag, {"-cram", "--cache-ram"})) {
      a.cache_ram = value;
      a.cache_ram_from = "ARGS " + flag + " " + value;
    } else if (flag == "--sleep-idle-seconds") {
      args_sleep_idle = value;  // the last one counts, as in llama-server
    } else if (flag == "--api-key") {
      add_key_list(value, a.api_keys);
    } else if (flag == "--api-key-file") {
      KV_RETURN_IF_ERROR(add_key_file(value, "--api-key-file", env, a.api_keys));
    }
    if (cache_setting(flag)) a.cache_settings.push_back({flag, value, "ARGS"});
    // any other flag goes to the child untouched
  }
  if (!config.hf.empty() || !config.dr.empty() || !config.mu.empty()) a.model.clear(), config.model = false;
  // What a config file alone set goes on the child's command line too: the child reads the file
  // again at each restart, and an edit would change its caches under kvsnap's conversions.
  auto pin = [&](bool from_config, const char* flag, const std::string& value) {
    if (from_config) a.config_pins.insert(a.config_pins.end(), {flag, value});
  };
  pin(config.model, "-m", a.model);
  pin(config.ctx, "-c", std::to_string(a.ctx_size));
  pin(config.np, "-np", std::to_string(a.parallel));
  pin(config.ctk, "-ctk", a.ctk);
  pin(config.ctv, "-ctv", a.ctv);
  pin(config.fa, "-fa", a.flash_attn);
  const bool slots_flag = std::any_of(items.begin(), items.end(), [](const ArgItem& it) { return it.flag == "--slots"; });
  const bool env_sets_slots = env.getenv("LLAMA_ARG_NO_ENDPOINT_SLOTS") || env.getenv("LLAMA_ARG_ENDPOINT_SLOTS");
  if (std::string var = slots_off_by(env); !var.empty() && !slots_flag)
    return Status::InvalidArgument("environment variable " + var + " turns llama-server's /slots endpoint off, "
                                   "through which kvsnap serve saves and restores slots: unset it (or add --slots)");
  if (config.slots == false && !env_sets_slots && !slots_flag)
    return Status::InvalidArgument(config.slots_from + " turns the /slots endpoint off, through which kvsnap serve "
                                   "saves and restores slots: remove it (or add --slots)");
  if (!config.api_prefix.empty() && !env.getenv("LLAMA_ARG_API_PREFIX"))
    return Status::InvalidArgument(config.api_prefix_from + " moves llama-server's routes where kvsnap serve does not "
                                   "look for /health and /slots: remove it");
  // A sleeping llama-server (3.22.1: server-context.cpp handle_sleeping_state) frees its model and
  // context, every slot's cache with them, and says nothing to its clients. Measured through kvsnap
  // serve with --sleep-idle-seconds 2: a conversation's turn after the sleep evaluated its whole
  // prompt (108 of 108 tokens) though its snapshot was in the store, serve counting the slot as
  // still holding it. -1 (off) is llama-server's default.
  const std::string sleep_idle = args_sleep_idle ? *args_sleep_idle : config.sleep_idle;
  if (!sleep_idle.empty() && stoi_like(sleep_idle) != std::optional<int>(-1))  // as llama-server reads it
    return Status::InvalidArgument(
        (args_sleep_idle ? "llama-server argument --sleep-idle-seconds " + sleep_idle : config.sleep_idle_from) +
        ": a sleeping llama-server drops every slot's cache without a word, which kvsnap serve would go on counting "
        "as held (the next turn would evaluate its whole prompt, not restore it); leave it out: kvsnap serve keeps "
        "the sessions in its store, so stopping it (SIGTERM) frees the memory and a restart resumes them");
  if (!a.api_keys.empty()) a.api_key = a.api_keys.front();
  return a;
}

Result<LlamaArgs> with_cache(const LlamaArgs& a, const std::string& ctk, const std::string& ctv,
                             const std::string& flash_attn, int ctx_size, const ArgsEnvironment& env) {
  KV_ASSIGN_OR_RETURN(auto items, split_args(a.argv));
  std::vector<std::string> argv = {a.argv[0]};
  for (const ArgItem& it : items) {
    const bool replaced = is_one_of(it.flag, {"-ctk", "--cache-type-k", "-ctv", "--cache-type-v"}) ||
                          (!flash_attn.empty() && is_one_of(it.flag, {"-fa", "--flash-attn"})) ||
                          (ctx_size > 0 && is_one_of(it.flag, {"-c", "--ctx-size"}));
    if (!replaced) argv.insert(argv.end(), a.argv.begin() + long(it.first), a.argv.begin() + long(it.last) + 1);
  }
  argv.insert(argv.end(), {"-ctk", ctk, "-ctv", ctv});
  if (!flash_attn.empty()) argv.insert(argv.end(), {"-fa", flash_attn});
  if (ctx_size > 0) argv.insert(argv.end(), {"-c", std::to_string(ctx_size)});
  return parse_llama_args(argv, env);
}

std::string cache_settings_tag(const LlamaArgs& a) {
  if (a.cache_settings.empty()) return "";
  std::string text;
  for (const LlamaArgs::Setting& s : a.cache_settings) text += s.flag + "=" + s.value + "\n";
  const auto d = sha256_of(std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size()));
  return to_hex(d).substr(0, 16);
}

bool ram_cache_off(const LlamaArgs& a) {
  const auto n = stoi_like(a.cache_ram);  // std::stoi, as llama-server reads it
  return n && *n == 0;
}

std::vector<std::string> child_argv(const LlamaArgs& a, int port, const std::string& slot_dir) {
  std::vector<std::string> v = a.argv;
  v.insert(v.end(), a.config_pins.begin(), a.config_pins.end());
  const std::string dir = slot_dir.empty() || slot_dir.back() == '/' ? slot_dir : slot_dir + "/";
  v.insert(v.end(), {"--host", "127.0.0.1", "--port", std::to_string(port), "--slot-save-path", dir});
  return v;
}

}  // namespace kvsnap
