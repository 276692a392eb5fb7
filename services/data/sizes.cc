#include "services/data/sizes.h"

#include <algorithm>
#include <cmath>

namespace stagewise::data {

int64_t NominalTrainSize(const DataSpec& spec) {
  int64_t n = 0;
  if (spec.dataset == "fashion_mnist") n = 60000;
  if (spec.dataset == "cifar10" || spec.dataset == "cifar100") n = 50000;
  if (spec.dataset == "synthetic") n = spec.train_size;
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

}  // namespace stagewise::data
