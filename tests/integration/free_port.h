// A loopback port no process listens on yet (bound, then released), for a
// server a test starts on a port it must know in advance.
#ifndef STAGEWISE_TESTS_INTEGRATION_FREE_PORT_H_
#define STAGEWISE_TESTS_INTEGRATION_FREE_PORT_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace stagewise::testing {

inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_INTEGRATION_FREE_PORT_H_
