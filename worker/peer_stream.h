// The two ends of StageService.Exchange as callback reactors. Reactor
// callbacks never block: incoming messages go to a sink (the stage's inbox);
// reads pause while the inbox is full and resume when it has room; outgoing
// messages wait in a bounded rpc::Outbox with one write in flight.
#ifndef STAGEWISE_WORKER_PEER_STREAM_H_
#define STAGEWISE_WORKER_PEER_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/rpc/outbox.h"
#include "stagewise/v1/stage.grpc.pb.h"

namespace stagewise::worker {

// Where a stream delivers what it reads. Deliver returns true to keep reading
// now, false when the sink is full (it then runs `resume` once it has room), or
// an error that ends the stream (the peer gets it as the stream status).
class MessageSink {
 public:
  virtual ~MessageSink() = default;
  virtual absl::StatusOr<bool> Deliver(v1::StageMessage message, std::function<void()> resume) = 0;
  // The stream ended: OK when the peer closed cleanly, else why it broke.
  virtual void StreamClosed(const absl::Status& status) = 0;
};

class PeerStream : public std::enable_shared_from_this<PeerStream> {
 public:
  PeerStream(std::string name, size_t outbox_capacity);
  virtual ~PeerStream() = default;

  // Blocks while the outbox is full. Fails once the stream is closed or broken.
  // (Virtual for NeighbourLink's tests.)
  virtual absl::Status Send(v1::StageMessage message) { return outbox_.Send(std::move(message)); }
  // Never blocks (from inside a reaction): RESOURCE_EXHAUSTED when full.
  absl::Status TrySend(v1::StageMessage message) { return outbox_.TrySend(std::move(message)); }
  // No more sends; ends the stream once queued writes are out. An error status
  // drops the queued writes and is reported to the peer (server side) or
  // cancels the call at once (client side).
  virtual void Close(const absl::Status& status) {
    outbox_.Close(status);
    if (!status.ok()) OnClosedWithError();
  }
  // Blocks until gRPC is done with the stream (the sink has been told) and
  // has dropped its own reference to it. Call it before dropping the last
  // reference of your own (and, for a client, the channel): then the stream,
  // its ClientContext and maybe the channel are destroyed on your thread,
  // never on a gRPC callback thread (destroying the last channel there makes
  // gRPC join that very thread and free its completion queue under it).
  virtual void WaitDone() const {
    outbox_.WaitDone();
    absl::MutexLock lock(&released_->mu);
    released_->mu.Await(absl::Condition(&released_->released));
  }
  bool done() const { return outbox_.done(); }
  const std::string& name() const { return outbox_.name(); }

 protected:
  // Starts the first read; call once the reactor is ready.
  void BeginReading(MessageSink* sink);
  void OnReadDoneImpl(bool ok);
  void OnWriteDoneImpl(bool ok) { outbox_.OnWriteDone(ok); }
  void OnDoneImpl(const absl::Status& status);

  virtual void DoStartRead(v1::StageMessage* into) = 0;
  virtual void DoStartWrite(const v1::StageMessage* message) = 0;
  virtual void DoFinish(const absl::Status& status) = 0;
  // The peer will send nothing more.
  virtual void OnReadSideDone() {}
  // Close was called with an error (maybe not the first Close).
  virtual void OnClosedWithError() {}

  // Keeps the object alive while gRPC holds the reactor.
  std::shared_ptr<PeerStream> self_;
  // Set once OnDone has dropped self_ (shared: it outlives the stream when
  // that was the last reference).
  struct Released {
    absl::Mutex mu;
    bool released ABSL_GUARDED_BY(mu) = false;
  };
  const std::shared_ptr<Released> released_ = std::make_shared<Released>();

 private:
  // The sink has room again: read on, from outside a reaction.
  void ResumeRead();

  MessageSink* sink_ = nullptr;
  // Only touched by the one read in flight (reads are never concurrent).
  v1::StageMessage read_buffer_;
  rpc::Outbox<v1::StageMessage> outbox_;
};

// Server end, on stage j+1: created by StageService for each Exchange call.
// The sink is chosen from the first message (its job id) by `route`.
class UpstreamStream : public PeerStream,
                       public grpc::ServerBidiReactor<v1::StageMessage, v1::StageMessage> {
 public:
  using Router = std::function<absl::Status(
      const v1::StageMessage& first, std::shared_ptr<UpstreamStream> stream, MessageSink** sink)>;
  // Creates the reactor (owned by gRPC until OnDone) and starts reading.
  static UpstreamStream* Start(Router router, size_t outbox_capacity);
  ~UpstreamStream() override;

  void OnReadDone(bool ok) override { OnReadDoneImpl(ok); }
  void OnWriteDone(bool ok) override { OnWriteDoneImpl(ok); }
  void OnCancel() override;
  void OnDone() override;

 private:
  class RoutingSink;
  explicit UpstreamStream(size_t outbox_capacity);
  void DoStartRead(v1::StageMessage* into) override { StartRead(into); }
  void DoStartWrite(const v1::StageMessage* m) override { StartWrite(m); }
  void DoFinish(const absl::Status& status) override;
  // Stage j closes its writes only when the job is over on its side; a
  // stream that ends before its first valid message finishes with
  // INVALID_ARGUMENT (a garbled frame).
  void OnReadSideDone() override;
  std::unique_ptr<RoutingSink> router_sink_;
  // Set by OnCancel, read by OnDone: the status the sink is told.
  std::atomic<bool> cancelled_{false};
};

// Client end, on stage j: dials stage j+1.
class DownstreamStream : public PeerStream,
                         public grpc::ClientBidiReactor<v1::StageMessage, v1::StageMessage> {
 public:
  static std::shared_ptr<DownstreamStream> Open(v1::StageService::Stub* stub, MessageSink* sink,
                                                size_t outbox_capacity);
  void OnReadDone(bool ok) override { OnReadDoneImpl(ok); }
  void OnWriteDone(bool ok) override { OnWriteDoneImpl(ok); }
  void OnDone(const grpc::Status& status) override;

 private:
  explicit DownstreamStream(size_t outbox_capacity);
  void DoStartRead(v1::StageMessage* into) override { StartRead(into); }
  void DoStartWrite(const v1::StageMessage* m) override { StartWrite(m); }
  void DoFinish(const absl::Status& status) override;
  // Fails a write stuck behind a peer that stopped reading, so the outbox
  // finishes (and releases the hold) without waiting for it.
  void OnClosedWithError() override { context_.TryCancel(); }
  grpc::ClientContext context_;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_PEER_STREAM_H_
