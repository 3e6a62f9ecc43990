// Whether the client of a request the proxy is still working on has hung up.
//
// llama-server asks this of its connection while a completion runs (cpp-httplib's
// is_connection_closed, polled every second) and cancels the task of a client that went away. The
// proxy talks to llama-server over its own connection, so it must ask its client's and cut that
// connection itself, or the child would generate to the end for nobody, its slot and one of
// kvsnap's slot permits held all the while.
//
// cpp-httplib 0.11 (Debian 12's) hands a handler the two ends of its connection but not the socket,
// and has no is_connection_closed. A ClientWatch finds the socket by those two ends among this
// process's descriptors, once, then asks it as newer cpp-httplib does: readable with nothing to
// read is a connection the peer closed. (A client that shuts down only its sending side after its
// request looks the same, to llama-server as well.)
//
// Promises: never blocks; a socket that cannot be found (another system, descriptors hidden) is
// never "gone": the request then runs on as before.
#pragma once

#include <string>

namespace kvsnap {

class ClientWatch {
 public:
  // The connection's own end (the proxy's listening address and port) and the client's, numeric, as
  // cpp-httplib gives them in Request::local_addr/local_port and remote_addr/remote_port.
  ClientWatch(std::string local_addr, int local_port, std::string remote_addr, int remote_port);

  // True once the client has closed (or reset) the connection. The first call looks for the socket.
  bool gone();

 private:
  std::string local_addr_, remote_addr_;
  int local_port_, remote_port_;
  bool looked_ = false;
  int fd_ = -1;
};

// The descriptor of this process's TCP socket whose own end and peer are these (numeric addresses,
// getnameinfo's NI_NUMERICHOST form), or -1. Linux lists /proc/self/fd; elsewhere every descriptor
// below open_fd_limit() is tried.
int find_tcp_socket(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);

// Whether `fd`'s peer has closed or reset the connection: readable now, and a peek finds end of
// file or ECONNRESET. Data waiting (a pipelined next request) is a peer still there.
bool peer_closed(int fd);

}  // namespace kvsnap
