#include "base/key_source.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <vector>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "base/os.h"
#include "base/text.h"

namespace kvsnap {
namespace {

constexpr size_t kMaxKeyFileBytes = 4096;

// A buffer of key material, wiped when dropped.
struct SecretBuffer {
  std::vector<std::byte> bytes;
  ~SecretBuffer() {
    if (!bytes.empty()) OPENSSL_cleanse(bytes.data(), bytes.size());
  }
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string errno_text(int e) { return std::strerror(e); }

std::string octal_mode(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", unsigned(m & 07777));
  return b;
}

// Reads what fd gives until EOF, at most `limit` bytes (one more tells "too long").
Status read_bounded(int fd, size_t limit, std::vector<std::byte>& out, const std::string& what) {
  out.resize(limit + 1);
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(what + ": cannot read: " + errno_text(errno));
    if (n == 0) break;
    got += size_t(n);
  }
  out.resize(got);
  return Status::OK();
}

// NAME=VALUE, a shell's assignment before a command (NAME: letters, digits, '_', not a digit first).
bool is_assignment(std::string_view word) {
  const size_t eq = word.find('=');
  if (eq == 0 || eq == std::string_view::npos || (word[0] >= '0' && word[0] <= '9')) return false;
  for (char c : word.substr(0, eq))
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

// The program the command runs, only: its arguments may carry a secret (`vault read -token=...`),
// and so may the assignments before it (`VAULT_TOKEN=... vault ...`, `env TOKEN=... helper`);
// messages go to logs and stay cached for the process's life.
std::string command_name(const std::string& command) {
  std::vector<std::string_view> words;
  for (size_t at = command.find_first_not_of(" \t"); at != std::string::npos;) {
    const size_t end = std::min(command.find_first_of(" \t", at), command.size());
    words.push_back(std::string_view(command).substr(at, end - at));
    at = command.find_first_not_of(" \t", end);
  }
  size_t i = 0;
  bool after_env = false;
  for (; i < words.size(); ++i) {
    if (is_assignment(words[i])) continue;
    if (after_env && words[i].rfind("-", 0) == 0) {
      if (words[i] == "-u" || words[i] == "-C" || words[i] == "-S") ++i;  // env's options with a value
      continue;
    }
    if (words[i] != "env") break;
    after_env = true;
  }
  if (i > words.size()) i = words.size();
  if (i == words.size()) return words.empty() ? "key command ''" : "key command (its words not shown)";
  // The split above is on blanks, not sh's words: a quote, escape or expansion up to the program
  // may put part of a secret where the program seems to be (`AUTH="Bearer hvs.x" curl ...` gives
  // `hvs.x"`: a review's finding), so then nothing is shown.
  for (size_t w = 0; w <= i; ++w) {
    if (words[w].find_first_of("\"'\\`$(){};|&<>*?[]~#") != std::string_view::npos)
      return "key command (its words not shown)";
  }
  const bool more = i + 1 < words.size() || i > 0;
  return "key command " + quote_text(std::string(words[i])) + (more ? " (its arguments not shown)" : "");
}

}  // namespace

Result<MasterKey> load_key_file(const std::string& path) {
  const std::string what = "key file " + path;
  // O_NONBLOCK: a FIFO's open would wait for a writer; it is refused below as not a regular file.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (f.fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::NotFound(what + " does not exist");
    return Status::IOError(what + ": cannot open: " + errno_text(e));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return Status::IOError(what + ": cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(what + " is not a regular file");
  // As ssh does: a key file another user owns is theirs to change (root's files are trusted).
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return Status::InvalidArgument(what + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
                                   std::to_string(::geteuid()) + ") or root: use a key file of your own");
  }
  if ((st.st_mode & 077) != 0) {
    return Status::InvalidArgument(what + " is open to other users (mode " + octal_mode(st.st_mode) +
                                   "): chmod 600 it, or read a shared secret on purpose with "
                                   "{--key-command 'cat FILE'}");
  }
  if (uint64_t(st.st_size) > kMaxKeyFileBytes) {
    return Status::InvalidArgument(what + ": " + std::to_string(st.st_size) + " bytes; a key file is 32 raw bytes " +
                                   "or 64 hex digits");
  }
  SecretBuffer buf;
  KV_RETURN_IF_ERROR(read_bounded(f.fd, kMaxKeyFileBytes, buf.bytes, what));
  return parse_master_key(buf.bytes, what);
}

Result<MasterKey> run_key_command(const std::string& command, const KeyCommandOptions& opts) {
  const std::string what = command_name(command);
  int pipe_fds[2];
  if (const int e = pipe_cloexec(pipe_fds); e != 0) {
    return Status::IOError(what + ": cannot make a pipe: " + errno_text(e));
  }
  Fd rd{pipe_fds[0]};
  Fd wr{pipe_fds[1]};
  posix_spawn_file_actions_t actions;
  if (posix_spawn_file_actions_init(&actions) != 0) throw std::bad_alloc();
  // dup2 onto stdout clears close-on-exec for the child's copy only.
  posix_spawn_file_actions_adddup2(&actions, wr.fd, STDOUT_FILENO);
  std::string sh = "sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, "/bin/sh", &actions, nullptr, argv, process_environ());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return Status::IOError(what + ": cannot start /bin/sh: " + errno_text(spawned));
  ::close(wr.fd);
  wr.fd = -1;

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts.timeout_ms);
  SecretBuffer out;
  out.bytes.resize(opts.max_output + 1);
  size_t got = 0;
  bool too_long = false, timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{rd.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, int(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (r == 0) continue;  // the deadline check above ends it
    const ssize_t n = ::read(rd.fd, out.bytes.data() + got, out.bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
    if (got > opts.max_output) {
      too_long = true;
      break;
    }
  }
  out.bytes.resize(got);
  bool killed = false;
  // A command that printed too much or ran out of time is stopped now, not waited for.
  const int st = wait_child_until(pid, too_long || timed_out ? std::chrono::steady_clock::now() : deadline, &killed);
  if (too_long) {
    return Status::InvalidArgument(what + " printed more than " + std::to_string(opts.max_output) +
                                   " bytes (a key is 32 raw bytes or 64 hex digits); it was stopped");
  }
  if (timed_out || (killed && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))) {
    return Status::InvalidArgument(what + " did not finish within " + std::to_string(opts.timeout_ms) +
                                   " ms; it was killed");
  }
  if (st == -1) return Status::IOError(what + ": cannot wait for it: " + errno_text(errno));
  if (WIFSIGNALED(st)) {
    return Status::InvalidArgument(what + " was killed by signal " + std::to_string(WTERMSIG(st)));
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
    return Status::InvalidArgument(what + " failed (exit status " + std::to_string(WEXITSTATUS(st)) + ")");
  }
  return parse_master_key(out.bytes, what);
}

}  // namespace kvsnap
