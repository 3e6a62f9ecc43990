// serve/tenant_stores.h: with --tenant-per-namespace each namespace's snapshots are sealed under its
// own tenant, so one namespace's store can neither find nor restore another's.
#include "serve/tenant_stores.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "format/state_prefix.h"
#include "test_files.h"

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

struct Bed {
  fs::path root = fs::temp_directory_path() / ("kvsnap-tenants-" + std::to_string(::getpid()) + "-" +
                                              std::to_string(std::random_device{}()));
  fs::path key = root / "keys" / "master.key";
  StoreLocation where = directory_store((root / "store").string());
  Bed() {
    fs::create_directories(key.parent_path());
    std::ofstream(key) << std::string(64, 'c') << "\n";
    ::chmod(key.c_str(), 0600);
    where.keys.key_file = key.string();
  }
  ~Bed() { fs::remove_all(root); }
};

struct Slot {
  std::vector<std::byte> bytes = test::slurp(fs::path(KVSNAP_SOURCE_DIR) / "fixtures/v0.5.0/hd64-f16-f16-faon.slot");
  MemoryFile file{"slot", std::span<const std::byte>(bytes)};
  Result<StateFile> state = parse_for_model(file, {}, nullptr);
};

Result<std::vector<std::byte>> restore(Store& s, int64_t id) {
  VectorSink out;
  KV_RETURN_IF_ERROR(s.restore(std::to_string(id), RestoreRequest{}, out).status());
  return std::move(out.bytes);
}

TEST(TenantStores, EachNamespaceIsItsOwnTenant) {
  Bed b;
  Slot slot;
  ASSERT_TRUE(slot.state.ok()) << slot.state.status().ToString();
  auto stores = TenantStores::open(posix_io(), b.where, /*per_namespace=*/true);
  ASSERT_TRUE(stores.ok()) << stores.status().ToString();
  SaveRequest req;
  req.tags["serve.ns"] = "ana";
  Store* ana = *(*stores)->for_namespace("ana");
  auto saved = ana->save(slot.file, *slot.state, req);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->info.tenant, "ana");
  auto back = restore(*ana, saved->info.id);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, slot.bytes);
  const std::vector<int32_t>& toks = slot.state->tokens.tokens;
  EXPECT_EQ(ana->catalog().find_prefix(toks, saved->info.model_fingerprint, 8)->size(), 1u);

  Store* bob = *(*stores)->for_namespace("bob");
  EXPECT_TRUE(bob->catalog().find_prefix(toks, saved->info.model_fingerprint, 8)->empty())
      << "bob's keyed prefix index does not hold ana's tokens";
  auto stolen = restore(*bob, saved->info.id);
  ASSERT_FALSE(stolen.ok());
  EXPECT_NE(stolen.status().message().find("ana"), std::string::npos) << stolen.status().message();
  EXPECT_EQ(*(*stores)->for_namespace("ana"), ana) << "a namespace's store stays open";
}

TEST(TenantStores, OneSharedTenantByDefault) {
  Bed b;
  b.where.keys.tenant = "team";
  auto stores = TenantStores::open(posix_io(), b.where, /*per_namespace=*/false);
  ASSERT_TRUE(stores.ok()) << stores.status().ToString();
  Store* a = *(*stores)->for_namespace("ana");
  EXPECT_EQ(*(*stores)->for_namespace("bob"), a);
  EXPECT_EQ(a->tenant(), "team");
}

TEST(TenantStores, PerNamespaceNeedsAKeyAndNoFixedTenant) {
  Bed b;
  StoreLocation keyless = b.where;
  keyless.keys.key_file.clear();
  auto no_key = TenantStores::open(posix_io(), keyless, true);
  ASSERT_FALSE(no_key.ok());
  EXPECT_EQ(no_key.status().code(), Code::kInvalidArgument);
  EXPECT_NE(no_key.status().message().find("--key-file"), std::string::npos) << no_key.status().message();
  StoreLocation fixed = b.where;
  fixed.keys.tenant = "team";
  auto both = TenantStores::open(posix_io(), fixed, true);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("'team'"), std::string::npos) << both.status().message();
}

TEST(TenantStores, ANamespaceThatIsNoTenantNameIsRefusedAndOpenStoresAreBounded) {
  Bed b;
  auto stores = TenantStores::open(posix_io(), b.where, true);
  ASSERT_TRUE(stores.ok()) << stores.status().ToString();
  auto bad = (*stores)->for_namespace("has space");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'has space'"), std::string::npos) << bad.status().message();
  for (size_t i = 0; i < TenantStores::kMaxOpen + 3; ++i) {
    auto s = (*stores)->for_namespace("ns-" + std::to_string(i));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->tenant(), "ns-" + std::to_string(i));
  }
  auto again = (*stores)->for_namespace("ns-0");  // closed meanwhile: opened again
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->tenant(), "ns-0");
}

}  // namespace
}  // namespace kvsnap
