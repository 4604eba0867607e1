// ConnectionProbe: tells whether an HTTP client has gone while its request still runs. Debian's
// cpp-httplib 0.11 gives a handler neither the socket nor is_connection_closed, so the probe finds
// the connection's socket among the process's descriptors by its two addresses (unique while the
// connection is open, and the handler's thread holds it open) and polls it without blocking.
#pragma once

#include <string>

namespace tandem::server {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  // remote_addr/remote_port: the peer; local_port: our end (<= 0 = match the peer only).
  static ConnectionProbe find(const std::string& remote_addr, int remote_port, int local_port);
  bool valid() const { return fd_ >= 0; }
  // True once the peer has closed (EOF, reset or error). A peer that only shut down its sending
  // side looks the same; HTTP clients waiting for a response do not do that.
  bool peer_closed() const;

 private:
  int fd_ = -1;
};

}  // namespace tandem::server
