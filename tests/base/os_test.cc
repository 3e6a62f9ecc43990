// base/os.h: the OS seam. These run on every system; the parts only one system can show (the parent
// death signal on Linux) say so and skip elsewhere. F_FULLFSYNC itself runs only on macOS.
#include "base/os.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace kvsnap {
namespace {

namespace fs = std::filesystem;

TEST(Os, SyncFdSyncsFilesAndDirectories) {
  const fs::path dir = fs::temp_directory_path() / ("kvsnap_os_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "f").string();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::write(fd, "abc", 3), 3);
  EXPECT_EQ(sync_fd(fd, /*data_only=*/true), 0);
  EXPECT_EQ(sync_fd(fd, /*data_only=*/false), 0);
  ::close(fd);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dfd, 0);
  EXPECT_EQ(sync_fd(dfd, /*data_only=*/false), 0);
  ::close(dfd);
  // A closed descriptor is the OS's error, passed on (EBADF), not a crash or a silent success.
  EXPECT_EQ(sync_fd(dfd, false), EBADF);
  EXPECT_STRNE(sync_fd_call(true), "");
  fs::remove_all(dir);
}

TEST(Os, WritebackThenSyncKeepsTheBytes) {
  const std::string file = (fs::temp_directory_path() / ("kvsnap_os_wb_" + std::to_string(::getpid()))).string();
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::string data(1 << 20, 'k');
  ASSERT_EQ(::write(fd, data.data(), data.size()), ssize_t(data.size()));
  start_writeback(fd, 0, data.size());
  start_writeback(-1, 0, 1);  // best effort: a bad descriptor is ignored, not a crash
  EXPECT_EQ(sync_fd(fd, /*data_only=*/true), 0);
  EXPECT_EQ(fs::file_size(file), data.size());
  ::close(fd);
  fs::remove(file);
}

TEST(Os, PipeEndsAreCloseOnExec) {
  int fds[2];
  ASSERT_EQ(pipe_cloexec(fds), 0);
  for (int fd : fds) EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "fd " << fd;
  ASSERT_EQ(::write(fds[1], "x", 1), 1);
  char c = 0;
  EXPECT_EQ(::read(fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(Os, ProcessEnvironmentIsThisProcesssEnvironment) {
  ASSERT_EQ(::setenv("KVSNAP_OS_TEST", "here", 1), 0);
  bool seen = false;
  for (char** e = process_environ(); e && *e; ++e) seen = seen || std::string(*e) == "KVSNAP_OS_TEST=here";
  EXPECT_TRUE(seen);
  ::unsetenv("KVSNAP_OS_TEST");
}

TEST(Os, TakePendingSignalTakesOnlyWhatIsPending) {
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGUSR2);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &set, &old), 0);
  int sig = 0;
  EXPECT_FALSE(take_pending_signal(set, &sig)) << "nothing pending yet";
  ASSERT_EQ(pthread_kill(pthread_self(), SIGUSR2), 0);
  EXPECT_TRUE(take_pending_signal(set, &sig));
  EXPECT_EQ(sig, SIGUSR2);
  EXPECT_FALSE(take_pending_signal(set, &sig)) << "taken once";
  sigset_t only_usr1;
  sigemptyset(&only_usr1);
  sigaddset(&only_usr1, SIGUSR1);
  ASSERT_EQ(pthread_kill(pthread_self(), SIGUSR2), 0);
  EXPECT_FALSE(take_pending_signal(only_usr1, &sig)) << "SIGUSR2 is not among those asked for";
  EXPECT_TRUE(take_pending_signal(set, &sig));  // leave nothing pending behind
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &old, nullptr), 0);
}

// A grandchild asks for SIGTERM when its parent ends; the parent then exits. The grandchild holds the
// write end of a pipe, so its death shows here as end-of-file (it is no child of this process).
TEST(Os, ParentDeathSignalReachesTheOrphan) {
  if (!has_parent_death_signal()) GTEST_SKIP() << "this system has no parent death signal (macOS)";
  int fds[2], ready[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    const pid_t parent = ::getpid();
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(fds[0]);
      if (request_parent_death_signal(parent, SIGTERM) != 0) _exit(3);
      (void)!::write(ready[1], "r", 1);
      for (;;) ::pause();  // until SIGTERM
    }
    ::close(ready[1]);
    char c = 0;
    const bool made = ::read(ready[0], &c, 1) == 1 && c == 'r';  // the request is made: end now
    _exit(made ? 0 : 4);
  }
  ::close(fds[1]);
  ::close(ready[1]);
  int st = 0;
  ASSERT_EQ(::waitpid(middle, &st, 0), middle);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the orphan could not make its request";
  char c = 0;
  pollfd p{fds[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 20000), 1) << "the orphan still runs 20 s after its parent ended";
  EXPECT_EQ(::read(fds[0], &c, 1), 0) << "end of file: the orphan is gone";
  ::close(fds[0]);
  ::close(ready[0]);
}

TEST(Os, CloseFdsFromClosesEveryDescriptorFromThereUp) {
  // In a child, as the lifeline watchdog does it: descriptors below `lowest` stay open, all others close,
  // a high one included (with and without close_range the same).
  const int limit = open_fd_limit();
  ASSERT_GT(limit, 3);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int p[2];
    if (::pipe(p) != 0) _exit(2);
    const int high = ::fcntl(p[0], F_DUPFD, limit > 1000 ? 1000 : limit - 1);
    if (high < 0) _exit(3);
    const int keep = ::dup(p[1]);
    const int lowest = keep + 1;
    const int next = ::fcntl(p[0], F_DUPFD, lowest);
    if (next < 0) _exit(4);
    close_fds_from(lowest, limit);
    bool ok = ::fcntl(keep, F_GETFD) != -1;
    for (int fd : {next, high}) ok = ok && ::fcntl(fd, F_GETFD) == -1 && errno == EBADF;
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "wait status " << st;
}

TEST(Os, NameThisProcessShowsInProc) {
  if (!std::filesystem::exists("/proc/self/comm")) GTEST_SKIP() << "no /proc: the name is not readable here (macOS: not set)";
  int up[2];
  ASSERT_EQ(::pipe(up), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    name_this_process("kvsnap-lifeline");
    (void)!::write(up[1], "r", 1);
    for (;;) ::pause();
  }
  ::close(up[1]);
  char c = 0;
  ASSERT_EQ(::read(up[0], &c, 1), 1);
  ::close(up[0]);
  std::string name;
  {
    std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
    std::getline(in, name);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_EQ(name, "kvsnap-lifeline");
}

TEST(Os, ParentDeathRequestSeesAParentAlreadyGone) {
  if (!has_parent_death_signal()) GTEST_SKIP() << "this system has no parent death signal (macOS)";
  // Asked in a child on behalf of a pid that is not its parent: as if the parent had died first.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(request_parent_death_signal(::getppid() + 1, SIGTERM) == ESRCH ? 0 : 1);
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST(Os, MachineDescriptionsNeverFail) {
  EXPECT_FALSE(cpu_model_name().empty());
  EXPECT_FALSE(load_average_text().empty());
}

TEST(Os, CryptoFeaturesAgreeWithTheCompilersOwnQuery) {
  const std::string f = " " + cpu_crypto_features() + " ";
#if defined(__x86_64__) && defined(__GNUC__)
  // GCC and clang answer from their own CPUID reading: an independent source for the same bits.
  EXPECT_EQ(f.find(" aes ") != std::string::npos, __builtin_cpu_supports("aes") != 0) << f;
  EXPECT_EQ(f.find(" pclmulqdq ") != std::string::npos, __builtin_cpu_supports("pclmul") != 0) << f;
  EXPECT_EQ(f.find(" avx2 ") != std::string::npos, __builtin_cpu_supports("avx2") != 0) << f;
  EXPECT_EQ(f.find(" avx512f ") != std::string::npos, __builtin_cpu_supports("avx512f") != 0) << f;
#else
  EXPECT_NE(f, "  ");
#endif
}

}  // namespace
}  // namespace kvsnap
