// serve/adapters.h: the LoRA scales a completion runs with, read as llama-server 3.22.1 reads them,
// and what serve does with a request before it is forwarded.
#include "serve/adapters.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <thread>

#include "http_serving.h"

namespace kvsnap {
namespace {

using Scales = std::vector<float>;

TEST(ServeAdapters, TheChildsAdaptersAreReadFromItsAnswer) {
  auto a = parse_lora_adapters_reply(
      R"([{"id": 0, "path": "a.gguf", "scale": 1.0, "task_name": "", "prompt_prefix": ""},
          {"id": 1, "path": "b.gguf", "scale": 0.30000001192092896}])");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->known);
  EXPECT_FALSE(a->activated);
  EXPECT_EQ(a->loaded, (Scales{1.0f, 0.3f}));
  auto none = parse_lora_adapters_reply("[]");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->loaded.empty());
  auto alora = parse_lora_adapters_reply(R"([{"id": 0, "scale": 1, "alora_invocation_tokens": [5, 6]}])");
  ASSERT_TRUE(alora.ok());
  EXPECT_TRUE(alora->activated);
  // construct_lora_list gives scales by position: an id that is not its position, no scale, no array
  for (const char* bad : {R"([{"id": 1, "scale": 1}])", R"([{"id": 0}])", R"({"id": 0})", R"([1])", "", "[{"})
    EXPECT_FALSE(parse_lora_adapters_reply(bad).ok()) << bad;
}

// parse_lora_request + construct_lora_list: the last entry of an id wins, ids not loaded are ignored,
// loaded adapters not named run at 0, json_value's defaults for what is not a number.
TEST(ServeAdapters, ARequestsScalesAreReadAsLlamaServerReadsThem) {
  const Scales loaded{1.0f, 0.5f};
  auto read = [&](const char* lora) { return scales_as_read(nlohmann::json::parse(lora), loaded); };
  EXPECT_EQ(read(R"([{"id": 0, "scale": 0.25}])"), (Scales{0.25f, 0.0f}));
  EXPECT_EQ(read(R"([{"id": 1, "scale": 2}, {"id": 1, "scale": 3}])"), (Scales{0.0f, 3.0f}));
  EXPECT_EQ(read(R"([{"id": 7, "scale": 2}, {"id": -1, "scale": 2}])"), (Scales{0.0f, 0.0f}));
  EXPECT_EQ(read(R"([{"id": 0.9, "scale": true}, {"id": 1, "scale": "x"}])"), (Scales{1.0f, 0.0f}));
  EXPECT_EQ(read(R"([{"id": "0", "scale": 1}, 5, null])"), (Scales{0.0f, 0.0f}));
  EXPECT_EQ(read(R"([{"id": 0, "scale": 1}, {"id": 1, "scale": 0.5}])"), loaded);
  EXPECT_EQ(read("[]"), loaded);  // names none
  EXPECT_EQ(read(R"({"id": 0, "scale": 0})"), loaded);  // no array: the child refuses it
  // with no adapter loaded, any "lora" runs with none
  EXPECT_EQ(scales_as_read(nlohmann::json::parse(R"([{"id": 0, "scale": 0.5}])"), {}), Scales{});
}

TEST(ServeAdapters, ASlotsScalesAreItsLastTasks) {
  const Scales loaded{1.0f};
  EXPECT_EQ(slot_scales(nlohmann::json::parse(R"({"params": {"lora": [{"id": 0, "scale": 0.5}]}})"), loaded), Scales{0.5f});
  EXPECT_EQ(slot_scales(nlohmann::json::parse(R"({"params": {"lora": []}})"), loaded), loaded);
  EXPECT_EQ(slot_scales(nlohmann::json::parse(R"({"params": {}})"), loaded), loaded);
  EXPECT_EQ(slot_scales(nlohmann::json::parse(R"({"id": 0})"), loaded), loaded);
  EXPECT_EQ(slot_scales(nlohmann::json::parse("[1]"), loaded), loaded);
}

Forward completion(const std::string& path, const std::string& body) {
  Forward f;
  f.method = "POST";
  f.path = path;
  f.body = body;
  return f;
}

ChildAdapters loaded_adapters(Scales s) {
  ChildAdapters a;
  a.loaded = std::move(s);
  return a;
}

// A request that names no scales, or the loaded ones, runs with the loaded ones; so does one whose
// "lora" never reaches its task or that the child refuses. The body is never changed.
TEST(ServeAdapters, ARequestWithTheLoadedScalesIsNoOwnScales) {
  ChildScales cs;
  cs.set(loaded_adapters({1.0f, 0.25f}), false);
  for (auto [path, body] : std::vector<std::pair<const char*, const char*>>{
           {"/completion", R"({"prompt": "Hi"})"},
           {"/completion", R"({"prompt": "Hi", "lora": []})"},
           {"/completion", R"({"prompt": "Hi", "lora": null})"},
           {"/completion", R"({"prompt": "Hi", "lora": [{"id": 0, "scale": 1}, {"id": 1, "scale": 0.25}]})"},
           {"/completion", R"({"prompt": "Hi", "lora": "x"})"},
           {"/completion", R"(["Hi"])"},
           {"/completion", R"({"prompt": )"},
           {"/v1/messages", R"({"messages": [], "lora": [{"id": 0, "scale": 0}]})"},
       }) {
    Forward f = completion(path, body);
    cs.settle(f);
    EXPECT_FALSE(f.own_scales) << body;
    EXPECT_TRUE(f.refused.empty()) << body;
    EXPECT_FALSE(f.body_changed) << body;
    EXPECT_EQ(f.body, body);
  }
  // no adapter loaded: "lora" changes nothing
  ChildScales none;
  none.set({}, false);
  Forward f = completion("/completion", R"({"prompt": "Hi", "lora": [{"id": 0, "scale": 0.5}]})");
  none.settle(f);
  EXPECT_FALSE(f.body_changed || f.own_scales || !f.refused.empty());
}

TEST(ServeAdapters, ARequestsOwnScalesAreSeenOrRefused) {
  const char* own = R"({"prompt": "Hi", "lora": [{"id": 0, "scale": 0.5}]})";
  ChildScales kept;
  kept.set(loaded_adapters({1.0f}), true);
  Forward f = completion("/completion", own);
  kept.settle(f);
  EXPECT_TRUE(f.refused.empty());
  EXPECT_TRUE(f.own_scales);
  EXPECT_FALSE(f.body_changed);
  // refused when the child keeps a RAM prompt cache, its adapters are unknown (any scales named) or
  // one is activated
  ChildAdapters unknown;
  unknown.known = false;
  unknown.why_unknown = "GET /lora-adapters answered HTTP 404";
  ChildAdapters activated = loaded_adapters({1.0f});
  activated.activated = true;
  ChildAdapters embeddings = loaded_adapters({1.0f});
  embeddings.ungated_tasks = true;
  struct Case {
    ChildAdapters a;
    bool ram_off;
    const char* body;
    const char* says;
  };
  std::string deep = R"({"prompt": "Hi", "x": )" + std::string(600, '[') + std::string(600, ']') +
                     R"(, "lora": [{"id": 0, "scale": 0.5}]})";
  for (const Case& c : {Case{loaded_adapters({1.0f}), false, own, "--cache-ram 0"},
                        Case{unknown, true, R"({"messages": [], "lora": [{"id": 0, "scale": 1}]})", "HTTP 404"},
                        Case{activated, true, own, "activated"},
                        Case{embeddings, true, own, "--embeddings"},
                        Case{loaded_adapters({1.0f}), true, R"({"lora": [{"id": 0, "scale": 1e39}]})", "finite"},
                        Case{loaded_adapters({1.0f}), true, deep.c_str(), "nested deeper than 512"}}) {
    ChildScales cs;
    cs.set(c.a, c.ram_off);
    Forward g = completion("/v1/chat/completions", c.body);
    cs.settle(g);
    EXPECT_FALSE(g.own_scales);
    EXPECT_EQ(g.refused_status, 400);
    EXPECT_NE(g.refused.find(c.says), std::string::npos) << g.refused;
    EXPECT_TRUE(nlohmann::json::parse(g.refused).at("error").is_object());
  }
  // a body kvsnap cannot read is forwarded when no adapter is loaded (its "lora" changes nothing), also
  // while the child restarts
  ChildScales none;
  none.set({}, false);
  none.restarting(false, false);
  for (const std::string& body : {deep, std::string(own)}) {
    Forward g = completion("/completion", body);
    none.settle(g);
    EXPECT_TRUE(g.refused.empty()) << g.refused;
    EXPECT_FALSE(g.own_scales);
  }
  EXPECT_FALSE(none.admits_own_scales());
  EXPECT_TRUE(kept.admits_own_scales());
  // a review's finding: a prompt kvsnap does not look up (mixed tokens and text, which llama-server
  // takes) was refused with adapters loaded; its "lora" is read from the body
  Forward mixed = completion("/completion", R"({"prompt": [12, " world"]})");
  kept.settle(mixed);
  EXPECT_TRUE(mixed.refused.empty()) << mixed.refused;
  EXPECT_FALSE(mixed.own_scales);
  Forward mixed_own = completion("/completion", R"({"prompt": [12, " world"], "lora": [{"id": 0, "scale": 0.5}]})");
  kept.settle(mixed_own);
  EXPECT_TRUE(mixed_own.own_scales);
  // while the child restarts: 503 (try again), the loaded scales kept
  kept.restarting(true, true);
  EXPECT_FALSE(kept.admits_own_scales());
  EXPECT_EQ(kept.adapters().loaded, Scales{1.0f});
  Forward r = completion("/completion", own);
  kept.settle(r);
  EXPECT_EQ(r.refused_status, 503);
  EXPECT_NE(r.refused.find("restarting"), std::string::npos) << r.refused;
  Forward plain = completion("/completion", R"({"prompt": "Hi"})");
  kept.settle(plain);
  EXPECT_TRUE(plain.refused.empty());
}

// A review's finding: one failed read of the child's adapters at its start refused a request's own
// scales for the child's whole life. Unknown (not restarting), they are read again, at most every
// interval; known, or while the child restarts, never.
TEST(ServeAdapters, UnreadableAdaptersAreReadAgainNowAndThen) {
  ChildScales cs;
  cs.set(loaded_adapters({1.0f}), true);
  EXPECT_FALSE(cs.read_again(0));
  ChildAdapters unknown;
  unknown.known = false;
  cs.set(unknown, true);
  EXPECT_TRUE(cs.read_again(3600));
  EXPECT_FALSE(cs.read_again(3600)) << "again within the interval";
  EXPECT_TRUE(cs.read_again(0));
  cs.restarting(true, true);
  EXPECT_FALSE(cs.read_again(0)) << "restarting: read once it is up";
}

TEST(ServeAdapters, TheAnthropicRouteAndFormDataTakeTheLoadedScalesBlindly) {
  EXPECT_TRUE(takes_loaded_scales_blindly("/v1/messages"));
  EXPECT_TRUE(takes_loaded_scales_blindly("/v1/audio/transcriptions"));
  EXPECT_FALSE(takes_loaded_scales_blindly("/completion"));
  EXPECT_FALSE(takes_loaded_scales_blindly("/v1/chat/completions"));
}

// A child with four slots: 0 made under a request's own scales, 1 under the loaded ones, 2 under its
// own but busy, 3 of its own but empty; it records the slots erased.
struct ScalesChild {
  httplib::Server svr;
  std::thread thread;
  std::mutex mu;
  std::vector<int> erased;
  int port = serve();
  int serve() {
    svr.Get("/slots", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"([
        {"id": 0, "id_task": 5, "is_processing": false, "n_prompt_tokens": 9, "params": {"lora": [{"id": 0, "scale": 0.5}]}},
        {"id": 1, "id_task": 6, "is_processing": false, "n_prompt_tokens": 9, "params": {"lora": []}},
        {"id": 2, "id_task": 7, "is_processing": true, "n_prompt_tokens": 9, "params": {"lora": [{"id": 0, "scale": 0}]}},
        {"id": 3, "id_task": 8, "is_processing": false, "n_prompt_tokens": 0, "params": {"lora": [{"id": 0, "scale": 0}]}}
      ])", "application/json");
    });
    svr.Post(R"(/slots/(\d+))", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> l(mu);
      if (req.get_param_value("action") == "erase") erased.push_back(std::stoi(req.matches[1]));
      res.set_content(R"({"id_slot": 0, "n_erased": 9})", "application/json");
    });
    return test::serve_on_free_port(svr, thread);
  }
  ~ScalesChild() { test::stop_serving(svr, thread); }
};

// Before a request with the loaded scales runs: its slot, or every idle one, made under other scales is
// erased (llama-server would go on from it); an empty one, or one of the loaded scales, is left, and a
// busy one unless the request holds the slot's permit.
// Before one with its own: a slot kvsnap restored into since its last task (its scales are that task's).
TEST(ServeAdapters, TheSlotsACompletionWouldContinueUnderOtherScalesAreErased) {
  ScalesChild child;
  ASSERT_GT(child.port, 0);
  LlamaServer srv({"http://127.0.0.1:" + std::to_string(child.port), "", 5});
  auto erase = [&](bool own, int slot, const std::vector<float>& loaded, std::function<bool(int, int64_t)> restored,
                   bool permit = false) {
    {
      std::lock_guard<std::mutex> l(child.mu);
      child.erased.clear();
    }
    std::vector<int> erased;
    EXPECT_TRUE(erase_slots_of_other_scales(srv, loaded, own, slot, permit, restored, erased).ok());
    std::lock_guard<std::mutex> l(child.mu);
    EXPECT_EQ(child.erased, erased);
    return erased;
  };
  auto none = [](int, int64_t) { return false; };
  using Ids = std::vector<int>;
  EXPECT_EQ(erase(false, -1, {1.0f}, none), Ids{0});
  EXPECT_EQ(erase(false, 0, {1.0f}, none), Ids{0});
  for (int slot : {1, 2, 3}) EXPECT_EQ(erase(false, slot, {1.0f}, none), Ids{}) << slot;
  // a review's finding: with the slot's permit, a busy slot is a task whose client hung up (not
  // cancelled yet): its cache is erased once it ends, or the request would go on from it
  EXPECT_EQ(erase(false, 2, {1.0f}, none, true), Ids{2});
  EXPECT_EQ(erase(false, -1, {1.0f}, none, true), (Ids{0, 2}));
  EXPECT_EQ(erase(false, -1, {0.5f}, none), Ids{}) << "loaded at 0.5: slot 0 ran with them, slot 1 named none";
  // own scales: only what kvsnap restored into since the slot's task (slot 1's task is 6)
  EXPECT_EQ(erase(true, -1, {1.0f}, none), Ids{});
  auto restored_1 = [](int slot, int64_t task) { return slot == 1 && task == 6; };
  EXPECT_EQ(erase(true, -1, {1.0f}, restored_1), Ids{1});
  EXPECT_EQ(erase(true, 0, {1.0f}, restored_1), Ids{});
}

}  // namespace
}  // namespace kvsnap
