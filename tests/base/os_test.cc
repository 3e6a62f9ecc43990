// base/os.h: the OS seam. These run on every system; the parts only one system can show (the parent
// death signal on Linux) say so and skip elsewhere. F_FULLFSYNC itself runs only on macOS; the choice
// around it runs everywhere through SyncCalls. A build with -DKVSNAP_OS_GENERIC_POSIX=ON runs all of
// them on Linux against os.cc's branch for other POSIX systems (tests/run-all.sh).
#include "base/os.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <thread>

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

TEST(Os, BuiltBranchIsTheOneConfigured) {
#if defined(__APPLE__)
  EXPECT_STREQ(os_branch(), "macos");
#elif defined(__linux__) && !defined(KVSNAP_OS_GENERIC_POSIX)
  EXPECT_STREQ(os_branch(), "linux");
#else
  EXPECT_STREQ(os_branch(), "posix");
#endif
  const SyncCalls& c = system_sync_calls();
  EXPECT_NE(c.sync, nullptr);
  if (std::string(os_branch()) == "linux") {
    EXPECT_EQ(c.full_sync, nullptr);
    EXPECT_NE(c.data_sync, nullptr);
    EXPECT_TRUE(has_parent_death_signal());
  } else if (std::string(os_branch()) == "macos") {
    EXPECT_NE(c.full_sync, nullptr);
    EXPECT_EQ(c.data_sync, nullptr);
  } else {
    EXPECT_EQ(c.full_sync, nullptr);
    EXPECT_FALSE(has_parent_death_signal());
    EXPECT_EQ(become_subreaper(), ENOSYS);
#if defined(__linux__)
    EXPECT_EQ(c.data_sync, nullptr) << "the generic build on Linux stands for a system without fdatasync";
#endif
  }
}

// Stand-ins for the three sync calls: each records that it ran; the fsync and fdatasync ones make
// the real call, the F_FULLFSYNC one answers as the test says (macOS's own is not on this system).
struct FakeSyncs {
  std::vector<std::string> ran;
  int full_sync_errno = 0;  // 0: F_FULLFSYNC succeeds
  int eintr_first = 0;      // this many calls of F_FULLFSYNC are interrupted first
};
FakeSyncs fake;
int fake_full_sync(int) {
  fake.ran.push_back("F_FULLFSYNC");
  if (fake.eintr_first > 0) {
    --fake.eintr_first;
    errno = EINTR;
    return -1;
  }
  if (fake.full_sync_errno == 0) return 0;
  errno = fake.full_sync_errno;
  return -1;
}
int fake_data_sync(int fd) {
  fake.ran.push_back("fdatasync");
  return ::fsync(fd);  // (macOS's headers do not declare fdatasync)
}
int fake_sync(int fd) {
  fake.ran.push_back("fsync");
  return ::fsync(fd);
}
constexpr SyncCalls kMacCalls{fake_full_sync, nullptr, fake_sync};
constexpr SyncCalls kLinuxCalls{nullptr, fake_data_sync, fake_sync};
constexpr SyncCalls kNoFdatasyncCalls{nullptr, nullptr, fake_sync};

class OsSync : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = (fs::temp_directory_path() / ("kvsnap_os_sync_" + std::to_string(::getpid()))).string();
    fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd_, 0) << file_ << ": " << std::strerror(errno);
    ASSERT_EQ(::write(fd_, "abc", 3), 3);
    fake = FakeSyncs();
  }
  void TearDown() override {
    ::close(fd_);
    fs::remove(file_);
  }
  std::vector<std::string> ran(const SyncCalls& calls, bool data_only, int* result) {
    fake.ran.clear();
    *result = sync_fd_with(calls, fd_, data_only);
    return fake.ran;
  }
  std::string file_;
  int fd_ = -1;
};

using Ran = std::vector<std::string>;

TEST_F(OsSync, FullSyncAloneWhenTheFileSystemTakesIt) {
  int rc = -1;
  EXPECT_EQ(ran(kMacCalls, true, &rc), Ran{"F_FULLFSYNC"});
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(ran(kMacCalls, false, &rc), Ran{"F_FULLFSYNC"});
  EXPECT_EQ(rc, 0);
  EXPECT_STREQ(sync_fd_call_with(kMacCalls, true), "F_FULLFSYNC");
}

TEST_F(OsSync, FullSyncRefusedByTheFileSystemFallsBackToFsync) {
  // As SMB or a FUSE file system answers on macOS: fsync is the most such a file system offers.
  for (int e : {ENOTSUP, EOPNOTSUPP, EINVAL}) {
    fake.full_sync_errno = e;
    int rc = -1;
    EXPECT_EQ(ran(kMacCalls, true, &rc), (Ran{"F_FULLFSYNC", "fsync"})) << std::strerror(e);
    EXPECT_EQ(rc, 0) << std::strerror(e);
  }
}

TEST_F(OsSync, FullSyncFailingOtherwiseIsTheAnswer) {
  // EIO is a write the disk lost: an fsync after it may report success for pages already dropped.
  fake.full_sync_errno = EIO;
  int rc = 0;
  EXPECT_EQ(ran(kMacCalls, true, &rc), Ran{"F_FULLFSYNC"});
  EXPECT_EQ(rc, EIO);
  // An interrupted F_FULLFSYNC is asked again, not replaced by fsync.
  fake.full_sync_errno = 0;
  fake.eintr_first = 2;
  EXPECT_EQ(ran(kMacCalls, true, &rc), (Ran{"F_FULLFSYNC", "F_FULLFSYNC", "F_FULLFSYNC"}));
  EXPECT_EQ(rc, 0);
}

TEST_F(OsSync, FdatasyncForDataWhereThereIsOneElseFsync) {
  int rc = -1;
  EXPECT_EQ(ran(kLinuxCalls, true, &rc), Ran{"fdatasync"});
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(ran(kLinuxCalls, false, &rc), Ran{"fsync"});
  EXPECT_STREQ(sync_fd_call_with(kLinuxCalls, true), "fdatasync");
  EXPECT_STREQ(sync_fd_call_with(kLinuxCalls, false), "fsync");
  EXPECT_EQ(ran(kNoFdatasyncCalls, true, &rc), Ran{"fsync"});
  EXPECT_EQ(rc, 0);
  EXPECT_STREQ(sync_fd_call_with(kNoFdatasyncCalls, true), "fsync");
}

TEST_F(OsSync, TheSystemsErrorIsPassedOn) {
  ::close(fd_);
  int rc = 0;
  for (const SyncCalls* calls : {&kLinuxCalls, &kNoFdatasyncCalls, &system_sync_calls()}) {
    fake.ran.clear();
    EXPECT_EQ(sync_fd_with(*calls, fd_, true), EBADF);
  }
  fake.full_sync_errno = ENOTSUP;  // refused, then fsync's own error
  EXPECT_EQ(ran(kMacCalls, true, &rc), (Ran{"F_FULLFSYNC", "fsync"}));
  EXPECT_EQ(rc, EBADF);
  fd_ = ::open(file_.c_str(), O_RDONLY);  // for TearDown
}

TEST(Os, WritebackThenSyncKeepsTheBytes) {
  const std::string file = (fs::temp_directory_path() / ("kvsnap_os_wb_" + std::to_string(::getpid()))).string();
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::string data(1 << 20, 'k');
  ASSERT_EQ(::write(fd, data.data(), data.size()), ssize_t(data.size()));
  EXPECT_EQ(start_writeback(fd, 0, data.size()), std::string(os_branch()) == "linux");
  (void)start_writeback(-1, 0, 1);  // best effort: a bad descriptor is ignored, not a crash
  const WritebackWait waited = wait_writeback(fd, 0, data.size());
  EXPECT_EQ(waited.error, 0);
  EXPECT_EQ(waited.supported, std::string(os_branch()) == "linux") << "Linux has sync_file_range for a regular file";
  EXPECT_EQ(sync_fd(fd, /*data_only=*/true), 0);
  EXPECT_EQ(fs::file_size(file), data.size());
  ::close(fd);
  fs::remove(file);
}

// A save's adaptive level reads whether its sink thread blocked (format/snapshot_write.cc): a
// sleep counts, the thread's own computing does not; another thread's sleep is not this one's.
TEST(Os, ABlockedThreadIsCounted) {
  const std::optional<uint64_t> before = thread_blocked_count();
  if (!before) GTEST_SKIP() << "no count of a thread's waits on this system (every chunk is compressed)";
  volatile uint64_t x = 1;
  for (int i = 0; i < 1000000; ++i) x = x * 3 + 1;
  std::thread([] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }).join();  // this thread waits too
  const uint64_t after_join = *thread_blocked_count();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_GT(*thread_blocked_count(), after_join) << "a sleep is a voluntary context switch";
  EXPECT_GE(after_join, *before);
}

// Another thread's sleep, while this one computes (spins), is not this thread's (RUSAGE_THREAD).
TEST(Os, AnotherThreadsWaitIsNotThisThreads) {
  if (!thread_blocked_count()) GTEST_SKIP() << "no count of a thread's waits on this system";
  // Under qemu-user (tests/cross/*.sh set KVSNAP_TEST_EMULATED) a computing thread blocks on the
  // emulator's own locks (code translation; 24 -> 30 in a run), which no native thread does.
  if (std::getenv("KVSNAP_TEST_EMULATED") != nullptr) GTEST_SKIP() << "under emulation";
  volatile uint64_t x = 1;
  std::atomic<bool> go{false}, done{false};
  std::thread sleeper([&] {  // started before the count is taken: its start is not measured
    while (!go.load()) {
    }
    for (int i = 0; i < 5; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done = true;
  });
  const uint64_t spinning_from = *thread_blocked_count();
  go = true;
  while (!done.load()) x = x * 3 + 1;
  const uint64_t spun_to = *thread_blocked_count();
  sleeper.join();
  EXPECT_EQ(spun_to, spinning_from) << "RUSAGE_THREAD, not the process's count";
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

// signal_ignored reports SIG_IGN only: not the default action, not a handler.
TEST(Os, SignalIgnoredIsSigIgnOnly) {
  struct sigaction was {};
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &was), 0);
  signal(SIGUSR2, SIG_IGN);
  EXPECT_TRUE(signal_ignored(SIGUSR2));
  signal(SIGUSR2, SIG_DFL);
  EXPECT_FALSE(signal_ignored(SIGUSR2));
  signal(SIGUSR2, [](int) {});
  EXPECT_FALSE(signal_ignored(SIGUSR2));
  sigaction(SIGUSR2, &was, nullptr);
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
// The two bounded waits a supervisor's spawn and its watchdog's stop use: a pipe whose writer
// neither writes nor closes is not readable by the deadline, and is once the writer closes it; a
// child that outlives the deadline is killed and reaped, one that exits first is only reaped.
TEST(Os, BoundedWaitsEndAtTheirDeadline) {
  using Clock = std::chrono::steady_clock;
  int p[2];
  ASSERT_EQ(pipe_cloexec(p), 0);
  auto t0 = Clock::now();
  EXPECT_FALSE(wait_readable_until(p[0], t0 + std::chrono::milliseconds(50)));
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(50));
  ::close(p[1]);
  EXPECT_TRUE(wait_readable_until(p[0], Clock::now() + std::chrono::seconds(10)));  // end of file
  ::close(p[0]);

  const pid_t sleeper = ::fork();
  ASSERT_GE(sleeper, 0);
  if (sleeper == 0) {
    ::pause();
    ::_exit(0);
  }
  bool killed = false;
  t0 = Clock::now();
  int st = wait_child_until(sleeper, t0 + std::chrono::milliseconds(50), &killed);
  EXPECT_TRUE(killed);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20));

  const pid_t quick = ::fork();
  ASSERT_GE(quick, 0);
  if (quick == 0) ::_exit(7);
  st = wait_child_until(quick, Clock::now() + std::chrono::seconds(20), &killed);
  EXPECT_FALSE(killed);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7) << st;
}

// A listening socket made with a backlog of 1 takes a burst of 64 connections once its backlog is
// raised: none is accepted meanwhile, so with the backlog it had most would wait for a SYN-ACK
// (Linux drops a SYN while the accept queue is full) past the 3 s they are given here.
TEST(Os, RaisingTheListenBacklogLetsABurstOfClientsConnect) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(ls, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  ASSERT_EQ(::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &n), 0);
  ASSERT_EQ(::listen(ls, 1), 0);
  const int port = ntohs(a.sin_port);
  EXPECT_EQ(raise_listen_backlog(port + 1 == 65536 ? port - 1 : port + 1, 128), 0);  // another port: none
  EXPECT_EQ(raise_listen_backlog(port, 128), 1);
  std::vector<pollfd> clients;
  for (int i = 0; i < 64; ++i) {
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(c, 0);
    clients.push_back({c, POLLOUT, 0});
    ASSERT_TRUE(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 || errno == EINPROGRESS) << std::strerror(errno);
  }
  // Each client once it is connected (writable, no error), within 3 s for them all.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int connected = 0;
  while (connected < 64 && std::chrono::steady_clock::now() < deadline) {
    if (::poll(clients.data(), clients.size(), 100) < 0) break;
    for (pollfd& p : clients) {
      if (p.fd < 0 || !(p.revents & (POLLOUT | POLLERR | POLLHUP))) continue;
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(p.fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) ++connected;
      ::close(p.fd);
      p.fd = -1;  // poll skips it from now on
    }
  }
  EXPECT_EQ(connected, 64);
  for (const pollfd& p : clients) {
    if (p.fd >= 0) ::close(p.fd);
  }
  ::close(ls);
}

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
    const bool named = name_this_process("kvsnap-lifeline");
    (void)!::write(up[1], named ? "y" : "n", 1);
    for (;;) ::pause();
  }
  ::close(up[1]);
  char c = 0;
  ASSERT_EQ(::read(up[0], &c, 1), 1);
  ::close(up[0]);
  if (c == 'n') {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    GTEST_SKIP() << "this build (" << os_branch() << ") names no process: the watchdog shows as its parent's name";
  }
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

// A write to a pipe nobody reads, with SIGPIPE's default action (end the process), in a child:
// with the guard, inside it the write is EPIPE, and after it nothing is pending and the old mask
// is back (exit 0); without, SIGPIPE ends the child.
[[noreturn]] void write_to_a_closed_pipe(bool guarded) {
  signal(SIGPIPE, SIG_DFL);
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_UNBLOCK, &pipe_only, nullptr);  // whatever mask the test runner had
  int fds[2];
  if (pipe(fds) != 0) _exit(2);
  close(fds[0]);
  const char byte = 'x';
  if (guarded) {
    const ScopedSigpipeBlock guard;
    if (write(fds[1], &byte, 1) != -1 || errno != EPIPE) _exit(3);
  } else {
    (void)!write(fds[1], &byte, 1);
  }
  sigset_t pending;
  sigset_t mask;
  sigpending(&pending);
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  _exit(sigismember(&pending, SIGPIPE) || sigismember(&mask, SIGPIPE) ? 4 : 0);
}

TEST(OsDeathTest, ASigpipeInsideTheGuardIsEpipeNotDeath) {
  EXPECT_EXIT(write_to_a_closed_pipe(true), ::testing::ExitedWithCode(0), "");
}

TEST(OsDeathTest, WithoutTheGuardTheSameWriteEndsTheProcess) {  // so the test above can fail
  EXPECT_EXIT(write_to_a_closed_pipe(false), ::testing::KilledBySignal(SIGPIPE), "");
}

// The ephemeral range is the kernel's own (Linux), and a child's port is picked outside it, at
// least 10000, and binds: no bind() to port 0 or outgoing connection elsewhere can be given it
// between the pick and the child's bind.
TEST(Os, AChildsLoopbackPortIsOutsideTheEphemeralRangeAndBinds) {
  const PortRange eph = ephemeral_port_range();
  ASSERT_LE(eph.first, eph.last);
#if defined(KVSNAP_OS_LINUX)
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0, last = 0;
  ASSERT_TRUE(f >> first >> last);
  EXPECT_EQ(eph.first, first);
  EXPECT_EQ(eph.last, last);
#endif
  for (int i = 0; i < 20; ++i) {
    const int port = free_loopback_port();
    ASSERT_GT(port, 0);
    EXPECT_GE(port, 10000);
    EXPECT_TRUE(port < eph.first || port > eph.last) << port << " is in " << eph.first << "-" << eph.last;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << port << ": " << std::strerror(errno);
    ::close(fd);
  }
  EXPECT_EQ(free_loopback_port(0), -1);  // no candidate tried: none found
}

// A port whose last connection is in TIME_WAIT is not free: a server without SO_REUSEADDR (kvsnap
// serve's listener sets SO_REUSEPORT alone) may fail to bind it.
TEST(Os, APortInTimeWaitIsNotFree) {
  const auto loopback = [](int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    return a;
  };
  // The listener sets SO_REUSEADDR, as most servers do; the connection it accepts inherits it,
  // and so does that connection's TIME_WAIT, which another SO_REUSEADDR socket may then bind over.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  const int one = 1;
  ASSERT_EQ(::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
  sockaddr_in a = loopback(0);
  socklen_t n = sizeof a;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &n), 0);
  const int port = ntohs(a.sin_port);
  ASSERT_EQ(::listen(listener, 1), 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  const sockaddr_in to = loopback(port);
  ASSERT_EQ(::connect(client, reinterpret_cast<const sockaddr*>(&to), sizeof to), 0);
  const int served = ::accept(listener, nullptr, nullptr);
  ASSERT_GE(served, 0);
  ::close(listener);
  ::close(served);  // the server's side closes first: its end (127.0.0.1:port) goes to TIME_WAIT
  char byte;
  EXPECT_EQ(::read(client, &byte, 1), 0);  // the server's FIN has arrived
  ::close(client);
  // Only the TIME_WAIT socket holds the port now: a bind with SO_REUSEADDR succeeds (the old
  // check), one without does not.
  bool reuse_binds = false;
  for (int i = 0; i < 100 && !reuse_binds; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const sockaddr_in at = loopback(port);
    reuse_binds = ::bind(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0;
    ::close(fd);
    if (!reuse_binds) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(reuse_binds) << "port " << port << " still held by more than a TIME_WAIT socket";
  EXPECT_FALSE(loopback_port_is_free(port)) << port;
}

}  // namespace
}  // namespace kvsnap
