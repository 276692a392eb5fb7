// StageRuntime's part in replicated stages (docs/replicas.md): meeting the
// other replicas of the stage, averaging gradients before every optimizer
// step (sync.every = 1), or the outer synchronisation every H steps.
#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "worker/stage_runtime.h"

namespace stagewise::worker {

absl::Status StageRuntime::JoinReplicas() {
  const std::string& host = assignment_.collective_host();
  const auto bucket_bytes =
      std::max<int64_t>(1, static_cast<int64_t>(spec_.sync.bucket_mb * (1 << 20)));
  STAGEWISE_ASSIGN_OR_RETURN(replicas_,
                             ReplicaGroup::Create(env_.collective_store(assignment_),
                                                  {.rank = replica(),
                                                   .size = num_replicas(),
                                                   .host = host.empty() ? "127.0.0.1" : host,
                                                   .timeout = env_.collective_timeout,
                                                   .bucket_bytes = bucket_bytes,
                                                   .name = absl::StrCat("stage ", stage())}));
  if (spec_.sync.every > 1 && outer_ == nullptr) outer_ = std::make_unique<OuterSync>(spec_.sync);
  return absl::OkStatus();
}

std::vector<torch::Tensor> StageRuntime::ReplicatedParameters(
    torch::optim::Optimizer* extra) const {
  std::vector<torch::Tensor> params;
  for (torch::optim::Optimizer* opt : {optimizer_.get(), extra}) {
    if (opt == nullptr) continue;
    for (const auto& group : opt->param_groups()) {
      for (const torch::Tensor& p : group.params()) params.push_back(p);
    }
  }
  return params;
}

absl::Status StageRuntime::AverageReplicaGradients(torch::optim::Optimizer* extra) {
  if (replicas_ == nullptr) return absl::OkStatus();
  // sync.every > 1: each replica steps on its own gradients; the anchors are
  // the parameters before the first step.
  if (outer_ != nullptr) return outer_->BeforeStep(ReplicatedParameters(extra));
  if (overlap_ != nullptr && overlap_->armed()) {
    // The stage optimizer's buckets started during the backward.
    STAGEWISE_RETURN_IF_ERROR(overlap_->Finish());
    Summarize("overlapped_buckets", static_cast<double>(overlap_->started_early()));
    return extra == nullptr ? absl::OkStatus() : AverageReplicaGradientsOf(*extra);
  }
  return replicas_->AverageGradients(ReplicatedParameters(extra));
}

void StageRuntime::FinishReplicaOverlap() {
  // A step that failed between arming and its optimizer step may have left
  // buckets in flight that the other replicas' buckets match. Finishing them
  // (the result no longer matters) starts the rest, as every replica that
  // armed does, so that no replica's group, when destroyed, waits out the
  // collective timeout for a bucket the others never start. A replica that
  // did not arm destroys its group, which fails the others' buckets at once.
  if (overlap_ != nullptr && overlap_->armed()) overlap_->Finish().IgnoreError();
}

void StageRuntime::ArmReplicaOverlap() {
  if (replicas_ == nullptr || outer_ != nullptr || !spec_.sync.overlap) return;
  if (overlap_ == nullptr) {
    overlap_ = std::make_unique<OverlappedAverage>(replicas_.get(), ReplicatedParameters(nullptr),
                                                   replicas_->bucket_bytes());
  }
  overlap_->Arm();
}

absl::Status StageRuntime::AverageReplicaGradientsOf(torch::optim::Optimizer& optimizer) {
  if (replicas_ == nullptr) return absl::OkStatus();
  if (outer_ != nullptr) {
    // The spec refuses sync.every > 1 with auxnet; the anchors cover the
    // stage's optimizer alone.
    return absl::FailedPreconditionError(
        "sync.every > 1 averages the stage's optimizer only; an auxiliary optimizer cannot step "
        "apart from it");
  }
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) params.push_back(p);
  }
  return replicas_->AverageGradients(params);
}

absl::Status StageRuntime::SyncReplicas(torch::optim::Optimizer* extra) {
  if (replicas_ == nullptr || outer_ == nullptr) return absl::OkStatus();
  return outer_->AfterStep(
      ReplicatedParameters(extra),
      [this](const std::vector<torch::Tensor>& deltas) { return replicas_->Average(deltas); });
}

}  // namespace stagewise::worker
