// The lifeline: a watchdog process that stops llama-server when kvsnap dies, however it dies (SIGKILL,
// a crash, the OOM killer), on every POSIX system. Linux's PR_SET_PDEATHSIG does this too, and stays
// as a second guard there; macOS and the BSDs have nothing like it (docs/portability.md).
//
// How: kvsnap holds the write end of a pipe (close-on-exec: no child it starts inherits it); the
// watchdog, forked from kvsnap, holds the read end and no other descriptor. Each child, between its
// fork and its exec, writes its pid into the pipe; the watchdog then joins that child's process group,
// so the group's number cannot be given to another process while the watchdog may still signal it
// (POSIX: a pid is not reused while a process group of that number exists). When kvsnap dies the
// kernel closes its descriptors and read() answers end-of-file: the watchdog sends SIGTERM to the
// group, waits up to `grace_s` for the child to go, then SIGKILLs the group (itself included). The
// SIGKILL matters: llama-server 3.22.1 loses a SIGTERM that comes while its task loop starts
// (docs/serve.md, "Shutdown"). One watchdog serves every child, forked with the first one (again only
// if it died), while kvsnap is still small: it keeps few of kvsnap's pages alive copy-on-write.
//
// Promises:
//   - start() forks the watchdog (again when the previous one has died: someone killed it, or a
//     SIGKILL kvsnap sent to the child's group reached it too); pid() names it;
//   - announce() is async-signal-safe: the child calls it between fork and exec, so the watchdog
//     knows the child before any of its own code runs;
//   - guard() returns once the watchdog is in the child's group (seen with getpgid): a watchdog
//     that was dying (a SIGKILL to the previous child's group) is replaced and told again;
//   - the watchdog ignores SIGTERM, SIGINT and SIGHUP (kvsnap stops its child by signalling the
//     child's group, which the watchdog is in), touches nothing of kvsnap's (it closes every other
//     descriptor and never returns into kvsnap's code) and is named `kvsnap-lifeline` on Linux;
//   - stop() tells it to exit without signalling anything and reaps it: call it once the child is
//     stopped and reaped.
#pragma once

#include <sys/types.h>

#include <atomic>

#include "base/status.h"

namespace kvsnap {

class Lifeline {
 public:
  explicit Lifeline(double grace_s) : grace_s_(grace_s) {}
  ~Lifeline() { stop(); }
  Lifeline(const Lifeline&) = delete;
  Lifeline& operator=(const Lifeline&) = delete;

  // Forks the watchdog unless one is running. Not thread-safe: one thread starts children at a time.
  Status start();
  // Child side, between fork and exec: asks the watchdog to guard `self`'s process group (the child
  // has made it with setpgid(0, 0) before). Does nothing when no watchdog runs.
  void announce(pid_t self) const;
  // Parent side, once the child has exec'd: OK when a live watchdog is in `child`'s group, else an
  // error after `timeout_s` (the child runs on unguarded by the lifeline).
  Status guard(pid_t child, double timeout_s = 5);
  void stop();
  pid_t pid() const { return pid_.load(); }  // 0 when none runs; any thread

 private:
  bool reap_if_dead();

  double grace_s_;
  int fd_ = -1;   // the write end, kvsnap's only
  std::atomic<pid_t> pid_{0};  // the watchdog, a child of kvsnap until reaped
};

}  // namespace kvsnap
