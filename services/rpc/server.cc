#include "services/rpc/server.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstdio>
#include <fstream>

namespace stagewise::rpc {

void ConfigureServerBuilder(const RpcOptions& options, grpc::ServerBuilder* builder) {
  // Process-wide switch; must be set before the server is built.
  grpc::EnableDefaultHealthCheckService(true);
  builder->SetMaxReceiveMessageSize(options.max_message_bytes);
  builder->SetMaxSendMessageSize(options.max_message_bytes);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Let clients ping as often as their keepalive says without being cut off.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              options.keepalive_time_ms / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const RpcOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC's reconnect backoff grows to 120 s by default: a peer that comes
  // back after a short outage would wait for it. Our callers retry on their
  // own schedule; the channel only has to be ready by then.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options.max_reconnect_backoff_ms / 4);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options.max_reconnect_backoff_ms);
  // gRPC gives each connection attempt at least this long (20 s by default):
  // an attempt that hangs while the peer restarts would hold every call
  // that waits for the channel that long.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, options.connect_timeout_ms);
  if (options.own_connections) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options.channel_credentials == nullptr) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(target, options.channel_credentials, args);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const RpcOptions& options) {
  return options.server_credentials != nullptr ? options.server_credentials
                                               : grpc::InsecureServerCredentials();
}

absl::Status WritePortFile(const std::string& path, int grpc_port, int metrics_port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << grpc_port << " " << metrics_port << "\n";
    out.flush();
    if (!out) return absl::InternalError("--port-file: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError("--port-file: cannot rename " + tmp + " to " + path);
  }
  return absl::OkStatus();
}

}  // namespace stagewise::rpc
