// Server profiles kept in the store (<store>/servers.json): what kvsnap must
// know about a llama-server that the server does not report itself: its cache
// types, flash attention, the directory behind --slot-save-path, its model and
// API key file. `kvsnap server add/ls/rm`; `--server NAME` uses one.
//
// The file is small JSON, rewritten atomically; the API key itself is never
// stored, only the path of a file that holds it (chmod 600).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/io.h"
#include "base/status.h"

namespace kvsnap {

struct ServerProfile {
  std::string name;
  std::string url;
  std::string slot_dir;
  std::string ctk, ctv;       // empty: unknown (detected from a file the server saves)
  std::string flash_attn;     // "on" | "off" | "" (unknown)
  std::string model;          // GGUF path, optional
  std::string api_key_file;   // optional
};

// Parses servers.json's text (type-checked: errors name `path`, the key path
// and the type found).
Result<std::vector<ServerProfile>> parse_server_profiles(std::string_view text, const std::string& path);

class ServerProfiles {
 public:
  static Result<ServerProfiles> load(Io& io, const std::string& store_root);
  const std::vector<ServerProfile>& all() const { return profiles_; }
  const ServerProfile* find(const std::string& name) const;
  // Adds or replaces (same name) and writes the file.
  Status put(Io& io, ServerProfile p);
  Status remove(Io& io, const std::string& name);  // kNotFound when absent

 private:
  Status save(Io& io) const;
  std::string path_;
  std::vector<ServerProfile> profiles_;
};

}  // namespace kvsnap
