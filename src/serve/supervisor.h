// llama-server as a child process: started in its own process group, waited
// for until /health answers, restarted when it dies without being asked to,
// stopped with SIGTERM and, after a grace period, SIGKILL.
//
// Promises:
//   - start() returns once the child answers /health (or with an error naming
//     the log file when it exits or stays unhealthy past the timeout);
//   - a child that dies unexpectedly is restarted by a monitor thread with the
//     same command line (after a pause, so a crash loop does not spin), and
//     the restart is counted and logged;
//   - stop() leaves no child process behind: SIGTERM to its process group,
//     SIGKILL after `stop_timeout_s`, and reaps it;
//   - a kvsnap killed with SIGKILL (or crashing) takes its child with it, on
//     every POSIX system: the lifeline watchdog (serve/lifeline.h) sends the
//     child's group SIGTERM, then SIGKILL after `lifeline_grace_s`; on Linux the
//     child also asks the kernel for SIGTERM at kvsnap's death (PR_SET_PDEATHSIG,
//     base/os.h request_parent_death_signal). The kernel sends that when the
//     *thread* that forked the child ends: start() must be called on a thread
//     that outlives the child (kvsnap serve's main thread); restarts are forked
//     by the monitor thread, which ends only in stop(), after the child;
//   - "healthy" means /health answers 200 and so does /slots: llama-server
//     answers /slots from its task loop, and a SIGTERM that comes before that
//     loop runs is lost (llama-server 3.22.1 sets its `running` flag when the
//     loop starts), so no stop is sent into that window. An empty `health_url`
//     makes a child healthy once it runs (a program without /health: tests);
//   - the child's stdout and stderr go to `log_path` (appended), or are
//     inherited when it is empty;
//   - replace() swaps the command line (a requantize): the child is stopped and
//     the new one started by the monitor thread, which starts every later child;
//     when the new one does not become healthy the previous command line is
//     started again and replace() answers the error: serving continues.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "serve/lifeline.h"

namespace kvsnap {

struct SupervisorOptions {
  std::vector<std::string> argv;  // the child's command line (argv[0] looked up in PATH)
  std::string health_url;         // "http://127.0.0.1:PORT"
  std::string api_key;            // for /health when the child wants one
  std::string log_path;           // empty: inherit stdout/stderr
  double start_timeout_s = 300;   // loading a large model takes a while
  double stop_timeout_s = 20;
  double restart_pause_s = 1;
  // From fork to exec: microseconds, unless the child is stuck (its log_path on a hung network
  // mount, a FIFO nobody reads); then it is killed and start() or the restart fails, named.
  double exec_timeout_s = 30;
  // The two guards against a child outliving a SIGKILLed kvsnap; both on by default. Turning
  // parent_death_signal off on Linux runs the lifeline alone, as on macOS (tests,
  // KVSNAP_SERVE_NO_PDEATHSIG). Systems without a parent-death signal ignore it.
  bool lifeline = true;
  double lifeline_grace_s = 5;  // SIGTERM to SIGKILL
  bool parent_death_signal = true;
};

class Supervisor {
 public:
  // `log` receives one line per event (started, died, restarted).
  Supervisor(SupervisorOptions o, std::function<void(const std::string&)> log);
  ~Supervisor();  // stop()

  // `give_up`, when set, is asked every 200 ms while the first child loads (a large model takes
  // minutes): true ends that child (SIGKILL: it holds nothing yet) and start() returns kInterrupted.
  // kvsnap serve passes a SIGINT/SIGTERM that came meanwhile, so Ctrl-C stops it during the load.
  Status start(const std::function<bool()>& give_up = nullptr);
  void stop();
  // Called when the child has ended and before the next one is started (not at stop(); a replace()
  // too): what was of its life (its slots, its settings) is over before a new one can answer.
  void on_exit(std::function<void()> f) { on_exit_ = std::move(f); }
  // Called after each restart once the new child is healthy (its slots are empty).
  void on_restart(std::function<void()> f) { on_restart_ = std::move(f); }
  // Stops the child and starts `argv` in its place; returns once a child is healthy again: OK with
  // the new one, else the error of the new one (the previous command line running again).
  // kIOError when the child is not running now (restarting, stopping).
  Status replace(std::vector<std::string> argv);
  std::vector<std::string> argv();

  pid_t pid() const { return pid_.load(); }
  pid_t lifeline_pid() const { return lifeline_.pid(); }  // 0 when none runs
  int restarts() const { return restarts_.load(); }
  bool healthy() const { return healthy_.load(); }

 private:
  Result<pid_t> spawn();
  Status wait_healthy(pid_t pid, const std::function<bool()>& give_up = nullptr);
  void monitor();
  void restart_loop();
  void end_child_on_stop(pid_t pid, bool reaped);
  bool try_replacement(const std::vector<std::string>& argv, Status& result);

  SupervisorOptions o_;
  std::function<void(const std::string&)> log_;
  std::function<void()> on_exit_, on_restart_;
  std::atomic<pid_t> pid_{0};
  std::atomic<int> restarts_{0};
  std::atomic<bool> healthy_{false}, stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread monitor_;
  Lifeline lifeline_;  // started and stopped by the thread that spawns: start(), then the monitor
  struct Replacement {
    std::vector<std::string> argv;
    bool asked = false, done = false;
    Status result;
  } replace_;  // guarded by mu_
};

}  // namespace kvsnap
