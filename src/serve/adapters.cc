#include "serve/adapters.h"

#include "base/json_access.h"
#include "serve/persist.h"
#include "serve/requests.h"

namespace kvsnap {

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
