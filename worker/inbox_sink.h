// Feeds one of a stage's two inboxes from one peer stream: every message is
// checked first (a bad one fails the stage), handshakes (RING, RESUME) go to
// their handler, data messages are numbered through the neighbour's link
// (a resent duplicate is dropped) and queued; reading pauses while the
// inbox is full. One sink per stream, so that a closing old stream is told
// apart from the current one (recovery.replay). With an emulated link delay
// (worker/link_delay.h) data messages go through the side's delay line
// instead, which fills the inbox once each is due.
#ifndef STAGEWISE_WORKER_INBOX_SINK_H_
#define STAGEWISE_WORKER_INBOX_SINK_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "services/common/bounded_queue.h"
#include "stagewise/v1/stage.pb.h"
#include "worker/link_delay.h"
#include "worker/neighbour_link.h"
#include "worker/peer_stream.h"

namespace stagewise::worker {

class InboxSink : public MessageSink {
 public:
  struct Hooks {
    // Resolves a shared-memory payload and validates (any error fails).
    std::function<absl::Status(v1::StageMessage*)> check;
    // A handshake (RING, RESUME) on `stream`.
    std::function<void(const v1::StageMessage&, const std::shared_ptr<PeerStream>& stream)>
        handshake;
    std::function<void(int64_t bytes)> received;  // a data message was queued
    std::function<void(const absl::Status&)> fail;
  };
  // `peer`: what the stream's end is called in errors ("stage 2"). `delay`:
  // the side's delay line, or null (data messages go to `queue` at once).
  InboxSink(BoundedQueue<v1::StageMessage>* queue, NeighbourLink* link, bool from_prev,
            std::string peer, Hooks hooks, LinkDelay* delay = nullptr);

  // The stream this sink reads (before its first message can arrive).
  void Bind(const std::shared_ptr<PeerStream>& stream);

  absl::StatusOr<bool> Deliver(v1::StageMessage message, std::function<void()> resume) override;
  void StreamClosed(const absl::Status& status) override;

 private:
  std::shared_ptr<PeerStream> stream() const;

  BoundedQueue<v1::StageMessage>* const queue_;
  NeighbourLink* const link_;
  LinkDelay* const delay_;
  const bool from_prev_;
  const std::string peer_;
  const Hooks hooks_;
  mutable absl::Mutex mu_;
  std::weak_ptr<PeerStream> stream_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_INBOX_SINK_H_
