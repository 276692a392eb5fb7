#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "services/rpc/status.h"

namespace stagewise::rpc {
namespace {

// Spelled out pair by pair so a mapping that is merely "some bijection" (e.g.
// off by one) fails, not only one that loses codes.
const std::vector<std::pair<absl::StatusCode, grpc::StatusCode>>& AllCodes() {
  static const auto* codes = new std::vector<std::pair<absl::StatusCode, grpc::StatusCode>>{
      {absl::StatusCode::kOk, grpc::StatusCode::OK},
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  return *codes;
}

TEST(RpcStatusTest, TableCoversEveryCanonicalCodeWithSameNumber) {
  ASSERT_EQ(AllCodes().size(), 17u);
  for (int i = 0; i < 17; ++i) {
    EXPECT_EQ(static_cast<int>(AllCodes()[i].first), i);
    EXPECT_EQ(static_cast<int>(AllCodes()[i].second), i);
  }
}

TEST(RpcStatusTest, EveryAbslCodeMapsToGrpcAndBack) {
  for (const auto& [absl_code, grpc_code] : AllCodes()) {
    SCOPED_TRACE(absl::StatusCodeToString(absl_code));
    const std::string message = "boom: " + absl::StatusCodeToString(absl_code) + " \xe2\x9c\x93";
    const absl::Status original(absl_code, message);

    const grpc::Status wire = ToGrpcStatus(original);
    EXPECT_EQ(wire.error_code(), grpc_code);
    EXPECT_EQ(static_cast<int>(wire.error_code()), static_cast<int>(absl_code));

    const absl::Status back = FromGrpcStatus(wire);
    EXPECT_EQ(back.code(), absl_code);
    if (absl_code == absl::StatusCode::kOk) {
      EXPECT_TRUE(wire.ok());
      EXPECT_TRUE(back.ok());
    } else {
      EXPECT_EQ(wire.error_message(), message);
      EXPECT_EQ(back.message(), message);
      EXPECT_EQ(back, original);
    }
  }
}

TEST(RpcStatusTest, EveryGrpcCodeMapsToAbslAndBack) {
  for (const auto& [absl_code, grpc_code] : AllCodes()) {
    SCOPED_TRACE(static_cast<int>(grpc_code));
    const grpc::Status original(grpc_code, "detail text");
    const absl::Status converted = FromGrpcStatus(original);
    EXPECT_EQ(converted.code(), absl_code);
    const grpc::Status back = ToGrpcStatus(converted);
    EXPECT_EQ(back.error_code(), grpc_code);
    if (grpc_code != grpc::StatusCode::OK) {
      EXPECT_EQ(converted.message(), "detail text");
      EXPECT_EQ(back.error_message(), "detail text");
    }
  }
}

TEST(RpcStatusTest, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(RpcStatusTest, EmptyMessagePreserved) {
  const grpc::Status wire = ToGrpcStatus(absl::NotFoundError(""));
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(wire.error_message(), "");
  EXPECT_EQ(FromGrpcStatus(wire), absl::NotFoundError(""));
}

TEST(RpcStatusTest, UnrecognisedGrpcCodeStaysAnError) {
  // A newer peer could send a number we do not know; it must not become OK.
  // 20 stays inside grpc::StatusCode's value range (no fixed underlying type,
  // so e.g. 42 would be UB to even store).
  const grpc::Status odd(static_cast<grpc::StatusCode>(20), "from the future");
  const absl::Status converted = FromGrpcStatus(odd);
  EXPECT_EQ(converted.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(converted.message(), "from the future");
}

TEST(RpcStatusTest, UnrecognisedAbslCodeStaysAnError) {
  const absl::Status odd(static_cast<absl::StatusCode>(99), "odd");
  const grpc::Status wire = ToGrpcStatus(odd);
  EXPECT_FALSE(wire.ok());
  EXPECT_EQ(wire.error_message(), "odd");
}

}  // namespace
}  // namespace stagewise::rpc
