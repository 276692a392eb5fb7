#include "worker/peer_stream.h"

#include <utility>

#include "services/common/status_macros.h"
#include "services/rpc/status.h"

namespace stagewise::worker {

PeerStream::PeerStream(std::string name, size_t outbox_capacity)
    : outbox_(std::move(name), outbox_capacity,
              {[this](const v1::StageMessage* message) { DoStartWrite(message); },
               [this](const absl::Status& status) { DoFinish(status); }}) {}

void PeerStream::BeginReading(MessageSink* sink) {
  sink_ = sink;
  DoStartRead(&read_buffer_);
}

void PeerStream::OnReadDoneImpl(bool ok) {
  if (!ok) {
    OnReadSideDone();
    return;
  }
  v1::StageMessage message = std::move(read_buffer_);
  read_buffer_.Clear();
  std::weak_ptr<PeerStream> weak = weak_from_this();
  absl::StatusOr<bool> keep_reading = sink_->Deliver(std::move(message), [weak]() {
    if (auto stream = weak.lock()) stream->ResumeRead();
  });
  if (!keep_reading.ok()) {
    Close(keep_reading.status());
    return;
  }
  // Inside a reaction: gRPC keeps the reactor until this read completes.
  if (*keep_reading) DoStartRead(&read_buffer_);
}

void PeerStream::ResumeRead() {
  // Outside a reaction a read must not race with Finish (the server reactor,
  // or the client's hold, may be gone right after it): hold it off meanwhile.
  if (!outbox_.AcquireHold()) return;
  DoStartRead(&read_buffer_);
  outbox_.ReleaseHold();  // may run DoFinish
}

void PeerStream::OnDoneImpl(const absl::Status& status) {
  std::shared_ptr<PeerStream> keep = std::move(self_);  // may be the last reference
  // Tell the sink before WaitDone() returns: its owner may be waiting to free it.
  if (sink_ != nullptr) sink_->StreamClosed(status);
  outbox_.OnDone(status);
  // gRPC's reference goes before WaitDone() returns: a waiter holds one of
  // its own, so this is not the last and nothing is destroyed here.
  std::shared_ptr<Released> released = released_;
  keep.reset();  // `this` may be gone from here on
  absl::MutexLock lock(&released->mu);
  released->released = true;
}

// ---- server end -------------------------------------------------------------

// Routes the first message to the stage it belongs to, then forwards.
class UpstreamStream::RoutingSink : public MessageSink {
 public:
  RoutingSink(Router router, UpstreamStream* stream)
      : router_(std::move(router)), stream_(stream) {}

  absl::StatusOr<bool> Deliver(v1::StageMessage message, std::function<void()> resume) override {
    if (target_ == nullptr) {
      auto self = std::dynamic_pointer_cast<UpstreamStream>(stream_->shared_from_this());
      STAGEWISE_RETURN_IF_ERROR(router_(message, self, &target_));
      // The stream's opening message: it bound the stream, nothing to deliver.
      if (message.kind() == v1::StageMessage::OPEN) return true;
    }
    return target_->Deliver(std::move(message), std::move(resume));
  }
  void StreamClosed(const absl::Status& status) override {
    if (target_ != nullptr) target_->StreamClosed(status);
  }
  // Whether a first message arrived and found its stage (read side only).
  bool routed() const { return target_ != nullptr; }

 private:
  Router router_;
  UpstreamStream* stream_;
  MessageSink* target_ = nullptr;
};

UpstreamStream::UpstreamStream(size_t outbox_capacity) : PeerStream("upstream", outbox_capacity) {}

UpstreamStream::~UpstreamStream() = default;

UpstreamStream* UpstreamStream::Start(Router router, size_t outbox_capacity) {
  std::shared_ptr<UpstreamStream> stream(new UpstreamStream(outbox_capacity));
  stream->self_ = stream;
  stream->router_sink_ = std::make_unique<RoutingSink>(std::move(router), stream.get());
  stream->BeginReading(stream->router_sink_.get());
  return stream.get();
}

void UpstreamStream::OnReadSideDone() {
  // The reads ended. Before any StageMessage that is a frame that did not
  // parse (a peer always sends before it half-closes): say so, not OK.
  if (!router_sink_->routed()) {
    Close(absl::InvalidArgumentError(
        "the stream ended before a valid StageMessage arrived (a malformed frame?)"));
    return;
  }
  Close(absl::OkStatus());
}

void UpstreamStream::OnCancel() {
  cancelled_ = true;
  Close(absl::CancelledError("the stream from stage j-1 was cancelled"));
}

void UpstreamStream::OnDone() {
  OnDoneImpl(cancelled_ ? absl::CancelledError("the stream from stage j-1 was cancelled")
                        : absl::OkStatus());
}

void UpstreamStream::DoFinish(const absl::Status& status) { Finish(rpc::ToGrpcStatus(status)); }

// ---- client end -------------------------------------------------------------

DownstreamStream::DownstreamStream(size_t outbox_capacity)
    : PeerStream("downstream", outbox_capacity) {}

std::shared_ptr<DownstreamStream> DownstreamStream::Open(v1::StageService::Stub* stub,
                                                         MessageSink* sink,
                                                         size_t outbox_capacity) {
  std::shared_ptr<DownstreamStream> stream(new DownstreamStream(outbox_capacity));
  stream->self_ = stream;
  // The peer is known to be serving (it acked its configuration): ride out a
  // transient connection failure instead of failing the call at once.
  stream->context_.set_wait_for_ready(true);
  stub->async()->Exchange(&stream->context_, stream.get());
  stream->AddHold();  // writes start outside reactions until the outbox finishes
  stream->BeginReading(sink);
  stream->StartCall();
  return stream;
}

void DownstreamStream::OnDone(const grpc::Status& status) {
  OnDoneImpl(rpc::FromGrpcStatus(status));
}

void DownstreamStream::DoFinish(const absl::Status& status) {
  if (status.ok()) {
    StartWritesDone();
  } else {
    context_.TryCancel();
  }
  RemoveHold();
}

}  // namespace stagewise::worker
