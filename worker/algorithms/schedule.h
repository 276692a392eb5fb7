// The step schedules several algorithms share: a lock-step loop over the
// mini-batches of a phase and the drained 1F1B pipeline (docs/algorithms.md).
#ifndef STAGEWISE_WORKER_ALGORITHMS_SCHEDULE_H_
#define STAGEWISE_WORKER_ALGORITHMS_SCHEDULE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

using StepFn = std::function<absl::Status(int64_t step)>;

// For every step t of the phase: checks Interrupted(), runs `step`(t) and
// evaluates where an evaluation is due after it.
absl::Status RunLockStep(StageContext& ctx, const StepFn& step);

// Up to `depth` mini-batches in flight, in 1F1B order: `forward`(t) while
// fewer than `depth` wait for their gradient, else `backward` of the oldest.
// On the last stage a mini-batch is done with its forward (no backward
// call). The pipeline drains where an evaluation is due, then evaluates.
absl::Status RunDrainedPipeline(StageContext& ctx, int64_t depth, const StepFn& forward,
                                const StepFn& backward);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_SCHEDULE_H_
