// Server and channel settings shared by every stagewise process: explicit
// message limits and matching keepalive on both ends, and the standard
// grpc.health.v1 service on every server (Kubernetes probes).
#ifndef STAGEWISE_SERVICES_RPC_SERVER_H_
#define STAGEWISE_SERVICES_RPC_SERVER_H_

#include <grpcpp/channel.h>
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
};

// Applies limits and keepalive to `builder` and enables the health service.
// Call before builder.BuildAndStart().
void ConfigureServerBuilder(const RpcOptions& options, grpc::ServerBuilder* builder);

// Insecure channel to `target` ("host:port") with the same limits and keepalive.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const RpcOptions& options = {});

// Writes "GRPC_PORT METRICS_PORT\n" to `path` atomically (temp file, then
// rename) so a supervisor (`stagewise local`) learns the ports a process bound.
absl::Status WritePortFile(const std::string& path, int grpc_port, int metrics_port);

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_SERVER_H_
