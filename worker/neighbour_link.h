// One neighbour of a stage (stage j-1 or j+1) as the compute thread and the
// stream's reader see it: the stream to it, the numbers of the data
// messages sent to it (StageMessage.seq) and of those taken from it.
//
// With recovery.replay (docs/fault_tolerance.md, "Replacing one stage") the
// link also keeps every message it sent since the last committed checkpoint,
// survives its stream breaking (the neighbour was lost: sends are kept
// until a new stream is attached), and on each Attach resends, in order,
// what the peer does not hold. Then the sends go out from the link's own
// thread (the pump), so that a compute thread blocked on the other
// neighbour never holds them up; duplicates a peer resends are dropped by
// number (Arrived).
//
// Threading: Send, Took and Trim on the compute thread; Arrived on the
// stream's reader; Attach, Detach and Close anywhere. Never blocks a
// reaction: Attach and Detach only take the link's lock.
#ifndef STAGEWISE_WORKER_NEIGHBOUR_LINK_H_
#define STAGEWISE_WORKER_NEIGHBOUR_LINK_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stagewise/v1/stage.pb.h"
#include "worker/peer_stream.h"

namespace stagewise::worker {

class NeighbourLink {
 public:
  struct Options {
    std::string name;     // for errors: "stage 3"
    bool replay = false;  // recovery.replay
    // Replay: the compute thread waits while this many kept messages wait
    // for a live stream (backpressure, as the stream's outbox gives without).
    size_t max_unsent = 64;
    // Replay: the pump cannot go on (the peer asks for a message dropped
    // already); the stage fails with it.
    std::function<void(const absl::Status&)> on_error;
  };
  explicit NeighbourLink(Options options);
  ~NeighbourLink();
  NeighbourLink(const NeighbourLink&) = delete;
  NeighbourLink& operator=(const NeighbourLink&) = delete;

  // A resumed stage goes on numbering from its shard's counts (before any
  // traffic).
  void Resume(int64_t sent, int64_t taken);

  // A stream to the peer. `peer_holds`: the highest seq of this side's
  // messages the peer holds (its handshake); with replay, the kept messages
  // after it are sent first. The link keeps every stream until WaitDone.
  void Attach(std::shared_ptr<PeerStream> stream, int64_t peer_holds);
  // The stream `which` broke. With replay: true, and when it is the current
  // one, sends are kept until the next Attach. Without: false (the stage
  // fails).
  bool Detach(const PeerStream* which);
  // Blocks until every kept message went to a stream (or none is attached,
  // or the link is closed): before the stage ends.
  void Flush();
  bool attached() const;
  bool closed() const;

  // Numbers `message` and sends it (replay: keeps it with `step`, its global
  // step, and leaves the sending to the pump). Without replay, the stream's
  // error; with replay, only a closed link's.
  absl::Status Send(v1::StageMessage message, int64_t step);
  // The reader got a data message numbered `seq`: false when it holds it
  // already (a resent duplicate: drop it); with replay, an error when
  // messages before it are missing. seq 0: not numbered, always taken.
  absl::StatusOr<bool> Arrived(int64_t seq);
  // The compute thread took the message numbered `seq`.
  void Took(int64_t seq);
  // Replay: drops the kept messages of global steps before `step` - 1 (a
  // checkpoint after `step` steps was committed).
  void Trim(int64_t step);

  int64_t sent() const;
  int64_t taken() const;
  int64_t held() const;
  int64_t kept_messages() const;
  int64_t kept_bytes() const;
  // Attached, and the peer holds more of this side's messages than this side
  // has sent since (a replacement recomputing what its lost stage sent).
  bool CatchingUp() const;

  // No more sends; closes the current stream with `why`, stops the pump.
  void Close(const absl::Status& why);
  // Blocks until gRPC is done with every stream the link had (see
  // PeerStream::WaitDone); after Close.
  void WaitDone();

 private:
  struct Kept {
    int64_t seq;
    int64_t step;
    v1::StageMessage message;
  };
  void Pump();
  bool PumpReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Flushed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::shared_ptr<PeerStream> stream_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<PeerStream>> streams_ ABSL_GUARDED_BY(mu_);  // every one attached
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;                            // +1 per Attach/Detach
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(mu_);
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t peer_holds_ ABSL_GUARDED_BY(mu_) = 0;
  // Replay: what was sent since the last committed checkpoint, by seq, and
  // the next seq the pump sends on the current stream.
  std::deque<Kept> kept_ ABSL_GUARDED_BY(mu_);
  int64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_to_send_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread pump_;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_NEIGHBOUR_LINK_H_
