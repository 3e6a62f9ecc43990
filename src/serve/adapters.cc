#include "serve/adapters.h"

#include <cmath>
#include <map>

#include "base/json_access.h"
#include "serve/persist.h"
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

ChildAdapters read_child_adapters(LlamaServer& srv, bool loads_adapters) {
  ChildAdapters out;
  auto r = srv.request("GET", "/lora-adapters", "", "listing the child's LoRA adapters");
  std::string why;
  if (r.ok() && r->status == 200) {
    auto a = parse_lora_adapters_reply(r->body);
    if (a.ok()) return *a;
    why = a.status().message();
  } else {
    why = r.ok() ? "GET /lora-adapters answered HTTP " + std::to_string(r->status) : r.status().ToString();
  }
  if (!loads_adapters) return out;  // none on its command line: nothing to know
  out.known = false;
  out.why_unknown = why;
  return out;
}

void ChildScales::set(const ChildAdapters& a, bool ram_cache_off) {
  std::lock_guard<std::mutex> l(mu_);
  adapters_ = a;
  ram_cache_off_ = ram_cache_off;
}

void ChildScales::restarting(bool loads_adapters, bool ram_cache_off) {
  std::lock_guard<std::mutex> l(mu_);
  ram_cache_off_ = ram_cache_off;
  if (!loads_adapters && adapters_.loaded.empty()) return;  // none before, none to come
  adapters_.known = false;
  adapters_.restarting = true;
}

bool ChildScales::admits_own_scales() const {
  std::lock_guard<std::mutex> l(mu_);
  return !adapters_.loaded.empty() && scales_refusal(adapters_, ram_cache_off_, {}).empty();
}

bool ChildScales::read_again(double every_s) {
  std::lock_guard<std::mutex> l(mu_);
  if (adapters_.known || adapters_.restarting) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_read_again_ < std::chrono::duration<double>(every_s)) return false;
  last_read_again_ = now;
  return true;
}

ChildAdapters ChildScales::adapters() const {
  std::lock_guard<std::mutex> l(mu_);
  return adapters_;
}

void ChildScales::settle(Forward& f) const {
  if (takes_loaded_scales_blindly(f.path)) return;
  const Result<CompletionRequest>& req = completion_request(f);
  std::lock_guard<std::mutex> l(mu_);
  auto refuse = [&f](const std::string& why, int status) {
    nlohmann::json e = {{"error",
                         {{"code", status},
                          {"message", "kvsnap serve: " + why},
                          {"type", status == 503 ? "unavailable_error" : "invalid_request_error"}}}};
    f.refused = json_text(e);
    f.refused_status = status;
  };
  const bool adapters = !adapters_.loaded.empty() || !adapters_.known;
  // "lora" as the child reads it: the parsed request's, or (a prompt kvsnap does not look up, such as
  // a mixed one) the body's own.
  std::optional<nlohmann::ordered_json> lora;
  if (req.ok()) {
    if (!req->object) return;  // the child refuses it
    lora = req->lora;
  } else if (adapters) {
    const auto j = parse_bounded<nlohmann::ordered_json>(f.body);
    if (j.is_discarded()) {
      // JSON nested deeper than kvsnap reads, which llama-server reads: its "lora" would go unseen.
      if (nlohmann::ordered_json::accept(f.body))
        refuse("the request's JSON is nested deeper than " + std::to_string(kMaxServeJsonDepth) +
                   " levels, so which LoRA scales it runs with is unknown",
               adapters_.restarting ? 503 : 400);
      return;
    }
    if (auto it = j.find("lora"); j.is_object() && it != j.end() && !it->is_null()) lora = *it;
  }
  if (!lora || !lora->is_array() || lora->empty()) return;
  const std::vector<float> scales = scales_as_read(*lora, adapters_.loaded);
  // Unknown adapters: any scales named may be others than the loaded ones.
  if (adapters_.known && scales == adapters_.loaded) return;
  if (const std::string why = scales_refusal(adapters_, ram_cache_off_, scales); !why.empty()) {
    refuse("a request with LoRA scales of its own (\"lora\") is refused: " + why, adapters_.restarting ? 503 : 400);
    return;
  }
  f.own_scales = true;
}

bool takes_loaded_scales_blindly(const std::string& path) {
  return !route_takes_id_slot(path) || is_form_data_route(path);
}

Status erase_slots_of_other_scales(LlamaServer& srv, const std::vector<float>& loaded, bool own_scales, int slot,
                                   bool permit, const std::function<bool(int, int64_t)>& restored_since,
                                   std::vector<int>& erased) {
  KV_ASSIGN_OR_RETURN(auto slots, srv.slots());
  for (const SlotState& s : slots) {
    if (slot >= 0 && s.id != slot) continue;
    // Busy under a permit: a task whose client hung up, not cancelled yet (llama-server polls the
    // connection each second); the erase waits for it to end.
    if ((s.is_processing && !permit) || s.raw.value("n_prompt_tokens", int64_t(1)) <= 0) continue;
    const bool other = own_scales ? restored_since(s.id, s.raw.value("id_task", int64_t(-1)))
                                  : slot_scales(s.raw, loaded) != loaded;
    if (!other) continue;
    KV_RETURN_IF_ERROR(srv.erase_slot(s.id));
    erased.push_back(s.id);
  }
  return Status::OK();
}

}  // namespace kvsnap
