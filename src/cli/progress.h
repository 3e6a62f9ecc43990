// Progress and Ctrl-C for the long commands (save, restore, convert, verify, export,
// import, gc, migrate).
//
// Nothing below the CLI knows about either. Every file the CLI opens goes through
// cli_io(), an Io that counts the bytes read and written and, once SIGINT, SIGTERM or SIGHUP
// has arrived, answers every further read or write with Code::kInterrupted. The
// operation then fails the way it fails on a disk error: atomic writers remove their
// temporaries, the catalog rolls back, and the process ends by the signal it got (a shell reports
// 130 for Ctrl-C) with nothing half-written. A second Ctrl-C kills the process at once (the
// default action).
//
// ProgressDisplay draws "what: done / total (pct) rate ETA" on stderr, redrawn in
// place, once the operation has run for a second, and clears it at the end; it draws
// nothing when stderr is not a terminal or with --quiet. With --json it prints one
// JSON line per second on stderr instead ({"progress": {...}}), for scripts.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "base/io.h"

namespace CLI {
class App;
}

namespace kvsnap::cli {

// The Io every command uses: posix_io() with byte counters and the interrupt check.
Io& cli_io();
uint64_t cli_bytes_read();
uint64_t cli_bytes_written();
// Bytes of store files a gc deleted (gc deletes, it does not read or write): counted by the gc's
// progress callback, drawn like the others, and stopped by Ctrl-C the same way (cmd_maintain.cc).
uint64_t cli_bytes_freed();
void count_freed(uint64_t n);

// Installs the SIGINT/SIGTERM/SIGHUP handler (main does, once). A signal the process was started
// with ignored (nohup's SIGHUP, a background job's SIGINT) is left ignored.
void install_interrupt_handler();
bool interrupted();

// After a command the handler stopped has removed what it was writing: ends the process by that
// signal, with its default action, so that its parent sees a death by the signal (a shell's $? is
// 128 + N: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP) and acts on it as it would on an
// unhandled one: bash ends a script whose command Ctrl-C stopped instead of running its next
// command, systemd counts a SIGTERM as a clean stop. Returns when no signal was taken.
void end_by_interrupting_signal();
// A signal a command took itself (serve's sigwait) rather than through the handler: the one the
// process ends by.
void note_interrupting_signal(int sig);

// Testing knob: KVSNAP_TEST_INTERRUPT_AFTER_BYTES=N raises SIGINT (KVSNAP_TEST_INTERRUPT_SIGNAL=TERM
// or HUP: that one) in the process once N bytes have been read or written through cli_io() (or freed
// by gc), so tests can stop every command at a known point through the real signal path;
// KVSNAP_TEST_INTERRUPT_TO_GROUP=1 sends it to the process group instead (kill(0, sig)), as a
// terminal's Ctrl-C reaches a shell script and the command it waits for.

enum class ProgressMode { kAuto, kQuiet, kJson };

// --quiet and --json as the long commands bind them.
struct ProgressFlags {
  bool quiet = false;
  ProgressMode mode(bool json) const { return quiet ? ProgressMode::kQuiet : json ? ProgressMode::kJson : ProgressMode::kAuto; }
};
void add_progress_flags(CLI::App* sub, ProgressFlags& flags);

enum class Counted { kRead, kWritten, kFreed };

class ProgressDisplay {
 public:
  // `what` names the operation ("save chat.bin"); `total` 0: unknown (no percentage, no ETA).
  ProgressDisplay(std::string what, Counted counted, uint64_t total, ProgressMode mode);
  ~ProgressDisplay();  // stops the drawing and clears the line
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;
  void set_total(uint64_t total) { total_.store(total); }
  // The operation's outcome, passed through: the last JSON line says "finished": true only
  // after a call with a success (a display never told reports false).
  template <class Outcome>
  Outcome finish(Outcome outcome) {
    succeeded_ = outcome.ok();
    return outcome;
  }
  // For commands over many files (migrate): files done of the total, drawn as "[3/10]" before the
  // bytes and in JSON as files_done/files_total.
  void set_files(size_t done, size_t total) {
    files_done_.store(done);
    files_total_.store(total);
  }

 private:
  void run();
  void draw(bool final);
  uint64_t counted_now() const;
  uint64_t done() const;

  std::string what_;
  Counted counted_;
  std::atomic<uint64_t> total_;
  bool succeeded_ = false;
  std::atomic<size_t> files_done_{0}, files_total_{0};
  ProgressMode mode_;
  uint64_t base_ = 0;  // the counter when the operation started
  std::chrono::steady_clock::time_point start_;
  bool drew_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvsnap::cli
