#include "worker/stage_replicas.h"

#include <algorithm>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "services/common/status_macros.h"

namespace stagewise::worker {

StageReplicas::StageReplicas(SyncSpec sync,
                             std::function<void(const std::string&, double)> summarize)
    : sync_(std::move(sync)), summarize_(std::move(summarize)) {}

StageReplicas::~StageReplicas() { Close(); }

absl::Status StageReplicas::Join(c10::intrusive_ptr<c10d::Store> store,
                                 const ReplicaGroupOptions& options, int generation) {
  store_ = std::move(store);
  options_ = options;
  options_.keep_inputs = options_.keep_inputs || hooks_.publish != nullptr;
  STAGEWISE_RETURN_IF_ERROR(Meet(generation));
  if (sync_.every > 1 && outer_ == nullptr) outer_ = std::make_unique<OuterSync>(sync_);
  return absl::OkStatus();
}

absl::Status StageReplicas::Meet(int generation) {
  c10::intrusive_ptr<c10d::Store> store = store_;
  // The attempt's first group keeps the stage's keys; a group formed again
  // meets under keys of its own.
  if (generation > 0) {
    store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("g", generation), store_);
  }
  STAGEWISE_ASSIGN_OR_RETURN(group_, ReplicaGroup::Create(std::move(store), options_));
  generation_ = generation;
  return absl::OkStatus();
}

void StageReplicas::EnableRegroup(RegroupHooks hooks) { hooks_ = std::move(hooks); }

void StageReplicas::Regroup(int generation, bool source, const std::string& token) {
  absl::MutexLock lock(&mu_);
  if (generation <= announced_.generation) return;
  announced_ = {generation, source, token};
}

void StageReplicas::Cancel(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (cancelled_.ok()) cancelled_ = why.ok() ? absl::CancelledError("stopped") : why;
}

absl::Status StageReplicas::Retried(const std::function<absl::Status()>& average) {
  absl::Status s = average();
  while (!s.ok() && hooks_.publish) {
    STAGEWISE_RETURN_IF_ERROR(Rejoin(s));
    s = average();
    if (s.ok() && hooks_.release) hooks_.release();
  }
  return s;
}

absl::Status StageReplicas::Rejoin(const absl::Status& failure) {
  Announced next;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return announced_.generation > generation_ || !cancelled_.ok();
    };
    // The coordinator announces a regroup as it learns of the loss, before
    // a survivor's average fails: a stage that hears of none soon (its
    // average failed for another reason, or timed out behind a stalled
    // pipeline whose loss was not its own) fails as before.
    const absl::Duration grace = std::min(options_.timeout, kRegroupGrace);
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), grace)) {
      return absl::Status(failure.code(), absl::StrCat(failure.message(),
                                                       "; no regroup of the stage's replicas "
                                                       "announced within ",
                                                       absl::FormatDuration(grace)));
    }
    if (!cancelled_.ok()) return cancelled_;
    next = announced_;
  }
  if (next.source) STAGEWISE_RETURN_IF_ERROR(hooks_.publish(next.generation, next.token));
  // The broken group goes first: its connections are dead anyway.
  overlap_.reset();
  group_.reset();
  absl::Status met = Meet(next.generation);
  // No new group: what was published for it goes.
  if (!met.ok() && next.source && hooks_.release) hooks_.release();
  return met;
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
  return Retried([&] { return group_->AverageGradients(Parameters(stage, extra)); });
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
  return Retried([&] { return group_->AverageGradients(params); });
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
