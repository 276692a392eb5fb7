// Outer synchronisation of a stage's replicas (sync.every = H > 1,
// docs/replicas.md): the replicas step on their own shares for H optimizer
// steps, then average how far their parameters moved since the last
// synchronisation and apply that average with an outer optimizer to the
// parameters they all started from (the DiLoCo recipe), so that replicas
// exchange parameters every H steps instead of gradients every step.
#ifndef STAGEWISE_WORKER_OUTER_SYNC_H_
#define STAGEWISE_WORKER_OUTER_SYNC_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/spec/job_spec.h"

namespace stagewise::worker {

class OuterSync {
 public:
  // In-place mean of the tensors over the replicas of the stage (every
  // replica passes tensors of the same shapes in the same order).
  using Average = std::function<absl::Status(const std::vector<torch::Tensor>&)>;

  explicit OuterSync(const SyncSpec& spec) : spec_(spec) {}

  // Before every inner optimizer step, with the stage's parameters (the same
  // list every time): the first call takes them as the anchors (they are
  // equal on every replica then), or the anchors a checkpoint held.
  absl::Status BeforeStep(const std::vector<torch::Tensor>& params);
  // After every inner optimizer step. Every H-th call: the moves
  // delta = anchor - p are averaged over the replicas, the outer step moves
  // the anchor
  //   m <- momentum m + delta;  anchor <- anchor - lr (delta + momentum m)  (nesterov)
  //                             anchor <- anchor - lr m                     (sgd)
  // (momentum 0: anchor <- anchor - lr delta), and every parameter becomes
  // its anchor.
  absl::Status AfterStep(const std::vector<torch::Tensor>& params, const Average& average);

  // Anchors, momentum and the step count, for a checkpoint; Load keeps them
  // until the first AfterStep, which checks them against the parameters.
  void Save(torch::serialize::OutputArchive& archive) const;
  absl::Status Load(torch::serialize::InputArchive& archive);

  int64_t steps() const { return steps_; }

 private:
  SyncSpec spec_;
  int64_t steps_ = 0;  // inner optimizer steps taken
  std::vector<torch::Tensor> anchors_;
  std::vector<torch::Tensor> momentum_;
  // Loaded from a checkpoint, for the first AfterStep.
  std::vector<torch::Tensor> loaded_anchors_, loaded_momentum_;
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_OUTER_SYNC_H_
