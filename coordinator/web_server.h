// The coordinator's status pages over HTTP(S) (docs/status_page.md), served by
// cpp-httplib (Debian's libcpp-httplib, built with OpenSSL). Debian 12's
// civetweb, which prometheus-cpp's /metrics uses, cannot do TLS with
// OpenSSL 3 (it looks up SSL_get_peer_certificate, which OpenSSL 3 no longer
// exports, and drops every HTTPS connection).
//
// Transport: HTTPS with the coordinator's own certificate and key when TLS is
// on (--tls-cert/--tls-key; browsers present no client certificate, so none
// is asked for; re-read every --tls-reload-seconds like the gRPC port's, each
// handshake taking the newest valid pair), plaintext otherwise, under the same listen rule as gRPC
// (plaintext only on loopback unless --insecure). Access: with --tokens, a
// read token is needed, sent as "Authorization: Bearer <secret>" or through
// the sign-in form, which keeps it in an HttpOnly, SameSite=Strict cookie
// (Secure over HTTPS); the tokens in force are the coordinator's, reloads
// included. Before a request is authenticated, what it may send is bounded
// (WebLimits, coordinator/guarded_http.h): a request over a limit is cut
// off and counted in stagewise_coordinator_refused_total{reason="web_..."}.
// Pages are rendered by status_page.h from the JobManager's
// queries; the server only reads.
#ifndef STAGEWISE_COORDINATOR_WEB_SERVER_H_
#define STAGEWISE_COORDINATOR_WEB_SERVER_H_

#include <openssl/types.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "coordinator/job_manager.h"
#include "coordinator/web_limits.h"
#include "services/metrics/metrics.h"
#include "services/rpc/tls.h"
#include "services/rpc/tokens.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace stagewise::coordinator {

struct WebOptions {
  std::string listen;  // host:port ("127.0.0.1:0": any free port)
  rpc::TlsConfig tls;  // HTTPS with its cert and key when enabled()
  // The tokens in force (null: no token asked for, as the gRPC API).
  const rpc::TokenFile* tokens = nullptr;
  int refresh_seconds = 5;  // the pages' own refresh
  int threads = 8;          // threads answering requests
  // What one request may send before it is answered (a request over a limit
  // is cut off and its connection closed).
  WebLimits limits;
  // Counts the cut-off requests by reason (null: not counted).
  metrics::CoordinatorMetrics* metrics = nullptr;
};

class ServedCertificate;  // web_server.cc
class GuardedServer;      // guarded_http.h

class WebServer {
 public:
  // Checks the listen rule and TLS files, then serves. Errors name the flag
  // (--web-listen, --tls-cert).
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(const JobManager* manager,
                                                          WebOptions options);
  ~WebServer();
  WebServer(const WebServer&) = delete;
  WebServer& operator=(const WebServer&) = delete;

  int port() const { return port_; }
  bool https() const { return options_.tls.enabled(); }

 private:
  WebServer(const JobManager* manager, WebOptions options);
  void Serve(const httplib::Request& request, httplib::Response& response) const;
  // /api/v1/...: the same reads as JSON (docs/status_page.md, "JSON API").
  void ServeApi(const httplib::Request& request, httplib::Response& response) const;

  // Every tls.reload_seconds: the certificate files again, into cert_.
  void WatchCertificate();

  const JobManager* const manager_;
  const WebOptions options_;
  struct FreeSslCtx {
    void operator()(SSL_CTX* ctx) const;
  };
  std::unique_ptr<ServedCertificate> cert_;       // HTTPS only
  std::unique_ptr<SSL_CTX, FreeSslCtx> tls_ctx_;  // HTTPS only; outlives server_
  std::unique_ptr<GuardedServer> server_;
  std::thread thread_;
  absl::Notification stop_watching_;
  std::thread watcher_;
  int port_ = 0;
};

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_WEB_SERVER_H_
