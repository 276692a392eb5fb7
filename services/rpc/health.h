// A plaintext gRPC server that serves only grpc.health.v1 Check. Kubernetes'
// gRPC probes (and most load balancers) speak no TLS and present no client
// certificate, while the main port of a TLS-enabled process requires both;
// so the health check gets its own port (--health-listen). It reveals only
// SERVING / NOT_SERVING, nothing about jobs or the cluster.
#ifndef STAGEWISE_SERVICES_RPC_HEALTH_H_
#define STAGEWISE_SERVICES_RPC_HEALTH_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace stagewise::rpc {

class HealthServer {
 public:
  // Serves on `address` (host:port; port 0 = any free port). UNAVAILABLE
  // naming --health-listen if it cannot bind. Starts SERVING.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address);
  ~HealthServer();

  int port() const { return port_; }
  // NOT_SERVING while the process shuts down (probes stop sending traffic).
  void SetServing(bool serving) { service_.serving = serving; }

 private:
  class Service : public grpc::health::v1::Health::CallbackService {
   public:
    grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                    const grpc::health::v1::HealthCheckRequest* request,
                                    grpc::health::v1::HealthCheckResponse* response) override;
    std::atomic<bool> serving{true};
  };
  HealthServer() = default;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_HEALTH_H_
