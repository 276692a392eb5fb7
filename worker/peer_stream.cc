#include "worker/peer_stream.h"

#include "absl/strings/str_cat.h"
#include "services/rpc/status.h"

namespace stagewise::worker {

PeerStream::PeerStream(std::string name, size_t outbox_capacity)
    : name_(std::move(name)), capacity_(outbox_capacity == 0 ? 1 : outbox_capacity) {}

absl::Status PeerStream::Send(v1::StageMessage message) {
  const v1::StageMessage* start = nullptr;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &PeerStream::HasRoom));
    if (broken_) {
      // Report why it broke (the call's final status), not just that it did.
      mu_.Await(absl::Condition(&done_));
      return closed_;
    }
    if (!closed_.ok()) return closed_;
    if (closing_) return absl::FailedPreconditionError(absl::StrCat(name_, ": stream is closing"));
    bytes_sent_ += static_cast<int64_t>(message.ByteSizeLong());
    outbox_.push_back(std::move(message));
    if (!writing_) {
      writing_ = true;
      start = &outbox_.front();  // deque elements do not move on push_back
    }
  }
  if (start != nullptr) DoStartWrite(start);
  return absl::OkStatus();
}

void PeerStream::Close(const absl::Status& status) {
  std::function<void()> action;
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return;
    closing_ = true;
    close_status_ = status;
    if (!status.ok()) outbox_.erase(outbox_.begin() + (writing_ ? 1 : 0), outbox_.end());
    MaybeFinishLocked(&action);
  }
  if (action) action();
}

void PeerStream::WaitDone() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
}

bool PeerStream::done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

int64_t PeerStream::bytes_sent() const {
  absl::MutexLock lock(&mu_);
  return bytes_sent_;
}

int64_t PeerStream::bytes_received() const {
  absl::MutexLock lock(&mu_);
  return bytes_received_;
}

void PeerStream::BeginReading(MessageSink* sink) {
  sink_ = sink;
  DoStartRead(&read_buffer_);
}

void PeerStream::OnReadDoneImpl(bool ok) {
  if (!ok) {
    std::function<void()> action;
    {
      absl::MutexLock lock(&mu_);
      read_side_done_ = true;
      MaybeFinishLocked(&action);
    }
    if (action) action();
    OnReadSideDone();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    bytes_received_ += static_cast<int64_t>(read_buffer_.ByteSizeLong());
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
  if (*keep_reading) DoStartRead(&read_buffer_);
}

void PeerStream::ResumeRead() {
  {
    absl::MutexLock lock(&mu_);
    if (finish_started_ || done_ || read_side_done_) return;
    read_starting_ = true;
  }
  DoStartRead(&read_buffer_);
  std::function<void()> action;
  {
    absl::MutexLock lock(&mu_);
    read_starting_ = false;
    MaybeFinishLocked(&action);
  }
  if (action) action();
}

void PeerStream::OnWriteDoneImpl(bool ok) {
  const v1::StageMessage* next = nullptr;
  std::function<void()> action;
  {
    absl::MutexLock lock(&mu_);
    outbox_.pop_front();
    if (!ok) {
      closed_ = absl::UnavailableError(absl::StrCat(name_, ": the peer stream broke"));
      broken_ = true;
      outbox_.clear();
    }
    if (!outbox_.empty()) {
      next = &outbox_.front();
    } else {
      writing_ = false;
      MaybeFinishLocked(&action);
    }
  }
  if (next != nullptr) DoStartWrite(next);
  if (action) action();
  // The call is over: end it on our side too (releases the client's hold) so
  // OnDone arrives with the final status.
  if (!ok) Close(absl::UnavailableError(absl::StrCat(name_, ": the peer stream broke")));
}

void PeerStream::MaybeFinishLocked(std::function<void()>* action) {
  if (!closing_ || writing_ || finish_started_ || read_starting_) return;
  finish_started_ = true;
  const absl::Status status = close_status_;
  *action = [this, status]() { DoFinish(status); };
}

void PeerStream::OnDoneImpl(const absl::Status& status) {
  std::shared_ptr<PeerStream> keep = std::move(self_);  // may be the last reference
  {
    absl::MutexLock lock(&mu_);
    if (closed_.ok()) {
      closed_ = status.ok() ? absl::FailedPreconditionError(absl::StrCat(name_, ": stream ended"))
                            : status;
    } else if (broken_) {
      closed_ = absl::UnavailableError(
          absl::StrCat(name_, ": the peer stream broke (", status.ToString(), ")"));
    }
    outbox_.clear();
    writing_ = false;
  }
  // Tell the sink before WaitDone() returns: its owner may be waiting to free it.
  if (sink_ != nullptr) sink_->StreamClosed(status);
  absl::MutexLock lock(&mu_);
  done_ = true;
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
      if (absl::Status s = router_(message, self, &target_); !s.ok()) return s;
    }
    return target_->Deliver(std::move(message), std::move(resume));
  }
  void StreamClosed(const absl::Status& status) override {
    if (target_ != nullptr) target_->StreamClosed(status);
  }

 private:
  Router router_;
  UpstreamStream* stream_;
  MessageSink* target_ = nullptr;
};

UpstreamStream::UpstreamStream(size_t outbox_capacity) : PeerStream("upstream", outbox_capacity) {}

UpstreamStream* UpstreamStream::Start(Router router, size_t outbox_capacity) {
  std::shared_ptr<UpstreamStream> stream(new UpstreamStream(outbox_capacity));
  stream->self_ = stream;
  stream->router_sink_ = std::make_unique<RoutingSink>(std::move(router), stream.get());
  stream->BeginReading(stream->router_sink_.get());
  return stream.get();
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
  stream->AddHold();  // writes start outside reactions until we are done writing
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
