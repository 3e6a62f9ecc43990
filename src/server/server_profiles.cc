#include "server/server_profiles.h"

#include <algorithm>

#include "base/json.h"
#include "base/json_access.h"

namespace kvsnap {

using json = nlohmann::ordered_json;

namespace {

json to_json(const ServerProfile& p) {
  return {{"name", p.name}, {"url", p.url}, {"slot_dir", p.slot_dir}, {"ctk", p.ctk}, {"ctv", p.ctv},
          {"flash_attn", p.flash_attn}, {"model", p.model}, {"api_key_file", p.api_key_file}};
}

// One entry of servers.json: every field is an optional string.
Result<ServerProfile> from_json(const JsonRef& j) {
  ServerProfile p;
  KV_ASSIGN_OR_RETURN(p.name, j.string_or("name", ""));
  KV_ASSIGN_OR_RETURN(p.url, j.string_or("url", ""));
  KV_ASSIGN_OR_RETURN(p.slot_dir, j.string_or("slot_dir", ""));
  KV_ASSIGN_OR_RETURN(p.ctk, j.string_or("ctk", ""));
  KV_ASSIGN_OR_RETURN(p.ctv, j.string_or("ctv", ""));
  KV_ASSIGN_OR_RETURN(p.flash_attn, j.string_or("flash_attn", ""));
  KV_ASSIGN_OR_RETURN(p.model, j.string_or("model", ""));
  KV_ASSIGN_OR_RETURN(p.api_key_file, j.string_or("api_key_file", ""));
  return p;
}

}  // namespace

Result<std::vector<ServerProfile>> parse_server_profiles(std::string_view text, const std::string& path) {
  auto parsed = parse_json(text, path);
  if (!parsed.ok() || !parsed->is_object()) return Status::Corruption(path + ": not a kvsnap server profile file");
  const JsonRef root(*parsed, path);
  KV_ASSIGN_OR_RETURN(JsonRef servers, root.at("servers"));
  return servers.elements_as<ServerProfile>(from_json);
}

Result<ServerProfiles> ServerProfiles::load(Io& io, const std::string& store_root) {
  ServerProfiles s;
  s.path_ = store_root + "/servers.json";
  KV_ASSIGN_OR_RETURN(bool there, io.exists(s.path_));
  if (!there) return s;
  KV_ASSIGN_OR_RETURN(auto bytes, read_all(io, s.path_, 16 << 20));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  KV_ASSIGN_OR_RETURN(s.profiles_, parse_server_profiles(text, s.path_));
  return s;
}

const ServerProfile* ServerProfiles::find(const std::string& name) const {
  for (const auto& p : profiles_)
    if (p.name == name) return &p;
  return nullptr;
}

Status ServerProfiles::put(Io& io, ServerProfile p) {
  auto it = std::find_if(profiles_.begin(), profiles_.end(), [&](const ServerProfile& x) { return x.name == p.name; });
  if (it != profiles_.end()) *it = std::move(p);
  else profiles_.push_back(std::move(p));
  return save(io);
}

Status ServerProfiles::remove(Io& io, const std::string& name) {
  auto it = std::find_if(profiles_.begin(), profiles_.end(), [&](const ServerProfile& x) { return x.name == name; });
  if (it == profiles_.end()) return Status::NotFound("no server profile named '" + name + "' (kvsnap server ls)");
  profiles_.erase(it);
  return save(io);
}

Status ServerProfiles::save(Io& io) const {
  json j = {{"version", 1}, {"servers", json::array()}};
  for (const auto& p : profiles_) j["servers"].push_back(to_json(p));
  const std::string text = json_text(j, 2) + "\n";
  KV_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::create(io, path_));
  KV_RETURN_IF_ERROR(w->append(text.data(), text.size()));
  return w->commit();
}

}  // namespace kvsnap
