// Loopback TCP sockets for tests: a port nobody listens on, a listener at a free port, and a raw
// client that has sent its bytes (requests no HTTP library would send: cut, malformed, or left
// unread).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/os.h"

namespace kvsnap::test {

// A TCP socket bound to 127.0.0.1 at the kernel's choice of port (*port), or -1.
inline int bind_loopback(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// A loopback TCP port nobody holds now, for a server the test starts there a moment later:
// kvsnap serve's own pick for its child (base/os.h free_loopback_port: outside the kernel's
// ephemeral range, so no other test's connection or bind to port 0 is given it in between, and
// not in TIME_WAIT). 0 when none was found.
inline int free_port() { return std::max(0, free_loopback_port()); }

// A listening socket on 127.0.0.1 at a free port (*port), or -1. Connections wait in its backlog
// until the test accepts them (or never, for a server that does not answer).
inline int listen_on_loopback(int* port, int backlog = 4) {
  const int fd = bind_loopback(port);
  if (fd < 0) return -1;
  if (::listen(fd, backlog) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A client connected to 127.0.0.1:port that has sent `request` whole, or -1.
inline int send_raw(int port, const std::string& request) {
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::write(c, request.data(), request.size()) != ssize_t(request.size())) {
    ::close(c);
    return -1;
  }
  return c;
}

}  // namespace kvsnap::test
