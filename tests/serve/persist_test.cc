// serve/persist.h: a saved slot is tagged with the namespace of the request whose prompt it holds.
#include "serve/persist.h"

#include <gtest/gtest.h>

namespace kvsnap {
namespace {

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

}  // namespace
}  // namespace kvsnap
