#include "services/rpc/health.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace stagewise::rpc {

grpc::ServerUnaryReactor* HealthServer::Service::Check(
    grpc::CallbackServerContext* context, const grpc::health::v1::HealthCheckRequest* request,
    grpc::health::v1::HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Only the whole process ("") is known here.
  if (!request->service().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "only the empty service name (the whole process) is served"));
    return reactor;
  }
  response->set_status(serving ? grpc::health::v1::HealthCheckResponse::SERVING
                               : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address) {
  std::unique_ptr<HealthServer> health(new HealthServer());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &health->port_);
  builder.RegisterService(&health->service_);
  health->server_ = builder.BuildAndStart();
  if (!health->server_ || health->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--health-listen: cannot serve the health check on ", address));
  }
  return health;
}

HealthServer::~HealthServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace stagewise::rpc
