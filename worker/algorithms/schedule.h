// The step schedules several algorithms share: a lock-step loop over the
// mini-batches of a phase and the drained 1F1B pipeline (docs/algorithms.md).
// Both start at ctx.first_step() (0, or the checkpoint a resumed job starts
// from) and take the checkpoints ctx.CheckpointDue asks for.
#ifndef STAGEWISE_WORKER_ALGORITHMS_SCHEDULE_H_
#define STAGEWISE_WORKER_ALGORITHMS_SCHEDULE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "worker/stage_context.h"

namespace stagewise::worker {

using StepFn = std::function<absl::Status(int64_t step)>;

// For every step t of the phase from ctx.first_step(): checks Interrupted(),
// runs `step`(t), evaluates where an evaluation is due after it, then calls
// ctx.Checkpoint(t+1) where ctx.CheckpointDue(t+1). The cut is the step
// boundary: `step` must leave nothing in flight that the algorithm's
// SaveState does not record (a lock-step algorithm that keeps a message of
// step t+1 across the boundary receives it inside `step`(t) when
// CheckpointDue(t+1), as features_replay does).
absl::Status RunLockStep(StageContext& ctx, const StepFn& step);

// Up to `depth` mini-batches in flight, in 1F1B order: `forward`(t) while
// fewer than `depth` wait for their gradient, else `backward` of the oldest.
// On the last stage a mini-batch is done with its forward (no backward
// call). Starts at ctx.first_step(). The pipeline drains where an evaluation
// or a checkpoint is due (segments end at every step s with EvalDue(s) or
// CheckpointDue(s)), then evaluates if due, then calls ctx.Checkpoint(s) if
// due: at a checkpoint no mini-batch is in flight on any stage, so the cut
// holds only counters (and what an algorithm accumulates across mini-batches,
// e.g. petra's partial gradient sums). The drain is part of the trajectory:
// a job with checkpoints every k steps trains like a job that evaluates
// every k steps.
absl::Status RunDrainedPipeline(StageContext& ctx, int64_t depth, const StepFn& forward,
                                const StepFn& backward);

}  // namespace stagewise::worker

#endif  // STAGEWISE_WORKER_ALGORITHMS_SCHEDULE_H_
