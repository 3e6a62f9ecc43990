#include "base/lazy_library.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace kvsnap {
namespace {

// The C library is what every Linux process has; the tests need a real one to open.
#if defined(__GLIBC__)
constexpr const char* kRealLibrary = "libc.so.6";

TEST(LazyLibrary, ResolvesEverySymbolOnceAndCallsThrough) {
  static constexpr const char* kNames[] = {"getpid", "strlen"};
  LazyLibrary lib(kRealLibrary, nullptr, "the test", "test package", kNames);
  EXPECT_EQ(lib.symbol(0), nullptr);  // nothing before load()
  std::vector<std::thread> threads;
  std::vector<Status> outcomes(4);
  for (size_t i = 0; i < outcomes.size(); ++i) threads.emplace_back([&, i] { outcomes[i] = lib.load(); });
  for (auto& t : threads) t.join();
  for (const Status& s : outcomes) EXPECT_TRUE(s.ok()) << s.message();
  auto length = reinterpret_cast<size_t (*)(const char*)>(lib.symbol(1));
  ASSERT_NE(length, nullptr);
  EXPECT_EQ(length("kvsnap"), 6u);
  lib.load_or_die();  // loaded: returns
}

TEST(LazyLibrary, AMissingSymbolNamesItAndSetsNone) {
  static constexpr const char* kNames[] = {"getpid", "kvsnap_no_such_function"};
  LazyLibrary lib(kRealLibrary, nullptr, "the test", "install package libc6", kNames);
  Status s = lib.load();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.message().find("cannot load libc.so.6 (for the test; install package libc6)"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("it has no kvsnap_no_such_function"), std::string::npos) << s.message();
  EXPECT_EQ(lib.symbol(0), nullptr);  // all or nothing
  EXPECT_EQ(lib.load().message(), s.message());  // the first outcome stays
}

TEST(LazyLibrary, TheBuildsPathIsTriedWhenTheSonameIsNotFound) {
  static constexpr const char* kNames[] = {"strlen"};
  LazyLibrary lib("libkvsnap-no-such-library.so.9", kRealLibrary, "the test", "no package", kNames);
  ASSERT_TRUE(lib.load().ok());
  EXPECT_EQ(reinterpret_cast<size_t (*)(const char*)>(lib.symbol(0))("abc"), 3u);
}
#endif

TEST(LazyLibrary, AMissingLibraryNamesItWhatNeedsItAndThePackage) {
  static constexpr const char* kNames[] = {"anything"};
  LazyLibrary lib("libkvsnap-no-such-library.so.9", "/nonexistent/libkvsnap-no-such-library.so.9", "the fleet store",
                  "install package libnothing9", kNames);
  Status s = lib.load();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.message().find("cannot load libkvsnap-no-such-library.so.9 (for the fleet store; install package "
                             "libnothing9): "),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("libkvsnap-no-such-library.so.9: cannot open shared object file"), std::string::npos)
      << s.message();  // dlerror's reason for the SONAME, not for the fallback, follows
}

TEST(LazyLibraryDeathTest, AStubReachedWithoutItsLibraryAbortsWithTheMessage) {
  static constexpr const char* kNames[] = {"anything"};
  LazyLibrary lib("libkvsnap-no-such-library.so.9", nullptr, "the test", "no package", kNames);
  EXPECT_DEATH(lib.load_or_die(), "kvsnap: cannot load libkvsnap-no-such-library.so.9 \\(for the test; no package\\)");
}

}  // namespace
}  // namespace kvsnap
