#include "server/server_profiles.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace kvsnap {

using json = nlohmann::ordered_json;

namespace {

json to_json(const ServerProfile& p) {
  return {{"name", p.name}, {"url", p.url}, {"slot_dir", p.slot_dir}, {"ctk", p.ctk}, {"ctv", p.ctv},
          {"flash_attn", p.flash_attn}, {"model", p.model}, {"api_key_file", p.api_key_file}};
}

ServerProfile from_json(const json& j) {
  ServerProfile p;
  p.name = j.value("name", "");
  p.url = j.value("url", "");
  p.slot_dir = j.value("slot_dir", "");
  p.ctk = j.value("ctk", "");
  p.ctv = j.value("ctv", "");
  p.flash_attn = j.value("flash_attn", "");
  p.model = j.value("model", "");
  p.api_key_file = j.value("api_key_file", "");
  return p;
}

}  // namespace

Result<ServerProfiles> ServerProfiles::load(Io& io, const std::string& store_root) {
  ServerProfiles s;
  s.path_ = store_root + "/servers.json";
  KV_ASSIGN_OR_RETURN(bool there, io.exists(s.path_));
  if (!there) return s;
  KV_ASSIGN_OR_RETURN(auto bytes, read_all(io, s.path_, 16 << 20));
  json j = json::parse(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), nullptr, false);
  if (!j.is_object() || !j.contains("servers") || !j["servers"].is_array())
    return Status::Corruption(s.path_ + ": not a kvsnap server profile file");
  for (const json& p : j["servers"]) {
    if (!p.is_object()) return Status::Corruption(s.path_ + ": a server entry is not an object");
    s.profiles_.push_back(from_json(p));
  }
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
  const std::string text = j.dump(2) + "\n";
  KV_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::create(io, path_));
  KV_RETURN_IF_ERROR(w->append(text.data(), text.size()));
  return w->commit();
}

}  // namespace kvsnap
