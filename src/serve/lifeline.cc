#include "serve/lifeline.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <string>

#include "base/os.h"

namespace kvsnap {

namespace {

// The pipe carries 4-byte messages (shorter than PIPE_BUF: each arrives whole): a child's pid to guard,
// or this one, "kvsnap stops on purpose: exit without signalling".
constexpr int32_t kStandDown = 0;
constexpr long kPollMs = 50;

void sleep_ms(long ms) {
  timespec t{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// The watchdog's whole life, in the process forked from kvsnap. kvsnap has threads, so only
// async-signal-safe calls here, and it never returns into kvsnap's code.
[[noreturn]] void watch(int fd, int fd_limit, long grace_ms) {
  name_this_process("kvsnap-lifeline");
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  // SIGTERM: kvsnap stops its child by signalling the child's group, which this process joins.
  // The terminal's signals reach it while it is still in kvsnap's group.
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) sigaction(s, &ign, nullptr);
  // Nothing of kvsnap's stays open here (its sockets, its store, the pipe's write end): a client or a
  // file kvsnap closes is closed.
  if (fd != 0 && dup2(fd, 0) != 0) _exit(1);
  close_fds_from(1, fd_limit);
  pid_t guarded = 0;
  for (;;) {
    int32_t msg = 0;
    const ssize_t n = read(0, &msg, sizeof msg);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof msg)) break;  // end of file: every copy of the write end is closed
    if (msg == kStandDown) _exit(0);
    // In the child's group the group's number stays ours to signal. A child that is gone already
    // (its exec failed and kvsnap reaped it) has no group to join: nothing to guard.
    guarded = setpgid(0, msg) == 0 ? msg : 0;
  }
  if (guarded <= 0) _exit(0);
  kill(-guarded, SIGTERM);
  for (long waited = 0; waited < grace_ms; waited += kPollMs) {
    if (kill(guarded, 0) != 0 && errno == ESRCH) break;  // gone and reaped by its new parent
    sleep_ms(kPollMs);
  }
  // A child that did not stop (or lost the SIGTERM) and whatever else is in its group, this process too.
  kill(-guarded, SIGKILL);
  _exit(0);
}

// write() of one message where the reader may be gone: EPIPE rather than a SIGPIPE that ends the caller
// (kvsnap serve ignores SIGPIPE; a program using the Supervisor may not).
void send(int fd, int32_t msg) {
  const ScopedSigpipeBlock no_sigpipe;
  while (write(fd, &msg, sizeof msg) < 0 && errno == EINTR) {
  }
}

}  // namespace

bool Lifeline::reap_if_dead() {
  const pid_t r = waitpid(pid_, nullptr, WNOHANG);
  if (r == 0 || (r < 0 && errno == EINTR)) return false;
  close(fd_);
  fd_ = -1;
  pid_ = 0;
  return true;
}

Status Lifeline::start() {
  if (pid_ > 0 && !reap_if_dead()) return Status::OK();
  int fds[2];
  if (const int e = pipe_cloexec(fds); e != 0)
    return Status::IOError(std::string("lifeline watchdog: cannot make a pipe: ") + std::strerror(e));
  const int fd_limit = open_fd_limit();  // before fork: getrlimit is not async-signal-safe
  const long grace_ms = grace_s_ <= 0 ? 0 : static_cast<long>(grace_s_ * 1000);
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(fds[0]);
    close(fds[1]);
    return Status::IOError(std::string("lifeline watchdog: fork: ") + std::strerror(e));
  }
  if (pid == 0) watch(fds[0], fd_limit, grace_ms);
  close(fds[0]);
  fd_ = fds[1];
  pid_ = pid;
  return Status::OK();
}

void Lifeline::announce(pid_t self) const {
  if (fd_ < 0) return;
  const int32_t msg = self;
  ssize_t n;
  while ((n = write(fd_, &msg, sizeof msg)) < 0 && errno == EINTR) {
  }
}

Status Lifeline::guard(pid_t child, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool told = false;
  for (;;) {
    // A watchdog that died (or dies now: the SIGKILL kvsnap sent the previous child's group reached
    // it) never joins: a new one is told. One with a SIGKILL pending runs no more code, so one seen
    // in the new group has none.
    if (pid_ <= 0 || reap_if_dead()) {
      KV_RETURN_IF_ERROR(start());
      told = false;
    }
    if (!told) {
      send(fd_, child);
      told = true;
    }
    if (getpgid(pid_) == child) return Status::OK();
    if (std::chrono::steady_clock::now() > deadline)
      return Status::IOError("lifeline watchdog (pid " + std::to_string(pid_.load()) + ") did not join the group of pid " +
                             std::to_string(child) + " within " + std::to_string(int(timeout_s)) + " s");
    sleep_ms(2);
  }
}

void Lifeline::stop() {
  if (pid_ <= 0 || reap_if_dead()) return;
  send(fd_, kStandDown);
  close(fd_);
  // It exits at once when told; one that cannot (stuck before it reads, as a fork under qemu-user
  // can be) is killed rather than waited for without end.
  bool killed = false;
  (void)wait_child_until(pid_, std::chrono::steady_clock::now() + std::chrono::seconds(10), &killed);
  fd_ = -1;
  pid_ = 0;
}

}  // namespace kvsnap
