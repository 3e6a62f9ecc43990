// serve/persist.h: a saved slot is tagged with the namespace of the request whose prompt it holds, and a
// completion can wait for the saves queued before it.
#include "serve/persist.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "store/store_location.h"

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
  // Equal prompts: the latest.
  recent.push_back({"key-d", {1, 2, 3, 4}});
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 3, 4, 5}), "key-d");
  // Nobody's prompt: no owner (a prompt longer than the slot, a different one, an empty one).
  EXPECT_EQ(owner_of_tokens(recent, {1, 2, 3}), "key-c");
  EXPECT_EQ(owner_of_tokens(recent, {7, 7, 7}), "");
  EXPECT_EQ(owner_of_tokens({{"key-e", {}}}, {1, 2}), "");
  EXPECT_EQ(owner_of_tokens({}, {1, 2}), "");
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

// A session name is the client's choice: two key holders who send the same one get two namespaces,
// so neither is restored (nor sees tagged) what the other kept under it. The key is read as
// llama-server reads it, whichever header carries it.
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
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int port = 0;
  SilentChild() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 8) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0)
      port = ntohs(a.sin_port);
  }
  ~SilentChild() { ::close(fd); }
};

TEST(ServePersist, WaitSavedReturnsAfterTheSavesQueuedBeforeIt) {
  // -np 1: the next completion takes the slot whose conversation the last one queued for saving; it
  // must wait for that save, or the conversation is replaced before it is saved.
  SilentChild child;
  ASSERT_GT(child.port, 0);
  const fs::path root = fs::temp_directory_path() / ("kvsnap-persist-" + std::to_string(::getpid()) + "-" +
                                                    std::to_string(std::random_device{}()));
  {
    auto stores = TenantStores::open(posix_io(), directory_store((root / "store").string()), false);
    ASSERT_TRUE(stores.ok()) << stores.status().ToString();
    std::mutex store_mu;
    ServerTarget t;
    t.endpoint = {"http://127.0.0.1:" + std::to_string(child.port), "", /*timeout_s=*/2};
    t.slot_dir = (root / "slots").string();
    Persister persist(posix_io(), **stores, store_mu, t, [](const std::string&) {});
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
  fs::remove_all(root);
}

}  // namespace
}  // namespace kvsnap
