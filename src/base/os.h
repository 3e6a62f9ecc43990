// The operating-system seam below Io: every call whose spelling differs between Linux and other
// POSIX systems (macOS first) lives here, each with one implementation per system chosen at compile
// time in os.cc. Callers never test __linux__ or __APPLE__ themselves. docs/portability.md lists every
// Linux-only call of the tree and what stands in for it elsewhere.
//
// The functions answer errno values (0 = done) rather than Status: they run where a Status cannot be
// made (between fork and exec) or under callers that word their own errors.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace kvsnap {

// Which of os.cc's implementations this build compiled: "linux", "macos", or "posix" (any other POSIX
// system, and a Linux build configured with -DKVSNAP_OS_GENERIC_POSIX=ON, which takes that branch so
// that it is compiled and tested on Linux: tests/run-all.sh, docs/portability.md).
const char* os_branch();

// Makes what was written to `fd` durable: it survives a power cut once this returns 0.
//   Linux: fdatasync (data_only) or fsync.
//   macOS: fcntl(F_FULLFSYNC): there fsync only hands the data to the drive, whose volatile cache
//          may still lose it. A file system that refuses F_FULLFSYNC (ENOTSUP, EINVAL: SMB, some
//          FUSE ones) gets fsync instead, as SQLite and Go do. Any other error (EIO) is answered as
//          it is: an fsync after a failed write-back can report success for pages the kernel has
//          already dropped.
//   Other POSIX: fdatasync where _POSIX_SYNCHRONIZED_IO promises it, else fsync.
// `data_only` allows skipping metadata a read does not need (mtime); a directory gets false.
int sync_fd(int fd, bool data_only);
// The name of the call sync_fd makes, for error messages ("fdatasync", "F_FULLFSYNC", "fsync").
const char* sync_fd_call(bool data_only);

// The calls sync_fd chooses among, as this system has them. Each answers 0, or -1 with errno, like
// the system call. The seam through which tests run one system's choice on another (F_FULLFSYNC
// refused by the file system, a system without fdatasync).
struct SyncCalls {
  int (*full_sync)(int fd);  // macOS: fcntl(F_FULLFSYNC); nullptr elsewhere
  int (*data_sync)(int fd);  // fdatasync; nullptr where the system has none
  int (*sync)(int fd);       // fsync
};
const SyncCalls& system_sync_calls();
// sync_fd and sync_fd_call over `calls` (sync_fd is sync_fd_with(system_sync_calls(), ...)).
int sync_fd_with(const SyncCalls& calls, int fd, bool data_only);
const char* sync_fd_call_with(const SyncCalls& calls, bool data_only);

// Allocates the first `bytes` of `fd` on its disk without writing them (Linux: fallocate, the
// file's size grows to `bytes`), so the space is the file's until it is removed. 0, or an errno:
// EOPNOTSUPP where the file system cannot (and on systems without the call: ZFS, macOS, the
// generic POSIX branch), ENOSPC, ... No byte of data is written, whatever the answer.
int allocate_space(int fd, uint64_t bytes);

// Asks the kernel to start writing bytes [offset, offset + len) of `fd` to the disk without waiting
// (write-behind: a later sync_fd then waits only for the tail). Linux: sync_file_range with
// SYNC_FILE_RANGE_WRITE. Elsewhere nothing (macOS has no such call): sync_fd alone still makes every
// byte durable, only later. Best effort, so no error; false where the call is not there for `fd`
// (not a regular file or block device, a kernel or sandbox without it, not Linux).
bool start_writeback(int fd, uint64_t offset, uint64_t len);
// Waits until bytes [offset, offset + len) of `fd` are written to the disk (Linux: sync_file_range
// WAIT_BEFORE | WRITE | WAIT_AFTER; no durability promise: the file's metadata is not written), so
// a writer that waits for its older windows goes at the disk's pace instead of filling the page
// cache and waiting for all of it in its final sync. `error`: 0, or the errno of a write error the
// kernel reported for the file (EIO, ENOSPC): the caller must report it, a later fsync may not.
// Where the call is not there for `fd` (not a regular file or block device: ESPIPE; a kernel or
// sandbox without it: ENOSYS; not Linux) `error` is 0 and `supported` false: nothing was waited for.
// (Linux implements it for every file system alike; one that writes back on its own terms, as FUSE
// without a write-back cache, may return without having waited.)
struct WritebackWait {
  int error = 0;
  bool supported = true;
};
WritebackWait wait_writeback(int fd, uint64_t offset, uint64_t len);

// How many times the calling thread has blocked so far (voluntary context switches: a wait for
// the disk, the network or a lock; not a time slice taken by another thread). Linux:
// getrusage(RUSAGE_THREAD); elsewhere nullopt (not known).
std::optional<uint64_t> thread_blocked_count();

// Whether `sig` is ignored (SIG_IGN) in this process, as a parent can leave it across exec:
// `nohup` ignores SIGHUP, a shell starts a script's background jobs with SIGINT ignored. kvsnap
// leaves such a signal ignored (the CLI's handlers, serve's sigwait set).
bool signal_ignored(int sig);

// A pipe whose two ends are close-on-exec. Linux: pipe2(O_CLOEXEC), atomic. Elsewhere pipe + fcntl:
// a fork + exec by another thread between the two can leak the ends into that child (they are closed
// again when it exits; kvsnap's children are llama-server and key commands, which ignore them).
int pipe_cloexec(int fds[2]);

// Waits until fd can be read without blocking (data, end of file or an error to report) or
// until `deadline`: true in the first case, false when the deadline came first.
bool wait_readable_until(int fd, std::chrono::steady_clock::time_point deadline);

// Raises the listen backlog of this process's listening TCP sockets on `port` (IPv4 or IPv6) to
// `backlog` (the system caps it: Linux's net.core.somaxconn): listen() again on a listening
// socket sets its backlog, on Linux and the BSDs. For a server library that listens with a small
// fixed one (cpp-httplib 0.11.4: 5, so a burst of clients overflows it while its accept loop
// waits for a core). Looks at descriptors below 4096. Returns how many sockets it changed.
int raise_listen_backlog(int port, int backlog);

// The kernel's range of ephemeral ports, the ones bind() to port 0 and outgoing connections are
// given: Linux's /proc/sys/net/ipv4/ip_local_port_range, elsewhere (and where that cannot be
// read) IANA's 49152-65535, the BSDs' and macOS's default.
struct PortRange {
  int first = 49152, last = 65535;
};
PortRange ephemeral_port_range();

// A loopback TCP port that can be bound now, for a child process to listen on a moment later.
// Chosen at random outside the ephemeral range (above it or below it, never under 10000, where
// services have their fixed ports), so that
// no other process's bind to port 0 or outgoing connection is given it in between: a port the
// kernel handed out for port 0 was, to another test's client while llama-server started (it
// failed "couldn't bind HTTP server socket"). -1 when none of `tries` candidates binds.
int free_loopback_port(int tries = 64);

// Whether a TCP socket binds to 127.0.0.1:port now with no socket option set: false while any
// socket holds the port, one in TIME_WAIT included (a server may fail to bind such a port).
bool loopback_port_is_free(int port);

// Waits for child `pid` until `deadline`; one still running then is sent SIGKILL and reaped
// (*killed set). Returns its wait status, or -1 when waitpid fails (errno says why).
int wait_child_until(pid_t pid, std::chrono::steady_clock::time_point deadline, bool* killed);

// The environment to hand to posix_spawn/execve. macOS shared libraries cannot see `environ`
// directly (_NSGetEnviron instead).
char** process_environ();

// Child side, between fork and exec (async-signal-safe only): asks the kernel to send `sig` to this
// process when the thread of `parent` that forked it ends, so a SIGKILLed kvsnap does not leave its
// child running. Linux: prctl(PR_SET_PDEATHSIG); ESRCH when `parent` already died before the
// request (the child should _exit). Systems without such a request (macOS) do nothing and answer 0:
// has_parent_death_signal() tells them apart.
int request_parent_death_signal(pid_t parent, int sig);
bool has_parent_death_signal();

// For a process forked from a threaded kvsnap that never execs (serve/lifeline.h's watchdog): each
// of the three is async-signal-safe.
//   close_fds_from: closes every descriptor >= `lowest`. Linux: close_range(2), one call; where that
//     is missing (macOS, kernels before 5.9), close() on each below `limit`, which open_fd_limit()
//     gave before the fork (getrlimit is not async-signal-safe).
//   name_this_process: the name ps and top show (Linux: prctl(PR_SET_NAME), 15 bytes kept); nothing
//     elsewhere (macOS has no call for it: the watchdog shows as kvsnap there). True when named.
void close_fds_from(int lowest, int limit);
int open_fd_limit();
bool name_this_process(const char* name);

// Swaps the names `a` and `b` of two existing files in one step: each then names what the other
// did. Linux: renameat2(RENAME_EXCHANGE) (3.15+; ext4, xfs, btrfs, tmpfs, overlayfs; EINVAL where
// the file system has none, e.g. NFS); macOS: renamex_np(RENAME_SWAP) (APFS); elsewhere ENOSYS.
// migrate_dir's publication through AtomicFileWriter::publish_if_unchanged rests on it: a writer
// that opened `b` before the swap is seen on the old file afterwards.
int exchange_paths(const char* a, const char* b);

// Makes this process the one that reaps its orphaned descendants, in place of init (tests: the
// children of a supervisor the test SIGKILLed come back to the test, which can wait for them).
// Linux: prctl(PR_SET_CHILD_SUBREAPER). Elsewhere ENOSYS (FreeBSD's procctl(PROC_REAP_ACQUIRE) would do).
int become_subreaper();

// Takes one signal of `among` that is pending for this thread (blocked, delivered), without waiting:
// true and `*sig` when there was one. POSIX (sigpending + sigwait): sigtimedwait is missing on macOS.
bool take_pending_signal(const sigset_t& among, int* sig);

// While alive, a SIGPIPE from this thread's write to a closed socket or pipe does not end the
// process: SIGPIPE is blocked on this thread, and one left pending is taken before the old mask
// comes back (EPIPE is what the writer sees). For writers that cannot pass MSG_NOSIGNAL (cpp-httplib's
// client, a plain write() to a pipe) in a process that may not ignore SIGPIPE (the kvsnap command
// does not: `kvsnap ls | head` ends quietly). POSIX: pthread_sigmask, take_pending_signal.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock();
  ~ScopedSigpipeBlock();
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t old_;
};

// The CPU's marketing name for benchmark headers ("unknown CPU" when the system does not say).
// Linux: /proc/cpuinfo "model name"; macOS: sysctl machdep.cpu.brand_string; elsewhere unknown.
std::string cpu_model_name();
// The crypto-relevant CPU features the running CPU reports, space-separated, for benchmark headers
// (which of AES-NI, PCLMULQDQ, VAES, SHA-NI, AVX2, AVX-512F on x86-64; AES, PMULL, SHA2 on aarch64
// Linux), "(none)" when it reports none of them, "(unknown)" where kvsnap cannot ask. From CPUID /
// the auxiliary vector: no /proc, so the same code serves Linux and macOS on x86-64.
std::string cpu_crypto_features();
// The 1, 5 and 15 minute load averages as "a b c" (getloadavg, on Linux and macOS alike), or "?".
std::string load_average_text();

// When process `pid` started, in seconds since the epoch, to about a second (the boot time is
// given in whole seconds). Linux: /proc/PID/stat's start time (clock ticks after boot) plus
// /proc/stat's btime; nullopt elsewhere, and when the process is gone or the files do not parse.
std::optional<double> process_start_time(pid_t pid);
// The name of process `pid` as ps shows it (Linux: /proc/PID/comm, at most 15 bytes); nullopt
// elsewhere and when the process is gone.
std::optional<std::string> process_name(pid_t pid);

}  // namespace kvsnap
