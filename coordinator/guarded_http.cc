#include "coordinator/guarded_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/time/clock.h"

namespace stagewise::coordinator {
namespace {

enum class Wait { kReady, kTimedOut, kFailed };

// Waits until `fd` has `events` or `deadline` passes.
Wait WaitFd(int fd, short events, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return Wait::kTimedOut;
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    const int r = poll(&p, 1, ms);
    if (r < 0 && errno != EINTR) return Wait::kFailed;
    if (r > 0) {
      // Readable at end of stream or on error too: the read says which.
      return Wait::kReady;
    }
  }
}

// The numeric address and port of one end of `fd`.
void Address(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int r = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                     : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char host[NI_MAXHOST] = "";
  char service[NI_MAXSERV] = "";
  if (r != 0 || getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), service,
                            sizeof(service), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    ip.clear();
    port = -1;
    return;
  }
  ip = host;
  port = atoi(service);
}

// Everything httplib reads and writes for one request. Reads are counted
// against the limits while the head lasts, then against the body's; a read
// past a limit or a deadline fails and stays failed (cut()).
class GuardedStream : public httplib::Stream {
 public:
  GuardedStream(int fd, SSL* ssl, const WebLimits& limits, absl::Time start)
      : fd_(fd), ssl_(ssl), limits_(limits), deadline_(start + limits.header_timeout) {}

  // The reason the request was cut off, or null.
  const char* cut() const { return cut_; }

  bool is_readable() const override {
    if (cut_ != nullptr) return false;
    if (ssl_ != nullptr && SSL_pending(ssl_) > 0) return true;
    return WaitFd(fd_, POLLIN, deadline_) == Wait::kReady;
  }
  bool is_writable() const override {
    return WaitFd(fd_, POLLOUT, absl::Now() + limits_.write_timeout) == Wait::kReady;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (cut_ != nullptr) return -1;
    const ssize_t n = ReadSome(ptr, std::min<size_t>(size, 16 * 1024));
    if (n <= 0) return n;
    for (ssize_t i = 0; i < n; ++i) {
      if (head_done_) {
        body_bytes_ += static_cast<size_t>(n - i);
        break;
      }
      Head(ptr[i]);
      if (cut_ != nullptr) return -1;
    }
    if (body_bytes_ > limits_.max_body_bytes) return Cut(kRefusedBody);
    return n;
  }

  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override {
    const absl::Time deadline = absl::Now() + limits_.write_timeout;
    size_t done = 0;
    while (done < size) {
      if (ssl_ != nullptr) {
        const int r = SSL_write(ssl_, ptr + done, static_cast<int>(size - done));
        if (r > 0) {
          done += static_cast<size_t>(r);
          continue;
        }
        const int e = SSL_get_error(ssl_, r);
        ERR_clear_error();
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) return -1;
        if (WaitFd(fd_, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline) != Wait::kReady) {
          return -1;
        }
        continue;
      }
      const ssize_t r = send(fd_, ptr + done, size - done, MSG_NOSIGNAL);
      if (r >= 0) {
        done += static_cast<size_t>(r);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (WaitFd(fd_, POLLOUT, deadline) != Wait::kReady) return -1;
    }
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(fd_, /*peer=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(fd_, /*peer=*/false, ip, port);
  }
  int socket() const override { return fd_; }

 private:
  ssize_t Cut(const char* why) {
    if (cut_ == nullptr) cut_ = why;
    return -1;
  }

  // One byte of the head: the request line, header lines, the blank line.
  void Head(char c) {
    if (++head_bytes_ > limits_.max_header_bytes) {
      Cut(kRefusedHeaders);
      return;
    }
    if (c == '\r') return;
    if (c != '\n') {
      ++line_bytes_;
      if (lines_ == 0 && line_bytes_ > limits_.max_request_line_bytes) Cut(kRefusedRequestLine);
      return;
    }
    if (lines_ > 0 && line_bytes_ == 0) {  // the blank line: the body's limits from here
      head_done_ = true;
      deadline_ = absl::Now() + limits_.body_timeout;
      return;
    }
    if (++lines_ > limits_.max_header_lines + 1) Cut(kRefusedHeaders);
    line_bytes_ = 0;
  }

  // Up to n bytes (0: end of stream, -1: failed, timed out or cut).
  ssize_t ReadSome(char* p, size_t n) {
    for (;;) {
      Wait waited = Wait::kReady;
      if (ssl_ != nullptr) {
        const int r = SSL_read(ssl_, p, static_cast<int>(n));
        if (r > 0) return r;
        const int e = SSL_get_error(ssl_, r);
        ERR_clear_error();
        if (e == SSL_ERROR_ZERO_RETURN) return 0;
        if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) return -1;
        waited = WaitFd(fd_, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_);
      } else {
        const ssize_t r = recv(fd_, p, n, 0);
        if (r >= 0) return r;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        waited = WaitFd(fd_, POLLIN, deadline_);
      }
      if (waited == Wait::kTimedOut) return Cut(kRefusedSlow);
      if (waited == Wait::kFailed) return -1;
    }
  }

  const int fd_;
  SSL* const ssl_;
  const WebLimits& limits_;
  absl::Time deadline_;  // the head's, then the body's
  const char* cut_ = nullptr;
  size_t head_bytes_ = 0;
  size_t line_bytes_ = 0;  // of the current line, without its line end
  int lines_ = 0;          // complete lines of the head, the request line included
  bool head_done_ = false;
  size_t body_bytes_ = 0;
};

// The TLS handshake, by `deadline`: kReady when done.
Wait Handshake(SSL* ssl, int fd, absl::Time deadline) {
  for (;;) {
    const int r = SSL_accept(ssl);
    if (r == 1) return Wait::kReady;
    const int e = SSL_get_error(ssl, r);
    ERR_clear_error();
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) return Wait::kFailed;
    const Wait w = WaitFd(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
    if (w != Wait::kReady) return w;
  }
}

}  // namespace

GuardedServer::GuardedServer(SSL_CTX* tls, WebLimits limits,
                             std::function<void(const char*)> on_refused)
    : tls_(tls), limits_(std::move(limits)), on_refused_(std::move(on_refused)) {}

bool GuardedServer::TakePeerSlot(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  int& open = open_by_peer_[peer];
  if (open >= std::max(1, limits_.max_connections_per_peer)) return false;
  ++open;
  return true;
}

void GuardedServer::FreePeerSlot(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = open_by_peer_.find(peer);
  if (it != open_by_peer_.end() && --it->second <= 0) open_by_peer_.erase(it);
}

bool GuardedServer::process_and_close_socket(int sock) {
  const absl::Time start = absl::Now();
  std::string peer;
  int peer_port = -1;
  Address(sock, /*peer=*/true, peer, peer_port);
  if (!TakePeerSlot(peer)) {
    on_refused_(kRefusedPeerBusy);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return false;
  }
  const int flags = fcntl(sock, F_GETFL, 0);
  if (flags >= 0) fcntl(sock, F_SETFL, flags | O_NONBLOCK);
  const int one = 1;
  setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  bool ok = true;
  SSL* ssl = nullptr;
  if (tls_ != nullptr) {
    ssl = SSL_new(tls_);
    ok = ssl != nullptr && SSL_set_fd(ssl, sock) == 1;
    if (ok) {
      const Wait w = Handshake(ssl, sock, start + limits_.header_timeout);
      if (w == Wait::kTimedOut) on_refused_(kRefusedSlow);
      ok = w == Wait::kReady;
    }
    ERR_clear_error();
  }
  if (ok) {
    GuardedStream stream(sock, ssl, limits_, start);
    bool closed = false;
    ok = process_request(stream, /*close_connection=*/true, closed,
                         [ssl](httplib::Request& req) { req.ssl = ssl; });
    if (const char* why = stream.cut(); why != nullptr) on_refused_(why);
  }
  if (ssl != nullptr) {
    SSL_shutdown(ssl);  // one try: the peer's close_notify is not waited for
    ERR_clear_error();
    SSL_free(ssl);
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  FreePeerSlot(peer);
  return ok;
}

}  // namespace stagewise::coordinator
