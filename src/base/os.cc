#include "base/os.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

// The branch compiled: Linux, macOS, or any other POSIX system. KVSNAP_OS_GENERIC_POSIX (the CMake
// option of that name) makes a Linux build take the last, so that it is compiled and tested here.
#if defined(__APPLE__)
#define KVSNAP_OS_MACOS 1
#elif defined(__linux__) && !defined(KVSNAP_OS_GENERIC_POSIX)
#define KVSNAP_OS_LINUX 1
#endif

#if defined(KVSNAP_OS_LINUX)
#include <sys/prctl.h>
#include <sys/syscall.h>
#elif defined(KVSNAP_OS_MACOS)
#include <crt_externs.h>
#include <sys/sysctl.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(KVSNAP_OS_LINUX)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#if !defined(KVSNAP_OS_MACOS)
extern char** environ;
#endif

namespace kvsnap {

namespace {

int retry_eintr(int (*call)(int), int fd) {
  int rc;
  do {
    rc = call(fd);
  } while (rc != 0 && errno == EINTR);
  return rc == 0 ? 0 : errno;
}

#if defined(KVSNAP_OS_MACOS)
int full_fsync(int fd) { return ::fcntl(fd, F_FULLFSYNC); }
#endif

// Errors by which a file system says it has no F_FULLFSYNC (ENOTSUP and EOPNOTSUPP differ on macOS).
bool refuses_call(int e) { return e == ENOTSUP || e == EOPNOTSUPP || e == EINVAL; }

}  // namespace

bool signal_ignored(int sig) {
  struct sigaction was {};
  return sigaction(sig, nullptr, &was) == 0 && was.sa_handler == SIG_IGN;
}

const char* os_branch() {
#if defined(KVSNAP_OS_LINUX)
  return "linux";
#elif defined(KVSNAP_OS_MACOS)
  return "macos";
#else
  return "posix";
#endif
}

const SyncCalls& system_sync_calls() {
#if defined(KVSNAP_OS_LINUX)
  static constexpr SyncCalls calls{nullptr, ::fdatasync, ::fsync};
#elif defined(KVSNAP_OS_MACOS)
  static constexpr SyncCalls calls{full_fsync, nullptr, ::fsync};
#elif defined(_POSIX_SYNCHRONIZED_IO) && _POSIX_SYNCHRONIZED_IO > 0 && !defined(__linux__)
  static constexpr SyncCalls calls{nullptr, ::fdatasync, ::fsync};
#else
  // No fdatasync promised. The generic build on Linux takes this too (glibc has fdatasync), so that
  // the branch of such a system is compiled and run somewhere.
  static constexpr SyncCalls calls{nullptr, nullptr, ::fsync};
#endif
  return calls;
}

int sync_fd_with(const SyncCalls& calls, int fd, bool data_only) {
  if (calls.full_sync != nullptr) {
    const int e = retry_eintr(calls.full_sync, fd);
    // Refused by this file system: the drive's cache may keep the data a while longer, but fsync is
    // the most it offers. Any other error is the answer.
    if (!refuses_call(e)) return e;
  } else if (data_only && calls.data_sync != nullptr) {
    return retry_eintr(calls.data_sync, fd);
  }
  return retry_eintr(calls.sync, fd);
}

const char* sync_fd_call_with(const SyncCalls& calls, bool data_only) {
  if (calls.full_sync != nullptr) return "F_FULLFSYNC";
  return data_only && calls.data_sync != nullptr ? "fdatasync" : "fsync";
}

int sync_fd(int fd, bool data_only) { return sync_fd_with(system_sync_calls(), fd, data_only); }
const char* sync_fd_call(bool data_only) { return sync_fd_call_with(system_sync_calls(), data_only); }

#if defined(KVSNAP_OS_LINUX)
namespace {
// sync_file_range's errno for a file it does not work on (as opposed to a write error, EBADF, ...).
bool writeback_unsupported(int e) { return e == EINVAL || e == ENOSYS || e == ESPIPE || e == EOPNOTSUPP; }
}  // namespace
#endif

int allocate_space(int fd, uint64_t bytes) {
#if defined(KVSNAP_OS_LINUX)
  // not posix_fallocate: where the file system cannot allocate, glibc's writes zeros instead
  return ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
#else
  (void)fd;
  (void)bytes;
  return EOPNOTSUPP;
#endif
}

bool start_writeback(int fd, uint64_t offset, uint64_t len) {
#if defined(KVSNAP_OS_LINUX)
  if (::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(len), SYNC_FILE_RANGE_WRITE) == 0) return true;
  return !writeback_unsupported(errno);
#else
  (void)fd;
  (void)offset;
  (void)len;
  return false;
#endif
}

std::optional<uint64_t> thread_blocked_count() {
#if defined(KVSNAP_OS_LINUX)
  struct rusage u {};
  if (::getrusage(RUSAGE_THREAD, &u) != 0) return std::nullopt;
  return static_cast<uint64_t>(u.ru_nvcsw);
#else
  return std::nullopt;
#endif
}

WritebackWait wait_writeback(int fd, uint64_t offset, uint64_t len) {
#if defined(KVSNAP_OS_LINUX)
  const unsigned flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
  int rc;
  do {
    rc = ::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(len), flags);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return {};
  const int e = errno;
  // Not a write error: the call is not there for this file (not a regular file, no such call).
  if (writeback_unsupported(e)) return {0, false};
  // ENOMEM: the kernel could not queue the wait now; the final sync still writes and checks.
  return {e == ENOMEM ? 0 : e, true};
#else
  (void)fd;
  (void)offset;
  (void)len;
  return {0, false};
#endif
}

int pipe_cloexec(int fds[2]) {
#if defined(KVSNAP_OS_LINUX)
  return ::pipe2(fds, O_CLOEXEC) == 0 ? 0 : errno;
#else
  if (::pipe(fds) != 0) return errno;
  for (int i = 0; i < 2; ++i) {
    if (::fcntl(fds[i], F_SETFD, FD_CLOEXEC) != 0) {
      const int e = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      return e;
    }
  }
  return 0;
#endif
}

bool wait_readable_until(int fd, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, int(std::min<int64_t>(left.count(), 60000)));
    if (r > 0 || (r < 0 && errno != EINTR)) return true;  // an error: the read reports it
  }
}

int wait_child_until(pid_t pid, std::chrono::steady_clock::time_point deadline, bool* killed) {
  *killed = false;
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      *killed = true;
      while (::waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) return -1;
      }
      return st;
    }
    ::usleep(5000);
  }
}

int raise_listen_backlog(int port, int backlog) {
  int changed = 0;
  const int limit = std::min(open_fd_limit(), 4096);
  for (int fd = 0; fd < limit; ++fd) {
    int accepting = 0;
    socklen_t len = sizeof accepting;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || accepting == 0) continue;
    sockaddr_storage a{};
    socklen_t n = sizeof a;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) continue;
    int bound = -1;
    if (a.ss_family == AF_INET) bound = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
    if (a.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
    if (bound == port && ::listen(fd, backlog) == 0) ++changed;
  }
  return changed;
}

PortRange ephemeral_port_range() {
  PortRange r;
#if defined(KVSNAP_OS_LINUX)
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0, last = 0;
  if (f >> first >> last && first >= 1 && first <= last && last <= 65535) r = {first, last};
#endif
  return r;
}

// Without SO_REUSEADDR: servers differ in what they set (cpp-httplib 0.11.4, kvsnap serve's own
// listener, sets SO_REUSEPORT alone), and one without SO_REUSEADDR may fail to bind a port in
// TIME_WAIT: a test's `kvsnap serve` failed so ("cannot listen ... address in use") on a port a
// check with SO_REUSEADDR set had passed.
bool loopback_port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

int free_loopback_port(int tries) {
  const PortRange eph = ephemeral_port_range();
  // The ports outside the ephemeral range: [10000, first) and (last, 65535] (below 10000 are the
  // fixed ports services are configured on: 5432, 8080, ...).
  constexpr int kLowest = 10000;
  const int below = std::max(0, eph.first - kLowest), above = std::max(0, 65535 - eph.last);
  if (below + above == 0) return -1;
  std::random_device seed;
  std::mt19937 rng(seed() ^ uint32_t(::getpid()));
  std::uniform_int_distribution<int> pick(0, below + above - 1);
  for (int i = 0; i < tries; ++i) {
    const int k = pick(rng);
    const int port = k < below ? kLowest + k : eph.last + 1 + (k - below);
    if (loopback_port_is_free(port)) return port;
  }
  return -1;
}

char** process_environ() {
#if defined(KVSNAP_OS_MACOS)
  return *_NSGetEnviron();
#else
  return environ;
#endif
}

int request_parent_death_signal(pid_t parent, int sig) {
#if defined(KVSNAP_OS_LINUX)
  if (::prctl(PR_SET_PDEATHSIG, sig) != 0) return errno;
  // The parent may have died between fork and prctl: then nothing will ever send the signal.
  if (::getppid() != parent) return ESRCH;
  return 0;
#else
  // macOS has no such request (kqueue's EVFILT_PROC watches another process, but llama-server runs
  // no code of ours after exec). FreeBSD's procctl(PROC_PDEATHSIG_CTL) would be the equivalent.
  (void)parent;
  (void)sig;
  return 0;
#endif
}

bool has_parent_death_signal() {
#if defined(KVSNAP_OS_LINUX)
  return true;
#else
  return false;
#endif
}

void close_fds_from(int lowest, int limit) {
#if defined(KVSNAP_OS_LINUX) && defined(SYS_close_range)
  if (::syscall(SYS_close_range, static_cast<unsigned>(lowest), ~0U, 0U) == 0) return;
#endif
  for (int fd = lowest; fd < limit; ++fd) (void)::close(fd);
}

int open_fd_limit() {
  rlimit r{};
  // RLIM_INFINITY or a huge hard limit: descriptors are numbered from 0 up, and a process this
  // small never got far; 65536 bounds the loop where there is no close_range.
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY || r.rlim_cur > 65536) return 65536;
  return static_cast<int>(r.rlim_cur);
}

bool name_this_process(const char* name) {
#if defined(KVSNAP_OS_LINUX)
  return ::prctl(PR_SET_NAME, name, 0, 0, 0) == 0;
#else
  (void)name;
  return false;
#endif
}

int exchange_paths(const char* a, const char* b) {
#if defined(KVSNAP_OS_LINUX) && defined(RENAME_EXCHANGE)
  return ::renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0 ? 0 : errno;
#elif defined(KVSNAP_OS_LINUX) && defined(SYS_renameat2)
  // A C library without the wrapper (glibc before 2.28, musl): the system call itself.
  constexpr unsigned kRenameExchange = 1u << 1;  // <linux/fs.h> RENAME_EXCHANGE
  return ::syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, kRenameExchange) == 0 ? 0 : errno;
#elif defined(KVSNAP_OS_MACOS)
  return ::renamex_np(a, b, RENAME_SWAP) == 0 ? 0 : errno;
#else
  (void)a;
  (void)b;
  return ENOSYS;
#endif
}

int become_subreaper() {
#if defined(KVSNAP_OS_LINUX)
  return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 ? 0 : errno;
#else
  return ENOSYS;
#endif
}

bool take_pending_signal(const sigset_t& among, int* sig) {
  sigset_t pending;
  if (::sigpending(&pending) != 0) return false;
  for (int s = 1; s < NSIG; ++s) {
    if (sigismember(&among, s) == 1 && sigismember(&pending, s) == 1) {
      // Pending and blocked: sigwait returns at once.
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, s);
      return ::sigwait(&one, sig) == 0;
    }
  }
  return false;
}

ScopedSigpipeBlock::ScopedSigpipeBlock() {
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old_);
}

ScopedSigpipeBlock::~ScopedSigpipeBlock() {
  if (!sigismember(&old_, SIGPIPE)) {  // blocked by us: a pending one is ours to take
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    int sig;
    while (take_pending_signal(pipe_only, &sig)) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

std::string cpu_model_name() {
#if defined(KVSNAP_OS_MACOS)
  char buf[256];
  size_t n = sizeof buf;
  if (::sysctlbyname("machdep.cpu.brand_string", buf, &n, nullptr, 0) == 0 && n > 1) return std::string(buf, n - 1);
#elif defined(KVSNAP_OS_LINUX)
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
  }
#endif
  return "unknown CPU";
}

std::string cpu_crypto_features() {
  std::string out;
  auto add = [&](bool has, const char* name) {
    if (!has) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) != 0) {
    add(c & (1u << 25), "aes");
    add(c & (1u << 1), "pclmulqdq");
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) {
    add(b & (1u << 5), "avx2");
    add(b & (1u << 16), "avx512f");
    add(c & (1u << 9), "vaes");
    add(c & (1u << 10), "vpclmulqdq");
    add(b & (1u << 29), "sha_ni");
  }
#elif defined(__aarch64__) && defined(KVSNAP_OS_LINUX)
  const unsigned long hw = ::getauxval(AT_HWCAP);
  add(hw & HWCAP_AES, "aes");
  add(hw & HWCAP_PMULL, "pmull");
  add(hw & HWCAP_SHA2, "sha2");
#else
  return "(unknown)";
#endif
  return out.empty() ? "(none)" : out;
}

std::string load_average_text() {
  double l[3];
  if (::getloadavg(l, 3) != 3) return "?";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", l[0], l[1], l[2]);
  return buf;
}

std::optional<double> process_start_time(pid_t pid) {
#if defined(KVSNAP_OS_LINUX)
  // /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces and parentheses, so the
  // fields are counted from the last ')': state is field 3, starttime field 22.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return std::nullopt;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  const char* p = line.c_str() + close + 1;
  for (int field = 3; field < 22; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
    if (*p == '\0') return std::nullopt;
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long ticks = std::strtoull(p, &end, 10);
  if (end == p || errno != 0) return std::nullopt;
  std::ifstream all("/proc/stat");
  unsigned long long btime = 0;
  while (std::getline(all, line)) {
    if (line.rfind("btime ", 0) == 0) {
      btime = std::strtoull(line.c_str() + 6, nullptr, 10);
      break;
    }
  }
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (btime == 0 || hz <= 0) return std::nullopt;
  return double(btime) + double(ticks) / double(hz);
#else
  (void)pid;
  return std::nullopt;
#endif
}

std::optional<std::string> process_name(pid_t pid) {
#if defined(KVSNAP_OS_LINUX)
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  if (!std::getline(comm, name)) return std::nullopt;
  return name;
#else
  (void)pid;
  return std::nullopt;
#endif
}

}  // namespace kvsnap
