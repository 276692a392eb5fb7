#include "services/data/sizes.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace stagewise::data {

int64_t NominalTrainSize(const DataSpec& spec) {
  int64_t n = spec.train_size;  // synthetic
  if (spec.dataset == DatasetKind::kFashionMnist) n = 60000;
  if (spec.dataset == DatasetKind::kCifar10 || spec.dataset == DatasetKind::kCifar100) n = 50000;
  if (spec.limit_train > 0) n = std::min(n, spec.limit_train);
  return n;
}

int64_t PhaseSteps(const PhaseSpec& phase, int64_t steps_per_epoch) {
  return phase.steps > 0
             ? phase.steps
             : static_cast<int64_t>(std::ceil(phase.epochs * static_cast<double>(steps_per_epoch)));
}

int64_t TotalSteps(const JobSpec& spec, int64_t steps_per_epoch) {
  if (spec.steps > 0) return spec.steps;  // a step budget for the whole job
  int64_t total = 0;
  for (const PhaseSpec& phase : Phases(spec)) total += PhaseSteps(phase, steps_per_epoch);
  return total;
}

absl::StatusOr<int64_t> StepsPerEpoch(const JobSpec& spec) {
  const int64_t per_epoch = spec.batch_size > 0 ? NominalTrainSize(spec.data) / spec.batch_size : 0;
  if (per_epoch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size: ", spec.batch_size, " is larger than the training set"));
  }
  return per_epoch;
}

bool EvalDue(const EvalSpec& eval, int64_t phase_offset, int64_t phase_steps, int64_t steps_done,
             int64_t steps_per_epoch) {
  if (steps_done == phase_steps) {
    return eval.at_end || eval.every_epochs > 0 || eval.every_steps > 0;
  }
  const int64_t global = phase_offset + steps_done;
  if (eval.every_steps > 0 && global % eval.every_steps == 0) return true;
  return eval.every_epochs > 0 && global % (eval.every_epochs * steps_per_epoch) == 0;
}

bool CheckpointScheduled(const CheckpointSpec& checkpoint, int64_t step, int64_t total_steps,
                         int64_t steps_per_epoch) {
  if (checkpoint.dir.empty() || step <= 0 || step >= total_steps) return false;
  if (checkpoint.every_steps > 0 && step % checkpoint.every_steps == 0) return true;
  return checkpoint.every_epochs > 0 && step % (checkpoint.every_epochs * steps_per_epoch) == 0;
}

}  // namespace stagewise::data
