// The one place where absl::Status becomes grpc::Status and back.
#ifndef STAGEWISE_SERVICES_RPC_STATUS_H_
#define STAGEWISE_SERVICES_RPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace stagewise::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace stagewise::rpc

#endif  // STAGEWISE_SERVICES_RPC_STATUS_H_
