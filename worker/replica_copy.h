// Replacing a replica (recovery.replay with stages.replicas > 1,
// docs/fault_tolerance.md "Replacing a replica"): the state a surviving
// replica publishes and serves (StageService.CopyReplica), and the copy a
// replacing replica takes of it, piece by piece over gRPC.
//
// The state is a checkpoint shard (services/checkpoint/shard_archive.h) of
// the step the survivor waits in, as it was at that step's start: synchronous
// replicas hold the same parameters and optimizer state after every step.
#ifndef STAGEWISE_WORKER_REPLICA_COPY_H_
#define STAGEWISE_WORKER_REPLICA_COPY_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/checkpoint/shard_archive.h"
#include "services/rpc/server.h"
#include "stagewise/v1/coordinator.pb.h"
#include "stagewise/v1/stage.pb.h"

namespace stagewise::worker {

// The most bytes one CopyReplicaResponse carries.
inline constexpr int64_t kReplicaCopyChunk = int64_t{2} << 20;

// One stage's side of replacing a replica: as a possible source, where each
// step began and the state it published; as a replacement, its copy.
// Thread-safe: the compute thread notes steps and publishes, gRPC threads
// serve, the stage thread fetches (before the compute thread starts).
class ReplicaCopy {
 public:
  // A step of the phase begins: its number, the stage's message counts, the
  // random state and the model's buffers now (what a copy of the step's
  // start needs).
  void NoteStepStart(int64_t phase_step, const checkpoint::ShardPosition::Marks& marks,
                     const torch::nn::Module& model) ABSL_LOCKS_EXCLUDED(mu_);
  // The source replica, waiting in the current step's average: publishes
  // `model` and `optimizer` (unchanged since the step began) as a shard at
  // the step's start for the copy of `generation` with `token`. `at` names
  // the stage, its blocks and phase; `phase_offset` is the global step the
  // phase began at. FAILED_PRECONDITION before any step began.
  absl::Status Publish(int generation, std::string token, checkpoint::ShardPosition at,
                       int64_t phase_offset, torch::nn::Module& model,
                       torch::optim::Optimizer& optimizer) ABSL_LOCKS_EXCLUDED(mu_);
  // The new group met: what was published goes.
  void Release() ABSL_LOCKS_EXCLUDED(mu_);
  // StageService.CopyReplica: one piece of what was published. UNAVAILABLE
  // while nothing of that generation is (the replacement retries),
  // PERMISSION_DENIED for another token, OUT_OF_RANGE past the end.
  absl::Status Serve(const v1::CopyReplicaRequest& request, v1::CopyReplicaResponse* response) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // A replacing replica: copies the state `assignment.replica_source`
  // names, piece by piece (waiting while the survivor has not published)
  // until `timeout` passes or `stopped` says the stage stopped; checks it
  // against the survivor's CRC-32 and the stage's blocks, and parses it.
  absl::StatusOr<std::unique_ptr<checkpoint::ShardReader>> Fetch(
      const v1::StageAssignment& assignment, const rpc::RpcOptions& rpc, absl::Duration timeout,
      const std::function<bool()>& stopped, const torch::Device& device) ABSL_LOCKS_EXCLUDED(mu_);
  // What Fetch copied, and how long it took.
  int64_t copied_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  double copy_seconds() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  // The current step's start.
  int64_t phase_step_ ABSL_GUARDED_BY(mu_) = -1;
  checkpoint::ShardPosition::Marks marks_ ABSL_GUARDED_BY(mu_);
  torch::Tensor rng_ ABSL_GUARDED_BY(mu_);
  std::vector<torch::Tensor> buffers_ ABSL_GUARDED_BY(mu_);  // the model's, cloned
  // What was published.
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::string> bytes_ ABSL_GUARDED_BY(mu_);
  uint32_t crc32_ ABSL_GUARDED_BY(mu_) = 0;
  // The copy taken.
  int64_t copied_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  double copy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_REPLICA_COPY_H_
