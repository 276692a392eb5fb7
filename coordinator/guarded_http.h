// Bounds on what a stranger can make the status pages' HTTP server hold
// before a request is authenticated (docs/security.md, "Status pages").
//
// cpp-httplib (Debian's 0.11, a compiled library) reads the request line and
// header lines into memory until the blank line, with a limit per line but
// none on their number or total, and a read timeout per read but none on the
// whole head: a 100 MiB header flood was held in full before the token check
// could answer 401, and a client sending a byte every few seconds kept a
// thread forever. GuardedServer keeps httplib's parsing and routing but owns
// the connection: it accepts TLS itself, and every byte httplib reads goes
// through a GuardedStream that counts the head (request line, header lines,
// their total) against WebLimits, holds the whole head to one deadline from
// the connection's start (the TLS handshake included) and the body to its own
// size and deadline. A request over a limit is cut off: the stream fails,
// httplib gives up on it, and the connection is closed; the refusal is
// reported to on_refused with its reason.
#ifndef STAGEWISE_COORDINATOR_GUARDED_HTTP_H_
#define STAGEWISE_COORDINATOR_GUARDED_HTTP_H_

#include <httplib.h>
#include <openssl/ssl.h>

#include <functional>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "coordinator/web_limits.h"

namespace stagewise::coordinator {

class GuardedServer : public httplib::Server {
 public:
  // `tls`: the server context for HTTPS (null: plaintext); not owned, must
  // outlive the server. `on_refused` is called from the serving threads.
  GuardedServer(SSL_CTX* tls, WebLimits limits, std::function<void(const char*)> on_refused);

 private:
  // httplib calls this for every accepted connection on a pool thread: one
  // request, under the limits, then the connection is closed.
  bool process_and_close_socket(int sock) override;

  bool TakePeerSlot(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);
  void FreePeerSlot(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);

  SSL_CTX* const tls_;
  const WebLimits limits_;
  const std::function<void(const char*)> on_refused_;
  absl::Mutex mu_;
  std::map<std::string, int> open_by_peer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_GUARDED_HTTP_H_
