#include "serve/lora_scales.h"

#include <cmath>
#include <map>

#include "serve/requests.h"

namespace kvsnap {

namespace {

// A scale as llama-server's json_value<float> reads it: a number or a boolean converted, anything
// else (a string, an array, null) its default 0.
template <class Json>
float scale_as_read(const Json& entry) {
  if (!entry.is_object()) return 0.0f;
  auto it = entry.find("scale");
  if (it == entry.end()) return 0.0f;
  const Json& v = *it;
  if (v.is_boolean()) return v.template get<bool>() ? 1.0f : 0.0f;
  if (v.is_number_unsigned()) return float(v.template get<uint64_t>());
  if (v.is_number_integer()) return float(v.template get<int64_t>());
  if (v.is_number_float()) return float(v.template get<double>());
  return 0.0f;
}

template <class Json>
int id_as_read(const Json& entry) {
  if (!entry.is_object()) return -1;
  auto it = entry.find("id");
  return it == entry.end() ? -1 : int_as_read(*it, -1);
}

// parse_lora_request (the last entry of an id wins) and construct_lora_list (the loaded ids only,
// those not named at 0), or `loaded` for no array or an empty one (the task takes the loaded scales).
template <class Json>
std::vector<float> scales_of(const Json& lora, const std::vector<float>& loaded) {
  if (!lora.is_array() || lora.empty()) return loaded;
  std::map<int, float> named;
  for (const Json& entry : lora) named[id_as_read(entry)] = scale_as_read(entry);
  std::vector<float> out(loaded.size(), 0.0f);
  for (size_t i = 0; i < out.size(); ++i)
    if (auto it = named.find(int(i)); it != named.end()) out[i] = it->second;
  return out;
}

}  // namespace

Result<ChildAdapters> parse_lora_adapters_reply(std::string_view body) {
  const auto j = parse_bounded<nlohmann::json>(body);
  if (!j.is_array()) return Status::Mismatch("GET /lora-adapters answered no JSON array");
  ChildAdapters out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    const std::string where = "GET /lora-adapters [" + std::to_string(i) + "]";
    if (!e.is_object()) return Status::Mismatch(where + " is no object");
    // construct_lora_list gives a request's scales by position: the ids must be the positions.
    auto id = e.find("id");
    if (id == e.end() || !id->is_number_integer() || id->get<int64_t>() != int64_t(i))
      return Status::Mismatch(where + " has no \"id\" " + std::to_string(i));
    auto scale = e.find("scale");
    if (scale == e.end() || !scale->is_number()) return Status::Mismatch(where + " has no numeric \"scale\"");
    out.loaded.push_back(float(scale->get<double>()));
    if (auto a = e.find("alora_invocation_tokens"); a != e.end() && !(a->is_array() && a->empty())) out.activated = true;
  }
  return out;
}

std::vector<float> scales_as_read(const nlohmann::json& lora, const std::vector<float>& loaded) {
  return scales_of(lora, loaded);
}

std::vector<float> scales_as_read(const nlohmann::ordered_json& lora, const std::vector<float>& loaded) {
  return scales_of(lora, loaded);
}

std::vector<float> slot_scales(const nlohmann::json& slot, const std::vector<float>& loaded) {
  if (!slot.is_object()) return loaded;
  auto params = slot.find("params");
  if (params == slot.end() || !params->is_object()) return loaded;
  auto lora = params->find("lora");
  return lora == params->end() ? loaded : scales_of(*lora, loaded);
}

std::string scales_refusal(const ChildAdapters& a, bool ram_cache_off, const std::vector<float>& scales) {
  if (!a.known)
    return a.restarting ? "llama-server is restarting; try again once it is up"
                        : "kvsnap serve could not read the adapters llama-server loaded (" + a.why_unknown +
                              "), so it cannot keep a cache made under a request's own scales apart from the others";
  for (float s : scales)
    if (!std::isfinite(s)) return "a scale is no finite float (llama-server reads each as a float)";
  if (a.activated)
    return "llama-server keeps a slot's cache across a change to an activated LoRA (alora), so kvsnap serve cannot "
           "tell which scales made it";
  if (a.ungated_tasks)
    return "the child runs embedding tasks (--embeddings), which kvsnap serve's slot gate does not hold: one may "
           "take a slot made under a request's own scales";
  if (!ram_cache_off)
    return "llama-server's RAM prompt cache (--cache-ram, on by default) hands a cache made under one request's "
           "scales to a later request of other scales; start the child with --cache-ram 0";
  return "";
}

}  // namespace kvsnap
