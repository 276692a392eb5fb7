// Admission of StageService.Exchange streams before their first message
// (docs/security.md, "Threats, controls and tests"). A stream that has not yet
// said which job and stage it is for is *pending*: it costs the worker a
// reactor and buffers and does nothing. Pending streams are bounded in time
// (a first-message deadline) and in number (at most `max_pending`; a new one
// evicts the oldest pending stream of the peer that holds the most), so idle
// streams can never keep a stage's predecessor from connecting. Once the
// first message binds a stream to a stage (or is refused), it is settled and
// no longer counted here.
//
// Only bookkeeping: the worker closes the streams the gate names. Thread-safe.
// No LibTorch, no gRPC.
#ifndef STAGEWISE_WORKER_STREAM_GATE_H_
#define STAGEWISE_WORKER_STREAM_GATE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagewise::worker {

class StreamGate {
 public:
  struct Options {
    int max_pending = 16;
    absl::Duration first_message_timeout = absl::Seconds(10);
  };
  explicit StreamGate(Options options);

  struct Admitted {
    uint64_t ticket = 0;
    // Pending streams to close to make room (already removed from the gate).
    std::vector<uint64_t> evict;
  };
  // A new stream from `peer` (its certificate identity, or its host when the
  // channel is plaintext), opened at `now`.
  Admitted Admit(const std::string& peer, absl::Time now);
  // The stream's first message arrived (bound, or refused), or the stream
  // ended: it is no longer pending. Unknown tickets are ignored.
  void Settle(uint64_t ticket);
  // The pending streams whose deadline is at or before `now`, removed.
  std::vector<uint64_t> TakeExpired(absl::Time now);
  // The earliest first-message deadline (InfiniteFuture when none is pending).
  absl::Time NextDeadline() const;
  int pending() const;
  bool IsPending(uint64_t ticket) const;
  // How many streams the gate evicted and let expire, since it was made.
  int64_t evicted() const;
  int64_t expired() const;

 private:
  struct Pending {
    std::string peer;
    absl::Time deadline;
  };
  // The ticket to evict for a newcomer: the oldest of the busiest peer.
  uint64_t VictimLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(uint64_t ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Tickets grow with time: the map's order is the order of arrival.
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);
  int64_t evicted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STREAM_GATE_H_
