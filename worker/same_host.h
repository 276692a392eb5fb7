// One side of a stage-to-stage stream's same-host shortcut (docs/performance.md,
// "Neighbours on one host"). Stage j offers its shared-memory ring in OPEN;
// stage j+1 opens it if it can and answers with RING (its own ring, and
// whether it opened j's); stage j opens that one and answers with RING. From
// the answer on, a side puts large payloads in its ring (Wire) and the peer
// copies them out as they arrive (Resolve), or reads a large floating-point
// one in place (services/tensor/ring_leases.h: lent to its message, returned
// by Reap when nobody read it). The stream still carries every
// message, in order, with every check it always had; a side that cannot open
// its peer's ring (another host, another container's /dev/shm, the feature
// off) says so and both keep sending inline.
#ifndef STAGEWISE_WORKER_SAME_HOST_H_
#define STAGEWISE_WORKER_SAME_HOST_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/tensor/shared_ring.h"
#include "stagewise/v1/stage.pb.h"

namespace stagewise::worker {

class SameHostLink {
 public:
  // `dir` empty: off (offers nothing, opens nothing). `widen`: fp16/bf16
  // payloads come out of the peer's ring as float32 (a stage on the CPU).
  SameHostLink(std::string dir, uint64_t ring_bytes, bool widen = false)
      : dir_(std::move(dir)), ring_bytes_(ring_bytes), widen_(widen) {}
  ~SameHostLink();  // returns the leases nobody took
  SameHostLink(const SameHostLink&) = delete;
  SameHostLink& operator=(const SameHostLink&) = delete;

  // This side's ring for OPEN or RING (created on first use; an empty name
  // when off or when it could not be created), with `opened_peer`.
  v1::SharedRingOffer Offer(bool opened_peer);
  // The peer's offer arrived: opens its ring (once). Whether this side can
  // now read the peer's payloads.
  bool Accept(const v1::SharedRingOffer& peer);
  // The peer's answer to this side's offer (only the first counts): it
  // opened the ring, so payloads may go there; or it could not (another
  // host), and the ring's memory is given back at once.
  void PeerAnswered(bool opened);

  // The ring payloads to the peer go to (EncodeOptions::ring), or null.
  SharedRing* ring() const {
    return peer_opened_.load(std::memory_order_acquire) ? ring_.get() : nullptr;
  }
  // Copies a message's shared payloads out of the peer's ring, or lends the
  // large floating-point ones to it (ResolveSharedPayloads): an error when it
  // has some and no ring was agreed.
  absl::Status Resolve(v1::StageMessage* message);
  // Returns the leases of messages numbered below `seq` that nobody took
  // (all of them: INT64_MAX), so that the peer can reuse their regions.
  void Reap(int64_t below_seq);

 private:
  const std::string dir_;
  const uint64_t ring_bytes_;
  const bool widen_;
  absl::Mutex mu_;
  bool tried_ ABSL_GUARDED_BY(mu_) = false;  // Offer made the ring (or failed to)
  std::shared_ptr<SharedRing> ring_;  // set under mu_ before PeerAnswered (shared: placement)
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> peer_opened_{false};
  std::shared_ptr<SharedRingView> view_ ABSL_GUARDED_BY(mu_);
  bool accepted_ ABSL_GUARDED_BY(mu_) = false;
};

// The RING message of `job_id`'s `attempt` that carries `offer`.
v1::StageMessage RingMessage(const std::string& job_id, int attempt, v1::SharedRingOffer offer);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_SAME_HOST_H_
