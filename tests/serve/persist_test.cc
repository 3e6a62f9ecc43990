// serve/persist.h: a saved slot is tagged with the namespace of the request whose prompt it holds, and a
// completion can wait for the saves queued before it.
#include "serve/persist.h"
#include "serve/prefix.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <thread>
#include <random>

#include "format/state_prefix.h"
#include "http_serving.h"
#include "loopback.h"
#include "store/store_location.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

TEST(ServePersist, OwnerIsTheRequestWhosePromptTheSlotHolds) {
  // B asked first and queued its save; A then used the same slot. What the slot holds is A's: the save
  // B's completion asked for must not put A's conversation in B's namespace.
  std::deque<PromptOwner> recent = {{"key-b", {1, 9, 9}}, {"key-a", {1, 2, 3, 4}}};
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 3, 4, 50, 51}), "key-a");
  EXPECT_EQ(owner_of_tokens(recent, {1, 9, 9, 7}), "key-b");
  // The longest prompt that is a prefix wins, whoever came last.
  recent.push_back({"key-c", {1, 2}});
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 3, 4, 5}), "key-a");
  // Equal prompts of one namespace: its.
  recent.push_back({"key-a", {1, 2, 3, 4}});
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 3, 4, 5}), "key-a");
  // Nobody's prompt: no owner (a prompt longer than the slot, a different one, an empty one).
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 3}), "key-c");
  EXPECT_EQ(owner_of_tokens(recent, {7, 7, 7}), "");
  EXPECT_EQ(owner_of_tokens({{"key-e", {}}}, {1, 2}), "");
  EXPECT_EQ(owner_of_tokens({}, {1, 2}), "");
}

// A review's finding: ana and bob send the same prompt; ana's save runs after bob's completion was
// noted, and the latest on a tie (bob) got ana's conversation, sealed for bob. Equal prompts of two
// namespaces go to the one whose answer named the slot being saved, else to no one.
TEST(ServePersist, EqualPromptsOfTwoNamespacesGoToTheSlotsOwnExchangeOrNoOne) {
  const std::deque<PromptOwner> recent = {{"session-ana", {1, 2}}, {"session-bob", {1, 2}}};
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 7}), "");
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 7}, "session-ana"), "session-ana");
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 7}, "session-bob"), "session-bob");
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 7}, "session-eve"), "");
  EXPECT_EQ(slot_owner(recent, {1, 2, 7}, false, "unattributed"), "unattributed");
  // A longer prompt is no tie.
  const std::deque<PromptOwner> longer = {{"session-ana", {1, 2, 7}}, {"session-bob", {1, 2}}};
  EXPECT_EQ(owner_of_tokens(longer, {1, 2, 7, 9}, "session-bob"), "session-ana");
}

// A client that hangs up while the child evaluates its prompt leaves a part of it in the slot, and that
// part may begin with another namespace's shorter prompt: bob's "Hello" must not own the rest of ana's
// given-up prompt (with --tenant-per-namespace it would be sealed for bob and restored into bob's
// conversations). Such a slot has no owner; a completed prompt is whole in its slot, so its longer
// share with the slot (the shorter one's generation went that way) takes nothing from the shorter one.
TEST(ServePersist, AGivenUpPromptHeldInPartIsNoShorterPromptsConversation) {
  std::deque<PromptOwner> recent = {{"session-bob", {1, 15043}}, {"session-ana", {1, 15043, 3186, 29892, 590}, true}};
  EXPECT_EQ(owner_of_tokens(recent, {1, 15043, 3186}), "");
  EXPECT_EQ(owner_of_tokens(recent, {1, 15043, 3186, 29892, 590, 7}), "session-ana");
  EXPECT_EQ(owner_of_tokens(recent, {1, 15043, 7}), "session-bob");  // no more of ana's than bob's
  EXPECT_EQ(slot_owner(recent, {1, 15043, 3186}, false, "unattributed"), "unattributed");
  recent.back().may_be_partial = false;  // ana's completion ended: her prompt was evaluated whole
  EXPECT_EQ(owner_of_tokens(recent, {1, 15043, 3186}), "session-bob");
  // bob's own given-up prompt is still bob's.
  recent = {{"session-bob", {1, 15043}}, {"session-bob", {1, 15043, 3186, 29892}, true}};
  EXPECT_EQ(owner_of_tokens(recent, {1, 15043, 3186}), "session-bob");
}

// A review's finding: bob sent "Hello" (tokenized), then ana a prompt kvsnap does not tokenize (an
// array) that begins with it; the save ana's completion asked for found bob's prompt at the start of
// ana's conversation and filed it as bob's. Such a save files what it finds as unattributed.
TEST(ServePersist, AnUntokenizedExchangesSaveTakesNoOtherNamespacesPrompt) {
  const std::deque<PromptOwner> recent = {{"session-bob", {1, 15043}}};
  const std::vector<int32_t> anas = {1, 15043, 3186, 29892, 590, 7035};
  EXPECT_EQ(slot_owner(recent, anas, /*untokenized_job=*/true, "unattributed"), "unattributed");
  // A save of a tokenized exchange still files the slot by the prompt it begins with.
  EXPECT_EQ(slot_owner(recent, anas, false, ""), "session-bob");
  EXPECT_EQ(slot_owner(recent, {7, 7}, false, "unattributed"), "unattributed");
  EXPECT_EQ(slot_owner(recent, {7, 7}, false, ""), "");
}

// An untokenized exchange's own slot is its namespace's when it is certainly its own: named by its
// answer or pinned by serve, or (it ran alone: /v1/messages, "n": 2) a task newer than its admission,
// while every task the child runs passes the slot gate (a child that takes embedding tasks, which
// the gate does not hold, may have run one there) and none went on unguarded meanwhile (a review's
// findings). Else no one's.
TEST(ServePersist, AnUntokenizedExchangesOwnSlotIsItsNamespacesWhenCertain) {
  EXPECT_EQ(untokenized_exchange_owner("session-ana", 1, -1, true, false), "session-ana");
  EXPECT_EQ(untokenized_exchange_owner("session-ana", -1, 41, true, false), "session-ana");
  EXPECT_EQ(untokenized_exchange_owner("session-ana", -1, 41, false, false), "unattributed") << "an embedding task's?";
  EXPECT_EQ(untokenized_exchange_owner("session-ana", 1, -1, false, false), "unattributed")
      << "an embedding task may take the slot the answer named before its save";
  EXPECT_EQ(untokenized_exchange_owner("session-ana", 1, -1, true, true), "unattributed")
      << "a completion went on unguarded meanwhile";
  EXPECT_EQ(untokenized_exchange_owner("session-ana", -1, 41, true, true), "unattributed");
  EXPECT_EQ(untokenized_exchange_owner("session-ana", -1, -1, true, false), "unattributed") << "admission unknown";
  EXPECT_EQ(untokenized_exchange_owner("", 1, -1, true, false), "unattributed");
}

// A session name is the client's choice: two key holders who send the same one get two namespaces,
// so neither is restored (nor sees tagged) what the other kept under it. The key is read as
// llama-server reads it, whichever header carries it.
// A request whose JSON kvsnap cannot read may have asked for anything: its conversation is no
// tenant's, though the tenant it is counted for is still its own.
TEST(ServePersist, AnUnreadableRequestsConversationIsNoTenants) {
  Exchange x;
  x.request_headers = {{"X-Kvsnap-Session", "ana"}};
  EXPECT_EQ(owner_namespace(x), "session-ana");
  x.request_unreadable = true;
  EXPECT_EQ(owner_namespace(x), "unattributed");
  EXPECT_EQ(namespace_of(x), "session-ana");
}

TEST(ServePersist, ASessionNameBelongsToTheKeyThatSentIt) {
  auto ns = [](std::vector<std::pair<std::string, std::string>> headers) {
    Exchange x;
    x.request_headers = std::move(headers);
    return namespace_of(x);
  };
  EXPECT_EQ(ns({}), "default");
  EXPECT_EQ(ns({{"X-Kvsnap-Session", "ana"}}), "session-ana");
  const std::string a = ns({{"Authorization", "Bearer key-a"}});
  ASSERT_EQ(a.size(), 4u + 16u) << a;
  EXPECT_EQ(a.rfind("key-", 0), 0u) << a;
  EXPECT_EQ(ns({{"X-Api-Key", "key-a"}}), a);
  const std::string b = ns({{"X-Api-Key", "key-b"}});
  EXPECT_NE(a, b);
  const std::string a_ana = ns({{"Authorization", "Bearer key-a"}, {"X-Kvsnap-Session", "ana"}});
  const std::string b_ana = ns({{"X-Api-Key", "key-b"}, {"X-Kvsnap-Session", "ana"}});
  EXPECT_EQ(a_ana, a + "-session-ana");
  EXPECT_EQ(b_ana, b + "-session-ana");
  EXPECT_NE(a_ana, b_ana);
  EXPECT_NE(a_ana, "session-ana");
}

// A loopback listener that accepts connections (the kernel's backlog) and never answers: a child
// busy for the whole request timeout.
struct SilentChild {
  int port = 0;
  int fd = test::listen_on_loopback(&port, 8);
  ~SilentChild() {
    if (fd >= 0) ::close(fd);
  }
};

// A Persister in front of a child on `port`, with a directory store of its own (removed at the end).
struct PersistBed {
  fs::path root = fs::temp_directory_path() /
                  ("kvsnap-persist-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
  std::unique_ptr<TenantStores> stores;
  std::mutex store_mu;
  std::unique_ptr<Persister> persist;
  PersistBed(int port, double timeout_s) {
    auto s = TenantStores::open(posix_io(), directory_store((root / "store").string()), false);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return;
    stores = std::move(s).value();
    ServerTarget t;
    t.endpoint = {"http://127.0.0.1:" + std::to_string(port), "", timeout_s};
    t.slot_dir = (root / "slots").string();
    persist = std::make_unique<Persister>(posix_io(), *stores, store_mu, t, [](const std::string&) {});
  }
  ~PersistBed() {
    persist.reset();  // finishes the queued saves
    stores.reset();
    fs::remove_all(root);
  }
};

TEST(ServePersist, WaitSavedReturnsAfterTheSavesQueuedBeforeIt) {
  // -np 1: the next completion takes the slot whose conversation the last one queued for saving; it
  // must wait for that save, or the conversation is replaced before it is saved.
  SilentChild child;
  ASSERT_GT(child.port, 0);
  {
    PersistBed bed(child.port, /*timeout_s=*/2);
    ASSERT_TRUE(bed.persist);
    Persister& persist = *bed.persist;
    EXPECT_TRUE(persist.wait_saved(0));  // nothing queued: nothing to wait for

    Exchange x;
    x.method = "POST";
    x.path = "/completion";
    x.status = 200;
    x.request_headers = {{"X-Kvsnap-Session", "ana"}};
    x.prompt_tokens = {1, 2, 3};
    x.response_body = R"({"content": "x", "id_slot": 0})";
    persist.note_completion(x);
    // The save hangs on the silent child until its 2 s timeout: a short wait gives up.
    EXPECT_FALSE(persist.wait_saved(0.05));
    EXPECT_EQ(persist.stats().failed, 0u);
    // A long one returns when the save has run (here: failed, the child never answered).
    EXPECT_TRUE(persist.wait_saved(60));
    EXPECT_EQ(persist.stats().failed, 1u);
  }
}

// A child whose /slots shows slot 0 idle, filled, at task 7; it has no other route (a save of the slot
// fails).
struct SlotsChild {
  httplib::Server svr;
  int port = 0;
  std::thread thread;
  SlotsChild() {
    svr.Get("/slots", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"([{"id": 0, "id_task": 7, "is_processing": false, "n_prompt_tokens": 5}])", "application/json");
    });
    port = test::serve_on_free_port(svr, thread);
  }
  ~SlotsChild() { test::stop_serving(svr, thread); }
};

// A review's finding: after a restart (a requantize), a restore into an empty slot runs a one-token
// completion first (-fa auto's probe), which gives the slot a new task; the next save took kvsnap's own
// restore for a conversation to save, and filed it by the recent prompts (another tenant's, or none,
// dropping it from the book). A restored slot's task is noted as saved.
TEST(ServePersist, ARestoredSlotsTaskIsNotSavedAgain) {
  for (const bool restored : {false, true}) {
    SCOPED_TRACE(restored ? "noted as restored" : "not noted");
    SlotsChild child;
    ASSERT_GT(child.port, 0);
    {
      PersistBed bed(child.port, /*timeout_s=*/5);
      ASSERT_TRUE(bed.persist);
      Persister& persist = *bed.persist;
      if (restored) persist.note_restored(0, 7);
      Exchange x;
      x.method = "POST";
      x.path = "/v1/chat/completions";  // an answer that names no slot: every changed slot is saved
      x.status = 200;
      x.prompt_tokens = {1, 2};
      x.response_body = R"({"choices": []})";
      persist.note_completion(x);
      ASSERT_TRUE(persist.wait_saved(60));
      EXPECT_EQ(persist.stats().failed, restored ? 0u : 1u) << "a save of slot 0 was tried: " << persist.stats().last_error;
    }
  }
}

// A child whose slot 0 (idle, task 7) holds a real slot file: a save copies the fixture into the slot
// directory, as llama-server writes it.
const fs::path& slot_fixture() {
  static const fs::path p = fs::path(KVSNAP_SOURCE_DIR) / "fixtures/v0.5.0/hd64-f16-f16-faon.slot";
  return p;
}

// The tokens slot_fixture() holds.
std::vector<int32_t> fixture_tokens() {
  std::vector<std::byte> bytes = test::slurp(slot_fixture());
  MemoryFile file{"slot", std::span<const std::byte>(bytes)};
  auto state = parse_for_model(file, {}, nullptr);
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  return state.ok() ? state->tokens.tokens : std::vector<int32_t>{};
}

struct SavingChild {
  httplib::Server svr;
  int port = 0;
  std::thread thread;
  std::function<void()> on_save;  // called as a save is asked for, before the file is written
  // Slot 0's last task and its params (as llama-server 3.22.1's /slots shows them).
  void set_params(const std::string& p, int64_t t = 7) {
    std::lock_guard<std::mutex> l(params_mu);
    params = p;
    task = t;
  }
  std::mutex params_mu;
  std::string params = "{}";
  int64_t task = 7;
  explicit SavingChild(const fs::path& fixture, const fs::path& slot_dir) {
    svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status": "ok"})", "application/json");
    });
    svr.Get("/props", [](const httplib::Request&, httplib::Response& res) { res.set_content("{}", "application/json"); });
    svr.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> l(params_mu);
      res.set_content(R"([{"id": 0, "id_task": )" + std::to_string(task) +
                          R"(, "is_processing": false, "n_prompt_tokens": 5, "params": )" + params + "}]",
                      "application/json");
    });
    svr.Post("/slots/0", [this, fixture, slot_dir](const httplib::Request& req, httplib::Response& res) {
      if (on_save) on_save();
      const std::string name = nlohmann::json::parse(req.body).value("filename", "");
      fs::copy_file(fixture, slot_dir / name);
      res.set_content(R"({"id_slot": 0, "filename": ")" + name + R"(", "n_saved": 1, "n_written": )" +
                          std::to_string(fs::file_size(fixture)) + R"(, "timings": {"save_ms": 1.0}})",
                      "application/json");
    });
    port = test::serve_on_free_port(svr, thread);
  }
  ~SavingChild() { test::stop_serving(svr, thread); }
};

// A finished completion of session `session` whose answer names slot 0.
Exchange slot0_completion(const std::string& session, std::vector<int32_t> prompt) {
  Exchange x;
  x.method = "POST";
  x.path = "/completion";
  x.status = 200;
  x.request_headers = {{"X-Kvsnap-Session", session}};
  x.prompt_tokens = std::move(prompt);
  x.response_body = R"({"content": "x", "id_slot": 0})";
  return x;
}

// A store and slot directory (a PersistBed's) with a SavingChild in front, and the target a Persister
// of the test's own saves from.
struct SavingBed {
  static fs::path made(const fs::path& dir) {
    fs::create_directories(dir);
    return dir;
  }
  PersistBed bed{0, 5};  // its own Persister goes unused
  fs::path slots = made(bed.root / "slots");
  SavingChild child{slot_fixture(), slots};
  ServerTarget target() const {
    ServerTarget t;
    t.endpoint = {"http://127.0.0.1:" + std::to_string(child.port), "", 5};
    t.slot_dir = slots.string();
    return t;
  }
};

// A review's finding: a request's own slot was left unsaved, and counted nowhere, when another
// namespace's given-up prompt shared more of its start than the request's own prompt (owner_of_tokens
// names no one then: the slot may hold a part of that one). Its save is the last that would tag it:
// it is kept, as no tenant's.
TEST(ServePersist, ARequestsOwnSlotThatAnotherPromptFitsIsKeptForNoOne) {
  const std::vector<int32_t> toks = fixture_tokens();
  ASSERT_GT(toks.size(), 8u);
  SavingBed b;
  ASSERT_GT(b.child.port, 0);
  std::vector<std::string> lines;
  std::mutex lines_mu;
  {
    Persister persist(posix_io(), *b.bed.stores, b.bed.store_mu, b.target(), [&](const std::string& l) {
      std::lock_guard<std::mutex> g(lines_mu);
      lines.push_back(l);
    });
    Exchange given_up;  // bob's stream, given up: the child may have evaluated a part of it
    given_up.method = "POST";
    given_up.path = "/completion";
    given_up.request_headers = {{"X-Kvsnap-Session", "bob"}};
    given_up.prompt_tokens.assign(toks.begin(), toks.begin() + 6);
    given_up.prompt_tokens.push_back(-5);  // its own words after the shared start
    persist.note_prompt(given_up);
    persist.note_completion(slot0_completion("ana", {toks.begin(), toks.begin() + 4}));
    ASSERT_TRUE(persist.wait_saved(60));
    EXPECT_EQ(persist.stats().failed, 0u) << persist.stats().last_error;
    EXPECT_EQ(persist.stats().saved, 1u) << "the slot was left unsaved";
  }
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(),
                          [](const std::string& l) { return l.find("kept as unattributed") != std::string::npos; }));
  Store* store = *b.bed.stores->for_namespace("unattributed");
  auto kept = store->catalog().find_prefix(toks, "", 8);
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ(kept->size(), 1u);
  EXPECT_EQ(kept->front().tags.at("serve.ns"), "unattributed") << "neither ana's nor bob's";
}

// Two reviews' findings: a save that ran while the child restarted (forget_slots: task ids start
// again) recorded its slot's task of the old child afterwards, and a new conversation that reached
// that id would have counted as saved; and it kept the file under the old child's tags, which the new
// child's settings (a config.ini edited meanwhile) may not be. Such a save keeps nothing.
TEST(ServePersist, ASaveAcrossAChildRestartKeepsNothing) {
  const std::vector<int32_t> toks = fixture_tokens();
  ASSERT_FALSE(toks.empty());
  SavingBed b;
  ASSERT_GT(b.child.port, 0);
  std::vector<std::string> lines;
  std::mutex lines_mu;
  Persister persist(posix_io(), *b.bed.stores, b.bed.store_mu, b.target(), [&](const std::string& l) {
    std::lock_guard<std::mutex> g(lines_mu);
    lines.push_back(l);
  });
  b.child.on_save = [&persist] { persist.forget_slots(); };  // the child restarts while its slot is saved
  persist.note_completion(slot0_completion("ana", {toks.front()}));
  ASSERT_TRUE(persist.wait_saved(60));
  EXPECT_EQ(persist.stats().saved, 0u);
  EXPECT_EQ(persist.stats().failed, 0u) << persist.stats().last_error;
  EXPECT_TRUE(persist.holds_unsaved(0, 7)) << "task 7 of the new child counts as saved";
  Store* store = *b.bed.stores->for_namespace("session-ana");
  auto kept = store->catalog().find_prefix(toks, "", 8);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->empty());
  std::lock_guard<std::mutex> g(lines_mu);
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(),
                          [](const std::string& l) { return l.find("restarted while slot 0 was saved") != std::string::npos; }));
}

// A review's finding: a slot that ran a request with LoRA scales of its own was filed by another
// exchange's save under the tenant whose earlier prompt its tokens start with, and restored for that
// tenant's next plain request: a cache of other values. Which scales made a slot is read from the
// child (its last task's params.lora), and such a slot is not kept (serve restores no conversation
// of a request's own scales).
TEST(ServePersist, ASlotMadeUnderOtherLoraScalesIsNotKept) {
  const std::vector<int32_t> toks = fixture_tokens();
  ASSERT_GT(toks.size(), 4u);
  SavingBed b;
  ASSERT_GT(b.child.port, 0);
  Store* store = *b.bed.stores->for_namespace("session-ana");
  auto kept = [&] {
    auto found = store->catalog().find_prefix(toks, "", 64);
    return found.ok() ? found->size() : size_t(1000);
  };
  auto saves = [&](const std::string& params) {
    b.child.set_params(params);
    Persister persist(posix_io(), *b.bed.stores, b.bed.store_mu, b.target(), [](const std::string&) {});
    persist.set_cache_tag("settings");
    persist.set_loaded_scales({1.0f});
    const size_t before = kept();
    // ana's plain completion named slot 0; the slot's last task may be another's
    persist.note_completion(slot0_completion("ana", {toks.begin(), toks.begin() + 4}));
    EXPECT_TRUE(persist.wait_saved(60));
    EXPECT_EQ(persist.stats().failed, 0u) << persist.stats().last_error;
    EXPECT_FALSE(persist.holds_unsaved(0, 7)) << "left to be saved again";
    return kept() - before;
  };
  EXPECT_EQ(saves(R"({"lora": [{"id": 0, "scale": 0.5}]})"), 0u);
  EXPECT_EQ(saves(R"({"lora": [{"id": 1, "scale": 1.0}]})"), 0u) << "adapter 0 at 0";
  EXPECT_EQ(saves(R"({"lora": [{"id": 0, "scale": 1.0}]})"), 1u) << "the loaded scales, named";
  EXPECT_EQ(saves(R"({"lora": []})"), 1u);
  EXPECT_EQ(saves("{}"), 1u);
}

// A review's finding: a save for every slot (queued by an exchange without a permit) listed a slot
// before a gated request with LoRA scales of its own ran there, then saved it: the file was that
// request's, kept under the loaded scales' tags. With adapters loaded the slot is listed again
// before the file is kept; a task run meanwhile leaves it to the next pass.
TEST(ServePersist, ASlotThatRanAnotherTaskWhileSavedIsNotKept) {
  const std::vector<int32_t> toks = fixture_tokens();
  ASSERT_GT(toks.size(), 4u);
  for (bool adapters : {true, false}) {
    SCOPED_TRACE(adapters);
    SavingBed b;
    ASSERT_GT(b.child.port, 0);
    Persister persist(posix_io(), *b.bed.stores, b.bed.store_mu, b.target(), [](const std::string&) {});
    if (adapters) persist.set_loaded_scales({1.0f});
    b.child.on_save = [&b] { b.child.set_params(R"({"lora": [{"id": 0, "scale": 0}]})", 8); };
    persist.note_completion(slot0_completion("ana", {toks.begin(), toks.begin() + 4}));
    ASSERT_TRUE(persist.wait_saved(60));
    EXPECT_EQ(persist.stats().failed, 0u) << persist.stats().last_error;
    EXPECT_EQ(persist.stats().saved, adapters ? 0u : 1u) << "without adapters no task changes what it holds";
    EXPECT_EQ(persist.holds_unsaved(0, 7), adapters);
  }
}

// A review's finding: an OPTIONS (a CORS preflight) on a completion route, answered 200, was noted
// as a finished completion whose save took slot 0's unsaved conversation for its own. Only a POST
// generates: anything else queues no save.
TEST(ServePersist, OnlyAPostCompletionQueuesASave) {
  for (const char* method : {"OPTIONS", "GET", "POST"}) {
    SCOPED_TRACE(method);
    SlotsChild child;
    ASSERT_GT(child.port, 0);
    {
      PersistBed bed(child.port, /*timeout_s=*/5);
      ASSERT_TRUE(bed.persist);
      Persister& persist = *bed.persist;
      Exchange x;
      x.method = method;
      x.path = "/completion";
      x.status = 200;
      persist.note_completion(x);
      persist.note_prompt(x);
      ASSERT_TRUE(persist.wait_saved(60));
      const bool post = std::string(method) == "POST";
      EXPECT_EQ(persist.stats().failed, post ? 1u : 0u) << "a save of slot 0 was tried: " << persist.stats().last_error;
    }
  }
}

// A review's finding: a prefix restore into an unpinned request's slot took the first idle slot that
// held least of the request, which could be one whose conversation had just finished and whose save
// was not queued yet (lost to the restore). A slot holding an unsaved conversation comes last.
TEST(ServePrefix, ARestoreGoesFirstToASlotWhoseConversationIsSaved) {
  const SlotChoice unsaved_empty{0, true, true, 0}, saved_empty{1, true, false, 0}, busy{2, false, false, 0},
      saved_holding{3, true, false, 5};
  EXPECT_EQ(choose_restore_slot({unsaved_empty, saved_empty}, -1), 1);
  EXPECT_EQ(choose_restore_slot({saved_empty, unsaved_empty}, -1), 1);
  EXPECT_EQ(choose_restore_slot({unsaved_empty, saved_holding}, -1), 3) << "a saved slot, even one worth more";
  EXPECT_EQ(choose_restore_slot({saved_holding, saved_empty}, -1), 1) << "among saved ones, the one worth least";
  EXPECT_EQ(choose_restore_slot({unsaved_empty, busy}, -1), 0) << "no saved idle slot: the unsaved one";
  EXPECT_EQ(choose_restore_slot({busy}, -1), -1);
  EXPECT_EQ(choose_restore_slot({saved_empty, busy}, 2), 2) << "a pinned request's slot, busy or not";
  EXPECT_EQ(choose_restore_slot({saved_empty}, 7), -1);
}

TEST(ServePersist, ASlotHoldsAnUnsavedConversationUntilItsTaskIsSavedOrRestored) {
  SlotsChild child;
  ASSERT_GT(child.port, 0);
  PersistBed bed(child.port, /*timeout_s=*/5);
  ASSERT_TRUE(bed.persist);
  EXPECT_FALSE(bed.persist->holds_unsaved(0, -1)) << "an empty slot";
  EXPECT_TRUE(bed.persist->holds_unsaved(0, 7));
  bed.persist->note_restored(0, 7);  // the child said task 7
  EXPECT_FALSE(bed.persist->holds_unsaved(0, 7));
  EXPECT_TRUE(bed.persist->holds_unsaved(0, 8)) << "another request ran there since";
  bed.persist->forget_slots();
  EXPECT_TRUE(bed.persist->holds_unsaved(0, 7));
}

}  // namespace
}  // namespace kvsnap
