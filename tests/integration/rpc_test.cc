// Real gRPC servers on port 0 in this process: the health service answers,
// and tensors far above gRPC's default 4 MiB limit cross a StageService stream
// in both directions with the shared limits.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "services/rpc/server.h"
#include "services/rpc/status.h"
#include "services/tensor/codec.h"
#include "stagewise/v1/stage.grpc.pb.h"

namespace stagewise {
namespace {

// Echoes every message back with kind BACKWARD (what stage j+1 does to j).
class EchoStage final : public v1::StageService::Service {
  grpc::Status Exchange(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::StageMessage, v1::StageMessage>* stream) override {
    v1::StageMessage m;
    while (stream->Read(&m)) {
      for (const auto& [name, tensor] : m.tensors()) {
        if (absl::Status s = ValidateTensorProto(tensor); !s.ok()) return rpc::ToGrpcStatus(s);
      }
      m.set_kind(v1::StageMessage::BACKWARD);
      if (!stream->Write(m)) break;
    }
    return grpc::Status::OK;
  }
};

class RpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    rpc::ConfigureServerBuilder(rpc::RpcOptions{}, &builder);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&echo_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_);
    ASSERT_GT(port_, 0);
    channel_ = rpc::MakeChannel("127.0.0.1:" + std::to_string(port_));
  }
  void TearDown() override { server_->Shutdown(); }

  EchoStage echo_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RpcTest, HealthServiceReportsServing) {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  grpc::ClientContext unknown_ctx;
  req.set_service("no.such.Service");
  s = stub->Check(&unknown_ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RpcTest, LargeTensorsCrossAStageStream) {
  auto stub = v1::StageService::NewStub(channel_);
  grpc::ClientContext ctx;
  auto stream = stub->Exchange(&ctx);
  torch::manual_seed(0);
  torch::Tensor big = torch::randn({10, 1024, 1024});  // 40 MiB, 10x gRPC's default cap
  v1::StageMessage out;
  out.set_job_id("job-1");
  out.set_kind(v1::StageMessage::FORWARD);
  out.set_step(7);
  ASSERT_TRUE(EncodeTensor(big, &(*out.mutable_tensors())["x"]).ok());
  ASSERT_TRUE(EncodeTensor(torch::arange(10), &(*out.mutable_tensors())["labels"]).ok());
  (*out.mutable_scalars())["loss"] = 1.5;
  ASSERT_TRUE(stream->Write(out));
  v1::StageMessage in;
  ASSERT_TRUE(stream->Read(&in));
  stream->WritesDone();
  ASSERT_TRUE(stream->Finish().ok());
  EXPECT_EQ(in.kind(), v1::StageMessage::BACKWARD);
  EXPECT_EQ(in.step(), 7);
  EXPECT_DOUBLE_EQ(in.scalars().at("loss"), 1.5);
  auto x = DecodeTensor(in.tensors().at("x"));
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_TRUE(torch::equal(*x, big));
  auto labels = DecodeTensor(in.tensors().at("labels"));
  ASSERT_TRUE(labels.ok());
  EXPECT_TRUE(torch::equal(*labels, torch::arange(10)));
}

TEST_F(RpcTest, MalformedTensorIsInvalidArgumentAtTheEdge) {
  auto stub = v1::StageService::NewStub(channel_);
  grpc::ClientContext ctx;
  auto stream = stub->Exchange(&ctx);
  v1::StageMessage out;
  auto& t = (*out.mutable_tensors())["x"];
  t.set_dtype(v1::DTYPE_FLOAT32);
  t.add_shape(4);
  t.set_data("abc");  // 3 bytes, 16 expected
  ASSERT_TRUE(stream->Write(out));
  stream->WritesDone();
  v1::StageMessage ignored;
  EXPECT_FALSE(stream->Read(&ignored));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("tensor.data"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace stagewise
