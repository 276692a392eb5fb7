// Server and channel settings shared by every stagewise process: explicit
// message limits and matching keepalive on both ends, and the standard
// grpc.health.v1 service on every server (Kubernetes probes).
#ifndef STAGEWISE_SERVICES_RPC_SERVER_H_
#define STAGEWISE_SERVICES_RPC_SERVER_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace stagewise::rpc {

struct RpcOptions {
  // Bounds one message either way. Nothing is chunked: a StageMessage (all its
  // tensors) must fit, or the call fails with RESOURCE_EXHAUSTED.
  int max_message_bytes = 256 << 20;
  int keepalive_time_ms = 20000;
  int keepalive_timeout_ms = 10000;
  // Clients: the longest wait between the channel's reconnect attempts, and
  // how long one attempt (TCP and TLS handshakes) may take.
  int max_reconnect_backoff_ms = 1000;
  int connect_timeout_ms = 5000;
  // Clients: connections of this channel alone (gRPC otherwise shares a
  // connection between channels with the same target and settings).
  bool own_connections = false;
  // Transport security, built from the TLS flags by services/rpc/tls.h
  // (ApplyTls). Null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  std::shared_ptr<grpc::ServerCredentials> server_credentials;
  // Clients: the name to verify in the server's certificate instead of the
  // target's host ("" = the host).
  std::string tls_server_name;
  // Clients of the coordinator: sent as "authorization: Bearer <token>" with
  // every call ("" = none). Workers never send one.
  std::string bearer_token;
  // Clients of the coordinator: the version sent as x-stagewise-version
  // ("" = this build's, services/common/version.h; tests set another).
  std::string client_version;
  // Emulated one-way link latency (benchmarks and tests; worker
  // --emulate-link-delay-ms): the data messages a worker's stages receive
  // from their neighbours reach them this long after they arrived
  // (worker/link_delay.h). 0: none.
  double emulated_link_delay_ms = 0;
};

// The server credentials of `options` (plaintext when none were set).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const RpcOptions& options);

// Applies limits and keepalive to `builder` and enables the health service.
// Call before builder.BuildAndStart().
void ConfigureServerBuilder(const RpcOptions& options, grpc::ServerBuilder* builder);

// Channel to `target` ("host:port") with the same limits and keepalive, and
// the credentials of `options` (plaintext when none were set).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const RpcOptions& options = {});

// Writes "GRPC_PORT METRICS_PORT\n" to `path` atomically (temp file, then
// rename) so a supervisor (`stagewise local`) learns the ports a process bound.
absl::Status WritePortFile(const std::string& path, int grpc_port, int metrics_port);

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_SERVER_H_
