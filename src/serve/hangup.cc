#include "serve/hangup.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "base/os.h"

namespace kvsnap {
namespace {

// An address in the form cpp-httplib gives it (detail::get_ip_and_port: getnameinfo with
// NI_NUMERICHOST, the port from sin_port / sin6_port).
bool numeric_end(const sockaddr_storage& a, socklen_t len, std::string* host, int* port) {
  char buf[NI_MAXHOST];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  if (a.ss_family == AF_INET) {
    *port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  } else if (a.ss_family == AF_INET6) {
    *port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  } else {
    return false;
  }
  *host = buf;
  return true;
}

bool has_ends(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  std::string host;
  int port = 0;
  // The cheap test first: most descriptors are files, not sockets (ENOTSOCK).
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !numeric_end(a, len, &host, &port) ||
      port != local_port || host != local_addr) {
    return false;
  }
  len = sizeof a;
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && numeric_end(a, len, &host, &port) &&
         port == remote_port && host == remote_addr;
}

}  // namespace

int find_tcp_socket(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return -1;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    int found = -1;
    while (const dirent* e = ::readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd == own) continue;
      if (has_ends(int(fd), local_addr, local_port, remote_addr, remote_port)) {
        found = int(fd);
        break;
      }
    }
    ::closedir(d);
    return found;
  }
  const int limit = open_fd_limit();
  for (int fd = 0; fd < limit; ++fd) {
    if (has_ends(fd, local_addr, local_port, remote_addr, remote_port)) return fd;
  }
  return -1;
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do r = ::poll(&p, 1, 0);
  while (r < 0 && errno == EINTR);
  if (r <= 0 || (p.revents & POLLNVAL)) return false;
  char c;
  ssize_t n;
  do n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  return n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN));
}

ClientWatch::ClientWatch(std::string local_addr, int local_port, std::string remote_addr, int remote_port)
    : local_addr_(std::move(local_addr)),
      remote_addr_(std::move(remote_addr)),
      local_port_(local_port),
      remote_port_(remote_port) {}

bool ClientWatch::gone() {
  if (!looked_) {
    looked_ = true;
    fd_ = find_tcp_socket(local_addr_, local_port_, remote_addr_, remote_port_);
  }
  return fd_ >= 0 && peer_closed(fd_);
}

}  // namespace kvsnap
