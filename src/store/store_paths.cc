#include "store/store_paths.h"

#include <cstdlib>

namespace kvsnap {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
std::string strip_trailing_slashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}
}  // namespace

Result<StorePaths> resolve_store_paths(const std::string& explicit_dir) {
  std::string root = explicit_dir;
  if (root.empty()) root = env("KVSNAP_HOME");
  if (root.empty()) {
    std::string data = env("XDG_DATA_HOME");
    if (data.empty()) {
      std::string home = env("HOME");
      if (home.empty())
        return Status::InvalidArgument("no store directory: set KVSNAP_HOME or HOME, or pass --store DIR");
      data = home + "/.local/share";
    }
    root = data + "/kvsnap";
  }
  return StorePaths{strip_trailing_slashes(root)};
}

}  // namespace kvsnap
