// PeerStream over a real in-process gRPC server on 127.0.0.1: a
// DownstreamStream (client) dials an UpstreamStream (server), both feeding
// test sinks.
#include "worker/peer_stream.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/rpc/server.h"

namespace stagewise::worker {
namespace {

constexpr absl::Duration kPatience = absl::Seconds(30);  // a hang fails, never a slow run

v1::StageMessage Message(int64_t step, size_t payload_bytes = 0) {
  v1::StageMessage m;
  m.set_job_id("job");
  m.set_kind(v1::StageMessage::FORWARD);
  m.set_step(step);
  if (payload_bytes > 0) (*m.mutable_tensors())["x"].set_data(std::string(payload_bytes, 'x'));
  return m;
}

// Buffers what it is given. At `capacity` buffered messages it pauses the
// stream (Deliver returns false) until Drain; a Deliver while paused means the
// stream did not stop reading.
class TestSink : public MessageSink {
 public:
  explicit TestSink(size_t capacity = std::numeric_limits<size_t>::max(),
                    absl::Status reject = absl::OkStatus())
      : capacity_(capacity), reject_(std::move(reject)) {}

  absl::StatusOr<bool> Deliver(v1::StageMessage message, std::function<void()> resume) override {
    absl::MutexLock lock(&mu_);
    if (!reject_.ok()) return reject_;
    if (resume_) ++violations_;
    steps_.push_back(message.step());
    if (++buffered_ < capacity_) return true;
    ++pauses_;
    resume_ = std::move(resume);
    return false;
  }

  void StreamClosed(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    ++closed_calls_;
    closed_ = status;
  }

  // Consumes the buffered messages and resumes a paused stream.
  void Drain() {
    std::function<void()> resume;
    {
      absl::MutexLock lock(&mu_);
      buffered_ = 0;
      resume = std::move(resume_);
      resume_ = nullptr;
    }
    if (resume) resume();
  }

  bool WaitReceived(size_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return steps_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), kPatience);
  }
  bool WaitPausedOrReceived(size_t n) {
    absl::MutexLock lock(&mu_);
    auto ready = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return resume_ != nullptr || steps_.size() >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), kPatience);
  }
  // The stream's final status, once StreamClosed ran.
  std::optional<absl::Status> WaitClosed() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_calls_ > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), kPatience)) return std::nullopt;
    return closed_;
  }

  std::vector<int64_t> steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  int violations() const {
    absl::MutexLock lock(&mu_);
    return violations_;
  }
  int pauses() const {
    absl::MutexLock lock(&mu_);
    return pauses_;
  }
  int closed_calls() const {
    absl::MutexLock lock(&mu_);
    return closed_calls_;
  }

 private:
  const size_t capacity_;
  const absl::Status reject_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
  size_t buffered_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> resume_ ABSL_GUARDED_BY(mu_);
  int violations_ ABSL_GUARDED_BY(mu_) = 0;
  int pauses_ ABSL_GUARDED_BY(mu_) = 0;
  int closed_calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

// StageService whose every Exchange is routed to one sink.
class TestService : public v1::StageService::CallbackService {
 public:
  TestService(MessageSink* sink, size_t outbox_capacity)
      : sink_(sink), outbox_capacity_(outbox_capacity) {}

  grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage>* Exchange(
      grpc::CallbackServerContext*) override {
    return UpstreamStream::Start(
        [this](const v1::StageMessage& first, std::shared_ptr<UpstreamStream> stream,
               MessageSink** sink) {
          if (first.job_id() != "job") {
            return absl::FailedPreconditionError(absl::StrCat("no job '", first.job_id(), "'"));
          }
          absl::MutexLock lock(&mu_);
          upstream_ = std::move(stream);
          *sink = sink_;
          return absl::OkStatus();
        },
        outbox_capacity_);
  }

  std::shared_ptr<UpstreamStream> WaitUpstream() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return upstream_ != nullptr; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), kPatience);
    return upstream_;
  }
  std::shared_ptr<UpstreamStream> upstream() {
    absl::MutexLock lock(&mu_);
    return upstream_;
  }

 private:
  MessageSink* const sink_;
  const size_t outbox_capacity_;
  absl::Mutex mu_;
  std::shared_ptr<UpstreamStream> upstream_ ABSL_GUARDED_BY(mu_);
};

class PeerStreamTest : public ::testing::Test {
 protected:
  // The server delivers into `server_sink` (owned by the test).
  void StartServer(MessageSink* server_sink, size_t server_outbox = 8) {
    service_ = std::make_unique<TestService>(server_sink, server_outbox);
    grpc::ServerBuilder builder;
    rpc::ConfigureServerBuilder(rpc::RpcOptions{}, &builder);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    stub_ = v1::StageService::NewStub(rpc::MakeChannel(absl::StrCat("127.0.0.1:", port)));
  }

  std::shared_ptr<DownstreamStream> Dial(MessageSink* client_sink, size_t client_outbox = 8) {
    client_ = DownstreamStream::Open(stub_.get(), client_sink, client_outbox);
    return client_;
  }

  // Whatever a test left running is torn down before the sinks go away.
  void TearDown() override {
    if (client_) client_->Close(absl::CancelledError("test over"));
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    if (client_) client_->WaitDone();
    if (service_) {
      if (auto upstream = service_->upstream()) upstream->WaitDone();
    }
    if (server_) server_->Wait();
  }

  std::unique_ptr<TestService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::StageService::Stub> stub_;
  std::shared_ptr<DownstreamStream> client_;
};

TEST_F(PeerStreamTest, MessagesArriveInOrderBothWaysAndACleanCloseEndsBothEnds) {
  TestSink server_sink;
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink);
  constexpr int kForward = 200;
  constexpr int kBackward = 50;
  for (int i = 0; i < kForward; ++i) ASSERT_TRUE(client->Send(Message(i)).ok());
  auto upstream = service_->WaitUpstream();
  ASSERT_NE(upstream, nullptr);
  for (int i = 0; i < kBackward; ++i) ASSERT_TRUE(upstream->Send(Message(1000 + i)).ok());
  ASSERT_TRUE(server_sink.WaitReceived(kForward));
  ASSERT_TRUE(client_sink.WaitReceived(kBackward));

  // Stage j closes its writes; stage j+1 then ends the call.
  client->Close(absl::OkStatus());
  client->WaitDone();
  upstream->WaitDone();
  EXPECT_TRUE(client->done());
  EXPECT_TRUE(upstream->done());
  EXPECT_EQ(server_sink.WaitClosed(), absl::OkStatus());
  EXPECT_EQ(client_sink.WaitClosed(), absl::OkStatus());
  EXPECT_EQ(server_sink.closed_calls(), 1);
  EXPECT_EQ(client_sink.closed_calls(), 1);

  std::vector<int64_t> forward = server_sink.steps();
  ASSERT_EQ(forward.size(), static_cast<size_t>(kForward));
  for (int i = 0; i < kForward; ++i) EXPECT_EQ(forward[i], i);
  std::vector<int64_t> backward = client_sink.steps();
  ASSERT_EQ(backward.size(), static_cast<size_t>(kBackward));
  for (int i = 0; i < kBackward; ++i) EXPECT_EQ(backward[i], 1000 + i);
  // Both ends refuse sends once the call is over.
  EXPECT_FALSE(client->Send(Message(0)).ok());
  EXPECT_FALSE(upstream->Send(Message(0)).ok());
}

TEST_F(PeerStreamTest, AFullSinkPausesReadsUntilItHasRoom) {
  constexpr size_t kSinkCapacity = 3;
  constexpr int kMessages = 60;
  TestSink server_sink(kSinkCapacity);
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink, /*client_outbox=*/4);
  absl::Status send_status;
  std::thread sender([&] {
    for (int i = 0; i < kMessages && send_status.ok(); ++i) send_status = client->Send(Message(i));
  });
  size_t seen = 0;
  while (seen < static_cast<size_t>(kMessages)) {
    ASSERT_TRUE(server_sink.WaitPausedOrReceived(kMessages));
    seen = server_sink.steps().size();
    server_sink.Drain();
  }
  sender.join();
  ASSERT_TRUE(send_status.ok()) << send_status;
  EXPECT_EQ(server_sink.violations(), 0);  // no delivery while paused
  EXPECT_EQ(server_sink.pauses(), kMessages / static_cast<int>(kSinkCapacity));
  std::vector<int64_t> steps = server_sink.steps();
  ASSERT_EQ(steps.size(), static_cast<size_t>(kMessages));
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(steps[i], i);

  client->Close(absl::OkStatus());
  client->WaitDone();
  EXPECT_EQ(client_sink.WaitClosed(), absl::OkStatus());
  EXPECT_EQ(server_sink.WaitClosed(), absl::OkStatus());
}

TEST_F(PeerStreamTest, ClientClosingWithAnErrorCancelsTheServerEnd) {
  TestSink server_sink;
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink);
  ASSERT_TRUE(client->Send(Message(0)).ok());
  ASSERT_TRUE(server_sink.WaitReceived(1));
  auto upstream = service_->WaitUpstream();
  ASSERT_NE(upstream, nullptr);

  client->Close(absl::InternalError("stage j failed"));
  client->WaitDone();
  upstream->WaitDone();
  std::optional<absl::Status> at_server = server_sink.WaitClosed();
  ASSERT_TRUE(at_server.has_value());
  EXPECT_EQ(at_server->code(), absl::StatusCode::kCancelled) << *at_server;
  std::optional<absl::Status> at_client = client_sink.WaitClosed();
  ASSERT_TRUE(at_client.has_value());
  EXPECT_EQ(at_client->code(), absl::StatusCode::kCancelled) << *at_client;
  EXPECT_FALSE(client->Send(Message(1)).ok());
  EXPECT_FALSE(upstream->Send(Message(1)).ok());
}

TEST_F(PeerStreamTest, ServerClosingWithAnErrorReachesTheClientSinkAsThatStatus) {
  TestSink server_sink;
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink);
  ASSERT_TRUE(client->Send(Message(0)).ok());
  auto upstream = service_->WaitUpstream();
  ASSERT_NE(upstream, nullptr);

  upstream->Close(absl::FailedPreconditionError("the job stopped on stage j+1"));
  upstream->WaitDone();
  // Stage j ends its side when its job stops; the call's status is then j+1's.
  client->Close(absl::OkStatus());
  client->WaitDone();
  std::optional<absl::Status> at_client = client_sink.WaitClosed();
  ASSERT_TRUE(at_client.has_value());
  EXPECT_EQ(at_client->code(), absl::StatusCode::kFailedPrecondition) << *at_client;
  EXPECT_EQ(at_client->message(), "the job stopped on stage j+1");
  // The client's later sends report the call's final status.
  absl::Status late = client->Send(Message(1));
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
}

TEST_F(PeerStreamTest, ASinkErrorEndsTheStreamWithThatStatus) {
  TestSink server_sink(std::numeric_limits<size_t>::max(),
                       absl::InvalidArgumentError("StageMessage.kind: not for this stage"));
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink);
  ASSERT_TRUE(client->Send(Message(0)).ok());
  auto upstream = service_->WaitUpstream();
  ASSERT_NE(upstream, nullptr);
  upstream->WaitDone();
  client->Close(absl::OkStatus());
  client->WaitDone();
  std::optional<absl::Status> at_client = client_sink.WaitClosed();
  ASSERT_TRUE(at_client.has_value());
  EXPECT_EQ(at_client->code(), absl::StatusCode::kInvalidArgument) << *at_client;
  EXPECT_EQ(at_client->message(), "StageMessage.kind: not for this stage");
}

TEST_F(PeerStreamTest, AnUnroutableFirstMessageEndsTheStream) {
  TestSink server_sink;
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink);
  v1::StageMessage stray = Message(0);
  stray.set_job_id("other");
  ASSERT_TRUE(client->Send(stray).ok());
  // The server end ends the call at once; stage j learns why when it ends its side.
  client->Close(absl::OkStatus());
  client->WaitDone();
  std::optional<absl::Status> at_client = client_sink.WaitClosed();
  ASSERT_TRUE(at_client.has_value());
  EXPECT_EQ(at_client->code(), absl::StatusCode::kFailedPrecondition) << *at_client;
  EXPECT_EQ(server_sink.closed_calls(), 0);  // never routed to it
  EXPECT_TRUE(server_sink.steps().empty());
}

// Stage j+1 stops reading (a full inbox) while stage j keeps sending large
// messages, so writes queue up on the client; then `tear_down` ends the call.
// The blocked sender must wake with an error.
void FillThenTearDown(TestSink* server_sink, const std::shared_ptr<DownstreamStream>& client,
                      const std::function<void()>& tear_down) {
  constexpr size_t kPayload = 1 << 20;
  std::atomic<int> sent{0};
  absl::Status last = absl::OkStatus();
  std::thread sender([&] {
    for (int i = 0;; ++i) {
      last = client->Send(Message(i, kPayload));
      if (!last.ok()) return;
      sent.fetch_add(1);
    }
  });
  ASSERT_TRUE(server_sink->WaitReceived(1));  // now paused: capacity 1
  // Message 0 was read, so the outbox took messages 1 and 2 (capacity 2):
  // accepted, not read.
  while (sent.load() < 3) absl::SleepFor(absl::Milliseconds(1));
  tear_down();
  sender.join();
  client->WaitDone();
  EXPECT_FALSE(last.ok());
  EXPECT_LT(server_sink->steps().size(), static_cast<size_t>(sent.load()));
  EXPECT_FALSE(client->Send(Message(0)).ok());
}

TEST_F(PeerStreamTest, ClientTeardownWhileWritesAreQueued) {
  TestSink server_sink(/*capacity=*/1);
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink, /*client_outbox=*/2);
  FillThenTearDown(&server_sink, client,
                   [&] { client->Close(absl::AbortedError("stage j stopped")); });
  auto upstream = service_->WaitUpstream();
  ASSERT_NE(upstream, nullptr);
  upstream->WaitDone();
  std::optional<absl::Status> at_server = server_sink.WaitClosed();
  ASSERT_TRUE(at_server.has_value());
  EXPECT_EQ(at_server->code(), absl::StatusCode::kCancelled) << *at_server;
  std::optional<absl::Status> at_client = client_sink.WaitClosed();
  ASSERT_TRUE(at_client.has_value());
  EXPECT_FALSE(at_client->ok());
}

TEST_F(PeerStreamTest, ServerShutdownWhileWritesAreQueued) {
  TestSink server_sink(/*capacity=*/1);
  TestSink client_sink;
  StartServer(&server_sink);
  auto client = Dial(&client_sink, /*client_outbox=*/2);
  FillThenTearDown(&server_sink, client,
                   [&] { server_->Shutdown(std::chrono::system_clock::now()); });
  std::optional<absl::Status> at_client = client_sink.WaitClosed();
  ASSERT_TRUE(at_client.has_value());
  EXPECT_FALSE(at_client->ok());
  auto upstream = service_->upstream();
  ASSERT_NE(upstream, nullptr);
  upstream->WaitDone();
  std::optional<absl::Status> at_server = server_sink.WaitClosed();
  ASSERT_TRUE(at_server.has_value());
  EXPECT_EQ(at_server->code(), absl::StatusCode::kCancelled) << *at_server;
}

}  // namespace
}  // namespace stagewise::worker
