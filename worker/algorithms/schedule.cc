#include "worker/algorithms/schedule.h"

#include "absl/strings/str_cat.h"
#include "services/common/status_macros.h"
#include "worker/algorithms/common.h"

namespace stagewise::worker {
namespace {

absl::Status CheckFirstStep(const StageContext& ctx) {
  const int64_t first = ctx.first_step();
  if (first < 0 || (first > 0 && first >= ctx.total_steps())) {
    return absl::InternalError(
        absl::StrCat("first step ", first, " outside the phase's ", ctx.total_steps(), " steps"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunLockStep(StageContext& ctx, const StepFn& step) {
  STAGEWISE_RETURN_IF_ERROR(CheckFirstStep(ctx));
  for (int64_t t = ctx.first_step(); t < ctx.total_steps(); ++t) {
    STAGEWISE_RETURN_IF_ERROR(ctx.Interrupted());
    ctx.BeginStep(t);
    STAGEWISE_RETURN_IF_ERROR(step(t));
    if (ctx.EvalDue(t + 1)) STAGEWISE_RETURN_IF_ERROR(RunEvaluation(ctx, t + 1));
    if (ctx.CheckpointDue(t + 1)) STAGEWISE_RETURN_IF_ERROR(ctx.Checkpoint(t + 1));
  }
  return absl::OkStatus();
}

absl::Status RunDrainedPipeline(StageContext& ctx, int64_t depth, const StepFn& forward,
                                const StepFn& backward) {
  STAGEWISE_RETURN_IF_ERROR(CheckFirstStep(ctx));
  const int64_t total = ctx.total_steps();
  for (int64_t begin = ctx.first_step(); begin < total;) {
    int64_t end = begin + 1;
    while (end < total && !ctx.EvalDue(end) && !ctx.CheckpointDue(end)) ++end;
    for (int64_t f = begin, b = begin; b < end;) {
      STAGEWISE_RETURN_IF_ERROR(ctx.Interrupted());
      if (f < end && f - b < depth) {
        STAGEWISE_RETURN_IF_ERROR(forward(f++));
        if (ctx.last()) ++b;
      } else {
        STAGEWISE_RETURN_IF_ERROR(backward(b++));
      }
    }
    if (ctx.EvalDue(end)) STAGEWISE_RETURN_IF_ERROR(RunEvaluation(ctx, end));
    if (ctx.CheckpointDue(end)) STAGEWISE_RETURN_IF_ERROR(ctx.Checkpoint(end));
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace stagewise::worker
