#include "serve/llama_args.h"

#include <charconv>

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

}  // namespace

Result<LlamaArgs> parse_llama_args(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0].empty())
    return Status::InvalidArgument("no llama-server command after '--' (kvsnap serve -- llama-server -m MODEL ...)");
  LlamaArgs a;
  a.argv = argv;
  bool have_key = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string flag = argv[i], value;
    bool inline_value = false;
    if (flag.rfind("--", 0) == 0) {
      if (auto eq = flag.find('='); eq != std::string::npos) {
        value = flag.substr(eq + 1);
        flag.resize(eq);
        inline_value = true;
      }
    }
    if (is_one_of(flag, {"--host", "--port", "--slot-save-path"}))
      return Status::InvalidArgument("llama-server argument " + flag +
                                     " is kvsnap serve's own: the child listens on a private loopback port with a "
                                     "kvsnap-owned slot directory; set the address clients use with serve's "
                                     "{--listen HOST:PORT}");
    if (flag == "--no-slots")
      return Status::InvalidArgument("llama-server argument --no-slots: kvsnap serve saves and restores slots "
                                     "through the /slots endpoint it disables");
    // -fa takes an optional value (on|off|auto); a bare -fa (older servers) means on.
    if (is_one_of(flag, {"-fa", "--flash-attn"})) {
      if (!inline_value) {
        if (i + 1 < argv.size() && is_one_of(argv[i + 1], {"on", "off", "auto"})) value = argv[++i];
        else value = "on";
      }
      if (!is_one_of(value, {"on", "off", "auto"}))
        return Status::InvalidArgument("llama-server argument " + flag + " '" + value + "' must be on, off or auto");
      a.flash_attn = value;
      continue;
    }
    const bool known = is_one_of(flag, {"-m", "--model", "-c", "--ctx-size", "-np", "--parallel", "-ctk",
                                        "--cache-type-k", "-ctv", "--cache-type-v", "--api-key"});
    if (!known) continue;  // any other flag goes to the child untouched
    if (!inline_value) {
      if (i + 1 >= argv.size()) return Status::InvalidArgument("llama-server argument " + flag + " needs a value");
      value = argv[++i];
    }
    if (is_one_of(flag, {"-m", "--model"})) a.model = value;
    else if (is_one_of(flag, {"-c", "--ctx-size"})) { KV_ASSIGN_OR_RETURN(a.ctx_size, to_int(flag, value)); }
    else if (is_one_of(flag, {"-np", "--parallel"})) { KV_ASSIGN_OR_RETURN(a.parallel, to_int(flag, value)); }
    else if (is_one_of(flag, {"-ctk", "--cache-type-k"})) a.ctk = value;
    else if (is_one_of(flag, {"-ctv", "--cache-type-v"})) a.ctv = value;
    else if (!have_key) {  // --api-key K1[,K2...]: kvsnap's own calls send the first
      a.api_key = value.substr(0, value.find(','));
      have_key = true;
    }
  }
  return a;
}

std::vector<std::string> child_argv(const LlamaArgs& a, int port, const std::string& slot_dir) {
  std::vector<std::string> v = a.argv;
  const std::string dir = slot_dir.empty() || slot_dir.back() == '/' ? slot_dir : slot_dir + "/";
  v.insert(v.end(), {"--host", "127.0.0.1", "--port", std::to_string(port), "--slot-save-path", dir});
  return v;
}

}  // namespace kvsnap
