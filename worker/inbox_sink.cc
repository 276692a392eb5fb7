#include "worker/inbox_sink.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/common/log.h"
#include "services/common/retry_policy.h"
#include "services/tensor/stage_message.h"

namespace stagewise::worker {

InboxSink::InboxSink(BoundedQueue<v1::StageMessage>* queue, NeighbourLink* link, bool from_prev,
                     std::string peer, Hooks hooks, LinkDelay* delay)
    : queue_(queue),
      link_(link),
      delay_(delay),
      from_prev_(from_prev),
      peer_(std::move(peer)),
      hooks_(std::move(hooks)) {}

void InboxSink::Bind(const std::shared_ptr<PeerStream>& stream) {
  absl::MutexLock lock(&mu_);
  stream_ = stream;
}

std::shared_ptr<PeerStream> InboxSink::stream() const {
  absl::MutexLock lock(&mu_);
  return stream_.lock();
}

absl::StatusOr<bool> InboxSink::Deliver(v1::StageMessage message, std::function<void()> resume) {
  absl::Status s = hooks_.check(&message);
  if (s.ok() && message.kind() == v1::StageMessage::OPEN) {
    s = absl::InvalidArgumentError("StageMessage.kind: OPEN on a stream that is already open");
  }
  if (s.ok() && message.kind() == v1::StageMessage::RESUME && from_prev_) {
    s = absl::InvalidArgumentError("StageMessage.kind: RESUME comes from stage j+1 only");
  }
  absl::StatusOr<bool> take = true;
  const bool handshake =
      message.kind() == v1::StageMessage::RING || message.kind() == v1::StageMessage::RESUME;
  if (s.ok() && !handshake) {
    take = link_->Arrived(message.seq());
    s = take.status();
  }
  if (!s.ok()) {
    hooks_.fail(s);
    return s;
  }
  if (handshake) {
    if (std::shared_ptr<PeerStream> on = stream()) hooks_.handshake(message, on);
    return true;
  }
  if (!*take) return true;  // resent after a reconnection, held already
  // Emulated latency: the line queues it when due (and counts it then).
  if (delay_ != nullptr) return delay_->Hold(std::move(message), std::move(resume));
  const auto bytes = static_cast<int64_t>(message.ByteSizeLong()) + LentBytes(message);
  if (!queue_->ForcePush(std::move(message))) {
    return absl::CancelledError("the stage is no longer running this job");
  }
  hooks_.received(bytes);
  if (queue_->HasRoom()) return true;
  queue_->NotifyWhenRoom(std::move(resume));  // backpressure: pause reading
  return false;
}

void InboxSink::StreamClosed(const absl::Status& status) {
  if (status.ok()) return;
  const std::shared_ptr<PeerStream> closed = stream();
  if (link_->Detach(closed.get())) {
    if (link_->closed()) return;  // this stage is stopping
    STAGEWISE_LOG(WARNING) << "the stream " << (from_prev_ ? "from " : "to ") << peer_ << " broke ("
                           << status.message()
                           << "); keeping what is sent to it until it is replaced";
    return;
  }
  hooks_.fail(NeighbourStreamError(absl::StrCat(from_prev_ ? "the stream from " : "the stream to ",
                                                peer_, " broke: ", status.message())));
}

}  // namespace stagewise::worker
