// What one request to the status pages may send before it is answered
// (docs/security.md, "Status pages"); enforced by GuardedServer
// (coordinator/guarded_http.h).
#ifndef STAGEWISE_COORDINATOR_WEB_LIMITS_H_
#define STAGEWISE_COORDINATOR_WEB_LIMITS_H_

#include <cstddef>

#include "absl/time/time.h"

namespace stagewise::coordinator {

struct WebLimits {
  size_t max_request_line_bytes = 8 * 1024;  // "GET /path?query HTTP/1.1"
  size_t max_header_bytes = 32 * 1024;       // request line and header lines together
  int max_header_lines = 64;                 // header lines (the request line not counted)
  size_t max_body_bytes = 4096;              // the sign-in form is the only body
  // From the connection's start (TLS handshake included) to the end of the
  // headers; then the body's own time.
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(10);
  absl::Duration write_timeout = absl::Seconds(10);
  // Connections one peer address may have open at once (the rest are closed
  // at once): a slow client from one address cannot take every thread.
  int max_connections_per_peer = 4;
};

// Why a request was cut off (the refusal metric's reason label).
inline constexpr char kRefusedRequestLine[] = "web_request_line";
inline constexpr char kRefusedHeaders[] = "web_headers";
inline constexpr char kRefusedBody[] = "web_body";
inline constexpr char kRefusedSlow[] = "web_slow";
inline constexpr char kRefusedPeerBusy[] = "web_peer_busy";

}  // namespace stagewise::coordinator

#endif  // STAGEWISE_COORDINATOR_WEB_LIMITS_H_
