#include "worker/stage_replicas.h"

#include <utility>

#include "services/common/status_macros.h"

namespace stagewise::worker {

StageReplicas::StageReplicas(SyncSpec sync,
                             std::function<void(const std::string&, double)> summarize)
    : sync_(std::move(sync)), summarize_(std::move(summarize)) {}

StageReplicas::~StageReplicas() { Close(); }

absl::Status StageReplicas::Join(c10::intrusive_ptr<c10d::Store> store,
                                 const ReplicaGroupOptions& options) {
  STAGEWISE_ASSIGN_OR_RETURN(group_, ReplicaGroup::Create(std::move(store), options));
  if (sync_.every > 1 && outer_ == nullptr) outer_ = std::make_unique<OuterSync>(sync_);
  return absl::OkStatus();
}

std::vector<torch::Tensor> StageReplicas::Parameters(torch::optim::Optimizer& stage,
                                                     torch::optim::Optimizer* extra) {
  std::vector<torch::Tensor> params;
  for (torch::optim::Optimizer* opt : {&stage, extra}) {
    if (opt == nullptr) continue;
    for (const auto& group : opt->param_groups()) {
      for (const torch::Tensor& p : group.params()) params.push_back(p);
    }
  }
  return params;
}

absl::Status StageReplicas::AverageGradients(torch::optim::Optimizer& stage,
                                             torch::optim::Optimizer* extra) {
  if (group_ == nullptr) return absl::OkStatus();
  // sync.every > 1: each replica steps on its own gradients; the anchors are
  // the parameters before the first step.
  if (outer_ != nullptr) return outer_->BeforeStep(Parameters(stage, extra));
  if (overlap_ != nullptr && overlap_->armed()) {
    // The stage optimizer's buckets started during the backward.
    STAGEWISE_RETURN_IF_ERROR(overlap_->Finish());
    if (summarize_) {
      summarize_("overlapped_buckets", static_cast<double>(overlap_->started_early()));
    }
    return extra == nullptr ? absl::OkStatus() : AverageGradientsOf(*extra);
  }
  return group_->AverageGradients(Parameters(stage, extra));
}

absl::Status StageReplicas::AverageGradientsOf(torch::optim::Optimizer& optimizer) {
  if (group_ == nullptr) return absl::OkStatus();
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
  return group_->AverageGradients(params);
}

absl::Status StageReplicas::Sync(torch::optim::Optimizer& stage, torch::optim::Optimizer* extra) {
  if (group_ == nullptr || outer_ == nullptr) return absl::OkStatus();
  return outer_->AfterStep(Parameters(stage, extra), [this](const std::vector<torch::Tensor>& d) {
    return group_->Average(d);
  });
}

void StageReplicas::ArmOverlap(torch::optim::Optimizer& stage) {
  if (group_ == nullptr || outer_ != nullptr || !sync_.overlap) return;
  if (overlap_ == nullptr) {
    overlap_ = std::make_unique<OverlappedAverage>(group_.get(), Parameters(stage, nullptr),
                                                   group_->bucket_bytes());
  }
  overlap_->Arm();
}

void StageReplicas::Close() {
  // A step that failed between arming and its optimizer step may have left
  // buckets in flight that the other replicas' buckets match. Finishing them
  // starts the rest, as every replica that armed does, so that no replica's
  // group, when destroyed, waits out the collective timeout for a bucket the
  // others never start. A replica that did not arm destroys its group, which
  // fails the others' buckets at once.
  if (overlap_ != nullptr && overlap_->armed()) overlap_->Finish().IgnoreError();
  overlap_.reset();
  group_.reset();
}

bool StageReplicas::SaveOuter(torch::serialize::OutputArchive& archive) const {
  if (outer_ == nullptr || group_ == nullptr) return false;
  outer_->Save(archive);
  return true;
}

absl::Status StageReplicas::LoadOuter(torch::serialize::InputArchive& archive) {
  outer_ = std::make_unique<OuterSync>(sync_);
  return outer_->Load(archive);
}

}  // namespace stagewise::worker
