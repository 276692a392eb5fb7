#include "worker/stage_phases.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/data/sizes.h"
#include "services/training/optimizer.h"

namespace stagewise::worker {

StagePhases::StagePhases(std::vector<PhaseSpec> phases, int64_t steps_per_epoch, int64_t batch_size)
    : phases_(std::move(phases)), steps_per_epoch_(steps_per_epoch), batch_size_(batch_size) {
  for (const PhaseSpec& phase : phases_) total_ += data::PhaseSteps(phase, steps_per_epoch_);
}

absl::Status StagePhases::Release(int phase, bool strict) {
  absl::MutexLock lock(&mu_);
  if (strict) {
    if (phase != released_ + 1 || phase >= count()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "StartCommand.phase: ", phase, " does not follow phase ", released_, " of ", count()));
    }
    released_ = phase;
    return absl::OkStatus();
  }
  released_ = std::max(released_, std::min(phase, count() - 1));
  return absl::OkStatus();
}

bool StagePhases::Released(int phase) const {
  absl::MutexLock lock(&mu_);
  return released_ >= phase;
}

absl::Status StagePhases::Await(int phase) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, phase]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return released_ >= phase || !cancelled_.ok();
  };
  mu_.Await(absl::Condition(&ready));
  return cancelled_;
}

void StagePhases::Cancel(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (cancelled_.ok()) cancelled_ = why.ok() ? absl::CancelledError("stopped") : why;
}

const PhaseSpec& StagePhases::Enter(int p) {
  const PhaseSpec& phase = phases_.at(static_cast<size_t>(p));
  // Phases run in order: phase p starts where p - 1 ended.
  offset_ = 0;
  for (int q = 0; q < p; ++q) offset_ += data::PhaseSteps(phases_[q], steps_per_epoch_);
  current_ = p;
  steps_ = data::PhaseSteps(phase, steps_per_epoch_);
  base_lr_ =
      training::BaseLearningRate(phase.optimizer, batch_size_, AccumulationFactor(phase.algorithm));
  return phase;
}

}  // namespace stagewise::worker
