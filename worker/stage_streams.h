// A stage's two neighbours on the wire: the stream it dials to stage j+1,
// the one it binds from stage j-1, the bounded inboxes they feed, their
// same-host rings, and their links (worker/neighbour_link.h: message
// numbers and, with recovery.replay, what was sent since the last committed
// checkpoint). With recovery.replay a broken stream waits for the
// neighbour's replacement: stage j+1's is dialed again (Replaced), stage
// j-1's new stream is bound with `resume`, and each side resends what the
// other does not hold.
//
// Threading: Dial, Replaced and Trim from the stage's command or compute
// thread; Bind from a stream's reaction (never blocks); the inboxes and
// links as their own headers say.
#ifndef STAGEWISE_WORKER_STAGE_STREAMS_H_
#define STAGEWISE_WORKER_STAGE_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/checkpoint/shard_archive.h"
#include "services/common/bounded_queue.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.pb.h"
#include "stagewise/v1/stage.grpc.pb.h"
#include "worker/inbox_sink.h"
#include "worker/link_delay.h"
#include "worker/neighbour_link.h"
#include "worker/peer_stream.h"
#include "worker/same_host.h"

namespace stagewise::worker {

class StageStreams {
 public:
  struct Setup {
    std::string job_id;
    int stage = 0;
    int num_stages = 1;
    int attempt = 0;
    bool replay = false;        // StageAssignment.replay
    std::string prev_identity;  // StageAssignment.prev_identity
    rpc::RpcOptions rpc;
    size_t inbox_capacity = 64;
    size_t outbox_capacity = 16;
    std::string shared_memory_dir;  // empty: no rings (always so with replay)
    uint64_t shared_ring_bytes = 0;
    bool widen_on_receipt = false;  // the stage computes on the CPU (SameHostLink)
  };
  struct Hooks {
    // Validates a message from stage j-1 (`from_prev`) or j+1.
    std::function<absl::Status(const v1::StageMessage&, bool from_prev)> validate;
    // The stage has failed or stopped: no new stream is bound.
    std::function<bool()> stopped;
    // A data message was queued (`bytes`), from stage j-1 or j+1.
    std::function<void(int64_t bytes, bool from_prev)> received;
    // A bad message, a broken stream (without replay), a lost kept message.
    std::function<void(const absl::Status&)> fail;
  };
  StageStreams(Setup setup, Hooks hooks);
  // Closes both (if not yet) and waits until gRPC is done with every stream.
  ~StageStreams();

  BoundedQueue<v1::StageMessage>& from_prev() { return from_prev_; }
  BoundedQueue<v1::StageMessage>& from_next() { return from_next_; }
  NeighbourLink& to_prev() { return *to_prev_; }
  NeighbourLink& to_next() { return *to_next_; }
  const NeighbourLink& to_prev() const { return *to_prev_; }
  const NeighbourLink& to_next() const { return *to_next_; }
  // The ring payloads to stage j+1 (`to_next`) or j-1 go to, or null.
  SharedRing* ring(bool to_next) const { return (to_next ? next_ring_ : prev_ring_).ring(); }
  // The compute thread took message `seq` from a side: the payloads lent to
  // older messages from it that nobody read are returned to the peer.
  void Popped(bool from_prev, int64_t seq);
  // Also those of the messages taken last (the end of a phase).
  void ReapRead();
  // Makes the ring stage j-1 is offered (off a reaction).
  void PrepareRing();

  // A resumed stage: the counts of its shard.
  void Resume(const checkpoint::ShardPosition::Marks& marks);
  checkpoint::ShardPosition::Marks marks() const;

  // Opens the stream to stage j+1 at `address` and sends its OPEN (`resume`:
  // a replacing stage's, or after stage j+1 was replaced: answered by RESUME).
  absl::Status Dial(const std::string& address, bool resume);
  // Binds a stream whose validated first message `open` is stage j-1's OPEN
  // of this attempt, when its peer is the expected identity; the sink it
  // feeds from now on into `sink`. PERMISSION_DENIED otherwise.
  absl::Status Bind(const v1::StageMessage& open, const std::string& peer_identity,
                    std::shared_ptr<UpstreamStream> stream, MessageSink** sink);
  // recovery.replay: stage j-1 now runs as `identity` (it dials this stage),
  // or stage j+1 at `address` (dialed now).
  absl::Status Replaced(const v1::NeighbourReplaced& replaced);
  // recovery.replay: a checkpoint after global step `step` was committed.
  void Trim(int64_t step);

  // The stage's run ended well: what is kept goes out, then the stream to
  // stage j+1 closes once it has drained.
  void Finish();
  // The stage stops: the inboxes and streams close with `why`.
  void Close(const absl::Status& why);

 private:
  std::unique_ptr<InboxSink> MakeSink(bool from_prev);
  bool first() const { return setup_.stage == 0; }
  bool last() const { return setup_.stage == setup_.num_stages - 1; }

  const Setup setup_;
  const Hooks hooks_;
  BoundedQueue<v1::StageMessage> from_prev_;
  BoundedQueue<v1::StageMessage> from_next_;
  // Emulated link latency (setup_.rpc.emulated_link_delay_ms > 0): what
  // each side's sinks hand on waits here first; null without.
  std::unique_ptr<LinkDelay> prev_delay_, next_delay_;
  std::unique_ptr<NeighbourLink> to_prev_, to_next_;
  SameHostLink prev_ring_, next_ring_;
  // The seq of the last message the compute thread took from each side.
  std::atomic<int64_t> popped_prev_{0}, popped_next_{0};
  mutable absl::Mutex mu_;
  std::shared_ptr<UpstreamStream> upstream_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<DownstreamStream> downstream_ ABSL_GUARDED_BY(mu_);
  std::string prev_identity_ ABSL_GUARDED_BY(mu_);
  // Every stream's sink and every channel to stage j+1 (a replaced one is
  // dialed again): kept until the streams are done.
  std::vector<std::unique_ptr<InboxSink>> sinks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<v1::StageService::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_STREAMS_H_
