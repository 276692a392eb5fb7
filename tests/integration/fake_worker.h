// A client that speaks the worker side of the coordinator protocol by hand:
// registers (or not), opens a Control stream and sends whatever a test wants.
// With a worker certificate it is a rogue (or merely slow) cluster member
// that mutual TLS lets in, so only the coordinator's own checks stand in its
// way. Used by the hostile and limits integration tests.
#ifndef STAGEWISE_TESTS_INTEGRATION_FAKE_WORKER_H_
#define STAGEWISE_TESTS_INTEGRATION_FAKE_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.grpc.pb.h"
#include "tests/oracle/process_cluster.h"

namespace stagewise::testing {

class FakeWorker {
 public:
  FakeWorker(const ProcessCluster& cluster, std::string id)
      : id_(std::move(id)),
        stub_(v1::Coordinator::NewStub(
            rpc::MakeChannel(cluster.coordinator_address(), cluster.RpcOptionsFor("worker")))) {}
  ~FakeWorker() { Close(); }

  grpc::Status Register(const std::string& address = "127.0.0.1:1") {
    v1::RegisterWorkerRequest req;
    req.mutable_worker()->set_worker_id(id_);
    req.mutable_worker()->set_address(address);
    req.mutable_worker()->set_device("cpu");
    req.mutable_worker()->set_protocol(v1::CONTROL_PROTOCOL_V6);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterWorkerResponse resp;
    grpc::Status s = stub_->RegisterWorker(&ctx, req, &resp);
    if (s.ok()) session_ = resp.session();
    return s;
  }

  // Register, then Open: a registered rogue member with its control stream.
  grpc::Status Join() {
    grpc::Status s = Register();
    if (s.ok()) Open();
    return s;
  }

  // Opens the control stream with a heartbeat (carrying the session, if any)
  // and starts reading commands in the background; with `ack_configures` it
  // acknowledges every StageAssignment like a real worker does.
  void Open(const std::string& session_override = "-", bool ack_configures = false) {
    stream_ = stub_->Control(&ctx_);
    v1::WorkerEvent hello;
    hello.set_worker_id(id_);
    hello.set_session(session_override == "-" ? session_ : session_override);
    hello.mutable_heartbeat()->set_unix_ms(1);
    Write(hello);
    reader_ = std::thread([this, ack_configures] {
      v1::Command c;
      while (stream_->Read(&c)) {
        if (c.has_configure()) {
          {
            absl::MutexLock lock(&mu_);
            assignments_.push_back(c.configure());
          }
          if (ack_configures) {
            v1::WorkerEvent ack;
            ack.set_worker_id(id_);
            ack.mutable_ack()->set_command_id(c.command_id());
            Write(ack);
          }
        }
        ++commands_;
      }
      finished_ = stream_->Finish();
      done_ = true;
    });
  }
  // Heartbeats every `period` until Close (so the coordinator keeps it).
  void KeepAlive(absl::Duration period = absl::Milliseconds(500)) {
    heartbeat_ = std::thread([this, period] {
      while (!stop_ && !done_) {
        Heartbeat();
        absl::SleepFor(period);
      }
    });
  }

  bool Send(v1::WorkerEvent e) {
    if (e.worker_id().empty()) e.set_worker_id(id_);
    return Write(e);
  }
  bool Heartbeat() {
    v1::WorkerEvent e;
    e.mutable_heartbeat()->set_unix_ms(1);
    return Send(e);
  }
  // Waits for the coordinator to end the stream; its status.
  grpc::Status WaitClosed(absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!done_ && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    if (!done_) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "still open");
    reader_.join();
    return finished_;
  }
  void Close() {
    stop_ = true;
    if (heartbeat_.joinable()) heartbeat_.join();
    if (!stream_) return;
    ctx_.TryCancel();
    if (reader_.joinable()) reader_.join();
    stream_.reset();
  }
  bool done() const { return done_; }
  int commands() const { return commands_; }
  std::string configured_job() const {
    absl::MutexLock lock(&mu_);
    return assignments_.empty() ? "" : assignments_.back().job_id();
  }
  // The StageAssignments received so far.
  std::vector<v1::StageAssignment> assignments() const {
    absl::MutexLock lock(&mu_);
    return assignments_;
  }

 private:
  // One write in flight on the stream (the reader acks, the test sends).
  bool Write(const v1::WorkerEvent& e) {
    absl::MutexLock lock(&write_mu_);
    return stream_->Write(e);
  }

  std::string id_;
  std::string session_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerEvent, v1::Command>> stream_;
  std::thread reader_;
  std::thread heartbeat_;
  std::atomic<bool> done_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int> commands_{0};
  absl::Mutex write_mu_;
  mutable absl::Mutex mu_;
  std::vector<v1::StageAssignment> assignments_ ABSL_GUARDED_BY(mu_);
  grpc::Status finished_;
};

}  // namespace stagewise::testing

#endif  // STAGEWISE_TESTS_INTEGRATION_FAKE_WORKER_H_
