// Data sizes known without loading (or linking LibTorch): the coordinator
// schedules with them, every stage derives its step counts from them.
#ifndef STAGEWISE_SERVICES_DATA_SIZES_H_
#define STAGEWISE_SERVICES_DATA_SIZES_H_

#include <cstdint>

#include "services/spec/job_spec.h"

namespace stagewise::data {

// The number of training samples `spec` yields, known without loading the
// data: every stage and the coordinator need the schedule, only stage 0 loads
// data (and checks that the real count agrees).
int64_t NominalTrainSize(const DataSpec& spec);

// Optimizer steps of one phase: its `steps`, else ceil(epochs x steps_per_epoch).
int64_t PhaseSteps(const PhaseSpec& phase, int64_t steps_per_epoch);

// Optimizer steps of the whole job: its `steps` when set (a step budget for
// the whole job, e.g. `train-local --steps`), else the sum of its phases'
// steps, each phase rounded up on its own (what every stage runs, what the
// coordinator shows and what the reference trainer runs).
int64_t TotalSteps(const JobSpec& spec, int64_t steps_per_epoch);

}  // namespace stagewise::data

#endif  // STAGEWISE_SERVICES_DATA_SIZES_H_
