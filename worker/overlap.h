// Overlap of the replicas' gradient all-reduce with the backward pass
// (docs/replicas.md, "Overlap"): while the last backward of a step still
// runs, every parameter whose gradient is final joins its bucket, and a
// complete bucket's all-reduce starts at once on gloo's threads; what the
// backward computes afterwards runs while those buckets travel.
#ifndef STAGEWISE_WORKER_OVERLAP_H_
#define STAGEWISE_WORKER_OVERLAP_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective.h"

namespace stagewise::worker {

class OverlappedAverage {
 public:
  // Watches `params` (the stage optimizer's, in its order) of a group whose
  // every replica watches the same list: a hook on each parameter's
  // gradient accumulator reports when its gradient is accumulated. Buckets
  // hold consecutive parameters of the reversed list (the order a backward
  // produces them), at most `bucket_bytes` each.
  OverlappedAverage(ReplicaGroup* group, std::vector<torch::Tensor> params, int64_t bucket_bytes);
  ~OverlappedAverage();
  OverlappedAverage(const OverlappedAverage&) = delete;
  OverlappedAverage& operator=(const OverlappedAverage&) = delete;

  // Before the last backward of a step (earlier backwards of the step
  // accumulate into the same gradients and start nothing).
  void Arm() ABSL_LOCKS_EXCLUDED(mu_);
  bool armed() const ABSL_LOCKS_EXCLUDED(mu_);
  // After it: starts the buckets still waiting (a parameter the backward did
  // not reach counts as a zero gradient), waits for all of them and leaves
  // every replica with the mean gradient, as ReplicaGroup::AverageGradients.
  // Disarms.
  absl::Status Finish() ABSL_LOCKS_EXCLUDED(mu_);

  // Buckets started while the backward ran, over all steps (the overlap's
  // reach: a backward that finishes before any bucket is complete hides
  // nothing).
  int64_t started_early() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Hook;
  void Ready(int index) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts buckets next_.. while they are complete (all == true: every one).
  void StartInOrder(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ReplicaGroup* const group_;
  const std::vector<torch::Tensor> params_;
  std::vector<std::vector<int>> buckets_;  // indices into params_
  std::vector<int> bucket_of_;             // params_ index -> bucket
  // Kept alive so that the hooks stay on the accumulators every graph uses.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;

  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> missing_ ABSL_GUARDED_BY(mu_);    // per bucket: gradients not yet final
  std::vector<char> reported_ ABSL_GUARDED_BY(mu_);  // per parameter, this backward
  int next_ ABSL_GUARDED_BY(mu_) = 0;                // the next bucket to start
  std::vector<ReplicaGroup::Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t started_early_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_OVERLAP_H_
