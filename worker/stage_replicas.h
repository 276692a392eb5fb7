// The replicas of one stage (docs/replicas.md), as one object the stage
// runtime owns: the group they meet in, the gradients averaged before every
// optimizer step (sync.every = 1; started during the backward with
// sync.overlap), or the outer synchronisation every H steps (sync.every > 1)
// and its anchors in a checkpoint. Used from the stage's compute thread
// only (Load and SaveOuter from its set-up and checkpoints). With one
// replica nothing joins and every call is a no-op.
#ifndef STAGEWISE_WORKER_STAGE_REPLICAS_H_
#define STAGEWISE_WORKER_STAGE_REPLICAS_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/spec/job_spec.h"
#include "worker/collective.h"
#include "worker/outer_sync.h"
#include "worker/overlap.h"

namespace stagewise::worker {

class StageReplicas {
 public:
  // `summarize` records a value of the stage's result (overlapped_buckets).
  StageReplicas(SyncSpec sync, std::function<void(const std::string&, double)> summarize);
  ~StageReplicas();
  StageReplicas(const StageReplicas&) = delete;
  StageReplicas& operator=(const StageReplicas&) = delete;

  // Meets the other replicas through `store` (before the first step), in
  // the group of `generation` (0: the attempt's first; a replacing replica
  // joins the one it was given).
  absl::Status Join(c10::intrusive_ptr<c10d::Store> store, const ReplicaGroupOptions& options,
                    int generation = 0);
  bool joined() const { return group_ != nullptr; }

  // Replacing a replica: what a failed average does (before Join).
  struct RegroupHooks {
    // The source replica: publishes the stage's state as it was at the
    // start of the current step, for the copy with `token`.
    std::function<absl::Status(int generation, const std::string& token)> publish;
    // The new group works: what was published may go.
    std::function<void()> release;
  };
  void EnableRegroup(RegroupHooks hooks);
  // How long a failed average waits for the coordinator's Regroup (at most
  // the collective timeout).
  static constexpr absl::Duration kRegroupGrace = absl::Seconds(60);
  // The coordinator formed the group again as `generation` (any thread).
  void Regroup(int generation, bool source, const std::string& token) ABSL_LOCKS_EXCLUDED(mu_);
  // The job stops: a wait for Regroup ends with `why` (any thread).
  void Cancel(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  int generation() const { return generation_; }

  // Before the stage optimizer's step: every replica ends with the mean
  // gradient of the parameters of `stage` (and `extra`'s, if any). With
  // sync.every > 1, each replica steps on its own gradients instead (the
  // first call takes the anchors).
  absl::Status AverageGradients(torch::optim::Optimizer& stage, torch::optim::Optimizer* extra);
  // The same for another optimizer's parameters alone (auxiliary heads).
  absl::Status AverageGradientsOf(torch::optim::Optimizer& optimizer);
  // After the step: the outer synchronisation every sync.every steps.
  absl::Status Sync(torch::optim::Optimizer& stage, torch::optim::Optimizer* extra);
  // Before the last backward of a step (sync.overlap): the stage
  // optimizer's buckets start as their gradients are ready.
  void ArmOverlap(torch::optim::Optimizer& stage);

  // The end of the run: finishes an armed overlap's buckets (the result no
  // longer matters) and closes the group, so that a replica still waiting in
  // a collective with this one fails at once.
  void Close();

  // Checkpoints (sync.every > 1): the outer sync's anchors into `archive`
  // (false when there are none to save), and back.
  bool SaveOuter(torch::serialize::OutputArchive& archive) const;
  absl::Status LoadOuter(torch::serialize::InputArchive& archive);

 private:
  // The parameters of `stage`, then of `extra`.
  static std::vector<torch::Tensor> Parameters(torch::optim::Optimizer& stage,
                                               torch::optim::Optimizer* extra);
  // `average`, and with EnableRegroup once more in every new group until it
  // succeeds.
  absl::Status Retried(const std::function<absl::Status()>& average);
  // After a failed average (`failure`): waits for Regroup, publishes (the
  // source), joins the new generation's group.
  absl::Status Rejoin(const absl::Status& failure) ABSL_LOCKS_EXCLUDED(mu_);
  // The group of `generation` over store_.
  absl::Status Meet(int generation);

  const SyncSpec sync_;
  const std::function<void(const std::string&, double)> summarize_;
  std::unique_ptr<ReplicaGroup> group_;  // once joined
  // The stage optimizer's gradients averaged during the backward (declared
  // after group_: destroyed before it).
  std::unique_ptr<OverlappedAverage> overlap_;
  std::unique_ptr<OuterSync> outer_;       // sync.every > 1 (or a shard that had one)
  c10::intrusive_ptr<c10d::Store> store_;  // once joined
  ReplicaGroupOptions options_;
  int generation_ = 0;  // of group_
  RegroupHooks hooks_;  // EnableRegroup

  mutable absl::Mutex mu_;
  struct Announced {
    int generation = 0;
    bool source = false;
    std::string token;
  };
  Announced announced_ ABSL_GUARDED_BY(mu_);
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_STAGE_REPLICAS_H_
