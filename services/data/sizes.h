// Data sizes known without loading (or linking LibTorch): the coordinator
// schedules with them, every stage derives its step counts from them.
#ifndef STAGEWISE_SERVICES_DATA_SIZES_H_
#define STAGEWISE_SERVICES_DATA_SIZES_H_

#include <cstdint>

#include "absl/status/statusor.h"
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

// Optimizer steps per epoch (NominalTrainSize / batch_size), or
// INVALID_ARGUMENT naming batch_size when it is larger than the training set.
absl::StatusOr<int64_t> StepsPerEpoch(const JobSpec& spec);

// The one home of the job's cadences (every stage, the test fakes and the
// reference trainer ask these).
//
// Whether to evaluate after `steps_done` steps of a phase that runs
// `phase_steps` steps from global step `phase_offset`: at the end of every
// phase when anything is evaluated (eval.at_end, every_epochs or
// every_steps), else every eval.every_steps global steps and at the end of
// every eval.every_epochs-th epoch.
bool EvalDue(const EvalSpec& eval, int64_t phase_offset, int64_t phase_steps, int64_t steps_done,
             int64_t steps_per_epoch);

// Whether the job checkpoints after global step `step` on its schedule: never
// without checkpoint.dir, only strictly inside (0, total_steps) (the final
// state is written by its own rule), every checkpoint.every_steps global
// steps and at the end of every checkpoint.every_epochs-th epoch.
bool CheckpointScheduled(const CheckpointSpec& checkpoint, int64_t step, int64_t total_steps,
                         int64_t steps_per_epoch);

}  // namespace stagewise::data

#endif  // STAGEWISE_SERVICES_DATA_SIZES_H_
