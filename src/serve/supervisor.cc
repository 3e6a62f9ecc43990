#include "serve/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/os.h"
#include "server/llama_server.h"

namespace kvsnap {

namespace {

using Clock = std::chrono::steady_clock;

std::string describe_exit(int st) {
  if (WIFEXITED(st)) return "exited with status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("was killed by signal ") + strsignal(WTERMSIG(st));
  return "stopped";
}

}  // namespace

Supervisor::Supervisor(SupervisorOptions o, std::function<void(const std::string&)> log)
    : o_(std::move(o)), log_(std::move(log)), lifeline_(o_.lifeline_grace_s) {}

Supervisor::~Supervisor() { stop(); }

Result<pid_t> Supervisor::spawn() {
  // fork + exec rather than posix_spawn: the child must ask for a signal when kvsnap dies (below),
  // which posix_spawn cannot. Everything the child needs is made before fork (kvsnap has threads:
  // between fork and exec the child calls only async-signal-safe functions).
  std::vector<char*> args;
  for (auto& a : o_.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const char* log_path = o_.log_path.empty() ? nullptr : o_.log_path.c_str();
  if (o_.lifeline) KV_RETURN_IF_ERROR(lifeline_.start());  // again if the previous watchdog died
  const bool pdeathsig = o_.parent_death_signal;
  int report[2];  // the child writes errno here when it cannot exec; closed on exec
  if (const int e = pipe_cloexec(report); e != 0) {
    return Status::IOError(std::string("cannot make a pipe: ") + std::strerror(e));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(report[0]);
    close(report[1]);
    return Status::IOError("cannot start " + o_.argv[0] + ": fork: " + std::strerror(e));
  }
  if (pid == 0) {
    auto fail = [&](int e) {
      (void)!write(report[1], &e, sizeof e);
      _exit(127);
    };
    // A SIGKILLed kvsnap cannot stop its child. On Linux the kernel sends SIGTERM instead, when the
    // thread that forked it exits (spawn() runs on the thread that start()s and on the monitor
    // thread, both of which live as long as their child). If kvsnap died before the request, exit
    // now.
    if (pdeathsig) {
      if (const int e = request_parent_death_signal(parent, SIGTERM); e == ESRCH) {
        _exit(1);
      } else if (e != 0) {
        fail(e);
      }
    }
    // Its own process group (a Ctrl-C at the terminal reaches kvsnap, which stops it in order).
    if (setpgid(0, 0) != 0) fail(errno);
    // The lifeline watchdog joins that group and stops it when kvsnap dies, on every system. Told
    // before exec, so no code of llama-server's runs unguarded; a watchdog that died meanwhile is an
    // EPIPE here, not a SIGPIPE.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, nullptr);
    lifeline_.announce(getpid());
    // The signals kvsnap blocks or ignores restored to their defaults.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (log_path) {
      const int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0 || dup2(fd, 1) < 0 || dup2(1, 2) < 0) fail(errno);
      if (fd > 2) close(fd);
    }
    execvp(args[0], args.data());
    fail(errno);
  }
  close(report[1]);
  // The pipe closes at exec (or carries errno). Bounded: a child stuck before exec (its log file
  // on a hung network mount; under qemu-user, a fork from a process with threads) would otherwise
  // hold this thread, and stop() behind it, for ever.
  const bool reported = wait_readable_until(
      report[0], Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.exec_timeout_s)));
  int e = 0;
  ssize_t n = -1;
  while (reported && (n = read(report[0], &e, sizeof e)) < 0 && errno == EINTR) {
  }
  close(report[0]);
  if (!reported) {
    bool killed = false;
    (void)wait_child_until(pid, Clock::now(), &killed);
    const std::string log = o_.log_path.empty() ? "" : " (it opens its log file " + o_.log_path + " before exec)";
    return Status::IOError("cannot start " + o_.argv[0] + ": it did not reach exec within " +
                           std::to_string(int(o_.exec_timeout_s)) + " s" + log + "; it was killed");
  }
  if (n > 0) {
    waitpid(pid, nullptr, 0);
    return Status::IOError("cannot start " + o_.argv[0] + ": " + std::strerror(e));
  }
  if (o_.lifeline) {
    if (Status g = lifeline_.guard(pid); !g.ok()) log_(g.ToString() + "; " + o_.argv[0] + " runs on without it");
  }
  return pid;
}

Status Supervisor::wait_healthy(pid_t pid, const std::function<bool()>& give_up) {
  if (o_.health_url.empty()) return Status::OK();  // nothing to ask: running is healthy
  LlamaServer srv({o_.health_url, o_.api_key, 2.0});
  const auto deadline = Clock::now() + std::chrono::duration<double>(o_.start_timeout_s);
  const std::string where = o_.log_path.empty() ? "its output above" : o_.log_path;
  while (Clock::now() < deadline) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid)
      return Status::IOError(o_.argv[0] + " " + describe_exit(st) + " before answering /health; see " + where);
    // /health says the model is loaded; /slots is answered by the task loop, so then a SIGTERM is
    // no longer lost (llama-server 3.22.1 drops one that comes before the loop has started).
    if (srv.health().ok() && srv.slots().ok()) return Status::OK();
    if (stopping_) return Status::Interrupted("stopping");
    if (give_up && give_up()) return Status::Interrupted("stopped while " + o_.argv[0] + " was loading");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return Status::IOError(o_.argv[0] + " did not answer /health within " + std::to_string(int(o_.start_timeout_s)) +
                         " s; see " + where);
}

Status Supervisor::start(const std::function<bool()>& give_up) {
  auto spawned = spawn();
  if (!spawned.ok()) {
    lifeline_.stop();
    return spawned.status();
  }
  const pid_t pid = *spawned;
  pid_ = pid;
  log_("started " + o_.argv[0] + " (pid " + std::to_string(pid) + ") on " + o_.health_url +
       (lifeline_.pid() > 0 ? "; lifeline watchdog pid " + std::to_string(lifeline_.pid()) : ""));
  if (Status h = wait_healthy(pid, give_up); !h.ok()) {
    // wait_healthy reaped a child that exited or stayed unhealthy; one interrupted by stop() or
    // `give_up` is ours to end. No monitor runs yet: stop() must find nothing to wait for.
    if (h.code() == Code::kInterrupted) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      pid_ = 0;
    }
    cv_.notify_all();
    lifeline_.stop();
    return h;
  }
  healthy_ = true;
  log_(o_.argv[0] + " is healthy");
  monitor_ = std::thread([this] { monitor(); });
  return Status::OK();
}

void Supervisor::monitor() {
  for (;;) {
    const pid_t pid = pid_;
    int st = 0;
    pid_t r;
    while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR) {
    }
    // Not ours any more (cannot happen: only this thread reaps). Returning ends this thread, which
    // on Linux sends the parent-death signal to a child it forked.
    if (r != pid) return;
    healthy_ = false;
    if (on_exit_ && !stopping_) on_exit_();
    std::vector<std::string> next;
    {
      std::lock_guard<std::mutex> l(mu_);
      pid_ = 0;
      if (replace_.asked) next = replace_.argv;
    }
    cv_.notify_all();
    if (stopping_) return;
    Status replaced = Status::OK();
    const bool replacing = !next.empty();
    if (replacing && try_replacement(next, replaced)) {
      log_("started " + o_.argv[0] + " with the new arguments (pid " + std::to_string(pid_) + ")");
    } else {
      if (!replacing)
        log_(o_.argv[0] + " (pid " + std::to_string(pid) + ") " + describe_exit(st) + " unexpectedly: restarting it");
      restart_loop();
      if (stopping_) {
        // Healthy just as stop() signalled it: still this thread's to reap (stop() waits for that).
        const pid_t now = pid_;
        if (now > 0) end_child_on_stop(now, false);
        return;
      }
      if (!replacing) ++restarts_;
      log_("restarted " + o_.argv[0] + " (pid " + std::to_string(pid_) + ")" +
           (replacing ? " with the previous arguments" : ", restart " + std::to_string(restarts_)));
    }
    healthy_ = true;
    if (on_restart_) on_restart_();
    if (replacing) {
      std::lock_guard<std::mutex> l(mu_);
      replace_.asked = false;
      replace_.done = true;
      replace_.result = replaced;
      cv_.notify_all();
    }
  }
}

// The new command line, started now; false (with `result` saying why) when it does not become healthy.
bool Supervisor::try_replacement(const std::vector<std::string>& argv, Status& result) {
  std::vector<std::string> previous;
  {
    std::lock_guard<std::mutex> l(mu_);
    previous = o_.argv;
    o_.argv = argv;
  }
  auto np = spawn();
  Status h = np.ok() ? Status::OK() : np.status();
  if (np.ok()) {
    {
      std::lock_guard<std::mutex> l(mu_);
      pid_ = *np;
    }
    h = stopping_ ? Status::Interrupted("stopping") : wait_healthy(*np);
    if (stopping_) {
      end_child_on_stop(*np, !h.ok() && h.code() != Code::kInterrupted);
      result = Status::Interrupted("kvsnap serve is stopping");
      return false;
    }
  }
  if (h.ok()) return true;
  {
    std::lock_guard<std::mutex> l(mu_);
    pid_ = 0;
    o_.argv = previous;
  }
  cv_.notify_all();
  result = h;
  log_("the new arguments failed (" + h.ToString() + "): starting the previous ones again");
  return false;
}

// A child this thread started while stop() runs: stop() signals only the pid it finds, so one set
// after it looked was never signalled, and one it signalled is still this thread's to reap (the only
// reaper; stop() waits for pid_ to go back to 0). `reaped`: wait_healthy already did.
void Supervisor::end_child_on_stop(pid_t pid, bool reaped) {
  if (!reaped) {
    kill(-pid, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::duration<double>(o_.stop_timeout_s);
    pid_t r;
    while ((r = waitpid(pid, nullptr, WNOHANG)) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (r == 0) {
      log_(o_.argv[0] + " did not stop within " + std::to_string(int(o_.stop_timeout_s)) + " s: SIGKILL");
      kill(-pid, SIGKILL);
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    pid_ = 0;
  }
  cv_.notify_all();
}

// Starts o_.argv again after a pause, until it is healthy or stop() is called.
void Supervisor::restart_loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      if (cv_.wait_for(l, std::chrono::duration<double>(o_.restart_pause_s), [this] { return stopping_.load(); }))
        return;
    }
    auto np = spawn();
    if (!np.ok()) {
      log_(np.status().ToString());
      continue;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      pid_ = *np;
    }
    Status h = stopping_ ? Status::Interrupted("stopping") : wait_healthy(*np);
    if (stopping_) return end_child_on_stop(*np, !h.ok() && h.code() != Code::kInterrupted);
    if (h.ok()) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      pid_ = 0;
    }
    cv_.notify_all();
    if (stopping_) return;
    log_("restart failed: " + h.ToString());
  }
}

Status Supervisor::replace(std::vector<std::string> argv) {
  std::unique_lock<std::mutex> l(mu_);
  if (stopping_ || pid_ <= 0 || !healthy_)
    return Status::IOError(o_.argv[0] + " is not running now (restarting or stopping): try again");
  replace_ = {std::move(argv), true, false, Status::OK()};
  const pid_t pid = pid_;
  log_("stopping " + o_.argv[0] + " (pid " + std::to_string(pid) + ") to start it with new arguments");
  kill(-pid, SIGTERM);
  if (!cv_.wait_for(l, std::chrono::duration<double>(o_.stop_timeout_s), [&] { return pid_ != pid; })) {
    log_(o_.argv[0] + " did not stop within " + std::to_string(int(o_.stop_timeout_s)) + " s: SIGKILL");
    kill(-pid, SIGKILL);
  }
  cv_.wait(l, [this] { return replace_.done || stopping_.load(); });
  if (!replace_.done) return Status::Interrupted("kvsnap serve is stopping");
  replace_.done = false;
  return replace_.result;
}

std::vector<std::string> Supervisor::argv() {
  std::lock_guard<std::mutex> l(mu_);
  return o_.argv;
}

void Supervisor::stop() {
  if (stopping_.exchange(true)) {
    if (monitor_.joinable()) monitor_.join();
    return;
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> l(mu_);
  if (pid_ > 0) {
    const pid_t pid = pid_;
    log_("stopping " + o_.argv[0] + " (pid " + std::to_string(pid) + "): SIGTERM");
    kill(-pid, SIGTERM);
    if (!cv_.wait_for(l, std::chrono::duration<double>(o_.stop_timeout_s), [this] { return pid_ == 0; })) {
      log_(o_.argv[0] + " did not stop within " + std::to_string(int(o_.stop_timeout_s)) + " s: SIGKILL");
      kill(-pid, SIGKILL);
      cv_.wait(l, [this] { return pid_ == 0; });
    }
  }
  l.unlock();
  if (monitor_.joinable()) monitor_.join();
  lifeline_.stop();  // the child is reaped: the watchdog exits without signalling
}

}  // namespace kvsnap
