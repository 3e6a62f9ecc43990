// serve/lifeline.h and serve/supervisor.h: a SIGKILLed supervisor's child does not outlive it, with the
// lifeline watchdog alone (the macOS path), with Linux's parent-death signal alone, and with both; a
// child that ignores SIGTERM (llama-server losing one) is SIGKILLed; a restarted child (forked by the
// monitor thread) is guarded too; a stop leaves no watchdog and the pipe reaches no child.
//
// The child is `sleep`, not llama-server (an empty health_url: running is healthy). The process that
// runs the supervisor is forked from the test and SIGKILLed; the test makes itself the subreaper of its
// descendants, so the orphaned child and watchdog come back to it and their ends can be waited for.
#include "serve/lifeline.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/os.h"
#include "serve/supervisor.h"

namespace kvsnap {
namespace {

using Clock = std::chrono::steady_clock;
const std::vector<std::string> kSleeper = {"sleep", "1000"};
// llama-server 3.22.1 can lose a SIGTERM (docs/serve.md, "Shutdown"): a child that ignores it, and
// says so by making `ready` (before that a SIGTERM still ends it).
std::vector<std::string> deaf(const std::string& ready) {
  return {"sh", "-c", "trap '' TERM; : > '" + ready + "'; exec sleep 1000"};
}
std::string ready_file(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("kvsnap-lifeline-") + name + "-" +
                                                    std::to_string(getpid()))).string();
}
constexpr double kBoundS = 60;  // "dies at all": far above the 0.3 s grace, for a loaded machine

struct Guards {
  bool lifeline = true;
  bool pdeathsig = true;
  bool restart_first = false;  // the child the test kills is the monitor thread's restart
  std::string ready;           // a file the child makes once it is set up
};
Guards lifeline_alone() {
  Guards g;
  g.pdeathsig = false;
  return g;
}
Guards pdeathsig_alone() {
  Guards g;
  g.lifeline = false;
  return g;
}
Guards restarted(Guards g) {
  g.restart_first = true;
  return g;
}

SupervisorOptions options(const std::vector<std::string>& argv, Guards g) {
  SupervisorOptions o;
  o.argv = argv;
  o.lifeline = g.lifeline;
  o.parent_death_signal = g.pdeathsig;
  o.lifeline_grace_s = 0.3;
  o.restart_pause_s = 0.05;
  o.stop_timeout_s = 5;
  return o;
}

// How `pid` ended: its wait status when the test could reap it (subreaper), -1 when only its absence
// was seen, nullopt when it still runs after `seconds`.
std::optional<int> wait_gone(pid_t pid, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int st = 0;
    const pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && kill(pid, 0) != 0 && errno == ESRCH) return -1;  // not ours (no subreaper): gone
    if (Clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct Orphans {
  pid_t child = 0, watchdog = 0;
};

// Forks a process that runs a Supervisor over `argv` and reports its child's and watchdog's pids,
// SIGKILLs that process and answers the two it left.
Orphans kill_supervisor(const std::vector<std::string>& argv, Guards g) {
  int up[2];
  EXPECT_EQ(pipe(up), 0);
  const pid_t host = fork();
  if (host == 0) {
    close(up[0]);
    Supervisor sup(options(argv, g), [](const std::string&) {});
    if (!sup.start().ok()) _exit(2);
    if (g.restart_first) {
      const pid_t first = sup.pid();
      kill(first, SIGKILL);
      while (sup.restarts() < 1 || !sup.healthy() || sup.pid() == first || sup.pid() <= 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    while (!g.ready.empty() && !std::filesystem::exists(g.ready))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int32_t pids[2] = {sup.pid(), sup.lifeline_pid()};
    (void)!write(up[1], pids, sizeof pids);
    for (;;) pause();
  }
  close(up[1]);
  int32_t pids[2] = {0, 0};
  // Bounded: a host stuck before it reports (a fork under qemu-user can be) fails the test.
  ssize_t n = -1;
  if (wait_readable_until(up[0], std::chrono::steady_clock::now() + std::chrono::seconds(120))) {
    n = read(up[0], pids, sizeof pids);
  } else {
    ADD_FAILURE() << "the supervisor's host process did not report within 120 s";
  }
  close(up[0]);
  kill(host, SIGKILL);
  waitpid(host, nullptr, 0);
  EXPECT_EQ(n, static_cast<ssize_t>(sizeof pids)) << "the supervisor did not start its child";
  return {pids[0], pids[1]};
}

// The child's end after its supervisor was SIGKILLed; the watchdog (when there is one) ends too.
void expect_child_ends_by(const Orphans& o, int sig) {
  ASSERT_GT(o.child, 0);
  const auto st = wait_gone(o.child, kBoundS);
  ASSERT_TRUE(st.has_value()) << "the child " << o.child << " outlived its SIGKILLed supervisor";
  if (*st >= 0) {
    EXPECT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == sig)
        << "the child ended with wait status " << *st << ", not by " << strsignal(sig);
  }
  if (o.watchdog > 0) {
    EXPECT_TRUE(wait_gone(o.watchdog, kBoundS).has_value()) << "the watchdog stays";
  }
}

class ServeLifeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Orphans come back to the test (Linux). Elsewhere the test sees only that they are gone.
    (void)become_subreaper();
  }
};

TEST_F(ServeLifeline, SigkilledSupervisorsChildGetsSigtermFromTheLifelineAlone) {
  const Orphans o = kill_supervisor(kSleeper, lifeline_alone());
  EXPECT_GT(o.watchdog, 0);
  expect_child_ends_by(o, SIGTERM);
}

TEST_F(ServeLifeline, SigkilledSupervisorsChildGetsSigtermFromTheParentDeathSignalAlone) {
  if (!has_parent_death_signal()) GTEST_SKIP() << "no parent-death signal on this system: the lifeline is the guard";
  const Orphans o = kill_supervisor(kSleeper, pdeathsig_alone());
  EXPECT_EQ(o.watchdog, 0);
  expect_child_ends_by(o, SIGTERM);
}

TEST_F(ServeLifeline, SigkilledSupervisorsChildGetsSigtermWithBothGuards) {
  expect_child_ends_by(kill_supervisor(kSleeper, {}), SIGTERM);
}

TEST_F(ServeLifeline, AChildThatIgnoresSigtermIsKilledAfterTheGrace) {
  for (const Guards& g : {lifeline_alone(), Guards()}) {
    Guards deaf_child = g;
    deaf_child.ready = ready_file("deaf");
    std::filesystem::remove(deaf_child.ready);
    expect_child_ends_by(kill_supervisor(deaf(deaf_child.ready), deaf_child), SIGKILL);
    std::filesystem::remove(deaf_child.ready);
  }
}

TEST_F(ServeLifeline, ARestartedChildIsGuardedByEachGuard) {
  // The restart is forked by the monitor thread, which dies with the supervisor's process.
  expect_child_ends_by(kill_supervisor(kSleeper, restarted(lifeline_alone())),
                       SIGTERM);
  if (has_parent_death_signal())
    expect_child_ends_by(kill_supervisor(kSleeper, restarted(pdeathsig_alone())),
                         SIGTERM);
}

// The readlink()s of a process's descriptors ("pipe:[1234]"); empty where there is no /proc.
std::vector<std::string> fd_links(pid_t pid) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec) out.push_back(target.string());
  }
  return out;
}

// Restarts happen on the monitor thread: the test waits for them.
bool eventually(const std::function<bool()>& cond) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!cond()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST_F(ServeLifeline, TheWatchdogHoldsOnlyThePipeJoinsTheChildsGroupAndStopLeavesNothing) {
  Supervisor sup(options(kSleeper, {}), [](const std::string&) {});
  ASSERT_TRUE(sup.start().ok());
  const pid_t child = sup.pid(), dog = sup.lifeline_pid();
  ASSERT_GT(child, 0);
  ASSERT_GT(dog, 0);
  EXPECT_EQ(getpgid(dog), child) << "the watchdog is not in the child's group";
  if (std::filesystem::exists("/proc/self/fd")) {
    const auto dog_fds = fd_links(dog);
    ASSERT_EQ(dog_fds.size(), 1u) << "the watchdog keeps descriptors of the supervisor's";
    EXPECT_EQ(dog_fds[0].rfind("pipe:", 0), 0u) << dog_fds[0];
    for (const auto& l : fd_links(child)) EXPECT_NE(l, dog_fds[0]) << "the child holds the lifeline pipe";
  }
  sup.stop();
  EXPECT_EQ(sup.lifeline_pid(), 0);
  errno = 0;
  EXPECT_NE(kill(dog, 0), 0);  // reaped: not even a zombie
  EXPECT_EQ(errno, ESRCH);
  EXPECT_NE(kill(child, 0), 0);
}

TEST_F(ServeLifeline, TheWatchdogFollowsARestartAndAKilledWatchdogIsReplaced) {
  std::mutex mu;
  std::string log;
  Supervisor sup(options(kSleeper, {}), [&](const std::string& line) {
    std::lock_guard<std::mutex> l(mu);
    log += line + "\n";
  });
  ASSERT_TRUE(sup.start().ok());
  const pid_t first = sup.pid(), dog = sup.lifeline_pid();
  ASSERT_EQ(getpgid(dog), first);
  kill(first, SIGKILL);  // an unexpected death: the monitor reports it and starts the child again
  ASSERT_TRUE(eventually([&] { return sup.restarts() == 1 && sup.healthy(); }));
  const pid_t second = sup.pid();
  EXPECT_NE(second, first);
  EXPECT_EQ(sup.lifeline_pid(), dog);
  EXPECT_EQ(getpgid(dog), second) << "the watchdog still guards the old group";
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_NE(log.find("(pid " + std::to_string(first) + ") was killed by signal"), std::string::npos) << log;
  }

  // The child's whole group SIGKILLed (as kvsnap does to a child that will not stop) takes the
  // watchdog with it; the next child gets a new one.
  kill(-second, SIGKILL);
  ASSERT_TRUE(eventually([&] { return sup.restarts() == 2 && sup.healthy(); }));
  const pid_t third = sup.pid(), dog2 = sup.lifeline_pid();
  EXPECT_GT(dog2, 0);
  EXPECT_NE(dog2, dog);
  EXPECT_EQ(getpgid(dog2), third);
  sup.stop();
  EXPECT_NE(kill(dog2, 0), 0);
}

// stop() while the monitor restarts a child that keeps exiting: whenever stop() comes (before the
// fork, while the new child's pid is not yet set, just as it turns healthy), it returns, and this
// process is left with no child at all, running or unreaped (waitpid(-1) says ECHILD). stop()
// signals only the pid it finds; a child started after it looked was left running, or unreaped
// while stop() waited for it forever.
TEST_F(ServeLifeline, StopDuringRestartsEndsAndReapsEveryChild) {
  pid_t r;
  while ((r = waitpid(-1, nullptr, WNOHANG)) > 0) {
  }
  if (r == 0) GTEST_SKIP() << "an earlier test left a child of this process running: no child count to check";
  std::mt19937 rng(11);
  for (int round = 0; round < 300; ++round) {
    SupervisorOptions o = options({"sh", "-c", "exec sleep 0.002"}, {});
    o.restart_pause_s = 0.0005;
    o.lifeline = false;
    o.parent_death_signal = false;  // it would end a child whose monitor thread returned: hide nothing
    Supervisor sup(o, [](const std::string&) {});
    ASSERT_TRUE(sup.start().ok());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 12000));
    std::atomic<bool> stopped{false};
    std::thread stopper([&] {
      sup.stop();
      stopped = true;
    });
    // Beyond every bound stop() waits within (a child's exec 30 s, its stop_timeout_s): a stop()
    // still running then hangs, and the stopper thread holds `sup`: nothing to return to.
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (!stopped && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (!stopped) {
      std::fprintf(stderr, "ServeLifeline.StopDuringRestartsEndsAndReapsEveryChild: round %d: stop() hangs\n", round);
      std::abort();
    }
    stopper.join();
    errno = 0;
    r = waitpid(-1, nullptr, WNOHANG);
    ASSERT_TRUE(r == -1 && errno == ECHILD)
        << "round " << round << ": a child is left " << (r == 0 ? "running" : "unreaped");
  }
}

TEST_F(ServeLifeline, AChildThatExitsBeforeHealthFailsStartAndStopReturns) {
  // stop() (the destructor) used to wait for a monitor that never ran: kvsnap serve hung on a model
  // llama-server could not load.
  SupervisorOptions o = options({"sh", "-c", "exit 3"}, {});
  o.health_url = "http://127.0.0.1:1";  // never asked: the child is gone first
  Supervisor sup(o, [](const std::string&) {});
  const Status s = sup.start();
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.ToString().find("exited with status 3 before answering /health"), std::string::npos) << s.ToString();
  EXPECT_EQ(sup.pid(), 0);
  EXPECT_EQ(sup.lifeline_pid(), 0);
  sup.stop();
}

TEST_F(ServeLifeline, AChildStuckBeforeExecIsKilledAndStartSaysWhy) {
  // The child opens its log file between fork and exec; a FIFO nobody reads holds that open for
  // ever (as a log file on a hung network mount would). start() used to wait for the exec without
  // end, and stop() (the destructor) behind it.
  const std::string fifo = ::testing::TempDir() + "kvsnap-lifeline-stuck-" + std::to_string(getpid()) + ".fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  SupervisorOptions o = options(kSleeper, {});
  o.log_path = fifo;
  o.exec_timeout_s = 1;
  Supervisor sup(o, [](const std::string&) {});
  const auto t0 = Clock::now();
  const Status s = sup.start();
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.ToString().find("did not reach exec within 1 s (it opens its log file " + fifo + " before exec); it was killed"),
            std::string::npos)
      << s.ToString();
  EXPECT_LT(took, 30.0);
  EXPECT_EQ(sup.pid(), 0);
  sup.stop();
  errno = 0;
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << "a child is left";  // the stuck child was reaped
  ::unlink(fifo.c_str());
}

TEST_F(ServeLifeline, GivingUpWhileTheChildLoadsEndsItAndStartSaysInterrupted) {
  // kvsnap serve's Ctrl-C during a model load: the child never answers /health (nothing listens on
  // port 1); start() asks give_up between polls and, once it says so, ends and reaps the child.
  SupervisorOptions o = options(kSleeper, {});
  o.health_url = "http://127.0.0.1:1";
  o.start_timeout_s = 600;
  Supervisor sup(o, [](const std::string&) {});
  int asked = 0;
  const auto t0 = Clock::now();
  const Status s = sup.start([&asked] { return ++asked == 3; });
  EXPECT_EQ(s.code(), Code::kInterrupted) << s.ToString();
  EXPECT_NE(s.ToString().find("stopped while sleep was loading"), std::string::npos) << s.ToString();
  EXPECT_EQ(asked, 3);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), kBoundS);
  EXPECT_EQ(sup.pid(), 0);
  EXPECT_EQ(sup.lifeline_pid(), 0);
  errno = 0;
  const pid_t r = waitpid(-1, nullptr, WNOHANG);
  EXPECT_TRUE(r == -1 && errno == ECHILD) << "a child is left " << (r == 0 ? "running" : "unreaped");
  sup.stop();
}

TEST_F(ServeLifeline, AProgramThatCannotStartIsAnErrorNamingIt) {
  Supervisor sup(options({"kvsnap-no-such-program"}, {}), [](const std::string&) {});
  const Status s = sup.start();
  EXPECT_EQ(s.code(), Code::kIOError);
  EXPECT_NE(s.ToString().find("cannot start kvsnap-no-such-program"), std::string::npos) << s.ToString();
  EXPECT_EQ(sup.lifeline_pid(), 0);
}

}  // namespace
}  // namespace kvsnap
